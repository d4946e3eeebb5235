//! `xmx cluster ...`.

use anyhow::Result;
use clap::Subcommand;

use super::{print_table, XmxdTarget};
use crate::xmxd::control::{ClusterReport, XmxdRequest};

/// The subcommands of `xmx cluster`.
#[derive(Debug, Subcommand)]
pub enum ClusterCmd {
    /// Create cluster NAME (1 to 32 letters, digits, '_', '.', '-').
    Create {
        #[command(flatten)]
        target: XmxdTarget,
        name: String,
    },
    /// Delete cluster NAME; with members only with --force, which moves them to `default`.
    Delete {
        #[command(flatten)]
        target: XmxdTarget,
        name: String,
        #[arg(long)]
        force: bool,
    },
    /// Put GUEST (a guest name, or the domid of a running domain) in cluster NAME; a
    /// running guest's device is re-attached with its new cluster. A guest that neither
    /// runs here nor is known to any host is refused unless --new says it is expected.
    Add {
        #[command(flatten)]
        target: XmxdTarget,
        name: String,
        guest: String,
        /// GUEST does not run yet: record it, so that it joins NAME when it starts.
        #[arg(long)]
        new: bool,
    },
    /// Take GUEST out of cluster NAME, back to `default`.
    Remove {
        #[command(flatten)]
        target: XmxdTarget,
        name: String,
        guest: String,
    },
    /// The clusters, their ids and members.
    List {
        #[command(flatten)]
        target: XmxdTarget,
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub(super) fn run(cmd: ClusterCmd) -> Result<i32> {
    match cmd {
        ClusterCmd::Create { target, name } => {
            let v = target
                .connect()?
                .call(&XmxdRequest::ClusterCreate { name: name.clone() })?;
            println!("cluster {name} created (id {})", v["id"]);
        }
        ClusterCmd::Delete {
            target,
            name,
            force,
        } => {
            let v = target.connect()?.call(&XmxdRequest::ClusterDelete {
                name: name.clone(),
                force,
            })?;
            println!("cluster {name} deleted");
            for g in v["moved"].as_array().into_iter().flatten() {
                println!(
                    "  {} moved to the default cluster",
                    g.as_str().unwrap_or("?")
                );
            }
        }
        ClusterCmd::Add {
            target,
            name,
            guest,
            new,
        } => {
            let v = target.connect()?.call(&XmxdRequest::ClusterAdd {
                name: name.clone(),
                guest: guest.clone(),
                new,
            })?;
            if v["running"].as_bool() == Some(true) {
                println!("{guest} is in cluster {name}");
            } else {
                println!("{guest} is recorded in cluster {name}; it joins it when it starts");
            }
        }
        ClusterCmd::Remove {
            target,
            name,
            guest,
        } => {
            target.connect()?.call(&XmxdRequest::ClusterRemove {
                name: name.clone(),
                guest: guest.clone(),
            })?;
            println!("{guest} left cluster {name} for the default cluster");
        }
        ClusterCmd::List { target, json } => {
            let list: Vec<ClusterReport> = target.connect()?.call_as(&XmxdRequest::Clusters)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                let rows: Vec<Vec<String>> = list
                    .iter()
                    .map(|c| vec![c.name.clone(), c.id.to_string(), c.members.join(" ")])
                    .collect();
                print_table(&["CLUSTER", "ID", "MEMBERS"], &rows);
            }
        }
    }
    Ok(0)
}

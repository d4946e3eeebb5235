//! `xmx direct`.

use anyhow::Result;

use super::XmxdTarget;
use crate::xmxd::control::{DirectReport, XmxdRequest};

/// Arguments of `xmx direct`.
#[derive(Debug, clap::Args)]
pub struct DirectArgs {
    #[command(flatten)]
    target: XmxdTarget,
    /// `on` offers a direct channel to every pair of this host's guests in one virtual
    /// cluster (the default); `off` revokes them all, and traffic goes through the backend
    /// again with nothing lost [default: print the pairs offered now].
    #[arg(value_parser = ["on", "off"], conflicts_with_all = ["leaving", "staying"])]
    state: Option<String>,
    /// Domain DOMID is about to migrate away: revoke its channels now, while it runs, and
    /// offer it none while it is here (what `xmx-hook migrate` does before `xl migrate`).
    #[arg(long, value_name = "DOMID", conflicts_with = "staying")]
    leaving: Option<u16>,
    /// Domain DOMID stays after all (its migration failed): lift its leaving mark, and its
    /// pairs are offered again.
    #[arg(long, value_name = "DOMID")]
    staying: Option<u16>,
    /// Print the reply as JSON.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(args: &DirectArgs) -> Result<i32> {
    let mut client = args.target.connect()?;
    let request = match (args.leaving, args.staying) {
        (Some(domid), _) => XmxdRequest::DirectLeaving {
            domid,
            leaving: true,
        },
        (None, Some(domid)) => XmxdRequest::DirectLeaving {
            domid,
            leaving: false,
        },
        (None, None) => XmxdRequest::Direct {
            enabled: args.state.as_deref().map(|s| s == "on"),
        },
    };
    let report: DirectReport = client.call_as(&request)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(0);
    }
    let state = if report.enabled { "on" } else { "off" };
    println!(
        "direct channels {state}; pairs offered: {}",
        report.pairs.len()
    );
    for (a, b) in &report.pairs {
        println!("  domain {a} <-> domain {b}");
    }
    Ok(0)
}

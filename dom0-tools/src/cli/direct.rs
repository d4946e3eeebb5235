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
    #[arg(value_parser = ["on", "off"])]
    state: Option<String>,
    /// Print the reply as JSON.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(args: &DirectArgs) -> Result<i32> {
    let mut client = args.target.connect()?;
    let report: DirectReport = client.call_as(&XmxdRequest::Direct {
        enabled: args.state.as_deref().map(|s| s == "on"),
    })?;
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

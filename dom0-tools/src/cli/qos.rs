//! `xmx qos`.

use anyhow::Result;

use super::XmxdTarget;
use crate::xmxd::control::{QosReport, XmxdRequest};

/// Arguments of `xmx qos`.
#[derive(Debug, clap::Args)]
pub struct QosArgs {
    #[command(flatten)]
    target: XmxdTarget,
    /// The guest: its name, or the domid of its running domain.
    guest: String,
    /// Its new weight, 1 to 1000 [default: print the current one]. Active guests share
    /// the host's pull budget and transmit queue in proportion to their weights; a guest
    /// alone gets all of it whatever its weight.
    weight: Option<u32>,
    /// Print the reply as JSON.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(args: &QosArgs) -> Result<i32> {
    let mut client = args.target.connect()?;
    let report: QosReport = client.call_as(&XmxdRequest::Qos {
        guest: args.guest.clone(),
        weight: args.weight,
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(0);
    }
    let running = if report.domains.is_empty() {
        "not running here".to_string()
    } else {
        let ids: Vec<String> = report.domains.iter().map(|d| d.to_string()).collect();
        format!("domain {}", ids.join(", "))
    };
    println!(
        "guest {}: QoS weight {} ({running})",
        report.guest, report.weight
    );
    Ok(0)
}

//! `xmx peers`.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::{print_table, XmxdTarget};
use crate::xmxd::control::{PeersReport, XmxdRequest};

/// Arguments of `xmx peers`.
#[derive(Debug, clap::Args)]
pub struct PeersArgs {
    #[command(flatten)]
    target: XmxdTarget,
    /// Only what this guest (a name, or a domid of this host) may see: its cluster's peers.
    #[arg(long)]
    guest: Option<String>,
    /// Wait until the table holds at least this many peers (see --timeout).
    #[arg(long, value_name = "N")]
    wait: Option<usize>,
    /// Answer only once the table's generation is above GEN (a change since a report
    /// that showed GEN), or after --timeout with the table unchanged.
    #[arg(long, value_name = "GEN")]
    changed_after: Option<u64>,
    /// Seconds --wait and --changed-after wait at most.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    /// Print the table as JSON.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(args: &PeersArgs) -> Result<i32> {
    let mut client = args.target.connect()?;
    // A timeout beyond what the clock can represent means no deadline: keep waiting.
    let deadline = Instant::now().checked_add(Duration::from_secs(args.timeout));
    let mut after = args.changed_after;
    let report = loop {
        let left = match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()),
            None => Duration::MAX,
        };
        let report: PeersReport = client.call_as(&XmxdRequest::Peers {
            guest: args.guest.clone(),
            after,
            timeout_ms: after.map(|_| left.as_millis().min(u128::from(u64::MAX)) as u64),
        })?;
        let Some(want) = args.wait else { break report };
        if report.peers.len() >= want {
            break report;
        }
        if left.is_zero() {
            bail!(
                "the peer table has {} peers, not {want}, after {}s",
                report.peers.len(),
                args.timeout
            );
        }
        // Long-poll: xmxd answers when the table changes (or the time is up).
        after = Some(report.generation);
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(0);
    }
    let scope = match &report.cluster {
        Some(c) => format!(", cluster {c} only"),
        None => String::new(),
    };
    println!(
        "host {} ({}), peer table generation {}, {} peers{scope}",
        report.host,
        report.host_mac,
        report.generation,
        report.peers.len()
    );
    let rows: Vec<Vec<String>> = report
        .peers
        .iter()
        .map(|p| {
            vec![
                p.index.to_string(),
                p.mac.to_string(),
                p.hostname.clone(),
                p.cluster.clone(),
                if p.local {
                    "local".to_string()
                } else {
                    format!("{} ({})", p.host, p.host_mac)
                },
            ]
        })
        .collect();
    print_table(&["INDEX", "MAC", "HOSTNAME", "CLUSTER", "WHERE"], &rows);
    for c in &report.conflicts {
        println!(
            "left out: guest {} on {} ({}): {}",
            c.guest, c.host, c.mac, c.reason
        );
    }
    Ok(0)
}

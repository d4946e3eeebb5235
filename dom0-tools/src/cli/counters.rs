//! `xmx counters`.

use anyhow::{Context, Result};
use xmx_backend::admin::{BackdRequest, CountersReport};

use super::{print_table, BackendTarget};

/// Arguments of `xmx counters`.
#[derive(Debug, clap::Args)]
pub struct CountersArgs {
    #[command(flatten)]
    target: BackendTarget,
    /// Print the backend's report as JSON (schema in xmx-backd's control socket docs).
    #[arg(long)]
    json: bool,
}

pub(super) fn run(args: &CountersArgs) -> Result<i32> {
    let value = args
        .target
        .connect()?
        .call(&BackdRequest::Counters)
        .context("asking xmx-backd for its counters")?;
    let report: CountersReport =
        serde_json::from_value(value).context("xmx-backd's counters report")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(0);
    }
    let e = &report.engine;
    let b = &report.backend;
    println!(
        "wire: {} frames in ({} malformed, {} for no guest, {} spoofed; {} dropped by the kernel, ring full), {} out ({} refused); {} guests disconnected",
        e.rx_frames,
        e.rx_malformed,
        e.rx_unknown_destination,
        e.rx_spoofed_source,
        b.nic_rx_ring_drops,
        b.nic_tx_frames,
        b.nic_tx_errors,
        b.disconnects
    );
    let rows: Vec<Vec<String>> = report
        .guests
        .iter()
        .map(|g| {
            let mut row = vec![
                g.domid.to_string(),
                g.devid.to_string(),
                if g.connected { "yes" } else { "no" }.to_string(),
            ];
            match &g.nic {
                Some(n) => row.extend([
                    n.tx_frames.to_string(),
                    n.tx_bytes.to_string(),
                    n.rx_frames.to_string(),
                    n.rx_bytes.to_string(),
                    n.local_frames.to_string(),
                    n.total_drops.to_string(),
                    n.retransmits.to_string(),
                    (n.quota_refusals + g.quota_refusals).to_string(),
                    n.weight.to_string(),
                ]),
                None => {
                    row.extend(vec!["-".to_string(); 7]);
                    row.push(g.quota_refusals.to_string());
                    row.push("-".to_string());
                }
            }
            row
        })
        .collect();
    print_table(
        &[
            "DOMID",
            "DEV",
            "CONNECTED",
            "TX_FRAMES",
            "TX_BYTES",
            "RX_FRAMES",
            "RX_BYTES",
            "LOCAL",
            "DROPS",
            "RETRANSMITS",
            "QUOTA_REFUSALS",
            "WEIGHT",
        ],
        &rows,
    );
    for g in &report.guests {
        if let Some(n) = &g.nic {
            for (reason, count) in &n.drops {
                println!("  domain {} drops {reason}: {count}", g.domid);
            }
        }
        if g.endpoints.is_empty() {
            continue;
        }
        println!("domain {} endpoints:", g.domid);
        let rows: Vec<Vec<String>> = g
            .endpoints
            .iter()
            .map(|ep| {
                vec![
                    format!("  {}", ep.endpoint),
                    ep.send_requests.to_string(),
                    ep.events.to_string(),
                    ep.event_drops.to_string(),
                    ep.notifications.to_string(),
                    if ep.quiet_send_done {
                        ep.quiet_events.to_string()
                    } else {
                        "-".to_string()
                    },
                    ep.backlog.to_string(),
                ]
            })
            .collect();
        print_table(
            &[
                "  ENDPOINT",
                "SENDS",
                "EVENTS",
                "EVENT_DROPS",
                "NOTIFICATIONS",
                "QUIET",
                "BACKLOG",
            ],
            &rows,
        );
    }
    Ok(0)
}

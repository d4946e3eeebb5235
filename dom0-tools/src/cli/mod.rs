//! The administration subcommands of `xmx`: `peers`, `attach`, `detach`, `cluster`,
//! `counters`, `qos`. They talk to the local xmxd (and, for `counters`, to `xmx-backd`) over their
//! control sockets; `--json` prints what the daemons answered, for scripts.

mod cluster;
mod counters;
mod direct;
mod guest;
mod peers;
mod qos;
mod target;

use anyhow::Result;
use clap::Subcommand;

pub(crate) use target::{BackendTarget, XmxdTarget};

/// The administration subcommands, flattened into `xmx`'s own.
#[derive(Debug, Subcommand)]
pub enum AdminCmd {
    /// The fabric's peer table, as omx_info shows it: index, MAC, MX hostname, cluster and
    /// where each peer runs.
    Peers(peers::PeersArgs),
    /// Give running domain DOMID the xmx device (and remember the wish for its name).
    Attach(guest::AttachArgs),
    /// Take the xmx device away from running domain DOMID.
    Detach(guest::DetachArgs),
    /// Virtual clusters: guests of different clusters cannot exchange any traffic.
    Cluster {
        /// What to do with clusters.
        #[command(subcommand)]
        cmd: cluster::ClusterCmd,
    },
    /// Traffic counters per guest and endpoint, from the backend: frames, bytes, drops,
    /// retransmits, quota refusals.
    Counters(counters::CountersArgs),
    /// A guest's quality-of-service weight (default 1): its share of its host's pull
    /// budget and transmit queue while other guests are busy. Kept by name in dom0's
    /// xenstore; guests cannot change it.
    Qos(qos::QosArgs),
    /// Direct channels between co-located guests of one virtual cluster: list them, or
    /// turn them on or off for this host.
    Direct(direct::DirectArgs),
}

/// Run one administration subcommand; returns the process exit code.
pub fn run(cmd: AdminCmd) -> Result<i32> {
    match cmd {
        AdminCmd::Peers(a) => peers::run(&a),
        AdminCmd::Attach(a) => guest::attach(&a),
        AdminCmd::Detach(a) => guest::detach(&a),
        AdminCmd::Cluster { cmd } => cluster::run(cmd),
        AdminCmd::Counters(a) => counters::run(&a),
        AdminCmd::Qos(a) => qos::run(&a),
        AdminCmd::Direct(a) => direct::run(&a),
    }
}

/// Left-aligned columns, each as wide as its widest cell.
fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let text: Vec<String> = cells
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", text.join("  ").trim_end());
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
}

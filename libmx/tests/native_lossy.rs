//! The C programs across two hosts whose link loses 5% of the frames,
//! duplicates 1%, reorders 5% and delays the rest by 1 ms (`tc netem` on
//! both ends, or the same done by a relay where the kernel has no netem).
//! Every byte is still checked by the programs; they must finish: the
//! library retransmits messages, the engine re-requests pull blocks.
//! Needs root; skipped with a printed reason otherwise.

mod common;
#[path = "common/twohost.rs"]
mod twohost;

use common::{build, our_include, scratch};
use twohost::{passed, TwoHosts, LOSSY};
use xmx_nic::testbed::relay::RelayStats;

/// Timers scaled to a link with a 2 ms round trip, so losses cost tens of
/// milliseconds rather than MX's half-second defaults. The end of a run is
/// made safe on a lossy link: a send completes only once acknowledged
/// (`MX_ZOMBIE_SEND=0`, else a program could exit with its last message
/// lost), and a closed endpoint lingers to repeat its last ack (else a peer
/// that missed it would wait for a process that is gone).
const ENV: &[(&str, &str)] = &[
    ("XMX_QDISC_BYPASS", "0"),
    ("XMX_RESEND_DELAY_US", "20000"),
    ("XMX_PULL_TIMEOUT_MS", "20"),
    ("XMX_LINGER_MS", "300"),
    ("MX_ZOMBIE_SEND", "0"),
];

/// Runs C program `name` on two hosts over the lossy link; its two sides' output and what
/// the relay did (None where tc netem impairs the link).
fn run_lossy(name: &str, tag: &str) -> Option<(String, String, Option<RelayStats>)> {
    let hosts = TwoHosts::impaired(tag, LOSSY)?;
    let dir = scratch();
    let bin = build(name, &our_include(), dir.path());
    let started = std::time::Instant::now();
    let (p, a) = hosts.run_pair(&bin, ENV);
    let (p, a) = (passed("passive side", &p), passed("active side", &a));
    print!("{a}{p}");
    println!(
        "{name} over {} in {:?}; relay: {:?}",
        hosts.impairment,
        started.elapsed(),
        hosts.relay_stats()
    );
    Some((p, a, hosts.relay_stats()))
}

/// The link of a test's runs must have lost frames, or the test proved nothing about loss.
/// Counted over all of a test's programs: one of ten frames may see no loss at 5%.
fn assert_lost(stats: impl IntoIterator<Item = Option<RelayStats>>) {
    let stats: Vec<RelayStats> = stats.into_iter().flatten().collect();
    if !stats.is_empty() {
        let lost: u64 = stats.iter().map(|s| s.lost).sum();
        assert!(lost > 0, "the link lost nothing: {stats:?}");
    }
}

/// [`run_lossy`] for a test of one program.
fn lossy(name: &str, tag: &str) -> Option<(String, String)> {
    let (p, a, stats) = run_lossy(name, tag)?;
    assert_lost([stats]);
    Some((p, a))
}

#[test]
fn pingpong_every_size_up_to_16_mib_over_a_lossy_link() {
    if let Some((_, a)) = lossy("pingpong", "lpp") {
        assert!(a.lines().any(|l| l.trim_start().starts_with("16777216 ")));
    }
}

/// Once the receiver falls behind, more LARGE sends are outstanding here than
/// an endpoint has windows (256): the sends posted behind one waiting for a
/// window must wait too, or the receiver matches them first.
#[test]
fn stream_keeps_order_over_a_lossy_link() {
    if let Some((p, _)) = lossy("stream", "lst") {
        assert!(p.contains("received 1500 messages in order"));
    }
}

#[test]
fn outstanding_requests_over_a_lossy_link() {
    lossy("outstanding", "lou");
}

#[test]
fn probe_and_large_reply_over_a_lossy_link() {
    let stats = [("probe", "lpr"), ("reply_large", "lrl")]
        .map(|(name, tag)| run_lossy(name, tag).and_then(|(_, _, s)| s));
    assert_lost(stats);
}

#[test]
fn the_other_programs_over_a_lossy_link() {
    let stats = [
        ("waitany", "lwa"),
        ("badkey", "lbk"),
        ("truncate", "ltr"),
        ("cancel", "lca"),
        ("unexp", "lun"),
    ]
    .map(|(name, tag)| run_lossy(name, tag).and_then(|(_, _, s)| s));
    assert_lost(stats);
}

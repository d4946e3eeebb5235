//! A guest of a simulated cluster moves to another host (`xmx sim migrate`) while an MX
//! program streams to and from it; every message must arrive once, in order and
//! byte-exact on both sides (`migrate_stream.c` checks each one), and the stream must go
//! on over the new host's backend.
//!
//! The guest streams with a co-located guest through their backend
//! (`MX_DISABLE_SHMEM=1`: a direct channel would have to fall back before the move,
//! which is not done yet); after the move the two are on different hosts, so the
//! traffic crosses the link.
//!
//! Needs root (namespaces, veths, AF_PACKET); skipped with the reason otherwise.

use std::time::Duration;

use xmx_backend::admin::{CountersReport, Request as BackdRequest};
use xmx_tests::app::App;
use xmx_tests::cluster::{exclusive, skipped, SimCluster};
use xmx_tests::cprog;

/// Counters of guest `domid` on host `i`'s backend: (frames received, frames sent).
fn nic_frames(c: &SimCluster, i: usize, domid: u16) -> (u64, u64) {
    let v = c
        .backd(i)
        .call(&BackdRequest::Counters)
        .expect("backd counters");
    let report: CountersReport = serde_json::from_value(v).expect("a counters report");
    let g = report
        .guests
        .iter()
        .find(|g| g.domid == domid)
        .unwrap_or_else(|| panic!("no guest {domid} on host {i}"));
    let nic = g.nic.as_ref().expect("the guest's NIC counters");
    (nic.rx_frames, nic.tx_frames)
}

#[test]
fn a_guest_moves_to_another_host_under_a_two_way_stream_and_nothing_is_lost() {
    if skipped("a_guest_moves_to_another_host_under_a_two_way_stream_and_nothing_is_lost") {
        return;
    }
    let _one = exclusive();
    let mut c = SimCluster::up("mig2s", &[]);
    let dir = tempfile::tempdir().unwrap();
    let bin = cprog::build("migrate_stream", dir.path());
    let env = [
        ("MX_DISABLE_SHMEM", "1"),
        ("XMX_TEST_COUNT", "20000"),
        ("XMX_TEST_LARGE", "1"),
    ];
    let moving = c.hostname(0, 0);
    let mut passive = App::spawn(
        &format!("migrate_stream -l 2 in {moving}"),
        c.app(0, 0, &bin, &["-l", "2"], &env),
    );
    c.wait_listening(0, 0, 2, Duration::from_secs(30), &mut passive);
    let active = App::spawn(
        &format!("migrate_stream -d {moving} in {}", c.hostname(0, 1)),
        c.app(0, 1, &bin, &["-d", &moving, "-e", "2"], &env),
    );
    passive.wait_line(Duration::from_secs(60), |l| l == "received 1000");

    let report = c.migrate(0, 0, 1);
    eprintln!("{report:#}");
    assert_eq!(
        (report["from"].as_str(), report["to"].as_str()),
        (Some("h0"), Some("h1"))
    );
    // The guest daemon and the application were frozen for the last round.
    assert!(report["frozen_processes"].as_u64() >= Some(2), "{report}");
    // The passive's endpoint kept its session on the new host.
    assert_eq!(report["sessions_carried"].as_u64(), Some(1), "{report}");
    let d = report["dest_domid"].as_u64().unwrap() as u16;

    let active = active.finish();
    let passive = passive.finish();
    passive.passed();
    active.passed();
    // The stream went on over the new host's backend, both ways.
    let (rx, tx) = nic_frames(&c, 1, d);
    assert!(
        rx > 0 && tx > 0,
        "on the new host: {rx} frames in, {tx} out"
    );
    eprintln!(
        "migration under a two-way stream: downtime {:.1} ms, {} rounds, {} bytes",
        report["downtime_ms"].as_f64().unwrap_or(f64::NAN),
        report["rounds"].as_array().map_or(0, |r| r.len()),
        report["bytes"]
    );
}

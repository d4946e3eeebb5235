//! dom0 and guest-daemon faults on a simulated cluster of 2 hosts x 2 guests,
//! each injected while 1 MiB messages stream, byte-checked, from guest gJ of
//! h0 to guest gJ of h1 on both pairs:
//!
//! - h0's fabric link down for 2 s, then up: both streams complete, every
//!   message received once and checked, and h0's daemons are still the same
//!   processes;
//! - g0 of h0 loses its xmx-frontd (SIGKILL): its sender fails with a clear
//!   status within 5 s, and g1's stream completes;
//! - g0 of h1, the receiver, is destroyed: g0's sender fails within the
//!   request timeout it set, and g1's stream completes;
//! - h0's xmxd is killed (SIGKILL): its supervisor starts it again, as
//!   systemd's `Restart=on-failure` does, and both streams complete;
//! - h0's xmx-backd is killed (SIGKILL) while both senders wait for their
//!   last message to be pulled: restarted, it recovers the guests from
//!   xenstore, their endpoints keep their sessions and windows, and both
//!   streams complete byte for byte.
//!
//! Needs root (namespaces, veths, AF_PACKET); skipped with the reason
//! otherwise.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use xmx_tests::app::{App, Finished};
use xmx_tests::cluster::{exclusive, skipped, SimCluster};
use xmx_tests::cprog;

/// Messages of each stream; the receiver holds the last one back until the
/// fault has been dealt with, so the stream is in progress meanwhile.
const COUNT: usize = 16;
const STREAM: [(&str, &str); 3] = [
    ("BULK_COUNT", "16"),
    ("BULK_SIZE", "1048576"),
    ("BULK_HOLD", "1"),
];

/// A `bulk` stream from guest `g` of h0 to guest `g` of h1, started and seen
/// delivering its first message: (receiver, sender).
fn stream(c: &SimCluster, bin: &Path, g: usize, env: &[(&str, &str)]) -> (App, App) {
    let mut rx = App::spawn(
        &format!("bulk receiver in {}", c.hostname(1, g)),
        c.app(1, g, bin, &["-l", "2"], env),
    );
    rx.wait_line(Duration::from_secs(30), |l| l == "ready");
    let peer = c.hostname(1, g);
    let tx = App::spawn(
        &format!("bulk sender in {}", c.hostname(0, g)),
        c.app(0, g, bin, &["-d", &peer, "-e", "2"], env),
    );
    rx.wait_line(Duration::from_secs(60), |l| l == "received 0");
    (rx, tx)
}

/// The stream, held before its last message, is let go and ends with every
/// message received exactly once, each checked byte for byte by the receiver.
fn completed(mut rx: App, tx: App) {
    rx.wait_line(Duration::from_secs(60), |l| l == "holding");
    rx.send_line("go");
    ended(rx, tx);
}

/// The stream, let go, ends with every message received exactly once, each
/// checked byte for byte by the receiver.
fn ended(rx: App, tx: App) {
    let (tx, rx): (Finished, Finished) = (tx.finish(), rx.finish());
    tx.passed();
    let out = rx.passed();
    let got: Vec<&str> = out.lines().filter(|l| l.starts_with("received ")).collect();
    let want: Vec<String> = (0..COUNT).map(|i| format!("received {i}")).collect();
    assert_eq!(got, want, "{out}");
}

/// The pid of daemon `name` of host `host`: the child of its supervisor,
/// whose pid the cluster's state file holds.
fn daemon_pid(c: &SimCluster, host: usize, name: &str) -> i32 {
    supervisor_child(c, host, name).unwrap_or_else(|| panic!("{name} of h{host} runs no daemon"))
}

/// The daemon its supervisor runs now, if any.
fn supervisor_child(c: &SimCluster, host: usize, name: &str) -> Option<i32> {
    let supervisor = supervisor_pid(c, host, name);
    std::fs::read_to_string(format!("/proc/{supervisor}/task/{supervisor}/children"))
        .ok()
        .and_then(|c| c.split_whitespace().next()?.parse().ok())
}

/// The pid of the supervisor of daemon `name` of host `host`.
fn supervisor_pid(c: &SimCluster, host: usize, name: &str) -> i32 {
    let path = Path::new("/run/xmx").join(c.name()).join("cluster.json");
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("the cluster's state")).unwrap();
    state["hosts"][host]["daemons"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["name"] == name)
        .and_then(|d| d["pid"].as_i64())
        .unwrap_or_else(|| panic!("no daemon {name} on h{host}: {state}")) as i32
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

fn link(c: &SimCluster, host: usize, state: &str) {
    let ns = &c.host(host).netns;
    let out = Command::new("ip")
        .args(["-n", ns, "link", "set", "eth0", state])
        .output()
        .expect("running ip");
    assert!(out.status.success(), "ip link set {state}: {out:?}");
}

#[test]
fn a_two_second_link_flap_loses_and_duplicates_nothing() {
    if skipped("a_two_second_link_flap_loses_and_duplicates_nothing") {
        return;
    }
    let _one = exclusive();
    let c = SimCluster::up("dflap", &[]);
    let dir = tempfile::tempdir().unwrap();
    let bin = cprog::build("bulk", dir.path());
    let daemons = ["xmxd", "xmx-backd"].map(|d| daemon_pid(&c, 0, d));

    let mut s0 = stream(&c, &bin, 0, &STREAM);
    let mut s1 = stream(&c, &bin, 1, &STREAM);
    for rx in [&mut s0.0, &mut s1.0] {
        rx.wait_line(Duration::from_secs(60), |l| l == "holding");
    }
    // The last message of each stream crosses while the link is down: the
    // flap is the fault under test, 2 s without a link.
    link(&c, 0, "down");
    s0.0.send_line("go");
    s1.0.send_line("go");
    std::thread::sleep(Duration::from_secs(2));
    link(&c, 0, "up");
    ended(s0.0, s0.1);
    ended(s1.0, s1.1);
    for (pid, name) in daemons.iter().zip(["xmxd", "xmx-backd"]) {
        assert!(alive(*pid), "h0's {name} did not survive the flap");
    }
}

#[test]
fn a_killed_frontd_fails_its_guests_sends_within_five_seconds() {
    if skipped("a_killed_frontd_fails_its_guests_sends_within_five_seconds") {
        return;
    }
    let _one = exclusive();
    let c = SimCluster::up("dfrontd", &[]);
    let dir = tempfile::tempdir().unwrap();
    let bin = cprog::build("bulk", dir.path());

    let by = stream(&c, &bin, 1, &STREAM);
    let (v_rx, v_tx) = stream(&c, &bin, 0, &STREAM);
    let frontd = daemon_pid(&c, 0, "xmx-frontd-g0");
    let killed_at = Instant::now();
    // SAFETY: plain syscall on a daemon of the cluster this test brought up.
    assert_eq!(unsafe { libc::kill(frontd, libc::SIGKILL) }, 0);
    let tx = v_tx.finish();
    let took = killed_at.elapsed();
    assert!(!tx.status.success(), "the sender went on: {tx:?}");
    assert!(
        tx.stdout.contains("Aborted") || tx.stderr.contains("Aborted"),
        "no clear status: {tx:?}"
    );
    assert!(
        took < Duration::from_secs(5),
        "the sender failed after {took:?}"
    );
    println!("g0's sender failed {took:?} after its frontd was killed");
    // The receiver waits for a message that will not come.
    assert!(v_rx.kill_program("bulk"), "the receiver still waits");
    drop(v_rx.finish());
    completed(by.0, by.1);
}

#[test]
fn a_destroyed_receiver_times_the_sender_out_within_its_bound() {
    if skipped("a_destroyed_receiver_times_the_sender_out_within_its_bound") {
        return;
    }
    let _one = exclusive();
    let c = SimCluster::up("drecv", &[]);
    let dir = tempfile::tempdir().unwrap();
    let bin = cprog::build("bulk", dir.path());
    const BOUND: Duration = Duration::from_secs(3);
    let mut victim_env = STREAM.to_vec();
    let bound_ms = BOUND.as_millis().to_string();
    victim_env.push(("BULK_TIMEOUT_MS", &bound_ms));

    let by = stream(&c, &bin, 1, &STREAM);
    let (v_rx, v_tx) = stream(&c, &bin, 0, &victim_env);
    let receiver = c.host(1).guests[0].domid;
    let destroyed_at = Instant::now();
    c.sim_admin(1)
        .destroy(receiver)
        .expect("destroying g0 of h1");
    let tx = v_tx.finish();
    let took = destroyed_at.elapsed();
    assert!(!tx.status.success(), "the sender went on: {tx:?}");
    let text = format!("{}{}", tx.stdout, tx.stderr);
    assert!(
        // Unreachable: the receiver's NIC left the sender's peer table before a send.
        [
            "Timed out",
            "Remote endpoint closed",
            "Aborted",
            "Remote endpoint unreachable",
        ]
        .iter()
        .any(|s| text.contains(s)),
        "no clear status: {tx:?}"
    );
    // A send started just before the destruction may run its whole bound.
    assert!(
        took < BOUND + Duration::from_secs(2),
        "the sender failed after {took:?}"
    );
    println!("g0's sender failed {took:?} after its receiver was destroyed");
    v_rx.kill_program("bulk");
    drop(v_rx.finish());
    completed(by.0, by.1);
}

#[test]
fn a_killed_xmxd_is_restarted_and_the_streams_complete() {
    if skipped("a_killed_xmxd_is_restarted_and_the_streams_complete") {
        return;
    }
    let _one = exclusive();
    let c = SimCluster::up("dxmxd", &[]);
    let dir = tempfile::tempdir().unwrap();
    let bin = cprog::build("bulk", dir.path());

    let s0 = stream(&c, &bin, 0, &STREAM);
    let s1 = stream(&c, &bin, 1, &STREAM);
    let xmxd = daemon_pid(&c, 0, "xmxd");
    // SAFETY: plain syscall on a daemon of the cluster this test brought up.
    assert_eq!(unsafe { libc::kill(xmxd, libc::SIGKILL) }, 0);
    completed(s0.0, s0.1);
    completed(s1.0, s1.1);
    // The supervisor starts a new xmxd a second after the kill, and it
    // answers on its socket with the whole table. Nothing announces another
    // process's restart: the supervisor's child and the socket are looked
    // at until both are there, within a bound.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let again = supervisor_child(&c, 0, "xmxd");
        if again.is_some_and(|p| p != xmxd) {
            let peers = Command::new(xmx_tests::bins::cluster_programs())
                .args([
                    "peers",
                    "--sim-name",
                    c.name(),
                    "--sim-host",
                    &c.host(0).name,
                ])
                .args(["--wait", "4", "--timeout", "10"])
                .output()
                .expect("running xmx peers");
            if peers.status.success() {
                break;
            }
        }
        assert!(Instant::now() < deadline, "xmxd was not started again");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_restarted_backend_recovers_its_guests_and_both_streams_complete() {
    if skipped("a_restarted_backend_recovers_its_guests_and_both_streams_complete") {
        return;
    }
    let _one = exclusive();
    let c = SimCluster::up("dbackd", &[]);
    let dir = tempfile::tempdir().unwrap();
    let bin = cprog::build("bulk", dir.path());
    // A send that recovery left behind fails with a clear status within this
    // bound (the default request timeout is minutes); recovery itself takes
    // the supervisor's restart delay and a handshake.
    let mut env = STREAM.to_vec();
    env.push(("BULK_TIMEOUT_MS", "30000"));
    let mut streams = [stream(&c, &bin, 0, &env), stream(&c, &bin, 1, &env)];
    for (rx, _) in &mut streams {
        rx.wait_line(Duration::from_secs(60), |l| l == "holding");
    }
    // Both senders have lent their last message's window and wait for the
    // receivers' pulls when h0's backend dies under them.
    let backd = daemon_pid(&c, 0, "xmx-backd");
    // SAFETY: plain syscall on a daemon of the cluster this test brought up.
    assert_eq!(unsafe { libc::kill(backd, libc::SIGKILL) }, 0);
    for (rx, _) in &mut streams {
        rx.send_line("go");
    }
    // The supervisor starts it again; it recovers the guests' devices from
    // xenstore, the frontends open their endpoints again with their sessions
    // and regions, and the libraries' retransmissions finish the streams:
    // every message received once, byte for byte.
    for (rx, tx) in streams {
        ended(rx, tx);
    }
    let restarted = daemon_pid(&c, 0, "xmx-backd");
    assert_ne!(restarted, backd, "xmx-backd was not restarted");
}

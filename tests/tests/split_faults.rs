//! Faults in one guest do not reach the others: while guest g1 of h0 streams
//! to guest g1 of h1, the application streaming 16 MiB messages from g0 of
//! h0 to g0 of h1 is killed (SIGKILL), or its whole domain destroyed. The
//! backend of h0 lets go of everything of g0's (the simulated hypervisor's
//! counters of dom0's mappings and of g0's grants mapped by others return to
//! their idle values) and the other stream completes, every byte checked.
//!
//! Needs root (namespaces, veths, AF_PACKET); skipped with the reason
//! otherwise.

use std::path::Path;
use std::time::Duration;

use xmx_hv::DOM0;
use xmx_tests::app::{strip_ansi, App, Finished};
use xmx_tests::cluster::{exclusive, skipped, SimCluster};
use xmx_tests::cprog;

/// The bystanders' stream; its receiver holds the last message back until
/// the fault has been dealt with, so the stream is in progress meanwhile.
const BYSTANDER: [(&str, &str); 3] = [
    ("BULK_COUNT", "24"),
    ("BULK_SIZE", "1048576"),
    ("BULK_HOLD", "1"),
];
const BYSTANDER_COUNT: usize = 24;
/// The victim's stream; its receiver, too, holds the last message back: by
/// then every transfer before it is over and the last one waits, its window
/// lent, so the fault strikes a stream in a known state (struck in the
/// middle of a pull, the receiver would see its receive fail and exit).
const VICTIM: [(&str, &str); 3] = [
    ("BULK_COUNT", "6"),
    ("BULK_SIZE", "16777216"),
    ("BULK_HOLD", "1"),
];
/// How long the backend may take to let go.
const RELEASE: Duration = Duration::from_secs(20);

/// A `bulk` stream from guest `g` of h0 to guest `g` of h1, started and
/// seen delivering its first message: (receiver, sender).
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

/// The bystanders' stream, held before its last message, is let go and
/// ends with every message received and checked.
fn completed(mut rx: App, tx: App, count: usize) {
    rx.wait_line(Duration::from_secs(60), |l| l == "holding");
    rx.send_line("go");
    let (tx, rx): (Finished, Finished) = (tx.finish(), rx.finish());
    tx.passed();
    let out = rx.passed();
    assert_eq!(
        out.lines().filter(|l| l.starts_with("received ")).count(),
        count,
        "{out}"
    );
}

/// What a host's dom0 maps and a guest's grants others map, idle.
struct Idle {
    dom0_mappings: [usize; 2],
    victim_mapped: usize,
}

fn idle(c: &SimCluster, victim: u16) -> Idle {
    let idle = Idle {
        dom0_mappings: [0, 1].map(|h| c.domain_state(h, DOM0).mappings_held),
        victim_mapped: c.domain_state(0, victim).grants_mapped_by_others,
    };
    assert!(
        idle.victim_mapped > 0,
        "the backend maps the victim's control ring"
    );
    println!(
        "idle: dom0 of h0 maps {} pages, of h1 {}; h0's backend maps {} of the victim's",
        idle.dom0_mappings[0], idle.dom0_mappings[1], idle.victim_mapped
    );
    idle
}

/// Waits until the victim's sender lends a 16 MiB window (its pages mapped
/// by h0's backend): the middle of a transfer. Returns how many of its pages
/// are mapped then.
fn lending(c: &SimCluster, victim: u16, idle: &Idle) -> usize {
    let window = 16 << 20 >> 12;
    let r = c.wait_domain(0, victim, RELEASE, |s| {
        s.grants_mapped_by_others >= idle.victim_mapped + window
    });
    r.unwrap_or_else(|s| panic!("the victim never lent its window: {s:?}"))
        .grants_mapped_by_others
}

fn dom0_back_to(c: &SimCluster, host: usize, expected: usize) {
    let r = c.wait_domain(host, DOM0, RELEASE, |s| s.mappings_held == expected);
    assert!(
        r.is_ok(),
        "h{host}'s dom0 still maps more than when idle ({expected}): {r:?}"
    );
}

#[test]
fn a_killed_application_leaves_nothing_mapped() {
    if skipped("a_killed_application_leaves_nothing_mapped") {
        return;
    }
    let _one = exclusive();
    let c = SimCluster::up("skill", &[]);
    let dir = tempfile::tempdir().unwrap();
    let bin = cprog::build("bulk", dir.path());
    let victim = c.host(0).guests[0].domid;
    let before = idle(&c, victim);

    let (by_rx, by_tx) = stream(&c, &bin, 1, &BYSTANDER);
    let (mut v_rx, v_tx) = stream(&c, &bin, 0, &VICTIM);
    v_rx.wait_line(Duration::from_secs(60), |l| l == "holding");
    let busy = lending(&c, victim, &before);
    assert!(v_tx.kill_program("bulk"), "the sender runs");
    let killed = v_tx.finish();
    assert!(!killed.status.success(), "killed: {killed:?}");
    // g0's endpoint and windows are gone from h0's backend while the
    // bystanders go on.
    let r = c.wait_domain(0, victim, RELEASE, |s| {
        s.grants_mapped_by_others == before.victim_mapped
    });
    assert!(r.is_ok(), "h0's backend still maps g0's pages: {r:?}");
    println!(
        "after the kill: {busy} of g0's pages mapped, then {}; dom0 of h0 maps {} with the bystanders",
        before.victim_mapped,
        c.domain_state(0, DOM0).mappings_held
    );
    // The receiver holds before a message that will not come.
    assert!(v_rx.kill_program("bulk"), "the receiver still waits");
    drop(v_rx.finish());

    completed(by_rx, by_tx, BYSTANDER_COUNT);
    dom0_back_to(&c, 0, before.dom0_mappings[0]);
    dom0_back_to(&c, 1, before.dom0_mappings[1]);
}

#[test]
fn a_destroyed_guest_leaves_nothing_mapped() {
    if skipped("a_destroyed_guest_leaves_nothing_mapped") {
        return;
    }
    let _one = exclusive();
    let c = SimCluster::up("sdestroy", &[]);
    let dir = tempfile::tempdir().unwrap();
    let bin = cprog::build("bulk", dir.path());
    let victim = c.host(0).guests[0].domid;
    let before = idle(&c, victim);

    let (by_rx, by_tx) = stream(&c, &bin, 1, &BYSTANDER);
    let (v_rx, v_tx) = stream(&c, &bin, 0, &VICTIM);
    let busy = lending(&c, victim, &before);
    c.sim_admin(0).destroy(victim).expect("destroying g0 of h0");
    // Whatever the victim's processes do now, the backend unmaps all of
    // g0's pages (its control ring too: the device is gone).
    backend_forgets(&c, 0, victim);
    println!(
        "after the destruction: {busy} of g0's pages were mapped; dom0 of h0 maps {} with the bystanders",
        c.domain_state(0, DOM0).mappings_held
    );
    for app in [v_tx, v_rx] {
        app.kill_program("bulk");
        drop(app.finish());
    }
    completed(by_rx, by_tx, BYSTANDER_COUNT);
    dom0_back_to(&c, 0, before.dom0_mappings[0] - before.victim_mapped);
    dom0_back_to(&c, 1, before.dom0_mappings[1]);
}

/// Waits until host `host`'s backend lists no device of domain `domid`.
/// There is no event for it: the backend is asked until it says so.
fn backend_forgets(c: &SimCluster, host: usize, domid: u16) {
    let deadline = std::time::Instant::now() + RELEASE;
    let mut backd = c.backd(host);
    loop {
        let guests = backd
            .call(&xmx_backend::admin::BackdRequest::Guests)
            .expect("backd guests");
        let present = guests
            .as_array()
            .into_iter()
            .flatten()
            .any(|g| g["domid"].as_u64() == Some(u64::from(domid)));
        if !present {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "h{host}'s backend still serves the destroyed guest: {guests}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn an_endpoint_comes_back_after_suspend_and_resume() {
    if skipped("an_endpoint_comes_back_after_suspend_and_resume") {
        return;
    }
    let _one = exclusive();
    let c = SimCluster::up("sresume", &[]);
    let dir = tempfile::tempdir().unwrap();
    let bin = cprog::build("bulk", dir.path());
    let env = [("BULK_COUNT", "3"), ("BULK_SIZE", "1048576")];
    let mut rx = App::spawn(
        "bulk receiver in h1-g0",
        c.app(
            1,
            0,
            &bin,
            &["-l", "2"],
            &[env[0], env[1], ("MX_VERBOSE", "1")],
        ),
    );
    rx.wait_line(Duration::from_secs(30), |l| l == "ready");
    // The receiver's guest is suspended: its device disconnects and the
    // backend lets the endpoint go (keeping its session recorded); on resume
    // the daemon opens it again in that session and the library remaps it.
    let domid = c.host(1).guests[0].domid;
    let admin = c.sim_admin(1);
    admin.suspend(domid).expect("suspending h1-g0");
    c.wait_endpoint_state(1, domid, 2, false, RELEASE)
        .expect("the backend let the endpoint go");
    admin.resume(domid).expect("resuming h1-g0");
    c.wait_endpoint_state(1, domid, 2, true, RELEASE)
        .expect("the endpoint is open again");
    // A sender connecting now reaches the same endpoint, every byte intact.
    let tx = App::spawn(
        "bulk sender in h0-g0",
        c.app(0, 0, &bin, &["-d", &c.hostname(1, 0), "-e", "2"], &env),
    );
    let (tx, rx) = (tx.finish(), rx.finish());
    tx.passed();
    let out = rx.passed();
    assert_eq!(
        out.lines().filter(|l| l.starts_with("received ")).count(),
        3,
        "{out}"
    );
    let log = strip_ansi(&rx.stderr);
    assert!(log.contains("endpoint re-opened and remapped"), "{log}");
    // In its own session: peers that knew the endpoint before still reach it.
    assert!(!log.contains("new session"), "{log}");
}

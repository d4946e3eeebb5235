//! Co-located guests talk through a direct channel that dom0 brokers, and
//! fall back to the backend with nothing lost when dom0 revokes it.
//!
//! tests/c/direct.c runs its passive side in guest g1 and its active side
//! in guest g0 of host h0 (one virtual cluster): three phases of messages of
//! every class, order and bytes checked by the receiver. Between phase 1
//! and 2 the test revokes the channels (`xmx direct off`), between 2 and 3
//! it offers them again; the programs' counters show the channel carried
//! traffic (LARGE data too: the receiver pulls over the channel), was
//! closed, and came back; a suspend and resume of the passive guest does the
//! same through its frontend. With `MX_DISABLE_SHMEM=1` the same
//! program runs with no channel at all.
//!
//! The channel is on by default (`XMX_DIRECT=0` or `MX_DISABLE_SHMEM=1` turns it off).
//!
//! Needs root (namespaces, veths, AF_PACKET); skipped with the reason
//! otherwise.

use std::time::Duration;

use xmx_tests::app::{App, Finished};
use xmx_tests::cluster::{exclusive, skipped, SimCluster};
use xmx_tests::cprog;

const PASSIVE: (usize, usize) = (0, 1);
const ACTIVE: (usize, usize) = (0, 0);
const LINE: Duration = Duration::from_secs(60);
/// Senders in turn in the_last_messages_of_a_sender_that_exits_at_once_arrive.
const ROUNDS: u32 = 3;

/// The value of `key=` in a counters line.
fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

fn passed(f: &Finished) -> bool {
    f.status.success() && f.stdout.contains("PASS")
}

fn show(f: &Finished) -> String {
    format!(
        "{} ({:?}):\nstdout:\n{}\nstderr:\n{}",
        f.what, f.status, f.stdout, f.stderr
    )
}

/// Starts the pair with `env`; returns (passive, active).
fn start(c: &SimCluster, bin: &std::path::Path, env: &[(&str, &str)]) -> (App, App) {
    let p = App::spawn(
        "direct -l 2 (passive)",
        c.app(PASSIVE.0, PASSIVE.1, bin, &["-l", "2"], env),
    );
    c.wait_endpoint(PASSIVE.0, PASSIVE.1, 2, Duration::from_secs(30));
    let peer = c.hostname(PASSIVE.0, PASSIVE.1);
    let a = App::spawn(
        "direct -d (active)",
        c.app(ACTIVE.0, ACTIVE.1, bin, &["-d", &peer, "-e", "2"], env),
    );
    (p, a)
}

fn pairs(c: &SimCluster) -> usize {
    c.admin(0, &["direct"])["pairs"]
        .as_array()
        .map_or(0, Vec::len)
}

/// Runs direct.c's three phases between h0's two guests, which must use their channel
/// (`XMX_EXPECT_DIRECT=1`): `revoke` runs between phases 1 and 2 and must end the channel,
/// `restore` between phases 2 and 3 (or `revoke` already) must bring it back. Checks what
/// every such run shows: phase 1 on the channel, the channel closed before phase 2, open
/// again and used in phase 3, and all 900 messages of every class received in order,
/// lengths and bytes checked, LARGE data pulled over the channel.
fn three_phases(tag: &str, revoke: impl FnOnce(&SimCluster), restore: impl FnOnce(&SimCluster)) {
    let _g = exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = cprog::build("direct", dir.path());
    let c = SimCluster::up(tag, &[]);
    // Two guests per host, all in the default cluster: one pair per host.
    assert_eq!(pairs(&c), 1, "h0's xmxd offers its one pair");

    let env = [("XMX_EXPECT_DIRECT", "1")];
    let (p, mut a) = start(&c, &bin, &env);
    let one = a.wait_line(LINE, |l| l.starts_with("phase 1 "));
    assert!(
        field(&one, "direct-sent") > 0,
        "phase 1 used the channel: {one}"
    );
    assert!(field(&one, "opened") >= 1, "{one}");
    assert_eq!(field(&one, "broken"), 0, "{one}");

    revoke(&c);
    a.send_line("go");
    let two = a.wait_line(LINE, |l| l.starts_with("phase 2 "));
    assert!(
        field(&two, "closed") >= 1,
        "the revoke closed the channel: {two}"
    );

    restore(&c);
    a.send_line("go");
    let three = a.wait_line(LINE, |l| l.starts_with("phase 3 "));
    assert!(
        field(&three, "opened") >= 2,
        "the channel came back: {three}"
    );
    assert!(
        field(&three, "direct-sent") > field(&two, "direct-sent"),
        "phase 3 used the channel again: {two} / {three}"
    );
    let a = a.finish();
    let p = p.finish();
    assert!(passed(&p) && passed(&a), "{}\n{}", show(&p), show(&a));
    // The passive side checked all 900 messages: order, lengths, bytes.
    assert!(
        p.stdout.contains("received 900 messages in order"),
        "{}",
        show(&p)
    );
    let last = p
        .stdout
        .lines()
        .find(|l| l.starts_with("passive "))
        .expect("passive counters");
    assert!(field(last, "direct-received") > 0, "{last}");
    assert!(
        field(last, "pulls") > 0,
        "LARGE data went over the channel: {last}"
    );
    assert_eq!(field(last, "broken"), 0, "{last}");
    println!("active: {one}\nactive: {two}\nactive: {three}\n{last}");
}

#[test]
fn co_located_guests_use_a_direct_channel_and_fall_back_when_revoked() {
    if skipped("split_direct") {
        return;
    }
    three_phases(
        "dir",
        |c| {
            let off = c.admin(0, &["direct", "off"]);
            assert_eq!(off["enabled"], false);
            assert_eq!(pairs(c), 0, "revoked");
        },
        |c| {
            c.admin(0, &["direct", "on"]);
            assert_eq!(pairs(c), 1, "offered again");
        },
    );
}

/// Waits until h0's xmxd offers `n` pairs. The offers are xenstore nodes the test has no
/// watch on, so xmxd is asked until it says so, within a bound.
fn wait_pairs(c: &SimCluster, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = pairs(c);
        if now == n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "h0 offers {now} pairs, not {n}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_suspended_guest_loses_its_channel_and_gets_it_back_when_it_resumes() {
    if skipped("split_direct") {
        return;
    }
    // The passive side's guest is suspended: its frontend closes the device, and xmxd
    // revokes the pair at once; on resume it connects again and is offered the pair.
    three_phases(
        "dsus",
        |c| {
            let domid = c.host(PASSIVE.0).guests[PASSIVE.1].domid;
            let admin = c.sim_admin(PASSIVE.0);
            admin.suspend(domid).expect("suspending h0-g1");
            wait_pairs(c, 0);
            admin.resume(domid).expect("resuming h0-g1");
            wait_pairs(c, 1);
        },
        |_| {},
    );
}

#[test]
fn disable_shmem_keeps_co_located_guests_on_the_backend() {
    if skipped("split_direct") {
        return;
    }
    let _g = exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = cprog::build("direct", dir.path());
    let c = SimCluster::up("dirx", &[]);
    let env = [("MX_DISABLE_SHMEM", "1")];
    let (p, mut a) = start(&c, &bin, &env);
    for phase in 1..=3 {
        let line = a.wait_line(LINE, |l| l.starts_with(&format!("phase {phase} ")));
        assert_eq!(field(&line, "direct-sent"), 0, "{line}");
        assert_eq!(field(&line, "opened"), 0, "{line}");
        if phase < 3 {
            a.send_line("go");
        }
    }
    let a = a.finish();
    let p = p.finish();
    assert!(passed(&p) && passed(&a), "{}\n{}", show(&p), show(&a));
    let last = p
        .stdout
        .lines()
        .find(|l| l.starts_with("passive "))
        .expect("passive counters");
    assert_eq!(field(last, "direct-received"), 0, "{last}");
    assert_eq!(field(last, "pulls"), 0, "{last}");
}

/// Runs the pair with the active side (g0, which creates the channel and
/// sends the data) misbehaving as `fault` says; the passive side must
/// receive every message in order all the same. Returns the passive side's
/// counters line.
fn against_hostile_peer(tag: &str, fault: &str) -> String {
    let _g = exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = cprog::build("direct", dir.path());
    let c = SimCluster::up(tag, &[]);
    let p = App::spawn(
        "direct -l 2 (victim)",
        c.app(PASSIVE.0, PASSIVE.1, &bin, &["-l", "2"], &[]),
    );
    c.wait_endpoint(PASSIVE.0, PASSIVE.1, 2, Duration::from_secs(30));
    let peer = c.hostname(PASSIVE.0, PASSIVE.1);
    let mut a = App::spawn(
        &format!("direct -d (hostile: {fault})"),
        c.app(
            ACTIVE.0,
            ACTIVE.1,
            &bin,
            &["-d", &peer, "-e", "2"],
            &[("XMX_DIRECT_FAULT", fault)],
        ),
    );
    for phase in 1..=2 {
        a.wait_line(LINE, |l| l.starts_with(&format!("phase {phase} ")));
        a.send_line("go");
    }
    let a = a.finish();
    let p = p.finish();
    assert!(passed(&p) && passed(&a), "{}\n{}", show(&p), show(&a));
    assert!(
        p.stdout.contains("received 900 messages in order"),
        "{}",
        show(&p)
    );
    let last = p
        .stdout
        .lines()
        .find(|l| l.starts_with("passive "))
        .expect("passive counters")
        .to_owned();
    println!("{fault}: {last}");
    last
}

#[test]
fn a_peer_publishing_a_garbage_index_breaks_only_its_channel() {
    if skipped("split_direct") {
        return;
    }
    let last = against_hostile_peer("dirgi", "garbage-index");
    assert!(field(&last, "direct-received") > 0, "{last}");
    assert!(field(&last, "broken") >= 1, "the victim noticed: {last}");
}

#[test]
fn a_peer_rewriting_a_slot_breaks_only_its_channel() {
    if skipped("split_direct") {
        return;
    }
    let last = against_hostile_peer("dirrw", "rewritten-slot");
    assert!(field(&last, "direct-received") > 0, "{last}");
    assert!(field(&last, "broken") >= 1, "the victim noticed: {last}");
}

#[test]
fn a_peer_that_stops_mid_message_leaves_the_pull_to_the_backend() {
    if skipped("split_direct") {
        return;
    }
    let last = against_hostile_peer("dirst", "stop-large");
    assert!(
        field(&last, "stalled") >= 1,
        "the victim gave up on the peer: {last}"
    );
    assert_eq!(field(&last, "broken"), 0, "{last}");
}

/// Pages of a direct channel (the control page and two 512 KiB lanes), as
/// the survivor maps them.
const CHANNEL_PAGES: usize = 1 + 2 * 128;

/// Lines of `/proc/<pid>/maps` of `root`'s processes naming `needle`.
fn mapped(root: i32, needle: &str) -> Vec<String> {
    let mut pids = vec![root];
    pids.extend(xmx_tests::app::descendants(root));
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/maps")).ok())
        .flat_map(|m| {
            m.lines()
                .filter(|l| l.contains(needle))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn a_peer_destroyed_mid_large_leaves_nothing_mapped_and_the_endpoint_working() {
    if skipped("split_direct") {
        return;
    }
    let _g = exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = cprog::build("direct", dir.path());
    // The backend fails the survivor's pull from the destroyed guest once its retries
    // run out: ten of them (about twenty seconds), not the default's two minutes of
    // patience for a source that may be migrating.
    let c = SimCluster::up("dirds", &[("XMX_PULL_RETRIES", "10")]);
    let doomed = c.host(ACTIVE.0).guests[ACTIVE.1].domid;
    let survivor = c.host(PASSIVE.0).guests[PASSIVE.1].domid;
    assert!(doomed < survivor, "g0 creates the channel, g1 maps it");
    // The survivor never gives up on the pull by itself: only the
    // destruction ends it.
    let mut p = App::spawn(
        "direct -l 2 (survivor)",
        c.app(
            PASSIVE.0,
            PASSIVE.1,
            &bin,
            &["-l", "2"],
            &[("XMX_SURVIVE_PEER", "1"), ("XMX_DIRECT_STALL_MS", "600000")],
        ),
    );
    c.wait_endpoint(PASSIVE.0, PASSIVE.1, 2, Duration::from_secs(30));
    let peer = c.hostname(PASSIVE.0, PASSIVE.1);
    let mut a = App::spawn(
        "direct -d (doomed, never serves a pull)",
        c.app(
            ACTIVE.0,
            ACTIVE.1,
            &bin,
            &["-d", &peer, "-e", "2"],
            &[
                ("XMX_DIRECT_FAULT", "stop-large"),
                ("XMX_EXPECT_DIRECT", "1"),
            ],
        ),
    );
    // Every send of phase 1 is posted; the survivor takes the messages
    // before the first LARGE one (the tenth) and pulls it over the channel,
    // which maps the doomed guest's pages.
    a.wait_line(LINE, |l| l == "posted phase 1");
    let r = c.wait_domain(0, survivor, LINE, |s| s.mappings_held >= CHANNEL_PAGES);
    assert!(r.is_ok(), "the survivor maps the channel: {r:?}");
    // The domain's memory is simhv's memfd, named after the domain ("/memfd:xmx-simhv:domN
    // (deleted)" in the maps).
    let needle = format!("xmx-simhv:dom{doomed} ");
    assert!(
        !mapped(p.pid(), &needle).is_empty(),
        "the survivor's process maps {needle}"
    );

    c.sim_admin(0).destroy(doomed).expect("destroying g0 of h0");
    // dom0 revokes the channel; the survivor unmaps, and its pull goes to
    // the backend, which fails it: the peer is gone.
    let r = c.wait_domain(0, survivor, LINE, |s| s.mappings_held == 0);
    assert!(r.is_ok(), "the survivor still maps pages: {r:?}");
    // xmxd revokes the pair when it learns of the destruction, which may be
    // after the survivor has already let the channel go (its peer's port
    // closed): wait for it, bounded.
    let deadline = std::time::Instant::now() + LINE;
    while pairs(&c) != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "xmxd still offers the pair of a destroyed guest: {}",
            c.admin(0, &["direct"])
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    p.wait_line(LINE, |l| l == "endpoint works after the peer went");
    let left = mapped(p.pid(), &needle);
    assert!(
        left.is_empty(),
        "the survivor still maps {needle}: {left:?}"
    );
    p.send_line("done");
    let p = p.finish();
    assert!(passed(&p), "{}", show(&p));
    assert!(p.stdout.contains("lost message 9:"), "{}", show(&p));
    a.kill_program("direct");
    drop(a.finish());
}

/// MX completes an eager send once it is buffered, so a sender may close
/// its endpoint and exit while its last messages are still on the channel;
/// closing ends the channel. The receiver must still get every one of them,
/// although the first thing its library learns is that the channel ended
/// (it never asks to be signalled, and its application waits on stdin):
/// they are taken off the channel before it is let go, as a NIC delivers
/// what a closed port sent. Three senders in turn, each a new process.
#[test]
fn the_last_messages_of_a_sender_that_exits_at_once_arrive() {
    if skipped("split_direct") {
        return;
    }
    let _g = exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = cprog::build("last_words", dir.path());
    let c = SimCluster::up("dirlw", &[]);
    let receiver_dom = c.host(PASSIVE.0).guests[PASSIVE.1].domid;
    let mut p = App::spawn(
        "last_words -l 2 (receiver)",
        c.app(
            PASSIVE.0,
            PASSIVE.1,
            &bin,
            &["-l", "2"],
            &[("XMX_DIRECT_FAULT", "unarmed")],
        ),
    );
    let peer = c.hostname(PASSIVE.0, PASSIVE.1);
    for round in 1..=ROUNDS {
        p.wait_line(LINE, |l| l == format!("waiting for burst {round}"));
        let mut a = App::spawn(
            &format!("last_words -d (sender {round})"),
            c.app(ACTIVE.0, ACTIVE.1, &bin, &["-d", &peer, "-e", "2"], &[]),
        );
        a.wait_line(LINE, |l| l == "ready");
        let r = c.wait_domain(PASSIVE.0, receiver_dom, LINE, |s| {
            s.mappings_held >= CHANNEL_PAGES
        });
        assert!(
            r.is_ok(),
            "round {round}: the receiver maps the channel: {r:?}"
        );
        a.send_line("go");
        let a = a.finish();
        assert!(passed(&a), "{}", show(&a));
        let line = a
            .stdout
            .lines()
            .find(|l| l.starts_with("burst of 16 sent"))
            .unwrap_or_else(|| panic!("no burst line: {}", show(&a)));
        assert!(
            field(line, "direct-sent") >= 16,
            "round {round}: the burst went over the channel: {line}"
        );
        let r = c.wait_domain(PASSIVE.0, receiver_dom, LINE, |s| s.mappings_held == 0);
        assert!(
            r.is_ok(),
            "round {round}: the receiver unmaps the ended channel: {r:?}"
        );
        p.send_line("go");
        p.wait_line(LINE, |l| l == format!("received burst {round}"));
    }
    let p = p.finish();
    assert!(passed(&p), "{}", show(&p));
}

/// A full send window of 32 KiB MEDIUM messages to a co-located peer that takes nothing
/// meanwhile (the test stops its process) is more than the channel's lane holds: the
/// messages that do not fit go through the backend, each whole. A message whose first
/// fragments went onto the lane and whose last ones, finding it full, went to the backend
/// (which sends a MEDIUM only once it has all of its fragments) reached the peer
/// incomplete and waited for a retransmission, half a second: MPI's bandwidth test over
/// co-located guests ran at 3-40 MB/s at 32 KiB, against 1-4 GB/s at 16 and 64 KiB. The
/// sender runs with a resend delay of ten minutes here, so such a message never arrives
/// within the receiver's bounded waits.
#[test]
fn a_medium_message_that_does_not_fit_the_lane_goes_whole_through_the_backend() {
    if skipped("split_direct") {
        return;
    }
    let _g = exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = cprog::build("direct_medium", dir.path());
    let c = SimCluster::up("dirmed", &[]);
    let mut p = App::spawn(
        "direct_medium -l 2 (receiver)",
        c.app(PASSIVE.0, PASSIVE.1, &bin, &["-l", "2"], &[]),
    );
    c.wait_endpoint(PASSIVE.0, PASSIVE.1, 2, Duration::from_secs(30));
    let peer = c.hostname(PASSIVE.0, PASSIVE.1);
    let mut a = App::spawn(
        "direct_medium -d (sender)",
        c.app(
            ACTIVE.0,
            ACTIVE.1,
            &bin,
            &["-d", &peer, "-e", "2"],
            // The close lingers 1.5 resend delays by default.
            &[("XMX_RESEND_DELAY_US", "600000000"), ("XMX_LINGER_MS", "0")],
        ),
    );
    p.wait_line(LINE, |l| l == "ready");
    a.wait_line(LINE, |l| l == "ready");
    assert!(
        p.stop_program("direct_medium", LINE),
        "the receiver is stopped"
    );
    a.send_line("go");
    let posted = a.wait_line(LINE, |l| l.starts_with("posted "));
    assert!(
        p.signal_program("direct_medium", libc::SIGCONT),
        "the receiver goes on"
    );
    p.send_line("go");
    let p = p.finish();
    let a = a.finish();
    assert!(passed(&p) && passed(&a), "{}\n{}", show(&p), show(&a));
    assert!(
        p.stdout.contains("received 16 messages in order"),
        "{}",
        show(&p)
    );
    // 16 messages of 8 fragments: the lane took some and not all of them.
    let direct = field(&posted, "direct-frames");
    assert!((8..128).contains(&direct), "the lane filled up: {posted}");
}

/// A co-located peer is killed while its library holds a direct channel: a synchronous
/// send to it ends as it does through the backend (its endpoint closed), in bounded
/// time, instead of resending into a ring nobody reads until the resend budget runs out.
/// The guest daemon of the killed process ends the channels its library made or
/// accepted, as the library would have on a close: the killed side is the channel's
/// acceptor (g1, the higher domain id) in one run and its creator (g0) in the other.
#[test]
fn a_send_to_a_killed_co_located_peer_ends_as_through_the_backend() {
    if skipped("a_send_to_a_killed_co_located_peer_ends_as_through_the_backend") {
        return;
    }
    let _g = exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = cprog::build("dead_peer", dir.path());
    let c = SimCluster::up("ddead", &[]);
    let mut outcomes = Vec::new();
    for (env, victim, sender) in [
        (&[("MX_DISABLE_SHMEM", "1")][..], PASSIVE, ACTIVE),
        (&[("XMX_TEST_DIRECT", "1")][..], PASSIVE, ACTIVE),
        (&[("XMX_TEST_DIRECT", "1")][..], ACTIVE, PASSIVE),
    ] {
        let peer = c.hostname(victim.0, victim.1);
        let domid = c.host(victim.0).guests[victim.1].domid;
        let mut p = App::spawn(
            &format!("dead_peer -l 2 in {peer}"),
            c.app(victim.0, victim.1, &bin, &["-l", "2"], env),
        );
        c.wait_endpoint(victim.0, victim.1, 2, Duration::from_secs(30));
        let mut a = App::spawn(
            "dead_peer -d",
            c.app(sender.0, sender.1, &bin, &["-d", &peer, "-e", "2"], env),
        );
        p.wait_line(LINE, |l| l == "got");
        a.wait_line(LINE, |l| l == "ready");
        assert!(p.kill_program("dead_peer"), "the passive side runs");
        drop(p.finish());
        // Its guest daemon closed the endpoint in the backend.
        c.wait_endpoint_state(victim.0, domid, 2, false, LINE)
            .expect("the killed program's endpoint is closed");
        a.send_line("go");
        let a = a.finish();
        assert!(a.status.success(), "{}", show(&a));
        let line = a
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("issend: "))
            .unwrap_or_else(|| panic!("no outcome: {}", show(&a)))
            .to_owned();
        eprintln!("{env:?}, {peer} killed: issend: {line}");
        outcomes.push(line.split(" in ").next().unwrap_or("").to_owned());
    }
    assert_eq!(
        outcomes, ["Remote endpoint closed"; 3],
        "through the backend, then to a killed acceptor and a killed creator of a channel"
    );
}

/// A sender that outruns its receiver finds the channel's ring full in the middle of
/// a stream of the largest MEDIUM messages (a send window of them is more than the ring
/// holds). No message may be split between the ring and the backend, which carries a
/// MEDIUM only whole: a split one would wait for the sender's retransmission. With the
/// retransmission delay far beyond the programs' bounded waits, every message must
/// arrive in order and byte-exact without one, nearly all of them over the channel.
#[test]
fn a_stream_that_fills_the_ring_mid_message_needs_no_retransmission() {
    if skipped("split_direct") {
        return;
    }
    let _g = exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = cprog::build("medium_stream", dir.path());
    let c = SimCluster::up("dirstr", &[]);
    // Ten minutes: a message that needs a retransmission fails the receiver's
    // 30 s wait for it. The close's linger follows the resend delay unless set.
    let env = [("XMX_RESEND_DELAY_US", "600000000"), ("XMX_LINGER_MS", "0")];
    let (p, a) = start(&c, &bin, &env);
    let a = a.finish();
    let p = p.finish();
    assert!(
        passed(&p) && passed(&a),
        "{}\n{}\nthe backend's counters: {}",
        show(&p),
        show(&a),
        c.admin(0, &["counters"])
    );
    let line = p
        .stdout
        .lines()
        .find(|l| l.starts_with("received 1500 messages in order"))
        .unwrap_or_else(|| panic!("{}", show(&p)));
    // 8 fragments a message; the first few may go through the backend while
    // the peer accepts the channel.
    assert!(
        field(line, "direct-received") >= 1500 * 8 * 9 / 10,
        "the stream went over the channel: {line}"
    );
    println!("{line}");
}

/// Runs tests/c/bibw.c between h0's two guests (`window` receives and sends of 1 MiB each
/// way, `rounds` times; every byte checked), with `passive_env` added on the passive side
/// and the cluster's daemons started with `daemons_env`; returns how many pulls of each side,
/// (active, passive), went over the channel.
fn bibw(
    tag: &str,
    window: u32,
    rounds: u32,
    passive_env: &[(&str, &str)],
    daemons_env: &[(&str, &str)],
) -> (u64, u64) {
    let _g = exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = cprog::build("bibw", dir.path());
    let c = SimCluster::up(tag, daemons_env);
    let (window, rounds) = (window.to_string(), rounds.to_string());
    let env = [
        ("BIBW_LEN", "1048576"),
        ("BIBW_WINDOW", window.as_str()),
        ("BIBW_ROUNDS", rounds.as_str()),
        ("XMX_LINGER_MS", "0"),
        ("XMX_EXPECT_DIRECT", "1"),
    ];
    let mut penv = env.to_vec();
    penv.extend_from_slice(passive_env);
    let p = App::spawn(
        "bibw -l 2 (passive)",
        c.app(PASSIVE.0, PASSIVE.1, &bin, &["-l", "2"], &penv),
    );
    c.wait_endpoint(PASSIVE.0, PASSIVE.1, 2, Duration::from_secs(30));
    let peer = c.hostname(PASSIVE.0, PASSIVE.1);
    let a = App::spawn(
        "bibw -d (active)",
        c.app(ACTIVE.0, ACTIVE.1, &bin, &["-d", &peer, "-e", "2"], &env),
    );
    let a = a.finish();
    let p = p.finish();
    assert!(passed(&p) && passed(&a), "{}\n{}", show(&p), show(&a));
    let pulls = |f: &Finished, side: &str| {
        let line = f
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("{side}: direct-pulls=")))
            .unwrap_or_else(|| panic!("{}", show(f)));
        println!("{line}");
        field(line, "direct-pulls")
    };
    (pulls(&a, "active"), pulls(&p, "passive"))
}

/// Both guests pull LARGE messages from each other at once (osu_bibw's pattern): each
/// side's lane fills with the data it serves, and a pull request that finds its lane full
/// waits there for room. It went through the backend instead, whose copy of the peer's
/// window did not hold the data yet (the peer lent it over the channel), so that pull
/// waited for the backend's retry, half a second: MPI's bidirectional bandwidth between
/// co-located guests fell from 10 GB/s at 64 KiB to 0.2-1.2 GB/s from 128 KiB. Every pull
/// must now go over the channel.
#[test]
fn guests_pulling_from_each_other_at_once_keep_every_pull_on_the_channel() {
    if skipped("split_direct") {
        return;
    }
    let (active, passive) = bibw("dirbibw", 8, 32, &[], &[]);
    assert_eq!(
        active,
        8 * 32,
        "every pull of the active side went over the channel"
    );
    assert_eq!(
        passive,
        8 * 32,
        "every pull of the passive side went over the channel"
    );
}

/// A guest serving more pulls than it keeps (`XMX_DIRECT_FAULT=busy`: it refuses every
/// one) fills the refused pull's window for the backends before it refuses, so the peer's
/// pull through the backends finds the data there at once. It filled the window only when
/// its backend asked for it, after the peer's first pull was dropped, and the peer waited
/// for its backend's retry (half a second; ten minutes here, beyond the programs' time
/// limit).
#[test]
fn a_pull_refused_over_the_channel_finds_its_data_in_the_backends_at_once() {
    if skipped("split_direct") {
        return;
    }
    let (active, passive) = bibw(
        "dirbusy",
        4,
        4,
        &[("XMX_DIRECT_FAULT", "busy")],
        &[("XMX_PULL_TIMEOUT_MS", "600000")],
    );
    assert_eq!(
        active, 0,
        "the passive side refused every pull over the channel"
    );
    assert_eq!(
        passive,
        4 * 4,
        "the active side served every pull over the channel"
    );
}

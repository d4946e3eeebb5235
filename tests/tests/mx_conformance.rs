//! The MX conformance suite: C programs reproducing what real MX and MPI
//! applications do, each checking every completion's status field by field
//! and every byte, run in every layout xmx supports:
//!
//! - loopback: both sides in one process (`XMX_TRANSPORT=loopback`);
//! - native: two processes in two network namespaces joined by a veth, on
//!   the native transport, and two processes on one interface;
//! - guests of a simulated cluster, on two hosts and on one host;
//! - the same across hosts whose links lose, duplicate, reorder and delay
//!   frames.
//!
//! Each layout is brought up once and runs every program. The layouts but
//! loopback need root (namespaces, veths, AF_PACKET); they are skipped with
//! the reason otherwise.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use xmx_nic::testbed::VethPair;
use xmx_tests::app::App;
use xmx_tests::bins::lib_dir;
use xmx_tests::cluster::{exclusive, netns_cmd, skipped, unavailable, SimCluster};
use xmx_tests::cprog;
use xmx_tests::relay::{ImpairedLinks, Impairment};

/// Programs with a passive and an active side, and what the active side
/// prints once every check held.
const PAIRS: [(&str, &str); 6] = [
    ("self_send", "75 messages to itself checked"),
    (
        "zero_issend",
        "20 rounds of 0 B issends with sends behind them",
    ),
    ("class_sizes", "17 sizes x 3 buffers sent and checked"),
    ("ring_exchange", "rings of 2 and 4: every sum checked"),
    (
        "ctxid_any",
        "data and control messages sent with context ids",
    ),
    ("bibw", "active: 2 rounds of 64 x 524288 bytes each way"),
];

/// What the passive sides print once every check held.
const PASSIVE_LINES: [(&str, &str); 6] = [
    ("self_send", "75 messages to itself checked"),
    ("zero_issend", "PASS"),
    ("class_sizes", "17 sizes x 3 buffers received and checked"),
    ("ring_exchange", "rings of 2 and 4: every sum checked"),
    (
        "ctxid_any",
        "context ids, handler-posted receives and masked completions checked",
    ),
    ("bibw", "passive: 2 rounds of 64 x 524288 bytes each way"),
];

/// Programs of one process only (no peer).
const SINGLE: [(&str, &str); 2] = [
    ("bad_args", "bad arguments refused with MX's codes"),
    (
        "mx_internals",
        "mx_open_board, mx__get_mapper_state, mx__regcache_clean checked",
    ),
];

struct Program {
    bin: PathBuf,
    name: &'static str,
    active_line: &'static str,
    passive_line: &'static str,
}

fn build_pairs(dir: &Path) -> Vec<Program> {
    PAIRS
        .iter()
        .zip(PASSIVE_LINES)
        .map(|(&(name, active_line), (_, passive_line))| Program {
            bin: cprog::build(name, dir),
            name,
            active_line,
            passive_line,
        })
        .collect()
}

fn check(place: &str, p: &Program, passive: &str, active: &str) {
    assert!(
        active.contains(p.active_line),
        "{place}: {}'s active side did not say {:?}:\n{active}",
        p.name,
        p.active_line
    );
    assert!(
        passive.contains(p.passive_line),
        "{place}: {}'s passive side did not say {:?}:\n{passive}",
        p.name,
        p.passive_line
    );
    println!("{place}: {} passed", p.name);
}

/// Runs `bin` with the loopback transport (none of the MX or xmx knobs the
/// test's environment may hold, only `env`); returns its (stdout, stderr)
/// once it passed.
fn on_loopback_with_stderr(bin: &Path, env: &[(&str, &str)]) -> (String, String) {
    let mut cmd = Command::new("timeout");
    cmd.args(["-k", "5", "300"])
        .arg(bin)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("XMX_TRANSPORT", "loopback")
        .env_remove("MX_ERRORS_ARE_FATAL")
        .env_remove("MX_RCACHE")
        .env_remove("RUST_LOG")
        .env_remove("XMX_STALL_REPORT_MS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().expect("running the program");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        o.status.success() && stdout.contains("PASS"),
        "{} failed ({:?}):\n{stdout}\n{stderr}",
        bin.display(),
        o.status,
    );
    (stdout, stderr)
}

/// [`on_loopback_with_stderr`]'s stdout.
fn on_loopback(bin: &Path, env: &[(&str, &str)]) -> String {
    on_loopback_with_stderr(bin, env).0
}

/// Both sides in one process, two endpoints; then the one-process programs.
#[test]
fn conformance_on_loopback() {
    let dir = tempfile::tempdir().unwrap();
    for p in build_pairs(dir.path()) {
        let out = on_loopback(&p.bin, &[]);
        check("loopback", &p, &out, &out);
    }
    for (name, line) in SINGLE {
        let out = on_loopback(&cprog::build(name, dir.path()), &[]);
        assert!(out.contains(line), "{name} did not say {line:?}:\n{out}");
        println!("loopback: {name} passed");
    }
}

/// A wait that makes no progress is reported on standard error when
/// `XMX_STALL_REPORT_MS` asks for it (with the receive that waits), and not
/// otherwise.
#[test]
fn a_stalled_wait_is_reported_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let bin = cprog::build("stall", dir.path());
    let run = |env: &[(&str, &str)]| on_loopback_with_stderr(&bin, env).1;
    let reported = run(&[("XMX_STALL_REPORT_MS", "200")]);
    assert_eq!(
        reported.matches("stall: no request completed").count(),
        1,
        "one report per stall:\n{reported}"
    );
    assert!(
        reported.contains("receives posted 1"),
        "the report names the waiting receive:\n{reported}"
    );
    let quiet = run(&[]);
    assert!(!quiet.contains("stall"), "no report unless asked:\n{quiet}");
}

/// Two processes in two namespaces on the native transport, each its own
/// board on a veth.
#[test]
fn conformance_native() {
    native_pairs(false);
}

/// Two processes on one interface on the native transport: each its own
/// board with the interface's address, reaching the other through its
/// endpoints' lanes (a frame sent to one's own address never comes back in
/// from the link), as ranks of one host do.
#[test]
fn conformance_native_one_interface() {
    native_pairs(true);
}

/// Every program's two sides on the native transport: in the two namespaces
/// of a veth, or both in one on the same interface (`one_interface`).
fn native_pairs(one_interface: bool) {
    if let Some(why) = unavailable() {
        println!("skipped: {why}");
        return;
    }
    let _one = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let programs = build_pairs(dir.path());
    let pair = VethPair::create("mxc", 9000).expect("veth pair");
    let macs = ["02:58:4d:00:c0:0a", "02:58:4d:00:c0:0b"];
    for ((ns, ifname), mac) in [(&pair.ns_a, &pair.if_a), (&pair.ns_b, &pair.if_b)]
        .into_iter()
        .zip(macs)
    {
        let ok = Command::new("ip")
            .args(["-n", ns, "link", "set", ifname, "address", mac])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "setting {ifname}'s MAC");
    }
    let peers = dir.path().join("peers.json");
    std::fs::write(
        &peers,
        format!(
            r#"[{{"index":0,"mac":"{}","hostname":"a:0"}},{{"index":1,"mac":"{}","hostname":"b:0"}}]"#,
            macs[0], macs[1]
        ),
    )
    .unwrap();
    let peers = peers.display().to_string();
    let env = |iface: &str, host: &str| -> Vec<(&'static str, String)> {
        vec![
            ("XMX_TRANSPORT", "native".into()),
            ("XMX_IFACE", iface.into()),
            ("XMX_HOSTNAME", host.into()),
            ("XMX_PEERS", peers.clone()),
        ]
    };
    let (env_a, env_b) = (env(&pair.if_a, "a"), env(&pair.if_b, "b"));
    let ea: Vec<(&str, &str)> = env_a.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let eb: Vec<(&str, &str)> = env_b.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (passive_ns, passive_env, passive_host, layout) = if one_interface {
        (&pair.ns_a, &ea, "a", "native, one interface")
    } else {
        (&pair.ns_b, &eb, "b", "native")
    };
    for p in &programs {
        let mut passive = App::spawn(
            &format!("{} passive ({layout})", p.name),
            netns_cmd(passive_ns, &p.bin, &["-l", "2"], passive_env),
        );
        // The library starts its progression thread when the first
        // endpoint opens. A passive side that needs no peer (it sends to
        // itself) may have opened, finished and gone before it is seen:
        // its output is judged below.
        assert!(
            passive.wait_thread("mx-progress", Duration::from_secs(30)) || passive.ended(),
            "{}: the passive side opened its endpoint",
            p.name
        );
        let active = App::spawn(
            &format!("{} active ({layout})", p.name),
            netns_cmd(&pair.ns_a, &p.bin, &["-d", passive_host, "-e", "2"], &ea),
        )
        .finish();
        let passive = passive.finish();
        check(layout, p, passive.passed(), active.passed());
    }
}

/// A guest: (host, guest) indices.
type MxConformanceGuest = (usize, usize);

/// (passive, active) guests: across hosts, then co-located.
const PLACEMENTS: [(&str, MxConformanceGuest, MxConformanceGuest); 2] = [
    ("guests across hosts", (1, 0), (0, 0)),
    ("co-located guests", (0, 1), (0, 0)),
];

fn between_guests(c: &SimCluster, programs: &[Program], env: &[(&str, &str)], what: &str) {
    for (place, passive, active) in PLACEMENTS {
        for p in programs {
            let (pf, af) = c.run_pair(&p.bin, passive, active, env);
            check(&format!("{what}{place}"), p, pf.passed(), af.passed());
        }
    }
}

/// Guests of a simulated cluster, on two hosts and on one.
#[test]
fn conformance_between_guests() {
    if skipped("conformance_between_guests") {
        return;
    }
    let _one = exclusive();
    let c = SimCluster::up("mxconf", &[]);
    let dir = tempfile::tempdir().unwrap();
    let programs = build_pairs(dir.path());
    between_guests(&c, &programs, &[], "");
}

/// The same with both hosts' links impaired like `tc netem loss 5%
/// duplicate 1% reorder 5% delay 1ms` (by netem, or by a relay on each
/// host's port where the kernel has no netem).
#[test]
fn conformance_on_impaired_links() {
    if skipped("conformance_on_impaired_links") {
        return;
    }
    let _one = exclusive();
    // Short retransmission delays keep the run short; sends complete at
    // their ack so that a program's last messages are delivered before
    // it exits.
    let c = SimCluster::up("mxconfl", &[("XMX_PULL_TIMEOUT_MS", "20")]);
    let env = [("XMX_RESEND_DELAY_US", "20000"), ("MX_ZOMBIE_SEND", "0")];
    let dir = tempfile::tempdir().unwrap();
    let programs = build_pairs(dir.path());
    let links = ImpairedLinks::on(&c, Impairment::NETEM);
    between_guests(&c, &programs, &env, "impaired links, ");
    links.assert_impaired();
}

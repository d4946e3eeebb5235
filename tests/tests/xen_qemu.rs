//! Real Xen under QEMU: boots Xen 4.17 with a Linux dom0 (and a PV domU) through
//! `tests/xen/run.sh` and checks what the machines report on their serial consoles.
//!
//! - `conformance`: the platform conformance suite on the `linux` platform, the domU
//!   granting and dom0 mapping; every check of both roles is listed by name.
//! - `link`: two hosts whose dom0 NICs share an emulated link echo MXoE-ethertype frames
//!   up to the jumbo size.
//! - `mx`: the xmx stack on one host (xmx-backd and xmxd in dom0, two guests created
//!   through the xl integration, xmx-frontd in each): an MX ping-pong (latency printed)
//!   and 16 MiB each way, every byte checked; a guest destroyed and re-created; nothing
//!   left in dom0.
//! - `mx-link`: the same stack on two linked hosts, the MX traffic between a guest of each.
//! - `mx-migrate`: the same, and the guest of host A migrated to host B by `xl migrate`
//!   in the middle of its MX traffic, then back to A, which completes with every byte
//!   checked.
//! - `migrate`: `xl migrate` of a running PV guest from one linked host to the other, the
//!   stream over the link; the guest's heartbeat, jobs and console go on there, and it
//!   leaves nothing behind on the first host.
//!
//! They need qemu-system-x86, cpio and the Debian packages of tests/xen/packages.lock
//! (fetched once into target/xen/cache), and about 35 s, 25 s, 2 min, 2 min and 75 s here (the
//! stack scenarios build the stack with cargo unless `XMX_XEN_STACK` names a profile
//! directory). They run with `XMX_XEN_TESTS=1`, and under CI (`CI` set, as .ci/run installs
//! QEMU); `XMX_XEN_TESTS=0` turns them off.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// Prints to the process's stderr past the test harness's capture, so that CI's log shows
/// what real Xen reported (checks, latencies, byte counts) for passing tests too.
macro_rules! report {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

/// The scenarios boot whole machines: one at a time, whatever the test harness does.
static QEMU: Mutex<()> = Mutex::new(());

/// The bound run.sh puts on each QEMU of the platform scenarios.
const QEMU_TIMEOUT_S: u32 = 150;
/// The bound run.sh puts on each QEMU of the stack scenarios.
const STACK_QEMU_TIMEOUT_S: u32 = 360;
/// The bound run.sh puts on each QEMU of the migrate scenario.
const MIGRATE_QEMU_TIMEOUT_S: u32 = 360;
/// The bound run.sh puts on each QEMU of the mx-migrate scenario.
const MX_MIGRATE_QEMU_TIMEOUT_S: u32 = 540;
/// What a scenario may take beyond its QEMU bound: fetch, cargo and image build.
const BUILD_BOUND_S: u32 = 300;

fn enabled(test: &str) -> bool {
    match std::env::var("XMX_XEN_TESTS").as_deref() {
        Ok("1") => return true,
        Ok("0") => {}
        _ if std::env::var_os("CI").is_some() => return true,
        _ => {}
    }
    eprintln!(
        "{test}: skipped: boots Xen under QEMU (about half a minute, needs qemu-system-x86, \
         cpio and the pinned Debian packages); set XMX_XEN_TESTS=1 to run it (CI runs it)"
    );
    false
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Run `tests/xen/run.sh SCENARIO`, each QEMU bounded by `qemu_timeout_s`, with its logs
/// in `run_dir`; its exit status.
fn run_scenario(scenario: &str, qemu_timeout_s: u32, run_dir: &Path, extra: &[&str]) -> i32 {
    let ws = workspace();
    let status = Command::new("timeout")
        .arg("--kill-after=15")
        // Twice the machines' bound: run.sh boots a scenario again after a stalled boot.
        .arg((2 * qemu_timeout_s + BUILD_BOUND_S).to_string())
        .arg(ws.join("tests/xen/run.sh"))
        .arg("--timeout")
        .arg(qemu_timeout_s.to_string())
        .arg("--run-dir")
        .arg(run_dir)
        .args(extra)
        .arg(scenario)
        .current_dir(&ws)
        .status()
        .expect("run tests/xen/run.sh");
    status.code().unwrap_or(-1)
}

fn read_log(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The outcome of one check, as a role printed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConsoleOutcome {
    Pass,
    Fail,
    Skip,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ConsoleCheck {
    name: String,
    outcome: ConsoleOutcome,
    detail: String,
}

/// What one role printed between `xmx-report-begin ROLE` and `xmx-report-end ROLE
/// status=N` on a console.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct RoleReport {
    checks: Vec<ConsoleCheck>,
    /// The runner's exit status; None if the end marker never came.
    status: Option<i32>,
}

impl RoleReport {
    fn get(&self, name: &str) -> Option<&ConsoleCheck> {
        self.checks.iter().find(|c| c.name == name)
    }
}

/// A serial-log line without its decorations: run.sh's `[  12.34] ` stamp, then the
/// `domU| ` prefix of lines copied from the domU's console.
fn console_text(line: &str) -> &str {
    let mut s = line;
    if let Some(rest) = s.strip_prefix('[') {
        if let Some(end) = rest.find("] ") {
            if rest[..end].trim().parse::<f64>().is_ok() {
                s = &rest[end + 2..];
            }
        }
    }
    s.strip_prefix("domU| ").unwrap_or(s)
}

/// A report line: `  PASS  name` or `  FAIL  name  (detail)`.
fn parse_check(text: &str) -> Option<ConsoleCheck> {
    let body = text.strip_prefix("  ")?;
    let (tag, rest) = body.split_once("  ")?;
    let outcome = match tag {
        "PASS" => ConsoleOutcome::Pass,
        "FAIL" => ConsoleOutcome::Fail,
        "SKIP" => ConsoleOutcome::Skip,
        _ => return None,
    };
    let (name, detail) = match rest.split_once("  (") {
        Some((name, d)) => (name, d.strip_suffix(')').unwrap_or(d)),
        None => (rest, ""),
    };
    if name.is_empty() || name.contains(char::is_whitespace) {
        return None;
    }
    Some(ConsoleCheck {
        name: name.to_string(),
        outcome,
        detail: detail.to_string(),
    })
}

/// Every role report in a serial log, by role.
fn parse_reports(log: &str) -> BTreeMap<String, RoleReport> {
    let mut reports = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in log.lines() {
        let text = console_text(line);
        if let Some(role) = text.strip_prefix("xmx-report-begin ") {
            let role = role.trim().to_string();
            reports.insert(role.clone(), RoleReport::default());
            current = Some(role);
        } else if let Some(rest) = text.strip_prefix("xmx-report-end ") {
            let mut words = rest.split_whitespace();
            let role = words.next().unwrap_or_default();
            let status = words
                .find_map(|w| w.strip_prefix("status="))
                .and_then(|s| s.parse().ok());
            if let Some(r) = reports.get_mut(role) {
                r.status = status;
            }
            current = None;
        } else if let Some(role) = &current {
            if let Some(check) = parse_check(text) {
                reports
                    .get_mut(role)
                    .expect("current role exists")
                    .checks
                    .push(check);
            }
        }
    }
    reports
}

fn print_reports(reports: &BTreeMap<String, RoleReport>) {
    for (role, r) in reports {
        report!("{role} (status {:?}):", r.status);
        for c in &r.checks {
            let tag = match c.outcome {
                ConsoleOutcome::Pass => "PASS",
                ConsoleOutcome::Fail => "FAIL",
                ConsoleOutcome::Skip => "SKIP",
            };
            if c.detail.is_empty() {
                report!("  {tag}  {}", c.name);
            } else {
                report!("  {tag}  {}  ({})", c.name, c.detail);
            }
        }
    }
}

/// Checks that prove the primitives really worked across two VMs: they must pass, not
/// merely not fail.
const MAPPER_MUST_PASS: &[&str] = &[
    "xs.transaction-conflict",
    "grant.1.map",
    "grant.2048.map",
    "grant.2048.granter-to-mapper",
    "grant.readonly-refuses-writable",
    "grant.copy-from-foreign",
    "grant.copy-to-foreign",
    "evtchn.bind",
    "evtchn.notify-to-granter",
    "evtchn.notify-from-granter",
];
const GRANTER_MUST_PASS: &[&str] = &[
    "xs.perm-publish",
    "grant.2048.grant",
    "grant.2048.mapper-to-granter",
    "grant.2048.end-access",
    "grant.copy-to-foreign-seen",
    "evtchn.notify-from-mapper",
    "evtchn.notify-to-mapper",
];

/// Fails the test with every problem found, and with run.sh's exit status
/// if it was not 0 (the run's logs stay in `run_dir`).
fn assert_clean(mut problems: Vec<String>, status: i32, run_dir: &Path, what: &str) {
    if status != 0 {
        problems.push(format!(
            "run.sh exited with {status} (see {})",
            run_dir.display()
        ));
    }
    assert!(problems.is_empty(), "{what}:\n  {}", problems.join("\n  "));
}

#[test]
fn conformance_suite_passes_on_real_xen() {
    if !enabled("conformance_suite_passes_on_real_xen") {
        return;
    }
    let _one = QEMU.lock().unwrap_or_else(|e| e.into_inner());
    let run_dir = workspace().join("target/xen/run/test-conformance");
    let status = run_scenario("conformance", QEMU_TIMEOUT_S, &run_dir, &[]);
    let log = read_log(&run_dir.join("conformance.log"));
    let reports = parse_reports(&log);
    print_reports(&reports);

    let mut problems = Vec::new();
    for role in ["mapper", "granter"] {
        let Some(r) = reports.get(role) else {
            problems.push(format!("no {role} report in the serial log"));
            continue;
        };
        if r.status != Some(0) {
            problems.push(format!("{role} exited with {:?}", r.status));
        }
        for c in r
            .checks
            .iter()
            .filter(|c| c.outcome == ConsoleOutcome::Fail)
        {
            problems.push(format!("{role}: {} failed: {}", c.name, c.detail));
        }
        let must = if role == "mapper" {
            MAPPER_MUST_PASS
        } else {
            GRANTER_MUST_PASS
        };
        for name in must {
            match r.get(name) {
                Some(c) if c.outcome == ConsoleOutcome::Pass => {}
                Some(c) => {
                    problems.push(format!("{role}: {name} is {:?}: {}", c.outcome, c.detail))
                }
                None => problems.push(format!("{role}: {name} did not run")),
            }
        }
    }
    assert_clean(problems, status, &run_dir, "conformance on real Xen");
}

#[test]
fn two_hosts_echo_jumbo_mxoe_frames() {
    if !enabled("two_hosts_echo_jumbo_mxoe_frames") {
        return;
    }
    let _one = QEMU.lock().unwrap_or_else(|e| e.into_inner());
    let run_dir = workspace().join("target/xen/run/test-link");
    let status = run_scenario("link", QEMU_TIMEOUT_S, &run_dir, &[]);
    let a = read_log(&run_dir.join("link-a.log"));
    let b = read_log(&run_dir.join("link-b.log"));
    let lines = |log: &str, prefix: &str| -> Vec<String> {
        log.lines()
            .map(console_text)
            .filter(|t| t.starts_with(prefix))
            .map(str::to_string)
            .collect()
    };
    let pings = lines(&a, "rawlink ping:");
    let echoes = lines(&b, "rawlink echo:");
    for l in pings.iter().chain(&echoes) {
        report!("{l}");
    }
    assert!(
        pings.iter().any(|l| l.contains("20 x 9014 bytes echoed")),
        "no jumbo round trips: {pings:?}"
    );
    assert!(
        pings.iter().any(|l| l.starts_with("rawlink ping: ok,")),
        "host A: {pings:?}"
    );
    assert!(
        echoes.iter().any(|l| l.contains("end frame received")),
        "host B: {echoes:?}"
    );
    assert_eq!(status, 0, "run.sh link (see {})", run_dir.display());
}

/// A guest's console line as dom0 copied it: `[  12.34] NAME| TEXT` gives (NAME, TEXT).
fn guest_line(line: &str) -> Option<(&str, &str)> {
    let text = line
        .strip_prefix('[')
        .and_then(|rest| rest.split_once("] "))
        .map_or(line, |(_, t)| t);
    let (name, text) = text.split_once("| ")?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric()) {
        return None;
    }
    Some((name, text))
}

/// What the stack scenarios print: dom0's `xmx-result STEP pass|fail ...` lines and the
/// guests' `mxcheck:` lines.
#[derive(Debug, Default, PartialEq, Eq)]
struct StackReport {
    /// (step, passed, the rest of the line), in order.
    results: Vec<(String, bool, String)>,
    /// (guest, text after `mxcheck: `), in order.
    mxcheck: Vec<(String, String)>,
}

impl StackReport {
    fn parse(log: &str) -> StackReport {
        let mut r = StackReport::default();
        for line in log.lines() {
            if let Some((guest, text)) = guest_line(line) {
                if let Some(m) = text.strip_prefix("mxcheck: ") {
                    r.mxcheck.push((guest.to_string(), m.to_string()));
                }
                continue;
            }
            let Some(rest) = console_text(line).strip_prefix("xmx-result ") else {
                continue;
            };
            let mut words = rest.splitn(3, ' ');
            let step = words.next().unwrap_or_default().to_string();
            let passed = words.next() == Some("pass");
            let detail = words.next().unwrap_or_default().to_string();
            r.results.push((step, passed, detail));
        }
        r
    }

    /// Whether step `step` reported a pass.
    fn passed(&self, step: &str) -> bool {
        self.results.iter().any(|(s, ok, _)| s == step && *ok)
    }

    /// A problem for each of `steps` that did not pass on `host`.
    fn unpassed(&self, host: &str, steps: &[&str]) -> Vec<String> {
        steps
            .iter()
            .filter(|step| !self.passed(step))
            .map(|step| format!("{host}: step {step} did not pass"))
            .collect()
    }

    /// The `mxcheck:` lines of `guest` that contain `needle`.
    fn lines_of(&self, guest: &str, needle: &str) -> Vec<&str> {
        self.mxcheck
            .iter()
            .filter(|(g, m)| g == guest && m.contains(needle))
            .map(|(_, m)| m.as_str())
            .collect()
    }

    fn print(&self, host: &str) {
        for (step, ok, detail) in &self.results {
            report!(
                "{host}: {step}: {} {detail}",
                if *ok { "pass" } else { "FAIL" }
            );
        }
        for (guest, m) in &self.mxcheck {
            report!("{host}/{guest}: mxcheck: {m}");
        }
    }
}

/// The half round trip an active mxcheck printed, in microseconds.
fn half_rtt_us(line: &str) -> Option<f64> {
    line.split_once("half-RTT ")?
        .1
        .strip_suffix(" us")?
        .parse()
        .ok()
}

const SIXTEEN_MIB: &str = "16777216 B";

/// (sent, received) of an mxcheck line "direct frames sent S, received R".
fn direct_frames(line: &str) -> Option<(u64, u64)> {
    let rest = line.split("direct frames sent ").nth(1)?;
    let (sent, received) = rest.split_once(", received ")?;
    Some((sent.trim().parse().ok()?, received.trim().parse().ok()?))
}

#[test]
fn mx_between_guests_of_one_host_and_a_guest_recreated() {
    if !enabled("mx_between_guests_of_one_host_and_a_guest_recreated") {
        return;
    }
    let _one = QEMU.lock().unwrap_or_else(|e| e.into_inner());
    let run_dir = workspace().join("target/xen/run/test-mx");
    let status = run_scenario("mx", STACK_QEMU_TIMEOUT_S, &run_dir, &[]);
    let r = StackReport::parse(&read_log(&run_dir.join("mx.log")));
    r.print("host");

    let mut problems = Vec::new();
    for step in ["pair-1", "destroy", "pair-2", "empty"] {
        if !r.passed(step) {
            problems.push(format!("step {step} did not pass"));
        }
    }
    // g2 (active) ran twice: the 16 MiB run, then the run of its re-created self.
    let latencies: Vec<f64> = r
        .lines_of("g2", "half-RTT")
        .into_iter()
        .filter_map(half_rtt_us)
        .collect();
    if latencies.len() != 2 || latencies.iter().any(|l| *l <= 0.0) {
        problems.push(format!("g2's ping-pong latencies: {latencies:?}"));
    }
    if r.lines_of("g2", &format!("received {SIXTEEN_MIB}, every byte checked"))
        .is_empty()
    {
        problems.push("g2 did not receive 16 MiB byte-checked".into());
    }
    if r.lines_of("g1", &format!("received {SIXTEEN_MIB}, every byte checked"))
        .is_empty()
    {
        problems.push("g1 did not receive 16 MiB byte-checked".into());
    }
    for g in ["g1", "g2"] {
        let passes = r.lines_of(g, "PASS").len();
        if passes != 2 {
            problems.push(format!("{g}: {passes} mxcheck runs passed, 2 expected"));
        }
        // Co-located guests of one cluster talk over a direct channel (dom0
        // offers it; grants and event channels of the guests' own), before
        // the re-creation and after it.
        let direct: Vec<Option<(u64, u64)>> = r
            .lines_of(g, "direct frames sent")
            .into_iter()
            .map(direct_frames)
            .collect();
        if direct.len() != 2
            || direct
                .iter()
                .any(|d| !d.is_some_and(|(s, r)| s > 0 && r > 0))
        {
            problems.push(format!(
                "{g}: direct frames (sent, received) per run: {direct:?}"
            ));
        }
    }
    assert_clean(problems, status, &run_dir, "mx on real Xen");
}

#[test]
fn mx_between_guests_of_two_hosts() {
    if !enabled("mx_between_guests_of_two_hosts") {
        return;
    }
    let _one = QEMU.lock().unwrap_or_else(|e| e.into_inner());
    let run_dir = workspace().join("target/xen/run/test-mx-link");
    let status = run_scenario("mx-link", STACK_QEMU_TIMEOUT_S, &run_dir, &[]);
    let a = StackReport::parse(&read_log(&run_dir.join("mx-link-a.log")));
    let b = StackReport::parse(&read_log(&run_dir.join("mx-link-b.log")));
    a.print("host-a");
    b.print("host-b");

    let mut problems = Vec::new();
    for (host, r, side) in [("host-a", &a, "a"), ("host-b", &b, "b")] {
        for step in [
            format!("link-pair-{side}"),
            format!("nocache-pair-{side}"),
            format!("empty-{side}"),
        ] {
            if !r.passed(&step) {
                problems.push(format!("{host}: step {step} did not pass"));
            }
        }
    }
    if a.lines_of("a1", &format!("received {SIXTEEN_MIB}, every byte checked"))
        .is_empty()
    {
        problems.push("a1 did not receive 16 MiB byte-checked".into());
    }
    if b.lines_of("b1", &format!("received {SIXTEEN_MIB}, every byte checked"))
        .is_empty()
    {
        problems.push("b1 did not receive 16 MiB byte-checked".into());
    }
    // The run without the registration cache: eight rounds, each byte-checked on both sides.
    for (r, guest) in [(&a, "a1"), (&b, "b1")] {
        if r.lines_of(guest, "8 rounds each way, every byte checked")
            .is_empty()
        {
            problems.push(format!("{guest}: no byte-checked rounds without the cache"));
        }
    }
    let latency = b
        .lines_of("b1", "half-RTT")
        .into_iter()
        .find_map(half_rtt_us);
    if !latency.is_some_and(|l| l > 0.0) {
        problems.push(format!("b1's ping-pong latency: {latency:?}"));
    }
    assert_clean(problems, status, &run_dir, "mx-link on real Xen");
}

/// The value of `key=VALUE` among the words of an `xmx-result` line's detail.
fn detail_value<'a>(detail: &'a str, key: &str) -> Option<&'a str> {
    detail
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// The text of `guest`'s console lines (as dom0 copied them) that start with `prefix`.
fn guest_lines<'a>(log: &'a str, guest: &str, prefix: &str) -> Vec<&'a str> {
    log.lines()
        .filter_map(guest_line)
        .filter(|(g, t)| *g == guest && t.starts_with(prefix))
        .map(|(_, t)| t)
        .collect()
}

#[test]
fn a_running_guest_migrates_between_two_hosts() {
    if !enabled("a_running_guest_migrates_between_two_hosts") {
        return;
    }
    let _one = QEMU.lock().unwrap_or_else(|e| e.into_inner());
    let run_dir = workspace().join("target/xen/run/test-migrate");
    let status = run_scenario("migrate", MIGRATE_QEMU_TIMEOUT_S, &run_dir, &[]);
    let log_a = read_log(&run_dir.join("migrate-a.log"));
    let log_b = read_log(&run_dir.join("migrate-b.log"));
    let a = StackReport::parse(&log_a);
    let b = StackReport::parse(&log_b);
    a.print("host-a");
    b.print("host-b");

    let mut problems = a.unpassed("host-a", &["migrate-a", "gone-a"]);
    problems.extend(b.unpassed(
        "host-b",
        &["receive-b", "arrived-b", "heartbeat-b", "job-b", "end-b"],
    ));
    let detail = |r: &StackReport, step: &str, key: &str| -> Option<String> {
        r.results
            .iter()
            .find(|(s, _, _)| s == step)
            .and_then(|(_, _, d)| detail_value(d, key).map(str::to_string))
    };
    let seconds = detail(&a, "migrate-a", "seconds").and_then(|s| s.parse::<f64>().ok());
    let gap_ms = detail(&b, "heartbeat-b", "move-gap-ms").and_then(|s| s.parse::<u64>().ok());
    report!(
        "migration: {seconds:?} s (xl migrate on host A), the guest's heartbeat gap {gap_ms:?} ms"
    );
    if !seconds.is_some_and(|s| s > 0.0) {
        problems.push(format!("no migration time from host A: {seconds:?}"));
    }
    if gap_ms.is_none() {
        problems.push("the guest did not record the gap of its move".into());
    }
    // On host B the guest is another domain than it was on host A (B created and destroyed
    // one first), and it knows it.
    let moved = detail(&b, "heartbeat-b", "moved");
    let arrived = detail(&b, "arrived-b", "domid");
    let ends = moved.as_deref().map(|m| {
        let words: Vec<&str> = m.split('-').collect();
        (words.get(1).copied(), words.last().copied())
    });
    if !ends.is_some_and(|(from, to)| to == arrived.as_deref() && from != to) {
        problems.push(format!(
            "the guest moved {moved:?}, host B has it as domain {arrived:?}"
        ));
    }
    // The job dom0 of host B handed it printed on the console xenconsoled of B logged.
    let job = guest_lines(&log_b, "mig", "migrate-job: ");
    for l in &job {
        report!("host-b/mig: {l}");
    }
    if !job.iter().any(|l| l.ends_with("named mig")) {
        problems.push(format!(
            "no job output on the guest's console on host B: {job:?}"
        ));
    }
    assert_clean(problems, status, &run_dir, "migrate on real Xen");
}

#[test]
fn an_mx_guest_migrates_between_two_hosts_in_the_middle_of_its_traffic() {
    if !enabled("an_mx_guest_migrates_between_two_hosts_in_the_middle_of_its_traffic") {
        return;
    }
    let _one = QEMU.lock().unwrap_or_else(|e| e.into_inner());
    let run_dir = workspace().join("target/xen/run/test-mx-migrate");
    let status = run_scenario("mx-migrate", MX_MIGRATE_QEMU_TIMEOUT_S, &run_dir, &[]);
    let a = StackReport::parse(&read_log(&run_dir.join("mx-migrate-a.log")));
    let b = StackReport::parse(&read_log(&run_dir.join("mx-migrate-b.log")));
    a.print("host-a");
    b.print("host-b");

    // a1 goes from A to B in the middle of its stream, then back to A once it talks to
    // b1 over a direct channel there, and ends on A.
    let mut problems = a.unpassed(
        "host-a",
        &[
            "stream-a",
            "migrate-a",
            "gone-a",
            "back-receive-a",
            "back-arrived-a",
            "back-device-a",
            "a1-moved-a",
            "end-a",
            "empty-a",
        ],
    );
    problems.extend(b.unpassed(
        "host-b",
        &[
            "receive-b",
            "arrived-b",
            "a1-device-b",
            "direct-b",
            "back-b",
            "gone-b",
            "pair-b",
            "end-b",
            "empty-b",
        ],
    ));
    // Every round of LARGE messages, each way, was checked byte for byte by its receiver
    // (a1's console, from its last host, is in A's log).
    for (guest, r) in [("a1", &a), ("b1", &b)] {
        if r.lines_of(guest, "rounds each way, every byte checked")
            .is_empty()
        {
            problems.push(format!("{guest} did not check every round"));
        }
    }
    if b.lines_of("b1", "slowest round").is_empty() {
        problems.push("b1 did not report its slowest round (the move's cost)".into());
    }
    assert_clean(problems, status, &run_dir, "mx-migrate on real Xen");
}

mod parsing {
    use super::*;

    const LOG: &str = "\
[  30.01] xmx-report-begin mapper
[  30.01] mapper (domain 0, peer 1, platform linux)
[  30.01]   PASS  grant.1.map  (one batch)
[  30.01]   SKIP  xs.perm-read-denied  (dom0 is privileged)
[  30.02] 2 passed, 0 failed, 1 skipped
[  30.02] xmx-report-end mapper status=0
[  33.02] domU| xmx-report-begin granter
[  33.02] domU| [    7.1] some kernel line
[  33.02] domU|   FAIL  grant.2048.grant  (quota exceeded: (os error 28))
[  33.02] domU|   PASS  evtchn.close
[  33.03] domU| xmx-report-end granter status=1
[  33.04]   PASS  not.in.a.report
";

    #[test]
    fn reports_are_read_per_role_with_their_status() {
        let r = parse_reports(LOG);
        assert_eq!(r.len(), 2);
        let m = &r["mapper"];
        assert_eq!(m.status, Some(0));
        assert_eq!(
            m.checks,
            [
                ConsoleCheck {
                    name: "grant.1.map".into(),
                    outcome: ConsoleOutcome::Pass,
                    detail: "one batch".into()
                },
                ConsoleCheck {
                    name: "xs.perm-read-denied".into(),
                    outcome: ConsoleOutcome::Skip,
                    detail: "dom0 is privileged".into()
                },
            ]
        );
        let g = &r["granter"];
        assert_eq!(g.status, Some(1));
        assert_eq!(g.checks.len(), 2);
        assert_eq!(
            g.get("grant.2048.grant").unwrap().outcome,
            ConsoleOutcome::Fail
        );
        assert_eq!(
            g.get("grant.2048.grant").unwrap().detail,
            "quota exceeded: (os error 28)"
        );
        assert_eq!(g.get("evtchn.close").unwrap().detail, "");
        assert!(g.get("not.in.a.report").is_none());
    }

    #[test]
    fn a_report_without_its_end_has_no_status() {
        let r = parse_reports("[ 1.00] xmx-report-begin mapper\n[ 1.10]   PASS  a.b\n");
        assert_eq!(r["mapper"].status, None);
        assert_eq!(r["mapper"].checks.len(), 1);
    }

    const STACK_LOG: &str = "\
[  95.50] xmx-result pair-1 pass g1=1 g2=2
[  95.80] g2| mxcheck: ping-pong 8 B x 100: half-RTT 11598.9 us
[  95.80] g2| mxcheck: sent 16777216 B in 1946.8 ms; received 16777216 B, every byte checked, in 1573.9 ms (10.7 MB/s)
[  95.81] g2| [    1.2] xmx-result pair-9 pass
[  95.82] g1| mxcheck: PASS (passive)
[ 101.05] xmx-result destroy fail domain=2 holdings=[gntdev-mappings=1] expected=[x]
[ 101.06] mxcheck: not from a guest
";

    #[test]
    fn stack_reports_separate_dom0_steps_and_guest_lines() {
        let r = StackReport::parse(STACK_LOG);
        assert_eq!(
            r.results,
            [
                ("pair-1".to_string(), true, "g1=1 g2=2".to_string()),
                (
                    "destroy".to_string(),
                    false,
                    "domain=2 holdings=[gntdev-mappings=1] expected=[x]".to_string()
                ),
            ]
        );
        assert!(r.passed("pair-1"));
        assert!(!r.passed("destroy"));
        assert!(!r.passed("pair-9"));
        assert_eq!(r.mxcheck.len(), 3);
        assert_eq!(r.lines_of("g1", "PASS"), ["PASS (passive)"]);
        assert_eq!(
            r.lines_of("g2", "half-RTT")
                .into_iter()
                .filter_map(half_rtt_us)
                .collect::<Vec<_>>(),
            [11598.9]
        );
        assert!(r.lines_of("g3", "").is_empty());
    }

    #[test]
    fn direct_frame_counts_are_read_from_their_line() {
        assert_eq!(
            direct_frames("mxcheck: direct frames sent 116, received 35"),
            Some((116, 35))
        );
        assert_eq!(
            direct_frames("mxcheck: direct frames sent many, received 1"),
            None
        );
        assert_eq!(direct_frames("mxcheck: PASS (active)"), None);
    }

    #[test]
    fn result_details_and_guest_lines_are_found_by_key_and_name() {
        let d = "beats=171 moved=domain-1-to-2 move-gap-ms=1526 max-gap-ms=1526";
        assert_eq!(detail_value(d, "move-gap-ms"), Some("1526"));
        assert_eq!(detail_value(d, "moved"), Some("domain-1-to-2"));
        assert_eq!(detail_value(d, "gap-ms"), None);
        assert_eq!(detail_value(d, "max-gap"), None);
        let log = "[ 74.57] mig| migrate-job: domain 2 named mig\n[ 74.58] mig| xmx[1.0] job 1\n\
                   [ 74.59] b1| migrate-job: elsewhere\n";
        assert_eq!(
            guest_lines(log, "mig", "migrate-job: "),
            ["migrate-job: domain 2 named mig"]
        );
    }

    #[test]
    fn guest_lines_need_a_plain_name() {
        assert_eq!(guest_line("[ 1.00] a1| text"), Some(("a1", "text")));
        assert_eq!(guest_line("b1| x| y"), Some(("b1", "x| y")));
        assert_eq!(guest_line("[ 1.00] domU x| y"), None);
        assert_eq!(guest_line("[ 1.00] | y"), None);
        assert_eq!(half_rtt_us("ping-pong 8 B x 5: half-RTT abc us"), None);
    }

    #[test]
    fn decorations_are_stripped_and_other_lines_ignored() {
        assert_eq!(
            console_text("[  12.34] domU| xmx-report-begin granter"),
            "xmx-report-begin granter"
        );
        assert_eq!(console_text("[bogus] x"), "[bogus] x");
        assert_eq!(console_text("plain"), "plain");
        assert!(parse_check("  PASS  two words").is_none());
        assert!(parse_check("PASS  name").is_none());
        assert!(parse_check("  OKAY  name").is_none());
        assert!(parse_check("  PASS  ").is_none());
    }
}

//! A simulated cluster for one test: `xmx sim up` on creation, `xmx sim down`
//! when dropped (also when the test fails).
//!
//! Host `hI` is network namespace `xmx-NAME-hI` with its own simhv, backend,
//! xmxd and one xmx-frontd per guest; guest `gJ` of host `hI` is domain
//! `J + 1` there and its MX hostname is `hI-gJ:0`. The hosts' veths meet on
//! a bridge in namespace `xmx-NAME-fabric`, where host `hI`'s end is `phI`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;
use xmx_backend::admin::{AdminClient, BackdRequest};
use xmx_hv::sim::admin::{DomainState, SimAdmin};
use xmx_hv::xs::XsClient;
use xmx_hv::{DomId, Xenstore, XBT_NULL};

use crate::app::{App, Finished};
use crate::bins::{cluster_programs, lib_dir};

/// How long an application may run before `timeout` ends it.
pub const APP_TIMEOUT_S: u32 = 120;

/// The tests of one executable bring clusters up one at a time: the machine
/// has two cores and the scenarios measure nothing when they starve.
pub fn exclusive() -> MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether simulated clusters can run here; the reason if not.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces, veth, AF_PACKET)".into());
    }
    match Command::new("ip").args(["netns", "list"]).output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "`ip netns` fails: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("no `ip` command: {e}")),
    }
}

/// True (after saying why) if simulated clusters cannot run here: a test
/// calls this first and returns early, so the run shows what was skipped.
pub fn skipped(test: &str) -> bool {
    match unavailable() {
        Some(why) => {
            println!("{test}: skipped: {why}");
            true
        }
        None => false,
    }
}

/// A command running `prog args` in network namespace `netns` (not as a
/// guest's application), with `env` added, the freshly built library, and a
/// `timeout` of [`APP_TIMEOUT_S`].
pub fn netns_cmd(netns: &str, prog: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns])
        .args(["timeout", "-k", "5", &APP_TIMEOUT_S.to_string(), "env"])
        .arg(format!("LD_LIBRARY_PATH={}", lib_dir().display()));
    for (k, v) in env {
        cmd.arg(format!("{k}={v}"));
    }
    cmd.arg(prog).args(args);
    for k in [
        "RUST_LOG",
        "MX_RCACHE",
        "MX_ERRORS_ARE_FATAL",
        "MX_VERBOSE",
        "XMX_TRANSPORT",
        "XMX_FRONTD_SOCKET",
    ] {
        cmd.env_remove(k);
    }
    cmd
}

/// A guest of a host.
#[derive(Clone, Debug)]
pub struct Guest {
    /// `gJ`.
    pub name: String,
    /// Its domain id on its host.
    pub domid: DomId,
}

/// A host of the cluster.
#[derive(Clone, Debug)]
pub struct ClusterHost {
    /// `hI`.
    pub name: String,
    /// Its network namespace.
    pub netns: String,
    /// Its NIC's MAC.
    pub mac: String,
    /// Its simhv directory (admin and xenstore sockets, backd's socket).
    pub simhv_dir: PathBuf,
    /// The fabric side of its veth.
    pub port: String,
    /// Its guests.
    pub guests: Vec<Guest>,
}

/// Whether the backend behind `backd` lists endpoint `eid` of domain `domid` as open,
/// and its list of guests.
fn endpoint_open(backd: &mut AdminClient, domid: DomId, eid: u64) -> (bool, Value) {
    let guests = backd.call(&BackdRequest::Guests).expect("backd guests");
    let open = guests.as_array().into_iter().flatten().any(|g| {
        g["domid"].as_u64() == Some(u64::from(domid))
            && g["endpoints"]
                .as_array()
                .is_some_and(|e| e.iter().any(|x| x.as_u64() == Some(eid)))
    });
    (open, guests)
}

/// A running cluster; see the module documentation.
pub struct SimCluster {
    name: String,
    xmx: PathBuf,
    hosts: Vec<ClusterHost>,
}

fn output_text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

impl SimCluster {
    /// Brings up cluster `<tag><pid>` with 2 hosts of 2 guests each, the
    /// daemons started with `env` added to their environment, and waits
    /// until every guest sees every other in its peer view.
    pub fn up(tag: &str, env: &[(&str, &str)]) -> SimCluster {
        let xmx = cluster_programs();
        let name = format!("{tag}{}", std::process::id() % 100_000);
        assert!(name.len() <= 16, "cluster name {name} too long");
        let mut cmd = Command::new(&xmx);
        cmd.args(["sim", "down", "--name", &name])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let _ = cmd.status();
        let mut cmd = Command::new(&xmx);
        cmd.args([
            "sim", "up", "--name", &name, "--hosts", "2", "--guests", "2", "--json",
        ])
        .env_remove("RUST_LOG");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut o = cmd.output().expect("running xmx sim up");
        if !o.status.success() {
            // `up` removes what it built when it fails: try once more, so a
            // start-up race of the cluster tooling does not fail the test.
            eprintln!("xmx sim up failed, trying again: {}", output_text(&o));
            o = cmd.output().expect("running xmx sim up");
        }
        // From here on the cluster (or what was built of it) is removed on drop.
        let mut cluster = SimCluster {
            name,
            xmx,
            hosts: Vec::new(),
        };
        assert!(o.status.success(), "xmx sim up: {}", output_text(&o));
        let state: Value = serde_json::from_slice(&o.stdout).expect("xmx sim up --json");
        for (i, h) in state["hosts"].as_array().expect("hosts").iter().enumerate() {
            let text = |k: &str| h[k].as_str().unwrap_or_default().to_owned();
            let guests = h["guests"]
                .as_array()
                .expect("guests")
                .iter()
                .map(|g| Guest {
                    name: g["name"].as_str().unwrap_or_default().to_owned(),
                    domid: g["domid"].as_u64().unwrap_or_default() as DomId,
                })
                .collect();
            cluster.hosts.push(ClusterHost {
                name: text("name"),
                netns: text("netns"),
                mac: text("mac"),
                simhv_dir: PathBuf::from(text("simhv_dir")),
                port: format!("ph{i}"),
                guests,
            });
        }
        assert_eq!(cluster.hosts.len(), 2, "{state}");
        cluster.wait_settled(Duration::from_secs(30));
        cluster
    }

    /// The cluster's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fabric namespace (the bridge and the hosts' ports).
    pub fn fabric_netns(&self) -> String {
        format!("xmx-{}-fabric", self.name)
    }

    /// Host `i`.
    pub fn host(&self, i: usize) -> &ClusterHost {
        &self.hosts[i]
    }

    /// The MX hostname of guest `j` of host `i` (`hI-gJ`, board 0).
    pub fn hostname(&self, i: usize, j: usize) -> String {
        format!("{}-{}", self.hosts[i].name, self.hosts[i].guests[j].name)
    }

    /// Waits until every host's xmxd lists all 4 guests and every guest's
    /// peer view in xenstore holds them (on a watch).
    fn wait_settled(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let total = self.hosts.iter().map(|h| h.guests.len()).sum::<usize>();
        for h in &self.hosts {
            let o = Command::new(&self.xmx)
                .args(["peers", "--sim-name", &self.name, "--sim-host", &h.name])
                .args([
                    "--wait",
                    &total.to_string(),
                    "--timeout",
                    &timeout.as_secs().to_string(),
                ])
                .env_remove("XMX_XMXD_SOCKET")
                .output()
                .expect("running xmx peers");
            assert!(o.status.success(), "xmx peers --wait: {}", output_text(&o));
            let xs = XsClient::connect_unix(xmx_hv::sim::layout::xenstore_sock(&h.simhv_dir, 0))
                .expect("dom0's xenstore connection");
            for g in &h.guests {
                let dir = format!("/local/domain/0/xmx/peers/{}", g.domid);
                xs.watch(&dir, "settled").expect("watching a peer view");
                loop {
                    let n = xs.directory(XBT_NULL, &dir).map_or(0, |d| d.len());
                    if n >= total {
                        break;
                    }
                    let left = deadline.saturating_duration_since(Instant::now());
                    assert!(
                        !left.is_zero(),
                        "{}/{}: peer view of {n} entries",
                        h.name,
                        g.name
                    );
                    let _ = xs.next_watch_event(Some(left)).expect("xenstore watch");
                }
                let _ = xs.unwatch(&dir, "settled");
            }
        }
    }

    /// A command running `prog args` as an application of guest `guest` of
    /// host `host` (`xmx sim run`), with `env` added, the freshly built
    /// library, and a `timeout` of [`APP_TIMEOUT_S`].
    pub fn app(
        &self,
        host: usize,
        guest: usize,
        prog: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Command {
        let h = &self.hosts[host];
        let g = &h.guests[guest];
        let mut cmd = Command::new(&self.xmx);
        cmd.args(["sim", "run", "--name", &self.name, &h.name, &g.name, "--"])
            .args(["timeout", "-k", "5", &APP_TIMEOUT_S.to_string(), "env"])
            .arg(format!("LD_LIBRARY_PATH={}", lib_dir().display()));
        for (k, v) in env {
            cmd.arg(format!("{k}={v}"));
        }
        cmd.arg(prog).args(args);
        for k in [
            "RUST_LOG",
            "MX_RCACHE",
            "MX_ERRORS_ARE_FATAL",
            "MX_VERBOSE",
            "XMX_TRANSPORT",
        ] {
            cmd.env_remove(k);
        }
        cmd
    }

    /// Board MAC of every guest, by MX hostname (`hI-gJ:0`), as host `i`'s
    /// xmxd lists them.
    pub fn guest_macs(&self, i: usize) -> std::collections::BTreeMap<String, String> {
        let o = Command::new(&self.xmx)
            .args([
                "peers",
                "--sim-name",
                &self.name,
                "--sim-host",
                &self.hosts[i].name,
                "--json",
            ])
            .env_remove("XMX_XMXD_SOCKET")
            .output()
            .expect("running xmx peers");
        assert!(o.status.success(), "xmx peers: {}", output_text(&o));
        let v: Value = serde_json::from_slice(&o.stdout).expect("xmx peers --json");
        v["peers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| {
                Some((
                    p["hostname"].as_str()?.to_owned(),
                    p["mac"].as_str()?.to_owned(),
                ))
            })
            .collect()
    }

    /// Runs the administration subcommand `args` of `xmx` against host `i`'s
    /// xmxd with `--json`; panics unless it succeeds. Returns its reply.
    pub fn admin(&self, i: usize, args: &[&str]) -> Value {
        let o = Command::new(&self.xmx)
            .args(args)
            .args(["--sim-name", &self.name, "--sim-host", &self.hosts[i].name])
            .arg("--json")
            .env_remove("XMX_XMXD_SOCKET")
            .output()
            .expect("running xmx");
        assert!(o.status.success(), "xmx {args:?}: {}", output_text(&o));
        serde_json::from_slice(&o.stdout).expect("xmx --json")
    }

    /// Runs `prog` as a pair: the passive side (`-l 2`) in guest `passive`
    /// (host, guest), then, once its endpoint is open, the active side
    /// (`-d <passive's hostname> -e 2`) in guest `active`; both with `env`.
    /// Returns how (passive, active) ended.
    pub fn run_pair(
        &self,
        prog: &Path,
        passive: (usize, usize),
        active: (usize, usize),
        env: &[(&str, &str)],
    ) -> (Finished, Finished) {
        let name = prog
            .file_name()
            .map_or("program".into(), |n| n.to_string_lossy().into_owned());
        let mut p = App::spawn(
            &format!("{name} -l 2 in {}", self.hostname(passive.0, passive.1)),
            self.app(passive.0, passive.1, prog, &["-l", "2"], env),
        );
        self.wait_listening(passive.0, passive.1, 2, Duration::from_secs(30), &mut p);
        let peer = self.hostname(passive.0, passive.1);
        let a = App::spawn(
            &format!("{name} -d {peer} in {}", self.hostname(active.0, active.1)),
            self.app(active.0, active.1, prog, &["-d", &peer, "-e", "2"], env),
        );
        let a = a.finish();
        let p = p.finish();
        (p, a)
    }

    /// A connection to host `i`'s backend control socket.
    pub fn backd(&self, i: usize) -> AdminClient {
        AdminClient::connect(&self.hosts[i].simhv_dir.join("backd.sock"))
            .expect("xmx-backd's control socket")
    }

    /// Waits until guest `guest` of host `host` has endpoint `eid` open in
    /// its backend. There is no event for it, so the backend is asked until
    /// it says so.
    pub fn wait_endpoint(&self, host: usize, guest: usize, eid: u64, timeout: Duration) {
        self.wait_endpoint_unless(host, guest, eid, timeout, || false);
    }

    /// Waits until the passive side `app`, run in guest `guest` of host
    /// `host`, listens on endpoint `eid`, or has already ended: a passive
    /// side that needs no peer (it sends to itself) may open, finish and
    /// close before the backend is asked; what it did is judged from its
    /// output.
    pub fn wait_listening(
        &self,
        host: usize,
        guest: usize,
        eid: u64,
        timeout: Duration,
        app: &mut App,
    ) {
        self.wait_endpoint_unless(host, guest, eid, timeout, || app.ended());
    }

    fn wait_endpoint_unless(
        &self,
        host: usize,
        guest: usize,
        eid: u64,
        timeout: Duration,
        mut done: impl FnMut() -> bool,
    ) {
        let domid = self.hosts[host].guests[guest].domid;
        let deadline = Instant::now() + timeout;
        let mut backd = self.backd(host);
        loop {
            let (open, guests) = endpoint_open(&mut backd, domid, eid);
            if open || done() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "endpoint {eid} of {}/{} never opened: {guests}",
                self.hosts[host].name,
                self.hosts[host].guests[guest].name
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until host `host`'s backend lists endpoint `eid` of domain `domid` as
    /// open (`open`) or not; the backend's list of guests if it does not within
    /// `timeout`. There is no event for it, so the backend is asked until it says so.
    pub fn wait_endpoint_state(
        &self,
        host: usize,
        domid: DomId,
        eid: u64,
        open: bool,
        timeout: Duration,
    ) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let mut backd = self.backd(host);
        loop {
            let (listed, guests) = endpoint_open(&mut backd, domid, eid);
            if listed == open {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(guests.to_string());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Moves guest `guest` of host `from` to host `to` (`xmx sim migrate --json`);
    /// returns its report. The guest is listed under `to` afterwards (last), by its
    /// domain name, with its new domid.
    pub fn migrate(&mut self, from: usize, guest: usize, to: usize) -> Value {
        let (h, g) = (&self.hosts[from], &self.hosts[from].guests[guest]);
        let o = Command::new(&self.xmx)
            .args(["sim", "migrate", "--name", &self.name, &h.name, &g.name])
            .args(["--to", &self.hosts[to].name, "--json"])
            .env_remove("RUST_LOG")
            .output()
            .expect("running xmx sim migrate");
        assert!(o.status.success(), "xmx sim migrate: {}", output_text(&o));
        let report: Value = serde_json::from_slice(&o.stdout).expect("xmx sim migrate --json");
        let moved = self.hosts[from].guests.remove(guest);
        self.hosts[to].guests.push(Guest {
            name: report["guest"].as_str().unwrap_or(&moved.name).to_owned(),
            domid: report["dest_domid"].as_u64().expect("dest_domid") as DomId,
        });
        report
    }

    /// The simulated hypervisor of host `i`.
    pub fn sim_admin(&self, i: usize) -> SimAdmin {
        SimAdmin::connect(&self.hosts[i].simhv_dir).expect("simhv's admin socket")
    }

    /// What host `i`'s simhv says of domain `domid`.
    pub fn domain_state(&self, i: usize, domid: DomId) -> DomainState {
        self.sim_admin(i).state(domid).expect("domain state")
    }

    /// Waits until `check` holds on host `i`'s view of domain `domid`; the
    /// last state seen. The simulator has no event for its counters, so they
    /// are read until they say so.
    pub fn wait_domain(
        &self,
        i: usize,
        domid: DomId,
        timeout: Duration,
        check: impl Fn(&DomainState) -> bool,
    ) -> Result<DomainState, Box<DomainState>> {
        let admin = self.sim_admin(i);
        let deadline = Instant::now() + timeout;
        loop {
            let s = admin.state(domid).expect("domain state");
            if check(&s) {
                return Ok(s);
            }
            if Instant::now() >= deadline {
                return Err(Box::new(s));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl SimCluster {
    /// A test failed with the cluster up: the end of every daemon's log, on the test's
    /// standard error (where the failure is read), before `sim down` removes them.
    fn show_daemon_logs(&self) {
        let root = std::path::Path::new("/run/xmx").join(&self.name);
        let Ok(hosts) = std::fs::read_dir(&root) else {
            return;
        };
        let mut logs: Vec<PathBuf> = hosts
            .flatten()
            .filter_map(|h| std::fs::read_dir(h.path().join("logs")).ok())
            .flat_map(|d| d.flatten().map(|e| e.path()))
            .collect();
        logs.sort();
        for log in logs {
            let Ok(text) = std::fs::read_to_string(&log) else {
                continue;
            };
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(DAEMON_LOG_TAIL)..];
            eprintln!(
                "--- {} (last {} of {} lines)\n{}",
                log.display(),
                tail.len(),
                lines.len(),
                tail.join("\n")
            );
        }
    }
}

/// Lines of each daemon's log a failed test shows.
const DAEMON_LOG_TAIL: usize = 60;

impl SimCluster {
    /// With `XMX_DAEMON_WARNINGS=FILE` (a soak's), every warning and error the daemons
    /// logged is appended to FILE, passed or failed: a lag that did not fail this test is
    /// how a later failure begins.
    fn keep_daemon_warnings(&self) {
        let Some(file) = std::env::var_os("XMX_DAEMON_WARNINGS") else {
            return;
        };
        let root = std::path::Path::new("/run/xmx").join(&self.name);
        let mut found = String::new();
        for host in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            for log in std::fs::read_dir(host.path().join("logs"))
                .into_iter()
                .flatten()
                .flatten()
            {
                let Ok(text) = std::fs::read_to_string(log.path()) else {
                    continue;
                };
                for line in text
                    .lines()
                    .filter(|l| l.contains(" WARN") || l.contains("ERROR"))
                {
                    found.push_str(&format!("{}: {line}\n", log.path().display()));
                }
            }
        }
        if found.is_empty() {
            return;
        }
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&file)
        {
            let _ = f.write_all(found.as_bytes());
        }
    }
}

impl Drop for SimCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.show_daemon_logs();
        }
        self.keep_daemon_warnings();
        let started = Instant::now();
        let o = Command::new(&self.xmx)
            .args(["sim", "down", "--name", &self.name])
            .output();
        match o {
            Ok(o) if o.status.success() => {
                if started.elapsed() > Duration::from_secs(5) {
                    eprintln!(
                        "xmx sim down --name {} took {:.1} s:\n{}",
                        self.name,
                        started.elapsed().as_secs_f64(),
                        String::from_utf8_lossy(&o.stderr)
                    );
                }
            }
            Ok(o) => eprintln!("xmx sim down --name {}: {}", self.name, output_text(&o)),
            Err(e) => eprintln!("xmx sim down --name {}: {e}", self.name),
        }
    }
}

//! Two hosts for the native transport: two network namespaces, each with
//! one Ethernet interface (MTU 9000), joined directly by a veth pair or
//! through a relay that impairs the link like `tc netem`.
//!
//! Programs run in a namespace with `ip netns exec`, on the native transport
//! (`XMX_TRANSPORT=native`, `XMX_IFACE`, `XMX_PEERS`, `XMX_HOSTNAME`).
//! Host 0 is `h0`, host 1 is `h1`. Needs root; [`TwoHosts::direct`] and
//! [`TwoHosts::impaired`] return `None` (with the reason printed) without it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use xmx_nic::testbed::relay::relay_seed_or;
use xmx_nic::testbed::VethPair;
use xmx_nic::{NicConfig, PacketSocket};

use crate::common::lib_dir;

/// MTU of every link.
pub const MTU: u32 = 9000;
/// Watchdog of every program run, in seconds.
pub const RUN_LIMIT_S: u32 = 110;

/// One host: its namespace, interface, board address and hostname.
#[derive(Clone, Debug)]
pub struct NamespaceHost {
    pub ns: String,
    pub iface: String,
    pub mac: String,
    pub hostname: String,
}

pub use xmx_nic::testbed::relay::{Impairment, RelayStats};

/// The relay's seed unless `XMX_RELAY_SEED` names another: these tests check that the
/// relay lost frames even in runs of a dozen frames, which a fixed sequence of decisions
/// guarantees and a fresh one would not.
const FIXED_SEED: u64 = 0x786d_7820_6e65_7465;

/// `netem loss 5% duplicate 1% reorder 5% delay 1ms`.
pub const LOSSY: Impairment = Impairment::NETEM;

enum TwoHostsLink {
    Veth(VethPair),
    Relayed(NamespaceRelay),
}

/// Two hosts and the peer list naming both.
pub struct TwoHosts {
    pub hosts: [NamespaceHost; 2],
    /// `XMX_PEERS` file listing both hosts with their hostnames.
    pub peers: PathBuf,
    /// The same hosts with no hostname: they are learnt by HOST_QUERY.
    pub peers_unnamed: PathBuf,
    /// How the link is impaired, for the logs.
    pub impairment: String,
    link: TwoHostsLink,
    dir: tempfile::TempDir,
}

/// Why two hosts cannot be built here, if they cannot.
fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root: network namespaces need CAP_SYS_ADMIN".into());
    }
    match Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => None,
        _ => Some("iproute2's ip is not installed".into()),
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let o = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// Board addresses of the two hosts (locally administered).
const MACS: [&str; 2] = ["02:58:4d:00:00:a0", "02:58:4d:00:00:b1"];

static NEXT: AtomicU32 = AtomicU32::new(0);

impl TwoHosts {
    /// Two hosts on a direct veth.
    pub fn direct(tag: &str) -> Option<TwoHosts> {
        if let Some(why) = unavailable() {
            println!("skipped: {why}");
            return None;
        }
        let pair = VethPair::create(tag, MTU).expect("veth pair");
        let hosts = [
            host(&pair.ns_a, &pair.if_a, 0),
            host(&pair.ns_b, &pair.if_b, 1),
        ];
        Some(TwoHosts::with(
            hosts,
            TwoHostsLink::Veth(pair),
            "none".into(),
        ))
    }

    /// Two hosts on a link impaired as `imp` says: by `tc netem` on both
    /// ends when the kernel has it, else by a relay in a third namespace.
    pub fn impaired(tag: &str, imp: Impairment) -> Option<TwoHosts> {
        if let Some(why) = unavailable() {
            println!("skipped: {why}");
            return None;
        }
        let pair = VethPair::create(tag, MTU).expect("veth pair");
        let pct = |p: f64| format!("{}%", (p * 1000.0).round() / 10.0);
        let netem = format!(
            "loss {} duplicate {} reorder {} delay {}us",
            pct(imp.loss),
            pct(imp.duplicate),
            pct(imp.reorder),
            imp.delay.as_micros()
        );
        let tc = |ns: &str, dev: &str| -> Result<(), String> {
            let mut args = vec!["netns", "exec", ns, "tc", "qdisc", "add", "dev", dev];
            args.extend(["root", "netem"]);
            args.extend(netem.split(' '));
            let o = Command::new("ip")
                .args(&args)
                .output()
                .map_err(|e| e.to_string())?;
            if o.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&o.stderr).trim().to_owned())
            }
        };
        match tc(&pair.ns_a, &pair.if_a).and_then(|_| tc(&pair.ns_b, &pair.if_b)) {
            Ok(()) => {
                let hosts = [
                    host(&pair.ns_a, &pair.if_a, 0),
                    host(&pair.ns_b, &pair.if_b, 1),
                ];
                Some(TwoHosts::with(
                    hosts,
                    TwoHostsLink::Veth(pair),
                    format!("tc netem {netem}"),
                ))
            }
            Err(why) => {
                println!("tc netem unavailable ({why}); impairing the link in a relay instead");
                drop(pair);
                let relay = NamespaceRelay::start(tag, imp);
                let hosts = [
                    host(&relay.namespaces[0], "xmx-a", 0),
                    host(&relay.namespaces[1], "xmx-b", 1),
                ];
                Some(TwoHosts::with(
                    hosts,
                    TwoHostsLink::Relayed(relay),
                    format!("relay {netem}"),
                ))
            }
        }
    }

    fn with(hosts: [NamespaceHost; 2], link: TwoHostsLink, impairment: String) -> TwoHosts {
        for h in &hosts {
            ip(&["-n", &h.ns, "link", "set", &h.iface, "address", &h.mac]).expect("set MAC");
        }
        let dir = tempfile::tempdir().expect("temporary directory");
        let list = |named: bool| {
            let entries: Vec<String> = hosts
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    if named {
                        format!(
                            r#"{{"index": {i}, "mac": "{}", "hostname": "{}"}}"#,
                            h.mac, h.hostname
                        )
                    } else {
                        format!(r#"{{"index": {i}, "mac": "{}"}}"#, h.mac)
                    }
                })
                .collect();
            format!("[{}]\n", entries.join(",\n "))
        };
        let peers = dir.path().join("peers.json");
        let peers_unnamed = dir.path().join("peers-unnamed.json");
        std::fs::write(&peers, list(true)).expect("peer list");
        std::fs::write(&peers_unnamed, list(false)).expect("peer list");
        TwoHosts {
            hosts,
            peers,
            peers_unnamed,
            impairment,
            link,
            dir,
        }
    }

    /// What the relay did, if the link is relayed.
    pub fn relay_stats(&self) -> Option<RelayStats> {
        match &self.link {
            TwoHostsLink::Relayed(r) => Some(r.stats()),
            TwoHostsLink::Veth(_) => None,
        }
    }

    /// `bin args` on host `side` on the native transport, with `env` on
    /// top, under a watchdog; stdout and stderr piped.
    pub fn command(&self, side: usize, bin: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
        let h = &self.hosts[side];
        let limit = RUN_LIMIT_S.to_string();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &h.ns, "timeout", "-k", "5", &limit])
            .arg(bin)
            .args(args)
            .env("LD_LIBRARY_PATH", lib_dir())
            .env("XMX_TRANSPORT", "native")
            .env("XMX_IFACE", &h.iface)
            .env("XMX_PEERS", &self.peers)
            .env("XMX_HOSTNAME", &h.hostname)
            .env_remove("MX_ERRORS_ARE_FATAL")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        // XMX_TEST_LOG=filter logs the programs' libraries (RUST_LOG).
        if let Ok(filter) = std::env::var("XMX_TEST_LOG") {
            cmd.env("RUST_LOG", filter);
        }
        cmd
    }

    /// Runs `bin -l 2` on h0 and, once its endpoint is open, `bin -d h0 -e 2`
    /// on h1; returns (passive, active) outputs.
    pub fn run_pair(&self, bin: &Path, env: &[(&str, &str)]) -> (Output, Output) {
        self.run_pair_args(bin, &["-l", "2"], &["-d", "h0", "-e", "2"], env)
    }

    /// Runs `bin passive_args` on h0 and, once its endpoint is open,
    /// `bin active_args` on h1; returns (passive, active) outputs.
    pub fn run_pair_args(
        &self,
        bin: &Path,
        passive_args: &[&str],
        active_args: &[&str],
        env: &[(&str, &str)],
    ) -> (Output, Output) {
        let mut passive = self
            .command(0, bin, passive_args, env)
            .spawn()
            .expect("spawning the passive side");
        wait_endpoint_open(&mut passive);
        let active = self
            .command(1, bin, active_args, env)
            .spawn()
            .expect("spawning the active side");
        let active = active.wait_with_output().expect("active side");
        let passive = passive.wait_with_output().expect("passive side");
        (passive, active)
    }
}

fn host(ns: &str, iface: &str, i: usize) -> NamespaceHost {
    NamespaceHost {
        ns: ns.to_owned(),
        iface: iface.to_owned(),
        mac: MACS[i].to_owned(),
        hostname: format!("h{i}"),
    }
}

/// Processes descending from `pid`, itself included.
fn descendants(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            // "pid (comm) state ppid ...": comm may hold spaces, so split
            // after its closing parenthesis.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|s| s.parse::<u32>().ok());
            if let Some(pp) = ppid {
                parents.push((p, pp));
            }
        }
    }
    let mut out = vec![pid];
    let mut i = 0;
    while let Some(&p) = out.get(i) {
        out.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    out
}

/// Whether a thread named `name` runs in process `pid`.
fn has_thread(pid: u32, name: &str) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks
        .flatten()
        .any(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
}

/// Waits until the program under `child` has an open endpoint: libmx
/// starts its progression thread (`mx-progress`) when the first endpoint
/// opens. Returns early if the program exits (its output tells why).
pub fn wait_endpoint_open(child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if descendants(child.id())
            .into_iter()
            .any(|p| has_thread(p, "mx-progress"))
        {
            return;
        }
        if child.try_wait().ok().flatten().is_some() || Instant::now() > deadline {
            return;
        }
        // No event announces another process's thread: poll /proc.
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Requires a run to have passed; returns its stdout.
pub fn passed(what: &str, o: &Output) -> String {
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success() && stdout.contains("PASS"),
        "{what} failed ({:?}):\nstdout:\n{stdout}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

/// A relay in a third namespace between the two hosts' interfaces, impairing both ways.
struct NamespaceRelay {
    namespaces: [String; 3],
    relay: Option<xmx_nic::testbed::relay::Relay>,
}

impl NamespaceRelay {
    fn start(tag: &str, imp: Impairment) -> NamespaceRelay {
        let base = format!(
            "xmx-{tag}-{}-r{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let namespaces = [
            format!("{base}-a"),
            format!("{base}-b"),
            format!("{base}-r"),
        ];
        let mut relay = NamespaceRelay {
            namespaces: namespaces.clone(),
            relay: None,
        };
        for ns in &namespaces {
            ip(&["netns", "add", ns]).expect("namespace");
        }
        let [a, b, r] = &namespaces;
        let mtu = MTU.to_string();
        for (ns, iface, peer) in [(a, "xmx-a", "xmx-ra"), (b, "xmx-b", "xmx-rb")] {
            ip(&[
                "-n", ns, "link", "add", iface, "mtu", &mtu, "type", "veth", "peer", "name", peer,
                "mtu", &mtu, "netns", r,
            ])
            .expect("veth");
            ip(&["-n", ns, "link", "set", iface, "up"]).expect("link up");
            ip(&["-n", r, "link", "set", peer, "up"]).expect("link up");
        }
        let cfg = NicConfig {
            promiscuous: true,
            ..NicConfig::default()
        };
        let a_end = PacketSocket::open_in_netns(r, "xmx-ra", cfg.clone()).expect("relay end a");
        let b_end = PacketSocket::open_in_netns(r, "xmx-rb", cfg).expect("relay end b");
        relay.relay = Some(
            xmx_nic::testbed::relay::Relay::start(
                "netem-relay",
                a_end,
                b_end,
                imp,
                imp,
                relay_seed_or(FIXED_SEED),
            )
            .expect("relay thread"),
        );
        relay
    }

    fn stats(&self) -> RelayStats {
        self.relay.as_ref().map(|r| r.stats()).unwrap_or_default()
    }
}

impl Drop for NamespaceRelay {
    fn drop(&mut self) {
        self.relay = None;
        for ns in &self.namespaces {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

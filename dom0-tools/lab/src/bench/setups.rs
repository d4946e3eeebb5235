//! The registry of setups: what `--setups` names, in table order.
//!
//! A setup says how to start the two processes of one measurement cell. Adding one is
//! implementing [`Setup`] and listing it in [`registry`]; the driver, the table, the JSON,
//! the ratios and the plots pick it up. A setup that cannot run here says why from
//! [`Setup::prepare`], and every report shows it as "n/a (why)". `guest-scaling` measures
//! by guest count, not by size, and has a section of its own ([`super::scaling`]).

use std::path::Path;

use super::agent::Test;
use super::cost::DaemonRole;
use super::guests::{BenchPair, GuestAt, GuestBed};
use super::link::BenchLink;
use super::native::PreparedNative;
use super::plan::Counts;
use super::runner::{AgentSpec, CellAgents};
use super::BenchError;

/// What setups can use while preparing and running.
pub struct Env<'a> {
    /// The link between the two namespaces, or why there is none.
    pub link: Result<&'a BenchLink, &'a str>,
    /// The `xmx` binary (agents are started through it).
    pub xmx: &'a Path,
    /// A directory for this run's files (shared mappings, built programs).
    pub scratch: &'a Path,
    /// Microseconds a polling waiter spins before it blocks.
    pub spin_us: u64,
    /// The simulated cluster of the guest setups, or why there is none.
    pub guests: Result<&'a GuestBed, &'a str>,
}

/// One way of moving messages between two processes.
pub trait Setup {
    /// Short name, as `--setups` and the reports spell it.
    fn name(&self) -> &'static str;
    /// One line for readers of the reports.
    fn description(&self) -> &'static str;
    /// Setups this one is divided by in the ratio columns (`this/other`).
    fn compare_with(&self) -> &'static [&'static str] {
        &[]
    }
    /// Get ready to run; `Err(reason)` marks the setup n/a for the whole run.
    fn prepare(&mut self, env: &Env<'_>) -> Result<(), String>;
    /// Whether it measures `size`-byte messages (sizes it skips show as "-").
    fn measures(&self, _size: u64) -> bool {
        true
    }
    /// Daemons whose CPU time the setup's messages cost, besides its two programs.
    fn daemons(&self, _env: &Env<'_>) -> Vec<(DaemonRole, i32)> {
        Vec::new()
    }
    /// The two processes that measure `test` for `size`-byte messages.
    fn cell(
        &self,
        env: &Env<'_>,
        test: Test,
        size: u64,
        counts: Counts,
    ) -> Result<CellAgents, String>;
}

/// Every known setup, in the order of the reports.
pub fn registry() -> Vec<Box<dyn Setup>> {
    vec![
        Box::new(Shm),
        Box::new(AfPacket {
            frame_payload: None,
        }),
        Box::new(AfPacket {
            frame_payload: Some(MX_FRAME_PAYLOAD),
        }),
        Box::new(Tcp),
        Box::new(NativeSetup(None)),
        Box::new(GuestSetup {
            name: "guest-remote",
            description:
                "xmx between two guests on different hosts, h0/g0 -> h1/g0 (frontend, rings, backend, wire), library defaults (MX_RCACHE=1)",
            compare: &["native", "tcp"],
            placement: Placement::Remote,
            rcache: true,
            poll: false,
            direct: true,
        }),
        Box::new(GuestSetup {
            name: "guest-local",
            description:
                "xmx between two co-located guests, h0/g0 -> h0/g1, through the backend (it copies between them; MX_DISABLE_SHMEM=1), MX_RCACHE=1",
            compare: &["shm"],
            placement: Placement::Local,
            rcache: true,
            poll: false,
            direct: false,
        }),
        Box::new(GuestSetup {
            name: "guest-direct",
            description:
                "xmx between two co-located guests, h0/g0 -> h0/g1, on the direct channel dom0 brokers (shared rings, no backend), library defaults",
            compare: &["shm", "guest-local"],
            placement: Placement::Local,
            rcache: true,
            poll: false,
            direct: true,
        }),
        Box::new(GuestSetup {
            name: "guest-nocache",
            description:
                "guest-remote with the registration cache off (MX_RCACHE=0), LARGE messages (> 32 KiB) only",
            compare: &["guest-remote"],
            placement: Placement::Remote,
            rcache: false,
            poll: false,
            direct: true,
        }),
        Box::new(GuestSetup {
            name: "guest-remote-poll",
            description:
                "guest-remote with every waiter spinning (XMX_SPIN_US = 1 s) and both programs polling with mx_test in a loop, as MPI progress engines do",
            compare: &["guest-remote"],
            placement: Placement::Remote,
            rcache: true,
            poll: true,
            direct: true,
        }),
    ]
}

/// Names of every setup `--setups` accepts: the registry's, then `guest-scaling`.
pub fn names() -> Vec<&'static str> {
    let mut names: Vec<_> = registry().iter().map(|s| s.name()).collect();
    names.push(super::scaling::NAME);
    names
}

/// Whether `name` is requested by `wanted` (empty: everything).
pub fn wanted(wanted: &[String], name: &str) -> bool {
    wanted.is_empty() || wanted.iter().any(|w| w == name)
}

/// The registered setups named in `wanted` (in registry order), or every one when `wanted`
/// is empty. An unknown name is an error that lists the known ones.
pub fn select(wanted: &[String]) -> Result<Vec<Box<dyn Setup>>, BenchError> {
    let all = registry();
    let known = names();
    if let Some(bad) = wanted.iter().find(|w| !known.contains(&w.as_str())) {
        return Err(BenchError::UnknownSetup {
            name: bad.clone(),
            known: names().join(", "),
        });
    }
    Ok(all
        .into_iter()
        .filter(|s| wanted.is_empty() || wanted.iter().any(|w| w == s.name()))
        .collect())
}

/// `bench-agent` arguments shared by the built-in setups.
fn agent_args(
    env: &Env<'_>,
    transport: &str,
    role: &str,
    test: Test,
    size: u64,
    counts: Counts,
) -> Vec<String> {
    [
        "bench-agent",
        "--transport",
        transport,
        "--role",
        role,
        "--test",
        test.as_str(),
        "--size",
        &size.to_string(),
        "--warmup",
        &counts.warmup.to_string(),
        "--iters",
        &counts.iters.to_string(),
        "--spin-us",
        &env.spin_us.to_string(),
    ]
    .map(str::to_owned)
    .to_vec()
}

fn with(mut args: Vec<String>, extra: &[&str]) -> Vec<String> {
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args
}

/// Two processes on one shared mapping.
struct Shm;

impl Setup for Shm {
    fn name(&self) -> &'static str {
        "shm"
    }
    fn description(&self) -> &'static str {
        "two processes, one shared mapping, acquire/release rings, bounded spin (ceiling for co-located peers)"
    }
    fn prepare(&mut self, _env: &Env<'_>) -> Result<(), String> {
        Ok(())
    }
    fn cell(
        &self,
        env: &Env<'_>,
        test: Test,
        size: u64,
        counts: Counts,
    ) -> Result<CellAgents, String> {
        // Under /dev/shm when it exists, so the mapping is memory and not a disk file.
        let dir = Path::new("/dev/shm");
        let dir = if dir.is_dir() { dir } else { env.scratch };
        let path = dir.join(format!(
            "xmx-bench-{}-{}-{size}",
            std::process::id(),
            test.as_str()
        ));
        let _ = std::fs::remove_file(&path);
        let cleanup = vec![path.clone()];
        let path = path.display().to_string();
        let server = AgentSpec {
            args: with(
                agent_args(env, "shm", "server", test, size, counts),
                &["--shm", &path],
            ),
            env: vec![],
        };
        let client = AgentSpec {
            args: with(
                agent_args(env, "shm", "client", test, size, counts),
                &["--shm", &path],
            ),
            env: vec![],
        };
        Ok(CellAgents {
            server,
            client: Box::new(move |_| client),
            cleanup,
        })
    }
}

/// Payload of MXoE's data frames in wire-compatible mode (MEDIUM fragments, PULL_REPLY).
const MX_FRAME_PAYLOAD: usize = 4096;

/// Raw frames over the veth, as large as the link allows or as MX's data frames.
struct AfPacket {
    frame_payload: Option<usize>,
}

impl Setup for AfPacket {
    fn name(&self) -> &'static str {
        match self.frame_payload {
            None => "afpacket",
            Some(_) => "afpacket-mx",
        }
    }
    fn description(&self) -> &'static str {
        match self.frame_payload {
            None => "raw AF_PACKET frames over the veth (mmap rings), messages as trains of <= 9000-byte frames",
            Some(_) => "raw AF_PACKET frames over the veth, messages as trains of 4096-byte payloads (MX's data frames in wire-compatible mode)",
        }
    }
    fn compare_with(&self) -> &'static [&'static str] {
        &["shm"]
    }
    fn prepare(&mut self, env: &Env<'_>) -> Result<(), String> {
        env.link.map(drop).map_err(str::to_owned)
    }
    fn cell(
        &self,
        env: &Env<'_>,
        test: Test,
        size: u64,
        counts: Counts,
    ) -> Result<CellAgents, String> {
        let link = env.link.map_err(str::to_owned)?;
        let payload = self.frame_payload.map(|p| p.to_string());
        let payload: Vec<&str> = payload
            .iter()
            .flat_map(|p| ["--frame-payload", p])
            .collect();
        let server = AgentSpec {
            args: with(
                with(
                    agent_args(env, "afpacket", "server", test, size, counts),
                    &["--netns", &link.b.netns, "--iface", &link.b.iface],
                ),
                &payload,
            ),
            env: vec![],
        };
        let base = with(
            with(
                agent_args(env, "afpacket", "client", test, size, counts),
                &["--netns", &link.a.netns, "--iface", &link.a.iface],
            ),
            &payload,
        );
        let client = move |mac: Option<String>| {
            let mut args = base;
            if let Some(mac) = mac {
                args.extend(["--peer".to_owned(), mac]);
            }
            AgentSpec { args, env: vec![] }
        };
        Ok(CellAgents {
            server,
            client: Box::new(client),
            cleanup: vec![],
        })
    }
}

/// TCP over the veth.
struct Tcp;

impl Setup for Tcp {
    fn name(&self) -> &'static str {
        "tcp"
    }
    fn description(&self) -> &'static str {
        "TCP over the veth (TCP_NODELAY, 4-byte length prefix per message)"
    }
    fn compare_with(&self) -> &'static [&'static str] {
        &["native", "afpacket"]
    }
    fn prepare(&mut self, env: &Env<'_>) -> Result<(), String> {
        env.link.map(drop).map_err(str::to_owned)
    }
    fn cell(
        &self,
        env: &Env<'_>,
        test: Test,
        size: u64,
        counts: Counts,
    ) -> Result<CellAgents, String> {
        let link = env.link.map_err(str::to_owned)?;
        let server_ip = link.b.addr.to_string();
        let server = AgentSpec {
            args: with(
                agent_args(env, "tcp", "server", test, size, counts),
                &["--netns", &link.b.netns, "--addr", &server_ip],
            ),
            env: vec![],
        };
        let base = with(
            agent_args(env, "tcp", "client", test, size, counts),
            &["--netns", &link.a.netns, "--addr", &server_ip],
        );
        let client = move |port: Option<String>| {
            let mut args = base;
            if let Some(port) = port {
                args.extend(["--peer".to_owned(), port]);
            }
            AgentSpec { args, env: vec![] }
        };
        Ok(CellAgents {
            server,
            client: Box::new(client),
            cleanup: vec![],
        })
    }
}

/// xmx native: libmyriexpress with the engine in-process.
struct NativeSetup(Option<PreparedNative>);

impl Setup for NativeSetup {
    fn name(&self) -> &'static str {
        "native"
    }
    fn description(&self) -> &'static str {
        "xmx native: libmyriexpress (XMX_TRANSPORT=native), MX engine in-process on the veth"
    }
    fn compare_with(&self) -> &'static [&'static str] {
        &["afpacket", "afpacket-mx", "shm"]
    }
    fn prepare(&mut self, env: &Env<'_>) -> Result<(), String> {
        let link = env.link.map_err(str::to_owned)?;
        self.0 = Some(PreparedNative::prepare(
            env.xmx,
            link,
            env.scratch,
            env.spin_us,
        )?);
        Ok(())
    }
    fn cell(
        &self,
        env: &Env<'_>,
        test: Test,
        size: u64,
        counts: Counts,
    ) -> Result<CellAgents, String> {
        let link = env.link.map_err(str::to_owned)?;
        let native = self.0.as_ref().ok_or("native setup not prepared")?;
        Ok(native.cell(link, test, size, counts))
    }
}

/// Where the two guests of a guest setup are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// h0/g0 -> h1/g0.
    Remote,
    /// h0/g0 -> h0/g1.
    Local,
}

/// xmx between two guests of the run's simulated cluster.
struct GuestSetup {
    name: &'static str,
    description: &'static str,
    compare: &'static [&'static str],
    placement: Placement,
    /// `MX_RCACHE`; with the cache off only LARGE messages are measured
    /// (the cache plays no part in smaller ones).
    rcache: bool,
    /// Both programs poll with `mx_test` (`MX_BENCH_POLL=1`) and every wait in the
    /// library spins for [`POLL_SETUP_SPIN_US`] before it blocks: more pollers than
    /// cores, as on a consolidated host.
    poll: bool,
    /// Direct channels between co-located guests on (the default, said explicitly:
    /// `XMX_DIRECT=1`, `MX_DISABLE_SHMEM=0`), or off (`MX_DISABLE_SHMEM=1`).
    direct: bool,
}

/// `XMX_SPIN_US` of the polling setup: long enough that no wait of a cell ever blocks.
const POLL_SETUP_SPIN_US: u64 = 1_000_000;

impl GuestSetup {
    fn pair(&self) -> BenchPair {
        BenchPair {
            client: GuestAt::new(0, 0),
            server: match self.placement {
                Placement::Remote => GuestAt::new(1, 0),
                Placement::Local => GuestAt::new(0, 1),
            },
        }
    }
}

impl Setup for GuestSetup {
    fn name(&self) -> &'static str {
        self.name
    }
    fn description(&self) -> &'static str {
        self.description
    }
    fn compare_with(&self) -> &'static [&'static str] {
        self.compare
    }
    fn prepare(&mut self, env: &Env<'_>) -> Result<(), String> {
        let bed = env.guests.map_err(str::to_owned)?;
        let pair = self.pair();
        for at in [pair.client, pair.server] {
            bed.programs.env(&bed.state, at)?;
        }
        Ok(())
    }
    fn measures(&self, size: u64) -> bool {
        self.rcache || size > xmx_wire::msg::MEDIUM_MAX as u64
    }
    fn daemons(&self, env: &Env<'_>) -> Vec<(DaemonRole, i32)> {
        let pair = self.pair();
        env.guests
            .map(|bed| bed.daemons(&[pair.client, pair.server]))
            .unwrap_or_default()
    }
    fn cell(
        &self,
        env: &Env<'_>,
        test: Test,
        size: u64,
        counts: Counts,
    ) -> Result<CellAgents, String> {
        let bed = env.guests.map_err(str::to_owned)?;
        let spin_us = if self.poll {
            POLL_SETUP_SPIN_US
        } else {
            env.spin_us
        };
        let extra = [
            ("MX_RCACHE", if self.rcache { "1" } else { "0" }.to_owned()),
            ("XMX_SPIN_US", spin_us.to_string()),
            (
                "MX_BENCH_POLL",
                if self.poll { "1" } else { "0" }.to_owned(),
            ),
            (
                "MX_DISABLE_SHMEM",
                if self.direct { "0" } else { "1" }.to_owned(),
            ),
            ("XMX_DIRECT", if self.direct { "1" } else { "0" }.to_owned()),
        ]
        .map(|(k, v)| (k.to_owned(), v));
        bed.programs
            .cell_with(&bed.state, &self.pair(), test, size, counts, &extra, &[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_comparisons_known() {
        let all = names();
        let mut sorted = all.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), all.len());
        for s in registry() {
            for other in s.compare_with() {
                assert!(
                    all.contains(other),
                    "{} compares with unknown {other}",
                    s.name()
                );
                assert_ne!(*other, s.name());
            }
        }
    }

    #[test]
    fn guest_setups_and_their_sizes() {
        let all = names();
        for n in [
            "guest-remote",
            "guest-local",
            "guest-direct",
            "guest-nocache",
            "guest-scaling",
        ] {
            assert!(all.contains(&n), "{n}");
        }
        let picked = select(&["guest-scaling".into(), "guest-nocache".into()]).unwrap();
        let names: Vec<_> = picked.iter().map(|s| s.name()).collect();
        assert_eq!(names, ["guest-nocache"], "scaling is not a per-size setup");
        let nocache = &picked[0];
        assert!(!nocache.measures(32 << 10));
        assert!(nocache.measures((32 << 10) + 1));
        assert_eq!(nocache.compare_with(), ["guest-remote"]);
        let remote = select(&["guest-remote".into()]).unwrap();
        assert!(remote[0].measures(0) && remote[0].measures(16 << 20));
        assert!(wanted(&[], "guest-scaling"));
        assert!(!wanted(&["shm".into()], "guest-scaling"));
    }

    #[test]
    fn selection_keeps_registry_order() {
        let picked = select(&["tcp".into(), "shm".into()]).unwrap();
        let names: Vec<_> = picked.iter().map(|s| s.name()).collect();
        assert_eq!(names, ["shm", "tcp"]);
        assert_eq!(select(&[]).unwrap().len(), registry().len());
    }

    #[test]
    fn unknown_setups_are_refused() {
        let err = select(&["shm".into(), "infiniband".into()]).err().unwrap();
        match &err {
            BenchError::UnknownSetup { name, known } => {
                assert_eq!(name, "infiniband");
                assert!(
                    known.starts_with("shm, afpacket, afpacket-mx, tcp, native"),
                    "{known}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(
            err.to_string().contains("unknown setup \"infiniband\""),
            "{err}"
        );
    }
}

//! The registry of setups: what `--setups` names, in table order.
//!
//! A setup says how to start the two processes of one measurement cell. Adding one
//! (guest-to-guest, co-located guests, rcache off, N guests per host) is implementing
//! [`Setup`] and listing it in [`registry`]; the driver, the table, the JSON, the ratios and
//! the plots pick it up. A setup that cannot run here says why from [`Setup::prepare`], and
//! every report shows it as "n/a (why)".

use std::path::Path;

use super::agent::Test;
use super::link::Link;
use super::native::Native;
use super::plan::Counts;
use super::runner::{AgentSpec, CellAgents};
use super::BenchError;

/// What setups can use while preparing and running.
pub struct Env<'a> {
    /// The link between the two namespaces, or why there is none.
    pub link: Result<&'a Link, &'a str>,
    /// The `xmx` binary (agents are started through it).
    pub xmx: &'a Path,
    /// A directory for this run's files (shared mappings, built programs).
    pub scratch: &'a Path,
    /// Microseconds a polling waiter spins before it blocks.
    pub spin_us: u64,
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
        Box::new(AfPacket),
        Box::new(Tcp),
        Box::new(NativeSetup(None)),
        Box::new(Planned {
            name: "guest-remote",
            description:
                "xmx between two guests on different hosts (frontend, rings, backend, wire)",
            reason: "the xen transport of libmyriexpress is not built yet",
            compare: &["native"],
        }),
        Box::new(Planned {
            name: "guest-local",
            description: "xmx between two co-located guests (the backend copies between them)",
            reason: "the xen transport of libmyriexpress is not built yet",
            compare: &["shm"],
        }),
        Box::new(Planned {
            name: "guest-nocache",
            description: "guest-remote with the registration cache off (MX_RCACHE=0)",
            reason: "the xen transport of libmyriexpress is not built yet",
            compare: &["guest-remote"],
        }),
        Box::new(Planned {
            name: "guest-x4",
            description: "guest-remote with 4 guest pairs sharing the hosts, per-pair figures",
            reason: "the xen transport of libmyriexpress is not built yet",
            compare: &["guest-remote"],
        }),
    ]
}

/// Names of every registered setup.
pub fn names() -> Vec<&'static str> {
    registry().iter().map(|s| s.name()).collect()
}

/// The registered setups named in `wanted` (in registry order), or every one when `wanted`
/// is empty. An unknown name is an error that lists the known ones.
pub fn select(wanted: &[String]) -> Result<Vec<Box<dyn Setup>>, BenchError> {
    let all = registry();
    if let Some(bad) = wanted
        .iter()
        .find(|w| !all.iter().any(|s| s.name() == w.as_str()))
    {
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

/// Raw frames over the veth.
struct AfPacket;

impl Setup for AfPacket {
    fn name(&self) -> &'static str {
        "afpacket"
    }
    fn description(&self) -> &'static str {
        "raw AF_PACKET frames over the veth (mmap rings), messages as trains of <= 9000-byte frames"
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
        let server = AgentSpec {
            args: with(
                agent_args(env, "afpacket", "server", test, size, counts),
                &["--netns", &link.b.netns, "--iface", &link.b.iface],
            ),
            env: vec![],
        };
        let base = with(
            agent_args(env, "afpacket", "client", test, size, counts),
            &["--netns", &link.a.netns, "--iface", &link.a.iface],
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
struct NativeSetup(Option<Native>);

impl Setup for NativeSetup {
    fn name(&self) -> &'static str {
        "native"
    }
    fn description(&self) -> &'static str {
        "xmx native: libmyriexpress (XMX_TRANSPORT=native), MX engine in-process on the veth"
    }
    fn compare_with(&self) -> &'static [&'static str] {
        &["afpacket", "shm"]
    }
    fn prepare(&mut self, env: &Env<'_>) -> Result<(), String> {
        let link = env.link.map_err(str::to_owned)?;
        self.0 = Some(Native::prepare(env.xmx, link, env.scratch, env.spin_us)?);
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

/// A setup whose transport does not exist yet: always n/a, with the reason.
struct Planned {
    name: &'static str,
    description: &'static str,
    reason: &'static str,
    compare: &'static [&'static str],
}

impl Setup for Planned {
    fn name(&self) -> &'static str {
        self.name
    }
    fn description(&self) -> &'static str {
        self.description
    }
    fn compare_with(&self) -> &'static [&'static str] {
        self.compare
    }
    fn prepare(&mut self, _env: &Env<'_>) -> Result<(), String> {
        Err(self.reason.to_owned())
    }
    fn cell(
        &self,
        _env: &Env<'_>,
        _test: Test,
        _size: u64,
        _counts: Counts,
    ) -> Result<CellAgents, String> {
        Err(self.reason.to_owned())
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
                assert!(known.starts_with("shm, afpacket, tcp, native"), "{known}");
            }
            other => panic!("{other:?}"),
        }
        assert!(
            err.to_string().contains("unknown setup \"infiniband\""),
            "{err}"
        );
    }
}

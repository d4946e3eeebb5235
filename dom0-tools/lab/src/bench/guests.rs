//! The guests the guest setups measure between: a simulated cluster of two hosts (made for
//! the run, or an existing one named with `--cluster`), the MX program its guests run, and
//! how one measuring process is started as an application of a guest.
//!
//! An application of a guest is `mx_bench` (the native setup's program, built against our
//! MX header) executed through `xmx bench-agent --transport exec` inside the host's
//! namespace with the guest's environment: its frontd socket and `XMX_TRANSPORT=xen`,
//! what `xmx sim run` gives a program. The demo starts its guest cells the same way.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::agent::Test;
use super::cost::DaemonRole;
use super::native;
use super::plan::Counts;
use super::runner::{AgentSpec, CellAgents};
use crate::interrupt;
use crate::sim::cluster::{self, ClusterState, UpOptions};
use crate::sim::settle;

/// Endpoint id of the passive side of a guest cell.
pub const SERVER_EID: &str = "2";
/// How long a cluster made for the run may take to connect every device and settle every
/// peer view.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The MX library the guests' programs run with.
const LIBRARY: &str = "libmyriexpress.so";

/// Guest `guest` of host `host`, by index (`h<host>/g<guest>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GuestAt {
    /// Host index.
    pub host: usize,
    /// Guest index on that host.
    pub guest: usize,
}

impl GuestAt {
    /// `h<host>/g<guest>`.
    pub const fn new(host: usize, guest: usize) -> GuestAt {
        GuestAt { host, guest }
    }

    /// The domain's name, which is its MX hostname (board 0) too: `h0-g1`.
    pub fn domain_name(self) -> String {
        format!(
            "{}-{}",
            cluster::host_name(self.host),
            cluster::guest_name(self.guest)
        )
    }
}

/// Two guests that exchange messages: the passive server and the active client.
pub trait GuestPair {
    /// The passive side (`mx_bench -l`).
    fn server(&self) -> GuestAt;
    /// The active side (`mx_bench -d`).
    fn client(&self) -> GuestAt;
}

/// A pair of guests with extra environment for both programs (`MX_RCACHE`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchPair {
    /// The passive side.
    pub server: GuestAt,
    /// The active side.
    pub client: GuestAt,
}

impl GuestPair for BenchPair {
    fn server(&self) -> GuestAt {
        self.server
    }
    fn client(&self) -> GuestAt {
        self.client
    }
}

/// `mx_bench`'s arguments after its role's own.
pub fn mx_bench_args(test: Test, size: u64, counts: Counts) -> Vec<String> {
    vec![
        "-t".into(),
        test.as_str().into(),
        "-s".into(),
        size.to_string(),
        "-w".into(),
        counts.warmup.to_string(),
        "-n".into(),
        counts.iters.to_string(),
    ]
}

/// What guest cells run: the built `mx_bench` and the library it is linked with.
#[derive(Debug, Clone)]
pub struct GuestPrograms {
    /// The built `mx_bench`.
    pub mx_bench: PathBuf,
    /// The directory of `libmyriexpress.so`.
    pub lib_dir: PathBuf,
}

impl GuestPrograms {
    /// Copy the library next to `xmx` into `scratch` (a build running meanwhile cannot
    /// replace it under the guests) and build `mx_bench` against it.
    pub fn build(xmx: &Path, scratch: &Path) -> Result<GuestPrograms, String> {
        let built = native::find_library(xmx)
            .ok_or("libmyriexpress.so not found (build xmx-libmx, or set XMX_LIB_DIR)")?;
        let lib_dir = scratch.join("guest-lib");
        std::fs::create_dir_all(&lib_dir).map_err(|e| format!("{}: {e}", lib_dir.display()))?;
        std::fs::copy(built.join(LIBRARY), lib_dir.join(LIBRARY))
            .map_err(|e| format!("copying {}: {e}", built.join(LIBRARY).display()))?;
        let out = scratch.join("guest-prog");
        std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
        let mx_bench = native::build_program(&out, &native::include_dir(), &lib_dir)?;
        Ok(GuestPrograms { mx_bench, lib_dir })
    }

    /// The environment of an MX application of guest `at`.
    pub fn env(&self, state: &ClusterState, at: GuestAt) -> Result<Vec<(String, String)>, String> {
        let host = state
            .hosts
            .get(at.host)
            .ok_or_else(|| format!("the cluster has no host {}", at.host))?;
        let guest = host
            .guests
            .get(at.guest)
            .ok_or_else(|| format!("host {} has no guest {}", host.name, at.guest))?;
        if guest.frontd_socket.is_none() {
            return Err(format!(
                "{}/{} has no xmx-frontd (the guest daemon was not built)",
                host.name, guest.name
            ));
        }
        let mut env: Vec<(String, String)> = cluster::guest_env(host, guest, &self.lib_dir)
            .into_iter()
            .filter(|(k, _)| k != "LD_LIBRARY_PATH")
            .collect();
        env.push(("LD_LIBRARY_PATH".into(), self.lib_dir.display().to_string()));
        env.push(("XMX_TRANSPORT".into(), "xen".into()));
        Ok(env)
    }

    /// `mx_bench program_args` as an application of guest `at`, with `extra` environment.
    pub fn agent(
        &self,
        state: &ClusterState,
        at: GuestAt,
        program_args: Vec<String>,
        extra: &[(String, String)],
    ) -> Result<AgentSpec, String> {
        let host = state
            .hosts
            .get(at.host)
            .ok_or_else(|| format!("the cluster has no host {}", at.host))?;
        let mut args: Vec<String> = [
            "bench-agent",
            "--transport",
            "exec",
            "--netns",
            &host.netns,
            "--",
        ]
        .map(str::to_owned)
        .to_vec();
        args.push(self.mx_bench.display().to_string());
        args.extend(program_args);
        let mut env = self.env(state, at)?;
        env.extend(extra.iter().cloned());
        Ok(AgentSpec { args, env })
    }

    /// The two processes of one cell of `pair`.
    pub fn cell(
        &self,
        state: &ClusterState,
        pair: &impl GuestPair,
        test: Test,
        size: u64,
        counts: Counts,
    ) -> Result<CellAgents, String> {
        self.cell_with(state, pair, test, size, counts, &[], &[])
    }

    /// [`cell`](Self::cell) with `extra` environment for both programs and `server_extra`
    /// arguments for the server.
    #[allow(clippy::too_many_arguments)]
    pub fn cell_with(
        &self,
        state: &ClusterState,
        pair: &impl GuestPair,
        test: Test,
        size: u64,
        counts: Counts,
        extra: &[(String, String)],
        server_extra: &[String],
    ) -> Result<CellAgents, String> {
        let mut server_args = vec!["-l".to_owned(), SERVER_EID.to_owned()];
        server_args.extend(server_extra.iter().cloned());
        server_args.extend(mx_bench_args(test, size, counts));
        let mut client_args = vec![
            "-d".to_owned(),
            pair.server().domain_name(),
            "-e".to_owned(),
            SERVER_EID.to_owned(),
        ];
        client_args.extend(mx_bench_args(test, size, counts));
        let server = self.agent(state, pair.server(), server_args, extra)?;
        let client = self.agent(state, pair.client(), client_args, extra)?;
        Ok(CellAgents {
            server,
            client: Box::new(move |_| client),
            cleanup: vec![],
        })
    }
}

/// The cluster of the guest setups and the programs its guests run. A cluster this run
/// made is removed when the bed is dropped (also after an interruption).
pub struct GuestBed {
    /// What was built.
    pub state: ClusterState,
    /// The guests' program.
    pub programs: GuestPrograms,
    owned: bool,
}

/// A name for the cluster of run `pid`: `b<pid>` (state in /run/xmx/b<pid>).
pub fn cluster_name(pid: u32) -> String {
    format!("b{pid}")
}

impl GuestBed {
    /// Make a cluster of two hosts with `guests` guests each, wait until it has settled,
    /// and build the programs.
    pub fn up(
        name: &str,
        guests: usize,
        bin_dir: &Path,
        xmx: &Path,
        scratch: &Path,
        progress: &mut dyn FnMut(&str),
    ) -> Result<GuestBed> {
        for bin in ["xmx-simhv", "xmx-backd", "xmxd", "xmx-frontd"] {
            if !bin_dir.join(bin).is_file() {
                bail!(
                    "{bin} is not in {} (build the workspace: cargo build --workspace)",
                    bin_dir.display()
                );
            }
        }
        let programs = GuestPrograms::build(xmx, scratch).map_err(anyhow::Error::msg)?;
        interrupt::set_force_hint(Some(format!("xmx sim down --name {name}")));
        let opts = UpOptions {
            name: name.to_owned(),
            hosts: 2,
            guests,
            mtu: super::link::MTU,
            bin_dir: bin_dir.to_path_buf(),
            guest_clusters: Vec::new(),
            // As the network setups' veth pair: the guest/native ratios then measure
            // the virtualisation, not the simulated switch (a bridge and a second veth
            // hop, about 1.5 us and a third of the CPU per frame here).
            back_to_back: true,
        };
        let state = cluster::up(&opts, &mut |step| progress(&format!("sim up: {step}")))?;
        let bed = GuestBed {
            state,
            programs,
            owned: true,
        };
        progress("waiting for every guest's device to connect and see every other guest");
        wait_settled(&bed.state, SETTLE_TIMEOUT)?;
        Ok(bed)
    }

    /// Use the existing cluster `name` (not removed at the end).
    pub fn existing(name: &str, xmx: &Path, scratch: &Path) -> Result<GuestBed> {
        let state = ClusterState::load(&cluster::root_of(name))?.with_context(|| {
            format!("no simulated cluster {name:?} (start one with `xmx sim up`)")
        })?;
        if state.hosts.len() < 2 {
            bail!(
                "cluster {name} has {} host(s); the guest setups need two",
                state.hosts.len()
            );
        }
        let programs = GuestPrograms::build(xmx, scratch).map_err(anyhow::Error::msg)?;
        Ok(GuestBed {
            state,
            programs,
            owned: false,
        })
    }

    /// Guests per host available to every host (the smallest count).
    pub fn guests_per_host(&self) -> usize {
        self.state
            .hosts
            .iter()
            .map(|h| h.guests.len())
            .min()
            .unwrap_or(0)
    }

    /// The daemons whose CPU the messages between `involved` guests cost: every host's
    /// backend, the frontends of `involved`, and the hypervisors and xmxd (as `Other`).
    pub fn daemons(&self, involved: &[GuestAt]) -> Vec<(DaemonRole, i32)> {
        let mut out = Vec::new();
        for (h, host) in self.state.hosts.iter().enumerate() {
            for d in &host.daemons {
                let role = DaemonRole::of(&d.name);
                let wanted = role != DaemonRole::Frontend
                    || involved.iter().any(|at| {
                        at.host == h
                            && host
                                .guests
                                .get(at.guest)
                                .is_some_and(|g| d.name == format!("xmx-frontd-{}", g.name))
                    });
                if wanted {
                    out.push((role, d.daemon_pid()));
                }
            }
        }
        out
    }

    /// `sim:NAME`.
    pub fn kind(&self) -> String {
        format!("sim:{}", self.state.name)
    }

    /// Remove the cluster if this run made it.
    pub fn teardown(&mut self, progress: &mut dyn FnMut(&str)) {
        if !self.owned {
            return;
        }
        self.owned = false;
        let _shield = interrupt::shield();
        if let Err(e) = cluster::down(&self.state.name, &mut |s| {
            progress(&format!("sim down: {s}"))
        }) {
            progress(&format!("removing cluster {}: {e:#}", self.state.name));
        }
        interrupt::set_force_hint(None);
    }
}

impl Drop for GuestBed {
    fn drop(&mut self) {
        self.teardown(&mut |line| super::say(line));
    }
}

/// Wait, on xenstore watches, until every guest is connected and its peer view lists
/// every guest of the cluster.
pub fn wait_settled(state: &ClusterState, timeout: Duration) -> Result<()> {
    let expected: BTreeSet<String> = state
        .hosts
        .iter()
        .flat_map(|h| {
            h.guests
                .iter()
                .map(move |g| format!("{}-{}:0", h.name, g.name))
        })
        .collect();
    settle::wait_guests(state, timeout, "the cluster", |xs, _, _, guest| {
        if let Some(why) = settle::not_connected(xs, guest.domid) {
            return Some(why);
        }
        let listed = settle::peer_view(xs, guest.domid);
        let missing: Vec<&String> = expected.difference(&listed).collect();
        (!missing.is_empty()).then(|| format!("peer view lacks {missing:?}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_arguments_follow_mx_bench_usage() {
        let counts = Counts {
            warmup: 3,
            iters: 40,
        };
        assert_eq!(
            mx_bench_args(Test::Stream, 4096, counts),
            ["-t", "stream", "-s", "4096", "-w", "3", "-n", "40"]
        );
    }

    #[test]
    fn names_follow_the_cluster() {
        assert_eq!(GuestAt::new(1, 0).domain_name(), "h1-g0");
        assert_eq!(GuestAt::new(0, 39).domain_name(), "h0-g39");
        let name = cluster_name(4_294_967_295);
        assert!(cluster::check_name(&name).is_ok(), "{name}");
    }
}

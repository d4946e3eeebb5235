//! The state file of a simulated cluster (`xmx sim up`): where the cluster lives, its hosts,
//! their daemons and guests. The lab's `sim` module writes it; the administration commands
//! read it to find a simulated host's sockets (`--sim-host`).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use xmx_hv::DomId;

/// Where clusters live: `RUN_DIR/<cluster name>`.
pub const RUN_DIR: &str = "/run/xmx";
/// The cluster name unless `--name` says otherwise.
pub const DEFAULT_NAME: &str = "sim";
/// The state file's name in the cluster's directory.
pub const STATE_FILE: &str = "cluster.json";

/// One guest domain of a simulated host.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GuestState {
    /// Its name (g0, g1, ...).
    pub name: String,
    /// Its domain id on its host.
    pub domid: DomId,
    /// The socket of the guest's xmx-frontd, when one runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frontd_socket: Option<PathBuf>,
}

/// One daemon a simulated host runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DaemonState {
    /// The program (xmx-simhv, xmx-backd, xmxd, ...).
    pub name: String,
    /// The supervisor's pid (the simulated cluster runs each daemon under a
    /// supervisor that restarts it); [`DaemonState::daemon_pid`] is the
    /// daemon's own, which changes when it is restarted.
    pub pid: i32,
    /// Its log file.
    pub log: PathBuf,
}

impl DaemonState {
    /// The running daemon's own pid: the supervisor's child (the supervisor's pid while
    /// it has none, between a failure and the restart).
    pub fn daemon_pid(&self) -> i32 {
        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.pid))
            .ok()
            .and_then(|c| c.split_whitespace().next()?.parse().ok())
            .unwrap_or(self.pid)
    }
}

/// One simulated host: a network namespace with its NIC, daemons and guests.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HostState {
    /// Its name (h0, h1, ...).
    pub name: String,
    /// Its network namespace.
    pub netns: String,
    /// Its NIC inside the namespace.
    pub iface: String,
    /// The NIC's MAC.
    pub mac: String,
    /// IPv4 address of the host NIC, for the TCP baseline (RFC 2544 benchmarking range).
    pub addr: String,
    /// The host's simhv directory.
    pub simhv_dir: PathBuf,
    /// The daemons it runs.
    pub daemons: Vec<DaemonState>,
    /// Its guests.
    pub guests: Vec<GuestState>,
}

/// A simulated cluster, as its state file records it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClusterState {
    /// Its name.
    pub name: String,
    /// Its directory ([`root_of`]).
    pub root: PathBuf,
    /// MTU of every link.
    pub mtu: u32,
    /// Its hosts.
    pub hosts: Vec<HostState>,
}

/// The name of host `i`.
pub fn host_name(i: usize) -> String {
    format!("h{i}")
}

/// The name of guest `j` of a host.
pub fn guest_name(j: usize) -> String {
    format!("g{j}")
}

/// The directory of cluster `name`.
pub fn root_of(name: &str) -> PathBuf {
    Path::new(RUN_DIR).join(name)
}

impl ClusterState {
    /// Reads the state file under `root`; `None` when there is no cluster.
    pub fn load(root: &Path) -> Result<Option<ClusterState>> {
        let path = root.join(STATE_FILE);
        match fs::read(&path) {
            Ok(bytes) => Ok(Some(
                serde_json::from_slice(&bytes)
                    .with_context(|| format!("parsing {}", path.display()))?,
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Write the state file atomically (a temporary file renamed over it).
    pub fn save(&self) -> Result<()> {
        let path = self.root.join(STATE_FILE);
        let tmp = self.root.join(format!("{STATE_FILE}.tmp"));
        fs::write(&tmp, serde_json::to_vec_pretty(self)?)?;
        fs::rename(&tmp, &path)?;
        Ok(())
    }

    /// The host named `name`, or by index (`0` for h0).
    pub fn host(&self, name: &str) -> Result<&HostState> {
        let by_index = name.parse::<usize>().ok().map(host_name);
        self.hosts
            .iter()
            .find(|h| h.name == name || Some(&h.name) == by_index.as_ref())
            .with_context(|| {
                format!(
                    "no host {name:?} in the cluster (hosts: {})",
                    self.host_names()
                )
            })
    }

    fn host_names(&self) -> String {
        self.hosts
            .iter()
            .map(|h| h.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl HostState {
    /// The guest named `name`, or by index (`0` for g0).
    pub fn guest(&self, name: &str) -> Result<&GuestState> {
        let by_index = name.parse::<usize>().ok().map(guest_name);
        self.guests
            .iter()
            .find(|g| g.name == name || Some(&g.name) == by_index.as_ref())
            .with_context(|| format!("no guest {name:?} on host {}", self.name))
    }
}

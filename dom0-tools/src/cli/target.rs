//! Which daemon a subcommand talks to: the local one by default, a simulated host's with
//! `--sim-host`, or any socket given explicitly.

use std::path::PathBuf;

use anyhow::{Context, Result};
use xmx_backend::admin::AdminClient;

use crate::simstate::{self as cluster, ClusterState};
use crate::xmxd::{self, ControlClient};

/// Where xmxd listens.
#[derive(Debug, Clone, clap::Args)]
pub struct XmxdTarget {
    /// xmxd's control socket [default: $XMX_SIM_DIR/xmxd.sock on the simulator,
    /// /run/xmx/xmxd.sock on Xen].
    #[arg(long, env = "XMX_XMXD_SOCKET")]
    pub(crate) xmxd_socket: Option<PathBuf>,
    /// A host of a simulated cluster whose daemons to talk to, when no socket is given.
    #[command(flatten)]
    pub(crate) sim: SimHostArgs,
}

/// A host of a simulated cluster (`xmx sim up`).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct SimHostArgs {
    /// Talk to the daemons of this host of the simulated cluster (e.g. h0).
    #[arg(long, env = "XMX_SIM_HOST")]
    pub(crate) sim_host: Option<String>,
    /// The simulated cluster's name.
    #[arg(long, env = "XMX_SIM_NAME", default_value = cluster::DEFAULT_NAME)]
    pub(crate) sim_name: String,
}

impl SimHostArgs {
    /// The simhv directory of the chosen simulated host, where its daemons' sockets are.
    fn dir(&self) -> Result<Option<PathBuf>> {
        let Some(host) = &self.sim_host else {
            return Ok(None);
        };
        let state = ClusterState::load(&cluster::root_of(&self.sim_name))?
            .with_context(|| format!("no simulated cluster {:?}", self.sim_name))?;
        Ok(Some(state.host(host)?.simhv_dir.clone()))
    }
}

impl XmxdTarget {
    /// The socket path this target names.
    pub(crate) fn socket(&self) -> Result<PathBuf> {
        if let Some(p) = &self.xmxd_socket {
            return Ok(p.clone());
        }
        Ok(match self.sim.dir()? {
            Some(dir) => dir.join("xmxd.sock"),
            None => xmxd::default_control_socket(),
        })
    }

    /// A connection to xmxd.
    pub(crate) fn connect(&self) -> Result<ControlClient> {
        let path = self.socket()?;
        ControlClient::connect(&path)
            .with_context(|| format!("connecting to xmxd at {} (is it running?)", path.display()))
    }
}

/// Where the backend listens.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct BackendTarget {
    /// xmx-backd's control socket [default: $XMX_SIM_DIR/backd.sock on the simulator,
    /// /run/xmx/backd.sock on Xen].
    #[arg(long, env = "XMX_BACKD_SOCKET")]
    pub(crate) backd_socket: Option<PathBuf>,
    /// A host of a simulated cluster whose daemons to talk to, when no socket is given.
    #[command(flatten)]
    pub(crate) sim: SimHostArgs,
}

impl BackendTarget {
    /// A connection to the backend.
    pub(crate) fn connect(&self) -> Result<AdminClient> {
        let path = match (&self.backd_socket, self.sim.dir()?) {
            (Some(p), _) => p.clone(),
            (None, Some(dir)) => dir.join("backd.sock"),
            (None, None) => xmxd::default_backend_socket(),
        };
        AdminClient::connect(&path).with_context(|| {
            format!(
                "connecting to xmx-backd at {} (is it running?)",
                path.display()
            )
        })
    }
}

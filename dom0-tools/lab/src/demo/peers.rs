//! Step 2: the peer table, once per virtual cluster, as a member of it sees it.
//!
//! The text is what `xmx peers --guest NAME` prints (it is run as such, so the demo shows
//! exactly the administrator's command); the JSON document gets xmxd's own report.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::layout::{self, VCLUSTERS};
use crate::sim::cluster::ClusterState;
use xmx_tools::xmxd::control::PeersReport;
use xmx_tools::xmxd::{ControlClient, XmxdRequest};

/// The table of one virtual cluster.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterView {
    /// The virtual cluster.
    pub cluster: String,
    /// The member whose view this is (`h0/g0`).
    pub seen_by: String,
    /// The command that shows it.
    pub command: String,
    /// What xmxd answered.
    pub report: PeersReport,
}

/// One view per virtual cluster, each from its first member on h0; `show` gets the text.
pub fn views(
    state: &ClusterState,
    xmx: &Path,
    show: &mut dyn FnMut(&str),
) -> Result<Vec<ClusterView>> {
    let mut out = Vec::new();
    for name in VCLUSTERS {
        let member = layout::members(name)
            .into_iter()
            .find(|p| p.host == 0)
            .with_context(|| format!("cluster {name} has no member on h0"))?;
        let host = state.host(&member.host_name())?;
        let guest = member.domain_name();
        let args = [
            "peers",
            "--sim-name",
            &state.name,
            "--sim-host",
            &host.name,
            "--guest",
            &guest,
        ];
        let command = format!("xmx {}", args.join(" "));
        let o = Command::new(xmx)
            .args(args)
            .env_remove("XMX_XMXD_SOCKET")
            .output()
            .with_context(|| format!("running {command}"))?;
        if !o.status.success() {
            bail!(
                "{command} failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
        show(&format!(
            "cluster {name}, as {member} sees it ({command}):\n{}",
            String::from_utf8_lossy(&o.stdout)
        ));
        let socket = host.simhv_dir.join("xmxd.sock");
        let report: PeersReport = ControlClient::connect(&socket)
            .with_context(|| format!("connecting to {}", socket.display()))?
            .call_as(&XmxdRequest::Peers {
                guest: Some(guest.clone()),
                after: None,
                timeout_ms: None,
            })
            .with_context(|| format!("peers of {guest}"))?;
        let want = super::vclusters::expected_view(name);
        let got = report.peers.iter().map(|p| p.hostname.clone()).collect();
        if want != got {
            bail!("cluster {name} as {member} sees it: {got:?}, expected {want:?}");
        }
        out.push(ClusterView {
            cluster: name.into(),
            seen_by: member.to_string(),
            command,
            report,
        });
    }
    Ok(out)
}

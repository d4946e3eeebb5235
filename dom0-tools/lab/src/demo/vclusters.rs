//! Step 1's second half: the virtual clusters, and the wait until the fabric has taken
//! them in.
//!
//! Each guest is attached in its cluster from the start, as the xl hook does it (an attach
//! wish naming the cluster; xmxd creates the cluster on first use): moving a running guest
//! later would re-attach its device, which ends its xmx-frontd. The cluster is ready when,
//! for every guest, the backend directory names its cluster, both xenbus halves are
//! Connected, and the guest's peer view lists exactly its cluster's members. All three are
//! xenstore nodes, so this waits on watches.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use xmx_hv::xs::XsClient;
use xmx_hv::DOM0;
use xmx_wire::xenbus::{self, keys};

use super::layout::{self, Place, VCLUSTERS};
use crate::sim::cluster::{ClusterState, HostState};
use crate::sim::settle;
use xmx_tools::xmxd::control::ClusterReport;
use xmx_tools::xmxd::{names, ControlClient, XmxdRequest};

/// How long the fabric may take to settle after the moves.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

fn xmxd(host: &HostState) -> Result<ControlClient> {
    let socket = host.simhv_dir.join("xmxd.sock");
    ControlClient::connect(&socket).with_context(|| {
        format!(
            "connecting to xmxd of {} at {}",
            host.name,
            socket.display()
        )
    })
}

/// `guest_clusters[i][j]`: the cluster of guest `j` of host `i`, for `xmx sim up`.
pub fn guest_clusters() -> Vec<Vec<String>> {
    (0..layout::HOSTS)
        .map(|h| {
            (0..layout::GUESTS_PER_HOST)
                .map(|g| Place::new(h, g).vcluster().to_owned())
                .collect()
        })
        .collect()
}

/// Check with every host's xmxd that each guest is in its cluster; `note` gets one line
/// per host and cluster, as `xmx cluster list` shows them.
pub fn check_members(state: &ClusterState, note: &mut dyn FnMut(&str)) -> Result<()> {
    for (h, host) in state.hosts.iter().enumerate() {
        let list: Vec<ClusterReport> = xmxd(host)?
            .call_as(&XmxdRequest::Clusters)
            .with_context(|| format!("clusters of {}", host.name))?;
        for c in list.iter().filter(|c| VCLUSTERS.contains(&c.name.as_str())) {
            note(&format!(
                "{}: cluster {} (id {}): {}",
                host.name,
                c.name,
                c.id,
                c.members.join(" ")
            ));
        }
        for g in 0..host.guests.len() {
            let place = Place::new(h, g);
            let name = place.domain_name();
            let found = list
                .iter()
                .find(|c| c.members.contains(&name))
                .map(|c| c.name.as_str());
            if found != Some(place.vcluster()) {
                bail!(
                    "{}'s xmxd has {name} in cluster {found:?}, not {}",
                    host.name,
                    place.vcluster()
                );
            }
        }
    }
    Ok(())
}

/// What is not settled yet about the guest at `place`, if anything: its backend names
/// its cluster, both xenbus halves are Connected, its peer view lists exactly its
/// cluster's members.
fn pending(xs: &XsClient, place: Place, domid: u16) -> Option<String> {
    let bdir = xenbus::backend_dir(DOM0, domid, 0);
    let want_id = names::cluster_id(place.vcluster()).to_string();
    let id = settle::read(xs, &xenbus::key_path(&bdir, keys::CLUSTER));
    if id.as_deref() != Some(want_id.as_str()) {
        return Some(format!(
            "backend cluster id {id:?}, want {want_id} ({})",
            place.vcluster()
        ));
    }
    if let Some(why) = settle::not_connected(xs, domid) {
        return Some(why);
    }
    let expected = expected_view(place.vcluster());
    let listed = settle::peer_view(xs, domid);
    (listed != expected).then(|| format!("peer view {listed:?}, want {expected:?}"))
}

/// The MX hostnames of cluster `name`'s members, as their peer views list them.
pub fn expected_view(name: &str) -> BTreeSet<String> {
    layout::members(name)
        .into_iter()
        .map(|p| format!("{}:0", p.domain_name()))
        .collect()
}

/// Wait until every guest of every host is settled (see the module documentation).
pub fn wait_settled(state: &ClusterState, timeout: Duration) -> Result<()> {
    settle::wait_guests(state, timeout, "the virtual clusters", |xs, h, g, guest| {
        pending(xs, Place::new(h, g), guest.domid)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_guest_gets_its_cluster() {
        let c = guest_clusters();
        assert_eq!(c.len(), layout::HOSTS);
        assert_eq!(c[0], ["blue", "red", "blue"]);
        assert_eq!(c[1], ["blue", "red", "red"]);
    }

    #[test]
    fn views_name_the_members_with_board_zero() {
        let blue = expected_view(layout::BLUE);
        assert_eq!(
            blue.into_iter().collect::<Vec<_>>(),
            ["h0-g0:0", "h0-g2:0", "h1-g0:0"]
        );
        assert!(expected_view(layout::RED).contains("h1-g2:0"));
        assert_eq!(
            xmx_tools::xmxd::xsnodes::peers_dir(DOM0, 3),
            "/local/domain/0/xmx/peers/3"
        );
    }
}

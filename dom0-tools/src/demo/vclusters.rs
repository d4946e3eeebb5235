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
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use xmx_hv::xs::XsClient;
use xmx_hv::{Xenstore, DOM0, XBT_NULL};
use xmx_wire::xenbus::{self, keys, XenbusState};

use super::layout::{self, Place, VCLUSTERS};
use crate::interrupt;
use crate::sim::cluster::{ClusterState, HostState};
use crate::xmxd::control::ClusterReport;
use crate::xmxd::{names, ControlClient, Request};

/// How long the fabric may take to settle after the moves.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest single wait for a watch event, so a signal is noticed soon.
const WAIT_SLICE: Duration = Duration::from_millis(250);
const WATCH_TOKEN: &str = "xmx-demo";

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
            .call_as(&Request::Clusters)
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

/// What is not settled yet about one guest, if anything.
fn pending(xs: &XsClient, place: Place, domid: u16, expected: &BTreeSet<String>) -> Option<String> {
    let read = |path: &str| {
        xs.read(XBT_NULL, path).ok().map(|v| {
            String::from_utf8_lossy(&v)
                .trim_end_matches('\0')
                .to_owned()
        })
    };
    let bdir = xenbus::backend_dir(DOM0, domid, 0);
    let want_id = names::cluster_id(place.vcluster()).to_string();
    let id = read(&xenbus::key_path(&bdir, keys::CLUSTER));
    if id.as_deref() != Some(want_id.as_str()) {
        return Some(format!(
            "{place}: backend cluster id {id:?}, want {want_id} ({})",
            place.vcluster()
        ));
    }
    let connected = (XenbusState::Connected as u32).to_string();
    let fdir = xenbus::frontend_dir(domid, 0);
    for (side, dir) in [("backend", &bdir), ("frontend", &fdir)] {
        let s = read(&xenbus::key_path(dir, keys::STATE));
        if s.as_deref() != Some(connected.as_str()) {
            return Some(format!("{place}: {side} state {s:?}, not Connected"));
        }
    }
    let view = peer_view_dir(domid);
    let names = xs.directory(XBT_NULL, &view).unwrap_or_default();
    let listed: BTreeSet<String> = names
        .iter()
        .filter_map(|n| read(&format!("{view}/{n}")))
        .filter_map(|v| v.split_once(' ').map(|(_, host)| host.trim().to_owned()))
        .collect();
    if &listed != expected {
        return Some(format!("{place}: peer view {listed:?}, want {expected:?}"));
    }
    None
}

/// Where xmxd publishes the peers guest `domid` may reach.
fn peer_view_dir(domid: u16) -> String {
    format!("/local/domain/{DOM0}/xmx/peers/{domid}")
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
    let deadline = Instant::now() + timeout;
    for (h, host) in state.hosts.iter().enumerate() {
        let sock = xmx_hv::sim::layout::xenstore_sock(&host.simhv_dir, DOM0);
        let xs =
            XsClient::connect_unix(&sock).with_context(|| format!("xenstore of {}", host.name))?;
        for g in &host.guests {
            for dir in [
                xenbus::backend_dir(DOM0, g.domid, 0),
                xenbus::frontend_dir(g.domid, 0),
                peer_view_dir(g.domid),
            ] {
                xs.watch(&dir, WATCH_TOKEN)
                    .with_context(|| format!("watching {dir}"))?;
            }
        }
        loop {
            interrupt::check()?;
            let waiting = host.guests.iter().enumerate().find_map(|(g, guest)| {
                let place = Place::new(h, g);
                pending(&xs, place, guest.domid, &expected_view(place.vcluster()))
            });
            let Some(what) = waiting else { break };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("the virtual clusters did not settle within {timeout:?}: {what}");
            }
            // Any change under a watched directory wakes this; the loop looks again.
            xs.next_watch_event(Some(left.min(WAIT_SLICE)))
                .context("waiting on xenstore")?;
        }
    }
    Ok(())
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
        assert_eq!(peer_view_dir(3), "/local/domain/0/xmx/peers/3");
    }
}

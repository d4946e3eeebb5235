//! Waiting until a simulated cluster's guests are settled: what a guest's xenstore nodes
//! say (both xenbus halves, its peer view), and a wait on watches until a caller's test
//! of them holds for every guest.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use xmx_hv::xs::XsClient;
use xmx_hv::{DomId, Xenstore, DOM0, XBT_NULL};
use xmx_wire::xenbus::{self, keys, XenbusState};

use super::cluster::{ClusterState, GuestState};
use crate::interrupt;
use xmx_tools::xmxd::xsnodes;

/// Longest single wait for a watch event, so that a signal is noticed soon.
const WAIT_SLICE: Duration = Duration::from_millis(250);
const WATCH_TOKEN: &str = "xmx-settle";

/// A node's value as text, if it exists.
pub fn read(xs: &XsClient, path: &str) -> Option<String> {
    xs.read(XBT_NULL, path).ok().map(|v| {
        String::from_utf8_lossy(&v)
            .trim_end_matches('\0')
            .to_owned()
    })
}

/// Why guest `domid`'s device is not Connected on both xenbus halves, if it is not.
pub fn not_connected(xs: &XsClient, domid: DomId) -> Option<String> {
    let connected = (XenbusState::Connected as u32).to_string();
    for (side, dir) in [
        ("backend", xenbus::backend_dir(DOM0, domid, 0)),
        ("frontend", xenbus::frontend_dir(domid, 0)),
    ] {
        let s = read(xs, &xenbus::key_path(&dir, keys::STATE));
        if s.as_deref() != Some(connected.as_str()) {
            return Some(format!("{side} state {s:?}, not Connected"));
        }
    }
    None
}

/// The MX hostnames guest `domid`'s peer view lists.
pub fn peer_view(xs: &XsClient, domid: DomId) -> BTreeSet<String> {
    let view = xsnodes::peers_dir(DOM0, domid);
    xs.directory(XBT_NULL, &view)
        .unwrap_or_default()
        .iter()
        .filter_map(|n| read(xs, &format!("{view}/{n}")))
        .filter_map(|v| v.split_once(' ').map(|(_, host)| host.trim().to_owned()))
        .collect()
}

/// Waits on xenstore watches, host by host, until `pending(xs, host, guest, state)` is
/// `None` for every guest (else it says what is missing), up to `timeout`. `what` names
/// what settles, for the error.
pub fn wait_guests(
    state: &ClusterState,
    timeout: Duration,
    what: &str,
    pending: impl Fn(&XsClient, usize, usize, &GuestState) -> Option<String>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    for (h, host) in state.hosts.iter().enumerate() {
        let sock = xmx_hv::sim::layout::xenstore_sock(&host.simhv_dir, DOM0);
        let xs =
            XsClient::connect_unix(&sock).with_context(|| format!("xenstore of {}", host.name))?;
        for g in &host.guests {
            for dir in [
                xenbus::backend_dir(DOM0, g.domid, 0),
                xenbus::frontend_dir(g.domid, 0),
                xsnodes::peers_dir(DOM0, g.domid),
            ] {
                xs.watch(&dir, WATCH_TOKEN)
                    .with_context(|| format!("watching {dir}"))?;
            }
        }
        loop {
            interrupt::check()?;
            let waiting = host.guests.iter().enumerate().find_map(|(g, guest)| {
                pending(&xs, h, g, guest).map(|why| format!("{}/{}: {why}", host.name, guest.name))
            });
            let Some(why) = waiting else { break };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("{what} did not settle within {timeout:?}: {why}");
            }
            // Any change under a watched directory wakes this; the loop looks again.
            xs.next_watch_event(Some(left.min(WAIT_SLICE)))
                .context("waiting on xenstore")?;
        }
    }
    Ok(())
}

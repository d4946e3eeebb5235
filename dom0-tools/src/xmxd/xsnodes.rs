//! xmxd's nodes in xenstore, all under the toolstack domain's home, where no guest can
//! write (and, with the permissions set here, not even read):
//!
//! ```text
//! /local/domain/0/xmx/                       owner dom0, no access for others
//!     guests/<domid> = "<cluster>" | ""      a domain that wants xmx (written by the xl
//!                                            hook or `xmx attach`); xmxd records the
//!                                            cluster, empties the node, and removes it
//!                                            when the domain goes
//!     clusters/<name>/id = "<id>"            mirror of the clusters in xmxd's state
//!     clusters/<name>/members/<guest> = "<mac>"
//!     qos/<guest> = "<weight>"               a guest's QoS weight by name (`xmx qos`),
//!                                            copied into its device's backend directory
//!                                            (`qos-weight`) whenever it runs here
//!     peers/<domid>/                         owner dom0, readable by domain <domid> only
//!         <index> = "<mac> <hostname>"       the peers that guest may reach: its cluster's
//! ```
//!
//! A guest's identity itself (MAC, cluster, hostname) lives in its device's backend
//! directory, which [`toolstack::attach`](xmx_backend::xenbus::toolstack::attach) creates
//! owned by dom0 with read-only access for the guest.

use std::collections::BTreeMap;

use xmx_backend::xenbus::toolstack::in_transaction;
use xmx_hv::{DomId, Error, Result, Xenstore, XsAccess, XsPerm, XBT_NULL};

use super::state::XmxdState;

/// `/local/domain/<toolstack>/xmx`.
pub fn root(toolstack: DomId) -> String {
    format!("/local/domain/{toolstack}/xmx")
}

/// Where the wishes of domains live.
pub(crate) fn wishes_dir(toolstack: DomId) -> String {
    format!("{}/guests", root(toolstack))
}

/// The wish node of domain `domu`.
pub fn wish_path(toolstack: DomId, domu: DomId) -> String {
    format!("{}/{domu}", wishes_dir(toolstack))
}

/// Where the clusters are mirrored.
pub fn clusters_dir(toolstack: DomId) -> String {
    format!("{}/clusters", root(toolstack))
}

/// Where the peers guest `domu` may see are published.
pub fn peers_dir(toolstack: DomId, domu: DomId) -> String {
    xmx_wire::peer_view::view_dir(toolstack, domu)
}

/// The QoS weight node of a guest, by name.
pub(crate) fn qos_path(toolstack: DomId, guest: &str) -> String {
    format!("{}/qos/{guest}", root(toolstack))
}

/// A guest's recorded QoS weight (1 if none, or if the node does not read well).
pub(crate) fn read_qos(xs: &dyn Xenstore, toolstack: DomId, guest: &str) -> Result<u32> {
    Ok(read_opt(xs, &qos_path(toolstack, guest))?
        .and_then(|w| xmx_backend::xenbus::toolstack::parse_qos_weight(&w).ok())
        .unwrap_or(1))
}

/// Record a guest's QoS weight (checked: 1 to the maximum).
pub(crate) fn write_qos(
    xs: &dyn Xenstore,
    toolstack: DomId,
    guest: &str,
    weight: u32,
) -> Result<()> {
    xmx_backend::xenbus::toolstack::parse_qos_weight(&weight.to_string())?;
    xs.write(
        XBT_NULL,
        &qos_path(toolstack, guest),
        weight.to_string().as_bytes(),
    )
}

/// The name node of domain `domid`.
pub fn name_path(domid: DomId) -> String {
    format!("/local/domain/{domid}/name")
}

/// The `state` node of domain `domid`'s xmx device `devid`, as its frontend writes it.
pub(crate) fn front_state_path(domid: DomId, devid: u32) -> String {
    xmx_wire::xenbus::key_path(
        &xmx_wire::xenbus::frontend_dir(domid, devid),
        xmx_wire::xenbus::keys::STATE,
    )
}

/// Whether the frontend of domain `domid`'s device `devid` says it is closing or closed
/// (a suspend, a shutdown): a node that is missing or does not parse says nothing.
pub(crate) fn front_closed(xs: &dyn Xenstore, domid: DomId, devid: u32) -> Result<bool> {
    use xmx_wire::xenbus::XenbusState;
    Ok(read_opt(xs, &front_state_path(domid, devid))?
        .and_then(|v| v.parse::<XenbusState>().ok())
        .is_some_and(|s| matches!(s, XenbusState::Closing | XenbusState::Closed)))
}

fn text(raw: Vec<u8>) -> String {
    String::from_utf8_lossy(&raw)
        .trim_end_matches('\0')
        .trim()
        .to_string()
}

fn read_opt(xs: &dyn Xenstore, path: &str) -> Result<Option<String>> {
    match xs.read(XBT_NULL, path) {
        Ok(v) => Ok(Some(text(v))),
        Err(Error::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Make the root (and the wishes directory) private to the toolstack domain.
pub(crate) fn ensure_root(xs: &dyn Xenstore, toolstack: DomId) -> Result<()> {
    let private = [XsPerm {
        domid: toolstack,
        access: XsAccess::None,
    }];
    in_transaction(xs, |tx| {
        for dir in [root(toolstack), wishes_dir(toolstack)] {
            xs.mkdir(tx, &dir)?;
            xs.set_perms(tx, &dir, &private)?;
        }
        Ok(())
    })
}

/// The wish of domain `domu`: `None` if it has none, else the cluster it asks for (empty:
/// whatever xmxd has recorded, or the default cluster).
pub(crate) fn read_wish(
    xs: &dyn Xenstore,
    toolstack: DomId,
    domu: DomId,
) -> Result<Option<String>> {
    read_opt(xs, &wish_path(toolstack, domu))
}

/// Record that domain `domu` wants xmx (in `cluster`, if not empty).
pub(crate) fn write_wish(
    xs: &dyn Xenstore,
    toolstack: DomId,
    domu: DomId,
    cluster: &str,
) -> Result<()> {
    xs.write(XBT_NULL, &wish_path(toolstack, domu), cluster.as_bytes())
}

/// Forget domain `domu`'s wish; a missing one is fine.
pub(crate) fn remove_wish(xs: &dyn Xenstore, toolstack: DomId, domu: DomId) -> Result<()> {
    remove_node(xs, &wish_path(toolstack, domu))
}

/// Remove `path` and what is below it; a missing node is fine.
pub(crate) fn remove_node(xs: &dyn Xenstore, path: &str) -> Result<()> {
    // xenstored fails the removal of a missing node whose parent is missing too: look
    // first, so "already gone" is never an error.
    match xs.read(XBT_NULL, path) {
        Ok(_) => match xs.rm(XBT_NULL, path) {
            Ok(()) | Err(Error::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        },
        Err(Error::NotFound(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Domains with a wish node.
pub(crate) fn wished_domains(xs: &dyn Xenstore, toolstack: DomId) -> Result<Vec<DomId>> {
    match xs.directory(XBT_NULL, &wishes_dir(toolstack)) {
        Ok(names) => Ok(names.iter().filter_map(|n| n.parse().ok()).collect()),
        Err(Error::NotFound(_)) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Which instance of domain `domid` runs: libxl's `vm` path, unique per created domain
/// (None if the toolstack wrote none).
pub(crate) fn domain_instance(xs: &dyn Xenstore, domid: DomId) -> Result<Option<String>> {
    Ok(read_opt(xs, &format!("/local/domain/{domid}/vm"))?.filter(|v| !v.is_empty()))
}

/// The name of domain `domid`, if written yet.
pub(crate) fn domain_name(xs: &dyn Xenstore, domid: DomId) -> Result<Option<String>> {
    Ok(read_opt(xs, &name_path(domid))?.filter(|n| !n.is_empty()))
}

/// Whether domain `domid` may write node `path` (it owns it, or is granted write).
pub(crate) fn writable_by(xs: &dyn Xenstore, path: &str, domid: DomId) -> Result<bool> {
    let perms = match xs.get_perms(XBT_NULL, path) {
        Ok(p) => p,
        Err(Error::NotFound(_)) => return Ok(false),
        Err(e) => return Err(e),
    };
    let owner = perms.first().is_some_and(|p| p.domid == domid);
    let default_write = perms
        .first()
        .is_some_and(|p| matches!(p.access, XsAccess::Write | XsAccess::Both));
    let granted = perms
        .iter()
        .skip(1)
        .any(|p| p.domid == domid && matches!(p.access, XsAccess::Write | XsAccess::Both));
    Ok(owner || default_write || granted)
}

/// Every domain with a home in xenstore.
pub(crate) fn listed_domains(xs: &dyn Xenstore) -> Result<Vec<DomId>> {
    match xs.directory(XBT_NULL, "/local/domain") {
        Ok(names) => Ok(names.iter().filter_map(|n| n.parse().ok()).collect()),
        Err(Error::NotFound(_)) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Rewrite the mirror of the clusters from `state`, in one transaction.
pub(crate) fn mirror_clusters(
    xs: &dyn Xenstore,
    toolstack: DomId,
    state: &XmxdState,
) -> Result<()> {
    let dir = clusters_dir(toolstack);
    in_transaction(xs, |tx| {
        if xs.read(tx, &dir).is_ok() {
            xs.rm(tx, &dir)?;
        }
        xs.mkdir(tx, &dir)?;
        for (name, c) in &state.clusters {
            let cdir = format!("{dir}/{name}");
            xs.write(tx, &format!("{cdir}/id"), c.id.to_string().as_bytes())?;
            xs.mkdir(tx, &format!("{cdir}/members"))?;
        }
        for (guest, g) in &state.guests {
            let path = format!("{dir}/{}/members/{guest}", g.cluster);
            xs.write(tx, &path, g.mac.to_string().as_bytes())?;
        }
        Ok(())
    })
}

/// Make `peers_dir(domu)` hold exactly `peers` (index -> value), readable by `domu`: only
/// the differences from `before` (what was published last) are written, in one
/// transaction.
pub(crate) fn publish_peers(
    xs: &dyn Xenstore,
    toolstack: DomId,
    domu: DomId,
    before: Option<&BTreeMap<u16, String>>,
    peers: &BTreeMap<u16, String>,
) -> Result<()> {
    let dir = peers_dir(toolstack, domu);
    let empty = BTreeMap::new();
    let old = before.unwrap_or(&empty);
    in_transaction(xs, |tx| {
        if before.is_none() {
            // Whatever an earlier run left there is unknown: start from nothing.
            if xs.read(tx, &dir).is_ok() {
                xs.rm(tx, &dir)?;
            }
            xs.mkdir(tx, &dir)?;
            xs.set_perms(
                tx,
                &dir,
                &[
                    XsPerm {
                        domid: toolstack,
                        access: XsAccess::None,
                    },
                    XsPerm {
                        domid: domu,
                        access: XsAccess::Read,
                    },
                ],
            )?;
        }
        for index in old.keys().filter(|i| !peers.contains_key(i)) {
            xs.rm(tx, &format!("{dir}/{index}"))?;
        }
        for (index, value) in peers {
            if old.get(index) != Some(value) {
                xs.write(tx, &format!("{dir}/{index}"), value.as_bytes())?;
            }
        }
        Ok(())
    })
}

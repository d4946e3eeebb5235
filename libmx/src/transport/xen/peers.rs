//! The guest's view of the peer table, as the toolstack publishes it.
//!
//! xmxd writes the peers a guest may reach (its virtual cluster's) under
//! `/local/domain/<toolstack>/xmx/peers/<domid>/`, one node per peer:
//! `<index> = "<mac> <hostname>"`, readable by that guest only. The index is
//! the one the backend's engine routes by, so it is what send requests name.
//! The driver thread keeps a watch on the directory and reloads the view when
//! it changes; lookups read the last copy without a xenstore round trip.

use std::sync::{Condvar, Mutex, RwLock};
use std::time::Instant;

use xmx_engine::{ClusterId, PeerEntry, PeerTable};
use xmx_hv::{Error as HvError, Xenstore, XBT_NULL};

pub(crate) use xmx_wire::peer_view::view_dir;

/// One node of the view: its name (the index) and value (`"<mac> <hostname>"`).
pub(crate) fn parse_entry(name: &str, value: &str) -> Result<PeerEntry, String> {
    let e = xmx_wire::peer_view::parse_entry(name, value)?;
    Ok(PeerEntry {
        index: e.index,
        mac: e.mac,
        hostname: e.hostname,
        // The view holds one cluster: the guest's own.
        cluster: ClusterId(0),
    })
}

/// A whole view from its nodes; malformed nodes and later duplicates are left
/// out (and reported), so one bad node does not hide the others.
pub(crate) fn parse_view(nodes: &[(String, String)]) -> (PeerTable, Vec<String>) {
    let mut problems = Vec::new();
    let mut entries: Vec<PeerEntry> = Vec::new();
    for (name, value) in nodes {
        match parse_entry(name, value) {
            Ok(e) if entries.iter().any(|o| o.index == e.index || o.mac == e.mac) => {
                problems.push(format!("peer {} ({}) listed twice", e.index, e.mac));
            }
            Ok(e) => entries.push(e),
            Err(p) => problems.push(p),
        }
    }
    match PeerTable::from_entries(entries) {
        Ok(t) => (t, problems),
        Err(e) => {
            problems.push(format!("peer view: {e}"));
            (PeerTable::new(), problems)
        }
    }
}

/// Reads the nodes of `dir`; a missing directory is an empty view.
pub(crate) fn read_nodes(xs: &dyn Xenstore, dir: &str) -> Result<Vec<(String, String)>, HvError> {
    let names = match xs.directory(XBT_NULL, dir) {
        Ok(n) => n,
        Err(HvError::NotFound(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut nodes = Vec::with_capacity(names.len());
    for name in names {
        match xs.read(XBT_NULL, &format!("{dir}/{name}")) {
            Ok(v) => nodes.push((name, String::from_utf8_lossy(&v).into_owned())),
            // Removed between the listing and the read: the next watch event
            // brings the new listing.
            Err(HvError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(nodes)
}

/// The view lookups read, and a signal for threads waiting for it to change.
#[derive(Default)]
pub(crate) struct PeerView {
    table: RwLock<PeerTable>,
    version: Mutex<u64>,
    changed: Condvar,
}

impl PeerView {
    /// Reads the table.
    pub(crate) fn read<T>(&self, f: impl FnOnce(&PeerTable) -> T) -> T {
        f(&self.table.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Replaces the table and wakes the waiters.
    pub(crate) fn publish(&self, table: PeerTable) {
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = table;
        *self.version.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.changed.notify_all();
    }

    /// Reloads the table from xenstore.
    pub(crate) fn reload(&self, xs: &dyn Xenstore, dir: &str) -> Result<(), HvError> {
        let nodes = read_nodes(xs, dir)?;
        let (table, problems) = parse_view(&nodes);
        for p in problems {
            tracing::warn!(dir, "{p}");
        }
        tracing::debug!(dir, peers = table.iter().count(), "peer view loaded");
        self.publish(table);
        Ok(())
    }

    /// The first `find` answer, waiting for the view to change until
    /// `deadline` while there is none.
    pub(crate) fn wait_for<T>(
        &self,
        deadline: Instant,
        find: impl Fn(&PeerTable) -> Option<T>,
    ) -> Option<T> {
        let mut version = self.version.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(found) = self.read(&find) {
                return Some(found);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            let seen = *version;
            while *version == seen {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                version = self
                    .changed
                    .wait_timeout(version, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;
    use xmx_wire::mxoe::Mac;

    fn node(name: &str, value: &str) -> (String, String) {
        (name.to_owned(), value.to_owned())
    }

    #[test]
    fn entries_are_index_mac_and_hostname() {
        let e = parse_entry("3", "06:47:81:33:14:9e h0-g0:0").unwrap();
        assert_eq!(e.index, 3);
        assert_eq!(e.mac, Mac([0x06, 0x47, 0x81, 0x33, 0x14, 0x9e]));
        assert_eq!(e.hostname, "h0-g0:0");
        // A NUL-terminated value, as some toolstacks write them.
        let e = parse_entry("0", "06:00:00:00:00:01 a:0\0").unwrap();
        assert_eq!(e.hostname, "a:0");
        // No hostname yet.
        assert_eq!(parse_entry("1", "06:00:00:00:00:02").unwrap().hostname, "");
        for (name, value) in [
            ("x", "06:00:00:00:00:01 a:0"),
            ("65536", "06:00:00:00:00:01 a:0"),
            ("1", "not-a-mac a:0"),
            ("1", "07:00:00:00:00:01 multicast:0"),
            ("1", ""),
        ] {
            assert!(parse_entry(name, value).is_err(), "{name} = {value:?}");
        }
    }

    #[test]
    fn bad_and_duplicate_nodes_are_left_out() {
        let (t, problems) = parse_view(&[
            node("0", "06:00:00:00:00:01 a:0"),
            node("1", "06:00:00:00:00:01 again:0"),
            node("2", "garbage"),
            node("5", "06:00:00:00:00:05 e:0"),
        ]);
        assert_eq!(problems.len(), 2, "{problems:?}");
        let got: Vec<(u16, String)> = t.iter().map(|e| (e.index, e.hostname.clone())).collect();
        assert_eq!(got, vec![(0, "a:0".into()), (5, "e:0".into())]);
        assert_eq!(t.by_mac(Mac([6, 0, 0, 0, 0, 5])).unwrap().index, 5);
    }

    #[test]
    fn a_waiter_sees_a_later_publication() {
        let view = Arc::new(PeerView::default());
        let find = |t: &PeerTable| t.by_hostname("late:0").map(|e| e.index);
        assert_eq!(view.wait_for(Instant::now(), find), None);
        let v2 = view.clone();
        let waiter =
            std::thread::spawn(move || v2.wait_for(Instant::now() + Duration::from_secs(30), find));
        let (t, _) = parse_view(&[node("7", "06:00:00:00:00:07 late:0")]);
        view.publish(t);
        assert_eq!(waiter.join().unwrap(), Some(7));
    }
}

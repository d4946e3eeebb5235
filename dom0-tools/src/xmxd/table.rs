//! The fabric's peer table, computed from every host's announced guests.
//!
//! One index space for the whole fabric, as MX expects: a peer index names the same
//! board on every host. There is no leader: each guest's own host claims an index for it
//! and announces the claim; every host runs the same pure function (`compute`) over the
//! same announcements and so reaches the same table. The rules:
//!
//! 1. One MAC, one entry. A MAC announced by two hosts (a guest caught mid-migration, or
//!    two guests whose names hash alike) is kept from the host with the lowest NIC address.
//! 2. One cluster id, one name. An entry whose cluster name disagrees with the
//!    lexicographically first name announced for that id is left out: two clusters
//!    sharing an id would not be isolated from each other.
//! 3. One index, one MAC. Of several claims on an index, the oldest (`since`) wins, then
//!    the lowest MAC: a guest that already had an index keeps it when a newcomer claims
//!    the same one. Losers are left out until their host claims again.
//!
//! A host re-claims for its own losers with `pick_index`: the index the MAC held before
//! if it is free (so a migrated guest keeps its index), else the lowest index no one
//! claims and no remembered MAC held, so indices are not reused while peers may still
//! hold them.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use xmx_backend::admin::PeerSpec;
use xmx_wire::mxoe::Mac;

use super::announce::EntryRepr;
use super::names;
use super::state::mac_text;

/// Peer indices are 16 bits, and [`announce::NO_INDEX`](super::announce::NO_INDEX) is taken.
pub(crate) const INDEX_LIMIT: u16 = u16::MAX;

/// One guest as some host announced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Claim {
    /// The NIC address of the announcing host.
    pub(crate) host: Mac,
    /// Its name.
    pub(crate) host_name: String,
    /// True if the announcing host is this one.
    pub(crate) local: bool,
    /// The guest.
    pub(crate) entry: EntryRepr,
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peer {
    /// Peer index, the same on every host.
    pub index: u16,
    /// The guest's board MAC.
    #[serde(with = "mac_text")]
    pub mac: Mac,
    /// MX hostname, `<guest>:0`.
    pub hostname: String,
    /// The guest's (base) name.
    pub guest: String,
    /// Its cluster's name.
    pub cluster: String,
    /// Its cluster's id.
    pub(crate) cluster_id: u32,
    /// Name of the host running the guest.
    pub host: String,
    /// NIC address of that host.
    #[serde(with = "mac_text")]
    pub host_mac: Mac,
    /// Runs on this host.
    pub local: bool,
}

/// Why an announced guest is not in the table (or shares it uneasily).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Conflict {
    /// The guest's (base) name.
    pub(crate) guest: String,
    /// Its board MAC.
    #[serde(with = "mac_text")]
    pub(crate) mac: Mac,
    /// Name of the host that announced it.
    pub(crate) host: String,
    /// Which rule left it out, for people.
    pub(crate) reason: String,
}

/// The computed table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FabricTable {
    /// Placed peers in index order.
    pub peers: Vec<Peer>,
    /// Guests announced without a usable index (none claimed yet, or a lost claim).
    pub(crate) unplaced: Vec<Claim>,
    /// Claims left out by a rule, with the reason.
    pub(crate) conflicts: Vec<Conflict>,
}

fn conflict(c: &Claim, reason: String) -> Conflict {
    Conflict {
        guest: c.entry.guest.clone(),
        mac: c.entry.mac,
        host: c.host_name.clone(),
        reason,
    }
}

/// The table every host computes from the same claims (see the module documentation).
pub(crate) fn compute(claims: &[Claim]) -> FabricTable {
    let mut table = FabricTable::default();

    // 1. One MAC, one entry: the lowest announcing host keeps it.
    let mut by_mac: BTreeMap<Mac, &Claim> = BTreeMap::new();
    for c in claims {
        match by_mac.get(&c.entry.mac) {
            Some(kept) if kept.host <= c.host => {
                let reason = duplicate_reason(kept, c);
                table.conflicts.push(conflict(c, reason));
            }
            Some(kept) => {
                let reason = duplicate_reason(c, kept);
                table.conflicts.push(conflict(kept, reason));
                by_mac.insert(c.entry.mac, c);
            }
            None => {
                by_mac.insert(c.entry.mac, c);
            }
        }
    }

    // 2. One cluster id, one name.
    let mut cluster_names: BTreeMap<u32, &str> = BTreeMap::new();
    for c in by_mac.values() {
        let name = cluster_names
            .entry(c.entry.cluster)
            .or_insert(&c.entry.cluster_name);
        if c.entry.cluster_name.as_str() < *name {
            *name = &c.entry.cluster_name;
        }
    }
    let mut eligible: Vec<&Claim> = Vec::new();
    for c in by_mac.values() {
        let canonical = cluster_names.get(&c.entry.cluster).copied().unwrap_or("");
        if c.entry.cluster_name != canonical {
            table.conflicts.push(conflict(
                c,
                format!(
                    "cluster {} has id {}, which cluster {canonical} has too",
                    c.entry.cluster_name, c.entry.cluster
                ),
            ));
        } else {
            eligible.push(c);
        }
    }

    // 3. One index, one MAC: the oldest claim, then the lowest MAC.
    let mut by_index: BTreeMap<u16, &Claim> = BTreeMap::new();
    for c in eligible {
        let Some(index) = c.entry.index.filter(|i| *i < INDEX_LIMIT) else {
            table.unplaced.push(c.clone());
            continue;
        };
        let key = |c: &Claim| (c.entry.since, c.entry.mac);
        match by_index.get(&index) {
            Some(kept) if key(kept) <= key(c) => table.unplaced.push(c.clone()),
            Some(kept) => {
                table.unplaced.push((*kept).clone());
                by_index.insert(index, c);
            }
            None => {
                by_index.insert(index, c);
            }
        }
    }
    table.peers = by_index
        .into_iter()
        .map(|(index, c)| Peer {
            index,
            mac: c.entry.mac,
            hostname: names::guest_hostname(&c.entry.guest),
            guest: c.entry.guest.clone(),
            cluster: c.entry.cluster_name.clone(),
            cluster_id: c.entry.cluster,
            host: c.host_name.clone(),
            host_mac: c.host,
            local: c.local,
        })
        .collect();
    table
}

fn duplicate_reason(kept: &Claim, dropped: &Claim) -> String {
    if kept.entry.guest == dropped.entry.guest {
        format!(
            "guest {} is announced by hosts {} and {} (migrating?); {} is used",
            kept.entry.guest, kept.host_name, dropped.host_name, kept.host_name
        )
    } else {
        format!(
            "MAC {} is claimed by guest {} on {} too",
            kept.entry.mac, kept.entry.guest, kept.host_name
        )
    }
}

impl FabricTable {
    /// The entry of `mac`, if placed.
    pub(crate) fn by_mac(&self, mac: Mac) -> Option<&Peer> {
        self.peers.iter().find(|p| p.mac == mac)
    }

    /// The peers a guest of cluster `cluster_id` may see and reach.
    pub(crate) fn visible_to(&self, cluster_id: u32) -> impl Iterator<Item = &Peer> {
        self.peers
            .iter()
            .filter(move |p| p.cluster_id == cluster_id)
    }

    /// The table as `xmx-backd`'s `set-peers` takes it.
    pub(crate) fn to_specs(&self) -> Vec<PeerSpec> {
        self.peers
            .iter()
            .map(|p| PeerSpec {
                index: p.index,
                mac: p.mac.to_string(),
                hostname: p.hostname.clone(),
                cluster: p.cluster_id,
            })
            .collect()
    }
}

/// An index for `mac`, not claimed by any of `claims` (other than `mac`'s own) and, unless
/// none is left, not held before by another MAC in `remembered`. The index `mac` held
/// before is taken again if it is free.
pub(crate) fn pick_index(
    mac: Mac,
    claims: &[Claim],
    remembered: &HashMap<Mac, u16>,
) -> Option<u16> {
    let taken: BTreeSet<u16> = claims
        .iter()
        .filter(|c| c.entry.mac != mac)
        .filter_map(|c| c.entry.index)
        .collect();
    if let Some(&before) = remembered.get(&mac) {
        if before < INDEX_LIMIT && !taken.contains(&before) {
            return Some(before);
        }
    }
    let held: BTreeSet<u16> = remembered
        .iter()
        .filter(|(m, _)| **m != mac)
        .map(|(_, i)| *i)
        .collect();
    let fresh = (0..INDEX_LIMIT).find(|i| !taken.contains(i) && !held.contains(i));
    fresh.or_else(|| (0..INDEX_LIMIT).find(|i| !taken.contains(i)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HA: Mac = Mac([2, 0, 0, 0, 0, 0xa]);
    const HB: Mac = Mac([2, 0, 0, 0, 0, 0xb]);

    fn claim(host: Mac, guest: &str, index: Option<u16>, since: u32, cluster: &str) -> Claim {
        Claim {
            host,
            host_name: format!("h{:x}", host.0[5]),
            local: host == HA,
            entry: EntryRepr {
                index,
                since,
                mac: names::guest_mac(guest),
                cluster: names::cluster_id(cluster),
                cluster_name: cluster.into(),
                guest: guest.into(),
            },
        }
    }

    fn indices(t: &FabricTable) -> Vec<(u16, String)> {
        t.peers.iter().map(|p| (p.index, p.guest.clone())).collect()
    }

    #[test]
    fn disjoint_claims_make_one_table_whatever_the_order() {
        let claims = vec![
            claim(HA, "a1", Some(0), 10, "default"),
            claim(HB, "b1", Some(1), 10, "default"),
            claim(HA, "a2", Some(2), 11, "blue"),
        ];
        let t = compute(&claims);
        assert_eq!(
            indices(&t),
            [(0, "a1".into()), (1, "b1".into()), (2, "a2".into())]
        );
        assert!(t.unplaced.is_empty() && t.conflicts.is_empty());
        let mut reversed = claims.clone();
        reversed.reverse();
        assert_eq!(compute(&reversed).peers, t.peers);
        let p = t.by_mac(names::guest_mac("a2")).unwrap();
        assert_eq!(p.hostname, "a2:0");
        assert_eq!(p.cluster_id, names::cluster_id("blue"));
        assert!(p.local);
        assert_eq!(p.host, "ha");
    }

    #[test]
    fn the_older_claim_keeps_a_contested_index() {
        let old = claim(HB, "b1", Some(0), 10, "default");
        let new = claim(HA, "a1", Some(0), 20, "default");
        for claims in [
            vec![old.clone(), new.clone()],
            vec![new.clone(), old.clone()],
        ] {
            let t = compute(&claims);
            assert_eq!(indices(&t), [(0, "b1".into())]);
            assert_eq!(t.unplaced, std::slice::from_ref(&new));
        }
        // Same age: the lower MAC wins, on every host alike.
        let x = claim(HA, "x", Some(4), 10, "default");
        let y = claim(HB, "y", Some(4), 10, "default");
        let winner = if x.entry.mac < y.entry.mac { "x" } else { "y" };
        assert_eq!(compute(&[x.clone(), y.clone()]).peers[0].guest, winner);
        assert_eq!(compute(&[y, x]).peers[0].guest, winner);
    }

    #[test]
    fn a_mac_announced_twice_is_kept_once() {
        let on_a = claim(HA, "vm", Some(3), 10, "default");
        let on_b = claim(HB, "vm", Some(3), 10, "default");
        let t = compute(&[on_b.clone(), on_a.clone()]);
        assert_eq!(t.peers.len(), 1);
        assert_eq!(t.peers[0].host_mac, HA);
        assert_eq!(t.conflicts.len(), 1);
        assert!(
            t.conflicts[0].reason.contains("migrating"),
            "{:?}",
            t.conflicts
        );
        // Two names, one MAC: a collision, reported as such.
        let mut other = claim(HB, "other", Some(5), 10, "default");
        other.entry.mac = on_a.entry.mac;
        let t = compute(&[on_a, other]);
        assert_eq!(t.peers.len(), 1);
        assert!(
            t.conflicts[0].reason.contains("claimed by guest vm"),
            "{:?}",
            t.conflicts
        );
    }

    #[test]
    fn clusters_sharing_an_id_are_refused() {
        let a = claim(HA, "a", Some(0), 1, "alpha");
        let mut b = claim(HB, "b", Some(1), 1, "beta");
        b.entry.cluster = a.entry.cluster;
        let t = compute(&[b.clone(), a.clone()]);
        assert_eq!(indices(&t), [(0, "a".into())]);
        assert_eq!(t.conflicts.len(), 1);
        assert_eq!(t.conflicts[0].guest, "b");
    }

    #[test]
    fn unclaimed_and_out_of_range_indices_are_unplaced() {
        let t = compute(&[
            claim(HA, "a", None, 0, "default"),
            claim(HA, "b", Some(INDEX_LIMIT), 0, "default"),
        ]);
        assert!(t.peers.is_empty());
        assert_eq!(t.unplaced.len(), 2);
    }

    #[test]
    fn visibility_follows_the_cluster() {
        let t = compute(&[
            claim(HA, "a1", Some(0), 1, "default"),
            claim(HB, "b1", Some(1), 1, "blue"),
            claim(HA, "a2", Some(2), 1, "blue"),
        ]);
        let blue: Vec<_> = t
            .visible_to(names::cluster_id("blue"))
            .map(|p| p.guest.as_str())
            .collect();
        assert_eq!(blue, ["b1", "a2"]);
        let default: Vec<_> = t.visible_to(0).map(|p| p.guest.as_str()).collect();
        assert_eq!(default, ["a1"]);
        let specs = t.to_specs();
        assert_eq!(specs.len(), 3);
        assert_eq!(specs[1].mac, names::guest_mac("b1").to_string());
        assert_eq!(specs[1].hostname, "b1:0");
        assert_eq!(specs[1].cluster, names::cluster_id("blue"));
    }

    #[test]
    fn picking_reuses_a_remembered_index_and_avoids_held_ones() {
        let claims = vec![
            claim(HB, "b0", Some(0), 1, "default"),
            claim(HB, "b2", Some(2), 1, "default"),
        ];
        let me = names::guest_mac("new");
        let mut remembered = HashMap::new();
        assert_eq!(pick_index(me, &claims, &remembered), Some(1));
        // Index 1 was held by a guest that left: not reused while others are free.
        remembered.insert(names::guest_mac("gone"), 1);
        assert_eq!(pick_index(me, &claims, &remembered), Some(3));
        // The index this MAC held before comes back if free...
        remembered.insert(me, 7);
        assert_eq!(pick_index(me, &claims, &remembered), Some(7));
        // ...but not if someone else claims it now.
        remembered.insert(me, 2);
        assert_eq!(pick_index(me, &claims, &remembered), Some(3));
        // Our own (losing) claim does not block us.
        let mut with_own = claims.clone();
        with_own.push(claim(HA, "new", Some(9), 1, "default"));
        remembered.remove(&me);
        assert_eq!(pick_index(me, &with_own, &remembered), Some(3));
    }
}

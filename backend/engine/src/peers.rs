//! The peer table: which MX NIC (board MAC) each peer index names, in which virtual cluster.
//!
//! One index space per engine, as in Open-MX, so indices agree across all hosts that got
//! the same table from the peer service. Each entry belongs to one virtual cluster; a guest
//! may only exchange traffic with peers of its own cluster. The table is replaced wholesale
//! by the peer service ([`Engine::set_peers`](super::Engine::set_peers)).

use rustc_hash::FxHashMap;
use xmx_wire::mxoe::Mac;

use super::error::PeerTableError;
use super::ClusterId;

/// One peer: a native MX/Open-MX host or a guest (on this or another host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerEntry {
    /// Index in the table, as guests name the peer.
    pub index: u16,
    /// Board address of the peer's NIC.
    pub mac: Mac,
    /// Hostname as MX reports it (`host:board`), informative.
    pub hostname: String,
    /// Virtual cluster the peer belongs to.
    pub cluster: ClusterId,
}

/// Peer index <-> (MAC, hostname, cluster), looked up both ways.
#[derive(Debug, Clone, Default)]
pub struct PeerTable {
    by_index: Vec<Option<PeerEntry>>,
    by_mac: FxHashMap<Mac, u16>,
}

impl PeerTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Build a table, refusing duplicate indices or MACs and group addresses.
    pub fn from_entries(
        entries: impl IntoIterator<Item = PeerEntry>,
    ) -> Result<Self, PeerTableError> {
        let mut table = PeerTable::new();
        for entry in entries {
            if !entry.mac.is_unicast() {
                return Err(PeerTableError::NotUnicast(entry.mac));
            }
            let slot = usize::from(entry.index);
            if table.by_index.get(slot).is_some_and(Option::is_some) {
                return Err(PeerTableError::DuplicateIndex(entry.index));
            }
            if table.by_mac.contains_key(&entry.mac) {
                return Err(PeerTableError::DuplicateMac(entry.mac));
            }
            if table.by_index.len() <= slot {
                table.by_index.resize(slot + 1, None);
            }
            table.by_mac.insert(entry.mac, entry.index);
            if let Some(s) = table.by_index.get_mut(slot) {
                *s = Some(entry);
            }
        }
        Ok(table)
    }

    /// One past the highest index in use: guests may name indices below it.
    pub fn len(&self) -> usize {
        self.by_index.len()
    }

    /// True if no peer is known.
    pub fn is_empty(&self) -> bool {
        self.by_mac.is_empty()
    }

    /// The entry at `index`, if any.
    pub fn get(&self, index: u16) -> Option<&PeerEntry> {
        self.by_index.get(usize::from(index))?.as_ref()
    }

    /// The entry whose board address is `mac`, if any.
    pub fn by_mac(&self, mac: Mac) -> Option<&PeerEntry> {
        self.get(*self.by_mac.get(&mac)?)
    }

    /// The entry with this hostname, if any.
    pub fn by_hostname(&self, hostname: &str) -> Option<&PeerEntry> {
        self.iter().find(|e| e.hostname == hostname)
    }

    /// All entries in index order.
    pub fn iter(&self) -> impl Iterator<Item = &PeerEntry> {
        self.by_index.iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u16, last: u8, cluster: u32) -> PeerEntry {
        PeerEntry {
            index,
            mac: Mac([2, 0, 0, 0, 0, last]),
            hostname: format!("h{last}:0"),
            cluster: ClusterId(cluster),
        }
    }

    #[test]
    fn lookups_both_ways() {
        let t = PeerTable::from_entries([entry(3, 1, 1), entry(0, 2, 2)]).unwrap();
        assert_eq!(t.len(), 4);
        assert_eq!(t.get(3).unwrap().mac, Mac([2, 0, 0, 0, 0, 1]));
        assert!(t.get(1).is_none());
        assert!(t.get(60000).is_none());
        assert_eq!(t.by_mac(Mac([2, 0, 0, 0, 0, 2])).unwrap().index, 0);
        assert_eq!(t.by_hostname("h1:0").unwrap().index, 3);
        assert_eq!(t.iter().map(|e| e.index).collect::<Vec<_>>(), [0, 3]);
    }

    #[test]
    fn duplicates_and_group_macs_are_refused() {
        assert_eq!(
            PeerTable::from_entries([entry(1, 1, 1), entry(1, 2, 1)]).unwrap_err(),
            PeerTableError::DuplicateIndex(1)
        );
        assert_eq!(
            PeerTable::from_entries([entry(1, 1, 1), entry(2, 1, 1)]).unwrap_err(),
            PeerTableError::DuplicateMac(Mac([2, 0, 0, 0, 0, 1]))
        );
        let mut bad = entry(0, 1, 1);
        bad.mac = Mac::BROADCAST;
        assert_eq!(
            PeerTable::from_entries([bad]).unwrap_err(),
            PeerTableError::NotUnicast(Mac::BROADCAST)
        );
    }
}

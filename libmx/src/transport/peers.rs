//! A peer table: NIC ids, their indexes (what frames carry) and hostnames.

use rustc_hash::FxHashMap;

use crate::abi::MxReturn;
use crate::errors::{Failure, MxResult};

/// Most peers a table holds (MXoE's 16-bit peer index).
pub(crate) const MAX_PEERS: usize = 65536;

#[derive(Clone, Debug)]
struct DirectoryPeer {
    nic_id: u64,
    hostname: Option<String>,
}

/// NIC id <-> peer index <-> hostname. Indexes are stable while a peer
/// stays in the table.
#[derive(Clone, Debug, Default)]
pub(crate) struct PeerDirectory {
    slots: Vec<Option<DirectoryPeer>>,
    by_nic: FxHashMap<u64, u16>,
    by_name: FxHashMap<String, u64>,
}

impl PeerDirectory {
    /// Adds a peer, or renames it if present; returns its index.
    pub(crate) fn add(&mut self, nic_id: u64, hostname: Option<&str>) -> MxResult<u16> {
        let index = match self.by_nic.get(&nic_id) {
            Some(&i) => i,
            None => {
                let i = match self.slots.iter().position(Option::is_none) {
                    Some(i) => i,
                    None if self.slots.len() < MAX_PEERS => {
                        self.slots.push(None);
                        self.slots.len() - 1
                    }
                    None => return Err(Failure::new(MxReturn::NoResources, "peer table is full")),
                };
                self.slots[i] = Some(DirectoryPeer {
                    nic_id,
                    hostname: None,
                });
                self.by_nic.insert(nic_id, i as u16);
                i as u16
            }
        };
        if let Some(name) = hostname {
            if let Some(Some(p)) = self.slots.get_mut(index as usize) {
                if let Some(old) = p.hostname.replace(name.to_owned()) {
                    self.by_name.remove(&old);
                }
            }
            self.by_name.insert(name.to_owned(), nic_id);
        }
        Ok(index)
    }

    /// Removes a peer; returns whether it was present.
    pub(crate) fn remove(&mut self, nic_id: u64) -> bool {
        let Some(i) = self.by_nic.remove(&nic_id) else {
            return false;
        };
        if let Some(Some(p)) = self.slots.get_mut(i as usize).map(Option::take) {
            if let Some(name) = p.hostname {
                self.by_name.remove(&name);
            }
        }
        true
    }

    /// The index of a NIC.
    pub(crate) fn index_of(&self, nic_id: u64) -> Option<u16> {
        self.by_nic.get(&nic_id).copied()
    }

    /// The NIC at an index.
    pub(crate) fn nic_at(&self, index: u16) -> Option<u64> {
        self.slots.get(index as usize)?.as_ref().map(|p| p.nic_id)
    }

    /// The hostname of a NIC.
    pub(crate) fn hostname_of(&self, nic_id: u64) -> Option<String> {
        let i = self.index_of(nic_id)?;
        self.slots.get(i as usize)?.as_ref()?.hostname.clone()
    }

    /// The NIC of a hostname.
    pub(crate) fn nic_of(&self, hostname: &str) -> Option<u64> {
        self.by_name.get(hostname).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_rename_remove_reuse() {
        let mut t = PeerDirectory::default();
        assert_eq!(t.add(0xa, Some("a:0")).unwrap(), 0);
        assert_eq!(t.add(0xb, None).unwrap(), 1);
        assert_eq!(t.add(0xa, Some("alpha:0")).unwrap(), 0);
        assert_eq!(t.nic_of("a:0"), None);
        assert_eq!(t.nic_of("alpha:0"), Some(0xa));
        assert_eq!(t.hostname_of(0xb), None);
        assert!(t.remove(0xa));
        assert!(!t.remove(0xa));
        assert_eq!(t.nic_at(0), None);
        assert_eq!(t.nic_of("alpha:0"), None);
        assert_eq!(t.add(0xc, Some("c:0")).unwrap(), 0, "free slot reused");
        assert_eq!(t.index_of(0xb), Some(1));
    }
}

//! A registration cache keyed by `(address, length)`.
//!
//! Registering memory (granting and mapping its pages, on Xen) is costly, so
//! with `MX_RCACHE=1` a transport keeps a buffer's registration after the
//! send that needed it and reuses it when the same buffer is sent again.
//! The key is the exact `(address, length)`; invalidating a range drops every
//! entry overlapping it, so memory the application freed or remapped is
//! never reached through an old registration.

use std::collections::BTreeMap;

/// Cached registrations of type `V`.
#[derive(Debug)]
pub(crate) struct RegCache<V> {
    entries: BTreeMap<(usize, usize), V>,
    /// Lookups that found an entry.
    pub(crate) hits: u64,
    /// Lookups that did not.
    pub(crate) misses: u64,
}

impl<V> Default for RegCache<V> {
    fn default() -> Self {
        RegCache {
            entries: BTreeMap::new(),
            hits: 0,
            misses: 0,
        }
    }
}

impl<V> RegCache<V> {
    /// The registration of exactly `(addr, len)`, if cached.
    pub(crate) fn get(&mut self, addr: usize, len: usize) -> Option<&V> {
        let v = self.entries.get(&(addr, len));
        if v.is_some() {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
        v
    }

    /// Caches a registration.
    pub(crate) fn insert(&mut self, addr: usize, len: usize, v: V) {
        self.entries.insert((addr, len), v);
    }

    /// Drops (and returns) every registration overlapping `[addr, addr+len)`.
    pub(crate) fn invalidate(&mut self, addr: usize, len: usize) -> Vec<V> {
        let end = addr.saturating_add(len);
        let doomed: Vec<(usize, usize)> = self
            .entries
            .keys()
            .filter(|&&(a, l)| a < end && addr < a.saturating_add(l))
            .copied()
            .collect();
        doomed
            .into_iter()
            .filter_map(|k| self.entries.remove(&k))
            .collect()
    }

    /// Number of cached registrations.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_key_and_overlap_invalidation() {
        let mut c = RegCache::default();
        c.insert(0x1000, 0x100, "a");
        c.insert(0x2000, 0x100, "b");
        c.insert(0x1000, 0x200, "c");
        assert_eq!(c.get(0x1000, 0x100), Some(&"a"));
        assert_eq!(c.get(0x1000, 0x80), None);
        assert_eq!((c.hits, c.misses), (1, 1));
        let mut gone = c.invalidate(0x10ff, 1);
        gone.sort();
        assert_eq!(gone, vec!["a", "c"]);
        assert_eq!(c.invalidate(0x2100, 0x10), Vec::<&str>::new(), "adjacent");
        assert_eq!(c.len(), 1);
    }
}

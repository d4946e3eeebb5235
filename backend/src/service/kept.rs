//! Mappings of deregistered windows, kept for the windows that follow (blkback's
//! persistent grants).
//!
//! A guest application that registers its own windows keeps the grants of a deregistered
//! window in a pool and lists them again for its next window (`xmx_frontend::own_grants`).
//! Mapping those pages at every REGISTER and unmapping them at every DEREGISTER was the
//! whole cost of a registration without the cache: two hypercalls and a page-table build
//! and teardown per window, hundreds of microseconds for a megabyte. The backend keeps the
//! mapping instead and serves the next REGISTER that lists the same refs from it. The
//! window's info pages (the pool lists each next window in the same ones) are kept mapped
//! too, and read from there instead of through a grant copy.
//!
//! Why a kept mapping still maps what the refs name: a grant ref cannot be handed out
//! again while a remote maps it (Xen's grant table defers the end of a mapped grant, and
//! so does the simulator's), so as long as the mapping is kept, each of its refs names the
//! frame it mapped. What it exposes: pages still granted to this backend, which saw their
//! contents already. The registration itself is not kept: a DEREGISTER retires the id at
//! once, and nothing reaches a kept mapping until a REGISTER names its refs again.
//!
//! Bounded per endpoint by [`KEPT_WINDOW_PAGES`] (oldest go first), dropped with the
//! endpoint and the connection, and given up before a registration is refused for the
//! guest's mapping quota. Pages a guest ended while kept here are freed when this lets go.

use std::collections::VecDeque;
use std::sync::Arc;

use xmx_hv::{GrantRef, MappedPages};
pub(crate) use xmx_wire::msg::KEPT_WINDOW_PAGES;

/// One kept mapping (`M`: the platform's, a stand-in in unit tests): the refs it mapped,
/// in order.
pub(crate) struct KeptMapping<M = MappedPages> {
    endpoint: u8,
    refs: Vec<GrantRef>,
    mapping: Arc<M>,
}

impl<M> KeptMapping<M> {
    /// A mapping of `refs` for `endpoint`.
    pub(crate) fn new(endpoint: u8, refs: Vec<GrantRef>, mapping: Arc<M>) -> Self {
        KeptMapping {
            endpoint,
            refs,
            mapping,
        }
    }

    /// Pages it maps.
    pub(crate) fn pages(&self) -> usize {
        self.refs.len()
    }

    /// The mapping (its first pages are the window's).
    pub(crate) fn mapping(&self) -> &Arc<M> {
        &self.mapping
    }

    /// The refs it mapped.
    #[cfg(test)]
    fn refs(&self) -> &[GrantRef] {
        &self.refs
    }
}

/// The kept mappings of one guest connection.
pub(crate) struct KeptMappings<M = MappedPages> {
    /// Oldest first.
    entries: VecDeque<KeptMapping<M>>,
    pages: usize,
    reused: u64,
}

impl<M> Default for KeptMappings<M> {
    fn default() -> Self {
        KeptMappings {
            entries: VecDeque::new(),
            pages: 0,
            reused: 0,
        }
    }
}

impl<M> KeptMappings<M> {
    /// Pages kept.
    pub(crate) fn pages(&self) -> usize {
        self.pages
    }

    /// Registrations served from a kept mapping so far.
    pub(crate) fn reused(&self) -> u64 {
        self.reused
    }

    /// The kept mapping of `endpoint` whose refs begin with `refs`, taken out; else, if one
    /// begins with the same ref (the same grants, listed longer now), it is dropped and its
    /// pages returned in `Err`, since the caller maps them afresh.
    pub(crate) fn take(
        &mut self,
        endpoint: u8,
        refs: &[GrantRef],
    ) -> Result<KeptMapping<M>, usize> {
        let same_grants =
            |k: &KeptMapping<M>| k.endpoint == endpoint && k.refs.first() == refs.first();
        let Some(kept) = self
            .entries
            .iter()
            .position(same_grants)
            .and_then(|i| self.entries.remove(i))
        else {
            return Err(0);
        };
        self.pages -= kept.pages();
        if kept.refs.starts_with(refs) && !refs.is_empty() {
            self.reused += 1;
            Ok(kept)
        } else {
            Err(kept.pages())
        }
    }

    /// Keeps `kept` if nothing else holds its mapping, dropping the endpoint's oldest beyond
    /// [`KEPT_WINDOW_PAGES`]; returns the pages no longer mapped (`kept`'s own included
    /// when it is not kept).
    pub(crate) fn put(&mut self, kept: KeptMapping<M>) -> usize {
        if Arc::strong_count(&kept.mapping) != 1 || kept.pages() > KEPT_WINDOW_PAGES {
            return kept.pages();
        }
        let endpoint = kept.endpoint;
        self.pages += kept.pages();
        self.entries.push_back(kept);
        let mut released = 0;
        while self.pages_of(endpoint) > KEPT_WINDOW_PAGES {
            let Some(i) = self.entries.iter().position(|k| k.endpoint == endpoint) else {
                break;
            };
            released += self.remove(i);
        }
        released
    }

    /// Drops the oldest kept mapping; returns its pages (0: none was kept).
    pub(crate) fn drop_oldest(&mut self) -> usize {
        if self.entries.is_empty() {
            0
        } else {
            self.remove(0)
        }
    }

    /// Drops every mapping kept for `endpoint`; returns their pages.
    pub(crate) fn drop_endpoint(&mut self, endpoint: u8) -> usize {
        let mut released = 0;
        while let Some(i) = self.entries.iter().position(|k| k.endpoint == endpoint) {
            released += self.remove(i);
        }
        released
    }

    fn pages_of(&self, endpoint: u8) -> usize {
        self.entries
            .iter()
            .filter(|k| k.endpoint == endpoint)
            .map(KeptMapping::<M>::pages)
            .sum()
    }

    fn remove(&mut self, i: usize) -> usize {
        let pages = self.entries.remove(i).map_or(0, |k| k.pages());
        self.pages -= pages;
        pages
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(endpoint: u8, refs: std::ops::Range<u32>) -> KeptMapping<()> {
        KeptMapping::new(endpoint, refs.collect(), Arc::new(()))
    }

    #[test]
    fn a_window_over_the_same_grants_or_fewer_of_them_reuses_the_mapping() {
        let mut k = KeptMappings::default();
        assert_eq!(k.put(kept(1, 10..14)), 0);
        assert_eq!(k.pages(), 4);
        // Another endpoint's window, or other grants, find nothing.
        assert_eq!(k.take(2, &[10, 11]).err(), Some(0));
        assert_eq!(k.take(1, &[20, 21]).err(), Some(0));
        // The first two pages of the same grants: the whole mapping comes back.
        let got = k.take(1, &[10, 11]).ok().unwrap();
        assert_eq!(got.refs(), &[10, 11, 12, 13]);
        assert_eq!((k.pages(), k.reused()), (0, 1));
        // Put back after its DEREGISTER, it serves the whole window again.
        assert_eq!(k.put(got), 0);
        assert!(k.take(1, &[10, 11, 12, 13]).is_ok());
    }

    #[test]
    fn the_same_grants_listed_longer_or_in_another_order_are_mapped_afresh() {
        let mut k = KeptMappings::default();
        k.put(kept(1, 10..12));
        // Longer: the kept mapping goes (its pages are returned), the caller maps anew.
        assert_eq!(k.take(1, &[10, 11, 12]).err(), Some(2));
        assert_eq!(k.pages(), 0);
        k.put(kept(1, 10..13));
        assert_eq!(k.take(1, &[10, 12]).err(), Some(3));
        assert_eq!(k.take(1, &[]).err(), Some(0));
    }

    #[test]
    fn a_mapping_held_elsewhere_or_beyond_the_bound_is_not_kept() {
        let mut k = KeptMappings::default();
        let held = kept(1, 0..3);
        let other = held.mapping().clone();
        assert_eq!(k.put(held), 3, "a view of it is still alive");
        drop(other);
        let huge = KEPT_WINDOW_PAGES as u32 + 1;
        assert_eq!(k.put(kept(1, 0..huge)), huge as usize);
        assert_eq!(k.pages(), 0);
    }

    #[test]
    fn each_endpoint_keeps_its_newest_within_the_bound() {
        let mut k = KeptMappings::default();
        let half = (KEPT_WINDOW_PAGES / 2) as u32;
        assert_eq!(k.put(kept(1, 0..half)), 0);
        assert_eq!(k.put(kept(2, 100_000..100_000 + half)), 0);
        assert_eq!(k.put(kept(1, half..2 * half)), 0);
        // A third window of endpoint 1 pushes its oldest out; endpoint 2's stays.
        assert_eq!(k.put(kept(1, 2 * half..2 * half + 5)), half as usize);
        assert!(k.take(1, &[0]).is_err());
        assert!(k.take(2, &[100_000]).is_ok());
        assert_eq!(k.drop_endpoint(1), half as usize + 5);
        assert_eq!(k.pages(), 0);
        assert_eq!(k.drop_oldest(), 0);
    }
}

//! The registration cache: which granted window serves which application buffer.
//!
//! LARGE data is copied between the application's buffer and a granted window (see the
//! crate documentation for why), so what costs is not the copy but registering the window:
//! granting its pages, the backend mapping them, and the reverse at deregistration. The
//! cache keys windows by the buffer they serve, `(endpoint, address, length)`:
//!
//! - `MX_RCACHE=1` (the default): a window stays registered after its message; the next
//!   message from or to the same buffer finds it (a hit) and pays no grant operation.
//!   Unused windows are evicted least-recently-used beyond the cache's capacity, once
//!   unused for [`IDLE_FOR_MAX`], and all at once ([`RegionCache::drop_unused`]) when the
//!   guest runs short of grants: a guest's grants are shared by all its processes, and
//!   windows one process keeps but does not use must not leave another unable to
//!   register (several MPI ranks in one guest). The guest daemon says when a
//!   registration failed for want of grants (`Notice::GrantsShort`), so no byte bound is
//!   needed while grants are plenty: a bound below what a stream cycles through (eight
//!   posted receives of 16 MiB, each into its own buffer) evicted, least recently used,
//!   exactly the window needed next, and every message paid a registration.
//! - `MX_RCACHE=0`: a message registers its window and the last message using it
//!   deregisters it: messages of one buffer in flight at once share its window (MX keeps
//!   a pending send's buffer unchanged), and nothing stays registered once they are done.
//!
//! [`RegionCache::invalidate`] drops windows of a buffer range the application freed or
//! remapped (a window in use is dropped when its message releases it), so a later buffer
//! at the same address never inherits a stale registration.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::channel::RegionWindow;
use crate::error::Result;

/// How long a cache keeps a window nothing uses.
pub const IDLE_FOR_MAX: Duration = Duration::from_secs(1);

/// Registers and deregisters windows for the cache: the daemon client, or a fake in tests.
pub trait Registrar {
    /// Register a zeroed window of `length` bytes on `endpoint`.
    fn register(&mut self, endpoint: u8, length: u32) -> Result<RegionWindow>;
    /// Deregister a window (it is unmapped first).
    fn deregister(&mut self, window: RegionWindow) -> Result<()>;
}

/// Counters of a cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RcacheStats {
    /// Acquisitions served by a registered window.
    pub hits: u64,
    /// Acquisitions that had to register.
    pub misses: u64,
    /// Windows registered.
    pub registrations: u64,
    /// Windows deregistered.
    pub deregistrations: u64,
    /// Windows deregistered to stay within capacity.
    pub evictions: u64,
    /// Windows dropped by [`RegionCache::invalidate`] or [`RegionCache::flush`].
    pub invalidations: u64,
}

/// What a window serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Key {
    endpoint: u8,
    addr: usize,
    len: usize,
}

/// A window held for one message; give it back with [`RegionCache::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    id: u64,
}

struct Entry {
    key: Key,
    window: RegionWindow,
    users: u32,
    /// Invalidated while in use: dropped at the last release, never handed out again.
    stale: bool,
    last_use: u64,
    /// Since when no message uses it (none while one does).
    idle_since: Option<Instant>,
}

/// The registration cache; see the module documentation.
pub struct RegionCache {
    enabled: bool,
    capacity: usize,
    entries: BTreeMap<u64, Entry>,
    next_id: u64,
    clock: u64,
    stats: RcacheStats,
}

impl RegionCache {
    /// A cache keeping windows registered (`enabled`) up to `capacity` unused ones, or
    /// registering per message.
    pub fn new(enabled: bool, capacity: usize) -> RegionCache {
        RegionCache {
            enabled,
            capacity: capacity.max(1),
            entries: BTreeMap::new(),
            next_id: 1,
            clock: 0,
            stats: RcacheStats::default(),
        }
    }

    /// As [`RegionCache::new`], enabled unless `MX_RCACHE` is `0`.
    pub fn from_env(capacity: usize) -> RegionCache {
        let enabled = std::env::var("MX_RCACHE")
            .map(|v| v.trim() != "0")
            .unwrap_or(true);
        RegionCache::new(enabled, capacity)
    }

    /// Whether windows stay registered across messages.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Counters so far.
    pub fn stats(&self) -> RcacheStats {
        self.stats
    }

    /// Windows registered now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True if no window is registered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A window for the `len` bytes of the application buffer at `addr`, for a message on
    /// `endpoint`: the cached one if any, else a new registration.
    pub fn acquire(
        &mut self,
        reg: &mut dyn Registrar,
        endpoint: u8,
        addr: usize,
        len: usize,
    ) -> Result<Lease> {
        let key = Key {
            endpoint,
            addr,
            len,
        };
        self.clock += 1;
        let clock = self.clock;
        // Without the cache every window kept is one a message still holds (the last
        // release deregisters it), and it serves another message of the same buffer
        // too: nothing stays registered past its last message (what `MX_RCACHE=0`
        // promises), and a burst of sends from one buffer (a stream, the window of an
        // MPI bandwidth loop) registers it once, not per message.
        if let Some((id, e)) = self
            .entries
            .iter_mut()
            .find(|(_, e)| e.key == key && !e.stale)
        {
            e.users += 1;
            e.last_use = clock;
            e.idle_since = None;
            self.stats.hits += 1;
            return Ok(Lease { id: *id });
        }
        if self.enabled {
            self.make_room(reg)?;
        }
        self.stats.misses += 1;
        let length = u32::try_from(len)
            .map_err(|_| crate::Error::Invalid(format!("a window of {len} bytes")))?;
        let window = reg.register(endpoint, length)?;
        self.stats.registrations += 1;
        let id = self.next_id;
        self.next_id += 1;
        self.entries.insert(
            id,
            Entry {
                key,
                window,
                users: 1,
                stale: false,
                last_use: self.clock,
                idle_since: None,
            },
        );
        Ok(Lease { id })
    }

    /// Deregister least-recently-used unused windows until one more fits.
    fn make_room(&mut self, reg: &mut dyn Registrar) -> Result<()> {
        while self.entries.len() >= self.capacity {
            // Every window in use: grow past capacity rather than fail the message.
            if !self.evict_least_recently_used(reg)? {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Deregisters the least recently used unused window; false if every one is in use.
    fn evict_least_recently_used(&mut self, reg: &mut dyn Registrar) -> Result<bool> {
        let victim = self
            .entries
            .iter()
            .filter(|(_, e)| e.users == 0)
            .min_by_key(|(_, e)| e.last_use)
            .map(|(id, _)| *id);
        let Some(id) = victim else { return Ok(false) };
        self.stats.evictions += 1;
        self.drop_entry(reg, id)?;
        Ok(true)
    }

    fn drop_entry(&mut self, reg: &mut dyn Registrar, id: u64) -> Result<()> {
        if let Some(e) = self.entries.remove(&id) {
            self.stats.deregistrations += 1;
            reg.deregister(e.window)?;
        }
        Ok(())
    }

    /// The window a lease holds.
    pub fn window(&self, lease: Lease) -> Option<&RegionWindow> {
        self.entries.get(&lease.id).map(|e| &e.window)
    }

    /// The message is done with its window: kept registered (cache on), or deregistered
    /// (cache off, or invalidated meanwhile).
    pub fn release(&mut self, reg: &mut dyn Registrar, lease: Lease) -> Result<()> {
        let Some(e) = self.entries.get_mut(&lease.id) else {
            return Ok(());
        };
        e.users = e.users.saturating_sub(1);
        if e.users > 0 {
            return Ok(());
        }
        if !self.enabled || e.stale {
            return self.drop_entry(reg, lease.id);
        }
        e.idle_since = Some(Instant::now());
        Ok(())
    }

    /// Deregisters the windows unused for [`IDLE_FOR_MAX`] at `now`; returns how many.
    pub fn expire_idle(&mut self, reg: &mut dyn Registrar, now: Instant) -> Result<usize> {
        let old: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, e)| e.idle_since.is_some_and(|t| now >= t + IDLE_FOR_MAX))
            .map(|(id, _)| *id)
            .collect();
        for id in &old {
            self.stats.evictions += 1;
            self.drop_entry(reg, *id)?;
        }
        Ok(old.len())
    }

    /// When the next unused window is due to expire, if any is unused.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.entries
            .values()
            .filter_map(|e| e.idle_since)
            .min()
            .map(|t| t + IDLE_FOR_MAX)
    }

    /// The application buffer range `[addr, addr + len)` changed (freed, remapped):
    /// drop every window serving bytes of it. Returns how many were dropped or marked.
    pub fn invalidate(
        &mut self,
        reg: &mut dyn Registrar,
        addr: usize,
        len: usize,
    ) -> Result<usize> {
        let end = addr.saturating_add(len);
        let hit: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, e)| {
                !e.stale && e.key.addr < end && addr < e.key.addr.saturating_add(e.key.len)
            })
            .map(|(id, _)| *id)
            .collect();
        self.retire(reg, &hit)
    }

    /// Deregisters every window nothing uses now (the guest is short of grants); returns
    /// how many. Windows in use stay, and stay cached.
    pub fn drop_unused(&mut self, reg: &mut dyn Registrar) -> Result<usize> {
        let unused: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, e)| e.users == 0)
            .map(|(id, _)| *id)
            .collect();
        let mut first_err = None;
        for id in &unused {
            self.stats.evictions += 1;
            if let Err(e) = self.drop_entry(reg, *id) {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(unused.len()),
        }
    }

    /// Drop every window (those in use at their release).
    pub fn flush(&mut self, reg: &mut dyn Registrar) -> Result<usize> {
        let all: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, e)| !e.stale)
            .map(|(id, _)| *id)
            .collect();
        self.retire(reg, &all)
    }

    fn retire(&mut self, reg: &mut dyn Registrar, ids: &[u64]) -> Result<usize> {
        let mut first_err = None;
        for id in ids {
            self.stats.invalidations += 1;
            let in_use = self.entries.get(id).is_some_and(|e| e.users > 0);
            if in_use {
                if let Some(e) = self.entries.get_mut(id) {
                    e.stale = true;
                }
            } else if let Err(e) = self.drop_entry(reg, *id) {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(ids.len()),
        }
    }

    /// Every window of `endpoint`, in use or not (to move them onto new pages after the
    /// domain moved).
    pub fn windows_mut(&mut self, endpoint: u8) -> impl Iterator<Item = &mut RegionWindow> {
        self.entries
            .values_mut()
            .map(|e| &mut e.window)
            .filter(move |w| w.endpoint() == endpoint)
    }

    /// Forget (unmap, without deregistering) every window of `endpoint`: after a
    /// reconnection the backend no longer knows them. Leases on them become void.
    pub fn forget_endpoint(&mut self, endpoint: u8) -> usize {
        let before = self.entries.len();
        self.entries.retain(|_, e| e.key.endpoint != endpoint);
        before - self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    /// Windows over process memory, counting calls.
    #[derive(Default)]
    struct Fake {
        registered: u64,
        deregistered: u64,
        live: usize,
        fail_next: bool,
    }

    impl Registrar for Fake {
        fn register(&mut self, endpoint: u8, length: u32) -> Result<RegionWindow> {
            if std::mem::take(&mut self.fail_next) {
                return Err(Error::Exhausted("region id".into()));
            }
            self.registered += 1;
            self.live += 1;
            Ok(RegionWindow::in_memory(
                endpoint,
                self.registered as u8,
                length,
            ))
        }
        fn deregister(&mut self, _w: RegionWindow) -> Result<()> {
            self.deregistered += 1;
            self.live -= 1;
            Ok(())
        }
    }

    #[test]
    fn a_hit_reuses_the_registered_window() {
        let mut reg = Fake::default();
        let mut c = RegionCache::new(true, 8);
        let a = c.acquire(&mut reg, 0, 0x1000, 100_000).unwrap();
        c.window(a).unwrap().write(5, b"abc").unwrap();
        let id = c.window(a).unwrap().region_id();
        c.release(&mut reg, a).unwrap();
        let b = c.acquire(&mut reg, 0, 0x1000, 100_000).unwrap();
        assert_eq!(c.window(b).unwrap().region_id(), id);
        let mut got = [0u8; 3];
        c.window(b).unwrap().read(5, &mut got).unwrap();
        assert_eq!(&got, b"abc");
        c.release(&mut reg, b).unwrap();
        assert_eq!((reg.registered, reg.deregistered), (1, 0));
        assert_eq!((c.stats().hits, c.stats().misses), (1, 1));
        // Another length, endpoint or address is another window.
        for (ep, addr, len) in [
            (0, 0x1000, 99_999),
            (1, 0x1000, 100_000),
            (0, 0x2000, 100_000),
        ] {
            let l = c.acquire(&mut reg, ep, addr, len).unwrap();
            c.release(&mut reg, l).unwrap();
        }
        assert_eq!(reg.registered, 4);
    }

    #[test]
    fn without_the_cache_every_message_registers() {
        let mut reg = Fake::default();
        let mut c = RegionCache::new(false, 8);
        for _ in 0..3 {
            let l = c.acquire(&mut reg, 0, 0x1000, 5000).unwrap();
            assert!(c.window(l).is_some());
            c.release(&mut reg, l).unwrap();
            assert!(c.window(l).is_none());
        }
        assert_eq!((reg.registered, reg.deregistered, reg.live), (3, 3, 0));
        assert_eq!(c.stats().hits, 0);
        assert!(c.is_empty());
    }

    #[test]
    fn without_the_cache_a_window_in_use_serves_the_same_buffer_until_its_last_user() {
        let mut reg = Fake::default();
        let mut c = RegionCache::new(false, 8);
        let a = c.acquire(&mut reg, 0, 0x1000, 5000).unwrap();
        c.window(a).unwrap().write(0, b"sent").unwrap();
        // A second message of the same buffer while the first holds its window: shared,
        // its bytes already there.
        let b = c.acquire(&mut reg, 0, 0x1000, 5000).unwrap();
        assert_eq!(a, b);
        let mut seen = [0u8; 4];
        c.window(b).unwrap().read(0, &mut seen).unwrap();
        assert_eq!(&seen, b"sent");
        // Another length, another endpoint: windows of their own.
        let other_len = c.acquire(&mut reg, 0, 0x1000, 4000).unwrap();
        let other_ep = c.acquire(&mut reg, 1, 0x1000, 5000).unwrap();
        assert_ne!(other_len, a);
        assert_ne!(other_ep, a);
        assert_eq!(reg.registered, 3);
        assert_eq!(c.stats().hits, 1);
        c.release(&mut reg, a).unwrap();
        assert!(c.window(b).is_some(), "still held by the second message");
        c.release(&mut reg, b).unwrap();
        assert!(c.window(b).is_none(), "nothing kept past the last user");
        c.release(&mut reg, other_len).unwrap();
        c.release(&mut reg, other_ep).unwrap();
        assert_eq!((reg.deregistered, reg.live), (3, 0));
        // Once released, the same buffer registers again.
        let again = c.acquire(&mut reg, 0, 0x1000, 5000).unwrap();
        assert_ne!(again, a);
        assert_eq!(reg.registered, 4);
        c.release(&mut reg, again).unwrap();
        assert!(c.is_empty());
    }

    #[test]
    fn without_the_cache_an_invalidated_window_in_use_is_not_shared() {
        let mut reg = Fake::default();
        let mut c = RegionCache::new(false, 8);
        let a = c.acquire(&mut reg, 0, 0x1000, 0x1000).unwrap();
        assert_eq!(c.invalidate(&mut reg, 0x1000, 0x1000).unwrap(), 1);
        let b = c.acquire(&mut reg, 0, 0x1000, 0x1000).unwrap();
        assert_ne!(a, b, "a remapped buffer never inherits the old window");
        c.release(&mut reg, a).unwrap();
        c.release(&mut reg, b).unwrap();
        assert_eq!((reg.registered, reg.deregistered, reg.live), (2, 2, 0));
    }

    #[test]
    fn concurrent_users_of_one_buffer_share_a_window() {
        let mut reg = Fake::default();
        let mut c = RegionCache::new(true, 8);
        let a = c.acquire(&mut reg, 0, 0x1000, 5000).unwrap();
        let b = c.acquire(&mut reg, 0, 0x1000, 5000).unwrap();
        assert_eq!(a, b);
        assert_eq!(reg.registered, 1);
        c.release(&mut reg, a).unwrap();
        c.release(&mut reg, b).unwrap();
        assert_eq!(reg.live, 1);
    }

    #[test]
    fn invalidation_drops_overlapping_windows_and_defers_busy_ones() {
        let mut reg = Fake::default();
        let mut c = RegionCache::new(true, 8);
        let a = c.acquire(&mut reg, 0, 0x1000, 0x1000).unwrap();
        c.release(&mut reg, a).unwrap();
        let busy = c.acquire(&mut reg, 0, 0x3000, 0x1000).unwrap();
        let far = c.acquire(&mut reg, 0, 0x9000, 0x1000).unwrap();
        c.release(&mut reg, far).unwrap();
        // [0x1800, 0x3800) touches the first two, not the third.
        assert_eq!(c.invalidate(&mut reg, 0x1800, 0x2000).unwrap(), 2);
        assert_eq!(reg.deregistered, 1, "the unused one goes at once");
        assert!(
            c.window(busy).is_some(),
            "the busy one stays until released"
        );
        // A new message on the invalidated buffer does not get the stale window.
        let fresh = c.acquire(&mut reg, 0, 0x3000, 0x1000).unwrap();
        assert_ne!(fresh, busy);
        c.release(&mut reg, busy).unwrap();
        assert_eq!(reg.deregistered, 2);
        c.release(&mut reg, fresh).unwrap();
        // Adjacent ranges do not overlap.
        assert_eq!(c.invalidate(&mut reg, 0x8000, 0x1000).unwrap(), 0);
        assert_eq!(c.invalidate(&mut reg, 0xa000, 0x1000).unwrap(), 0);
        assert_eq!(c.flush(&mut reg).unwrap(), 2);
        assert_eq!(reg.live, 0);
        assert_eq!(c.stats().invalidations, 4);
    }

    #[test]
    fn buffers_used_in_turn_stay_cached_until_the_guest_is_short_of_grants() {
        let mut reg = Fake::default();
        let mut c = RegionCache::new(true, 32);
        let big = 16 << 20;
        let bufs = [0x1000_0000, 0x2000_0000, 0x3000_0000, 0x4000_0000];
        // A stream with four receives posted, each into its own buffer, one pulled at a
        // time: after the first round every window is a hit.
        for round in 0..3 {
            for &addr in &bufs {
                let l = c.acquire(&mut reg, 0, addr, big).unwrap();
                c.release(&mut reg, l).unwrap();
            }
            assert_eq!(c.stats().registrations, 4, "round {round}");
        }
        assert_eq!((c.stats().hits, c.stats().evictions), (8, 0));
        // Short of grants: what nothing uses goes, what is in use stays cached.
        let busy = c.acquire(&mut reg, 0, bufs[1], big).unwrap();
        assert_eq!(c.drop_unused(&mut reg).unwrap(), 3);
        assert_eq!(reg.live, 1);
        assert!(c.window(busy).is_some());
        c.release(&mut reg, busy).unwrap();
        let again = c.acquire(&mut reg, 0, bufs[1], big).unwrap();
        assert_eq!((c.stats().hits, c.stats().registrations), (10, 4));
        c.release(&mut reg, again).unwrap();
        assert_eq!(c.drop_unused(&mut reg).unwrap(), 1);
        assert!(c.is_empty());
    }

    #[test]
    fn unused_windows_expire() {
        let mut reg = Fake::default();
        let mut c = RegionCache::new(true, 32);
        let big = 16 << 20;
        let a = c.acquire(&mut reg, 0, 0x1000_0000, big).unwrap();
        let b = c.acquire(&mut reg, 0, 0x2000_0000, big).unwrap();
        let d = c.acquire(&mut reg, 0, 0x3000_0000, big).unwrap();
        c.release(&mut reg, a).unwrap();
        c.release(&mut reg, b).unwrap();
        c.release(&mut reg, d).unwrap();
        assert_eq!(reg.live, 3, "all kept");
        assert!(c.next_expiry().is_some());
        // A hit makes a window used again: it does not expire while in use.
        let b2 = c.acquire(&mut reg, 0, 0x2000_0000, big).unwrap();
        let later = Instant::now() + IDLE_FOR_MAX;
        assert_eq!(
            c.expire_idle(&mut reg, later).unwrap(),
            2,
            "a and d were unused"
        );
        assert_eq!(reg.live, 1);
        c.release(&mut reg, b2).unwrap();
        assert_eq!(
            c.expire_idle(&mut reg, Instant::now()).unwrap(),
            0,
            "not yet"
        );
        let due = c.next_expiry().unwrap();
        assert_eq!(c.expire_idle(&mut reg, due).unwrap(), 1);
        assert_eq!((reg.live, c.next_expiry()), (0, None));
        assert!(c.is_empty());
    }

    #[test]
    fn capacity_evicts_the_least_recently_used_unused_window() {
        let mut reg = Fake::default();
        let mut c = RegionCache::new(true, 2);
        let a = c.acquire(&mut reg, 0, 0x1000, 10).unwrap();
        c.release(&mut reg, a).unwrap();
        let b = c.acquire(&mut reg, 0, 0x2000, 10).unwrap();
        c.release(&mut reg, b).unwrap();
        // Touch a, so b is the least recently used.
        let a2 = c.acquire(&mut reg, 0, 0x1000, 10).unwrap();
        c.release(&mut reg, a2).unwrap();
        let d = c.acquire(&mut reg, 0, 0x3000, 10).unwrap();
        assert_eq!(c.stats().evictions, 1);
        assert_eq!(c.len(), 2);
        c.release(&mut reg, d).unwrap();
        let a3 = c.acquire(&mut reg, 0, 0x1000, 10).unwrap();
        assert_eq!(a3, a, "a survived");
        c.release(&mut reg, a3).unwrap();
        // With every window busy the cache grows instead of failing.
        let x = c.acquire(&mut reg, 0, 0x1000, 10).unwrap();
        let y = c.acquire(&mut reg, 0, 0x3000, 10).unwrap();
        let z = c.acquire(&mut reg, 0, 0x4000, 10).unwrap();
        assert_eq!(c.len(), 3);
        for l in [x, y, z] {
            c.release(&mut reg, l).unwrap();
        }
    }

    #[test]
    fn a_failed_registration_leaves_the_cache_unchanged() {
        let mut reg = Fake::default();
        let mut c = RegionCache::new(true, 4);
        reg.fail_next = true;
        assert!(c.acquire(&mut reg, 0, 0x1000, 10).is_err());
        assert!(c.is_empty());
        assert!(c.acquire(&mut reg, 0, 0x1000, usize::MAX).is_err());
        let l = c.acquire(&mut reg, 0, 0x1000, 10).unwrap();
        assert_eq!(c.forget_endpoint(0), 1);
        assert!(c.window(l).is_none());
        c.release(&mut reg, l).unwrap();
        assert_eq!(
            reg.deregistered, 0,
            "forgotten windows are not deregistered"
        );
    }
}

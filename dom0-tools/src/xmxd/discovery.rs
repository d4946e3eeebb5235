//! Who runs which guests across the fabric, learnt from the other hosts' announcements.
//!
//! Sans-IO: `Discovery` takes frames and time and hands back frames to send. Each host
//! broadcasts its guest list (`announce`) every `interval` and at once
//! when the list changes; a newly started host solicits the others so it learns the
//! fabric within one round trip. What a host announced is soft state: it is forgotten
//! `ttl` after the last message heard from that host, so a host that dies leaves the
//! fabric's tables without anyone telling.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use xmx_wire::mxoe::Mac;

use super::announce::{self, AnnounceKind, EntryRepr, MessageRepr};

/// Timers of discovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiscoveryConfig {
    /// Time between two announcements of an unchanged list.
    pub interval: Duration,
    /// How long others keep our list without news from us (sent in every message).
    pub ttl: Duration,
}

/// Shortest silence after which a host's guests are forgotten, however often it
/// announces. The interval says how fast news spreads, not how long a host may be silent
/// for reasons of its own: a link flap, an xmxd restart. Forgetting a host's guests drops
/// the traffic to them, so a host that announces often must not lose its peers over a
/// flap of a few seconds. Open-MX never forgets a peer; the default interval (2 s) gives
/// this value too, so only short intervals are affected.
pub(crate) const MIN_TTL: Duration = Duration::from_secs(8);

impl DiscoveryConfig {
    /// Announce every `interval`, be forgotten after four silent intervals, and never
    /// after less than `MIN_TTL`, 8 s.
    pub fn every(interval: Duration) -> Self {
        DiscoveryConfig {
            interval,
            ttl: interval.saturating_mul(4).max(MIN_TTL),
        }
    }
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig::every(Duration::from_secs(2))
    }
}

/// Shortest time between two periodic announcements, whatever the configuration says.
const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// Most remote hosts remembered: a fabric of this many hosts is far beyond what one
/// Ethernet segment carries, and the bound keeps a stream of forged sources from growing
/// the map without end.
pub(crate) const MAX_HOSTS: usize = 4096;

/// What one remote host announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RemoteHost {
    /// Its name.
    pub(crate) name: String,
    /// Its guests, from its last complete generation.
    pub(crate) entries: Vec<EntryRepr>,
    generation: Option<u32>,
    expires: Instant,
    partial: Option<Partial>,
}

/// Fragments of a generation still being received.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Partial {
    generation: u32,
    fragments: Vec<Option<Vec<EntryRepr>>>,
}

/// The discovery state of one host.
#[derive(Debug)]
pub(crate) struct Discovery {
    me: Mac,
    host_name: String,
    cfg: DiscoveryConfig,
    generation: u32,
    local: Vec<EntryRepr>,
    hosts: BTreeMap<Mac, RemoteHost>,
    next_announce: Instant,
    /// When a solicitation was last answered: answers are rate-limited, so a flood of
    /// solicitations cannot make us flood the segment.
    answered_at: Option<Instant>,
    out: VecDeque<Vec<u8>>,
    /// Frames not understood (not ours, malformed), for the counters.
    pub(crate) rejected: u64,
}

impl Discovery {
    /// A host whose NIC is `me`. `generation` seeds the list's generation: give a value
    /// that differs between runs (a restarted host must not look unchanged). The first
    /// messages (a solicitation and an announcement) are queued at once.
    pub(crate) fn new(
        me: Mac,
        host_name: &str,
        cfg: DiscoveryConfig,
        generation: u32,
        now: Instant,
    ) -> Discovery {
        let mut d = Discovery {
            me,
            host_name: host_name.to_owned(),
            cfg,
            generation,
            local: Vec::new(),
            hosts: BTreeMap::new(),
            next_announce: now,
            answered_at: None,
            out: VecDeque::new(),
            rejected: 0,
        };
        d.queue(
            Mac::BROADCAST,
            &announce::solicitation(&d.host_name, d.ttl_ms()),
        );
        d
    }

    /// This host's NIC address, its identity on the fabric.
    pub(crate) fn me(&self) -> Mac {
        self.me
    }

    fn ttl_ms(&self) -> u32 {
        u32::try_from(self.cfg.ttl.as_millis()).unwrap_or(u32::MAX)
    }

    fn queue(&mut self, dst: Mac, msg: &MessageRepr) {
        match announce::frame(self.me, dst, msg) {
            Ok(f) => self.out.push_back(f),
            Err(e) => tracing::error!(error = %e, "discovery message not sent"),
        }
    }

    fn announce_now(&mut self, now: Instant) {
        match announce::announcements(&self.host_name, self.generation, self.ttl_ms(), &self.local)
        {
            Ok(msgs) => {
                for m in &msgs {
                    self.queue(Mac::BROADCAST, m);
                }
            }
            Err(e) => tracing::error!(error = %e, "guest list cannot be announced"),
        }
        self.next_announce = now + self.cfg.interval.max(MIN_INTERVAL);
    }

    /// Ask the others for their lists and announce ours now, as a starting host does:
    /// after a link failure, each side may have missed the other's news.
    pub(crate) fn reannounce(&mut self, now: Instant) {
        self.queue(
            Mac::BROADCAST,
            &announce::solicitation(&self.host_name, self.ttl_ms()),
        );
        self.announce_now(now);
    }

    /// Replace this host's guest list; a changed list is announced at once.
    pub(crate) fn set_local(&mut self, entries: Vec<EntryRepr>, now: Instant) {
        if entries == self.local {
            return;
        }
        self.local = entries;
        self.generation = self.generation.wrapping_add(1);
        self.announce_now(now);
    }

    /// Take in a frame from the fabric; true if a host's list changed.
    pub(crate) fn handle_frame(&mut self, now: Instant, frame: &[u8]) -> bool {
        let (src, msg) = match announce::parse_frame(frame) {
            Ok(v) => v,
            Err(e) => {
                self.rejected += 1;
                tracing::trace!(error = %e, "not a discovery frame");
                return false;
            }
        };
        if src == self.me || !src.is_unicast() {
            return false;
        }
        if !self.hosts.contains_key(&src) && self.hosts.len() >= MAX_HOSTS {
            self.rejected += 1;
            tracing::debug!(%src, "too many hosts; announcement ignored");
            return false;
        }
        let ttl = Duration::from_millis(u64::from(msg.ttl_ms));
        match msg.kind {
            AnnounceKind::Solicit => {
                // The newcomer needs our list now, not in an interval; at most a few
                // times per interval, whoever asks.
                let quiet = self.cfg.interval / 4;
                let due = match self.answered_at {
                    Some(at) => now.saturating_duration_since(at) >= quiet,
                    None => true,
                };
                if due {
                    self.answered_at = Some(now);
                    self.announce_now(now);
                }
                let known = self.hosts.entry(src).or_insert_with(|| RemoteHost {
                    name: msg.host_name.clone(),
                    entries: Vec::new(),
                    generation: None,
                    expires: now + ttl,
                    partial: None,
                });
                known.expires = now + ttl;
                false
            }
            AnnounceKind::Announce => self.take_announcement(now, src, msg, ttl),
        }
    }

    fn take_announcement(
        &mut self,
        now: Instant,
        src: Mac,
        msg: MessageRepr,
        ttl: Duration,
    ) -> bool {
        let host = self.hosts.entry(src).or_insert_with(|| RemoteHost {
            name: msg.host_name.clone(),
            entries: Vec::new(),
            generation: None,
            expires: now + ttl,
            partial: None,
        });
        host.expires = now + ttl;
        let renamed = host.name != msg.host_name;
        host.name = msg.host_name.clone();
        if host.generation == Some(msg.generation) {
            return renamed;
        }
        let fragments = usize::from(msg.fragments);
        let partial = match &mut host.partial {
            Some(p) if p.generation == msg.generation && p.fragments.len() == fragments => p,
            slot => slot.insert(Partial {
                generation: msg.generation,
                fragments: vec![None; fragments],
            }),
        };
        if let Some(slot) = partial.fragments.get_mut(usize::from(msg.fragment)) {
            *slot = Some(msg.entries);
        }
        if partial.fragments.iter().all(Option::is_some) {
            let entries: Vec<EntryRepr> = partial.fragments.drain(..).flatten().flatten().collect();
            host.partial = None;
            host.generation = Some(msg.generation);
            let changed = host.entries != entries || renamed;
            host.entries = entries;
            return changed;
        }
        renamed
    }

    /// Let time pass: announce when due, forget silent hosts. True if a host was forgotten.
    pub(crate) fn handle_timeout(&mut self, now: Instant) -> bool {
        if now >= self.next_announce {
            self.announce_now(now);
        }
        let mut forgotten = false;
        self.hosts.retain(|mac, h| {
            let keep = h.expires > now;
            if !keep {
                tracing::info!(host = %h.name, %mac, "host silent for its TTL; its guests are forgotten");
                forgotten = true;
            }
            keep
        });
        forgotten
    }

    /// When [`Discovery::handle_timeout`] should run next.
    pub(crate) fn poll_timeout(&self) -> Instant {
        self.hosts
            .values()
            .map(|h| h.expires)
            .fold(self.next_announce, Instant::min)
    }

    /// The next frame to put on the fabric.
    pub(crate) fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.out.pop_front()
    }

    /// Remote hosts with at least one complete generation, by NIC address.
    pub(crate) fn hosts(&self) -> impl Iterator<Item = (Mac, &RemoteHost)> {
        self.hosts
            .iter()
            .filter(|(_, h)| h.generation.is_some())
            .map(|(m, h)| (*m, h))
    }

    /// Every remote host heard of, complete or not.
    pub(crate) fn known_hosts(&self) -> usize {
        self.hosts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xmxd::names;

    const A: Mac = Mac([2, 0, 0, 0, 0, 0xa]);
    const B: Mac = Mac([2, 0, 0, 0, 0, 0xb]);

    fn entry(guest: &str, index: Option<u16>) -> EntryRepr {
        EntryRepr {
            index,
            since: 100,
            mac: names::guest_mac(guest),
            cluster: 0,
            cluster_name: "default".into(),
            guest: guest.into(),
        }
    }

    fn drain(d: &mut Discovery) -> Vec<Vec<u8>> {
        std::iter::from_fn(|| d.poll_transmit()).collect()
    }

    fn kinds(frames: &[Vec<u8>]) -> Vec<AnnounceKind> {
        frames
            .iter()
            .map(|f| announce::parse_frame(f).unwrap().1.kind)
            .collect()
    }

    #[test]
    fn a_new_host_solicits_and_learns_from_the_answer() {
        let t0 = Instant::now();
        let cfg = DiscoveryConfig::every(Duration::from_secs(1));
        let mut a = Discovery::new(A, "ha", cfg, 10, t0);
        let mut b = Discovery::new(B, "hb", cfg, 20, t0);
        b.set_local(vec![entry("b1", Some(0))], t0);
        drain(&mut b);
        let from_a = drain(&mut a);
        assert_eq!(kinds(&from_a), [AnnounceKind::Solicit]);
        for f in &from_a {
            assert!(!b.handle_frame(t0, f), "a solicitation changes no list");
        }
        // B answers at once with its list.
        let from_b = drain(&mut b);
        assert_eq!(kinds(&from_b), [AnnounceKind::Announce]);
        assert!(a.handle_frame(t0, &from_b[0]));
        let hosts: Vec<_> = a.hosts().collect();
        assert_eq!(hosts.len(), 1);
        assert_eq!(hosts[0].0, B);
        assert_eq!(hosts[0].1.name, "hb");
        assert_eq!(hosts[0].1.entries, [entry("b1", Some(0))]);
        // The same generation again changes nothing.
        assert!(!a.handle_frame(t0, &from_b[0]));
        // Our own frames coming back are ignored.
        let mine = drain(&mut b);
        assert!(mine.is_empty());
        b.set_local(vec![], t0);
        let own = drain(&mut b);
        assert!(!b.handle_frame(t0, &own[0]));
    }

    #[test]
    fn a_change_is_announced_at_once_and_replaces_the_list() {
        let t0 = Instant::now();
        let cfg = DiscoveryConfig::every(Duration::from_secs(1));
        let mut a = Discovery::new(A, "ha", cfg, 1, t0);
        let mut b = Discovery::new(B, "hb", cfg, 1, t0);
        drain(&mut b);
        b.set_local(vec![entry("b1", None)], t0);
        for f in drain(&mut b) {
            a.handle_frame(t0, &f);
        }
        b.set_local(vec![entry("b1", Some(3)), entry("b2", None)], t0);
        // Unchanged lists are not re-sent before the interval.
        b.set_local(vec![entry("b1", Some(3)), entry("b2", None)], t0);
        let frames = drain(&mut b);
        assert_eq!(frames.len(), 1);
        assert!(a.handle_frame(t0, &frames[0]));
        assert_eq!(a.hosts().next().unwrap().1.entries.len(), 2);
    }

    #[test]
    fn a_fragmented_list_counts_only_when_complete() {
        let t0 = Instant::now();
        let cfg = DiscoveryConfig::every(Duration::from_secs(1));
        let mut a = Discovery::new(A, "ha", cfg, 1, t0);
        let mut b = Discovery::new(B, "hb", cfg, 1, t0);
        drain(&mut b);
        let many: Vec<EntryRepr> = (0..60)
            .map(|i| entry(&format!("{}{i}", "x".repeat(60)), Some(i)))
            .collect();
        b.set_local(many.clone(), t0);
        let frames = drain(&mut b);
        assert!(frames.len() >= 3, "{}", frames.len());
        // Delivered out of order, with a duplicate; complete only with the last one.
        let (last, rest) = frames.split_last().unwrap();
        for f in rest.iter().rev().chain(rest.first()) {
            assert!(!a.handle_frame(t0, f));
            assert_eq!(a.hosts().count(), 0);
        }
        assert!(a.handle_frame(t0, last));
        assert_eq!(a.hosts().next().unwrap().1.entries, many);
    }

    #[test]
    fn silent_hosts_are_forgotten_after_their_ttl_and_we_announce_every_interval() {
        let t0 = Instant::now();
        let cfg = DiscoveryConfig::every(Duration::from_secs(1));
        let mut a = Discovery::new(A, "ha", cfg, 1, t0);
        let mut b = Discovery::new(B, "hb", cfg, 1, t0);
        b.set_local(vec![entry("b1", Some(0))], t0);
        for f in drain(&mut b) {
            a.handle_frame(t0, &f);
        }
        drain(&mut a);
        assert_eq!(a.hosts().count(), 1);
        assert_eq!(a.poll_timeout(), t0 + Duration::from_secs(1));
        assert!(!a.handle_timeout(t0 + Duration::from_secs(1)));
        assert_eq!(kinds(&drain(&mut a)), [AnnounceKind::Announce]);
        assert!(!a.handle_timeout(t0 + MIN_TTL - Duration::from_millis(1)));
        assert!(a.handle_timeout(t0 + MIN_TTL));
        assert_eq!(a.hosts().count(), 0);
    }

    #[test]
    fn a_host_that_announces_often_survives_a_flap_of_seconds() {
        let t0 = Instant::now();
        let interval = Duration::from_millis(200);
        let cfg = DiscoveryConfig::every(interval);
        assert_eq!(cfg.ttl, MIN_TTL);
        let mut a = Discovery::new(A, "ha", cfg, 1, t0);
        let mut b = Discovery::new(B, "hb", cfg, 1, t0);
        b.set_local(vec![entry("b1", Some(0))], t0);
        for f in drain(&mut b) {
            a.handle_frame(t0, &f);
        }
        // B's link is down for 2 s: A hears nothing and keeps ticking.
        let mut t = t0;
        while t < t0 + Duration::from_secs(2) {
            t += interval;
            assert!(!a.handle_timeout(t), "forgotten at {:?}", t - t0);
            drain(&mut a);
        }
        assert_eq!(a.hosts().count(), 1);
        // Back: B re-announces and is kept from then on.
        b.reannounce(t);
        let frames = drain(&mut b);
        assert_eq!(
            kinds(&frames),
            [AnnounceKind::Solicit, AnnounceKind::Announce]
        );
        for f in frames {
            a.handle_frame(t, &f);
        }
        assert!(!a.handle_timeout(t + MIN_TTL - Duration::from_millis(1)));
        assert_eq!(a.hosts().next().unwrap().1.entries[0].guest, "b1");
    }

    #[test]
    fn solicitations_are_answered_a_few_times_per_interval_at_most() {
        let t0 = Instant::now();
        let cfg = DiscoveryConfig::every(Duration::from_secs(1));
        let mut a = Discovery::new(A, "ha", cfg, 1, t0);
        let mut b = Discovery::new(B, "hb", cfg, 1, t0);
        drain(&mut a);
        let solicit = drain(&mut b).remove(0);
        for _ in 0..100 {
            a.handle_frame(t0, &solicit);
        }
        assert_eq!(kinds(&drain(&mut a)), [AnnounceKind::Announce]);
        a.handle_frame(t0 + Duration::from_millis(250), &solicit);
        assert_eq!(kinds(&drain(&mut a)), [AnnounceKind::Announce]);
    }

    #[test]
    fn the_number_of_remote_hosts_is_bounded() {
        let t0 = Instant::now();
        let cfg = DiscoveryConfig::every(Duration::from_secs(1));
        let mut a = Discovery::new(A, "ha", cfg, 1, t0);
        for i in 0..MAX_HOSTS + 10 {
            let src = Mac([2, 0xff, 0, 0, (i >> 8) as u8, i as u8]);
            let mut other = Discovery::new(src, "x", cfg, 1, t0);
            other.set_local(vec![entry("g", None)], t0);
            let frames = drain(&mut other);
            a.handle_frame(t0, frames.last().unwrap());
        }
        assert_eq!(a.known_hosts(), MAX_HOSTS);
        assert_eq!(a.rejected, 10);
    }

    #[test]
    fn garbage_is_counted_not_trusted() {
        let t0 = Instant::now();
        let mut a = Discovery::new(A, "ha", DiscoveryConfig::default(), 1, t0);
        assert!(!a.handle_frame(t0, &[0u8; 10]));
        assert!(!a.handle_frame(t0, &[0xffu8; 100]));
        assert_eq!(a.rejected, 2);
        assert_eq!(a.known_hosts(), 0);
    }
}

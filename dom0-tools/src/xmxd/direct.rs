//! The broker of direct channels between co-located guests (see
//! [`xmx_wire::direct`] for the nodes).
//!
//! Two guests of this host that are attached in the same virtual cluster are
//! offered a channel: xmxd creates their pair directory, readable and
//! writable by the two of them only, and lists each in the other's offers.
//! Everything else (granting, mapping, the event channel) is the guests'
//! business inside that directory. Isolation stays dom0's: when the pair no
//! longer qualifies (a cluster move, a detach, a destroy, hence a migration
//! away) or the administrator turns channels off, xmxd removes the offers and
//! the pair directory, and both libraries fall back to the backend path.
//!
//! A guest whose frontend closes its device (a suspend, a shutdown, or its
//! daemon following a backend restart) loses its pairs at once: its peers go
//! back to the backend path rather than write into a channel nobody reads, and
//! the pairs are offered again when it connects (a resume on this host). On
//! real Xen the guest's kernel freezes its processes for a suspend before its
//! daemon can close anything, so there the toolstack's mark is what ends the
//! channels in time: a guest about to migrate is marked leaving before it is
//! suspended (`direct-leaving`, which `xmx-hook migrate` sends), and its pairs
//! are revoked while it still runs, so its peers fall back to the backend with
//! nothing left in a channel whose other end is about to freeze and go. Its
//! library ends its channels on the new host anyway (see libmx's direct
//! module), and a pair is revoked when a domain is destroyed, so a migration
//! that did not mark it stays correct.
//!
//! A guest can close and reopen its device as often as it likes, and each
//! reopening would cost its peers a channel's set-up and their traffic a
//! fall-back. A guest that reopens again within [`FLAP_WINDOW`] of its last
//! reopening is held down: offered nothing for a second, then twice as long at
//! each further quick reopening, up to [`HOLD_MAX`]. A suspend and resume, or
//! a backend restart, reopen once and are offered again at once.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use xmx_backend::xenbus::toolstack::in_transaction;
use xmx_hv::{DomId, Result, Xenstore, XsAccess, XsPerm};
use xmx_wire::direct;
use xmx_wire::mxoe::Mac;

use super::xsnodes;

/// A reopening this soon after the last one counts as flapping.
pub(crate) const FLAP_WINDOW: Duration = Duration::from_secs(10);
/// The first hold-down of a flapping guest; each further one doubles.
const HOLD_FIRST: Duration = Duration::from_secs(1);
/// The longest hold-down.
pub(crate) const HOLD_MAX: Duration = Duration::from_secs(32);

/// How often a guest reopened its device lately.
#[derive(Debug, Clone, Copy)]
struct Reopenings {
    /// Quick reopenings in a row (0: the last one was not quick).
    quick: u32,
    /// The last one.
    last: Instant,
    /// Offered nothing before this.
    held_until: Instant,
}

/// A guest that may take part in a channel: its domain, MAC and cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Member {
    /// The guest's domain on this host.
    pub(crate) domid: DomId,
    /// Its board MAC.
    pub(crate) mac: Mac,
    /// Its cluster's id.
    pub(crate) cluster: u32,
}

/// The pairs offered now.
#[derive(Debug)]
pub(crate) struct Broker {
    toolstack: DomId,
    enabled: bool,
    published: BTreeMap<(DomId, DomId), (Mac, Mac)>,
    offer_dirs: BTreeSet<DomId>,
    /// Domains about to migrate away: offered nothing.
    leaving: BTreeSet<DomId>,
    /// Domains that reopened their device, for the hold-down.
    reopened: BTreeMap<DomId, Reopenings>,
    /// When the next hold-down ends.
    next_release: Option<Instant>,
}

/// The pairs `members` qualify for: same cluster, different domains.
pub(crate) fn pairs(members: &[Member]) -> BTreeMap<(DomId, DomId), (Mac, Mac)> {
    let mut out = BTreeMap::new();
    for a in members {
        for b in members {
            if a.domid < b.domid && a.cluster == b.cluster && a.mac != b.mac {
                out.insert((a.domid, b.domid), (a.mac, b.mac));
            }
        }
    }
    out
}

/// The pairs `members` qualify for, leaving out the domains in `out` (leaving the host, or
/// held down).
fn pairs_staying(
    members: &[Member],
    out: &BTreeSet<DomId>,
) -> BTreeMap<(DomId, DomId), (Mac, Mac)> {
    let staying: Vec<Member> = members
        .iter()
        .filter(|m| !out.contains(&m.domid))
        .copied()
        .collect();
    pairs(&staying)
}

impl Broker {
    /// Starts from nothing: what an earlier run of xmxd offered is revoked
    /// (the guests fall back, and get a new offer at the first sync).
    pub(crate) fn new(xs: &dyn Xenstore, toolstack: DomId) -> Result<Broker> {
        xsnodes::remove_node(xs, &direct::root(toolstack))?;
        in_transaction(xs, |tx| {
            xs.mkdir(tx, &direct::root(toolstack))?;
            xs.mkdir(tx, &format!("{}/offers", direct::root(toolstack)))
        })?;
        Ok(Broker {
            toolstack,
            enabled: true,
            published: BTreeMap::new(),
            offer_dirs: BTreeSet::new(),
            leaving: BTreeSet::new(),
            reopened: BTreeMap::new(),
            next_release: None,
        })
    }

    /// Whether channels are offered at all.
    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// Turns offering on or off (off revokes every channel at the next sync).
    pub(crate) fn set_enabled(&mut self, on: bool) {
        self.enabled = on;
    }

    /// Marks `domid` as about to leave this host (or not): a leaving domain is offered
    /// no channel, and loses those it has at the next sync.
    pub(crate) fn set_leaving(&mut self, domid: DomId, leaving: bool) {
        if leaving {
            self.leaving.insert(domid);
        } else {
            self.leaving.remove(&domid);
        }
    }

    /// Forgets the leaving marks and reopenings of domains `present` denies (gone from
    /// this host): a later domain with the same domid starts unmarked.
    pub(crate) fn forget_gone(&mut self, present: impl Fn(DomId) -> bool) {
        self.leaving.retain(|&d| present(d));
        self.reopened.retain(|&d, _| present(d));
    }

    /// `domid`'s frontend opened its device again at `now` after closing it: held down
    /// if it did so quickly again (see the module documentation).
    pub(crate) fn reopened(&mut self, domid: DomId, now: Instant) {
        let quick = match self.reopened.get(&domid) {
            Some(r) if now.saturating_duration_since(r.last) < FLAP_WINDOW => r.quick + 1,
            _ => 0,
        };
        let hold = match quick {
            0 => Duration::ZERO,
            n => HOLD_FIRST
                .saturating_mul(1 << (n - 1).min(16))
                .min(HOLD_MAX),
        };
        if !hold.is_zero() {
            tracing::warn!(
                domid,
                reopenings = quick + 1,
                hold_s = hold.as_secs(),
                "a guest reopens its device over and over: its direct channels are held down"
            );
        }
        self.reopened.insert(
            domid,
            Reopenings {
                quick,
                last: now,
                held_until: now + hold,
            },
        );
    }

    /// When the next hold-down ends, as of the last sync: sync again then.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.next_release
    }

    fn held(&self, now: Instant) -> BTreeSet<DomId> {
        self.reopened
            .iter()
            .filter(|(_, r)| r.held_until > now)
            .map(|(&d, _)| d)
            .collect()
    }

    /// The pairs offered now.
    pub(crate) fn offered(&self) -> Vec<(DomId, DomId)> {
        self.published.keys().copied().collect()
    }

    /// Makes xenstore offer exactly the pairs `members` qualify for at `now`.
    pub(crate) fn sync(&mut self, xs: &dyn Xenstore, members: &[Member], now: Instant) {
        let wanted = if self.enabled {
            let mut out: BTreeSet<DomId> = self.held(now);
            self.next_release = self
                .reopened
                .values()
                .map(|r| r.held_until)
                .filter(|&t| t > now)
                .min();
            out.extend(&self.leaving);
            pairs_staying(members, &out)
        } else {
            BTreeMap::new()
        };
        let gone: Vec<(DomId, DomId)> = self
            .published
            .iter()
            .filter(|(k, v)| wanted.get(k) != Some(v))
            .map(|(k, _)| *k)
            .collect();
        for (lo, hi) in gone {
            if let Err(e) = self.revoke(xs, lo, hi) {
                tracing::warn!(lo, hi, error = %e, "revoking a direct channel");
            }
            self.published.remove(&(lo, hi));
        }
        for (&(lo, hi), &(lo_mac, hi_mac)) in &wanted {
            if self.published.contains_key(&(lo, hi)) {
                continue;
            }
            match self.offer(xs, (lo, lo_mac), (hi, hi_mac)) {
                Ok(()) => {
                    tracing::info!(lo, hi, "direct channel offered");
                    self.published.insert((lo, hi), (lo_mac, hi_mac));
                }
                Err(e) => tracing::warn!(lo, hi, error = %e, "offering a direct channel"),
            }
        }
        // The offer directories of domains left without any pair go too.
        let in_use: BTreeSet<DomId> = self.published.keys().flat_map(|&(a, b)| [a, b]).collect();
        let idle: Vec<DomId> = self.offer_dirs.difference(&in_use).copied().collect();
        for d in idle {
            match xsnodes::remove_node(xs, &direct::offers_dir(self.toolstack, d)) {
                Ok(()) => {
                    self.offer_dirs.remove(&d);
                }
                Err(e) => tracing::warn!(domid = d, error = %e, "removing direct offers"),
            }
        }
    }

    fn offer(&mut self, xs: &dyn Xenstore, lo: (DomId, Mac), hi: (DomId, Mac)) -> Result<()> {
        let ts = self.toolstack;
        let perm = |domid, access| XsPerm { domid, access };
        in_transaction(xs, |tx| {
            let pair = direct::pair_dir(ts, lo.0, hi.0);
            if xs.read(tx, &pair).is_ok() {
                xs.rm(tx, &pair)?;
            }
            xs.mkdir(tx, &pair)?;
            xs.set_perms(
                tx,
                &pair,
                &[
                    perm(ts, XsAccess::None),
                    perm(lo.0, XsAccess::Both),
                    perm(hi.0, XsAccess::Both),
                ],
            )?;
            for (me, other) in [(lo, hi), (hi, lo)] {
                let dir = direct::offers_dir(ts, me.0);
                if xs.read(tx, &dir).is_err() {
                    xs.mkdir(tx, &dir)?;
                    xs.set_perms(
                        tx,
                        &dir,
                        &[perm(ts, XsAccess::None), perm(me.0, XsAccess::Read)],
                    )?;
                }
                xs.write(
                    tx,
                    &format!("{dir}/{}", other.0),
                    other.1.to_string().as_bytes(),
                )?;
            }
            Ok(())
        })?;
        self.offer_dirs.extend([lo.0, hi.0]);
        Ok(())
    }

    /// The offers go first, then the pair directory (and with it every
    /// channel's nodes): a guest that sees its offer gone stops using the
    /// channel before its nodes vanish.
    fn revoke(&mut self, xs: &dyn Xenstore, lo: DomId, hi: DomId) -> Result<()> {
        let ts = self.toolstack;
        for (me, other) in [(lo, hi), (hi, lo)] {
            xsnodes::remove_node(xs, &format!("{}/{other}", direct::offers_dir(ts, me)))?;
        }
        xsnodes::remove_node(xs, &direct::pair_dir(ts, lo, hi))?;
        tracing::info!(lo, hi, "direct channel revoked");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_guests_of_one_cluster_pair_up() {
        let m = |domid, last, cluster| Member {
            domid,
            mac: Mac([2, 0, 0, 0, 0, last]),
            cluster,
        };
        let p = pairs(&[m(3, 3, 1), m(1, 1, 1), m(2, 2, 2), m(4, 4, 2), m(5, 5, 1)]);
        let keys: Vec<_> = p.keys().copied().collect();
        assert_eq!(keys, vec![(1, 3), (1, 5), (2, 4), (3, 5)]);
        assert_eq!(
            p[&(1, 3)],
            (Mac([2, 0, 0, 0, 0, 1]), Mac([2, 0, 0, 0, 0, 3]))
        );
    }

    #[test]
    fn a_leaving_domain_is_in_no_pair() {
        let m = |domid, last| Member {
            domid,
            mac: Mac([2, 0, 0, 0, 0, last]),
            cluster: 1,
        };
        let members = [m(1, 1), m(2, 2), m(3, 3)];
        let leaving = BTreeSet::from([2]);
        let keys: Vec<_> = pairs_staying(&members, &leaving).into_keys().collect();
        assert_eq!(keys, vec![(1, 3)]);
        let none = BTreeSet::new();
        assert_eq!(pairs_staying(&members, &none).len(), 3);
    }

    /// A guest that closes and reopens its device over and over is offered nothing for a
    /// hold-down that doubles at each quick reopening; one reopening, or one long after
    /// the last, is offered again at once.
    #[test]
    fn a_guest_reopening_its_device_over_and_over_is_held_down() {
        let host = xmx_simkit::SimHost::start_with_hv_subdir("hv");
        let xs = host.xs0();
        let mut broker = Broker::new(xs.as_ref(), xmx_hv::DOM0).unwrap();
        let m = |domid, last| Member {
            domid,
            mac: Mac([2, 0, 0, 0, 0, last]),
            cluster: 1,
        };
        let members = [m(1, 1), m(2, 2)];
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_millis(s);
        let offered_at = |b: &mut Broker, t: Instant| {
            b.sync(xs.as_ref(), &members, t);
            !b.offered().is_empty()
        };
        assert!(offered_at(&mut broker, at(0)));
        // A resume: offered again at once.
        broker.reopened(2, at(100));
        assert!(offered_at(&mut broker, at(100)));
        assert_eq!(broker.poll_timeout(), None);
        // Again within the window: held for a second.
        broker.reopened(2, at(2_000));
        assert!(!offered_at(&mut broker, at(2_000)));
        assert_eq!(broker.poll_timeout(), Some(at(3_000)));
        assert!(!offered_at(&mut broker, at(2_999)));
        assert!(offered_at(&mut broker, at(3_000)));
        // Each quick reopening doubles the hold, up to the longest.
        let mut t = 3_000;
        for hold in [2_000, 4_000, 8_000, 16_000, 32_000, 32_000] {
            t += 500;
            broker.reopened(2, at(t));
            assert!(!offered_at(&mut broker, at(t + hold - 1)), "{hold}");
            assert!(offered_at(&mut broker, at(t + hold)), "{hold}");
        }
        // Quiet for longer than the window: the next reopening is offered at once.
        t += FLAP_WINDOW.as_millis() as u64 + 1;
        broker.reopened(2, at(t));
        assert!(offered_at(&mut broker, at(t)));
        // A destroyed guest's reopenings go with it: a domain given its id starts afresh.
        broker.forget_gone(|d| d != 2);
        assert!(broker.reopened.is_empty());
    }
}

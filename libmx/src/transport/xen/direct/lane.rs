//! One direction of a direct channel: a ring of variable-length records in
//! memory both guests map.
//!
//! The channel's memory is one control page and two data areas. Each lane
//! has three words in the control page: `prod` (written by its producer
//! only), `cons` (by its consumer only) and `wants` (the consumer sets it
//! before sleeping; the producer clears it when it signals). Indices are free
//! running byte counts; the data area's size is a power of two.
//!
//! A record is an 8-byte header (`len`, `kind`) and `len` bytes, padded to 8;
//! a record never wraps: a producer that does not find room before the end
//! writes a pad record and starts over at 0.
//!
//! The peer is hostile: each side keeps its own index privately and only
//! reads the other's, which it checks against the area's size; the consumer
//! copies a header out before checking it and copies the bytes out before
//! anyone decodes them (no double fetch). Whatever the peer writes, the
//! worst outcome is [`Broken`]: this channel is dropped, nothing else.

use std::sync::atomic::{fence, AtomicU32, Ordering};

use xmx_hv::PAGE_SIZE;
use xmx_wire::ring::copy_shared;

use super::codec::MAX_RECORD as MAX_FRAME;

/// Pages of one lane's data area.
pub(crate) const DATA_PAGES: usize = 128;
/// Bytes of one lane's data area.
pub(crate) const DATA_BYTES: usize = DATA_PAGES * PAGE_SIZE;
/// Pages of a whole channel: the control page and two data areas.
pub(crate) const CHANNEL_PAGES: usize = 1 + 2 * DATA_PAGES;

const HEADER: usize = 8;
const KIND_FRAME: u32 = 1;
const KIND_PAD: u32 = 2;

/// The peer broke the ring's rules: the channel must be dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Broken(pub(crate) &'static str);

/// Where a lane's words and data live in the channel.
#[derive(Clone, Copy, Debug)]
struct LaneLayout {
    prod: usize,
    cons: usize,
    wants: usize,
    /// Set by a producer that found the lane full and is going to sleep;
    /// the consumer clears it and signals once it has made room.
    space: usize,
    data: usize,
}

/// The layout of lane `lane` (0: creator to acceptor, 1: the other way).
fn at(lane: usize) -> LaneLayout {
    let words = 256 * lane;
    LaneLayout {
        prod: words,
        cons: words + 64,
        wants: words + 128,
        space: words + 192,
        data: PAGE_SIZE + lane * DATA_BYTES,
    }
}

fn padded(len: usize) -> usize {
    HEADER + len.div_ceil(8) * 8
}

/// Bytes of the data area that records of lengths `lens` take when written
/// from offset `pos`, the pad records before those that would cross the
/// end included.
fn span(mut pos: usize, lens: impl Iterator<Item = usize>) -> usize {
    let mut need = 0;
    for len in lens {
        let total = padded(len);
        let tail = DATA_BYTES - pos;
        if tail < total {
            need += tail;
            pos = 0;
        }
        need += total;
        pos = (pos + total) % DATA_BYTES;
    }
    need
}

/// A record `peek` found: where its bytes are and how many.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LaneRecord {
    pos: usize,
    /// Its length in bytes.
    pub(crate) len: usize,
}

/// One end of a lane.
struct End {
    base: *mut u8,
    at: LaneLayout,
}

// SAFETY: the pointer is the base of the channel's mapping, which the
// channel keeps alive as long as its lanes; the shared words are accessed as
// atomics and the bytes under the ring protocol, so any thread may drive it.
unsafe impl Send for End {}

impl End {
    fn word(&self, offset: usize) -> &AtomicU32 {
        // SAFETY: `offset` is one of `at`'s word offsets, 4-byte aligned and
        // inside the control page of a mapping of CHANNEL_PAGES pages that
        // outlives `self` (see `Lanes::new`). AtomicU32 has u32's layout, and
        // concurrent access by the peer goes through atomics too.
        unsafe { &*(self.base.add(offset) as *const AtomicU32) }
    }
    fn data(&self, pos: usize) -> *mut u8 {
        debug_assert!(pos < DATA_BYTES);
        // SAFETY: `pos < DATA_BYTES`, so the address is inside this lane's
        // data area of the mapping.
        unsafe { self.base.add(self.at.data + pos) }
    }
}

/// What a push did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// No room: the caller sends another way (the core retransmits anyway).
    Full,
    /// In the ring.
    Sent {
        /// The consumer sleeps: signal it.
        notify: bool,
    },
}

/// The producing end of a lane.
pub(crate) struct Producer {
    end: End,
    prod: u32,
    /// The consumer's index as last read (checked then). The consumer only
    /// moves it forward, so room seen then is still there; the producer
    /// reads the word again only when that room is short. Reading it at
    /// every push pulled the consumer's cache line over once per record,
    /// and the consumer then waited for it back at its next store (and
    /// fence) of the index: a cache miss on each side of every message.
    cons_seen: u32,
}

/// The consuming end of a lane.
pub(crate) struct Consumer {
    end: End,
    cons: u32,
    /// Bytes of room made since the producer's request was last looked at.
    freed: usize,
}

/// Room a consumer makes before it looks whether the producer waits for it
/// (see [`Consumer::advance`]).
const TELL_AFTER: usize = DATA_BYTES / 4;

/// The two ends one side of a channel drives.
pub(crate) struct Lanes {
    /// Where this side sends.
    pub(crate) tx: Producer,
    /// Where this side receives.
    pub(crate) rx: Consumer,
}

impl Lanes {
    /// The lanes of a channel mapped at `base` (`CHANNEL_PAGES` pages), for
    /// its creator (`creator`) or its acceptor. A creator starts from zeroed
    /// pages; an acceptor starts from whatever the creator wrote, and its
    /// first reads check it.
    ///
    /// # Safety
    /// `base` must point to a mapping of at least `CHANNEL_PAGES` pages that
    /// stays mapped as long as the returned lanes live.
    pub(crate) unsafe fn new(base: *mut u8, creator: bool) -> Lanes {
        let (tx, rx) = if creator { (0, 1) } else { (1, 0) };
        let tx = End { base, at: at(tx) };
        let rx = End { base, at: at(rx) };
        // Start from what the words say (zero on a fresh channel); a lying
        // peer only makes the first check fail.
        let prod = tx.word(tx.at.prod).load(Ordering::Acquire);
        let cons_seen = tx.word(tx.at.cons).load(Ordering::Acquire);
        let cons = rx.word(rx.at.cons).load(Ordering::Acquire);
        Lanes {
            tx: Producer {
                end: tx,
                prod,
                cons_seen,
            },
            rx: Consumer {
                end: rx,
                cons,
                freed: 0,
            },
        }
    }
}

impl Producer {
    /// Appends one record holding `bytes` (at most `MAX_FRAME`).
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Result<Pushed, Broken> {
        self.push_parts(bytes, 0, |_| true)
    }

    /// Appends one record holding `bytes` only if records of the lengths
    /// `then` would fit after it too: the first record of a group that must
    /// take one path whole (a MEDIUM message's fragments: a fragment that
    /// found the lane full would go through the backend, which sends a
    /// MEDIUM only once it has all of its fragments). Only this producer
    /// fills the lane, so the records that follow find the room this one
    /// saw.
    pub(crate) fn push_first_of(&mut self, bytes: &[u8], then: &[usize]) -> Result<Pushed, Broken> {
        self.push_reserving(bytes, 0, then, |_| true)
    }

    /// Appends one record of `head` followed by `body_len` bytes that `fill`
    /// writes at the pointer it gets (it returns false to give the record
    /// up: nothing is published then).
    pub(crate) fn push_parts(
        &mut self,
        head: &[u8],
        body_len: usize,
        fill: impl FnOnce(*mut u8) -> bool,
    ) -> Result<Pushed, Broken> {
        self.push_reserving(head, body_len, &[], fill)
    }

    /// [`push_parts`](Self::push_parts), done only if records of the
    /// lengths `then` would fit after this one.
    fn push_reserving(
        &mut self,
        head: &[u8],
        body_len: usize,
        then: &[usize],
        fill: impl FnOnce(*mut u8) -> bool,
    ) -> Result<Pushed, Broken> {
        let len = head.len() + body_len;
        if len > MAX_FRAME || then.iter().any(|&l| l > MAX_FRAME) {
            return Ok(Pushed::Full);
        }
        let total = padded(len);
        let mut fresh = false;
        let (pos, tail) = loop {
            // Every value is checked, the cached one included: one the
            // consumer lied with fails here whenever it was read.
            let used = self.prod.wrapping_sub(self.cons_seen) as usize;
            if used > DATA_BYTES {
                return Err(Broken("consumer index out of range"));
            }
            let pos = self.prod as usize % DATA_BYTES;
            let tail = DATA_BYTES - pos;
            let need = span(pos, std::iter::once(len).chain(then.iter().copied()));
            if DATA_BYTES - used >= need {
                break (pos, tail);
            }
            if fresh {
                // No signal is asked for here: a producer that polls looks
                // again by itself; one that is going to sleep asks first
                // (`arm_room`).
                return Ok(Pushed::Full);
            }
            self.cons_seen = self.end.word(self.end.at.cons).load(Ordering::Acquire);
            fresh = true;
        };
        let mut prod = self.prod;
        let mut pos = pos;
        if tail < total {
            self.header(pos, 0, KIND_PAD);
            prod = prod.wrapping_add(tail as u32);
            pos = 0;
        }
        self.header(pos, len as u32, KIND_FRAME);
        // SAFETY: `pos + total <= DATA_BYTES` (checked above: the record fits
        // before the end), so both writes stay inside the lane's data area;
        // the consumer does not read these bytes before `prod` is released
        // (one that does anyway races on values: `copy_shared`).
        unsafe { copy_shared(head.as_ptr(), self.end.data(pos + HEADER), head.len()) }
        if body_len > 0 && !fill(self.end.data(pos + HEADER + head.len())) {
            return Ok(Pushed::Full);
        }
        self.prod = prod.wrapping_add(total as u32);
        self.end
            .word(self.end.at.prod)
            .store(self.prod, Ordering::Release);
        // ring.h's check: the consumer sets `wants` then looks at `prod`; we
        // set `prod` then look at `wants`; one of the two sees the other.
        fence(Ordering::SeqCst);
        let wants = self.end.word(self.end.at.wants);
        let notify = wants.load(Ordering::Relaxed) != 0;
        if notify {
            wants.store(0, Ordering::Relaxed);
        }
        Ok(Pushed::Sent { notify })
    }

    /// Asks the consumer to signal once it has made room, before this side
    /// sleeps with a record of `len` bytes still to push; true if the room
    /// is there already (push instead of sleeping).
    ///
    /// Asked only by a thread about to sleep: a signal for a producer that
    /// polls would wake its driver thread for nothing (a stream with eight
    /// receives posted made three times the wake-ups when every full lane
    /// asked). Ring.h's check: this side sets `space`, then reads `cons`; the
    /// consumer moves `cons`, then reads `space`; one of the two sees the other.
    pub(crate) fn arm_room(&mut self, len: usize) -> bool {
        self.end.word(self.end.at.space).store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.cons_seen = self.end.word(self.end.at.cons).load(Ordering::Acquire);
        let used = self.prod.wrapping_sub(self.cons_seen) as usize;
        if used > DATA_BYTES {
            // A lying index: the push that follows finds the channel broken.
            return true;
        }
        let pos = self.prod as usize % DATA_BYTES;
        DATA_BYTES - used >= span(pos, std::iter::once(len.min(MAX_FRAME)))
    }

    /// Fault injection (`XMX_DIRECT_FAULT`, tests of the peer's defences):
    /// publishes a producer index that is not a multiple of 8.
    pub(crate) fn publish_garbage_index(&mut self) {
        self.end
            .word(self.end.at.prod)
            .store(self.prod.wrapping_add(4), Ordering::Release);
    }

    /// Fault injection: publishes a record whose header claims more bytes
    /// than a record may hold (a slot rewritten by its producer).
    pub(crate) fn publish_rewritten_slot(&mut self) {
        let cons = self.end.word(self.end.at.cons).load(Ordering::Acquire);
        let pos = self.prod as usize % DATA_BYTES;
        if DATA_BYTES - (self.prod.wrapping_sub(cons) as usize) < HEADER || DATA_BYTES - pos < 64 {
            return;
        }
        self.header(pos, u32::MAX, KIND_FRAME);
        self.prod = self.prod.wrapping_add(64);
        self.end
            .word(self.end.at.prod)
            .store(self.prod, Ordering::Release);
    }

    fn header(&self, pos: usize, len: u32, kind: u32) {
        let mut h = [0u8; HEADER];
        h[..4].copy_from_slice(&len.to_le_bytes());
        h[4..].copy_from_slice(&kind.to_le_bytes());
        // SAFETY: `pos` is 8-aligned and below DATA_BYTES, whose size is a
        // multiple of 8, so the 8 header bytes are inside the data area.
        unsafe { copy_shared(h.as_ptr(), self.end.data(pos), HEADER) }
    }
}

impl Consumer {
    /// Copies the next record into `out` (replacing its contents); false if
    /// the lane is empty.
    #[cfg(test)]
    pub(crate) fn pop(&mut self, out: &mut Vec<u8>) -> Result<bool, Broken> {
        let Some(rec) = self.peek()? else {
            return Ok(false);
        };
        out.clear();
        out.reserve(rec.len);
        // SAFETY: `out` has room for `rec.len` bytes, all initialised by the
        // copy, which `copy_out` bounds to the record.
        unsafe {
            self.copy_out(rec, 0, out.as_mut_ptr(), rec.len);
            out.set_len(rec.len);
        }
        self.advance(rec);
        Ok(true)
    }

    /// The next record, checked to lie inside what the producer published
    /// (pad records are skipped); `None` if the lane is empty.
    pub(crate) fn peek(&mut self) -> Result<Option<LaneRecord>, Broken> {
        loop {
            let prod = self.end.word(self.end.at.prod).load(Ordering::Acquire);
            let avail = prod.wrapping_sub(self.cons) as usize;
            if avail == 0 {
                return Ok(None);
            }
            if avail > DATA_BYTES || !avail.is_multiple_of(8) {
                return Err(Broken("producer index out of range"));
            }
            let pos = self.cons as usize % DATA_BYTES;
            let mut h = [0u8; HEADER];
            // SAFETY: `pos` is 8-aligned (every advance is a multiple of 8)
            // and below DATA_BYTES: the header is inside the data area. The
            // bytes are copied before they are looked at.
            unsafe { copy_shared(self.end.data(pos), h.as_mut_ptr(), HEADER) };
            let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
            let kind = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
            let step = match kind {
                KIND_PAD => DATA_BYTES - pos,
                KIND_FRAME if len <= MAX_FRAME && padded(len) <= DATA_BYTES - pos => padded(len),
                _ => return Err(Broken("malformed record header")),
            };
            if step > avail {
                return Err(Broken("record beyond the producer index"));
            }
            if kind == KIND_FRAME {
                return Ok(Some(LaneRecord { pos, len }));
            }
            self.cons = self.cons.wrapping_add(step as u32);
            self.end
                .word(self.end.at.cons)
                .store(self.cons, Ordering::Release);
        }
    }

    /// Copies at most `n` bytes of `rec` from `offset` to `dst`; returns how
    /// many (none past the record's end).
    ///
    /// # Safety
    /// `dst` must be valid for `n` bytes of writes and not overlap the lane.
    pub(crate) unsafe fn copy_out(
        &self,
        rec: LaneRecord,
        offset: usize,
        dst: *mut u8,
        n: usize,
    ) -> usize {
        let n = n.min(rec.len.saturating_sub(offset));
        if n > 0 {
            // SAFETY: `rec` was checked by `peek` to lie inside the data area
            // (`rec.pos + HEADER + rec.len <= DATA_BYTES`) and `offset + n <=
            // rec.len`; the caller vouches for `dst`.
            unsafe { copy_shared(self.end.data(rec.pos + HEADER + offset), dst, n) };
        }
        n
    }

    /// Done with `rec` (the one `peek` returned): its room goes back to the
    /// producer. True when the producer waits for room and should be
    /// signalled now.
    ///
    /// A producer that found the lane full sleeps until told. Told once a
    /// quarter of the lane is free, it refills while this side drains the
    /// rest; told only after a whole batch, the two sides copied in turn, each
    /// idle while the other worked (16 MiB between two guests with two
    /// receives posted ran at less than half the speed of one). Not at every
    /// record: a producer woken for one record's room sleeps again at once.
    /// The caller still asks [`room_wanted`](Self::room_wanted) when its batch
    /// ends.
    pub(crate) fn advance(&mut self, rec: LaneRecord) -> bool {
        let step = padded(rec.len);
        self.cons = self.cons.wrapping_add(step as u32);
        self.end
            .word(self.end.at.cons)
            .store(self.cons, Ordering::Release);
        self.freed += step;
        if self.freed < TELL_AFTER {
            return false;
        }
        self.freed = 0;
        self.room_wanted()
    }

    /// Whether the producer asked for a signal when room is made (and
    /// forgets the request): call after taking records.
    pub(crate) fn room_wanted(&mut self) -> bool {
        self.freed = 0;
        fence(Ordering::SeqCst);
        let w = self.end.word(self.end.at.space);
        if w.load(Ordering::Relaxed) != 0 {
            w.store(0, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Whether the producer has published nothing this consumer has not
    /// taken: one load of the producer's index, no copy. A polling wait
    /// asks this at every look; a published record (or a lying index) makes
    /// it false, and `peek` then judges what is there.
    pub(crate) fn is_empty(&self) -> bool {
        self.end.word(self.end.at.prod).load(Ordering::Acquire) == self.cons
    }

    /// Asks the producer to signal the next record; true if one is there
    /// already (take it in instead of sleeping).
    pub(crate) fn arm(&self) -> bool {
        self.end.word(self.end.at.wants).store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.end.word(self.end.at.prod).load(Ordering::Acquire) != self.cons
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Mem(Vec<u64>);
    impl Mem {
        fn new() -> Mem {
            Mem(vec![0; CHANNEL_PAGES * PAGE_SIZE / 8])
        }
        fn base(&mut self) -> *mut u8 {
            self.0.as_mut_ptr() as *mut u8
        }
        fn word(&mut self, offset: usize) -> &mut u32 {
            // SAFETY: test helper; offsets are the 4-aligned word offsets.
            unsafe { &mut *(self.base().add(offset) as *mut u32) }
        }
    }

    #[test]
    fn a_producer_waiting_for_room_is_told_once_a_quarter_is_free() {
        let mut m = Mem::new();
        // SAFETY: `m` outlives both sides' lanes.
        let (mut a, mut b) = unsafe { (Lanes::new(m.base(), true), Lanes::new(m.base(), false)) };
        let rec = vec![7u8; 16 << 10];
        let mut pushed = 0;
        while let Pushed::Sent { .. } = a.tx.push(&rec).unwrap() {
            pushed += 1;
        }
        assert!(pushed >= 4);
        // A producer that only polls asks for nothing: room it finds by
        // looking again costs the consumer no signal.
        let r =
            b.rx.peek()
                .unwrap()
                .expect("a record the producer published");
        assert!(!b.rx.room_wanted());
        // Going to sleep, it asks; the room is not there yet.
        assert!(!a.tx.arm_room(rec.len()));
        let mut freed = 0;
        let mut told_at = None;
        let mut r = Some(r);
        for i in 0..pushed {
            let r = match r.take() {
                Some(r) => r,
                None => {
                    b.rx.peek()
                        .unwrap()
                        .expect("a record the producer published")
                }
            };
            assert_eq!(r.len, rec.len());
            freed += padded(r.len);
            if b.rx.advance(r) {
                assert!(told_at.is_none(), "told twice for one request");
                told_at = Some((i, freed));
            }
        }
        let (i, freed_then) = told_at.expect("the waiting producer was told");
        // Told as soon as a quarter of the lane was free, long before the
        // lane was empty, so it refills while the rest is drained.
        assert!(freed_then >= DATA_BYTES / 4);
        assert!(freed_then - padded(rec.len()) < DATA_BYTES / 4);
        assert!(i + 1 < pushed);
        // Nothing more to tell: the request was answered.
        assert!(!b.rx.room_wanted());
        // Asking when the room is there says so: push instead of sleeping.
        assert!(a.tx.arm_room(rec.len()));
        assert!(b.rx.room_wanted());
        // Room made while nobody waits (half a lane, never full) tells nobody.
        for _ in 0..pushed / 2 {
            assert!(matches!(a.tx.push(&rec).unwrap(), Pushed::Sent { .. }));
        }
        for _ in 0..pushed / 2 {
            let r =
                b.rx.peek()
                    .unwrap()
                    .expect("a record the producer published");
            assert!(!b.rx.advance(r));
        }
    }

    #[test]
    fn records_cross_in_order_through_many_wraps() {
        let mut m = Mem::new();
        // SAFETY: `m` outlives both sides' lanes.
        let (mut a, mut b) = unsafe { (Lanes::new(m.base(), true), Lanes::new(m.base(), false)) };
        let mut out = Vec::new();
        let mut next_in = 0u32;
        for i in 0..4_000u32 {
            let len = (i as usize * 37) % MAX_FRAME;
            let rec: Vec<u8> = (0..len).map(|k| (k as u32 ^ i) as u8).collect();
            loop {
                match a.tx.push(&rec).unwrap() {
                    Pushed::Sent { .. } => break,
                    Pushed::Full => {
                        assert!(b.rx.pop(&mut out).unwrap());
                        let want = (next_in as usize * 37) % MAX_FRAME;
                        assert_eq!(out.len(), want);
                        assert!(out
                            .iter()
                            .enumerate()
                            .all(|(k, &x)| x == (k as u32 ^ next_in) as u8));
                        next_in += 1;
                    }
                }
            }
        }
        while b.rx.pop(&mut out).unwrap() {
            next_in += 1;
        }
        assert_eq!(next_in, 4_000);
        // The other lane works too, and an armed consumer gets a signal.
        assert!(!a.rx.arm());
        assert_eq!(b.tx.push(b"hi").unwrap(), Pushed::Sent { notify: true });
        assert_eq!(b.tx.push(b"again").unwrap(), Pushed::Sent { notify: false });
        assert!(a.rx.pop(&mut out).unwrap());
        assert_eq!(out, b"hi");
    }

    /// Pushes records taking exactly `bytes` of the lane (a multiple of 8);
    /// returns how many.
    fn push_span(tx: &mut Producer, mut bytes: usize) -> usize {
        let mut n = 0;
        while bytes > 0 {
            let take = bytes.min(padded(MAX_FRAME));
            assert!(matches!(
                tx.push(&vec![0; take - HEADER]).unwrap(),
                Pushed::Sent { .. }
            ));
            bytes -= take;
            n += 1;
        }
        n
    }

    #[test]
    fn a_group_goes_in_whole_or_not_at_all() {
        let mut m = Mem::new();
        // SAFETY: `m` outlives both sides' lanes.
        let (mut a, mut b) = unsafe { (Lanes::new(m.base(), true), Lanes::new(m.base(), false)) };
        let mut out = Vec::new();
        // A 32 KiB MEDIUM's fragments: eight records of 4128 bytes, 4136 in
        // the lane each. The group starts 1000 bytes before the area's end,
        // so a pad of 1000 bytes goes first: it needs 1000 + 8 * 4136.
        let rec: Vec<u8> = (0..4128).map(|i| i as u8).collect();
        let then = [rec.len(); 7];
        let need = 1000 + 8 * 4136;
        // Unconsumed records: A, B (an empty one, 8 bytes), then C up to
        // the start of the group.
        let a_bytes = need - 8 - 1000;
        let a_recs = push_span(&mut a.tx, a_bytes);
        push_span(&mut a.tx, 8);
        let c_recs = push_span(&mut a.tx, DATA_BYTES - 1000 - a_bytes - 8);
        assert_eq!(a.tx.prod as usize, DATA_BYTES - 1000);
        // Taking A leaves 8 bytes too few for the group: none of it goes in,
        // though its first record alone would.
        for _ in 0..a_recs {
            assert!(b.rx.pop(&mut out).unwrap());
        }
        assert!(span(DATA_BYTES - 1000, [rec.len()].into_iter()) < need - 8);
        let prod = a.tx.prod;
        assert_eq!(a.tx.push_first_of(&rec, &then).unwrap(), Pushed::Full);
        assert_eq!(a.tx.prod, prod, "nothing written");
        assert!(b.rx.pop(&mut out).unwrap());
        assert!(out.is_empty(), "B comes next: nothing was published");
        // Taking B makes the room: the group goes in whole, pad and all.
        assert!(matches!(
            a.tx.push_first_of(&rec, &then).unwrap(),
            Pushed::Sent { .. }
        ));
        for _ in then {
            assert!(matches!(a.tx.push(&rec).unwrap(), Pushed::Sent { .. }));
        }
        assert_eq!(
            a.tx.prod as usize,
            DATA_BYTES + 8 * 4136,
            "the pad, then the group"
        );
        for _ in 0..c_recs {
            assert!(b.rx.pop(&mut out).unwrap());
        }
        for _ in 0..8 {
            assert!(b.rx.pop(&mut out).unwrap());
            assert_eq!(out, rec);
        }
        assert!(b.rx.is_empty());
    }

    #[test]
    fn emptiness_follows_what_the_producer_published() {
        let mut m = Mem::new();
        // SAFETY: `m` outlives both sides' lanes.
        let (mut a, mut b) = unsafe { (Lanes::new(m.base(), true), Lanes::new(m.base(), false)) };
        let mut out = Vec::new();
        assert!(b.rx.is_empty());
        assert!(matches!(a.tx.push(b"one").unwrap(), Pushed::Sent { .. }));
        assert!(!b.rx.is_empty(), "a published record is seen");
        assert!(b.rx.pop(&mut out).unwrap());
        assert!(b.rx.is_empty(), "taken");
        // A record published after the consumer armed is seen by the arm's
        // own check or by the next look, and the producer signals it.
        assert!(!b.rx.arm());
        assert_eq!(a.tx.push(b"two").unwrap(), Pushed::Sent { notify: true });
        assert!(!b.rx.is_empty());
        // Only the index counts: a lying one is not "empty", so the
        // consumer goes on to `peek`, which refuses it.
        let prod = at(0).prod;
        *m.word(prod) = b.rx.cons.wrapping_add(DATA_BYTES as u32 + 8);
        assert!(!b.rx.is_empty());
        assert!(b.rx.peek().is_err());
    }

    #[test]
    fn a_hostile_producer_breaks_only_the_lane() {
        let lane0 = at(0);
        // An index far ahead.
        let mut m = Mem::new();
        // SAFETY: `m` outlives the lanes.
        let mut b = unsafe { Lanes::new(m.base(), false) };
        *m.word(lane0.prod) = (DATA_BYTES + 8) as u32;
        assert!(b.rx.pop(&mut Vec::new()).is_err());
        // A record header that lies about its length, or its kind.
        for (len, kind) in [
            (u32::MAX, KIND_FRAME),
            (MAX_FRAME as u32 + 1, KIND_FRAME),
            (8, 77),
        ] {
            let mut m = Mem::new();
            // SAFETY: `m` outlives the lanes.
            let mut b = unsafe { Lanes::new(m.base(), false) };
            *m.word(lane0.data) = len;
            *m.word(lane0.data + 4) = kind;
            *m.word(lane0.prod) = 64;
            assert!(b.rx.pop(&mut Vec::new()).is_err(), "{len} {kind}");
        }
        // A record longer than what the producer published.
        let mut m = Mem::new();
        // SAFETY: `m` outlives the lanes.
        let mut b = unsafe { Lanes::new(m.base(), false) };
        *m.word(lane0.data) = 100;
        *m.word(lane0.data + 4) = KIND_FRAME;
        *m.word(lane0.prod) = 16;
        assert!(b.rx.pop(&mut Vec::new()).is_err());
        // A consumer index that runs ahead of the producer, read when the
        // producer runs out of the room it last saw.
        let mut m = Mem::new();
        // SAFETY: `m` outlives the lanes.
        let mut a = unsafe { Lanes::new(m.base(), true) };
        push_span(&mut a.tx, DATA_BYTES);
        *m.word(lane0.cons) = DATA_BYTES as u32 + 4096;
        assert!(a.tx.push(b"x").is_err());
        // One read when the lane is created is checked at the first push.
        let mut m = Mem::new();
        *m.word(lane0.cons) = 4096;
        // SAFETY: `m` outlives the lanes.
        let mut a = unsafe { Lanes::new(m.base(), true) };
        assert!(a.tx.push(b"x").is_err());
    }
}

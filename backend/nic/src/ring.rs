//! The slot protocol of TPACKET_V2 rings, on memory shared with the kernel.
//!
//! Each slot begins with a 32-bit status word that says who owns the slot. The side that
//! gives a slot away writes the slot's contents first and then the status with release
//! ordering; the side that takes it loads the status with acquire ordering before reading
//! anything else. Between those two points only the owner touches the slot.
//!
//! - receive: kernel-owned (`TP_STATUS_KERNEL`) until the kernel sets `TP_STATUS_USER`;
//!   we read the frame, then store `TP_STATUS_KERNEL` to give the slot back.
//! - transmit: ours while `TP_STATUS_AVAILABLE` (or `TP_STATUS_WRONG_FORMAT`, a slot the
//!   kernel refused and gave back); we write the frame, then store
//!   `TP_STATUS_SEND_REQUEST`; the kernel moves it through `TP_STATUS_SENDING` and back to
//!   `TP_STATUS_AVAILABLE` once the frame has left.

use std::mem::offset_of;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU32, Ordering};

use libc::{
    TP_STATUS_AVAILABLE, TP_STATUS_COPY, TP_STATUS_KERNEL, TP_STATUS_SENDING,
    TP_STATUS_SEND_REQUEST, TP_STATUS_USER, TP_STATUS_WRONG_FORMAT,
};

use super::error::{NicError, Result};
use super::geometry::{RingGeometry, SLOT_ADDR_OFFSET, SLOT_HDR_LEN, TX_DATA_OFFSET};
use super::stats::NicStats;
use super::ETH_HEADER_LEN;

/// Byte offsets of the fields we use in a slot.
mod field {
    use super::*;
    pub(super) const STATUS: usize = offset_of!(libc::tpacket2_hdr, tp_status);
    pub(super) const LEN: usize = offset_of!(libc::tpacket2_hdr, tp_len);
    pub(super) const SNAPLEN: usize = offset_of!(libc::tpacket2_hdr, tp_snaplen);
    pub(super) const MAC: usize = offset_of!(libc::tpacket2_hdr, tp_mac);
    pub(super) const PKTTYPE: usize = SLOT_ADDR_OFFSET + offset_of!(libc::sockaddr_ll, sll_pkttype);
}

/// Packet type the kernel gives frames this host sent (PACKET_OUTGOING).
const PKTTYPE_OUTGOING: u8 = libc::PACKET_OUTGOING;

/// Load a slot's status word.
///
/// # Safety
/// `slot` is the 16-aligned start of a slot inside a live ring mapping.
unsafe fn load_status(slot: NonNull<u8>) -> u32 {
    // SAFETY: the caller guarantees a live, aligned slot; its first four bytes are the
    // status word, which the kernel also accesses, so it is only touched atomically here.
    // Acquire pairs with the kernel's write barrier before it publishes a slot: what the
    // kernel wrote into the slot is visible once we see its status.
    unsafe { AtomicU32::from_ptr(slot.as_ptr().add(field::STATUS).cast()) }.load(Ordering::Acquire)
}

/// Store a slot's status word, handing the slot to the kernel.
///
/// # Safety
/// As [`load_status`], and the slot is ours (we took it or it is free).
unsafe fn store_status(slot: NonNull<u8>, status: u32) {
    // SAFETY: as in `load_status`. Release orders every earlier access to the slot (our
    // reads of a received frame, our writes of a frame to send) before the handoff.
    unsafe { AtomicU32::from_ptr(slot.as_ptr().add(field::STATUS).cast()) }
        .store(status, Ordering::Release)
}

/// The header fields of a received slot, copied out of the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RxSlotHeader {
    pub status: u32,
    pub len: u32,
    pub snaplen: u32,
    pub mac: u16,
    pub pkttype: u8,
}

/// What to do with a received slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RxVerdict {
    /// Deliver `len` bytes at offset `start` of the slot.
    Deliver { start: usize, len: usize },
    /// The kernel cut the frame short; drop it.
    Truncated,
    /// Offsets or lengths outside the slot, or a runt; drop it.
    Corrupt,
    /// A frame this host sent; drop it.
    Outgoing,
}

/// Decide what a ready receive slot holds, trusting none of its numbers.
pub(crate) fn classify_rx(header: &RxSlotHeader, frame_size: usize) -> RxVerdict {
    let start = usize::from(header.mac);
    let snaplen = header.snaplen as usize;
    let Some(end) = start.checked_add(snaplen) else {
        return RxVerdict::Corrupt;
    };
    if start < SLOT_HDR_LEN || end > frame_size || header.snaplen > header.len {
        return RxVerdict::Corrupt;
    }
    if header.status & TP_STATUS_COPY != 0 || header.snaplen < header.len {
        return RxVerdict::Truncated;
    }
    if snaplen < ETH_HEADER_LEN {
        return RxVerdict::Corrupt;
    }
    if header.pkttype == PKTTYPE_OUTGOING {
        return RxVerdict::Outgoing;
    }
    RxVerdict::Deliver {
        start,
        len: snaplen,
    }
}

/// Who holds a transmit slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxSlotState {
    /// Ours to fill.
    Free,
    /// Ours again after the kernel refused its frame as malformed.
    Rejected,
    /// Queued or being sent by the kernel.
    Busy,
}

/// Read a transmit slot's status; timestamp bits are ignored.
pub(crate) fn classify_tx(status: u32) -> TxSlotState {
    if status & (TP_STATUS_SEND_REQUEST | TP_STATUS_SENDING) != 0 {
        TxSlotState::Busy
    } else if status & TP_STATUS_WRONG_FORMAT != 0 {
        TxSlotState::Rejected
    } else {
        TxSlotState::Free
    }
}

/// Address of slot `index` in a ring at `base`.
fn slot_at(base: NonNull<u8>, geometry: &RingGeometry, index: usize) -> NonNull<u8> {
    // Callers keep `index < frame_nr`, so the offset exists and lies inside the ring.
    let offset = geometry.slot_offset(index).unwrap_or(0);
    // SAFETY: `offset` is within the ring of `geometry.size()` bytes that starts at `base`
    // (constructor contract), so the result stays in the same allocation and is non-null.
    unsafe { NonNull::new_unchecked(base.as_ptr().add(offset)) }
}

/// The consumer side of a receive ring.
pub(crate) struct RxRing {
    base: NonNull<u8>,
    geometry: RingGeometry,
    /// Next slot to look at; always `< frame_nr`.
    head: usize,
}

impl RxRing {
    /// A receive ring over `geometry.size()` bytes at `base`.
    ///
    /// # Safety
    /// `base` is aligned to 16 and valid for reads and writes of `geometry.size()` bytes
    /// for the whole life of the ring, and nothing but this ring and a producer that keeps
    /// the TPACKET_V2 status protocol accesses that memory.
    pub(crate) unsafe fn new(base: NonNull<u8>, geometry: RingGeometry) -> Self {
        Self {
            base,
            geometry,
            head: 0,
        }
    }

    /// Slots in the ring.
    pub(crate) fn frames(&self) -> usize {
        self.geometry.frame_nr()
    }

    /// True when the next slot holds a frame for us.
    pub(crate) fn is_ready(&self) -> bool {
        let slot = slot_at(self.base, &self.geometry, self.head);
        // SAFETY: `slot` is an aligned slot of the live ring (constructor contract).
        let status = unsafe { load_status(slot) };
        status & TP_STATUS_USER != 0
    }

    /// Hand up to `max` ready slots to `f` in ring order, giving each slot back to the
    /// kernel after `f` returns. Returns the number of frames delivered; skipped slots are
    /// counted in `stats`.
    pub(crate) fn drain(
        &mut self,
        max: usize,
        stats: &mut NicStats,
        f: &mut impl FnMut(&[u8]),
    ) -> usize {
        let frame_size = self.geometry.frame_size();
        let mut delivered = 0;
        for _ in 0..max {
            let slot = slot_at(self.base, &self.geometry, self.head);
            // SAFETY: `slot` is an aligned slot of the live ring.
            let status = unsafe { load_status(slot) };
            if status & TP_STATUS_USER == 0 {
                break;
            }
            // SAFETY: the acquire load saw TP_STATUS_USER, so the kernel has finished
            // writing this slot and leaves it alone until we store TP_STATUS_KERNEL. The
            // fields read lie in the slot header (offsets < SLOT_HDR_LEN <= frame_size)
            // and are naturally aligned within the 16-aligned slot.
            let header = unsafe {
                let p = slot.as_ptr();
                RxSlotHeader {
                    status,
                    len: ptr::read(p.add(field::LEN).cast::<u32>()),
                    snaplen: ptr::read(p.add(field::SNAPLEN).cast::<u32>()),
                    mac: ptr::read(p.add(field::MAC).cast::<u16>()),
                    pkttype: ptr::read(p.add(field::PKTTYPE)),
                }
            };
            match classify_rx(&header, frame_size) {
                RxVerdict::Deliver { start, len } => {
                    // SAFETY: `classify_rx` checked `start + len <= frame_size`, so the
                    // bytes are inside this slot, which is ours (see above) and stays
                    // unmodified while `f` borrows them: we give it back only after.
                    let frame =
                        unsafe { std::slice::from_raw_parts(slot.as_ptr().add(start), len) };
                    f(frame);
                    stats.rx_frames += 1;
                    stats.rx_bytes += len as u64;
                    delivered += 1;
                }
                RxVerdict::Truncated => {
                    tracing::debug!(
                        len = header.len,
                        snaplen = header.snaplen,
                        "truncated frame dropped"
                    );
                    stats.rx_truncated += 1;
                }
                RxVerdict::Corrupt => {
                    tracing::debug!(?header, "receive slot with impossible layout skipped");
                    stats.rx_bad_slots += 1;
                }
                RxVerdict::Outgoing => stats.rx_outgoing += 1,
            }
            // SAFETY: the slot is ours (we saw TP_STATUS_USER) and we are done with it.
            unsafe { store_status(slot, TP_STATUS_KERNEL) };
            self.head = (self.head + 1) % self.geometry.frame_nr();
        }
        delivered
    }
}

/// What happened to a frame offered to the transmit ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Push {
    /// Written and marked for sending.
    Queued,
    /// The next slot is still the kernel's.
    Full,
}

/// What [`TxRing::try_push_with`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PushWith {
    /// A frame of this many bytes was written and marked for sending.
    Queued(usize),
    /// The writer had no frame; the slot stays free.
    Nothing,
    /// The next slot is still the kernel's; the writer was not called.
    Full,
}

/// The producer side of a transmit ring.
pub(crate) struct TxRing {
    base: NonNull<u8>,
    geometry: RingGeometry,
    /// Next slot to fill; always `< frame_nr`.
    head: usize,
    /// Slot of the last frame queued since the last flush.
    last_queued: Option<usize>,
}

impl TxRing {
    /// A transmit ring over `geometry.size()` bytes at `base`.
    ///
    /// # Safety
    /// As [`RxRing::new`], with a consumer that keeps the TPACKET_V2 transmit protocol.
    pub(crate) unsafe fn new(base: NonNull<u8>, geometry: RingGeometry) -> Self {
        Self {
            base,
            geometry,
            head: 0,
            last_queued: None,
        }
    }

    /// Slots in the ring.
    pub(crate) fn frames(&self) -> usize {
        self.geometry.frame_nr()
    }

    /// Longest frame a slot holds.
    pub(crate) fn slot_capacity(&self) -> usize {
        self.geometry.frame_size() - TX_DATA_OFFSET
    }

    /// Copy `frame` into the next slot and mark it for sending.
    pub(crate) fn try_push(&mut self, frame: &[u8], stats: &mut NicStats) -> Result<Push> {
        let capacity = self.slot_capacity();
        if frame.len() > capacity {
            return Err(NicError::FrameTooLong {
                len: frame.len(),
                max: capacity,
            });
        }
        let mut copy = |slot: &mut [u8]| {
            // Fits: checked against the capacity above, which bounds the slot.
            slot[..frame.len()].copy_from_slice(frame);
            frame.len()
        };
        match self.try_push_with(capacity, stats, &mut copy)? {
            PushWith::Full => Ok(Push::Full),
            PushWith::Queued(_) | PushWith::Nothing => Ok(Push::Queued),
        }
    }

    /// Let `fill` write a frame of at most `max_len` bytes (and the slot's capacity)
    /// straight into the next slot, then mark it for sending: no copy through a buffer
    /// of the caller's. `fill` returns the frame's length, 0 for no frame.
    pub(crate) fn try_push_with(
        &mut self,
        max_len: usize,
        stats: &mut NicStats,
        fill: &mut impl FnMut(&mut [u8]) -> usize,
    ) -> Result<PushWith> {
        let room = self.slot_capacity().min(max_len);
        let slot = slot_at(self.base, &self.geometry, self.head);
        // SAFETY: `slot` is an aligned slot of the live ring.
        match classify_tx(unsafe { load_status(slot) }) {
            TxSlotState::Busy => return Ok(PushWith::Full),
            TxSlotState::Rejected => {
                tracing::debug!(slot = self.head, "kernel refused a queued frame");
                stats.tx_rejected += 1;
            }
            TxSlotState::Free => {}
        }
        // SAFETY: the acquire load showed the slot free: the kernel neither reads nor
        // writes it until we publish TP_STATUS_SEND_REQUEST below, and no other
        // reference to it exists (`&mut self`). The `room` bytes from TX_DATA_OFFSET
        // lie inside the slot (room <= frame_size - TX_DATA_OFFSET).
        let data =
            unsafe { std::slice::from_raw_parts_mut(slot.as_ptr().add(TX_DATA_OFFSET), room) };
        let len = fill(data);
        if len == 0 {
            return Ok(PushWith::Nothing);
        }
        if len > room {
            return Err(NicError::FrameTooLong { len, max: room });
        }
        if len < ETH_HEADER_LEN {
            return Err(NicError::FrameTooShort { len });
        }
        // SAFETY: as above, the slot is still ours; the length word is an aligned field
        // of its header.
        unsafe {
            // `len` <= room < frame_size, which fits in u32.
            ptr::write(slot.as_ptr().add(field::LEN).cast::<u32>(), len as u32);
            store_status(slot, TP_STATUS_SEND_REQUEST);
        }
        self.last_queued = Some(self.head);
        self.head = (self.head + 1) % self.geometry.frame_nr();
        stats.tx_frames += 1;
        stats.tx_bytes += len as u64;
        Ok(PushWith::Queued(len))
    }

    /// True when frames were queued since the last [`TxRing::mark_flushed`].
    pub(crate) fn has_unflushed(&self) -> bool {
        self.last_queued.is_some()
    }

    /// True when the last queued frame is still waiting for the kernel to pick it up,
    /// i.e. the last `send()` did not get through the whole batch. The kernel takes
    /// slots in ring order, so the last one tells for all.
    pub(crate) fn last_queued_waiting(&self) -> bool {
        self.last_queued.is_some_and(|index| {
            let slot = slot_at(self.base, &self.geometry, index);
            // SAFETY: `slot` is an aligned slot of the live ring.
            let status = unsafe { load_status(slot) };
            status & TP_STATUS_SEND_REQUEST != 0
        })
    }

    /// Forget the queued batch: the kernel has taken all of it.
    pub(crate) fn mark_flushed(&mut self) {
        self.last_queued = None;
    }
}

const _: () = assert!(TP_STATUS_AVAILABLE == 0 && TP_STATUS_KERNEL == 0);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::RX_NET_OFFSET;

    /// Page-aligned memory standing in for the kernel's ring.
    #[repr(C, align(4096))]
    struct Page([u8; 4096]);

    struct FakeRing {
        _mem: Vec<Page>,
        base: NonNull<u8>,
        geometry: RingGeometry,
    }

    impl FakeRing {
        fn new(frame_size: usize, frames: usize) -> Self {
            let geometry = RingGeometry::new(frame_size, frames, 4096).unwrap();
            let mut mem: Vec<Page> = (0..geometry.size() / 4096)
                .map(|_| Page([0; 4096]))
                .collect();
            let base = NonNull::new(mem.as_mut_ptr().cast::<u8>()).unwrap();
            Self {
                _mem: mem,
                base,
                geometry,
            }
        }

        fn slot(&self, index: usize) -> *mut u8 {
            slot_at(self.base, &self.geometry, index).as_ptr()
        }

        fn rx(&self) -> RxRing {
            // SAFETY: `_mem` holds `geometry.size()` page-aligned bytes and outlives the
            // ring in every test; the test plays the kernel through raw pointers only.
            unsafe { RxRing::new(self.base, self.geometry) }
        }

        fn tx(&self) -> TxRing {
            // SAFETY: as in `rx`.
            unsafe { TxRing::new(self.base, self.geometry) }
        }

        fn status(&self, index: usize) -> u32 {
            // SAFETY: an aligned slot of the test ring.
            unsafe { load_status(NonNull::new(self.slot(index)).unwrap()) }
        }

        fn set_status(&self, index: usize, status: u32) {
            // SAFETY: an aligned slot of the test ring.
            unsafe { store_status(NonNull::new(self.slot(index)).unwrap(), status) }
        }

        /// Write a received frame the way the kernel lays it out.
        fn kernel_put(&self, index: usize, frame: &[u8], header: RxSlotHeader) {
            let p = self.slot(index);
            // SAFETY: offsets inside the slot of the test ring; the test keeps `mac +
            // frame.len()` within the slot when it writes a frame at all.
            unsafe {
                ptr::write(p.add(field::LEN).cast::<u32>(), header.len);
                ptr::write(p.add(field::SNAPLEN).cast::<u32>(), header.snaplen);
                ptr::write(p.add(field::MAC).cast::<u16>(), header.mac);
                ptr::write(p.add(field::PKTTYPE), header.pkttype);
                let start = usize::from(header.mac);
                if start + frame.len() <= self.geometry.frame_size() {
                    ptr::copy_nonoverlapping(frame.as_ptr(), p.add(start), frame.len());
                }
            }
            self.set_status(index, header.status);
        }

        fn kernel_put_frame(&self, index: usize, frame: &[u8]) {
            let len = frame.len() as u32;
            self.kernel_put(index, frame, good_header(len));
        }

        fn tx_frame(&self, index: usize) -> Vec<u8> {
            let p = self.slot(index);
            // SAFETY: the length word and the frame bytes lie inside the slot (the ring
            // refuses frames longer than the slot capacity).
            unsafe {
                let len = ptr::read(p.add(field::LEN).cast::<u32>()) as usize;
                std::slice::from_raw_parts(p.add(TX_DATA_OFFSET), len).to_vec()
            }
        }
    }

    const MAC_OFFSET: u16 = (RX_NET_OFFSET - ETH_HEADER_LEN) as u16;

    fn good_header(len: u32) -> RxSlotHeader {
        RxSlotHeader {
            status: TP_STATUS_USER,
            len,
            snaplen: len,
            mac: MAC_OFFSET,
            pkttype: libc::PACKET_HOST,
        }
    }

    fn frame(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn collect(ring: &mut RxRing, max: usize, stats: &mut NicStats) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let n = ring.drain(max, stats, &mut |f: &[u8]| out.push(f.to_vec()));
        assert_eq!(n, out.len());
        out
    }

    #[test]
    fn field_offsets_match_the_v2_abi() {
        assert_eq!(
            (
                field::STATUS,
                field::LEN,
                field::SNAPLEN,
                field::MAC,
                field::PKTTYPE
            ),
            (0, 4, 8, 12, 42)
        );
    }

    #[test]
    fn classify_accepts_a_well_formed_slot() {
        let h = good_header(60);
        assert_eq!(
            classify_rx(&h, 2048),
            RxVerdict::Deliver {
                start: MAC_OFFSET as usize,
                len: 60
            }
        );
        // Status flags beside USER do not matter.
        let h = RxSlotHeader {
            status: TP_STATUS_USER | libc::TP_STATUS_LOSING | libc::TP_STATUS_CSUM_VALID,
            ..h
        };
        assert!(matches!(classify_rx(&h, 2048), RxVerdict::Deliver { .. }));
    }

    #[test]
    fn classify_rejects_layouts_outside_the_slot() {
        let base = good_header(100);
        let cases = [
            RxSlotHeader { mac: 0, ..base },
            RxSlotHeader {
                mac: (SLOT_HDR_LEN - 1) as u16,
                ..base
            },
            RxSlotHeader {
                mac: u16::MAX,
                ..base
            },
            RxSlotHeader {
                snaplen: 2048,
                len: 2048,
                ..base
            },
            RxSlotHeader {
                snaplen: u32::MAX,
                len: u32::MAX,
                ..base
            },
            RxSlotHeader {
                snaplen: 101,
                len: 100,
                ..base
            },
            RxSlotHeader {
                snaplen: 13,
                len: 13,
                ..base
            },
        ];
        for h in cases {
            assert_eq!(classify_rx(&h, 2048), RxVerdict::Corrupt, "{h:?}");
        }
    }

    #[test]
    fn classify_drops_truncated_and_outgoing_frames() {
        let base = good_header(100);
        let cut = RxSlotHeader {
            snaplen: 50,
            ..base
        };
        assert_eq!(classify_rx(&cut, 2048), RxVerdict::Truncated);
        let copy = RxSlotHeader {
            status: TP_STATUS_USER | TP_STATUS_COPY,
            ..base
        };
        assert_eq!(classify_rx(&copy, 2048), RxVerdict::Truncated);
        let out = RxSlotHeader {
            pkttype: libc::PACKET_OUTGOING,
            ..base
        };
        assert_eq!(classify_rx(&out, 2048), RxVerdict::Outgoing);
    }

    #[test]
    fn drain_delivers_ready_slots_in_order_and_returns_them() {
        let fake = FakeRing::new(2048, 4);
        let mut ring = fake.rx();
        let mut stats = NicStats::default();
        assert!(!ring.is_ready());
        assert!(collect(&mut ring, 64, &mut stats).is_empty());

        let frames: Vec<Vec<u8>> = (0..3).map(|i| frame(60 + i * 7, i as u8)).collect();
        for (i, f) in frames.iter().enumerate() {
            fake.kernel_put_frame(i, f);
        }
        assert!(ring.is_ready());
        assert_eq!(collect(&mut ring, 64, &mut stats), frames);
        for i in 0..4 {
            assert_eq!(fake.status(i), TP_STATUS_KERNEL);
        }
        assert_eq!(stats.rx_frames, 3);
        assert_eq!(
            stats.rx_bytes,
            frames.iter().map(|f| f.len() as u64).sum::<u64>()
        );
        assert!(!ring.is_ready());
    }

    #[test]
    fn drain_wraps_around_the_ring() {
        let fake = FakeRing::new(2048, 4);
        let mut ring = fake.rx();
        let mut stats = NicStats::default();
        assert_eq!(ring.frames(), 4);
        for round in 0..3u8 {
            let frames: Vec<Vec<u8>> = (0..3).map(|i| frame(64, round * 10 + i)).collect();
            for (i, f) in frames.iter().enumerate() {
                fake.kernel_put_frame((usize::from(round) * 3 + i) % 4, f);
            }
            assert_eq!(collect(&mut ring, 64, &mut stats), frames, "round {round}");
        }
    }

    #[test]
    fn drain_stops_at_max_and_resumes() {
        let fake = FakeRing::new(2048, 4);
        let mut ring = fake.rx();
        let mut stats = NicStats::default();
        for i in 0..4 {
            fake.kernel_put_frame(i, &frame(80, i as u8));
        }
        assert_eq!(collect(&mut ring, 3, &mut stats).len(), 3);
        assert_eq!(fake.status(3), TP_STATUS_USER);
        assert_eq!(collect(&mut ring, 3, &mut stats), vec![frame(80, 3)]);
    }

    #[test]
    fn bad_slots_are_skipped_counted_and_returned() {
        let fake = FakeRing::new(2048, 4);
        let mut ring = fake.rx();
        let mut stats = NicStats::default();
        let good = frame(100, 1);
        fake.kernel_put(
            0,
            &good,
            RxSlotHeader {
                mac: 4,
                ..good_header(100)
            },
        );
        fake.kernel_put(
            1,
            &good,
            RxSlotHeader {
                snaplen: 60_000,
                len: 60_000,
                ..good_header(100)
            },
        );
        fake.kernel_put(
            2,
            &good,
            RxSlotHeader {
                snaplen: 40,
                ..good_header(100)
            },
        );
        fake.kernel_put(3, &good, good_header(100));
        assert_eq!(collect(&mut ring, 64, &mut stats), vec![good]);
        assert_eq!(stats.rx_bad_slots, 2);
        assert_eq!(stats.rx_truncated, 1);
        assert_eq!(stats.rx_frames, 1);
        for i in 0..4 {
            assert_eq!(fake.status(i), TP_STATUS_KERNEL);
        }
    }

    #[test]
    fn delivered_slice_has_exactly_the_frame_bytes() {
        let fake = FakeRing::new(2048, 2);
        let mut ring = fake.rx();
        let mut stats = NicStats::default();
        // A long frame leaves bytes behind in the slot; a later short one must not show them.
        fake.kernel_put_frame(0, &vec![0xaa; 1500]);
        fake.kernel_put_frame(1, &vec![0xbb; 1500]);
        collect(&mut ring, 64, &mut stats);
        let short = frame(61, 9);
        fake.kernel_put_frame(0, &short);
        assert_eq!(collect(&mut ring, 64, &mut stats), vec![short]);
    }

    #[test]
    fn push_fills_slots_and_requests_sending() {
        let fake = FakeRing::new(2048, 4);
        let mut ring = fake.tx();
        let mut stats = NicStats::default();
        assert!(!ring.has_unflushed());
        let frames: Vec<Vec<u8>> = (0..3).map(|i| frame(60 + i * 100, i as u8)).collect();
        for f in &frames {
            assert_eq!(ring.try_push(f, &mut stats).unwrap(), Push::Queued);
        }
        for (i, f) in frames.iter().enumerate() {
            assert_eq!(fake.status(i), TP_STATUS_SEND_REQUEST);
            assert_eq!(&fake.tx_frame(i), f);
        }
        assert_eq!(fake.status(3), TP_STATUS_AVAILABLE);
        assert!(ring.has_unflushed());
        assert!(ring.last_queued_waiting());
        assert_eq!(stats.tx_frames, 3);
        assert_eq!(
            stats.tx_bytes,
            frames.iter().map(|f| f.len() as u64).sum::<u64>()
        );
    }

    #[test]
    fn push_reports_full_until_the_kernel_frees_a_slot() {
        let fake = FakeRing::new(2048, 2);
        let mut ring = fake.tx();
        let mut stats = NicStats::default();
        let f = frame(100, 0);
        assert_eq!(ring.try_push(&f, &mut stats).unwrap(), Push::Queued);
        assert_eq!(ring.try_push(&f, &mut stats).unwrap(), Push::Queued);
        assert_eq!(classify_tx(fake.status(0)), TxSlotState::Busy);
        assert_eq!(ring.try_push(&f, &mut stats).unwrap(), Push::Full);
        // The kernel takes both and is still sending the first.
        fake.set_status(0, TP_STATUS_SENDING);
        fake.set_status(1, TP_STATUS_AVAILABLE);
        assert!(!ring.last_queued_waiting());
        assert_eq!(ring.try_push(&f, &mut stats).unwrap(), Push::Full);
        fake.set_status(0, TP_STATUS_AVAILABLE | libc::TP_STATUS_TS_SOFTWARE);
        assert_eq!(classify_tx(fake.status(0)), TxSlotState::Free);
        let g = frame(200, 5);
        assert_eq!(ring.try_push(&g, &mut stats).unwrap(), Push::Queued);
        assert_eq!(fake.tx_frame(0), g);
        assert_eq!(stats.tx_frames, 3);
    }

    #[test]
    fn rejected_slot_is_reclaimed_and_counted() {
        let fake = FakeRing::new(2048, 2);
        let mut ring = fake.tx();
        let mut stats = NicStats::default();
        fake.set_status(0, TP_STATUS_WRONG_FORMAT);
        assert_eq!(
            ring.try_push(&frame(70, 1), &mut stats).unwrap(),
            Push::Queued
        );
        assert_eq!(stats.tx_rejected, 1);
        assert_eq!(fake.status(0), TP_STATUS_SEND_REQUEST);
    }

    #[test]
    fn oversized_frame_is_refused_without_touching_the_ring() {
        let fake = FakeRing::new(2048, 2);
        let mut ring = fake.tx();
        let mut stats = NicStats::default();
        let max = ring.slot_capacity();
        assert_eq!(max, 2048 - TX_DATA_OFFSET);
        let err = ring.try_push(&vec![0; max + 1], &mut stats).unwrap_err();
        assert!(
            matches!(err, NicError::FrameTooLong { len, max: m } if len == max + 1 && m == max)
        );
        assert_eq!(fake.status(0), TP_STATUS_AVAILABLE);
        assert!(!ring.has_unflushed());
        assert_eq!(
            ring.try_push(&vec![7; max], &mut stats).unwrap(),
            Push::Queued
        );
        assert_eq!(fake.tx_frame(0), vec![7; max]);
    }

    #[test]
    fn flush_bookkeeping() {
        let fake = FakeRing::new(2048, 2);
        let mut ring = fake.tx();
        let mut stats = NicStats::default();
        ring.try_push(&frame(60, 0), &mut stats).unwrap();
        assert!(ring.last_queued_waiting());
        fake.set_status(0, TP_STATUS_AVAILABLE);
        assert!(!ring.last_queued_waiting());
        ring.mark_flushed();
        assert!(!ring.has_unflushed());
        assert!(!ring.last_queued_waiting());
    }
}

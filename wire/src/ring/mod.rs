//! The split-driver shared ring, laid out as Xen's `public/io/ring.h`.
//!
//! # The shared page
//!
//! ```text
//! offset  0  u32 req_prod    written by the front half only
//! offset  4  u32 req_event   written by the back half only
//! offset  8  u32 rsp_prod    written by the back half only
//! offset 12  u32 rsp_event   written by the front half only
//! offset 16  48 bytes of padding (zero; the endpoint send ring keeps its region fill
//!            marks in the first 32, see `msg::fill_marks`)
//! offset 64  slot[0], slot[1], ... slot[n-1]
//! ```
//!
//! A slot holds either a request or the response that replaces it, so its size is the larger
//! of the two. `n` is the largest power of two with `64 + n * slot_size <= ring bytes`: the
//! same count as Xen's `__CONST_RING_SIZE`, so a C peer built with `DEFINE_RING_TYPES` over
//! request and response structs of these sizes sees the same slots. Indices are free-running
//! `u32` counters; a slot is `index & (n - 1)`.
//!
//! # Halves
//!
//! [`FrontRing`] produces requests and consumes responses; [`BackRing`] consumes requests and
//! produces responses. Each keeps its private indices in process memory and writes only its
//! own two fields of the header. Producers publish with release ordering, consumers read the
//! producer index with acquire ordering, and the notify check and the final check put a full
//! fence between their store and their load, so an event is never lost: either the producer
//! sees the consumer's event index or the consumer sees the new producer index.
//!
//! A one-way channel (the endpoint send ring, the event ring) is a ring whose response type is
//! `()`: the consumer returns slots by pushing empty responses, which moves `rsp_prod` and
//! writes no slot bytes.
//!
//! # Hostile peers
//!
//! The other side of the page may be another domain that does not follow the protocol. Every
//! producer index read from the page is checked against what the protocol allows (at most a
//! ring's worth of outstanding requests, never behind what was already consumed; no more
//! responses than requests published) and refused with [`RingError::Overflow`]. A slot is
//! copied out of shared memory in one pass into private memory before it is decoded, so a peer
//! rewriting the slot concurrently cannot make the decoder see two different values.

mod back;
mod front;
mod shared;

use std::sync::atomic::Ordering;

pub use back::BackRing;
pub use front::FrontRing;
pub use shared::{copy_shared, SharedMem};

/// Offsets of the shared header fields and of the slot array.
pub mod layout {
    /// `req_prod`: requests published by the front half.
    pub const REQ_PROD: usize = 0;
    /// `req_event`: the back half wants an event when `req_prod` passes this value.
    pub const REQ_EVENT: usize = 4;
    /// `rsp_prod`: responses published by the back half.
    pub const RSP_PROD: usize = 8;
    /// `rsp_event`: the front half wants an event when `rsp_prod` passes this value.
    pub const RSP_EVENT: usize = 12;
    /// Start of the padding that follows the four indices (ring.h's private area).
    pub const PAD: usize = 16;
    /// Start of the slot array.
    pub const SLOTS: usize = 64;
}

/// The size of a page, the unit in which ring memory is granted.
pub const PAGE_SIZE: usize = 4096;

/// Slots are copied in 8-byte words; every slot type's size is a multiple of this.
pub const SLOT_ALIGN: usize = 8;

/// A fixed-size message that can live in a ring slot.
pub trait Slot: Sized {
    /// Encoded size in bytes: a multiple of [`SLOT_ALIGN`] (0 for an empty response).
    const SIZE: usize;

    /// Write `self` into `slot` (exactly [`Slot::SIZE`] bytes long, zero-filled).
    fn encode(&self, slot: &mut [u8]) -> crate::Result<()>;

    /// Read a value from `slot` (exactly [`Slot::SIZE`] bytes, already copied out of
    /// shared memory). Untrusted: must refuse, never panic.
    fn decode(slot: &[u8]) -> crate::Result<Self>;
}

/// The empty response of a one-way ring: it only returns the slot to the producer.
impl Slot for () {
    const SIZE: usize = 0;

    fn encode(&self, _slot: &mut [u8]) -> crate::Result<()> {
        Ok(())
    }

    fn decode(_slot: &[u8]) -> crate::Result<Self> {
        Ok(())
    }
}

/// Number of slots of `slot_size` bytes in a ring of `ring_bytes` bytes, as
/// `__CONST_RING_SIZE`: the largest power of two that fits after the 64-byte header.
/// 0 if not even one slot fits or `slot_size` is 0.
pub const fn ring_size(slot_size: usize, ring_bytes: usize) -> u32 {
    if slot_size == 0 || ring_bytes < layout::SLOTS + slot_size {
        return 0;
    }
    let fit = (ring_bytes - layout::SLOTS) / slot_size;
    // Indices are u32 and compared with wrapping subtraction, so a ring may hold at most
    // 2^31 slots; no page-sized ring comes near that.
    let fit = if fit > (1 << 31) { 1 << 31 } else { fit };
    let pow = 1usize << (usize::BITS - 1 - fit.leading_zeros());
    pow as u32
}

/// Bytes one slot occupies for a ring of `Req` requests and `Rsp` responses.
pub const fn slot_size<Req: Slot, Rsp: Slot>() -> usize {
    if Req::SIZE > Rsp::SIZE {
        Req::SIZE
    } else {
        Rsp::SIZE
    }
}

/// Why a ring operation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// The memory cannot hold the header and one slot.
    #[error("ring memory of {len} bytes holds no {slot}-byte slot")]
    TooSmall {
        /// Bytes of ring memory.
        len: usize,
        /// Bytes of one slot (0 when even the header does not fit).
        slot: usize,
    },
    /// The memory is not 8-byte aligned.
    #[error("ring memory is not 8-byte aligned")]
    Misaligned,
    /// A slot type whose size is not a multiple of 8 bytes.
    #[error("slot size {0} is not a multiple of 8")]
    BadSlotSize(usize),
    /// No slot to write into: on a front ring every slot holds an unanswered request; on a
    /// back ring every consumed request already has its response.
    #[error("ring full")]
    Full,
    /// The peer's producer index is impossible: ahead by more than the protocol allows, or
    /// behind what was already consumed. The ring state was not changed.
    #[error("peer's {index} is {value}, impossible with consumer at {cons} and {limit} allowed")]
    Overflow {
        /// Which header field (`req_prod` or `rsp_prod`).
        index: &'static str,
        /// The value read from the page.
        value: u32,
        /// This side's consumer index.
        cons: u32,
        /// How many unconsumed entries the protocol allows at most right now.
        limit: u32,
    },
    /// A slot was consumed but its bytes are not a valid message.
    #[error("bad message in slot: {0}")]
    Message(#[from] crate::Error),
}

/// Initialise the shared header as `SHARED_RING_INIT` does, with both producer indices at
/// `start` (0 for a new ring), both event indices at `start + 1` and the padding zeroed.
///
/// [`FrontRing::new`] does this itself; call it directly when the side that owns the page
/// is not the request producer (a guest preparing an event ring the backend produces into,
/// which then takes its half with [`FrontRing::attach`]).
pub fn init_shared(mem: &SharedMem, start: u32) -> Result<(), RingError> {
    if mem.len() < layout::SLOTS {
        return Err(RingError::TooSmall {
            len: mem.len(),
            slot: 0,
        });
    }
    mem.store_u32(layout::REQ_EVENT, start.wrapping_add(1), Ordering::Relaxed);
    mem.store_u32(layout::RSP_EVENT, start.wrapping_add(1), Ordering::Relaxed);
    mem.zero(layout::PAD, layout::SLOTS - layout::PAD);
    mem.store_u32(layout::RSP_PROD, start, Ordering::Relaxed);
    // Release: a peer that sees these indices also sees the rest of the header.
    mem.store_u32(layout::REQ_PROD, start, Ordering::Release);
    Ok(())
}

/// Validates the memory for a ring of `Req`/`Rsp` slots and returns its slot count.
fn check_geometry<Req: Slot, Rsp: Slot>(mem: &SharedMem) -> Result<u32, RingError> {
    if Req::SIZE % SLOT_ALIGN != 0 {
        return Err(RingError::BadSlotSize(Req::SIZE));
    }
    if Rsp::SIZE % SLOT_ALIGN != 0 {
        return Err(RingError::BadSlotSize(Rsp::SIZE));
    }
    let slot = slot_size::<Req, Rsp>();
    let size = ring_size(slot, mem.len());
    if size == 0 {
        return Err(RingError::TooSmall {
            len: mem.len(),
            slot,
        });
    }
    Ok(size)
}

/// Byte offset of the slot for free-running index `idx`.
fn slot_offset(idx: u32, size: u32, slot: usize) -> usize {
    layout::SLOTS + (idx & (size - 1)) as usize * slot
}

/// The notify rule of ring.h: the consumer asked to be woken when the producer index passes
/// `event`; the producer moved it from `old` to `new`.
pub const fn needs_notify(old: u32, new: u32, event: u32) -> bool {
    new.wrapping_sub(event) < new.wrapping_sub(old)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_size_matches_const_ring_size() {
        // (4096 - 64) / slot, rounded down to a power of two.
        assert_eq!(ring_size(8, PAGE_SIZE), 256);
        assert_eq!(ring_size(64, PAGE_SIZE), 32);
        assert_eq!(ring_size(112, PAGE_SIZE), 32);
        assert_eq!(ring_size(128, PAGE_SIZE), 16);
        assert_eq!(ring_size(192, PAGE_SIZE), 16);
        assert_eq!(ring_size(256, PAGE_SIZE), 8);
        assert_eq!(ring_size(192, 4 * PAGE_SIZE), 64);
        assert_eq!(ring_size(4032, PAGE_SIZE), 1);
        assert_eq!(ring_size(4033, PAGE_SIZE), 0);
        assert_eq!(ring_size(0, PAGE_SIZE), 0);
        assert_eq!(ring_size(8, 64), 0);
        assert_eq!(ring_size(8, 72), 1);
    }

    #[test]
    fn notify_rule() {
        // Consumer waiting for index 5 (it consumed 0..4): a push from 4 to 5 crosses it.
        assert!(needs_notify(4, 5, 5));
        assert!(needs_notify(4, 8, 5));
        assert!(!needs_notify(5, 8, 5));
        assert!(!needs_notify(4, 4, 5));
        assert!(needs_notify(u32::MAX, 1, 0));
    }
}

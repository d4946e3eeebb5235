//! The engine's view of this process's memory in native mode.
//!
//! Under Xen the engine reaches a guest's queues and regions through mapped
//! grants; here they are this process's own memory:
//!
//! - send-queue slots hold the fragments of the MEDIUM message being posted,
//!   moved in from the protocol core's frames (no copy);
//! - receive-queue slots receive MEDIUM fragments from the engine and are
//!   moved out into the frames handed to the core;
//! - regions are the application's own buffers (a LARGE send's data, a LARGE
//!   receive's destination), read and written in place.
//!
//! Every access is checked against the area's bounds, as the engine's
//! [`GuestMemory`] contract asks.

use std::sync::{Arc, Mutex, MutexGuard};

use rustc_hash::FxHashMap;
use xmx_engine::{checked_range, GuestMemory, MemoryArea, MemoryError, RegionHandle};
use xmx_wire::msg::MEDIUM_FRAG_MAX;

use crate::segments::Segments;

const SLOT: u64 = MEDIUM_FRAG_MAX as u64;

#[derive(Debug, Default)]
struct Queues {
    send: Vec<Vec<u8>>,
    recv: Vec<Vec<u8>>,
}

#[derive(Debug, Default)]
struct Areas {
    queues: FxHashMap<u8, Queues>,
    regions: FxHashMap<RegionHandle, Segments>,
}

/// Queues and regions of this process, shared between the engine (which
/// owns one clone) and the transport (which fills and empties them).
#[derive(Clone, Debug, Default)]
pub(super) struct NativeMemory {
    areas: Arc<Mutex<Areas>>,
}

/// Slot `offset / 4096` of a queue and the range `[offset % 4096, + len)`
/// inside it, if the access stays within one slot of a queue of `slots`.
fn slot_range(
    offset: u64,
    len: usize,
    slots: usize,
) -> Result<(usize, std::ops::Range<usize>), MemoryError> {
    let size = slots as u64 * SLOT;
    checked_range(offset, len, size)?;
    let slot = (offset / SLOT) as usize;
    let start = (offset % SLOT) as usize;
    let end = start + len;
    if end as u64 > SLOT {
        return Err(MemoryError::OutOfBounds {
            offset,
            len,
            size: SLOT * (slot as u64 + 1),
        });
    }
    Ok((slot, start..end))
}

impl NativeMemory {
    fn lock(&self) -> MutexGuard<'_, Areas> {
        self.areas.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Maps the queues of endpoint `endpoint`.
    pub(super) fn add_endpoint(&self, endpoint: u8, send_slots: u16, recv_slots: u16) {
        self.lock().queues.insert(
            endpoint,
            Queues {
                send: vec![Vec::new(); usize::from(send_slots)],
                recv: vec![Vec::new(); usize::from(recv_slots)],
            },
        );
    }

    /// Unmaps the queues of endpoint `endpoint`.
    pub(super) fn remove_endpoint(&self, endpoint: u8) {
        self.lock().queues.remove(&endpoint);
    }

    /// Puts a MEDIUM fragment in send-queue slot `slot`; false if there is no
    /// such slot.
    pub(super) fn put_send_fragment(&self, endpoint: u8, slot: u16, data: Vec<u8>) -> bool {
        let mut areas = self.lock();
        let found = areas
            .queues
            .get_mut(&endpoint)
            .and_then(|q| q.send.get_mut(usize::from(slot)));
        match found {
            Some(s) if data.len() <= MEDIUM_FRAG_MAX => {
                *s = data;
                true
            }
            _ => false,
        }
    }

    /// Takes the first `len` bytes of receive-queue slot `slot` out, leaving
    /// the slot empty.
    pub(super) fn take_recv_fragment(&self, endpoint: u8, slot: u16, len: u16) -> Option<Vec<u8>> {
        let mut areas = self.lock();
        let s = areas
            .queues
            .get_mut(&endpoint)?
            .recv
            .get_mut(usize::from(slot))?;
        let mut data = std::mem::take(s);
        if data.len() < usize::from(len) {
            return None;
        }
        data.truncate(usize::from(len));
        Some(data)
    }

    /// Maps the application memory `data` as region `handle`.
    ///
    /// The memory must stay valid until [`NativeMemory::remove_region`]:
    /// `data` names a pending request's buffer, which MX requires the
    /// application to keep, and the region is removed before that request's
    /// completion is reported.
    pub(super) fn add_region(&self, handle: RegionHandle, data: Segments) {
        self.lock().regions.insert(handle, data);
    }

    /// Unmaps region `handle`.
    pub(super) fn remove_region(&self, handle: RegionHandle) {
        self.lock().regions.remove(&handle);
    }

    /// Number of regions mapped.
    #[cfg(test)]
    pub(super) fn regions(&self) -> usize {
        self.lock().regions.len()
    }
}

/// Walks the pieces of `segs` covering `[offset, offset + len)`, calling
/// `f(address, position in the access, bytes)` for each.
fn walk(
    segs: &Segments,
    offset: u64,
    len: usize,
    mut f: impl FnMut(usize, usize, usize),
) -> Result<(), MemoryError> {
    let range = checked_range(offset, len, segs.len() as u64)?;
    let mut skip = range.start;
    let mut done = 0;
    for &(addr, plen) in segs.parts() {
        if done == len {
            break;
        }
        if skip >= plen {
            skip -= plen;
            continue;
        }
        let n = (plen - skip).min(len - done);
        f(addr + skip, done, n);
        done += n;
        skip = 0;
    }
    if done == len {
        Ok(())
    } else {
        Err(MemoryError::Fault)
    }
}

impl GuestMemory for NativeMemory {
    fn read(&self, area: MemoryArea, offset: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let areas = self.lock();
        match area {
            MemoryArea::SendQueue { endpoint } | MemoryArea::RecvQueue { endpoint } => {
                let q = areas
                    .queues
                    .get(&endpoint)
                    .ok_or(MemoryError::NoSuchArea(area))?;
                let slots = if matches!(area, MemoryArea::SendQueue { .. }) {
                    &q.send
                } else {
                    &q.recv
                };
                let (slot, range) = slot_range(offset, buf.len(), slots.len())?;
                // Bytes never written read as absent, not as zeros.
                let src = slots
                    .get(slot)
                    .and_then(|s| s.get(range))
                    .ok_or(MemoryError::Fault)?;
                buf.copy_from_slice(src);
                Ok(())
            }
            // Native endpoints lend every region's data straight from the application.
            MemoryArea::FillMarks { .. } => Err(MemoryError::NoSuchArea(area)),
            MemoryArea::Region(handle) => {
                let segs = areas
                    .regions
                    .get(&handle)
                    .ok_or(MemoryError::NoSuchArea(area))?;
                let out = buf.as_mut_ptr();
                walk(segs, offset, buf.len(), |addr, at, n| {
                    // SAFETY: `walk` keeps `[addr, addr + n)` inside one piece
                    // of the region, which is application memory kept valid
                    // while the region is mapped (see `add_region`), and
                    // `[at, at + n)` inside `buf`. `buf` is the engine's own
                    // buffer, so the two do not overlap.
                    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, out.add(at), n) }
                })
            }
        }
    }

    fn write(&mut self, area: MemoryArea, offset: u64, data: &[u8]) -> Result<(), MemoryError> {
        let mut areas = self.lock();
        match area {
            MemoryArea::SendQueue { endpoint } | MemoryArea::RecvQueue { endpoint } => {
                let q = areas
                    .queues
                    .get_mut(&endpoint)
                    .ok_or(MemoryError::NoSuchArea(area))?;
                let slots = if matches!(area, MemoryArea::SendQueue { .. }) {
                    &mut q.send
                } else {
                    &mut q.recv
                };
                let (slot, range) = slot_range(offset, data.len(), slots.len())?;
                let s = slots.get_mut(slot).ok_or(MemoryError::Fault)?;
                if s.len() < range.end {
                    s.resize(range.end, 0);
                }
                s.get_mut(range)
                    .ok_or(MemoryError::Fault)?
                    .copy_from_slice(data);
                Ok(())
            }
            // Native endpoints lend every region's data straight from the application.
            MemoryArea::FillMarks { .. } => Err(MemoryError::NoSuchArea(area)),
            MemoryArea::Region(handle) => {
                let segs = areas
                    .regions
                    .get(&handle)
                    .ok_or(MemoryError::NoSuchArea(area))?;
                let src = data.as_ptr();
                walk(segs, offset, data.len(), |addr, at, n| {
                    // SAFETY: as in `read`: `[addr, addr + n)` lies inside a
                    // piece of a mapped region, writable application memory
                    // (a pending receive's buffer) kept valid while mapped,
                    // and `[at, at + n)` inside `data`, the engine's frame
                    // buffer, which does not overlap it.
                    unsafe { std::ptr::copy_nonoverlapping(src.add(at), addr as *mut u8, n) }
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs(parts: &mut [&mut [u8]]) -> Segments {
        let list = parts
            .iter_mut()
            .map(|p| (p.as_mut_ptr() as usize, p.len()))
            .collect();
        // SAFETY: the buffers outlive every access in the tests below.
        unsafe { Segments::from_parts(list) }
    }

    #[test]
    fn send_fragments_are_read_back_within_their_slot() {
        let mem = NativeMemory::default();
        mem.add_endpoint(3, 2, 1);
        let area = MemoryArea::SendQueue { endpoint: 3 };
        assert!(mem.put_send_fragment(3, 1, vec![7; 100]));
        assert!(!mem.put_send_fragment(3, 2, vec![7; 100]), "no slot 2");
        assert!(!mem.put_send_fragment(4, 0, vec![7; 100]), "no endpoint 4");
        let mut buf = [0u8; 100];
        mem.read(area, SLOT, &mut buf).unwrap();
        assert_eq!(buf, [7; 100]);
        // Past the fragment's bytes, past the slot, past the queue.
        assert_eq!(mem.read(area, SLOT + 1, &mut buf), Err(MemoryError::Fault));
        let mut big = vec![0u8; 4097];
        assert!(matches!(
            mem.read(area, 0, &mut big),
            Err(MemoryError::OutOfBounds { .. })
        ));
        assert!(matches!(
            mem.read(area, 2 * SLOT, &mut buf),
            Err(MemoryError::OutOfBounds { .. })
        ));
        assert_eq!(
            mem.read(MemoryArea::SendQueue { endpoint: 9 }, 0, &mut buf),
            Err(MemoryError::NoSuchArea(MemoryArea::SendQueue {
                endpoint: 9
            }))
        );
    }

    #[test]
    fn received_fragments_are_taken_out_once() {
        let mut mem = NativeMemory::default();
        mem.add_endpoint(0, 1, 2);
        let area = MemoryArea::RecvQueue { endpoint: 0 };
        mem.write(area, SLOT + 10, b"tail").unwrap();
        assert!(matches!(
            mem.write(area, SLOT + 4094, b"tail"),
            Err(MemoryError::OutOfBounds { .. })
        ));
        mem.write(area, SLOT, b"0123456789").unwrap();
        assert_eq!(
            mem.take_recv_fragment(0, 1, 14).as_deref(),
            Some(&b"0123456789tail"[..])
        );
        assert_eq!(mem.take_recv_fragment(0, 1, 1), None, "slot emptied");
        assert_eq!(mem.take_recv_fragment(0, 5, 0), None, "no slot 5");
        mem.remove_endpoint(0);
        assert_eq!(mem.write(area, 0, b"x"), Err(MemoryError::NoSuchArea(area)));
    }

    #[test]
    fn regions_span_the_application_segments() {
        let mut mem = NativeMemory::default();
        let (mut a, mut b) = (vec![0u8; 5], vec![0u8; 7]);
        let h = RegionHandle(4);
        let area = MemoryArea::Region(h);
        mem.add_region(h, segs(&mut [&mut a[..], &mut b[..]]));
        assert_eq!(mem.regions(), 1);
        mem.write(area, 3, b"abcdef").unwrap();
        let mut out = [0u8; 12];
        mem.read(area, 0, &mut out).unwrap();
        assert_eq!(&out, b"\0\0\0abcdef\0\0\0");
        assert!(matches!(
            mem.write(area, 8, b"12345"),
            Err(MemoryError::OutOfBounds { size: 12, .. })
        ));
        assert!(matches!(
            mem.read(area, u64::MAX, &mut out[..1]),
            Err(MemoryError::OutOfBounds { .. })
        ));
        mem.remove_region(h);
        assert_eq!(
            mem.read(area, 0, &mut out),
            Err(MemoryError::NoSuchArea(area))
        );
        drop(mem);
        assert_eq!(a, b"\0\0\0ab");
        assert_eq!(b, b"cdef\0\0\0");
    }
}

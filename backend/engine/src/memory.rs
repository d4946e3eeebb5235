//! Guest memory as the engine sees it: areas addressed by offset, every access checked.
//!
//! The daemon implements [`GuestMemory`] over the grants it mapped for a guest (endpoint
//! queues, registered regions). The engine never holds a pointer into guest memory: it
//! copies bytes in and out through this trait, so a guest changing its pages concurrently
//! can corrupt only its own data, never the engine's state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Names a registered region's memory; chosen by the daemon when it maps the region and
/// handed back unchanged in [`MemoryArea::Region`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionHandle(pub u64);

/// A contiguous area of one guest's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryArea {
    /// An endpoint's send queue: MEDIUM fragments, 4096 bytes per slot.
    SendQueue {
        /// The endpoint index.
        endpoint: u8,
    },
    /// An endpoint's receive queue: MEDIUM fragments, 4096 bytes per slot.
    RecvQueue {
        /// The endpoint index.
        endpoint: u8,
    },
    /// A registered region.
    Region(RegionHandle),
    /// An endpoint's region fill marks (`xmx_wire::msg::fill_marks`): the guest lends a
    /// region's data to pullers only while its bit is set. An endpoint without this area
    /// (the native mode) has every region filled.
    FillMarks {
        /// The endpoint index.
        endpoint: u8,
    },
}

/// Why a guest memory access failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    /// The area is not mapped.
    #[error("area {0:?} is not mapped")]
    NoSuchArea(MemoryArea),
    /// The access leaves the area.
    #[error("access at {offset} of {len} bytes leaves an area of {size} bytes")]
    OutOfBounds {
        /// Where the access starts in the area.
        offset: u64,
        /// Bytes accessed.
        len: usize,
        /// Bytes in the area.
        size: u64,
    },
    /// The mapping failed underneath (unmapped grant, revoked page).
    #[error("memory fault")]
    Fault,
}

/// Byte access to one guest's shared memory. Implementations check every access against
/// the area's size and never panic.
pub trait GuestMemory: Send {
    /// Copy `buf.len()` bytes at `offset` of `area` into `buf`.
    fn read(&self, area: MemoryArea, offset: u64, buf: &mut [u8]) -> Result<(), MemoryError>;
    /// Copy `data` to `offset` of `area`.
    fn write(&mut self, area: MemoryArea, offset: u64, data: &[u8]) -> Result<(), MemoryError>;
}

/// The bytes `offset..offset+len` of an area of `size` bytes, or why not.
pub fn checked_range(
    offset: u64,
    len: usize,
    size: u64,
) -> Result<std::ops::Range<usize>, MemoryError> {
    let out = MemoryError::OutOfBounds { offset, len, size };
    let end = offset.checked_add(len as u64).ok_or(out)?;
    if end > size {
        return Err(out);
    }
    let start = usize::try_from(offset).map_err(|_| out)?;
    let end = usize::try_from(end).map_err(|_| out)?;
    Ok(start..end)
}

/// Guest memory held in vectors, for tests and for the native (non-Xen) mode. Clones share
/// the same memory, so a test keeps a clone to fill and inspect what the engine owns.
#[derive(Debug, Clone, Default)]
pub struct InMemoryGuest {
    areas: Arc<Mutex<HashMap<MemoryArea, Vec<u8>>>>,
}

impl InMemoryGuest {
    /// No area yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<MemoryArea, Vec<u8>>> {
        // A panic elsewhere while holding the lock leaves plain bytes behind; keep using them.
        self.areas.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Map a zero-filled area of `size` bytes (replacing any previous one).
    pub fn add_area(&self, area: MemoryArea, size: usize) {
        self.lock().insert(area, vec![0; size]);
    }

    /// Map an area holding `bytes`.
    pub fn add_area_with(&self, area: MemoryArea, bytes: Vec<u8>) {
        self.lock().insert(area, bytes);
    }

    /// Copy `bytes` into an area at `offset` (what the guest itself would do).
    pub fn write_at(&self, area: MemoryArea, offset: u64, bytes: &[u8]) -> Result<(), MemoryError> {
        self.clone().write(area, offset, bytes)
    }

    /// Unmap an area.
    pub fn remove_area(&self, area: MemoryArea) {
        self.lock().remove(&area);
    }

    /// A copy of a whole area.
    pub fn area(&self, area: MemoryArea) -> Option<Vec<u8>> {
        self.lock().get(&area).cloned()
    }
}

impl GuestMemory for InMemoryGuest {
    fn read(&self, area: MemoryArea, offset: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let areas = self.lock();
        let bytes = areas.get(&area).ok_or(MemoryError::NoSuchArea(area))?;
        let range = checked_range(offset, buf.len(), bytes.len() as u64)?;
        let src = bytes.get(range).ok_or(MemoryError::Fault)?;
        buf.copy_from_slice(src);
        Ok(())
    }

    fn write(&mut self, area: MemoryArea, offset: u64, data: &[u8]) -> Result<(), MemoryError> {
        let mut areas = self.lock();
        let bytes = areas.get_mut(&area).ok_or(MemoryError::NoSuchArea(area))?;
        let range = checked_range(offset, data.len(), bytes.len() as u64)?;
        let dst = bytes.get_mut(range).ok_or(MemoryError::Fault)?;
        dst.copy_from_slice(data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accesses_are_bounded() {
        let mut mem = InMemoryGuest::new();
        let area = MemoryArea::Region(RegionHandle(7));
        mem.add_area(area, 10);
        mem.write(area, 6, b"abcd").unwrap();
        let mut out = [0u8; 4];
        mem.read(area, 6, &mut out).unwrap();
        assert_eq!(&out, b"abcd");
        assert_eq!(
            mem.write(area, 7, b"abcd"),
            Err(MemoryError::OutOfBounds {
                offset: 7,
                len: 4,
                size: 10
            })
        );
        assert_eq!(
            mem.read(area, u64::MAX, &mut out),
            Err(MemoryError::OutOfBounds {
                offset: u64::MAX,
                len: 4,
                size: 10
            })
        );
        let other = MemoryArea::SendQueue { endpoint: 0 };
        assert_eq!(
            mem.read(other, 0, &mut out),
            Err(MemoryError::NoSuchArea(other))
        );
        // A clone sees the same bytes.
        assert_eq!(mem.clone().area(area).unwrap()[6..], *b"abcd");
    }
}

//! [`GrantMemory`]: a guest's endpoint queues and registered regions, as the engine reaches
//! them, over the grants the backend mapped.
//!
//! Each area is a window of a [`SharedMem`] (which keeps its mapping alive). Every access is
//! bounds-checked against the window and copies bytes with atomic loads or stores, so a guest
//! rewriting its pages concurrently changes only the bytes copied, never what the engine
//! validated afterwards: the engine always works on its own copy.

use std::sync::{Arc, Mutex, MutexGuard};

use rustc_hash::FxHashMap;

use xmx_wire::ring::SharedMem;

use xmx_engine::{checked_range, GuestMemory, MemoryArea, MemoryError};

/// A window of mapped guest memory.
#[derive(Debug, Clone)]
struct GuestWindow {
    mem: SharedMem,
    /// Offset of the window's first byte within `mem`.
    base: usize,
    /// Length of the window.
    len: u64,
}

/// One guest's mapped areas. Clones share the same table: the daemon keeps one to add and
/// remove areas while the engine owns another.
#[derive(Debug, Clone, Default)]
pub struct GrantMemory {
    areas: Arc<Mutex<FxHashMap<MemoryArea, GuestWindow>>>,
}

impl GrantMemory {
    /// No area yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, FxHashMap<MemoryArea, GuestWindow>> {
        // The table holds plain handles; one left by a panicking thread is still whole.
        self.areas.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Make `len` bytes of `mem` starting at `base` reachable as `area`; false (and nothing
    /// added) if the window does not fit in `mem`.
    pub fn add(&self, area: MemoryArea, mem: SharedMem, base: usize, len: usize) -> bool {
        let fits = base.checked_add(len).is_some_and(|end| end <= mem.len());
        if !fits {
            return false;
        }
        self.lock().insert(
            area,
            GuestWindow {
                mem,
                base,
                len: len as u64,
            },
        );
        true
    }

    /// Forget an area; its mapping goes once no other handle holds it.
    pub fn remove(&self, area: MemoryArea) -> bool {
        self.lock().remove(&area).is_some()
    }

    /// Number of areas.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True if no area is mapped.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forget every area.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Copies `n` bytes at `offset` of `area` with `copy` (given the window's memory and
    /// the first byte's offset in it). The copy runs under the table's lock, the window
    /// borrowed rather than cloned: a frame's copy is a few microseconds, and a clone and
    /// drop per frame (two atomic updates of the mapping's count) cost more than the
    /// daemon's rare wait to add or remove an area.
    fn copy(
        &self,
        area: MemoryArea,
        offset: u64,
        n: usize,
        copy: impl FnOnce(&SharedMem, usize) -> bool,
    ) -> Result<(), MemoryError> {
        let areas = self.lock();
        let w = areas.get(&area).ok_or(MemoryError::NoSuchArea(area))?;
        let range = checked_range(offset, n, w.len)?;
        let at = w.base.checked_add(range.start).ok_or(MemoryError::Fault)?;
        if copy(&w.mem, at) {
            Ok(())
        } else {
            Err(MemoryError::Fault)
        }
    }
}

impl GuestMemory for GrantMemory {
    fn read(&self, area: MemoryArea, offset: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        self.copy(area, offset, buf.len(), |mem, at| mem.read_bytes(at, buf))
    }

    fn write(&mut self, area: MemoryArea, offset: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.copy(area, offset, data.len(), |mem, at| {
            mem.write_bytes(at, data)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xmx_engine::RegionHandle;

    #[test]
    fn windows_are_bounded_and_offset() {
        let mem = SharedMem::new_owned(2);
        let mut gm = GrantMemory::new();
        let area = MemoryArea::Region(RegionHandle(1));
        assert!(gm.add(area, mem.clone(), 100, 5000));
        gm.write(area, 4990, b"0123456789").unwrap();
        let mut raw = [0u8; 10];
        assert!(mem.read_bytes(5090, &mut raw));
        assert_eq!(&raw, b"0123456789");
        let mut back = [0u8; 10];
        gm.read(area, 4990, &mut back).unwrap();
        assert_eq!(back, raw);
        assert_eq!(
            gm.write(area, 4991, b"0123456789"),
            Err(MemoryError::OutOfBounds {
                offset: 4991,
                len: 10,
                size: 5000
            })
        );
        assert_eq!(
            gm.read(area, u64::MAX, &mut back),
            Err(MemoryError::OutOfBounds {
                offset: u64::MAX,
                len: 10,
                size: 5000
            })
        );
    }

    #[test]
    fn windows_must_fit_their_mapping() {
        let mem = SharedMem::new_owned(1);
        let gm = GrantMemory::new();
        let area = MemoryArea::SendQueue { endpoint: 0 };
        assert!(!gm.add(area, mem.clone(), 1, 4096));
        assert!(!gm.add(area, mem.clone(), usize::MAX, 2));
        assert!(gm.is_empty());
        assert!(gm.add(area, mem, 0, 4096));
        assert_eq!(gm.len(), 1);
    }

    #[test]
    fn removed_areas_are_refused_and_clones_share_the_table() {
        let gm = GrantMemory::new();
        let mut engine_side = gm.clone();
        let area = MemoryArea::RecvQueue { endpoint: 3 };
        assert!(gm.add(area, SharedMem::new_owned(1), 0, 4096));
        engine_side.write(area, 0, b"x").unwrap();
        assert!(gm.remove(area));
        assert_eq!(
            engine_side.write(area, 0, b"x"),
            Err(MemoryError::NoSuchArea(area))
        );
        assert!(!gm.remove(area));
    }
}

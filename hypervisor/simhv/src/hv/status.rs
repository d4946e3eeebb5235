//! The status page of one event-channel handle: one word per port, written only here.
//!
//! The page is a sealed memfd (it can neither shrink nor grow, so the daemon's mapping
//! can never fault); the handle's process gets a read-only descriptor of it.

use std::ffi::CStr;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use xmx_hv::sim::mmap::Region;
use xmx_hv::sim::proto::{status_word, GENERATION_MASK, PORT_FREE, STATUS_SLOTS};
use xmx_hv::PAGE_SIZE;

/// One handle's status page and its slot allocator.
pub(crate) struct StatusPageWriter {
    memfd: OwnedFd,
    region: Region,
    free: Vec<u32>,
    next_slot: u32,
    next_generation: u32,
}

impl StatusPageWriter {
    /// A fresh page with every slot free.
    pub(crate) fn new() -> io::Result<StatusPageWriter> {
        const NAME: &CStr = c"xmx-evtchn-status";
        let memfd = memfd_create(
            NAME,
            MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
        )?;
        nix::unistd::ftruncate(memfd.as_fd(), PAGE_SIZE as i64)?;
        fcntl(
            memfd.as_raw_fd(),
            FcntlArg::F_ADD_SEALS(
                SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL,
            ),
        )?;
        let region = Region::map_file(memfd.as_fd(), PAGE_SIZE, true)?;
        Ok(StatusPageWriter {
            memfd,
            region,
            free: Vec::new(),
            next_slot: 0,
            next_generation: 1,
        })
    }

    /// A read-only descriptor of the page for the handle's process.
    pub(crate) fn reader_fd(&self) -> io::Result<OwnedFd> {
        let path = format!("/proc/self/fd/{}", self.memfd.as_raw_fd());
        match OpenOptions::new().read(true).open(path) {
            Ok(f) => Ok(f.into()),
            // Without /proc, share the page itself: a client can only confuse itself.
            Err(_) => self.memfd.try_clone(),
        }
    }

    /// Take a slot; returns it and its new generation, or None if all are in use.
    pub(crate) fn alloc(&mut self) -> Option<(u32, u32)> {
        let slot = match self.free.pop() {
            Some(s) => s,
            None if (self.next_slot as usize) < STATUS_SLOTS => {
                self.next_slot += 1;
                self.next_slot - 1
            }
            None => return None,
        };
        let generation = self.next_generation & GENERATION_MASK;
        self.next_generation = self.next_generation.wrapping_add(1);
        Some((slot, generation))
    }

    /// Publish the state of a slot.
    pub(crate) fn set(&self, slot: u32, generation: u32, state: u32) {
        if slot as usize >= STATUS_SLOTS {
            return;
        }
        // SAFETY: slot < STATUS_SLOTS, so the word lies inside the one-page mapping this
        // StatusPageWriter owns (sealed: the file cannot shrink under it); the address is 4-byte
        // aligned and AtomicU32 has u32's layout. Readers only load atomically.
        let word = unsafe { &*(self.region.as_ptr().add(slot as usize * 4) as *const AtomicU32) };
        word.store(status_word(generation, state), Ordering::Release);
    }

    /// Free a slot; its word reads as no port.
    pub(crate) fn release(&mut self, slot: u32) {
        self.set(slot, 0, PORT_FREE);
        self.free.push(slot);
    }

    /// Slots in use.
    pub(crate) fn in_use(&self) -> usize {
        self.next_slot as usize - self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xmx_hv::sim::proto::{split_status_word, PORT_BOUND};

    #[test]
    fn the_reader_sees_published_words_and_cannot_resize() {
        let mut page = StatusPageWriter::new().unwrap();
        let (slot, generation) = page.alloc().unwrap();
        page.set(slot, generation, PORT_BOUND);
        let fd = page.reader_fd().unwrap();
        let view = Region::map_file(fd.as_fd(), PAGE_SIZE, false).unwrap();
        // SAFETY: one readable page, slot < STATUS_SLOTS.
        let w = unsafe { (view.as_ptr().add(slot as usize * 4) as *const u32).read_volatile() };
        assert_eq!(split_status_word(w), (generation, PORT_BOUND));
        assert!(nix::unistd::ftruncate(page.memfd.as_fd(), 0).is_err());
        page.release(slot);
        assert_eq!(page.in_use(), 0);
        let (again, g2) = page.alloc().unwrap();
        assert_eq!(again, slot);
        assert_ne!(g2, generation);
    }

    #[test]
    fn slots_run_out() {
        let mut page = StatusPageWriter::new().unwrap();
        for _ in 0..STATUS_SLOTS {
            assert!(page.alloc().is_some());
        }
        assert!(page.alloc().is_none());
    }
}

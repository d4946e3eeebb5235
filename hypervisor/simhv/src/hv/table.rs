//! A domain's grant table: Xen v1 entries in shared memory, and a free-ref allocator.
//!
//! Entry layout (grant_entry_v1, little-endian as on x86): `flags u16 | domid u16 |
//! frame u32`. An entry is installed as a guest does it: domid and frame first, then the
//! flags that make it valid.
//!
//! The table is an anonymous shared-memory file (memfd) the daemon maps: entries are read
//! and written with plain atomic loads and stores, no system call per grant (a table on a
//! disk file system cost several `pwrite`s of page cache per granted page). The file is
//! sealed against growing and shrinking before it is mapped, so nobody can cut it short
//! under the daemon's mapping. For inspection, the domain's directory holds `gnttab`, a
//! link to the daemon's descriptor of it.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use xmx_hv::sim::mmap::Region;
use xmx_hv::{DomId, GrantRef};

/// Type bits of an entry.
pub(crate) const GTF_TYPE_MASK: u16 = 3;
/// Type: the entry grants `domid` access to `frame`.
pub(crate) const GTF_PERMIT_ACCESS: u16 = 1;
/// `domid` may only read.
pub(crate) const GTF_READONLY: u16 = 1 << 2;
/// Currently mapped (any access) by `domid`; set by the hypervisor.
pub(crate) const GTF_READING: u16 = 1 << 3;
/// Currently mapped writable by `domid`; set by the hypervisor.
pub(crate) const GTF_WRITING: u16 = 1 << 4;
/// Refs a Xen guest keeps for itself (console, xenstore) and never hands out.
pub(crate) const RESERVED_REFS: u32 = 8;
/// Bytes per entry.
pub(crate) const ENTRY_LEN: u64 = 8;

/// One v1 entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EntryV1 {
    pub flags: u16,
    pub domid: DomId,
    pub frame: u32,
}

/// The grant table of one domain.
pub(crate) struct TableFile {
    /// Keeps the memory (and the inspection link's target) alive.
    _file: File,
    map: Region,
    entries: u32,
    next_fresh: u32,
    free: BTreeSet<u32>,
}

impl TableFile {
    /// Create a zeroed table of `entries` entries, and the link to it at `path`.
    pub(crate) fn create(path: &Path, entries: u32) -> io::Result<TableFile> {
        let name = CString::new("xmx-simhv:gnttab").unwrap_or_default();
        let fd = memfd_create(
            &name,
            MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
        )
        .map_err(io::Error::from)?;
        let file = File::from(fd);
        let len = (entries.max(1) as u64 * ENTRY_LEN) as usize;
        file.set_len(len as u64)?;
        fcntl(
            file.as_raw_fd(),
            FcntlArg::F_ADD_SEALS(
                SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_SEAL,
            ),
        )
        .map_err(io::Error::from)?;
        let map = Region::map_file(file.as_fd(), len, true)?;
        let target = format!("/proc/{}/fd/{}", std::process::id(), file.as_raw_fd());
        std::os::unix::fs::symlink(target, path)?;
        Ok(TableFile {
            _file: file,
            map,
            entries,
            next_fresh: RESERVED_REFS.min(entries),
            free: BTreeSet::new(),
        })
    }

    fn flags_at(&self, r: GrantRef) -> &AtomicU16 {
        debug_assert!(r < self.entries);
        // SAFETY: r < entries (every caller checks), so the entry lies inside the mapping,
        // which lives as long as self; the mapping is page aligned and entries are 8 bytes,
        // so the field is aligned; the file is sealed against shrinking, so the memory
        // stays backed; it is only accessed atomically.
        unsafe { &*(self.map.as_ptr().add(r as usize * ENTRY_LEN as usize) as *const AtomicU16) }
    }

    fn domid_at(&self, r: GrantRef) -> &AtomicU16 {
        // SAFETY: as in flags_at, two bytes further (still inside the 8-byte entry).
        unsafe {
            &*(self.map.as_ptr().add(r as usize * ENTRY_LEN as usize + 2) as *const AtomicU16)
        }
    }

    fn frame_at(&self, r: GrantRef) -> &AtomicU32 {
        // SAFETY: as in flags_at, four bytes further (4-byte aligned, inside the entry).
        unsafe {
            &*(self.map.as_ptr().add(r as usize * ENTRY_LEN as usize + 4) as *const AtomicU32)
        }
    }

    /// Number of entries.
    pub(crate) fn entries(&self) -> u32 {
        self.entries
    }

    /// Refs that can still be allocated.
    pub(crate) fn available(&self) -> usize {
        (self.entries - self.next_fresh) as usize + self.free.len()
    }

    /// Take the lowest free ref.
    pub(crate) fn alloc_ref(&mut self) -> Option<GrantRef> {
        if let Some(r) = self.free.pop_first() {
            return Some(r);
        }
        if self.next_fresh < self.entries {
            self.next_fresh += 1;
            return Some(self.next_fresh - 1);
        }
        None
    }

    /// Return a ref (its entry must already be cleared).
    pub(crate) fn free_ref(&mut self, r: GrantRef) {
        if r >= RESERVED_REFS && r < self.next_fresh {
            self.free.insert(r);
        }
    }

    /// Take `used` as the refs in use after a restore, on a table that handed none out.
    pub(crate) fn adopt_refs(&mut self, used: &BTreeSet<u32>) -> io::Result<()> {
        let fresh = RESERVED_REFS.min(self.entries);
        if self.next_fresh != fresh || !self.free.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "restoring grants into a table in use",
            ));
        }
        if let Some(&r) = used
            .iter()
            .find(|&&r| r < RESERVED_REFS || r >= self.entries)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "grant ref {r} is reserved or outside the table of {} entries",
                    self.entries
                ),
            ));
        }
        if let Some(&last) = used.last() {
            self.next_fresh = last + 1;
        }
        self.free = (fresh..self.next_fresh)
            .filter(|r| !used.contains(r))
            .collect();
        Ok(())
    }

    /// Read entry `r`.
    pub(crate) fn read(&self, r: GrantRef) -> io::Result<EntryV1> {
        if r >= self.entries {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "ref out of range",
            ));
        }
        Ok(EntryV1 {
            flags: u16::from_le(self.flags_at(r).load(Ordering::Acquire)),
            domid: u16::from_le(self.domid_at(r).load(Ordering::Relaxed)),
            frame: u32::from_le(self.frame_at(r).load(Ordering::Relaxed)),
        })
    }

    /// Make `r` grant `domid` access to `frame`: domid and frame first, flags last.
    pub(crate) fn install(
        &self,
        r: GrantRef,
        domid: DomId,
        frame: u32,
        flags: u16,
    ) -> io::Result<()> {
        self.check(r)?;
        self.domid_at(r).store(domid.to_le(), Ordering::Relaxed);
        self.frame_at(r).store(frame.to_le(), Ordering::Relaxed);
        self.set_flags(r, flags)
    }

    /// Overwrite the flags of `r`.
    pub(crate) fn set_flags(&self, r: GrantRef, flags: u16) -> io::Result<()> {
        self.check(r)?;
        self.flags_at(r).store(flags.to_le(), Ordering::Release);
        Ok(())
    }

    /// Invalidate `r`: flags first, then the rest.
    pub(crate) fn clear(&self, r: GrantRef) -> io::Result<()> {
        self.set_flags(r, 0)?;
        self.domid_at(r).store(0, Ordering::Relaxed);
        self.frame_at(r).store(0, Ordering::Relaxed);
        Ok(())
    }

    fn check(&self, r: GrantRef) -> io::Result<()> {
        if r >= self.entries {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "ref out of range",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_have_the_v1_byte_layout() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gnttab");
        let mut t = TableFile::create(&path, 64).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 64 * 8);
        let r = t.alloc_ref().unwrap();
        assert_eq!(r, RESERVED_REFS);
        t.install(r, 0x0102, 0x0a0b0c0d, GTF_PERMIT_ACCESS | GTF_READONLY)
            .unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let at = r as usize * 8;
        assert_eq!(
            &bytes[at..at + 8],
            &[0x05, 0x00, 0x02, 0x01, 0x0d, 0x0c, 0x0b, 0x0a]
        );
        assert_eq!(
            t.read(r).unwrap(),
            EntryV1 {
                flags: 5,
                domid: 0x0102,
                frame: 0x0a0b0c0d
            }
        );
        t.clear(r).unwrap();
        assert_eq!(&std::fs::read(&path).unwrap()[at..at + 8], &[0u8; 8]);
        // Out of range refs are refused, not written.
        assert!(t.install(64, 1, 1, GTF_PERMIT_ACCESS).is_err());
        assert!(t.set_flags(64, GTF_PERMIT_ACCESS).is_err());
    }

    #[test]
    fn the_table_cannot_be_cut_short_under_the_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gnttab");
        let t = TableFile::create(&path, 64).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        assert!(f.set_len(0).is_err(), "a sealed table shrank");
        assert!(f.set_len(1 << 20).is_err(), "a sealed table grew");
        assert_eq!(t.read(63).unwrap().flags, 0);
    }

    #[test]
    fn refs_are_reused_lowest_first_and_run_out() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = TableFile::create(&dir.path().join("g"), 11).unwrap();
        assert_eq!(t.available(), 3);
        let a = t.alloc_ref().unwrap();
        let b = t.alloc_ref().unwrap();
        let c = t.alloc_ref().unwrap();
        assert_eq!((a, b, c), (8, 9, 10));
        assert_eq!(t.alloc_ref(), None);
        t.free_ref(9);
        t.free_ref(3); // reserved: ignored
        assert_eq!(t.available(), 1);
        assert_eq!(t.alloc_ref(), Some(9));
        assert!(t.read(11).is_err());
    }

    #[test]
    fn restored_refs_are_in_use_and_the_gaps_free() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = TableFile::create(&dir.path().join("g"), 16).unwrap();
        t.adopt_refs(&[9, 12].into_iter().collect()).unwrap();
        assert_eq!(t.available(), 16 - 8 - 2);
        assert_eq!(t.alloc_ref(), Some(8));
        assert_eq!(t.alloc_ref(), Some(10));
        assert_eq!(t.alloc_ref(), Some(11));
        assert_eq!(t.alloc_ref(), Some(13));
        // Only once, and only into a fresh table.
        assert!(t.adopt_refs(&BTreeSet::new()).is_err());
        let mut u = TableFile::create(&dir.path().join("h"), 16).unwrap();
        assert!(u.adopt_refs(&[3].into_iter().collect()).is_err());
        assert!(u.adopt_refs(&[16].into_iter().collect()).is_err());
        assert_eq!(u.available(), 8);
    }
}

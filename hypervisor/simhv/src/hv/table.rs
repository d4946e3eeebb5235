//! A domain's grant table: Xen v1 entries in a file, and a free-ref allocator.
//!
//! Entry layout (grant_entry_v1, little-endian as on x86): `flags u16 | domid u16 |
//! frame u32`. An entry is installed as a guest does it: domid and frame first, then the
//! flags that make it valid. The daemon accesses the file with `pread`/`pwrite` only.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

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

impl EntryV1 {
    fn from_bytes(b: [u8; 8]) -> EntryV1 {
        EntryV1 {
            flags: u16::from_le_bytes([b[0], b[1]]),
            domid: u16::from_le_bytes([b[2], b[3]]),
            frame: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        }
    }
}

/// The grant-table file of one domain.
pub(crate) struct TableFile {
    file: File,
    entries: u32,
    next_fresh: u32,
    free: BTreeSet<u32>,
}

impl TableFile {
    /// Create a zeroed table of `entries` entries at `path`.
    pub(crate) fn create(path: &Path, entries: u32) -> io::Result<TableFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        file.set_len(entries as u64 * ENTRY_LEN)?;
        Ok(TableFile {
            file,
            entries,
            next_fresh: RESERVED_REFS.min(entries),
            free: BTreeSet::new(),
        })
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

    /// Read entry `r` (a copy; the file is not trusted to be unchanged).
    pub(crate) fn read(&self, r: GrantRef) -> io::Result<EntryV1> {
        if r >= self.entries {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "ref out of range",
            ));
        }
        let mut b = [0u8; 8];
        let n = self.file.read_at(&mut b, r as u64 * ENTRY_LEN)?;
        if n != b.len() {
            // Cut short behind our back: treat the entry as invalid.
            return Ok(EntryV1 {
                flags: 0,
                domid: 0,
                frame: 0,
            });
        }
        Ok(EntryV1::from_bytes(b))
    }

    /// Make `r` grant `domid` access to `frame`: domid and frame first, flags last.
    pub(crate) fn install(
        &self,
        r: GrantRef,
        domid: DomId,
        frame: u32,
        flags: u16,
    ) -> io::Result<()> {
        let mut tail = [0u8; 6];
        tail[..2].copy_from_slice(&domid.to_le_bytes());
        tail[2..].copy_from_slice(&frame.to_le_bytes());
        self.file.write_all_at(&tail, r as u64 * ENTRY_LEN + 2)?;
        self.set_flags(r, flags)
    }

    /// Overwrite the flags of `r`.
    pub(crate) fn set_flags(&self, r: GrantRef, flags: u16) -> io::Result<()> {
        self.file
            .write_all_at(&flags.to_le_bytes(), r as u64 * ENTRY_LEN)
    }

    /// Invalidate `r`: flags first, then the rest.
    pub(crate) fn clear(&self, r: GrantRef) -> io::Result<()> {
        self.set_flags(r, 0)?;
        self.file.write_all_at(&[0u8; 6], r as u64 * ENTRY_LEN + 2)
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
}

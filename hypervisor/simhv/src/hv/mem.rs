//! A domain's memory: a file whose page `f` is frame `f`, with a frame allocator.
//!
//! The file grows on demand (sparse) up to the domain's limit and never shrinks, so a
//! mapping of any frame ever handed out stays backed. Freed frames are zeroed (hole
//! punched) before reuse, so granted pages always start zeroed. The daemon itself reads
//! and writes frames with `pread`/`pwrite` only: nothing a client does to the file can
//! fault the daemon.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use nix::fcntl::{fallocate, FallocateFlags};
use xmx_hv::{Error, Result, PAGE_SIZE};

/// Frames the file grows by at least, to keep `ftruncate` calls rare.
const GROW_FRAMES: u32 = 256;

/// The memory file of one domain.
pub(crate) struct MemFile {
    rw: File,
    ro: File,
    limit_frames: u32,
    size_frames: u32,
    next_fresh: u32,
    free: BTreeSet<u32>,
    in_use: usize,
}

impl MemFile {
    /// Create the (empty) file at `path`, limited to `limit` bytes.
    pub(crate) fn create(path: &Path, limit: u64) -> io::Result<MemFile> {
        let rw = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        let ro = OpenOptions::new().read(true).open(path)?;
        let limit_frames = (limit / PAGE_SIZE as u64).min(u32::MAX as u64) as u32;
        Ok(MemFile {
            rw,
            ro,
            limit_frames,
            size_frames: 0,
            next_fresh: 0,
            free: BTreeSet::new(),
            in_use: 0,
        })
    }

    /// A descriptor mapping may use: read-write or read-only.
    pub(crate) fn fd(&self, writable: bool) -> BorrowedFd<'_> {
        if writable {
            self.rw.as_fd()
        } else {
            self.ro.as_fd()
        }
    }

    /// Frames in use.
    pub(crate) fn in_use(&self) -> usize {
        self.in_use
    }

    /// Whether `frame` has ever been handed out (so it lies inside the file).
    pub(crate) fn contains(&self, frame: u32) -> bool {
        frame < self.next_fresh
    }

    /// Allocate `count` zeroed frames, lowest first; all or nothing.
    pub(crate) fn alloc(&mut self, count: usize) -> Result<Vec<u32>> {
        let available = (self.limit_frames as usize).saturating_sub(self.in_use);
        if count > available {
            return Err(Error::Quota(format!(
                "memory limit: {count} pages asked, {available} left of {}",
                self.limit_frames
            )));
        }
        let from_free = count.min(self.free.len());
        let fresh = (count - from_free) as u32;
        let end = self.next_fresh + fresh;
        if end > self.size_frames {
            let target = end
                .max(self.size_frames.saturating_mul(2))
                .max(self.size_frames + GROW_FRAMES)
                .min(self.limit_frames.max(end));
            self.rw
                .set_len(target as u64 * PAGE_SIZE as u64)
                .map_err(Error::Io)?;
            self.size_frames = target;
        }
        let mut frames = Vec::with_capacity(count);
        for _ in 0..from_free {
            if let Some(f) = self.free.pop_first() {
                frames.push(f);
            }
        }
        frames.extend(self.next_fresh..end);
        self.next_fresh = end;
        self.in_use += frames.len();
        Ok(frames)
    }

    /// Give a frame back; its contents are zeroed now.
    pub(crate) fn free(&mut self, frame: u32) {
        if !self.contains(frame) || self.free.contains(&frame) {
            tracing::error!(frame, "freeing a frame that is not in use");
            return;
        }
        let off = frame as i64 * PAGE_SIZE as i64;
        let punched = fallocate(
            self.rw.as_raw_fd(),
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            off,
            PAGE_SIZE as i64,
        );
        if punched.is_err() {
            if let Err(e) = self.rw.write_all_at(&[0u8; PAGE_SIZE], off as u64) {
                tracing::error!(frame, error = %e, "zeroing a freed frame");
            }
        }
        self.free.insert(frame);
        self.in_use -= 1;
    }

    /// Read `buf.len()` bytes at `offset` of `frame`.
    pub(crate) fn read(&self, frame: u32, offset: usize, buf: &mut [u8]) -> Result<()> {
        self.check(frame, offset, buf.len())?;
        let at = frame as u64 * PAGE_SIZE as u64 + offset as u64;
        read_fully_at(&self.rw, buf, at).map_err(Error::Io)
    }

    /// Write `data` at `offset` of `frame`.
    pub(crate) fn write(&self, frame: u32, offset: usize, data: &[u8]) -> Result<()> {
        self.check(frame, offset, data.len())?;
        let at = frame as u64 * PAGE_SIZE as u64 + offset as u64;
        self.rw.write_all_at(data, at).map_err(Error::Io)
    }

    fn check(&self, frame: u32, offset: usize, len: usize) -> Result<()> {
        if !self.contains(frame) || offset + len > PAGE_SIZE {
            return Err(Error::Invalid(format!(
                "frame {frame} bytes {offset}+{len} outside the domain's memory"
            )));
        }
        Ok(())
    }
}

/// Like `read_exact_at`, but a file cut short by someone else reads as zeros.
fn read_fully_at(f: &File, buf: &mut [u8], mut at: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], at) {
            Ok(0) => {
                buf[done..].fill(0);
                return Ok(());
            }
            Ok(n) => {
                done += n;
                at += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_allocated_lowest_first_and_zeroed_on_reuse() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = MemFile::create(&dir.path().join("mem"), 16 * PAGE_SIZE as u64).unwrap();
        assert_eq!(m.alloc(3).unwrap(), vec![0, 1, 2]);
        m.write(1, 10, b"dirty").unwrap();
        m.free(1);
        assert_eq!(m.in_use(), 2);
        assert_eq!(m.alloc(2).unwrap(), vec![1, 3]);
        let mut b = [0xffu8; 5];
        m.read(1, 10, &mut b).unwrap();
        assert_eq!(b, [0; 5]);
        assert_eq!(m.in_use(), 4);
    }

    #[test]
    fn the_limit_is_a_quota_and_all_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = MemFile::create(&dir.path().join("mem"), 4 * PAGE_SIZE as u64).unwrap();
        m.alloc(3).unwrap();
        assert!(matches!(m.alloc(2), Err(Error::Quota(_))));
        assert_eq!(m.in_use(), 3);
        assert_eq!(m.alloc(1).unwrap(), vec![3]);
        let len = std::fs::metadata(dir.path().join("mem")).unwrap().len();
        // Growth stops at the limit.
        assert_eq!(len, 4 * PAGE_SIZE as u64);
    }

    #[test]
    fn out_of_range_access_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = MemFile::create(&dir.path().join("mem"), 1 << 20).unwrap();
        m.alloc(1).unwrap();
        let mut b = [0u8; 8];
        assert!(m.read(1, 0, &mut b).is_err());
        assert!(m.read(0, PAGE_SIZE - 4, &mut b).is_err());
        assert!(m.write(7, 0, b"x").is_err());
        assert!(m.read(0, PAGE_SIZE - 8, &mut b).is_ok());
    }
}

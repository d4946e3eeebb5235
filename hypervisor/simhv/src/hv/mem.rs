//! A domain's memory: an anonymous shared-memory file (memfd) whose page `f` is frame `f`,
//! with a frame allocator.
//!
//! The memory is RAM as a guest's is: a memfd, never a file on a disk file system (where
//! every granted page would be page cache with writeback). The file grows on demand
//! (sparse) up to the domain's limit and never shrinks, so a mapping of any frame ever
//! handed out stays backed. Freed frames are zeroed before reuse, so granted pages always
//! start zeroed (as gntalloc's do), and nothing a process or a remote domain saw in a frame
//! reaches whoever is granted it next: frees are collected and zeroed in runs of consecutive
//! frames, at the latest before the next allocation. They are zeroed in place and stay
//! resident, as a guest's RAM does: a hole punch gave them back to the kernel, which then
//! allocated, zeroed and charged a fresh page at the next mapping of the frame, in the
//! mapping process, and freed it again at the next free (per page, twice per registration
//! of a window without the cache). A domain's memory therefore stays at its high-water mark
//! until the domain is destroyed; zeroing punches a hole only if writing fails. This only
//! speeds the simulator: on Xen, gntalloc allocates a zeroed page per grant. The daemon
//! itself reads and writes frames with `pread`/`pwrite` only: nothing a client does to the
//! file can fault the daemon.
//!
//! For inspection by the host's user, the domain's directory holds `mem`, a link to the
//! daemon's descriptor of the file (`/proc/<pid>/fd/<n>`).

use std::collections::BTreeSet;
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;

use nix::fcntl::{fallocate, FallocateFlags};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
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
    /// Zeroed frames ready for reuse.
    free: BTreeSet<u32>,
    /// Freed frames not zeroed yet (see [`MemFile::flush`]).
    dirty: BTreeSet<u32>,
    in_use: usize,
    /// Zeroing runs made (one per run of consecutive freed frames).
    zeroings: u64,
}

impl MemFile {
    /// Create the (empty) memory of a domain, limited to `limit` bytes, and the link to it
    /// at `path`.
    pub(crate) fn create(path: &Path, limit: u64) -> io::Result<MemFile> {
        let name = CString::new(format!(
            "xmx-simhv:{}",
            path.parent()
                .and_then(|d| d.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        ))
        .unwrap_or_default();
        let fd = memfd_create(&name, MemFdCreateFlag::MFD_CLOEXEC).map_err(io::Error::from)?;
        let rw = File::from(fd);
        let link = format!("/proc/self/fd/{}", rw.as_raw_fd());
        // A second open file description of the same memory, opened read-only: a mapping
        // made through it can never be writable.
        let ro = OpenOptions::new().read(true).open(&link)?;
        let target = format!("/proc/{}/fd/{}", std::process::id(), rw.as_raw_fd());
        std::os::unix::fs::symlink(target, path)?;
        let limit_frames = (limit / PAGE_SIZE as u64).min(u32::MAX as u64) as u32;
        Ok(MemFile {
            rw,
            ro,
            limit_frames,
            size_frames: 0,
            next_fresh: 0,
            free: BTreeSet::new(),
            dirty: BTreeSet::new(),
            in_use: 0,
            zeroings: 0,
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

    /// The memory file's inode: how `/proc/PID/maps` names a mapping of it.
    pub(crate) fn inode(&self) -> io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        Ok(self.rw.metadata()?.ino())
    }

    /// Frames in use.
    pub(crate) fn in_use(&self) -> usize {
        self.in_use
    }

    /// The limit in bytes (whole frames).
    pub(crate) fn limit_bytes(&self) -> u64 {
        self.limit_frames as u64 * PAGE_SIZE as u64
    }

    /// The limit in frames.
    pub(crate) fn limit_frames(&self) -> u32 {
        self.limit_frames
    }

    /// Frames ever handed out: every frame below lies inside the file.
    pub(crate) fn extent(&self) -> u32 {
        self.next_fresh
    }

    /// Another descriptor of the memory, for migration rounds: they read or write every
    /// frame, which must not happen under the host's lock.
    pub(crate) fn clone_file(&self) -> io::Result<File> {
        self.rw.try_clone()
    }

    /// A restore wrote frames below `extent` through [`MemFile::clone_file`] (writing
    /// extends the file): take the file's new size and the extent into account. The frames
    /// are in no allocator set until [`MemFile::adopt`]; an incoming domain allocates
    /// nothing before then (it is suspended).
    pub(crate) fn note_restored(&mut self, extent: u32) -> io::Result<()> {
        let len = self.rw.metadata()?.len();
        let frames = len.div_ceil(PAGE_SIZE as u64).min(u32::MAX as u64) as u32;
        self.size_frames = self.size_frames.max(frames);
        self.next_fresh = self.next_fresh.max(extent);
        if self.size_frames < self.next_fresh {
            // The last frames of the extent were zero, so nothing wrote them: grow the file
            // so that they lie inside it, as `contains` promises.
            self.rw.set_len(self.next_fresh as u64 * PAGE_SIZE as u64)?;
            self.size_frames = self.next_fresh;
        }
        Ok(())
    }

    /// Take `used` as the frames in use after a restore (the frames of the restored
    /// grants); every other frame below the extent is zeroed and becomes free, since
    /// free frames must be zero (the stream mirrors the source's memory, frames a process
    /// wrote without a grant and frames of grants not restored included).
    pub(crate) fn adopt(&mut self, used: &BTreeSet<u32>) -> Result<()> {
        if self.in_use != 0 {
            return Err(Error::Invalid(format!(
                "restoring grants over {} frames in use",
                self.in_use
            )));
        }
        if let Some(&last) = used.last() {
            if last >= self.next_fresh {
                return Err(Error::Invalid(format!(
                    "a restored grant names frame {last}, beyond the {} frames restored",
                    self.next_fresh
                )));
            }
        }
        self.free.clear();
        self.dirty = (0..self.next_fresh).filter(|f| !used.contains(f)).collect();
        self.in_use = used.len();
        // Punched, not written: most of them are holes the stream never filled, which
        // writing zeroes would make resident.
        self.zero_pending(false);
        Ok(())
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
        self.flush();
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

    /// Give a frame back; it is zeroed by the next [`MemFile::flush`] (which
    /// [`MemFile::alloc`] makes first).
    pub(crate) fn free(&mut self, frame: u32) {
        if !self.contains(frame) || self.free.contains(&frame) || self.dirty.contains(&frame) {
            tracing::error!(frame, "freeing a frame that is not in use");
            return;
        }
        self.dirty.insert(frame);
        self.in_use -= 1;
    }

    /// Zero the frames freed since the last flush, in place, one run of consecutive frames
    /// at a time, and make them available.
    pub(crate) fn flush(&mut self) {
        self.zero_pending(true);
    }

    /// Zero the frames freed since the last flush, in place (they stay resident) or by
    /// giving them back to the kernel, and make them available.
    fn zero_pending(&mut self, in_place: bool) {
        if self.dirty.is_empty() {
            return;
        }
        let dirty: Vec<u32> = std::mem::take(&mut self.dirty).into_iter().collect();
        let mut i = 0;
        while i < dirty.len() {
            let mut run = 1;
            while i + run < dirty.len() && dirty[i + run - 1] + 1 == dirty[i + run] {
                run += 1;
            }
            if self.zero(dirty[i], run as u32, in_place) {
                self.free.extend(&dirty[i..i + run]);
            }
            i += run;
        }
    }

    /// Frames freed and not zeroed yet.
    pub(crate) fn pending(&self) -> usize {
        self.dirty.len()
    }

    /// Zeroing runs made so far.
    #[cfg(test)]
    pub(crate) fn zeroings(&self) -> u64 {
        self.zeroings
    }

    /// Zero `count` frames from `first`, in place or by a hole punch; false if they could
    /// not be, in which case they must never be handed out again (they are lost to the
    /// domain).
    fn zero(&mut self, first: u32, count: u32, in_place: bool) -> bool {
        let off = first as u64 * PAGE_SIZE as u64;
        let len = count as u64 * PAGE_SIZE as u64;
        self.zeroings += 1;
        if !in_place {
            return self.punch(first, count);
        }
        /// Zeroes written per call.
        static ZEROS: [u8; 16 * PAGE_SIZE] = [0; 16 * PAGE_SIZE];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(ZEROS.len() as u64) as usize;
            if let Err(e) = self.rw.write_all_at(&ZEROS[..n], off + done) {
                // Out of memory for the file, say: give the run back to the kernel instead,
                // which zeroes it as well.
                tracing::warn!(frame = first, error = %e, "zeroing freed frames in place; punching a hole");
                return self.punch(first, count);
            }
            done += n as u64;
        }
        true
    }

    /// Give `count` frames from `first` back to the kernel (they read zero after).
    fn punch(&self, first: u32, count: u32) -> bool {
        let punched = fallocate(
            self.rw.as_raw_fd(),
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            first as i64 * PAGE_SIZE as i64,
            count as i64 * PAGE_SIZE as i64,
        );
        if let Err(e) = punched {
            tracing::error!(frame = first, count, error = %e, "freed frames could not be zeroed; never reused");
            return false;
        }
        true
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
pub(crate) fn read_fully_at(f: &File, buf: &mut [u8], mut at: u64) -> io::Result<()> {
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
        // Not reusable before it is zeroed; allocating zeroes it first.
        assert_eq!(m.pending(), 1);
        assert_eq!(m.alloc(2).unwrap(), vec![1, 3]);
        let mut b = [0xffu8; 5];
        m.read(1, 10, &mut b).unwrap();
        assert_eq!(b, [0; 5]);
        assert_eq!(m.in_use(), 4);
    }

    #[test]
    fn freed_frames_are_zeroed_in_place_one_run_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = MemFile::create(&dir.path().join("mem"), 1 << 20).unwrap();
        let frames = m.alloc(64).unwrap();
        for &f in &frames {
            m.write(f, 0, b"used").unwrap();
        }
        // Two runs: 0..20 and 30..50 (freed out of order), and frame 60 alone.
        for f in (30..50).rev().chain(0..20).chain([60]) {
            m.free(f);
        }
        assert_eq!(m.in_use(), 64 - 41);
        m.flush();
        assert_eq!(m.zeroings(), 3);
        assert_eq!(m.pending(), 0);
        let again = m.alloc(41).unwrap();
        assert_eq!(again.len(), 41);
        for f in again {
            let mut b = [0xffu8; 4];
            m.read(f, 0, &mut b).unwrap();
            assert_eq!(b, [0; 4], "frame {f} reused without zeroing");
        }
        // Freeing twice is refused, whether zeroed already or not.
        m.free(61);
        m.free(61);
        assert_eq!(m.pending(), 1);
        assert_eq!(m.in_use(), 63);
    }

    #[test]
    fn freed_frames_stay_resident_and_read_zero_when_handed_out_again() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let mut m = MemFile::create(&dir.path().join("mem"), 1 << 20).unwrap();
        let frames = m.alloc(8).unwrap();
        for &f in &frames {
            m.write(f, 0, &[0xab; PAGE_SIZE]).unwrap();
        }
        let blocks = |m: &MemFile| m.clone_file().unwrap().metadata().unwrap().blocks();
        let resident = blocks(&m);
        assert!(resident >= 8 * PAGE_SIZE as u64 / 512, "{resident} blocks");
        for &f in &frames {
            m.free(f);
        }
        m.flush();
        // Zeroed in place: the kernel neither frees nor allocates the pages again.
        assert_eq!(blocks(&m), resident);
        assert_eq!(m.alloc(8).unwrap(), frames);
        for &f in &frames {
            let mut page = [0xffu8; PAGE_SIZE];
            m.read(f, 0, &mut page).unwrap();
            assert!(
                page.iter().all(|&b| b == 0),
                "frame {f} handed out again unzeroed"
            );
        }
    }

    #[test]
    fn the_memory_is_anonymous_shared_memory_linked_for_inspection() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mem");
        let mut m = MemFile::create(&path, 1 << 20).unwrap();
        let f = m.alloc(2).unwrap()[1];
        m.write(f, 5, b"seen").unwrap();
        let link = std::fs::read_link(&path).unwrap();
        assert!(link.starts_with("/proc/"), "{}", link.display());
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[f as usize * PAGE_SIZE + 5..][..4], b"seen");
        // The read-only descriptor cannot be written through.
        let ro = File::from(m.fd(false).try_clone_to_owned().unwrap());
        assert!(ro.write_at(b"x", 0).is_err());
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
    fn restored_memory_keeps_the_used_frames_and_zeroes_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = MemFile::create(&dir.path().join("mem"), 1 << 20).unwrap();
        let f = m.clone_file().unwrap();
        for frame in [0u64, 2, 3] {
            f.write_all_at(&[frame as u8 + 1; PAGE_SIZE], frame * PAGE_SIZE as u64)
                .unwrap();
        }
        // Frame 4 was zero on the source: the stream did not carry it.
        m.note_restored(5).unwrap();
        assert_eq!(m.extent(), 5);
        assert!(std::fs::metadata(dir.path().join("mem")).unwrap().len() >= 5 * PAGE_SIZE as u64);
        m.adopt(&[2, 3].into_iter().collect()).unwrap();
        assert_eq!(m.in_use(), 2);
        // Frames not in use are given back, not zeroed in place: only 2 and 3 stay resident.
        use std::os::unix::fs::MetadataExt;
        let blocks = f.metadata().unwrap().blocks();
        assert!(
            blocks <= 2 * PAGE_SIZE as u64 / 512,
            "{blocks} blocks resident"
        );
        let mut b = [0u8; 4];
        m.read(2, 0, &mut b).unwrap();
        assert_eq!(b, [3; 4]);
        // Frame 0 was not in use on the source: zeroed, and handed out first.
        assert_eq!(m.alloc(3).unwrap(), vec![0, 1, 4]);
        m.read(0, 0, &mut b).unwrap();
        assert_eq!(b, [0; 4]);
        assert!(m.adopt(&BTreeSet::new()).is_err());
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

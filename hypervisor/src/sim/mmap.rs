//! Shared mappings of simhv files: frames of a domain's memory laid out contiguously, and
//! small whole-file mappings (event-channel status pages).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

use crate::PAGE_SIZE;

/// `MAP_POPULATE` unless `XMX_SIM_POPULATE=0` (read once).
fn populate() -> libc::c_int {
    static FLAG: std::sync::OnceLock<libc::c_int> = std::sync::OnceLock::new();
    *FLAG.get_or_init(|| match std::env::var("XMX_SIM_POPULATE") {
        Ok(v) if v.trim() == "0" => 0,
        _ => libc::MAP_POPULATE,
    })
}

fn prot_of(writable: bool) -> libc::c_int {
    if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    }
}

/// A mapping owned by this process; unmapped on drop.
#[derive(Debug)]
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Region is only an address range this process mapped; any thread may use or
// unmap it, and byte access is synchronised by its users.
unsafe impl Send for Region {}
// SAFETY: as above; &Region only exposes the address and length.
unsafe impl Sync for Region {}

impl Region {
    /// Map page `frames[i]` of `fd` at page `i` of a fresh contiguous range. Runs of
    /// consecutive frames are mapped with one call each, populated at once
    /// (`MAP_POPULATE`): every page of a window or a ring is touched soon after it is
    /// mapped, and one call that fills the page tables costs far less than a fault per page
    /// (a 16 MiB window is 4096 pages). `XMX_SIM_POPULATE=0` maps lazily, for comparisons.
    pub fn map_frames(fd: BorrowedFd<'_>, frames: &[u32], writable: bool) -> io::Result<Region> {
        let len = frames
            .len()
            .checked_mul(PAGE_SIZE)
            .filter(|l| *l > 0)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no frames to map"))?;
        if frames.windows(2).all(|w| w[0].checked_add(1) == Some(w[1])) {
            // One run (a window of pages granted together): one call, no reservation.
            let offset = libc::off_t::try_from(u64::from(frames[0]) * PAGE_SIZE as u64)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame out of range"))?;
            return Self::map_fresh(fd, len, offset, prot_of(writable), populate());
        }
        let region = Self::reserve(len)?;
        // Dropping `region` on an error unmaps the whole range, runs already mapped
        // included.
        region.map_runs(fd, frames, writable)?;
        Ok(region)
    }

    /// Map page `frames[i]` of `fd` over page `i` of this region, at the same addresses
    /// (what the region mapped before is replaced): pointers into the region stay valid
    /// and now reach the new file. `frames` must cover the region exactly. On an error
    /// part of the region may map the new file and the rest the old one.
    pub fn remap_frames(
        &self,
        fd: BorrowedFd<'_>,
        frames: &[u32],
        writable: bool,
    ) -> io::Result<()> {
        if frames.len().checked_mul(PAGE_SIZE) != Some(self.len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the frames do not cover the region",
            ));
        }
        self.map_runs(fd, frames, writable)
    }

    fn map_runs(&self, fd: BorrowedFd<'_>, frames: &[u32], writable: bool) -> io::Result<()> {
        let prot = prot_of(writable);
        let mut i = 0usize;
        while i < frames.len() {
            let mut run = 1usize;
            while i + run < frames.len()
                && frames[i + run - 1].checked_add(1) == Some(frames[i + run])
            {
                run += 1;
            }
            let offset = frames[i] as u64 * PAGE_SIZE as u64;
            let offset = libc::off_t::try_from(offset)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame out of range"))?;
            // SAFETY: the target range [i, i+run) pages lies inside this Region, which
            // owns its whole range exclusively (callers check that `frames` covers it), so
            // MAP_FIXED replaces only our own pages. The fd is valid for the call.
            let addr = unsafe {
                libc::mmap(
                    self.ptr.as_ptr().add(i * PAGE_SIZE).cast(),
                    run * PAGE_SIZE,
                    prot,
                    libc::MAP_SHARED | libc::MAP_FIXED | populate(),
                    fd.as_raw_fd(),
                    offset,
                )
            };
            if addr == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            i += run;
        }
        Ok(())
    }

    /// Map the first `len` bytes of `fd`.
    pub fn map_file(fd: BorrowedFd<'_>, len: usize, writable: bool) -> io::Result<Region> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        Self::map_fresh(fd, len, 0, prot_of(writable), 0)
    }

    /// `len` bytes of `fd` from `offset`, shared, at an address the kernel picks.
    fn map_fresh(
        fd: BorrowedFd<'_>,
        len: usize,
        offset: libc::off_t,
        prot: libc::c_int,
        flags: libc::c_int,
    ) -> io::Result<Region> {
        // SAFETY: a fresh mapping chosen by the kernel (no MAP_FIXED), so no existing
        // memory is affected; the fd is valid for the call.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED | flags,
                fd.as_raw_fd(),
                offset,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Region {
            ptr: NonNull::new(addr.cast()).ok_or_else(io::Error::last_os_error)?,
            len,
        })
    }

    fn reserve(len: usize) -> io::Result<Region> {
        // SAFETY: an anonymous PROT_NONE reservation at an address the kernel picks;
        // it touches no existing mapping.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Region {
            ptr: NonNull::new(addr.cast()).ok_or_else(io::Error::last_os_error)?,
            len,
        })
    }

    /// First byte of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: empty regions are refused at creation.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe exactly the range this Region mapped and still owns;
        // nothing else unmaps it, so no other mapping is affected.
        let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        if rc != 0 {
            tracing::warn!(error = %io::Error::last_os_error(), "munmap failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    fn file_with_pages(n: usize) -> std::fs::File {
        let mut f = tempfile_in_tmp();
        for i in 0..n {
            f.write_all(&vec![i as u8 + 1; PAGE_SIZE]).unwrap();
        }
        f
    }

    fn tempfile_in_tmp() -> std::fs::File {
        let path = std::env::temp_dir().join(format!(
            "xmx-mmap-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }

    #[test]
    fn frames_appear_in_the_order_asked() {
        let f = file_with_pages(6);
        let frames = [4u32, 5, 0, 2, 3];
        let r = Region::map_frames(f.as_fd(), &frames, false).unwrap();
        assert_eq!(r.len(), 5 * PAGE_SIZE);
        for (i, fr) in frames.iter().enumerate() {
            // SAFETY: the region maps 5 readable pages.
            let b = unsafe { *r.as_ptr().add(i * PAGE_SIZE + 17) };
            assert_eq!(b, *fr as u8 + 1);
        }
    }

    #[test]
    fn one_run_of_frames_maps_in_place_and_can_be_remapped() {
        let f = file_with_pages(6);
        let r = Region::map_frames(f.as_fd(), &[1, 2, 3], false).unwrap();
        let byte = |r: &Region, page: usize| {
            // SAFETY: the region maps 3 readable pages.
            unsafe { *r.as_ptr().add(page * PAGE_SIZE + 9) }
        };
        assert_eq!([byte(&r, 0), byte(&r, 1), byte(&r, 2)], [2, 3, 4]);
        // Pages of another run then replace them at the same addresses.
        r.remap_frames(f.as_fd(), &[5, 0, 4], false).unwrap();
        assert_eq!([byte(&r, 0), byte(&r, 1), byte(&r, 2)], [6, 1, 5]);
    }

    #[test]
    fn writes_reach_the_file() {
        let f = file_with_pages(3);
        let r = Region::map_frames(f.as_fd(), &[2], true).unwrap();
        // SAFETY: one writable page.
        unsafe { r.as_ptr().add(5).write(0xee) };
        let mut b = [0u8; 1];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, 2 * PAGE_SIZE as u64 + 5).unwrap();
        assert_eq!(b[0], 0xee);
    }

    #[test]
    fn empty_mappings_are_refused() {
        let f = file_with_pages(1);
        assert!(Region::map_frames(f.as_fd(), &[], false).is_err());
        assert!(Region::map_file(f.as_fd(), 0, false).is_err());
    }
}

//! Test patterns and bounds-checked copies in and out of shared pages.
//!
//! The suite never forms Rust references into shared memory: the other domain may
//! write it at any time, so bytes are copied out before they are compared.

use crate::PAGE_SIZE;

/// The byte at `index` of the pattern named by `seed`: distinct seeds give unrelated
/// sequences, so a page from the wrong grant or the wrong writer does not match.
pub(crate) fn pattern_byte(seed: u64, index: usize) -> u8 {
    let mut x = seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    x ^= x >> 29;
    (x >> 24) as u8
}

/// `len` bytes of the pattern `seed`.
pub(crate) fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| pattern_byte(seed, i)).collect()
}

/// The seed of page `page` of a scenario; `tag` names the scenario and the writer.
pub(crate) fn seed(tag: u32, pages: usize, page: usize) -> u64 {
    (u64::from(tag) << 48) ^ ((pages as u64) << 24) ^ page as u64
}

/// A shared mapping as a base pointer and length, for bounds-checked copies.
#[derive(Clone, Copy)]
pub(crate) struct SharedBytes {
    ptr: *mut u8,
    len: usize,
}

impl SharedBytes {
    /// # Safety
    /// `ptr` must be valid for reads (and for writes, if [`SharedBytes::write`] is used) of
    /// `len` bytes for as long as this value is used.
    pub(crate) unsafe fn new(ptr: *mut u8, len: usize) -> Self {
        SharedBytes { ptr, len }
    }

    /// Copy `n` bytes at `offset` out of the mapping.
    pub(crate) fn read(&self, offset: usize, n: usize) -> Result<Vec<u8>, String> {
        self.check(offset, n)?;
        let mut out = vec![0u8; n];
        // SAFETY: `offset + n <= len` (checked), the mapping is readable for `len` bytes
        // (constructor contract), and `out` is a fresh local buffer of `n` bytes. The
        // peer does not write these bytes during the copy: the suite's protocol orders
        // its writes before the xenstore message that lets this side read.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset), out.as_mut_ptr(), n) };
        Ok(out)
    }

    /// Copy `src` into the mapping at `offset`.
    pub(crate) fn write(&self, offset: usize, src: &[u8]) -> Result<(), String> {
        self.check(offset, src.len())?;
        // SAFETY: `offset + src.len() <= len` (checked) and the mapping is writable
        // (constructor contract); `src` is local memory, so the ranges do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(offset), src.len()) };
        Ok(())
    }

    fn check(&self, offset: usize, n: usize) -> Result<(), String> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(format!(
                "{n} bytes at {offset} outside a mapping of {} bytes",
                self.len
            )),
        }
    }
}

/// Write the pattern of page `page` into bytes `range` of every page of `mem`.
pub(crate) fn fill_pages(
    mem: &SharedBytes,
    pages: usize,
    tag: u32,
    range: std::ops::Range<usize>,
) -> Result<(), String> {
    for page in 0..pages {
        let bytes = pattern(seed(tag, pages, page), range.len());
        mem.write(page * PAGE_SIZE + range.start, &bytes)?;
    }
    Ok(())
}

/// Compare bytes `range` of every page of `mem` with the pattern of that page.
pub(crate) fn check_pages(
    mem: &SharedBytes,
    pages: usize,
    tag: u32,
    range: std::ops::Range<usize>,
) -> Result<(), String> {
    for page in 0..pages {
        let want = pattern(seed(tag, pages, page), range.len());
        let got = mem.read(page * PAGE_SIZE + range.start, range.len())?;
        if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
            return Err(format!(
                "page {page} byte {}: got {:#04x}, want {:#04x}",
                range.start + i,
                got[i],
                want[i]
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_by_seed_and_position() {
        let a = pattern(seed(1, 16, 0), 256);
        let b = pattern(seed(1, 16, 1), 256);
        let c = pattern(seed(2, 16, 0), 256);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(a, pattern(seed(1, 16, 0), 256));
        // Not a constant or a short cycle.
        let distinct: std::collections::HashSet<u8> = a.iter().copied().collect();
        assert!(distinct.len() > 100);
    }

    #[test]
    fn fill_then_check_round_trips_and_catches_changes() {
        let mut buf = vec![0u8; 3 * PAGE_SIZE];
        // SAFETY: `buf` is a live local buffer of the length given, used only here.
        let mem = unsafe { SharedBytes::new(buf.as_mut_ptr(), buf.len()) };
        fill_pages(&mem, 3, 7, 0..2048).unwrap();
        check_pages(&mem, 3, 7, 0..2048).unwrap();
        assert!(check_pages(&mem, 3, 8, 0..2048).is_err());
        // The other half was not touched.
        assert!(mem.read(2048, 2048).unwrap().iter().all(|&b| b == 0));
        mem.write(PAGE_SIZE + 5, &[pattern_byte(seed(7, 3, 1), 5) ^ 1])
            .unwrap();
        let err = check_pages(&mem, 3, 7, 0..2048).unwrap_err();
        assert!(err.starts_with("page 1 byte 5"), "{err}");
    }

    #[test]
    fn out_of_bounds_copies_are_refused() {
        let mut buf = vec![0u8; 64];
        // SAFETY: `buf` is a live local buffer of the length given, used only here.
        let mem = unsafe { SharedBytes::new(buf.as_mut_ptr(), buf.len()) };
        assert!(mem.read(60, 5).is_err());
        assert!(mem.read(usize::MAX, 2).is_err());
        assert!(mem.write(64, &[1]).is_err());
        assert!(mem.read(0, 64).is_ok());
    }
}

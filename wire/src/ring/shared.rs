//! Access to memory shared with another domain or process.
//!
//! This is the only place in the ring that touches raw memory. Every access is an atomic
//! load or store at a bounds-checked, naturally aligned offset, or (for long copies on
//! x86-64) one `rep movsb` the compiler cannot see into ([`copy_shared`]), whose byte
//! accesses are what relaxed atomic byte accesses compile to there; so a peer writing the
//! same bytes at the same time is a race on values, never undefined behaviour in this
//! process.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use super::{RingError, PAGE_SIZE};

/// A region of memory shared with a peer (a granted or mapped page, or an owned buffer in
/// tests), accessed only through atomic loads and stores.
///
/// Clones refer to the same memory.
#[derive(Clone)]
pub struct SharedMem {
    ptr: NonNull<u8>,
    len: usize,
    _owner: Option<Arc<dyn Send + Sync>>,
}

// SAFETY: SharedMem is a handle to memory that stays valid for the life of every clone (the
// caller of `from_raw` promised it, or `_owner` keeps it alive); all access through it is
// atomic, so using it from several threads cannot cause a data race.
unsafe impl Send for SharedMem {}
// SAFETY: see Send; `&SharedMem` only offers atomic accesses.
unsafe impl Sync for SharedMem {}

impl std::fmt::Debug for SharedMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMem")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

/// Zeroed, page-aligned memory owned by a [`SharedMem`].
struct OwnedPages {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: OwnedPages only frees its allocation on drop; the bytes are accessed through the
// SharedMem handles, atomically.
unsafe impl Send for OwnedPages {}
// SAFETY: as Send: no method reads or writes through the pointer.
unsafe impl Sync for OwnedPages {}

impl Drop for OwnedPages {
    fn drop(&mut self) {
        // SAFETY: ptr came from alloc_zeroed with this layout and is freed once, here.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl SharedMem {
    /// Allocate `pages` (at least one) zeroed, page-aligned pages owned by the returned handle
    /// and its clones: ring memory for tests and for rings whose halves share a process.
    pub fn new_owned(pages: usize) -> Self {
        let len = pages.max(1).saturating_mul(PAGE_SIZE);
        let layout =
            Layout::from_size_align(len, PAGE_SIZE).expect("page-aligned layout of a sane size");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        let owner: Arc<dyn Send + Sync> = Arc::new(OwnedPages { ptr, layout });
        SharedMem {
            ptr,
            len,
            _owner: Some(owner),
        }
    }

    /// Wrap `len` bytes of mapped memory at `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be readable and writable, and stay mapped as long as the returned
    /// value or any clone of it lives. Other parties may write the memory at any time; this
    /// process must touch it only through `SharedMem` handles or atomics.
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Result<Self, RingError> {
        Self::checked(ptr, len, None)
    }

    /// As [`SharedMem::from_raw`], and keep `owner` (the object that holds the mapping, such
    /// as the platform's mapped-pages handle) alive as long as the memory is in use.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be readable and writable for as long as `owner` lives, and this
    /// process must touch it only through `SharedMem` handles or atomics.
    pub unsafe fn from_raw_with_owner(
        ptr: *mut u8,
        len: usize,
        owner: Arc<dyn Send + Sync>,
    ) -> Result<Self, RingError> {
        Self::checked(ptr, len, Some(owner))
    }

    fn checked(
        ptr: *mut u8,
        len: usize,
        owner: Option<Arc<dyn Send + Sync>>,
    ) -> Result<Self, RingError> {
        let ptr = NonNull::new(ptr).ok_or(RingError::Misaligned)?;
        if ptr.as_ptr() as usize & 7 != 0 {
            return Err(RingError::Misaligned);
        }
        if len > isize::MAX as usize {
            return Err(RingError::TooSmall { len, slot: 0 });
        }
        Ok(SharedMem {
            ptr,
            len,
            _owner: owner,
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start of the region, for handing it to code that maps or grants it.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    fn in_bounds(&self, off: usize, n: usize) -> bool {
        off.checked_add(n).is_some_and(|end| end <= self.len)
    }

    /// Load the aligned `u32` at `off` with `order`; `None` if out of bounds or unaligned.
    pub fn load_u32(&self, off: usize, order: Ordering) -> Option<u32> {
        if off & 3 != 0 || !self.in_bounds(off, 4) {
            return None;
        }
        // SAFETY: off..off+4 is inside the region (checked) and 4-aligned (the base is
        // 8-aligned, off is a multiple of 4); the region is valid for the life of self.
        let cell = unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(off).cast::<u32>()) };
        Some(cell.load(order))
    }

    /// Store `value` at the aligned offset `off` with `order`; false if out of bounds or
    /// unaligned (nothing is written).
    pub fn store_u32(&self, off: usize, value: u32, order: Ordering) -> bool {
        if off & 3 != 0 || !self.in_bounds(off, 4) {
            return false;
        }
        // SAFETY: as in load_u32.
        let cell = unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(off).cast::<u32>()) };
        cell.store(value, order);
        true
    }

    /// Copy `dst.len()` bytes starting at `off` out of the region (relaxed loads, one pass);
    /// false if the range is out of bounds (nothing is read).
    pub fn read_bytes(&self, off: usize, dst: &mut [u8]) -> bool {
        if !self.in_bounds(off, dst.len()) {
            return false;
        }
        let n = dst.len();
        if n >= BULK_COPY_MIN {
            // SAFETY: off..off+n is inside the region (checked above), which is valid for
            // the life of self; dst is n writable bytes of this process, not in the region
            // (a `&mut` to shared memory cannot exist: this process only touches it here).
            unsafe { copy_shared(self.ptr.as_ptr().add(off), dst.as_mut_ptr(), n) };
            return true;
        }
        // Bytes up to the first 8-aligned offset, whole words in one tight loop, then the
        // tail. A loop that tested alignment and length before each word copied 4 KiB
        // frames at a quarter of this speed.
        let head = off.next_multiple_of(8).saturating_sub(off).min(n);
        let (head_dst, rest) = dst.split_at_mut(head);
        for (i, b) in head_dst.iter_mut().enumerate() {
            *b = self.byte_cell(off + i).load(Ordering::Relaxed);
        }
        let words = off + head;
        let mut body = rest.chunks_exact_mut(8);
        for (w, chunk) in body.by_ref().enumerate() {
            chunk.copy_from_slice(
                &self
                    .word_cell(words + 8 * w)
                    .load(Ordering::Relaxed)
                    .to_ne_bytes(),
            );
        }
        let tail_dst = body.into_remainder();
        let tail = off + n - tail_dst.len();
        for (i, b) in tail_dst.iter_mut().enumerate() {
            *b = self.byte_cell(tail + i).load(Ordering::Relaxed);
        }
        true
    }

    /// Copy `src` into the region at `off` (relaxed stores); false if the range is out of
    /// bounds (nothing is written).
    pub fn write_bytes(&self, off: usize, src: &[u8]) -> bool {
        if !self.in_bounds(off, src.len()) {
            return false;
        }
        if src.len() >= BULK_COPY_MIN {
            // SAFETY: as in read_bytes, the other way round.
            unsafe { copy_shared(src.as_ptr(), self.ptr.as_ptr().add(off), src.len()) };
            return true;
        }
        // Laid out as read_bytes.
        let head = off.next_multiple_of(8).saturating_sub(off).min(src.len());
        let (head_src, rest) = src.split_at(head);
        for (i, b) in head_src.iter().enumerate() {
            self.byte_cell(off + i).store(*b, Ordering::Relaxed);
        }
        let words = off + head;
        let mut body = rest.chunks_exact(8);
        for (w, chunk) in body.by_ref().enumerate() {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.word_cell(words + 8 * w)
                .store(u64::from_ne_bytes(word), Ordering::Relaxed);
        }
        let tail_src = body.remainder();
        let tail = off + src.len() - tail_src.len();
        for (i, b) in tail_src.iter().enumerate() {
            self.byte_cell(tail + i).store(*b, Ordering::Relaxed);
        }
        true
    }

    /// The byte at `at`, which the caller checked is inside the region.
    fn byte_cell(&self, at: usize) -> &AtomicU8 {
        debug_assert!(at < self.len);
        // SAFETY: `at` is inside the region (the caller's bounds check covers it), a byte
        // is always aligned, and the region is valid for the life of self.
        unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(at)) }
    }

    /// The word at `at`, which the caller checked is inside the region and 8-aligned.
    fn word_cell(&self, at: usize) -> &AtomicU64 {
        debug_assert!(at & 7 == 0 && at + 8 <= self.len);
        // SAFETY: at..at+8 is inside the region (the caller's bounds check covers it) and
        // 8-aligned (the base is 8-aligned, `at` a multiple of 8); the region is valid for
        // the life of self.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(at).cast::<u64>()) }
    }

    /// Set `n` bytes at `off` to zero; false if out of bounds (nothing is written).
    pub fn zero(&self, off: usize, n: usize) -> bool {
        if !self.in_bounds(off, n) {
            return false;
        }
        const ZEROS: [u8; 64] = [0; 64];
        let mut done = 0;
        while done < n {
            let chunk = (n - done).min(ZEROS.len());
            self.write_bytes(off + done, &ZEROS[..chunk]);
            done += chunk;
        }
        true
    }
}

/// Copies at least this long are one string instruction (see [`copy_shared`]): below it
/// the word loop costs less than starting one. Where there is none to use, never.
const BULK_COPY_MIN: usize = if cfg!(all(target_arch = "x86_64", not(miri))) {
    64
} else {
    usize::MAX
};

/// Copies `n` bytes from `src` to `dst` where either side is memory another party may
/// write at the same time (a ring, a window, a direct channel's lane): the one copy
/// primitive for shared memory outside [`SharedMem`]'s own accessors, which use it too.
///
/// From [`BULK_COPY_MIN`] bytes on x86-64 this is one `rep movsb`: as fast as the C
/// library's memcpy on every size the rings and windows copy (4-9 KiB frames 5-6x the
/// relaxed word loop's speed here, 256 KiB 1.6x, a stream of 16 MiB messages between
/// guests 1.4x), and sound where memcpy is not, because the compiler treats the block as
/// opaque code that reads and writes memory, and at the machine level its accesses are the
/// plain byte loads and stores that relaxed atomics are made of. Ordering against ring
/// indices comes from the callers' acquire loads and release stores, as for atomics (the
/// stores of a string instruction are not reordered with the stores after it). Shorter
/// copies, other targets and Miri take relaxed byte accesses.
///
/// # Safety
/// `src..src+n` must be readable and `dst..dst+n` writable for the whole call, the two
/// ranges must not overlap, and neither may be memory this process holds a Rust reference
/// to while another thread writes it.
pub unsafe fn copy_shared(src: *const u8, dst: *mut u8, n: usize) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if n >= BULK_COPY_MIN {
        // SAFETY: the caller guarantees both ranges; `rep movsb` with the direction flag
        // clear (the ABI's state at every call) copies exactly rcx bytes forward from rsi
        // to rdi and touches no other memory or the stack.
        unsafe {
            std::arch::asm!(
                "rep movsb",
                inout("rcx") n => _,
                inout("rsi") src => _,
                inout("rdi") dst => _,
                options(nostack, preserves_flags),
            );
        }
        return;
    }
    for i in 0..n {
        // SAFETY: i < n, so both addresses are inside the caller's ranges; a byte is
        // always aligned.
        unsafe {
            let b = AtomicU8::from_ptr(src.add(i).cast_mut()).load(Ordering::Relaxed);
            AtomicU8::from_ptr(dst.add(i)).store(b, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_memory_is_zeroed_and_page_aligned() {
        let mem = SharedMem::new_owned(2);
        assert_eq!(mem.len(), 2 * PAGE_SIZE);
        assert_eq!(mem.as_ptr() as usize % PAGE_SIZE, 0);
        let mut buf = vec![0xffu8; mem.len()];
        assert!(mem.read_bytes(0, &mut buf));
        assert!(buf.iter().all(|&b| b == 0));
    }

    #[test]
    fn bytes_round_trip_at_any_alignment() {
        let mem = SharedMem::new_owned(2);
        let src: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8 + 1).collect();
        // Every head length (offset), word boundaries around the tail, and a frame's size.
        for off in 0..17 {
            for len in [0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 100, 4099] {
                assert!(mem.zero(0, 2 * PAGE_SIZE));
                assert!(mem.write_bytes(off, &src[..len]));
                let mut back = vec![0u8; len];
                assert!(mem.read_bytes(off, &mut back));
                assert_eq!(back, src[..len], "offset {off}, length {len}");
                // Nothing is written outside the range.
                let mut around = vec![0xffu8; off];
                assert!(mem.read_bytes(0, &mut around));
                assert!(around.iter().all(|&b| b == 0));
                let mut after = [0xffu8; 9];
                assert!(mem.read_bytes(off + len, &mut after));
                assert_eq!(after, [0; 9], "offset {off}, length {len}");
            }
        }
    }

    #[test]
    fn a_copy_racing_a_writer_sees_each_byte_old_or_new() {
        // A peer rewrites the region while this side copies it out, over and over: every
        // byte copied is one of the two values the peer ever wrote there, whatever the
        // copy's length (the string instruction's and the byte loop's) and alignment.
        let mem = SharedMem::new_owned(4);
        assert!(mem.write_bytes(0, &vec![0x11u8; mem.len()]));
        let writer_mem = mem.clone();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer_stop = stop.clone();
        let writer = std::thread::spawn(move || {
            let (a, b) = (
                vec![0x11u8; writer_mem.len()],
                vec![0xeeu8; writer_mem.len()],
            );
            let mut flip = false;
            while !writer_stop.load(Ordering::Relaxed) {
                assert!(writer_mem.write_bytes(0, if flip { &a } else { &b }));
                flip = !flip;
            }
        });
        let mut out = vec![0u8; mem.len()];
        for round in 0..2000 {
            let off = round % 13;
            let len = [5, 63, 64, 4096, 3 * PAGE_SIZE][round % 5];
            out[..len].fill(0);
            // SAFETY: off + len is inside the region and `out` has len bytes of this
            // process's own; they do not overlap.
            unsafe { copy_shared(mem.as_ptr().add(off), out.as_mut_ptr(), len) };
            assert!(
                out[..len].iter().all(|&b| b == 0 || b == 0x11 || b == 0xee),
                "round {round}: a byte no writer wrote"
            );
            assert!(
                out[..len].iter().all(|&b| b != 0),
                "round {round}: a byte not copied"
            );
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
    }

    #[test]
    fn out_of_bounds_and_unaligned_accesses_are_refused() {
        let mem = SharedMem::new_owned(1);
        assert_eq!(mem.load_u32(PAGE_SIZE - 4, Ordering::Relaxed), Some(0));
        assert_eq!(mem.load_u32(PAGE_SIZE, Ordering::Relaxed), None);
        assert_eq!(mem.load_u32(2, Ordering::Relaxed), None);
        assert_eq!(mem.load_u32(usize::MAX - 1, Ordering::Relaxed), None);
        assert!(!mem.store_u32(PAGE_SIZE, 1, Ordering::Relaxed));
        assert!(!mem.store_u32(6, 1, Ordering::Relaxed));
        assert!(!mem.write_bytes(PAGE_SIZE - 1, &[1, 2]));
        assert!(!mem.read_bytes(usize::MAX, &mut [0u8; 2]));
        assert!(!mem.zero(1, PAGE_SIZE));
        let mut page = vec![0xffu8; PAGE_SIZE];
        assert!(mem.read_bytes(0, &mut page));
        assert!(
            page.iter().all(|&b| b == 0),
            "a refused write must write nothing"
        );
    }

    #[test]
    fn raw_memory_must_be_aligned_and_non_null() {
        let mem = SharedMem::new_owned(1);
        // SAFETY: the owned page outlives both handles created here, which are only checked.
        let odd = unsafe { SharedMem::from_raw(mem.as_ptr().add(4), 64) };
        assert_eq!(odd.unwrap_err(), RingError::Misaligned);
        // SAFETY: a null pointer is refused before any use.
        let null = unsafe { SharedMem::from_raw(std::ptr::null_mut(), 64) };
        assert_eq!(null.unwrap_err(), RingError::Misaligned);
        // SAFETY: as above: the owned page is alive and 4096 bytes long.
        let ok = unsafe {
            SharedMem::from_raw_with_owner(mem.as_ptr(), PAGE_SIZE, Arc::new(mem.clone()))
        }
        .unwrap();
        assert!(ok.store_u32(8, 7, Ordering::Relaxed));
        assert_eq!(mem.load_u32(8, Ordering::Relaxed), Some(7));
    }
}

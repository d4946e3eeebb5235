//! Application buffers named by MX segment lists, and the copies in and out
//! of them.
//!
//! MX leaves buffers to the application: a send's segments must stay
//! unchanged and a receive's segments writable until the request completes.
//! A [`Segments`] records the addresses once the list has been validated;
//! the copies rely on that contract, which [`Segments::from_c`] states.

use crate::abi::{MxReturn, MxSegment, MX_MAX_SEGMENTS};
use crate::errors::Failure;

/// The memory of one send or receive: `(address, length)` pieces, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Segments {
    parts: Pieces,
    total: usize,
}

/// The pieces of a segment list. Almost every MX call names one segment:
/// its piece is kept inline, as a list of it cost every send and receive an
/// allocation and a free.
#[derive(Clone, Debug, Default)]
enum Pieces {
    #[default]
    None,
    One((usize, usize)),
    Many(Vec<(usize, usize)>),
}

impl Pieces {
    fn push(&mut self, piece: (usize, usize)) {
        *self = match std::mem::take(self) {
            Pieces::None => Pieces::One(piece),
            Pieces::One(first) => Pieces::Many(vec![first, piece]),
            Pieces::Many(mut v) => {
                v.push(piece);
                Pieces::Many(v)
            }
        };
    }
}

impl std::ops::Deref for Pieces {
    type Target = [(usize, usize)];
    fn deref(&self) -> &Self::Target {
        match self {
            Pieces::None => &[],
            Pieces::One(p) => std::slice::from_ref(p),
            Pieces::Many(v) => v,
        }
    }
}

impl PartialEq for Pieces {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Pieces {}

impl Segments {
    /// Validates and records a C segment list: at most `MX_MAX_SEGMENTS`
    /// entries, no NULL pointer with a non-zero length, a total that fits
    /// the 32-bit message length.
    ///
    /// # Safety
    /// `list` must point to `count` readable `mx_segment_t` (or be NULL with
    /// `count == 0`), and each segment must name memory that stays valid (and
    /// is not otherwise accessed in a conflicting way) until the request
    /// using it completes, as MX requires of the application.
    pub(crate) unsafe fn from_c(list: *const MxSegment, count: u32) -> Result<Self, Failure> {
        if count > MX_MAX_SEGMENTS {
            return Err(Failure::new(
                MxReturn::BadSegCnt,
                format!("{count} segments (at most {MX_MAX_SEGMENTS})"),
            ));
        }
        if count == 0 {
            return Ok(Segments::default());
        }
        if list.is_null() {
            return Err(Failure::new(
                MxReturn::BadSegList,
                format!("NULL segment list with {count} segments"),
            ));
        }
        // The entries are not gathered into a list first: each is copied
        // once, below, before it is looked at.
        let mut parts = Pieces::None;
        let mut total: u64 = 0;
        for i in 0..count as usize {
            // SAFETY: the caller guarantees `count` readable entries; each is
            // copied once so a concurrent change cannot make us read twice.
            let s = unsafe { std::ptr::read(list.add(i)) };
            let len = s.segment_length as usize;
            if len == 0 {
                continue;
            }
            if s.segment_ptr.is_null() {
                return Err(Failure::new(
                    MxReturn::BadSegMem,
                    format!("segment {i} is NULL with length {len}"),
                ));
            }
            let addr = s.segment_ptr as usize;
            if addr.checked_add(len).is_none() {
                return Err(Failure::new(
                    MxReturn::BadSegMem,
                    format!("segment {i} wraps the address space"),
                ));
            }
            total += len as u64;
            parts.push((addr, len));
        }
        if total > u32::MAX as u64 {
            return Err(Failure::new(
                MxReturn::BadSegMem,
                format!("segments total {total} bytes, above the 4 GiB message limit"),
            ));
        }
        Ok(Segments {
            parts,
            total: total as usize,
        })
    }

    /// Segments over memory the caller owns.
    ///
    /// # Safety
    /// Same contract as [`from_c`](Self::from_c): every piece stays valid
    /// until the last copy through these segments.
    pub(crate) unsafe fn from_parts(parts: Vec<(usize, usize)>) -> Self {
        let mut pieces = Pieces::None;
        for p in parts.into_iter().filter(|p| p.1 > 0) {
            pieces.push(p);
        }
        let total = pieces.iter().map(|p| p.1).sum();
        Segments {
            parts: pieces,
            total,
        }
    }

    /// Total length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.total
    }

    /// Whether there is no byte at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The pieces, `(address, length)`.
    pub(crate) fn parts(&self) -> &[(usize, usize)] {
        &self.parts
    }

    /// A copy of the whole content (a send's data).
    pub(crate) fn gather(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.total);
        for &(addr, len) in self.parts.iter() {
            // SAFETY: validated at construction; the application keeps the
            // buffer valid and unchanged while the send is pending.
            out.extend_from_slice(unsafe { std::slice::from_raw_parts(addr as *const u8, len) });
        }
        out
    }

    /// Writes `data` from the start, as much as fits; returns the bytes written.
    pub(crate) fn scatter(&self, data: &[u8]) -> usize {
        let mut done = 0;
        for &(addr, len) in self.parts.iter() {
            if done == data.len() {
                break;
            }
            let n = len.min(data.len() - done);
            // SAFETY: validated at construction; the application keeps the
            // receive buffer valid and untouched until the receive completes.
            // `data` is library memory, so the ranges cannot overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(data[done..].as_ptr(), addr as *mut u8, n);
            }
            done += n;
        }
        done
    }

    /// Calls `f(address, length)` for each piece of `[offset, offset + n)`
    /// of the buffer, in order; returns how many bytes the pieces cover
    /// (fewer when the buffer ends first).
    pub(crate) fn for_range(
        &self,
        offset: usize,
        n: usize,
        mut f: impl FnMut(usize, usize),
    ) -> usize {
        let mut skip = offset;
        let mut left = n;
        for &(addr, len) in self.parts.iter() {
            if left == 0 {
                break;
            }
            if skip >= len {
                skip -= len;
                continue;
            }
            let k = (len - skip).min(left);
            f(addr + skip, k);
            skip = 0;
            left -= k;
        }
        n - left
    }

    /// Copies the first `length` bytes of `self` into `dst` (a pull between
    /// two endpoints of this process); returns the bytes copied.
    pub(crate) fn copy_into(&self, dst: &Segments, length: usize) -> usize {
        let length = length.min(self.total).min(dst.total);
        let (mut si, mut so, mut di, mut doff) = (0usize, 0usize, 0usize, 0usize);
        let mut done = 0;
        while done < length {
            let (Some(&(sa, sl)), Some(&(da, dl))) = (self.parts.get(si), dst.parts.get(di)) else {
                break;
            };
            let n = (sl - so).min(dl - doff).min(length - done);
            // SAFETY: both lists were validated at construction and MX's
            // contract keeps both buffers valid while their requests are
            // pending. `copy` tolerates an application that gave overlapping
            // send and receive buffers.
            unsafe {
                std::ptr::copy((sa + so) as *const u8, (da + doff) as *mut u8, n);
            }
            done += n;
            so += n;
            doff += n;
            if so == sl {
                si += 1;
                so = 0;
            }
            if doff == dl {
                di += 1;
                doff = 0;
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::c_void;

    fn seg(buf: &mut [u8]) -> MxSegment {
        MxSegment {
            segment_ptr: buf.as_mut_ptr() as *mut c_void,
            segment_length: buf.len() as u32,
        }
    }

    #[test]
    fn validation_errors() {
        // SAFETY: NULL with count 0 or a rejected count reads nothing.
        unsafe {
            assert_eq!(
                Segments::from_c(std::ptr::null(), 0).map(|s| s.len()),
                Ok(0)
            );
            assert_eq!(
                Segments::from_c(std::ptr::null(), 3).unwrap_err().code,
                MxReturn::BadSegList
            );
            assert_eq!(
                Segments::from_c(std::ptr::null(), 257).unwrap_err().code,
                MxReturn::BadSegCnt
            );
        }
        let list = [MxSegment {
            segment_ptr: std::ptr::null_mut(),
            segment_length: 4,
        }];
        // SAFETY: one readable entry; it is rejected before any use.
        let e = unsafe { Segments::from_c(list.as_ptr(), 1) }.unwrap_err();
        assert_eq!(e.code, MxReturn::BadSegMem);
    }

    #[test]
    fn gather_scatter_and_copy_across_piece_boundaries() {
        let mut a = *b"hello";
        let mut b = *b" world!";
        let list = [seg(&mut a), seg(&mut b)];
        // SAFETY: the buffers outlive every use below.
        let src = unsafe { Segments::from_c(list.as_ptr(), 2) }.unwrap();
        assert_eq!(src.len(), 12);
        assert_eq!(src.gather(), b"hello world!");

        let mut x = [0u8; 3];
        let mut y = [0u8; 4];
        let mut z = [0u8; 10];
        let dl = [seg(&mut x), seg(&mut y), seg(&mut z)];
        // SAFETY: as above.
        let dst = unsafe { Segments::from_c(dl.as_ptr(), 3) }.unwrap();
        assert_eq!(src.copy_into(&dst, 100), 12);
        assert_eq!(&x, b"hel");
        assert_eq!(&y, b"lo w");
        assert_eq!(&z[..5], b"orld!");
        assert_eq!(z[5..], [0; 5]);

        assert_eq!(dst.scatter(b"0123456789ABCDEFGHIJ"), 17);
        assert_eq!(&x, b"012");
        assert_eq!(&z, b"789ABCDEFG");
    }
}

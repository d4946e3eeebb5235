//! Big-endian field access for the packet views.
//!
//! Every view is length-checked once by its `new_checked`, so the reads and
//! writes here always land inside the buffer. They still go through `get` /
//! `get_mut` rather than indexing: a view built with `new_unchecked` over a
//! short buffer then reads zeros and drops writes instead of panicking.

use super::Mac;

/// A fixed-width field stored big-endian at a byte offset.
pub(crate) trait BeField: Sized {
    const WIDTH: usize;
    fn read(buf: &[u8], offset: usize) -> Self;
    fn write(self, buf: &mut [u8], offset: usize);
}

fn window(buf: &[u8], offset: usize, width: usize) -> Option<&[u8]> {
    buf.get(offset..offset.checked_add(width)?)
}

fn window_mut(buf: &mut [u8], offset: usize, width: usize) -> Option<&mut [u8]> {
    buf.get_mut(offset..offset.checked_add(width)?)
}

macro_rules! be_int_field {
    ($($ty:ty),*) => {$(
        impl BeField for $ty {
            const WIDTH: usize = core::mem::size_of::<$ty>();

            #[inline]
            fn read(buf: &[u8], offset: usize) -> Self {
                window(buf, offset, Self::WIDTH)
                    .and_then(|bytes| bytes.try_into().ok())
                    .map_or(0, <$ty>::from_be_bytes)
            }

            #[inline]
            fn write(self, buf: &mut [u8], offset: usize) {
                if let Some(bytes) = window_mut(buf, offset, Self::WIDTH) {
                    bytes.copy_from_slice(&self.to_be_bytes());
                }
            }
        }
    )*};
}

be_int_field!(u8, u16, u32);

impl BeField for Mac {
    const WIDTH: usize = 6;

    #[inline]
    fn read(buf: &[u8], offset: usize) -> Self {
        window(buf, offset, Self::WIDTH)
            .and_then(|bytes| bytes.try_into().ok())
            .map_or(Mac([0; 6]), Mac)
    }

    #[inline]
    fn write(self, buf: &mut [u8], offset: usize) {
        if let Some(bytes) = window_mut(buf, offset, Self::WIDTH) {
            bytes.copy_from_slice(&self.0);
        }
    }
}

/// Declares a zero-copy view type with its constructors. The type's module
/// provides `check_len`.
macro_rules! packet_view {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wraps a buffer without checking its length. Accessors on a short
            /// buffer read zeros and ignore writes; prefer
            #[doc = concat!("[`", stringify!($name), "::new_checked`].")]
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps a buffer after checking it holds the whole packet, so no
            /// accessor can fall outside it.
            pub fn new_checked(buffer: T) -> $crate::Result<Self> {
                let packet = Self::new_unchecked(buffer);
                packet.check_len()?;
                Ok(packet)
            }

            /// Gives the buffer back.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// The packet type byte (first byte of every MXoE packet).
            pub fn ptype(&self) -> u8 {
                <u8 as $crate::mxoe::access::BeField>::read(self.buffer.as_ref(), 0)
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            /// Sets the packet type byte.
            pub fn set_ptype(&mut self, value: u8) {
                <u8 as $crate::mxoe::access::BeField>::write(value, self.buffer.as_mut(), 0)
            }
        }

        impl<T: AsRef<[u8]>> AsRef<[u8]> for $name<T> {
            fn as_ref(&self) -> &[u8] {
                self.buffer.as_ref()
            }
        }
    };
}

/// Declares a getter and a setter per field of a view: `name, set_name: Type = OFFSET;`.
macro_rules! packet_fields {
    ($view:ident { $( $(#[$doc:meta])* $get:ident, $set:ident : $ty:ty = $off:expr; )* }) => {
        impl<T: AsRef<[u8]>> $view<T> {
            $(
                $(#[$doc])*
                #[inline]
                pub fn $get(&self) -> $ty {
                    <$ty as $crate::mxoe::access::BeField>::read(self.buffer.as_ref(), $off)
                }
            )*
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $view<T> {
            $(
                #[doc = concat!("Sets [`Self::", stringify!($get), "`].")]
                #[inline]
                pub fn $set(&mut self, value: $ty) {
                    <$ty as $crate::mxoe::access::BeField>::write(value, self.buffer.as_mut(), $off)
                }
            )*
        }
    };
}

pub(crate) use packet_fields;
pub(crate) use packet_view;

/// Refuses a buffer shorter than `needed`.
pub(crate) fn need(have: usize, needed: usize) -> crate::Result<()> {
    if have < needed {
        Err(crate::Error::Truncated { needed, have })
    } else {
        Ok(())
    }
}

/// Refuses a destination buffer shorter than `needed`.
pub(crate) fn room(have: usize, needed: usize) -> crate::Result<()> {
    if have < needed {
        Err(crate::Error::BufferTooSmall { needed, have })
    } else {
        Ok(())
    }
}

/// Refuses a packet whose type byte is not `expected`.
pub(crate) fn expect_ptype(actual: u8, expected: super::PacketType) -> crate::Result<()> {
    if actual == expected as u8 {
        Ok(())
    } else {
        Err(crate::Error::Invalid {
            field: "ptype",
            reason: expected.mismatch_reason(),
        })
    }
}

/// Copies `bytes` into `buf` at `offset`, refusing a buffer too short for them.
pub(crate) fn put(buf: &mut [u8], offset: usize, bytes: &[u8]) -> crate::Result<()> {
    let have = buf.len();
    let end = offset
        .checked_add(bytes.len())
        .ok_or(crate::Error::BufferTooSmall {
            needed: usize::MAX,
            have,
        })?;
    let dst = buf
        .get_mut(offset..end)
        .ok_or(crate::Error::BufferTooSmall { needed: end, have })?;
    // `dst` spans exactly `bytes.len()` bytes.
    dst.copy_from_slice(bytes);
    Ok(())
}

/// The slice `[start, start + len)` of `buf`, or as much of it as exists.
pub(crate) fn clamped(buf: &[u8], start: usize, len: usize) -> &[u8] {
    let start = start.min(buf.len());
    let end = start.saturating_add(len).min(buf.len());
    buf.get(start..end).unwrap_or(&[])
}

/// Mutable counterpart of [`clamped`].
pub(crate) fn clamped_mut(buf: &mut [u8], start: usize, len: usize) -> &mut [u8] {
    let start = start.min(buf.len());
    let end = start.saturating_add(len).min(buf.len());
    buf.get_mut(start..end).unwrap_or(&mut [])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_big_endian() {
        let buf = [0x12, 0x34, 0x56, 0x78, 0x9a];
        assert_eq!(u8::read(&buf, 4), 0x9a);
        assert_eq!(u16::read(&buf, 1), 0x3456);
        assert_eq!(u32::read(&buf, 0), 0x1234_5678);
    }

    #[test]
    fn writes_are_big_endian() {
        let mut buf = [0u8; 6];
        0xa1b2u16.write(&mut buf, 0);
        0xc3d4_e5f6u32.write(&mut buf, 2);
        assert_eq!(buf, [0xa1, 0xb2, 0xc3, 0xd4, 0xe5, 0xf6]);
    }

    #[test]
    fn out_of_range_reads_zero_and_writes_nothing() {
        let mut buf = [0xffu8; 3];
        assert_eq!(u32::read(&buf, 0), 0);
        assert_eq!(u16::read(&buf, 2), 0);
        assert_eq!(u8::read(&buf, usize::MAX), 0);
        0u32.write(&mut buf, 1);
        0u16.write(&mut buf, usize::MAX);
        assert_eq!(buf, [0xff; 3]);
        assert_eq!(Mac::read(&buf, 0), Mac([0; 6]));
    }

    #[test]
    fn clamped_never_exceeds_buffer() {
        let buf = [1u8, 2, 3];
        assert_eq!(clamped(&buf, 1, 10), &[2, 3]);
        assert_eq!(clamped(&buf, 5, 1), &[] as &[u8]);
        assert_eq!(clamped(&buf, 0, usize::MAX), &[1, 2, 3]);
    }
}

//! Message classes: how a message of a given length travels.

/// Longest TINY message: the data fits in the packet header's slot.
pub const TINY_MAX: usize = 32;
/// Longest SMALL message: one frame, data copied.
pub const SMALL_MAX: usize = 128;
/// Longest MEDIUM message in wire-compatible mode: up to eight 4 KiB fragments.
/// Longer messages use the rendezvous (LARGE).
pub const MEDIUM_MAX: usize = 32768;

/// The class a message length falls in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MessageClass {
    /// 0..=32 bytes.
    Tiny,
    /// 33..=128 bytes.
    Small,
    /// 129..=32768 bytes, fragmented.
    Medium,
    /// Above 32768 bytes: RNDV, then the receiver pulls.
    Large,
}

impl MessageClass {
    /// The class of a message of `len` bytes.
    pub const fn of(len: usize) -> Self {
        if len <= TINY_MAX {
            MessageClass::Tiny
        } else if len <= SMALL_MAX {
            MessageClass::Small
        } else if len <= MEDIUM_MAX {
            MessageClass::Medium
        } else {
            MessageClass::Large
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundaries() {
        use MessageClass::*;
        let cases = [
            (0, Tiny),
            (32, Tiny),
            (33, Small),
            (128, Small),
            (129, Medium),
            (32768, Medium),
            (32769, Large),
        ];
        for (len, class) in cases {
            assert_eq!(MessageClass::of(len), class, "length {len}");
        }
    }
}

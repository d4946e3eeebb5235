//! Library sequence numbers: the 16-bit `lib_seqnum` / `lib_piggyack` wire fields.
//!
//! The low 14 bits count messages and wrap; the top 2 bits are a session number
//! that a receiver bumps when it drops a partner, so that frames from before the
//! drop can be told apart from frames of the new connection. Arithmetic on the
//! counter never touches the session bits.

use core::fmt;

/// Bits of the wrapping message counter.
pub const SEQ_BITS: u32 = 14;
/// Mask of the message counter.
pub const SEQ_MASK: u16 = (1 << SEQ_BITS) - 1;
/// Mask of the session-number bits.
pub const SES_MASK: u16 = !SEQ_MASK;
/// One step of the session number.
pub const SES_ONE: u16 = 1 << SEQ_BITS;

/// How far ahead of the next expected message an out-of-order frame may be and
/// still be kept; anything farther is taken for a stale frame from before a wrap.
pub const EARLY_WINDOW: u16 = 0xff;

/// How many sent messages may wait for an ack before further sends are held
/// back. Half the counter space, so that ack arithmetic never becomes ambiguous.
pub const THROTTLE_WINDOW: u16 = SEQ_MASK / 2;

/// A library sequence number: session bits plus a wrapping 14-bit counter.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Seqnum(u16);

impl Seqnum {
    /// The value as carried on the wire.
    pub const fn from_raw(raw: u16) -> Self {
        Seqnum(raw)
    }

    /// Session number `session` (0..=3), counter `seq`.
    pub const fn new(session: u16, seq: u16) -> Self {
        Seqnum(((session << SEQ_BITS) & SES_MASK) | (seq & SEQ_MASK))
    }

    /// The wire value.
    pub const fn raw(self) -> u16 {
        self.0
    }

    /// The 14-bit counter.
    pub const fn seq(self) -> u16 {
        self.0 & SEQ_MASK
    }

    /// The session number (0..=3).
    pub const fn session(self) -> u16 {
        (self.0 & SES_MASK) >> SEQ_BITS
    }

    /// Whether both carry the same session number.
    pub const fn same_session(self, other: Seqnum) -> bool {
        (self.0 ^ other.0) & SES_MASK == 0
    }

    /// This number advanced by `n`, the counter wrapping inside its 14 bits.
    pub const fn add(self, n: u16) -> Self {
        Seqnum((self.0 & SES_MASK) | (self.0.wrapping_add(n) & SEQ_MASK))
    }

    /// The next number.
    pub const fn next(self) -> Self {
        self.add(1)
    }

    /// The previous number.
    pub const fn prev(self) -> Self {
        self.add(SEQ_MASK)
    }

    /// Counter distance from `base` forward to `self`, modulo 2^14. Session
    /// bits are ignored.
    pub const fn since(self, base: Seqnum) -> u16 {
        self.0.wrapping_sub(base.0) & SEQ_MASK
    }

    /// The same counter with the session number moved to the next one, and the
    /// counter scrambled so that no frame of the old session can look current.
    pub const fn next_session_scrambled(self) -> Self {
        let seq = (self.0 ^ 0x30f0) & SEQ_MASK;
        Seqnum((self.0 & SES_MASK).wrapping_add(SES_ONE) | seq)
    }

    /// The counter restarted at 1 in the same session.
    pub const fn restarted(self) -> Self {
        Seqnum((self.0 & SES_MASK) | 1)
    }
}

impl fmt::Debug for Seqnum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.seq(), self.session())
    }
}

impl fmt::Display for Seqnum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_split_at_bit_14() {
        let s = Seqnum::from_raw(0xC005);
        assert_eq!(s.seq(), 5);
        assert_eq!(s.session(), 3);
        assert_eq!(Seqnum::new(2, 0x3fff).raw(), 0xBFFF);
        assert_eq!(Seqnum::new(5, 1).session(), 1, "session is taken modulo 4");
    }

    #[test]
    fn counter_wraps_without_touching_session() {
        let s = Seqnum::new(1, SEQ_MASK);
        assert_eq!(s.next(), Seqnum::new(1, 0));
        assert_eq!(s.next().prev(), s);
        assert_eq!(Seqnum::new(3, 0).prev(), Seqnum::new(3, SEQ_MASK));
        assert_eq!(Seqnum::new(2, 10).add(SEQ_MASK + 1), Seqnum::new(2, 10));
    }

    #[test]
    fn distance_is_modular_and_session_blind() {
        let a = Seqnum::new(0, SEQ_MASK - 1);
        let b = a.add(5);
        assert_eq!(b.seq(), 3);
        assert_eq!(b.since(a), 5);
        assert_eq!(a.since(b), SEQ_MASK + 1 - 5);
        assert_eq!(Seqnum::new(3, 7).since(Seqnum::new(0, 7)), 0);
        assert_eq!(a.prev().since(a), SEQ_MASK);
    }

    #[test]
    fn session_compare_and_bump() {
        let a = Seqnum::new(1, 100);
        assert!(a.same_session(Seqnum::new(1, 9)));
        assert!(!a.same_session(Seqnum::new(2, 100)));
        let b = a.next_session_scrambled();
        assert_eq!(b.session(), 2);
        assert_ne!(b.seq(), a.seq());
        assert_eq!(Seqnum::new(3, 4).next_session_scrambled().session(), 0);
        assert_eq!(Seqnum::new(2, 99).restarted(), Seqnum::new(2, 1));
    }
}

//! Wide MEDIUM fragments between xmx boards: how long a fragment toward each peer may be.
//!
//! MX cuts a MEDIUM message into 4 KiB fragments, one frame each; a 9000-byte fabric
//! carries two of those per frame, and on the kernel's packet path each frame costs about
//! as much as 4 KiB of copying. A board whose link carries longer frames says so in the
//! padding of its CONNECTs ([`units_mark`]); its peers then send it fragments of up to
//! that many units (a wider `frag_pipeline`), and it splits them back into MX's 4 KiB
//! fragments for the library. MX and Open-MX never write the mark, so they only ever get
//! MX's fragments.
//!
//! What a peer allowed can go stale: it may move (a migrated guest keeps its MAC) to a
//! host whose link carries less. The library sends a message again when it is not acked;
//! a message sent wide that comes back for a resend is sent in 4 KiB fragments, and that
//! peer gets only those until it connects again.
//!
//! [`units_mark`]: xmx_wire::mxoe::units_mark

use rustc_hash::FxHashMap;
use xmx_wire::msg::MEDIUM_FRAG_MAX;
use xmx_wire::mxoe::{units_mark, Mac, MEDIUM_FRAG_LEN_SHIFT, MEDIUM_FRAG_LEN_SHIFT_MAX};

/// Wide sends remembered per guest to tell a resend: far more than a window of messages
/// in flight to any one peer endpoint.
const REMEMBERED: usize = 64;

/// One wide MEDIUM as sent: to whom (board, endpoint), from which endpoint, which message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WideSend {
    pub dst: Mac,
    pub dst_endpoint: u8,
    pub src_endpoint: u8,
    pub lib_seqnum: u16,
}

/// What one guest's peers allow, and its last wide sends.
#[derive(Debug, Default)]
pub(crate) struct WideMedium {
    /// Units per fragment each peer board allows (absent: 1, MX's).
    allowed: FxHashMap<Mac, u8>,
    sent: Vec<WideSend>,
    next: usize,
}

impl WideMedium {
    /// A CONNECT from `peer` carried `units` (1 without a mark): its fragments' limit from
    /// now on.
    pub fn learn(&mut self, peer: Mac, units: u8) {
        if units > 1 {
            self.allowed.insert(peer, units);
        } else {
            self.allowed.remove(&peer);
        }
    }

    /// The fragment stride (log2) for a MEDIUM of `length` bytes to `send.dst`, with
    /// `ours` the units this board's own link carries per frame. A message sent wide
    /// before is a resend: it and the peer's later ones go at MX's stride (`downgraded`
    /// tells the caller to count it).
    pub fn stride(&mut self, send: WideSend, length: u32, ours: u8) -> Stride {
        let narrow = Stride {
            shift: MEDIUM_FRAG_LEN_SHIFT,
            downgraded: false,
        };
        if length as usize <= MEDIUM_FRAG_MAX {
            return narrow;
        }
        let units = ours.min(self.allowed.get(&send.dst).copied().unwrap_or(1));
        if units <= 1 {
            return narrow;
        }
        if self.sent.contains(&send) {
            self.allowed.remove(&send.dst);
            self.sent.retain(|s| s.dst != send.dst);
            return Stride {
                downgraded: true,
                ..narrow
            };
        }
        if self.sent.len() < REMEMBERED {
            self.sent.push(send);
        } else if let Some(slot) = self.sent.get_mut(self.next) {
            *slot = send;
        }
        self.next = (self.next + 1) % REMEMBERED;
        Stride {
            shift: (MEDIUM_FRAG_LEN_SHIFT + units.ilog2()).min(MEDIUM_FRAG_LEN_SHIFT_MAX),
            downgraded: false,
        }
    }
}

/// The mark this board puts after its PULLs and CONNECTs: the units one frame toward it
/// may carry (nothing where that is MX's one).
#[derive(Debug, Clone, Copy)]
pub(crate) struct OurMark {
    bytes: [u8; units_mark::LEN],
    written: bool,
}

impl OurMark {
    pub fn new(units: u8) -> Self {
        let mut bytes = [0; units_mark::LEN];
        let written = units > 1 && units_mark::write(&mut bytes, units);
        OurMark { bytes, written }
    }

    /// The bytes to put right after the packet.
    pub fn bytes(&self) -> &[u8] {
        if self.written {
            &self.bytes
        } else {
            &[]
        }
    }
}

/// A MEDIUM's fragment stride, as [`WideMedium::stride`] chose it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stride {
    /// log2 of the stride: 12 is MX's 4 KiB.
    pub shift: u32,
    /// The message was sent wide before and now goes narrow.
    pub downgraded: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(seq: u16) -> WideSend {
        WideSend {
            dst: Mac([2, 0, 0, 0, 0, 9]),
            dst_endpoint: 3,
            src_endpoint: 1,
            lib_seqnum: seq,
        }
    }

    #[test]
    fn only_a_peer_that_allows_it_gets_wide_fragments_and_never_wider_than_our_link() {
        let mut w = WideMedium::default();
        assert_eq!(w.stride(send(1), 32768, 2).shift, 12, "no mark yet");
        w.learn(send(0).dst, 8);
        assert_eq!(w.stride(send(2), 32768, 2).shift, 13, "our link: 2 units");
        assert_eq!(w.stride(send(3), 32768, 8).shift, 15);
        assert_eq!(w.stride(send(4), 32768, 3).shift, 13, "a power of two");
        assert_eq!(w.stride(send(5), 4096, 8).shift, 12, "one fragment anyway");
        w.learn(send(0).dst, 1);
        assert_eq!(
            w.stride(send(6), 32768, 8).shift,
            12,
            "a CONNECT without the mark"
        );
    }

    #[test]
    fn a_resent_wide_message_goes_narrow_and_so_does_the_peer_until_it_connects_again() {
        let mut w = WideMedium::default();
        w.learn(send(0).dst, 2);
        assert_eq!(w.stride(send(7), 9000, 2).shift, 13);
        let other = WideSend {
            dst_endpoint: 4,
            ..send(7)
        };
        assert_eq!(
            w.stride(other, 9000, 2).shift,
            13,
            "another endpoint's message"
        );
        let again = w.stride(send(7), 9000, 2);
        assert_eq!((again.shift, again.downgraded), (12, true));
        assert_eq!(
            w.stride(send(8), 9000, 2),
            Stride {
                shift: 12,
                downgraded: false
            }
        );
        w.learn(send(0).dst, 2);
        assert_eq!(
            w.stride(send(7), 9000, 2).shift,
            13,
            "forgotten with the downgrade"
        );
    }

    #[test]
    fn the_memory_of_wide_sends_is_bounded() {
        let mut w = WideMedium::default();
        w.learn(send(0).dst, 2);
        for seq in 0..1000 {
            assert_eq!(w.stride(send(seq), 9000, 2).shift, 13);
        }
        assert_eq!(w.sent.len(), REMEMBERED);
        assert!(w.stride(send(999), 9000, 2).downgraded);
    }
}

//! The receive-side matching engine.
//!
//! MX matches on 64 bits of match info. A receive is posted with
//! `(match_info, match_mask)`, where every bit set in `match_info` must also be
//! set in `match_mask`; a message with match info `m` satisfies it when
//! `m & match_mask == match_info`. The receive's mask is the only mask: the
//! sender has none.
//!
//! - An arriving message takes the earliest posted receive it satisfies; if
//!   there is none it joins the unexpected queue, in arrival order.
//! - A newly posted receive first takes the earliest unexpected message that
//!   satisfies it; only if there is none is it queued.
//!
//! Hence the two queues never hold a pair that would match. The engine is
//! generic over what a receive (`R`) and a message (`U`) are.

use std::collections::VecDeque;

/// A receive whose `match_info` has bits outside its `match_mask`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("match info {match_info:#x} has bits outside mask {match_mask:#x}")]
pub struct BadMatchMask {
    /// The offending match info.
    pub match_info: u64,
    /// Its mask.
    pub match_mask: u64,
}

/// Checks MX's rule that a receive's match info lies inside its mask.
pub fn check_mask(match_info: u64, match_mask: u64) -> Result<(), BadMatchMask> {
    if match_info & !match_mask != 0 {
        Err(BadMatchMask {
            match_info,
            match_mask,
        })
    } else {
        Ok(())
    }
}

/// Whether a message with `msg_info` satisfies a receive `(match_info, match_mask)`.
pub const fn satisfies(msg_info: u64, match_info: u64, match_mask: u64) -> bool {
    msg_info & match_mask == match_info
}

#[derive(Clone, Debug)]
struct Posted<R> {
    match_info: u64,
    match_mask: u64,
    recv: R,
}

#[derive(Clone, Debug)]
struct Unexpected<U> {
    match_info: u64,
    msg: U,
}

/// What [`Matcher::post`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Posting<R, U> {
    /// The receive took this unexpected message (and left both queues).
    Matched(R, U),
    /// No unexpected message satisfied it; it waits in the posted queue.
    Queued,
}

/// Posted receives and unexpected messages of one endpoint.
#[derive(Clone, Debug)]
pub struct Matcher<R, U> {
    posted: VecDeque<Posted<R>>,
    unexpected: VecDeque<Unexpected<U>>,
}

impl<R, U> Default for Matcher<R, U> {
    fn default() -> Self {
        Matcher {
            posted: VecDeque::new(),
            unexpected: VecDeque::new(),
        }
    }
}

impl<R, U> Matcher<R, U> {
    /// An engine with both queues empty.
    pub fn new() -> Self {
        Self::default()
    }

    /// Posts a receive: matches the earliest satisfying unexpected message, or
    /// queues the receive.
    pub fn post(
        &mut self,
        match_info: u64,
        match_mask: u64,
        recv: R,
    ) -> Result<Posting<R, U>, BadMatchMask> {
        check_mask(match_info, match_mask)?;
        match self.take_unexpected(match_info, match_mask) {
            Some(msg) => Ok(Posting::Matched(recv, msg)),
            None => {
                self.posted.push_back(Posted {
                    match_info,
                    match_mask,
                    recv,
                });
                Ok(Posting::Queued)
            }
        }
    }

    /// A message with `msg_info` arrives: returns the earliest posted receive
    /// it satisfies (removed from the queue), or `None`, in which case the
    /// caller owns the message and files it with
    /// [`push_unexpected`](Self::push_unexpected) if it keeps it.
    pub fn arrive(&mut self, msg_info: u64) -> Option<R> {
        let pos = self
            .posted
            .iter()
            .position(|p| satisfies(msg_info, p.match_info, p.match_mask))?;
        self.posted.remove(pos).map(|p| p.recv)
    }

    /// Files a message nobody was waiting for, at the end of the unexpected queue.
    pub fn push_unexpected(&mut self, msg_info: u64, msg: U) {
        self.unexpected.push_back(Unexpected {
            match_info: msg_info,
            msg,
        });
    }

    /// Removes and returns the earliest unexpected message satisfying `(match_info, match_mask)`.
    pub fn take_unexpected(&mut self, match_info: u64, match_mask: u64) -> Option<U> {
        let pos = self
            .unexpected
            .iter()
            .position(|u| satisfies(u.match_info, match_info, match_mask))?;
        self.unexpected.remove(pos).map(|u| u.msg)
    }

    /// The earliest unexpected message satisfying `(match_info, match_mask)`,
    /// left in place (MX's `mx_iprobe`).
    pub fn probe(&self, match_info: u64, match_mask: u64) -> Option<(u64, &U)> {
        self.unexpected
            .iter()
            .find(|u| satisfies(u.match_info, match_info, match_mask))
            .map(|u| (u.match_info, &u.msg))
    }

    /// Removes the first posted receive for which `pred` holds (cancel).
    pub fn cancel(&mut self, mut pred: impl FnMut(&R) -> bool) -> Option<R> {
        let pos = self.posted.iter().position(|p| pred(&p.recv))?;
        self.posted.remove(pos).map(|p| p.recv)
    }

    /// Removes every unexpected message for which `pred` holds and returns
    /// them in queue order.
    pub fn remove_unexpected(&mut self, mut pred: impl FnMut(&U) -> bool) -> Vec<U> {
        let mut removed = Vec::new();
        let mut kept = VecDeque::with_capacity(self.unexpected.len());
        for u in self.unexpected.drain(..) {
            if pred(&u.msg) {
                removed.push(u.msg);
            } else {
                kept.push_back(u);
            }
        }
        self.unexpected = kept;
        removed
    }

    /// Posted receives waiting, in posting order.
    pub fn posted(&self) -> impl Iterator<Item = (u64, u64, &R)> {
        self.posted
            .iter()
            .map(|p| (p.match_info, p.match_mask, &p.recv))
    }

    /// Unexpected messages waiting, in arrival order.
    pub fn unexpected(&self) -> impl Iterator<Item = (u64, &U)> {
        self.unexpected.iter().map(|u| (u.match_info, &u.msg))
    }

    /// Number of posted receives.
    pub fn posted_len(&self) -> usize {
        self.posted.len()
    }

    /// Number of unexpected messages.
    pub fn unexpected_len(&self) -> usize {
        self.unexpected.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_rule() {
        assert!(check_mask(0x12, 0xff).is_ok());
        assert_eq!(
            check_mask(0x100, 0xff),
            Err(BadMatchMask {
                match_info: 0x100,
                match_mask: 0xff
            })
        );
        assert!(satisfies(0xabcd, 0xcd, 0xff));
        assert!(!satisfies(0xabcd, 0xce, 0xff));
        assert!(satisfies(u64::MAX, 0, 0), "mask 0 takes anything");
    }

    #[test]
    fn arrival_takes_earliest_satisfied_posting() {
        let mut m: Matcher<&str, u32> = Matcher::new();
        assert_eq!(m.post(0x1, 0xf, "a"), Ok(Posting::Queued));
        assert_eq!(m.post(0x0, 0x0, "any"), Ok(Posting::Queued));
        assert_eq!(m.post(0x1, 0xf, "b"), Ok(Posting::Queued));
        assert_eq!(m.arrive(0x21), Some("a"));
        assert_eq!(m.arrive(0x22), Some("any"));
        assert_eq!(m.arrive(0x31), Some("b"));
        assert_eq!(m.arrive(0x31), None);
        assert_eq!(m.posted_len(), 0);
    }

    #[test]
    fn posting_takes_earliest_unexpected() {
        let mut m: Matcher<&str, u32> = Matcher::new();
        m.push_unexpected(0x10, 1);
        m.push_unexpected(0x21, 2);
        m.push_unexpected(0x11, 3);
        assert_eq!(m.probe(0x1, 0xf), Some((0x21, &2)));
        assert_eq!(m.post(0x1, 0xf, "r"), Ok(Posting::Matched("r", 2)));
        assert_eq!(m.post(0x1, 0xf, "s"), Ok(Posting::Matched("s", 3)));
        assert_eq!(m.post(0x1, 0xf, "t"), Ok(Posting::Queued));
        assert_eq!(m.post(0, 0, "u"), Ok(Posting::Matched("u", 1)));
        assert_eq!(m.unexpected_len(), 0);
        assert_eq!(
            m.post(0x100, 0xff, "bad"),
            Err(BadMatchMask {
                match_info: 0x100,
                match_mask: 0xff
            })
        );
        assert_eq!(m.posted_len(), 1);
    }

    #[test]
    fn cancel_and_remove() {
        let mut m: Matcher<u32, u32> = Matcher::new();
        for r in 0..3 {
            m.post(0, 0xff, r).unwrap();
        }
        assert_eq!(m.cancel(|&r| r == 1), Some(1));
        assert_eq!(m.cancel(|&r| r == 1), None);
        assert_eq!(m.arrive(0), Some(0));
        assert_eq!(m.arrive(0), Some(2));
        for u in 0..5 {
            m.push_unexpected(7, u);
        }
        assert_eq!(m.remove_unexpected(|&u| u % 2 == 0), vec![0, 2, 4]);
        assert_eq!(
            m.unexpected().map(|(_, &u)| u).collect::<Vec<_>>(),
            vec![1, 3]
        );
    }
}

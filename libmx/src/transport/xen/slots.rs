//! Send-queue slots: which ones a MEDIUM message in flight still holds.
//!
//! A MEDIUM message is copied into send-queue slots (one 4 KiB fragment per
//! slot) before its request is posted; the backend copies the whole message
//! out when it takes the request and completes it with an event carrying the
//! request's tag. The slots are ours again from that completion on.

use rustc_hash::FxHashMap;

/// The send queue's slots, and the requests holding some.
#[derive(Debug, Clone)]
pub(crate) struct SendSlots {
    free: Vec<u16>,
    held: FxHashMap<u32, Vec<u16>>,
    count: u16,
}

impl SendSlots {
    /// A queue of `count` slots, all free.
    pub(crate) fn new(count: u16) -> SendSlots {
        SendSlots {
            // Popped from the end: the lowest slots go first.
            free: (0..count).rev().collect(),
            held: FxHashMap::default(),
            count,
        }
    }

    /// Slots in the queue.
    pub(crate) fn count(&self) -> u16 {
        self.count
    }

    /// Slots free now.
    pub(crate) fn available(&self) -> usize {
        self.free.len()
    }

    /// Takes `n` free slots, or none if fewer are free.
    pub(crate) fn take(&mut self, n: usize) -> Option<Vec<u16>> {
        if n > self.free.len() {
            return None;
        }
        let at = self.free.len() - n;
        let mut slots = self.free.split_off(at);
        slots.reverse();
        Some(slots)
    }

    /// Gives slots taken by [`SendSlots::take`] back unused.
    pub(crate) fn put_back(&mut self, slots: Vec<u16>) {
        for s in slots.into_iter().rev() {
            if s < self.count && !self.free.contains(&s) {
                self.free.push(s);
            }
        }
    }

    /// Records that the request tagged `tag` holds `slots`.
    pub(crate) fn hold(&mut self, tag: u32, slots: Vec<u16>) {
        if let Some(old) = self.held.insert(tag, slots) {
            // Tags are not reused while in flight; should one be, its slots
            // are not lost.
            self.put_back(old);
        }
    }

    /// The request tagged `tag` completed: its slots are free. False if it
    /// held none.
    pub(crate) fn complete(&mut self, tag: u32) -> bool {
        match self.held.remove(&tag) {
            Some(slots) => {
                self.put_back(slots);
                true
            }
            None => false,
        }
    }

    /// Requests holding slots.
    pub(crate) fn in_flight(&self) -> usize {
        self.held.len()
    }

    /// Every slot free again: the rings were replaced and no completion will
    /// come for what was in flight.
    pub(crate) fn reset(&mut self) {
        *self = SendSlots::new(self.count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_come_back_with_their_request() {
        let mut s = SendSlots::new(8);
        let a = s.take(3).unwrap();
        assert_eq!(a, vec![0, 1, 2]);
        s.hold(10, a);
        let b = s.take(5).unwrap();
        assert_eq!(b, vec![3, 4, 5, 6, 7]);
        s.hold(11, b);
        assert_eq!(s.take(1), None);
        assert!(s.complete(10));
        assert!(!s.complete(10), "once");
        assert!(!s.complete(99));
        assert_eq!(s.available(), 3);
        assert_eq!(s.take(3).unwrap(), vec![0, 1, 2]);
        assert_eq!(s.in_flight(), 1);
        s.reset();
        assert_eq!((s.available(), s.in_flight()), (8, 0));
    }

    #[test]
    fn put_back_ignores_foreign_and_repeated_slots() {
        let mut s = SendSlots::new(4);
        let a = s.take(2).unwrap();
        s.put_back(vec![a[0], a[0], 9]);
        assert_eq!(s.available(), 3);
        s.put_back(vec![a[1]]);
        assert_eq!(s.available(), 4);
        let mut all = s.take(4).unwrap();
        all.sort();
        assert_eq!(all, vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_reused_tag_does_not_leak_slots() {
        let mut s = SendSlots::new(4);
        let a = s.take(2).unwrap();
        s.hold(1, a);
        let b = s.take(2).unwrap();
        s.hold(1, b);
        assert_eq!(s.available(), 2);
        s.complete(1);
        assert_eq!(s.available(), 4);
    }
}

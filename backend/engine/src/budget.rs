//! The host-wide budget of PULL_REPLY frames in flight, shared by every pull of every
//! guest of the engine.
//!
//! Every block a pull requests holds its frames of the budget until the block retires, so
//! the replies the peers may send at once never outnumber the budget, whatever the number
//! of guests and pulls: the daemon sizes it below its NIC's receive ring, which then
//! cannot overflow. A lone pull grows its pipeline up to its own limit; many pulls share
//! the budget. Blocks are handed out by deficit round robin between guests, in proportion
//! to their weights (dom0's quality-of-service setting), and round robin between the pulls
//! of one guest, so every waiting pull gets a block in turn and none starves.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use xmx_wire::mxoe::{PULL_BLOCK_LEN_MAX, PULL_REPLY_LEN_MAX};

use super::GuestId;

/// Frames of a whole block: the most one grant can cost.
pub(crate) const BLOCK_FRAMES: u32 = (PULL_BLOCK_LEN_MAX / PULL_REPLY_LEN_MAX) as u32;

/// A pull, as the budget names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PullKey {
    pub guest: GuestId,
    pub endpoint: u8,
    pub handle: u32,
}

/// One guest's turn in the round.
#[derive(Debug, Default)]
struct GuestTurn {
    /// Its pulls waiting for a block, oldest first.
    pulls: VecDeque<PullKey>,
    /// Frames it may still be granted in this round.
    deficit: u64,
    /// True once its quantum was added for the current visit.
    visited: bool,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct PullBudget {
    frames_max: u32,
    in_flight: u32,
    turns: FxHashMap<GuestId, GuestTurn>,
    /// Guests with waiting pulls, in round order.
    round: VecDeque<GuestId>,
    /// Frames granted per guest since it was first seen (for counters and tests).
    granted: FxHashMap<GuestId, u64>,
}

impl PullBudget {
    /// A budget of `frames_max` frames; at least one block, so a pull can always progress.
    pub fn new(frames_max: u32) -> Self {
        PullBudget {
            frames_max: frames_max.max(BLOCK_FRAMES),
            in_flight: 0,
            turns: FxHashMap::default(),
            round: VecDeque::new(),
            granted: FxHashMap::default(),
        }
    }

    /// Frames held by requested blocks.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// The budget.
    pub fn frames_max(&self) -> u32 {
        self.frames_max
    }

    /// Frames granted to `guest` so far.
    pub fn granted(&self, guest: GuestId) -> u64 {
        self.granted.get(&guest).copied().unwrap_or(0)
    }

    /// A pull wants a block (once: the caller keeps track of whether it waits).
    pub fn enqueue(&mut self, key: PullKey) {
        let turn = self.turns.entry(key.guest).or_default();
        if turn.pulls.is_empty() && !self.round.contains(&key.guest) {
            self.round.push_back(key.guest);
        }
        turn.pulls.push_back(key);
    }

    /// The next pull to grant a block to, if the budget has room for a whole block. The
    /// caller grows it and calls [`PullBudget::charge`] with the block's frames.
    pub fn next_grant(&mut self, weight: impl Fn(GuestId) -> u32) -> Option<PullKey> {
        if self.in_flight + BLOCK_FRAMES > self.frames_max {
            return None;
        }
        // Each visit either grants or ends the guest's turn, and a guest's deficit grows
        // by at least one block per visit, so this ends.
        loop {
            let guest = *self.round.front()?;
            let turn = self.turns.entry(guest).or_default();
            if turn.pulls.is_empty() {
                turn.deficit = 0;
                turn.visited = false;
                self.round.pop_front();
                continue;
            }
            if !turn.visited {
                turn.visited = true;
                turn.deficit += u64::from(weight(guest).max(1)) * u64::from(BLOCK_FRAMES);
            }
            if turn.deficit >= u64::from(BLOCK_FRAMES) {
                return turn.pulls.pop_front();
            }
            turn.visited = false;
            self.round.rotate_left(1);
        }
    }

    /// `frames` of the budget are now held by a block of `guest`.
    pub fn charge(&mut self, guest: GuestId, frames: u32) {
        self.in_flight += frames;
        *self.granted.entry(guest).or_default() += u64::from(frames);
        if let Some(turn) = self.turns.get_mut(&guest) {
            turn.deficit = turn.deficit.saturating_sub(u64::from(frames));
        }
    }

    /// A pull's blocks retired or the pull ended: `frames` come back.
    pub fn release(&mut self, frames: u32) {
        self.in_flight = self.in_flight.saturating_sub(frames);
    }

    /// Forget the waiting pulls of a closed endpoint, so a later pull reusing a handle
    /// is not served twice per turn (their frames were released already).
    pub fn forget_endpoint(&mut self, guest: GuestId, endpoint: u8) {
        if let Some(turn) = self.turns.get_mut(&guest) {
            turn.pulls.retain(|k| k.endpoint != endpoint);
        }
    }

    /// Forget a guest that left (its pulls released their frames already).
    pub fn remove_guest(&mut self, guest: GuestId) {
        self.turns.remove(&guest);
        self.round.retain(|&g| g != guest);
        self.granted.remove(&guest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(guest: u32, handle: u32) -> PullKey {
        PullKey {
            guest: GuestId(guest),
            endpoint: 0,
            handle,
        }
    }

    #[test]
    fn grants_stop_at_the_budget_and_resume_on_release() {
        let mut b = PullBudget::new(2 * BLOCK_FRAMES);
        for h in 0..3 {
            b.enqueue(key(1, h));
        }
        let first = b.next_grant(|_| 1).unwrap();
        b.charge(first.guest, BLOCK_FRAMES);
        let second = b.next_grant(|_| 1).unwrap();
        b.charge(second.guest, BLOCK_FRAMES);
        assert_eq!((first.handle, second.handle), (0, 1));
        assert_eq!(b.next_grant(|_| 1), None, "budget used up");
        b.release(BLOCK_FRAMES);
        assert_eq!(b.next_grant(|_| 1).map(|k| k.handle), Some(2));
    }

    #[test]
    fn guests_are_served_in_proportion_to_their_weights() {
        let mut b = PullBudget::new(u32::MAX);
        let weights = [1, 1, 2, 4];
        for g in 0..4 {
            b.enqueue(key(g, 0));
        }
        for _ in 0..800 {
            let k = b.next_grant(|g| weights[g.0 as usize]).unwrap();
            b.charge(k.guest, BLOCK_FRAMES);
            b.enqueue(k);
        }
        let got: Vec<u64> = (0..4).map(|g| b.granted(GuestId(g)) / 8).collect();
        assert_eq!(got, vec![100, 100, 200, 400]);
    }

    #[test]
    fn a_small_budget_never_goes_below_one_block() {
        let mut b = PullBudget::new(1);
        assert_eq!(b.frames_max(), BLOCK_FRAMES);
        b.enqueue(key(1, 0));
        assert!(b.next_grant(|_| 1).is_some());
    }
}

//! Per-partner connection state: sessions, the send window, the receive
//! window and when to ack.
//!
//! A partner is one remote endpoint. Both directions share the structure:
//!
//! - send side: `next_send_seq` is the seqnum of the next message we send,
//!   `next_acked_send_seq` the first one not acknowledged yet; the requests in
//!   between wait in `non_acked`, in seqnum order.
//! - receive side: `next_match_recv_seq` is the next message to match,
//!   `next_frag_recv_seq` the first message not entirely received (lower than
//!   `next_match_recv_seq` while a MEDIUM is partly in); everything before it
//!   may be acked. `last_acked_recv_seq` is what we last told the partner.
//!
//! Sessions: a partner's endpoint session id (`true_session`) goes into every
//! message we send it; `back_session` is the one it announced in its own
//! connect request, used for acks. The session bits of the seqnums tell frames
//! of a previous connection apart.

use std::collections::VecDeque;

use crate::frame::{MessageKind, Notify, PeerAddr};
use crate::seqnum::{Seqnum, EARLY_WINDOW, THROTTLE_WINDOW};
use crate::time::Instant;
use crate::{InboundId, RequestId};

/// "No seqnum yet": session bits 3, counter all ones.
const UNSET: Seqnum = Seqnum::from_raw(0xffff);

/// Whether, and how urgently, the partner needs an ack from us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AckNeed {
    /// Everything received has been acked.
    None,
    /// Unacked messages since `since`; ack by `since + ack_delay` unless a
    /// message to the partner carries the ack first.
    Delayed { since: Instant },
    /// Ack at the next opportunity.
    Immediate,
}

/// Where an arriving sequenced frame falls relative to the receive window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// Inside `[next_frag, next_match]`: the next message, a fragment of a
    /// partly received MEDIUM, or a duplicate of something already handled.
    InWindow,
    /// Ahead of the next expected message, close enough to be kept.
    Early,
    /// Behind the window (a duplicate) or too far ahead to trust. `ack_now`
    /// when it is the message just before the window: its sender probably
    /// lost our ack.
    Obsolete { ack_now: bool },
}

/// A sequenced frame that arrived ahead of its turn, kept until its turn comes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum EarlyFrame {
    Message {
        seqnum: Seqnum,
        match_info: u64,
        kind: MessageKind,
        payload: Vec<u8>,
    },
    Notify(Notify),
}

impl EarlyFrame {
    pub(crate) fn seqnum(&self) -> Seqnum {
        match self {
            EarlyFrame::Message { seqnum, .. } => *seqnum,
            EarlyFrame::Notify(n) => n.seqnum,
        }
    }

    /// Distinguishes fragments of one MEDIUM; 0 for everything else.
    fn frag(&self) -> u8 {
        match self {
            EarlyFrame::Message {
                kind: MessageKind::Medium(m),
                ..
            } => m.frag_seqnum,
            _ => 0,
        }
    }
}

/// State shared with one remote endpoint.
#[derive(Debug)]
pub(crate) struct Partner {
    pub addr: PeerAddr,
    /// The partner endpoint's session: goes into every message we send it.
    pub true_session: Option<u32>,
    /// The session the partner announced when it connected to us: goes into acks.
    pub back_session: Option<u32>,
    /// Counter of our connect attempts to this partner.
    pub connect_seqnum: u8,
    pub last_send_acknum: u32,
    pub last_recv_acknum: u32,

    pub next_send_seq: Seqnum,
    pub next_acked_send_seq: Seqnum,
    /// Requests holding a seqnum and waiting for its ack, in seqnum order.
    pub non_acked: VecDeque<RequestId>,
    /// Requests waiting for a seqnum because too many sends are unacked.
    pub throttled: VecDeque<RequestId>,
    /// Acked LARGE sends waiting for the receiver's NOTIFY.
    pub awaiting_notify: Vec<RequestId>,
    /// Our connect requests to this partner waiting for a reply.
    pub connects: Vec<RequestId>,

    pub next_match_recv_seq: Seqnum,
    pub next_frag_recv_seq: Seqnum,
    pub last_acked_recv_seq: Seqnum,
    /// Matched-or-unexpected MEDIUMs still missing fragments, in seqnum order.
    pub partials: VecDeque<(Seqnum, InboundId)>,
    /// Frames ahead of `next_match_recv_seq`, sorted by seqnum then fragment.
    pub early: Vec<EarlyFrame>,
    pub ack: AckNeed,
    /// When the last sequenced frame of the current connection arrived
    /// (new or resent): how long a closed endpoint lingers counts from it.
    pub last_heard: Option<Instant>,
}

impl Partner {
    pub(crate) fn new(addr: PeerAddr) -> Self {
        let first = Seqnum::new(0, 1);
        Partner {
            addr,
            true_session: None,
            back_session: None,
            connect_seqnum: 0,
            last_send_acknum: 0,
            last_recv_acknum: 0,
            next_send_seq: UNSET,
            next_acked_send_seq: UNSET,
            non_acked: VecDeque::new(),
            throttled: VecDeque::new(),
            awaiting_notify: Vec::new(),
            connects: Vec::new(),
            next_match_recv_seq: first,
            next_frag_recv_seq: first,
            last_acked_recv_seq: first,
            partials: VecDeque::new(),
            early: Vec::new(),
            ack: AckNeed::None,
            last_heard: None,
        }
    }

    /// Forgets the connection (queues must have been emptied by the caller):
    /// sessions unknown, receive counter back to 1 in the current receive session.
    pub(crate) fn reset(&mut self) {
        let addr = self.addr;
        let recv = self.next_match_recv_seq.restarted();
        *self = Partner::new(addr);
        self.set_recv_start(recv);
    }

    /// Moves the receive window to `start` with nothing pending to ack.
    pub(crate) fn set_recv_start(&mut self, start: Seqnum) {
        self.next_match_recv_seq = start;
        self.next_frag_recv_seq = start;
        self.last_acked_recv_seq = start;
    }

    /// Moves the send window to `start` (what the partner expects from us next).
    pub(crate) fn set_send_start(&mut self, start: Seqnum) {
        self.next_send_seq = start;
        self.next_acked_send_seq = start;
    }

    /// Whether a new send must wait for acks before taking a seqnum, with
    /// `window` messages allowed in flight. A message the partner refused
    /// (NACKed) no longer occupies the window although no ack moved its
    /// base: a partner that refuses everything acks nothing, and the held
    /// sends must still get their turn to be refused. The seqnum distance
    /// stays bounded by the protocol's window all the same, so that acks
    /// remain unambiguous.
    pub(crate) fn send_window_full(&self, window: u16) -> bool {
        self.non_acked.len() >= usize::from(window.min(THROTTLE_WINDOW))
            || self.next_send_seq.since(self.next_acked_send_seq) >= THROTTLE_WINDOW
    }

    /// Takes the next send seqnum.
    pub(crate) fn take_send_seq(&mut self) -> Seqnum {
        let s = self.next_send_seq;
        self.next_send_seq = s.next();
        s
    }

    /// How many of our sends `ack_before` newly acknowledges (0 for a stale
    /// or impossible ack).
    pub(crate) fn new_acks(&self, ack_before: Seqnum) -> u16 {
        let missing = self.next_send_seq.since(self.next_acked_send_seq);
        let new = ack_before.since(self.next_acked_send_seq);
        if new == 0 || new > missing {
            0
        } else {
            new
        }
    }

    /// Position of a send seqnum in the unacked window.
    pub(crate) fn send_index(&self, seq: Seqnum) -> u16 {
        seq.since(self.next_acked_send_seq)
    }

    /// Classifies an arriving sequenced frame.
    pub(crate) fn arrival(&self, seq: Seqnum) -> Arrival {
        let index = seq.since(self.next_frag_recv_seq);
        let max = self.next_match_recv_seq.since(self.next_frag_recv_seq);
        if index <= max {
            Arrival::InWindow
        } else if index <= max.saturating_add(EARLY_WINDOW) {
            Arrival::Early
        } else {
            Arrival::Obsolete {
                ack_now: seq.next() == self.next_frag_recv_seq,
            }
        }
    }

    /// Whether `seq` names a MEDIUM that is matched but still partial.
    pub(crate) fn is_partial_seq(&self, seq: Seqnum) -> bool {
        seq.since(self.next_frag_recv_seq) < self.next_match_recv_seq.since(self.next_frag_recv_seq)
    }

    /// Keeps an early frame in order; drops duplicates and, past `max`
    /// frames, newcomers (the sender will resend them). Returns whether kept.
    pub(crate) fn keep_early(&mut self, frame: EarlyFrame, max: usize) -> bool {
        if self.early.len() >= max {
            return false;
        }
        let base = self.next_frag_recv_seq;
        let key = |f: &EarlyFrame| (f.seqnum().since(base), f.frag());
        let k = key(&frame);
        match self.early.binary_search_by(|f| key(f).cmp(&k)) {
            Ok(_) => false,
            Err(pos) => {
                self.early.insert(pos, frame);
                true
            }
        }
    }

    /// Removes and returns the first early frame whose turn has come, dropping
    /// any that fell behind the window on the way.
    pub(crate) fn next_due_early(&mut self) -> Option<EarlyFrame> {
        while let Some(first) = self.early.first() {
            match self.arrival(first.seqnum()) {
                Arrival::InWindow => return Some(self.early.remove(0)),
                Arrival::Obsolete { .. } => {
                    self.early.remove(0);
                }
                Arrival::Early => return None,
            }
        }
        None
    }

    /// Drops every early frame.
    pub(crate) fn clear_early(&mut self) {
        self.early.clear();
    }

    /// Recomputes the first not-entirely-received seqnum after a message
    /// matched or completed, and schedules the ack it calls for.
    pub(crate) fn update_next_frag(&mut self, now: Instant, imm_threshold: u16) {
        let new = match self.partials.front() {
            Some(&(seq, _)) => seq,
            None => self.next_match_recv_seq,
        };
        if new == self.next_frag_recv_seq {
            return;
        }
        self.next_frag_recv_seq = new;
        if new.since(self.last_acked_recv_seq) >= imm_threshold {
            self.ack = AckNeed::Immediate;
        } else if self.ack == AckNeed::None {
            self.ack = AckNeed::Delayed { since: now };
        }
    }

    /// Asks for an ack at the next opportunity.
    pub(crate) fn need_ack_now(&mut self) {
        self.ack = AckNeed::Immediate;
    }

    /// Records that an ack up to `next_frag_recv_seq` left (piggybacked or explicit).
    pub(crate) fn ack_sent(&mut self) {
        self.ack = AckNeed::None;
        self.last_acked_recv_seq = self.next_frag_recv_seq;
    }

    /// When a delayed ack falls due.
    pub(crate) fn ack_due(&self, delay: std::time::Duration) -> Option<Instant> {
        match self.ack {
            AckNeed::Delayed { since } => Some(since + delay),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn partner() -> Partner {
        let mut p = Partner::new(PeerAddr::new(1, 2));
        p.set_send_start(Seqnum::new(0, 1));
        p
    }

    fn msg(seq: Seqnum, frag: u8) -> EarlyFrame {
        EarlyFrame::Message {
            seqnum: seq,
            match_info: 0,
            kind: MessageKind::Medium(crate::frame::MediumFrag {
                msg_length: 9000,
                frag_seqnum: frag,
                frag_pipeline: 12,
            }),
            payload: vec![0; 10],
        }
    }

    #[test]
    fn ack_counting_handles_stale_and_wrap() {
        let mut p = partner();
        p.set_send_start(Seqnum::new(1, 0x3ffe));
        for _ in 0..4 {
            p.take_send_seq();
        }
        assert_eq!(p.next_send_seq, Seqnum::new(1, 2));
        assert_eq!(p.new_acks(Seqnum::new(1, 0x3fff)), 1);
        assert_eq!(p.new_acks(Seqnum::new(1, 2)), 4);
        assert_eq!(
            p.new_acks(Seqnum::new(1, 3)),
            0,
            "acks beyond what was sent are refused"
        );
        assert_eq!(p.new_acks(Seqnum::new(1, 0x3ffe)), 0, "nothing new");
        assert_eq!(p.send_index(Seqnum::new(1, 1)), 3);
    }

    #[test]
    fn window_full_at_half_space() {
        let mut p = partner();
        for _ in 0..THROTTLE_WINDOW - 1 {
            p.take_send_seq();
        }
        assert!(!p.send_window_full(THROTTLE_WINDOW));
        p.take_send_seq();
        assert!(
            p.send_window_full(THROTTLE_WINDOW),
            "refused messages still count against the protocol's window"
        );
    }

    #[test]
    fn window_counts_messages_waiting_for_an_ack() {
        let mut p = partner();
        for i in 0..4 {
            p.take_send_seq();
            p.non_acked.push_back(RequestId(i));
        }
        assert!(p.send_window_full(4));
        assert!(!p.send_window_full(5));
        // A refusal takes one out of the window, though nothing was acked.
        p.non_acked.pop_front();
        assert!(!p.send_window_full(4));
    }

    #[test]
    fn arrival_classes() {
        let mut p = partner();
        let s = |n: u16| Seqnum::new(0, n);
        p.set_recv_start(s(10));
        assert_eq!(p.arrival(s(10)), Arrival::InWindow);
        assert_eq!(p.arrival(s(11)), Arrival::Early);
        assert_eq!(p.arrival(s(10 + 255)), Arrival::Early);
        assert_eq!(p.arrival(s(10 + 256)), Arrival::Obsolete { ack_now: false });
        assert_eq!(p.arrival(s(9)), Arrival::Obsolete { ack_now: true });
        assert_eq!(p.arrival(s(8)), Arrival::Obsolete { ack_now: false });
        // A partial MEDIUM at 10 widens the window up to next_match.
        p.next_match_recv_seq = s(13);
        assert!(p.is_partial_seq(s(12)));
        assert!(!p.is_partial_seq(s(13)));
        assert_eq!(p.arrival(s(13)), Arrival::InWindow);
        assert_eq!(p.arrival(s(14)), Arrival::Early);
        // Across the counter wrap.
        p.set_recv_start(s(0x3fff));
        assert_eq!(p.arrival(s(0)), Arrival::Early);
        assert_eq!(p.arrival(s(0x3ffe)), Arrival::Obsolete { ack_now: true });
    }

    #[test]
    fn early_frames_sorted_deduped_and_bounded() {
        let mut p = partner();
        let s = |n: u16| Seqnum::new(0, n);
        p.set_recv_start(s(0x3ffe));
        assert!(p.keep_early(msg(s(1), 1), 10));
        assert!(p.keep_early(msg(s(0x3fff), 0), 10));
        assert!(p.keep_early(msg(s(1), 0), 10));
        assert!(!p.keep_early(msg(s(1), 0), 10), "duplicate");
        assert!(!p.keep_early(msg(s(2), 0), 3), "full");
        let order: Vec<_> = p
            .early
            .iter()
            .map(|f| (f.seqnum().seq(), f.frag()))
            .collect();
        assert_eq!(order, vec![(0x3fff, 0), (1, 0), (1, 1)]);
        assert_eq!(p.next_due_early(), None);
        p.next_match_recv_seq = s(0x3fff);
        assert_eq!(p.next_due_early().map(|f| f.seqnum()), Some(s(0x3fff)));
        assert_eq!(p.early.len(), 2);
    }

    #[test]
    fn ack_scheduling() {
        let mut p = partner();
        let t = Instant::from_millis(1);
        p.next_match_recv_seq = p.next_match_recv_seq.next();
        p.update_next_frag(t, 4);
        assert_eq!(p.ack, AckNeed::Delayed { since: t });
        assert_eq!(
            p.ack_due(Duration::from_millis(5)),
            Some(Instant::from_millis(6))
        );
        for _ in 0..3 {
            p.next_match_recv_seq = p.next_match_recv_seq.next();
            p.update_next_frag(Instant::from_millis(2), 4);
        }
        assert_eq!(
            p.ack,
            AckNeed::Immediate,
            "four unacked messages force an ack"
        );
        p.ack_sent();
        assert_eq!(p.ack, AckNeed::None);
        assert_eq!(p.last_acked_recv_seq, p.next_frag_recv_seq);
        // A partial MEDIUM holds next_frag back: no new ack is due.
        p.partials.push_back((p.next_match_recv_seq, InboundId(0)));
        p.next_match_recv_seq = p.next_match_recv_seq.next();
        p.update_next_frag(t, 4);
        assert_eq!(p.ack, AckNeed::None);
    }
}

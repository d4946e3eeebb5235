//! Closing: the endpoint stops taking anything in, but for a while (its
//! linger) still answers what its partners resend, as a TCP connection
//! lingers in TIME_WAIT.
//!
//! An exchange ends with an ack, and the side that owes it often closes at
//! once. If that last ack is lost, the partner resends a message this
//! endpoint took in already; a closed port would have it refused
//! (`ENDPT_CLOSED`) and the partner would read a delivered message as a
//! failed send. A closed endpoint therefore acks every resent frame it had
//! taken in, and only frames it never took in stay unanswered, so that
//! their senders learn of the close (the refusal) once the linger ends.

use super::*;
use crate::seqnum::THROTTLE_WINDOW;

/// Longest a closing endpoint waits for its NOTIFYs to be acked and its
/// held sends to leave, before it closes all the same.
pub const CLOSE_SETTLE_MAX: std::time::Duration = std::time::Duration::from_secs(3);

impl Endpoint {
    /// How long a closing endpoint may wait, before [`close`](Self::close),
    /// for [`unacked_notifies`](Self::unacked_notifies) and
    /// [`held_sends`](Self::held_sends) to reach zero. A NOTIFY is the only
    /// word a LARGE sender waits for after its RNDV was acked: if the
    /// closing receiver gave up on it early, a lost NOTIFY would leave that
    /// send waiting out its whole rendezvous timeout. So the wait covers
    /// several retransmissions (the retry budget), capped by
    /// [`CLOSE_SETTLE_MAX`] for a partner that vanished.
    pub fn settle_limit(&self) -> std::time::Duration {
        self.config.retry_budget().min(CLOSE_SETTLE_MAX)
    }

    /// The application closed the endpoint: every request is dropped
    /// without an event, the acks owed are queued, and from now on only
    /// frames this endpoint had taken in are answered (with an ack). Call
    /// [`linger_until`](Self::linger_until) to learn how long the port
    /// should stay open for that.
    pub fn close(&mut self, now: Instant) {
        self.timers_changed();
        if self.closed {
            return;
        }
        self.closed = true;
        self.requests.clear();
        self.events.clear();
        for p in self.partners.values_mut() {
            p.non_acked.clear();
            p.throttled.clear();
            p.awaiting_notify.clear();
            p.connects.clear();
            p.clear_early();
        }
        self.flush_acks();
        tracing::debug!(session = self.session, ?now, "endpoint closed, lingering");
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Until when a closed endpoint should keep answering resent frames: a
    /// partner resends a message whose ack it missed one resend delay after
    /// it sent it, so `linger` after the last sequenced frame that arrived
    /// from any partner (a resent one moves it on). `None` when no partner
    /// ever sent us anything: then nobody can be missing an ack.
    pub fn linger_until(&self, linger: std::time::Duration) -> Option<Instant> {
        self.partners
            .values()
            .filter_map(|p| p.last_heard)
            .max()
            .map(|t| t + linger)
    }

    /// A sequenced frame for a closed endpoint: acked again if it is one we
    /// had taken in entirely (its sender missed our ack), else dropped
    /// without an answer.
    pub(super) fn on_sequenced_closed(&mut self, now: Instant, src: PeerAddr, seq: Seqnum) {
        let Some(p) = self.partners.get_mut(&src) else {
            return;
        };
        if !seq.same_session(p.next_frag_recv_seq) {
            return;
        }
        let behind = p.next_frag_recv_seq.since(seq);
        if behind == 0 || behind > THROTTLE_WINDOW {
            tracing::trace!(?src, ?seq, "frame for a closed endpoint, not taken");
            return;
        }
        p.last_heard = Some(now);
        tracing::debug!(?src, ?seq, "resent frame answered by a closed endpoint");
        self.send_liback(src);
    }
}

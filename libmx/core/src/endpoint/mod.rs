//! The endpoint: one MX endpoint's protocol state, driven by calls and frames.
//!
//! Inputs are the application's requests ([`Endpoint::connect`],
//! [`Endpoint::send`], [`Endpoint::post_recv`], ...), received frames
//! ([`Endpoint::handle_frame`]) and the passage of time
//! ([`Endpoint::handle_timeout`]). Outputs are frames to put on the wire
//! ([`Endpoint::poll_transmit`]), completions ([`Endpoint::poll_event`]) and
//! the next instant at which the endpoint wants `handle_timeout`
//! ([`Endpoint::next_timeout`]). Every call takes the current time as an
//! argument; nothing here reads a clock, sleeps or does I/O.
//!
//! After any input, callers drain `poll_transmit` (which also emits acks
//! that became urgent) and `poll_event`, then wait for a frame or for
//! `next_timeout`.

mod ack;
mod close;
mod connect;
mod recv;
mod report;
mod send;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::OnceLock;

use crate::class::{MessageClass, SMALL_MAX, TINY_MAX};
use crate::config::Config;
use crate::frame::{
    Body, ConnectReply, ConnectRequest, Frame, Liback, MediumFrag, Message, MessageKind, Nack,
    Notify, PeerAddr, RdmaWindow, Rndv,
};
use crate::matching::{BadMatchMask, Matcher, Posting};
use crate::medium::{self, FragError, Inserted, Reassembly, FRAG_PIPELINE};
use crate::partner::{AckNeed, Arrival, EarlyFrame, Partner};
use crate::seqnum::Seqnum;
use crate::status::{ConnectStatus, NackType, Status};
use crate::time::Instant;

pub use close::CLOSE_SETTLE_MAX;

/// Names a request (connect, send or receive) for its whole life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

/// Names a message being received (matched or not); an
/// [`EndpointEvent::Unexpected`] gives it to the application.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InboundId(pub(crate) u64);

/// A connected remote endpoint as the application sees it: where it is and
/// which incarnation (session) of it we talk to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EndpointAddr {
    /// Where the endpoint is.
    pub peer: PeerAddr,
    /// Its session id.
    pub session: u32,
}

/// Requests the endpoint refuses outright.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Sending needs a partner that connected to us or that we connected to.
    #[error("not connected to peer {} endpoint {}", .0.peer_index, .0.endpoint)]
    NotConnected(PeerAddr),
    /// Above MEDIUM size, data travels by rendezvous: use `send_large`.
    #[error("a {0}-byte message needs the rendezvous protocol")]
    NeedsRendezvous(usize),
    /// A receive's match info lies outside its mask.
    #[error(transparent)]
    BadMatchMask(#[from] BadMatchMask),
    /// No request with that id is in a state where the call applies.
    #[error("request {0:?} is unknown or not in the right state")]
    BadRequest(RequestId),
}

/// A finished receive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvDone {
    /// The receive request.
    pub id: RequestId,
    /// `Success`, `Truncated` when the buffer was shorter than the message, or
    /// why the message could not be received.
    pub status: Status,
    /// Who sent it.
    pub source: EndpointAddr,
    /// The message's match info.
    pub match_info: u64,
    /// Length of the message as sent.
    pub msg_length: u32,
    /// Bytes delivered: `min(msg_length, buffer length)`.
    pub xfer_length: u32,
    /// The delivered bytes (`xfer_length` of them); empty for LARGE messages,
    /// whose data was pulled straight into the application's region.
    pub data: Vec<u8>,
}

/// A LARGE message matched a receive: its data must be pulled from the
/// sender's window, then reported with [`Endpoint::pull_done`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PullNeeded {
    /// The receive request.
    pub id: RequestId,
    /// The sender.
    pub source: EndpointAddr,
    /// The sender's window holding the data.
    pub window: RdmaWindow,
    /// Bytes to pull (the receive buffer may be shorter than the message).
    pub length: u32,
}

/// What the endpoint reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndpointEvent {
    /// A connect finished; `addr` is set on success.
    Connected {
        /// The connect request.
        id: RequestId,
        /// `Success`, `BadKey`, `Timeout` or a NACK status.
        status: Status,
        /// The remote endpoint, on success.
        addr: Option<EndpointAddr>,
    },
    /// A send finished: acknowledged (LARGE: also pulled), refused, or timed out.
    SendDone {
        /// The send request.
        id: RequestId,
        /// How it ended.
        status: Status,
        /// Bytes the receiver took.
        xfer_length: u32,
    },
    /// A receive finished.
    RecvDone(RecvDone),
    /// A receive needs its LARGE data pulled.
    PullNeeded(PullNeeded),
    /// A message matched no posted receive and joined the unexpected queue
    /// (reported only after [`Endpoint::set_unexpected_events`]).
    Unexpected(UnexpectedArrival),
}

/// A message that joined the unexpected queue, in arrival order: what MX
/// shows an unexpected handler. It stays queued, in its place, until a
/// receive takes it ([`Endpoint::post_recv`] or
/// [`Endpoint::receive_unexpected`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnexpectedArrival {
    /// The queued message.
    pub id: InboundId,
    /// Who sent it.
    pub source: EndpointAddr,
    /// Its match info.
    pub match_info: u64,
    /// Its length as sent.
    pub msg_length: u32,
}

/// An unexpected message, as `probe` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeInfo {
    /// Who sent it.
    pub source: EndpointAddr,
    /// Its match info.
    pub match_info: u64,
    /// Its length.
    pub msg_length: u32,
}

/// Retransmission state of one sequenced message.
#[derive(Clone, Copy, Debug)]
struct Retx {
    seqnum: Seqnum,
    transmissions: u32,
    next_resend: Instant,
}

#[derive(Debug)]
enum SendPayload {
    Eager(Vec<u8>),
    Large { msg_length: u32, window: RdmaWindow },
}

#[derive(Debug)]
struct SendReq {
    peer: PeerAddr,
    match_info: u64,
    payload: SendPayload,
    submitted: Instant,
    deadline: Option<Instant>,
    retx: Option<Retx>,
    /// LARGE: the length the receiver's NOTIFY reported.
    notified: Option<u32>,
}

#[derive(Debug)]
struct ConnectReq {
    peer: PeerAddr,
    key: u32,
    connect_seqnum: u8,
    submitted: Instant,
    deadline: Option<Instant>,
    transmissions: u32,
    next_resend: Instant,
}

/// A LARGE message matched by a receive.
#[derive(Clone, Copy, Debug)]
struct LargeRecv {
    source: PeerAddr,
    window: RdmaWindow,
    match_info: u64,
    msg_length: u32,
    xfer_length: u32,
}

#[derive(Debug)]
enum RecvState {
    /// Waiting for a message.
    Posted,
    /// Bound to a MEDIUM still missing fragments.
    Assembling,
    /// Waiting for the pull of a LARGE message.
    Pulling(LargeRecv),
    /// Pulled (or failed); the NOTIFY to the sender waits for its ack.
    Notifying {
        large: LargeRecv,
        status: Status,
        deadline: Option<Instant>,
        retx: Option<Retx>,
    },
}

#[derive(Debug)]
struct RecvReq {
    capacity: usize,
    state: RecvState,
}

#[derive(Debug)]
enum CoreRequest {
    Connect(ConnectReq),
    Send(SendReq),
    Recv(RecvReq),
}

#[derive(Debug)]
enum Content {
    Whole(Vec<u8>),
    Assembling(Reassembly),
    Rndv(RdmaWindow),
}

/// A message being received (matched or not).
#[derive(Debug)]
struct InboundMessage {
    source: PeerAddr,
    match_info: u64,
    msg_length: u32,
    content: Content,
    recv: Option<RequestId>,
}

impl InboundMessage {
    /// Bytes held while unexpected.
    fn stored_len(&self) -> usize {
        match self.content {
            Content::Rndv(_) => 0,
            _ => self.msg_length as usize,
        }
    }
}

/// One MX endpoint's protocol state machine.
#[derive(Debug)]
pub struct Endpoint {
    config: Config,
    index: u8,
    session: u32,
    key: u32,
    partners: BTreeMap<PeerAddr, Partner>,
    requests: BTreeMap<RequestId, CoreRequest>,
    inbound: BTreeMap<InboundId, InboundMessage>,
    matcher: Matcher<RequestId, InboundId>,
    unexpected_bytes: usize,
    /// Whether arrivals into the unexpected queue are reported.
    report_unexpected: bool,
    /// Partners that may owe an ack (a superset; pruned when scanned).
    ack_pending: BTreeSet<PeerAddr>,
    transmits: VecDeque<Frame<Vec<u8>>>,
    events: VecDeque<EndpointEvent>,
    next_request: u64,
    next_inbound: u64,
    /// [`Endpoint::next_timeout`] as last computed, emptied by every call
    /// that may move a timer. Drivers ask for it on each poll of a spin,
    /// where nothing changes between two asks; scanning every pending
    /// request each time showed in profiles.
    timer_cache: OnceLock<Option<Instant>>,
    /// [`Endpoint::close`] was called: only resent frames are answered.
    closed: bool,
    /// Sequenced messages a NACK refused, not yet believed: the refusal's
    /// status and when it takes effect unless the message is acked first
    /// (see `on_nack`).
    refusals: BTreeMap<RequestId, (Status, Instant)>,
}
impl Endpoint {
    /// An endpoint with index `index` on its NIC, session id `session` (the
    /// driver/backend picks it, randomly, at open) and application key `key`.
    pub fn new(config: Config, index: u8, session: u32, key: u32) -> Self {
        Endpoint {
            config,
            index,
            session,
            key,
            partners: BTreeMap::new(),
            requests: BTreeMap::new(),
            inbound: BTreeMap::new(),
            matcher: Matcher::new(),
            unexpected_bytes: 0,
            report_unexpected: false,
            ack_pending: BTreeSet::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            next_request: 1,
            next_inbound: 1,
            timer_cache: OnceLock::new(),
            closed: false,
            refusals: BTreeMap::new(),
        }
    }

    /// The endpoint's index.
    pub fn index(&self) -> u8 {
        self.index
    }

    /// The endpoint's session id.
    pub fn session(&self) -> u32 {
        self.session
    }

    /// The tunables in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Requests not finished yet.
    pub fn pending_requests(&self) -> usize {
        self.requests.len()
    }

    /// Whether every message sent to `peer` has been acknowledged and nothing
    /// is queued for it.
    pub fn is_settled_with(&self, peer: PeerAddr) -> bool {
        match self.partners.get(&peer) {
            None => true,
            Some(p) => p.non_acked.is_empty() && p.throttled.is_empty() && p.connects.is_empty(),
        }
    }

    fn alloc_request(&mut self) -> RequestId {
        let id = RequestId(self.next_request);
        self.next_request += 1;
        id
    }

    fn partner_entry(&mut self, peer: PeerAddr) -> &mut Partner {
        self.partners
            .entry(peer)
            .or_insert_with(|| Partner::new(peer))
    }

    fn addr_of(&self, peer: PeerAddr) -> EndpointAddr {
        let session = self
            .partners
            .get(&peer)
            .and_then(|p| p.back_session.or(p.true_session))
            .unwrap_or(0);
        EndpointAddr { peer, session }
    }

    fn deadline_from(&self, now: Instant) -> Option<Instant> {
        self.config.request_timeout.map(|t| now + t)
    }

    /// Starts connecting to `peer` with application key `key`. Completes with
    /// [`EndpointEvent::Connected`].
    pub fn connect(&mut self, now: Instant, peer: PeerAddr, key: u32) -> RequestId {
        self.timers_changed();
        let id = self.alloc_request();
        let p = self.partner_entry(peer);
        let connect_seqnum = p.connect_seqnum;
        p.connect_seqnum = p.connect_seqnum.wrapping_add(1);
        p.connects.push(id);
        let deadline = self.deadline_from(now);
        self.requests.insert(
            id,
            CoreRequest::Connect(ConnectReq {
                peer,
                key,
                connect_seqnum,
                submitted: now,
                deadline,
                transmissions: 0,
                next_resend: now,
            }),
        );
        tracing::debug!(?peer, connect_seqnum, "connecting");
        self.transmit_connect(now, id);
        id
    }

    /// Sends `data` (at most [`MEDIUM_MAX`](crate::MEDIUM_MAX) bytes) with
    /// `match_info` to a connected partner. The data is copied. Completes with
    /// [`EndpointEvent::SendDone`] once the partner acknowledged it.
    pub fn send(
        &mut self,
        now: Instant,
        dest: PeerAddr,
        match_info: u64,
        data: &[u8],
    ) -> Result<RequestId, Error> {
        if MessageClass::of(data.len()) == MessageClass::Large {
            return Err(Error::NeedsRendezvous(data.len()));
        }
        self.submit_send(now, dest, match_info, SendPayload::Eager(data.to_vec()))
    }

    /// Announces a LARGE message of `msg_length` bytes held in the registered
    /// `window`; the receiver pulls it. Completes with [`EndpointEvent::SendDone`]
    /// once the receiver has notified the end of its pull.
    pub fn send_large(
        &mut self,
        now: Instant,
        dest: PeerAddr,
        match_info: u64,
        msg_length: u32,
        window: RdmaWindow,
    ) -> Result<RequestId, Error> {
        self.submit_send(
            now,
            dest,
            match_info,
            SendPayload::Large { msg_length, window },
        )
    }

    fn submit_send(
        &mut self,
        now: Instant,
        dest: PeerAddr,
        match_info: u64,
        payload: SendPayload,
    ) -> Result<RequestId, Error> {
        self.timers_changed();
        if self
            .partners
            .get(&dest)
            .and_then(|p| p.true_session)
            .is_none()
        {
            return Err(Error::NotConnected(dest));
        }
        let id = self.alloc_request();
        let deadline = self.deadline_from(now);
        self.requests.insert(
            id,
            CoreRequest::Send(SendReq {
                peer: dest,
                match_info,
                payload,
                submitted: now,
                deadline,
                retx: None,
                notified: None,
            }),
        );
        self.enqueue_sequenced(now, dest, id);
        Ok(id)
    }

    /// Posts a receive for up to `capacity` bytes of a message satisfying
    /// `(match_info, match_mask)`. Completes with [`EndpointEvent::RecvDone`] (or first
    /// [`EndpointEvent::PullNeeded`] for a LARGE message); may complete at once if a
    /// matching message already arrived.
    pub fn post_recv(
        &mut self,
        now: Instant,
        match_info: u64,
        match_mask: u64,
        capacity: usize,
    ) -> Result<RequestId, Error> {
        self.timers_changed();
        let id = self.alloc_request();
        let posting = self.matcher.post(match_info, match_mask, id)?;
        self.requests.insert(
            id,
            CoreRequest::Recv(RecvReq {
                capacity,
                state: RecvState::Posted,
            }),
        );
        if let Posting::Matched(_, iid) = posting {
            if let Some(inb) = self.inbound.get_mut(&iid) {
                self.unexpected_bytes -= inb.stored_len();
                inb.recv = Some(id);
            }
            self.settle(now, iid);
        }
        Ok(id)
    }

    /// Reports (or stops reporting) every message that joins the unexpected
    /// queue with an [`EndpointEvent::Unexpected`], for MX's unexpected handlers.
    /// Turning it on first reports the messages queued already, in queue
    /// order: a handler registered after traffic began still sees every
    /// message no receive took.
    pub fn set_unexpected_events(&mut self, on: bool) {
        if on && !self.report_unexpected {
            let queued: Vec<InboundId> = self.matcher.unexpected().map(|(_, &id)| id).collect();
            for id in queued {
                if let Some(inb) = self.inbound.get(&id) {
                    let arrival = UnexpectedArrival {
                        id,
                        source: self.addr_of(inb.source),
                        match_info: inb.match_info,
                        msg_length: inb.msg_length,
                    };
                    self.events.push_back(EndpointEvent::Unexpected(arrival));
                }
            }
        }
        self.report_unexpected = on;
    }

    /// Whether message `id` is still in the unexpected queue.
    pub fn is_unexpected(&self, id: InboundId) -> bool {
        self.inbound.get(&id).is_some_and(|inb| inb.recv.is_none())
    }

    /// The data of unexpected message `id` if it is still queued and
    /// whole (a TINY, SMALL or fully reassembled MEDIUM message).
    pub fn unexpected_data(&self, id: InboundId) -> Option<&[u8]> {
        match self.inbound.get(&id) {
            Some(InboundMessage {
                recv: None,
                content: Content::Whole(data),
                ..
            }) => Some(data),
            _ => None,
        }
    }

    /// Posts a receive of up to `capacity` bytes for exactly the unexpected
    /// message `id`, wherever it stands in the queue (an unexpected handler
    /// that drops the message it was shown). Completes like
    /// [`post_recv`](Self::post_recv); `None` if `id` is no longer queued.
    pub fn receive_unexpected(
        &mut self,
        now: Instant,
        id: InboundId,
        capacity: usize,
    ) -> Option<RequestId> {
        self.timers_changed();
        let iid = self
            .matcher
            .remove_unexpected(|&u| u == id)
            .into_iter()
            .next()?;
        let rid = self.alloc_request();
        self.requests.insert(
            rid,
            CoreRequest::Recv(RecvReq {
                capacity,
                state: RecvState::Posted,
            }),
        );
        if let Some(inb) = self.inbound.get_mut(&iid) {
            self.unexpected_bytes -= inb.stored_len();
            inb.recv = Some(rid);
        }
        self.settle(now, iid);
        Some(rid)
    }

    /// Withdraws a posted receive that has not matched yet. Returns whether it
    /// was withdrawn; a withdrawn request produces no event.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        self.timers_changed();
        let posted = matches!(
            self.requests.get(&id),
            Some(CoreRequest::Recv(RecvReq {
                state: RecvState::Posted,
                ..
            }))
        );
        if posted && self.matcher.cancel(|&r| r == id).is_some() {
            self.requests.remove(&id);
            true
        } else {
            false
        }
    }

    /// The earliest unexpected message satisfying `(match_info, match_mask)`,
    /// without receiving it (MX's `mx_iprobe`).
    pub fn probe(&self, match_info: u64, match_mask: u64) -> Result<Option<ProbeInfo>, Error> {
        crate::matching::check_mask(match_info, match_mask)?;
        Ok(self
            .matcher
            .probe(match_info, match_mask)
            .and_then(|(_, iid)| {
                self.inbound.get(iid).map(|inb| ProbeInfo {
                    source: self.addr_of(inb.source),
                    match_info: inb.match_info,
                    msg_length: inb.msg_length,
                })
            }))
    }

    /// Reports the end of a pull requested by [`EndpointEvent::PullNeeded`]: the
    /// receive completes now (with `status` if it is not `Success`) and the
    /// NOTIFY to the sender is queued, retransmitted until it is acked.
    pub fn pull_done(&mut self, now: Instant, id: RequestId, status: Status) -> Result<(), Error> {
        self.timers_changed();
        let large = match self.requests.get(&id) {
            Some(CoreRequest::Recv(RecvReq {
                state: RecvState::Pulling(large),
                ..
            })) => *large,
            _ => return Err(Error::BadRequest(id)),
        };
        self.start_notify(now, id, large, status);
        Ok(())
    }

    /// NOTIFYs sent for completed LARGE receives and not yet acked. An
    /// endpoint about to close lets these settle first: a sender that never
    /// hears its NOTIFY waits for it until its rendezvous timeout.
    pub fn unacked_notifies(&self) -> usize {
        self.requests
            .values()
            .filter(|r| {
                matches!(
                    r,
                    CoreRequest::Recv(RecvReq {
                        state: RecvState::Notifying { .. },
                        ..
                    })
                )
            })
            .count()
    }

    /// Sends and NOTIFYs held back by a full send window: not on the wire
    /// yet. MX reports an eager send complete once it is buffered, before
    /// its ack; an endpoint about to close lets these leave first (they do
    /// as acks reopen the window), or they would be lost with it although
    /// the application saw them complete.
    pub fn held_sends(&self) -> usize {
        self.partners.values().map(|p| p.throttled.len()).sum()
    }

    /// Sets a deadline on a pending send or connect, counted from its submission
    /// (MX's `mx_set_request_timeout`). Returns whether the request was found.
    pub fn set_request_timeout(&mut self, id: RequestId, timeout: std::time::Duration) -> bool {
        self.timers_changed();
        match self.requests.get_mut(&id) {
            Some(CoreRequest::Send(s)) => {
                s.deadline = Some(s.submitted + timeout);
                true
            }
            Some(CoreRequest::Connect(c)) => {
                c.deadline = Some(c.submitted + timeout);
                true
            }
            _ => false,
        }
    }

    /// Drops everything shared with `peer`: pending requests to it complete
    /// with `EndpointUnreachable`, and frames of the old connection are
    /// ignored from now on.
    pub fn disconnect(&mut self, peer: PeerAddr) {
        self.timers_changed();
        self.cleanup_partner(peer, Status::EndpointUnreachable, true);
    }

    /// The endpoint lost its way to the network for good (its backend or its
    /// guest daemon is gone): every pending send and connect, and every
    /// receive in progress, completes with `status` now instead of after the
    /// retry budget. Posted receives that matched nothing stay posted, as MX
    /// leaves them until they are cancelled.
    pub fn abandon_all(&mut self, status: Status) {
        self.timers_changed();
        let peers: Vec<PeerAddr> = self.partners.keys().copied().collect();
        for peer in peers {
            self.cleanup_partner(peer, status, true);
        }
    }

    /// The next frame to send, if any. Acks that must go out now are emitted
    /// here, after the frames already queued.
    pub fn poll_transmit(&mut self) -> Option<Frame<Vec<u8>>> {
        if self.transmits.is_empty() && !self.ack_pending.is_empty() {
            self.timers_changed();
            self.flush_immediate_acks();
        }
        self.transmits.pop_front()
    }

    /// The next completion, if any.
    pub fn poll_event(&mut self) -> Option<EndpointEvent> {
        self.events.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) should next be called:
    /// the earliest delayed ack, retransmission or request deadline. Cheap
    /// when nothing changed since the last call.
    pub fn next_timeout(&self) -> Option<Instant> {
        let next = *self.timer_cache.get_or_init(|| self.earliest_timer());
        debug_assert_eq!(
            next,
            self.earliest_timer(),
            "a call that moved a timer left the cached one in place"
        );
        next
    }

    /// Forgets the cached [`next_timeout`](Self::next_timeout): every call
    /// that may touch partners, requests or acks starts with this.
    pub(super) fn timers_changed(&mut self) {
        self.timer_cache.take();
    }

    /// The earliest timer, scanning every partner's pending requests.
    fn earliest_timer(&self) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut consider = |t: Instant| next = Some(next.map_or(t, |n| n.min(t)));
        for p in self.partners.values() {
            if let Some(t) = p.ack_due(self.config.ack_delay) {
                consider(t);
            }
            for id in p
                .non_acked
                .iter()
                .chain(&p.throttled)
                .chain(&p.awaiting_notify)
                .chain(&p.connects)
            {
                let Some(req) = self.requests.get(id) else {
                    continue;
                };
                let (retx_at, deadline) = match req {
                    CoreRequest::Send(s) => (s.retx.map(|r| r.next_resend), s.deadline),
                    CoreRequest::Connect(c) => (Some(c.next_resend), c.deadline),
                    CoreRequest::Recv(RecvReq {
                        state: RecvState::Notifying { retx, deadline, .. },
                        ..
                    }) => (retx.map(|r| r.next_resend), *deadline),
                    CoreRequest::Recv(_) => (None, None),
                };
                let refused = self.refusals.get(id).map(|r| r.1);
                retx_at
                    .into_iter()
                    .chain(deadline)
                    .chain(refused)
                    .for_each(&mut consider);
            }
        }
        next
    }

    /// Advances timers to `now`: sends due delayed acks, retransmits unacked
    /// messages and connects, and fails every pending request to a partner
    /// whose retry budget or deadline ran out.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.timers_changed();
        if !self.refusals.is_empty() {
            self.apply_refusals(now);
        }
        let peers: Vec<PeerAddr> = self.partners.keys().copied().collect();
        for peer in peers {
            if self.partner_expired(now, peer) {
                tracing::warn!(
                    ?peer,
                    "partner did not answer within the retry budget, dropping it"
                );
                self.cleanup_partner(peer, Status::Timeout, true);
                continue;
            }
            let Some(p) = self.partners.get(&peer) else {
                continue;
            };
            let due_ack = p.ack_due(self.config.ack_delay).is_some_and(|t| t <= now);
            let resend: Vec<RequestId> = p
                .non_acked
                .iter()
                .copied()
                .filter(|id| self.retx_of(*id).is_some_and(|r| r.next_resend <= now))
                .collect();
            let reconnect: Vec<RequestId> = p
                .connects
                .iter()
                .copied()
                .filter(|id| matches!(self.requests.get(id), Some(CoreRequest::Connect(c)) if c.next_resend <= now))
                .collect();
            for id in resend {
                tracing::debug!(?peer, ?id, "retransmitting");
                self.transmit_sequenced(now, id);
            }
            for id in reconnect {
                self.transmit_connect(now, id);
            }
            // A retransmission carried the ack already if there was one.
            if due_ack
                && self
                    .partners
                    .get(&peer)
                    .is_some_and(|p| p.ack != AckNeed::None)
            {
                self.send_liback(peer);
            }
        }
    }

    fn partner_expired(&self, now: Instant, peer: PeerAddr) -> bool {
        let Some(p) = self.partners.get(&peer) else {
            return false;
        };
        let max = self.config.max_retries;
        let past = |d: Option<Instant>| d.is_some_and(|d| d <= now);
        let exhausted =
            |r: Option<Retx>| r.is_some_and(|r| r.next_resend <= now && r.transmissions > max);
        p.non_acked
            .iter()
            .chain(&p.throttled)
            .chain(&p.awaiting_notify)
            .chain(&p.connects)
            .any(|id| match self.requests.get(id) {
                Some(CoreRequest::Send(s)) => exhausted(s.retx) || past(s.deadline),
                Some(CoreRequest::Connect(c)) => {
                    (c.next_resend <= now && c.transmissions > max) || past(c.deadline)
                }
                Some(CoreRequest::Recv(RecvReq {
                    state: RecvState::Notifying { retx, deadline, .. },
                    ..
                })) => exhausted(*retx) || past(*deadline),
                _ => false,
            })
    }

    /// Handles one frame addressed to this endpoint.
    pub fn handle_frame(&mut self, now: Instant, frame: Frame<&[u8]>) {
        self.timers_changed();
        if frame.dst_endpoint != self.index {
            tracing::debug!(
                dst = frame.dst_endpoint,
                "frame for another endpoint, dropped"
            );
            return;
        }
        let src = frame.source();
        if self.closed {
            match &frame.body {
                Body::Message(m) if m.session == self.session => {
                    self.on_sequenced_closed(now, src, m.seqnum)
                }
                Body::Notify(n) if n.session == self.session => {
                    self.on_sequenced_closed(now, src, n.seqnum)
                }
                _ => tracing::trace!(?src, "frame for a closed endpoint dropped"),
            }
            return;
        }
        match &frame.body {
            Body::Message(m) => self.on_message(now, src, m),
            Body::Notify(n) => self.on_notify_frame(now, src, n),
            Body::Liback(a) => self.on_liback(now, src, a),
            Body::ConnectRequest(c) => self.on_connect_request(src, c),
            Body::ConnectReply(c) => self.on_connect_reply(src, c),
            Body::Nack(n) => self.on_nack(now, src, n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn cached_timer_follows_every_change() {
        let mut ep = Endpoint::new(Config::default(), 0, 7, 1);
        assert_eq!(ep.next_timeout(), None);
        let t0 = Instant::from_millis(10);
        let peer = PeerAddr::new(1, 2);
        let id = ep.connect(t0, peer, 1);
        let resend = t0 + Config::default().resend_delay;
        assert_eq!(ep.next_timeout(), Some(resend));
        assert_eq!(ep.next_timeout(), Some(resend), "asked twice, unchanged");
        assert!(ep.set_request_timeout(id, Duration::from_millis(1)));
        assert_eq!(ep.next_timeout(), Some(t0 + Duration::from_millis(1)));
        ep.disconnect(peer);
        assert_eq!(ep.next_timeout(), None);
    }
}

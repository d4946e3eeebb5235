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

use std::collections::{BTreeMap, BTreeSet, VecDeque};

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

/// Names a request (connect, send or receive) for its whole life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

/// Names a message being received.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct InboundId(pub(crate) u64);

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
pub enum Event {
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
enum Request {
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
struct Inbound {
    source: PeerAddr,
    match_info: u64,
    msg_length: u32,
    content: Content,
    recv: Option<RequestId>,
}

impl Inbound {
    /// Bytes held while unexpected.
    fn stored_len(&self) -> usize {
        match self.content {
            Content::Rndv(_) => 0,
            _ => self.msg_length as usize,
        }
    }
}

/// A sequenced frame being processed, payload borrowed.
#[derive(Clone, Copy, Debug)]
enum Sequenced<'a> {
    Message(&'a Message<&'a [u8]>),
    Notify(&'a Notify),
}

impl Sequenced<'_> {
    fn seqnum(&self) -> Seqnum {
        match self {
            Sequenced::Message(m) => m.seqnum,
            Sequenced::Notify(n) => n.seqnum,
        }
    }

    fn to_early(self) -> EarlyFrame {
        match self {
            Sequenced::Message(m) => EarlyFrame::Message {
                seqnum: m.seqnum,
                match_info: m.match_info,
                kind: m.kind,
                payload: m.payload.to_vec(),
            },
            Sequenced::Notify(n) => EarlyFrame::Notify(*n),
        }
    }
}

/// Why a message frame is refused before it touches any state.
#[derive(Debug, thiserror::Error)]
enum BadMessage {
    #[error("{kind} message of {len} bytes")]
    TooLong { kind: &'static str, len: usize },
    #[error(transparent)]
    Fragment(FragError),
}

fn validate(m: &Message<&[u8]>) -> Result<(), BadMessage> {
    match m.kind {
        MessageKind::Tiny if m.payload.len() > TINY_MAX => Err(BadMessage::TooLong {
            kind: "tiny",
            len: m.payload.len(),
        }),
        MessageKind::Small if m.payload.len() > SMALL_MAX => Err(BadMessage::TooLong {
            kind: "small",
            len: m.payload.len(),
        }),
        MessageKind::Medium(f) => medium::check_fragment(
            f.msg_length,
            f.frag_seqnum,
            f.frag_pipeline,
            m.payload.len(),
        )
        .map(|_| ())
        .map_err(BadMessage::Fragment),
        _ => Ok(()),
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
    requests: BTreeMap<RequestId, Request>,
    inbound: BTreeMap<InboundId, Inbound>,
    matcher: Matcher<RequestId, InboundId>,
    unexpected_bytes: usize,
    /// Partners that may owe an ack (a superset; pruned when scanned).
    ack_pending: BTreeSet<PeerAddr>,
    transmits: VecDeque<Frame<Vec<u8>>>,
    events: VecDeque<Event>,
    next_request: u64,
    next_inbound: u64,
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
            ack_pending: BTreeSet::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            next_request: 1,
            next_inbound: 1,
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

    // ---------------------------------------------------------------------
    // Application requests
    // ---------------------------------------------------------------------

    /// Starts connecting to `peer` with application key `key`. Completes with
    /// [`Event::Connected`].
    pub fn connect(&mut self, now: Instant, peer: PeerAddr, key: u32) -> RequestId {
        let id = self.alloc_request();
        let p = self.partner_entry(peer);
        let connect_seqnum = p.connect_seqnum;
        p.connect_seqnum = p.connect_seqnum.wrapping_add(1);
        p.connects.push(id);
        let deadline = self.deadline_from(now);
        self.requests.insert(
            id,
            Request::Connect(ConnectReq {
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
    /// [`Event::SendDone`] once the partner acknowledged it.
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
    /// `window`; the receiver pulls it. Completes with [`Event::SendDone`]
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
            Request::Send(SendReq {
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
    /// `(match_info, match_mask)`. Completes with [`Event::RecvDone`] (or first
    /// [`Event::PullNeeded`] for a LARGE message); may complete at once if a
    /// matching message already arrived.
    pub fn post_recv(
        &mut self,
        now: Instant,
        match_info: u64,
        match_mask: u64,
        capacity: usize,
    ) -> Result<RequestId, Error> {
        let id = self.alloc_request();
        let posting = self.matcher.post(match_info, match_mask, id)?;
        self.requests.insert(
            id,
            Request::Recv(RecvReq {
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

    /// Withdraws a posted receive that has not matched yet. Returns whether it
    /// was withdrawn; a withdrawn request produces no event.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        let posted = matches!(
            self.requests.get(&id),
            Some(Request::Recv(RecvReq {
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

    /// Reports the end of a pull requested by [`Event::PullNeeded`]; the
    /// receive completes (with `status` if it is not `Success`) once the
    /// sender acknowledged the NOTIFY.
    pub fn pull_done(&mut self, now: Instant, id: RequestId, status: Status) -> Result<(), Error> {
        let large = match self.requests.get(&id) {
            Some(Request::Recv(RecvReq {
                state: RecvState::Pulling(large),
                ..
            })) => *large,
            _ => return Err(Error::BadRequest(id)),
        };
        self.start_notify(now, id, large, status);
        Ok(())
    }

    /// Sets a deadline on a pending send or connect, counted from its submission
    /// (MX's `mx_set_request_timeout`). Returns whether the request was found.
    pub fn set_request_timeout(&mut self, id: RequestId, timeout: std::time::Duration) -> bool {
        match self.requests.get_mut(&id) {
            Some(Request::Send(s)) => {
                s.deadline = Some(s.submitted + timeout);
                true
            }
            Some(Request::Connect(c)) => {
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
        self.cleanup_partner(peer, Status::EndpointUnreachable, true);
    }

    // ---------------------------------------------------------------------
    // Outputs
    // ---------------------------------------------------------------------

    /// The next frame to send, if any. Acks that must go out now are emitted
    /// here, after the frames already queued.
    pub fn poll_transmit(&mut self) -> Option<Frame<Vec<u8>>> {
        if self.transmits.is_empty() {
            self.flush_immediate_acks();
        }
        self.transmits.pop_front()
    }

    /// The next completion, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) should next be called:
    /// the earliest delayed ack, retransmission or request deadline.
    pub fn next_timeout(&self) -> Option<Instant> {
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
                    Request::Send(s) => (s.retx.map(|r| r.next_resend), s.deadline),
                    Request::Connect(c) => (Some(c.next_resend), c.deadline),
                    Request::Recv(RecvReq {
                        state: RecvState::Notifying { retx, deadline, .. },
                        ..
                    }) => (retx.map(|r| r.next_resend), *deadline),
                    Request::Recv(_) => (None, None),
                };
                retx_at.into_iter().chain(deadline).for_each(&mut consider);
            }
        }
        next
    }

    /// Advances timers to `now`: sends due delayed acks, retransmits unacked
    /// messages and connects, and fails every pending request to a partner
    /// whose retry budget or deadline ran out.
    pub fn handle_timeout(&mut self, now: Instant) {
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
                .filter(|id| matches!(self.requests.get(id), Some(Request::Connect(c)) if c.next_resend <= now))
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
                Some(Request::Send(s)) => exhausted(s.retx) || past(s.deadline),
                Some(Request::Connect(c)) => {
                    (c.next_resend <= now && c.transmissions > max) || past(c.deadline)
                }
                Some(Request::Recv(RecvReq {
                    state: RecvState::Notifying { retx, deadline, .. },
                    ..
                })) => exhausted(*retx) || past(*deadline),
                _ => false,
            })
    }

    // ---------------------------------------------------------------------
    // Sending side
    // ---------------------------------------------------------------------

    fn retx_of(&self, id: RequestId) -> Option<Retx> {
        match self.requests.get(&id)? {
            Request::Send(s) => s.retx,
            Request::Recv(RecvReq {
                state: RecvState::Notifying { retx, .. },
                ..
            }) => *retx,
            _ => None,
        }
    }

    fn retx_mut(&mut self, id: RequestId) -> Option<&mut Option<Retx>> {
        match self.requests.get_mut(&id)? {
            Request::Send(s) => Some(&mut s.retx),
            Request::Recv(RecvReq {
                state: RecvState::Notifying { retx, .. },
                ..
            }) => Some(retx),
            _ => None,
        }
    }

    /// Gives a sequenced request (send or NOTIFY) its seqnum and sends it, or
    /// holds it while the send window is full.
    fn enqueue_sequenced(&mut self, now: Instant, peer: PeerAddr, id: RequestId) {
        let Some(p) = self.partners.get_mut(&peer) else {
            return;
        };
        if !p.throttled.is_empty() || p.send_window_full() {
            tracing::debug!(?peer, ?id, "send window full, holding");
            p.throttled.push_back(id);
            return;
        }
        let seqnum = p.take_send_seq();
        p.non_acked.push_back(id);
        if let Some(slot) = self.retx_mut(id) {
            *slot = Some(Retx {
                seqnum,
                transmissions: 0,
                next_resend: now,
            });
        }
        self.transmit_sequenced(now, id);
    }

    /// Lets held requests take seqnums as acks free the window.
    fn release_throttled(&mut self, now: Instant, peer: PeerAddr) {
        loop {
            let Some(p) = self.partners.get_mut(&peer) else {
                return;
            };
            if p.send_window_full() {
                return;
            }
            let Some(id) = p.throttled.pop_front() else {
                return;
            };
            let seqnum = p.take_send_seq();
            p.non_acked.push_back(id);
            if let Some(slot) = self.retx_mut(id) {
                *slot = Some(Retx {
                    seqnum,
                    transmissions: 0,
                    next_resend: now,
                });
            }
            self.transmit_sequenced(now, id);
        }
    }

    /// (Re)sends the frames of a sequenced request with a fresh piggybacked ack.
    fn transmit_sequenced(&mut self, now: Instant, id: RequestId) {
        let Endpoint {
            partners,
            requests,
            transmits,
            config,
            index,
            ..
        } = self;
        let Some(req) = requests.get_mut(&id) else {
            return;
        };
        let (peer, retx) = match req {
            Request::Send(s) => (s.peer, &mut s.retx),
            Request::Recv(RecvReq {
                state: RecvState::Notifying { large, retx, .. },
                ..
            }) => (large.source, retx),
            _ => return,
        };
        let Some(r) = retx.as_mut() else { return };
        let Some(p) = partners.get_mut(&peer) else {
            return;
        };
        let piggyack = p.next_frag_recv_seq;
        let seqnum = r.seqnum;
        r.transmissions += 1;
        r.next_resend = now + config.resend_wait(r.transmissions);
        let frame = |body| Frame {
            peer_index: peer.peer_index,
            dst_endpoint: peer.endpoint,
            src_endpoint: *index,
            body,
        };
        match req {
            Request::Send(s) => {
                let session = p.true_session.unwrap_or(0);
                let msg = |kind, payload: &[u8]| {
                    frame(Body::Message(Message {
                        session,
                        seqnum,
                        piggyack,
                        match_info: s.match_info,
                        kind,
                        payload: payload.to_vec(),
                    }))
                };
                match &s.payload {
                    SendPayload::Eager(data) => match MessageClass::of(data.len()) {
                        MessageClass::Tiny => transmits.push_back(msg(MessageKind::Tiny, data)),
                        MessageClass::Small => transmits.push_back(msg(MessageKind::Small, data)),
                        _ => {
                            let msg_length = data.len() as u32;
                            for f in medium::fragments(data) {
                                let kind = MessageKind::Medium(MediumFrag {
                                    msg_length,
                                    frag_seqnum: f.frag_seqnum,
                                    frag_pipeline: FRAG_PIPELINE,
                                });
                                transmits.push_back(msg(kind, f.data));
                            }
                        }
                    },
                    SendPayload::Large { msg_length, window } => {
                        transmits.push_back(msg(
                            MessageKind::Rndv(Rndv {
                                msg_length: *msg_length,
                                window: *window,
                            }),
                            &[],
                        ));
                    }
                }
            }
            Request::Recv(RecvReq {
                state: RecvState::Notifying { large, status, .. },
                ..
            }) => {
                let total_length = if status.is_success() {
                    large.xfer_length
                } else {
                    0
                };
                transmits.push_back(frame(Body::Notify(Notify {
                    session: p.back_session.unwrap_or(0),
                    total_length,
                    rdma_id: large.window.id,
                    rdma_seqnum: large.window.seqnum,
                    seqnum,
                    piggyack,
                })));
            }
            _ => {}
        }
        p.ack_sent();
    }

    fn transmit_connect(&mut self, now: Instant, id: RequestId) {
        let Some(Request::Connect(c)) = self.requests.get_mut(&id) else {
            return;
        };
        let Some(p) = self.partners.get(&c.peer) else {
            return;
        };
        c.transmissions += 1;
        c.next_resend = now + self.config.resend_wait(c.transmissions);
        self.transmits.push_back(Frame {
            peer_index: c.peer.peer_index,
            dst_endpoint: c.peer.endpoint,
            src_endpoint: self.index,
            body: Body::ConnectRequest(ConnectRequest {
                lib_seqnum: 0,
                src_session: self.session,
                app_key: c.key,
                target_recv_seqnum_start: p.next_match_recv_seq,
                connect_seqnum: c.connect_seqnum,
            }),
        });
    }

    fn send_liback(&mut self, peer: PeerAddr) {
        let Some(p) = self.partners.get_mut(&peer) else {
            return;
        };
        // Both name the partner endpoint's session; a partner that never
        // connected to us can still send NOTIFYs back on our connection.
        let Some(session) = p.back_session.or(p.true_session) else {
            p.ack_sent();
            return;
        };
        p.last_send_acknum = p.last_send_acknum.wrapping_add(1);
        let upto = p.next_frag_recv_seq;
        tracing::trace!(?peer, ?upto, "explicit ack");
        self.transmits.push_back(Frame {
            peer_index: peer.peer_index,
            dst_endpoint: peer.endpoint,
            src_endpoint: self.index,
            body: Body::Liback(Liback {
                session,
                ack_session: session,
                acknum: p.last_send_acknum,
                lib_seqnum: upto,
                send_seq: upto,
                resent: 0,
            }),
        });
        p.ack_sent();
    }

    fn flush_immediate_acks(&mut self) {
        let candidates: Vec<PeerAddr> = self.ack_pending.iter().copied().collect();
        for peer in candidates {
            match self.partners.get(&peer).map(|p| p.ack) {
                Some(AckNeed::Immediate) => {
                    self.send_liback(peer);
                    self.ack_pending.remove(&peer);
                }
                Some(AckNeed::Delayed { .. }) => {}
                _ => {
                    self.ack_pending.remove(&peer);
                }
            }
        }
    }

    fn send_nack(&mut self, to: PeerAddr, nack_type: NackType, lib_seqnum: Seqnum) {
        self.transmits.push_back(Frame {
            peer_index: to.peer_index,
            dst_endpoint: to.endpoint,
            src_endpoint: self.index,
            body: Body::Nack(Nack {
                nack_type: nack_type.to_wire(),
                lib_seqnum,
            }),
        });
    }

    // ---------------------------------------------------------------------
    // Completions
    // ---------------------------------------------------------------------

    fn complete_send(&mut self, id: RequestId, status: Status, xfer_length: u32) {
        if self.requests.remove(&id).is_some() {
            tracing::debug!(?id, %status, "send done");
            self.events.push_back(Event::SendDone {
                id,
                status,
                xfer_length,
            });
        }
    }

    fn complete_connect(&mut self, id: RequestId, status: Status, addr: Option<EndpointAddr>) {
        if self.requests.remove(&id).is_some() {
            tracing::debug!(?id, %status, "connect done");
            self.events.push_back(Event::Connected { id, status, addr });
        }
    }

    /// Completes a receive; `failure` overrides the status (and empties the data).
    fn complete_recv(
        &mut self,
        id: RequestId,
        source: PeerAddr,
        match_info: u64,
        msg_length: u32,
        mut data: Vec<u8>,
        failure: Option<Status>,
    ) {
        let capacity = match self.requests.get(&id) {
            Some(Request::Recv(r)) => r.capacity,
            _ => return,
        };
        self.requests.remove(&id);
        let xfer = (msg_length as usize).min(capacity);
        data.truncate(xfer);
        let (status, xfer_length) = match failure {
            Some(s) => {
                data.clear();
                (s, 0)
            }
            None if xfer < msg_length as usize => (Status::Truncated, xfer as u32),
            None => (Status::Success, xfer as u32),
        };
        let source = self.addr_of(source);
        self.events.push_back(Event::RecvDone(RecvDone {
            id,
            status,
            source,
            match_info,
            msg_length,
            xfer_length,
            data,
        }));
    }

    /// An acked LARGE send now waits for the receiver's pull, for at most the
    /// rendezvous timeout (a receiver that died after the ack never notifies).
    fn start_notify_wait(&mut self, now: Instant, id: RequestId) {
        let limit = self
            .config
            .rendezvous_timeout
            .unwrap_or_else(|| self.config.retry_budget());
        if let Some(Request::Send(s)) = self.requests.get_mut(&id) {
            if matches!(s.payload, SendPayload::Large { .. }) && s.notified.is_none() {
                let wait_end = now + limit;
                s.deadline = Some(s.deadline.map_or(wait_end, |d| d.min(wait_end)));
            }
        }
    }

    /// The sequenced message of `id` was acknowledged (`Success`) or refused.
    fn finish_sequenced(&mut self, id: RequestId, status: Status) {
        match self.requests.get_mut(&id) {
            Some(Request::Send(s)) => {
                s.retx = None;
                match s.payload {
                    SendPayload::Eager(ref data) => {
                        let len = data.len() as u32;
                        self.complete_send(id, status, len);
                    }
                    SendPayload::Large { .. } => {
                        if !status.is_success() {
                            self.complete_send(id, status, 0);
                        } else if let Some(len) = s.notified {
                            self.complete_send(id, status, len);
                        } else {
                            let peer = s.peer;
                            if let Some(p) = self.partners.get_mut(&peer) {
                                p.awaiting_notify.push(id);
                            }
                        }
                    }
                }
            }
            Some(Request::Recv(RecvReq {
                state:
                    RecvState::Notifying {
                        large,
                        status: pull_status,
                        ..
                    },
                ..
            })) => {
                let large = *large;
                let failure = match (status, *pull_status) {
                    (Status::Success, Status::Success) => None,
                    (Status::Success, s) => Some(s),
                    (s, _) => Some(s),
                };
                if failure.is_none() {
                    // The data went straight to the application's region.
                    self.requests.remove(&id);
                    let source = self.addr_of(large.source);
                    let status = if large.xfer_length < large.msg_length {
                        Status::Truncated
                    } else {
                        Status::Success
                    };
                    self.events.push_back(Event::RecvDone(RecvDone {
                        id,
                        status,
                        source,
                        match_info: large.match_info,
                        msg_length: large.msg_length,
                        xfer_length: large.xfer_length,
                        data: Vec::new(),
                    }));
                } else {
                    self.complete_recv(
                        id,
                        large.source,
                        large.match_info,
                        large.msg_length,
                        Vec::new(),
                        failure,
                    );
                }
            }
            _ => {}
        }
    }

    // ---------------------------------------------------------------------
    // Receiving side
    // ---------------------------------------------------------------------

    /// Handles one frame addressed to this endpoint.
    pub fn handle_frame(&mut self, now: Instant, frame: Frame<&[u8]>) {
        if frame.dst_endpoint != self.index {
            tracing::debug!(
                dst = frame.dst_endpoint,
                "frame for another endpoint, dropped"
            );
            return;
        }
        let src = frame.source();
        match &frame.body {
            Body::Message(m) => {
                if m.session != self.session {
                    tracing::debug!(?src, "message for another session, refused");
                    self.send_nack(src, NackType::BadSession, m.seqnum);
                    return;
                }
                if let Err(e) = validate(m) {
                    tracing::warn!(?src, %e, "malformed message dropped");
                    return;
                }
                self.on_sequenced(now, src, m.piggyack, Sequenced::Message(m));
            }
            Body::Notify(n) => {
                if n.session != self.session {
                    self.send_nack(src, NackType::BadSession, n.seqnum);
                    return;
                }
                self.on_sequenced(now, src, n.piggyack, Sequenced::Notify(n));
            }
            Body::Liback(a) => self.on_liback(now, src, a),
            Body::ConnectRequest(c) => self.on_connect_request(src, c),
            Body::ConnectReply(c) => self.on_connect_reply(src, c),
            Body::Nack(n) => self.on_nack(src, n),
        }
    }

    fn on_sequenced(&mut self, now: Instant, src: PeerAddr, piggyack: Seqnum, s: Sequenced<'_>) {
        let Some(p) = self.partners.get(&src) else {
            tracing::debug!(?src, "message from a partner that never connected, dropped");
            return;
        };
        if !s.seqnum().same_session(p.next_frag_recv_seq) {
            tracing::debug!(?src, seq = ?s.seqnum(), "message of an old connection, dropped");
            return;
        }
        if !piggyack.same_session(p.next_send_seq) {
            tracing::debug!(?src, ?piggyack, "ack of an old connection, dropped");
            return;
        }
        self.on_ack(now, src, piggyack);
        let Some(p) = self.partners.get_mut(&src) else {
            return;
        };
        match p.arrival(s.seqnum()) {
            Arrival::InWindow => {
                self.process_in_window(now, src, s);
                self.drain_early(now, src);
            }
            Arrival::Early => {
                let max = self.config.early_frames_max;
                if !p.keep_early(s.to_early(), max) {
                    tracing::trace!(?src, seq = ?s.seqnum(), "early frame not kept");
                }
            }
            Arrival::Obsolete { ack_now } => {
                if ack_now {
                    p.need_ack_now();
                    self.ack_pending.insert(src);
                }
            }
        }
    }

    fn drain_early(&mut self, now: Instant, src: PeerAddr) {
        while let Some(f) = self
            .partners
            .get_mut(&src)
            .and_then(Partner::next_due_early)
        {
            match &f {
                EarlyFrame::Message {
                    seqnum,
                    match_info,
                    kind,
                    payload,
                } => {
                    // Session and piggyback were checked and used on arrival.
                    let m = Message {
                        session: self.session,
                        seqnum: *seqnum,
                        piggyack: *seqnum,
                        match_info: *match_info,
                        kind: *kind,
                        payload: payload.as_slice(),
                    };
                    self.process_in_window(now, src, Sequenced::Message(&m));
                }
                EarlyFrame::Notify(n) => self.process_in_window(now, src, Sequenced::Notify(n)),
            }
        }
    }

    /// A frame inside the receive window: the next message, a fragment of a
    /// partial MEDIUM, or a duplicate.
    fn process_in_window(&mut self, now: Instant, src: PeerAddr, s: Sequenced<'_>) {
        let Some(p) = self.partners.get(&src) else {
            return;
        };
        let seq = s.seqnum();
        if seq == p.next_match_recv_seq {
            let accepted = match s {
                Sequenced::Message(m) => self.match_new(now, src, m),
                Sequenced::Notify(n) => {
                    self.on_notify(src, n);
                    true
                }
            };
            if accepted {
                let threshold = self.config.imm_ack_threshold;
                if let Some(p) = self.partners.get_mut(&src) {
                    p.next_match_recv_seq = p.next_match_recv_seq.next();
                    p.update_next_frag(now, threshold);
                }
                self.ack_pending.insert(src);
            }
        } else if let Sequenced::Message(
            m @ Message {
                kind: MessageKind::Medium(_),
                ..
            },
        ) = s
        {
            if p.is_partial_seq(seq) {
                self.continue_partial(now, src, m);
            }
        }
    }

    /// The next message of `src` arrived: match it and keep or deliver it.
    /// Returns false if it could not be accepted (it will be resent).
    fn match_new(&mut self, now: Instant, src: PeerAddr, m: &Message<&[u8]>) -> bool {
        let (msg_length, content) = match m.kind {
            MessageKind::Tiny | MessageKind::Small => {
                (m.payload.len() as u32, Content::Whole(m.payload.to_vec()))
            }
            MessageKind::Medium(f) => {
                let Ok(mut r) = Reassembly::new(f.msg_length) else {
                    return false;
                };
                match r.insert(f.frag_seqnum, f.frag_pipeline, m.payload) {
                    Ok(Inserted::Complete) => (f.msg_length, Content::Whole(r.into_data())),
                    Ok(_) => (f.msg_length, Content::Assembling(r)),
                    Err(_) => return false,
                }
            }
            MessageKind::Rndv(r) => (r.msg_length, Content::Rndv(r.window)),
        };
        let mut inb = Inbound {
            source: src,
            match_info: m.match_info,
            msg_length,
            content,
            recv: None,
        };
        let recv = self.matcher.arrive(m.match_info);
        if recv.is_none()
            && self.unexpected_bytes + inb.stored_len() > self.config.unexpected_bytes_max
        {
            tracing::warn!(
                ?src,
                msg_length,
                "unexpected-message memory full, refusing (the sender will resend)"
            );
            return false;
        }
        let iid = InboundId(self.next_inbound);
        self.next_inbound += 1;
        if matches!(inb.content, Content::Assembling(_)) {
            if let Some(p) = self.partners.get_mut(&src) {
                p.partials.push_back((m.seqnum, iid));
            }
        }
        match recv {
            Some(rid) => {
                inb.recv = Some(rid);
                self.inbound.insert(iid, inb);
                self.settle(now, iid);
            }
            None => {
                self.unexpected_bytes += inb.stored_len();
                self.inbound.insert(iid, inb);
                self.matcher.push_unexpected(m.match_info, iid);
            }
        }
        true
    }

    fn continue_partial(&mut self, now: Instant, src: PeerAddr, m: &Message<&[u8]>) {
        let MessageKind::Medium(f) = m.kind else {
            return;
        };
        let Some(p) = self.partners.get_mut(&src) else {
            return;
        };
        let Some((pos, iid)) = p
            .partials
            .iter()
            .enumerate()
            .find_map(|(pos, &(s, iid))| (s == m.seqnum).then_some((pos, iid)))
        else {
            return;
        };
        let Some(inb) = self.inbound.get_mut(&iid) else {
            return;
        };
        if inb.match_info != m.match_info || inb.msg_length != f.msg_length {
            tracing::warn!(?src, "fragment disagrees with its message, dropped");
            return;
        }
        let Content::Assembling(r) = &mut inb.content else {
            return;
        };
        match r.insert(f.frag_seqnum, f.frag_pipeline, m.payload) {
            Ok(Inserted::Complete) => {
                if let Content::Assembling(done) =
                    std::mem::replace(&mut inb.content, Content::Whole(Vec::new()))
                {
                    inb.content = Content::Whole(done.into_data());
                }
                p.partials.remove(pos);
                p.update_next_frag(now, self.config.imm_ack_threshold);
                self.ack_pending.insert(src);
                self.settle(now, iid);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(?src, %e, "bad fragment dropped"),
        }
    }

    /// Moves a message forward once it has a receive: deliver it whole, wait
    /// for more fragments, or ask for the pull of a LARGE one.
    fn settle(&mut self, now: Instant, iid: InboundId) {
        let Some(inb) = self.inbound.get(&iid) else {
            return;
        };
        let Some(rid) = inb.recv else { return };
        match inb.content {
            Content::Assembling(_) => {
                if let Some(Request::Recv(r)) = self.requests.get_mut(&rid) {
                    r.state = RecvState::Assembling;
                }
            }
            Content::Whole(_) => {
                let Some(inb) = self.inbound.remove(&iid) else {
                    return;
                };
                let Content::Whole(data) = inb.content else {
                    return;
                };
                self.complete_recv(rid, inb.source, inb.match_info, inb.msg_length, data, None);
            }
            Content::Rndv(window) => {
                let Some(inb) = self.inbound.remove(&iid) else {
                    return;
                };
                let capacity = match self.requests.get(&rid) {
                    Some(Request::Recv(r)) => r.capacity,
                    _ => return,
                };
                let xfer_length = (inb.msg_length as usize).min(capacity) as u32;
                let large = LargeRecv {
                    source: inb.source,
                    window,
                    match_info: inb.match_info,
                    msg_length: inb.msg_length,
                    xfer_length,
                };
                if xfer_length == 0 {
                    self.start_notify(now, rid, large, Status::Success);
                } else {
                    if let Some(Request::Recv(r)) = self.requests.get_mut(&rid) {
                        r.state = RecvState::Pulling(large);
                    }
                    let source = self.addr_of(large.source);
                    self.events.push_back(Event::PullNeeded(PullNeeded {
                        id: rid,
                        source,
                        window,
                        length: xfer_length,
                    }));
                }
            }
        }
    }

    fn start_notify(&mut self, now: Instant, id: RequestId, large: LargeRecv, status: Status) {
        let deadline = self.deadline_from(now);
        let Some(Request::Recv(r)) = self.requests.get_mut(&id) else {
            return;
        };
        r.state = RecvState::Notifying {
            large,
            status,
            deadline,
            retx: None,
        };
        if self
            .partners
            .get(&large.source)
            .and_then(|p| p.back_session)
            .is_none()
        {
            // The sender's connection is gone; nobody to notify.
            self.complete_recv(
                id,
                large.source,
                large.match_info,
                large.msg_length,
                Vec::new(),
                Some(Status::EndpointUnreachable),
            );
            return;
        }
        self.enqueue_sequenced(now, large.source, id);
    }

    /// A NOTIFY arrived in order: the matching LARGE send is done.
    fn on_notify(&mut self, src: PeerAddr, n: &Notify) {
        let Some(p) = self.partners.get_mut(&src) else {
            return;
        };
        let is_it = |req: Option<&Request>| {
            matches!(req, Some(Request::Send(SendReq { payload: SendPayload::Large { window, .. }, .. }))
                if window.id == n.rdma_id && window.seqnum == n.rdma_seqnum)
        };
        if let Some(pos) = p
            .awaiting_notify
            .iter()
            .position(|id| is_it(self.requests.get(id)))
        {
            let id = p.awaiting_notify.remove(pos);
            self.complete_send(id, Status::Success, n.total_length);
            return;
        }
        // Notified before its RNDV was acked: complete when the ack comes.
        if let Some(&id) = p.non_acked.iter().find(|id| is_it(self.requests.get(id))) {
            if let Some(Request::Send(s)) = self.requests.get_mut(&id) {
                s.notified = Some(n.total_length);
            }
        }
    }

    /// Processes an ack (piggybacked or explicit) of our sends up to `ack_before`.
    fn on_ack(&mut self, now: Instant, peer: PeerAddr, ack_before: Seqnum) {
        let Some(p) = self.partners.get(&peer) else {
            return;
        };
        let new = p.new_acks(ack_before);
        if new == 0 {
            return;
        }
        let mut acked = Vec::new();
        let mut count = 0;
        for &id in &p.non_acked {
            match self.retx_of(id) {
                Some(r) if p.send_index(r.seqnum) >= new => break,
                _ => {
                    acked.push(id);
                    count += 1;
                }
            }
        }
        let Some(p) = self.partners.get_mut(&peer) else {
            return;
        };
        p.non_acked.drain(..count);
        p.next_acked_send_seq = ack_before;
        tracing::trace!(?peer, ?ack_before, count, "acked");
        for id in acked {
            self.start_notify_wait(now, id);
            self.finish_sequenced(id, Status::Success);
        }
        self.release_throttled(now, peer);
    }

    fn on_liback(&mut self, now: Instant, src: PeerAddr, a: &Liback) {
        if a.session != self.session || a.ack_session != a.session {
            tracing::debug!(?src, "ack for another session, dropped");
            return;
        }
        let Some(p) = self.partners.get_mut(&src) else {
            return;
        };
        if !a.lib_seqnum.same_session(p.next_send_seq) {
            return;
        }
        if a.acknum <= p.last_recv_acknum {
            tracing::trace!(?src, acknum = a.acknum, "stale explicit ack");
            return;
        }
        p.last_recv_acknum = a.acknum;
        self.on_ack(now, src, a.lib_seqnum);
    }

    fn on_nack(&mut self, src: PeerAddr, n: &Nack) {
        let Some(nack_type) = NackType::from_wire(n.nack_type) else {
            tracing::warn!(?src, nack_type = n.nack_type, "unknown NACK type ignored");
            return;
        };
        let status = nack_type.status();
        let Some(p) = self.partners.get(&src) else {
            return;
        };
        if n.lib_seqnum.same_session(p.next_send_seq) {
            let target = p.send_index(n.lib_seqnum);
            let mut found = None;
            for (pos, &id) in p.non_acked.iter().enumerate() {
                let Some(r) = self.retx_of(id) else { continue };
                let i = p.send_index(r.seqnum);
                if i > target {
                    break;
                }
                if i == target {
                    found = Some((pos, id));
                    break;
                }
            }
            if let Some((pos, id)) = found {
                tracing::debug!(?src, ?id, %status, "send refused by the peer");
                if let Some(p) = self.partners.get_mut(&src) {
                    p.non_acked.remove(pos);
                }
                self.finish_sequenced(id, status);
                return;
            }
        }
        // Connects carry no seqnum; any pending one is equivalent to another.
        let Some(p) = self.partners.get_mut(&src) else {
            return;
        };
        if !p.connects.is_empty() {
            let id = p.connects.remove(0);
            self.complete_connect(id, status, None);
        }
    }

    fn on_connect_request(&mut self, src: PeerAddr, c: &ConnectRequest) {
        let status = if c.app_key == self.key {
            ConnectStatus::Success
        } else {
            ConnectStatus::BadKey
        };
        let back = self.partner_entry(src).back_session;
        if back != Some(c.src_session) {
            if back.is_some() {
                tracing::info!(
                    ?src,
                    "partner endpoint was reopened, dropping the old connection"
                );
                self.cleanup_partner(src, Status::EndpointUnreachable, false);
            }
            let p = self.partner_entry(src);
            let start = p.next_match_recv_seq.restarted();
            p.set_recv_start(start);
        }
        let my_session = self.session;
        let p = self.partner_entry(src);
        if p.true_session != Some(c.src_session) {
            p.set_send_start(c.target_recv_seqnum_start);
        }
        p.true_session = Some(c.src_session);
        p.back_session = Some(c.src_session);
        let reply = ConnectReply {
            lib_seqnum: 0,
            src_session: c.src_session,
            target_session: my_session,
            target_recv_seqnum_start: p.next_match_recv_seq,
            connect_seqnum: c.connect_seqnum,
            status: status.to_wire(),
        };
        tracing::debug!(?src, ?status, "connect request answered");
        self.transmits.push_back(Frame {
            peer_index: src.peer_index,
            dst_endpoint: src.endpoint,
            src_endpoint: self.index,
            body: Body::ConnectReply(reply),
        });
    }

    fn on_connect_reply(&mut self, src: PeerAddr, c: &ConnectReply) {
        if c.src_session != self.session {
            return;
        }
        let Some(status) = ConnectStatus::from_wire(c.status) else {
            tracing::warn!(
                ?src,
                status = c.status,
                "connect reply with unknown status ignored"
            );
            return;
        };
        let Some(p) = self.partners.get_mut(&src) else {
            return;
        };
        let requests = &self.requests;
        let Some(pos) = p.connects.iter().position(
            |id| matches!(requests.get(id), Some(Request::Connect(r)) if r.connect_seqnum == c.connect_seqnum),
        ) else {
            return;
        };
        let id = p.connects.remove(pos);
        let addr = EndpointAddr {
            peer: src,
            session: c.target_session,
        };
        if status != ConnectStatus::Success {
            self.complete_connect(id, status.status(), None);
            return;
        }
        self.complete_connect(id, Status::Success, Some(addr));
        let back = self.partners.get(&src).and_then(|p| p.back_session);
        if back.is_some_and(|b| b != c.target_session) {
            tracing::info!(
                ?src,
                "partner endpoint was reopened, dropping the old connection"
            );
            self.cleanup_partner(src, Status::EndpointUnreachable, false);
        }
        let p = self.partner_entry(src);
        if p.true_session != Some(c.target_session) {
            p.set_send_start(c.target_recv_seqnum_start);
        }
        p.true_session = Some(c.target_session);
    }

    /// Fails everything pending with `peer` and forgets its connection. With
    /// `disconnect`, the receive session number moves on so that frames of
    /// the old connection are recognised and dropped.
    fn cleanup_partner(&mut self, peer: PeerAddr, status: Status, disconnect: bool) {
        let Some(p) = self.partners.get_mut(&peer) else {
            return;
        };
        let non_acked = std::mem::take(&mut p.non_acked);
        let throttled = std::mem::take(&mut p.throttled);
        let awaiting = std::mem::take(&mut p.awaiting_notify);
        let connects = std::mem::take(&mut p.connects);
        let partials = std::mem::take(&mut p.partials);
        p.clear_early();
        for id in non_acked.into_iter().chain(throttled) {
            self.finish_sequenced(id, status);
        }
        for id in awaiting {
            self.complete_send(id, status, 0);
        }
        for id in connects {
            self.complete_connect(id, status, None);
        }
        for (_, iid) in partials {
            let Some(inb) = self.inbound.remove(&iid) else {
                continue;
            };
            match inb.recv {
                Some(rid) => self.complete_recv(
                    rid,
                    peer,
                    inb.match_info,
                    inb.msg_length,
                    Vec::new(),
                    Some(status),
                ),
                None => {
                    self.matcher.remove_unexpected(|&x| x == iid);
                    self.unexpected_bytes -= inb.stored_len();
                }
            }
        }
        // Unexpected rendezvous name the old connection's memory: unusable now.
        // Whole unexpected messages were acked and stay deliverable.
        let inbound = &self.inbound;
        let stale = self.matcher.remove_unexpected(
            |iid| matches!(inbound.get(iid), Some(i) if i.source == peer && matches!(i.content, Content::Rndv(_))),
        );
        for iid in stale {
            self.inbound.remove(&iid);
        }
        if let Some(p) = self.partners.get_mut(&peer) {
            p.reset();
            if disconnect {
                let next = p.next_match_recv_seq.next_session_scrambled();
                p.set_recv_start(next);
            }
        }
        self.ack_pending.remove(&peer);
    }
}

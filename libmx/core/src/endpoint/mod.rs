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

use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use rustc_hash::FxHashMap;

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
    /// An unexpected LARGE message is to be pulled into the library's memory before a
    /// receive takes it ([`Config::early_pull_max`]): `id` names the pull, not a
    /// request. Report its end with [`Endpoint::early_pull_done`].
    EarlyPullNeeded(PullNeeded),
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
    /// A LARGE message pulled before any receive took it (see
    /// [`Config::early_pull_max`]): the NOTIFY waits for the receive.
    EarlyPull {
        window: RdmaWindow,
        /// The pull's id while it runs; `None` once landed.
        pull: Option<RequestId>,
        /// The pulled bytes, once landed.
        data: Vec<u8>,
    },
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

    /// Whether the message names its sender's memory (a rendezvous, pulled or not).
    fn is_rendezvous(&self) -> bool {
        matches!(self.content, Content::Rndv(_) | Content::EarlyPull { .. })
    }
}

/// Early pulls one endpoint runs at once (see [`Config::early_pull_max`]).
pub(crate) const EARLY_PULLS_IN_FLIGHT_MAX: usize = 16;

/// One MX endpoint's protocol state machine.
#[derive(Debug)]
pub struct Endpoint {
    config: Config,
    index: u8,
    session: u32,
    key: u32,
    partners: BTreeMap<PeerAddr, Partner>,
    /// Looked up by id only (never walked in order where order matters): a hash
    /// map, where the ordered map's insert and remove were a tenth of the core's
    /// time per message.
    requests: FxHashMap<RequestId, CoreRequest>,
    inbound: FxHashMap<InboundId, InboundMessage>,
    /// Pulls started before a receive took their message: pull id to message.
    early_pulls: FxHashMap<RequestId, InboundId>,
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
    /// that may move a timer, or kept up to date by one that only arms
    /// timers (a send). Calls that move none (draining frames, posting or
    /// cancelling an unmatched receive) leave it. Drivers ask for it on
    /// each poll of a spin and after each input; scanning every pending
    /// request each time showed in profiles. A cell, not a lock: the
    /// endpoint is driven by one thread at a time (its owner's lock), and
    /// filling a `OnceLock` after each input took its atomics (a tenth of
    /// a ping-pong message's time in the core).
    timer_cache: OnceCell<Option<Instant>>,
    /// Full scans [`Endpoint::next_timeout`] made, for tests that check
    /// the hot calls keep the cache.
    #[cfg(test)]
    scans: std::cell::Cell<u64>,
    /// [`Endpoint::close`] was called: only resent frames are answered.
    closed: bool,
    /// Sequenced messages a NACK refused, not yet believed: the refusal's
    /// status and when it takes effect unless the message is acked first
    /// (see `on_nack`).
    refusals: BTreeMap<RequestId, (Status, Instant)>,
    /// [`Endpoint::set_request_timeout`] gave a request a deadline: held
    /// requests may have one (see `earliest_timer`). Never cleared.
    deadline_set: bool,
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
            requests: FxHashMap::default(),
            inbound: FxHashMap::default(),
            early_pulls: FxHashMap::default(),
            matcher: Matcher::new(),
            unexpected_bytes: 0,
            report_unexpected: false,
            ack_pending: BTreeSet::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            next_request: 1,
            next_inbound: 1,
            timer_cache: OnceCell::new(),
            #[cfg(test)]
            scans: std::cell::Cell::new(0),
            closed: false,
            refusals: BTreeMap::new(),
            deadline_set: false,
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

    /// [`send`](Self::send) of data the caller gives away: the core keeps
    /// it (for resends) without copying it first.
    pub fn send_owned(
        &mut self,
        now: Instant,
        dest: PeerAddr,
        match_info: u64,
        data: Vec<u8>,
    ) -> Result<RequestId, Error> {
        if MessageClass::of(data.len()) == MessageClass::Large {
            return Err(Error::NeedsRendezvous(data.len()));
        }
        self.submit_send(now, dest, match_info, SendPayload::Eager(data))
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
        let Some(ack_before) = self
            .partners
            .get(&dest)
            .filter(|p| p.true_session.is_some())
            .map(|p| p.ack_due(self.config.ack_delay))
        else {
            return Err(Error::NotConnected(dest));
        };
        // A send only arms timers (its resend and deadline), except that
        // the ack it piggybacks clears the partner's delayed-ack timer:
        // the cached earliest timer stays right, lowered to the new ones,
        // unless the cleared ack timer may have been that earliest one.
        // This runs on every send of a ping-pong, where a rescan of every
        // pending request after each showed in profiles.
        let cached = self.timer_cache.take();
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
        if let Some(prev) = cached {
            // `a < p` cannot be (`p` is the earliest of all), but only
            // `a > p` proves the cleared timer was not the earliest.
            let cleared_earliest = match (ack_before, prev) {
                (None, _) => false,
                (Some(a), Some(p)) => a <= p,
                (Some(_), None) => true,
            };
            if !cleared_earliest {
                let ack_after = self
                    .partners
                    .get(&dest)
                    .and_then(|p| p.ack_due(self.config.ack_delay));
                let next = self
                    .request_timers(id)
                    .into_iter()
                    .chain([prev, ack_after])
                    .flatten()
                    .min();
                self.timer_cache = OnceCell::from(next);
            }
        }
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
        // A receive left posted is in no partner's queues and has no timer;
        // only one that takes a queued message (and may ack it) moves one.
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
            self.timers_changed();
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
        // Only a posted receive, which has no timer, is withdrawn: the
        // cached earliest timer stays right.
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
        self.start_notify(now, id, large, status, Vec::new());
        Ok(())
    }

    /// Reports the end of a pull requested by [`EndpointEvent::EarlyPullNeeded`]:
    /// `Ok` with the message's bytes, or the pull's failure. A message a receive took
    /// meanwhile completes now; one still unexpected keeps its bytes until a receive
    /// takes it. A failed pull leaves the message a plain rendezvous, pulled again
    /// into the receive's buffer once one takes it. `Err` if the message is gone (its
    /// partner's connection was reset): the bytes are dropped.
    pub fn early_pull_done(
        &mut self,
        now: Instant,
        id: RequestId,
        result: Result<Vec<u8>, Status>,
    ) -> Result<(), Error> {
        self.timers_changed();
        let iid = self.early_pulls.remove(&id).ok_or(Error::BadRequest(id))?;
        let inb = self.inbound.get_mut(&iid).ok_or(Error::BadRequest(id))?;
        let Content::EarlyPull { window, .. } = inb.content else {
            return Err(Error::BadRequest(id));
        };
        match result {
            Ok(data) if data.len() == inb.msg_length as usize => {
                inb.content = Content::EarlyPull {
                    window,
                    pull: None,
                    data,
                };
            }
            failed => {
                let status = failed.err().unwrap_or(Status::Aborted);
                tracing::debug!(%status, "early pull failed; pulled again once received");
                if inb.recv.is_none() {
                    self.unexpected_bytes -= inb.stored_len();
                }
                inb.content = Content::Rndv(window);
            }
        }
        self.settle(now, iid);
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
        self.deadline_set = true;
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
            // Only immediate acks leave here, and an immediate ack owes no
            // timer (only a delayed one does): the cached earliest timer
            // stays right. Drivers drain this in a loop after every input,
            // and forgetting the cache at each drain cost a full rescan.
            self.flush_immediate_acks();
        }
        self.transmits.pop_front()
    }

    /// The next frame already queued, if any: [`poll_transmit`](Self::poll_transmit)
    /// without making up the acks that are due (a driver that sends what a
    /// call queued before it takes in arrivals, whose acks it would rather
    /// send together after them).
    pub fn poll_queued_transmit(&mut self) -> Option<Frame<Vec<u8>>> {
        self.transmits.pop_front()
    }

    /// Whether a completion waits for [`poll_event`](Self::poll_event).
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The next completion, if any.
    pub fn poll_event(&mut self) -> Option<EndpointEvent> {
        self.events.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) should next be called:
    /// the earliest delayed ack, retransmission or request deadline. Cheap
    /// when nothing changed since the last call.
    pub fn next_timeout(&self) -> Option<Instant> {
        let next = *self.timer_cache.get_or_init(|| {
            #[cfg(test)]
            self.scans.set(self.scans.get() + 1);
            self.earliest_timer(false)
        });
        debug_assert_eq!(
            next,
            self.earliest_timer(true),
            "a call that moved a timer left the cached one in place"
        );
        next
    }

    /// Forgets the cached [`next_timeout`](Self::next_timeout): every call
    /// that may touch partners, requests or acks starts with this.
    pub(super) fn timers_changed(&mut self) {
        self.timer_cache.take();
    }

    /// The earliest timer, scanning every partner's pending requests; with
    /// `every_held`, also the held ones that cannot have a timer (the full
    /// scan, which checks the shortcut).
    fn earliest_timer(&self, every_held: bool) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut consider = |t: Instant| next = Some(next.map_or(t, |n| n.min(t)));
        // A request held by a full send window has no resend timer and no
        // refusal (it has no seqnum yet), only a deadline, which it has only
        // if requests time out. The held queue grows with every send past
        // the window (16 by default): a stream of small isends walked it,
        // a lookup per held send, after every ack it received.
        let held = if every_held || self.config.request_timeout.is_some() || self.deadline_set {
            usize::MAX
        } else {
            0
        };
        for p in self.partners.values() {
            if let Some(t) = p.ack_due(self.config.ack_delay) {
                consider(t);
            }
            for &id in p
                .non_acked
                .iter()
                .chain(p.throttled.iter().take(held))
                .chain(&p.awaiting_notify)
                .chain(&p.connects)
            {
                self.request_timers(id)
                    .into_iter()
                    .flatten()
                    .for_each(&mut consider);
            }
        }
        next
    }

    /// The timers of pending request `id` (one in a partner's queues): its
    /// resend, its deadline and the refusal waiting to take effect.
    fn request_timers(&self, id: RequestId) -> [Option<Instant>; 3] {
        let (retx_at, deadline) = match self.requests.get(&id) {
            Some(CoreRequest::Send(s)) => (s.retx.map(|r| r.next_resend), s.deadline),
            Some(CoreRequest::Connect(c)) => (Some(c.next_resend), c.deadline),
            Some(CoreRequest::Recv(RecvReq {
                state: RecvState::Notifying { retx, deadline, .. },
                ..
            })) => (retx.map(|r| r.next_resend), *deadline),
            Some(CoreRequest::Recv(_)) | None => (None, None),
        };
        // Refusals are rare: skip the lookup when there is none.
        let refused = if self.refusals.is_empty() {
            None
        } else {
            self.refusals.get(&id).map(|r| r.1)
        };
        [retx_at, deadline, refused]
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

    /// Two endpoints on hosts 1 and 2 and the frames between them.
    struct Pair {
        eps: [Endpoint; 2],
        /// Frames in flight, each with the index of its receiver.
        wire: VecDeque<(usize, Frame<Vec<u8>>)>,
        /// Receives posted and not finished, per endpoint.
        posted: [Vec<RequestId>; 2],
        /// Unexpected messages reported, per endpoint.
        unexpected: [Vec<InboundId>; 2],
        now: Instant,
    }

    impl Pair {
        fn addr(i: usize) -> PeerAddr {
            PeerAddr::new(i as u16 + 1, 0)
        }

        /// Moves what each endpoint emits onto the wire and answers its
        /// pulls (at once, or failed, as the dice say).
        fn drain(&mut self, rng: &mut fastrand::Rng) {
            for i in 0..2 {
                while let Some(mut f) = self.eps[i].poll_transmit() {
                    // The receiver sees the sender's host in `peer_index`.
                    f.peer_index = i as u16 + 1;
                    self.wire.push_back((1 - i, f));
                }
                while let Some(ev) = self.eps[i].poll_event() {
                    match ev {
                        EndpointEvent::PullNeeded(p) => {
                            let status = if rng.u8(..4) == 0 {
                                Status::BadRdmawin
                            } else {
                                Status::Success
                            };
                            let _ = self.eps[i].pull_done(self.now, p.id, status);
                        }
                        EndpointEvent::EarlyPullNeeded(p) => {
                            let result = if rng.u8(..4) == 0 {
                                Err(Status::BadRdmawin)
                            } else {
                                Ok(vec![0; p.length as usize])
                            };
                            let _ = self.eps[i].early_pull_done(self.now, p.id, result);
                        }
                        EndpointEvent::RecvDone(r) => self.posted[i].retain(|&x| x != r.id),
                        EndpointEvent::Unexpected(u) => self.unexpected[i].push(u.id),
                        _ => {}
                    }
                }
            }
        }
    }

    /// A ping-pong driven as the library drives the core (after each input
    /// it asks for the next timeout, drains the frames and asks again; the
    /// application pre-posts its next receive and sends its reply) rescans
    /// the pending requests once per frame received and once per send that
    /// carries the ack owed, not at every drain, post and send.
    #[test]
    fn ping_pong_rescans_only_when_a_timer_moves() {
        let mut rng = fastrand::Rng::with_seed(1);
        let config = Config::default();
        let mut pair = Pair {
            eps: [
                Endpoint::new(config.clone(), 0, 11, 1),
                Endpoint::new(config, 0, 22, 1),
            ],
            wire: VecDeque::new(),
            posted: [Vec::new(), Vec::new()],
            unexpected: [Vec::new(), Vec::new()],
            now: Instant::from_millis(1),
        };
        // The library's progress after an input: ask, drain, ask again.
        let settle = |pair: &mut Pair, rng: &mut fastrand::Rng| {
            for ep in &pair.eps {
                ep.next_timeout();
            }
            pair.drain(rng);
            for ep in &pair.eps {
                ep.next_timeout();
            }
        };
        pair.eps[0].connect(pair.now, Pair::addr(1), 1);
        settle(&mut pair, &mut rng);
        while let Some((to, f)) = pair.wire.pop_front() {
            pair.eps[to].handle_frame(pair.now, f.as_borrowed());
            settle(&mut pair, &mut rng);
        }
        for i in 0..2 {
            pair.eps[i].post_recv(pair.now, 0, !0, 64).unwrap();
        }
        let before = [pair.eps[0].scans.get(), pair.eps[1].scans.get()];
        let round_trips = 100u64;
        let mut delivered = [0u64; 2];
        for n in 0..round_trips * 2 {
            pair.now = pair.now + Duration::from_micros(3);
            let from = (n % 2) as usize;
            let now = pair.now;
            pair.eps[from].post_recv(now, 0, !0, 64).unwrap();
            settle(&mut pair, &mut rng);
            pair.eps[from]
                .send(now, Pair::addr(1 - from), 0, &[1; 8])
                .unwrap();
            settle(&mut pair, &mut rng);
            let (to, f) = pair.wire.pop_front().expect("the message left");
            assert!(pair.wire.is_empty(), "no explicit ack in a ping-pong");
            pair.eps[to].handle_frame(now, f.as_borrowed());
            settle(&mut pair, &mut rng);
            delivered[to] += 1;
        }
        assert_eq!(delivered, [round_trips; 2]);
        for (i, (ep, before)) in pair.eps.iter().zip(before).enumerate() {
            let scans = ep.scans.get() - before;
            // One per frame received, one per send clearing the ack it owed.
            assert!(
                scans <= 2 * round_trips,
                "endpoint {i} rescanned {scans} times in {round_trips} round trips"
            );
        }
    }

    /// The cached earliest timer against the full scan, after every step
    /// of random traffic between two endpoints: connects, sends of every
    /// class, receives posted, cancelled or taking unexpected messages,
    /// frames lost, reordered and duplicated, timers firing, deadlines set,
    /// acks flushed, disconnects and path restorations. A call that moves
    /// a timer without updating or forgetting the cache fails it.
    #[test]
    fn cached_timer_matches_full_scan_under_random_traffic() {
        for seed in 0..300u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut config = Config::default();
            if rng.bool() {
                config.request_timeout = Some(Duration::from_millis(rng.u64(1..400)));
            }
            config.send_window = rng.u16(1..8);
            let mut pair = Pair {
                eps: [
                    Endpoint::new(config.clone(), 0, 100 + seed as u32, 1),
                    Endpoint::new(config, 0, 200 + seed as u32, 1),
                ],
                wire: VecDeque::new(),
                posted: [Vec::new(), Vec::new()],
                unexpected: [Vec::new(), Vec::new()],
                now: Instant::from_millis(1),
            };
            let mut sends: [Vec<RequestId>; 2] = [Vec::new(), Vec::new()];
            for step in 0..400 {
                let i = rng.usize(..2);
                let peer = Pair::addr(1 - i);
                let now = pair.now;
                match rng.u8(..20) {
                    0 => {
                        pair.eps[i].connect(now, peer, 1);
                    }
                    1..=4 => {
                        let len = [0, 1, 64, 128, 300, 5000, 40_000][rng.usize(..7)];
                        if let Ok(id) = pair.eps[i].send(now, peer, rng.u64(..4), &vec![7; len]) {
                            sends[i].push(id);
                        }
                    }
                    5 => {
                        let window = RdmaWindow {
                            id: rng.u8(..),
                            seqnum: 0,
                            offset: 0,
                        };
                        let len = rng.u32(40_000..100_000);
                        if let Ok(id) = pair.eps[i].send_large(now, peer, rng.u64(..4), len, window)
                        {
                            sends[i].push(id);
                        }
                    }
                    6..=8 => {
                        if let Ok(id) = pair.eps[i].post_recv(now, rng.u64(..4), !0, 100_000) {
                            pair.posted[i].push(id);
                        }
                    }
                    9 => {
                        if let Some(&id) = rng.choice(&pair.posted[i]) {
                            pair.eps[i].cancel(id);
                        }
                    }
                    10 => {
                        if let Some(id) = pair.unexpected[i].pop() {
                            pair.eps[i].receive_unexpected(now, id, rng.usize(..100_000));
                        }
                    }
                    11..=14 => {
                        // Deliver, lose, duplicate or reorder the next frame.
                        if let Some((to, f)) = pair.wire.pop_front() {
                            match rng.u8(..10) {
                                0 => {}
                                1 => pair.wire.push_back((to, f)),
                                n => {
                                    pair.eps[to].handle_frame(now, f.as_borrowed());
                                    if n == 2 {
                                        pair.eps[to].handle_frame(now, f.as_borrowed());
                                    }
                                }
                            }
                        }
                    }
                    15 | 16 => {
                        let jump = if rng.bool() {
                            pair.eps[i].next_timeout().unwrap_or(now)
                        } else {
                            now + Duration::from_micros(rng.u64(1..5000))
                        };
                        pair.now = jump.max(now);
                        pair.eps[i].handle_timeout(pair.now);
                    }
                    17 => {
                        if let Some(&id) = rng.choice(&sends[i]) {
                            let t = Duration::from_millis(rng.u64(..300));
                            pair.eps[i].set_request_timeout(id, t);
                        }
                    }
                    18 => pair.eps[i].flush_acks(),
                    _ => match rng.u8(..8) {
                        0 => pair.eps[i].disconnect(peer),
                        1 => pair.eps[i].path_restored(now),
                        _ => pair.eps[i].handle_timeout(now),
                    },
                }
                for j in 0..2 {
                    assert_eq!(
                        pair.eps[j].next_timeout(),
                        pair.eps[j].earliest_timer(true),
                        "seed {seed} step {step}: endpoint {j}'s cached timer is stale"
                    );
                }
                pair.drain(&mut rng);
                for j in 0..2 {
                    assert_eq!(
                        pair.eps[j].next_timeout(),
                        pair.eps[j].earliest_timer(true),
                        "seed {seed} step {step}: endpoint {j}'s cached timer is stale after draining"
                    );
                }
            }
        }
    }
}

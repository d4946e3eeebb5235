//! One endpoint's shared rings as the library drives them.
//!
//! A [`XenLink`] owns the endpoint's [`EndpointChannel`] and what the library
//! keeps about requests it posted there: send-queue slots of MEDIUM messages
//! in flight, LARGE windows lent to peers, pulls in progress. It sits behind
//! a mutex shared by the application threads (which post requests and may
//! take events in while they poll) and the driver thread (which takes events
//! in when the backend signals the port). Whoever takes events in converts
//! them at once: frames and finished pulls go to the endpoint's [`Mailbox`],
//! MEDIUM fragments are copied out of the receive queue before their event
//! slot is handed back.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use rustc_hash::{FxHashMap, FxHashSet};

use xmx_frontend::frontd::FrontdClient;
use xmx_frontend::own_grants::{GrantPool, RegionGrants};
use xmx_frontend::{EndpointChannel, EndpointHandoff, Lease, RegionCache, RegionWindow, Registrar};
use xmx_hv::{DomId, GrantTable};
use xmx_mx::{Frame, PeerAddr, RdmaWindow, RequestId, Status};
use xmx_wire::msg::{Route, SendOp, SendRequest};
use xmx_wire::ring::RingError;

use super::slots::SendSlots;
use super::windows::{self, pool_pages};
use crate::counters::{self, Counter};
use crate::segments::Segments;
use crate::transport::engine_msgs::{self, Inbound, Outbound, PeerSessions};
use crate::transport::mailbox::Mailbox;
use crate::transport::PullProgress;

/// How long a post waits for room in the send ring or the send queue before
/// the request is dropped (and later retransmitted by the protocol core).
const POST_WAIT: Duration = Duration::from_millis(200);
/// Region ids kept free of send windows, so a receive can always pull.
const PULL_RESERVE: usize = 8;
/// Unused windows the registration cache keeps registered at most.
pub(crate) const CACHE_CAPACITY: usize = 32;

/// How long a pull is held back (the send ring full, or the backend refusing it for lack
/// of room) with no pull of the link ending before its receive fails: a backend that stays
/// alive but never makes room must not leave the receive waiting without a bound.
const PULL_HELD_MAX: Duration = Duration::from_secs(10);

/// Bytes of windows an endpoint lends to peers at once (a send's window holds its grants
/// until a peer pulls it), beyond the first: the rest of the guest's grants stay for
/// receives. Without a bound, two guests exchanging many large messages could each fill
/// their grants with sends the other cannot pull, having no room left to pull into.
const LENT_BYTES_MAX: usize = 32 << 20;

/// How often a pull that found no room to register tries again when nothing of its own
/// endpoint gave room back: the room may come from another process of the guest (its
/// pulls ending, its unused windows expiring).
const STARVED_RETRY: Duration = Duration::from_millis(5);

/// A pull in progress: the receive's buffer and the window the data lands in.
struct LinkSink {
    id: RequestId,
    lease: Lease,
    dest: Segments,
    length: u32,
    source: PeerAddr,
    session: u32,
    window: RdmaWindow,
    /// When it was first held back (ring full, or refused for lack of room), if it was.
    held_since: Option<Instant>,
    /// Bytes already copied from the window to `dest` (see `Inbound::PullProgress`).
    drained: u32,
}

/// A pull whose destination has no window yet: asked while the link was down (the
/// daemon registers nothing for an endpoint its device is not connected for; it gets one
/// once the endpoint is re-opened, [`XenLink::remap`]), or when no room was left to
/// register it (it gets one as room is given back, [`XenLink::feed_starved`]).
struct WaitingPull {
    id: RequestId,
    dest: Segments,
    length: u32,
    source: PeerAddr,
    session: u32,
    window: RdmaWindow,
}

impl WaitingPull {
    /// The pull into `lease`, the window registered for its destination.
    fn into_sink(self, lease: Lease) -> LinkSink {
        LinkSink {
            id: self.id,
            lease,
            dest: self.dest,
            length: self.length,
            source: self.source,
            session: self.session,
            window: self.window,
            held_since: None,
            drained: 0,
        }
    }
}

/// How a pull request fared on the send ring.
enum PullPost {
    Posted(u32),
    /// No room now: the backend is late, not gone.
    RingFull,
    Failed,
}

/// How [`XenLink::remap`] took a re-opened endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Remapped {
    /// In its session: it goes on where it was.
    Resumed,
    /// Under a new session: its peers no longer reach it.
    SessionChanged,
    /// Not at all (the link was closed, or the new pages could not be mapped).
    NotTaken,
}

/// An endpoint's rings and requests; see the module documentation.
pub(crate) struct XenLink {
    channel: Option<EndpointChannel>,
    index: u8,
    /// The session the protocol core was opened with.
    session: u32,
    slots: SendSlots,
    next_tag: u32,
    sessions: PeerSessions,
    cache: RegionCache,
    /// Send windows lent to peers, by (region id, seqnum).
    lent: FxHashMap<(u8, u8), Lease>,
    /// The application's buffer behind each lent window (direct-channel
    /// pulls read it).
    lent_data: FxHashMap<(u8, u8), Segments>,
    /// Lent windows whose data is not in their region yet: a send is copied
    /// into its region only once the backend may be asked for it (its RNDV
    /// goes through the backend, or the backend asks), as a peer pulling over
    /// a direct channel reads the application's buffer. The region's fill
    /// mark stays clear meanwhile, so the backend serves none of it.
    unfilled: FxHashSet<(u8, u8)>,
    /// Windows that were lent when a reconnection lost the regions: their sends are not
    /// over, and an RNDV naming one is still posted (the backend refuses it loudly).
    lost_in_reconnection: FxHashSet<(u8, u8)>,
    sinks: FxHashMap<u32, LinkSink>,
    /// Bytes of finished pulls copied out of their windows, and how many of them were
    /// copied while the rest was on the way (logged when the endpoint closes).
    pulled_out: (u64, u64),
    /// Sends' data copied into windows: copies and bytes (logged when the endpoint
    /// closes).
    filled_in: (u64, u64),
    /// The port's notifications taken by the application thread that slept on the
    /// port, and by the driver thread (logged when the endpoint closes).
    signals_taken: (u64, u64),
    /// Pulls waiting for room in the send ring (or to be asked again after a refusal for
    /// lack of room), in the order their receives took them.
    deferred: VecDeque<LinkSink>,
    /// Pulls asked while down that could not get a window yet, in order.
    waiting: VecDeque<WaitingPull>,
    /// Pulls that found no room to register their destination (the guest's grants or
    /// the backend's quota all held by windows in use), in order, with when they first
    /// did: each gets its window as an earlier pull or a lent send gives room back.
    starved: VecDeque<(WaitingPull, Instant)>,
    /// A window was given back since the starved pulls last tried to register: they
    /// try again then, or at `starved_retry_at` (a registration that fails costs a
    /// request to the daemon).
    room_freed: bool,
    starved_retry_at: Option<Instant>,
    generations: [u8; 256],
    max_send_windows: usize,
    /// Send-ring slots when nothing is in flight.
    ring_slots: u32,
    /// The backend let the endpoint go; nothing is posted until it is back.
    down: bool,
    /// Regions per endpoint the backend allows (at most 256).
    max_regions: usize,
    /// Set when windows are registered without the guest daemon.
    own_grants: Option<OwnGrants>,
}

/// Registration without the guest daemon (Xen2MX's way, see [`xmx_frontend::own_grants`]):
/// the link grants each window's pages itself and registers them on its own send ring,
/// waiting for the backend's completion; a deregistration is posted without waiting and
/// the pages' grants end at once (the hypervisor frees them when the backend unmaps).
pub(crate) struct OwnGrants {
    gnttab: Arc<dyn GrantTable>,
    backend: DomId,
    /// Region ids not in use, lowest last.
    free_ids: Vec<u8>,
    /// What arrived on the event ring while a registration waited for its completion; taken
    /// in before anything newer.
    stash: Vec<Inbound>,
    /// The registration of every region registered, by id, and its grants: posted again
    /// after a reconnection, over the same grants, so the ids peers hold stay valid.
    registered: std::collections::BTreeMap<u8, OwnRegion>,
    /// Grants of deregistered windows, for the next windows (see
    /// [`xmx_frontend::own_grants::GrantPool`]).
    pool: GrantPool,
    /// How long a registration polls for its completion before it sleeps (the endpoint's
    /// `XMX_SPIN_US`).
    spin: Duration,
}

/// A region the link registered itself.
pub(crate) struct OwnRegion {
    request: xmx_wire::msg::DirectRegister,
    grants: RegionGrants,
}

/// How long a registration waits for the backend's answer.
const REGISTER_WAIT: Duration = Duration::from_secs(5);

/// Whether `op` announces a LARGE send whose window came back to the link: the send is over,
/// and the region may be deregistered already. (A window a reconnection lost is not one: its
/// send is still pending.)
fn announces_returned_window<L>(
    op: &SendOp,
    lent: &FxHashMap<(u8, u8), L>,
    lost: &FxHashSet<(u8, u8)>,
) -> bool {
    let SendOp::Rndv(r) = op else {
        return false;
    };
    let window = (r.region_id, r.region_seqnum);
    !lent.contains_key(&window) && !lost.contains(&window)
}

impl XenLink {
    /// The link of an opened endpoint. `max_regions` is the backend's limit of
    /// regions per endpoint; `rcache` keeps windows registered across messages.
    pub(crate) fn new(mut channel: EndpointChannel, max_regions: u32, rcache: bool) -> XenLink {
        let index = channel.endpoint();
        // A fresh ring: every slot is free.
        let ring_slots = channel.free_send_slots().unwrap_or(0);
        let session = channel.session_id();
        let slots = SendSlots::new(channel.geometry().send_queue);
        let max_regions = (max_regions as usize).min(256);
        XenLink {
            channel: Some(channel),
            index,
            session,
            slots,
            next_tag: 0,
            sessions: PeerSessions::default(),
            cache: RegionCache::new(rcache, CACHE_CAPACITY.min(max_regions.max(1))),
            lent: FxHashMap::default(),
            lent_data: FxHashMap::default(),
            unfilled: FxHashSet::default(),
            lost_in_reconnection: FxHashSet::default(),
            sinks: FxHashMap::default(),
            pulled_out: (0, 0),
            filled_in: (0, 0),
            signals_taken: (0, 0),
            deferred: VecDeque::new(),
            waiting: VecDeque::new(),
            starved: VecDeque::new(),
            room_freed: false,
            starved_retry_at: None,
            generations: [0; 256],
            max_send_windows: max_regions.saturating_sub(PULL_RESERVE).max(1),
            ring_slots,
            down: false,
            max_regions,
            own_grants: None,
        }
    }

    /// From now on, register windows without the guest daemon: grant their pages through
    /// `gnttab` to `backend` and register them on the send ring. For an endpoint with no
    /// window registered yet (the ids are the link's to choose).
    /// A registration polls for its completion for `spin` before it sleeps.
    pub(crate) fn register_with_own_grants(
        &mut self,
        gnttab: Arc<dyn GrantTable>,
        backend: DomId,
        spin: Duration,
    ) {
        self.own_grants = Some(OwnGrants {
            gnttab,
            backend,
            free_ids: (0..self.max_regions).rev().map(|i| i as u8).collect(),
            stash: Vec::new(),
            registered: Default::default(),
            pool: GrantPool::new(pool_pages()),
            spin,
        });
    }

    /// After a reconnection, registers every region this link registered itself again,
    /// under its id and over its grants (they outlive a backend restart, a suspend, and,
    /// on the simulator, a move to another host). True if all are back (or there were
    /// none); false if any failed, in which case none is kept.
    fn register_own_again(&mut self) -> bool {
        let (Some(d), Some(channel)) = (self.own_grants.as_mut(), self.channel.as_mut()) else {
            return false;
        };
        let requests: Vec<_> = d.registered.values().map(|r| r.request).collect();
        let mut r = OwnGrantsRegistrar {
            d,
            channel,
            next_tag: &mut self.next_tag,
            index: self.index,
            session: self.session,
        };
        for req in &requests {
            let tag = r.tag();
            let ok =
                r.post(tag, SendOp::Register(*req)) && matches!(r.completion(tag), Some(Ok(_)));
            if !ok {
                tracing::warn!(
                    index = self.index,
                    region_id = req.region_id,
                    "a region could not be registered again; the windows are dropped"
                );
                return false;
            }
        }
        if !requests.is_empty() {
            tracing::info!(
                index = self.index,
                regions = requests.len(),
                "regions registered again under their ids"
            );
        }
        true
    }

    /// The cache and the registrar it uses: `outer` (the daemon), or the link itself when
    /// it registers with its own grants.
    fn split<'a>(&'a mut self, outer: &'a mut dyn Registrar) -> (&'a mut RegionCache, Via<'a>) {
        let index = self.index;
        let session = self.session;
        let down = self.down;
        let mut registered = None;
        let Some(d) = self.own_grants.as_mut() else {
            return (
                &mut self.cache,
                Via {
                    outer,
                    own_grants: None,
                    own_grants_mode: false,
                    registered: None,
                },
            );
        };
        let own_grants = match self.channel.as_mut() {
            Some(channel) if !down => Some(OwnGrantsRegistrar {
                d,
                channel,
                next_tag: &mut self.next_tag,
                index,
                session,
            }),
            _ => {
                registered = Some(&mut d.registered);
                None
            }
        };
        (
            &mut self.cache,
            Via {
                outer,
                own_grants,
                own_grants_mode: true,
                registered,
            },
        )
    }

    /// Pulls, windows and rings, as lines of text for a stall report.
    pub(crate) fn describe(&self) -> String {
        let mut out = format!(
            "  link: {} pulls at the backend, {} held back, {} windows lent, {} of {} send slots free ({} sends in flight){}{}\n",
            self.sinks.len(),
            self.deferred.len(),
            self.lent.len(),
            self.slots.available(),
            self.slots.count(),
            self.slots.in_flight(),
            if self.down { ", down" } else { "" },
            if self.channel.is_none() { ", closed" } else { "" },
        );
        let mut sinks: Vec<(&u32, &LinkSink)> = self.sinks.iter().collect();
        sinks.sort_by_key(|(tag, _)| **tag);
        for (tag, s) in sinks.iter().take(4) {
            out.push_str(&format!(
                "    pull tag {tag} for recv {}: {} bytes from {}:{} session {:#x} window {}/{}\n",
                s.id.0,
                s.length,
                s.source.peer_index,
                s.source.endpoint,
                s.session,
                s.window.id,
                s.window.seqnum
            ));
        }
        if sinks.len() > 4 {
            out.push_str(&format!("    ... and {} more\n", sinks.len() - 4));
        }
        out
    }

    /// The session the protocol core uses.
    pub(crate) fn session(&self) -> u32 {
        self.session
    }

    /// The port's descriptor, while the link is up.
    pub(crate) fn port_fd(&self) -> Option<RawFd> {
        match &self.channel {
            Some(c) if !self.down => Some(c.port_fd().as_raw_fd()),
            _ => None,
        }
    }

    fn tag(&mut self) -> u32 {
        self.next_tag = self.next_tag.wrapping_add(1);
        self.next_tag
    }

    /// Posts a frame of the protocol core, converted.
    pub(crate) fn post(&mut self, out: Outbound, mailbox: &Mailbox, reg: &mut dyn Registrar) {
        if self.down || self.channel.is_none() {
            return;
        }
        if let Outbound::Request(r) = &out {
            if announces_returned_window(&r.op, &self.lent, &self.lost_in_reconnection) {
                // A resent RNDV of a send that ended (its NOTIFY arrived while the resend
                // waited to be posted): the window may be deregistered already, and the
                // backend disconnects a guest that names a region it does not have.
                tracing::debug!(index = self.index, "RNDV of a finished send not posted");
                return;
            }
        }
        let tag = self.tag();
        let request = match out {
            Outbound::Request(mut r) => {
                r.tag = tag;
                r
            }
            Outbound::Medium(m) => {
                let Some(slots) = self.take_slots(m.fragments.len(), mailbox, reg) else {
                    tracing::debug!(
                        index = self.index,
                        "no send-queue slot in time; MEDIUM dropped"
                    );
                    counters::add(Counter::SendsDroppedForRoom, 1);
                    return;
                };
                let written = self.channel.as_ref().is_some_and(|channel| {
                    slots
                        .iter()
                        .zip(&m.fragments)
                        .all(|(&s, f)| channel.write_send_queue(s, 0, f).is_ok())
                });
                let request = match m.request(tag, &slots) {
                    Ok(r) if written => r,
                    Ok(_) | Err(_) => {
                        self.slots.put_back(slots);
                        tracing::warn!(
                            index = self.index,
                            "MEDIUM message does not fit the send queue"
                        );
                        return;
                    }
                };
                self.slots.hold(tag, slots);
                request
            }
        };
        self.push(&request, mailbox, reg);
    }

    /// `n` send-queue slots, waiting a while for completions to free some.
    fn take_slots(
        &mut self,
        n: usize,
        mailbox: &Mailbox,
        reg: &mut dyn Registrar,
    ) -> Option<Vec<u16>> {
        if n > usize::from(self.slots.count()) {
            return None;
        }
        let deadline = Instant::now() + POST_WAIT;
        loop {
            if let Some(s) = self.slots.take(n) {
                return Some(s);
            }
            if self.down || Instant::now() >= deadline {
                return None;
            }
            if self.take_in(mailbox, reg) == 0 {
                std::thread::yield_now();
            }
        }
    }

    /// Pushes and publishes one request, waiting a while for room; on failure
    /// whatever the request held is freed. True if it was posted.
    fn push(&mut self, request: &SendRequest, mailbox: &Mailbox, reg: &mut dyn Registrar) -> bool {
        if self
            .own_grants
            .as_ref()
            .is_some_and(|d| !d.stash.is_empty())
        {
            // Events a registration took in while it waited: delivered before more is sent.
            self.take_in(mailbox, reg);
        }
        let deadline = Instant::now() + POST_WAIT;
        while let Some(channel) = self.channel.as_mut() {
            match channel.push(request) {
                Ok(()) => {
                    if let Err(e) = channel.flush() {
                        tracing::warn!(index = self.index, %e, "notifying the backend");
                    }
                    return true;
                }
                Err(xmx_frontend::Error::Ring(RingError::Full)) => {
                    // Publish what waits, so the backend makes room.
                    let _ = channel.flush();
                    if self.down || Instant::now() >= deadline {
                        tracing::debug!(index = self.index, "no send-ring room in time; dropped");
                        counters::add(Counter::SendsDroppedForRoom, 1);
                        break;
                    }
                    if self.take_in(mailbox, reg) == 0 {
                        std::thread::yield_now();
                    }
                }
                Err(e) => {
                    tracing::warn!(index = self.index, %e, "send request not posted");
                    break;
                }
            }
        }
        self.slots.complete(request.tag);
        false
    }

    /// Takes in every event waiting: frames and finished pulls go to
    /// `mailbox`, completions free what their request held. Returns how many
    /// things were delivered to the mailbox.
    pub(crate) fn take_in(&mut self, mailbox: &Mailbox, reg: &mut dyn Registrar) -> usize {
        self.post_deferred(mailbox, reg);
        self.feed_starved(mailbox, reg);
        // What a registration took in while it waited came first.
        let mut inbound = match self.own_grants.as_mut() {
            Some(d) => std::mem::take(&mut d.stash),
            None => Vec::new(),
        };
        let Some(channel) = self.channel.as_mut() else {
            return self.deliver(inbound, mailbox, reg);
        };
        loop {
            let event = match channel.next_event() {
                Ok(Some(e)) => e,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(index = self.index, %e, "event ring unusable");
                    break;
                }
            };
            let ch: &EndpointChannel = channel;
            // The fragment is copied out now: its receive-queue slot returns
            // to the backend with the event's slot, below.
            let converted = engine_msgs::incoming(self.index, self.session, &event, |slot, len| {
                let mut buf = vec![0u8; usize::from(len)];
                ch.read_recv_queue(slot, 0, &mut buf).ok()?;
                Some(buf)
            });
            match converted {
                Ok(i) => inbound.push(i),
                Err(e) => {
                    tracing::warn!(index = self.index, %e, "event dropped");
                }
            }
        }
        if let Err(e) = channel.release_events() {
            tracing::warn!(index = self.index, %e, "handing event slots back");
        }
        self.deliver(inbound, mailbox, reg)
    }

    /// Frames and finished pulls to `mailbox`; completions free what their request held.
    fn deliver(
        &mut self,
        inbound: Vec<Inbound>,
        mailbox: &Mailbox,
        reg: &mut dyn Registrar,
    ) -> usize {
        let mut frames = Vec::new();
        let mut pulls = Vec::new();
        for i in inbound {
            match i {
                Inbound::Frame(f) => {
                    self.sessions.observe(&f);
                    frames.push(f);
                }
                Inbound::RegionWanted { region } => self.region_wanted(region),
                Inbound::PullProgress { tag, length } => self.pulled_so_far(tag, length),
                Inbound::Completed { tag, result } => {
                    if let Some(mut sink) = self.sinks.remove(&tag) {
                        // The backend's pull quota is full: the pull is asked again as
                        // others finish, for a bounded time.
                        if result == Err(Status::NoResources) {
                            let since = *sink.held_since.get_or_insert_with(Instant::now);
                            if since.elapsed() < PULL_HELD_MAX {
                                sink.drained = 0;
                                self.deferred.push_back(sink);
                                continue;
                            }
                        }
                        pulls.push(self.finish_pull(sink, result, reg));
                    } else {
                        self.slots.complete(tag);
                        if let Err(status) = result {
                            // Lost, as on a wire: the core sends it again.
                            tracing::debug!(index = self.index, tag, %status, "request refused by the backend");
                        }
                    }
                }
            }
        }
        let delivered = frames.len() + pulls.len();
        if !frames.is_empty() {
            mailbox.put_frames(frames);
        }
        if !pulls.is_empty() {
            mailbox.put_pulls(pulls);
            // Room came: the held pulls' bounded wait starts over (a long queue of
            // LARGE receives behind one another is not a backend that never makes room).
            for sink in &mut self.deferred {
                sink.held_since = None;
            }
            // Their windows are back: a starved pull may register now.
            self.feed_starved(mailbox, reg);
        }
        delivered
    }

    /// Takes events in, then arms the event ring so the backend signals the
    /// port at the next one (taking in again what raced with the arming).
    pub(crate) fn take_in_and_arm(&mut self, mailbox: &Mailbox, reg: &mut dyn Registrar) -> usize {
        let mut delivered = 0;
        loop {
            delivered += self.take_in(mailbox, reg);
            let Some(channel) = self.channel.as_mut() else {
                return delivered;
            };
            match channel.arm_events() {
                Ok(true) => continue,
                Ok(false) => return delivered,
                Err(e) => {
                    tracing::warn!(index = self.index, %e, "arming the event ring");
                    return delivered;
                }
            }
        }
    }

    /// Consumes the port's notification after a poll saw it: the driver's, or
    /// (`by_waiter`) that of the application thread sleeping on the port.
    pub(crate) fn take_notification(&mut self, by_waiter: bool) {
        let closed = match &self.channel {
            Some(c) => {
                match c.take_notification() {
                    Ok(true) if by_waiter => self.signals_taken.0 += 1,
                    Ok(true) => self.signals_taken.1 += 1,
                    Ok(false) => {}
                    Err(e) => tracing::debug!(index = self.index, %e, "taking a notification"),
                }
                c.is_disconnected()
            }
            None => false,
        };
        if closed {
            self.set_down();
        }
    }

    /// The backend let the endpoint go: stop posting until it is re-opened.
    pub(crate) fn set_down(&mut self) {
        if !self.down {
            tracing::info!(index = self.index, "endpoint disconnected from the backend");
        }
        self.down = true;
    }

    /// The backend says the first `length` bytes of the pull tagged `tag` are in its
    /// window: copied out now, while the rest is on the way, so that little is left to
    /// copy once the pull is done. A length beyond the pull's, or not beyond what was
    /// copied, is ignored (the copy at the end takes whatever is left).
    fn pulled_so_far(&mut self, tag: u32, length: u32) {
        let Some(sink) = self.sinks.get_mut(&tag) else {
            return;
        };
        if length <= sink.drained || length > sink.length {
            return;
        }
        let copied = self
            .cache
            .window(sink.lease)
            .is_some_and(|w| windows::drain(w, &sink.dest, sink.drained as usize, length as usize));
        if copied {
            sink.drained = length;
        }
    }

    fn finish_pull(
        &mut self,
        sink: LinkSink,
        result: Result<u32, Status>,
        reg: &mut dyn Registrar,
    ) -> (RequestId, Result<(), Status>) {
        let outcome = match result {
            Ok(_) => {
                let copied = self.cache.window(sink.lease).is_some_and(|w| {
                    let (from, to) = (sink.drained as usize, sink.length as usize);
                    windows::drain(w, &sink.dest, from, to)
                });
                if copied {
                    self.pulled_out.0 += u64::from(sink.length);
                    self.pulled_out.1 += u64::from(sink.drained);
                    Ok(())
                } else {
                    tracing::warn!(index = self.index, "pulled data could not be copied out");
                    Err(Status::Aborted)
                }
            }
            Err(s) => Err(s),
        };
        let (cache, mut via) = self.split(reg);
        if let Err(e) = cache.release(&mut via, sink.lease) {
            tracing::warn!(index = self.index, %e, "releasing a pull window");
        }
        self.room_freed = true;
        (sink.id, outcome)
    }

    /// A window for `len` bytes of the buffer at `addr`: cached, or registered
    /// now; when registering fails, unused cached windows are dropped and it is
    /// tried once more. The error says why the second try failed.
    fn acquire(
        &mut self,
        reg: &mut dyn Registrar,
        addr: usize,
        len: usize,
    ) -> Result<Lease, xmx_frontend::Error> {
        let index = self.index;
        let (cache, mut via) = self.split(reg);
        match cache.acquire(&mut via, index, addr, len) {
            Ok(l) => return Ok(l),
            Err(e) => {
                tracing::debug!(index = self.index, %e, "registering a window; dropping unused ones")
            }
        }
        let (cache, mut via) = self.split(reg);
        if let Err(e) = cache.flush(&mut via) {
            tracing::warn!(index, %e, "dropping cached windows");
        }
        cache.acquire(&mut via, index, addr, len).inspect_err(|e| {
            tracing::debug!(index = self.index, %e, len, "no window for a LARGE message");
        })
    }

    /// Learns the peer's session from a connect that came another way (a
    /// direct channel).
    pub(crate) fn observe(&mut self, frame: &Frame<Vec<u8>>) {
        self.sessions.observe(frame);
    }

    /// Copies `n` bytes at `offset` of the data a LARGE send lends under
    /// `window` to `dst`, for a peer pulling over a direct channel; false if
    /// the window is not lent (any more) or the range is beyond its data.
    /// The application's buffer is read while the link's lock is held, so
    /// the send cannot complete (and the buffer go) during the copy.
    ///
    /// # Safety
    /// `dst` must be valid for `n` bytes of writes.
    pub(crate) unsafe fn read_lent(
        &self,
        window: RdmaWindow,
        offset: usize,
        dst: *mut u8,
        n: usize,
    ) -> bool {
        let Some(data) = self.lent_data.get(&(window.id, window.seqnum)) else {
            return false;
        };
        let offset = offset + usize::from(window.offset);
        if offset.checked_add(n).is_none_or(|end| end > data.len()) {
            return false;
        }
        let mut at = 0;
        data.for_range(offset, n, |addr, len| {
            // SAFETY: `addr..addr + len` is part of the send's buffer, which
            // MX keeps valid and unchanged while the send is pending (it is:
            // the window is still lent); `dst + at .. + len` is within the
            // `n` bytes the caller vouches for, shared memory (a direct
            // channel's lane) its other side may write meanwhile.
            unsafe { xmx_wire::ring::copy_shared(addr as *const u8, dst.add(at), len) };
            at += len;
        });
        at == n
    }

    /// `peer`'s session is known without a connect (this endpoint's own).
    pub(crate) fn learn_session(&mut self, peer: PeerAddr, session: u32) {
        self.sessions.learn(peer, session);
    }

    /// Lends a LARGE send's data to peers under a window of its own. The
    /// data is copied into the window's region by [`XenLink::fill`], when
    /// the backend may be asked for it.
    pub(crate) fn register(
        &mut self,
        reg: &mut dyn Registrar,
        data: &Segments,
    ) -> Option<RdmaWindow> {
        if data.is_empty() || self.down || self.channel.is_none() {
            return None;
        }
        if self.lent.len() >= self.max_send_windows {
            return None;
        }
        let (addr, len) = windows::key(data);
        let over = !self.lent.is_empty() && self.lent_bytes().saturating_add(len) > LENT_BYTES_MAX;
        let lease = self.acquire(reg, addr, len).ok()?;
        let Some(id) = self
            .cache
            .window(lease)
            .filter(|w| w.len() >= data.len())
            .map(|w| w.region_id())
        else {
            tracing::warn!(index = self.index, "no window holds the LARGE data");
            let (cache, mut via) = self.split(reg);
            let _ = cache.release(&mut via, lease);
            return None;
        };
        if over && !self.lent.keys().any(|k| k.0 == id) {
            // Past the bound, only a window lent already (the same buffer) is lent again.
            let (cache, mut via) = self.split(reg);
            let _ = cache.release(&mut via, lease);
            return None;
        }
        // A send of the same buffer still lent with its data in the region: MX keeps a
        // send's buffer unchanged while the send is pending, so these bytes are there
        // already (a stream of sends from one buffer copies it once, not per message).
        let filled = self
            .lent_data
            .iter()
            .any(|(k, d)| k.0 == id && !self.unfilled.contains(k) && d.parts() == data.parts());
        let seqnum = self.generations[usize::from(id)].wrapping_add(1);
        self.generations[usize::from(id)] = seqnum;
        self.lent.insert((id, seqnum), lease);
        self.lent_data.insert((id, seqnum), data.clone());
        if !filled {
            self.unfilled.insert((id, seqnum));
        }
        self.publish_fill_mark(id);
        Some(RdmaWindow {
            id,
            seqnum,
            offset: 0,
        })
    }

    /// Bytes of the windows lent now, each region once (without allocating: it is
    /// asked at every LARGE send).
    fn lent_bytes(&self) -> usize {
        let mut counted = [false; 256];
        let mut bytes = 0;
        for (&(id, _), lease) in &self.lent {
            if !std::mem::replace(&mut counted[usize::from(id)], true) {
                bytes += self.cache.window(*lease).map_or(0, |w| w.len());
            }
        }
        bytes
    }

    /// Copies the data `window` lends into its region (if it is not there
    /// yet) and sets the region's fill mark: the backend may now serve it.
    /// False if the window is not lent or the copy failed.
    pub(crate) fn fill(&mut self, window: RdmaWindow) -> bool {
        let key = (window.id, window.seqnum);
        if !self.lent.contains_key(&key) {
            return false;
        }
        if self.unfilled.contains(&key) {
            let (Some(lease), Some(data)) = (self.lent.get(&key), self.lent_data.get(&key)) else {
                return false;
            };
            if !self
                .cache
                .window(*lease)
                .is_some_and(|w| windows::fill(w, data))
            {
                tracing::warn!(
                    index = self.index,
                    "LARGE data could not be copied into its window"
                );
                return false;
            }
            self.filled_in.0 += 1;
            self.filled_in.1 += data.len() as u64;
            // Windows share a region only for one buffer (the cache's key),
            // so every send lending this region lends these bytes.
            self.unfilled.retain(|&(id, _)| id != window.id);
        }
        self.publish_fill_mark(window.id);
        true
    }

    /// The backend was asked for `region`, whose fill mark was clear: fills
    /// it if a send lends it (after a reconnection, the backend's new ring
    /// has every mark clear).
    fn region_wanted(&mut self, region: u8) {
        let lent: Vec<(u8, u8)> = self
            .lent
            .keys()
            .filter(|&&(id, _)| id == region)
            .copied()
            .collect();
        for (id, seqnum) in lent {
            tracing::debug!(
                index = self.index,
                region,
                "the backend asks for a window's data"
            );
            self.fill(RdmaWindow {
                id,
                seqnum,
                offset: 0,
            });
        }
    }

    /// Writes `region`'s fill mark as it stands: set while a send lends it
    /// and its data is in it.
    fn publish_fill_mark(&self, region: u8) {
        let filled = self
            .lent
            .keys()
            .any(|k| k.0 == region && !self.unfilled.contains(k));
        if let Some(ch) = self.channel.as_ref() {
            ch.set_fill_mark(region, filled);
        }
    }

    /// The send lending `window` is over.
    pub(crate) fn release(&mut self, reg: &mut dyn Registrar, window: RdmaWindow) {
        self.lent_data.remove(&(window.id, window.seqnum));
        self.unfilled.remove(&(window.id, window.seqnum));
        let lent = self.lent.remove(&(window.id, window.seqnum));
        self.publish_fill_mark(window.id);
        if let Some(lease) = lent {
            let (cache, mut via) = self.split(reg);
            if let Err(e) = cache.release(&mut via, lease) {
                tracing::warn!(index = self.index, %e, "releasing a send window");
            }
            self.room_freed = true;
        }
    }

    /// The application's `[addr, addr + len)` is going away.
    pub(crate) fn invalidate(&mut self, reg: &mut dyn Registrar, addr: usize, len: usize) {
        let (cache, mut via) = self.split(reg);
        if let Err(e) = cache.invalidate(&mut via, addr, len) {
            tracing::warn!(index = self.index, %e, "invalidating cached windows");
        }
    }

    /// Starts pulling `length` bytes of `source`'s `window` into `dest`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pull(
        &mut self,
        reg: &mut dyn Registrar,
        mailbox: &Mailbox,
        id: RequestId,
        source: PeerAddr,
        window: RdmaWindow,
        dest: &Segments,
        length: u32,
    ) -> PullProgress {
        if length == 0 {
            return PullProgress::Done(Ok(()));
        }
        if length as usize > dest.len() {
            return PullProgress::Done(Err(Status::BadRdmawin));
        }
        let Some(session) = self.sessions.get(source) else {
            tracing::warn!(
                index = self.index,
                ?source,
                "no session known for the sender of a LARGE message"
            );
            return PullProgress::Done(Err(Status::EndpointUnreachable));
        };
        let waiting = WaitingPull {
            id,
            dest: dest.clone(),
            length,
            source,
            session,
            window,
        };
        // Behind pulls already starved: the room given back goes to them first.
        if !self.starved.is_empty() && !self.down {
            self.starved.push_back((waiting, Instant::now()));
            return PullProgress::Started;
        }
        let acquired = self.acquire(reg, windows::key(dest).0, length as usize);
        let Ok(lease) = acquired else {
            // Not connected while the link is not down yet: the device is going away (a
            // suspend for a migration) and its notice is on its way; the pull waits for
            // the reconnection as it would a moment later, instead of failing the receive.
            let going = matches!(acquired, Err(xmx_frontend::Error::NotConnected(_)));
            if self.down || going {
                // A suspend, a migration or a backend restart: the receive completes once
                // the endpoint is back, as MX completes it once the peer is reachable.
                self.waiting.push_back(waiting);
                return PullProgress::Started;
            }
            // MX registers any number of receives at once; a guest's grants run out (an
            // MPI window of 16 MiB receives, or several ranks in one guest): this one
            // waits for room, for a bounded time.
            tracing::debug!(
                index = self.index,
                len = length,
                "a pull waits for room to register"
            );
            self.starve(waiting, Instant::now());
            return PullProgress::Started;
        };
        match self.issue(waiting.into_sink(lease), mailbox, reg) {
            Ok(()) => PullProgress::Started,
            Err(sink) => {
                let (cache, mut via) = self.split(reg);
                let _ = cache.release(&mut via, sink.lease);
                PullProgress::Done(Err(Status::Aborted))
            }
        }
    }

    /// Posts the PULL of `sink`, or holds it back until the send ring has room; gives it
    /// back if it cannot be posted at all (no window, link down).
    fn issue(
        &mut self,
        sink: LinkSink,
        _mailbox: &Mailbox,
        _reg: &mut dyn Registrar,
    ) -> Result<(), LinkSink> {
        // Behind pulls already waiting: receives are pulled in the order they took them.
        // While the link is down (a suspend, a migration, a backend restarting) a pull
        // waits too: the re-mapping after the reconnection issues it; failing it would
        // fail a receive that MX completes once the peer is reachable again.
        if !self.deferred.is_empty() || self.down {
            self.deferred.push_back(sink);
            return Ok(());
        }
        match self.post_pull(&sink) {
            PullPost::Posted(tag) => {
                self.sinks.insert(tag, sink);
                Ok(())
            }
            PullPost::RingFull => {
                self.deferred.push_back(sink);
                Ok(())
            }
            PullPost::Failed => Err(sink),
        }
    }

    /// One try at posting the PULL request of `sink`, without waiting. Its completion is
    /// taken in under the link's lock, after the post: the caller records the sink
    /// under the returned tag before that.
    fn post_pull(&mut self, sink: &LinkSink) -> PullPost {
        if self.down {
            return PullPost::Failed;
        }
        let Some(local) = self.cache.window(sink.lease).map(|w| w.region_id()) else {
            return PullPost::Failed;
        };
        let tag = self.tag();
        let request = engine_msgs::pull_request(
            tag,
            sink.source,
            sink.session,
            sink.window,
            local,
            sink.length,
        );
        let Some(channel) = self.channel.as_mut() else {
            return PullPost::Failed;
        };
        match channel.push(&request) {
            Ok(()) => {
                if let Err(e) = channel.flush() {
                    tracing::warn!(index = self.index, %e, "notifying the backend");
                }
                PullPost::Posted(tag)
            }
            Err(xmx_frontend::Error::Ring(RingError::Full)) => {
                // Publish what waits, so the backend makes room.
                let _ = channel.flush();
                PullPost::RingFull
            }
            Err(e) => {
                tracing::warn!(index = self.index, %e, "pull request not posted");
                PullPost::Failed
            }
        }
    }

    /// Posts the pulls held back, in order, while the send ring has room.
    /// Pulls held back longer than [`PULL_HELD_MAX`] fail with `Aborted` (or the refusal
    /// that held them).
    fn post_deferred(&mut self, mailbox: &Mailbox, reg: &mut dyn Registrar) {
        if self.down {
            // Their time waiting for room starts once there is a ring again.
            return;
        }
        let mut expired = Vec::new();
        while let Some(mut sink) = self.deferred.pop_front() {
            let since = *sink.held_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= PULL_HELD_MAX {
                tracing::warn!(
                    index = self.index,
                    "a pull found no room in time; its receive fails"
                );
                expired.push(self.finish_pull(sink, Err(Status::Aborted), reg));
                continue;
            }
            match self.post_pull(&sink) {
                PullPost::Posted(tag) => {
                    self.sinks.insert(tag, sink);
                }
                PullPost::RingFull | PullPost::Failed => {
                    // Down: the re-mapping after a reconnection issues it again.
                    self.deferred.push_front(sink);
                    break;
                }
            }
        }
        if !expired.is_empty() {
            mailbox.put_pulls(expired);
        }
    }

    /// Deregisters the cached windows nothing has used for a while (so other processes of
    /// the guest find grants to register with); returns when the next one is due.
    pub(crate) fn expire_idle_windows(&mut self, reg: &mut dyn Registrar) -> Option<Instant> {
        let now = Instant::now();
        if self.cache.next_expiry().is_some_and(|t| now >= t) {
            let (cache, mut via) = self.split(reg);
            match cache.expire_idle(&mut via, now) {
                Ok(0) => {}
                Ok(n) => {
                    tracing::debug!(index = self.index, n, "unused windows expired");
                    self.room_freed = true;
                }
                Err(e) => tracing::warn!(index = self.index, %e, "expiring unused windows"),
            }
        }
        self.cache.next_expiry()
    }

    /// The guest is short of grants (its daemon says so): gives back every window the
    /// cache keeps unused, for whoever waits for their room.
    pub(crate) fn give_back_unused_windows(&mut self, reg: &mut dyn Registrar) {
        // Grants kept for windows not registered yet (registration without the cache) go
        // too: ending them returns their room at once.
        if let Some(d) = self.own_grants.as_mut() {
            d.pool.clear();
        }
        let (cache, mut via) = self.split(reg);
        match cache.drop_unused(&mut via) {
            Ok(0) => {}
            Ok(n) => {
                tracing::debug!(index = self.index, n, "unused windows given back");
                self.room_freed = true;
            }
            Err(e) => tracing::warn!(index = self.index, %e, "giving back unused windows"),
        }
    }

    /// Whether pulls wait for room in the send ring or to register: whoever drives the
    /// link looks at it again soon rather than sleeping until an event.
    pub(crate) fn has_deferred_pulls(&self) -> bool {
        (!self.deferred.is_empty() || !self.starved.is_empty()) && !self.down
    }

    /// Queues a pull whose destination found no room to register (first refused at
    /// `since`); it tries again when room is given back or after [`STARVED_RETRY`].
    fn starve(&mut self, pull: WaitingPull, since: Instant) {
        self.room_freed = false;
        self.starved_retry_at = Some(Instant::now() + STARVED_RETRY);
        self.starved.push_back((pull, since));
    }

    /// Registers the starved pulls' destinations, in order, as room is given back (by
    /// this endpoint's pulls and sends, or by other processes of the guest), and issues
    /// their pulls. One that still finds no room after [`PULL_HELD_MAX`] fails with
    /// `MX_STATUS_NO_RESOURCES`: room that never comes must not leave the receive
    /// waiting without a bound.
    fn feed_starved(&mut self, mailbox: &Mailbox, reg: &mut dyn Registrar) {
        if self.down || self.starved.is_empty() {
            return;
        }
        let retry_due = self.starved_retry_at.is_none_or(|t| Instant::now() >= t);
        if !self.room_freed && !retry_due {
            return;
        }
        self.room_freed = false;
        let mut failed = Vec::new();
        while let Some((w, since)) = self.starved.pop_front() {
            let (addr, len) = (windows::key(&w.dest).0, w.length as usize);
            let Ok(lease) = self.acquire(reg, addr, len) else {
                if since.elapsed() < PULL_HELD_MAX {
                    self.starved.push_front((w, since));
                    self.starved_retry_at = Some(Instant::now() + STARVED_RETRY);
                    break;
                }
                tracing::warn!(
                    index = self.index,
                    len,
                    "a LARGE receive found no room to register in time; it fails"
                );
                failed.push((w.id, Err(Status::NoResources)));
                continue;
            };
            let sink = w.into_sink(lease);
            if let Err(sink) = self.issue(sink, mailbox, reg) {
                let (cache, mut via) = self.split(reg);
                let _ = cache.release(&mut via, sink.lease);
                failed.push((sink.id, Err(Status::Aborted)));
            }
        }
        if !failed.is_empty() {
            mailbox.put_pulls(failed);
        }
    }

    /// Takes the endpoint re-opened after a reconnection: remaps the channel,
    /// forgets what the backend forgot (slots in flight; windows, unless the
    /// daemon registered them again) and pulls again what was being pulled. A
    /// send lent out keeps its window when the daemon kept the regions, so a
    /// peer's pull of it succeeds once the backend is back.
    pub(crate) fn remap(
        &mut self,
        client: &mut FrontdClient,
        h: EndpointHandoff,
        mailbox: &Mailbox,
    ) -> Remapped {
        let Some(channel) = self.channel.as_mut() else {
            return Remapped::NotTaken;
        };
        let new_session = h.session_id;
        let daemon_kept = h.regions_kept;
        let regions_moved = h.regions_moved;
        if let Err(e) = client.remap(channel, h) {
            tracing::warn!(index = self.index, %e, "re-opened endpoint not taken");
            return Remapped::NotTaken;
        }
        if new_session != self.session {
            // Peers address the endpoint (and the acks of its messages) by the old
            // session, which the backend now refuses: nothing it has in flight would
            // complete. It is lost, and its requests fail now rather than at their
            // timeouts.
            tracing::warn!(
                index = self.index,
                old = self.session,
                new = new_session,
                "the backend gave the endpoint a new session; the endpoint is lost"
            );
            return Remapped::SessionChanged;
        }
        self.slots.reset();
        // The daemon registers again the regions it registered; the link those it
        // registered itself.
        let regions_kept = match self.own_grants.is_some() {
            false if daemon_kept && regions_moved => self.adopt_moved_regions(client),
            false => daemon_kept,
            true => self.register_own_again(),
        };
        if !regions_kept {
            self.cache.forget_endpoint(self.index);
            self.lost_in_reconnection.extend(self.lent.keys());
            self.lent.clear();
            let max = self.max_regions;
            if let Some(d) = self.own_grants.as_mut() {
                // The new backend knows none of the link's regions.
                d.free_ids = (0..max).rev().map(|i| i as u8).collect();
                d.stash.clear();
                d.registered.clear();
            }
            self.lent_data.clear();
            self.unfilled.clear();
        }
        // The new ring's marks are clear: say again which regions hold their data.
        let filled: FxHashSet<u8> = self
            .lent
            .keys()
            .filter(|k| !self.unfilled.contains(k))
            .map(|k| k.0)
            .collect();
        for id in filled {
            self.publish_fill_mark(id);
        }
        self.down = false;
        let mut sinks: Vec<LinkSink> = self.sinks.drain().map(|(_, s)| s).collect();
        sinks.extend(self.deferred.drain(..));
        // In the order their receives took them: those that had a window, then those
        // asked while down.
        let mut again = VecDeque::new();
        for sink in sinks {
            if regions_kept {
                // The window is registered again under its id: the pull starts over into it.
                if let Err(sink) = self.issue(sink, mailbox, client) {
                    let (cache, mut via) = self.split(client);
                    let _ = cache.release(&mut via, sink.lease);
                    mailbox.put_pulls([(sink.id, Err(Status::Aborted))]);
                }
                continue;
            }
            // Its window went with the backend that knew it.
            again.push_back(WaitingPull {
                id: sink.id,
                dest: sink.dest,
                length: sink.length,
                source: sink.source,
                session: sink.session,
                window: sink.window,
            });
        }
        again.extend(self.waiting.drain(..));
        again.extend(self.starved.drain(..).map(|(w, _)| w));
        for w in again {
            let (addr, len) = (windows::key(&w.dest).0, w.length as usize);
            let Ok(lease) = self.acquire(client, addr, len) else {
                self.starve(w, Instant::now());
                continue;
            };
            let sink = w.into_sink(lease);
            if let Err(sink) = self.issue(sink, mailbox, client) {
                let (cache, mut via) = self.split(client);
                let _ = cache.release(&mut via, sink.lease);
                mailbox.put_pulls([(sink.id, Err(Status::Aborted))]);
            }
        }
        tracing::info!(index = self.index, "endpoint re-opened and remapped");
        Remapped::Resumed
    }

    /// The daemon registered the endpoint's regions again over new pages (the domain
    /// moved and its grants did not follow): each window goes on over its region's new
    /// pages, keeping what it holds, before anything naming it is posted. True if every
    /// one did.
    fn adopt_moved_regions(&mut self, client: &mut FrontdClient) -> bool {
        let index = self.index;
        let mut moved = 0usize;
        for window in self.cache.windows_mut(index) {
            if let Err(e) = client.refresh_window(window) {
                tracing::warn!(index, region = window.region_id(), %e, "a window did not follow its region");
                return false;
            }
            moved += 1;
        }
        tracing::info!(
            index,
            windows = moved,
            "windows moved onto their regions' new pages"
        );
        true
    }

    /// Waits (up to `timeout`) until the backend has taken every request
    /// posted, so that frames the core sent last (the ack of a final NOTIFY,
    /// say) leave before the endpoint is closed under them; what arrives
    /// meanwhile is taken in. True if the ring emptied.
    pub(crate) fn flush_sends(
        &mut self,
        mailbox: &Mailbox,
        reg: &mut dyn Registrar,
        timeout: Duration,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let free = match self.channel.as_mut() {
                Some(c) if !self.down => c.free_send_slots().unwrap_or(self.ring_slots),
                _ => return false,
            };
            if free >= self.ring_slots {
                return true;
            }
            if Instant::now() >= deadline {
                tracing::debug!(
                    index = self.index,
                    in_flight = self.ring_slots - free,
                    "closing with requests in flight"
                );
                return false;
            }
            if self.take_in(mailbox, reg) == 0 {
                std::thread::yield_now();
            }
        }
    }

    /// The endpoint is closing: forget its pulls and windows (nothing is
    /// copied into the application's memory from now on) and give the
    /// channel back to be closed.
    pub(crate) fn close(&mut self) -> Option<EndpointChannel> {
        let s = self.cache.stats();
        tracing::info!(
            index = self.index,
            hits = s.hits,
            misses = s.misses,
            registrations = s.registrations,
            "registration cache"
        );
        tracing::info!(
            index = self.index,
            bytes = self.pulled_out.0,
            early = self.pulled_out.1,
            "LARGE receives copied out of their windows"
        );
        tracing::info!(
            index = self.index,
            copies = self.filled_in.0,
            bytes = self.filled_in.1,
            "LARGE sends copied into their windows"
        );
        tracing::info!(
            index = self.index,
            by_waiter = self.signals_taken.0,
            by_driver = self.signals_taken.1,
            "port notifications taken"
        );
        self.sinks.clear();
        self.deferred.clear();
        self.waiting.clear();
        self.starved.clear();
        self.lent.clear();
        self.lent_data.clear();
        self.unfilled.clear();
        self.lost_in_reconnection.clear();
        self.cache.forget_endpoint(self.index);
        self.down = true;
        self.channel.take()
    }

    /// The endpoint is gone for good (the daemon could not re-open it).
    pub(crate) fn lose(&mut self) {
        self.set_down();
        drop(self.close());
    }
}

/// The registrar a cache operation of the link uses.
struct Via<'a> {
    outer: &'a mut dyn Registrar,
    own_grants: Option<OwnGrantsRegistrar<'a>>,
    /// The link registers with its own grants: never through `outer` (the ids are the link's).
    own_grants_mode: bool,
    /// While the link is down: its own registrations, to forget a window dropped meanwhile.
    registered: Option<&'a mut std::collections::BTreeMap<u8, OwnRegion>>,
}

impl Registrar for Via<'_> {
    fn register(&mut self, endpoint: u8, length: u32) -> xmx_frontend::Result<RegionWindow> {
        match (&mut self.own_grants, self.own_grants_mode) {
            (Some(d), _) => d.register(endpoint, length),
            (None, true) => Err(xmx_frontend::Error::NotConnected(
                "the endpoint is disconnected from its backend".into(),
            )),
            (None, false) => self.outer.register(endpoint, length),
        }
    }

    fn deregister(&mut self, window: RegionWindow) -> xmx_frontend::Result<()> {
        match (&mut self.own_grants, self.own_grants_mode) {
            (Some(d), _) => d.deregister(window),
            // The backend forgot the region with the connection; the grants end here, and
            // it is not registered again after the reconnection.
            (None, true) => {
                if let Some(r) = self.registered.as_mut() {
                    r.remove(&window.region_id());
                }
                drop(window);
                Ok(())
            }
            (None, false) => self.outer.deregister(window),
        }
    }
}

/// A link registering windows itself, for the length of one cache operation.
struct OwnGrantsRegistrar<'a> {
    d: &'a mut OwnGrants,
    channel: &'a mut EndpointChannel,
    next_tag: &'a mut u32,
    index: u8,
    session: u32,
}

impl OwnGrantsRegistrar<'_> {
    fn tag(&mut self) -> u32 {
        *self.next_tag = self.next_tag.wrapping_add(1);
        *self.next_tag
    }

    /// Posts `op`, waiting a while for room; false if it could not be.
    fn post(&mut self, tag: u32, op: SendOp) -> bool {
        let request = SendRequest {
            tag,
            route: Route::default(),
            op,
        };
        let deadline = Instant::now() + POST_WAIT;
        loop {
            match self.channel.push(&request) {
                Ok(()) => {
                    if let Err(e) = self.channel.flush() {
                        tracing::warn!(index = self.index, %e, "notifying the backend");
                    }
                    return true;
                }
                Err(xmx_frontend::Error::Ring(RingError::Full)) => {
                    // The backend takes requests whether or not we take events in.
                    let _ = self.channel.flush();
                    if Instant::now() >= deadline {
                        return false;
                    }
                    std::thread::yield_now();
                }
                Err(e) => {
                    tracing::warn!(index = self.index, %e, "region request not posted");
                    return false;
                }
            }
        }
    }

    /// Takes events in until the completion of `tag` arrives (what else arrives is kept for
    /// the link's next take-in), or `REGISTER_WAIT` passes.
    fn completion(&mut self, tag: u32) -> Option<Result<u32, Status>> {
        let start = Instant::now();
        let deadline = start + REGISTER_WAIT;
        let spin_until = start + self.d.spin;
        loop {
            let mut found = None;
            loop {
                let event = match self.channel.next_event() {
                    Ok(Some(e)) => e,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(index = self.index, %e, "event ring unusable");
                        return None;
                    }
                };
                let ch: &EndpointChannel = self.channel;
                let converted =
                    engine_msgs::incoming(self.index, self.session, &event, |slot, len| {
                        let mut buf = vec![0u8; usize::from(len)];
                        ch.read_recv_queue(slot, 0, &mut buf).ok()?;
                        Some(buf)
                    });
                match converted {
                    Ok(Inbound::Completed { tag: t, result }) if t == tag => found = Some(result),
                    Ok(i) => self.d.stash.push(i),
                    Err(e) => tracing::warn!(index = self.index, %e, "event dropped"),
                }
            }
            if let Err(e) = self.channel.release_events() {
                tracing::warn!(index = self.index, %e, "handing event slots back");
            }
            if found.is_some() {
                return found;
            }
            if Instant::now() >= deadline || self.channel.is_disconnected() {
                return None;
            }
            // The backend answers in microseconds when it reuses a kept mapping (no
            // hypervisor call): poll as a wait does, yielding the core each round, then
            // sleep until it signals (a fresh mapping takes it a hypervisor call, whose
            // core the poll would take). Armed first, so the next event rings; the driver
            // thread may take that notification, hence the short bound.
            if Instant::now() < spin_until {
                std::thread::yield_now();
                continue;
            }
            match self.channel.arm_events() {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => tracing::debug!(index = self.index, %e, "arming the event ring"),
            }
            let mut fds = [PollFd::new(self.channel.port_fd(), PollFlags::POLLIN)];
            let _ = poll(&mut fds, PollTimeout::from(1u8));
        }
    }
}

impl Registrar for OwnGrantsRegistrar<'_> {
    fn register(&mut self, endpoint: u8, length: u32) -> xmx_frontend::Result<RegionWindow> {
        let id = self
            .d
            .free_ids
            .pop()
            .ok_or(xmx_frontend::Error::Exhausted("region id".into()))?;
        let granted = xmx_frontend::own_grants::grant_region(
            self.d.gnttab.as_ref(),
            &mut self.d.pool,
            self.d.backend,
            endpoint,
            id,
            length,
        );
        // Grants that fail to register are not pooled: a REGISTER left unanswered may
        // still be served, and its DEREGISTER may never be.
        let (window, request, grants) = match granted {
            Ok(g) => g,
            Err(e) => {
                self.d.free_ids.push(id);
                return Err(e);
            }
        };
        let tag = self.tag();
        if !self.post(tag, SendOp::Register(request)) {
            self.d.free_ids.push(id);
            return Err(xmx_frontend::Error::Exhausted("send ring slot".into()));
        }
        match self.completion(tag) {
            Some(Ok(_)) => {
                self.d.registered.insert(id, OwnRegion { request, grants });
                Ok(window)
            }
            Some(Err(status)) => {
                self.d.free_ids.push(id);
                Err(xmx_frontend::Error::Invalid(format!(
                    "the backend refused region {id}: {status}"
                )))
            }
            None => {
                // It may still be served: deregister it behind it (the ring is in order)
                // before the id is used again.
                let tag = self.tag();
                if self.post(tag, SendOp::Deregister { region_id: id }) {
                    self.d.free_ids.push(id);
                }
                Err(xmx_frontend::Error::NotConnected(format!(
                    "no answer to registering region {id}"
                )))
            }
        }
    }

    fn deregister(&mut self, window: RegionWindow) -> xmx_frontend::Result<()> {
        let id = window.region_id();
        let region = self.d.registered.remove(&id);
        let tag = self.tag();
        // Not waited for: a later registration of the id comes after it on the ring.
        let posted = self.post(tag, SendOp::Deregister { region_id: id });
        drop(window);
        if posted {
            // Pooled: whatever registers these grants next comes after the DEREGISTER on
            // the ring. (Not posted, the backend keeps the region mapped: the grants end,
            // and the pages are freed once it unmaps them.)
            if let Some(r) = region {
                self.d.pool.put(r.grants);
            }
            self.d.free_ids.push(id);
            Ok(())
        } else {
            // The backend keeps the region until the endpoint closes; its id is not reused.
            Err(xmx_frontend::Error::Exhausted("send ring slot".into()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xmx_wire::msg::{Pull, RndvSend};

    #[test]
    fn only_an_rndv_of_a_returned_window_is_held_back() {
        let rndv = |region_id, region_seqnum| {
            SendOp::Rndv(RndvSend {
                region_id,
                region_seqnum,
                length: 70_000,
                ..RndvSend::default()
            })
        };
        let lent: FxHashMap<(u8, u8), ()> = [((22, 7), ())].into_iter().collect();
        let lost: FxHashSet<(u8, u8)> = [(5, 1)].into_iter().collect();
        assert!(!announces_returned_window(&rndv(22, 7), &lent, &lost));
        // The same region under an older generation: a resend of a send that ended.
        assert!(announces_returned_window(&rndv(22, 6), &lent, &lost));
        assert!(announces_returned_window(&rndv(23, 7), &lent, &lost));
        assert!(!announces_returned_window(&rndv(5, 1), &lent, &lost));
        let pull = SendOp::Pull(Pull::default());
        assert!(!announces_returned_window(&pull, &lent, &lost));
    }
}

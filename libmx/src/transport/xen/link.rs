//! One endpoint's shared rings as the library drives them.
//!
//! A [`Link`] owns the endpoint's [`EndpointChannel`] and what the library
//! keeps about requests it posted there: send-queue slots of MEDIUM messages
//! in flight, LARGE windows lent to peers, pulls in progress. It sits behind
//! a mutex shared by the application threads (which post requests and may
//! take events in while they poll) and the driver thread (which takes events
//! in when the backend signals the port). Whoever takes events in converts
//! them at once: frames and finished pulls go to the endpoint's [`Mailbox`],
//! MEDIUM fragments are copied out of the receive queue before their event
//! slot is handed back.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use xmx_frontend::frontd::FrontdClient;
use xmx_frontend::{EndpointChannel, EndpointHandoff, Lease, RegionCache, Registrar};
use xmx_mx::{Frame, PeerAddr, RdmaWindow, RequestId, Status};
use xmx_wire::msg::SendRequest;
use xmx_wire::ring::RingError;

use super::slots::SendSlots;
use super::windows;
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
pub const CACHE_CAPACITY: usize = 32;

/// Counters of one link, for the logs and the tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkCounters {
    /// Requests posted on the send ring.
    pub posted: u64,
    /// Requests dropped: no room in time, or the link was down.
    pub dropped: u64,
    /// Events that could not become frames.
    pub unreadable: u64,
    /// Requests the backend refused (a lost frame for the core).
    pub refused: u64,
    /// Pulls finished (successfully or not).
    pub pulls: u64,
    /// Re-mappings after a reconnection.
    pub remaps: u64,
}

/// A pull in progress: the receive's buffer and the window the data lands in.
struct Sink {
    id: RequestId,
    lease: Lease,
    dest: Segments,
    length: u32,
    source: PeerAddr,
    session: u32,
    window: RdmaWindow,
}

/// An endpoint's rings and requests; see the module documentation.
pub struct Link {
    channel: Option<EndpointChannel>,
    index: u8,
    /// The session the protocol core was opened with.
    session: u32,
    slots: SendSlots,
    next_tag: u32,
    sessions: PeerSessions,
    cache: RegionCache,
    /// Send windows lent to peers, by (region id, seqnum).
    lent: HashMap<(u8, u8), Lease>,
    /// The application's buffer behind each lent window (direct-channel
    /// pulls read it).
    lent_data: HashMap<(u8, u8), Segments>,
    sinks: HashMap<u32, Sink>,
    generations: [u8; 256],
    max_send_windows: usize,
    /// Send-ring slots when nothing is in flight.
    ring_slots: u32,
    /// The backend let the endpoint go; nothing is posted until it is back.
    down: bool,
    counters: LinkCounters,
}

impl Link {
    /// The link of an opened endpoint. `max_regions` is the backend's limit of
    /// regions per endpoint; `rcache` keeps windows registered across messages.
    pub fn new(mut channel: EndpointChannel, max_regions: u32, rcache: bool) -> Link {
        let index = channel.endpoint();
        // A fresh ring: every slot is free.
        let ring_slots = channel.free_send_slots().unwrap_or(0);
        let session = channel.session_id();
        let slots = SendSlots::new(channel.geometry().send_queue);
        let max_regions = (max_regions as usize).min(256);
        Link {
            channel: Some(channel),
            index,
            session,
            slots,
            next_tag: 0,
            sessions: PeerSessions::default(),
            cache: RegionCache::new(rcache, CACHE_CAPACITY.min(max_regions.max(1))),
            lent: HashMap::new(),
            lent_data: HashMap::new(),
            sinks: HashMap::new(),
            generations: [0; 256],
            max_send_windows: max_regions.saturating_sub(PULL_RESERVE).max(1),
            ring_slots,
            down: false,
            counters: LinkCounters::default(),
        }
    }

    /// The endpoint index.
    pub fn index(&self) -> u8 {
        self.index
    }

    /// The session the protocol core uses.
    pub fn session(&self) -> u32 {
        self.session
    }

    /// Counters so far.
    pub fn counters(&self) -> LinkCounters {
        self.counters
    }

    /// Hits and misses of the registration cache.
    pub fn cache_stats(&self) -> xmx_frontend::RcacheStats {
        self.cache.stats()
    }

    /// The port's descriptor, while the link is up.
    pub fn port_fd(&self) -> Option<RawFd> {
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
    pub fn post(&mut self, out: Outbound, mailbox: &Mailbox, reg: &mut dyn Registrar) {
        if self.down || self.channel.is_none() {
            self.counters.dropped += 1;
            return;
        }
        let tag = self.tag();
        let request = match out {
            Outbound::Request(mut r) => {
                r.tag = tag;
                r
            }
            Outbound::Medium(m) => {
                let Some(slots) = self.take_slots(m.fragments.len(), mailbox, reg) else {
                    self.counters.dropped += 1;
                    tracing::debug!(
                        index = self.index,
                        "no send-queue slot in time; MEDIUM dropped"
                    );
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
                        self.counters.dropped += 1;
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
        let deadline = Instant::now() + POST_WAIT;
        while let Some(channel) = self.channel.as_mut() {
            match channel.push(request) {
                Ok(()) => {
                    if let Err(e) = channel.flush() {
                        tracing::warn!(index = self.index, %e, "notifying the backend");
                    }
                    self.counters.posted += 1;
                    return true;
                }
                Err(xmx_frontend::Error::Ring(RingError::Full)) => {
                    // Publish what waits, so the backend makes room.
                    let _ = channel.flush();
                    if self.down || Instant::now() >= deadline {
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
        self.counters.dropped += 1;
        false
    }

    /// Takes in every event waiting: frames and finished pulls go to
    /// `mailbox`, completions free what their request held. Returns how many
    /// things were delivered to the mailbox.
    pub fn take_in(&mut self, mailbox: &Mailbox, reg: &mut dyn Registrar) -> usize {
        let Some(channel) = self.channel.as_mut() else {
            return 0;
        };
        let mut inbound = Vec::new();
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
                    self.counters.unreadable += 1;
                    tracing::warn!(index = self.index, %e, "event dropped");
                }
            }
        }
        if let Err(e) = channel.release_events() {
            tracing::warn!(index = self.index, %e, "handing event slots back");
        }
        let mut frames = Vec::new();
        let mut pulls = Vec::new();
        for i in inbound {
            match i {
                Inbound::Frame(f) => {
                    self.sessions.observe(&f);
                    frames.push(f);
                }
                Inbound::Completed { tag, result } => {
                    if let Some(sink) = self.sinks.remove(&tag) {
                        pulls.push(self.finish_pull(sink, result, reg));
                    } else {
                        self.slots.complete(tag);
                        if let Err(status) = result {
                            // Lost, as on a wire: the core sends it again.
                            self.counters.refused += 1;
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
        }
        delivered
    }

    /// Takes events in, then arms the event ring so the backend signals the
    /// port at the next one (taking in again what raced with the arming).
    pub fn take_in_and_arm(&mut self, mailbox: &Mailbox, reg: &mut dyn Registrar) -> usize {
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

    /// Consumes the port's notification after the driver's poll saw it.
    pub fn take_notification(&mut self) {
        let closed = match &self.channel {
            Some(c) => {
                if let Err(e) = c.take_notification() {
                    tracing::debug!(index = self.index, %e, "taking a notification");
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
    pub fn set_down(&mut self) {
        if !self.down {
            tracing::info!(index = self.index, "endpoint disconnected from the backend");
        }
        self.down = true;
    }

    fn finish_pull(
        &mut self,
        sink: Sink,
        result: Result<u32, Status>,
        reg: &mut dyn Registrar,
    ) -> (RequestId, Result<(), Status>) {
        self.counters.pulls += 1;
        let outcome = match result {
            Ok(_) => {
                let copied = self
                    .cache
                    .window(sink.lease)
                    .is_some_and(|w| windows::drain(w, &sink.dest, sink.length as usize));
                if copied {
                    Ok(())
                } else {
                    tracing::warn!(index = self.index, "pulled data could not be copied out");
                    Err(Status::Aborted)
                }
            }
            Err(s) => Err(s),
        };
        if let Err(e) = self.cache.release(reg, sink.lease) {
            tracing::warn!(index = self.index, %e, "releasing a pull window");
        }
        (sink.id, outcome)
    }

    /// A window for `len` bytes of the buffer at `addr`: cached, or registered
    /// now; when registering fails, unused cached windows are dropped and it is
    /// tried once more.
    fn acquire(&mut self, reg: &mut dyn Registrar, addr: usize, len: usize) -> Option<Lease> {
        match self.cache.acquire(reg, self.index, addr, len) {
            Ok(l) => return Some(l),
            Err(e) => {
                tracing::debug!(index = self.index, %e, "registering a window; dropping unused ones")
            }
        }
        if let Err(e) = self.cache.flush(reg) {
            tracing::warn!(index = self.index, %e, "dropping cached windows");
        }
        match self.cache.acquire(reg, self.index, addr, len) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(index = self.index, %e, len, "no window for a LARGE message");
                None
            }
        }
    }

    /// Learns the peer's session from a connect that came another way (a
    /// direct channel).
    pub fn observe(&mut self, frame: &Frame<Vec<u8>>) {
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
    pub unsafe fn read_lent(
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
            // `n` bytes the caller vouches for.
            unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, dst.add(at), len) };
            at += len;
        });
        at == n
    }

    /// `peer`'s session is known without a connect (this endpoint's own).
    pub fn learn_session(&mut self, peer: PeerAddr, session: u32) {
        self.sessions.learn(peer, session);
    }

    /// Lends a LARGE send's data to peers: copied into a window they pull from.
    pub fn register(&mut self, reg: &mut dyn Registrar, data: &Segments) -> Option<RdmaWindow> {
        if data.is_empty() || self.down || self.channel.is_none() {
            return None;
        }
        if self.lent.len() >= self.max_send_windows {
            return None;
        }
        let (addr, len) = windows::key(data);
        let lease = self.acquire(reg, addr, len)?;
        let window = self.cache.window(lease);
        let id = window.map(|w| w.region_id())?;
        if !window.is_some_and(|w| windows::fill(w, data)) {
            tracing::warn!(
                index = self.index,
                "LARGE data could not be copied into its window"
            );
            let _ = self.cache.release(reg, lease);
            return None;
        }
        let seqnum = self.generations[usize::from(id)].wrapping_add(1);
        self.generations[usize::from(id)] = seqnum;
        self.lent.insert((id, seqnum), lease);
        self.lent_data.insert((id, seqnum), data.clone());
        Some(RdmaWindow {
            id,
            seqnum,
            offset: 0,
        })
    }

    /// The send lending `window` is over.
    pub fn release(&mut self, reg: &mut dyn Registrar, window: RdmaWindow) {
        self.lent_data.remove(&(window.id, window.seqnum));
        if let Some(lease) = self.lent.remove(&(window.id, window.seqnum)) {
            if let Err(e) = self.cache.release(reg, lease) {
                tracing::warn!(index = self.index, %e, "releasing a send window");
            }
        }
    }

    /// The application's `[addr, addr + len)` is going away.
    pub fn invalidate(&mut self, reg: &mut dyn Registrar, addr: usize, len: usize) {
        if let Err(e) = self.cache.invalidate(reg, addr, len) {
            tracing::warn!(index = self.index, %e, "invalidating cached windows");
        }
    }

    /// Starts pulling `length` bytes of `source`'s `window` into `dest`.
    #[allow(clippy::too_many_arguments)]
    pub fn pull(
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
        let Some(lease) = self.acquire(reg, windows::key(dest).0, length as usize) else {
            return PullProgress::Done(Err(Status::NoResources));
        };
        let sink = Sink {
            id,
            lease,
            dest: dest.clone(),
            length,
            source,
            session,
            window,
        };
        match self.issue(sink, mailbox, reg) {
            Ok(()) => PullProgress::Started,
            Err(sink) => {
                let _ = self.cache.release(reg, sink.lease);
                PullProgress::Done(Err(Status::Aborted))
            }
        }
    }

    /// Posts the PULL of `sink`; gives it back if it could not be posted.
    fn issue(
        &mut self,
        sink: Sink,
        mailbox: &Mailbox,
        reg: &mut dyn Registrar,
    ) -> Result<(), Sink> {
        let Some(local) = self.cache.window(sink.lease).map(|w| w.region_id()) else {
            return Err(sink);
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
        // Its completion is taken in under this lock, after the post: the
        // sink is in place by then.
        if !self.push(&request, mailbox, reg) {
            return Err(sink);
        }
        self.sinks.insert(tag, sink);
        Ok(())
    }

    /// Takes the endpoint re-opened after a reconnection: remaps the channel,
    /// forgets what the backend forgot (slots in flight; windows, unless the
    /// daemon registered them again) and pulls again what was being pulled. A
    /// send lent out keeps its window when the daemon kept the regions, so a
    /// peer's pull of it succeeds once the backend is back.
    pub fn remap(&mut self, client: &mut FrontdClient, h: EndpointHandoff, mailbox: &Mailbox) {
        let Some(channel) = self.channel.as_mut() else {
            return;
        };
        let new_session = h.session_id;
        let regions_kept = h.regions_kept;
        if let Err(e) = client.remap(channel, h) {
            tracing::warn!(index = self.index, %e, "re-opened endpoint not taken");
            return;
        }
        self.counters.remaps += 1;
        if new_session != self.session {
            tracing::warn!(
                index = self.index,
                old = self.session,
                new = new_session,
                "the backend gave the endpoint a new session"
            );
        }
        self.slots.reset();
        if !regions_kept {
            self.cache.forget_endpoint(self.index);
            self.lent.clear();
            self.lent_data.clear();
        }
        self.down = false;
        let sinks: Vec<Sink> = self.sinks.drain().map(|(_, s)| s).collect();
        for mut sink in sinks {
            if regions_kept {
                // The window is registered again under its id: the pull starts over into it.
                if let Err(sink) = self.issue(sink, mailbox, client) {
                    let _ = self.cache.release(client, sink.lease);
                    mailbox.put_pulls([(sink.id, Err(Status::Aborted))]);
                }
                continue;
            }
            let (addr, len) = (windows::key(&sink.dest).0, sink.length as usize);
            let Some(lease) = self.acquire(client, addr, len) else {
                mailbox.put_pulls([(sink.id, Err(Status::NoResources))]);
                continue;
            };
            sink.lease = lease;
            if let Err(sink) = self.issue(sink, mailbox, client) {
                let _ = self.cache.release(client, sink.lease);
                mailbox.put_pulls([(sink.id, Err(Status::Aborted))]);
            }
        }
        tracing::info!(index = self.index, "endpoint re-opened and remapped");
    }

    /// Waits (up to `timeout`) until the backend has taken every request
    /// posted, so that frames the core sent last (the ack of a final NOTIFY,
    /// say) leave before the endpoint is closed under them; what arrives
    /// meanwhile is taken in. True if the ring emptied.
    pub fn flush_sends(
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
    pub fn close(&mut self) -> Option<EndpointChannel> {
        let s = self.cache.stats();
        tracing::info!(
            index = self.index,
            hits = s.hits,
            misses = s.misses,
            registrations = s.registrations,
            "registration cache"
        );
        self.sinks.clear();
        self.lent.clear();
        self.lent_data.clear();
        self.cache.forget_endpoint(self.index);
        self.down = true;
        self.channel.take()
    }

    /// The endpoint is gone for good (the daemon could not re-open it).
    pub fn lose(&mut self) {
        self.set_down();
        drop(self.close());
    }
}

//! The native board: one engine with one virtual NIC (this process), its
//! link, and the state of each open endpoint, behind the transport's lock.
//!
//! Whoever holds the lock moves the engine forward: the driver thread when
//! frames arrive or timers fall due, an application thread when its endpoint
//! polls the link or posts a frame or a pull. After every input the holder
//! [pumps](Board::pump) the engine's outputs: frames onto the link (one
//! flush per pass), events to the endpoints, host replies into the peer
//! table. An application thread that polls its own endpoint gets that
//! endpoint's frames straight into its port's [`Inbox`]: no mailbox, no lock
//! and no doorbell per frame. Frames for other endpoints, and every frame
//! the driver thread takes in, go to the endpoints' mailboxes, whose
//! doorbells the caller rings once the lock is released
//! ([`Board::take_rings`]), so a woken thread does not run straight into the
//! lock.
//!
//! # Lingering
//!
//! An exchange ends with an ack, and the side that sends it may close its
//! endpoint (and exit) at once; if that ack is lost, the peer resends its
//! last frame to nobody and never completes. A closed endpoint may therefore
//! linger (`XMX_LINGER_MS`), as a TCP connection lingers in TIME_WAIT: its
//! buffers are unmapped and nothing reaches the application any more, but a
//! frame the peer resends, which can only mean the peer missed our last ack,
//! is answered with that ack again. Frames the endpoint never took in are
//! not acknowledged, so their senders learn of the closed endpoint (NACK)
//! once the linger ends.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::Instant;

use rustc_hash::FxHashMap;
use xmx_engine::{
    EndpointConfig, Engine, EngineConfig, GuestConfig, GuestEvent, GuestId, PeerEntry, PeerTable,
    RegionHandle,
};
use xmx_mx::{Body, Frame, PeerAddr, RdmaWindow, RequestId, Status};
use xmx_wire::msg::{EventBody, SendOp, SendRequest};
use xmx_wire::mxoe::Mac;

use super::claim::{BoardLanes, ClaimsElsewhere, EndpointClaim, LaneSend, LANE_DATAGRAM_MAX};
use super::memory::NativeMemory;
use super::peers::{self, CLUSTER};
use super::wire::Wire;
use crate::doorbell::Doorbell;
use crate::segments::Segments;
use crate::transport::engine_msgs::{self, Inbound, Outbound, PeerSessions};
use crate::transport::mailbox::Mailbox;
use crate::transport::rcache::RegCache;
use crate::transport::{OpenError, PullProgress};
use xmx_hv::lock;

/// The engine's only guest: this process.
pub(super) const GUEST: GuestId = GuestId(0);
/// Send-queue slots per endpoint: one MEDIUM message (8 fragments), which
/// the engine copies out before `handle_send` returns.
const SEND_QUEUE_SLOTS: u16 = 8;
/// The send-queue slots of a MEDIUM message's fragments, in order.
const SEND_SLOTS: [u16; SEND_QUEUE_SLOTS as usize] = [0, 1, 2, 3, 4, 5, 6, 7];
/// Receive-queue slots per endpoint: fragments stay in a slot only from
/// their arrival to the end of the same pump, so this bounds a burst; empty
/// slots cost no buffer.
const RECV_QUEUE_SLOTS: u16 = 4096;
/// Region ids per endpoint (the wire's 8-bit RDMA window id).
const REGION_IDS: usize = 256;

/// The time of one pass over the board, read from the system clock the
/// first time something needs it: a poll that finds the link empty reads
/// none, a batch of frames taken in reads it once.
#[derive(Debug, Default)]
pub(super) struct Clock(Option<Instant>);

impl Clock {
    /// The pass's time.
    pub(super) fn now(&mut self) -> Instant {
        *self.0.get_or_insert_with(Instant::now)
    }
}

/// Where the frames of the endpoint whose application thread holds the
/// board go: straight to its port, which takes them without a lock. Nobody
/// needs waking for them, since the thread that takes them is the one
/// running.
pub(super) struct Inbox<'a> {
    /// The endpoint.
    pub(crate) index: u8,
    /// Its port's frames, oldest first.
    pub(crate) frames: &'a mut VecDeque<Frame<Vec<u8>>>,
}

/// The peer table as lookups see it: a copy readers take without the board's
/// lock, and a signal for threads waiting for a hostname to be learnt.
#[derive(Default)]
pub(super) struct BoardPeerView {
    table: RwLock<PeerTable>,
    learnt: Mutex<u64>,
    changed: Condvar,
}

impl BoardPeerView {
    /// Reads the table.
    pub(super) fn read<T>(&self, f: impl FnOnce(&PeerTable) -> T) -> T {
        f(&self.table.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// How many hostnames have been learnt so far.
    pub(super) fn learnt(&self) -> u64 {
        *lock(&self.learnt)
    }

    /// Waits until more than `seen` hostnames were learnt or `deadline`
    /// passes.
    pub(super) fn wait_learnt(&self, seen: u64, deadline: Instant) {
        let mut n = lock(&self.learnt);
        while *n == seen {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            n = self
                .changed
                .wait_timeout(n, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn publish(&self, table: PeerTable, learnt: bool) {
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = table;
        if learnt {
            *lock(&self.learnt) += 1;
            self.changed.notify_all();
        }
    }
}

/// A send's buffer, registered as a window peers pull from.
struct BoardWindow {
    seqnum: u8,
    handle: RegionHandle,
    /// Kept mapped after release (registration cache).
    cached: bool,
}

/// How long pulls held for room wait without any pull of the board ending before
/// they fail with `NoResources`: every pull in progress ends (done, or failed by its own
/// retries), so room comes unless something is wrong, and then the receives must not
/// wait without a bound.
const PULL_HELD_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// A pull waiting for room: the engine's pull quotas, or a free region id of its
/// endpoint. MX never fails a receive for want of either.
struct HeldPull {
    index: u8,
    id: RequestId,
    source: PeerAddr,
    window: RdmaWindow,
    dest: Segments,
    length: u32,
}

/// A receive's buffer, registered while a pull writes into it.
struct BoardSink {
    id: RequestId,
    region: u8,
    handle: RegionHandle,
}

/// An open endpoint as the board keeps it.
struct BoardEndpoint {
    mailbox: Arc<Mailbox>,
    /// Frames were put in the mailbox since its port last drained it under
    /// the board's lock: they go before anything newer (see [`Board::pump`]).
    mailed: bool,
    session: u32,
    sessions: PeerSessions,
    windows: FxHashMap<u8, BoardWindow>,
    /// Pulls in progress, by the tag of their request.
    sinks: FxHashMap<u32, BoardSink>,
    generations: [u8; REGION_IDS],
    cursor: u8,
    next_tag: u32,
    cache: Option<RegCache<RegionHandle>>,
    /// The last explicit ack sent to each partner, replayed while lingering.
    last_acks: FxHashMap<PeerAddr, SendRequest>,
    /// Closed, answering resent frames until then.
    lingering: Option<Instant>,
    /// The index, held against the other processes on the interface until
    /// the endpoint closes for good.
    claim: Option<EndpointClaim>,
}

impl BoardEndpoint {
    fn tag(&mut self) -> u32 {
        self.next_tag = self.next_tag.wrapping_add(1);
        self.next_tag
    }

    /// A region id neither a window nor a pull uses, the least recently
    /// handed out first so a stale PULL rarely finds its id reused.
    fn free_region(&mut self) -> Option<u8> {
        let start = self.cursor;
        let id = (0..=255u8).map(|k| start.wrapping_add(k)).find(|id| {
            !self.windows.contains_key(id) && !self.sinks.values().any(|s| s.region == *id)
        })?;
        self.cursor = id.wrapping_add(1);
        Some(id)
    }
}

/// Counters of what went wrong on the board, for the logs and the tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct BoardCounters {
    /// Frames the link refused.
    pub(crate) tx_errors: u64,
    /// Frames of the core no request exists for.
    pub(crate) unsendable: u64,
    /// Requests the engine found malformed (a library bug).
    pub(crate) violations: u64,
    /// Events that could not become frames.
    pub(crate) unreadable: u64,
    /// Frames sent to other processes on the link, through their endpoints'
    /// lanes ([`super::claim`]).
    pub(crate) lane_sent: u64,
    /// Frames for other processes lost (their lane full, or closed).
    pub(crate) lane_lost: u64,
    /// Frames taken in from this process's lanes.
    pub(crate) lane_taken: u64,
    /// Frames on this process's lanes from another user's process: dropped.
    pub(crate) lane_refused: u64,
    /// Pulls that waited for room before they started.
    pub(crate) pulls_held: u64,
}

/// The engine, its link and the endpoints. See the module documentation.
pub(super) struct Board {
    engine: Engine,
    wire: Box<dyn Wire>,
    memory: NativeMemory,
    slots: FxHashMap<u8, BoardEndpoint>,
    view: Arc<BoardPeerView>,
    entries: Vec<PeerEntry>,
    next_region: u64,
    rings: Vec<Arc<Mailbox>>,
    /// Acks to repeat for lingering endpoints.
    replay: Vec<(u8, SendRequest)>,
    counters: BoardCounters,
    /// The timer the driver thread sleeps until (`None`: none), so a thread
    /// arming an earlier one knows to wake it.
    pub(crate) driver_wake: Option<Instant>,
    /// Where frames for other processes' endpoints on the link go.
    lanes: BoardLanes,
    /// A frame taken from a lane.
    lane_buf: Vec<u8>,
    /// Readable when a lane of ours has frames.
    lane_set: LaneSet,
    /// Pulls waiting for room, oldest first.
    held_pulls: VecDeque<HeldPull>,
    /// Since when the held pulls wait without a pull of the board ending.
    held_since: Option<Instant>,
}

impl Board {
    /// A board on `wire` named `hostname` with peer table `entries`, which
    /// it publishes in `view`.
    pub(super) fn new(
        config: EngineConfig,
        wire: Box<dyn Wire>,
        hostname: &str,
        entries: Vec<PeerEntry>,
        view: Arc<BoardPeerView>,
    ) -> Result<Board, String> {
        let memory = NativeMemory::default();
        let mut engine = Engine::new(config);
        engine
            .add_guest(GuestConfig {
                id: GUEST,
                mac: wire.mac(),
                cluster: CLUSTER,
                hostname: hostname.to_owned(),
                memory: Box::new(memory.clone()),
            })
            .map_err(|e| format!("board {}: {e}", wire.mac()))?;
        // Other processes on the interface answer for the endpoints they hold.
        engine
            .set_endpoints_elsewhere(GUEST, Box::new(ClaimsElsewhere::new(wire.claim_scope())))
            .map_err(|e| format!("board {}: {e}", wire.mac()))?;
        let lanes = BoardLanes::new(wire.claim_scope())
            .map_err(|e| format!("board {}: lanes to other processes: {e}", wire.mac()))?;
        let lane_set =
            LaneSet::new().map_err(|e| format!("board {}: lane set: {e}", wire.mac()))?;
        let lane_buf = vec![0; LANE_DATAGRAM_MAX.max(wire.max_frame_len() + 4)];
        let mut board = Board {
            engine,
            wire,
            memory,
            slots: FxHashMap::default(),
            view,
            entries: Vec::new(),
            next_region: 1,
            rings: Vec::new(),
            replay: Vec::new(),
            counters: BoardCounters::default(),
            driver_wake: None,
            lanes,
            lane_buf,
            lane_set,
            held_pulls: VecDeque::new(),
            held_since: None,
        };
        board.set_peers(entries, false)?;
        Ok(board)
    }

    /// The board address.
    pub(super) fn mac(&self) -> Mac {
        self.wire.mac()
    }

    /// What went wrong so far.
    #[cfg(test)]
    pub(super) fn counters(&self) -> &BoardCounters {
        &self.counters
    }

    /// Frames the engine dropped for `reason`, and the NACKs it sent.
    #[cfg(test)]
    pub(super) fn engine_drops(&self, reason: xmx_engine::DropReason) -> (u64, u64) {
        self.engine.guest(GUEST).map_or((0, 0), |g| {
            (g.counters().drops(reason), g.counters().nacks_sent)
        })
    }

    /// The link's descriptor.
    pub(super) fn wire_fd(&self) -> std::os::fd::RawFd {
        self.wire.fd()
    }

    /// Frames sent and taken in through the lanes so far: a thread that sees
    /// it move expects more that way.
    pub(super) fn lane_traffic(&self) -> u64 {
        self.counters.lane_sent + self.counters.lane_taken
    }

    /// A descriptor readable while a lane of ours has frames
    /// ([`Board::receive_lanes`]).
    pub(super) fn lanes_fd(&self) -> std::os::fd::RawFd {
        self.lane_set.fd()
    }

    /// The peer entries.
    pub(super) fn entries(&self) -> &[PeerEntry] {
        &self.entries
    }

    /// Replaces the peer table.
    pub(super) fn set_peers(
        &mut self,
        entries: Vec<PeerEntry>,
        learnt: bool,
    ) -> Result<(), String> {
        self.engine
            .set_peers(entries.iter().cloned())
            .map_err(|e| format!("peer table: {e}"))?;
        self.entries = entries;
        self.view.publish(self.engine.peers().clone(), learnt);
        Ok(())
    }

    /// Renames the board: its virtual NIC is attached again under the new
    /// name, which only an idle board allows.
    pub(super) fn rename(&mut self, hostname: &str) -> Result<(), String> {
        peers::check_hostname(hostname)?;
        if !self.slots.is_empty() {
            return Err("endpoints are open".into());
        }
        let mac = self.mac();
        self.engine
            .remove_guest(GUEST)
            .map_err(|e| format!("renaming: {e}"))?;
        self.engine
            .add_guest(GuestConfig {
                id: GUEST,
                mac,
                cluster: CLUSTER,
                hostname: hostname.to_owned(),
                memory: Box::new(self.memory.clone()),
            })
            .map_err(|e| format!("renaming: {e}"))?;
        let entries = peers::with_peer(&self.entries, mac, Some(hostname))?;
        self.set_peers(entries, true)
    }

    /// Asks the board at `mac` for its hostname.
    pub(super) fn query(&mut self, now: Instant, mac: Mac) {
        if let Err(e) = self.engine.host_query(now, GUEST, mac) {
            tracing::warn!(%e, %mac, "host query not sent");
        }
    }

    /// Opens endpoint `endpoint` (or the lowest free one) with session
    /// `session`; arrivals ring `doorbell`.
    pub(super) fn open(
        &mut self,
        endpoint: Option<u8>,
        session: u32,
        doorbell: Arc<Doorbell>,
        rcache: bool,
    ) -> Result<(u8, Arc<Mailbox>), OpenError> {
        let busy = |slots: &FxHashMap<u8, BoardEndpoint>, i: &u8| {
            slots.get(i).is_some_and(|s| s.lingering.is_none())
        };
        let scope = self.wire.claim_scope();
        // The index must also be free in every other process on the
        // interface; a lingering endpoint of ours still holds its claim.
        // `Ok(None)`: another process holds the index; `Err`: the claim could
        // not be made at all (out of descriptors), which no index will change.
        let claim_for = |slots: &mut FxHashMap<u8, BoardEndpoint>, i: u8| {
            if let Some(claim) = slots.get_mut(&i).and_then(|s| s.claim.take()) {
                return Ok(Some(claim));
            }
            EndpointClaim::take(&scope, i).map_err(|e| {
                tracing::warn!(%e, index = i, "claiming a native endpoint");
                OpenError::NoResources
            })
        };
        let (index, claim) = match endpoint {
            Some(i) if busy(&self.slots, &i) => return Err(OpenError::Busy(i)),
            Some(i) => match claim_for(&mut self.slots, i)? {
                Some(c) => (i, c),
                None => {
                    tracing::info!(index = i, "endpoint open in another process");
                    return Err(OpenError::Busy(i));
                }
            },
            None => {
                // Indices never used first, lingering ones last.
                let (fresh, lingering): (Vec<u8>, Vec<u8>) = (0..=255u8)
                    .filter(|i| !busy(&self.slots, i))
                    .partition(|i| !self.slots.contains_key(i));
                let mut found = None;
                for i in fresh.into_iter().chain(lingering) {
                    if let Some(c) = claim_for(&mut self.slots, i)? {
                        found = Some((i, c));
                        break;
                    }
                }
                found.ok_or(OpenError::NoResources)?
            }
        };
        // A new endpoint on a lingering index ends the linger.
        self.finish_close(index);
        let config = EndpointConfig {
            session_id: session,
            send_queue_slots: SEND_QUEUE_SLOTS,
            recv_queue_slots: RECV_QUEUE_SLOTS,
        };
        self.engine
            .open_endpoint(GUEST, index, config)
            .map_err(|e| {
                tracing::warn!(%e, index, "engine refused the endpoint");
                OpenError::NoResources
            })?;
        self.memory
            .add_endpoint(index, SEND_QUEUE_SLOTS, RECV_QUEUE_SLOTS);
        // A claim carried over from a lingering endpoint is in the set already.
        if let Err(e) = self.lane_set.add(claim.fd()) {
            if e.raw_os_error() != Some(libc::EEXIST) {
                tracing::warn!(%e, index, "the endpoint's lane is not watched: its frames from other processes wait for the next look");
            }
        }
        let mailbox = Arc::new(Mailbox::new(doorbell));
        self.slots.insert(
            index,
            BoardEndpoint {
                mailbox: mailbox.clone(),
                mailed: false,
                session,
                sessions: PeerSessions::default(),
                windows: FxHashMap::default(),
                sinks: FxHashMap::default(),
                generations: [0; REGION_IDS],
                cursor: 0,
                next_tag: 0,
                cache: rcache.then(RegCache::default),
                last_acks: FxHashMap::default(),
                lingering: None,
                claim: Some(claim),
            },
        );
        self.filter_link();
        tracing::debug!(index, session, "native endpoint open");
        Ok((index, mailbox))
    }

    /// Has the kernel keep other processes' PULL_REPLY frames off this
    /// board's link ([`super::filter`]). Before an endpoint's first PULL
    /// leaves, so none of its replies is kept off. Without a filter (the
    /// kernel refused it) every frame still comes, as before: the engine
    /// leaves other endpoints' replies alone.
    fn filter_link(&mut self) {
        let held: Vec<u8> = self.slots.keys().copied().collect();
        let Some(program) = super::filter::pull_replies_only_for(&held) else {
            if let Err(e) = self.wire.take_only(&super::filter::everything()) {
                tracing::debug!(%e, "the link's filter stays");
            }
            return;
        };
        if let Err(e) = self.wire.take_only(&program) {
            tracing::debug!(%e, endpoints = held.len(), "link filter refused; every frame comes");
        }
    }

    /// Closes endpoint `index`: its buffers are unmapped and the
    /// application hears nothing more. With a `linger` and acks to repeat it
    /// stays open for the engine until `now + linger` (see the module
    /// documentation), else it closes at once: the engine forgets it and
    /// NACKs later packets for it.
    pub(super) fn close(&mut self, now: Instant, index: u8, linger: std::time::Duration) {
        let Some(slot) = self.slots.get_mut(&index) else {
            return;
        };
        if slot.lingering.is_some() {
            return;
        }
        // Never started, and their buffers are the application's to free now.
        self.held_pulls.retain(|p| p.index != index);
        let mut handles: Vec<RegionHandle> = Vec::new();
        for (id, w) in slot.windows.drain() {
            let _ = self.engine.deregister_region(GUEST, index, id);
            handles.push(w.handle);
        }
        for (_, sink) in slot.sinks.drain() {
            // Aborts the pull writing into it.
            let _ = self.engine.deregister_region(GUEST, index, sink.region);
            handles.push(sink.handle);
        }
        if let Some(mut cache) = slot.cache.take() {
            handles.extend(cache.invalidate(0, usize::MAX));
        }
        let linger = (!linger.is_zero() && !slot.last_acks.is_empty()).then(|| now + linger);
        slot.lingering = linger;
        slot.mailbox.clear();
        for h in handles {
            self.memory.remove_region(h);
        }
        match linger {
            Some(until) => tracing::debug!(index, ?until, "native endpoint lingering"),
            None => self.finish_close(index),
        }
    }

    /// Forgets endpoint `index` for good.
    fn finish_close(&mut self, index: u8) {
        if self.slots.remove(&index).is_none() {
            return;
        }
        if let Err(e) = self.engine.close_endpoint(GUEST, index) {
            tracing::warn!(%e, index, "closing a native endpoint");
        }
        self.memory.remove_endpoint(index);
        self.filter_link();
        tracing::debug!(index, "native endpoint closed");
    }

    /// When the last lingering endpoint closes for good, if one lingers.
    pub(super) fn lingering_until(&self) -> Option<Instant> {
        self.slots.values().filter_map(|s| s.lingering).max()
    }

    fn new_region_handle(&mut self) -> RegionHandle {
        let h = RegionHandle(self.next_region);
        self.next_region += 1;
        h
    }

    /// Posts a frame of endpoint `index`'s core, converted.
    pub(super) fn post(&mut self, now: Instant, index: u8, out: Outbound) {
        let Some(slot) = self.slots.get_mut(&index) else {
            return;
        };
        let tag = slot.tag();
        let request = match out {
            Outbound::Request(mut r) => {
                r.tag = tag;
                r
            }
            Outbound::Medium(m) => {
                // Fragment i in send-queue slot i: the engine copies them out
                // before `handle_send` returns.
                let slots = SEND_SLOTS.get(..m.fragments.len()).unwrap_or(&SEND_SLOTS);
                let request = match m.request(tag, slots) {
                    Ok(r) => r,
                    Err(e) => {
                        self.counters.unsendable += 1;
                        tracing::warn!(%e, "MEDIUM message not sent");
                        return;
                    }
                };
                for (&slot, data) in slots.iter().zip(m.fragments) {
                    self.memory.put_send_fragment(index, slot, data);
                }
                request
            }
        };
        if let (SendOp::Liback(_), Some(slot)) = (&request.op, self.slots.get_mut(&index)) {
            let partner = PeerAddr::new(request.route.peer_index, request.route.endpoint);
            slot.last_acks.insert(partner, request);
        }
        if let Err(v) = self.engine.handle_send(now, GUEST, index, &request) {
            // The request came from our own protocol core: a bug, not an attack.
            self.counters.violations += 1;
            tracing::warn!(%v, ?request, "engine refused a request of the library");
        }
    }

    /// Counts a frame that has no request.
    pub(super) fn unsendable(&mut self, e: &engine_msgs::Unsendable) {
        self.counters.unsendable += 1;
        tracing::debug!(%e, "frame not sent");
    }

    /// Registers a LARGE send's buffer as a window of endpoint `index`.
    pub(super) fn register_window(&mut self, index: u8, data: &Segments) -> Option<RdmaWindow> {
        if data.is_empty() {
            tracing::warn!("empty LARGE window refused");
            return None;
        }
        let fresh = self.new_region_handle();
        let slot = self.slots.get_mut(&index)?;
        let id = slot.free_region()?;
        let (handle, cached, new) = match (&mut slot.cache, data.parts()) {
            (Some(cache), &[(addr, len)]) => match cache.get(addr, len) {
                Some(&h) => (h, true, false),
                None => {
                    cache.insert(addr, len, fresh);
                    (fresh, true, true)
                }
            },
            _ => (fresh, false, true),
        };
        if new {
            self.memory.add_region(handle, data.clone());
        }
        if let Err(e) = self
            .engine
            .register_region(GUEST, index, id, handle, data.len() as u64)
        {
            tracing::warn!(%e, "LARGE window not registered");
            if !cached {
                self.memory.remove_region(handle);
            }
            return None;
        }
        let seqnum = slot.generations[usize::from(id)].wrapping_add(1);
        slot.generations[usize::from(id)] = seqnum;
        slot.windows.insert(
            id,
            BoardWindow {
                seqnum,
                handle,
                cached,
            },
        );
        Some(RdmaWindow {
            id,
            seqnum,
            offset: 0,
        })
    }

    /// A LARGE send is over: peers may not pull from its window any more.
    pub(super) fn release_window(&mut self, index: u8, window: RdmaWindow) {
        let Some(slot) = self.slots.get_mut(&index) else {
            return;
        };
        // A stale window (its id registered again since) is not ours to drop.
        match slot.windows.get(&window.id) {
            Some(w) if w.seqnum == window.seqnum => {}
            _ => return,
        }
        let Some(w) = slot.windows.remove(&window.id) else {
            return;
        };
        if let Err(e) = self.engine.deregister_region(GUEST, index, window.id) {
            tracing::warn!(%e, "releasing a LARGE window");
        }
        if !w.cached {
            self.memory.remove_region(w.handle);
        }
    }

    /// Forgets cached registrations overlapping `[addr, addr + len)`.
    pub(super) fn invalidate(&mut self, index: u8, addr: usize, len: usize) {
        let Some(slot) = self.slots.get_mut(&index) else {
            return;
        };
        let Some(cache) = &mut slot.cache else {
            return;
        };
        for h in cache.invalidate(addr, len) {
            let in_use = slot.windows.values_mut().filter(|w| w.handle == h);
            let mut used = false;
            for w in in_use {
                // Unmapped when its send is released.
                w.cached = false;
                used = true;
            }
            if !used {
                self.memory.remove_region(h);
            }
        }
    }

    /// Endpoint `index` knows `peer`'s session without a connect.
    pub(super) fn learn_session(&mut self, index: u8, peer: PeerAddr, session: u32) {
        if let Some(slot) = self.slots.get_mut(&index) {
            slot.sessions.learn(peer, session);
        }
    }

    /// Hits and misses of endpoint `index`'s registration cache.
    #[cfg(test)]
    pub(super) fn cache_stats(&self, index: u8) -> Option<(u64, u64)> {
        let c = self.slots.get(&index)?.cache.as_ref()?;
        Some((c.hits, c.misses))
    }

    /// Starts pulling `length` bytes of `source`'s `window` into `dest` for
    /// receive `id` of endpoint `index`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_pull(
        &mut self,
        now: Instant,
        index: u8,
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
        let Some(slot) = self.slots.get(&index) else {
            return PullProgress::Done(Err(Status::Aborted));
        };
        if slot.sessions.get(source).is_none() {
            tracing::warn!(
                ?source,
                "no session known for the sender of a LARGE message"
            );
            return PullProgress::Done(Err(Status::EndpointUnreachable));
        }
        let pull = HeldPull {
            index,
            id,
            source,
            window,
            dest: dest.clone(),
            length,
        };
        // Behind pulls already held, in order: a later receive must not take the
        // room an earlier one waits for.
        if self.held_pulls.is_empty() && self.has_room_for_pull(index, length) {
            return self.issue_pull(now, pull);
        }
        tracing::debug!(index, ?id, length, "pull held until a pull ends");
        self.counters.pulls_held += 1;
        self.held_since.get_or_insert(now);
        self.held_pulls.push_back(pull);
        PullProgress::Started
    }

    /// Whether a pull of `length` bytes for endpoint `index` could start now: within
    /// the engine's pull quotas, and with a region id free (windows and pulls take
    /// distinct ones).
    fn has_room_for_pull(&self, index: u8, length: u32) -> bool {
        self.engine.admits_pull(GUEST, length)
            && self
                .slots
                .get(&index)
                .is_some_and(|s| s.windows.len() + s.sinks.len() < REGION_IDS)
    }

    /// Registers `pull`'s destination and asks the engine to pull into it.
    fn issue_pull(&mut self, now: Instant, pull: HeldPull) -> PullProgress {
        let HeldPull {
            index,
            id,
            source,
            window,
            dest,
            length,
        } = pull;
        let handle = self.new_region_handle();
        let Some(slot) = self.slots.get_mut(&index) else {
            return PullProgress::Done(Err(Status::Aborted));
        };
        let Some(session) = slot.sessions.get(source) else {
            return PullProgress::Done(Err(Status::EndpointUnreachable));
        };
        let Some(region) = slot.free_region() else {
            tracing::warn!(index, "every region id is in use");
            return PullProgress::Done(Err(Status::NoResources));
        };
        let len = dest.len() as u64;
        self.memory.add_region(handle, dest);
        if let Err(e) = self
            .engine
            .register_region(GUEST, index, region, handle, len)
        {
            tracing::warn!(%e, "pull destination not registered");
            self.memory.remove_region(handle);
            return PullProgress::Done(Err(Status::NoResources));
        }
        let tag = slot.tag();
        slot.sinks.insert(tag, BoardSink { id, region, handle });
        let request = engine_msgs::pull_request(tag, source, session, window, region, length);
        if let Err(v) = self.engine.handle_send(now, GUEST, index, &request) {
            self.counters.violations += 1;
            tracing::warn!(%v, "engine refused a pull");
            if let Some(slot) = self.slots.get_mut(&index) {
                slot.sinks.remove(&tag);
            }
            let _ = self.engine.deregister_region(GUEST, index, region);
            self.memory.remove_region(handle);
            return PullProgress::Done(Err(Status::Aborted));
        }
        PullProgress::Started
    }

    /// Starts the held pulls there is room for now, oldest first; fails them all
    /// once no pull has ended for [`PULL_HELD_MAX`].
    fn start_held_pulls(&mut self, now: Instant) {
        while let Some(pull) = self.held_pulls.front() {
            if !self.slots.contains_key(&pull.index) {
                self.held_pulls.pop_front();
                continue;
            }
            if !self.has_room_for_pull(pull.index, pull.length) {
                break;
            }
            let Some(pull) = self.held_pulls.pop_front() else {
                break;
            };
            let (index, id) = (pull.index, pull.id);
            if let PullProgress::Done(result) = self.issue_pull(now, pull) {
                self.pull_finished(index, id, result);
            }
        }
        if self.held_pulls.is_empty() {
            self.held_since = None;
            return;
        }
        let since = *self.held_since.get_or_insert(now);
        if now.saturating_duration_since(since) >= PULL_HELD_MAX {
            tracing::warn!(
                pulls = self.held_pulls.len(),
                "no room for held pulls: they fail"
            );
            for pull in std::mem::take(&mut self.held_pulls) {
                self.pull_finished(pull.index, pull.id, Err(Status::NoResources));
            }
            self.held_since = None;
        }
    }

    /// Tells endpoint `index` that pull `id` is over.
    fn pull_finished(&mut self, index: u8, id: RequestId, result: Result<(), Status>) {
        let Some(slot) = self.slots.get(&index) else {
            return;
        };
        slot.mailbox.put_pulls([(id, result)]);
        self.ring_later(index);
    }

    /// Takes in every frame waiting on the link; returns how many.
    pub(super) fn receive(&mut self, clock: &mut Clock) -> usize {
        let Board { wire, engine, .. } = self;
        wire.recv(&mut |frame| engine.handle_frame(clock.now(), frame))
    }

    /// Takes in every frame other processes on the link sent to our
    /// endpoints' lanes ([`super::claim`]); returns how many.
    pub(super) fn receive_lanes(&mut self, clock: &mut Clock) -> usize {
        let Board {
            slots,
            engine,
            lane_buf,
            counters,
            ..
        } = self;
        let mut taken = 0;
        for claim in slots.values().filter_map(|s| s.claim.as_ref()) {
            let seen = claim.take_frames(lane_buf, &mut |frame| {
                engine.handle_board_frame(clock.now(), frame)
            });
            taken += seen.taken;
            counters.lane_taken += seen.taken as u64;
            counters.lane_refused += seen.refused as u64;
        }
        taken
    }

    /// Runs the engine's timers if one is due.
    pub(super) fn timers(&mut self, now: Instant) {
        if self.engine.poll_timeout().is_some_and(|t| t <= now) {
            self.engine.handle_timeout(now);
        }
        let over: Vec<u8> = self
            .slots
            .iter()
            .filter(|(_, s)| s.lingering.is_some_and(|t| t <= now))
            .map(|(i, _)| *i)
            .collect();
        for index in over {
            self.finish_close(index);
        }
    }

    /// When the board next needs [`Board::timers`] (or a pass that offers
    /// its lanes' backlog again).
    pub(super) fn next_timer(&self) -> Option<Instant> {
        let linger = self.slots.values().filter_map(|s| s.lingering).min();
        let lanes = self.lanes.retry_at();
        let held = self.held_since.map(|t| t + PULL_HELD_MAX);
        [self.engine.poll_timeout(), linger, lanes, held]
            .into_iter()
            .flatten()
            .min()
    }

    /// Moves the engine's outputs on: frames to the link, events to the
    /// endpoints (`inbox`'s straight to it, the others' to their mailboxes),
    /// host replies to the peer table.
    pub(super) fn pump(&mut self, clock: &mut Clock, mut inbox: Option<Inbox<'_>>) {
        if let Some(inbox) = inbox.as_mut() {
            // What the mailbox got before (from the driver thread, or from a
            // pass without the inbox) is older than anything delivered now.
            if let Some(slot) = self.slots.get_mut(&inbox.index) {
                if std::mem::take(&mut slot.mailed) {
                    while let Some(f) = slot.mailbox.next_frame() {
                        inbox.frames.push_back(f);
                    }
                }
            }
        }
        self.send_transmits();
        while let Some(ev) = self.engine.poll_event() {
            self.deliver(ev, inbox.as_mut());
        }
        if !self.held_pulls.is_empty() {
            self.start_held_pulls(clock.now());
            self.send_transmits();
        }
        if !self.replay.is_empty() {
            let now = clock.now();
            for (index, ack) in std::mem::take(&mut self.replay) {
                if let Err(v) = self.engine.handle_send(now, GUEST, index, &ack) {
                    tracing::debug!(%v, "repeated ack refused");
                }
            }
            self.send_transmits();
        }
        let mut learnt = false;
        while let Some(reply) = self.engine.poll_host_reply() {
            let name = String::from_utf8_lossy(&reply.hostname).into_owned();
            let known = self
                .entries
                .iter()
                .any(|e| e.mac == reply.from && e.hostname == name);
            if known || peers::check_hostname(&name).is_err() {
                continue;
            }
            if !self.entries.iter().any(|e| e.mac == reply.from) {
                continue;
            }
            match peers::with_peer(&self.entries, reply.from, Some(&name)) {
                Ok(entries) => {
                    self.entries = entries;
                    learnt = true;
                    tracing::debug!(mac = %reply.from, %name, "hostname learnt");
                }
                Err(e) => tracing::debug!(%e, "host reply ignored"),
            }
        }
        if learnt {
            let entries = self.entries.clone();
            if let Err(e) = self.set_peers(entries, true) {
                tracing::warn!(%e, "learnt hostnames not applied");
            }
        }
    }

    /// Puts the engine's frames on the link, then makes it send them.
    fn send_transmits(&mut self) {
        let Board {
            engine,
            wire,
            counters,
            ..
        } = self;
        // Each frame is written straight into the link's transmit ring: a
        // PULL_REPLY's data goes from the application's buffer to the ring in
        // one copy.
        let sent = engine.transmit_into(
            |fill| wire.send_with(fill),
            |e| {
                counters.tx_errors += 1;
                tracing::debug!(%e, "frame lost on the link");
            },
        ) > 0;
        if sent {
            if let Err(e) = self.wire.flush() {
                self.counters.tx_errors += 1;
                tracing::debug!(%e, "frames lost on the link");
            }
        }
        if self.engine.pending_board_frames() > 0 || self.lanes.backlogged() {
            let Board {
                engine,
                lanes,
                counters,
                ..
            } = self;
            let mut done = LaneSend::default();
            engine.transmit_to_boards(|endpoint, frame| lanes.queue(endpoint, frame, &mut done));
            lanes.flush(&mut done);
            counters.lane_sent += done.sent as u64;
            counters.lane_lost += done.lost as u64;
        }
    }

    fn deliver(&mut self, ev: GuestEvent, inbox: Option<&mut Inbox<'_>>) {
        let GuestEvent {
            endpoint, event, ..
        } = ev;
        let Some(slot) = self.slots.get_mut(&endpoint) else {
            return;
        };
        let memory = &self.memory;
        let converted = engine_msgs::incoming(endpoint, slot.session, &event, |s, len| {
            memory.take_recv_fragment(endpoint, s, len)
        });
        if let EventBody::RecvMedium { frag, .. } = &event.body {
            if let Err(v) = self
                .engine
                .release_recvq_slot(GUEST, endpoint, frag.recvq_slot)
            {
                tracing::warn!(%v, "receive-queue slot not given back");
            }
        }
        if slot.lingering.is_some() {
            // Only a resent message or NOTIFY calls for our last ack again.
            let resent = matches!(
                &converted,
                Ok(Inbound::Frame(Frame {
                    body: Body::Message(_) | Body::Notify(_),
                    ..
                }))
            );
            if let (true, Ok(Inbound::Frame(f))) = (resent, &converted) {
                // One repeat per partner and pump, however many fragments came.
                let source = f.source();
                let queued = |r: &(u8, SendRequest)| {
                    r.0 == endpoint
                        && PeerAddr::new(r.1.route.peer_index, r.1.route.endpoint) == source
                };
                let already = self.replay.iter().any(queued);
                if let (Some(mut ack), false) = (slot.last_acks.get(&f.source()).copied(), already)
                {
                    if let SendOp::Liback(a) = &mut ack.op {
                        a.resent = true;
                    }
                    tracing::debug!(endpoint, peer = ?f.source(), "last ack repeated");
                    self.replay.push((endpoint, ack));
                }
            }
            return;
        }
        match converted {
            // Native regions have no fill marks (the engine never asks), and
            // pulls land in the application's buffers (it is told no progress).
            Ok(Inbound::RegionWanted { .. } | Inbound::PullProgress { .. }) => {}
            Ok(Inbound::Frame(f)) => {
                slot.sessions.observe(&f);
                match inbox {
                    Some(inbox) if inbox.index == endpoint => {
                        inbox.frames.push_back(f);
                        return;
                    }
                    _ => {
                        slot.mailbox.put_frames([f]);
                        slot.mailed = true;
                    }
                }
            }
            Ok(Inbound::Completed { tag, result }) => {
                let Some(sink) = slot.sinks.remove(&tag) else {
                    if let Err(status) = result {
                        // A frame refused before the wire: lost, as on a
                        // wire; the core sends it again or times out.
                        tracing::debug!(%status, tag, "send refused by the engine");
                    }
                    return;
                };
                if let Err(e) = self.engine.deregister_region(GUEST, endpoint, sink.region) {
                    tracing::debug!(%e, "pull destination already gone");
                }
                self.memory.remove_region(sink.handle);
                // Room came: the held pulls' wait starts over.
                self.held_since = None;
                self.pull_finished(endpoint, sink.id, result.map(|_| ()));
                return;
            }
            Err(e) => {
                self.counters.unreadable += 1;
                tracing::warn!(%e, "event dropped");
                return;
            }
        }
        self.ring_later(endpoint);
    }

    /// Rings endpoint `index`'s mailbox once the board's lock is released.
    fn ring_later(&mut self, index: u8) {
        let Some(slot) = self.slots.get(&index) else {
            return;
        };
        if !self.rings.iter().any(|m| Arc::ptr_eq(m, &slot.mailbox)) {
            self.rings.push(slot.mailbox.clone());
        }
    }

    /// Until when an application thread can be counted on to take the
    /// link's frames in itself (its polling takes in every endpoint's), so
    /// the driver need not watch the link; `None`: the driver watches.
    pub(super) fn driven_until(&self, now_ns: u64) -> Option<u64> {
        // The link is every endpoint's only source of arrivals: a thread
        // asleep on it takes them in as one polling it does.
        self.slots
            .values()
            .filter_map(|s| s.mailbox.port_taken_until(now_ns))
            .max()
    }

    /// Moves the mailboxes that got something since the last call into
    /// `rings`: ring them once the lock is released. (The board keeps its
    /// own list's buffer: a pass that rings nobody allocates nothing.)
    pub(super) fn take_rings(&mut self, rings: &mut Vec<Arc<Mailbox>>) {
        rings.append(&mut self.rings);
    }

    /// Regions the memory maps (windows, pull destinations, cached).
    #[cfg(test)]
    pub(super) fn mapped_regions(&self) -> usize {
        self.memory.regions()
    }
}

/// An epoll set of the lanes of our endpoints: one descriptor a thread sleeps
/// on, beside the link's, for frames from other processes on the link (a lane
/// leaves the set by itself when its claim's socket closes). The link itself
/// stays out: a socket in an epoll set wakes the set at every frame, which
/// costs the sender of each a lock and a callback even while nobody sleeps.
struct LaneSet(std::os::fd::OwnedFd);

impl LaneSet {
    /// An empty set.
    fn new() -> std::io::Result<LaneSet> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain syscall; the result is checked before use.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        Ok(LaneSet(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    /// Watches `fd` for input as well.
    fn add(&self, fd: std::os::fd::RawFd) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let mut event = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd as u64,
        };
        // SAFETY: `event` is a valid epoll_event the kernel only reads; an
        // invalid or closed `fd` only makes the call fail.
        let rc =
            unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut event) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.0.as_raw_fd()
    }
}

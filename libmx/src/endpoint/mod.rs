//! An open MX endpoint: the protocol core, the transport port and the
//! application's requests, behind one lock.
//!
//! Every MX call on an endpoint takes its lock, lets the endpoint progress
//! (take in frames, run timers, turn core events into request completions,
//! send what the core emitted) and then does its own work. Blocking calls
//! release the lock while they sleep on the endpoint's doorbell, so other
//! threads (and `mx_wakeup`) can use the endpoint meanwhile. Unexpected
//! handlers run with the lock released, as MX allows them to post receives.

mod requests;
mod unexp;

use std::collections::{BTreeMap, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rustc_hash::FxHashMap;
use xmx_mx::{EndpointEvent, PeerAddr, RdmaWindow, RequestId, Status};

use self::unexp::Caller;
use crate::abi::{MxEndpointAddr, MxErrorHandler, MxReturn, MxStatus, MX_INFINITE};
use crate::addr::Addr;
use crate::counters::{self, Counter};
use crate::doorbell::Doorbell;
use crate::errors::{Failure, MxResult};
use crate::runtime::{self, Background, Library};
use crate::segments::Segments;
use crate::transport::{PullProgress, Regions, Transport, TransportPort};

pub(crate) use requests::AppRequest;
pub(crate) use requests::RequestKind;
pub(crate) use unexp::UnexpHandler;

/// Bits of a request token that number the request within its endpoint.
const SEQ_BITS: u32 = 40;
/// Frames taken in per progress round, so timers and sends keep their turn.
const FRAMES_PER_ROUND: usize = 256;
/// How often a LARGE send waiting for a window tries to register one again when nothing
/// of its own endpoint moved: the room may come from another process of the guest, which
/// signals nothing here. Slower than a starved pull's retry on purpose: room given back
/// goes to receives first, since a send's window holds its grants until a peer pulls it,
/// and sends that took all of two guests' grants would leave neither able to pull.
const WINDOW_RETRY: Duration = Duration::from_millis(100);
/// How long a LARGE send waits for a window, with no send of its endpoint giving one
/// back, before it fails with `MX_STATUS_NO_RESOURCES` (as long as a pull waits for room).
const WINDOW_WAIT_MAX: Duration = Duration::from_secs(10);

/// Whether a LARGE send queued at `queued` for a window has waited too long at `now`,
/// the endpoint's sends having last given a window back at `returned`: a long queue of
/// sends that move is not a transport that never makes room.
fn window_wait_over(
    queued: xmx_mx::Instant,
    returned: Option<xmx_mx::Instant>,
    now: xmx_mx::Instant,
) -> bool {
    let since = returned.map_or(queued, |r| r.max(queued));
    now.saturating_since(since) >= WINDOW_WAIT_MAX
}

/// The protocol core's time ([`runtime::now`]) at the wall-clock instant
/// `t`, so one clock reading serves both clocks.
fn core_time(t: std::time::Instant) -> xmx_mx::Instant {
    xmx_mx::Instant::from_nanos(t.saturating_duration_since(runtime::origin()).as_nanos() as u64)
}

/// Splits a request token into endpoint handle and request number.
pub(crate) fn split_token(token: usize) -> (u32, u64) {
    let t = token as u64;
    ((t >> SEQ_BITS) as u32, t & ((1 << SEQ_BITS) - 1))
}

fn make_token(handle: u32, seq: u64) -> usize {
    (((handle as u64) << SEQ_BITS) | seq) as usize
}

/// What an endpoint is opened with (from `mx_param_t`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct OpenParams {
    /// `MX_PARAM_ERROR_HANDLER`.
    pub(crate) error_handler: Option<MxErrorHandler>,
    /// `MX_PARAM_CONTEXT_ID`: (bits, shift).
    pub(crate) context_id: Option<(u8, u8)>,
}

/// What a core request id stands for in the library.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CoreRequestOwner {
    /// An application request.
    Request(u64),
    /// An eager send the application was told is complete.
    Zombie,
    /// Nobody wants this completion any more.
    Discard,
}

/// The state behind an endpoint's lock.
pub(crate) struct EndpointState {
    pub(crate) core: xmx_mx::Endpoint,
    port: Option<Box<dyn TransportPort>>,
    regions: Arc<dyn Regions>,
    pub(crate) requests: FxHashMap<u64, AppRequest>,
    pub(crate) links: FxHashMap<RequestId, CoreRequestOwner>,
    /// Completed, not yet reported requests in completion order.
    pub(crate) done: BTreeMap<u64, u64>,
    next_seq: u64,
    next_done: u64,
    zombies: usize,
    /// LARGE sends waiting for a free window, and the sends posted after
    /// them, in posting order, each with when it was queued.
    waiting_large: VecDeque<(u64, xmx_mx::Instant)>,
    /// When a LARGE send of the endpoint last gave its window back.
    window_returned: Option<xmx_mx::Instant>,
    addr_contexts: FxHashMap<(u64, u8), usize>,
    pub(crate) unexp: unexp::Unexp,
    completed: bool,
    /// The clock reading of the call that holds the state
    /// ([`AppEndpoint::with_state`]), for the core calls its own work makes:
    /// reading the clock again there cost a send or receive tens of
    /// nanoseconds for a reading a few hundred nanoseconds fresher.
    pub(crate) now: xmx_mx::Instant,
    /// The buffers of pulls started before a receive took their message
    /// (`EndpointEvent::EarlyPullNeeded`), by pull, until the transport ends
    /// each pull. Declared after `port`: fields drop in order, and a pull's
    /// buffer must outlive the port that writes into it.
    /// Each with the pull's length.
    early_pulls: FxHashMap<RequestId, (Vec<u8>, usize)>,
    /// Buffers of early pulls whose bytes were delivered, for the next: the
    /// same memory each time, a registration cache hit in a guest and no
    /// fresh pages to fault in natively.
    early_pool: Vec<Vec<u8>>,
}

/// Early-pull buffers kept for reuse per endpoint.
const EARLY_POOL_MAX: usize = 8;

impl EndpointState {
    /// A buffer for an early pull of `len` bytes, from the pool if one is long enough.
    fn early_buffer(&mut self, len: usize) -> Vec<u8> {
        match self.early_pool.iter().position(|b| b.capacity() >= len) {
            Some(i) => {
                let mut buf = self.early_pool.swap_remove(i);
                buf.clear();
                buf
            }
            None => Vec::with_capacity(len),
        }
    }

    /// Keeps a delivered (or failed) early pull's buffer for the next one.
    fn keep_early_buffer(&mut self, buf: Vec<u8>) {
        if self.early_pool.len() < EARLY_POOL_MAX {
            self.early_pool.push(buf);
        }
    }
}

/// What [`AppEndpoint::stall_view`] saw.
pub(crate) enum StallView {
    /// The endpoint's lock stayed held past the watch's patience.
    Locked,
    /// The endpoint's state.
    Seen {
        /// Requests completed since the endpoint opened.
        completed: u64,
        /// Requests (the application's and the core's) not finished.
        pending: usize,
        /// The account of the core and the port.
        text: String,
    },
}

/// Where a call's progress passes go around its work ([`AppEndpoint::with_passes`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Passes {
    /// Before and after: the work may need what arrived and may queue frames.
    Around,
    /// After only: the work posts (a send, a receive) and needs nothing that arrived.
    After,
    /// Before only: the work looks (a test, a probe) and queues nothing.
    Before,
}

/// An open endpoint.
pub(crate) struct AppEndpoint {
    handle: u32,
    index: u8,
    session: u32,
    nic_id: u64,
    error_handler: Option<MxErrorHandler>,
    ctxid_mask: u64,
    zombie_max: usize,
    doorbell: Arc<Doorbell>,
    transport: Arc<dyn Transport>,
    background: Arc<Background>,
    wakeups: AtomicU64,
    progression_disabled: AtomicBool,
    closed: AtomicBool,
    /// The core's next timer (nanos), `u64::MAX` for none.
    deadline: AtomicU64,
    /// The port's regions, reachable without the state lock: memory hooks
    /// (`mx__regcache_clean`) invalidate registrations from any thread.
    regions: Arc<dyn Regions>,
    state: Mutex<EndpointState>,
    handlers: Mutex<()>,
}

impl std::fmt::Debug for AppEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppEndpoint")
            .field("handle", &self.handle)
            .field("index", &self.index)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

thread_local! {
    static IN_HANDLER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl AppEndpoint {
    /// Opens endpoint `endpoint_id` (or any) of board `board` with
    /// application key `key`, and registers it with the library.
    pub(crate) fn open(
        lib: &Arc<Library>,
        board: u32,
        endpoint_id: Option<u8>,
        key: u32,
        params: OpenParams,
    ) -> MxResult<Arc<AppEndpoint>> {
        let ctxid_mask = match params.context_id {
            None | Some((0, _)) => 0,
            Some((bits, shift)) => {
                if bits > crate::abi::MX_CONTEXT_ID_BITS_MAX || bits as u32 + shift as u32 > 64 {
                    return Err(Failure::new(
                        MxReturn::BadParamVal,
                        format!("context id of {bits} bits at shift {shift}"),
                    ));
                }
                (((1u128 << bits) - 1) << shift) as u64
            }
        };
        let boards = lib.transport.boards();
        let Some(info) = boards.get(board as usize) else {
            return Err(Failure::new(
                MxReturn::BoardUnknown,
                format!("no board {board} ({} present)", boards.len()),
            ));
        };
        let handle = lib.new_handle();
        let background = lib.background();
        let unattended: Arc<dyn crate::doorbell::Unattended> = background.clone();
        let doorbell = Arc::new(Doorbell::new(
            lib.settings.spin,
            handle as u64,
            Some(unattended),
        ));
        let port = lib
            .transport
            .open(board, endpoint_id, doorbell.clone(), lib.settings.rcache)?;
        let config = lib.transport.tune(lib.settings.config.clone());
        let mut core = xmx_mx::Endpoint::new(config, port.index(), port.session(), key);
        // MX endpoints are connected to themselves from the start: sending
        // to the address of mx_get_endpoint_addr needs no mx_connect.
        match lib.transport.peer_index(info.nic_id) {
            Some(own) => {
                let me = PeerAddr::new(own, port.index());
                core.connect_self(me);
                port.regions().learn_session(me, port.session());
            }
            None => tracing::warn!(
                nic = format_args!("{:012x}", info.nic_id),
                "the board is not in its own peer table: no sends to itself"
            ),
        }
        let ep = Arc::new(AppEndpoint {
            handle,
            index: port.index(),
            session: port.session(),
            nic_id: info.nic_id,
            error_handler: params.error_handler,
            ctxid_mask,
            zombie_max: lib.settings.zombie_max,
            doorbell,
            transport: lib.transport.clone(),
            background,
            wakeups: AtomicU64::new(0),
            progression_disabled: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            deadline: AtomicU64::new(u64::MAX),
            regions: port.regions(),
            state: Mutex::new(EndpointState {
                core,
                regions: port.regions(),
                port: Some(port),
                requests: FxHashMap::default(),
                links: FxHashMap::default(),
                done: BTreeMap::new(),
                next_seq: 1,
                next_done: 1,
                zombies: 0,
                waiting_large: VecDeque::new(),
                window_returned: None,
                addr_contexts: FxHashMap::default(),
                unexp: unexp::Unexp::default(),
                completed: false,
                now: runtime::now(),
                early_pulls: FxHashMap::default(),
                early_pool: Vec::new(),
            }),
            handlers: Mutex::new(()),
        });
        lib.add_endpoint(ep.clone());
        tracing::debug!(
            handle,
            index = ep.index,
            session = ep.session,
            "endpoint open"
        );
        Ok(ep)
    }

    /// The `mx_endpoint_t` value given to the application.
    pub(crate) fn handle(&self) -> u32 {
        self.handle
    }

    /// The endpoint's own handler, if it was opened with one.
    pub(crate) fn error_handler(&self) -> Option<MxErrorHandler> {
        self.error_handler
    }

    /// Whether `mx_disable_progression` is in force.
    pub(crate) fn progression_disabled(&self) -> bool {
        self.progression_disabled.load(Ordering::SeqCst)
    }

    /// `mx_disable_progression` / `mx_reenable_progression`. Disabling
    /// returns once no handler runs on the progression thread: one it began
    /// before the switch ends first (the next sees the switch, see
    /// [`Self::run_handlers_from`]). An application refills what its
    /// handler takes (MPI's MX transport: a free list of requests) in such
    /// a section, trusting MX that no handler runs meanwhile.
    pub(crate) fn set_progression(&self, enabled: bool) {
        self.progression_disabled.store(!enabled, Ordering::SeqCst);
        if !enabled && !Self::in_handler() {
            drop(self.handlers.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }

    /// The next protocol timer, or the end of the application's lease if
    /// an arrival waits for it (see [`crate::doorbell::LEASE`]).
    pub(crate) fn next_deadline(&self) -> Option<xmx_mx::Instant> {
        let mut d = self.deadline.load(Ordering::SeqCst);
        if let Some(until) = self.doorbell.deferred_until() {
            d = d.min(until);
        }
        (d != u64::MAX).then(|| xmx_mx::Instant::from_nanos(d))
    }

    /// This endpoint's own address (`mx_get_endpoint_addr`).
    pub(crate) fn addr(&self) -> MxEndpointAddr {
        Addr {
            nic_id: self.nic_id,
            endpoint: self.index,
            session: self.session,
            local: self.handle,
        }
        .encode()
    }

    pub(crate) fn lock(&self) -> MxResult<MutexGuard<'_, EndpointState>> {
        self.lock_at(runtime::now())
    }

    /// [`Self::lock`] with the clock read by the caller at `now` (one
    /// reading serves a whole look of a polling wait).
    fn lock_at(&self, now: xmx_mx::Instant) -> MxResult<MutexGuard<'_, EndpointState>> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(self.closed_failure());
        }
        // Only application threads lock this way (the background thread
        // tries the lock): this use renews the application's lease.
        self.doorbell.touch(now.as_nanos());
        Ok(self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn closed_failure(&self) -> Failure {
        Failure::new(MxReturn::BadEndpoint, "the endpoint is closed")
    }

    /// Where the endpoint stands, for the stall watch (`XMX_STALL_REPORT_MS`):
    /// completions so far, requests pending, and a text account of the
    /// protocol core and the port. Tries the lock for a while and never
    /// blocks on it: a lock held that long is itself what gets reported.
    pub(crate) fn stall_view(&self) -> StallView {
        let mut tries = 0;
        let st = loop {
            match self.state.try_lock() {
                Ok(st) => break st,
                Err(std::sync::TryLockError::Poisoned(e)) => break e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) if tries < 100 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(std::sync::TryLockError::WouldBlock) => return StallView::Locked,
            }
        };
        let mut text = st.core.stall_report(runtime::now());
        text.push_str(&format!(
            "  library: {} requests, {} completed unreported, {} LARGE sends waiting for a window, {} zombies, closed {}\n",
            st.requests.len(),
            st.done.len(),
            st.waiting_large.len(),
            st.zombies,
            self.closed.load(Ordering::SeqCst)
        ));
        if let Some(port) = st.port.as_ref() {
            text.push_str(&port.describe());
        }
        StallView::Seen {
            completed: st.next_done,
            pending: st.requests.len() + st.core.pending_requests(),
            text,
        }
    }

    /// `mx_close_endpoint`: pending requests are dropped, blocked calls
    /// return, and the port closes (peers' frames are refused from then
    /// on) once the endpoint lingered, if its transport asks for that.
    pub(crate) fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        // Calls blocked on the endpoint return now, not after the settling.
        self.doorbell.ring_local();
        self.settle_before_close();
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.requests.clear();
        st.links.clear();
        st.done.clear();
        st.waiting_large.clear();
        st.core.close(runtime::now());
        drop(st);
        self.linger();
        self.state.lock().unwrap_or_else(|e| e.into_inner()).port = None;
        self.deadline.store(u64::MAX, Ordering::SeqCst);
        self.doorbell.ring_local();
        tracing::debug!(handle = self.handle, "endpoint closed");
    }

    /// What the partners still need from this endpoint before its port goes:
    /// the acks it owes (else they resend their last messages into a closed
    /// endpoint and read the refusal as a failed send) and the acks of its
    /// NOTIFYs (else a sender whose NOTIFY was lost waits for it until its
    /// rendezvous timeout). Bounded by a few retransmission delays; a
    /// vanished partner only costs that bound.
    fn settle_before_close(&self) {
        let limit = {
            let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            st.core.settle_limit()
        };
        let until = std::time::Instant::now() + limit;
        let _attending = self.doorbell.attend();
        loop {
            let seen = self.doorbell.generation();
            let (left, timer) = {
                let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                self.progress(&mut st);
                st.core.flush_acks();
                while let Some(frame) = st.core.poll_transmit() {
                    if let Some(port) = st.port.as_mut() {
                        counters::add(Counter::FramesSent, 1);
                        port.transmit(frame);
                    }
                }
                let timer = st.core.next_timeout().map(runtime::to_std);
                (st.core.unacked_notifies() + st.core.held_sends(), timer)
            };
            if left == 0 {
                return;
            }
            if std::time::Instant::now() >= until {
                tracing::debug!(left, "closing with NOTIFYs not acknowledged");
                return;
            }
            self.doorbell
                .wait(seen, Some(timer.map_or(until, |t| t.min(until))));
        }
    }

    /// The application's memory in `[addr, addr + len)` is going away: no
    /// cached registration may reach it any more (`mx__regcache_clean`).
    pub(crate) fn invalidate_registrations(&self, addr: usize, len: usize) {
        if !self.closed.load(Ordering::SeqCst) {
            self.regions.invalidate(addr, len);
        }
    }

    /// The closed endpoint keeps its port for the transport's
    /// [linger](Transport::close_linger) after the last frame a partner
    /// sent it, answering what partners resend with acks (see
    /// [`xmx_mx::Endpoint::close`]): the ack that ended an exchange may have
    /// been lost, and a partner that resends into a closed port reads the
    /// refusal as a failed send although its message was delivered.
    fn linger(&self) {
        let linger = self.transport.close_linger();
        let _attending = self.doorbell.attend();
        loop {
            let seen = self.doorbell.generation();
            let until = {
                let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                self.progress(&mut st);
                let until = st.core.linger_until(linger).map(runtime::to_std);
                if until.is_some_and(|t| t > std::time::Instant::now()) {
                    // Make sure the next arrival rings the doorbell.
                    if st.port.as_mut().is_some_and(|p| p.before_sleep()) {
                        continue;
                    }
                }
                until
            };
            match until {
                Some(t) if t > std::time::Instant::now() => self.doorbell.sleep(seen, Some(t)),
                _ => return,
            }
        }
    }

    /// Whether the calling thread runs an unexpected handler.
    pub(crate) fn in_handler() -> bool {
        IN_HANDLER.with(|h| h.get())
    }

    /// `mx_wakeup`: every call blocked on this endpoint returns.
    pub(crate) fn wakeup(&self) {
        self.wakeups.fetch_add(1, Ordering::SeqCst);
        self.doorbell.ring_local();
    }

    fn peer_of(&self, addr: &Addr) -> MxResult<PeerAddr> {
        let index = self.transport.peer_index(addr.nic_id).ok_or_else(|| {
            Failure::new(
                MxReturn::NicNotFound,
                format!("NIC {:012x} is not in the peer table", addr.nic_id),
            )
        })?;
        Ok(PeerAddr::new(index, addr.endpoint))
    }

    fn addr_of(&self, peer: PeerAddr, session: u32) -> Addr {
        Addr {
            nic_id: self.transport.peer_nic_id(peer.peer_index).unwrap_or(0),
            endpoint: peer.endpoint,
            session,
            local: self.handle,
        }
    }

    /// Runs `f` on the progressed state, then lets the endpoint progress
    /// again (to send what `f` queued) and runs unexpected handlers.
    pub(crate) fn with_state<T>(
        &self,
        f: impl FnOnce(&Self, &mut EndpointState) -> MxResult<T>,
    ) -> MxResult<T> {
        self.with_passes(Passes::Around, f).map(|(r, _)| r)
    }

    /// [`Self::with_state`] for a call that only posts work (`mx_isend`, `mx_irecv`):
    /// one progress pass, after `f`, which sends what `f` queued and takes in what
    /// arrived. A pass before `f` finds nothing `f` needs: a receive posted before an
    /// arrival is handled matches it as one posted after would, and a send waits for
    /// no arrival (a window an ack opens is used by the pass after).
    pub(crate) fn with_state_posting<T>(
        &self,
        f: impl FnOnce(&Self, &mut EndpointState) -> MxResult<T>,
    ) -> MxResult<T> {
        self.with_passes(Passes::After, f).map(|(r, _)| r)
    }

    /// Runs `f` under the endpoint's lock with the progress passes `passes`
    /// names, then the unexpected handlers; also says whether progress moved
    /// anything.
    fn with_passes<T>(
        &self,
        passes: Passes,
        f: impl FnOnce(&Self, &mut EndpointState) -> MxResult<T>,
    ) -> MxResult<(T, bool)> {
        // One clock reading for the lease and both progress passes: they
        // are microseconds apart, and a timer seen due that much later
        // fires at the next progress.
        let now = runtime::now();
        let (r, handlers) = {
            let mut st = self.lock_at(now)?;
            st.now = now;
            let mut moved = passes != Passes::After && self.progress_at(&mut st, now);
            if passes != Passes::After && Self::handlers_pending(&st) {
                // MX shows an unexpected message to the handler as progress
                // meets it, so what the handler receives is complete when
                // the call that progressed looks. An MPI that takes one
                // completion of each kind per poll otherwise sees a later
                // message (already matched) before the earlier ones its
                // handler posts receives for.
                drop(st);
                self.run_handlers();
                st = self.lock_at(now)?;
                st.now = now;
            }
            let r = f(self, &mut st);
            if passes != Passes::Before {
                moved |= self.progress_at(&mut st, now);
            }
            (r.map(|r| (r, moved)), Self::handlers_pending(&st))
        };
        if handlers {
            self.run_handlers();
        }
        r
    }

    /// A nonblocking call (`mx_test`, `mx_iprobe`, ...): one progress pass,
    /// before `f` (`f` queues nothing for a pass after it to send, and an
    /// idle MPI progress engine makes several such calls per round, each a
    /// look at the link), then, when it found nothing and nothing moved, a `sched_yield` before
    /// it returns as [`Doorbell::idle_call`] says.
    ///
    /// An application that polls in a tight loop (an MPI progress engine)
    /// would otherwise hold its core until the scheduler preempts it, and
    /// the backend or peer that must make the next step waits a time slice
    /// when pollers outnumber cores; a yield costs one system call when
    /// nobody else wants the core. The call never sleeps, however long
    /// nothing moves: the progress engine calling it may be waiting for
    /// something the library never sees (an MPI's shared-memory messages
    /// between ranks of one host, its own sends to itself), and a nap here
    /// made each of its rounds last the nap (a millisecond a message between
    /// two ranks of one host). A thread that wants to sleep calls `mx_wait`.
    pub(crate) fn poll_state<T>(
        &self,
        f: impl FnOnce(&Self, &mut EndpointState) -> MxResult<Option<T>>,
    ) -> MxResult<Option<T>> {
        let seen = self.doorbell.generation();
        let (found, moved) = self.with_passes(Passes::Before, f)?;
        if found.is_some() || moved || seen != self.doorbell.generation() {
            self.doorbell.call_moved();
        } else if self.doorbell.idle_call() {
            std::thread::yield_now();
        }
        Ok(found)
    }

    /// Asks the port to signal the next arrival ([`TransportPort::before_sleep`]);
    /// true if something arrived meanwhile, and the descriptor the signal
    /// comes on, if the port has one.
    fn prepare_sleep(&self) -> MxResult<(bool, Option<crate::transport::ArrivalFds>)> {
        let mut st = self.lock()?;
        Ok(match st.port.as_mut() {
            Some(p) => (p.before_sleep(), p.arrival_fds()),
            None => (false, None),
        })
    }

    /// Sleeps while the doorbell's generation is `seen`, at most until
    /// `until`: on the port's `arrival` descriptor if it has one, so the
    /// arrival wakes this thread itself ([`Doorbell::sleep_on`]), else on the
    /// doorbell alone.
    fn sleep_for_arrival(
        &self,
        arrival: Option<crate::transport::ArrivalFds>,
        seen: u64,
        until: Option<std::time::Instant>,
    ) {
        if let Some(fds) = arrival {
            match self.doorbell.sleep_on(fds, seen, until) {
                Some(true) => {
                    let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(p) = st.port.as_mut() {
                        p.take_arrival_signal();
                    }
                    return;
                }
                Some(false) => return,
                None => {}
            }
        }
        self.doorbell.sleep(seen, until);
    }

    /// `mx_progress` and the background thread: progress if the endpoint
    /// is free. Returns false if another thread holds it.
    pub(crate) fn background_progress(&self) -> bool {
        if self.closed.load(Ordering::SeqCst) {
            return true;
        }
        let Ok(mut st) = self.state.try_lock() else {
            return false;
        };
        self.progress(&mut st);
        drop(st);
        self.run_handlers_from(Caller::ProgressionThread);
        true
    }

    /// Moves everything forward: frames in, timers, events, frames out.
    /// True if anything moved.
    fn progress(&self, st: &mut EndpointState) -> bool {
        self.progress_at(st, runtime::now())
    }

    /// [`Self::progress`] at `now`, a clock reading the caller made.
    fn progress_at(&self, st: &mut EndpointState, now: xmx_mx::Instant) -> bool {
        self.doorbell.clear_deferred();
        // What the caller queued since the last progress (a send) leaves
        // before the port is polled: the pass below takes in and handles
        // whatever arrived first, and a ping-pong's message waited for a
        // whole look of every ring before it went out.
        let mut moved = false;
        while let Some(frame) = st.core.poll_queued_transmit() {
            counters::add(Counter::FramesSent, 1);
            if let Some(port) = st.port.as_mut() {
                port.transmit(frame);
            }
            moved = true;
        }
        loop {
            let mut work = false;
            let mut drained = true;
            if let Some(port) = st.port.as_mut() {
                drained = false;
                for _ in 0..FRAMES_PER_ROUND {
                    let Some(f) = port.receive() else {
                        drained = true;
                        break;
                    };
                    counters::add(Counter::FramesReceived, 1);
                    st.core.handle_frame(now, f.as_borrowed());
                    work = true;
                }
            }
            if st.port.as_mut().is_some_and(|p| p.take_path_restored()) {
                tracing::debug!(
                    index = self.index,
                    "path restored; resending what is unacked"
                );
                st.core.path_restored(now);
                work = true;
            }
            if st.core.next_timeout().is_some_and(|t| t <= now) {
                st.core.handle_timeout(now);
                work = true;
            }
            if let Some(why) = st.port.as_ref().and_then(|p| p.gone()) {
                // Nothing will carry a frame again: waiting out the retry
                // budget would only hide that for minutes.
                if st.core.pending_requests() > 0 {
                    tracing::debug!(why, "endpoint lost; its requests fail");
                    st.core.abandon_all(Status::Aborted);
                }
                // LARGE sends still waiting for a window never reached the
                // core, and no window will come (registering needs the lost
                // daemon or backend): they fail too, or their waiters hang.
                while let Some((seq, _)) = st.waiting_large.pop_front() {
                    let Some(r) = st.requests.get_mut(&seq) else {
                        continue;
                    };
                    r.code = Status::Aborted;
                    self.complete(st, seq);
                    work = true;
                }
            }
            while let Some((id, result)) = st.regions.completed_pull() {
                self.finish_pull(st, now, id, result);
                work = true;
            }
            while let Some(ev) = st.core.poll_event() {
                self.on_event(st, now, ev);
                work = true;
            }
            self.start_waiting_large(st, now);
            while let Some(frame) = st.core.poll_transmit() {
                counters::add(Counter::FramesSent, 1);
                if let Some(port) = st.port.as_mut() {
                    port.transmit(frame);
                }
                work = true;
            }
            if !work {
                break;
            }
            moved = true;
            // Another pass only for what this one left: frames beyond the
            // round, completions the sends above made, a timer already due,
            // input the port's own work queued. Looking at every ring again
            // for arrivals cost a whole look per progress that moved
            // anything (twice in a ping-pong's half round trip); the next
            // look sees them.
            let left = !drained
                || st.core.has_events()
                || st.core.next_timeout().is_some_and(|t| t <= now)
                || st.port.as_ref().is_some_and(|p| p.queued());
            if !left {
                break;
            }
        }
        let mut next = st.core.next_timeout();
        if !st.waiting_large.is_empty() {
            // Nothing signals room to register: look again soon.
            let retry = now + WINDOW_RETRY;
            next = Some(next.map_or(retry, |t| t.min(retry)));
        }
        // Stored only when it moved: most progress leaves it where it was,
        // and a SeqCst store costs an exchange.
        let next_ns = next.map_or(u64::MAX, |t| t.as_nanos());
        if self.deadline.load(Ordering::SeqCst) != next_ns {
            self.deadline.store(next_ns, Ordering::SeqCst);
        }
        if let Some(t) = next {
            self.background.nudge(t);
        }
        if std::mem::take(&mut st.completed) {
            self.doorbell.ring_local();
        }
        moved
    }

    fn on_event(&self, st: &mut EndpointState, now: xmx_mx::Instant, ev: EndpointEvent) {
        match ev {
            EndpointEvent::Connected { id, status, addr } => {
                let Some(CoreRequestOwner::Request(seq)) = st.links.remove(&id) else {
                    return;
                };
                if let Some(r) = st.requests.get_mut(&seq) {
                    r.code = status;
                    if let Some(a) = addr {
                        r.source = self.addr_of(a.peer, a.session);
                    }
                }
                self.complete(st, seq);
            }
            EndpointEvent::SendDone {
                id,
                status,
                xfer_length,
            } => match st.links.remove(&id) {
                Some(CoreRequestOwner::Zombie) => {
                    st.zombies = st.zombies.saturating_sub(1);
                    if !status.is_success() {
                        tracing::warn!(%status, "a send reported complete failed later");
                    }
                }
                Some(CoreRequestOwner::Request(seq)) => {
                    let Some(r) = st.requests.get_mut(&seq) else {
                        return;
                    };
                    r.code = status;
                    if let Some(w) = r.window.take() {
                        st.regions.release(w);
                        st.window_returned = Some(now);
                    }
                    if r.kind == (RequestKind::Send { eager: false }) {
                        // Rendezvous: what the receiver took.
                        r.xfer_length = xfer_length;
                    } else if status.is_success() {
                        r.xfer_length = r.msg_length;
                    }
                    if status.is_success() {
                        counters::add(Counter::BytesSent, r.xfer_length as u64);
                    }
                    self.complete(st, seq);
                }
                _ => {}
            },
            EndpointEvent::RecvDone(done) => {
                if let Some(CoreRequestOwner::Request(seq)) = st.links.remove(&done.id) {
                    self.finish_recv(st, seq, done);
                }
            }
            EndpointEvent::Unexpected(arrival) => self.unexp_arrived(st, arrival),
            EndpointEvent::PullNeeded(p) => match st.links.get(&p.id).copied() {
                Some(CoreRequestOwner::Request(seq)) => {
                    let Some(r) = st.requests.get(&seq) else {
                        let _ = st.core.pull_done(now, p.id, Status::Aborted);
                        return;
                    };
                    let progress = if Self::beyond_one_window(st, p.length as usize) {
                        // No room would ever come: waiting for it only delays the error.
                        PullProgress::Done(Err(Status::NoResources))
                    } else {
                        st.regions
                            .pull(p.id, p.source.peer, p.window, &r.segs, p.length)
                    };
                    if let PullProgress::Done(result) = progress {
                        self.finish_pull(st, now, p.id, result);
                    }
                }
                _ => {
                    // Dropped receive: tell the sender nothing was taken.
                    let _ = st.core.pull_done(now, p.id, Status::Aborted);
                }
            },
            EndpointEvent::EarlyPullNeeded(p) => {
                // Not zeroed: the pull writes every byte before any is read
                // (see `finish_pull`), and zeroing cost as much as the copy out.
                let mut buf = st.early_buffer(p.length as usize);
                // SAFETY: the block `buf` reserved is kept in `early_pulls`
                // until the transport reports this pull ended (`finish_pull`)
                // or the port is gone (it drops first), and is never resized
                // meanwhile: a Vec's heap block does not move when the Vec
                // itself is moved. The transport only writes through it.
                let segs = unsafe {
                    Segments::from_parts(vec![(buf.as_mut_ptr() as usize, p.length as usize)])
                };
                st.early_pulls.insert(p.id, (buf, p.length as usize));
                let progress = st
                    .regions
                    .pull(p.id, p.source.peer, p.window, &segs, p.length);
                if let PullProgress::Done(result) = progress {
                    self.finish_pull(st, now, p.id, result);
                }
            }
        }
    }

    fn finish_pull(
        &self,
        st: &mut EndpointState,
        now: xmx_mx::Instant,
        id: RequestId,
        result: Result<(), Status>,
    ) {
        counters::add(Counter::Pulls, 1);
        if let Some((mut buf, len)) = st.early_pulls.remove(&id) {
            let result = match result {
                Ok(()) => {
                    // SAFETY: `buf` reserved `len` bytes (the pull's length),
                    // and a transport reports a pull done only once it wrote
                    // every one of them: all `len` are initialised.
                    unsafe { buf.set_len(len) };
                    Ok(buf)
                }
                Err(status) => {
                    st.keep_early_buffer(buf);
                    Err(status)
                }
            };
            if st.core.early_pull_done(now, id, result).is_err() {
                tracing::debug!(?id, "early pull finished for a message that is gone");
            }
            return;
        }
        let status = match result {
            Ok(()) => Status::Success,
            Err(s) => s,
        };
        if st.core.pull_done(now, id, status).is_err() {
            tracing::debug!(?id, "pull finished for a receive that is gone");
        }
    }

    fn finish_recv(&self, st: &mut EndpointState, seq: u64, done: xmx_mx::RecvDone) {
        let Some(r) = st.requests.get_mut(&seq) else {
            return;
        };
        let written = if done.data.is_empty() {
            done.xfer_length as usize
        } else {
            r.segs.scatter(&done.data)
        };
        // Only a LARGE message pulled before its receive brings more than a
        // MEDIUM's bytes: its buffer serves the next early pull.
        let early = done.data.capacity() > xmx_mx::MEDIUM_MAX;
        r.code = done.status;
        r.source = Addr {
            nic_id: self
                .transport
                .peer_nic_id(done.source.peer.peer_index)
                .unwrap_or(0),
            endpoint: done.source.peer.endpoint,
            session: done.source.session,
            local: self.handle,
        };
        r.match_info = done.match_info;
        r.msg_length = done.msg_length;
        r.xfer_length = written as u32;
        counters::add(Counter::BytesReceived, r.xfer_length as u64);
        self.complete(st, seq);
        if early {
            st.keep_early_buffer(done.data);
        }
    }

    /// A request finished: queue it for test/wait (or drop it if forgotten).
    pub(crate) fn complete(&self, st: &mut EndpointState, seq: u64) {
        let Some(r) = st.requests.get_mut(&seq) else {
            return;
        };
        if r.forgotten {
            st.requests.remove(&seq);
            return;
        }
        let order = st.next_done;
        st.next_done += 1;
        r.done = Some(order);
        if !r.internal {
            st.done.insert(order, seq);
        }
        st.completed = true;
    }

    fn start_waiting_large(&self, st: &mut EndpointState, now: xmx_mx::Instant) {
        while let Some(&(seq, queued)) = st.waiting_large.front() {
            let Some(r) = st.requests.get_mut(&seq) else {
                st.waiting_large.pop_front();
                continue;
            };
            if let Some(data) = r.data.take() {
                st.waiting_large.pop_front();
                let (dest, match_info) = (r.dest, r.match_info);
                match dest.map(|d| st.core.send_owned(now, d, match_info, data)) {
                    Some(Ok(id)) => self.eager_sent(st, seq, id),
                    _ => {
                        if let Some(r) = st.requests.get_mut(&seq) {
                            r.code = Status::EndpointUnreachable;
                        }
                        self.complete(st, seq);
                    }
                }
                continue;
            }
            let Some(window) = self.window_for(st, seq) else {
                if !window_wait_over(queued, st.window_returned, now) {
                    return;
                }
                tracing::warn!(
                    index = self.index,
                    "a LARGE send found no window to register in time; it fails"
                );
                st.waiting_large.pop_front();
                if let Some(r) = st.requests.get_mut(&seq) {
                    r.code = Status::NoResources;
                }
                self.complete(st, seq);
                continue;
            };
            st.waiting_large.pop_front();
            self.launch_large(st, now, seq, window);
        }
    }

    /// The window a rendezvous send `seq` lends its data through; `None`
    /// while the transport has no free window. An empty message (a 0-byte
    /// `mx_issend`) still announces a registered window, as engines check
    /// every rendezvous against one: a one-byte stand-in that nobody reads
    /// (transports finish 0-byte pulls at once).
    pub(super) fn window_for(&self, st: &mut EndpointState, seq: u64) -> Option<RdmaWindow> {
        let r = st.requests.get(&seq)?;
        if r.segs.is_empty() {
            static STAND_IN: [u8; 1] = [0];
            // SAFETY: a static lives for the whole process and windows are
            // only ever read from (pulls copy out of them).
            let segs = unsafe { Segments::from_parts(vec![(STAND_IN.as_ptr() as usize, 1)]) };
            return st.regions.register(&segs);
        }
        st.regions.register(&r.segs)
    }

    /// Whether a LARGE message of `len` bytes is longer than one window of the
    /// transport holds (a guest's region: 96 MiB), said in the log when it is.
    pub(super) fn beyond_one_window(st: &EndpointState, len: usize) -> bool {
        let Some(max) = st.regions.window_len_max().filter(|&max| len > max) else {
            return false;
        };
        tracing::warn!(
            len,
            max,
            "a LARGE message longer than one window of this transport holds: it fails \
             with MX_STATUS_NO_RESOURCES"
        );
        true
    }

    fn launch_large(
        &self,
        st: &mut EndpointState,
        now: xmx_mx::Instant,
        seq: u64,
        window: RdmaWindow,
    ) {
        let Some(r) = st.requests.get_mut(&seq) else {
            st.regions.release(window);
            return;
        };
        let Some(dest) = r.dest else { return };
        match st
            .core
            .send_large(now, dest, r.match_info, r.msg_length, window)
        {
            Ok(id) => {
                r.window = Some(window);
                r.core = Some(id);
                st.links.insert(id, CoreRequestOwner::Request(seq));
            }
            Err(e) => {
                st.regions.release(window);
                tracing::debug!(%e, "rendezvous send refused");
                r.code = Status::EndpointUnreachable;
                self.complete(st, seq);
            }
        }
    }

    /// Blocks until `check` finds what it looks for, the timeout passes
    /// (`MX_INFINITE`: never) or `mx_wakeup` is called; `Ok(None)` for the
    /// last two.
    pub(crate) fn block<T>(
        &self,
        timeout_ms: u32,
        mut check: impl FnMut(&Self, &mut EndpointState) -> Option<T>,
    ) -> MxResult<Option<T>> {
        let deadline = (timeout_ms != MX_INFINITE)
            .then(|| std::time::Instant::now() + Duration::from_millis(timeout_ms as u64));
        let woken = self.wakeups.load(Ordering::SeqCst);
        let _attending = self.doorbell.attend();
        // The thread polls the endpoint itself for the doorbell's spin: an
        // arrival is seen without a notification and a thread hop (each costs
        // more than a round trip on the wire), and the transport is told so.
        let spin = self.doorbell.spin();
        let mut polling = Some(self.doorbell.polling());
        let mut poll_until = std::time::Instant::now() + spin;
        // What is already complete (a small send completes as it leaves) is taken
        // without a look at the port first.
        {
            let found = check(self, &mut *self.lock()?);
            if found.is_some() {
                return Ok(found);
            }
        }
        loop {
            let seen = self.doorbell.generation();
            // One clock reading per look: the lease, the core's timers and
            // the spin's end all take it (each reading cost about as much as
            // looking at an empty direct lane).
            let now = std::time::Instant::now();
            let core_now = core_time(now);
            let found = {
                let mut st = self.lock_at(core_now)?;
                self.progress_at(&mut st, core_now);
                if Self::handlers_pending(&st) {
                    // As in `with_passes`: handlers first, then the look.
                    drop(st);
                    self.run_handlers();
                    st = self.lock_at(core_now)?;
                }
                check(self, &mut st)
            };
            if found.is_some() {
                return Ok(found);
            }
            if self.closed.load(Ordering::SeqCst) {
                return Err(self.closed_failure());
            }
            if self.wakeups.load(Ordering::SeqCst) != woken {
                return Ok(None);
            }
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            if now < poll_until {
                // Yielding, not spinning: with more pollers than cores, the
                // thread that holds the message gets a core at once.
                std::thread::yield_now();
                continue;
            }
            drop(polling.take());
            let (arrived, arrival) = self.prepare_sleep()?;
            if !arrived {
                let timer = self.next_deadline().map(runtime::to_std);
                let until = match (deadline, timer) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                self.sleep_for_arrival(arrival, seen, until);
            }
            polling.get_or_insert_with(|| self.doorbell.polling());
            poll_until = std::time::Instant::now() + spin;
        }
    }

    fn new_request(&self, st: &mut EndpointState, r: AppRequest) -> u64 {
        let seq = st.next_seq;
        st.next_seq += 1;
        st.requests.insert(seq, r);
        seq
    }

    /// The token the application holds for request `seq`.
    pub(crate) fn token(&self, seq: u64) -> usize {
        make_token(self.handle, seq)
    }

    fn seq_of(&self, token: usize) -> MxResult<u64> {
        let (h, seq) = split_token(token);
        if h != self.handle || seq == 0 {
            return Err(Failure::new(
                MxReturn::BadRequest,
                format!("{token:#x} is not a request of this endpoint"),
            ));
        }
        Ok(seq)
    }

    fn status_of(&self, r: &AppRequest) -> MxStatus {
        MxStatus {
            code: r.code.code(),
            source: r.source.encode(),
            match_info: r.match_info,
            msg_length: r.msg_length,
            xfer_length: r.xfer_length,
            context: r.context as *mut c_void,
        }
    }

    /// Checks a receive-side `(match_info, match_mask)` pair.
    fn check_match(&self, match_info: u64, match_mask: u64) -> MxResult<()> {
        if match_info & !match_mask != 0 {
            return Err(Failure::new(
                MxReturn::BadMatchMask,
                format!("match info {match_info:#x} has bits outside mask {match_mask:#x}"),
            ));
        }
        if self.ctxid_mask & !match_mask != 0 {
            return Err(Failure::new(
                MxReturn::BadMatchingForContextIdMask,
                format!(
                    "mask {match_mask:#x} leaves context-id bits {:#x} unmatched",
                    self.ctxid_mask
                ),
            ));
        }
        Ok(())
    }

    /// `mx_set_endpoint_addr_context`.
    pub(crate) fn set_addr_context(&self, addr: &Addr, context: usize) -> MxResult<()> {
        let mut st = self.lock()?;
        st.addr_contexts.insert(addr.remote(), context);
        Ok(())
    }

    /// `mx_get_endpoint_addr_context` (NULL if never set).
    pub(crate) fn addr_context(&self, addr: &Addr) -> MxResult<usize> {
        let st = self.lock()?;
        Ok(st.addr_contexts.get(&addr.remote()).copied().unwrap_or(0))
    }
}

#[cfg(test)]
mod window_wait_tests {
    use super::*;

    fn at(secs: u64) -> xmx_mx::Instant {
        xmx_mx::Instant::from_millis(secs * 1000)
    }

    /// A send behind a long queue of sends that give windows back keeps waiting; one
    /// that sees no window come back for the bound fails.
    #[test]
    fn a_send_waits_while_windows_come_back_and_fails_when_none_do() {
        assert!(!window_wait_over(at(0), None, at(9)));
        assert!(window_wait_over(at(0), None, at(10)));
        // Queued 12 s ago, a window came back 2 s ago: still waiting.
        assert!(!window_wait_over(at(0), Some(at(10)), at(12)));
        // A window came back before it was queued: the queueing counts.
        assert!(window_wait_over(at(5), Some(at(1)), at(15)));
        assert!(window_wait_over(at(0), Some(at(10)), at(20)));
    }
}

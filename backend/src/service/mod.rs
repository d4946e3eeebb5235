//! The backend daemon's service: one thread serving every guest.
//!
//! [`Backend`] owns the MX [`Engine`], the NIC, one event-channel handle and one xenstore
//! connection, and runs a loop over them (see [`Backend::run`]). One thread serves all
//! guests on purpose: the machines this runs on have few cores, and busy pollers beyond the
//! core count preempt each other until latency is the scheduler's time slice.
//!
//! # A round
//!
//! 1. requests from the control socket, then xenstore watch events (device lifecycle);
//! 2. (pending event-channel ports are acknowledged only before the loop sleeps: rings
//!    are polled anyway, and reading the ports is a system call);
//! 3. frames waiting on the NIC go into the engine, as a batch;
//! 4. every connected guest: its control ring is served; for each endpoint, the event
//!    slots the application returned are reclaimed (releasing the receive-queue slots the
//!    events carried), then at most `send_budget_per_round` send requests are taken, so one
//!    busy guest cannot starve the others;
//! 5. engine timeouts, then the engine's frames go to the NIC with one flush;
//! 6. the engine's events are queued per endpoint and written into the event rings, with a
//!    notification only where the ring's check says the application asked for one;
//! 7. guests that broke the protocol are disconnected, alone.
//!
//! When a round found nothing to do, the loop keeps polling for a bounded spin budget
//! (`spin`, 200 us by default; it yields the core between rounds, so a guest or a peer
//! backend that has the next step to do runs at once even with more pollers than
//! cores), then re-arms every ring's event index with a final check and
//! sleeps in `epoll` on the NIC, the event-channel handle, the xenstore watch queue and a
//! wake-up eventfd, until a frame, a notification, a watch, a command or the engine's next
//! timeout.
//!
//! # Receive-queue slots
//!
//! A RECV_MEDIUM event lends the application one slot of its receive queue. The slot goes
//! back to the engine when the application returns that event's slot of the event ring, so
//! the application copies a fragment out of the receive queue before it retires the event.
//!
//! # Hostile guests
//!
//! Rings copy each request out of shared memory before it is decoded. A slot that does not
//! decode, a producer index no correct peer could write, or a request the engine refuses as
//! a [`Violation`](xmx_engine::Violation) disconnects that guest only: its device goes
//! Closing, everything it shared is unmapped, its ports are closed, and it goes Closed.

mod commands;
mod control;
mod devices;
mod guest;
mod kept;
mod link;
mod memory;
mod quota;

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use xmx_hv::{DomId, EventChannels, GrantTable, Platform, Port, Xenstore};
use xmx_wire::ring::RingError;

use crate::admin::{BackdRequest, BackendCounters, Reply, ReplyError};
use control::{ControlCtx, SessionIds};
use devices::Device;
use guest::Connection;
use xmx_engine::{Engine, EngineConfig};
use xmx_hv::daemon::control::{LineServer, LineService, Refusal};

pub use guest::DeviceKey;
pub use link::{FrameLink, LinkFault};
pub use memory::GrantMemory;
pub use quota::{GuestQuotas, GuestUsage};

/// How the backend runs.
#[derive(Debug, Clone)]
pub struct BackendConfig {
    /// How long an idle loop keeps polling before it sleeps.
    pub spin: Duration,
    /// This host's name; guests without a `hostname` key are named `<host>-<domid>:<devid>`.
    pub host_name: String,
    /// Per-guest limits.
    pub quotas: GuestQuotas,
    /// The MX engine's limits and timers.
    pub engine: EngineConfig,
    /// Where to serve the status and control socket, if anywhere.
    pub control_socket: Option<std::path::PathBuf>,
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig {
            spin: Duration::from_micros(200),
            host_name: "xmx".into(),
            quotas: GuestQuotas::default(),
            engine: EngineConfig::default(),
            control_socket: None,
        }
    }
}

/// Why the backend could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The hypervisor platform failed (xenstore connection lost, device unusable).
    #[error("platform: {0}")]
    Platform(#[from] xmx_hv::Error),
    /// A system call of the loop failed.
    #[error("{op}: {source}")]
    Sys {
        /// The call that failed.
        op: &'static str,
        /// Its error.
        #[source]
        source: std::io::Error,
    },
}

fn sys(op: &'static str) -> impl FnOnce(nix::errno::Errno) -> BackendError {
    move |e| BackendError::Sys {
        op,
        source: e.into(),
    }
}

/// A request from the control socket with the way back to its caller.
struct Command {
    request: BackdRequest,
    reply: SyncSender<Reply>,
}

/// Requests queued for the service loop at most.
const COMMAND_QUEUE: usize = 64;
/// How long a caller waits for the loop to answer.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// A service round at least this long is logged as a warning.
const SLOW_ROUND: Duration = Duration::from_secs(1);
/// Every this many rounds the polling loop looks at every device; in between only at
/// those with an endpoint open ([`Backend::active`]). A device without one has only its
/// control ring to serve (an endpoint's opening, a status), and `arm` looks at every
/// device before the loop sleeps. Looking at each of 40 idle guests every round made a
/// round several times longer and the one talking pair's latency with it.
const FULL_ROUND_EVERY: u64 = 16;

/// Sends requests to a running backend and waits for its answers; cheap to clone.
#[derive(Clone)]
pub struct ControlHandle {
    tx: SyncSender<Command>,
    wake: Arc<EventFd>,
    closed: Arc<AtomicBool>,
}

impl ControlHandle {
    /// Have the service loop answer `request`.
    pub fn call(&self, request: BackdRequest) -> Reply {
        let (reply_tx, reply_rx) = mpsc::sync_channel(1);
        let cmd = Command {
            request,
            reply: reply_tx,
        };
        if self.tx.try_send(cmd).is_err() {
            return Reply::err(ReplyError::new(
                "busy",
                "the backend is not taking requests",
            ));
        }
        let _ = self.wake.write(1);
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        // Waits in slices so a caller notices a backend that stopped without answering.
        while Instant::now() < deadline && !self.closed.load(Ordering::Acquire) {
            match reply_rx.recv_timeout(Duration::from_millis(100)) {
                Ok(reply) => return reply,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        Reply::err(ReplyError::new("closed", "the backend did not answer"))
    }
}

impl LineService for ControlHandle {
    type RequestLine = BackdRequest;
    type ReplyLine = Reply;

    fn answer(&self, request: BackdRequest) -> Reply {
        self.call(request)
    }

    fn refuse(&self, refusal: Refusal) -> Reply {
        Reply::err(match refusal {
            Refusal::NotRequest(e) => ReplyError::new("invalid", format!("request: {e}")),
            Refusal::TooLong => ReplyError::new("invalid", "request line too long"),
            Refusal::Busy => ReplyError::new("busy", "too many control connections"),
        })
    }
}

/// Stops a running backend from another thread; cheap to clone.
#[derive(Clone)]
pub struct BackendStopper {
    flag: Arc<AtomicBool>,
    wake: Arc<EventFd>,
}

impl BackendStopper {
    /// Ask the loop to disconnect every guest and return.
    pub fn stop(&self) {
        self.flag.store(true, Ordering::Release);
        let _ = self.wake.write(1);
    }
}

/// A backend running on its own thread.
pub struct BackendThread {
    handle: Option<JoinHandle<Result<(), BackendError>>>,
    stopper: BackendStopper,
    control: ControlHandle,
}

impl BackendThread {
    /// A handle for requests.
    pub fn control(&self) -> ControlHandle {
        self.control.clone()
    }

    /// A handle that stops the loop.
    pub fn stopper(&self) -> BackendStopper {
        self.stopper.clone()
    }

    /// Stop the loop and wait for it; the loop's own result.
    pub fn stop(mut self) -> Result<(), BackendError> {
        self.stopper.stop();
        self.join()
    }

    fn join(&mut self) -> Result<(), BackendError> {
        match self.handle.take() {
            Some(h) => h.join().unwrap_or_else(|_| {
                Err(BackendError::Sys {
                    op: "backend thread",
                    source: std::io::Error::other("panicked"),
                })
            }),
            None => Ok(()),
        }
    }
}

impl Drop for BackendThread {
    fn drop(&mut self) {
        self.stopper.stop();
        let _ = self.join();
    }
}

/// Epoll tokens.
const TOKEN_EVTCHN: u64 = 1;
const TOKEN_XENSTORE: u64 = 2;
const TOKEN_WAKE: u64 = 3;
const TOKEN_NIC: u64 = 4;

/// Watch tokens.
const WATCH_BACKEND: &str = "xmx-backd:backend";
const WATCH_RELEASE: &str = "xmx-backd:release";
const WATCH_FRONTEND_PREFIX: &str = "xmx-backd:frontend:";

/// The dom0 backend of device `xmx`; see the module documentation.
pub struct Backend {
    cfg: BackendConfig,
    domid: DomId,
    xs: Box<dyn Xenstore>,
    gnttab: Arc<dyn GrantTable>,
    evtchn: Box<dyn EventChannels>,
    engine: Engine,
    link: Option<Box<dyn FrameLink>>,
    /// Set while the link fails (down, interface gone); see [`link`].
    link_fault: Option<LinkFault>,
    devices: BTreeMap<DeviceKey, Device>,
    sessions: SessionIds,
    next_region: u64,
    counters: BackendCounters,
    /// Ring drops counted by sockets since replaced ([`BackendCounters::nic_rx_ring_drops`]).
    rx_ring_drops_closed: u64,
    epoll: Epoll,
    wake: Arc<EventFd>,
    stop: Arc<AtomicBool>,
    commands: Option<Receiver<Command>>,
    control: ControlHandle,
    admin: Option<LineServer>,
    /// The devices with an endpoint open at the last full round (and any since that
    /// got one: endpoints open only through the control ring, which a device without
    /// one has served in full rounds only), in key order.
    active: Vec<DeviceKey>,
    /// Set when a round saw a device break the protocol: `disconnect_failed` looks.
    failing: bool,
    /// Scratch list of the devices a round visits.
    visiting: Vec<DeviceKey>,
    /// This round looks at every device: every [`FULL_ROUND_EVERY`]th, and the first
    /// after the loop slept (what woke it may be an idle device's control request).
    full: bool,
    after_sleep: bool,
    /// Scratch lists reused every round.
    ports: Vec<Port>,
    released: Vec<u16>,
}

/// What a device counts of its control requests, and where its sessions are recorded.
struct DeviceTally<'a> {
    backend_dir: &'a str,
    ctrl_requests: &'a mut u64,
    quota_refusals: &'a mut u64,
}

/// Answers every request waiting on `conn`'s control ring; true if any was. A ring that
/// breaks fails the connection.
fn serve_control_ring(
    ctx: &mut ControlCtx<'_>,
    xs: &dyn Xenstore,
    tally: DeviceTally<'_>,
    conn: &mut Connection,
) -> bool {
    let mut answered = 0;
    loop {
        let req = match conn.ctrl.next_request() {
            Ok(Some(req)) => req,
            Ok(None) => break,
            Err(e) => {
                conn.fail(format!("control ring: {e}"));
                break;
            }
        };
        *tally.ctrl_requests += 1;
        let rsp = control::serve(ctx, conn, &req);
        if rsp.status == xmx_wire::msg::CtrlStatus::Ok {
            record_session(xs, tally.backend_dir, &rsp.reply);
        }
        if rsp.status == xmx_wire::msg::CtrlStatus::Quota {
            *tally.quota_refusals += 1;
        }
        if let Err(e) = conn.ctrl.push_response(&rsp) {
            conn.fail(format!("control ring response: {e}"));
            break;
        }
        answered += 1;
    }
    if answered == 0 {
        return false;
    }
    if conn.ctrl.push_responses_and_check_notify() {
        if let Err(e) = conn.ctrl_notify.notify() {
            tracing::debug!(domu = conn.domu, error = %e, "control notify failed");
        }
    }
    true
}

/// Takes up to a round's budget of requests from each of `conn`'s endpoint send rings
/// (after reclaiming the event slots the guest has consumed); true if anything was taken
/// or reclaimed. A ring that breaks, or a request the engine refuses as a violation, fails
/// the connection.
fn serve_send_rings(
    ctx: &mut ControlCtx<'_>,
    now: Instant,
    released: &mut Vec<u16>,
    conn: &mut Connection,
) -> bool {
    let mut work = false;
    let guest = conn.guest;
    let budget = ctx.quotas.send_budget_per_round;
    let backlog_max = ctx.quotas.max_event_backlog;
    let mut failure = None;
    let indices: Vec<u8> = conn.endpoints.keys().copied().collect();
    for epi in indices {
        let Some(ep) = conn.endpoints.get_mut(&epi) else {
            continue;
        };
        released.clear();
        match ep.reclaim_events(released) {
            Ok(n) => work |= n > 0,
            Err(e) => {
                failure = Some(format!("endpoint {epi} event ring: {e}"));
                break;
            }
        }
        for &slot in released.iter() {
            if let Err(v) = ctx.engine.release_recvq_slot(guest, epi, slot) {
                tracing::warn!(domu = conn.domu, endpoint = epi, error = %v, "receive slot");
            }
        }
        if ep.backlog.len() >= backlog_max {
            // Completions would have nowhere to go: leave the requests in the ring.
            continue;
        }
        let mut taken = 0;
        while taken < budget {
            let Some(ep) = conn.endpoints.get_mut(&epi) else {
                break;
            };
            let req = match ep.send.next_request() {
                Ok(Some(req)) => req,
                Ok(None) => break,
                Err(e) => {
                    failure = Some(format!("endpoint {epi} send ring: {e}"));
                    break;
                }
            };
            taken += 1;
            ep.counters.send_requests += 1;
            if let Some(answer) = control::region_request(ctx, conn, epi, &req) {
                // Served here (it maps guest memory); answered like any request.
                if let Some(ep) = conn.endpoints.get_mut(&epi) {
                    ep.queue_event(answer, backlog_max);
                }
                continue;
            }
            if let Err(v) = ctx.engine.handle_send(now, guest, epi, &req) {
                failure = Some(format!("endpoint {epi}: {v}"));
                break;
            }
        }
        let Some(ep) = conn.endpoints.get_mut(&epi) else {
            continue;
        };
        if taken > 0 {
            work = true;
            ep.send.retire_consumed();
            if ep.send.push_responses_and_check_notify() {
                ep.notify();
            }
        }
        if failure.is_some() {
            break;
        }
    }
    if let Some(reason) = failure {
        conn.fail(reason);
    }
    work
}

/// Keep in the device's backend directory the session of an endpoint just opened, and
/// forget that of one just closed: a restarted backend lets a re-opened endpoint keep its
/// session only if it is the one recorded here (see `EndpointOpen::resume_session`).
fn record_session(xs: &dyn Xenstore, backend_dir: &str, reply: &xmx_wire::msg::CtrlReply) {
    use xmx_wire::msg::CtrlReply;
    use xmx_wire::xenbus::{key_path, keys};
    let node = |ep: u8| {
        key_path(
            &key_path(backend_dir, keys::ENDPOINT_SESSIONS),
            &ep.to_string(),
        )
    };
    // Only while the device exists: a write must not re-create a removed directory.
    if xs
        .read(xmx_hv::XBT_NULL, &key_path(backend_dir, keys::FRONTEND_ID))
        .is_err()
    {
        return;
    }
    let done = match *reply {
        CtrlReply::EndpointOpen {
            endpoint,
            session_id,
        } => xs.write(
            xmx_hv::XBT_NULL,
            &node(endpoint),
            session_id.to_string().as_bytes(),
        ),
        CtrlReply::EndpointClose { endpoint } => {
            let dir = key_path(backend_dir, keys::ENDPOINT_SESSIONS);
            let removed = match xs.rm(xmx_hv::XBT_NULL, &node(endpoint)) {
                Err(xmx_hv::Error::NotFound(_)) => Ok(()),
                other => other,
            };
            // The last one takes the directory with it.
            match xs.directory(xmx_hv::XBT_NULL, &dir) {
                Ok(left) if left.is_empty() => match xs.rm(xmx_hv::XBT_NULL, &dir) {
                    Err(xmx_hv::Error::NotFound(_)) => removed,
                    other => removed.and(other),
                },
                _ => removed,
            }
        }
        _ => Ok(()),
    };
    if let Err(e) = done {
        tracing::warn!(error = %e, "recording an endpoint session in {backend_dir}");
    }
}

fn borrow_raw(fd: RawFd) -> BorrowedFd<'static> {
    // SAFETY: used only for the duration of an epoll_ctl call, on descriptors owned by
    // handles the Backend holds for its whole life (event channels, xenstore, NIC).
    unsafe { BorrowedFd::borrow_raw(fd) }
}

impl Backend {
    /// A backend in domain `platform.domid()`, with `link` to the wire (None: co-located
    /// guests only). Registers its xenstore watches at once; the devices already present
    /// are picked up by the first round.
    pub fn new(
        platform: &dyn Platform,
        link: Option<Box<dyn FrameLink>>,
        cfg: BackendConfig,
    ) -> Result<Backend, BackendError> {
        let domid = platform.domid();
        let xs = platform.xenstore()?;
        let gnttab = platform.grant_table()?;
        let evtchn = platform.event_channels()?;
        let engine = Engine::new(cfg.engine.clone());
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(sys("epoll_create"))?;
        let wake = Arc::new(
            EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
                .map_err(sys("eventfd"))?,
        );
        let ev = |token| EpollEvent::new(EpollFlags::EPOLLIN, token);
        epoll
            .add(borrow_raw(evtchn.fd()), ev(TOKEN_EVTCHN))
            .map_err(sys("epoll_ctl(evtchn)"))?;
        epoll
            .add(borrow_raw(xs.watch_fd()), ev(TOKEN_XENSTORE))
            .map_err(sys("epoll_ctl(xenstore)"))?;
        epoll
            .add(wake.as_fd(), ev(TOKEN_WAKE))
            .map_err(sys("epoll_ctl(eventfd)"))?;
        if let Some(l) = &link {
            epoll
                .add(borrow_raw(l.raw_fd()), ev(TOKEN_NIC))
                .map_err(sys("epoll_ctl(nic)"))?;
        }
        let (tx, rx) = mpsc::sync_channel(COMMAND_QUEUE);
        let control = ControlHandle {
            tx,
            wake: wake.clone(),
            closed: Arc::new(AtomicBool::new(false)),
        };
        let admin = match &cfg.control_socket {
            Some(path) => {
                let server = LineServer::start(path, Some(0o600), "backd-admin", control.clone());
                Some(server.map_err(|source| BackendError::Sys {
                    op: "control socket",
                    source,
                })?)
            }
            None => None,
        };
        xs.watch(&xmx_wire::xenbus::backend_root(domid), WATCH_BACKEND)?;
        xs.watch(xmx_hv::xs::wire::RELEASE_DOMAIN, WATCH_RELEASE)?;
        tracing::info!(domid, nic = link.is_some(), "xmx backend ready");
        Ok(Backend {
            cfg,
            domid,
            xs,
            gnttab,
            evtchn,
            engine,
            link,
            link_fault: None,
            devices: BTreeMap::new(),
            active: Vec::new(),
            failing: false,
            visiting: Vec::new(),
            full: true,
            after_sleep: true,
            sessions: SessionIds::new(),
            next_region: 1,
            counters: BackendCounters::default(),
            rx_ring_drops_closed: 0,
            epoll,
            wake: wake.clone(),
            stop: Arc::new(AtomicBool::new(false)),
            commands: Some(rx),
            control,
            admin,
            ports: Vec::new(),
            released: Vec::new(),
        })
    }

    /// A handle for requests (the same ones the control socket takes).
    pub fn control(&self) -> ControlHandle {
        self.control.clone()
    }

    /// A handle that stops [`Backend::run`] from another thread.
    pub fn stopper(&self) -> BackendStopper {
        BackendStopper {
            flag: self.stop.clone(),
            wake: self.wake.clone(),
        }
    }

    /// Where the control socket listens, if it does.
    pub fn control_socket(&self) -> Option<&std::path::Path> {
        self.admin.as_ref().map(|a| a.path())
    }

    /// Run [`Backend::run`] on a thread of its own.
    pub fn spawn(self) -> std::io::Result<BackendThread> {
        let stopper = self.stopper();
        let control = self.control();
        let handle = std::thread::Builder::new()
            .name("xmx-backd".into())
            .spawn(move || self.run())?;
        Ok(BackendThread {
            handle: Some(handle),
            stopper,
            control,
        })
    }

    /// Serve until stopped; then move every device to Closing, release what guests shared
    /// and return. An error means the loop could not go on (xenstore lost, epoll failed);
    /// guests are released in that case too.
    pub fn run(mut self) -> Result<(), BackendError> {
        let result = self.serve();
        self.shutdown();
        result
    }

    fn serve(&mut self) -> Result<(), BackendError> {
        let mut events = [EpollEvent::empty(); 8];
        let mut idle_since: Option<Instant> = None;
        while !self.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            let worked = self.round(now)?;
            let took = now.elapsed();
            if took >= SLOW_ROUND {
                // One thread serves every guest: a round this long delays all of them (a
                // control request unanswered past its caller's timeout disconnects it).
                tracing::warn!(
                    took_ms = took.as_millis() as u64,
                    "a service round took long"
                );
            }
            if worked {
                idle_since = None;
                continue;
            }
            let since = *idle_since.get_or_insert(now);
            if now.saturating_duration_since(since) < self.cfg.spin {
                // Yield rather than spin: on few cores the guest (or the peer host's
                // backend) that must answer next gets the core at once.
                std::thread::yield_now();
                continue;
            }
            // Notifications are taken only now: while the loop polls, every ring is read
            // each round anyway, and reading the pending ports costs a system call.
            self.ack_ports();
            if self.arm() {
                idle_since = None;
                continue;
            }
            let next = [
                self.engine.poll_timeout(),
                self.link_fault.map(|f| f.check_at),
            ]
            .into_iter()
            .flatten()
            .min();
            let timeout = match next {
                None => EpollTimeout::NONE,
                Some(at) => {
                    let wait = at.saturating_duration_since(Instant::now());
                    // Round up: waking early only costs a round, waking late delays a pull.
                    let ms = wait.as_micros().div_ceil(1000).min(i32::MAX as u128);
                    EpollTimeout::try_from(ms as u64).unwrap_or(EpollTimeout::MAX)
                }
            };
            let ready = match self.epoll.wait(&mut events, timeout) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => 0,
                Err(e) => return Err(sys("epoll_wait")(e)),
            };
            let link_failed = events.iter().take(ready).any(|e| {
                e.data() == TOKEN_NIC
                    && e.events()
                        .intersects(EpollFlags::EPOLLERR | EpollFlags::EPOLLHUP)
            });
            if link_failed {
                self.link_error();
            }
            self.check_link(Instant::now())?;
            // Level-triggered: the other sources are drained by the round itself.
            let _ = self.wake.read();
            idle_since = None;
            self.after_sleep = true;
        }
        Ok(())
    }

    /// One pass over every source; true if anything was done.
    fn round(&mut self, now: Instant) -> Result<bool, BackendError> {
        self.counters.rounds += 1;
        self.full = self.counters.rounds.is_multiple_of(FULL_ROUND_EVERY)
            || std::mem::take(&mut self.after_sleep);
        let mut work = self.serve_commands();
        work |= self.serve_watches()?;
        work |= self.receive_frames(now);
        work |= self.serve_guests(now);
        // The engine's timers (a pull's retransmission, a re-open's grace) run in hundreds
        // of milliseconds; finding the next one walks every guest's pulls.
        if self.full && self.engine.poll_timeout().is_some_and(|at| at <= now) {
            self.engine.handle_timeout(now);
            work = true;
        }
        work |= self.transmit();
        work |= self.deliver_events();
        self.disconnect_failed();
        Ok(work)
    }

    fn ack_ports(&mut self) -> bool {
        self.ports.clear();
        if let Err(e) = self.evtchn.pending(&mut self.ports) {
            tracing::warn!(error = %e, "reading pending ports");
            return false;
        }
        for &port in &self.ports {
            if let Err(e) = self.evtchn.unmask(port) {
                tracing::debug!(port, error = %e, "unmasking a port");
            }
        }
        !self.ports.is_empty()
    }

    fn receive_frames(&mut self, now: Instant) -> bool {
        let Backend { link, engine, .. } = self;
        let Some(link) = link else {
            return false;
        };
        let n = link.recv(&mut |frame| engine.handle_frame(now, frame));
        self.counters.nic_rx_frames += n as u64;
        if n > 0 {
            self.link_works(now);
        }
        n > 0
    }

    /// The link's descriptor polled as failed: take the error (until it is taken the
    /// descriptor keeps polling so, and the loop would spin) and note the fault.
    fn link_error(&mut self) {
        let Some(error) = self.link.as_mut().and_then(|l| l.take_error()) else {
            return;
        };
        self.link_failed(Instant::now(), &error.to_string());
    }

    fn link_failed(&mut self, now: Instant, error: &str) {
        self.counters.nic_link_errors += 1;
        match &mut self.link_fault {
            Some(f) => {
                f.errors += 1;
                tracing::debug!(error, "link still failing");
            }
            None => {
                tracing::warn!(error, "link failed; serving co-located guests and retrying");
                self.link_fault = Some(LinkFault::new(now));
            }
        }
    }

    /// A frame came in or went out: a failed link is back.
    fn link_works(&mut self, now: Instant) {
        if let Some(f) = self.link_fault.take() {
            tracing::info!(
                down_ms = f.lasted(now).as_millis() as u64,
                errors = f.errors,
                "link back"
            );
        }
    }

    /// While the link fails: open it again if its interface was re-created.
    fn check_link(&mut self, now: Instant) -> Result<(), BackendError> {
        let (Some(fault), Some(link)) = (&mut self.link_fault, &mut self.link) else {
            return Ok(());
        };
        if !fault.due(now) {
            return Ok(());
        }
        let dropped_before = link.rx_ring_drops();
        match link.reopen_if_replaced() {
            Ok(false) => {}
            Ok(true) => {
                self.rx_ring_drops_closed += dropped_before;
                // The old descriptor left the epoll set when it was closed.
                self.epoll
                    .add(
                        borrow_raw(link.raw_fd()),
                        EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_NIC),
                    )
                    .map_err(sys("epoll_ctl(nic)"))?;
                self.counters.nic_link_reopens += 1;
                tracing::info!("link interface re-created; socket reopened");
            }
            Err(e) => tracing::debug!(error = %e, "link not reopened"),
        }
        Ok(())
    }

    fn transmit(&mut self) -> bool {
        let Some(link) = &mut self.link else {
            while let Some(t) = self.engine.poll_transmit() {
                self.counters.tx_without_link += 1;
                self.engine.recycle(t);
            }
            return false;
        };
        // Each frame is written straight into the NIC's transmit ring: a PULL_REPLY's
        // data goes from the guest's granted pages to the ring in one copy.
        let counters = &mut self.counters;
        let sent = self.engine.transmit_into(
            |fill| link.send_with(fill),
            |e| {
                counters.nic_tx_errors += 1;
                tracing::debug!(error = %e, "frame refused by the NIC");
            },
        ) as u64;
        if sent > 0 {
            if let Some(link) = &mut self.link {
                match link.flush() {
                    Ok(()) => self.link_works(Instant::now()),
                    Err(e) => {
                        self.counters.nic_tx_errors += 1;
                        // A link that is down fails every flush: one warning per fault.
                        self.link_failed(Instant::now(), &format!("flush: {e}"));
                    }
                }
            }
        }
        self.counters.nic_tx_frames += sent;
        sent > 0
    }

    /// Serve every connected guest's rings; true if any request was taken.
    fn serve_guests(&mut self, now: Instant) -> bool {
        let full = self.full;
        let Backend {
            devices,
            engine,
            gnttab,
            evtchn,
            cfg,
            sessions,
            next_region,
            released,
            xs,
            active,
            visiting,
            failing,
            ..
        } = self;
        let mut work = false;
        let mut visit = std::mem::take(visiting);
        visit.clear();
        if full {
            visit.extend(devices.keys().copied());
            active.clear();
        } else {
            visit.extend_from_slice(active);
        }
        for &key in &visit {
            let Some(device) = devices.get_mut(&key) else {
                continue;
            };
            let Some(conn) = device.conn.as_mut() else {
                continue;
            };
            let mut ctx = ControlCtx {
                engine,
                gnttab: gnttab.as_ref(),
                evtchn: evtchn.as_ref(),
                quotas: &cfg.quotas,
                sessions,
                next_region,
            };
            let tally = DeviceTally {
                backend_dir: &device.backend_dir,
                ctrl_requests: &mut device.ctrl_requests,
                quota_refusals: &mut device.quota_refusals,
            };
            work |= serve_control_ring(&mut ctx, xs.as_ref(), tally, conn);
            if conn.failure.is_none() {
                work |= serve_send_rings(&mut ctx, now, released, conn);
            }
            *failing |= conn.failure.is_some();
            if full && !conn.endpoints.is_empty() {
                active.push(key);
            }
        }
        *visiting = visit;
        work
    }

    /// Queue the engine's events per endpoint and write them into the event rings.
    fn deliver_events(&mut self) -> bool {
        let limit = self.cfg.quotas.max_event_backlog;
        let mut any = false;
        while let Some(ge) = self.engine.poll_event() {
            any = true;
            let key = DeviceKey::from_guest(ge.guest);
            let ep = self
                .devices
                .get_mut(&key)
                .and_then(|d| d.conn.as_mut())
                .and_then(|c| c.endpoints.get_mut(&ge.endpoint));
            let Some(ep) = ep else {
                continue;
            };
            if !ep.queue(ge.event, ge.wakes, limit) {
                // A dropped MEDIUM fragment gives its receive slot back at once.
                if let Some(slot) = guest::recvq_slot(&ge.event) {
                    let _ = self.engine.release_recvq_slot(ge.guest, ge.endpoint, slot);
                }
            }
        }
        // Events are only ever queued for open endpoints, whose devices are active.
        let Backend {
            devices,
            active,
            full,
            ..
        } = self;
        let mut flush = |device: &mut Device| {
            let Some(conn) = device.conn.as_mut() else {
                return;
            };
            for ep in conn.endpoints.values_mut() {
                if !ep.backlog.is_empty() && ep.flush_events() {
                    ep.notify();
                }
            }
        };
        if *full {
            devices.values_mut().for_each(&mut flush);
        } else {
            for key in active.iter() {
                if let Some(device) = devices.get_mut(key) {
                    flush(device);
                }
            }
        }
        any
    }

    /// Before sleeping: ask every ring for an event on its next entry and check again.
    /// True if something arrived meanwhile (do not sleep).
    fn arm(&mut self) -> bool {
        let limit = self.cfg.quotas.max_event_backlog;
        let mut ready = false;
        for device in self.devices.values_mut() {
            let Some(conn) = device.conn.as_mut() else {
                continue;
            };
            let mut failure: Option<String> = None;
            match conn.ctrl.final_check_for_requests() {
                Ok(more) => ready |= more,
                Err(e) => failure = Some(format!("control ring: {e}")),
            }
            for (&epi, ep) in conn.endpoints.iter_mut() {
                let checked: Result<bool, RingError> = (|| {
                    let mut more = false;
                    if ep.backlog.len() < limit {
                        more |= ep.send.final_check_for_requests()?;
                    }
                    if !ep.backlog.is_empty() || !ep.in_ring.is_empty() {
                        // Waiting for the application to return event slots.
                        more |= ep.events.final_check_for_responses()?;
                    }
                    Ok(more)
                })();
                match checked {
                    Ok(more) => ready |= more,
                    Err(e) => {
                        failure.get_or_insert(format!("endpoint {epi}: {e}"));
                    }
                }
            }
            if let Some(reason) = failure {
                conn.fail(reason);
                self.failing = true;
                ready = true;
            }
        }
        ready
    }

    fn disconnect_failed(&mut self) {
        if !std::mem::take(&mut self.failing) {
            return;
        }
        let failed: Vec<(DeviceKey, String)> = self
            .devices
            .iter()
            .filter_map(|(k, d)| Some((*k, d.conn.as_ref()?.failure.clone()?)))
            .collect();
        for (key, reason) in failed {
            tracing::warn!(domu = key.domu, devid = key.devid, %reason, "guest broke the protocol; disconnecting it");
            self.counters.disconnects += 1;
            self.close_device(key, Some(reason));
        }
    }

    fn serve_commands(&mut self) -> bool {
        let mut any = false;
        loop {
            let Some(rx) = &self.commands else {
                return any;
            };
            let cmd = match rx.try_recv() {
                Ok(cmd) => cmd,
                Err(_) => return any,
            };
            any = true;
            let reply = self.answer(cmd.request);
            let _ = cmd.reply.try_send(reply);
        }
    }

    fn shutdown(&mut self) {
        // Callers waiting on the loop learn it is gone before the socket threads are joined.
        self.control.closed.store(true, Ordering::Release);
        if let Some(rx) = self.commands.take() {
            while let Ok(cmd) = rx.try_recv() {
                let _ = cmd.reply.try_send(Reply::err(ReplyError::new(
                    "closed",
                    "the backend is stopping",
                )));
            }
        }
        if let Some(mut admin) = self.admin.take() {
            admin.stop();
        }
        let keys: Vec<DeviceKey> = self.devices.keys().copied().collect();
        for key in keys {
            self.shutdown_device(key);
        }
        let _ = self
            .xs
            .unwatch(&xmx_wire::xenbus::backend_root(self.domid), WATCH_BACKEND);
        let _ = self
            .xs
            .unwatch(xmx_hv::xs::wire::RELEASE_DOMAIN, WATCH_RELEASE);
        tracing::info!("xmx backend stopped");
    }
}

#[cfg(test)]
mod control_socket_tests {
    use super::*;

    #[test]
    fn refusals_keep_the_sockets_words() {
        let (tx, _rx) = mpsc::sync_channel(1);
        let handle = ControlHandle {
            tx,
            wake: Arc::new(EventFd::new().unwrap()),
            closed: Arc::new(AtomicBool::new(false)),
        };
        let line = |r: Refusal| serde_json::to_string(&handle.refuse(r)).unwrap();
        assert_eq!(
            line(Refusal::TooLong),
            r#"{"ok":false,"error":{"kind":"invalid","message":"request line too long"}}"#
        );
        assert_eq!(
            line(Refusal::Busy),
            r#"{"ok":false,"error":{"kind":"busy","message":"too many control connections"}}"#
        );
        assert_eq!(
            line(Refusal::NotRequest("expected value".into())),
            r#"{"ok":false,"error":{"kind":"invalid","message":"request: expected value"}}"#
        );
    }
}

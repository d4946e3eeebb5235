//! The xmxd service: lifecycle of guests' xmx devices, the fabric's peer table, and the
//! answers to `xmx`.
//!
//! [`Core`] holds everything and reacts to one thing at a time (a xenstore watch, a
//! discovery frame, a timer, a control request). [`Xmxd`] runs it: one loop thread sleeping
//! in `poll` on the xenstore watch queue, the discovery socket and a wake-up eventfd, and
//! the control socket's threads, which take the same lock.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use xmx_backend::service::LinkFault;
use xmx_hv::daemon::control::{LineServer, LineService, Refusal, Reply};
use xmx_hv::xs::wire::{INTRODUCE_DOMAIN, RELEASE_DOMAIN};
use xmx_hv::{DomId, Platform, Xenstore};
use xmx_wire::mxoe::Mac;

use super::backend::BackendLink;
use super::control::{refusal_reply, PeersReport, XmxdRequest, MAX_WAIT};
use super::direct;
use super::discovery::{Discovery, DiscoveryConfig};
use super::error::{Error, Result};
use super::fabric::PacketFabric;
use super::names::{self};
use super::state::StateStore;
use super::table::FabricTable;
use super::xsnodes;

mod fabric_io;
mod lifecycle;
mod peers;
mod requests;

/// How xmxd runs.
#[derive(Debug, Clone)]
pub struct XmxdConfig {
    /// This host's name, announced with its guests.
    pub(crate) host_name: String,
    /// The domain xmxd and the backend run in (0: dom0).
    pub toolstack: DomId,
    /// Where the state file lives.
    pub(crate) state_dir: PathBuf,
    /// Where to serve the control socket, if anywhere.
    pub control_socket: Option<PathBuf>,
    /// The local backend's control socket, if there is a backend to feed.
    pub backend_socket: Option<PathBuf>,
    /// Discovery timers.
    pub discovery: DiscoveryConfig,
    /// How long a starting xmxd listens to the fabric before it claims new peer indices
    /// and pushes its first table (so it does not push a table without the other hosts).
    pub settle: Duration,
    /// How long a re-attach waits for the backend to let go of the old device.
    pub(crate) release_timeout: Duration,
}

impl XmxdConfig {
    /// Defaults for a host named `host_name` keeping its state in `state_dir`.
    pub fn new(host_name: &str, state_dir: &Path) -> XmxdConfig {
        let discovery = DiscoveryConfig::default();
        XmxdConfig {
            host_name: host_name.to_owned(),
            toolstack: xmx_hv::DOM0,
            state_dir: state_dir.to_path_buf(),
            control_socket: None,
            backend_socket: None,
            discovery,
            settle: discovery.interval,
            release_timeout: Duration::from_secs(5),
        }
    }
}

/// Watch tokens.
const WATCH_INTRODUCE: &str = "xmxd:introduce";
const WATCH_RELEASE: &str = "xmxd:release";
const WATCH_WISHES: &str = "xmxd:wishes";
const WATCH_NAME_PREFIX: &str = "xmxd:name:";
const WATCH_FRONT_PREFIX: &str = "xmxd:front:";

/// Device index of the xmx device xmxd manages in each guest.
const DEVID: u32 = 0;

/// What the device of a domain was attached with.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DeviceAttachment {
    guest: String,
    mac: Mac,
    cluster: u32,
}

/// A running domain of this host.
#[derive(Debug, Clone, Default)]
struct RunningDomain {
    name: Option<String>,
    /// Its `vm` path when first seen: a different one under the same domid is a new domain
    /// created after a destroy this daemon had not yet seen.
    instance: Option<String>,
    attached: Option<DeviceAttachment>,
    /// It had a wish node when last looked at: a wish that vanishes is withdrawn.
    wished: bool,
    /// Its frontend says Closing or Closed (a suspend, a shutdown): it is offered no
    /// direct channel until it connects again.
    front_closed: bool,
}

fn unix_now() -> u32 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX))
        .unwrap_or(0)
}

/// Everything xmxd knows and does; see the module documentation.
pub struct Core {
    cfg: XmxdConfig,
    xs: Box<dyn Xenstore>,
    store: StateStore,
    domains: BTreeMap<DomId, RunningDomain>,
    discovery: Discovery,
    fabric: Option<PacketFabric>,
    backend: BackendLink,
    table: FabricTable,
    generation: u64,
    /// The index (and claim age) each MAC last held in the table.
    remembered: HashMap<Mac, (u16, u32)>,
    /// What each attached guest was last shown of the table, in xenstore.
    published: HashMap<DomId, BTreeMap<u16, String>>,
    settle_at: Option<Instant>,
    /// Set while the fabric socket reports errors (link down, interface gone): xmxd keeps
    /// serving its own host, looks at the interface again with a bounded backoff, and is
    /// back on the first frame the link carries again.
    fabric_fault: Option<LinkFault>,
    /// The direct channels offered between this host's guests.
    direct: direct::Broker,
}

impl Core {
    fn new(platform: &dyn Platform, fabric: Option<PacketFabric>, cfg: XmxdConfig) -> Result<Core> {
        names::check_host_name(&cfg.host_name)?;
        let xs = platform.xenstore()?;
        xsnodes::ensure_root(xs.as_ref(), cfg.toolstack)?;
        let store = StateStore::open(&cfg.state_dir)?;
        xsnodes::mirror_clusters(xs.as_ref(), cfg.toolstack, &store.state)?;
        let direct = direct::Broker::new(xs.as_ref(), cfg.toolstack)?;
        let now = Instant::now();
        // Without a NIC this host is the whole fabric; its identity only has to be unicast.
        let me = fabric
            .as_ref()
            .map_or(Mac([0x02, 0, 0, 0, 0, 0]), PacketFabric::mac);
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
            ^ std::process::id().rotate_left(16);
        let discovery = Discovery::new(me, &cfg.host_name, cfg.discovery, seed, now);
        let backend = BackendLink::new(cfg.backend_socket.clone(), cfg.discovery.interval, now);
        let settle_at = fabric.as_ref().map(|_| now + cfg.settle);
        xs.watch(INTRODUCE_DOMAIN, WATCH_INTRODUCE)?;
        xs.watch(RELEASE_DOMAIN, WATCH_RELEASE)?;
        xs.watch(&xsnodes::wishes_dir(cfg.toolstack), WATCH_WISHES)?;
        tracing::info!(host = %cfg.host_name, %me, fabric = fabric.is_some(), "xmxd ready");
        Ok(Core {
            cfg,
            xs,
            store,
            domains: BTreeMap::new(),
            discovery,
            fabric,
            backend,
            table: FabricTable::default(),
            generation: 0,
            remembered: HashMap::new(),
            published: HashMap::new(),
            settle_at,
            fabric_fault: None,
            direct,
        })
    }

    // ----- read access -----

    /// The current peer table.
    pub fn table(&self) -> &FabricTable {
        &self.table
    }

    /// Bumped whenever the table changes.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether the backend holds the current table.
    pub fn backend_synced(&self) -> bool {
        self.backend.synced()
    }

    /// Whether domain `domid`'s xmx device is attached.
    pub fn is_attached(&self, domid: DomId) -> bool {
        self.domains
            .get(&domid)
            .is_some_and(|d| d.attached.is_some())
    }

    /// Whether the fabric socket is failing (link down, interface gone) right now.
    pub fn fabric_failing(&self) -> bool {
        self.fabric_fault.is_some()
    }

    /// Names of the remote hosts heard from.
    pub fn remote_hosts(&self) -> Vec<String> {
        self.discovery
            .hosts()
            .map(|(_, h)| h.name.clone())
            .collect()
    }
}

/// The core and the condition variable its changes are announced on.
struct XmxdShared {
    core: Mutex<Core>,
    changed: Condvar,
    /// Set when xmxd stops: stopping the control socket waits for the requests being
    /// answered, so a `peers` request waiting for a change must not wait any longer.
    closing: AtomicBool,
}

impl XmxdShared {
    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Run `f` on the core, then wake whoever waits for a change (they re-check).
    fn with<T>(&self, f: impl FnOnce(&mut Core) -> T) -> T {
        let out = f(&mut self.lock());
        self.changed.notify_all();
        out
    }

    fn dispatch(&self, request: XmxdRequest) -> Reply {
        if let XmxdRequest::Peers {
            after: Some(after),
            timeout_ms,
            ..
        } = &request
        {
            let wait = Duration::from_millis(timeout_ms.unwrap_or(0)).min(MAX_WAIT);
            let deadline = Instant::now() + wait;
            let mut core = self.lock();
            while core.generation <= *after && !self.closing.load(Ordering::Acquire) {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                core = self
                    .changed
                    .wait_timeout(core, left)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
        }
        match self.with(|core| core.answer(request)) {
            Ok(v) => Reply::ok(v),
            Err(e) => Reply::err(e.to_reply()),
        }
    }

    /// [`XmxdShared::dispatch`], then a wake-up of the loop: timers may have moved, and the
    /// loop recomputes its sleep.
    fn answer(&self, request: XmxdRequest, wake: &EventFd) -> Reply {
        let reply = self.dispatch(request);
        let _ = wake.write(1);
        reply
    }

    /// Ends the waits of requests being answered, for good.
    fn close(&self) {
        // Under the lock: a waiter between its check and its wait would miss the notice.
        let _core = self.lock();
        self.closing.store(true, Ordering::Release);
        self.changed.notify_all();
    }
}

/// A running xmxd: the loop thread and the control socket. Dropping it stops both.
pub struct Xmxd {
    shared: Arc<XmxdShared>,
    stop: Arc<AtomicBool>,
    wake: Arc<EventFd>,
    thread: Option<JoinHandle<Result<()>>>,
    control: Option<LineServer>,
}

/// What the control socket asks of a running xmxd.
struct ControlSide {
    shared: Arc<XmxdShared>,
    wake: Arc<EventFd>,
}

impl LineService for ControlSide {
    type RequestLine = XmxdRequest;
    type ReplyLine = Reply;

    fn answer(&self, request: XmxdRequest) -> Reply {
        self.shared.answer(request, &self.wake)
    }

    fn refuse(&self, refusal: Refusal) -> Reply {
        refusal_reply(refusal)
    }
}

fn borrow(fd: RawFd) -> BorrowedFd<'static> {
    // SAFETY: the descriptors polled belong to the xenstore connection and the discovery
    // socket, which the core owns for as long as the loop thread runs; the loop never
    // outlives the core (it holds an Arc to it).
    unsafe { BorrowedFd::borrow_raw(fd) }
}

impl Xmxd {
    /// Start xmxd for `platform`'s domain, with `fabric` to the other hosts (None: this
    /// host alone).
    pub fn start(
        platform: &dyn Platform,
        fabric: Option<PacketFabric>,
        cfg: XmxdConfig,
    ) -> Result<Xmxd> {
        let control_path = cfg.control_socket.clone();
        let core = Core::new(platform, fabric, cfg)?;
        let shared = Arc::new(XmxdShared {
            core: Mutex::new(core),
            changed: Condvar::new(),
            closing: AtomicBool::new(false),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(
            EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
                .map_err(std::io::Error::from)?,
        );
        let thread = {
            let (shared, stop, wake) = (shared.clone(), stop.clone(), wake.clone());
            std::thread::Builder::new()
                .name("xmxd".into())
                .spawn(move || run_loop(&shared, &stop, &wake))?
        };
        let mut xmxd = Xmxd {
            shared,
            stop,
            wake,
            thread: Some(thread),
            control: None,
        };
        if let Some(path) = control_path {
            let side = ControlSide {
                shared: xmxd.shared.clone(),
                wake: xmxd.wake.clone(),
            };
            xmxd.control = Some(LineServer::start(&path, Some(0o600), "xmxd-control", side)?);
        }
        Ok(xmxd)
    }

    /// Answer a request as the control socket does.
    pub fn call(&self, request: XmxdRequest) -> Reply {
        self.shared.answer(request, &self.wake)
    }

    /// The current peer table report.
    pub fn peers(&self) -> PeersReport {
        self.shared.lock().table_report()
    }

    /// Read the core.
    pub fn inspect<T>(&self, f: impl FnOnce(&Core) -> T) -> T {
        f(&self.shared.lock())
    }

    /// Wait until `cond` holds, re-checking after every event xmxd handles; up to
    /// `timeout`. Returns whether it held.
    pub fn wait_until(&self, timeout: Duration, mut cond: impl FnMut(&Core) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut core = self.shared.lock();
        loop {
            if cond(&core) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            core = self
                .shared
                .changed
                .wait_timeout(core, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// Wait until the loop ends by itself (a fatal error) or an [`XmxdStopper`] stops it from
    /// elsewhere.
    pub fn join(mut self) -> Result<()> {
        let result = match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(Error::Io(std::io::Error::other("xmxd loop panicked")))),
            None => Ok(()),
        };
        self.shared.close();
        self.control = None;
        result
    }

    /// A handle that stops the loop from another thread (a signal handler thread).
    pub fn stopper(&self) -> XmxdStopper {
        XmxdStopper {
            stop: self.stop.clone(),
            wake: self.wake.clone(),
        }
    }

    fn halt(&mut self) -> Result<()> {
        self.shared.close();
        self.control = None;
        self.stop.store(true, Ordering::Release);
        let _ = self.wake.write(1);
        match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(Error::Io(std::io::Error::other("xmxd loop panicked")))),
            None => Ok(()),
        }
    }
}

impl Drop for Xmxd {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

/// Stops a running [`Xmxd`] from another thread; cheap to clone.
#[derive(Clone)]
pub struct XmxdStopper {
    stop: Arc<AtomicBool>,
    wake: Arc<EventFd>,
}

impl XmxdStopper {
    /// Ask the loop to end.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.wake.write(1);
    }
}

fn run_loop(shared: &XmxdShared, stop: &AtomicBool, wake: &EventFd) -> Result<()> {
    let xs_fd = shared.lock().xs.watch_fd();
    while !stop.load(Ordering::Acquire) {
        // The fabric socket may have been opened again (a re-created interface).
        let (next, fabric_fd) = shared.with(|core| -> Result<(Instant, Option<RawFd>)> {
            core.step()?;
            Ok((
                core.poll_timeout(),
                core.fabric.as_ref().map(PacketFabric::raw_fd),
            ))
        })?;
        let left = next.saturating_duration_since(Instant::now());
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        let mut fds = vec![
            PollFd::new(borrow(xs_fd), PollFlags::POLLIN),
            PollFd::new(wake.as_fd(), PollFlags::POLLIN),
        ];
        if let Some(fd) = fabric_fd {
            fds.push(PollFd::new(borrow(fd), PollFlags::POLLIN));
        }
        match poll(
            &mut fds,
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(Error::Io(e.into())),
        }
        let _ = wake.read();
    }
    tracing::info!("xmxd stopping");
    Ok(())
}

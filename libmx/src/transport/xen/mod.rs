//! The Xen transport: a guest application talks to the dom0 backend through
//! the shared rings of its endpoints (OS bypass).
//!
//! The process connects once to the guest daemon `xmx-frontd`
//! (`XMX_FRONTD_SOCKET`), which opens endpoints for it and hands their pages
//! and event channel over. From then on nothing goes through the daemon on
//! the data path:
//!
//! - a frame of the protocol core becomes a send request on the endpoint's
//!   send ring ([`engine_msgs`](crate::transport::engine_msgs) converts both
//!   ways): TINY and SMALL data inline, MEDIUM fragments through send-queue
//!   slots ([`slots`]), LARGE data through a granted window peers pull from
//!   ([`windows`]);
//! - events the backend puts on the event ring become frames for the core
//!   (MEDIUM fragments copied out of the receive queue), pull completions
//!   (the pulled window copied into the receive buffer) or send completions
//!   that free what their request held ([`link`]);
//! - a blocked call sleeps on the endpoint's doorbell, which the driver
//!   thread ([`driver`]) rings when the backend signals the event channel.
//!
//! Only registering a window goes through the daemon, and with `MX_RCACHE=1`
//! only on a registration-cache miss; with the cache off, a link grants its
//! windows itself and registers them on its send ring
//! ([`XenLink::register_with_own_grants`], `XMX_OWN_GRANTS`). The peer table is the guest's view that
//! the toolstack publishes in xenstore ([`peers`]).
//!
//! When the backend goes away and comes back (restart, suspend and resume),
//! the daemon re-opens each endpoint over new pages and says so; the link
//! remaps, forgets what the backend forgot, pulls again what it was pulling,
//! and the core retransmits the frames that were lost meanwhile.
//!
//! Environment (read at `mx_init`): `XMX_FRONTD_SOCKET`,
//! `XMX_TOOLSTACK_DOMID` (default 0), `XMX_DIRECT=0` (no direct channels to
//! co-located guests, see [`direct`]; so does `MX_DISABLE_SHMEM=1`), `XMX_ACK_DELAY_US`,
//! `XMX_RESEND_DELAY_US`, `XMX_DISCOVERY_MS` (default 1000: how long a
//! hostname lookup waits for the peer view to name it),
//! `XMX_CONNECT_TIMEOUT_MS` (default 10000: how long `mx_init` waits for the
//! device to connect), `XMX_LINGER_MS` (default one and a half resend delays: how long a
//! closed endpoint still answers resent frames with acks, after the last one).

pub(crate) mod direct;
mod driver;
pub(crate) mod link;
pub(crate) mod peers;
mod port;
pub(crate) mod slots;
pub(crate) mod windows;

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::eventfd::{EfdFlags, EventFd};
use rustc_hash::FxHashMap;
use xmx_frontend::frontd::proto::{default_socket_path, SOCKET_ENV};
use xmx_frontend::frontd::{FrontdBoardInfo, FrontdClient, Notice};
use xmx_frontend::Error as FrontError;
use xmx_hv::Xenstore;
use xmx_mx::Config;
use xmx_wire::msg::CtrlStatus;
use xmx_wire::mxoe::Mac;

use super::native::board_name;
use super::{BoardInfo, OpenError, RawPort, Transport, TransportPort};
use crate::abi::MxReturn;
use crate::doorbell::Doorbell;
use crate::errors::{Failure, MxResult};

use port::LinkRef;
pub(crate) use port::XenPort;

use crate::transport::mailbox::Mailbox;
use link::XenLink;
use peers::PeerView;
use port::EndpointShared;
use windows::FrontdRegistrar;
use xmx_hv::lock;

/// Default delay of an explicit ack: the native transport's (Open-MX's), for
/// the same reason: replies carry the acks.
pub(crate) const DEFAULT_ACK_DELAY: Duration = super::native::DEFAULT_ACK_DELAY;
/// How long closing an endpoint waits for the backend to take the requests
/// posted last.
const CLOSE_FLUSH: Duration = Duration::from_secs(1);
/// The xenstore watch token of the peer view.
const PEERS_TOKEN: &str = "xmx-libmx:peers";

/// What the Xen transport is configured with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct XenConfig {
    /// `XMX_FRONTD_SOCKET`: the guest daemon's socket.
    pub(crate) socket: PathBuf,
    /// `XMX_TOOLSTACK_DOMID`: the domain publishing the peer views.
    pub(crate) toolstack: u16,
    /// `XMX_ACK_DELAY_US`: the library's explicit-ack delay.
    pub(crate) ack_delay: Duration,
    /// `XMX_RESEND_DELAY_US`: the library's first retransmission delay.
    pub(crate) resend_delay: Option<Duration>,
    /// `XMX_DISCOVERY_MS`: how long a hostname lookup waits for the view.
    pub(crate) discovery_wait: Duration,
    /// `XMX_CONNECT_TIMEOUT_MS`: how long opening waits for the device.
    pub(crate) connect_timeout: Duration,
    /// `XMX_LINGER_MS`: how long a closed endpoint keeps answering resent
    /// frames, after the last one.
    pub(crate) linger: Duration,
    /// Neither `XMX_DIRECT=0` nor `MX_DISABLE_SHMEM=1`: frames to co-located
    /// guests go through direct channels when dom0 offers them ([`direct`]).
    pub(crate) direct: bool,
}

impl XenConfig {
    /// Reads the configuration through `lookup` (e.g. the environment).
    pub(crate) fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let number = |name: &str| -> Result<Option<u64>, String> {
            lookup(name)
                .filter(|v| !v.trim().is_empty())
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .map_err(|_| format!("{name}={v}: not a number"))
                })
                .transpose()
        };
        let socket = lookup(SOCKET_ENV)
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .map_or_else(default_socket_path, PathBuf::from);
        let toolstack = match number("XMX_TOOLSTACK_DOMID")? {
            None => 0,
            Some(d) => {
                u16::try_from(d).map_err(|_| format!("XMX_TOOLSTACK_DOMID={d}: not a domain id"))?
            }
        };
        let resend_delay = number("XMX_RESEND_DELAY_US")?.map(Duration::from_micros);
        Ok(XenConfig {
            socket,
            toolstack,
            ack_delay: number("XMX_ACK_DELAY_US")?.map_or(DEFAULT_ACK_DELAY, Duration::from_micros),
            resend_delay,
            discovery_wait: Duration::from_millis(number("XMX_DISCOVERY_MS")?.unwrap_or(1000)),
            connect_timeout: Duration::from_millis(
                number("XMX_CONNECT_TIMEOUT_MS")?.unwrap_or(10_000),
            ),
            linger: number("XMX_LINGER_MS")?.map_or_else(
                || super::default_close_linger(resend_delay),
                Duration::from_millis,
            ),
            // On unless turned off: `XMX_DIRECT=0`, or MX's own
            // `MX_DISABLE_SHMEM=1` (whatever `XMX_DIRECT` says).
            direct: lookup("XMX_DIRECT").is_none_or(|v| v.trim() != "0")
                && lookup("MX_DISABLE_SHMEM")
                    .and_then(|v| v.trim().parse::<i64>().ok())
                    .is_none_or(|n| n == 0),
        })
    }
}

/// Whether the Xen transport is the default: no `XMX_TRANSPORT`, and a guest
/// daemon named by `XMX_FRONTD_SOCKET` (as `xmx sim run` and the guest's
/// environment set it).
pub(crate) fn is_default(lookup: impl Fn(&str) -> Option<String>) -> bool {
    lookup("XMX_TRANSPORT").is_none() && lookup(SOCKET_ENV).is_some_and(|s| !s.trim().is_empty())
}

/// Every endpoint in `endpoints` as the direct hub sees it, each with its
/// link (`links`, one per endpoint, in the same order).
fn attached<'a>(
    endpoints: &'a [Arc<EndpointShared>],
    links: &'a mut [LinkRef<'a>],
) -> Vec<direct::HubEndpoint<'a>> {
    endpoints
        .iter()
        .zip(links.iter_mut())
        .map(|(e, link)| direct::HubEndpoint {
            index: e.index,
            direct: &e.direct,
            mailbox: &e.mailbox,
            link,
        })
        .collect()
}

/// What the transport, its ports and the driver thread share.
pub(crate) struct XenShared {
    client: Mutex<FrontdClient>,
    client_fd: RawFd,
    /// The client's [`FrontdClient::queued_fd`]: notices a request's wait took in.
    notice_fd: RawFd,
    daemon_gone: AtomicBool,
    board: FrontdBoardInfo,
    view: PeerView,
    /// The peer view's directory and the connection watching it; both change when the
    /// domain moves to another host (a simulated migration, see [`XenShared::follow_move`]).
    view_dir: Mutex<String>,
    xs: Mutex<Option<Arc<dyn Xenstore>>>,
    /// This process's attachment to its domain, followed when the domain moves.
    platform: Option<Arc<dyn xmx_hv::Platform>>,
    /// Registration without the daemon, for links with the cache off.
    own_grants: Option<(Arc<dyn xmx_hv::GrantTable>, xmx_hv::DomId)>,
    /// The direct channels to co-located guests, unless disabled or the
    /// platform could not give them; replaced when the domain moves to another
    /// host ([`XenShared::direct_follow`]).
    direct: RwLock<Option<Arc<direct::Hub>>>,
    endpoints: Mutex<FxHashMap<u8, Arc<EndpointShared>>>,
    wake: EventFd,
    stop: AtomicBool,
    config: XenConfig,
}

impl XenShared {
    /// The direct channels' hub of the host the domain is on, if any.
    fn hub(&self) -> Option<Arc<direct::Hub>> {
        self.direct
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn endpoints(&self) -> Vec<Arc<EndpointShared>> {
        lock(&self.endpoints).values().cloned().collect()
    }

    fn wake_fd(&self) -> RawFd {
        self.wake.as_fd().as_raw_fd()
    }

    /// Makes the driver thread look at its descriptors again.
    fn kick(&self) {
        if let Err(e) = self.wake.write(1) {
            tracing::debug!(%e, "waking the driver");
        }
    }

    fn drain_wake(&self) {
        let _ = self.wake.read();
    }

    /// The connection watching the peer view, if any.
    fn xs(&self) -> Option<Arc<dyn Xenstore>> {
        lock(&self.xs).clone()
    }

    /// Reloads the peer view after its watch fired.
    fn peer_view_changed(&self) {
        if self
            .platform
            .as_ref()
            .is_some_and(|p| !p.handles_follow_move())
        {
            // Real Xen: after a migration the watch fires again on the old path, which
            // names another domain's view now. Follow the domain first.
            self.follow_move();
        }
        let Some(xs) = self.xs() else { return };
        let mut fired = false;
        loop {
            match xs.next_watch_event(Some(Duration::ZERO)) {
                Ok(Some(_)) => fired = true,
                Ok(None) => break,
                Err(xmx_hv::Error::Closed(e)) => {
                    // Its domain left the host (a migration): the view as loaded stays
                    // until the process follows the domain to its new host.
                    tracing::info!(%e, "xenstore connection closed; the peer view stays as it is");
                    *lock(&self.xs) = None;
                    return;
                }
                Err(e) => {
                    tracing::warn!(%e, "xenstore watch");
                    break;
                }
            }
        }
        if fired {
            let dir = lock(&self.view_dir).clone();
            if let Err(e) = self.view.reload(xs.as_ref(), &dir) {
                tracing::warn!(%e, %dir, "reading the peer view");
            }
            // A channel a peer offered before this guest's view named it
            // could not be accepted then: look again.
            self.direct_rescan();
        }
    }

    /// Acts on what the guest daemon said.
    fn handle_notices(&self) {
        // The client's guard must be gone before the arms below take endpoint
        // links: the lock order is link, then client (a guard in the match's
        // scrutinee would live through the arms and deadlock with an
        // application thread that holds its link and waits for the client).
        let polled = lock(&self.client).poll_notices();
        let notices = match polled {
            Ok(n) => n,
            Err(e) => {
                // The daemon held the device and re-opens endpoints after a
                // backend restart: without it nothing will, so the endpoints
                // are lost and their requests fail now, not in minutes.
                tracing::warn!(%e, "the guest daemon is gone; failing the endpoints' requests");
                self.daemon_gone.store(true, Ordering::SeqCst);
                for ep in self.endpoints() {
                    lock(&ep.link).set_down();
                    let _ = ep.lost.set("the guest daemon xmx-frontd is gone");
                    ep.mailbox.ring();
                }
                return;
            }
        };
        for notice in notices {
            match notice {
                Notice::Disconnected | Notice::Shutdown => {
                    tracing::info!(?notice, "device down");
                    for ep in self.endpoints() {
                        lock(&ep.link).set_down();
                    }
                }
                Notice::Connected => {
                    tracing::info!("device connected again");
                    self.follow_move();
                }
                Notice::Unknown(kind) => {
                    tracing::debug!(
                        kind,
                        "a notice of a kind this library does not know, ignored"
                    );
                }
                Notice::GrantsShort => {
                    // Lock order: link, then client (the registrar takes it).
                    for ep in self.endpoints() {
                        let mut reg = FrontdRegistrar(&self.client);
                        lock(&ep.link).give_back_unused_windows(&mut reg);
                    }
                }
                Notice::EndpointLost { endpoint, reason } => {
                    tracing::warn!(endpoint, %reason, "endpoint lost");
                    if let Some(ep) = lock(&self.endpoints).get(&endpoint).cloned() {
                        lock(&ep.link).lose();
                        let _ = ep.lost.set("the backend lost the endpoint");
                        ep.mailbox.ring();
                    }
                }
                Notice::EndpointReopened(h) => {
                    // Regions registered again must be granted on the host the
                    // endpoint is open on now.
                    self.follow_move();
                    let Some(ep) = lock(&self.endpoints).get(&h.endpoint).cloned() else {
                        tracing::debug!(
                            endpoint = h.endpoint,
                            "re-opened endpoint no longer wanted"
                        );
                        continue;
                    };
                    // Lock order: link, then client.
                    let mut link = lock(&ep.link);
                    let mut client = lock(&self.client);
                    let remapped = link.remap(&mut client, h, &ep.mailbox);
                    drop(client);
                    match remapped {
                        link::Remapped::SessionChanged => {
                            link.lose();
                            let _ = ep.lost.set(
                                "the backend re-opened the endpoint under a new session: its peers no longer reach it",
                            );
                        }
                        // What the core sent while the endpoint was away was
                        // dropped: it goes again now, not a resend delay later.
                        link::Remapped::Resumed => ep.restored.store(true, Ordering::SeqCst),
                        link::Remapped::NotTaken => {}
                    }
                    drop(link);
                    ep.mailbox.ring();
                }
            }
        }
    }

    /// If the domain moved to another host (its guest daemon has followed it already, or
    /// on real Xen is about to), attach there: on the simulator the grant table follows
    /// with the regions this process granted itself; the peer view is watched on the new
    /// host's xenstore under the domain's new id.
    fn follow_move(&self) {
        let Some(platform) = &self.platform else {
            return;
        };
        match platform.follow_move() {
            Ok(false) => return,
            Ok(true) => {}
            Err(e) => {
                tracing::warn!(%e, "following the domain to its new host");
                return;
            }
        }
        let dir = peers::view_dir(self.config.toolstack, platform.domid());
        match platform.xenstore() {
            Ok(xs) => {
                if let Err(e) = xs.watch(&dir, PEERS_TOKEN) {
                    tracing::warn!(%e, %dir, "watching the peer view");
                }
                if let Err(e) = self.view.reload(xs.as_ref(), &dir) {
                    tracing::warn!(%e, %dir, "reading the peer view");
                }
                *lock(&self.xs) = Some(Arc::from(xs));
            }
            Err(e) => tracing::warn!(%e, "no xenstore on the new host"),
        }
        tracing::info!(domid = platform.domid(), %dir, "followed the domain to its new host");
        *lock(&self.view_dir) = dir;
        self.direct_follow(platform.as_ref());
        self.kick();
    }

    /// The domain moved: its direct channels were to guests of the host it
    /// left, so they end (what they hold is taken in first; frames lost with
    /// them are resent through the backend, pulls under way go on through it),
    /// and a hub on the new host offers and accepts channels to the guests
    /// beside it there.
    fn direct_follow(&self, platform: &dyn xmx_hv::Platform) {
        let Some(old) = self.hub() else { return };
        let endpoints = self.endpoints();
        let mut links: Vec<LinkRef<'_>> = endpoints.iter().map(|e| LinkRef(&e.link)).collect();
        let mut list = attached(&endpoints, &mut links);
        old.part(&mut list);
        drop(list);
        let next = match direct::Hub::start_after(platform, self.config.toolstack, &old) {
            Ok(h) => Some(Arc::new(h)),
            Err(e) => {
                tracing::info!(%e, "no direct channels on the new host: co-located guests go through the backend");
                None
            }
        };
        *self.direct.write().unwrap_or_else(|e| e.into_inner()) = next;
        for ep in &endpoints {
            let orphans = lock(&ep.direct).take_orphans();
            self.resume_pulls(ep, orphans);
        }
        self.direct_rescan();
    }

    /// xenstore changed under the direct channels: the hub follows it.
    fn direct_changed(&self) {
        let Some(hub) = self.hub() else { return };
        if hub.drain_store() {
            self.direct_rescan();
        }
    }

    /// The hub looks at the offers and channels again; a channel that ends
    /// is emptied into its endpoint's mailbox first ([`direct::Hub::rescan`]).
    fn direct_rescan(&self) {
        let Some(hub) = self.hub() else { return };
        let endpoints = self.endpoints();
        let mut links: Vec<LinkRef<'_>> = endpoints.iter().map(|e| LinkRef(&e.link)).collect();
        let mut list = attached(&endpoints, &mut links);
        hub.rescan(&mut list, &self.view);
        drop(list);
        for ep in &endpoints {
            let orphans = lock(&ep.direct).take_orphans();
            self.resume_pulls(ep, orphans);
            ep.mailbox.ring();
        }
    }

    /// Pulls again through the backend what a direct channel that ended had
    /// not finished.
    fn resume_pulls(&self, ep: &EndpointShared, orphans: Vec<direct::DirectSink>) {
        if orphans.is_empty() {
            return;
        }
        let mut link = lock(&ep.link);
        for s in orphans {
            tracing::debug!(id = ?s.id, "a direct pull goes through the backend");
            let mut reg = FrontdRegistrar(&self.client);
            let progress = link.pull(
                &mut reg,
                &ep.mailbox,
                s.id,
                s.source,
                s.window,
                &s.dest,
                s.length,
            );
            if let super::PullProgress::Done(r) = progress {
                ep.mailbox.put_pulls([(s.id, r)]);
            }
        }
        drop(link);
        ep.mailbox.ring();
    }

    /// Closes an endpoint: forgotten by the driver, its channel unmapped and
    /// closed by the daemon.
    fn close_endpoint(&self, ep: &Arc<EndpointShared>) {
        if let Some(hub) = self.hub() {
            hub.close_endpoint(&mut lock(&ep.direct));
        }
        let channel = {
            let mut link = lock(&ep.link);
            link.flush_sends(&ep.mailbox, &mut FrontdRegistrar(&self.client), CLOSE_FLUSH);
            link.close()
        };
        lock(&self.endpoints).remove(&ep.index);
        self.kick();
        if let Some(ch) = channel {
            if self.daemon_gone.load(Ordering::SeqCst) {
                return;
            }
            if let Err(e) = lock(&self.client).close_endpoint(ch) {
                tracing::debug!(%e, index = ep.index, "closing an endpoint");
            }
        }
        tracing::debug!(index = ep.index, "xen endpoint closed");
    }
}

/// The guest's board. See the module documentation.
pub(crate) struct Xen {
    shared: Arc<XenShared>,
    driver: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Xen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Xen")
            .field("mac", &self.shared.board.mac)
            .field("socket", &self.shared.config.socket)
            .finish_non_exhaustive()
    }
}

/// Asks the daemon for the board until the device is connected, or
/// `timeout` passes.
fn connected_board(
    client: &mut FrontdClient,
    timeout: Duration,
) -> Result<FrontdBoardInfo, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match client.info() {
            Ok(b) if b.connected => return Ok(b),
            Ok(_) | Err(FrontError::NotConnected(_)) => {}
            Err(e) => return Err(format!("asking xmx-frontd for the board: {e}")),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("the xmx device is not connected to its backend".into());
        }
        // Woken by the daemon's CONNECTED notice, or asks again later.
        let _ = client
            .wait_notice(left.min(Duration::from_millis(100)))
            .map_err(|e| format!("waiting for the device: {e}"))?;
    }
}

impl Xen {
    /// Connects to the guest daemon, loads the peer view and starts the
    /// driver thread.
    pub(crate) fn open(config: XenConfig) -> Result<Arc<Xen>, String> {
        let mut client = FrontdClient::connect(&config.socket).map_err(|e| e.to_string())?;
        let board = connected_board(&mut client, config.connect_timeout)?;
        let client_fd = client.fd().as_raw_fd();
        let notice_fd = client.queued_fd().as_raw_fd();
        let view = PeerView::default();
        let view_dir = peers::view_dir(config.toolstack, board.domid);
        let platform = xmx_hv::platform::from_env().ok();
        let xs = match platform
            .as_ref()
            .ok_or_else(|| xmx_hv::Error::NotFound("no platform".into()))
            .and_then(|p| p.xenstore())
        {
            Ok(xs) => {
                // The watch fires once at once, and the driver loads the view
                // then; load it here too so the first lookup finds it.
                if let Err(e) = xs.watch(&view_dir, PEERS_TOKEN) {
                    tracing::warn!(%e, dir = %view_dir, "watching the peer view");
                }
                if let Err(e) = view.reload(xs.as_ref(), &view_dir) {
                    tracing::warn!(%e, dir = %view_dir, "reading the peer view");
                }
                Some(Arc::<dyn Xenstore>::from(xs))
            }
            Err(e) => {
                tracing::warn!(%e, "no xenstore: the peer table stays empty");
                None
            }
        };
        let own_grants =
            windows::own_grants_platform(platform.as_deref(), xs.as_deref(), board.domid);
        let direct = if config.direct {
            match xmx_hv::platform::from_env()
                .map_err(|e| e.to_string())
                .and_then(|p| direct::Hub::start(p.as_ref(), config.toolstack))
            {
                Ok(h) => Some(h),
                Err(e) => {
                    tracing::info!(%e, "no direct channels: co-located guests go through the backend");
                    None
                }
            }
        } else {
            None
        };
        let wake = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(|e| format!("eventfd: {e}"))?;
        let shared = Arc::new(XenShared {
            client: Mutex::new(client),
            client_fd,
            notice_fd,
            daemon_gone: AtomicBool::new(false),
            board,
            view,
            view_dir: Mutex::new(view_dir),
            xs: Mutex::new(xs),
            platform,
            own_grants,
            direct: RwLock::new(direct.map(Arc::new)),
            endpoints: Mutex::new(FxHashMap::default()),
            wake,
            stop: AtomicBool::new(false),
            config,
        });
        let for_driver = shared.clone();
        let driver = std::thread::Builder::new()
            .name("mx-xen".into())
            .spawn(move || driver::run(for_driver))
            .map_err(|e| format!("driver thread: {e}"))?;
        tracing::info!(
            mac = %shared.board.mac,
            hostname = %shared.board.hostname,
            domid = shared.board.domid,
            "xen board up"
        );
        Ok(Arc::new(Xen {
            shared,
            driver: Mutex::new(Some(driver)),
        }))
    }
}

impl Drop for Xen {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.kick();
        if let Some(t) = lock(&self.driver).take() {
            if t.join().is_err() {
                tracing::warn!("xen driver thread panicked");
            }
        }
    }
}

impl Transport for Xen {
    fn name(&self) -> &'static str {
        "xen"
    }

    fn boards(&self) -> Vec<BoardInfo> {
        let b = &self.shared.board;
        vec![BoardInfo {
            nic_id: b.mac.to_board_addr(),
            hostname: b.hostname.clone(),
            max_endpoints: b.max_endpoints.min(256),
            numa_node: u32::MAX,
        }]
    }

    fn close_linger(&self) -> Duration {
        self.shared.config.linger
    }

    fn tune(&self, config: Config) -> Config {
        let c = &self.shared.config;
        Config {
            ack_delay: c.ack_delay,
            resend_delay: c.resend_delay.unwrap_or(config.resend_delay),
            ..config
        }
    }

    fn open(
        &self,
        board: u32,
        endpoint: Option<u8>,
        doorbell: Arc<Doorbell>,
        rcache: bool,
    ) -> Result<Box<dyn TransportPort>, OpenError> {
        if board != 0 {
            return Err(OpenError::BoardUnknown(board));
        }
        if let Some(i) = endpoint {
            if u32::from(i) >= self.shared.board.max_endpoints {
                return Err(OpenError::BadEndpointId(u32::from(i)));
            }
        }
        // The library waits for no send's completion but a MEDIUM's (the others free
        // nothing it needs: see `XenLink::deliver`), so the backend need not wake a
        // sleeping application for them.
        let opened = lock(&self.shared.client).open_endpoint_with(endpoint, None, true);
        let channel = opened.map_err(|e| open_refusal(e, endpoint))?;
        let index = channel.endpoint();
        let mut link = XenLink::new(channel, self.shared.board.max_regions, rcache);
        if let (false, Some((gnttab, backend))) = (rcache, &self.shared.own_grants) {
            link.register_with_own_grants(gnttab.clone(), *backend, doorbell.spin());
        }
        let ep = Arc::new(EndpointShared {
            index,
            mailbox: Mailbox::new(doorbell),
            link: Mutex::new(link),
            direct: Mutex::new(direct::EndpointDirect::default()),
            lost: std::sync::OnceLock::new(),
            restored: std::sync::atomic::AtomicBool::new(false),
        });
        lock(&self.shared.endpoints).insert(index, ep.clone());
        if let Some(hub) = self.shared.hub() {
            // Channels peers created for this endpoint id before it opened.
            let mut link = LinkRef(&ep.link);
            let mut list = [direct::HubEndpoint {
                index,
                direct: &ep.direct,
                mailbox: &ep.mailbox,
                link: &mut link,
            }];
            hub.rescan(&mut list, &self.shared.view);
        }
        self.shared.kick();
        tracing::debug!(index, "xen endpoint open");
        Ok(Box::new(XenPort::new(self.shared.clone(), ep)))
    }

    fn peer_index(&self, nic_id: u64) -> Option<u16> {
        let mac = Mac::from_board_addr(nic_id).ok()?;
        self.shared.view.read(|t| t.by_mac(mac).map(|e| e.index))
    }

    fn peer_nic_id(&self, peer_index: u16) -> Option<u64> {
        self.shared
            .view
            .read(|t| t.get(peer_index).map(|e| e.mac.to_board_addr()))
    }

    fn peer_hostname(&self, nic_id: u64) -> Option<String> {
        let mac = Mac::from_board_addr(nic_id).ok()?;
        if mac == self.shared.board.mac && !self.shared.board.hostname.is_empty() {
            return Some(self.shared.board.hostname.clone());
        }
        let deadline = Instant::now() + self.shared.config.discovery_wait;
        self.shared.view.wait_for(deadline, |t| {
            t.by_mac(mac)
                .filter(|e| !e.hostname.is_empty())
                .map(|e| e.hostname.clone())
        })
    }

    fn peer_by_hostname(&self, hostname: &str) -> Option<u64> {
        if hostname.trim().is_empty() {
            return None;
        }
        let board = board_name(hostname);
        let deadline = Instant::now() + self.shared.config.discovery_wait;
        self.shared.view.wait_for(deadline, |t| {
            t.iter()
                .find(|e| !e.hostname.is_empty() && (e.hostname == hostname || e.hostname == board))
                .map(|e| e.mac.to_board_addr())
        })
    }

    fn add_peer(&self, nic_id: u64, _hostname: Option<&str>) -> MxResult<()> {
        if self.peer_index(nic_id).is_some() {
            return Ok(());
        }
        Err(Failure::new(
            MxReturn::NoPerm,
            "a guest's peers are the toolstack's to set (xmx peers, xmxd)",
        ))
    }

    fn remove_peer(&self, _nic_id: u64) -> bool {
        false
    }

    fn set_hostname(&self, _board: u32, _hostname: &str) -> MxResult<()> {
        Err(Failure::new(
            MxReturn::NoPerm,
            "a guest's hostname is the toolstack's to set",
        ))
    }

    fn open_raw(&self, _board: u32, _doorbell: Arc<Doorbell>) -> MxResult<Box<dyn RawPort>> {
        Err(Failure::new(
            MxReturn::NoDriver,
            "raw endpoints are not available in a guest",
        ))
    }
}

/// The process's Xen board, opened on first use and shared by every
/// `mx_init` while it lives.
pub(crate) fn process_wide() -> MxResult<Arc<dyn Transport>> {
    static CURRENT: Mutex<Weak<Xen>> = Mutex::new(Weak::new());
    super::process_wide(&CURRENT, "xen", || {
        Xen::open(XenConfig::from_lookup(|k| std::env::var(k).ok())?)
    })
}

/// The open error an application sees for what the guest daemon answered. It names what
/// happened: an application that only sees "no free endpoint" cannot tell a full board from a
/// daemon that is gone or a device without a backend.
fn open_refusal(e: FrontError, endpoint: Option<u8>) -> OpenError {
    match e {
        FrontError::Refused {
            status: CtrlStatus::EndpointBusy,
            ..
        } => OpenError::Busy(endpoint.unwrap_or(0)),
        FrontError::Invalid(e) if endpoint.is_some() => {
            tracing::debug!(%e, "endpoint refused");
            OpenError::BadEndpointId(endpoint.map_or(0, u32::from))
        }
        FrontError::Exhausted(_)
        | FrontError::Refused {
            status: CtrlStatus::Quota,
            ..
        } => OpenError::NoResources,
        e @ FrontError::NotConnected(_) => OpenError::NoDevice(e.to_string()),
        e => {
            tracing::warn!(%e, "opening an endpoint");
            OpenError::NoDriver(e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_refusal_names_what_the_daemon_said() {
        use xmx_wire::msg::CtrlKind;
        let busy = FrontError::Refused {
            op: CtrlKind::EndpointOpen,
            status: CtrlStatus::EndpointBusy,
        };
        assert_eq!(open_refusal(busy, Some(3)), OpenError::Busy(3));
        let quota = FrontError::Refused {
            op: CtrlKind::EndpointOpen,
            status: CtrlStatus::Quota,
        };
        assert_eq!(open_refusal(quota, None), OpenError::NoResources);
        let full = FrontError::Exhausted("endpoint index".into());
        assert_eq!(open_refusal(full, None), OpenError::NoResources);
        let away = open_refusal(FrontError::NotConnected("backend closing".into()), None);
        assert_eq!(Failure::from(away.clone()).code, MxReturn::NoDev);
        assert!(away.to_string().contains("backend closing"), "{away}");
        let gone = open_refusal(FrontError::Closed("xmx-frontd hung up".into()), None);
        assert_eq!(Failure::from(gone.clone()).code, MxReturn::NoDriver);
        assert!(gone.to_string().contains("xmx-frontd hung up"), "{gone}");
    }

    fn with(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let env: FxHashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| env.get(k).cloned()
    }

    #[test]
    fn selected_by_the_daemon_socket_unless_a_transport_is_named() {
        assert!(is_default(with(&[("XMX_FRONTD_SOCKET", "/run/x.sock")])));
        assert!(!is_default(with(&[("XMX_FRONTD_SOCKET", " ")])));
        assert!(!is_default(with(&[])));
        assert!(!is_default(with(&[
            ("XMX_FRONTD_SOCKET", "/run/x.sock"),
            ("XMX_TRANSPORT", "loopback")
        ])));
    }

    #[test]
    fn configuration_from_the_environment() {
        let c = XenConfig::from_lookup(with(&[
            ("XMX_FRONTD_SOCKET", "/tmp/f.sock"),
            ("XMX_TOOLSTACK_DOMID", "3"),
            ("XMX_RESEND_DELAY_US", "20000"),
            ("XMX_DISCOVERY_MS", "250"),
            ("XMX_LINGER_MS", "300"),
        ]))
        .unwrap();
        assert_eq!(c.socket, PathBuf::from("/tmp/f.sock"));
        assert_eq!(c.toolstack, 3);
        assert_eq!(c.ack_delay, DEFAULT_ACK_DELAY);
        assert_eq!(c.resend_delay, Some(Duration::from_millis(20)));
        assert_eq!(c.discovery_wait, Duration::from_millis(250));
        assert_eq!(c.connect_timeout, Duration::from_secs(10));
        assert_eq!(c.linger, Duration::from_millis(300));
        // A closed endpoint outlasts its partner's first resend by default,
        // so the ack of a message whose last ack was lost is not a refusal.
        let quiet = XenConfig::from_lookup(with(&[])).unwrap();
        assert_eq!(quiet.linger, Duration::from_millis(750));
        let fast = XenConfig::from_lookup(with(&[("XMX_RESEND_DELAY_US", "20000")])).unwrap();
        assert_eq!(fast.linger, Duration::from_millis(30));
        let off = XenConfig::from_lookup(with(&[("XMX_LINGER_MS", "0")])).unwrap();
        assert_eq!(off.linger, Duration::ZERO);
        // Direct channels are on unless either knob turns them off.
        assert!(quiet.direct);
        for (knobs, direct) in [
            (&[("XMX_DIRECT", "1")][..], true),
            (&[("XMX_DIRECT", "0")][..], false),
            (&[("MX_DISABLE_SHMEM", "1")][..], false),
            (&[("MX_DISABLE_SHMEM", "0")][..], true),
            (&[("XMX_DIRECT", "1"), ("MX_DISABLE_SHMEM", "1")][..], false),
        ] {
            let c = XenConfig::from_lookup(with(knobs)).unwrap();
            assert_eq!(c.direct, direct, "{knobs:?}");
        }
        for bad in [
            ("XMX_TOOLSTACK_DOMID", "70000"),
            ("XMX_ACK_DELAY_US", "soon"),
            ("XMX_LINGER_MS", "long"),
        ] {
            assert!(XenConfig::from_lookup(with(&[bad])).is_err(), "{bad:?}");
        }
    }
}

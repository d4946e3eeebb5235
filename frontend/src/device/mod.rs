//! [`Frontend`]: device `xmx` of this guest, from the xenbus handshake to the endpoints
//! and regions it shares with the backend.
//!
//! The frontend is driven by its caller: [`Frontend::pump`] waits for xenstore watch
//! events (the backend's state, the toolstack's `control/shutdown`) and takes the steps
//! [`crate::xenbus::step`] decides. Control requests ([`Frontend::open_endpoint`], ...)
//! are synchronous calls on the control ring.
//!
//! # Endpoints across reconnections
//!
//! When the device disconnects (backend closing, suspend), the endpoints' pages stay
//! granted and mapped by their applications, but the backend forgot them. When the device
//! connects again, each endpoint is opened again over **new** grants and a new port (after
//! a migration the old grants would not exist any more): its old share is *retired*, and
//! the new one is offered through [`Frontend::take_reopened`] to be handed to the
//! application, which remaps and then lets the daemon [`Frontend::release_retired`] the
//! old pages. Rings start empty again: send requests in flight at the disconnection get
//! no completion and the events not yet consumed are lost (MX retransmits above this).
//! Each endpoint asks to keep its session, which the backend grants only if it recorded
//! that session for it (a restarted backend does), so peers' connections stay valid.
//! The regions stay granted (when the backend went away on its own, a restart, and
//! across a suspend, a simulated domain's move to another host included) and are
//! registered again under their ids over the same pages (the hand-off says
//! `regions_kept`), so windows lent to peers stay valid; if registering one again fails
//! (grants that did not survive, as after a real Xen migration), none is kept and they
//! have to be registered again.
//!
//! # Detach and re-attach
//!
//! dom0 may remove the device and create it again while the guest runs: that is how it
//! moves a guest to another virtual cluster (the backend reads a device's identity when
//! it connects). A removed device leaves the frontend [`Frontend::is_detached`], Closed
//! but still wanting the device; when the toolstack creates it again the frontend reads
//! the new `backend` and `backend-id`, runs the handshake again and re-opens its
//! endpoints as after any reconnection. The identity (MAC, cluster, hostname) is read
//! from the backend's directory each time; nothing the guest writes chooses it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use xmx_hv::{
    DomId, Error as HvError, GrantTable, GrantedPages, Platform, WatchEvent, Xenstore, XBT_NULL,
};
use xmx_wire::msg::EndpointPages;
use xmx_wire::mxoe::Mac;
use xmx_wire::xenbus::{self, keys, XenbusState};

use crate::ctrl::{CtrlClient, CtrlStats};
use crate::error::{Error, Result};
use crate::handoff::{check_geometry, EndpointHandoff};
use crate::shared::{end_grants, end_shared_grants, OwnedPort};
use crate::xenbus::{step, FrontendStep};

mod endpoints;
mod handshake;
mod lifecycle;
mod regions;

/// Watch tokens of a frontend.
const TOKEN_BACKEND: &str = "xmx-front:backend";
const TOKEN_SHUTDOWN: &str = "xmx-front:shutdown";
/// Fires when the toolstack removes the device or creates it again.
const TOKEN_DEVICE: &str = "xmx-front:device-node";
/// Transactions are retried this many times on conflict.
const TX_ATTEMPTS: usize = 16;

/// How a frontend behaves.
#[derive(Debug, Clone)]
pub struct FrontendConfig {
    /// Device index (0 for the first `xmx` device of the guest).
    pub devid: u32,
    /// Geometry of endpoints whose opener does not ask for one.
    pub endpoint_pages: EndpointPages,
    /// Published as `feature-rcache`: whether regions stay registered across messages.
    pub rcache: bool,
    /// How long a control request may wait for its response.
    pub ctrl_timeout: Duration,
    /// How long a close waits for the backend to let go.
    pub close_timeout: Duration,
}

/// The default endpoint geometry: 2 pages of send ring (32 slots), 8 of event ring
/// (128 slots, the most a ring may have), 64 send-queue and 128 receive-queue
/// fragments. A stream of MEDIUM messages keeps a window of fragments in flight per
/// partner; with 64 receive slots the queue overflowed under a 4 KiB stream and every
/// dropped fragment cost a resend delay.
pub const DEFAULT_ENDPOINT_PAGES: EndpointPages = EndpointPages {
    send_ring: 2,
    event_ring: 8,
    send_queue: 64,
    recv_queue: 128,
};

impl Default for FrontendConfig {
    fn default() -> Self {
        FrontendConfig {
            devid: 0,
            endpoint_pages: DEFAULT_ENDPOINT_PAGES,
            rcache: true,
            ctrl_timeout: Duration::from_secs(10),
            close_timeout: Duration::from_secs(10),
        }
    }
}

/// What the backend published for this guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendInfo {
    /// The backend's domain.
    pub backend_id: DomId,
    /// The guest's board MAC (its MX NIC id).
    pub mac: Mac,
    /// The guest's virtual cluster.
    pub cluster: u32,
    /// The guest's MX hostname.
    pub hostname: String,
    /// Endpoints the guest may open.
    pub max_endpoints: u32,
    /// Regions each endpoint may register.
    pub max_regions: u32,
    /// Whether co-located guests are served without the wire.
    pub local_delivery: bool,
}

/// What a disconnection does with the endpoints open in the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EndpointsAtClose {
    /// Closed one by one first: they are gone for good, and so are their sessions.
    Closed,
    /// Left to the device's release: the backend keeps their sessions recorded, and the
    /// endpoints re-opened after the reconnection keep them, so peers' messages and acks
    /// in flight still reach them (a suspend, or giving up on an unanswered request).
    Kept,
}

/// Whether the frontend wants to be connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Connect, and reconnect after the backend comes back.
    Active,
    /// Disconnected for a suspend; waits for [`Frontend::resume`].
    Suspended,
    /// Closed for good.
    Stopped,
}

/// Something the owner of a frontend may want to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrontendEvent {
    /// The device is connected (again).
    Connected,
    /// The device lost its backend; open endpoints are not served until it reconnects.
    Disconnected,
    /// The toolstack asked for a suspend; the device is now disconnected.
    Suspended,
    /// Back from a suspend: reconnecting.
    Resumed,
    /// An endpoint was opened again after a reconnection (see [`Frontend::take_reopened`]).
    EndpointReopened {
        /// The endpoint's index.
        endpoint: u8,
    },
    /// An endpoint could not be opened again after a reconnection; it is gone.
    EndpointLost {
        /// The endpoint's index.
        endpoint: u8,
        /// Why opening it again failed.
        reason: String,
    },
}

/// One endpoint's memory and port, granted to the backend by this guest.
struct EndpointShare {
    geometry: EndpointPages,
    pages: Arc<GrantedPages>,
    port: OwnedPort,
    session_id: u32,
    generation: u32,
    open_in_backend: bool,
    /// Asked for at its opening ([`xmx_wire::msg::EndpointOpen::quiet_send_done`]).
    quiet_send_done: bool,
    regions: BTreeMap<u8, RegionShare>,
}

/// One registered region's pages.
struct RegionShare {
    pages: GrantedPages,
    length: u32,
    /// The backend domain the pages are granted to.
    backend_id: DomId,
}

/// What a request that timed out had shared: the backend may still act on it, so it is
/// kept until the backend has let go of the whole connection.
enum Quarantined {
    Endpoint(EndpointShare),
    Pages(GrantedPages),
}

impl EndpointShare {
    fn release(self, what: &str) {
        for (_, r) in self.regions {
            end_grants(r.pages, "region");
        }
        drop(self.port);
        end_shared_grants(self.pages, what);
    }
}

/// Device `xmx` of this guest; see the module documentation.
pub struct Frontend {
    platform: Arc<dyn Platform>,
    cfg: FrontendConfig,
    domid: DomId,
    front_dir: String,
    back_dir: String,
    backend_id: DomId,
    xs: Box<dyn Xenstore>,
    gnttab: Arc<dyn GrantTable>,
    state: XenbusState,
    mode: Mode,
    ctrl: Option<CtrlClient>,
    /// Counters of the control channels closed so far (a new one per connection).
    past_ctrl: CtrlStats,
    info: Option<BackendInfo>,
    endpoints: BTreeMap<u8, EndpointShare>,
    retired: Vec<(u8, u32, EndpointShare)>,
    quarantine: Vec<Quarantined>,
    /// A control request timed out: the backend is not serving us; disconnect.
    broken: bool,
    /// The toolstack removed the device (a detach, or the first half of a re-attach
    /// that moves the guest to another cluster); it is taken up again when the toolstack
    /// creates it anew.
    detached: bool,
    /// The domain moved and its grants did not follow (real Xen): the endpoints' regions
    /// are not registered again over their old pages at the next re-open.
    grants_lost: bool,
    /// The platform reported a move not yet followed (see [`Frontend::follow_move`]).
    move_pending: bool,
    reopened: Vec<EndpointHandoff>,
    events: VecDeque<FrontendEvent>,
}

fn parse_text(raw: Vec<u8>, what: &str) -> Result<String> {
    String::from_utf8(raw)
        .map(|s| s.trim_end_matches('\0').trim().to_string())
        .map_err(|_| Error::Protocol(format!("{what} is not UTF-8")))
}

impl Frontend {
    /// The frontend of device `cfg.devid` of the domain `platform` attaches as. The device
    /// must exist (the toolstack wrote `backend` and `backend-id`; see
    /// [`Frontend::wait_for_device`]). Registers its watches; call [`Frontend::pump`] or
    /// [`Frontend::wait_connected`] to make progress.
    pub fn new(platform: Arc<dyn Platform>, cfg: FrontendConfig) -> Result<Frontend> {
        check_geometry(&cfg.endpoint_pages)?;
        let domid = platform.domid();
        let xs = platform.xenstore()?;
        let gnttab = platform.grant_table()?;
        let front_dir = xenbus::frontend_dir(domid, cfg.devid);
        let read = |key: &str| -> Result<String> {
            parse_text(xs.read(XBT_NULL, &xenbus::key_path(&front_dir, key))?, key)
        };
        let back_dir = read(keys::BACKEND)?;
        let backend_id: DomId = xenbus::parse_u32(&read(keys::BACKEND_ID)?)
            .ok()
            .and_then(|v| DomId::try_from(v).ok())
            .ok_or_else(|| Error::Protocol("backend-id is not a domain id".into()))?;
        if back_dir.is_empty() || !back_dir.starts_with('/') {
            return Err(Error::Protocol(format!("backend path {back_dir:?}")));
        }
        xs.watch(&xenbus::key_path(&back_dir, keys::STATE), TOKEN_BACKEND)?;
        xs.watch(
            &format!("/local/domain/{domid}/control/shutdown"),
            TOKEN_SHUTDOWN,
        )?;
        xs.watch(
            &xenbus::key_path(&front_dir, keys::BACKEND_ID),
            TOKEN_DEVICE,
        )?;
        tracing::info!(domid, devid = cfg.devid, backend = %back_dir, backend_id, "xmx frontend");
        let mut fe = Frontend {
            platform,
            cfg,
            domid,
            front_dir,
            back_dir,
            backend_id,
            xs,
            gnttab,
            state: XenbusState::Unknown,
            mode: Mode::Active,
            ctrl: None,
            past_ctrl: CtrlStats::default(),
            info: None,
            endpoints: BTreeMap::new(),
            retired: Vec::new(),
            quarantine: Vec::new(),
            broken: false,
            detached: false,
            grants_lost: false,
            move_pending: false,
            reopened: Vec::new(),
            events: VecDeque::new(),
        };
        fe.announce_suspend_feature();
        // Whatever an earlier instance left, start from Initialising.
        fe.set_state(XenbusState::Initialising)?;
        Ok(fe)
    }

    /// Wait (on a xenstore watch) until the toolstack created device `devid` of this
    /// domain, i.e. wrote its `backend-id`.
    pub fn wait_for_device(platform: &dyn Platform, devid: u32, timeout: Duration) -> Result<()> {
        Self::wait_for_device_or_stop(platform, devid, timeout, None).map(|_| ())
    }

    /// [`Frontend::wait_for_device`], also ending when `stop` polls readable (a daemon
    /// told to stop). True if the device exists, false if stopped first.
    pub fn wait_for_device_or_stop(
        platform: &dyn Platform,
        devid: u32,
        timeout: Duration,
        stop: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<bool> {
        let xs = platform.xenstore()?;
        let path = xenbus::key_path(
            &xenbus::frontend_dir(platform.domid(), devid),
            keys::BACKEND_ID,
        );
        let token = "xmx-front:device";
        xs.watch(&path, token)?;
        let deadline = Instant::now() + timeout;
        let result = loop {
            match xs.read(XBT_NULL, &path) {
                Ok(_) => break Ok(true),
                Err(HvError::NotFound(_)) => {}
                Err(e) => break Err(e.into()),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Err(Error::Timeout(format!("device {path}")));
            }
            if let Some(stop) = stop {
                match wait_readable(xs.watch_fd(), stop, left) {
                    Ok(true) => break Ok(false),
                    Ok(false) => {}
                    Err(e) => break Err(e),
                }
            }
            if let Err(e) =
                xs.next_watch_event(Some(if stop.is_some() { Duration::ZERO } else { left }))
            {
                break Err(e.into());
            }
        };
        let _ = xs.unwatch(&path, token);
        result
    }

    /// This guest's domain id.
    pub fn domid(&self) -> DomId {
        self.domid
    }

    /// The state this frontend last wrote.
    pub fn state(&self) -> XenbusState {
        self.state
    }

    /// Whether a migration goes unannounced to this frontend (real Xen: the guest simply
    /// runs on, on another host) so that its owner must look for one
    /// ([`Frontend::follow_move`]) whenever its watches fire, as they all do once the
    /// kernel has set them again on the new host.
    pub fn moves_silently(&self) -> bool {
        !self.platform.handles_follow_move()
    }

    /// Whether it wants to be connected.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Connected to the backend, with its offer read.
    pub fn is_connected(&self) -> bool {
        self.state == XenbusState::Connected && self.ctrl.is_some()
    }

    /// What the backend published, while connected.
    pub fn backend_info(&self) -> Option<&BackendInfo> {
        self.info.as_ref()
    }

    /// `/local/domain/<domid>/device/xmx/<devid>`.
    pub fn frontend_dir(&self) -> &str {
        &self.front_dir
    }

    /// The backend directory named by the toolstack.
    pub fn backend_dir(&self) -> &str {
        &self.back_dir
    }

    /// A descriptor that polls readable while a watch event waits for [`Frontend::pump`].
    pub fn watch_fd(&self) -> std::os::fd::RawFd {
        self.xs.watch_fd()
    }

    /// Counters of the control ring, over every connection so far.
    pub fn ctrl_stats(&self) -> CtrlStats {
        let now = self.ctrl.as_ref().map(|c| c.stats()).unwrap_or_default();
        self.past_ctrl.plus(now)
    }

    /// Events since the last call.
    pub fn take_events(&mut self) -> Vec<FrontendEvent> {
        self.events.drain(..).collect()
    }

    /// Endpoints opened again after a reconnection, to hand to their applications.
    pub fn take_reopened(&mut self) -> Vec<EndpointHandoff> {
        std::mem::take(&mut self.reopened)
    }

    /// Open endpoint indices (served by the backend or waiting for a reconnection).
    pub fn endpoints(&self) -> Vec<u8> {
        self.endpoints.keys().copied().collect()
    }

    /// Regions registered on `endpoint`.
    pub fn regions(&self, endpoint: u8) -> Vec<u8> {
        self.endpoints
            .get(&endpoint)
            .map(|e| e.regions.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Wait for watch events up to `timeout` (None: forever) and act on every one queued.
    /// True if any came.
    pub fn pump(&mut self, timeout: Option<Duration>) -> Result<bool> {
        let Some(first) = self.xs.next_watch_event(timeout)? else {
            return Ok(false);
        };
        let mut shutdown = self.is_shutdown_event(&first);
        while let Some(ev) = self.xs.next_watch_event(Some(Duration::ZERO))? {
            shutdown |= self.is_shutdown_event(&ev);
        }
        if shutdown {
            self.check_shutdown_request()?;
        }
        self.advance()?;
        Ok(true)
    }

    fn is_shutdown_event(&self, ev: &WatchEvent) -> bool {
        ev.token == TOKEN_SHUTDOWN
    }

    /// Pump until connected, or fail after `timeout`.
    pub fn wait_connected(&mut self, timeout: Duration) -> Result<&BackendInfo> {
        let deadline = Instant::now() + timeout;
        self.advance()?;
        while !self.is_connected() {
            if self.mode != Mode::Active {
                return Err(Error::NotConnected(format!("frontend is {:?}", self.mode)));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout(format!(
                    "connecting {} (at {:?}, backend {:?})",
                    self.front_dir,
                    self.state,
                    self.backend_state()
                )));
            }
            self.pump(Some(left))?;
        }
        self.info
            .as_ref()
            .ok_or_else(|| Error::NotConnected("no backend info".into()))
    }

    /// The backend's state as it is now in xenstore (None if unreadable).
    pub fn backend_state(&self) -> Option<XenbusState> {
        let raw = self
            .xs
            .read(XBT_NULL, &xenbus::key_path(&self.back_dir, keys::STATE))
            .ok()?;
        parse_text(raw, "state").ok()?.parse().ok()
    }

    /// Take every step the states call for now.
    pub fn advance(&mut self) -> Result<()> {
        match self.take_steps() {
            // The toolstack removed the device under us (a detach): wait for it to come
            // back rather than recreate its nodes by writing our state.
            Err(Error::Platform(HvError::NotFound(_))) if !self.device_present()? => {
                self.mark_detached()
            }
            other => other,
        }
    }

    fn take_steps(&mut self) -> Result<()> {
        // Each step changes our state, so a handful is the longest useful chain.
        for _ in 0..8 {
            if self.detached {
                if self.mode != Mode::Active || !self.device_present()? {
                    return Ok(());
                }
                self.reattach()?;
            }
            let back = self.backend_state();
            let want = self.mode == Mode::Active;
            let s = step(self.state, back, want);
            tracing::trace!(front = ?self.state, ?back, want, step = ?s, "xenbus");
            match s {
                FrontendStep::Stay => {
                    if back.is_none() && !self.device_present()? {
                        self.mark_detached()?;
                    }
                    return Ok(());
                }
                FrontendStep::Publish => self.publish()?,
                FrontendStep::Connect => self.connect()?,
                FrontendStep::Teardown => self.teardown()?,
                FrontendStep::Restart => self.set_state(XenbusState::Initialising)?,
            }
        }
        Ok(())
    }
}

/// Wait up to `timeout` until `watch` or `stop` polls readable; true if `stop` did.
fn wait_readable(
    watch: std::os::fd::RawFd,
    stop: std::os::fd::BorrowedFd<'_>,
    timeout: Duration,
) -> Result<bool> {
    use std::os::fd::AsRawFd;
    let mut fds = [
        libc::pollfd {
            fd: watch,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: stop.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: `fds` is a valid array of two pollfd structures for the duration of the
    // call, and its length is passed with it.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(Error::Io(e));
    }
    Ok(fds[1].revents != 0)
}

/// Copy `bytes` into the start of granted pages.
fn write_pages(pages: &mut GrantedPages, bytes: &[u8]) {
    let n = bytes.len().min(pages.len());
    // SAFETY: the pages are mapped writable for `pages.len()` bytes in this process and
    // `n` is within that; they were just granted and the backend has not been told their
    // refs yet, so nobody else writes them concurrently.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), pages.as_ptr(), n) };
}

impl Drop for Frontend {
    fn drop(&mut self) {
        if self.mode != Mode::Stopped {
            if let Err(e) = self.shutdown() {
                tracing::debug!(error = %e, "closing the frontend on drop");
            }
        }
        let _ = self.xs.unwatch(
            &xenbus::key_path(&self.back_dir, keys::STATE),
            TOKEN_BACKEND,
        );
        let _ = self
            .xs
            .unwatch(&self.front_key(keys::BACKEND_ID), TOKEN_DEVICE);
    }
}

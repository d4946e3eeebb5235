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
    DomId, Error as HvError, GrantTable, GrantedPages, Platform, TxId, WatchEvent, Xenstore,
    PAGE_SIZE, XBT_NULL,
};
use xmx_wire::msg::{
    pack_info_page, pack_info_pages, CtrlOp, CtrlReply, CtrlStatus, EndpointOpen, EndpointPages,
    RegionRegister, PROTOCOL_VERSION, REGION_PAGES_MAX,
};
use xmx_wire::mxoe::Mac;
use xmx_wire::ring::init_shared;
use xmx_wire::xenbus::{self, keys, XenbusState};

use crate::ctrl::{CtrlClient, CtrlStats};
use crate::error::{Error, Result};
use crate::handoff::{check_geometry, EndpointHandoff, RegionHandoff};
use crate::shared::{end_grants, end_shared_grants, granted_mem, OwnedPort};
use crate::xenbus::{step, Step};

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
        let p = self.past_ctrl;
        CtrlStats {
            endpoint_open: p.endpoint_open + now.endpoint_open,
            endpoint_close: p.endpoint_close + now.endpoint_close,
            region_register: p.region_register + now.region_register,
            region_deregister: p.region_deregister + now.region_deregister,
            notifications: p.notifications + now.notifications,
            suppressed: p.suppressed + now.suppressed,
            timeouts: p.timeouts + now.timeouts,
            stale_responses: p.stale_responses + now.stale_responses,
        }
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
                Step::Stay => {
                    if back.is_none() && !self.device_present()? {
                        self.mark_detached()?;
                    }
                    return Ok(());
                }
                Step::Publish => self.publish()?,
                Step::Connect => self.connect()?,
                Step::Teardown => self.teardown()?,
                Step::Restart => self.set_state(XenbusState::Initialising)?,
            }
        }
        Ok(())
    }

    /// Whether the toolstack has removed the device (and not created it again yet).
    pub fn is_detached(&self) -> bool {
        self.detached
    }

    /// Whether the device's frontend directory names a backend.
    fn device_present(&self) -> Result<bool> {
        match self.xs.read(XBT_NULL, &self.front_key(keys::BACKEND_ID)) {
            Ok(_) => Ok(true),
            Err(HvError::NotFound(_)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// The device is gone: release what the old connection held and wait for the
    /// toolstack to create the device again.
    fn mark_detached(&mut self) -> Result<()> {
        if self.detached {
            return Ok(());
        }
        if self.ctrl.is_some()
            || matches!(
                self.state,
                XenbusState::Initialised | XenbusState::Connected
            )
        {
            // Saying Closed into the vanished directory fails and marks us detached; if
            // it succeeds, the device is back already and the handshake goes on.
            return self.teardown();
        }
        self.detached = true;
        self.state = XenbusState::Closed;
        tracing::info!(device = %self.front_dir, "the device was removed; waiting for it to come back");
        Ok(())
    }

    /// The toolstack created the device again: read where its backend is now and start
    /// the handshake over. Open endpoints are re-opened once connected.
    fn reattach(&mut self) -> Result<()> {
        let read = |key: &str| -> Result<String> {
            parse_text(self.xs.read(XBT_NULL, &self.front_key(key))?, key)
        };
        let back_dir = read(keys::BACKEND)?;
        let backend_id: DomId = xenbus::parse_u32(&read(keys::BACKEND_ID)?)
            .ok()
            .and_then(|v| DomId::try_from(v).ok())
            .ok_or_else(|| Error::Protocol("backend-id is not a domain id".into()))?;
        if back_dir.is_empty() || !back_dir.starts_with('/') {
            return Err(Error::Protocol(format!("backend path {back_dir:?}")));
        }
        if back_dir != self.back_dir {
            let _ = self.xs.unwatch(
                &xenbus::key_path(&self.back_dir, keys::STATE),
                TOKEN_BACKEND,
            );
            self.xs
                .watch(&xenbus::key_path(&back_dir, keys::STATE), TOKEN_BACKEND)?;
            self.back_dir = back_dir;
        }
        self.backend_id = backend_id;
        self.detached = false;
        tracing::info!(backend = %self.back_dir, backend_id, "the device is back; connecting again");
        self.set_state(XenbusState::Initialising)
    }

    fn in_transaction(&self, mut body: impl FnMut(TxId) -> Result<()>) -> Result<()> {
        for _ in 0..TX_ATTEMPTS {
            let tx = self.xs.transaction_start()?;
            if let Err(e) = body(tx) {
                let _ = self.xs.transaction_end(tx, false);
                return Err(e);
            }
            match self.xs.transaction_end(tx, true) {
                Ok(()) => return Ok(()),
                Err(HvError::Again) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(Error::Platform(HvError::Again))
    }

    fn front_key(&self, key: &str) -> String {
        xenbus::key_path(&self.front_dir, key)
    }

    /// Write our state, unless the device directory is gone (the toolstack removed the
    /// device: writing would create it again).
    fn set_state(&mut self, state: XenbusState) -> Result<()> {
        let dir = self.front_dir.clone();
        let path = self.front_key(keys::STATE);
        let value = state.to_string();
        self.in_transaction(|tx| {
            self.xs.read(tx, &dir)?;
            self.xs.write(tx, &path, value.as_bytes())?;
            Ok(())
        })?;
        tracing::debug!(devid = self.cfg.devid, from = ?self.state, to = ?state, "frontend state");
        self.state = state;
        Ok(())
    }

    /// Grant the control ring, allocate its channel, publish them, say Initialised.
    fn publish(&mut self) -> Result<()> {
        if let Some(old) = self.ctrl.take() {
            self.retire_ctrl(old);
        }
        let evtchn = self.platform.event_channels()?;
        let ctrl = CtrlClient::new(self.gnttab.as_ref(), evtchn, self.backend_id)?;
        let entries = [
            (keys::RING_REF, ctrl.ring_ref().to_string()),
            (keys::EVENT_CHANNEL, ctrl.port().to_string()),
            (keys::PROTOCOL_VERSION, PROTOCOL_VERSION.to_string()),
            (keys::FEATURE_RCACHE, u8::from(self.cfg.rcache).to_string()),
            (keys::STATE, XenbusState::Initialised.to_string()),
        ];
        let dir = self.front_dir.clone();
        let written = self.in_transaction(|tx| {
            self.xs.read(tx, &dir)?;
            for (key, value) in &entries {
                self.xs
                    .write(tx, &xenbus::key_path(&dir, key), value.as_bytes())?;
            }
            Ok(())
        });
        if let Err(e) = written {
            ctrl.release();
            return Err(e);
        }
        tracing::info!(
            ring_ref = ctrl.ring_ref(),
            port = ctrl.port(),
            "control ring published"
        );
        self.ctrl = Some(ctrl);
        self.state = XenbusState::Initialised;
        Ok(())
    }

    fn read_backend_info(&self) -> Result<BackendInfo> {
        let read = |key: &str| -> Result<Option<String>> {
            match self
                .xs
                .read(XBT_NULL, &xenbus::key_path(&self.back_dir, key))
            {
                Ok(v) => Ok(Some(parse_text(v, key)?)),
                Err(HvError::NotFound(_)) => Ok(None),
                Err(e) => Err(e.into()),
            }
        };
        let number = |key: &str, default: u32| -> Result<u32> {
            match read(key)? {
                Some(s) => xenbus::parse_u32(&s)
                    .map_err(|e| Error::Protocol(format!("backend {key}: {e}"))),
                None => Ok(default),
            }
        };
        let version = number(keys::PROTOCOL_VERSION, u32::from(PROTOCOL_VERSION))?;
        if version != u32::from(PROTOCOL_VERSION) {
            return Err(Error::Protocol(format!(
                "backend speaks protocol {version}, we speak {PROTOCOL_VERSION}"
            )));
        }
        let mac: Mac = read(keys::MAC)?
            .ok_or_else(|| Error::Protocol("backend published no mac".into()))?
            .parse()
            .map_err(|e| Error::Protocol(format!("backend mac: {e}")))?;
        Ok(BackendInfo {
            backend_id: self.backend_id,
            mac,
            cluster: number(keys::CLUSTER, 0)?,
            hostname: read(keys::HOSTNAME)?.unwrap_or_default(),
            max_endpoints: number(keys::MAX_ENDPOINTS, 0)?,
            max_regions: number(keys::MAX_REGIONS, 0)?,
            local_delivery: number(keys::FEATURE_LOCAL_DELIVERY, 0)? == 1,
        })
    }

    /// The backend is Connected: read its offer, say Connected, re-open lost endpoints.
    fn connect(&mut self) -> Result<()> {
        let info = match self.read_backend_info() {
            Ok(i) => i,
            Err(e) => {
                tracing::error!(error = %e, "the backend's offer is unusable; closing");
                self.teardown()?;
                self.mode = Mode::Stopped;
                return Err(e);
            }
        };
        self.set_state(XenbusState::Connected)?;
        tracing::info!(mac = %info.mac, hostname = %info.hostname, cluster = info.cluster, "connected");
        self.info = Some(info);
        self.events.push_back(FrontendEvent::Connected);
        self.reopen_endpoints();
        Ok(())
    }

    fn retire_ctrl(&mut self, ctrl: CtrlClient) {
        let s = ctrl.stats();
        let p = &mut self.past_ctrl;
        p.endpoint_open += s.endpoint_open;
        p.endpoint_close += s.endpoint_close;
        p.region_register += s.region_register;
        p.region_deregister += s.region_deregister;
        p.notifications += s.notifications;
        p.suppressed += s.suppressed;
        p.timeouts += s.timeouts;
        p.stale_responses += s.stale_responses;
        ctrl.release();
    }

    /// The backend let go (or vanished): release the ring, forget what the backend held,
    /// say Closed.
    /// The regions stay granted: the backend lost them with the connection, and they are
    /// registered again, under the same ids, when the endpoints are re-opened, so that
    /// windows the application lent to peers stay valid across a backend restart.
    fn teardown(&mut self) -> Result<()> {
        let was_connected = self.state == XenbusState::Connected;
        self.release_connection(was_connected, true)
    }

    fn release_connection(&mut self, was_connected: bool, keep_regions: bool) -> Result<()> {
        if let Some(ctrl) = self.ctrl.take() {
            self.retire_ctrl(ctrl);
        }
        self.info = None;
        self.broken = false;
        for q in self.quarantine.drain(..) {
            match q {
                Quarantined::Endpoint(share) => share.release("endpoint of a timed-out request"),
                Quarantined::Pages(pages) => end_grants(pages, "pages of a timed-out request"),
            }
        }
        for ep in self.endpoints.values_mut() {
            ep.open_in_backend = false;
            // The backend dropped the regions with the endpoint.
            if !keep_regions {
                for (_, r) in std::mem::take(&mut ep.regions) {
                    end_grants(r.pages, "region");
                }
            }
        }
        match self.set_state(XenbusState::Closed) {
            Ok(()) => {}
            Err(Error::Platform(HvError::NotFound(_))) => {
                // The device was removed; the toolstack may create it again (a
                // re-attach), which `advance` notices.
                self.state = XenbusState::Closed;
                if !self.detached {
                    self.detached = true;
                    tracing::info!(device = %self.front_dir, "the device was removed; waiting for it to come back");
                }
            }
            Err(e) => return Err(e),
        }
        if was_connected {
            tracing::info!("disconnected from the backend");
            self.events.push_back(FrontendEvent::Disconnected);
        }
        Ok(())
    }

    fn ctrl(&mut self) -> Result<&mut CtrlClient> {
        if self.state != XenbusState::Connected {
            return Err(Error::NotConnected(format!("device is {:?}", self.state)));
        }
        self.ctrl
            .as_mut()
            .ok_or_else(|| Error::NotConnected("no control ring".into()))
    }

    fn call(&mut self, op: CtrlOp) -> Result<CtrlReply> {
        let timeout = self.cfg.ctrl_timeout;
        let kind = op.kind();
        let started = std::time::Instant::now();
        let result = self.ctrl()?.call(op, timeout);
        if started.elapsed() >= timeout / 10 {
            // Slow answers come before a timeout: they say when the backend began to lag.
            tracing::warn!(
                ?kind,
                took_ms = started.elapsed().as_millis() as u64,
                ok = result.is_ok(),
                "the backend answered a control request late"
            );
        }
        match result {
            Ok(rsp) => Ok(rsp.reply),
            Err(e @ Error::Timeout(_)) => {
                tracing::error!(error = %e, "the backend does not answer; disconnecting");
                self.broken = true;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Release pages a request shared, or keep them until the connection is torn down if
    /// the request timed out (the backend may still map them).
    fn dispose(&mut self, q: Quarantined) {
        if self.broken {
            self.quarantine.push(q);
            return;
        }
        match q {
            Quarantined::Endpoint(share) => share.release("endpoint"),
            Quarantined::Pages(pages) => end_grants(pages, "pages"),
        }
    }

    /// After a timeout: drop the connection (the backend releases what it held), then
    /// the frontend reconnects as after any disconnection.
    fn fail_if_broken(&mut self) {
        if self.broken {
            if let Err(e) = self.disconnect(EndpointsAtClose::Kept) {
                tracing::warn!(error = %e, "disconnecting from an unresponsive backend");
            }
        }
    }

    /// Open endpoint `endpoint` (the lowest free index if None) with `geometry` (the
    /// configured one if None) and return what its application needs.
    pub fn open_endpoint(
        &mut self,
        endpoint: Option<u8>,
        geometry: Option<EndpointPages>,
    ) -> Result<EndpointHandoff> {
        let geometry = geometry.unwrap_or(self.cfg.endpoint_pages);
        check_geometry(&geometry)?;
        let max = self
            .info
            .as_ref()
            .ok_or_else(|| Error::NotConnected("device not connected".into()))?
            .max_endpoints
            .min(256);
        let index = match endpoint {
            Some(i) if u32::from(i) >= max => {
                return Err(Error::Invalid(format!(
                    "endpoint {i} (the backend allows {max})"
                )))
            }
            Some(i) if self.endpoints.contains_key(&i) => {
                return Err(Error::Refused {
                    op: xmx_wire::msg::CtrlKind::EndpointOpen,
                    status: CtrlStatus::EndpointBusy,
                })
            }
            Some(i) => i,
            None => (0..max)
                .map(|i| i as u8)
                .find(|i| !self.endpoints.contains_key(i))
                .ok_or(Error::Exhausted("endpoint".into()))?,
        };
        let share = self.share_endpoint(index, geometry, 0, 0)?;
        self.endpoints.insert(index, share);
        match self.export_endpoint(index) {
            Ok(h) => Ok(h),
            Err(e) => {
                let _ = self.close_endpoint(index);
                Err(e)
            }
        }
    }

    /// Grant an endpoint's pages and port and have the backend open it.
    fn share_endpoint(
        &mut self,
        index: u8,
        geometry: EndpointPages,
        generation: u32,
        resume_session: u32,
    ) -> Result<EndpointShare> {
        let backend = self.backend_id;
        let pages = Arc::new(self.gnttab.grant_pages(backend, geometry.total(), true)?);
        // Both ring headers are initialised here, before the backend or the application
        // takes its half: the backend attaches to the event ring as it finds it.
        for range in [geometry.send_ring_refs(), geometry.event_ring_refs()] {
            let mem = granted_mem(&pages, range.start * PAGE_SIZE, range.len() * PAGE_SIZE)?;
            init_shared(&mem, 0)?;
        }
        let port = OwnedPort::alloc_unbound(self.platform.event_channels()?, backend)?;
        let mut info = self.gnttab.grant_pages(backend, 1, false)?;
        let mut page = vec![0u8; PAGE_SIZE];
        pack_info_page(pages.refs(), &mut page)?;
        write_pages(&mut info, &page);
        let op = CtrlOp::EndpointOpen(EndpointOpen {
            endpoint: index,
            event_channel: port.port(),
            info_ref: info.refs()[0],
            pages: geometry,
            resume_session,
        });
        let result = self.call(op);
        // The backend copied the info page out and unmapped it before answering.
        self.dispose(Quarantined::Pages(info));
        let share = EndpointShare {
            geometry,
            pages,
            port,
            session_id: 0,
            generation,
            open_in_backend: false,
            regions: BTreeMap::new(),
        };
        match result {
            Ok(CtrlReply::EndpointOpen { session_id, .. }) => {
                tracing::info!(
                    endpoint = index,
                    session_id,
                    pages = geometry.total(),
                    "endpoint open"
                );
                Ok(EndpointShare {
                    session_id,
                    open_in_backend: true,
                    ..share
                })
            }
            Ok(other) => {
                share.release("endpoint");
                Err(Error::Protocol(format!("open answered with {other:?}")))
            }
            Err(e) => {
                self.dispose(Quarantined::Endpoint(share));
                self.fail_if_broken();
                Err(e)
            }
        }
    }

    fn export_endpoint(&self, index: u8) -> Result<EndpointHandoff> {
        let share = self
            .endpoints
            .get(&index)
            .ok_or_else(|| Error::Invalid(format!("endpoint {index} is not open")))?;
        Ok(EndpointHandoff {
            endpoint: index,
            session_id: share.session_id,
            geometry: share.geometry,
            generation: share.generation,
            regions_kept: false,
            pages: share.pages.export()?,
            port: share.port.handle().export_port(share.port.port())?,
        })
    }

    /// Close endpoint `endpoint`: the backend's side first, then its regions' and its
    /// own grants and its port. Only call this once its application unmapped the pages
    /// (or is gone).
    pub fn close_endpoint(&mut self, endpoint: u8) -> Result<()> {
        let share = self
            .endpoints
            .remove(&endpoint)
            .ok_or_else(|| Error::Invalid(format!("endpoint {endpoint} is not open")))?;
        let mut result = Ok(());
        if share.open_in_backend && self.is_connected() {
            match self.call(CtrlOp::EndpointClose { endpoint }) {
                Ok(_) => {}
                Err(Error::Refused {
                    status: CtrlStatus::EndpointNotOpen,
                    ..
                }) => {}
                Err(e) => result = Err(e),
            }
        }
        self.dispose(Quarantined::Endpoint(share));
        self.fail_if_broken();
        tracing::info!(endpoint, "endpoint closed");
        result
    }

    /// Register a region of `length` bytes on `endpoint`: grant its pages, list them in
    /// info pages, one REGION_REGISTER. The window starts zeroed.
    pub fn register_region(&mut self, endpoint: u8, length: u32) -> Result<RegionHandoff> {
        let nr_pages = (length as usize).div_ceil(PAGE_SIZE);
        if length == 0 || nr_pages > REGION_PAGES_MAX {
            return Err(Error::Invalid(format!(
                "region of {length} bytes (1 to {} pages)",
                REGION_PAGES_MAX
            )));
        }
        let max = self
            .info
            .as_ref()
            .ok_or_else(|| Error::NotConnected("device not connected".into()))?
            .max_regions
            .min(256);
        let share = self
            .endpoints
            .get(&endpoint)
            .filter(|e| e.open_in_backend)
            .ok_or_else(|| Error::Invalid(format!("endpoint {endpoint} is not open")))?;
        let region_id = (0..max)
            .map(|i| i as u8)
            .find(|i| !share.regions.contains_key(i))
            .ok_or(Error::Exhausted("region id".into()))?;
        let backend = self.backend_id;
        let pages = self.gnttab.grant_pages(backend, nr_pages, true)?;
        let packed = pack_info_pages(pages.refs());
        let mut info = match self.gnttab.grant_pages(backend, packed.len(), false) {
            Ok(i) => i,
            Err(e) => {
                end_grants(pages, "region");
                return Err(e.into());
            }
        };
        let flat: Vec<u8> = packed.iter().flat_map(|p| p.iter().copied()).collect();
        write_pages(&mut info, &flat);
        let op = CtrlOp::RegionRegister(RegionRegister {
            endpoint,
            region_id,
            first_page_offset: 0,
            length,
            info_refs: info.refs().to_vec(),
        });
        let result = self.call(op);
        self.dispose(Quarantined::Pages(info));
        if let Err(e) = result {
            self.dispose(Quarantined::Pages(pages));
            self.fail_if_broken();
            return Err(e);
        }
        let exported = match pages.export() {
            Ok(x) => x,
            Err(e) => {
                let _ = self.call(CtrlOp::RegionDeregister {
                    endpoint,
                    region_id,
                });
                end_grants(pages, "region");
                return Err(e.into());
            }
        };
        tracing::debug!(endpoint, region_id, pages = nr_pages, "region registered");
        if let Some(share) = self.endpoints.get_mut(&endpoint) {
            share.regions.insert(
                region_id,
                RegionShare {
                    pages,
                    length,
                    backend_id: backend,
                },
            );
        }
        Ok(RegionHandoff {
            endpoint,
            region_id,
            length,
            pages: exported,
        })
    }

    /// Deregister a region and end its grants. Only call this once the application
    /// unmapped its window (or is gone).
    pub fn deregister_region(&mut self, endpoint: u8, region_id: u8) -> Result<()> {
        let region = self
            .endpoints
            .get_mut(&endpoint)
            .and_then(|e| e.regions.remove(&region_id))
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "region {region_id} of endpoint {endpoint} is not registered"
                ))
            })?;
        let mut result = Ok(());
        if self.is_connected() {
            match self.call(CtrlOp::RegionDeregister {
                endpoint,
                region_id,
            }) {
                Ok(_) => {}
                Err(Error::Refused {
                    status: CtrlStatus::BadRegion | CtrlStatus::EndpointNotOpen,
                    ..
                }) => {}
                Err(e) => result = Err(e),
            }
        }
        self.dispose(Quarantined::Pages(region.pages));
        self.fail_if_broken();
        result
    }

    /// After a reconnection: open every endpoint again over new grants.
    fn reopen_endpoints(&mut self) {
        let lost: Vec<u8> = self
            .endpoints
            .iter()
            .filter(|(_, e)| !e.open_in_backend)
            .map(|(i, _)| *i)
            .collect();
        for index in lost {
            let Some(mut old) = self.endpoints.remove(&index) else {
                continue;
            };
            let generation = old.generation.wrapping_add(1);
            let regions = std::mem::take(&mut old.regions);
            match self.share_endpoint(index, old.geometry, generation, old.session_id) {
                Ok(mut new) => {
                    let kept = self.register_again(index, regions, &mut new);
                    self.endpoints.insert(index, new);
                    match self.export_endpoint(index) {
                        Ok(mut h) => {
                            h.regions_kept = kept;
                            self.reopened.push(h);
                            self.events
                                .push_back(FrontendEvent::EndpointReopened { endpoint: index });
                        }
                        Err(e) => self.events.push_back(FrontendEvent::EndpointLost {
                            endpoint: index,
                            reason: e.to_string(),
                        }),
                    }
                }
                Err(e) => {
                    for (_, r) in regions {
                        end_grants(r.pages, "region");
                    }
                    tracing::warn!(endpoint = index, error = %e, "re-opening an endpoint");
                    self.events.push_back(FrontendEvent::EndpointLost {
                        endpoint: index,
                        reason: e.to_string(),
                    });
                }
            }
            // The application still maps the old pages until it remaps.
            self.retired.push((index, old.generation, old));
        }
    }

    /// Register `regions` of re-opened endpoint `index` again, under their ids and over
    /// the same grants, into `share`. True if every one is back; otherwise none is (the
    /// application then drops its windows and registers new ones).
    fn register_again(
        &mut self,
        index: u8,
        regions: BTreeMap<u8, RegionShare>,
        share: &mut EndpointShare,
    ) -> bool {
        let mut failed = false;
        for (region_id, r) in regions {
            if failed || r.backend_id != self.backend_id {
                failed = true;
                end_grants(r.pages, "region");
                continue;
            }
            match self.register_pages(index, region_id, r.length, &r.pages) {
                Ok(()) => {
                    share.regions.insert(region_id, r);
                }
                Err(e) => {
                    tracing::warn!(endpoint = index, region_id, error = %e, "registering a region again");
                    failed = true;
                    self.dispose(Quarantined::Pages(r.pages));
                }
            }
        }
        if failed {
            for (region_id, r) in std::mem::take(&mut share.regions) {
                let _ = self.call(CtrlOp::RegionDeregister {
                    endpoint: index,
                    region_id,
                });
                self.dispose(Quarantined::Pages(r.pages));
            }
            return false;
        }
        if !share.regions.is_empty() {
            tracing::info!(
                endpoint = index,
                regions = share.regions.len(),
                "regions registered again"
            );
        }
        true
    }

    /// One REGION_REGISTER of `pages` (granted already) as `region_id` of `endpoint`.
    fn register_pages(
        &mut self,
        endpoint: u8,
        region_id: u8,
        length: u32,
        pages: &GrantedPages,
    ) -> Result<()> {
        let packed = pack_info_pages(pages.refs());
        let mut info = self
            .gnttab
            .grant_pages(self.backend_id, packed.len(), false)?;
        let flat: Vec<u8> = packed.iter().flat_map(|p| p.iter().copied()).collect();
        write_pages(&mut info, &flat);
        let result = self.call(CtrlOp::RegionRegister(RegionRegister {
            endpoint,
            region_id,
            first_page_offset: 0,
            length,
            info_refs: info.refs().to_vec(),
        }));
        self.dispose(Quarantined::Pages(info));
        result.map(drop)
    }

    /// Release the shares of `endpoint` older than `generation` (its application
    /// remapped, or is gone).
    pub fn release_retired(&mut self, endpoint: u8, generation: u32) {
        let mut keep = Vec::new();
        for (i, g, share) in self.retired.drain(..) {
            if i == endpoint && g < generation {
                share.release("retired endpoint");
            } else {
                keep.push((i, g, share));
            }
        }
        self.retired = keep;
    }

    /// Release every retired share of `endpoint`.
    pub fn release_all_retired(&mut self, endpoint: u8) {
        self.release_retired(endpoint, u32::MAX);
    }

    /// Shares kept for applications that have not remapped yet.
    pub fn retired_count(&self) -> usize {
        self.retired.len()
    }

    /// Read `control/shutdown`; on `suspend`, suspend and then acknowledge it (clear the
    /// node, as Linux guests do). The acknowledgement comes once the device is down: a
    /// toolstack moving the guest waits for it before it freezes the guest and copies its
    /// last pages (see `xmx_hv::sim::migrate`).
    fn check_shutdown_request(&mut self) -> Result<()> {
        let path = format!("/local/domain/{}/control/shutdown", self.domid);
        let value = match self.xs.read(XBT_NULL, &path) {
            Ok(v) => parse_text(v, "control/shutdown")?,
            Err(HvError::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        if value != "suspend" || self.mode != Mode::Active {
            return Ok(());
        }
        tracing::info!("suspend requested by the toolstack");
        let result = self.suspend();
        if let Err(e) = self.xs.write(XBT_NULL, &path, b"") {
            tracing::warn!(error = %e, "acknowledging the suspend request");
        }
        result
    }

    /// Say that this guest handles suspend requests (`control/feature-suspend`, as
    /// Linux guests do), so that a toolstack waits for their acknowledgement.
    fn announce_suspend_feature(&self) {
        let path = format!("/local/domain/{}/control/feature-suspend", self.domid);
        if let Err(e) = self.xs.write(XBT_NULL, &path, b"1") {
            tracing::warn!(error = %e, "announcing the suspend feature");
        }
    }

    /// Disconnect for a suspend: say Closing, wait for the backend to let go (Closed),
    /// release the ring, say Closed. Endpoints keep their pages and their sessions;
    /// [`Frontend::resume`] opens them again.
    pub fn suspend(&mut self) -> Result<()> {
        if self.mode != Mode::Active {
            return Ok(());
        }
        self.mode = Mode::Suspended;
        let result = self.disconnect(EndpointsAtClose::Kept);
        self.events.push_back(FrontendEvent::Suspended);
        result
    }

    /// Whether the platform serves this domain again after a suspend: a probe that
    /// allocates and closes a port. Nothing signals a resume on the simulator (on Xen the
    /// guest is frozen and simply runs again), so a suspended owner probes now and then.
    pub fn probe_running(&self) -> bool {
        let Ok(evtchn) = self.platform.event_channels() else {
            return false;
        };
        match evtchn.alloc_unbound(self.backend_id) {
            Ok(port) => {
                let _ = evtchn.close(port);
                true
            }
            Err(_) => false,
        }
    }

    /// After a suspend, when the platform no longer serves the domain: whether the
    /// domain was migrated to another host. If so, this frontend now lives there: the
    /// platform followed the domain (its grant table with the endpoints' pages), the
    /// xenstore connection and its watches are the new host's, and the device is taken
    /// up again once that host's toolstack has created it (it keeps its index; the
    /// domid is the new one). [`Frontend::resume`] then connects to the new backend and
    /// re-opens the endpoints, as after any resume. False if it did not move.
    pub fn follow_move(&mut self) -> Result<bool> {
        if !self.platform.follow_move()? {
            return Ok(false);
        }
        let from = self.domid;
        let domid = self.platform.domid();
        let xs = self.platform.xenstore()?;
        let front_dir = xenbus::frontend_dir(domid, self.cfg.devid);
        xs.watch(
            &format!("/local/domain/{domid}/control/shutdown"),
            TOKEN_SHUTDOWN,
        )?;
        xs.watch(
            &xenbus::key_path(&front_dir, keys::BACKEND_ID),
            TOKEN_DEVICE,
        )?;
        // The old connection died with the source domain, and its watches with it.
        self.xs = xs;
        self.domid = domid;
        self.front_dir = front_dir;
        self.announce_suspend_feature();
        // What the old connection held is gone with the old host's backend; the
        // endpoints are re-opened over new grants once connected to the new one.
        if let Some(ctrl) = self.ctrl.take() {
            self.retire_ctrl(ctrl);
        }
        self.info = None;
        self.state = XenbusState::Closed;
        self.detached = true;
        // The backend is named anew by the new host's toolstack; an empty path makes
        // `reattach` watch it on the new connection whatever it is.
        self.back_dir = String::new();
        for ep in self.endpoints.values_mut() {
            ep.open_in_backend = false;
        }
        tracing::info!(from, to = domid, device = %self.front_dir, "the domain moved to another host");
        Ok(true)
    }

    /// Back from a suspend: start the handshake again; endpoints are re-opened once
    /// connected (see [`Frontend::take_reopened`]).
    pub fn resume(&mut self) -> Result<()> {
        if self.mode != Mode::Suspended {
            return Ok(());
        }
        self.mode = Mode::Active;
        self.events.push_back(FrontendEvent::Resumed);
        tracing::info!("resuming");
        if self.state != XenbusState::Initialising && !self.detached {
            self.set_state(XenbusState::Initialising)?;
        }
        self.advance()
    }

    /// Close the device for good (the daemon stops): endpoints closed in the backend,
    /// Closing, wait for the backend, Closed. Endpoint grants are ended here too; their
    /// applications must be gone or have unmapped.
    pub fn shutdown(&mut self) -> Result<()> {
        self.mode = Mode::Stopped;
        let result = self.disconnect(EndpointsAtClose::Closed);
        let indices: Vec<u8> = self.endpoints.keys().copied().collect();
        for i in indices {
            let _ = self.close_endpoint(i);
        }
        for (_, _, share) in self.retired.drain(..) {
            share.release("retired endpoint");
        }
        result
    }

    /// Our side of a close: ENDPOINT_CLOSE for each endpoint if they are `Closed` for
    /// good, Closing, wait for the backend to be Closed (it has released everything then),
    /// teardown.
    fn disconnect(&mut self, endpoints: EndpointsAtClose) -> Result<()> {
        let was_connected = self.is_connected();
        if was_connected && !self.broken && endpoints == EndpointsAtClose::Closed {
            let open: Vec<u8> = self
                .endpoints
                .iter()
                .filter(|(_, e)| e.open_in_backend)
                .map(|(i, _)| *i)
                .collect();
            for index in open {
                if self.broken {
                    break;
                }
                match self.call(CtrlOp::EndpointClose { endpoint: index }) {
                    Ok(_) => {}
                    Err(e) => tracing::warn!(endpoint = index, error = %e, "closing an endpoint"),
                }
                if let Some(e) = self.endpoints.get_mut(&index) {
                    e.open_in_backend = false;
                }
            }
        }
        if matches!(
            self.state,
            XenbusState::Initialised | XenbusState::Connected
        ) {
            self.set_state(XenbusState::Closing)?;
            let deadline = Instant::now() + self.cfg.close_timeout;
            loop {
                // The backend writes Closing before it releases and Closed after.
                match self.backend_state() {
                    None | Some(XenbusState::Closed) => break,
                    Some(XenbusState::InitWait) if self.ctrl.is_none() => break,
                    _ => {}
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    tracing::warn!("the backend did not close in time");
                    break;
                }
                // Only state changes matter here; a shutdown request met meanwhile is
                // the one being served.
                self.xs.next_watch_event(Some(left))?;
            }
        }
        // Endpoints kept keep their regions granted: they are registered again under
        // their ids when the endpoints are re-opened (over the same grants, which a move
        // of a simulated domain keeps too), so windows lent to peers stay valid.
        self.release_connection(was_connected, endpoints == EndpointsAtClose::Kept)
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

//! The xenstore side of the service: finding devices, following their frontends through the
//! xenbus states ([`crate::xenbus::step`]), connecting and releasing guests.

use std::collections::BTreeMap;
use std::sync::Arc;

use xmx_hv::{Error, WatchEvent, XBT_NULL};
use xmx_wire::msg::{CtrlBack, PROTOCOL_VERSION};
use xmx_wire::ring::SharedMem;
use xmx_wire::xenbus::{self, keys, XenbusState};

use super::guest::{Connection, DeviceKey};
use super::memory::GrantMemory;
use super::quota::GuestUsage;
use super::{control, Backend, BackendError, WATCH_BACKEND, WATCH_FRONTEND_PREFIX, WATCH_RELEASE};
use crate::xenbus::toolstack::{self, in_transaction, DeviceSpec};
use crate::xenbus::{step, BackendStep};
use xmx_engine::{ClusterId, GuestConfig};

/// One device the backend found under its xenstore directory.
pub(crate) struct Device {
    pub backend_dir: String,
    pub frontend_dir: String,
    /// What dom0 decided for the guest; None while the backend directory holds values the
    /// backend refuses (the device then stays Closed).
    pub spec: Option<DeviceSpec>,
    /// The state we last wrote.
    pub state: XenbusState,
    pub conn: Option<Connection>,
    pub last_error: Option<String>,
    pub ctrl_requests: u64,
    pub quota_refusals: u64,
    /// dom0 holds the device closed (`hold` in its backend directory).
    pub held: bool,
}

fn frontend_token(key: DeviceKey) -> String {
    format!("{WATCH_FRONTEND_PREFIX}{}:{}", key.domu, key.devid)
}

fn parse_frontend_token(token: &str) -> Option<DeviceKey> {
    let rest = token.strip_prefix(WATCH_FRONTEND_PREFIX)?;
    let (domu, devid) = rest.split_once(':')?;
    Some(DeviceKey {
        domu: domu.parse().ok()?,
        devid: devid.parse().ok()?,
    })
}

fn utf8(raw: Vec<u8>, what: &str) -> Result<String, String> {
    String::from_utf8(raw)
        .map(|s| s.trim_end_matches('\0').to_string())
        .map_err(|_| format!("{what} is not UTF-8"))
}

impl Backend {
    /// Handle every queued watch event; an error means xenstore is gone.
    pub(super) fn serve_watches(&mut self) -> Result<bool, BackendError> {
        let mut any = false;
        while let Some(event) = self.xs.next_watch_event(Some(std::time::Duration::ZERO))? {
            any = true;
            self.handle_watch(event);
        }
        Ok(any)
    }

    fn handle_watch(&mut self, event: WatchEvent) {
        tracing::trace!(path = %event.path, token = %event.token, "watch");
        if event.token == WATCH_BACKEND {
            match xenbus::parse_backend_path(&event.path) {
                Some(node) if node.backend_dom == self.domid => self.refresh_device(DeviceKey {
                    domu: node.domu,
                    devid: node.devid,
                }),
                _ => self.rescan(),
            }
        } else if event.token == WATCH_RELEASE {
            self.domains_released();
        } else if let Some(key) = parse_frontend_token(&event.token) {
            self.frontend_changed(key);
        }
    }

    /// Compare the devices under our backend directory with the ones we know.
    fn rescan(&mut self) {
        let root = xenbus::backend_root(self.domid);
        let mut present = Vec::new();
        let domus = match self.xs.directory(XBT_NULL, &root) {
            Ok(d) => d,
            Err(Error::NotFound(_)) => Vec::new(),
            Err(e) => {
                tracing::warn!(error = %e, "listing {root}");
                return;
            }
        };
        for domu in domus {
            let Ok(domu_id) = domu.parse::<u16>() else {
                continue;
            };
            let devids = match self.xs.directory(XBT_NULL, &format!("{root}/{domu}")) {
                Ok(d) => d,
                Err(_) => continue,
            };
            for devid in devids {
                if let Ok(devid) = devid.parse::<u32>() {
                    present.push(DeviceKey {
                        domu: domu_id,
                        devid,
                    });
                }
            }
        }
        let gone: Vec<DeviceKey> = self
            .devices
            .keys()
            .filter(|k| !present.contains(k))
            .copied()
            .collect();
        for key in gone {
            self.remove_device(key);
        }
        for key in present {
            self.refresh_device(key);
        }
    }

    /// A node of one device's backend directory changed: create, re-read or forget it.
    fn refresh_device(&mut self, key: DeviceKey) {
        let bdir = xenbus::backend_dir(self.domid, key.domu, key.devid);
        let present = match self
            .xs
            .read(XBT_NULL, &xenbus::key_path(&bdir, keys::FRONTEND_ID))
        {
            Ok(_) => Some(true),
            Err(Error::NotFound(_)) => match self.xs.directory(XBT_NULL, &bdir) {
                Err(Error::NotFound(_)) => Some(false),
                // The toolstack is still writing it.
                _ => None,
            },
            Err(e) => {
                tracing::warn!(error = %e, "reading {bdir}");
                None
            }
        };
        match (present, self.devices.contains_key(&key)) {
            (Some(false), true) => self.remove_device(key),
            (Some(true), false) => self.create_device(key),
            (Some(true), true) if self.written_again(key, &bdir) => {
                // The toolstack wrote the device anew under a key we still serve: a new
                // domain took a destroyed one's id before we saw the destroy (both came
                // in one batch of events, so `@releaseDomain` found the id alive).
                tracing::info!(
                    domu = key.domu,
                    devid = key.devid,
                    "device written again under the same id: serving it as a new one"
                );
                self.remove_device(key);
                self.create_device(key);
            }
            (Some(true), true) => {
                self.apply_qos_weight(key);
                self.apply_hold(key, &bdir);
                let broken = self.devices.get(&key).is_some_and(|d| d.spec.is_none());
                // The toolstack may have fixed the values. Our own writes to a refused
                // device land here too: only values that now read well start it again.
                if broken && self.read_spec(key, &bdir).is_ok() {
                    self.remove_device(key);
                    self.create_device(key);
                }
            }
            _ => {}
        }
    }

    /// Whether the device's backend state reads Initialising although we moved it on:
    /// only the toolstack writes Initialising, when it creates a device.
    fn written_again(&self, key: DeviceKey, bdir: &str) -> bool {
        let Some(ours) = self.devices.get(&key).map(|d| d.state) else {
            return false;
        };
        if matches!(ours, XenbusState::Unknown | XenbusState::Initialising) {
            return false;
        }
        match self.xs.read(XBT_NULL, &xenbus::key_path(bdir, keys::STATE)) {
            Ok(raw) => {
                let text = String::from_utf8_lossy(&raw);
                text.trim_end_matches('\0').trim() == XenbusState::Initialising.to_string()
            }
            Err(_) => false,
        }
    }

    /// Follow dom0's `hold`: close the device when it appears (the frontend keeps its
    /// endpoints and waits), take the frontend up again when it goes.
    fn apply_hold(&mut self, key: DeviceKey, bdir: &str) {
        let held = match self.xs.read(XBT_NULL, &xenbus::key_path(bdir, keys::HOLD)) {
            Ok(raw) => String::from_utf8_lossy(&raw).trim_end_matches('\0').trim() == "1",
            Err(_) => false,
        };
        let Some(device) = self.devices.get_mut(&key) else {
            return;
        };
        if device.held == held {
            return;
        }
        device.held = held;
        tracing::info!(
            domu = key.domu,
            devid = key.devid,
            held,
            "dom0 holds the device closed"
        );
        if held {
            self.close_device(key, None);
        } else {
            self.frontend_changed(key);
        }
    }

    /// Give a connected guest the QoS weight dom0 wrote in its backend directory; a value
    /// that does not read well leaves the weight it has.
    fn apply_qos_weight(&mut self, key: DeviceKey) {
        let Some(guest) = self
            .devices
            .get(&key)
            .and_then(|d| d.conn.as_ref())
            .map(|c| c.guest)
        else {
            return;
        };
        let bdir = xenbus::backend_dir(self.domid, key.domu, key.devid);
        match toolstack::read_qos_weight(self.xs.as_ref(), &bdir) {
            Ok(weight) => {
                let before = self.engine.guest(guest).map(|n| n.weight());
                if self.engine.set_guest_weight(guest, weight).is_ok() && before != Some(weight) {
                    tracing::info!(domu = key.domu, devid = key.devid, weight, "QoS weight set");
                }
            }
            Err(e) => {
                tracing::warn!(domu = key.domu, devid = key.devid, error = %e, "QoS weight refused")
            }
        }
    }

    fn read_spec(&self, key: DeviceKey, bdir: &str) -> Result<(String, DeviceSpec), String> {
        let read = |k: &str| {
            self.xs
                .read(XBT_NULL, &xenbus::key_path(bdir, k))
                .map_err(|e| format!("{k}: {e}"))
                .and_then(|raw| utf8(raw, k))
        };
        let frontend_id = xenbus::parse_u32(&read(keys::FRONTEND_ID)?)
            .map_err(|e| format!("frontend-id: {e}"))?;
        if frontend_id != u32::from(key.domu) {
            return Err(format!(
                "frontend-id {frontend_id} is not domain {}",
                key.domu
            ));
        }
        let frontend = read(keys::FRONTEND)?;
        if !frontend.starts_with(&format!("/local/domain/{}/", key.domu)) {
            return Err(format!(
                "frontend {frontend:?} is outside domain {}",
                key.domu
            ));
        }
        let default_name = format!("{}-{}:{}", self.cfg.host_name, key.domu, key.devid);
        let spec = DeviceSpec::read(self.xs.as_ref(), bdir, key.domu, key.devid, &default_name)
            .map_err(|e| e.to_string())?;
        Ok((frontend, spec))
    }

    fn create_device(&mut self, key: DeviceKey) {
        let bdir = xenbus::backend_dir(self.domid, key.domu, key.devid);
        let (frontend_dir, spec, error) = match self.read_spec(key, &bdir) {
            Ok((f, s)) => (f, Some(s), None),
            Err(e) => (xenbus::frontend_dir(key.domu, key.devid), None, Some(e)),
        };
        self.devices.insert(
            key,
            Device {
                backend_dir: bdir,
                frontend_dir: frontend_dir.clone(),
                spec,
                state: XenbusState::Unknown,
                conn: None,
                last_error: None,
                ctrl_requests: 0,
                quota_refusals: 0,
                held: false,
            },
        );
        if let Some(e) = error {
            tracing::warn!(domu = key.domu, devid = key.devid, error = %e, "device refused");
            self.close_device(key, Some(e));
            return;
        }
        tracing::info!(domu = key.domu, devid = key.devid, "device found");
        self.publish_init_wait(key);
        // Fires once at once: the frontend's current state is handled then.
        if let Err(e) = self.xs.watch(&frontend_dir, &frontend_token(key)) {
            tracing::warn!(error = %e, "watching {frontend_dir}");
        }
    }

    fn remove_device(&mut self, key: DeviceKey) {
        let Some(mut device) = self.devices.remove(&key) else {
            return;
        };
        if let Some(conn) = device.conn.take() {
            self.release(conn);
        }
        let _ = self.xs.unwatch(&device.frontend_dir, &frontend_token(key));
        tracing::info!(domu = key.domu, devid = key.devid, "device removed");
    }

    /// Write keys of a device's backend directory in one transaction, only if the directory
    /// still exists (a write must not re-create what the toolstack removed).
    fn write_backend(&self, key: DeviceKey, pairs: &[(&str, String)]) -> bool {
        let Some(device) = self.devices.get(&key) else {
            return false;
        };
        let dir = &device.backend_dir;
        let xs = self.xs.as_ref();
        let res = in_transaction(xs, |tx| {
            match xs.read(tx, &xenbus::key_path(dir, keys::FRONTEND_ID)) {
                Ok(_) => {}
                Err(Error::NotFound(_)) => return Ok(false),
                Err(e) => return Err(e),
            }
            for (k, v) in pairs {
                xs.write(tx, &xenbus::key_path(dir, k), v.as_bytes())?;
            }
            Ok(true)
        });
        res.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "writing {dir}");
            false
        })
    }

    fn set_state(&mut self, key: DeviceKey, state: XenbusState) {
        self.write_backend(key, &[(keys::STATE, state.to_string())]);
        if let Some(d) = self.devices.get_mut(&key) {
            tracing::debug!(
                domu = key.domu,
                devid = key.devid,
                from = d.state.name(),
                to = state.name(),
                "backend state"
            );
            d.state = state;
        }
    }

    fn publish_init_wait(&mut self, key: DeviceKey) {
        let q = &self.cfg.quotas;
        let features = [
            (keys::MAX_ENDPOINTS, q.max_endpoints.to_string()),
            (keys::MAX_REGIONS, q.max_regions_per_endpoint.to_string()),
            (keys::FEATURE_RCACHE, "1".to_string()),
            (keys::FEATURE_LOCAL_DELIVERY, "1".to_string()),
            (keys::PROTOCOL_VERSION, PROTOCOL_VERSION.to_string()),
            (keys::STATE, XenbusState::InitWait.to_string()),
        ];
        self.write_backend(key, &features);
        if let Some(d) = self.devices.get_mut(&key) {
            d.state = XenbusState::InitWait;
        }
    }

    fn frontend_changed(&mut self, key: DeviceKey) {
        let Some(device) = self.devices.get(&key) else {
            return;
        };
        if device.spec.is_none() {
            return;
        }
        if device.held {
            // Closed it stays, whatever the frontend asks, until dom0 lets go.
            return;
        }
        let path = xenbus::key_path(&device.frontend_dir, keys::STATE);
        let frontend = match self.xs.read(XBT_NULL, &path) {
            Ok(raw) => Some(
                String::from_utf8_lossy(&raw)
                    .parse::<XenbusState>()
                    .unwrap_or(XenbusState::Unknown),
            ),
            Err(Error::NotFound(_)) => None,
            Err(e) => {
                tracing::warn!(error = %e, "reading {path}");
                return;
            }
        };
        match step(device.state, frontend) {
            BackendStep::Stay => {}
            BackendStep::InitWait => self.publish_init_wait(key),
            BackendStep::Connect => match self.connect(key) {
                Ok(conn) => {
                    if let Some(d) = self.devices.get_mut(&key) {
                        d.conn = Some(conn);
                        d.last_error = None;
                    }
                    self.apply_qos_weight(key);
                    self.set_state(key, XenbusState::Connected);
                    tracing::info!(domu = key.domu, devid = key.devid, "guest connected");
                }
                Err(reason) => {
                    tracing::warn!(domu = key.domu, devid = key.devid, %reason, "cannot connect the guest");
                    self.close_device(key, Some(reason));
                }
            },
            BackendStep::Close => self.close_device(key, None),
            BackendStep::Restart => {
                // The sessions stay recorded: the frontend re-opens its endpoints asking
                // to keep them (after a resume, or after it gave up on this backend).
                if let Some(conn) = self.devices.get_mut(&key).and_then(|d| d.conn.take()) {
                    self.release(conn);
                }
                self.publish_init_wait(key);
            }
        }
    }

    /// Map the control ring, bind its channel and introduce the guest to the engine.
    fn connect(&mut self, key: DeviceKey) -> Result<Connection, String> {
        let device = self.devices.get(&key).ok_or("no such device")?;
        let fdir = device.frontend_dir.clone();
        let bdir = device.backend_dir.clone();
        // Read again, as netback reads the MAC at connect: the toolstack may have changed
        // the values since the device appeared.
        let (_, spec) = self.read_spec(key, &bdir)?;
        if let Some(d) = self.devices.get_mut(&key) {
            d.spec = Some(spec.clone());
        }
        let read = |k: &str| -> Result<u32, String> {
            let raw = self
                .xs
                .read(XBT_NULL, &xenbus::key_path(&fdir, k))
                .map_err(|e| format!("{k}: {e}"))?;
            xenbus::parse_u32(&utf8(raw, k)?).map_err(|e| format!("{k}: {e}"))
        };
        let mut resumable = self.recorded_sessions(&bdir);
        let never_served = matches!(
            self.xs
                .read(XBT_NULL, &xenbus::key_path(&bdir, keys::ENDPOINT_SESSIONS)),
            Err(Error::NotFound(_))
        );
        if never_served {
            // A guest that arrived by a real-Xen migration: its records stayed on the
            // host it left, so it says which sessions its endpoints had. It can name only
            // its own endpoints' sessions (its MAC is dom0's), so believing it costs
            // nobody else anything; an endpoint it names but never re-opens is dropped
            // for the engine's reopen grace, then NACKed as closed.
            resumable = crate::xenbus::toolstack::read_sessions(self.xs.as_ref(), &fdir);
            let max = self.cfg.quotas.max_endpoints;
            resumable.retain(|&ep, _| usize::from(ep) < max);
            if !resumable.is_empty() {
                tracing::info!(
                    domu = key.domu,
                    endpoints = resumable.len(),
                    "the frontend names sessions to keep"
                );
            }
        }
        let ring_ref = read(keys::RING_REF)?;
        let remote_port = read(keys::EVENT_CHANNEL)?;
        let version = read(keys::PROTOCOL_VERSION)?;
        if version != u32::from(PROTOCOL_VERSION) {
            return Err(format!(
                "frontend speaks protocol {version}, backend {PROTOCOL_VERSION}"
            ));
        }
        let usage = GuestUsage {
            mapped_pages: 1,
            ..GuestUsage::default()
        };
        if !GuestUsage::default().may_map(&self.cfg.quotas, 1) {
            return Err("page quota leaves no room for the control ring".into());
        }
        let mapping = self
            .gnttab
            .map(key.domu, &[ring_ref], true)
            .map_err(|e| format!("mapping ring-ref {ring_ref}: {e}"))?;
        let mapping = Arc::new(mapping);
        let owner: Arc<dyn Send + Sync> = mapping.clone();
        // SAFETY: the mapping is one writable page, kept mapped by `owner` for as long as
        // the ring memory lives; it is touched only through SharedMem.
        let mem = unsafe { SharedMem::from_raw_with_owner(mapping.as_ptr(), mapping.len(), owner) }
            .map_err(|e| format!("control ring: {e}"))?;
        let ctrl = CtrlBack::new(mem).map_err(|e| format!("control ring: {e}"))?;
        let port = self
            .evtchn
            .bind_interdomain(key.domu, remote_port)
            .map_err(|e| format!("binding event channel {remote_port}: {e}"))?;
        let close_port = |b: &Backend| {
            let _ = b.evtchn.close(port);
        };
        let notify = match self.evtchn.notifier(port) {
            Ok(n) => n,
            Err(e) => {
                close_port(self);
                return Err(format!("notifier: {e}"));
            }
        };
        let memory = GrantMemory::new();
        let config = GuestConfig {
            id: key.guest(),
            mac: spec.mac,
            cluster: ClusterId(spec.cluster),
            hostname: spec.hostname.clone(),
            memory: Box::new(memory.clone()),
        };
        if let Err(e) = self.engine.add_guest(config) {
            close_port(self);
            return Err(format!("engine: {e}"));
        }
        // Without a link there is no fabric to tell.
        if self.link.is_some() {
            if let Err(e) = self.engine.announce(key.guest()) {
                tracing::warn!(domu = key.domu, error = %e, "announcing the guest's MAC");
            }
        }
        // The frontend re-opens these in a moment, keeping their sessions: peers'
        // frames meanwhile are dropped, not NACKed, so they are resent and arrive.
        if let Err(e) = self.engine.expect_reopen(
            std::time::Instant::now(),
            key.guest(),
            resumable.keys().copied(),
        ) {
            tracing::warn!(domu = key.domu, error = %e, "marking the endpoints re-opening");
        }
        Ok(Connection {
            guest: key.guest(),
            domu: key.domu,
            ctrl,
            ctrl_port: port,
            ctrl_notify: notify,
            memory,
            endpoints: Default::default(),
            regions: Default::default(),
            kept: Default::default(),
            usage,
            resumable,
            failure: None,
        })
    }

    /// The sessions recorded for a device's endpoints (by a previous run of the backend,
    /// if it died with them open, or before the guest's frontend closed and came back);
    /// unreadable entries are skipped.
    fn recorded_sessions(&self, backend_dir: &str) -> BTreeMap<u8, u32> {
        crate::xenbus::toolstack::read_sessions(self.xs.as_ref(), backend_dir)
    }

    /// The backend threw the guest out: its endpoints' sessions are not to be resumed.
    fn forget_sessions(&self, key: DeviceKey) {
        let Some(device) = self.devices.get(&key) else {
            return;
        };
        let dir = xenbus::key_path(&device.backend_dir, keys::ENDPOINT_SESSIONS);
        match self.xs.rm(XBT_NULL, &dir) {
            Ok(()) | Err(Error::NotFound(_)) => {}
            Err(e) => tracing::warn!(error = %e, "removing {dir}"),
        }
        // Left empty, not absent: an absent record means a device this host never
        // served (a migrated guest's), whose frontend may name its sessions.
        if let Err(e) = self.xs.write(XBT_NULL, &dir, b"") {
            tracing::warn!(error = %e, "writing {dir}");
        }
    }

    /// Release everything a connection holds: endpoints, regions, ports, mappings.
    pub(super) fn release(&mut self, mut conn: Connection) {
        let endpoints: Vec<u8> = conn.endpoints.keys().copied().collect();
        for ep in endpoints {
            control::teardown_endpoint(&mut self.engine, self.evtchn.as_ref(), &mut conn, ep);
        }
        if let Err(e) = self.engine.remove_guest(conn.guest) {
            tracing::warn!(domu = conn.domu, error = %e, "engine had no such guest");
        }
        conn.memory.clear();
        if let Err(e) = self.evtchn.close(conn.ctrl_port) {
            tracing::debug!(port = conn.ctrl_port, error = %e, "closing the control port");
        }
        tracing::info!(domu = conn.domu, "guest released");
        // The control ring is unmapped when `conn` goes.
    }

    /// Release the guest (if connected) and move the device to Closing, then Closed.
    /// `reason` says why the backend closed it, if it did on its own.
    pub(super) fn close_device(&mut self, key: DeviceKey, reason: Option<String>) {
        let Some(device) = self.devices.get_mut(&key) else {
            return;
        };
        let conn = device.conn.take();
        let was = device.state;
        if let Some(r) = &reason {
            device.last_error = Some(r.clone());
        }
        if was != XenbusState::Closed {
            self.set_state(key, XenbusState::Closing);
        }
        if let Some(conn) = conn {
            self.release(conn);
            // A guest the backend threw out starts over with new sessions; one that closed
            // its device itself may come back asking to keep them (a frontend that gave up
            // on an unanswered request, a resumed guest), and peers then still reach its
            // endpoints. Only the very session recorded can be kept, and an endpoint the
            // guest closed has its record removed then.
            if reason.is_some() {
                self.forget_sessions(key);
            }
        }
        if let Some(r) = reason {
            self.write_backend(key, &[("error", r)]);
        }
        if was != XenbusState::Closed {
            self.set_state(key, XenbusState::Closed);
        }
    }

    /// `@releaseDomain` fired: forget the devices of domains that are gone, and their
    /// backend directories (a later domain with the same id must not inherit them).
    fn domains_released(&mut self) {
        let mut domus: Vec<u16> = self.devices.keys().map(|k| k.domu).collect();
        domus.dedup();
        for domu in domus {
            match self.xs.is_domain_introduced(domu) {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(domu, error = %e, "is the domain alive?");
                    continue;
                }
            }
            tracing::info!(domu, "domain gone; releasing its devices");
            let keys: Vec<DeviceKey> = self
                .devices
                .keys()
                .filter(|k| k.domu == domu)
                .copied()
                .collect();
            for key in keys {
                self.remove_device(key);
            }
            let dir = format!("{}/{domu}", xenbus::backend_root(self.domid));
            match self.xs.rm(XBT_NULL, &dir) {
                Ok(()) | Err(Error::NotFound(_)) => {}
                Err(e) => tracing::warn!(error = %e, "removing {dir}"),
            }
        }
    }

    /// On the way out: release the guest and tell its frontend the backend is closing.
    pub(super) fn shutdown_device(&mut self, key: DeviceKey) {
        let Some(device) = self.devices.get_mut(&key) else {
            return;
        };
        let conn = device.conn.take();
        let state = device.state;
        let frontend_dir = device.frontend_dir.clone();
        if let Some(conn) = conn {
            self.release(conn);
        }
        if state != XenbusState::Closed {
            self.set_state(key, XenbusState::Closing);
        }
        let _ = self.xs.unwatch(&frontend_dir, &frontend_token(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frontend_tokens_round_trip() {
        let key = DeviceKey { domu: 7, devid: 3 };
        assert_eq!(parse_frontend_token(&frontend_token(key)), Some(key));
        assert_eq!(parse_frontend_token("xmx-backd:frontend:7"), None);
        assert_eq!(parse_frontend_token("other:7:3"), None);
        assert_eq!(parse_frontend_token("xmx-backd:frontend:x:3"), None);
    }
}

//! The xenbus handshake with the backend and the control connection it sets up: states
//! published and followed, the device detached and attached again, control requests.

use xmx_hv::{DomId, Error as HvError, TxId, XBT_NULL};
use xmx_wire::msg::{CtrlOp, CtrlReply, PROTOCOL_VERSION};
use xmx_wire::mxoe::Mac;
use xmx_wire::xenbus::{self, keys, XenbusState};

use super::{
    parse_text, BackendInfo, EndpointsAtClose, Frontend, FrontendEvent, Mode, Quarantined,
    TOKEN_BACKEND, TX_ATTEMPTS,
};
use crate::ctrl::CtrlClient;
use crate::error::{Error, Result};
use crate::shared::end_grants;

impl Frontend {
    /// Whether the toolstack has removed the device (and not created it again yet).
    pub fn is_detached(&self) -> bool {
        self.detached
    }

    /// Whether the device's frontend directory names a backend.
    pub(super) fn device_present(&self) -> Result<bool> {
        match self.xs.read(XBT_NULL, &self.front_key(keys::BACKEND_ID)) {
            Ok(_) => Ok(true),
            Err(HvError::NotFound(_)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// The device is gone: release what the old connection held and wait for the
    /// toolstack to create the device again.
    pub(super) fn mark_detached(&mut self) -> Result<()> {
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
    pub(super) fn reattach(&mut self) -> Result<()> {
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

    pub(super) fn in_transaction(&self, mut body: impl FnMut(TxId) -> Result<()>) -> Result<()> {
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

    pub(super) fn front_key(&self, key: &str) -> String {
        xenbus::key_path(&self.front_dir, key)
    }

    /// Write our state, unless the device directory is gone (the toolstack removed the
    /// device: writing would create it again).
    pub(super) fn set_state(&mut self, state: XenbusState) -> Result<()> {
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
    pub(super) fn publish(&mut self) -> Result<()> {
        if let Some(old) = self.ctrl.take() {
            self.retire_ctrl(old);
        }
        let evtchn = self.platform.event_channels()?;
        let ctrl = CtrlClient::new(self.gnttab.as_ref(), evtchn, self.backend_id)?;
        // The sessions of the endpoints this frontend will re-open, for a backend that
        // has none recorded: the destination of a real-Xen migration, where the
        // source's records stayed behind (see the backend's `resumable`).
        let sessions: Vec<(String, String)> = self
            .endpoints
            .iter()
            .filter(|(_, e)| e.session_id != 0)
            .map(|(i, e)| {
                (
                    format!("{}/{i}", keys::ENDPOINT_SESSIONS),
                    e.session_id.to_string(),
                )
            })
            .collect();
        let mut entries = vec![
            (keys::RING_REF.to_string(), ctrl.ring_ref().to_string()),
            (keys::EVENT_CHANNEL.to_string(), ctrl.port().to_string()),
            (
                keys::PROTOCOL_VERSION.to_string(),
                PROTOCOL_VERSION.to_string(),
            ),
            (
                keys::FEATURE_RCACHE.to_string(),
                u8::from(self.cfg.rcache).to_string(),
            ),
        ];
        entries.extend(sessions);
        entries.push((
            keys::STATE.to_string(),
            XenbusState::Initialised.to_string(),
        ));
        let dir = self.front_dir.clone();
        let stale_sessions = xenbus::key_path(&dir, keys::ENDPOINT_SESSIONS);
        let written = self.in_transaction(|tx| {
            self.xs.read(tx, &dir)?;
            match self.xs.rm(tx, &stale_sessions) {
                Ok(()) | Err(HvError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
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

    pub(super) fn read_backend_info(&self) -> Result<BackendInfo> {
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
    pub(super) fn connect(&mut self) -> Result<()> {
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

    pub(super) fn retire_ctrl(&mut self, ctrl: CtrlClient) {
        self.past_ctrl = self.past_ctrl.plus(ctrl.stats());
        ctrl.release();
    }

    /// The backend let go (or vanished): release the ring, forget what the backend held,
    /// say Closed.
    /// The regions stay granted: the backend lost them with the connection, and they are
    /// registered again, under the same ids, when the endpoints are re-opened, so that
    /// windows the application lent to peers stay valid across a backend restart.
    pub(super) fn teardown(&mut self) -> Result<()> {
        let was_connected = self.state == XenbusState::Connected;
        self.release_connection(was_connected, true)
    }

    pub(super) fn release_connection(
        &mut self,
        was_connected: bool,
        keep_regions: bool,
    ) -> Result<()> {
        if let Some(ctrl) = self.ctrl.take() {
            self.retire_ctrl(ctrl);
        }
        if self.moves_silently() {
            // The endpoints' ports go now, not when their applications remap: if this
            // is the guest letting go before a migration (dom0's `hold`), no port may be
            // left bound when the kernel suspends (see `xmx_hv::linux`'s migration notes).
            // Re-opening binds new ones.
            for e in self.endpoints.values_mut() {
                e.port.unbind();
            }
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

    pub(super) fn ctrl(&mut self) -> Result<&mut CtrlClient> {
        if self.state != XenbusState::Connected {
            return Err(Error::NotConnected(format!("device is {:?}", self.state)));
        }
        self.ctrl
            .as_mut()
            .ok_or_else(|| Error::NotConnected("no control ring".into()))
    }

    pub(super) fn call(&mut self, op: CtrlOp) -> Result<CtrlReply> {
        let timeout = self.cfg.ctrl_timeout;
        let kind = op.kind();
        let started = std::time::Instant::now();
        self.ctrl()?;
        let state_path = xenbus::key_path(&self.back_dir, keys::STATE);
        let xs = &self.xs;
        // Only a state the backend wrote (or its removal) ends the wait early: any other
        // xenstore error leaves the request to its timeout.
        let mut backend_gone = || match xs.read(XBT_NULL, &state_path) {
            Ok(v) => match String::from_utf8_lossy(&v).trim().parse::<XenbusState>() {
                Ok(XenbusState::Connected) | Err(_) => None,
                Ok(other) => Some(format!("the backend is {other:?}")),
            },
            Err(HvError::NotFound(_)) => Some("the backend's device is gone".to_string()),
            Err(_) => None,
        };
        let result = match self.ctrl.as_mut() {
            Some(ctrl) => ctrl.call_while(op, timeout, &mut backend_gone),
            None => return Err(Error::NotConnected("no control ring".into())),
        };
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
    pub(super) fn dispose(&mut self, q: Quarantined) {
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
    pub(super) fn fail_if_broken(&mut self) {
        if self.broken {
            if let Err(e) = self.disconnect(EndpointsAtClose::Kept) {
                tracing::warn!(error = %e, "disconnecting from an unresponsive backend");
            }
        }
    }
}

//! The device's life beyond the handshake: a toolstack's shutdown or suspend request, a
//! suspend and resume, following a migrated domain, and the orderly shutdown.

use std::time::Instant;

use xmx_hv::{Error as HvError, XBT_NULL};
use xmx_wire::msg::CtrlOp;
use xmx_wire::xenbus::{self, keys, XenbusState};

use super::{
    parse_text, EndpointsAtClose, Frontend, FrontendEvent, Mode, TOKEN_DEVICE, TOKEN_SHUTDOWN,
};
use crate::error::Result;

impl Frontend {
    /// Read `control/shutdown`; on `suspend`, suspend and then acknowledge it (clear the
    /// node, as Linux guests do). The acknowledgement comes once the device is down: a
    /// toolstack moving the guest waits for it before it freezes the guest and copies its
    /// last pages (see `xmx_hv::sim::migrate`).
    ///
    /// Not on real Xen: there the guest's kernel answers the toolstack (it must read
    /// `suspend` before anyone clears it, or it ignores the request and the toolstack
    /// waits in vain) and freezes every process before it suspends; the frontend learns
    /// of it afterwards ([`Frontend::moves_silently`]).
    pub(super) fn check_shutdown_request(&mut self) -> Result<()> {
        if self.moves_silently() {
            return Ok(());
        }
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
    pub(super) fn announce_suspend_feature(&self) {
        if self.moves_silently() {
            // The kernel announced it.
            return;
        }
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
    /// A move the platform reported but this failed to follow (its new xenstore
    /// connection refused, say) is followed at the next call.
    pub fn follow_move(&mut self) -> Result<bool> {
        if !self.move_pending && !self.platform.follow_move()? {
            return Ok(false);
        }
        // The platform reports a move once: remember it until followed.
        self.move_pending = true;
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
        self.move_pending = false;
        // The old connection died with the source domain, and its watches with it.
        self.xs = xs;
        self.domid = domid;
        self.front_dir = front_dir;
        self.announce_suspend_feature();
        if !self.platform.handles_follow_move() {
            // Real Xen: the guest ran on without a word. Nothing it granted or bound
            // before holds now, so the regions cannot be registered again over their
            // pages (the application registers new ones) and the device must be taken
            // up anew, as after a suspend.
            self.grants_lost = true;
            if self.mode == Mode::Active {
                self.mode = Mode::Suspended;
                self.events.push_back(FrontendEvent::Suspended);
            }
        }
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
    pub(super) fn disconnect(&mut self, endpoints: EndpointsAtClose) -> Result<()> {
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

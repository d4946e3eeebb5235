//! xmxd's link to the local `xmx-backd`: it pushes the peer table and asks which devices
//! the backend still serves.
//!
//! The backend keeps its table only in memory, so the link re-pushes after any failure and
//! after noticing the backend restarted (a probe of its socket fails).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use xmx_backend::admin::{AdminClient, BackdRequest, GuestReport, PeerSpec, ReplyError};
use xmx_hv::DomId;

/// The backend's control socket, as a reconnecting client.
pub(crate) struct BackendLink {
    path: Option<PathBuf>,
    client: Option<AdminClient>,
    wanted: Option<Vec<PeerSpec>>,
    synced: Option<Vec<PeerSpec>>,
    next_probe: Instant,
    probe_every: Duration,
    reachable: bool,
}

impl BackendLink {
    /// A link to the socket at `path` (None: no backend; nothing is pushed).
    pub(crate) fn new(path: Option<PathBuf>, probe_every: Duration, now: Instant) -> BackendLink {
        BackendLink {
            path,
            client: None,
            wanted: None,
            synced: None,
            next_probe: now,
            probe_every,
            reachable: true,
        }
    }

    /// The socket, if any.
    pub(crate) fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Whether the backend holds the last table given to [`BackendLink::push`].
    pub(crate) fn synced(&self) -> bool {
        self.path.is_none() || (self.wanted.is_some() && self.wanted == self.synced)
    }

    /// One request, on a fresh connection if the old one broke.
    pub(crate) fn call(&mut self, request: &BackdRequest) -> Result<serde_json::Value, ReplyError> {
        let Some(path) = self.path.clone() else {
            return Err(ReplyError::new("not_found", "no backend socket configured"));
        };
        for attempt in 0..2 {
            if self.client.is_none() {
                match AdminClient::connect(&path) {
                    Ok(c) => self.client = Some(c),
                    Err(e) => {
                        self.note_reachable(false, &e.to_string());
                        return Err(ReplyError::new("io", format!("{}: {e}", path.display())));
                    }
                }
            }
            let Some(client) = self.client.as_mut() else {
                continue;
            };
            match client.call(request) {
                Ok(v) => {
                    self.note_reachable(true, "");
                    return Ok(v);
                }
                Err(e) if matches!(e.kind.as_str(), "io" | "closed") && attempt == 0 => {
                    // The backend restarted: whatever it held is gone.
                    self.client = None;
                    self.synced = None;
                }
                Err(e) => {
                    if matches!(e.kind.as_str(), "io" | "closed") {
                        self.client = None;
                        self.synced = None;
                        self.note_reachable(false, &e.to_string());
                    }
                    return Err(e);
                }
            }
        }
        Err(ReplyError::new("closed", "xmx-backd did not answer"))
    }

    fn note_reachable(&mut self, now_reachable: bool, why: &str) {
        if now_reachable != self.reachable {
            if now_reachable {
                tracing::info!("backend reachable again");
            } else {
                tracing::warn!(error = why, "backend unreachable; the peer table waits");
            }
            self.reachable = now_reachable;
        }
    }

    /// Make `specs` the table the backend should hold, and push it if it does not yet.
    pub(crate) fn push(&mut self, specs: Vec<PeerSpec>) {
        self.wanted = Some(specs);
        self.sync();
    }

    fn sync(&mut self) {
        if self.path.is_none() || self.synced() {
            return;
        }
        let Some(peers) = self.wanted.clone() else {
            return;
        };
        match self.call(&BackdRequest::SetPeers {
            peers: peers.clone(),
        }) {
            Ok(_) => {
                tracing::debug!(peers = peers.len(), "peer table pushed to the backend");
                self.synced = Some(peers);
            }
            Err(e) => tracing::debug!(error = %e, "peer table not pushed"),
        }
    }

    /// Let time pass: probe the backend now and then (a restarted one lost its table) and
    /// retry a push that failed.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if self.path.is_none() || now < self.next_probe {
            return;
        }
        self.next_probe = now + self.probe_every;
        if self.synced() {
            let _ = self.call(&BackdRequest::Guests);
        }
        self.sync();
    }

    /// When [`BackendLink::handle_timeout`] wants to run.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.path.as_ref().map(|_| self.next_probe)
    }

    /// The devices the backend serves now.
    pub(crate) fn guests(&mut self) -> Result<Vec<GuestReport>, ReplyError> {
        let v = self.call(&BackdRequest::Guests)?;
        serde_json::from_value(v).map_err(|e| ReplyError::new("protocol", format!("guests: {e}")))
    }

    /// Wait until the backend no longer serves device 0 of `domu` (it has seen the device
    /// removed), up to `timeout`. The backend publishes no event for this, so its device
    /// list is polled; true if it let go (or there is no backend to ask).
    pub(crate) fn wait_released(&mut self, domu: DomId, timeout: Duration) -> bool {
        if self.path.is_none() {
            return true;
        }
        let deadline = Instant::now() + timeout;
        loop {
            match self.guests() {
                Ok(list) if !list.iter().any(|g| g.domid == domu && g.devid == 0) => return true,
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "cannot ask the backend about its devices");
                    return true;
                }
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

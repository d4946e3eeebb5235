//! The discovery traffic on the fabric: frames heard, announcements sent, timers, and
//! what a failing fabric link does.

use std::time::{Duration, Instant};

use xmx_backend::service::LinkFault;
use xmx_hv::DomId;

use super::Core;
use crate::xmxd::error::Result;
use crate::xmxd::names;

impl Core {
    pub(super) fn handle_frames(&mut self) -> Result<()> {
        let Some(fabric) = &self.fabric else {
            return Ok(());
        };
        let now = Instant::now();
        let mut changed = false;
        let discovery = &mut self.discovery;
        match fabric.recv_all(|frame| changed |= discovery.handle_frame(now, frame)) {
            Ok(0) => {}
            Ok(_) => self.fabric_works(now),
            // The link went down, the interface vanished, the kernel ran short of
            // buffers: none of it is this host's fault, and its guests still need xmxd.
            Err(e) => self.fabric_failed(now, &e),
        }
        if changed {
            // A domain here without a record may be a guest the fabric just told us about
            // (migrating in).
            let guests = &self.store.state.guests;
            let strangers: Vec<DomId> = self
                .domains
                .iter()
                .filter(|(_, d)| {
                    d.attached.is_none()
                        && d.name
                            .as_deref()
                            .is_some_and(|n| !guests.contains_key(names::base_name(n)))
                })
                .map(|(id, _)| *id)
                .collect();
            for id in strangers {
                self.evaluate(id);
            }
            self.refresh();
        }
        Ok(())
    }

    pub(super) fn handle_timeout(&mut self, now: Instant) {
        self.check_fabric(now);
        let mut changed = self.discovery.handle_timeout(now);
        if self.settle_at.is_some_and(|at| now >= at) {
            self.settle_at = None;
            tracing::info!(hosts = self.discovery.known_hosts(), "fabric settled");
            changed = true;
        }
        if changed {
            self.refresh();
        }
        self.backend.handle_timeout(now);
        if self.direct.poll_timeout().is_some_and(|at| now >= at) {
            // A hold-down ended.
            self.sync_direct();
        }
    }

    pub(super) fn transmit(&mut self) {
        let mut sent = false;
        while let Some(frame) = self.discovery.poll_transmit() {
            if let Some(f) = &self.fabric {
                match f.send(&frame) {
                    Ok(()) => sent = true,
                    Err(e) => tracing::debug!(error = %e, "discovery frame not sent"),
                }
            }
        }
        if sent {
            self.fabric_works(Instant::now());
        }
    }

    /// The fabric socket reported `error`: note it, and look at the interface soon.
    pub(super) fn fabric_failed(&mut self, now: Instant, error: &std::io::Error) {
        match &mut self.fabric_fault {
            Some(f) => {
                f.errors += 1;
                tracing::debug!(%error, "fabric still failing");
            }
            None => {
                tracing::warn!(%error, "fabric link failed; serving this host's guests and retrying");
                self.fabric_fault = Some(LinkFault::new(now));
            }
        }
    }

    /// A frame went out or came in: a failed link is back.
    pub(super) fn fabric_works(&mut self, now: Instant) {
        if let Some(f) = self.fabric_fault.take() {
            tracing::info!(
                down_ms = f.lasted(now).as_millis() as u64,
                errors = f.errors,
                "fabric link back"
            );
            // The others may have missed our news while the link was down, and we theirs.
            self.discovery.reannounce(now);
        }
    }

    /// While the link fails: is the interface a new one (deleted and created again)? Then
    /// open a socket on it; otherwise the socket resumes by itself when the link is up.
    pub(super) fn check_fabric(&mut self, now: Instant) {
        let (Some(fault), Some(fabric)) = (&mut self.fabric_fault, &self.fabric) else {
            return;
        };
        if !fault.due(now) {
            return;
        }
        match fabric.reopen_if_replaced() {
            Ok(None) => {}
            Ok(Some(fresh)) => {
                if fresh.mac() != self.discovery.me() {
                    // Our identity on the fabric stays what the others know.
                    tracing::warn!(old = %self.discovery.me(), new = %fresh.mac(),
                        "the re-created interface has another MAC; announcing with the old one");
                }
                tracing::info!(
                    iface = fresh.ifname(),
                    "fabric interface re-created; socket reopened"
                );
                self.fabric = Some(fresh);
                self.discovery.reannounce(now);
            }
            Err(e) => tracing::debug!(error = %e, "fabric interface not reopened"),
        }
    }

    pub(super) fn poll_timeout(&self) -> Instant {
        [
            Some(self.discovery.poll_timeout()),
            self.settle_at,
            self.backend.poll_timeout(),
            self.fabric_fault.map(|f| f.check_at),
            self.direct.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(1))
    }

    /// One pass over every source.
    pub(super) fn step(&mut self) -> Result<()> {
        self.handle_watches()?;
        self.handle_frames()?;
        self.handle_timeout(Instant::now());
        self.transmit();
        Ok(())
    }
}

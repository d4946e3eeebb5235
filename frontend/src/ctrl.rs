//! The guest's end of the control ring: requests with tags, answered in order by the
//! backend, with timeouts and Xen's notification suppression.
//!
//! The ring page is granted to the backend and its event channel is bound through an
//! event-channel handle of its own, so every event that handle reports is a control
//! event. A request is pushed, the backend is notified only if its `req_event` asks for
//! it, and the caller waits for the response carrying the request's tag: responses are
//! consumed with the final-check discipline (arm `rsp_event`, re-check, then block on the
//! port). A request that timed out is remembered, so its late response is recognised and
//! dropped instead of answering the next request.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use xmx_hv::{DomId, EventChannels, GrantTable, GrantedPages, Port, PortNotifier, PAGE_SIZE};
use xmx_wire::msg::{CtrlFront, CtrlKind, CtrlOp, CtrlRequest, CtrlResponse, CtrlStatus};

use crate::error::{Error, Result};
use crate::shared::{granted_mem, OwnedPort};

/// How often a waiting control request checks that the backend is still there.
pub const LIVENESS_EVERY: Duration = Duration::from_millis(200);

/// Counters of one control channel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CtrlStats {
    /// ENDPOINT_OPEN requests pushed.
    pub endpoint_open: u64,
    /// ENDPOINT_CLOSE requests pushed.
    pub endpoint_close: u64,
    /// REGION_REGISTER requests pushed.
    pub region_register: u64,
    /// REGION_DEREGISTER requests pushed.
    pub region_deregister: u64,
    /// Notifications sent to the backend (requests it asked to be woken for).
    pub notifications: u64,
    /// Requests pushed without a notification (the backend was polling).
    pub suppressed: u64,
    /// Requests given up after their timeout.
    pub timeouts: u64,
    /// Late responses to given-up requests, dropped.
    pub stale_responses: u64,
    /// Requests given up because the backend left while they waited.
    pub backend_gone: u64,
}

impl CtrlStats {
    /// All requests pushed.
    pub fn requests(&self) -> u64 {
        self.endpoint_open + self.endpoint_close + self.region_register + self.region_deregister
    }

    /// These counters and `other`'s together (a channel's and those of the ones before).
    pub fn plus(self, other: CtrlStats) -> CtrlStats {
        CtrlStats {
            endpoint_open: self.endpoint_open + other.endpoint_open,
            endpoint_close: self.endpoint_close + other.endpoint_close,
            region_register: self.region_register + other.region_register,
            region_deregister: self.region_deregister + other.region_deregister,
            notifications: self.notifications + other.notifications,
            suppressed: self.suppressed + other.suppressed,
            timeouts: self.timeouts + other.timeouts,
            stale_responses: self.stale_responses + other.stale_responses,
            backend_gone: self.backend_gone + other.backend_gone,
        }
    }

    fn count(&mut self, kind: CtrlKind) {
        match kind {
            CtrlKind::EndpointOpen => self.endpoint_open += 1,
            CtrlKind::EndpointClose => self.endpoint_close += 1,
            CtrlKind::RegionRegister => self.region_register += 1,
            CtrlKind::RegionDeregister => self.region_deregister += 1,
        }
    }
}

/// The requesting half of a control ring, with its page and event channel.
pub struct CtrlClient {
    ring: CtrlFront,
    /// The ring page; the ring's memory handle keeps it mapped, so it is ended only after
    /// the ring is gone (see [`CtrlClient::release`]).
    pages: Arc<GrantedPages>,
    ring_ref: u32,
    port: OwnedPort,
    notify: Arc<dyn PortNotifier>,
    next_tag: u32,
    abandoned: BTreeSet<u32>,
    stats: CtrlStats,
    scratch: Vec<Port>,
}

impl CtrlClient {
    /// Grant a fresh ring page to `backend` and allocate the channel's port on `evtchn`
    /// (a handle used for nothing else).
    pub fn new(
        gnttab: &dyn GrantTable,
        evtchn: Box<dyn EventChannels>,
        backend: DomId,
    ) -> Result<CtrlClient> {
        let pages = Arc::new(gnttab.grant_pages(backend, 1, true)?);
        let ring_ref = pages.refs()[0];
        let mem = granted_mem(&pages, 0, PAGE_SIZE)?;
        let ring = CtrlFront::new(mem)?;
        let port = OwnedPort::alloc_unbound(evtchn, backend)?;
        let notify = port.notifier()?;
        Ok(CtrlClient {
            ring,
            pages,
            ring_ref,
            port,
            notify,
            next_tag: 0,
            abandoned: BTreeSet::new(),
            stats: CtrlStats::default(),
            scratch: Vec::new(),
        })
    }

    /// The grant ref of the ring page (published as `ring-ref`).
    pub fn ring_ref(&self) -> u32 {
        self.ring_ref
    }

    /// The port the backend binds (published as `event-channel`).
    pub fn port(&self) -> Port {
        self.port.port()
    }

    /// Counters so far.
    pub fn stats(&self) -> CtrlStats {
        self.stats
    }

    fn tag(&mut self) -> u32 {
        loop {
            self.next_tag = self.next_tag.wrapping_add(1);
            if !self.abandoned.contains(&self.next_tag) {
                return self.next_tag;
            }
        }
    }

    /// Send `op` and wait up to `timeout` for its response. A response with an error
    /// status is returned as [`Error::Refused`].
    pub fn call(&mut self, op: CtrlOp, timeout: Duration) -> Result<CtrlResponse> {
        self.call_while(op, timeout, &mut || None)
    }

    /// As [`call`](Self::call), but a wait that lasts asks `backend_gone` every
    /// [`LIVENESS_EVERY`] whether the backend left (it disconnected the device, or
    /// stopped): a backend that left answers nothing, and waiting out `timeout` would
    /// only delay the reconnection. Its answer ends the call with
    /// [`Error::NotConnected`].
    pub fn call_while(
        &mut self,
        op: CtrlOp,
        timeout: Duration,
        backend_gone: &mut dyn FnMut() -> Option<String>,
    ) -> Result<CtrlResponse> {
        let deadline = Instant::now() + timeout;
        let kind = op.kind();
        while self.ring.is_full() {
            // Every slot holds an unanswered request (given-up ones, typically): wait for
            // the backend to answer some.
            self.drain_stale()?;
            if self.ring.is_full() {
                self.block_until(deadline, "a free control ring slot", backend_gone)?;
            }
        }
        let tag = self.tag();
        self.ring.push_request(&CtrlRequest { tag, op })?;
        self.stats.count(kind);
        if self.ring.push_requests_and_check_notify() {
            self.stats.notifications += 1;
            self.notify.notify()?;
        } else {
            self.stats.suppressed += 1;
        }
        match self.wait_for(tag, deadline, backend_gone) {
            Ok(rsp) => {
                if rsp.reply.kind() != kind {
                    return Err(Error::Protocol(format!(
                        "response to {kind:?} answers {:?}",
                        rsp.reply.kind()
                    )));
                }
                if rsp.status != CtrlStatus::Ok {
                    return Err(Error::Refused {
                        op: kind,
                        status: rsp.status,
                    });
                }
                Ok(rsp)
            }
            Err(Error::Timeout(what)) => {
                self.stats.timeouts += 1;
                self.abandoned.insert(tag);
                Err(Error::Timeout(what))
            }
            Err(e @ Error::NotConnected(_)) => {
                self.stats.backend_gone += 1;
                self.abandoned.insert(tag);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Consume responses until the one tagged `tag`.
    fn wait_for(
        &mut self,
        tag: u32,
        deadline: Instant,
        backend_gone: &mut dyn FnMut() -> Option<String>,
    ) -> Result<CtrlResponse> {
        loop {
            while let Some(rsp) = self.ring.next_response()? {
                if rsp.tag == tag {
                    return Ok(rsp);
                }
                if self.abandoned.remove(&rsp.tag) {
                    self.stats.stale_responses += 1;
                    continue;
                }
                return Err(Error::Protocol(format!(
                    "response tagged {} while waiting for {tag}",
                    rsp.tag
                )));
            }
            if self.ring.final_check_for_responses()? {
                continue;
            }
            self.block_until(deadline, "the control response", backend_gone)?;
        }
    }

    /// Drop late responses to given-up requests.
    fn drain_stale(&mut self) -> Result<()> {
        while self.ring.unconsumed_responses()? > 0 {
            match self.ring.next_response()? {
                Some(rsp) if self.abandoned.remove(&rsp.tag) => self.stats.stale_responses += 1,
                Some(rsp) => {
                    return Err(Error::Protocol(format!("unsolicited response {}", rsp.tag)))
                }
                None => break,
            }
        }
        Ok(())
    }

    /// Wait for an event on the channel until `deadline`, or until `backend_gone` says
    /// the backend left; re-enable delivery.
    fn block_until(
        &mut self,
        deadline: Instant,
        what: &str,
        backend_gone: &mut dyn FnMut() -> Option<String>,
    ) -> Result<()> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout(what.to_string()));
        }
        self.scratch.clear();
        let evtchn = self.port.handle();
        evtchn.wait(&mut self.scratch, Some(left.min(LIVENESS_EVERY)))?;
        if self.scratch.is_empty() {
            if let Some(why) = backend_gone() {
                return Err(Error::NotConnected(format!(
                    "{why} while waiting for {what}"
                )));
            }
        }
        for p in self.scratch.drain(..) {
            evtchn.unmask(p)?;
        }
        Ok(())
    }

    /// Close the port and end the ring's grant. The backend must have unmapped it; if it
    /// still does, the platform keeps the page until it lets go.
    pub fn release(self) {
        let CtrlClient {
            ring, pages, port, ..
        } = self;
        drop(port);
        drop(ring);
        crate::shared::end_shared_grants(pages, "control ring");
    }
}

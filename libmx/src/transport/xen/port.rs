//! An endpoint's port and regions on the Xen transport.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use xmx_mx::frame::{Message, MessageKind};
use xmx_mx::{Body, Frame, PeerAddr, RdmaWindow, RequestId, Status};

use super::link::XenLink;
use super::windows::FrontdRegistrar;
use super::XenShared;
use crate::segments::Segments;
use crate::transport::engine_msgs::Outgoing;
use crate::transport::mailbox::Mailbox;
use crate::transport::{PullProgress, Regions, TransportPort};
use xmx_hv::lock;

/// What the port, its regions and the driver thread share about one
/// endpoint.
pub(super) struct EndpointShared {
    /// The endpoint index.
    pub(crate) index: u8,
    /// Arrivals, taken without the link's lock.
    pub(crate) mailbox: Mailbox,
    /// The rings and requests.
    pub(crate) link: Mutex<XenLink>,
    /// Its direct channels to co-located guests.
    pub(crate) direct: Mutex<super::direct::EndpointDirect>,
    /// Why the endpoint is lost for good, once it is (the daemon is gone, or
    /// could not re-open it); read on every progress without the link's lock.
    pub(crate) lost: OnceLock<&'static str>,
    /// The endpoint was re-opened after an outage (a reconnection, a move) and
    /// its core has not been told yet; see [`TransportPort::take_path_restored`].
    pub(crate) restored: AtomicBool,
}

/// The endpoint's link as its direct channels see it.
pub(super) struct LinkRef<'a>(pub(crate) &'a Mutex<XenLink>);

impl super::direct::LinkAccess for LinkRef<'_> {
    fn observe(&mut self, frame: &Frame<Vec<u8>>) {
        lock(self.0).observe(frame);
    }

    unsafe fn read_lent(
        &mut self,
        window: RdmaWindow,
        offset: usize,
        dst: *mut u8,
        n: usize,
    ) -> bool {
        // SAFETY: the caller vouches for `dst`.
        unsafe { lock(self.0).read_lent(window, offset, dst, n) }
    }

    fn fill(&mut self, window: RdmaWindow) {
        lock(self.0).fill(window);
    }
}

/// An open endpoint of a guest.
pub(crate) struct XenPort {
    shared: Arc<XenShared>,
    ep: Arc<EndpointShared>,
    session: u32,
    outgoing: Outgoing,
    regions: Arc<XenRegions>,
}

impl XenPort {
    pub(super) fn new(shared: Arc<XenShared>, ep: Arc<EndpointShared>) -> XenPort {
        let session = lock(&ep.link).session();
        let regions = Arc::new(XenRegions {
            shared: shared.clone(),
            ep: ep.clone(),
        });
        XenPort {
            shared,
            ep,
            session,
            outgoing: Outgoing::default(),
            regions,
        }
    }
}

impl TransportPort for XenPort {
    fn describe(&self) -> String {
        let mut out = match self.ep.link.try_lock() {
            Ok(link) => link.describe(),
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner().describe(),
            Err(std::sync::TryLockError::WouldBlock) => "  link: its lock is held\n".into(),
        };
        if let Some(why) = self.ep.lost.get() {
            out.push_str(&format!("  link: lost ({why})\n"));
        }
        out
    }

    fn index(&self) -> u8 {
        self.ep.index
    }

    fn session(&self) -> u32 {
        self.session
    }

    fn transmit(&mut self, frame: Frame<Vec<u8>>) {
        // An ack marked resent (the endpoint is back from an outage, see
        // `xmx_mx::Endpoint::path_restored`) also tells the peer's backend to
        // request again what it was pulling from us; a direct channel would
        // hide it from that backend, so it always goes through ours.
        let backend_only = matches!(&frame.body, Body::Liback(a) if a.resent != 0);
        let rndv = match &frame.body {
            Body::Message(Message {
                kind: MessageKind::Rndv(r),
                ..
            }) => Some(r.window),
            _ => None,
        };
        if let Some(hub) = self.shared.hub().filter(|_| !backend_only) {
            let mut d = lock(&self.ep.direct);
            if let Some(window) = rndv {
                d.announce(window, frame.destination());
            }
            if hub.transmit(self.ep.index, &mut d, &self.shared.view, &frame) {
                return;
            }
        }
        if let Some(window) = rndv {
            // The peer will pull through the backends: the data must be in
            // the window first (a channel's peer reads the buffer itself).
            lock(&self.ep.link).fill(window);
        }
        match self.outgoing.convert(frame) {
            Ok(None) => {}
            Ok(Some(out)) => {
                let mut reg = FrontdRegistrar(&self.shared.client);
                lock(&self.ep.link).post(out, &self.ep.mailbox, &mut reg);
            }
            Err(e) => tracing::debug!(%e, "frame not sent"),
        }
    }

    fn receive(&mut self) -> Option<Frame<Vec<u8>>> {
        if let Some(f) = self.ep.mailbox.next_frame() {
            return Some(f);
        }
        if let Ok(mut d) = self.ep.direct.try_lock() {
            // A look that finds the lanes empty and no pull under way (a
            // polling wait's usual look) needs no hub, and takes no reference
            // to it.
            let hub = if d.idle() { None } else { self.shared.hub() };
            let (n, first) = hub.map_or((0, None), |hub| {
                hub.take_in_first(
                    self.ep.index,
                    &mut d,
                    &self.ep.mailbox,
                    &mut LinkRef(&self.ep.link),
                    true,
                )
            });
            let orphans = d.take_orphans();
            drop(d);
            self.shared.resume_pulls(&self.ep, orphans);
            if first.is_some() {
                return first;
            }
            if n > 0 {
                if let Some(f) = self.ep.mailbox.next_frame() {
                    return Some(f);
                }
            }
        }
        // An application polling its endpoint takes events in itself, unless
        // the driver thread is at it already. It leaves the ring unarmed: the
        // backend need not signal a port nobody sleeps on (see before_sleep).
        let mut link = self.ep.link.try_lock().ok()?;
        let mut reg = FrontdRegistrar(&self.shared.client);
        if link.take_in(&self.ep.mailbox, &mut reg) == 0 {
            return None;
        }
        drop(link);
        self.ep.mailbox.next_frame()
    }

    fn queued(&self) -> bool {
        // The driver thread's take-ins land here too; one that lands after
        // this look is the next look's (it rings the doorbell).
        !self.ep.mailbox.is_empty()
    }

    fn before_sleep(&mut self) -> bool {
        if let Some(hub) = self.shared.hub() {
            let mut d = lock(&self.ep.direct);
            let n = hub.take_in(
                self.ep.index,
                &mut d,
                &self.ep.mailbox,
                &mut LinkRef(&self.ep.link),
            );
            let orphans = d.take_orphans();
            let ready = n > 0 || !orphans.is_empty() || hub.arm(&mut d);
            drop(d);
            self.shared.resume_pulls(&self.ep, orphans);
            if ready {
                return true;
            }
        }
        let mut reg = FrontdRegistrar(&self.shared.client);
        lock(&self.ep.link).take_in_and_arm(&self.ep.mailbox, &mut reg) > 0
    }

    fn arrival_fds(&self) -> Option<crate::transport::ArrivalFds> {
        lock(&self.ep.link)
            .port_fd()
            .map(crate::transport::ArrivalFds::one)
    }

    fn take_arrival_signal(&mut self) {
        lock(&self.ep.link).take_notification(true);
    }

    fn regions(&self) -> Arc<dyn Regions> {
        self.regions.clone()
    }

    fn gone(&self) -> Option<&'static str> {
        self.ep.lost.get().copied()
    }

    fn take_path_restored(&mut self) -> bool {
        // Relaxed would do for the flag alone; SeqCst keeps it simple to reason
        // about beside the mailbox's ring that follows the store. Every
        // progress pass asks, and the answer is almost always no: a load
        // then, not a swap.
        self.ep.restored.load(Ordering::SeqCst) && self.ep.restored.swap(false, Ordering::SeqCst)
    }
}

impl Drop for XenPort {
    fn drop(&mut self) {
        self.shared.close_endpoint(&self.ep);
    }
}

/// An endpoint's LARGE buffers: copied into and out of granted windows.
pub(crate) struct XenRegions {
    shared: Arc<XenShared>,
    ep: Arc<EndpointShared>,
}

impl Regions for XenRegions {
    fn window_len_max(&self) -> Option<usize> {
        // A guest's region is named to the backend by at most REGION_INFO_REFS_MAX
        // pages of grant refs.
        Some(xmx_wire::msg::REGION_PAGES_MAX * xmx_wire::ring::PAGE_SIZE)
    }

    fn register(&self, data: &Segments) -> Option<RdmaWindow> {
        let mut reg = FrontdRegistrar(&self.shared.client);
        lock(&self.ep.link).register(&mut reg, data)
    }

    fn release(&self, window: RdmaWindow) {
        lock(&self.ep.direct).withdraw(window);
        let mut reg = FrontdRegistrar(&self.shared.client);
        lock(&self.ep.link).release(&mut reg, window);
    }

    fn invalidate(&self, addr: usize, len: usize) {
        let mut reg = FrontdRegistrar(&self.shared.client);
        lock(&self.ep.link).invalidate(&mut reg, addr, len);
    }

    fn pull(
        &self,
        id: RequestId,
        source: PeerAddr,
        window: RdmaWindow,
        dest: &Segments,
        length: u32,
    ) -> PullProgress {
        if let Some(hub) = self.shared.hub() {
            let sink = super::direct::DirectSink::new(id, source, window, dest.clone(), length);
            if let Some(p) = hub.pull(&mut lock(&self.ep.direct), self.ep.index, sink) {
                return p;
            }
        }
        let mut reg = FrontdRegistrar(&self.shared.client);
        lock(&self.ep.link).pull(&mut reg, &self.ep.mailbox, id, source, window, dest, length)
    }

    fn learn_session(&self, peer: PeerAddr, session: u32) {
        lock(&self.ep.link).learn_session(peer, session);
    }

    fn completed_pull(&self) -> Option<(RequestId, Result<(), Status>)> {
        self.ep.mailbox.next_pull()
    }
}

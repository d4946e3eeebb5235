//! The application's side of an open endpoint: [`EndpointChannel`].
//!
//! The guest daemon hands over the endpoint's pages and event channel
//! ([`crate::EndpointHandoff`]); from then on the application and the backend talk
//! through the shared pages alone:
//!
//! - the **send ring**: the application produces [`SendRequest`]s; the backend is notified
//!   only when its `req_event` asks for it;
//! - the **event ring**: the backend produces [`Event`]s, the application consumes them
//!   and hands the slots back ([`EndpointChannel::release_events`]); a RECV_MEDIUM event's
//!   receive-queue slot belongs to the application until the event's slot is handed back,
//!   so copy the fragment out first;
//! - the **send queue** and **receive queue**: one MEDIUM fragment (4096 bytes) per slot,
//!   read and written through bounds-checked copies.
//!
//! Waiting follows ring.h: spin for a short while, then arm the ring's event index, check
//! once more, and only then block on the event channel.

use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use xmx_hv::{ImportedPages, ImportedPort, Port, PortNotifier, PAGE_SIZE};
use xmx_wire::msg::{
    fill_marks, EndpointPages, Event, EventBack, SendFront, SendRequest, MEDIUM_FRAG_MAX,
};
use xmx_wire::ring::SharedMem;

use crate::error::{Error, Result};
use crate::handoff::{EndpointHandoff, RegionHandoff};
use crate::shared::imported_mem;

/// How long a waiter polls the event ring before it blocks, by default.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(20);

/// Counters of one channel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChannelStats {
    /// Send requests pushed.
    pub sends: u64,
    /// Notifications sent for them (the backend was asleep).
    pub send_notifications: u64,
    /// Events consumed.
    pub events: u64,
    /// Notifications sent when handing event slots back (the backend waited for room).
    pub release_notifications: u64,
    /// Times a waiter blocked on the event channel.
    pub blocks: u64,
    /// Re-mappings after a reconnection.
    pub remaps: u64,
}

/// Why [`EndpointChannel::wait_event`] returned.
#[derive(Debug)]
pub enum Wake {
    /// The next event (consumed; hand its slot back with
    /// [`EndpointChannel::release_events`]).
    Event(Event),
    /// The extra descriptor became readable.
    Other,
    /// The timeout passed.
    Timeout,
    /// The event channel is closed: the backend let the endpoint go (the device
    /// disconnected). The daemon re-opens it and hands over a new one on reconnection.
    Disconnected,
}

struct Mapped {
    endpoint: u8,
    session_id: u32,
    generation: u32,
    geometry: EndpointPages,
    port: ImportedPort,
    notify: Arc<dyn PortNotifier>,
    send: SendFront,
    events: EventBack,
    sendq: SharedMem,
    recvq: SharedMem,
}

impl Mapped {
    fn import(h: EndpointHandoff) -> Result<Mapped> {
        let geometry = h.geometry;
        let pages = Arc::new(h.pages.import()?);
        if pages.len() != geometry.total() * PAGE_SIZE {
            return Err(Error::Protocol(
                "endpoint pages do not match the geometry".into(),
            ));
        }
        let at = |r: std::ops::Range<usize>| -> Result<SharedMem> {
            imported_mem(&pages, r.start * PAGE_SIZE, r.len() * PAGE_SIZE)
        };
        // The daemon initialised both ring headers; take our halves as they stand. The
        // event ring is consumed from index 0: nothing the backend produced is skipped.
        let send = SendFront::attach(at(geometry.send_ring_refs())?)?;
        let events = EventBack::new(at(geometry.event_ring_refs())?)?;
        let sendq = at(geometry.send_queue_refs())?;
        let recvq = at(geometry.recv_queue_refs())?;
        let port = h.port.import()?;
        let notify = port.notifier();
        Ok(Mapped {
            endpoint: h.endpoint,
            session_id: h.session_id,
            generation: h.generation,
            geometry,
            port,
            notify,
            send,
            events,
            sendq,
            recvq,
        })
    }
}

/// An open endpoint as the application uses it; see the module documentation.
pub struct EndpointChannel {
    m: Mapped,
    spin: Duration,
    stats: ChannelStats,
}

impl std::fmt::Debug for EndpointChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointChannel")
            .field("endpoint", &self.m.endpoint)
            .field("session_id", &self.m.session_id)
            .field("generation", &self.m.generation)
            .finish()
    }
}

impl EndpointChannel {
    /// Map what the daemon handed over.
    pub fn from_handoff(h: EndpointHandoff) -> Result<EndpointChannel> {
        Ok(EndpointChannel {
            m: Mapped::import(h)?,
            spin: DEFAULT_SPIN,
            stats: ChannelStats::default(),
        })
    }

    /// Replace the mapping with the endpoint re-opened after a reconnection. The old
    /// pages are unmapped before this returns; the rings start empty (requests in flight
    /// before get no completion).
    pub fn remap(&mut self, h: EndpointHandoff) -> Result<()> {
        if h.endpoint != self.m.endpoint || h.generation <= self.m.generation {
            return Err(Error::Invalid(format!(
                "endpoint {} generation {} does not replace endpoint {} generation {}",
                h.endpoint, h.generation, self.m.endpoint, self.m.generation
            )));
        }
        self.m = Mapped::import(h)?;
        self.stats.remaps += 1;
        Ok(())
    }

    /// Spin this long before blocking in [`EndpointChannel::wait_event`].
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    /// Endpoint index.
    pub fn endpoint(&self) -> u8 {
        self.m.endpoint
    }
    /// Session id the backend gave the endpoint.
    pub fn session_id(&self) -> u32 {
        self.m.session_id
    }
    /// How many times the endpoint was re-opened.
    pub fn generation(&self) -> u32 {
        self.m.generation
    }
    /// Page counts of the rings and queues.
    pub fn geometry(&self) -> EndpointPages {
        self.m.geometry
    }
    /// The event-channel port.
    pub fn port(&self) -> Port {
        self.m.port.port()
    }
    /// A descriptor that polls readable when the backend signals the endpoint.
    pub fn port_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor belongs to the imported port, which lives as long as
        // the returned borrow of self.
        unsafe { BorrowedFd::borrow_raw(self.m.port.fd()) }
    }
    /// Counters so far.
    pub fn stats(&self) -> ChannelStats {
        self.stats
    }
    /// Slots of the send ring free for requests right now (after taking back the ones
    /// the backend returned).
    pub fn free_send_slots(&mut self) -> Result<u32> {
        self.m.send.reclaim()?;
        Ok(self.m.send.free_requests())
    }

    /// Queue a send request; `Error::Ring(RingError::Full)` if every slot is taken. Published by
    /// [`EndpointChannel::flush`].
    pub fn push(&mut self, req: &SendRequest) -> Result<()> {
        if self.m.send.is_full() {
            self.m.send.reclaim()?;
        }
        self.m.send.push_request(req)?;
        self.stats.sends += 1;
        Ok(())
    }

    /// Publish queued requests; notify the backend if it asked.
    pub fn flush(&mut self) -> Result<()> {
        if self.m.send.unpublished() == 0 {
            return Ok(());
        }
        if self.m.send.push_requests_and_check_notify() {
            self.stats.send_notifications += 1;
            self.m.notify.notify()?;
        }
        Ok(())
    }

    /// Sets or clears `region`'s fill mark in the send ring (see
    /// [`xmx_wire::msg::fill_marks`]): the backend serves a peer's pull of the region only
    /// while it is set. Set it after the region holds the data of the send it is lent to:
    /// the store is a release, so a backend that sees the mark sees the data.
    pub fn set_fill_mark(&self, region: u8, filled: bool) {
        fill_marks::write(self.m.send.mem(), region, filled);
    }

    /// Push and publish one request.
    pub fn send(&mut self, req: &SendRequest) -> Result<()> {
        self.push(req)?;
        self.flush()
    }

    /// The next event, if one is waiting. Its slot stays ours until
    /// [`EndpointChannel::release_events`].
    pub fn next_event(&mut self) -> Result<Option<Event>> {
        match self.m.events.next_request() {
            Ok(Some(ev)) => {
                self.stats.events += 1;
                Ok(Some(ev))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Hand every consumed event slot back to the backend (and with them the
    /// receive-queue slots their events named); notify it if it waits for room.
    pub fn release_events(&mut self) -> Result<()> {
        if self.m.events.retire_consumed() == 0 {
            return Ok(());
        }
        if self.m.events.push_responses_and_check_notify() {
            self.stats.release_notifications += 1;
            self.m.notify.notify()?;
        }
        Ok(())
    }

    /// Wait for the next event up to `timeout` (None: forever), also waking when `also`
    /// becomes readable (the daemon's socket, say). Spins first, then hands consumed event
    /// slots back (copy MEDIUM data out before calling this), arms the ring and blocks.
    pub fn wait_event(
        &mut self,
        timeout: Option<Duration>,
        also: Option<BorrowedFd<'_>>,
    ) -> Result<Wake> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let spin_until = Instant::now() + self.spin;
        loop {
            if let Some(ev) = self.next_event()? {
                return Ok(Wake::Event(ev));
            }
            let now = Instant::now();
            let before_deadline = match deadline {
                Some(d) => now < d,
                None => true,
            };
            if now < spin_until && before_deadline {
                std::hint::spin_loop();
                continue;
            }
            self.release_events()?;
            if self.m.events.final_check_for_requests()? {
                continue;
            }
            if self.m.port.is_closed() {
                return Ok(Wake::Disconnected);
            }
            let left = match deadline {
                None => None,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(Wake::Timeout);
                    }
                    Some(left)
                }
            };
            self.stats.blocks += 1;
            match self.block(left, also)? {
                Blocked::Port | Blocked::Timeout => {}
                Blocked::Other => return Ok(Wake::Other),
            }
        }
    }

    /// Hand consumed event slots back and arm the event ring, so that the backend
    /// notifies the port at its next event: the last step before sleeping on
    /// [`EndpointChannel::port_fd`] in a caller's own poll loop. True if events arrived
    /// meanwhile (consume them instead of sleeping).
    pub fn arm_events(&mut self) -> Result<bool> {
        self.release_events()?;
        Ok(self.m.events.final_check_for_requests()?)
    }

    /// Consume the port's pending notification without blocking, after a caller's own
    /// poll found [`EndpointChannel::port_fd`] readable; true if there was one.
    pub fn take_notification(&self) -> Result<bool> {
        Ok(self.m.port.take_pending()?)
    }

    /// True once the event channel is closed (see [`Wake::Disconnected`]).
    pub fn is_disconnected(&self) -> bool {
        self.m.port.is_closed()
    }

    fn block(&self, left: Option<Duration>, also: Option<BorrowedFd<'_>>) -> Result<Blocked> {
        let timeout = match left {
            None => PollTimeout::NONE,
            Some(d) => {
                let ms = d.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
                PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
            }
        };
        let port_fd = self.port_fd();
        let mut fds = vec![PollFd::new(port_fd, PollFlags::POLLIN)];
        if let Some(fd) = also {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
        }
        match nix::poll::poll(&mut fds, timeout) {
            Ok(0) => return Ok(Blocked::Timeout),
            Ok(_) => {}
            Err(Errno::EINTR) => return Ok(Blocked::Timeout),
            Err(e) => return Err(Error::Io(e.into())),
        }
        let ready = |f: &PollFd<'_>| {
            f.revents().is_some_and(|r| {
                r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR)
            })
        };
        let port_ready = ready(&fds[0]);
        let other_ready = fds.get(1).is_some_and(ready);
        if port_ready {
            self.m.port.take_pending()?;
        }
        if other_ready {
            return Ok(Blocked::Other);
        }
        Ok(Blocked::Port)
    }

    /// Write `bytes` at `offset` of send-queue slot `slot`.
    pub fn write_send_queue(&self, slot: u16, offset: usize, bytes: &[u8]) -> Result<()> {
        let at = queue_offset(slot, self.m.geometry.send_queue, offset, bytes.len())?;
        if !self.m.sendq.write_bytes(at, bytes) {
            return Err(Error::Invalid("send queue write out of range".into()));
        }
        Ok(())
    }

    /// Read `buf.len()` bytes at `offset` of send-queue slot `slot`.
    pub fn read_send_queue(&self, slot: u16, offset: usize, buf: &mut [u8]) -> Result<()> {
        let at = queue_offset(slot, self.m.geometry.send_queue, offset, buf.len())?;
        if !self.m.sendq.read_bytes(at, buf) {
            return Err(Error::Invalid("send queue read out of range".into()));
        }
        Ok(())
    }

    /// Read `buf.len()` bytes at `offset` of receive-queue slot `slot`.
    pub fn read_recv_queue(&self, slot: u16, offset: usize, buf: &mut [u8]) -> Result<()> {
        let at = queue_offset(slot, self.m.geometry.recv_queue, offset, buf.len())?;
        if !self.m.recvq.read_bytes(at, buf) {
            return Err(Error::Invalid("receive queue read out of range".into()));
        }
        Ok(())
    }
}

enum Blocked {
    Port,
    Other,
    Timeout,
}

/// Byte offset of `len` bytes at `offset` into queue slot `slot` of a `slots`-slot queue.
fn queue_offset(slot: u16, slots: u16, offset: usize, len: usize) -> Result<usize> {
    if slot >= slots {
        return Err(Error::Invalid(format!("queue slot {slot} of {slots}")));
    }
    match offset.checked_add(len) {
        Some(end) if end <= MEDIUM_FRAG_MAX => Ok(usize::from(slot) * MEDIUM_FRAG_MAX + offset),
        _ => Err(Error::Invalid(format!(
            "{len} bytes at {offset} of a {MEDIUM_FRAG_MAX}-byte queue slot"
        ))),
    }
}

/// A registered region's pages as the application sees them: a window LARGE data is
/// copied into (before a send) or out of (after a pull completed).
pub struct RegionWindow {
    endpoint: u8,
    region_id: u8,
    length: u32,
    mem: SharedMem,
}

impl std::fmt::Debug for RegionWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionWindow")
            .field("endpoint", &self.endpoint)
            .field("region_id", &self.region_id)
            .field("length", &self.length)
            .finish()
    }
}

impl RegionWindow {
    /// Map what the daemon handed over.
    pub fn from_handoff(h: RegionHandoff) -> Result<RegionWindow> {
        let pages: Arc<ImportedPages> = Arc::new(h.pages.import()?);
        if (h.length as usize) > pages.len() {
            return Err(Error::Protocol("region longer than its pages".into()));
        }
        let mem = imported_mem(&pages, 0, h.length as usize)?;
        Ok(RegionWindow {
            endpoint: h.endpoint,
            region_id: h.region_id,
            length: h.length,
            mem,
        })
    }

    /// Go on over the pages of `h` (the same region, granted anew), with what this
    /// window holds copied into them.
    pub(crate) fn rebase(&mut self, h: RegionHandoff) -> Result<()> {
        if (h.endpoint, h.region_id, h.length) != (self.endpoint, self.region_id, self.length) {
            return Err(Error::Protocol(format!(
                "region {} of endpoint {} ({} bytes) handed over for region {} of endpoint {} ({} bytes)",
                h.region_id, h.endpoint, h.length, self.region_id, self.endpoint, self.length
            )));
        }
        let next = RegionWindow::from_handoff(h)?;
        let mut held = vec![0u8; self.length as usize];
        self.read(0, &mut held)?;
        next.write(0, &held)?;
        self.mem = next.mem;
        Ok(())
    }

    /// A window over `mem` (pages this process granted itself, see [`crate::direct`]).
    pub(crate) fn over(endpoint: u8, region_id: u8, length: u32, mem: SharedMem) -> RegionWindow {
        RegionWindow {
            endpoint,
            region_id,
            length,
            mem,
        }
    }

    /// Endpoint of the region.
    pub fn endpoint(&self) -> u8 {
        self.endpoint
    }
    /// Region id (what RNDV and PULL name).
    pub fn region_id(&self) -> u8 {
        self.region_id
    }
    /// Bytes in the window.
    pub fn len(&self) -> usize {
        self.length as usize
    }
    /// Never true: regions have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// A window over private memory of this process, registered nowhere: for testing
    /// users of windows (a registration cache) without a daemon.
    pub fn in_memory(endpoint: u8, region_id: u8, length: u32) -> RegionWindow {
        RegionWindow {
            endpoint,
            region_id,
            length,
            mem: SharedMem::new_owned((length as usize).div_ceil(PAGE_SIZE)),
        }
    }

    fn fits(&self, offset: usize, len: usize) -> bool {
        offset
            .checked_add(len)
            .is_some_and(|end| end <= self.length as usize)
    }

    /// Copy `bytes` into the window at `offset`.
    pub fn write(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        if !self.fits(offset, bytes.len()) || !self.mem.write_bytes(offset, bytes) {
            return Err(Error::Invalid(format!(
                "{} bytes at {offset} of a {}-byte region",
                bytes.len(),
                self.length
            )));
        }
        Ok(())
    }

    /// Copy `buf.len()` bytes out of the window at `offset`.
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        if !self.fits(offset, buf.len()) || !self.mem.read_bytes(offset, buf) {
            return Err(Error::Invalid(format!(
                "{} bytes at {offset} of a {}-byte region",
                buf.len(),
                self.length
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_offsets_are_bounded() {
        assert_eq!(queue_offset(0, 4, 0, 4096).unwrap(), 0);
        assert_eq!(queue_offset(3, 4, 100, 10).unwrap(), 3 * 4096 + 100);
        assert!(queue_offset(4, 4, 0, 1).is_err());
        assert!(queue_offset(0, 4, 4000, 97).is_err());
        assert!(queue_offset(0, 4, usize::MAX, 2).is_err());
        assert!(queue_offset(0, 4, 4096, 0).is_ok());
    }
}

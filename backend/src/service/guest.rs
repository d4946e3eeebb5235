//! What the backend holds for one connected guest: its control ring, its open endpoints
//! (send ring, event ring, queues, event channel) and its registered regions.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use xmx_hv::{DomId, Port, PortNotifier};
use xmx_wire::msg::{CtrlBack, Event, EventBody, EventFront, SendBack};
use xmx_wire::ring::RingError;

use super::kept::{KeptMapping, KeptMappings};
use super::memory::GrantMemory;
use super::quota::GuestUsage;
use crate::admin::EndpointCountersReport;
use xmx_engine::{GuestId, RegionHandle};

/// A device, by guest domain and device index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceKey {
    /// The guest domain.
    pub domu: DomId,
    /// Device index within the guest.
    pub devid: u32,
}

impl DeviceKey {
    /// The engine's id for the device's virtual NIC: the domain id for device 0, the
    /// device index in the upper half otherwise (device indices are below 65536).
    pub fn guest(&self) -> GuestId {
        GuestId(u32::from(self.domu) | (self.devid << 16))
    }

    /// The device whose virtual NIC is `guest`.
    pub fn from_guest(guest: GuestId) -> Self {
        DeviceKey {
            domu: (guest.0 & 0xffff) as DomId,
            devid: guest.0 >> 16,
        }
    }
}

/// Counters of one endpoint's rings.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct EndpointCounters {
    pub send_requests: u64,
    pub events: u64,
    pub event_drops: u64,
    pub notifications: u64,
    pub quiet_events: u64,
}

/// True for events the guest did not ask for (received packets); completions are never
/// dropped, because the library waits for them.
pub(crate) fn is_unsolicited(event: &Event) -> bool {
    !matches!(
        event.body,
        EventBody::SendDone { .. } | EventBody::PullDone { .. } | EventBody::Error { .. }
    )
}

/// The receive-queue slot an event hands to the library, if any.
pub(crate) fn recvq_slot(event: &Event) -> Option<u16> {
    match event.body {
        EventBody::RecvMedium { frag, .. } => Some(frag.recvq_slot),
        _ => None,
    }
}

/// An open endpoint.
pub(crate) struct EndpointConn {
    /// Our port of the endpoint's event channel.
    pub port: Port,
    pub notify: Arc<dyn PortNotifier>,
    /// Requests from the application; we consume.
    pub send: SendBack,
    /// Events for the application; we produce.
    pub events: EventFront,
    /// Events waiting for room in the event ring, each with whether it wakes the
    /// application ([`xmx_engine::GuestEvent::wakes`]).
    pub backlog: VecDeque<(Event, bool)>,
    /// `req_prod` before the first of the events published since the last
    /// notification check without one (all quiet): the next check covers them.
    pub unsignalled: Option<u32>,
    /// The application waits for no send's completion but a MEDIUM's
    /// ([`xmx_wire::msg::EndpointOpen::quiet_send_done`]): the engine's quiet
    /// completions are published without a notification. Otherwise every event is
    /// notified as `io/ring.h` has it.
    pub quiet_send_done: bool,
    /// One entry per event in the ring not yet returned by the application: the
    /// receive-queue slot it handed over. A slot goes back to the engine when the
    /// application returns the event's ring slot.
    pub in_ring: VecDeque<Option<u16>>,
    /// Pages mapped for the endpoint (rings and queues).
    pub pages: usize,
    pub counters: EndpointCounters,
}

impl EndpointConn {
    /// Take back the event-ring slots the application returned; the receive-queue slots
    /// those events carried are appended to `released`.
    pub fn reclaim_events(&mut self, released: &mut Vec<u16>) -> Result<u32, RingError> {
        let n = self.events.reclaim()?;
        for _ in 0..n {
            if let Some(Some(slot)) = self.in_ring.pop_front() {
                released.push(slot);
            }
        }
        Ok(n)
    }

    /// Queue an event; an unsolicited one is refused when `limit` events already wait.
    pub fn queue_event(&mut self, event: Event, limit: usize) -> bool {
        self.queue(event, true, limit)
    }

    /// As [`EndpointConn::queue_event`], for an event that wakes the application
    /// only if `wakes` or the application did not open the endpoint with
    /// `quiet_send_done`.
    pub fn queue(&mut self, event: Event, wakes: bool, limit: usize) -> bool {
        let wakes = wakes || !self.quiet_send_done;
        if self.backlog.len() >= limit && is_unsolicited(&event) {
            self.counters.event_drops += 1;
            return false;
        }
        self.backlog.push_back((event, wakes));
        true
    }

    /// Move waiting events into the event ring as far as it has room; true if the
    /// application asked to be notified.
    ///
    /// Events that do not wake the application (a send's completion) are published
    /// without a notification: an application asleep waits for a reply, and woke for
    /// each of its own sends (one wake-up in two of a blocking ping-pong). The next
    /// event that wakes it is checked against all of them, so an application that
    /// asked to be told of the ring's next entry is told then; a ring left full with
    /// events still waiting is always told (only the application makes room).
    pub fn flush_events(&mut self) -> bool {
        let before = self.events.published();
        let mut pushed = 0u32;
        let mut wakes = false;
        while !self.events.is_full() {
            let Some((event, w)) = self.backlog.pop_front() else {
                break;
            };
            match self.events.push_request(&event) {
                Ok(()) => {
                    self.in_ring.push_back(recvq_slot(&event));
                    self.counters.events += 1;
                    pushed += 1;
                    wakes |= w;
                }
                Err(e) => {
                    // The engine only builds events that encode; keep going without it.
                    tracing::error!(error = %e, ?event, "event does not encode; dropped");
                }
            }
        }
        if pushed == 0 {
            return false;
        }
        if !wakes && self.backlog.is_empty() {
            self.events.push_requests();
            self.counters.quiet_events += u64::from(pushed);
            self.unsignalled.get_or_insert(before);
            return false;
        }
        let since = self.unsignalled.take().unwrap_or(before);
        self.events.push_requests_and_check_notify_since(since)
    }

    /// Counters for the status socket.
    pub fn report(&self, endpoint: u8) -> EndpointCountersReport {
        EndpointCountersReport {
            endpoint,
            send_requests: self.counters.send_requests,
            events: self.counters.events,
            event_drops: self.counters.event_drops,
            notifications: self.counters.notifications,
            quiet_send_done: self.quiet_send_done,
            quiet_events: self.counters.quiet_events,
            backlog: self.backlog.len() as u64,
        }
    }

    /// Signal the application, counting it.
    pub fn notify(&mut self) {
        self.counters.notifications += 1;
        if let Err(e) = self.notify.notify() {
            tracing::debug!(port = self.port, error = %e, "endpoint notify failed");
        }
    }
}

/// A registered region.
pub(crate) struct RegionConn {
    pub handle: RegionHandle,
    /// Pages it counts in the guest's mapped pages.
    pub pages: usize,
    /// Its mapping, kept for the next window when the region is deregistered (a window
    /// the application granted itself; see [`super::kept`]).
    pub keep: Option<KeptMapping>,
}

/// A connected guest.
pub(crate) struct Connection {
    pub guest: GuestId,
    pub domu: DomId,
    /// Control requests from the guest daemon; we answer.
    pub ctrl: CtrlBack,
    pub ctrl_port: Port,
    pub ctrl_notify: Arc<dyn PortNotifier>,
    /// The guest's areas as the engine reaches them (a clone is the engine's).
    pub memory: GrantMemory,
    pub endpoints: BTreeMap<u8, EndpointConn>,
    /// By (endpoint, region id).
    pub regions: BTreeMap<(u8, u8), RegionConn>,
    /// Mappings of deregistered windows, for the windows that follow.
    pub kept: KeptMappings,
    pub usage: GuestUsage,
    /// Sessions this device's endpoints had under a previous run of the backend, as
    /// recorded in xenstore: an endpoint re-opened with its own keeps it.
    pub resumable: BTreeMap<u8, u32>,
    /// Set when the guest broke the protocol: it is disconnected at the end of the round.
    pub failure: Option<String>,
}

impl Connection {
    /// Record a protocol violation (the first one wins).
    pub fn fail(&mut self, reason: String) {
        if self.failure.is_none() {
            self.failure = Some(reason);
        }
    }

    /// Regions registered on `endpoint`.
    pub fn regions_of(&self, endpoint: u8) -> usize {
        self.regions
            .range((endpoint, 0)..=(endpoint, u8::MAX))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xmx_wire::msg::{DoneStatus, EventBack, InlineData, InlineMsg, MsgInfo, RecvMedium, Route};
    use xmx_wire::ring::{init_shared, SharedMem};

    struct Counting(std::sync::atomic::AtomicU32);
    impl PortNotifier for Counting {
        fn notify(&self) -> xmx_hv::Result<()> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
    }

    fn endpoint() -> (EndpointConn, EventBack) {
        let send_mem = SharedMem::new_owned(1);
        let event_mem = SharedMem::new_owned(1);
        init_shared(&send_mem, 0).unwrap();
        init_shared(&event_mem, 0).unwrap();
        let app_events = EventBack::new(event_mem.clone()).unwrap();
        let ep = EndpointConn {
            port: 1,
            notify: Arc::new(Counting(0.into())),
            send: SendBack::new(send_mem).unwrap(),
            events: EventFront::attach(event_mem).unwrap(),
            backlog: VecDeque::new(),
            unsignalled: None,
            quiet_send_done: true,
            in_ring: VecDeque::new(),
            pages: 2,
            counters: EndpointCounters::default(),
        };
        (ep, app_events)
    }

    fn tiny(tag: u32) -> Event {
        Event {
            tag,
            body: EventBody::RecvTiny {
                from: Route::default(),
                msg: InlineMsg {
                    info: MsgInfo::default(),
                    data: InlineData::new(b"hi").unwrap(),
                },
            },
        }
    }

    fn medium(tag: u32, slot: u16) -> Event {
        Event {
            tag,
            body: EventBody::RecvMedium {
                from: Route::default(),
                frag: RecvMedium {
                    info: MsgInfo::default(),
                    length: 100,
                    recvq_slot: slot,
                    frag_length: 100,
                    frag_seqnum: 0,
                    frag_pipeline: 12,
                },
            },
        }
    }

    fn done(tag: u32) -> Event {
        Event {
            tag,
            body: EventBody::SendDone {
                status: DoneStatus::Success,
                length: 0,
            },
        }
    }

    #[test]
    fn a_quiet_completion_is_not_signalled_but_the_next_event_covers_it() {
        let (mut ep, mut app) = endpoint();
        // Take the ring's first notification (req_event starts at 1).
        ep.queue_event(tiny(0), usize::MAX);
        assert!(ep.flush_events());
        assert_eq!(app.next_request().unwrap(), Some(tiny(0)));
        // The application sleeps: it asks to be told of the next entry.
        assert!(!app.final_check_for_requests().unwrap());
        // Its own send's completion lands in the ring without a signal.
        assert!(ep.queue(done(1), false, usize::MAX));
        assert!(!ep.flush_events(), "a send's completion wakes nobody");
        assert_eq!(ep.unsignalled, Some(1));
        assert_eq!(ep.counters.quiet_events, 1);
        // The reply that follows is signalled, although the entry the application
        // asked about was the quiet one.
        ep.queue_event(tiny(2), usize::MAX);
        assert!(ep.flush_events());
        assert_eq!(ep.unsignalled, None);
        assert_eq!(app.next_request().unwrap(), Some(done(1)));
        assert_eq!(app.next_request().unwrap(), Some(tiny(2)));
    }

    /// A consumer that did not ask for quiet completions is told of each one: it may
    /// be asleep until its TINY has left (`io/ring.h`'s contract).
    #[test]
    fn without_quiet_send_done_every_completion_is_signalled() {
        let (mut ep, mut app) = endpoint();
        ep.quiet_send_done = false;
        ep.queue_event(tiny(0), usize::MAX);
        assert!(ep.flush_events());
        assert_eq!(app.next_request().unwrap(), Some(tiny(0)));
        assert!(!app.final_check_for_requests().unwrap());
        assert!(ep.queue(done(1), false, usize::MAX));
        assert!(
            ep.flush_events(),
            "the completion it asked about is signalled"
        );
        assert_eq!(ep.unsignalled, None);
        assert_eq!(ep.counters.quiet_events, 0);
        assert_eq!(app.next_request().unwrap(), Some(done(1)));
    }

    #[test]
    fn a_ring_full_of_quiet_completions_is_signalled() {
        let (mut ep, mut app) = endpoint();
        ep.queue_event(tiny(0), usize::MAX);
        assert!(ep.flush_events());
        assert_eq!(app.next_request().unwrap(), Some(tiny(0)));
        app.retire_consumed();
        app.push_responses();
        ep.reclaim_events(&mut Vec::new()).unwrap();
        assert!(!app.final_check_for_requests().unwrap());
        let size = ep.events.size();
        for tag in 0..=size {
            ep.queue(done(tag), false, usize::MAX);
        }
        // Only the application makes room for the one left waiting: it is told.
        assert!(ep.flush_events());
        assert_eq!(ep.backlog.len(), 1);
    }

    #[test]
    fn backlog_is_bounded_for_unsolicited_events_only() {
        let (mut ep, _app) = endpoint();
        assert!(ep.queue_event(tiny(0), 2));
        assert!(ep.queue_event(tiny(1), 2));
        assert!(!ep.queue_event(tiny(2), 2));
        assert!(ep.queue_event(done(3), 2), "completions always pass");
        assert_eq!(ep.backlog.len(), 3);
        assert_eq!(ep.counters.event_drops, 1);
    }

    #[test]
    fn events_flow_when_the_ring_has_room_and_slots_come_back_with_them() {
        let (mut ep, mut app) = endpoint();
        let size = ep.events.size() as usize;
        for i in 0..size + 3 {
            ep.queue_event(medium(i as u32, i as u16), usize::MAX);
        }
        // Nobody asked for a notification yet? The ring starts with rsp/req events at 1.
        assert!(ep.flush_events());
        assert_eq!(ep.backlog.len(), 3);
        assert_eq!(ep.in_ring.len(), size);
        // The application consumes two events and returns their slots.
        for want in 0..2u32 {
            let ev = app.next_request().unwrap().unwrap();
            assert_eq!(ev, medium(want, want as u16));
        }
        app.retire_consumed();
        app.push_responses();
        let mut released = Vec::new();
        assert_eq!(ep.reclaim_events(&mut released).unwrap(), 2);
        assert_eq!(released, vec![0, 1]);
        ep.flush_events();
        assert_eq!(ep.backlog.len(), 1);
        assert_eq!(ep.counters.events as usize, size + 2);
    }
}

//! The frontend against a minimal backend written in the tests: what the backend maps is
//! exactly what the guest listed, bytes cross the hand-off both ways, and everything is
//! released at the end.

mod common;

use std::time::{Duration, Instant};

use common::*;
use xmx_frontend::{
    Error, Frontend, FrontendConfig, FrontendEvent, RegionCache, RegionWindow, Registrar, Wake,
};
use xmx_hv::DOM0;
use xmx_wire::msg::{
    CtrlKind, EndpointPages, Event, EventBody, EventFront, InlineData, InlineMsg, MsgInfo, Route,
    SendBack, SendOp, SendRequest,
};
use xmx_wire::xenbus::XenbusState;

fn connected(
    host: &FrontendTestHost,
    name: &str,
    last: u8,
    cfg: FrontendConfig,
) -> (u16, FakeBackend, Frontend) {
    let domu = host.guest(name, last);
    let fake = FakeBackend::start(host, domu);
    let mut fe = host.frontend(domu, cfg);
    fe.wait_connected(WAIT).unwrap();
    (domu, fake, fe)
}

fn tiny(tag: u32, bytes: &[u8]) -> SendRequest {
    SendRequest {
        tag,
        route: Route {
            peer_index: 3,
            endpoint: 1,
            session_id: 0xabcd,
        },
        op: SendOp::Tiny(InlineMsg {
            info: MsgInfo {
                seqnum: 7,
                piggyack: 0,
                match_info: 0x1122_3344_5566_7788,
            },
            data: InlineData::new(bytes).unwrap(),
        }),
    }
}

#[test]
fn endpoint_pages_reach_the_backend_exactly_and_bytes_cross_both_ways() {
    let host = FrontendTestHost::start();
    let (domu, fake, mut fe) = connected(&host, "g1", 1, FrontendConfig::default());
    let info = fe.backend_info().unwrap().clone();
    assert_eq!(info.mac, guest_mac(1));
    assert_eq!(info.hostname, "g1:0");
    assert_eq!((info.max_endpoints, info.max_regions), (8, 16));
    assert_eq!(fe.state(), XenbusState::Connected);
    assert_eq!(host.state(DOM0).mappings_held, 1, "the control ring");

    let g = EndpointPages {
        send_ring: 2,
        event_ring: 1,
        send_queue: 3,
        recv_queue: 5,
    };
    let h = fe.open_endpoint(Some(2), Some(g)).unwrap();
    assert_eq!(
        (h.endpoint, h.session_id, h.generation),
        (2, 0x5e55_0002, 0)
    );
    let refs = h.pages.refs.clone();
    assert_eq!(refs.len(), g.total());
    let mapping = {
        let st = fake.lock();
        let ep = &st.endpoints[&2];
        assert_eq!(
            ep.refs, refs,
            "the backend maps exactly the listed pages, in order"
        );
        assert_eq!(ep.pages, g);
        ep.mapping.clone()
    };
    assert_eq!(host.state(DOM0).mappings_held, 1 + g.total());
    let mut ch = channel(h);
    assert_eq!(ch.geometry(), g);

    // Application to backend: a send-queue fragment.
    let frag: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 1) as u8).collect();
    ch.write_send_queue(2, 0, &frag).unwrap();
    let sq = g.send_queue_refs().start * 4096;
    assert!(read_mapped(&mapping, sq + 2 * 4096, 4096) == frag);
    // Backend to application: a receive-queue fragment.
    let rq = g.recv_queue_refs().start * 4096;
    write_mapped(&mapping, rq + 4 * 4096 + 100, b"from the backend");
    let mut got = [0u8; 16];
    ch.read_recv_queue(4, 100, &mut got).unwrap();
    assert_eq!(&got, b"from the backend");
    // Out-of-range queue access is refused.
    assert!(matches!(
        ch.write_send_queue(3, 0, b"x"),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        ch.read_recv_queue(0, 4090, &mut got),
        Err(Error::Invalid(_))
    ));

    // The send ring: what the application pushes, the backend decodes.
    let req = tiny(41, b"hello backend");
    ch.send(&req).unwrap();
    let sr = g.send_ring_refs();
    let mut back =
        SendBack::new(mapped_window(&mapping, sr.start * 4096, sr.len() * 4096)).unwrap();
    assert_eq!(back.next_request().unwrap(), Some(req));
    assert_eq!(back.next_request().unwrap(), None);
    back.retire_consumed();
    back.push_responses();
    // Two pages of 192-byte slots: 32 slots, all free again.
    assert_eq!(ch.free_send_slots().unwrap(), 32);

    // The event ring: what the backend produces, the application consumes.
    let er = g.event_ring_refs();
    let mut events =
        EventFront::attach(mapped_window(&mapping, er.start * 4096, er.len() * 4096)).unwrap();
    let ev = Event {
        tag: 41,
        body: EventBody::SendDone {
            status: xmx_wire::msg::DoneStatus::Success,
            length: 13,
        },
    };
    events.push_request(&ev).unwrap();
    events.push_requests();
    match ch.wait_event(Some(WAIT), None).unwrap() {
        Wake::Event(got) => assert_eq!(got, ev),
        other => panic!("expected the event, got {other:?}"),
    }
    ch.release_events().unwrap();
    assert_eq!(events.reclaim().unwrap(), 1, "the slot came back");

    // Close: the backend first, then every grant and port.
    drop((ch, back, events));
    fe.close_endpoint(2).unwrap();
    assert!(fake.lock().endpoints.is_empty());
    drop(mapping);
    assert_eq!(fake.lock().count(CtrlKind::EndpointClose), 1);
    assert_eq!(host.state(DOM0).mappings_held, 1);
    let s = host.state(domu);
    assert_eq!(
        (s.grants_active, s.ports_open),
        (1, 1),
        "only the control ring is left"
    );

    fe.shutdown().unwrap();
    drop(fe);
    drop(fake);
    let s = host.state(domu);
    assert_eq!(
        (s.grants_active, s.ports_open, s.grants_mapped_by_others),
        (0, 0, 0)
    );
    assert_eq!(host.state(DOM0).mappings_held, 0);
}

#[test]
fn regions_of_1_300_and_2048_pages_are_mapped_in_one_batch() {
    let host = FrontendTestHost::start();
    let (domu, fake, mut fe) = connected(&host, "g1", 1, FrontendConfig::default());
    let h = fe.open_endpoint(Some(0), Some(small_geometry())).unwrap();
    let ch = channel(h);
    let base = host.state(DOM0).mappings_held;
    let mut windows = Vec::new();
    for (pages, info_pages) in [(1usize, 1usize), (300, 1), (2048, 2)] {
        let length = (pages * 4096 - 7) as u32;
        let h = fe.register_region(0, length).unwrap();
        assert_eq!(h.pages.refs.len(), pages);
        let id = h.region_id;
        let refs = h.pages.refs.clone();
        let w = RegionWindow::from_handoff(h).unwrap();
        assert_eq!(w.len(), length as usize);
        let mapping = {
            let st = fake.lock();
            let r = &st.regions[&(0, id)];
            assert_eq!(r.info_refs.len(), info_pages);
            assert_eq!(r.refs, refs, "the batch is the listed pages in order");
            assert_eq!(r.length, length);
            r.mapping.clone()
        };
        assert_eq!(mapping.len(), pages * 4096);
        // Application to backend, at both ends of the window.
        let head: Vec<u8> = (0..5000u32.min(length)).map(|i| (i % 251) as u8).collect();
        w.write(0, &head).unwrap();
        assert!(
            read_mapped(&mapping, 0, head.len()) == head,
            "head of {pages} pages"
        );
        let tail_at = length as usize - 10;
        w.write(tail_at, b"0123456789").unwrap();
        assert_eq!(read_mapped(&mapping, tail_at, 10), b"0123456789");
        // Backend to application.
        write_mapped(&mapping, length as usize / 2, b"pulled data");
        let mut got = [0u8; 11];
        w.read(length as usize / 2, &mut got).unwrap();
        assert_eq!(&got, b"pulled data");
        // The window ends where the region does.
        assert!(w.write(length as usize - 1, b"xx").is_err());
        windows.push((w, mapping));
    }
    assert_eq!(fake.lock().count(CtrlKind::RegionRegister), 3);
    assert_eq!(host.state(DOM0).mappings_held, base + 1 + 300 + 2048);
    assert!(matches!(fe.register_region(0, 0), Err(Error::Invalid(_))));
    assert!(matches!(
        fe.register_region(0, 97 * 1024 * 1024),
        Err(Error::Invalid(_))
    ));

    for (w, mapping) in windows {
        let id = w.region_id();
        drop(w);
        drop(mapping);
        fe.deregister_region(0, id).unwrap();
        assert!(!fake.lock().regions.contains_key(&(0, id)));
    }
    assert_eq!(host.state(DOM0).mappings_held, base);
    drop(ch);
    fe.close_endpoint(0).unwrap();
    let s = host.state(domu);
    assert_eq!(s.grants_active, 1, "only the control ring is left");
}

/// Registers through the frontend directly, as the daemon does for an application.
struct FrontendRegistrar<'a> {
    fe: &'a mut Frontend,
}

impl Registrar for FrontendRegistrar<'_> {
    fn register(&mut self, endpoint: u8, length: u32) -> xmx_frontend::Result<RegionWindow> {
        RegionWindow::from_handoff(self.fe.register_region(endpoint, length)?)
    }
    fn deregister(&mut self, window: RegionWindow) -> xmx_frontend::Result<()> {
        let (e, id) = (window.endpoint(), window.region_id());
        drop(window);
        self.fe.deregister_region(e, id)
    }
}

#[test]
fn the_registration_cache_saves_register_requests_and_can_be_turned_off() {
    let host = FrontendTestHost::start();
    let (_domu, fake, mut fe) = connected(&host, "g1", 1, FrontendConfig::default());
    let h = fe.open_endpoint(Some(0), Some(small_geometry())).unwrap();
    let _ch = channel(h);
    let buffer: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    let addr = buffer.as_ptr() as usize;

    // MX_RCACHE=1: one registration serves three messages.
    let mut cache = RegionCache::new(true, 8);
    for round in 0..3u8 {
        let mut reg = FrontendRegistrar { fe: &mut fe };
        let lease = cache.acquire(&mut reg, 0, addr, buffer.len()).unwrap();
        let w = cache.window(lease).unwrap();
        let mut msg = buffer.clone();
        msg[0] = round;
        w.write(0, &msg).unwrap();
        let mapping = fake.lock().regions[&(0, w.region_id())].mapping.clone();
        assert!(read_mapped(&mapping, 0, msg.len()) == msg, "round {round}");
        cache.release(&mut reg, lease).unwrap();
    }
    assert_eq!(fake.lock().count(CtrlKind::RegionRegister), 1);
    assert_eq!(fe.ctrl_stats().region_register, 1);
    assert_eq!((cache.stats().hits, cache.stats().misses), (2, 1));
    assert_eq!(fake.lock().regions.len(), 1, "kept registered");

    // Invalidation: the buffer changed; its window goes and the next message registers.
    let mut reg = FrontendRegistrar { fe: &mut fe };
    assert_eq!(cache.invalidate(&mut reg, addr + 10, 1).unwrap(), 1);
    assert_eq!(fake.lock().count(CtrlKind::RegionDeregister), 1);
    assert!(fake.lock().regions.is_empty());
    let lease = cache.acquire(&mut reg, 0, addr, buffer.len()).unwrap();
    cache.release(&mut reg, lease).unwrap();
    assert_eq!(fake.lock().count(CtrlKind::RegionRegister), 2);
    cache.flush(&mut reg).unwrap();

    // MX_RCACHE=0: a registration and a deregistration per message.
    let mut off = RegionCache::new(false, 8);
    for _ in 0..3 {
        let lease = off.acquire(&mut reg, 0, addr, buffer.len()).unwrap();
        off.window(lease).unwrap().write(0, &buffer).unwrap();
        off.release(&mut reg, lease).unwrap();
    }
    assert_eq!(fake.lock().count(CtrlKind::RegionRegister), 5);
    assert_eq!(fake.lock().count(CtrlKind::RegionDeregister), 5);
    assert!(fake.lock().regions.is_empty());
    assert_eq!(fe.ctrl_stats().region_register, 5);
}

#[test]
fn a_backend_that_stops_answering_is_dropped_and_keeps_what_it_was_given_until_then() {
    let host = FrontendTestHost::start();
    let cfg = FrontendConfig {
        ctrl_timeout: Duration::from_millis(300),
        ..FrontendConfig::default()
    };
    let (domu, fake, mut fe) = connected(&host, "g1", 1, cfg);
    fe.take_events();
    fake.lock().hold = true;
    assert!(matches!(
        fe.open_endpoint(Some(1), Some(small_geometry())),
        Err(Error::Timeout(_))
    ));
    assert_eq!(fe.ctrl_stats().timeouts, 1);
    // The frontend closed the connection; the backend let go (it follows a closing
    // frontend), and only then were the pages of the unanswered open ended.
    assert_eq!(fe.state(), XenbusState::Closed);
    assert_eq!(fe.take_events(), vec![FrontendEvent::Disconnected]);
    fake.close();
    let s = host.state(domu);
    assert_eq!((s.grants_active, s.ports_open), (0, 0));
    assert_eq!(host.state(DOM0).mappings_held, 0);

    // A backend that answers again: the device comes back and the open works.
    let fake = FakeBackend::start(&host, domu);
    fe.wait_connected(WAIT).unwrap();
    let h = fe.open_endpoint(Some(1), Some(small_geometry())).unwrap();
    assert_eq!(h.session_id, 0x5e55_0001);
    assert_eq!(fake.lock().endpoints[&1].refs, h.pages.refs);
    assert!(!fake.lock().endpoints[&1].quiet_send_done, "not asked for");
    assert_eq!(fake.lock().count(CtrlKind::EndpointOpen), 1);
    drop(h);
    // The frontend closes while its backend still runs.
    drop(fe);
    drop(fake);
}

/// A backend that leaves while a control request waits (it disconnected the device, or it
/// stopped) will not answer: the request ends when the frontend sees the backend's state
/// leave Connected, with NotConnected, instead of waiting out its timeout; the frontend then
/// follows the closing backend and connects to the next one.
#[test]
fn a_request_waiting_on_a_backend_that_leaves_ends_when_it_leaves() {
    let host = FrontendTestHost::start();
    let cfg = FrontendConfig {
        // Long enough that only the backend's leaving can end the request.
        ctrl_timeout: Duration::from_secs(60),
        ..FrontendConfig::default()
    };
    let (domu, fake, mut fe) = connected(&host, "g1", 1, cfg);
    fe.take_events();
    fake.lock().hold = true;
    let closer = std::thread::spawn(move || {
        let deadline = Instant::now() + WAIT;
        while !fake.lock().held_pending {
            assert!(
                Instant::now() < deadline,
                "the request never reached the backend"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        fake.close();
    });
    let result = fe.open_endpoint(Some(1), Some(small_geometry()));
    closer.join().unwrap();
    assert!(matches!(result, Err(Error::NotConnected(_))), "{result:?}");
    let stats = fe.ctrl_stats();
    assert_eq!((stats.backend_gone, stats.timeouts), (1, 0));
    pump_until(&mut fe, "the frontend restarts", |f| {
        f.state() == XenbusState::Initialising
    });
    assert_eq!(host.state(DOM0).mappings_held, 0);

    let fake = FakeBackend::start(&host, domu);
    fe.wait_connected(WAIT).unwrap();
    let h = fe.open_endpoint(Some(1), Some(small_geometry())).unwrap();
    assert_eq!(fake.lock().endpoints[&1].refs, h.pages.refs);
    drop(h);
    drop(fe);
    drop(fake);
    let s = host.state(domu);
    assert_eq!((s.grants_active, s.ports_open), (0, 0));
}

#[test]
fn a_closing_backend_is_followed_and_endpoints_come_back_over_new_grants() {
    let host = FrontendTestHost::start();
    let (domu, fake, mut fe) = connected(&host, "g1", 1, FrontendConfig::default());
    let h = fe
        .open_endpoint_with(Some(0), Some(small_geometry()), true)
        .unwrap();
    assert!(fake.lock().endpoints[&0].quiet_send_done);
    let old_refs = h.pages.refs.clone();
    let mut ch = channel(h);
    fe.take_events();

    fake.close();
    pump_until(&mut fe, "the frontend restarts", |f| {
        f.state() == XenbusState::Initialising
    });
    assert_eq!(fe.take_events(), vec![FrontendEvent::Disconnected]);
    assert!(!fe.is_connected());
    assert_eq!(host.state(DOM0).mappings_held, 0);
    // The application notices: its port was closed by the backend.
    match ch.wait_event(Some(WAIT), None).unwrap() {
        Wake::Disconnected => {}
        other => panic!("expected a disconnection, got {other:?}"),
    }
    assert!(matches!(
        fe.register_region(0, 4096),
        Err(Error::NotConnected(_))
    ));

    let fake = FakeBackend::start(&host, domu);
    fe.wait_connected(WAIT).unwrap();
    let events = fe.take_events();
    assert!(events.contains(&FrontendEvent::Connected));
    assert!(events.contains(&FrontendEvent::EndpointReopened { endpoint: 0 }));
    let mut reopened = fe.take_reopened();
    assert_eq!(reopened.len(), 1);
    let h = reopened.pop().unwrap();
    assert_eq!((h.endpoint, h.generation), (0, 1));
    assert_ne!(h.pages.refs, old_refs, "new grants");
    assert_eq!(fake.lock().endpoints[&0].refs, h.pages.refs);
    assert!(
        fake.lock().endpoints[&0].quiet_send_done,
        "re-opened as the application opened it"
    );
    assert_eq!(
        fe.retired_count(),
        1,
        "the old pages wait for the application"
    );
    let g = small_geometry().total();
    assert_eq!(host.state(domu).grants_active, 1 + 2 * g);

    ch.remap(h).unwrap();
    assert_eq!(ch.generation(), 1);
    fe.release_retired(0, 1);
    assert_eq!(fe.retired_count(), 0);
    assert_eq!(host.state(domu).grants_active, 1 + g);
    ch.send(&tiny(1, b"after")).unwrap();
    let mapping = fake.lock().endpoints[&0].mapping.clone();
    let mut back = SendBack::new(mapped_window(&mapping, 0, 4096)).unwrap();
    assert_eq!(back.next_request().unwrap(), Some(tiny(1, b"after")));
    drop((back, mapping, ch));
    drop(fe);
    drop(fake);
    let s = host.state(domu);
    assert_eq!((s.grants_active, s.ports_open), (0, 0));
}

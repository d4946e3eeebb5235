//! The frontend against the real dom0 backend (`xmx_backend`), on the simulated platform:
//! the handshake and its restarts, the data path through handed-over endpoints and
//! region windows, and suspend/resume.

mod common;

use common::*;
use xmx_backend::admin::{BackdRequest, PeerSpec};
use xmx_backend::service::{Backend, BackendConfig, BackendThread};
use xmx_frontend::{EndpointChannel, FrontendConfig, FrontendEvent, Mode, RegionWindow, Wake};
use xmx_hv::{Platform, DOM0, XBT_NULL};
use xmx_wire::msg::{
    DoneStatus, EndpointPages, Event, EventBody, InlineData, InlineMsg, MediumSend, MsgInfo, Pull,
    QueueSlots, RndvSend, Route, SendOp, SendRequest,
};
use xmx_wire::xenbus::{self, keys, XenbusState};

fn start_backend(host: &FrontendTestHost) -> BackendThread {
    let dom0 = host.attach(DOM0);
    let cfg = BackendConfig {
        host_name: "testhost".into(),
        ..BackendConfig::default()
    };
    Backend::new(&dom0, None, cfg).unwrap().spawn().unwrap()
}

/// Peer table: guest `last` is peer `index`, all in cluster 1.
fn set_peers(backend: &BackendThread, entries: &[(u16, u8)]) {
    let peers = entries
        .iter()
        .map(|&(index, last)| PeerSpec {
            index,
            mac: guest_mac(last).to_string(),
            hostname: format!("g{last}:0"),
            cluster: 1,
        })
        .collect();
    backend
        .control()
        .call(BackdRequest::SetPeers { peers })
        .into_result()
        .unwrap();
}

fn geometry() -> EndpointPages {
    EndpointPages {
        send_ring: 1,
        event_ring: 2,
        send_queue: 8,
        recv_queue: 8,
    }
}

fn next_event(ch: &mut EndpointChannel) -> Event {
    match ch.wait_event(Some(WAIT), None).unwrap() {
        Wake::Event(ev) => ev,
        other => panic!("expected an event, got {other:?}"),
    }
}

fn expect_done(ch: &mut EndpointChannel, tag: u32, length: u32) {
    let ev = next_event(ch);
    assert_eq!(ev.tag, tag);
    assert_eq!(
        ev.body,
        EventBody::SendDone {
            status: DoneStatus::Success,
            length
        }
    );
    ch.release_events().unwrap();
}

fn info(seqnum: u16, match_info: u64) -> MsgInfo {
    MsgInfo {
        seqnum,
        piggyack: 0,
        match_info,
    }
}

fn tiny(tag: u32, to: Route, seqnum: u16, bytes: &[u8]) -> SendRequest {
    SendRequest {
        tag,
        route: to,
        op: SendOp::Tiny(InlineMsg {
            info: info(seqnum, 0x77),
            data: InlineData::new(bytes).unwrap(),
        }),
    }
}

#[test]
fn handshake_publishes_reads_the_offer_and_survives_a_backend_restart() {
    let host = FrontendTestHost::start();
    let backend = start_backend(&host);
    let domu = host.guest("g1", 1);
    let mut fe = host.frontend(domu, FrontendConfig::default());
    let info = fe.wait_connected(WAIT).unwrap().clone();
    assert_eq!(info.mac, guest_mac(1));
    assert_eq!(info.hostname, "g1:0");
    assert_eq!(info.cluster, 1);
    assert_eq!((info.max_endpoints, info.max_regions), (32, 256));
    assert_eq!(info.backend_id, DOM0);

    let xs = host.attach(DOM0).xenstore().unwrap();
    let front = |key: &str| {
        String::from_utf8(
            xs.read(
                XBT_NULL,
                &xenbus::key_path(&xenbus::frontend_dir(domu, 0), key),
            )
            .unwrap(),
        )
        .unwrap()
    };
    assert_eq!(front(keys::STATE), "4");
    assert_eq!(front(keys::PROTOCOL_VERSION), "1");
    assert_eq!(front(keys::FEATURE_RCACHE), "1");
    let ring_ref: u32 = front(keys::RING_REF).parse().unwrap();
    let port: u32 = front(keys::EVENT_CHANNEL).parse().unwrap();
    assert!(ring_ref >= 8, "refs below 8 are reserved");
    assert!(port > 0);
    assert_eq!(
        host.state(DOM0).mappings_held,
        1,
        "the backend maps the control ring"
    );
    assert_eq!(host.state(domu).grants_mapped_by_others, 1);

    // The backend goes away (leaving its device Closing): the frontend follows it down
    // and waits for a backend to say Closed or InitWait before starting over.
    fe.take_events();
    backend.stop().unwrap();
    pump_until(&mut fe, "the frontend closes", |f| {
        f.state() == XenbusState::Closed
    });
    assert_eq!(fe.backend_state(), Some(XenbusState::Closing));
    assert_eq!(fe.take_events(), vec![FrontendEvent::Disconnected]);
    let s = host.state(domu);
    assert_eq!((s.grants_active, s.ports_open), (0, 0));
    assert_eq!(host.state(DOM0).mappings_held, 0);

    // It comes back: the frontend connects again on its own.
    let backend = start_backend(&host);
    fe.wait_connected(WAIT).unwrap();
    assert_eq!(host.state(DOM0).mappings_held, 1);
    let new_ref: u32 = front(keys::RING_REF).parse().unwrap();
    assert!(new_ref >= 8);

    // The frontend closes: Closing, the backend lets go, Closed, nothing left.
    fe.shutdown().unwrap();
    assert_eq!(fe.state(), XenbusState::Closed);
    assert_eq!(front(keys::STATE), "6");
    let s = host.state(domu);
    assert_eq!((s.grants_active, s.ports_open), (0, 0));
    assert_eq!(host.state(DOM0).mappings_held, 0);
    drop(fe);
    drop(backend);
}

#[test]
fn messages_of_every_class_cross_between_guests_through_handed_over_memory() {
    let host = FrontendTestHost::start();
    let backend = start_backend(&host);
    set_peers(&backend, &[(0, 1), (1, 2)]);
    let a = host.guest("a", 1);
    let b = host.guest("b", 2);
    let mut fa = host.frontend(a, FrontendConfig::default());
    let mut fb = host.frontend(b, FrontendConfig::default());
    fa.wait_connected(WAIT).unwrap();
    fb.wait_connected(WAIT).unwrap();
    let mut ca = channel(fa.open_endpoint(Some(0), Some(geometry())).unwrap());
    let mut cb = channel(fb.open_endpoint(Some(0), Some(geometry())).unwrap());
    assert_ne!(ca.session_id(), 0);
    let to_b = Route {
        peer_index: 1,
        endpoint: 0,
        session_id: cb.session_id(),
    };

    // TINY, inline in the rings.
    ca.send(&tiny(10, to_b, 1, b"tiny from a")).unwrap();
    let ev = next_event(&mut cb);
    match ev.body {
        EventBody::RecvTiny { from, msg } => {
            assert_eq!((from.peer_index, from.endpoint), (0, 0));
            assert_eq!(msg.data.as_slice(), b"tiny from a");
        }
        other => panic!("expected a TINY, got {other:?}"),
    }
    cb.release_events().unwrap();
    expect_done(&mut ca, 10, 11);

    // MEDIUM: 10000 bytes through the send queue and the receive queue.
    let message: Vec<u8> = (0..10000u32).map(|i| (i * 7 + 3) as u8).collect();
    let slots = [5u16, 2, 7];
    for (i, &slot) in slots.iter().enumerate() {
        let chunk = &message[i * 4096..((i + 1) * 4096).min(message.len())];
        ca.write_send_queue(slot, 0, chunk).unwrap();
    }
    ca.send(&SendRequest {
        tag: 11,
        route: to_b,
        op: SendOp::Medium(MediumSend {
            info: info(2, 42),
            length: message.len() as u32,
            sendq_slots: QueueSlots::new(&slots).unwrap(),
        }),
    })
    .unwrap();
    let mut received = vec![0u8; message.len()];
    for _ in 0..slots.len() {
        let ev = next_event(&mut cb);
        let EventBody::RecvMedium { frag, .. } = ev.body else {
            panic!("expected a MEDIUM fragment, got {:?}", ev.body);
        };
        let start = usize::from(frag.frag_seqnum) * 4096;
        let len = usize::from(frag.frag_length);
        cb.read_recv_queue(frag.recvq_slot, 0, &mut received[start..start + len])
            .unwrap();
    }
    cb.release_events().unwrap();
    assert!(received == message, "the MEDIUM message arrived intact");
    expect_done(&mut ca, 11, message.len() as u32);

    // LARGE: copied into a's window, pulled by b's backend into b's window.
    let len = 300 * 1024u32;
    let wa = RegionWindow::from_handoff(fa.register_region(0, len).unwrap()).unwrap();
    let wb = RegionWindow::from_handoff(fb.register_region(0, len).unwrap()).unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    wa.write(0, &data).unwrap();
    ca.set_fill_mark(wa.region_id(), true);
    ca.send(&SendRequest {
        tag: 12,
        route: to_b,
        op: SendOp::Rndv(RndvSend {
            info: info(3, 9),
            length: len,
            region_id: wa.region_id(),
            region_seqnum: 0,
            region_offset: 0,
        }),
    })
    .unwrap();
    let ev = next_event(&mut cb);
    let EventBody::RecvRndv { from, rndv } = ev.body else {
        panic!("expected a RNDV, got {:?}", ev.body);
    };
    cb.release_events().unwrap();
    cb.send(&SendRequest {
        tag: 13,
        route: Route {
            peer_index: from.peer_index,
            endpoint: from.endpoint,
            session_id: ca.session_id(),
        },
        op: SendOp::Pull(Pull {
            length: len,
            local_region: wb.region_id(),
            local_offset: 0,
            remote_region: rndv.region_id,
            remote_region_seqnum: rndv.region_seqnum,
            remote_offset: rndv.region_offset,
        }),
    })
    .unwrap();
    // 300 KiB: the backend may tell of the first 256 KiB before the completion.
    let mut ev = next_event(&mut cb);
    if let EventBody::PullProgress { length } = ev.body {
        assert_eq!((ev.tag, length), (13, 256 << 10));
        ev = next_event(&mut cb);
    }
    assert_eq!(ev.tag, 13);
    assert_eq!(
        ev.body,
        EventBody::PullDone {
            status: DoneStatus::Success,
            length: len
        }
    );
    cb.release_events().unwrap();
    let mut got = vec![0u8; len as usize];
    wb.read(0, &mut got).unwrap();
    assert!(got == data, "the LARGE message arrived intact");

    // Everything goes back.
    drop((wa, wb));
    fa.deregister_region(0, 0).unwrap();
    fb.deregister_region(0, 0).unwrap();
    drop((ca, cb));
    fa.close_endpoint(0).unwrap();
    fb.close_endpoint(0).unwrap();
    assert_eq!(host.state(DOM0).mappings_held, 2, "the two control rings");
    drop((fa, fb));
    assert_eq!(host.state(DOM0).mappings_held, 0);
    for g in [a, b] {
        let s = host.state(g);
        assert_eq!((s.grants_active, s.ports_open), (0, 0));
    }
}

#[test]
fn suspend_closes_the_device_and_resume_reopens_the_endpoints_in_their_sessions() {
    let host = FrontendTestHost::start();
    let backend = start_backend(&host);
    set_peers(&backend, &[(0, 1)]);
    let g = host.guest("g1", 1);
    let mut fe = host.frontend(g, FrontendConfig::default());
    fe.wait_connected(WAIT).unwrap();
    let mut c0 = channel(fe.open_endpoint(Some(0), Some(geometry())).unwrap());
    let mut c1 = channel(fe.open_endpoint(Some(1), Some(geometry())).unwrap());
    let old_sessions = (c0.session_id(), c1.session_id());
    fe.take_events();

    host.admin.suspend(g).unwrap();
    pump_until(&mut fe, "the device is down", |f| {
        f.mode() == Mode::Suspended && f.state() == XenbusState::Closed
    });
    let events = fe.take_events();
    assert!(events.contains(&FrontendEvent::Suspended), "{events:?}");
    assert!(events.contains(&FrontendEvent::Disconnected), "{events:?}");
    assert_eq!(fe.backend_state(), Some(XenbusState::Closed));
    assert_eq!(
        host.state(DOM0).mappings_held,
        0,
        "the backend let everything go"
    );
    assert_eq!(host.state(DOM0).ports_open, 0);
    // The suspend request was acknowledged as Linux guests do.
    let xs = host.attach(DOM0).xenstore().unwrap();
    let ack = xs
        .read(XBT_NULL, &format!("/local/domain/{g}/control/shutdown"))
        .unwrap();
    assert!(ack.is_empty());
    // The applications see their endpoints go.
    assert!(matches!(
        c0.wait_event(Some(WAIT), None).unwrap(),
        Wake::Disconnected
    ));
    assert!(
        !fe.probe_running(),
        "a suspended domain cannot allocate ports"
    );

    host.admin.resume(g).unwrap();
    assert!(fe.probe_running());
    fe.resume().unwrap();
    fe.wait_connected(WAIT).unwrap();
    let events = fe.take_events();
    assert!(events.contains(&FrontendEvent::Resumed), "{events:?}");
    assert!(events.contains(&FrontendEvent::EndpointReopened { endpoint: 0 }));
    assert!(events.contains(&FrontendEvent::EndpointReopened { endpoint: 1 }));
    for h in fe.take_reopened() {
        assert_eq!(h.generation, 1);
        let (ch, old) = match h.endpoint {
            0 => (&mut c0, old_sessions.0),
            _ => (&mut c1, old_sessions.1),
        };
        // Peers keep reaching it: a session that changed under the library would
        // leave the acks of its messages in flight addressed to the old one.
        assert_eq!(
            h.session_id, old,
            "the re-opened endpoint keeps its session"
        );
        let endpoint = h.endpoint;
        ch.remap(h).unwrap();
        fe.release_retired(endpoint, 1);
    }
    assert_eq!(fe.retired_count(), 0);
    let pages = geometry().total();
    assert_eq!(host.state(g).grants_active, 1 + 2 * pages);

    // The re-opened endpoints carry messages: endpoint 0 to endpoint 1 of the same guest.
    let to_1 = Route {
        peer_index: 0,
        endpoint: 1,
        session_id: c1.session_id(),
    };
    c0.send(&tiny(5, to_1, 1, b"after resume")).unwrap();
    match next_event(&mut c1).body {
        EventBody::RecvTiny { msg, .. } => assert_eq!(msg.data.as_slice(), b"after resume"),
        other => panic!("expected a TINY, got {other:?}"),
    }
    c1.release_events().unwrap();
    expect_done(&mut c0, 5, 12);
    drop((c0, c1));
    drop(fe);
    let s = host.state(g);
    assert_eq!((s.grants_active, s.ports_open), (0, 0));
    drop(backend);
}

#[test]
fn a_migration_waits_until_the_frontend_has_suspended_before_the_last_round() {
    use xmx_hv::sim::migrate::{migrate_domain, MigrateOptions};
    let host = FrontendTestHost::start();
    let backend = start_backend(&host);
    set_peers(&backend, &[(0, 1)]);
    let g = host.guest("g1", 1);
    let mut fe = host.frontend(g, FrontendConfig::default());
    fe.wait_connected(WAIT).unwrap();
    let _c0 = channel(fe.open_endpoint(Some(0), Some(geometry())).unwrap());
    let xs = host.attach(DOM0).xenstore().unwrap();
    assert_eq!(
        xs.read(
            XBT_NULL,
            &format!("/local/domain/{g}/control/feature-suspend")
        )
        .unwrap(),
        b"1"
    );
    assert!(host.state(DOM0).mappings_held > 0);
    let dest = FrontendTestHost::start();
    let work = tempfile::tempdir().unwrap();
    let options = MigrateOptions {
        work_dir: Some(work.path().to_path_buf()),
        ..MigrateOptions::default()
    };
    let report = std::thread::scope(|s| {
        let migration = s.spawn(|| migrate_domain(&host.admin, &dest.admin, g, &options));
        let request = format!("/local/domain/{g}/control/shutdown");
        eventually("the suspend request", || {
            xs.read(XBT_NULL, &request).is_ok_and(|v| v == b"suspend")
        });
        // Nobody serves the frontend yet: the migration must be waiting for it. (A
        // window in which nothing may happen; no event says that nothing happened.)
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(!migration.is_finished(), "the migration did not wait");
        pump_until(&mut fe, "the frontend suspended", |f| {
            f.mode() == Mode::Suspended && f.state() == XenbusState::Closed
        });
        migration.join().unwrap()
    })
    .unwrap();
    let last = report.rounds.last().unwrap();
    assert!(!last.live);
    // The backend had let go of every page of the guest before the last round.
    assert_eq!(last.grants_still_mapped, 0);
    assert_eq!(host.state(DOM0).mappings_held, 0);
}

#[test]
fn a_migrated_frontend_follows_its_domain_and_reopens_its_endpoints_on_the_new_host() {
    use std::collections::BTreeMap;
    use xmx_backend::xenbus::toolstack::{self, DeviceRecord};
    use xmx_hv::sim::migrate::{MigrateOptions, Migration};
    let src = FrontendTestHost::start();
    let src_backend = start_backend(&src);
    set_peers(&src_backend, &[(0, 1)]);
    let g = src.guest("g1", 1);
    let mut fe = src.frontend(g, FrontendConfig::default());
    fe.wait_connected(WAIT).unwrap();
    let mut c0 = channel(fe.open_endpoint(Some(0), Some(geometry())).unwrap());
    let mut c1 = channel(fe.open_endpoint(Some(1), Some(geometry())).unwrap());
    let sessions = BTreeMap::from([(0, c0.session_id()), (1, c1.session_id())]);

    let dst = FrontendTestHost::start();
    // So that the guest gets another domid there.
    dst.admin.create("other", None).unwrap();
    let dst_backend = start_backend(&dst);
    set_peers(&dst_backend, &[(0, 1)]);
    let work = tempfile::tempdir().unwrap();
    let options = MigrateOptions {
        work_dir: Some(work.path().to_path_buf()),
        ..MigrateOptions::default()
    };
    let mut m = Migration::begin_with(&src.admin, &dst.admin, g, &options).unwrap();
    m.live_round().unwrap();
    let m = std::thread::scope(|s| {
        let suspended = s.spawn(move || m.suspend().map(|()| m));
        pump_until(&mut fe, "the frontend suspended", |f| {
            f.mode() == Mode::Suspended && f.state() == XenbusState::Closed
        });
        suspended.join().unwrap()
    })
    .unwrap();
    // The toolstack carries the device to the new host, its endpoints' sessions with it.
    let src_xs0 = src.attach(DOM0).xenstore().unwrap();
    let record = DeviceRecord::read(src_xs0.as_ref(), DOM0, g, 0).unwrap();
    assert_eq!(record.sessions, sessions);
    assert_eq!(record.spec.mac, guest_mac(1));
    let (report, frozen) = m.finish_frozen().unwrap();
    frozen.thaw();
    let d = report.dest_domid;
    assert_ne!(d, g);
    // The source host forgot the guest.
    assert_eq!(src.state(DOM0).mappings_held, 0);
    assert!(src.admin.state(g).is_err());

    assert!(!fe.probe_running(), "the source domain is gone");
    assert!(fe.follow_move().unwrap());
    assert!(!fe.follow_move().unwrap(), "it moved once");
    assert_eq!(fe.domid(), d);
    assert!(fe.probe_running());
    fe.resume().unwrap();
    // The new host's toolstack creates the device (same identity, new domid).
    let xs0 = dst.attach(DOM0).xenstore().unwrap();
    // The new host's peer service may create it first, without the sessions (it adopts
    // a guest it sees arrive): the sessions are then recorded in it.
    let spec = toolstack::DeviceSpec {
        domu: d,
        ..record.spec.clone()
    };
    toolstack::attach(xs0.as_ref(), DOM0, &spec).unwrap();
    toolstack::attach_moved(xs0.as_ref(), DOM0, d, &record).unwrap();
    let mut other = record.clone();
    other.spec.mac = guest_mac(2);
    assert!(matches!(
        toolstack::attach_moved(xs0.as_ref(), DOM0, d, &other),
        Err(xmx_hv::Error::Exists(_))
    ));
    let info = fe.wait_connected(WAIT).unwrap().clone();
    assert_eq!(info.mac, guest_mac(1));
    assert_eq!(
        xs0.read(
            XBT_NULL,
            &format!("/local/domain/{d}/control/feature-suspend")
        )
        .unwrap(),
        b"1"
    );
    let reopened = fe.take_reopened();
    assert_eq!(reopened.len(), 2);
    for h in reopened {
        assert_eq!(h.generation, 1);
        // Peers keep reaching it: the new host's backend resumed the recorded session.
        assert_eq!(Some(&h.session_id), sessions.get(&h.endpoint));
        let endpoint = h.endpoint;
        let ch = if endpoint == 0 { &mut c0 } else { &mut c1 };
        ch.remap(h).unwrap();
        fe.release_retired(endpoint, 1);
    }
    assert_eq!(fe.retired_count(), 0);
    // Only the re-opened endpoints' grants and the control ring are left: the pages
    // that moved were adopted and ended on the new host.
    let pages = geometry().total();
    assert_eq!(dst.state(d).grants_active, 1 + 2 * pages);

    // The new host's backend carries the endpoints' messages.
    let to_1 = Route {
        peer_index: 0,
        endpoint: 1,
        session_id: c1.session_id(),
    };
    c0.send(&tiny(9, to_1, 1, b"after the move")).unwrap();
    match next_event(&mut c1).body {
        EventBody::RecvTiny { msg, .. } => assert_eq!(msg.data.as_slice(), b"after the move"),
        other => panic!("expected a TINY, got {other:?}"),
    }
    c1.release_events().unwrap();
    expect_done(&mut c0, 9, 14);
    drop((c0, c1));
    drop(fe);
    let s = dst.state(d);
    assert_eq!((s.grants_active, s.ports_open), (0, 0));
    drop((src_backend, dst_backend));
}

#[test]
fn a_failed_migration_resumes_the_frontend_on_its_host_in_its_sessions() {
    use xmx_hv::sim::migrate::{migrate_domain, MigrateOptions};
    let host = FrontendTestHost::start();
    let backend = start_backend(&host);
    set_peers(&backend, &[(0, 1)]);
    let g = host.guest("g1", 1);
    let mut fe = host.frontend(g, FrontendConfig::default());
    fe.wait_connected(WAIT).unwrap();
    let mut c0 = channel(fe.open_endpoint(Some(0), Some(geometry())).unwrap());
    let mut c1 = channel(fe.open_endpoint(Some(1), Some(geometry())).unwrap());
    let sessions = (c0.session_id(), c1.session_id());
    // Its grant table is too small for the guest's refs: the last round fails.
    let dest = FrontendTestHost::start_with(xmx_simhv::SimhvConfig {
        gnttab_entries: 8,
        ..xmx_simhv::SimhvConfig::default()
    });
    let work = tempfile::tempdir().unwrap();
    let options = MigrateOptions {
        work_dir: Some(work.path().to_path_buf()),
        ..MigrateOptions::default()
    };
    let failed = std::thread::scope(|s| {
        let migration = s.spawn(|| migrate_domain(&host.admin, &dest.admin, g, &options));
        pump_until(&mut fe, "the frontend suspended", |f| {
            f.mode() == Mode::Suspended && f.state() == XenbusState::Closed
        });
        migration.join().unwrap()
    });
    assert!(
        matches!(failed, Err(xmx_hv::Error::Invalid(_))),
        "{failed:?}"
    );
    // Rolled back: the domain runs where it was, nothing moved.
    assert!(fe.probe_running());
    assert!(!fe.follow_move().unwrap());
    fe.resume().unwrap();
    fe.wait_connected(WAIT).unwrap();
    for h in fe.take_reopened() {
        let endpoint = h.endpoint;
        let (ch, old) = match endpoint {
            0 => (&mut c0, sessions.0),
            _ => (&mut c1, sessions.1),
        };
        assert_eq!(h.session_id, old, "endpoint {endpoint} keeps its session");
        ch.remap(h).unwrap();
        fe.release_retired(endpoint, 1);
    }
    let to_1 = Route {
        peer_index: 0,
        endpoint: 1,
        session_id: c1.session_id(),
    };
    c0.send(&tiny(7, to_1, 1, b"still here")).unwrap();
    match next_event(&mut c1).body {
        EventBody::RecvTiny { msg, .. } => assert_eq!(msg.data.as_slice(), b"still here"),
        other => panic!("expected a TINY, got {other:?}"),
    }
    c1.release_events().unwrap();
    expect_done(&mut c0, 7, 10);
    assert_eq!(
        dest.admin.list().unwrap().len(),
        1,
        "only dom0 is left there"
    );
}

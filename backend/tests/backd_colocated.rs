//! Two guests of one backend talk through their rings; the engine delivers locally.

mod backd_util;

use backd_util::{guest_mac, small_endpoint, BackdTestHost, FakeGuest, FakeGuestEndpoint};
use xmx_backend::admin::{BackdRequest, CountersReport, PeerSpec};
use xmx_backend::service::{BackendThread, GuestQuotas};
use xmx_wire::msg::{
    fill_marks, CtrlStatus, DoneStatus, EventBody, InlineData, InlineMsg, MediumSend, MsgInfo,
    Pull, QueueSlots, RndvSend, Route, SendOp, SendRequest,
};

fn peers(backend: &BackendThread, entries: &[(u16, u8, u32)]) {
    let peers = entries
        .iter()
        .map(|&(index, last, cluster)| PeerSpec {
            index,
            mac: guest_mac(last).to_string(),
            hostname: format!("g{last}:0"),
            cluster,
        })
        .collect();
    let r = backend
        .control()
        .call(BackdRequest::SetPeers { peers })
        .into_result()
        .unwrap();
    assert_eq!(r["peers"], entries.len());
}

/// Two connected guests with endpoint 0 open each, in the peer table as 0 and 1.
fn pair(
    host: &BackdTestHost,
    backend: &BackendThread,
) -> (FakeGuest, FakeGuestEndpoint, FakeGuest, FakeGuestEndpoint) {
    peers(backend, &[(0, 1, 1), (1, 2, 1)]);
    let mut a = host.guest("a", 1, 1);
    let mut b = host.guest("b", 2, 1);
    a.connect();
    b.connect();
    let (rsp, ea) = a.open_endpoint(0, small_endpoint(8));
    assert_eq!(rsp.status, CtrlStatus::Ok);
    let (rsp, eb) = b.open_endpoint(0, small_endpoint(8));
    assert_eq!(rsp.status, CtrlStatus::Ok);
    (a, ea.unwrap(), b, eb.unwrap())
}

fn info(seqnum: u16, match_info: u64) -> MsgInfo {
    MsgInfo {
        seqnum,
        piggyack: 0,
        match_info,
    }
}

/// The next event is the successful completion of send `tag` (of `length` bytes if given).
fn expect_done(g: &FakeGuest, ep: &mut FakeGuestEndpoint, tag: u32, length: Option<u32>) {
    let ev = g.next_event(ep);
    assert_eq!(ev.tag, tag);
    match ev.body {
        EventBody::SendDone {
            status: DoneStatus::Success,
            length: l,
        } => {
            if let Some(want) = length {
                assert_eq!(l, want);
            }
        }
        other => panic!("expected the completion of {tag}, got {other:?}"),
    }
    g.retire_events(ep);
}

#[test]
fn tiny_and_medium_messages_cross_between_colocated_guests() {
    let host = BackdTestHost::start();
    let backend = host.start_backend(GuestQuotas::default());
    let (a, mut ea, b, mut eb) = pair(&host, &backend);
    let to_b = Route {
        peer_index: 1,
        endpoint: 0,
        session_id: eb.session,
    };

    // TINY: inline both ways.
    let payload = b"hello from a, tiny";
    a.send(
        &mut ea,
        SendRequest {
            tag: 10,
            route: to_b,
            op: SendOp::Tiny(InlineMsg {
                info: info(1, 0xfeed_0000_0000_0001),
                data: InlineData::new(payload).unwrap(),
            }),
        },
    );
    let ev = b.next_event(&mut eb);
    match ev.body {
        EventBody::RecvTiny { from, msg } => {
            assert_eq!(from.peer_index, 0, "a is peer 0");
            assert_eq!(from.endpoint, 0);
            assert_eq!(msg.data.as_slice(), payload);
            assert_eq!(msg.info, info(1, 0xfeed_0000_0000_0001));
        }
        other => panic!("expected a TINY, got {other:?}"),
    }
    b.retire_events(&mut eb);
    expect_done(&a, &mut ea, 10, Some(payload.len() as u32));

    // MEDIUM: 10000 bytes in three send-queue slots (given out of order on purpose).
    let message: Vec<u8> = (0..10000u32).map(|i| (i * 7 + 3) as u8).collect();
    let slots = [5u16, 2, 7];
    for (i, &slot) in slots.iter().enumerate() {
        let chunk = &message[i * 4096..((i + 1) * 4096).min(message.len())];
        assert!(ea.sendq.write_bytes(usize::from(slot) * 4096, chunk));
    }
    a.send(
        &mut ea,
        SendRequest {
            tag: 11,
            route: to_b,
            op: SendOp::Medium(MediumSend {
                info: info(2, 42),
                length: message.len() as u32,
                sendq_slots: QueueSlots::new(&slots).unwrap(),
            }),
        },
    );
    let mut received = vec![0u8; message.len()];
    let mut frags = 0;
    while frags < slots.len() {
        let ev = b.next_event(&mut eb);
        let EventBody::RecvMedium { from, frag } = ev.body else {
            panic!("expected a MEDIUM fragment, got {:?}", ev.body);
        };
        assert_eq!(from.peer_index, 0);
        assert_eq!(frag.length, message.len() as u32);
        assert_eq!(frag.info.match_info, 42);
        let start = usize::from(frag.frag_seqnum) * 4096;
        let len = usize::from(frag.frag_length);
        // Read the fragment out of the receive queue before its event slot goes back.
        assert!(eb.recvq.read_bytes(
            usize::from(frag.recvq_slot) * 4096,
            &mut received[start..start + len]
        ));
        frags += 1;
    }
    b.retire_events(&mut eb);
    assert_eq!(received, message);
    expect_done(&a, &mut ea, 11, Some(message.len() as u32));

    // The counters saw it all, without the wire.
    let report: CountersReport = serde_json::from_value(
        backend
            .control()
            .call(BackdRequest::Counters)
            .into_result()
            .unwrap(),
    )
    .unwrap();
    let ga = report.guests.iter().find(|g| g.domid == a.domid).unwrap();
    let nic = ga.nic.as_ref().unwrap();
    assert_eq!(nic.local_frames, 1 + 3);
    assert_eq!(nic.tx_frames, 0);
    assert_eq!(ga.endpoints[0].send_requests, 2);
    assert_eq!(ga.endpoints[0].events, 2);
    let gb = report.guests.iter().find(|g| g.domid == b.domid).unwrap();
    assert_eq!(gb.nic.as_ref().unwrap().rx_frames, 4);
    assert_eq!(gb.endpoints[0].events, 4);
    assert_eq!(report.backend.tx_without_link, 0);
}

#[test]
fn a_large_message_is_pulled_between_registered_regions() {
    let host = BackdTestHost::start();
    let backend = host.start_backend(GuestQuotas::default());
    let (mut a, mut ea, mut b, mut eb) = pair(&host, &backend);
    // 100 KiB, starting 300 bytes into the sender's first page and 1000 into the receiver's.
    let len = 100 * 1024u32;
    let (rsp, src) = a.register_region(0, 3, 300, len);
    assert_eq!(rsp.status, CtrlStatus::Ok);
    let (rsp, dst) = b.register_region(0, 4, 1000, len);
    assert_eq!(rsp.status, CtrlStatus::Ok);
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    assert!(src.mem.write_bytes(300, &data));
    fill_marks::write(ea.send.mem(), 3, true);

    a.send(
        &mut ea,
        SendRequest {
            tag: 20,
            route: Route {
                peer_index: 1,
                endpoint: 0,
                session_id: eb.session,
            },
            op: SendOp::Rndv(RndvSend {
                info: info(1, 7),
                length: len,
                region_id: 3,
                region_seqnum: 0,
                region_offset: 0,
            }),
        },
    );
    let ev = b.next_event(&mut eb);
    let EventBody::RecvRndv { from, rndv } = ev.body else {
        panic!("expected a RNDV, got {:?}", ev.body);
    };
    assert_eq!((rndv.length, rndv.region_id), (len, 3));
    b.retire_events(&mut eb);
    b.send(
        &mut eb,
        SendRequest {
            tag: 21,
            route: Route {
                peer_index: from.peer_index,
                endpoint: from.endpoint,
                session_id: ea.session,
            },
            op: SendOp::Pull(Pull {
                length: len,
                local_region: 4,
                local_offset: 0,
                remote_region: rndv.region_id,
                remote_region_seqnum: rndv.region_seqnum,
                remote_offset: rndv.region_offset,
            }),
        },
    );
    let ev = b.next_event(&mut eb);
    assert_eq!(ev.tag, 21);
    assert_eq!(
        ev.body,
        EventBody::PullDone {
            status: DoneStatus::Success,
            length: len
        }
    );
    b.retire_events(&mut eb);
    let mut got = vec![0u8; len as usize];
    assert!(dst.mem.read_bytes(1000, &mut got));
    assert!(got == data, "pulled bytes differ");
    // The sender's RNDV completes once sent.
    expect_done(&a, &mut ea, 20, None);
}

/// An application that opened its endpoint with quiet send completions is not woken by
/// its TINY's completion: it lands in the ring unnotified, and the reply's notification
/// covers it. A MEDIUM's completion (which gives send-queue slots back) still wakes it,
/// and a guest that did not ask is woken by each of its completions.
#[test]
fn quiet_send_completions_are_covered_by_the_next_notified_event() {
    let host = BackdTestHost::start();
    let backend = host.start_backend(GuestQuotas::default());
    peers(&backend, &[(0, 1, 1), (1, 2, 1)]);
    let mut a = host.guest("a", 1, 1);
    a.quiet_send_done = true;
    let mut b = host.guest("b", 2, 1);
    a.connect();
    b.connect();
    let mut ea = a.open_endpoint(0, small_endpoint(8)).1.unwrap();
    let mut eb = b.open_endpoint(0, small_endpoint(8)).1.unwrap();
    let route = |peer_index, session_id| Route {
        peer_index,
        endpoint: 0,
        session_id,
    };
    let (to_a, to_b) = (route(0, ea.session), route(1, eb.session));
    let tiny = |tag: u32, to: Route, data: &[u8]| SendRequest {
        tag,
        route: to,
        op: SendOp::Tiny(InlineMsg {
            info: info(tag as u16, u64::from(tag)),
            data: InlineData::new(data).unwrap(),
        }),
    };

    a.send(&mut ea, tiny(1, to_b, b"ping"));
    let ev = b.next_event(&mut eb);
    assert!(matches!(ev.body, EventBody::RecvTiny { .. }), "{ev:?}");
    b.retire_events(&mut eb);
    // b asked for nothing: it sleeps until its own TINY is done, and is told.
    b.send(&mut eb, tiny(2, to_a, b"pong"));
    expect_done(&b, &mut eb, 2, Some(4));
    // a's completion came before the reply, in the order the backend wrote them.
    expect_done(&a, &mut ea, 1, Some(4));
    let ev = a.next_event(&mut ea);
    match ev.body {
        EventBody::RecvTiny { msg, .. } => assert_eq!(msg.data.as_slice(), b"pong"),
        other => panic!("expected the reply, got {other:?}"),
    }
    a.retire_events(&mut ea);

    // A MEDIUM's completion wakes a quiet endpoint by itself.
    assert!(ea.sendq.write_bytes(0, &[7u8; 100]));
    a.send(
        &mut ea,
        SendRequest {
            tag: 3,
            route: to_b,
            op: SendOp::Medium(MediumSend {
                info: info(3, 3),
                length: 100,
                sendq_slots: QueueSlots::new(&[0]).unwrap(),
            }),
        },
    );
    expect_done(&a, &mut ea, 3, Some(100));

    let report = backd_util::counters(&backend);
    let endpoint = |domid| {
        let g = report.guests.iter().find(|g| g.domid == domid).unwrap();
        g.endpoints[0].clone()
    };
    let (qa, qb) = (endpoint(a.domid), endpoint(b.domid));
    assert!(qa.quiet_send_done);
    assert_eq!(qa.quiet_events, 1, "the TINY's completion only");
    assert!(!qb.quiet_send_done);
    assert_eq!(qb.quiet_events, 0);
}

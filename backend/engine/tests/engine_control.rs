//! NACKs for closed endpoints, bad endpoints, stale sessions and bad regions; CONNECT,
//! lib acks (TRUC) and host discovery.

mod engine_util;

use engine_util::*;
use xmx_engine::{DropReason, EngineConfig, MemoryArea, RegionHandle};
use xmx_wire::msg::{
    DoneStatus, Event, EventBody, LibackSend, NackKind, Pull, RingConnectReply, RingConnectRequest,
    Route, SendOp, SendRequest,
};
use xmx_wire::mxoe::{ConnectData, NackType, PacketRepr, PacketType, HOST_QUERY_MAGIC};

fn nack_test(route: Route, kind: NackKind, wire_type: NackType) {
    let mut tb = Testbed::with_config(EngineConfig {
        endpoints_per_guest: 8,
        ..EngineConfig::default()
    });
    tb.send(1, tiny(1, route, 77, b"anyone?")).unwrap();
    tb.pump();
    assert!(tb.take_events(3).is_empty());
    let nacks = frames_of(&tb, PacketType::NackLib);
    assert_eq!(nacks.len(), 1);
    let repr = nacks[0].parse();
    assert_eq!(repr.head.src, tb.guest(3).mac);
    assert_eq!(repr.head.dst, tb.guest(1).mac);
    let PacketRepr::NackLib(n) = repr.packet else {
        unreachable!()
    };
    assert_eq!(n.nack_type, wire_type);
    assert_eq!(n.src_endpoint, route.endpoint);
    assert_eq!(n.dst_endpoint, EP);
    assert_eq!(n.lib_seqnum, 77);
    assert_eq!(n.dst_src_peer_index, tb.guest(3).peer_index);
    assert_eq!(
        tb.take_events(1),
        vec![
            send_done(1, 7),
            Event {
                tag: 0,
                body: EventBody::RecvNack {
                    from: Route {
                        peer_index: tb.guest(3).peer_index,
                        endpoint: route.endpoint,
                        session_id: 0
                    },
                    kind,
                    seqnum: 77
                }
            }
        ]
    );
    let c = tb.engines[1]
        .guest(tb.guest(3).id)
        .unwrap()
        .counters()
        .clone();
    assert_eq!(c.nacks_sent, 1);
}

#[test]
fn closed_endpoint_is_nacked() {
    let tb = Testbed::new();
    let route = Route {
        endpoint: 5,
        ..tb.route(3)
    };
    nack_test(route, NackKind::EndpointClosed, NackType::EndpointClosed);
}

/// A testbed whose guest `n` shares its link with another board holding endpoints 5 and 6
/// ([`HeldElsewhere`]), with room for eight endpoints per guest.
fn sharing_a_link(n: u32) -> (Testbed, TestGuest) {
    let mut tb = Testbed::with_config(EngineConfig {
        endpoints_per_guest: 8,
        ..EngineConfig::default()
    });
    let g = tb.guest(n);
    tb.engines[g.host]
        .set_endpoints_elsewhere(g.id, Box::new(HeldElsewhere))
        .unwrap();
    (tb, g)
}

/// A link several boards share (native processes on one interface): frames for an
/// endpoint another board holds are that board's to answer, not refused as closed; one
/// for an endpoint nobody holds still is, and a message to a stale session of an open
/// endpoint too.
#[test]
fn frames_for_an_endpoint_held_elsewhere_are_left_to_its_board() {
    let (mut tb, g3) = sharing_a_link(3);
    let route = tb.route(3);
    let to = |endpoint| Route { endpoint, ..route };
    tb.send(1, tiny(1, to(5), 77, b"for the other board"))
        .unwrap();
    tb.send(1, tiny(2, to(6), 78, b"for it too")).unwrap();
    tb.pump();
    assert!(frames_of(&tb, PacketType::NackLib).is_empty());
    let c = tb.engines[1].guest(g3.id).unwrap().counters().clone();
    assert_eq!(c.drops(DropReason::EndpointElsewhere), 2);
    assert_eq!(c.nacks_sent, 0);
    tb.send(1, tiny(3, to(4), 79, b"nobody's")).unwrap();
    tb.pump();
    let nacks = frames_of(&tb, PacketType::NackLib);
    assert_eq!(nacks.len(), 1);
    let PacketRepr::NackLib(n) = packet(&nacks[0]) else {
        unreachable!()
    };
    assert_eq!((n.nack_type, n.src_endpoint), (NackType::EndpointClosed, 4));
}

/// A board's own frame for an endpoint another board on its link holds (native processes
/// on one interface) cannot go through the NIC: it is handed out for that board, not
/// refused, and the board holding the endpoint takes it in as if from the wire. A frame
/// from a board that claims a source MAC not ours is dropped as spoofed.
#[test]
fn own_frames_for_an_endpoint_held_elsewhere_go_to_its_board() {
    let (mut tb, g2) = sharing_a_link(2);
    let to = Route {
        endpoint: 5,
        ..tb.route(2)
    };
    tb.send(1, tiny(1, to, 77, b"for the other board")).unwrap();
    tb.pump();
    let events = tb.take_events(1);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.body, EventBody::RecvNack { .. })),
        "not refused: {events:?}"
    );
    let c = tb.engines[0].guest(g2.id).unwrap().counters().clone();
    assert_eq!(
        (c.nacks_sent, c.drops(DropReason::EndpointElsewhere)),
        (0, 0)
    );
    assert_eq!(tb.engines[0].pending_board_frames(), 1);
    let mut handed = Vec::new();
    let n =
        tb.engines[0].transmit_to_boards(|endpoint, frame| handed.push((endpoint, frame.to_vec())));
    assert_eq!(n, 1);
    let (endpoint, frame) = handed.pop().unwrap();
    assert_eq!(endpoint, 5);
    let repr = xmx_wire::mxoe::FrameRepr::parse(&frame).unwrap();
    assert_eq!((repr.head.src, repr.head.dst), (tb.guest(1).mac, g2.mac));
    let PacketRepr::Tiny(t) = repr.packet else {
        panic!("not the TINY: {repr:?}")
    };
    assert_eq!(
        (t.header.dst_endpoint, t.data),
        (5, &b"for the other board"[..])
    );

    // The board holding endpoint 5 (this engine, once it opens it) takes the frame in.
    g2.mem.add_area(
        MemoryArea::SendQueue { endpoint: 5 },
        usize::from(SENDQ_SLOTS) * 4096,
    );
    g2.mem.add_area(
        MemoryArea::RecvQueue { endpoint: 5 },
        usize::from(RECVQ_SLOTS) * 4096,
    );
    tb.engines[0]
        .open_endpoint(
            g2.id,
            5,
            xmx_engine::EndpointConfig {
                session_id: g2.session,
                send_queue_slots: SENDQ_SLOTS,
                recv_queue_slots: RECVQ_SLOTS,
            },
        )
        .unwrap();
    let now = tb.now;
    tb.engines[0].handle_board_frame(now, &frame);
    let got = tb.take_guest_events(2);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].endpoint, 5);
    let EventBody::RecvTiny { msg, .. } = &got[0].event.body else {
        panic!("{got:?}")
    };
    assert_eq!(msg.data.as_slice(), b"for the other board");
    assert_eq!(tb.engines[0].counters().rx_board_frames, 1);

    // A board frame claiming another host's MAC is no board's.
    let mut forged = frame.clone();
    forged[6..12].copy_from_slice(&tb.guest(3).mac.0);
    tb.engines[0].handle_board_frame(now, &forged);
    assert!(tb.take_guest_events(2).is_empty());
    assert_eq!(tb.engines[0].counters().rx_spoofed_source, 1);

    // From another host the same endpoint is still left to the board holding it.
    let from_afar = Route {
        endpoint: 6,
        ..tb.route(2)
    };
    tb.send(3, tiny(2, from_afar, 78, b"from afar")).unwrap();
    tb.pump();
    let c = tb.engines[0].guest(g2.id).unwrap().counters().clone();
    assert_eq!(c.drops(DropReason::EndpointElsewhere), 1);
    assert_eq!(c.nacks_sent, 0);
    assert_eq!(tb.engines[0].pending_board_frames(), 0);
}

#[test]
fn endpoint_beyond_the_limit_is_nacked_as_bad() {
    let tb = Testbed::new();
    let route = Route {
        endpoint: 200,
        ..tb.route(3)
    };
    nack_test(route, NackKind::BadEndpoint, NackType::BadEndpoint);
}

#[test]
fn stale_session_is_nacked() {
    let tb = Testbed::new();
    let route = Route {
        session_id: 0xdead,
        ..tb.route(3)
    };
    nack_test(route, NackKind::BadSession, NackType::BadSession);
}

#[test]
fn closing_an_endpoint_turns_traffic_into_nacks() {
    let mut tb = Testbed::new();
    let g3 = tb.guest(3);
    tb.engines[1].close_endpoint(g3.id, EP).unwrap();
    let route = tb.route(3);
    tb.send(1, tiny(1, route, 3, b"late")).unwrap();
    tb.pump();
    let PacketRepr::NackLib(n) = packet(&frames_of(&tb, PacketType::NackLib)[0]) else {
        unreachable!()
    };
    assert_eq!(n.nack_type, NackType::EndpointClosed);
}

#[test]
fn acks_to_closed_endpoints_are_dropped_without_nack() {
    let mut tb = Testbed::new();
    let route = Route {
        endpoint: 9,
        ..tb.route(3)
    };
    let ack = LibackSend {
        lib_seqnum: 4,
        send_seq: 5,
        acknum: 6,
        resent: false,
    };
    tb.send(
        1,
        SendRequest {
            tag: 1,
            route,
            op: SendOp::Liback(ack),
        },
    )
    .unwrap();
    tb.pump();
    assert_eq!(tb.wire.len(), 1, "the TRUC only");
    let c = tb.engines[1]
        .guest(tb.guest(3).id)
        .unwrap()
        .counters()
        .clone();
    assert_eq!(c.drops(DropReason::EndpointClosed), 1);
    assert_eq!(c.nacks_sent, 0);
}

#[test]
fn lib_acks_are_delivered() {
    let mut tb = Testbed::new();
    let route = tb.route(3);
    let ack = LibackSend {
        lib_seqnum: 4,
        send_seq: 5,
        acknum: 6,
        resent: true,
    };
    tb.send(
        1,
        SendRequest {
            tag: 1,
            route,
            op: SendOp::Liback(ack),
        },
    )
    .unwrap();
    tb.pump();
    let PacketRepr::Truc(t) = packet(&tb.wire[0]) else {
        unreachable!()
    };
    assert_eq!(t.session, tb.guest(3).session);
    assert_eq!(t.liback.session_id, tb.guest(3).session);
    let ev = tb.take_events(3);
    assert_eq!(
        ev[0].body,
        EventBody::RecvLiback {
            from: Route {
                peer_index: tb.guest(1).peer_index,
                endpoint: EP,
                session_id: 0
            },
            ack
        }
    );
}

#[test]
fn connect_request_and_reply_carry_the_backends_sessions() {
    let mut tb = Testbed::new();
    let (g1, g3) = (tb.guest(1), tb.guest(3));
    // The requester does not know the target's session yet.
    let route = Route {
        session_id: 0,
        ..tb.route(3)
    };
    let request = RingConnectRequest {
        seqnum: 0,
        target_recv_seqnum_start: 10,
        app_key: 0x1234,
        connect_seqnum: 2,
    };
    tb.send(
        1,
        SendRequest {
            tag: 1,
            route,
            op: SendOp::ConnectRequest(request),
        },
    )
    .unwrap();
    tb.pump();
    let PacketRepr::Connect(c) = packet(&tb.wire[0]) else {
        unreachable!()
    };
    assert_eq!(c.src_dst_peer_index, g3.peer_index);
    let ConnectData::Request(r) = c.data else {
        unreachable!()
    };
    assert_eq!(r.src_session_id, g1.session, "filled by the backend");
    let ev = tb.take_events(3);
    assert_eq!(
        ev[0].body,
        EventBody::RecvConnectRequest {
            from: Route {
                peer_index: g1.peer_index,
                endpoint: EP,
                session_id: g1.session
            },
            request
        }
    );

    let reply = RingConnectReply {
        seqnum: 0,
        target_recv_seqnum_start: 20,
        connect_seqnum: 2,
        status: 0,
    };
    let back = tb.route(1);
    tb.send(
        3,
        SendRequest {
            tag: 2,
            route: back,
            op: SendOp::ConnectReply(reply),
        },
    )
    .unwrap();
    tb.pump();
    let ev = tb.take_events(1);
    assert_eq!(ev.len(), 2);
    assert_eq!(ev[0], send_done(1, 0));
    assert_eq!(
        ev[1].body,
        EventBody::RecvConnectReply {
            from: Route {
                peer_index: g3.peer_index,
                endpoint: EP,
                session_id: g3.session
            },
            reply,
            target_session_id: g1.session
        }
    );
}

#[test]
fn connect_to_a_closed_endpoint_is_nacked() {
    let mut tb = Testbed::new();
    let route = Route {
        endpoint: 3,
        ..tb.route(4)
    };
    let request = RingConnectRequest {
        seqnum: 0,
        target_recv_seqnum_start: 1,
        app_key: 1,
        connect_seqnum: 1,
    };
    tb.send(
        2,
        SendRequest {
            tag: 1,
            route,
            op: SendOp::ConnectRequest(request),
        },
    )
    .unwrap();
    tb.pump();
    let ev = tb.take_events(2);
    assert!(matches!(
        ev[1].body,
        EventBody::RecvNack {
            kind: NackKind::EndpointClosed,
            seqnum: 0,
            ..
        }
    ));
}

fn pull_from_3(tb: &mut Testbed, route: Route, remote_region: u8, remote_offset: u32, length: u32) {
    let pull = Pull {
        length,
        local_region: 2,
        local_offset: 0,
        remote_region,
        remote_region_seqnum: 0,
        remote_offset,
    };
    tb.send(
        1,
        SendRequest {
            tag: 8,
            route,
            op: SendOp::Pull(pull),
        },
    )
    .unwrap();
}

fn pull_done(status: DoneStatus) -> Event {
    pull_done_after(status, 0)
}

fn pull_done_after(status: DoneStatus, length: u32) -> Event {
    Event {
        tag: 8,
        body: EventBody::PullDone { status, length },
    }
}

#[test]
fn pulls_of_bad_regions_are_nacked_by_the_data_owner() {
    let mut tb = Testbed::new();
    tb.region(1, 2, 1, vec![0; 100_000]);
    tb.region(3, 4, 2, vec![0; 50_000]);
    let route = tb.route(3);

    // Unknown region.
    pull_from_3(&mut tb, route, 9, 0, 40_000);
    tb.pump();
    // Both blocks were requested at once: each is refused, the second refusal finds the
    // pull already failed.
    let mcp = frames_of(&tb, PacketType::NackMcp);
    assert_eq!(mcp.len(), 2);
    let g1 = tb.guest(1).id;
    let c = tb.engines[0].guest(g1).unwrap().counters().clone();
    assert_eq!(c.drops(DropReason::StalePull), 1);
    let PacketRepr::NackMcp(n) = packet(&mcp[0]) else {
        unreachable!()
    };
    assert_eq!(n.nack_type, NackType::BadRdmaWindow);
    assert_eq!(mcp[0].parse().head.src, tb.guest(3).mac);
    assert_eq!(tb.take_events(1), vec![pull_done(DoneStatus::BadRegion)]);

    // Known region, range past its end: the first block (up to the first 32 KiB boundary
    // of the remote layout) is served, the second is refused.
    pull_from_3(&mut tb, route, 4, 100, 50_000);
    tb.pump();
    assert_eq!(
        tb.take_events(1),
        vec![pull_done_after(DoneStatus::BadRegion, 32768 - 100)]
    );

    // Bad session, closed endpoint.
    let stale = Route {
        session_id: 1,
        ..route
    };
    pull_from_3(&mut tb, stale, 4, 0, 10);
    tb.pump();
    assert_eq!(tb.take_events(1), vec![pull_done(DoneStatus::BadSession)]);
    let closed = Route {
        endpoint: 1,
        ..route
    };
    pull_from_3(&mut tb, closed, 4, 0, 10);
    tb.pump();
    assert_eq!(
        tb.take_events(1),
        vec![pull_done(DoneStatus::EndpointClosed)]
    );

    assert_eq!(tb.engines[0].guest(g1).unwrap().outstanding_pulls(), 0);
    assert_eq!(tb.engines[0].poll_timeout(), None);
}

#[test]
fn deregistering_the_sink_region_aborts_the_pull() {
    let mut tb = Testbed::new();
    tb.region(1, 2, 1, vec![0; 100_000]);
    tb.region(3, 4, 2, vec![7; 100_000]);
    let route = tb.route(3);
    pull_from_3(&mut tb, route, 4, 0, 100_000);
    // Requests are queued, nothing answered yet.
    let g1 = tb.guest(1).id;
    assert_eq!(
        tb.engines[0].deregister_region(g1, EP, 2).unwrap(),
        RegionHandle(1)
    );
    assert_eq!(tb.take_events(1), vec![pull_done(DoneStatus::Aborted)]);
    tb.pump();
    // The replies find no pull.
    assert!(tb.take_events(1).is_empty());
    let c = tb.engines[0].guest(g1).unwrap().counters().clone();
    assert!(c.drops(DropReason::StalePull) > 0);
    assert_eq!(
        tb.guest(1)
            .mem
            .area(MemoryArea::Region(RegionHandle(1)))
            .unwrap(),
        vec![0; 100_000]
    );
}

#[test]
fn host_queries_are_answered_for_guests_of_the_cluster() {
    let mut tb = Testbed::new();
    let (g1, g3, g6) = (tb.guest(1), tb.guest(3), tb.guest(6));
    let now = tb.now;
    tb.engines[0].host_query(now, g1.id, g3.mac).unwrap();
    tb.pump();
    let types: Vec<PacketType> = tb.wire.iter().map(|f| f.ptype()).collect();
    assert_eq!(types, vec![PacketType::HostQuery, PacketType::HostReply]);
    let PacketRepr::HostReply(r) = packet(&tb.wire[1]) else {
        unreachable!()
    };
    assert_eq!(r.magic, HOST_QUERY_MAGIC);
    assert_eq!(r.hostname, b"guest3:0\0");
    let reply = tb.engines[0].poll_host_reply().unwrap();
    assert_eq!(reply.guest, g1.id);
    assert_eq!(reply.from, g3.mac);
    assert_eq!(reply.hostname, b"guest3:0");
    assert_eq!(reply.reverse_index, g1.peer_index);
    assert!(tb.engines[0].poll_host_reply().is_none());

    // Guest 6 is in cluster 2: it does not answer guest 1.
    tb.engines[0].host_query(now, g1.id, g6.mac).unwrap();
    tb.pump();
    assert!(tb.engines[0].poll_host_reply().is_none());
    let c = tb.engines[1].guest(g6.id).unwrap().counters().clone();
    assert_eq!(c.drops(DropReason::CrossCluster), 1);
}

#[test]
fn frames_for_an_endpoint_being_reopened_are_dropped_without_nack_until_it_opens() {
    let mut tb = Testbed::new();
    let g3 = tb.guest(3);
    // The guest went away and came back (a resume, a migration): its endpoint is not open
    // yet, but it will be, with its session.
    tb.engines[1].close_endpoint(g3.id, EP).unwrap();
    let now = tb.now;
    tb.engines[1].expect_reopen(now, g3.id, [EP]).unwrap();
    let route = tb.route(3);
    tb.send(1, tiny(1, route, 3, b"in the gap")).unwrap();
    tb.pump();
    assert!(frames_of(&tb, PacketType::NackLib).is_empty());
    let c = tb.engines[1].guest(g3.id).unwrap().counters().clone();
    assert_eq!(
        (c.drops(DropReason::EndpointReopening), c.nacks_sent),
        (1, 0)
    );
    // The sender's request is not failed: nothing but its completion.
    assert_eq!(tb.take_events(1), vec![send_done(1, 10)]);
    assert!(tb.take_events(3).is_empty());

    // Open again with its session: the resent message arrives.
    tb.engines[1]
        .open_endpoint(
            g3.id,
            EP,
            xmx_engine::EndpointConfig {
                session_id: g3.session,
                send_queue_slots: 4,
                recv_queue_slots: 4,
            },
        )
        .unwrap();
    tb.send(1, tiny(2, route, 3, b"in the gap")).unwrap();
    tb.pump();
    let got = tb.take_events(3);
    assert!(
        matches!(&got[..], [Event { body: EventBody::RecvTiny { msg, .. }, .. }] if msg.data.as_slice() == b"in the gap"),
        "{got:?}"
    );
    // Once open, it is an ordinary endpoint: closed again, it is NACKed.
    tb.engines[1].close_endpoint(g3.id, EP).unwrap();
    tb.send(1, tiny(3, route, 4, b"late")).unwrap();
    tb.pump();
    assert_eq!(frames_of(&tb, PacketType::NackLib).len(), 1);
    assert!(tb.engines[1]
        .expect_reopen(now, xmx_engine::GuestId(99), [EP])
        .is_err());
}

#[test]
fn an_endpoint_not_reopened_in_time_is_refused_as_closed() {
    let mut tb = Testbed::new();
    let grace = EngineConfig::default().reopen_grace;
    let g3 = tb.guest(3);
    // The guest came back, but the application behind its endpoint died during the
    // move: nothing will open it again.
    tb.engines[1].close_endpoint(g3.id, EP).unwrap();
    let now = tb.now;
    tb.engines[1].expect_reopen(now, g3.id, [EP]).unwrap();
    assert_eq!(tb.engines[1].poll_timeout(), Some(now + grace));
    let route = tb.route(3);
    tb.send(1, tiny(1, route, 3, b"while away")).unwrap();
    tb.pump();
    assert!(
        frames_of(&tb, PacketType::NackLib).is_empty(),
        "within the grace"
    );

    // The mark's deadline passes: the next frame is NACKed as for a closed endpoint,
    // and the sender learns it.
    assert!(tb.fire_timers());
    assert_eq!(tb.now, now + grace);
    assert_eq!(tb.engines[1].poll_timeout(), None, "no mark left");
    tb.send(1, tiny(2, route, 4, b"still away")).unwrap();
    tb.pump();
    let nacks = frames_of(&tb, PacketType::NackLib);
    assert_eq!(nacks.len(), 1);
    let PacketRepr::NackLib(n) = packet(&nacks[0]) else {
        unreachable!()
    };
    assert_eq!(n.nack_type, NackType::EndpointClosed);
    let got = tb.take_events(1);
    assert!(
        got.iter().any(|e| matches!(
            e.body,
            EventBody::RecvNack {
                kind: NackKind::EndpointClosed,
                ..
            }
        )),
        "{got:?}"
    );
    let c = tb.engines[1].guest(g3.id).unwrap().counters().clone();
    assert_eq!(
        (c.drops(DropReason::EndpointReopening), c.nacks_sent),
        (1, 1)
    );
}

#[test]
fn an_endpoint_reopened_in_time_keeps_nothing_waiting() {
    let mut tb = Testbed::new();
    let g3 = tb.guest(3);
    tb.engines[1].close_endpoint(g3.id, EP).unwrap();
    let now = tb.now;
    tb.engines[1].expect_reopen(now, g3.id, [EP]).unwrap();
    tb.engines[1]
        .open_endpoint(
            g3.id,
            EP,
            xmx_engine::EndpointConfig {
                session_id: g3.session,
                send_queue_slots: 4,
                recv_queue_slots: 4,
            },
        )
        .unwrap();
    // Opened: the mark went with it, and no timer is left for it.
    assert_eq!(tb.engines[1].poll_timeout(), None);
}

#[test]
fn a_guest_is_announced_with_a_broadcast_rarp_from_its_mac() {
    let mut tb = Testbed::new();
    let g3 = tb.guest(3);
    while tb.engines[1].poll_transmit().is_some() {}
    tb.engines[1].announce(g3.id).unwrap();
    let t = tb.engines[1].poll_transmit().expect("the announcement");
    assert_eq!(t.bytes, xmx_engine::rarp_announcement(g3.mac));
    assert_eq!(t.bytes.len(), 60);
    assert_eq!(&t.bytes[..6], &[0xff; 6]);
    assert_eq!(&t.bytes[6..12], &g3.mac.0);
    assert_eq!(&t.bytes[12..14], &[0x80, 0x35]);
    // Operation 3 (request reverse), sender hardware address the guest's.
    assert_eq!(&t.bytes[20..22], &[0, 3]);
    assert_eq!(&t.bytes[22..28], &g3.mac.0);
    let c = tb.engines[1].guest(g3.id).unwrap().counters().clone();
    assert_eq!((c.announcements, c.tx_frames), (1, 0));
    assert!(tb.engines[1].announce(xmx_engine::GuestId(99)).is_err());
}

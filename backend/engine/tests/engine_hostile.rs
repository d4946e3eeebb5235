//! Hostile guests and a hostile wire: every bad request is a Violation that changes
//! nothing, quotas refuse excess, random input never panics, and other guests' traffic
//! keeps flowing.

mod engine_util;

use engine_util::*;
use proptest::prelude::*;
use xmx_engine::{EngineConfig, GuestId, Violation};
use xmx_wire::msg::{
    ErrorCode, Event, EventBody, InlineData, InlineMsg, LibackSend, MediumSend, MsgInfo,
    NotifySend, Pull, QueueSlots, RingConnectReply, RingConnectRequest, RndvSend, Route, SendOp,
    SendRequest,
};
use xmx_wire::mxoe::{PacketType, HEAD_LEN};

fn req(route: Route, op: SendOp) -> SendRequest {
    SendRequest { tag: 99, route, op }
}

fn medium(length: u32, slots: &[u16]) -> SendOp {
    SendOp::Medium(MediumSend {
        info: MsgInfo::default(),
        length,
        sendq_slots: QueueSlots::new(slots).unwrap(),
    })
}

fn rndv(region_id: u8, region_offset: u32, length: u32) -> SendOp {
    SendOp::Rndv(RndvSend {
        info: MsgInfo::default(),
        length,
        region_id,
        region_seqnum: 0,
        region_offset,
    })
}

fn pull(local_region: u8, local_offset: u32, length: u32) -> SendOp {
    SendOp::Pull(Pull {
        length,
        local_region,
        local_offset,
        remote_region: 2,
        remote_region_seqnum: 0,
        remote_offset: 0,
    })
}

/// Guest 1 on host 0 with region 1 of 100 000 bytes; guest 3 with region 2.
fn testbed() -> Testbed {
    let mut tb = Testbed::new();
    tb.region(1, 1, 1, vec![1; 100_000]);
    tb.region(3, 2, 2, vec![3; 100_000]);
    tb
}

/// Output of host 0 so far: events and frames waiting.
fn footprint(tb: &mut Testbed) -> (usize, usize) {
    tb.collect_events();
    (tb.events.len(), tb.engines[0].pending_transmits())
}

#[test]
fn each_violation_is_reported_and_changes_nothing() {
    let mut tb = testbed();
    let to3 = tb.route(3);
    let cases: Vec<(SendRequest, Violation)> = vec![
        (
            req(to3, medium(4097, &[0])),
            Violation::BadLength {
                class: "medium",
                length: 4097,
            },
        ),
        (
            req(to3, medium(40_000, &[0; 8])),
            Violation::BadLength {
                class: "medium",
                length: 40_000,
            },
        ),
        (
            req(to3, medium(5000, &[1, SENDQ_SLOTS])),
            Violation::BadSendQueueSlot {
                slot: SENDQ_SLOTS,
                slots: SENDQ_SLOTS,
            },
        ),
        (
            req(to3, pull(1, u32::MAX, u32::MAX)),
            Violation::RegionRange {
                region: 1,
                offset: u64::from(u32::MAX),
                length: u64::from(u32::MAX),
                region_len: 100_000,
            },
        ),
        (req(to3, pull(2, 0, 1)), Violation::BadRegion(2)),
        (
            req(
                to3,
                SendOp::ConnectReply(RingConnectReply {
                    status: 5,
                    ..Default::default()
                }),
            ),
            Violation::BadConnectStatus(5),
        ),
    ];
    for (request, violation) in cases {
        let before = footprint(&mut tb);
        assert_eq!(tb.send(1, request), Err(violation), "{request:?}");
        assert_eq!(footprint(&mut tb), before, "{request:?} changed something");
    }
    let now = tb.now;
    let g1 = tb.guest(1).id;
    assert_eq!(
        tb.engines[0].handle_send(now, g1, 3, &tiny(1, to3, 1, b"x")),
        Err(Violation::EndpointNotOpen(3))
    );
    assert_eq!(
        tb.engines[0].handle_send(now, GuestId(77), EP, &tiny(1, to3, 1, b"x")),
        Err(Violation::UnknownGuest(GuestId(77)))
    );
    assert_eq!(
        tb.engines[0].release_recvq_slot(g1, EP, 0),
        Err(Violation::BadRecvQueueSlot { slot: 0 }),
        "a slot never handed out"
    );
    assert_eq!(
        tb.engines[0].release_recvq_slot(g1, EP, 9999),
        Err(Violation::BadRecvQueueSlot { slot: 9999 })
    );
    assert_eq!(tb.engines[0].guest(g1).unwrap().outstanding_pulls(), 0);
}

/// dom0 may shrink the peer table under a running guest (a host forgotten, a guest
/// gone): a send to an index past its end completes with an error and the guest
/// stays connected; it is no protocol violation.
#[test]
fn a_peer_index_past_a_shrunken_table_completes_with_an_error() {
    let mut tb = testbed();
    let to3 = tb.route(3);
    let table_len = tb.engines[0].peers().iter().count();
    let past = Route {
        peer_index: u16::try_from(table_len).unwrap(),
        ..to3
    };
    tb.send(1, req(past, medium(10, &[0]))).unwrap();
    tb.pump();
    assert!(tb.wire.is_empty(), "nothing left the host");
    assert_eq!(
        tb.take_events(1),
        vec![Event {
            tag: 99,
            body: EventBody::Error {
                code: ErrorCode::BadPeer
            }
        }]
    );
    // The guest goes on: the same send to a listed peer leaves the host.
    tb.send(1, req(to3, medium(10, &[0]))).unwrap();
    tb.pump();
    let g1 = tb.guest(1).id;
    let c = tb.engines[0].guest(g1).unwrap().counters().clone();
    assert_eq!(c.send_errors, 1);
    assert!(c.tx_frames >= 1, "the second send left the host");
}

/// A library resends an RNDV whose ack was lost; the NOTIFY ends the send, and the
/// library deregisters the window (through its daemon, a path not ordered with the send
/// ring) before the backend reaches the resend. The resend is refused with BadRegion and
/// nothing leaves the host; the guest keeps its device (it used to be disconnected for
/// naming a region it does not have, which a correct library can do). A window too short
/// for what it announces, or never registered, is refused the same way.
#[test]
fn an_rndv_naming_a_window_given_back_is_refused_and_the_guest_goes_on() {
    let mut tb = testbed();
    let to3 = tb.route(3);
    let g1 = tb.guest(1).id;
    tb.send(1, req(to3, rndv(1, 0, 70_000))).unwrap();
    tb.pump();
    assert_eq!(tb.take_events(1), vec![send_done(99, 0)]);
    let announced = frames_of(&tb, PacketType::Rndv).len();
    assert_eq!(announced, 1);
    tb.engines[0]
        .deregister_region(g1, EP, 1)
        .expect("window 1 was registered");
    let refused = |tb: &mut Testbed, stale: SendOp| {
        assert_eq!(tb.send(1, req(to3, stale)), Ok(()), "{stale:?}");
        tb.pump();
        assert_eq!(
            tb.take_events(1),
            vec![Event {
                tag: 99,
                body: EventBody::Error {
                    code: ErrorCode::BadRegion
                }
            }],
            "{stale:?}"
        );
    };
    refused(&mut tb, rndv(1, 0, 70_000));
    refused(&mut tb, rndv(7, 0, 10));
    // The id comes back for a shorter window, as a registration cache reuses ids.
    tb.engines[0]
        .register_region(g1, EP, 1, xmx_engine::RegionHandle(5), 1000)
        .unwrap();
    refused(&mut tb, rndv(1, 0, 70_000));
    assert_eq!(
        frames_of(&tb, PacketType::Rndv).len(),
        announced,
        "no stale RNDV left"
    );
    assert_eq!(tb.engines[0].guest(g1).unwrap().counters().send_errors, 3);
    // The endpoint goes on working.
    tb.send(1, tiny(100, to3, 2, b"still here")).unwrap();
    tb.pump();
    assert_eq!(tb.take_events(1), vec![send_done(100, 10)]);
}

#[test]
fn unsupported_wire_offsets_complete_with_an_error() {
    let mut tb = Testbed::new();
    tb.region(1, 1, 1, vec![0; 200_000]);
    let to3 = tb.route(3);
    tb.send(1, req(to3, rndv(1, 70_000, 10))).unwrap();
    tb.pump();
    assert!(tb.wire.is_empty());
    assert_eq!(
        tb.take_events(1),
        vec![Event {
            tag: 99,
            body: EventBody::Error {
                code: ErrorCode::Unsupported
            }
        }]
    );
}

/// Guest 1 was refused one pull for its quota, with `outstanding` pulls left going.
fn one_pull_refused(tb: &mut Testbed, outstanding: usize) {
    assert_eq!(
        tb.take_events(1),
        vec![Event {
            tag: 99,
            body: EventBody::Error {
                code: ErrorCode::NoResources
            }
        }]
    );
    let g1 = tb.guest(1).id;
    let nic = tb.engines[0].guest(g1).unwrap();
    assert_eq!(nic.counters().quota_refusals, 1);
    assert_eq!(nic.outstanding_pulls(), outstanding);
}

#[test]
fn quotas_refuse_excess_pulls_without_disconnecting() {
    let mut tb = Testbed::with_config(EngineConfig {
        max_pulls_per_guest: 2,
        ..EngineConfig::default()
    });
    tb.region(1, 1, 1, vec![0; 100_000]);
    let to3 = tb.route(3);
    for _ in 0..3 {
        tb.send(1, req(to3, pull(1, 0, 1000))).unwrap();
    }
    one_pull_refused(&mut tb, 2);
}

/// The byte quota limits what is outstanding together: a message longer than the
/// quota (MX's reach 4 GiB - 1) is pulled when it is alone, and a second pull beside it
/// is refused.
#[test]
fn a_lone_pull_longer_than_the_byte_quota_is_taken() {
    let mut tb = Testbed::with_config(EngineConfig {
        max_pull_bytes_per_guest: 10_000,
        ..EngineConfig::default()
    });
    tb.region(1, 1, 1, vec![0; 100_000]);
    let to3 = tb.route(3);
    tb.send(1, req(to3, pull(1, 0, 50_000))).unwrap();
    assert_eq!(tb.take_events(1), vec![]);
    tb.send(1, req(to3, pull(1, 0, 1000))).unwrap();
    one_pull_refused(&mut tb, 1);
}

#[test]
fn region_quota_is_per_guest() {
    let mut tb = Testbed::with_config(EngineConfig {
        max_regions_per_guest: 1,
        ..EngineConfig::default()
    });
    tb.region(1, 1, 1, vec![0; 10]);
    let g1 = tb.guest(1).id;
    let refused = tb.engines[0].register_region(g1, EP, 2, xmx_engine::RegionHandle(2), 10);
    assert_eq!(refused, Err(xmx_engine::EngineError::Quota("regions")));
    // Guest 2 has its own quota.
    tb.region(2, 1, 1, vec![0; 10]);
}

fn route_strategy() -> impl Strategy<Value = Route> {
    (
        0u16..8,
        0u8..3,
        prop_oneof![Just(0x5e55_0003u32), any::<u32>()],
    )
        .prop_map(|(peer_index, endpoint, session_id)| Route {
            peer_index,
            endpoint,
            session_id,
        })
}

fn info_strategy() -> impl Strategy<Value = MsgInfo> {
    (any::<u16>(), any::<u16>(), any::<u64>()).prop_map(|(seqnum, piggyack, match_info)| MsgInfo {
        seqnum,
        piggyack,
        match_info,
    })
}

fn offset_strategy() -> impl Strategy<Value = u32> {
    prop_oneof![0u32..5000, 95_000u32..105_000, any::<u32>()]
}

fn op_strategy() -> impl Strategy<Value = SendOp> {
    prop_oneof![
        (
            info_strategy(),
            proptest::collection::vec(any::<u8>(), 0..=128)
        )
            .prop_map(|(info, d)| {
                SendOp::Tiny(InlineMsg {
                    info,
                    data: InlineData::new(&d).unwrap(),
                })
            }),
        (
            info_strategy(),
            proptest::collection::vec(any::<u8>(), 0..=128)
        )
            .prop_map(|(info, d)| {
                SendOp::Small(InlineMsg {
                    info,
                    data: InlineData::new(&d).unwrap(),
                })
            }),
        (
            info_strategy(),
            0u32..40_000,
            proptest::collection::vec(0u16..12, 1..=8)
        )
            .prop_map(|(info, length, slots)| SendOp::Medium(MediumSend {
                info,
                length,
                sendq_slots: QueueSlots::new(&slots).unwrap(),
            })),
        (info_strategy(), any::<u32>(), 0u8..4, offset_strategy()).prop_map(
            |(info, length, region_id, region_offset)| SendOp::Rndv(RndvSend {
                info,
                length,
                region_id,
                region_seqnum: 0,
                region_offset,
            })
        ),
        (
            prop_oneof![0u32..200_000, any::<u32>()],
            0u8..4,
            offset_strategy(),
            0u8..4,
            offset_strategy()
        )
            .prop_map(
                |(length, local_region, local_offset, remote_region, remote_offset)| {
                    SendOp::Pull(Pull {
                        length,
                        local_region,
                        local_offset,
                        remote_region,
                        remote_region_seqnum: 0,
                        remote_offset,
                    })
                }
            ),
        (any::<u16>(), any::<u32>(), any::<u8>()).prop_map(|(seqnum, app_key, connect_seqnum)| {
            SendOp::ConnectRequest(RingConnectRequest {
                seqnum,
                target_recv_seqnum_start: seqnum,
                app_key,
                connect_seqnum,
            })
        }),
        (any::<u16>(), any::<u8>()).prop_map(|(seqnum, status)| SendOp::ConnectReply(
            RingConnectReply {
                seqnum,
                target_recv_seqnum_start: seqnum,
                connect_seqnum: 1,
                status,
            }
        )),
        (any::<u16>(), any::<u32>(), 0u8..4).prop_map(|(seqnum, total_length, region_id)| {
            SendOp::Notify(NotifySend {
                seqnum,
                piggyack: seqnum,
                total_length,
                region_id,
                region_seqnum: 0,
            })
        }),
        (any::<u16>(), any::<u32>(), any::<bool>()).prop_map(|(s, acknum, resent)| {
            SendOp::Liback(LibackSend {
                lib_seqnum: s,
                send_seq: s,
                acknum,
                resent,
            })
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn random_requests_never_panic_and_spare_other_guests(
        requests in proptest::collection::vec((route_strategy(), op_strategy()), 1..24),
    ) {
        let mut tb = testbed();
        for (i, (route, op)) in requests.into_iter().enumerate() {
            let request = SendRequest { tag: i as u32, route, op };
            let before = footprint(&mut tb);
            if tb.send(1, request).is_err() {
                prop_assert_eq!(footprint(&mut tb), before);
            }
            tb.pump();
            if i % 5 == 0 {
                tb.fire_timers();
                tb.pump();
            }
        }
        // Guest 2, co-located with the hostile guest 1, still reaches guest 3.
        tb.collect_events();
        tb.events.clear();
        let to3 = tb.route(3);
        tb.send(2, tiny(500, to3, 1, b"still here")).unwrap();
        tb.pump();
        prop_assert_eq!(tb.take_events(2), vec![send_done(500, 10)]);
        let got: Vec<Event> = tb.take_events(3);
        let from_2 = got.iter().any(|e| matches!(
            e.body,
            EventBody::RecvTiny { from, msg } if from.peer_index == 1 && msg.data.as_slice() == b"still here"
        ));
        prop_assert!(from_2, "{:?}", got);
    }

    #[test]
    fn random_packets_from_the_wire_never_panic(
        ptype in prop_oneof![Just(3u8), Just(4), 35u8..=45, any::<u8>()],
        body in proptest::collection::vec(any::<u8>(), 0..200),
        big in any::<bool>(),
    ) {
        let mut tb = testbed();
        let (g1, g3) = (tb.guest(1), tb.guest(3));
        let mut frame = raw_frame(g1.mac, g3.mac, ptype, &body);
        if big {
            frame.resize(HEAD_LEN + 4200, 0xa5);
        }
        let now = tb.now;
        tb.engines[1].handle_frame(now, &frame);
        tb.pump();
        tb.fire_timers();
        // Whatever happened, guest 3 still receives.
        let still = guest_3_still_receives(&mut tb);
        prop_assert!(still.is_ok(), "{:?}", still);
    }

    /// The same from another board on the link (native processes on one interface): a
    /// frame with our own MAC as source, whatever it carries, for any endpoint.
    #[test]
    fn random_packets_from_another_board_never_panic(
        ptype in prop_oneof![Just(3u8), Just(4), 35u8..=45, any::<u8>()],
        body in proptest::collection::vec(any::<u8>(), 0..200),
        to_endpoint_held_elsewhere in any::<bool>(),
    ) {
        let mut tb = testbed();
        let (g3, g4) = (tb.guest(3), tb.guest(4));
        tb.engines[1]
            .set_endpoints_elsewhere(g3.id, Box::new(HeldElsewhere))
            .unwrap();
        let mut frame = raw_frame(g4.mac, g3.mac, ptype, &body);
        if to_endpoint_held_elsewhere && frame.len() > HEAD_LEN + 2 {
            frame[HEAD_LEN + 2] = 5;
        }
        let now = tb.now;
        tb.engines[1].handle_board_frame(now, &frame);
        tb.pump();
        tb.fire_timers();
        let mut handed = 0;
        tb.engines[1].transmit_to_boards(|_, _| handed += 1);
        prop_assert!(handed <= 1);
        let still = guest_3_still_receives(&mut tb);
        prop_assert!(still.is_ok(), "{:?}", still);
    }
}

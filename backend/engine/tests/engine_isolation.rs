//! Virtual clusters and identity: no traffic crosses clusters, frames always carry the
//! sending guest's MAC, and frames from unknown or spoofed sources are dropped.

mod engine_util;

use engine_util::*;
use xmx_engine::{DropReason, PeerEntry};
use xmx_wire::msg::{ErrorCode, Event, EventBody};
use xmx_wire::mxoe::{FrameRepr, HeadRepr, Mac, MsgHeader, PacketRepr, TinyRepr};

fn tiny_frame(src: Mac, dst: Mac, session: u32) -> Vec<u8> {
    let mut bytes = FrameRepr {
        head: HeadRepr {
            dst,
            src,
            dst_src_peer_index: 0,
        },
        packet: PacketRepr::Tiny(TinyRepr {
            header: MsgHeader {
                dst_endpoint: EP,
                session,
                lib_seqnum: 1,
                ..Default::default()
            },
            data: b"intruder",
        }),
    }
    .to_vec()
    .unwrap();
    bytes.resize(60, 0);
    bytes
}

#[test]
fn cross_cluster_sends_fail_with_an_error_and_no_frame() {
    let mut tb = Testbed::new();
    // Guest 1 (cluster 1) to guest 6 (cluster 2, other host) and guest 5 (cluster 2, same host).
    for (tag, to) in [(1u32, 6u32), (2, 5)] {
        let route = tb.route(to);
        tb.send(1, tiny(tag, route, 1, b"x")).unwrap();
    }
    tb.pump();
    assert!(tb.wire.is_empty(), "nothing left the host");
    let denied = |tag| Event {
        tag,
        body: EventBody::Error {
            code: ErrorCode::Denied,
        },
    };
    assert_eq!(tb.take_events(1), vec![denied(1), denied(2)]);
    assert!(tb.take_events(5).is_empty());
    assert!(tb.take_events(6).is_empty());
    let c = tb.engines[0]
        .guest(tb.guest(1).id)
        .unwrap()
        .counters()
        .clone();
    assert_eq!((c.send_errors, c.tx_frames, c.local_frames), (2, 0, 0));
}

#[test]
fn a_stale_table_cannot_reach_a_co_located_guest_of_another_cluster() {
    let mut tb = Testbed::new();
    // The table wrongly puts guest 5 (cluster 2 on host 0) in cluster 1.
    let mut table: Vec<PeerEntry> = tb.engines[0].peers().iter().cloned().collect();
    table[4].cluster = tb.guest(1).cluster;
    tb.engines[0].set_peers(table).unwrap();
    let route = tb.route(5);
    tb.send(1, tiny(9, route, 1, b"x")).unwrap();
    tb.pump();
    assert_eq!(
        tb.take_events(1),
        vec![Event {
            tag: 9,
            body: EventBody::Error {
                code: ErrorCode::Denied
            }
        }]
    );
    assert!(tb.take_events(5).is_empty());
}

#[test]
fn received_frames_from_another_cluster_are_dropped() {
    let mut tb = Testbed::new();
    let (g3, g5) = (tb.guest(3), tb.guest(5));
    // Guest 3 (cluster 1, host 1) "sends" to guest 5 (cluster 2, host 0) by raw frame.
    let now = tb.now;
    tb.engines[0].handle_frame(now, &tiny_frame(g3.mac, g5.mac, g5.session));
    assert!(tb.take_events(5).is_empty());
    assert_eq!(tb.engines[0].pending_transmits(), 0, "not even a NACK");
    let c = tb.engines[0].guest(g5.id).unwrap().counters().clone();
    assert_eq!(c.drops(DropReason::CrossCluster), 1);
    assert_eq!(c.rx_frames, 0);
}

#[test]
fn unknown_spoofed_and_misaddressed_frames_are_dropped() {
    let mut tb = Testbed::new();
    let (g1, g2, g3) = (tb.guest(1), tb.guest(2), tb.guest(3));
    let now = tb.now;
    let stranger = Mac([0x02, 0xaa, 0, 0, 0, 1]);
    // Not in the peer table.
    tb.engines[0].handle_frame(now, &tiny_frame(stranger, g1.mac, g1.session));
    // Claims to be co-located guest 2 but came from the wire.
    tb.engines[0].handle_frame(now, &tiny_frame(g2.mac, g1.mac, g1.session));
    // For a MAC no guest of this host has.
    tb.engines[0].handle_frame(now, &tiny_frame(g1.mac, g3.mac, g3.session));
    // Truncated head.
    tb.engines[0].handle_frame(now, &[0u8; 10]);
    assert!(tb.take_events(1).is_empty());
    let c = tb.engines[0].counters().clone();
    assert_eq!(c.rx_frames, 4);
    assert_eq!(c.rx_spoofed_source, 1);
    assert_eq!(c.rx_unknown_destination, 1);
    assert_eq!(c.rx_malformed, 1);
    let nic = tb.engines[0].guest(g1.id).unwrap().counters().clone();
    assert_eq!(nic.drops(DropReason::UnknownSource), 1);
    assert_eq!(tb.engines[0].pending_transmits(), 0);
}

#[test]
fn frames_always_carry_the_senders_mac() {
    let mut tb = Testbed::new();
    // Guests 1 and 2 share host 0; each sends to guest 3.
    for n in [1u32, 2] {
        let route = tb.route(3);
        tb.send(n, tiny(n, route, 1, b"who")).unwrap();
    }
    tb.pump();
    let srcs: Vec<Mac> = tb.wire.iter().map(|f| f.parse().head.src).collect();
    assert_eq!(srcs, vec![tb.guest(1).mac, tb.guest(2).mac]);
    let ev = tb.take_events(3);
    let from: Vec<u16> = ev
        .iter()
        .map(|e| match e.body {
            EventBody::RecvTiny { from, .. } => from.peer_index,
            _ => panic!("{e:?}"),
        })
        .collect();
    assert_eq!(from, vec![tb.guest(1).peer_index, tb.guest(2).peer_index]);
}

#[test]
fn removing_a_guest_stops_delivery_to_it() {
    let mut tb = Testbed::new();
    let g3 = tb.guest(3);
    tb.engines[1].remove_guest(g3.id).unwrap();
    let route = tb.route(3);
    tb.send(1, tiny(1, route, 1, b"gone")).unwrap();
    tb.pump();
    assert_eq!(tb.engines[1].counters().rx_unknown_destination, 1);
    assert!(tb.take_events(3).is_empty());
}

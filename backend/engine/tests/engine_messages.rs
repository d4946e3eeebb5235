//! TINY, SMALL and MEDIUM messages between guests on two hosts and between co-located
//! guests: frames on the wire, events, and bytes in the receiver's queue.

mod engine_util;

use engine_util::*;
use xmx_engine::{DropReason, EngineConfig, MemoryArea};
use xmx_wire::msg::{
    medium_frags, ErrorCode, EventBody, MediumSend, QueueSlots, RingConnectReply,
    RingConnectRequest, Route, SendOp, SendRequest,
};
use xmx_wire::mxoe::{
    units_mark, PacketRepr, PacketType, CONNECT_LEN, FRAME_LEN_MAX, HEAD_LEN, MEDIUM_LEN, MSG_LEN,
};

#[test]
fn tiny_to_a_remote_guest() {
    let mut tb = Testbed::new();
    let route = tb.route(3);
    tb.send(1, tiny(11, route, 7, b"hello")).unwrap();
    tb.pump();

    assert_eq!(tb.wire.len(), 1);
    let frame = &tb.wire[0];
    let repr = frame.parse();
    assert_eq!(repr.head.src, tb.guest(1).mac);
    assert_eq!(repr.head.dst, tb.guest(3).mac);
    assert_eq!(repr.buffer_len(), HEAD_LEN + MSG_LEN + 5);
    assert_eq!(frame.bytes.len(), 60, "padded to the Ethernet minimum");
    let PacketRepr::Tiny(t) = repr.packet else {
        panic!("not a TINY: {repr:?}")
    };
    assert_eq!(t.data, b"hello");
    assert_eq!(t.header.session, tb.guest(3).session);
    assert_eq!((t.header.src_endpoint, t.header.dst_endpoint), (EP, EP));
    assert_eq!(t.header.lib_seqnum, 7);
    assert_eq!(t.header.match_info, info(7).match_info);

    assert_eq!(tb.take_events(1), vec![send_done(11, 5)]);
    let ev = tb.take_events(3);
    assert_eq!(ev.len(), 1);
    let EventBody::RecvTiny { from, msg } = ev[0].body else {
        panic!("{ev:?}")
    };
    assert_eq!(
        from,
        Route {
            peer_index: tb.guest(1).peer_index,
            endpoint: EP,
            session_id: 0
        }
    );
    assert_eq!(msg.info, info(7));
    assert_eq!(msg.data.as_slice(), b"hello");
}

/// A sleeping application is woken for what it waits for, not for its own sends having
/// left: only a MEDIUM's completion, which gives its send-queue slots back, wakes it.
#[test]
fn only_completions_that_give_something_back_wake_the_guest() {
    let mut tb = Testbed::new();
    let route = tb.route(3);
    tb.send(1, tiny(1, route, 1, b"hi")).unwrap();
    tb.send(1, small(2, route, 2, &pattern(100, 1))).unwrap();
    tb.send(1, medium(3, route, 3, 5000, &[0, 1])).unwrap();
    tb.pump();
    let woken: Vec<(u32, bool)> = tb
        .take_guest_events(1)
        .iter()
        .map(|e| (e.event.tag, e.wakes))
        .collect();
    assert_eq!(woken, vec![(1, false), (2, false), (3, true)]);
    let received = tb.take_guest_events(3);
    assert_eq!(received.len(), 4, "TINY, SMALL and two MEDIUM fragments");
    assert!(received.iter().all(|e| e.wakes), "every arrival wakes");
}

#[test]
fn small_remote_and_co_located_give_the_same_events() {
    let data: Vec<u8> = pattern(100, 3);
    let mut tb = Testbed::new();

    let to_remote = tb.route(3);
    tb.send(1, small(1, to_remote, 9, &data)).unwrap();
    tb.pump();
    assert_eq!(tb.wire.len(), 1);
    assert_eq!(tb.wire[0].ptype(), PacketType::Small);
    assert_eq!(tb.wire[0].bytes.len(), HEAD_LEN + MSG_LEN + 100);
    let remote = tb.take_events(3);

    let to_local = tb.route(2);
    tb.send(1, small(2, to_local, 9, &data)).unwrap();
    tb.pump();
    assert_eq!(
        tb.wire.len(),
        1,
        "co-located delivery puts nothing on the wire"
    );
    let local = tb.take_events(2);

    assert_eq!(remote.len(), 1);
    assert_eq!(
        local, remote,
        "same event whether the frame crossed the wire or not"
    );
    let EventBody::RecvSmall { msg, .. } = local[0].body else {
        panic!("{local:?}")
    };
    assert_eq!(msg.data.as_slice(), &data[..]);
    assert_eq!(
        tb.take_events(1),
        vec![send_done(1, 100), send_done(2, 100)]
    );
    let c = tb.engines[0]
        .guest(tb.guest(1).id)
        .unwrap()
        .counters()
        .clone();
    assert_eq!((c.tx_frames, c.local_frames), (1, 1));
}

fn medium(tag: u32, route: Route, seqnum: u16, length: u32, slots: &[u16]) -> SendRequest {
    SendRequest {
        tag,
        route,
        op: SendOp::Medium(MediumSend {
            info: info(seqnum),
            length,
            sendq_slots: QueueSlots::new(slots).unwrap(),
        }),
    }
}

/// Send a MEDIUM of `length` bytes from guest 1 to guest `to`; check the frames and the
/// reassembled bytes in the receiver's queue.
fn medium_roundtrip(to: u32, length: u32) {
    medium_roundtrip_in(&mut Testbed::new(), to, length, 12, 3);
}

/// As [`medium_roundtrip`], on `tb`, with the fragments expected on the wire at a stride
/// of `1 << shift` bytes; the library still gets MX's 4 KiB fragments.
fn medium_roundtrip_in(tb: &mut Testbed, to: u32, length: u32, shift: u32, seqnum: u16) {
    tb.wire.clear();
    let data = pattern(length as usize, length as u8);
    let frags = medium_frags(length);
    // Fragments in reverse slot order, to check slots are honoured.
    let slots: Vec<u16> = (0..frags as u16).rev().collect();
    let sender = tb.guest(1);
    for (i, &slot) in slots.iter().enumerate() {
        let start = i * 4096;
        let end = (start + 4096).min(data.len());
        sender
            .mem
            .write_at(
                MemoryArea::SendQueue { endpoint: EP },
                u64::from(slot) * 4096,
                &data[start..end],
            )
            .unwrap();
    }
    let route = tb.route(to);
    tb.send(1, medium(5, route, seqnum, length, &slots))
        .unwrap();
    tb.pump();

    let local = tb.guest(to).host == sender.host;
    let stride = 1usize << shift;
    let on_wire = (length as usize).div_ceil(stride).max(1);
    let wire = frames_of(tb, PacketType::Medium);
    assert_eq!(wire.len(), if local { 0 } else { on_wire });
    for (i, f) in wire.iter().enumerate() {
        let PacketRepr::Medium(m) = packet(f) else {
            unreachable!()
        };
        assert_eq!(usize::from(m.frag_seqnum), i);
        assert_eq!(u32::from(m.frag_pipeline), shift);
        assert_eq!(u32::from(m.msg_length), length);
        let frag_len = (length as usize - i * stride).min(stride);
        assert_eq!(m.data.len(), frag_len);
        assert_eq!(f.parse().buffer_len(), HEAD_LEN + MEDIUM_LEN + frag_len);
        assert_eq!(m.data, &data[i * stride..i * stride + frag_len]);
    }
    assert_eq!(tb.take_events(1), vec![send_done(5, length)]);

    let events = tb.take_events(to);
    assert_eq!(events.len(), frags);
    let receiver = tb.guest(to);
    let recvq = receiver
        .mem
        .area(MemoryArea::RecvQueue { endpoint: EP })
        .unwrap();
    let mut got = vec![0u8; length as usize];
    let mut seen = vec![false; frags];
    for ev in &events {
        let EventBody::RecvMedium { from, frag } = ev.body else {
            panic!("{ev:?}")
        };
        assert_eq!(from.peer_index, sender.peer_index);
        assert_eq!(frag.info, info(seqnum));
        assert_eq!(frag.length, length);
        assert_eq!(frag.frag_pipeline, 12);
        let i = usize::from(frag.frag_seqnum);
        assert!(!seen[i]);
        seen[i] = true;
        let slot = usize::from(frag.recvq_slot) * 4096;
        let n = usize::from(frag.frag_length);
        got[i * 4096..i * 4096 + n].copy_from_slice(&recvq[slot..slot + n]);
    }
    assert_eq!(got, data, "bytes reassembled from the receive queue");

    // Slots come back through the engine; a slot not taken is a violation.
    let engine = tb.engine(to);
    for ev in &events {
        let EventBody::RecvMedium { frag, .. } = ev.body else {
            unreachable!()
        };
        engine
            .release_recvq_slot(receiver.id, EP, frag.recvq_slot)
            .unwrap();
    }
    assert_eq!(
        engine.guest(receiver.id).unwrap().free_recvq_slots(EP),
        Some(usize::from(RECVQ_SLOTS))
    );
}

#[test]
fn medium_one_to_eight_fragments_remote() {
    for length in [129, 4096, 4097, 8192, 12_000, 20_480, 28_673, 32_768] {
        medium_roundtrip(3, length);
    }
}

#[test]
fn medium_one_to_eight_fragments_co_located() {
    for length in [129, 4097, 16_385, 32_768] {
        medium_roundtrip(2, length);
    }
}

#[test]
fn medium_fragments_beyond_free_recvq_slots_are_dropped() {
    let mut tb = Testbed::new();
    let route = tb.route(3);
    // Three 8-fragment messages need 24 slots; the queue has 16.
    for tag in 0..3 {
        tb.send(
            1,
            medium(tag, route, tag as u16, 32_768, &[0, 1, 2, 3, 4, 5, 6, 7]),
        )
        .unwrap();
    }
    tb.pump();
    let received = tb.take_events(3).len();
    assert_eq!(received, usize::from(RECVQ_SLOTS));
    let g3 = tb.guest(3);
    let c = tb.engines[1].guest(g3.id).unwrap().counters().clone();
    assert_eq!(c.drops(xmx_engine::DropReason::RecvQueueFull), 8);
}

/// A MEDIUM whose third fragment cannot be read (the guest's send queue shrank under
/// it) leaves nothing on the wire: fragments are read straight into their frames, and
/// the frames already read are given back, not sent, when a later one faults.
#[test]
fn a_medium_with_an_unreadable_fragment_sends_no_fragment_at_all() {
    let mut tb = Testbed::new();
    let sender = tb.guest(1);
    let sendq = MemoryArea::SendQueue { endpoint: EP };
    sender.mem.remove_area(sendq);
    sender.mem.add_area(sendq, 2 * 4096);
    let route = tb.route(3);
    tb.send(1, medium(7, route, 3, 3 * 4096, &[0, 1, 2]))
        .unwrap();
    tb.pump();
    assert!(
        frames_of(&tb, PacketType::Medium).is_empty(),
        "no fragment left"
    );
    let ev = tb.take_events(1);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert!(
        matches!(
            ev[0].body,
            EventBody::Error {
                code: ErrorCode::Malformed
            }
        ),
        "{ev:?}"
    );
    let nic = tb.engine(1).guest(sender.id).unwrap();
    assert_eq!(nic.counters().drops(DropReason::MemoryFault), 1);
    assert!(tb.take_events(3).is_empty(), "the receiver got nothing");

    // The same endpoint's next MEDIUM, within the queue, goes whole.
    let data = pattern(2 * 4096, 9);
    sender.mem.write_at(sendq, 0, &data).unwrap();
    tb.send(1, medium(8, route, 4, 2 * 4096, &[0, 1])).unwrap();
    tb.pump();
    assert_eq!(frames_of(&tb, PacketType::Medium).len(), 2);
    assert_eq!(tb.take_events(1), vec![send_done(8, 2 * 4096)]);
}

/// Guest `from` connects to guest `to` (request, then reply): each engine learns from
/// the other's CONNECT how long MEDIUM fragments toward it may be.
fn connect(tb: &mut Testbed, from: u32, to: u32) {
    let request = RingConnectRequest {
        seqnum: 0,
        target_recv_seqnum_start: 1,
        app_key: 7,
        connect_seqnum: 1,
    };
    let route = Route {
        session_id: 0,
        ..tb.route(to)
    };
    let op = SendOp::ConnectRequest(request);
    tb.send(from, SendRequest { tag: 90, route, op }).unwrap();
    tb.pump();
    let reply = RingConnectReply {
        seqnum: 0,
        target_recv_seqnum_start: 1,
        connect_seqnum: 1,
        status: 0,
    };
    let (route, op) = (tb.route(from), SendOp::ConnectReply(reply));
    tb.send(to, SendRequest { tag: 91, route, op }).unwrap();
    tb.pump();
    tb.take_events(from);
    tb.take_events(to);
}

fn wide_config(units: u8) -> EngineConfig {
    EngineConfig {
        pull_reply_frames: units,
        ..EngineConfig::default()
    }
}

/// Two xmx engines whose links carry 8 KiB of data per frame send each other MEDIUM
/// fragments of 8 KiB once connected (the CONNECTs carry the mark); the receiving
/// engine hands the library MX's 4 KiB fragments, bytes in place. Before the CONNECT,
/// and for a message of one MX fragment, fragments stay MX's.
#[test]
fn medium_fragments_between_xmx_boards_are_as_wide_as_both_links_allow() {
    let mut tb = Testbed::with_config(wide_config(2));
    medium_roundtrip_in(&mut tb, 3, 20_000, 12, 1);
    connect(&mut tb, 1, 3);
    let mut seqnum = 2;
    for length in [4097, 8192, 12_000, 20_480, 28_673, 32_768] {
        medium_roundtrip_in(&mut tb, 3, length, 13, seqnum);
        seqnum += 1;
    }
    for length in [129, 4096] {
        medium_roundtrip_in(&mut tb, 3, length, 12, seqnum);
        seqnum += 1;
    }
    let c = tb.engines[0]
        .guest(tb.guest(1).id)
        .unwrap()
        .counters()
        .clone();
    // 1 + 1 + 2 + 3 + 4 + 4 wide frames, none sent again.
    assert_eq!((c.wide_frags_sent, c.wide_downgrades), (15, 0));
    let c = tb.engines[1]
        .guest(tb.guest(3).id)
        .unwrap()
        .counters()
        .clone();
    assert_eq!(c.wide_frags_received, 15);

    // Co-located guests too, once connected.
    connect(&mut tb, 1, 2);
    medium_roundtrip_in(&mut tb, 2, 32_768, 13, seqnum);

    // A link of 32 KiB frames at both ends: a MEDIUM is one frame.
    let mut tb = Testbed::with_config(wide_config(8));
    connect(&mut tb, 1, 3);
    medium_roundtrip_in(&mut tb, 3, 32_768, 15, 1);
    medium_roundtrip_in(&mut tb, 3, 30_000, 15, 2);
}

/// A peer that never marks its CONNECTs (MX, Open-MX, or an xmx host whose link carries
/// MX's frames only) gets MX's fragments, and its CONNECT padding is zeros.
#[test]
fn a_peer_without_the_mark_gets_mx_fragments() {
    let mut tb = Testbed::with_configs(wide_config(2), wide_config(1));
    connect(&mut tb, 1, 3);
    let connects = frames_of(&tb, PacketType::Connect);
    assert_eq!(connects.len(), 2);
    let after = |f: &WireFrame| f.bytes[HEAD_LEN + CONNECT_LEN..].to_vec();
    assert_eq!(
        units_mark::read(&after(&connects[0])),
        2,
        "host 0 marks its request"
    );
    assert!(
        after(&connects[1]).iter().all(|&b| b == 0),
        "host 1 does not"
    );
    medium_roundtrip_in(&mut tb, 3, 32_768, 12, 1);
    // Host 1 learnt host 0's mark but its own link takes MX's frames only.
    let data = pattern(8192, 4);
    let g3 = tb.guest(3);
    g3.mem
        .write_at(MemoryArea::SendQueue { endpoint: EP }, 0, &data)
        .unwrap();
    let route = tb.route(1);
    tb.send(3, medium(6, route, 1, 8192, &[0, 1])).unwrap();
    tb.pump();
    let wire = frames_of(&tb, PacketType::Medium);
    assert_eq!(wire.len(), 2 + 8);
    assert!(wire.iter().all(|f| f.bytes.len() <= FRAME_LEN_MAX));
}

/// The library sends a message again when it is not acked; a message first sent wide
/// (lost here, as a link that stopped carrying long frames would lose it) goes again in
/// MX's fragments, and so do that peer's later messages until it connects again.
#[test]
fn a_wide_medium_sent_again_goes_in_mx_fragments() {
    let mut tb = Testbed::with_config(wide_config(2));
    connect(&mut tb, 1, 3);
    let data = pattern(16_384, 5);
    let g1 = tb.guest(1);
    g1.mem
        .write_at(MemoryArea::SendQueue { endpoint: EP }, 0, &data)
        .unwrap();
    let route = tb.route(3);
    tb.send(1, medium(1, route, 9, 16_384, &[0, 1, 2, 3]))
        .unwrap();
    tb.pump_with(|f| f.ptype() == PacketType::Medium);
    assert_eq!(tb.lost.len(), 2, "two 8 KiB fragments, lost");
    assert!(tb.take_events(3).is_empty());
    tb.send(1, medium(2, route, 9, 16_384, &[0, 1, 2, 3]))
        .unwrap();
    tb.pump();
    let wire = frames_of(&tb, PacketType::Medium);
    assert_eq!(wire.len(), 4, "sent again in 4 KiB fragments");
    let c = tb.engines[0].guest(g1.id).unwrap().counters().clone();
    assert_eq!(c.wide_downgrades, 1);
    let release = |tb: &mut Testbed| {
        let events = tb.take_events(3);
        let g3 = tb.guest(3).id;
        for ev in &events {
            let EventBody::RecvMedium { frag, .. } = ev.body else {
                panic!("{ev:?}")
            };
            tb.engine(3)
                .release_recvq_slot(g3, EP, frag.recvq_slot)
                .unwrap();
        }
        events.len()
    };
    assert_eq!(release(&mut tb), 4);
    for seqnum in [10, 11] {
        tb.wire.clear();
        tb.send(1, medium(3, route, seqnum, 16_384, &[0, 1, 2, 3]))
            .unwrap();
        tb.pump();
        assert_eq!(
            frames_of(&tb, PacketType::Medium).len(),
            4,
            "narrow until a CONNECT"
        );
        assert_eq!(release(&mut tb), 4);
    }
    connect(&mut tb, 1, 3);
    medium_roundtrip_in(&mut tb, 3, 16_384, 13, 12);
}

/// A wide fragment is delivered whole or not at all: with fewer free receive-queue slots
/// than the MX fragments it covers, it is dropped (the sender sends the message again)
/// and no slot is lost; what fits still goes.
#[test]
fn a_wide_fragment_beyond_the_free_recvq_slots_is_dropped_whole() {
    let mut tb = Testbed::with_config(wide_config(2));
    connect(&mut tb, 1, 3);
    let route = tb.route(3);
    // 8 + 7 slots held by the library: one left.
    tb.send(1, medium(1, route, 1, 32_768, &[0, 1, 2, 3, 4, 5, 6, 7]))
        .unwrap();
    tb.send(1, medium(2, route, 2, 28_672, &[0, 1, 2, 3, 4, 5, 6]))
        .unwrap();
    tb.pump();
    assert_eq!(tb.take_events(3).len(), 15);
    let g3 = tb.guest(3);
    assert_eq!(
        tb.engine(3).guest(g3.id).unwrap().free_recvq_slots(EP),
        Some(1)
    );
    tb.send(1, medium(3, route, 3, 8192, &[0, 1])).unwrap();
    tb.pump();
    assert!(
        tb.take_events(3).is_empty(),
        "nothing of a fragment that does not fit"
    );
    let nic = tb.engine(3).guest(g3.id).unwrap();
    assert_eq!(nic.free_recvq_slots(EP), Some(1));
    assert_eq!(nic.counters().drops(DropReason::RecvQueueFull), 1);
    tb.send(1, medium(4, route, 4, 4096, &[0])).unwrap();
    tb.pump();
    assert_eq!(tb.take_events(3).len(), 1, "one slot, one MX fragment");
}

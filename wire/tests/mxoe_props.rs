//! Properties of the MXoE parsers and emitters: round trips per packet type
//! and per frame, refusal of every truncation, and no panic on any input.

use std::ops::Range;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::FileFailurePersistence;
use xmx_wire::mxoe::*;
use xmx_wire::Error;

// ---------------------------------------------------------------- strategies

fn arb_mac() -> impl Strategy<Value = Mac> {
    any::<[u8; 6]>().prop_map(Mac)
}

fn arb_head() -> impl Strategy<Value = HeadRepr> {
    (arb_mac(), arb_mac(), any::<u16>()).prop_map(|(dst, src, dst_src_peer_index)| HeadRepr {
        dst,
        src,
        dst_src_peer_index,
    })
}

fn arb_msg_header() -> impl Strategy<Value = MsgHeader> {
    (
        any::<(u8, u8, u8)>(),
        any::<(u16, u16)>(),
        any::<u64>(),
        any::<u32>(),
        any::<u16>(),
    )
        .prop_map(
            |(
                (dst_endpoint, src_endpoint, src_generation),
                (lib_seqnum, lib_piggyack),
                match_info,
                session,
                checksum,
            )| {
                MsgHeader {
                    dst_endpoint,
                    src_endpoint,
                    src_generation,
                    lib_seqnum,
                    lib_piggyack,
                    match_info,
                    session,
                    checksum,
                }
            },
        )
}

fn arb_host_query() -> impl Strategy<Value = HostQueryRepr> {
    any::<(u16, u32)>().prop_map(|(src_dst_peer_index, magic)| HostQueryRepr {
        src_dst_peer_index,
        magic,
    })
}

fn arb_truc() -> impl Strategy<Value = TrucRepr> {
    (
        any::<(u8, u8, u8, u32)>(),
        any::<(u16, u32, u32, u16, u8)>(),
    )
        .prop_map(
            |(
                (dst_endpoint, src_endpoint, src_generation, session),
                (lib_seqnum, session_id, acknum, send_seq, resent),
            )| {
                TrucRepr {
                    dst_endpoint,
                    src_endpoint,
                    src_generation,
                    session,
                    liback: LibAck {
                        lib_seqnum,
                        session_id,
                        acknum,
                        send_seq,
                        resent,
                    },
                }
            },
        )
}

fn arb_connect() -> impl Strategy<Value = ConnectRepr> {
    let request = any::<(u32, u32, u16, u8)>().prop_map(
        |(src_session_id, app_key, target_recv_seqnum_start, connect_seqnum)| {
            ConnectData::Request(ConnectRequestData {
                src_session_id,
                app_key,
                target_recv_seqnum_start,
                connect_seqnum,
            })
        },
    );
    let reply = (any::<(u32, u32, u16, u8)>(), select(ConnectStatus::ALL)).prop_map(
        |(
            (src_session_id, target_session_id, target_recv_seqnum_start, connect_seqnum),
            status,
        )| {
            ConnectData::Reply(ConnectReplyData {
                src_session_id,
                target_session_id,
                target_recv_seqnum_start,
                connect_seqnum,
                status,
            })
        },
    );
    (any::<(u8, u8, u8, u16, u16)>(), prop_oneof![request, reply]).prop_map(
        |((dst_endpoint, src_endpoint, src_generation, lib_seqnum, src_dst_peer_index), data)| {
            ConnectRepr {
                dst_endpoint,
                src_endpoint,
                src_generation,
                lib_seqnum,
                src_dst_peer_index,
                data,
            }
        },
    )
}

fn arb_rndv() -> impl Strategy<Value = RndvRepr> {
    (arb_msg_header(), any::<(u32, u8, u8, u16)>()).prop_map(
        |(header, (msg_length, pulled_rdma_id, pulled_rdma_seqnum, pulled_rdma_offset))| RndvRepr {
            header,
            msg_length,
            pulled_rdma_id,
            pulled_rdma_seqnum,
            pulled_rdma_offset,
        },
    )
}

fn arb_pull() -> impl Strategy<Value = PullRepr> {
    let block = (0..PULL_REPLY_LEN_MAX as u16).prop_flat_map(|first_frame_offset| {
        let room = PULL_BLOCK_LEN_MAX as u16 - first_frame_offset;
        (Just(first_frame_offset), 0..=room)
    });
    (
        any::<(u8, u8, u8, u32, u32)>(),
        any::<(u8, u8, u16, u32, u32, u32)>(),
        block,
    )
        .prop_map(
            |(
                (dst_endpoint, src_endpoint, src_generation, session, total_length),
                (
                    pulled_rdma_id,
                    pulled_rdma_seqnum,
                    pulled_rdma_offset,
                    src_pull_handle,
                    src_magic,
                    frame_index,
                ),
                (first_frame_offset, block_length),
            )| PullRepr {
                dst_endpoint,
                src_endpoint,
                src_generation,
                session,
                total_length,
                pulled_rdma_id,
                pulled_rdma_seqnum,
                pulled_rdma_offset,
                src_pull_handle,
                src_magic,
                first_frame_offset,
                block_length,
                frame_index,
            },
        )
}

fn arb_notify() -> impl Strategy<Value = NotifyRepr> {
    (any::<(u8, u8, u8, u32, u32)>(), any::<(u8, u8, u16, u16)>()).prop_map(
        |(
            (dst_endpoint, src_endpoint, src_generation, session, total_length),
            (pulled_rdma_id, pulled_rdma_seqnum, lib_seqnum, lib_piggyack),
        )| NotifyRepr {
            dst_endpoint,
            src_endpoint,
            src_generation,
            session,
            total_length,
            pulled_rdma_id,
            pulled_rdma_seqnum,
            lib_seqnum,
            lib_piggyack,
        },
    )
}

fn arb_nack_lib() -> impl Strategy<Value = NackLibRepr> {
    (any::<(u8, u8, u8, u16, u16)>(), select(NackType::ALL)).prop_map(
        |(
            (src_endpoint, src_generation, dst_endpoint, dst_src_peer_index, lib_seqnum),
            nack_type,
        )| {
            NackLibRepr {
                src_endpoint,
                src_generation,
                nack_type,
                dst_endpoint,
                dst_src_peer_index,
                lib_seqnum,
            }
        },
    )
}

fn arb_nack_mcp() -> impl Strategy<Value = NackMcpRepr> {
    (any::<(u8, u8, u32, u32)>(), select(NackType::ALL)).prop_map(
        |((src_endpoint, src_generation, src_pull_handle, src_magic), nack_type)| NackMcpRepr {
            src_endpoint,
            src_generation,
            nack_type,
            src_pull_handle,
            src_magic,
        },
    )
}

/// A MEDIUM fragment's (message length, seqnum, data) that lies inside its message.
fn arb_medium_parts() -> impl Strategy<Value = (u16, u8, u8, Vec<u8>)> {
    // MX's stride and xmx's wider ones, each fragment inside a message of at most 32 KiB.
    (MEDIUM_FRAG_LEN_SHIFT..=MEDIUM_FRAG_LEN_SHIFT_MAX)
        .prop_flat_map(|pipeline| {
            let frags = (MEDIUM_MSG_LEN_MAX >> pipeline) as u8;
            (Just(pipeline as u8), 0..frags)
        })
        .prop_flat_map(|(pipeline, frag_seqnum)| {
            let start = usize::from(frag_seqnum) << pipeline;
            let room = (1usize << pipeline).min(MEDIUM_MSG_LEN_MAX - start);
            (
                Just(pipeline),
                Just(frag_seqnum),
                vec(any::<u8>(), 0..=room),
            )
        })
        .prop_flat_map(|(pipeline, frag_seqnum, data)| {
            let end = (usize::from(frag_seqnum) << pipeline) + data.len();
            let msg_length = end as u16..=MEDIUM_MSG_LEN_MAX as u16;
            (msg_length, Just(frag_seqnum), Just(pipeline), Just(data))
        })
}

/// A packet whose payload is owned, so strategies can produce it.
#[derive(Debug, Clone)]
enum OwnedPacket {
    Raw(Vec<u8>),
    HostQuery(HostQueryRepr),
    HostReply(u16, u32, Vec<u8>),
    Truc(TrucRepr),
    Connect(ConnectRepr),
    Tiny(MsgHeader, Vec<u8>),
    Small(MsgHeader, Vec<u8>),
    Medium(MsgHeader, (u16, u8, u8, Vec<u8>)),
    Rndv(RndvRepr),
    Pull(PullRepr),
    PullReply((u8, u32, u32, u32), Vec<u8>),
    Notify(NotifyRepr),
    NackLib(NackLibRepr),
    NackMcp(NackMcpRepr),
}

impl OwnedPacket {
    fn repr(&self) -> PacketRepr<'_> {
        match self {
            OwnedPacket::Raw(payload) => PacketRepr::Raw(RawRepr { payload }),
            OwnedPacket::HostQuery(r) => PacketRepr::HostQuery(*r),
            OwnedPacket::HostReply(src_dst_peer_index, magic, hostname) => {
                PacketRepr::HostReply(HostReplyRepr {
                    src_dst_peer_index: *src_dst_peer_index,
                    magic: *magic,
                    hostname,
                })
            }
            OwnedPacket::Truc(r) => PacketRepr::Truc(*r),
            OwnedPacket::Connect(r) => PacketRepr::Connect(*r),
            OwnedPacket::Tiny(header, data) => PacketRepr::Tiny(TinyRepr {
                header: *header,
                data,
            }),
            OwnedPacket::Small(header, data) => PacketRepr::Small(SmallRepr {
                header: *header,
                data,
            }),
            OwnedPacket::Medium(header, (msg_length, frag_seqnum, frag_pipeline, data)) => {
                PacketRepr::Medium(MediumRepr {
                    header: *header,
                    msg_length: *msg_length,
                    frag_seqnum: *frag_seqnum,
                    frag_pipeline: *frag_pipeline,
                    data,
                })
            }
            OwnedPacket::Rndv(r) => PacketRepr::Rndv(*r),
            OwnedPacket::Pull(r) => PacketRepr::Pull(*r),
            OwnedPacket::PullReply(
                (frame_seqnum, msg_offset, dst_pull_handle, dst_magic),
                data,
            ) => PacketRepr::PullReply(PullReplyRepr {
                frame_seqnum: *frame_seqnum,
                msg_offset: *msg_offset,
                dst_pull_handle: *dst_pull_handle,
                dst_magic: *dst_magic,
                data,
            }),
            OwnedPacket::Notify(r) => PacketRepr::Notify(*r),
            OwnedPacket::NackLib(r) => PacketRepr::NackLib(*r),
            OwnedPacket::NackMcp(r) => PacketRepr::NackMcp(*r),
        }
    }
}

fn arb_packet() -> impl Strategy<Value = OwnedPacket> {
    prop_oneof![
        vec(any::<u8>(), 0..=RAW_PAYLOAD_LEN_MAX).prop_map(OwnedPacket::Raw),
        arb_host_query().prop_map(OwnedPacket::HostQuery),
        (any::<u16>(), any::<u32>(), vec(any::<u8>(), 1..=255))
            .prop_map(|(i, m, h)| OwnedPacket::HostReply(i, m, h)),
        arb_truc().prop_map(OwnedPacket::Truc),
        arb_connect().prop_map(OwnedPacket::Connect),
        (arb_msg_header(), vec(any::<u8>(), 0..=TINY_MSG_LEN_MAX))
            .prop_map(|(h, d)| OwnedPacket::Tiny(h, d)),
        (arb_msg_header(), vec(any::<u8>(), 0..=SMALL_MSG_LEN_MAX))
            .prop_map(|(h, d)| OwnedPacket::Small(h, d)),
        (arb_msg_header(), arb_medium_parts()).prop_map(|(h, p)| OwnedPacket::Medium(h, p)),
        arb_rndv().prop_map(OwnedPacket::Rndv),
        arb_pull().prop_map(OwnedPacket::Pull),
        (
            any::<(u8, u32, u32, u32)>(),
            vec(any::<u8>(), 0..=PULL_REPLY_LEN_MAX)
        )
            .prop_map(|(f, d)| OwnedPacket::PullReply(f, d)),
        arb_notify().prop_map(OwnedPacket::Notify),
        arb_nack_lib().prop_map(OwnedPacket::NackLib),
        arb_nack_mcp().prop_map(OwnedPacket::NackMcp),
    ]
}

// ------------------------------------------------------------------- helpers

/// Emits `repr` through a view, parses it back through a checked view, and
/// checks both the value and the bytes survive.
macro_rules! assert_round_trip {
    ($repr:expr, $view:ident, $ty:ident) => {{
        let repr = $repr;
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut $view::new_unchecked(&mut buf[..])).unwrap();
        let view = $view::new_checked(&buf[..]).unwrap();
        let parsed = $ty::parse(&view).unwrap();
        prop_assert_eq!(&parsed, &repr);
        let mut again = vec![0xffu8; buf.len()];
        parsed
            .emit(&mut $view::new_unchecked(&mut again[..]))
            .unwrap();
        prop_assert_eq!(again, buf);
    }};
}

/// Padding bytes of a packet, relative to its first byte.
#[allow(clippy::single_range_in_vec_init)]
fn pads(packet: &PacketRepr<'_>) -> Vec<Range<usize>> {
    match packet {
        PacketRepr::HostQuery(_) => vec![1..2, 4..8, 12..16],
        PacketRepr::HostReply(_) => vec![4..8, 12..16],
        PacketRepr::Truc(_) => vec![5..8, 13..14, 27..28],
        PacketRepr::Connect(c) => match c.data {
            ConnectData::Request(_) => vec![5..8, 12..16, 28..32],
            ConnectData::Reply(_) => vec![5..8, 12..16, 29..32],
        },
        PacketRepr::Medium(_) => vec![6..8, 30..32],
        PacketRepr::Notify(_) => vec![14..18, 22..24],
        PacketRepr::NackLib(_) => vec![4..9, 14..16],
        PacketRepr::NackMcp(_) => vec![4..8],
        PacketRepr::Raw(_)
        | PacketRepr::Tiny(_)
        | PacketRepr::Small(_)
        | PacketRepr::Rndv(_)
        | PacketRepr::Pull(_)
        | PacketRepr::PullReply(_) => vec![],
    }
}

/// Every typed parser over the same bytes; none may panic.
fn parse_with_every_view(bytes: &[u8]) {
    let _ = FrameRepr::parse(bytes);
    let _ = PacketRepr::parse(bytes);
    if let Ok(p) = HeadPacket::new_checked(bytes) {
        let _ = HeadRepr::parse(&p);
        let _ = p.packet_type();
    }
    macro_rules! each {
        ($($view:ident => $ty:ident),* $(,)?) => {$(
            if let Ok(p) = $view::new_checked(bytes) {
                let _ = $ty::parse(&p);
            }
            let unchecked = $view::new_unchecked(bytes);
            let _ = $ty::parse(&unchecked);
        )*};
    }
    each!(
        RawPacket => RawRepr,
        HostQueryPacket => HostQueryRepr,
        HostReplyPacket => HostReplyRepr,
        TrucPacket => TrucRepr,
        ConnectPacket => ConnectRepr,
        TinyPacket => TinyRepr,
        SmallPacket => SmallRepr,
        MediumPacket => MediumRepr,
        RndvPacket => RndvRepr,
        PullPacket => PullRepr,
        PullReplyPacket => PullReplyRepr,
        NotifyPacket => NotifyRepr,
        NackLibPacket => NackLibRepr,
        NackMcpPacket => NackMcpRepr,
    );
}

// ---------------------------------------------------------------- properties

/// Failing cases are kept next to this file (`mxoe_props.regressions`).
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn head_round_trip(repr in arb_head()) {
        assert_round_trip!(repr, HeadPacket, HeadRepr);
    }

    #[test]
    fn host_query_round_trip(repr in arb_host_query()) {
        assert_round_trip!(repr, HostQueryPacket, HostQueryRepr);
    }

    #[test]
    fn host_reply_round_trip(index: u16, magic: u32, hostname in vec(any::<u8>(), 1..=255)) {
        let repr = HostReplyRepr { src_dst_peer_index: index, magic, hostname: &hostname };
        assert_round_trip!(repr, HostReplyPacket, HostReplyRepr);
    }

    #[test]
    fn truc_round_trip(repr in arb_truc()) {
        assert_round_trip!(repr, TrucPacket, TrucRepr);
    }

    #[test]
    fn connect_round_trip(repr in arb_connect()) {
        assert_round_trip!(repr, ConnectPacket, ConnectRepr);
    }

    #[test]
    fn tiny_round_trip(header in arb_msg_header(), data in vec(any::<u8>(), 0..=TINY_MSG_LEN_MAX)) {
        assert_round_trip!(TinyRepr { header, data: &data }, TinyPacket, TinyRepr);
    }

    #[test]
    fn small_round_trip(header in arb_msg_header(), data in vec(any::<u8>(), 0..=SMALL_MSG_LEN_MAX)) {
        assert_round_trip!(SmallRepr { header, data: &data }, SmallPacket, SmallRepr);
    }

    #[test]
    fn medium_round_trip(header in arb_msg_header(), (msg_length, frag_seqnum, frag_pipeline, data) in arb_medium_parts()) {
        let repr = MediumRepr { header, msg_length, frag_seqnum, frag_pipeline, data: &data };
        assert_round_trip!(repr, MediumPacket, MediumRepr);
    }

    #[test]
    fn rndv_round_trip(repr in arb_rndv()) {
        assert_round_trip!(repr, RndvPacket, RndvRepr);
    }

    #[test]
    fn pull_round_trip(repr in arb_pull()) {
        assert_round_trip!(repr, PullPacket, PullRepr);
        prop_assert!(repr.replies() <= PULL_REPLIES_PER_BLOCK);
    }

    #[test]
    fn pull_reply_round_trip(fields in any::<(u8, u32, u32, u32)>(), data in vec(any::<u8>(), 0..=PULL_REPLY_LEN_MAX)) {
        let (frame_seqnum, msg_offset, dst_pull_handle, dst_magic) = fields;
        let repr = PullReplyRepr { frame_seqnum, msg_offset, dst_pull_handle, dst_magic, data: &data };
        assert_round_trip!(repr, PullReplyPacket, PullReplyRepr);
    }

    #[test]
    fn notify_round_trip(repr in arb_notify()) {
        assert_round_trip!(repr, NotifyPacket, NotifyRepr);
    }

    #[test]
    fn nack_lib_round_trip(repr in arb_nack_lib()) {
        assert_round_trip!(repr, NackLibPacket, NackLibRepr);
    }

    #[test]
    fn nack_mcp_round_trip(repr in arb_nack_mcp()) {
        assert_round_trip!(repr, NackMcpPacket, NackMcpRepr);
    }

    #[test]
    fn raw_round_trip(payload in vec(any::<u8>(), 0..=RAW_PAYLOAD_LEN_MAX)) {
        assert_round_trip!(RawRepr { payload: &payload }, RawPacket, RawRepr);
    }

    #[test]
    fn mac_display_parse_round_trip(mac in arb_mac()) {
        prop_assert_eq!(mac.to_string().parse::<Mac>(), Ok(mac));
        prop_assert_eq!(Mac::from_board_addr(mac.to_board_addr()), Ok(mac));
    }

    #[test]
    fn frame_round_trip(head in arb_head(), packet in arb_packet()) {
        let repr = FrameRepr { head, packet: packet.repr() };
        let bytes = repr.to_vec().unwrap();
        prop_assert_eq!(bytes.len(), repr.buffer_len());
        // MX's frames fit its MTU; only xmx's wider MEDIUM fragments go beyond.
        let wide = matches!(repr.packet, PacketRepr::Medium(m) if m.frag_pipeline > 12);
        prop_assert!(bytes.len() <= FRAME_LEN_MAX || wide);
        let parsed = FrameRepr::parse(&bytes).unwrap();
        prop_assert_eq!(parsed, repr);
        prop_assert_eq!(parsed.to_vec().unwrap(), bytes.clone());

        // Ethernet padding after the packet changes nothing (RAW owns it).
        if repr.packet.packet_type() != PacketType::Raw {
            let mut padded = bytes.clone();
            padded.resize(repr.wire_len() + 16, 0xee);
            prop_assert_eq!(FrameRepr::parse(&padded), Ok(repr));
        }
    }

    #[test]
    fn truncated_frames_are_refused(head in arb_head(), packet in arb_packet()) {
        let repr = FrameRepr { head, packet: packet.repr() };
        let bytes = repr.to_vec().unwrap();
        let is_raw = repr.packet.packet_type() == PacketType::Raw;
        for len in 0..bytes.len() {
            let result = FrameRepr::parse(&bytes[..len]);
            if is_raw && len > HEAD_LEN {
                // RAW has no length field: a prefix is a shorter RAW frame.
                let expected = RawRepr { payload: &bytes[HEAD_LEN + 1..len] };
                prop_assert_eq!(result, Ok(FrameRepr { head, packet: PacketRepr::Raw(expected) }));
                continue;
            }
            match result {
                Err(Error::Truncated { needed, have }) => {
                    prop_assert_eq!(have, len);
                    prop_assert!(needed > len && needed <= bytes.len(), "needed {} for {} of {}", needed, len, bytes.len());
                }
                other => prop_assert!(false, "prefix of {} bytes gave {:?}", len, other),
            }
        }
    }

    #[test]
    fn emit_into_short_buffer_is_refused(head in arb_head(), packet in arb_packet(), cut in 1usize..64) {
        let repr = FrameRepr { head, packet: packet.repr() };
        let len = repr.buffer_len().saturating_sub(cut);
        let mut buf = vec![0u8; len];
        prop_assert_eq!(
            repr.emit(&mut buf),
            Err(Error::BufferTooSmall { needed: repr.buffer_len(), have: len })
        );
    }

    /// Changing a few bytes of a valid frame: parsing either refuses it or
    /// accepts a value that emits back to the same bytes, pads aside.
    #[test]
    fn mutated_frames_parse_consistently(
        head in arb_head(),
        packet in arb_packet(),
        edits in vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let mut bytes = FrameRepr { head, packet: packet.repr() }.to_vec().unwrap();
        for (index, value) in edits {
            let i = index.index(bytes.len());
            bytes[i] = value;
        }
        parse_with_every_view(&bytes);
        if let Ok(parsed) = FrameRepr::parse(&bytes) {
            let emitted = parsed.to_vec().unwrap();
            prop_assert!(emitted.len() <= bytes.len());
            let mut expected = bytes[..emitted.len()].to_vec();
            for pad in pads(&parsed.packet) {
                expected[HEAD_LEN + pad.start..HEAD_LEN + pad.end].fill(0);
            }
            prop_assert_eq!(&emitted, &expected);
            prop_assert_eq!(FrameRepr::parse(&emitted), Ok(parsed));
        }
    }
}

proptest! {
    #![proptest_config(config(2048))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..300)) {
        parse_with_every_view(&bytes);
        if bytes.len() > HEAD_LEN {
            parse_with_every_view(&bytes[HEAD_LEN..]);
        }
    }

    /// A valid head and a known type byte, then noise: reaches every parser's checks.
    #[test]
    fn typed_noise_never_panics(
        head in arb_head(),
        ptype in select(PacketType::ALL),
        noise in vec(any::<u8>(), 0..200),
    ) {
        let mut bytes = vec![0u8; HEAD_LEN];
        head.emit(&mut HeadPacket::new_unchecked(&mut bytes[..])).unwrap();
        bytes.push(ptype as u8);
        bytes.extend_from_slice(&noise);
        parse_with_every_view(&bytes);
        match FrameRepr::parse(&bytes) {
            Ok(parsed) => {
                prop_assert_eq!(parsed.head, head);
                prop_assert_eq!(parsed.packet.packet_type(), ptype);
                let emitted = parsed.to_vec().unwrap();
                prop_assert_eq!(FrameRepr::parse(&emitted), Ok(parsed));
            }
            Err(Error::Truncated { have, .. }) => prop_assert_eq!(have, bytes.len()),
            Err(_) => {}
        }
    }
}

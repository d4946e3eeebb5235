//! Known MXoE frames, assembled byte by byte from the wire layout: each one
//! parses to the expected fields and emits back to the same bytes.

use xmx_wire::mxoe::*;

/// dst 00:60:dd:11:22:33, src 02:16:3e:44:55:66, ethertype 0x86df, peer index 0x0102.
const HEAD: [u8; 16] = [
    0x00, 0x60, 0xdd, 0x11, 0x22, 0x33, 0x02, 0x16, 0x3e, 0x44, 0x55, 0x66, 0x86, 0xdf, 0x01, 0x02,
];

fn head() -> HeadRepr {
    HeadRepr {
        dst: Mac([0x00, 0x60, 0xdd, 0x11, 0x22, 0x33]),
        src: Mac([0x02, 0x16, 0x3e, 0x44, 0x55, 0x66]),
        dst_src_peer_index: 0x0102,
    }
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut bytes = HEAD.to_vec();
    bytes.extend_from_slice(body);
    bytes
}

/// Parses `bytes`, compares with `expected`, emits `expected` and compares
/// with `bytes`; also checks that Ethernet padding does not change the result.
fn check_known(bytes: &[u8], expected: PacketRepr<'_>) {
    let expected = FrameRepr {
        head: head(),
        packet: expected,
    };
    assert_eq!(FrameRepr::parse(bytes), Ok(expected));
    assert_eq!(expected.buffer_len(), bytes.len());
    assert_eq!(expected.to_vec().unwrap(), bytes);

    let mut padded = bytes.to_vec();
    padded.resize(expected.wire_len() + 7, 0);
    if expected.packet.packet_type() != PacketType::Raw {
        assert_eq!(FrameRepr::parse(&padded), Ok(expected));
    }

    // Emitting into a dirty buffer rewrites every covered byte, pads included.
    let mut dirty = vec![0xa5u8; bytes.len() + 3];
    assert_eq!(expected.emit(&mut dirty), Ok(bytes.len()));
    assert_eq!(&dirty[..bytes.len()], bytes);
    assert_eq!(&dirty[bytes.len()..], &[0xa5; 3]);
}

fn msg_header() -> MsgHeader {
    MsgHeader {
        dst_endpoint: 1,
        src_endpoint: 2,
        src_generation: 9,
        lib_seqnum: 0x0010,
        lib_piggyack: 0x000f,
        match_info: 0x0102_0304_0506_0708,
        session: 0xcafe_babe,
        checksum: 0xabcd,
    }
}

#[rustfmt::skip]
const MSG_HEADER_TAIL: [u8; 18] = [
    0xab, 0xcd,             // checksum
    0x00, 0x10,             // lib_seqnum
    0x00, 0x0f,             // lib_piggyack
    0x01, 0x02, 0x03, 0x04, // match_a
    0x05, 0x06, 0x07, 0x08, // match_b
    0xca, 0xfe, 0xba, 0xbe, // session
];

#[test]
fn host_query() {
    #[rustfmt::skip]
    let bytes = frame(&[
        3, 0,                   // ptype, pad
        0x00, 0x2a,             // src_dst_peer_index
        0, 0, 0, 0,             // pad0
        0x13, 0x05, 0x20, 0x08, // magic
        0, 0, 0, 0,             // pad1
    ]);
    check_known(
        &bytes,
        PacketRepr::HostQuery(HostQueryRepr {
            src_dst_peer_index: 42,
            magic: HOST_QUERY_MAGIC,
        }),
    );
    let view = HostQueryPacket::new_checked(&bytes[16..]).unwrap();
    assert_eq!((view.ptype(), view.magic()), (3, 0x1305_2008));
}

#[test]
fn host_reply() {
    #[rustfmt::skip]
    let bytes = frame(&[
        4, 6,                   // ptype, length
        0x00, 0x07,             // src_dst_peer_index
        0, 0, 0, 0,             // pad0
        0x13, 0x05, 0x20, 0x08, // magic
        0, 0, 0, 0,             // pad1
        b'n', b'o', b'd', b'e', b'1', 0,
    ]);
    let repr = HostReplyRepr {
        src_dst_peer_index: 7,
        magic: HOST_QUERY_MAGIC,
        hostname: b"node1\0",
    };
    check_known(&bytes, PacketRepr::HostReply(repr));
    assert_eq!(repr.name(), b"node1");
    let view = HostReplyPacket::new_checked(&bytes[16..]).unwrap();
    assert_eq!((view.length(), view.hostname()), (6, &b"node1\0"[..]));
}

#[test]
fn truc_liback() {
    #[rustfmt::skip]
    let bytes = frame(&[
        35, 3, 5, 1,            // ptype, dst_endpoint, src_endpoint, src_generation
        16, 0, 0, 0,            // length, pad1
        0xde, 0xad, 0xbe, 0xef, // session
        0x55, 0,                // data type, pad
        0x00, 0x09,             // lib_seqnum
        0xde, 0xad, 0xbe, 0xef, // session_id
        0x00, 0x00, 0x01, 0x00, // acknum
        0x00, 0x0a,             // send_seq
        1, 0,                   // resent, pad1
    ]);
    check_known(
        &bytes,
        PacketRepr::Truc(TrucRepr {
            dst_endpoint: 3,
            src_endpoint: 5,
            src_generation: 1,
            session: 0xdead_beef,
            liback: LibAck {
                lib_seqnum: 9,
                session_id: 0xdead_beef,
                acknum: 256,
                send_seq: 10,
                resent: 1,
            },
        }),
    );
}

#[test]
fn connect_request() {
    #[rustfmt::skip]
    let bytes = frame(&[
        36, 2, 4, 0,            // ptype, dst_endpoint, src_endpoint, src_generation
        16, 0, 0, 0,            // length, pad1
        0x00, 0x01,             // lib_seqnum
        0x00, 0x2a,             // src_dst_peer_index
        0, 0, 0, 0,             // pad2
        0x11, 0x22, 0x33, 0x44, // src_session_id
        0x00, 0x00, 0x12, 0x34, // app_key
        0x00, 0x05,             // target_recv_seqnum_start
        0, 3,                   // is_reply, connect_seqnum
        0, 0, 0, 0,             // pad
    ]);
    check_known(
        &bytes,
        PacketRepr::Connect(ConnectRepr {
            dst_endpoint: 2,
            src_endpoint: 4,
            src_generation: 0,
            lib_seqnum: 1,
            src_dst_peer_index: 42,
            data: ConnectData::Request(ConnectRequestData {
                src_session_id: 0x1122_3344,
                app_key: 0x1234,
                target_recv_seqnum_start: 5,
                connect_seqnum: 3,
            }),
        }),
    );
}

#[test]
fn connect_reply() {
    #[rustfmt::skip]
    let bytes = frame(&[
        36, 4, 2, 0,            // ptype, dst_endpoint, src_endpoint, src_generation
        16, 0, 0, 0,            // length, pad1
        0x00, 0x02,             // lib_seqnum
        0x00, 0x07,             // src_dst_peer_index
        0, 0, 0, 0,             // pad2
        0x55, 0x66, 0x77, 0x88, // src_session_id
        0x11, 0x22, 0x33, 0x44, // target_session_id
        0x00, 0x06,             // target_recv_seqnum_start
        1, 3,                   // is_reply, connect_seqnum
        11, 0, 0, 0,            // status (bad key), pad
    ]);
    check_known(
        &bytes,
        PacketRepr::Connect(ConnectRepr {
            dst_endpoint: 4,
            src_endpoint: 2,
            src_generation: 0,
            lib_seqnum: 2,
            src_dst_peer_index: 7,
            data: ConnectData::Reply(ConnectReplyData {
                src_session_id: 0x5566_7788,
                target_session_id: 0x1122_3344,
                target_recv_seqnum_start: 6,
                connect_seqnum: 3,
                status: ConnectStatus::BadKey,
            }),
        }),
    );
}

#[test]
fn tiny() {
    let mut body = vec![37, 1, 2, 9, 0x00, 0x05];
    body.extend_from_slice(&MSG_HEADER_TAIL);
    body.extend_from_slice(b"hello");
    let bytes = frame(&body);
    check_known(
        &bytes,
        PacketRepr::Tiny(TinyRepr {
            header: msg_header(),
            data: b"hello",
        }),
    );
    let view = TinyPacket::new_checked(&bytes[16..]).unwrap();
    assert_eq!(view.match_a(), 0x0102_0304);
    assert_eq!(view.match_b(), 0x0506_0708);
    assert_eq!(view.match_info(), 0x0102_0304_0506_0708);
    assert_eq!(view.data(), b"hello");
}

#[test]
fn small() {
    let data: Vec<u8> = (0..40).collect();
    let mut body = vec![38, 1, 2, 9, 0x00, 40];
    body.extend_from_slice(&MSG_HEADER_TAIL);
    body.extend_from_slice(&data);
    let bytes = frame(&body);
    check_known(
        &bytes,
        PacketRepr::Small(SmallRepr {
            header: msg_header(),
            data: &data,
        }),
    );
}

#[test]
fn medium_fragment() {
    #[rustfmt::skip]
    let bytes = frame(&[
        39, 1, 2, 9,            // ptype, dst_endpoint, src_endpoint, src_generation
        0x20, 0x00, 0, 0,       // length 8192, pad
        0x00, 0x10,             // lib_seqnum
        0x00, 0x0f,             // lib_piggyack
        0x01, 0x02, 0x03, 0x04, // match_a
        0x05, 0x06, 0x07, 0x08, // match_b
        0xca, 0xfe, 0xba, 0xbe, // session
        0x00, 0x08,             // frag_length
        1, 12,                  // frag_seqnum, frag_pipeline
        0xab, 0xcd, 0, 0,       // checksum, pad2
        1, 2, 3, 4, 5, 6, 7, 8, // data
    ]);
    let repr = MediumRepr {
        header: msg_header(),
        msg_length: 8192,
        frag_seqnum: 1,
        frag_pipeline: 12,
        data: &[1, 2, 3, 4, 5, 6, 7, 8],
    };
    check_known(&bytes, PacketRepr::Medium(repr));
    assert_eq!(repr.frag_offset(), 4096);
    let view = MediumPacket::new_checked(&bytes[16..]).unwrap();
    assert_eq!((view.frag_length(), view.frag_pipeline()), (8, 12));
}

#[test]
fn rndv() {
    let mut body = vec![40, 1, 2, 9, 0x00, 0x08];
    body.extend_from_slice(&MSG_HEADER_TAIL);
    #[rustfmt::skip]
    body.extend_from_slice(&[
        0x00, 0x10, 0x00, 0x00, // msg_length 1 MiB
        7, 2,                   // pulled_rdma_id, pulled_rdma_seqnum
        0x00, 0x40,             // pulled_rdma_offset
    ]);
    let bytes = frame(&body);
    check_known(
        &bytes,
        PacketRepr::Rndv(RndvRepr {
            header: msg_header(),
            msg_length: 1 << 20,
            pulled_rdma_id: 7,
            pulled_rdma_seqnum: 2,
            pulled_rdma_offset: 0x40,
        }),
    );
}

#[test]
fn pull() {
    #[rustfmt::skip]
    let bytes = frame(&[
        41, 5, 3, 1,            // ptype, dst_endpoint, src_endpoint, src_generation
        0xde, 0xad, 0xbe, 0xef, // session
        0x00, 0x10, 0x00, 0x00, // total_length
        7, 2,                   // pulled_rdma_id, pulled_rdma_seqnum
        0x01, 0x00,             // pulled_rdma_offset 256
        0x00, 0x00, 0x00, 0x2a, // src_pull_handle
        0x00, 0x00, 0x21, 0x0f, // src_magic
        0x01, 0x00,             // first_frame_offset 256
        0x7f, 0x00,             // block_length 32512
        0x00, 0x00, 0x00, 0x00, // frame_index
    ]);
    let repr = PullRepr {
        dst_endpoint: 5,
        src_endpoint: 3,
        src_generation: 1,
        session: 0xdead_beef,
        total_length: 1 << 20,
        pulled_rdma_id: 7,
        pulled_rdma_seqnum: 2,
        pulled_rdma_offset: 256,
        src_pull_handle: 42,
        src_magic: 0x210f,
        first_frame_offset: 256,
        block_length: 32512,
        frame_index: 0,
    };
    check_known(&bytes, PacketRepr::Pull(repr));
    assert_eq!(repr.replies(), 8);
}

#[test]
fn pull_reply() {
    #[rustfmt::skip]
    let bytes = frame(&[
        42, 3,                  // ptype, frame_seqnum
        0x00, 0x06,             // frame_length
        0x00, 0x00, 0x2f, 0x00, // msg_offset
        0x00, 0x00, 0x00, 0x2a, // dst_pull_handle
        0x00, 0x00, 0x21, 0x0f, // dst_magic
        9, 8, 7, 6, 5, 4,       // data
    ]);
    check_known(
        &bytes,
        PacketRepr::PullReply(PullReplyRepr {
            frame_seqnum: 3,
            msg_offset: 0x2f00,
            dst_pull_handle: 42,
            dst_magic: 0x210f,
            data: &[9, 8, 7, 6, 5, 4],
        }),
    );
}

#[test]
fn notify() {
    #[rustfmt::skip]
    let bytes = frame(&[
        43, 3, 5, 1,            // ptype, dst_endpoint, src_endpoint, src_generation
        0x11, 0x22, 0x33, 0x44, // session
        0x00, 0x10, 0x00, 0x00, // total_length
        7, 2, 0, 0,             // pulled_rdma_id, pulled_rdma_seqnum, pad1
        0, 0,                   // pad2
        0x00, 0x21,             // lib_seqnum
        0x00, 0x20,             // lib_piggyack
        0, 0,                   // pad3
    ]);
    check_known(
        &bytes,
        PacketRepr::Notify(NotifyRepr {
            dst_endpoint: 3,
            src_endpoint: 5,
            src_generation: 1,
            session: 0x1122_3344,
            total_length: 1 << 20,
            pulled_rdma_id: 7,
            pulled_rdma_seqnum: 2,
            lib_seqnum: 0x21,
            lib_piggyack: 0x20,
        }),
    );
}

#[test]
fn nack_lib() {
    #[rustfmt::skip]
    let bytes = frame(&[
        44, 3, 0, 3,            // ptype, src_endpoint, src_generation, nack_type (bad session)
        0, 0, 0, 0,             // pad1
        0, 1,                   // pad2, dst_endpoint
        0x00, 0x2a,             // dst_src_peer_index
        0x00, 0x11,             // lib_seqnum
        0, 0,                   // pad3
    ]);
    check_known(
        &bytes,
        PacketRepr::NackLib(NackLibRepr {
            src_endpoint: 3,
            src_generation: 0,
            nack_type: NackType::BadSession,
            dst_endpoint: 1,
            dst_src_peer_index: 42,
            lib_seqnum: 0x11,
        }),
    );
}

#[test]
fn nack_mcp() {
    #[rustfmt::skip]
    let bytes = frame(&[
        45, 5, 1, 4,            // ptype, src_endpoint, src_generation, nack_type (bad window)
        0, 0, 0, 0,             // pad1
        0x00, 0x00, 0x00, 0x2a, // src_pull_handle
        0x00, 0x00, 0x21, 0x0f, // src_magic
    ]);
    check_known(
        &bytes,
        PacketRepr::NackMcp(NackMcpRepr {
            src_endpoint: 5,
            src_generation: 1,
            nack_type: NackType::BadRdmaWindow,
            src_pull_handle: 42,
            src_magic: 0x210f,
        }),
    );
}

#[test]
fn raw() {
    let bytes = frame(&[1, 0xaa, 0xbb, 0xcc]);
    check_known(
        &bytes,
        PacketRepr::Raw(RawRepr {
            payload: &[0xaa, 0xbb, 0xcc],
        }),
    );
}

#[test]
fn views_write_in_place() {
    let mut bytes = frame(&[0u8; 24 + 3]);
    let mut head = HeadPacket::new_checked(&mut bytes[..]).unwrap();
    head.set_dst(Mac::BROADCAST);
    head.set_ethertype(ETHERTYPE);
    let mut tiny = TinyPacket::new_checked(&mut bytes[16..]).unwrap();
    tiny.set_ptype(PacketType::Tiny as u8);
    tiny.set_length(3);
    tiny.set_match_info(0xaaaa_bbbb_cccc_dddd);
    tiny.data_mut().copy_from_slice(b"abc");
    assert_eq!(&bytes[..6], &[0xff; 6]);
    assert_eq!(&bytes[16 + 4..16 + 6], &[0, 3]);
    assert_eq!(
        &bytes[16 + 12..16 + 20],
        &[0xaa, 0xaa, 0xbb, 0xbb, 0xcc, 0xcc, 0xdd, 0xdd]
    );
    let parsed = FrameRepr::parse(&bytes).unwrap();
    match parsed.packet {
        PacketRepr::Tiny(t) => {
            assert_eq!(t.data, b"abc");
            assert_eq!(t.header.match_info, 0xaaaa_bbbb_cccc_dddd);
        }
        other => panic!("parsed as {other:?}"),
    }
}

//! What MXoE parsing and emitting refuse, and with which error.

use xmx_wire::mxoe::*;
use xmx_wire::Error;

const HEAD: [u8; 16] = [
    0x00, 0x60, 0xdd, 0x11, 0x22, 0x33, 0x02, 0x16, 0x3e, 0x44, 0x55, 0x66, 0x86, 0xdf, 0x00, 0x01,
];

fn frame(body: &[u8]) -> Vec<u8> {
    let mut bytes = HEAD.to_vec();
    bytes.extend_from_slice(body);
    bytes
}

/// A message header body of type `ptype` with `length`, then `tail` bytes.
fn msg(ptype: u8, length: u16, tail: &[u8]) -> Vec<u8> {
    let mut body = vec![ptype, 1, 2, 0];
    body.extend_from_slice(&length.to_be_bytes());
    body.extend_from_slice(&[0; 18]);
    body.extend_from_slice(tail);
    frame(&body)
}

fn invalid(field: &'static str) -> impl Fn(&Error) -> bool {
    move |e| matches!(e, Error::Invalid { field: f, .. } if *f == field)
}

fn assert_invalid(bytes: &[u8], field: &'static str) {
    let err = FrameRepr::parse(bytes).unwrap_err();
    assert!(
        invalid(field)(&err),
        "expected invalid {field}, got {err:?}"
    );
}

#[test]
fn short_frames_are_truncated() {
    for len in 0..16 {
        assert_eq!(
            FrameRepr::parse(&HEAD[..len]),
            Err(Error::Truncated {
                needed: 16,
                have: len
            })
        );
    }
    assert_eq!(
        FrameRepr::parse(&HEAD),
        Err(Error::Truncated {
            needed: 17,
            have: 16
        })
    );
}

#[test]
fn foreign_ethertype_is_unknown() {
    let mut bytes = frame(&[3; 16]);
    bytes[12..14].copy_from_slice(&[0x08, 0x06]);
    assert_eq!(
        FrameRepr::parse(&bytes),
        Err(Error::Unknown {
            what: "ethertype",
            value: 0x0806
        })
    );
}

#[test]
fn unknown_and_reserved_types() {
    for ptype in [5u8, 31, 46, 0xff] {
        assert_eq!(
            FrameRepr::parse(&frame(&[ptype; 40])),
            Err(Error::Unknown {
                what: "packet type",
                value: u32::from(ptype)
            })
        );
    }
    for ptype in [0u8, 2, 32, 33, 34] {
        assert_invalid(&frame(&[ptype; 40]), "ptype");
    }
}

#[test]
fn tiny_and_small_lengths() {
    assert_invalid(&msg(37, 33, &[0; 33]), "message length");
    assert!(FrameRepr::parse(&msg(37, 32, &[0; 32])).is_ok());
    assert_invalid(&msg(38, 129, &[0; 129]), "message length");
    assert!(FrameRepr::parse(&msg(38, 128, &[0; 128])).is_ok());
    // Declared data missing from the frame.
    assert_eq!(
        FrameRepr::parse(&msg(37, 10, &[0; 5])),
        Err(Error::Truncated {
            needed: 16 + 24 + 10,
            have: 16 + 24 + 5
        })
    );
}

#[test]
fn rndv_data_length_must_be_eight() {
    assert!(FrameRepr::parse(&msg(40, 8, &[0; 8])).is_ok());
    assert_invalid(&msg(40, 7, &[0; 8]), "rndv length");
    assert_invalid(&msg(40, 9, &[0; 8]), "rndv length");
}

/// A MEDIUM body: message length, fragment length, seqnum, pipeline, then data.
fn medium(length: u16, frag_length: u16, seqnum: u8, pipeline: u8, data_len: usize) -> Vec<u8> {
    let mut body = vec![39, 1, 2, 0];
    body.extend_from_slice(&length.to_be_bytes());
    body.extend_from_slice(&[0; 18]);
    body.extend_from_slice(&frag_length.to_be_bytes());
    body.extend_from_slice(&[seqnum, pipeline, 0, 0, 0, 0]);
    body.resize(body.len() + data_len, 0x5a);
    frame(&body)
}

#[test]
fn medium_fragment_bounds() {
    assert!(FrameRepr::parse(&medium(32768, 4096, 7, 12, 4096)).is_ok());
    assert!(FrameRepr::parse(&medium(5000, 904, 1, 12, 904)).is_ok());
    assert_invalid(&medium(32768, 4097, 0, 12, 4097), "medium frag length");
    assert_invalid(&medium(32768, 16, 8, 12, 16), "medium frag seqnum");
    assert_invalid(&medium(32768, 16, 0, 11, 16), "medium frag pipeline");
    assert_invalid(&medium(32769, 16, 0, 12, 16), "medium length");
    assert_invalid(&medium(5000, 905, 1, 12, 905), "medium frag length");
    assert_eq!(
        FrameRepr::parse(&medium(100, 100, 0, 12, 99)),
        Err(Error::Truncated {
            needed: 16 + 32 + 100,
            have: 16 + 32 + 99
        })
    );
}

#[test]
fn truc_kind_and_length() {
    let mut body = vec![35, 1, 2, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0x55];
    body.resize(28, 0);
    assert!(FrameRepr::parse(&frame(&body)).is_ok());
    let mut other_kind = body.clone();
    other_kind[12] = 0x54;
    assert_eq!(
        FrameRepr::parse(&frame(&other_kind)),
        Err(Error::Unknown {
            what: "truc data type",
            value: 0x54
        })
    );
    let mut short_data = body.clone();
    short_data[4] = 15;
    assert_invalid(&frame(&short_data), "truc length");
    assert_eq!(
        FrameRepr::parse(&frame(&body[..27])),
        Err(Error::Truncated {
            needed: 16 + 28,
            have: 16 + 27
        })
    );
}

#[test]
fn connect_variants() {
    let mut body = vec![36, 1, 2, 0, 16];
    body.resize(32, 0);
    assert!(FrameRepr::parse(&frame(&body)).is_ok());
    let mut bad_flag = body.clone();
    bad_flag[26] = 2;
    assert_invalid(&frame(&bad_flag), "connect is_reply");
    let mut bad_status = body.clone();
    bad_status[26] = 1;
    bad_status[28] = 1;
    assert_eq!(
        FrameRepr::parse(&frame(&bad_status)),
        Err(Error::Unknown {
            what: "connect status",
            value: 1
        })
    );
    let mut bad_length = body.clone();
    bad_length[4] = 12;
    assert_invalid(&frame(&bad_length), "connect length");
}

fn pull(first_frame_offset: u16, block_length: u16) -> Vec<u8> {
    let mut body = vec![41, 1, 2, 0];
    body.resize(24, 0);
    body.extend_from_slice(&first_frame_offset.to_be_bytes());
    body.extend_from_slice(&block_length.to_be_bytes());
    body.extend_from_slice(&[0; 4]);
    frame(&body)
}

#[test]
fn pull_block_fits_eight_replies() {
    assert!(FrameRepr::parse(&pull(0, 32768)).is_ok());
    assert!(FrameRepr::parse(&pull(4095, 32768 - 4095)).is_ok());
    assert_invalid(&pull(4096, 0), "pull first frame offset");
    assert_invalid(&pull(1, 32768), "pull block length");
}

#[test]
fn pull_reply_length() {
    let reply = |frame_length: u16, data_len: usize| {
        let mut body = vec![42, 0];
        body.extend_from_slice(&frame_length.to_be_bytes());
        body.resize(16 + data_len, 0);
        frame(&body)
    };
    assert!(FrameRepr::parse(&reply(4096, 4096)).is_ok());
    // Longer replies are xmx's, for pullers that ask; a block is the most.
    assert!(FrameRepr::parse(&reply(8192, 8192)).is_ok());
    assert!(FrameRepr::parse(&reply(32768, 32768)).is_ok());
    assert_invalid(&reply(32769, 32769), "pull reply frame length");
    assert_eq!(
        FrameRepr::parse(&reply(10, 9)),
        Err(Error::Truncated {
            needed: 16 + 16 + 10,
            have: 16 + 16 + 9
        })
    );
}

#[test]
fn nack_types_are_checked() {
    let mut nack = vec![44, 1, 0, 5];
    nack.resize(16, 0);
    assert_eq!(
        FrameRepr::parse(&frame(&nack)),
        Err(Error::Unknown {
            what: "nack type",
            value: 5
        })
    );
    nack[0] = 45;
    assert_eq!(
        FrameRepr::parse(&frame(&nack)),
        Err(Error::Unknown {
            what: "nack type",
            value: 5
        })
    );
    nack[3] = 0;
    assert!(FrameRepr::parse(&frame(&nack)).is_ok());
}

#[test]
fn host_reply_needs_a_hostname() {
    let mut body = vec![4, 0];
    body.resize(16, 0);
    assert_invalid(&frame(&body), "host reply length");
    body[1] = 3;
    assert_eq!(
        FrameRepr::parse(&frame(&body)),
        Err(Error::Truncated {
            needed: 16 + 16 + 3,
            have: 16 + 16
        })
    );
}

#[test]
fn raw_frames_are_bounded() {
    let mut body = vec![1u8];
    body.resize(RAW_FRAME_LEN_MAX - 16, 0);
    assert!(FrameRepr::parse(&frame(&body)).is_ok());
    body.push(0);
    assert_invalid(&frame(&body), "raw frame length");
}

#[test]
fn parsers_refuse_other_types() {
    let bytes = msg(37, 0, &[0; 8]);
    let body = &bytes[16..];
    assert!(invalid("ptype")(
        &SmallRepr::parse(&SmallPacket::new_checked(body).unwrap()).unwrap_err()
    ));
    assert!(invalid("ptype")(
        &RndvRepr::parse(&RndvPacket::new_checked(body).unwrap()).unwrap_err()
    ));
    assert!(TinyRepr::parse(&TinyPacket::new_checked(body).unwrap()).is_ok());
}

#[test]
fn unchecked_views_never_read_past_the_buffer() {
    let short = [39u8, 1, 2];
    let view = MediumPacket::new_unchecked(&short[..]);
    assert_eq!(view.session(), 0);
    assert_eq!(view.data(), &[] as &[u8]);
    assert!(matches!(
        MediumRepr::parse(&view),
        Err(Error::Truncated {
            needed: 32,
            have: 3
        })
    ));
    let mut short = [0u8; 5];
    let mut view = PullReplyPacket::new_unchecked(&mut short[..]);
    view.set_dst_magic(0xffff_ffff);
    view.set_frame_length(4);
    assert_eq!(view.data_mut().len(), 0);
    assert_eq!(short, [0, 0, 0, 4, 0]);
}

#[test]
fn emit_refuses_unrepresentable_values() {
    let mut buf = [0u8; 64];
    let tiny = TinyRepr {
        header: MsgHeader::default(),
        data: &[0; 33],
    };
    assert!(invalid("message length")(
        &tiny
            .emit(&mut TinyPacket::new_unchecked(&mut buf[..]))
            .unwrap_err()
    ));
    let name = [b'x'; 256];
    let reply = HostReplyRepr {
        src_dst_peer_index: 0,
        magic: 0,
        hostname: &name,
    };
    assert!(invalid("host reply length")(
        &reply
            .emit(&mut HostReplyPacket::new_unchecked(&mut vec![0; 300][..]))
            .unwrap_err()
    ));
    let empty = HostReplyRepr {
        hostname: &[],
        ..reply
    };
    assert!(invalid("host reply length")(
        &empty
            .emit(&mut HostReplyPacket::new_unchecked(&mut buf[..]))
            .unwrap_err()
    ));
    let medium = MediumRepr {
        header: MsgHeader::default(),
        msg_length: 100,
        frag_seqnum: 1,
        frag_pipeline: 12,
        data: &[0; 10],
    };
    assert!(invalid("medium frag length")(
        &medium
            .emit(&mut MediumPacket::new_unchecked(&mut buf[..]))
            .unwrap_err()
    ));
    let big = vec![0u8; RAW_PAYLOAD_LEN_MAX + 1];
    assert!(invalid("raw frame length")(
        &RawRepr { payload: &big }
            .emit(&mut RawPacket::new_unchecked(&mut vec![0; 2000][..]))
            .unwrap_err()
    ));
}

#[test]
fn emit_refuses_short_buffers() {
    let repr = FrameRepr {
        head: HeadRepr {
            dst: Mac::BROADCAST,
            src: Mac([2, 0, 0, 0, 0, 1]),
            dst_src_peer_index: 0,
        },
        packet: PacketRepr::HostQuery(HostQueryRepr {
            src_dst_peer_index: 1,
            magic: HOST_QUERY_MAGIC,
        }),
    };
    let mut buf = [0u8; 31];
    assert_eq!(
        repr.emit(&mut buf),
        Err(Error::BufferTooSmall {
            needed: 32,
            have: 31
        })
    );
    assert_eq!(buf, [0; 31]);
    let notify = NotifyRepr {
        dst_endpoint: 0,
        src_endpoint: 0,
        src_generation: 0,
        session: 0,
        total_length: 0,
        pulled_rdma_id: 0,
        pulled_rdma_seqnum: 0,
        lib_seqnum: 0,
        lib_piggyack: 0,
    };
    assert_eq!(
        notify.emit(&mut NotifyPacket::new_unchecked(&mut buf[..23])),
        Err(Error::BufferTooSmall {
            needed: 24,
            have: 23
        })
    );
}

/// The mark of xmx's wide frames lives in a packet's padding: absent (MX, Open-MX,
/// zero padding) it reads as one unit per frame; a count is bounded by a block.
#[test]
fn units_mark_reads_what_was_written_and_defaults_to_one() {
    use xmx_wire::mxoe::units_mark;
    let mut padding = [0u8; 12];
    assert_eq!(units_mark::read(&padding), 1, "zero padding");
    assert_eq!(units_mark::read(&[]), 1, "no padding at all");
    assert!(units_mark::write(&mut padding, 2));
    assert_eq!(units_mark::read(&padding), 2);
    assert!(units_mark::write(&mut padding, 200));
    assert_eq!(units_mark::read(&padding), 8, "at most a block");
    assert!(units_mark::write(&mut padding, 0));
    assert_eq!(units_mark::read(&padding), 1);
    assert!(!units_mark::write(&mut padding[..3], 2), "no room");
    padding[0] = b'X';
    assert_eq!(units_mark::read(&padding), 1, "another tag");
}

/// Wider MEDIUM strides than MX's (xmx toward a board that allows them) parse within
/// the same 32 KiB message; a stride outside 4-32 KiB, a fragment longer than its stride
/// or starting past 32 KiB is refused.
#[test]
fn medium_strides_are_bounded_by_the_message() {
    let data = vec![7u8; 8192];
    let mut buf = vec![0u8; medium::field::DATA + 32768];
    let wide = MediumRepr {
        header: MsgHeader::default(),
        msg_length: 20000,
        frag_seqnum: 2,
        frag_pipeline: 13,
        data: &data[..20000 - 16384],
    };
    wide.emit(&mut MediumPacket::new_unchecked(&mut buf[..]))
        .unwrap();
    let parsed = MediumRepr::parse(&MediumPacket::new_checked(&buf[..]).unwrap()).unwrap();
    assert_eq!(parsed, wide);
    assert_eq!(parsed.frag_offset(), 16384);

    let refused = |repr: MediumRepr, field: &'static str| {
        let mut buf = vec![0u8; medium::field::DATA + 32768];
        let err = repr
            .emit(&mut MediumPacket::new_unchecked(&mut buf[..]))
            .unwrap_err();
        assert!(invalid(field)(&err), "{repr:?}: {err:?}");
        // The same fields written by hand are refused by the parser too.
        let mut view = MediumPacket::new_unchecked(&mut buf[..]);
        view.set_ptype(PacketType::Medium as u8);
        view.set_length(repr.msg_length);
        view.set_frag_seqnum(repr.frag_seqnum);
        view.set_frag_pipeline(repr.frag_pipeline);
        view.set_frag_length(repr.data.len() as u16);
        let err = MediumRepr::parse(&MediumPacket::new_checked(&buf[..]).unwrap()).unwrap_err();
        assert!(invalid(field)(&err), "{repr:?}: {err:?}");
    };
    refused(
        MediumRepr {
            frag_pipeline: 11,
            ..wide
        },
        "medium frag pipeline",
    );
    refused(
        MediumRepr {
            frag_pipeline: 16,
            ..wide
        },
        "medium frag pipeline",
    );
    refused(
        MediumRepr {
            msg_length: 32768,
            frag_seqnum: 0,
            data: &[0; 8193],
            ..wide
        },
        "medium frag length",
    );
    refused(
        MediumRepr {
            msg_length: 32768,
            frag_seqnum: 4,
            data: &[],
            ..wide
        },
        "medium frag seqnum",
    );
    refused(
        MediumRepr {
            data: &data[..4000],
            ..wide
        },
        "medium frag length",
    );
}

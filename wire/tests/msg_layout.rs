//! Every message against hand-assembled slot bytes: field offsets, widths and
//! little-endian order are pinned here; parse of the bytes gives the value and emit of the
//! value gives the bytes.

use xmx_wire::msg::*;
use xmx_wire::ring::{ring_size, PAGE_SIZE};
use xmx_wire::Error;

/// A zeroed slot of `size` bytes with `fields` written at their offsets.
fn slot(size: usize, fields: &[(usize, &[u8])]) -> Vec<u8> {
    let mut s = vec![0u8; size];
    for (off, bytes) in fields {
        s[*off..*off + bytes.len()].copy_from_slice(bytes);
    }
    s
}

fn check_ctrl_request(bytes: &[u8], value: &CtrlRequest) {
    assert_eq!(&CtrlRequest::parse(bytes).unwrap(), value);
    let mut out = vec![0xeeu8; CTRL_SLOT_SIZE];
    value.emit(&mut out).unwrap();
    assert_eq!(out, bytes);
}

fn check_ctrl_response(bytes: &[u8], value: &CtrlResponse) {
    assert_eq!(&CtrlResponse::parse(bytes).unwrap(), value);
    let mut out = vec![0xeeu8; CTRL_SLOT_SIZE];
    value.emit(&mut out).unwrap();
    assert_eq!(out, bytes);
}

fn check_send(bytes: &[u8], value: &SendRequest) {
    assert_eq!(&SendRequest::parse(bytes).unwrap(), value);
    let mut out = vec![0xeeu8; SEND_SLOT_SIZE];
    value.emit(&mut out).unwrap();
    assert_eq!(out, bytes);
}

fn check_event(bytes: &[u8], value: &Event) {
    assert_eq!(&Event::parse(bytes).unwrap(), value);
    let mut out = vec![0xeeu8; EVENT_SLOT_SIZE];
    value.emit(&mut out).unwrap();
    assert_eq!(out, bytes);
}

const ROUTE: Route = Route {
    peer_index: 0x0102,
    endpoint: 0x03,
    session_id: 0x0708_0910,
};
const ROUTE_BYTES: [u8; 8] = [0x02, 0x01, 0x03, 0x00, 0x10, 0x09, 0x08, 0x07];
const INFO: MsgInfo = MsgInfo {
    seqnum: 0x1112,
    piggyack: 0x1314,
    match_info: 0x2122_2324_2526_2728,
};
const SEQ_PIGGY: [u8; 4] = [0x12, 0x11, 0x14, 0x13];
const MATCH: [u8; 8] = [0x28, 0x27, 0x26, 0x25, 0x24, 0x23, 0x22, 0x21];

#[test]
fn slot_sizes_and_ring_sizes() {
    assert_eq!(PROTOCOL_VERSION, 1);
    assert_eq!(HEADER_LEN, 8);
    assert_eq!(CTRL_SLOT_SIZE, 128);
    assert_eq!(SEND_SLOT_SIZE, 192);
    assert_eq!(EVENT_SLOT_SIZE, 192);
    // __CONST_RING_SIZE for these slots.
    assert_eq!(ring_size(CTRL_SLOT_SIZE, PAGE_SIZE), 16);
    assert_eq!(ring_size(SEND_SLOT_SIZE, PAGE_SIZE), 16);
    assert_eq!(ring_size(SEND_SLOT_SIZE, 4 * PAGE_SIZE), 64);
    assert_eq!(ring_size(EVENT_SLOT_SIZE, 8 * PAGE_SIZE), 128);
    assert_eq!((INFO_PAGE_SIZE, INFO_PAGE_REFS), (4096, 1024));
    assert_eq!((REGION_INFO_REFS_MAX, REGION_PAGES_MAX), (24, 24 * 1024));
    // Inline data of a SMALL message ends inside the slot.
    const { assert!(32 + SMALL_MAX <= SEND_SLOT_SIZE) };
}

#[test]
fn endpoint_open() {
    let bytes = slot(
        CTRL_SLOT_SIZE,
        &[
            (0, &[0x01, 0x01, 0, 0, 0x44, 0x33, 0x22, 0x11]),
            (8, &[5, 1, 2, 0]),
            (12, &[0x34, 0x12, 0, 0]),
            (16, &[0x78, 0x56, 0, 0]),
            (20, &[0x10, 0x00, 0x20, 0x00]),
        ],
    );
    let value = CtrlRequest {
        tag: 0x1122_3344,
        op: CtrlOp::EndpointOpen(EndpointOpen {
            endpoint: 5,
            event_channel: 0x1234,
            info_ref: 0x5678,
            pages: EndpointPages {
                send_ring: 1,
                event_ring: 2,
                send_queue: 16,
                recv_queue: 32,
            },
            resume_session: 0,
            quiet_send_done: false,
        }),
    };
    check_ctrl_request(&bytes, &value);
    // Byte 11 holds the flags: bit 0 asks for quiet send completions, the others are
    // refused.
    let mut quiet_bytes = bytes.clone();
    quiet_bytes[11] = 0x01;
    let mut quiet = value.clone();
    if let CtrlOp::EndpointOpen(o) = &mut quiet.op {
        o.quiet_send_done = true;
    }
    check_ctrl_request(&quiet_bytes, &quiet);
    for bit in 1..8 {
        let mut unknown = bytes.clone();
        unknown[11] = 1 << bit;
        assert!(
            CtrlRequest::parse(&unknown).is_err(),
            "flag bit {bit} has no meaning yet"
        );
    }
    let CtrlOp::EndpointOpen(open) = value.op else {
        unreachable!()
    };
    assert_eq!(open.pages.total(), 51);
    assert_eq!(open.pages.send_ring_refs(), 0..1);
    assert_eq!(open.pages.event_ring_refs(), 1..3);
    assert_eq!(open.pages.send_queue_refs(), 3..19);
    assert_eq!(open.pages.recv_queue_refs(), 19..51);
}

#[test]
fn endpoint_close_and_region_deregister() {
    let close = slot(
        CTRL_SLOT_SIZE,
        &[(0, &[0x02, 0x01, 0, 0, 9, 0, 0, 0]), (8, &[7])],
    );
    check_ctrl_request(
        &close,
        &CtrlRequest {
            tag: 9,
            op: CtrlOp::EndpointClose { endpoint: 7 },
        },
    );
    let dereg = slot(
        CTRL_SLOT_SIZE,
        &[(0, &[0x04, 0x01, 0, 0, 10, 0, 0, 0]), (8, &[7, 200])],
    );
    check_ctrl_request(
        &dereg,
        &CtrlRequest {
            tag: 10,
            op: CtrlOp::RegionDeregister {
                endpoint: 7,
                region_id: 200,
            },
        },
    );
}

#[test]
fn region_register() {
    // 1 MiB + 1 byte starting at offset 0x100 of its first page: 257 pages, one info page.
    let bytes = slot(
        CTRL_SLOT_SIZE,
        &[
            (0, &[0x03, 0x01, 0, 0, 1, 0, 0, 0]),
            (8, &[2, 17, 0x00, 0x01]),
            (12, &[0x01, 0x00, 0x10, 0x00]),
            (16, &[0x01, 0x01, 0, 0]),
            (20, &[1, 0, 0, 0]),
            (24, &[0xef, 0xbe, 0xad, 0xde]),
        ],
    );
    let reg = RegionRegister {
        endpoint: 2,
        region_id: 17,
        first_page_offset: 0x100,
        length: 0x10_0001,
        info_refs: vec![0xdead_beef],
    };
    assert_eq!(reg.nr_pages(), 257);
    assert_eq!(reg.nr_info_pages(), 1);
    check_ctrl_request(
        &bytes,
        &CtrlRequest {
            tag: 1,
            op: CtrlOp::RegionRegister(reg),
        },
    );

    // The largest region: 24 info pages, refs up to offset 120.
    let refs: Vec<u32> = (0..24).map(|i| 0x100 + i).collect();
    let big = RegionRegister {
        endpoint: 0,
        region_id: 0,
        first_page_offset: 0,
        length: (REGION_PAGES_MAX * 4096) as u32,
        info_refs: refs.clone(),
    };
    let mut out = vec![0u8; CTRL_SLOT_SIZE];
    CtrlRequest {
        tag: 0,
        op: CtrlOp::RegionRegister(big.clone()),
    }
    .emit(&mut out)
    .unwrap();
    assert_eq!(out[20], 24);
    assert_eq!(&out[116..120], &0x117u32.to_le_bytes());
    assert_eq!(&out[120..], &[0u8; 8]);
    // One byte more needs a 25th info page.
    let too_big = RegionRegister {
        length: big.length + 1,
        first_page_offset: 0,
        ..big
    };
    assert!(matches!(
        CtrlRequest {
            tag: 0,
            op: CtrlOp::RegionRegister(too_big)
        }
        .emit(&mut out),
        Err(Error::Invalid { .. })
    ));
}

#[test]
fn region_register_consistency_is_checked() {
    let good = slot(
        CTRL_SLOT_SIZE,
        &[
            (0, &[0x03, 0x01, 0, 0, 1, 0, 0, 0]),
            (12, &[0x00, 0x10, 0, 0]),
            (16, &[1, 0, 0, 0]),
            (20, &[1]),
        ],
    );
    assert!(CtrlRequest::parse(&good).is_ok());
    let mut wrong_pages = good.clone();
    wrong_pages[16] = 2;
    assert!(matches!(
        CtrlRequest::parse(&wrong_pages),
        Err(Error::Invalid {
            field: "region pages",
            ..
        })
    ));
    let mut wrong_info = good.clone();
    wrong_info[20] = 2;
    assert!(matches!(
        CtrlRequest::parse(&wrong_info),
        Err(Error::Invalid {
            field: "region info refs",
            ..
        })
    ));
    let mut too_many_info = good.clone();
    too_many_info[20] = 25;
    assert!(matches!(
        CtrlRequest::parse(&too_many_info),
        Err(Error::Invalid { .. })
    ));
    let mut zero_length = good.clone();
    zero_length[12..16].fill(0);
    zero_length[16] = 0;
    zero_length[20] = 0;
    assert!(matches!(
        CtrlRequest::parse(&zero_length),
        Err(Error::Invalid {
            field: "region length",
            ..
        })
    ));
    let mut bad_offset = good;
    bad_offset[10..12].copy_from_slice(&4096u16.to_le_bytes());
    bad_offset[16] = 2;
    assert!(matches!(
        CtrlRequest::parse(&bad_offset),
        Err(Error::Invalid {
            field: "region first page offset",
            ..
        })
    ));
}

#[test]
fn endpoint_pages_are_bounded() {
    let base = slot(CTRL_SLOT_SIZE, &[(0, &[0x01, 0x01]), (8, &[0, 1, 1, 0])]);
    assert!(CtrlRequest::parse(&base).is_ok());
    for (off, value) in [(9usize, 0u8), (10, 0), (9, 9), (10, 9)] {
        let mut b = base.clone();
        b[off] = value;
        assert!(matches!(
            CtrlRequest::parse(&b),
            Err(Error::Invalid {
                field: "endpoint ring pages",
                ..
            })
        ));
    }
    let mut too_many = base;
    too_many[20..22].copy_from_slice(&1000u16.to_le_bytes());
    too_many[22..24].copy_from_slice(&23u16.to_le_bytes());
    assert!(matches!(
        CtrlRequest::parse(&too_many),
        Err(Error::Invalid {
            field: "endpoint pages",
            ..
        })
    ));
}

#[test]
fn ctrl_responses() {
    let open = slot(
        CTRL_SLOT_SIZE,
        &[
            (0, &[0x81, 0x01, 0, 0, 0x44, 0x33, 0x22, 0x11]),
            (8, &[0, 0, 0, 0, 5, 0]),
            (16, &[0xd4, 0xc3, 0xb2, 0xa1]),
        ],
    );
    check_ctrl_response(
        &open,
        &CtrlResponse {
            tag: 0x1122_3344,
            status: CtrlStatus::Ok,
            reply: CtrlReply::EndpointOpen {
                endpoint: 5,
                session_id: 0xa1b2_c3d4,
            },
        },
    );
    let busy = slot(
        CTRL_SLOT_SIZE,
        &[(0, &[0x82, 0x01, 0, 0, 2, 0, 0, 0]), (8, &[3, 0, 0, 0, 5])],
    );
    check_ctrl_response(
        &busy,
        &CtrlResponse {
            tag: 2,
            status: CtrlStatus::EndpointBusy,
            reply: CtrlReply::EndpointClose { endpoint: 5 },
        },
    );
    let reg = slot(
        CTRL_SLOT_SIZE,
        &[
            (0, &[0x83, 0x01, 0, 0, 3, 0, 0, 0]),
            (8, &[5, 0, 0, 0, 1, 17]),
        ],
    );
    check_ctrl_response(
        &reg,
        &CtrlResponse {
            tag: 3,
            status: CtrlStatus::BadGrant,
            reply: CtrlReply::RegionRegister {
                endpoint: 1,
                region_id: 17,
            },
        },
    );
    let dereg = slot(
        CTRL_SLOT_SIZE,
        &[
            (0, &[0x84, 0x01, 0, 0, 4, 0, 0, 0]),
            (8, &[6, 0, 0, 0, 1, 18]),
        ],
    );
    check_ctrl_response(
        &dereg,
        &CtrlResponse {
            tag: 4,
            status: CtrlStatus::BadRegion,
            reply: CtrlReply::RegionDeregister {
                endpoint: 1,
                region_id: 18,
            },
        },
    );
    let statuses: Vec<u32> = CtrlStatus::ALL.iter().map(|s| u32::from(*s)).collect();
    assert_eq!(statuses, (0..=8).collect::<Vec<u32>>());
    // Unknown status, request kinds in the response space, and unknown kinds are refused.
    let mut bad = busy.clone();
    bad[8] = 9;
    assert_eq!(
        CtrlResponse::parse(&bad),
        Err(Error::Unknown {
            what: "control status",
            value: 9
        })
    );
    let mut req_kind = busy.clone();
    req_kind[0] = 0x02;
    assert_eq!(
        CtrlResponse::parse(&req_kind),
        Err(Error::Unknown {
            what: "control response kind",
            value: 2
        })
    );
    let mut unknown = busy;
    unknown[0] = 0x85;
    assert_eq!(
        CtrlResponse::parse(&unknown),
        Err(Error::Unknown {
            what: "control response kind",
            value: 0x85
        })
    );
}

#[test]
fn answering_echoes_the_request() {
    let req = CtrlRequest {
        tag: 77,
        op: CtrlOp::RegionDeregister {
            endpoint: 3,
            region_id: 4,
        },
    };
    let rsp = CtrlResponse::answering(&req, CtrlStatus::Ok);
    assert_eq!(
        rsp,
        CtrlResponse {
            tag: 77,
            status: CtrlStatus::Ok,
            reply: CtrlReply::RegionDeregister {
                endpoint: 3,
                region_id: 4
            }
        }
    );
}

#[test]
fn send_tiny_and_small() {
    let tiny = slot(
        SEND_SLOT_SIZE,
        &[
            (0, &[0x10, 0x01, 0, 0, 0xaa, 0, 0, 0]),
            (8, &ROUTE_BYTES),
            (16, &SEQ_PIGGY),
            (20, &[3, 0, 0, 0]),
            (24, &MATCH),
            (32, b"abc"),
        ],
    );
    let msg = InlineMsg {
        info: INFO,
        data: InlineData::new(b"abc").unwrap(),
    };
    check_send(
        &tiny,
        &SendRequest {
            tag: 0xaa,
            route: ROUTE,
            op: SendOp::Tiny(msg),
        },
    );

    let data: Vec<u8> = (0..128u8).collect();
    let small = slot(
        SEND_SLOT_SIZE,
        &[
            (0, &[0x11, 0x01, 0, 0, 0xbb, 0, 0, 0]),
            (8, &ROUTE_BYTES),
            (16, &SEQ_PIGGY),
            (20, &[128, 0, 0, 0]),
            (24, &MATCH),
            (32, &data),
        ],
    );
    let msg = InlineMsg {
        info: INFO,
        data: InlineData::new(&data).unwrap(),
    };
    check_send(
        &small,
        &SendRequest {
            tag: 0xbb,
            route: ROUTE,
            op: SendOp::Small(msg),
        },
    );

    // Lengths beyond the inline capacity of the kind.
    let mut long_tiny = tiny.clone();
    long_tiny[20] = 33;
    assert_eq!(
        SendRequest::parse(&long_tiny),
        Err(Error::Invalid {
            field: "tiny length",
            reason: "length beyond the inline capacity"
        })
    );
    let mut long_small = small;
    long_small[20..24].copy_from_slice(&129u32.to_le_bytes());
    assert!(matches!(
        SendRequest::parse(&long_small),
        Err(Error::Invalid {
            field: "small length",
            ..
        })
    ));
    long_small[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        SendRequest::parse(&long_small),
        Err(Error::Invalid { .. })
    ));
    let big = InlineMsg {
        info: INFO,
        data: InlineData::new(&[0; 33]).unwrap(),
    };
    let mut out = vec![0u8; SEND_SLOT_SIZE];
    assert!(SendRequest {
        tag: 0,
        route: ROUTE,
        op: SendOp::Tiny(big)
    }
    .emit(&mut out)
    .is_err());
    assert_eq!(
        out,
        vec![0u8; SEND_SLOT_SIZE],
        "a refused emit writes nothing"
    );
    assert!(InlineData::new(&[0; 129]).is_err());
}

#[test]
fn send_medium() {
    let bytes = slot(
        SEND_SLOT_SIZE,
        &[
            (0, &[0x12, 0x01, 0, 0, 1, 0, 0, 0]),
            (8, &ROUTE_BYTES),
            (16, &SEQ_PIGGY),
            (20, &[0x01, 0x20, 0, 0]),
            (24, &MATCH),
            (32, &[3]),
            (36, &[7, 0, 8, 0, 0x09, 0x01]),
        ],
    );
    let value = SendRequest {
        tag: 1,
        route: ROUTE,
        op: SendOp::Medium(MediumSend {
            info: INFO,
            length: 8193,
            sendq_slots: QueueSlots::new(&[7, 8, 0x109]).unwrap(),
        }),
    };
    check_send(&bytes, &value);
    assert_eq!(medium_frags(0), 1);
    assert_eq!(medium_frags(4096), 1);
    assert_eq!(medium_frags(4097), 2);
    assert_eq!(medium_frags(32768), 8);
    let mut wrong_count = bytes.clone();
    wrong_count[32] = 2;
    assert!(matches!(
        SendRequest::parse(&wrong_count),
        Err(Error::Invalid {
            field: "medium fragments",
            ..
        })
    ));
    let mut no_frags = bytes.clone();
    no_frags[32] = 0;
    assert!(SendRequest::parse(&no_frags).is_err());
    let mut nine = bytes.clone();
    nine[32] = 9;
    assert!(SendRequest::parse(&nine).is_err());
    let mut too_long = bytes;
    too_long[20..24].copy_from_slice(&32769u32.to_le_bytes());
    too_long[32] = 8;
    assert!(matches!(
        SendRequest::parse(&too_long),
        Err(Error::Invalid {
            field: "medium length",
            ..
        })
    ));
    assert!(QueueSlots::new(&[]).is_err());
    assert!(QueueSlots::new(&[0; 9]).is_err());
}

#[test]
fn send_rndv_and_pull() {
    let rndv = slot(
        SEND_SLOT_SIZE,
        &[
            (0, &[0x13, 0x01, 0, 0, 2, 0, 0, 0]),
            (8, &ROUTE_BYTES),
            (16, &SEQ_PIGGY),
            (20, &[0x00, 0x00, 0x10, 0x00]),
            (24, &MATCH),
            (32, &[9, 4, 0, 0, 0x80, 0, 0, 0]),
        ],
    );
    let value = RndvSend {
        info: INFO,
        length: 0x10_0000,
        region_id: 9,
        region_seqnum: 4,
        region_offset: 0x80,
    };
    check_send(
        &rndv,
        &SendRequest {
            tag: 2,
            route: ROUTE,
            op: SendOp::Rndv(value),
        },
    );

    let pull = slot(
        SEND_SLOT_SIZE,
        &[
            (0, &[0x18, 0x01, 0, 0, 3, 0, 0, 0]),
            (8, &ROUTE_BYTES),
            (16, &[0x00, 0x80, 0x00, 0x00]),
            (20, &[11, 12, 13, 0]),
            (24, &[0x10, 0, 0, 0]),
            (28, &[0x20, 0, 0, 0]),
        ],
    );
    let value = Pull {
        length: 0x8000,
        local_region: 11,
        local_offset: 0x10,
        remote_region: 12,
        remote_region_seqnum: 13,
        remote_offset: 0x20,
    };
    check_send(
        &pull,
        &SendRequest {
            tag: 3,
            route: ROUTE,
            op: SendOp::Pull(value),
        },
    );
}

#[test]
fn send_connect_notify_liback() {
    let creq = slot(
        SEND_SLOT_SIZE,
        &[
            (0, &[0x14, 0x01, 0, 0, 4, 0, 0, 0]),
            (8, &ROUTE_BYTES),
            (16, &[0x01, 0x00, 0x02, 0x00]),
            (20, &[0x78, 0x56, 0x34, 0x12]),
            (24, &[5]),
        ],
    );
    let value = RingConnectRequest {
        seqnum: 1,
        target_recv_seqnum_start: 2,
        app_key: 0x1234_5678,
        connect_seqnum: 5,
    };
    check_send(
        &creq,
        &SendRequest {
            tag: 4,
            route: ROUTE,
            op: SendOp::ConnectRequest(value),
        },
    );

    let crep = slot(
        SEND_SLOT_SIZE,
        &[
            (0, &[0x15, 0x01, 0, 0, 5, 0, 0, 0]),
            (8, &ROUTE_BYTES),
            (16, &[0x01, 0x00, 0x02, 0x00]),
            (20, &[6, 11]),
        ],
    );
    let value = RingConnectReply {
        seqnum: 1,
        target_recv_seqnum_start: 2,
        connect_seqnum: 6,
        status: 11,
    };
    check_send(
        &crep,
        &SendRequest {
            tag: 5,
            route: ROUTE,
            op: SendOp::ConnectReply(value),
        },
    );

    let notify = slot(
        SEND_SLOT_SIZE,
        &[
            (0, &[0x16, 0x01, 0, 0, 6, 0, 0, 0]),
            (8, &ROUTE_BYTES),
            (16, &SEQ_PIGGY),
            (20, &[0, 0, 0x20, 0]),
            (24, &[9, 4]),
        ],
    );
    let value = NotifySend {
        seqnum: 0x1112,
        piggyack: 0x1314,
        total_length: 0x20_0000,
        region_id: 9,
        region_seqnum: 4,
    };
    check_send(
        &notify,
        &SendRequest {
            tag: 6,
            route: ROUTE,
            op: SendOp::Notify(value),
        },
    );

    let ack = slot(
        SEND_SLOT_SIZE,
        &[
            (0, &[0x17, 0x01, 0, 0, 7, 0, 0, 0]),
            (8, &ROUTE_BYTES),
            (16, &[0x34, 0x12, 0x78, 0x56]),
            (20, &[1, 2, 3, 4]),
            (24, &[1]),
        ],
    );
    let value = LibackSend {
        lib_seqnum: 0x1234,
        send_seq: 0x5678,
        acknum: 0x0403_0201,
        resent: true,
    };
    check_send(
        &ack,
        &SendRequest {
            tag: 7,
            route: ROUTE,
            op: SendOp::Liback(value),
        },
    );
    let mut bad_flag = ack;
    bad_flag[24] = 2;
    assert_eq!(
        SendRequest::parse(&bad_flag),
        Err(Error::Invalid {
            field: "liback resent",
            reason: "not 0 or 1"
        })
    );
}

#[test]
fn header_errors() {
    let good = slot(SEND_SLOT_SIZE, &[(0, &[0x16, 0x01])]);
    assert!(SendRequest::parse(&good).is_ok());
    assert_eq!(
        SendRequest::parse(&good[..191]),
        Err(Error::Truncated {
            needed: 192,
            have: 191
        })
    );
    assert_eq!(
        SendRequest::parse(&[]),
        Err(Error::Truncated {
            needed: 192,
            have: 0
        })
    );
    let mut v2 = good.clone();
    v2[1] = 2;
    assert_eq!(
        SendRequest::parse(&v2),
        Err(Error::Unknown {
            what: "protocol version",
            value: 2
        })
    );
    let mut kind = good.clone();
    kind[0] = 0x40;
    assert_eq!(
        SendRequest::parse(&kind),
        Err(Error::Unknown {
            what: "send request kind",
            value: 0x40
        })
    );
    assert_eq!(
        Event::parse(&good),
        Err(Error::Unknown {
            what: "event kind",
            value: 0x16
        })
    );
    assert_eq!(
        CtrlRequest::parse(&good),
        Err(Error::Unknown {
            what: "control request kind",
            value: 0x16
        })
    );
    // Reserved bytes are ignored on parse and zero on emit.
    let mut reserved = good.clone();
    reserved[2] = 0xff;
    reserved[11] = 0xff;
    reserved[191] = 0xff;
    let parsed = SendRequest::parse(&reserved).unwrap();
    assert_eq!(parsed, SendRequest::parse(&good).unwrap());
    let mut out = vec![0u8; SEND_SLOT_SIZE];
    parsed.emit(&mut out).unwrap();
    assert_eq!(out, good);
    // Emit into a short buffer.
    assert_eq!(
        parsed.emit(&mut out[..100]),
        Err(Error::BufferTooSmall {
            needed: 192,
            have: 100
        })
    );
}

#[test]
fn recv_inline_events() {
    let tiny = slot(
        EVENT_SLOT_SIZE,
        &[
            (0, &[0x40, 0x01, 0, 0, 0x10, 0, 0, 0]),
            (8, &ROUTE_BYTES),
            (16, &SEQ_PIGGY),
            (20, &[32, 0, 0, 0]),
            (24, &MATCH),
            (32, &[0x5a; 32]),
        ],
    );
    let msg = InlineMsg {
        info: INFO,
        data: InlineData::new(&[0x5a; 32]).unwrap(),
    };
    check_event(
        &tiny,
        &Event {
            tag: 0x10,
            body: EventBody::RecvTiny { from: ROUTE, msg },
        },
    );
    let mut small = tiny.clone();
    small[0] = 0x41;
    check_event(
        &small,
        &Event {
            tag: 0x10,
            body: EventBody::RecvSmall { from: ROUTE, msg },
        },
    );
    let mut long = tiny;
    long[20] = 33;
    assert!(matches!(
        Event::parse(&long),
        Err(Error::Invalid {
            field: "tiny length",
            ..
        })
    ));
}

#[test]
fn recv_medium_event() {
    let bytes = slot(
        EVENT_SLOT_SIZE,
        &[
            (0, &[0x42, 0x01, 0, 0, 0x11, 0, 0, 0]),
            (8, &ROUTE_BYTES),
            (16, &SEQ_PIGGY),
            (20, &[0x00, 0x50, 0, 0]),
            (24, &MATCH),
            (32, &[0x21, 0x00, 0x00, 0x04, 4, 12]),
        ],
    );
    let frag = RecvMedium {
        info: INFO,
        length: 0x5000,
        recvq_slot: 0x21,
        frag_length: 0x400,
        frag_seqnum: 4,
        frag_pipeline: 12,
    };
    check_event(
        &bytes,
        &Event {
            tag: 0x11,
            body: EventBody::RecvMedium { from: ROUTE, frag },
        },
    );
    let mut seq5 = bytes.clone();
    seq5[36] = 5; // a 20 KiB message has fragments 0 to 4
    assert!(matches!(
        Event::parse(&seq5),
        Err(Error::Invalid {
            field: "fragment seqnum",
            ..
        })
    ));
    let mut frag_long = bytes.clone();
    frag_long[34..36].copy_from_slice(&4097u16.to_le_bytes());
    assert!(matches!(
        Event::parse(&frag_long),
        Err(Error::Invalid {
            field: "fragment length",
            ..
        })
    ));
    let mut msg_long = bytes;
    msg_long[20..24].copy_from_slice(&40000u32.to_le_bytes());
    assert!(matches!(
        Event::parse(&msg_long),
        Err(Error::Invalid {
            field: "medium length",
            ..
        })
    ));
}

#[test]
fn recv_rndv_connect_notify_liback_events() {
    let rndv = slot(
        EVENT_SLOT_SIZE,
        &[
            (0, &[0x43, 0x01, 0, 0, 1, 0, 0, 0]),
            (8, &ROUTE_BYTES),
            (16, &SEQ_PIGGY),
            (20, &[0, 0, 1, 0]),
            (24, &MATCH),
            (32, &[1, 2, 0, 0, 3, 0, 0, 0]),
        ],
    );
    let value = RndvSend {
        info: INFO,
        length: 0x1_0000,
        region_id: 1,
        region_seqnum: 2,
        region_offset: 3,
    };
    check_event(
        &rndv,
        &Event {
            tag: 1,
            body: EventBody::RecvRndv {
                from: ROUTE,
                rndv: value,
            },
        },
    );

    let creq = slot(
        EVENT_SLOT_SIZE,
        &[
            (0, &[0x44, 0x01, 0, 0, 2, 0, 0, 0]),
            (8, &ROUTE_BYTES),
            (16, &[9, 0, 8, 0]),
            (20, &[7, 0, 0, 0]),
            (24, &[6]),
        ],
    );
    let request = RingConnectRequest {
        seqnum: 9,
        target_recv_seqnum_start: 8,
        app_key: 7,
        connect_seqnum: 6,
    };
    check_event(
        &creq,
        &Event {
            tag: 2,
            body: EventBody::RecvConnectRequest {
                from: ROUTE,
                request,
            },
        },
    );

    let crep = slot(
        EVENT_SLOT_SIZE,
        &[
            (0, &[0x45, 0x01, 0, 0, 3, 0, 0, 0]),
            (8, &ROUTE_BYTES),
            (16, &[9, 0, 8, 0]),
            (20, &[6, 0]),
            (24, &[0x44, 0x33, 0x22, 0x11]),
        ],
    );
    let reply = RingConnectReply {
        seqnum: 9,
        target_recv_seqnum_start: 8,
        connect_seqnum: 6,
        status: 0,
    };
    check_event(
        &crep,
        &Event {
            tag: 3,
            body: EventBody::RecvConnectReply {
                from: ROUTE,
                reply,
                target_session_id: 0x1122_3344,
            },
        },
    );

    let notify = slot(
        EVENT_SLOT_SIZE,
        &[
            (0, &[0x46, 0x01, 0, 0, 4, 0, 0, 0]),
            (8, &ROUTE_BYTES),
            (16, &SEQ_PIGGY),
            (20, &[1, 0, 0, 0]),
            (24, &[2, 3]),
        ],
    );
    let value = NotifySend {
        seqnum: 0x1112,
        piggyack: 0x1314,
        total_length: 1,
        region_id: 2,
        region_seqnum: 3,
    };
    check_event(
        &notify,
        &Event {
            tag: 4,
            body: EventBody::RecvNotify {
                from: ROUTE,
                notify: value,
            },
        },
    );

    let ack = slot(
        EVENT_SLOT_SIZE,
        &[
            (0, &[0x47, 0x01, 0, 0, 5, 0, 0, 0]),
            (8, &ROUTE_BYTES),
            (16, &[1, 0, 2, 0]),
            (20, &[3, 0, 0, 0]),
        ],
    );
    let value = LibackSend {
        lib_seqnum: 1,
        send_seq: 2,
        acknum: 3,
        resent: false,
    };
    check_event(
        &ack,
        &Event {
            tag: 5,
            body: EventBody::RecvLiback {
                from: ROUTE,
                ack: value,
            },
        },
    );
}

#[test]
fn completion_nack_and_error_events() {
    let done = slot(
        EVENT_SLOT_SIZE,
        &[
            (0, &[0x48, 0x01, 0, 0, 0x78, 0x56, 0x34, 0x12]),
            (8, &[0, 0, 0, 0, 0x80, 0, 0, 0]),
        ],
    );
    check_event(
        &done,
        &Event {
            tag: 0x1234_5678,
            body: EventBody::SendDone {
                status: DoneStatus::Success,
                length: 0x80,
            },
        },
    );
    let pull = slot(
        EVENT_SLOT_SIZE,
        &[
            (0, &[0x49, 0x01, 0, 0, 9, 0, 0, 0]),
            (8, &[6, 0, 0, 0, 0, 0x10, 0, 0]),
        ],
    );
    check_event(
        &pull,
        &Event {
            tag: 9,
            body: EventBody::PullDone {
                status: DoneStatus::Timeout,
                length: 0x1000,
            },
        },
    );
    let mut bad_status = pull;
    bad_status[8] = 10;
    assert_eq!(
        Event::parse(&bad_status),
        Err(Error::Unknown {
            what: "completion status",
            value: 10
        })
    );

    let nack = slot(
        EVENT_SLOT_SIZE,
        &[
            (0, &[0x4a, 0x01, 0, 0, 1, 0, 0, 0]),
            (8, &ROUTE_BYTES),
            (16, &[3, 0, 0x22, 0x11]),
        ],
    );
    check_event(
        &nack,
        &Event {
            tag: 1,
            body: EventBody::RecvNack {
                from: ROUTE,
                kind: NackKind::BadSession,
                seqnum: 0x1122,
            },
        },
    );
    let mut nack0 = nack;
    nack0[16] = 0;
    assert_eq!(
        Event::parse(&nack0),
        Err(Error::Unknown {
            what: "nack kind",
            value: 0
        })
    );

    let error = slot(
        EVENT_SLOT_SIZE,
        &[(0, &[0x4b, 0x01, 0, 0, 2, 0, 0, 0]), (8, &[6, 0, 0, 0])],
    );
    check_event(
        &error,
        &Event {
            tag: 2,
            body: EventBody::Error {
                code: ErrorCode::Denied,
            },
        },
    );
    check_event(
        &slot(
            EVENT_SLOT_SIZE,
            &[(0, &[0x4c, 0x01, 0, 0, 9, 0, 0, 0]), (8, &[200])],
        ),
        &Event {
            tag: 9,
            body: EventBody::RegionWanted { region: 200 },
        },
    );
    check_event(
        &slot(
            EVENT_SLOT_SIZE,
            &[
                (0, &[0x4d, 0x01, 0, 0, 5, 0, 0, 0]),
                (12, &[0x00, 0x00, 0x04, 0x00]),
            ],
        ),
        &Event {
            tag: 5,
            body: EventBody::PullProgress { length: 0x40000 },
        },
    );
    let mut bad_code = error;
    bad_code[8] = 0;
    assert_eq!(
        Event::parse(&bad_code),
        Err(Error::Unknown {
            what: "error code",
            value: 0
        })
    );

    let done: Vec<u8> = DoneStatus::ALL.iter().map(|s| u8::from(*s)).collect();
    assert_eq!(done, (0..=9).collect::<Vec<u8>>());
    let nacks: Vec<u8> = NackKind::ALL.iter().map(|s| u8::from(*s)).collect();
    assert_eq!(nacks, vec![1, 2, 3, 4]);
}

#[test]
fn send_register_and_deregister() {
    // 4 MiB + 1 byte: 1025 pages, listed by 2 info pages.
    let reg = slot(
        SEND_SLOT_SIZE,
        &[
            (0, &[0x19, 0x01, 0, 0, 9, 0, 0, 0]),
            (16, &[7, 2]),
            (20, &[0x01, 0x00, 0x40, 0x00]),
            (24, &[0x11, 0, 0, 0, 0x22, 0, 0, 0]),
        ],
    );
    let value = DirectRegister::new(7, 0x0040_0001, &[0x11, 0x22]).unwrap();
    assert_eq!(value.nr_pages(), 1025);
    assert_eq!(value.info_refs(), &[0x11, 0x22]);
    check_send(
        &reg,
        &SendRequest {
            tag: 9,
            route: Route::default(),
            op: SendOp::Register(value),
        },
    );
    let dereg = slot(
        SEND_SLOT_SIZE,
        &[(0, &[0x1a, 0x01, 0, 0, 10, 0, 0, 0]), (16, &[7])],
    );
    check_send(
        &dereg,
        &SendRequest {
            tag: 10,
            route: Route::default(),
            op: SendOp::Deregister { region_id: 7 },
        },
    );
}

#[test]
fn send_register_is_bounded() {
    // The info page count must match the length; zero and oversized regions are refused.
    assert!(DirectRegister::new(1, 4096, &[]).is_err());
    assert!(DirectRegister::new(1, 4096, &[1, 2]).is_err());
    assert!(DirectRegister::new(1, 0, &[1]).is_err());
    let too_big = (REGION_PAGES_MAX as u32 + 1) * PAGE_SIZE as u32;
    assert!(DirectRegister::new(1, too_big, &[0; 24]).is_err());
    assert!(DirectRegister::new(1, 4096, &[0; 25]).is_err());
    // A hostile slot claiming 200 info refs, or refs that do not match the length.
    let many = slot(
        SEND_SLOT_SIZE,
        &[
            (0, &[0x19, 0x01, 0, 0, 1, 0, 0, 0]),
            (16, &[0, 200]),
            (20, &[0, 16, 0, 0]),
        ],
    );
    assert!(matches!(
        SendRequest::parse(&many),
        Err(Error::Invalid { .. })
    ));
    let mismatch = slot(
        SEND_SLOT_SIZE,
        &[
            (0, &[0x19, 0x01, 0, 0, 1, 0, 0, 0]),
            (16, &[0, 3]),
            (20, &[0, 16, 0, 0]),
        ],
    );
    assert!(matches!(
        SendRequest::parse(&mismatch),
        Err(Error::Invalid { .. })
    ));
}

/// The send ring's fill marks lie in ring.h's private area, after the four indices: region
/// 0 is the low bit of the word at byte 16, region 255 the high bit of the word at byte 44,
/// and writing one leaves the indices and the other marks alone.
#[test]
fn fill_marks_lie_in_the_send_rings_private_area() {
    use std::sync::atomic::Ordering;
    use xmx_wire::msg::fill_marks;
    use xmx_wire::ring::{layout, SharedMem};

    let ring = SharedMem::new_owned(1);
    ring.store_u32(layout::REQ_PROD, 7, Ordering::Relaxed);
    fill_marks::write(&ring, 0, true);
    fill_marks::write(&ring, 33, true);
    fill_marks::write(&ring, 255, true);
    let word = |at: usize| ring.load_u32(at, Ordering::Relaxed).unwrap();
    assert_eq!(word(16), 1);
    assert_eq!(word(20), 1 << 1);
    assert_eq!(word(44), 1 << 31);
    fill_marks::write(&ring, 0, false);
    assert_eq!((word(16), word(20), word(44)), (0, 2, 1 << 31));
    assert_eq!(word(layout::REQ_PROD), 7);
    let mut rest = [0u8; layout::SLOTS - 48];
    assert!(ring.read_bytes(48, &mut rest));
    assert!(
        rest.iter().all(|&b| b == 0),
        "nothing written past the marks"
    );
    assert_eq!(fill_marks::OFFSET + fill_marks::LEN, 48);
}

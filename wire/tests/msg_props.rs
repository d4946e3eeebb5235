//! Property tests of the ring messages: every valid message survives emit then parse, and
//! arbitrary or damaged bytes are refused without panicking.

use proptest::prelude::*;
use xmx_wire::msg::*;
use xmx_wire::Error;

fn route() -> impl Strategy<Value = Route> {
    (any::<u16>(), any::<u8>(), any::<u32>()).prop_map(|(peer_index, endpoint, session_id)| Route {
        peer_index,
        endpoint,
        session_id,
    })
}

fn info() -> impl Strategy<Value = MsgInfo> {
    (any::<u16>(), any::<u16>(), any::<u64>()).prop_map(|(seqnum, piggyack, match_info)| MsgInfo {
        seqnum,
        piggyack,
        match_info,
    })
}

fn inline(max: usize) -> impl Strategy<Value = InlineMsg> {
    (info(), proptest::collection::vec(any::<u8>(), 0..=max)).prop_map(|(info, data)| InlineMsg {
        info,
        data: InlineData::new(&data).unwrap(),
    })
}

fn rndv() -> impl Strategy<Value = RndvSend> {
    (info(), any::<u32>(), any::<u8>(), any::<u8>(), any::<u32>()).prop_map(
        |(info, length, region_id, region_seqnum, region_offset)| RndvSend {
            info,
            length,
            region_id,
            region_seqnum,
            region_offset,
        },
    )
}

fn connect_request() -> impl Strategy<Value = RingConnectRequest> {
    (any::<u16>(), any::<u16>(), any::<u32>(), any::<u8>()).prop_map(|(a, b, c, d)| {
        RingConnectRequest {
            seqnum: a,
            target_recv_seqnum_start: b,
            app_key: c,
            connect_seqnum: d,
        }
    })
}

fn connect_reply() -> impl Strategy<Value = RingConnectReply> {
    (any::<u16>(), any::<u16>(), any::<u8>(), any::<u8>()).prop_map(|(a, b, c, d)| {
        RingConnectReply {
            seqnum: a,
            target_recv_seqnum_start: b,
            connect_seqnum: c,
            status: d,
        }
    })
}

fn notify() -> impl Strategy<Value = NotifySend> {
    (
        any::<u16>(),
        any::<u16>(),
        any::<u32>(),
        any::<u8>(),
        any::<u8>(),
    )
        .prop_map(|(a, b, c, d, e)| NotifySend {
            seqnum: a,
            piggyack: b,
            total_length: c,
            region_id: d,
            region_seqnum: e,
        })
}

fn liback() -> impl Strategy<Value = LibackSend> {
    (any::<u16>(), any::<u16>(), any::<u32>(), any::<bool>()).prop_map(|(a, b, c, d)| LibackSend {
        lib_seqnum: a,
        send_seq: b,
        acknum: c,
        resent: d,
    })
}

fn medium_send() -> impl Strategy<Value = MediumSend> {
    (info(), 0..=MEDIUM_MAX as u32).prop_flat_map(|(info, length)| {
        proptest::collection::vec(any::<u16>(), medium_frags(length)).prop_map(move |slots| {
            MediumSend {
                info,
                length,
                sendq_slots: QueueSlots::new(&slots).unwrap(),
            }
        })
    })
}

fn recv_medium() -> impl Strategy<Value = RecvMedium> {
    (info(), 0..=MEDIUM_MAX as u32).prop_flat_map(|(info, length)| {
        let frags = medium_frags(length) as u8;
        let max_frag = length.min(MEDIUM_FRAG_MAX as u32) as u16;
        (any::<u16>(), 0..=max_frag, 0..frags, any::<u8>()).prop_map(
            move |(recvq_slot, frag_length, frag_seqnum, frag_pipeline)| RecvMedium {
                info,
                length,
                recvq_slot,
                frag_length,
                frag_seqnum,
                frag_pipeline,
            },
        )
    })
}

fn region_register() -> impl Strategy<Value = RegionRegister> {
    (any::<u8>(), any::<u8>(), 0u16..4096)
        .prop_flat_map(|(endpoint, region_id, off)| {
            let max_len = (REGION_PAGES_MAX as u64 * 4096 - u64::from(off)) as u32;
            (Just((endpoint, region_id, off)), 1..=max_len)
        })
        .prop_flat_map(|((endpoint, region_id, first_page_offset), length)| {
            let pages = (u64::from(first_page_offset) + u64::from(length)).div_ceil(4096) as usize;
            proptest::collection::vec(any::<u32>(), info_pages_for(pages)).prop_map(
                move |info_refs| RegionRegister {
                    endpoint,
                    region_id,
                    first_page_offset,
                    length,
                    info_refs,
                },
            )
        })
}

fn ctrl_request() -> impl Strategy<Value = CtrlRequest> {
    let open = (
        any::<u8>(),
        any::<u32>(),
        any::<u32>(),
        1..=8u8,
        1..=8u8,
        0..=500u16,
        0..=500u16,
    )
        .prop_map(
            |(endpoint, event_channel, info_ref, send_ring, event_ring, send_queue, recv_queue)| {
                CtrlOp::EndpointOpen(EndpointOpen {
                    endpoint,
                    event_channel,
                    info_ref,
                    pages: EndpointPages {
                        send_ring,
                        event_ring,
                        send_queue,
                        recv_queue,
                    },
                    resume_session: event_channel ^ info_ref,
                    quiet_send_done: send_ring % 2 == 0,
                })
            },
        );
    let op = prop_oneof![
        open,
        any::<u8>().prop_map(|endpoint| CtrlOp::EndpointClose { endpoint }),
        region_register().prop_map(CtrlOp::RegionRegister),
        (any::<u8>(), any::<u8>()).prop_map(|(endpoint, region_id)| CtrlOp::RegionDeregister {
            endpoint,
            region_id
        }),
    ];
    (any::<u32>(), op).prop_map(|(tag, op)| CtrlRequest { tag, op })
}

fn ctrl_response() -> impl Strategy<Value = CtrlResponse> {
    let reply = prop_oneof![
        (any::<u8>(), any::<u32>()).prop_map(|(endpoint, session_id)| CtrlReply::EndpointOpen {
            endpoint,
            session_id
        }),
        any::<u8>().prop_map(|endpoint| CtrlReply::EndpointClose { endpoint }),
        (any::<u8>(), any::<u8>()).prop_map(|(endpoint, region_id)| CtrlReply::RegionRegister {
            endpoint,
            region_id
        }),
        (any::<u8>(), any::<u8>()).prop_map(|(endpoint, region_id)| CtrlReply::RegionDeregister {
            endpoint,
            region_id
        }),
    ];
    (
        any::<u32>(),
        proptest::sample::select(CtrlStatus::ALL),
        reply,
    )
        .prop_map(|(tag, status, reply)| CtrlResponse { tag, status, reply })
}

fn send_request() -> impl Strategy<Value = SendRequest> {
    let pull = (
        any::<u32>(),
        any::<u8>(),
        any::<u32>(),
        any::<u8>(),
        any::<u8>(),
        any::<u32>(),
    )
        .prop_map(
            |(
                length,
                local_region,
                local_offset,
                remote_region,
                remote_region_seqnum,
                remote_offset,
            )| Pull {
                length,
                local_region,
                local_offset,
                remote_region,
                remote_region_seqnum,
                remote_offset,
            },
        );
    let op = prop_oneof![
        inline(TINY_MAX).prop_map(SendOp::Tiny),
        inline(SMALL_MAX).prop_map(SendOp::Small),
        medium_send().prop_map(SendOp::Medium),
        rndv().prop_map(SendOp::Rndv),
        connect_request().prop_map(SendOp::ConnectRequest),
        connect_reply().prop_map(SendOp::ConnectReply),
        notify().prop_map(SendOp::Notify),
        liback().prop_map(SendOp::Liback),
        pull.prop_map(SendOp::Pull),
    ];
    (any::<u32>(), route(), op).prop_map(|(tag, route, op)| SendRequest { tag, route, op })
}

fn event() -> impl Strategy<Value = Event> {
    let body = prop_oneof![
        (route(), inline(TINY_MAX)).prop_map(|(from, msg)| EventBody::RecvTiny { from, msg }),
        (route(), inline(SMALL_MAX)).prop_map(|(from, msg)| EventBody::RecvSmall { from, msg }),
        (route(), recv_medium()).prop_map(|(from, frag)| EventBody::RecvMedium { from, frag }),
        (route(), rndv()).prop_map(|(from, rndv)| EventBody::RecvRndv { from, rndv }),
        (route(), connect_request())
            .prop_map(|(from, request)| EventBody::RecvConnectRequest { from, request }),
        (route(), connect_reply(), any::<u32>()).prop_map(|(from, reply, target_session_id)| {
            EventBody::RecvConnectReply {
                from,
                reply,
                target_session_id,
            }
        }),
        (route(), notify()).prop_map(|(from, notify)| EventBody::RecvNotify { from, notify }),
        (route(), liback()).prop_map(|(from, ack)| EventBody::RecvLiback { from, ack }),
        (proptest::sample::select(DoneStatus::ALL), any::<u32>())
            .prop_map(|(status, length)| EventBody::SendDone { status, length }),
        (proptest::sample::select(DoneStatus::ALL), any::<u32>())
            .prop_map(|(status, length)| EventBody::PullDone { status, length }),
        (
            route(),
            proptest::sample::select(NackKind::ALL),
            any::<u16>()
        )
            .prop_map(|(from, kind, seqnum)| EventBody::RecvNack { from, kind, seqnum }),
        proptest::sample::select(ErrorCode::ALL).prop_map(|code| EventBody::Error { code }),
        any::<u8>().prop_map(|region| EventBody::RegionWanted { region }),
        any::<u32>().prop_map(|length| EventBody::PullProgress { length }),
    ];
    (any::<u32>(), body).prop_map(|(tag, body)| Event { tag, body })
}

/// Parse with `parse`; if it accepts, the value must emit and parse back to itself.
fn parse_is_canonical<T: PartialEq + std::fmt::Debug>(
    bytes: &[u8],
    size: usize,
    parse: impl Fn(&[u8]) -> xmx_wire::Result<T>,
    emit: impl Fn(&T, &mut [u8]) -> xmx_wire::Result<()>,
) -> Result<(), TestCaseError> {
    if let Ok(value) = parse(bytes) {
        let mut out = vec![0u8; size];
        emit(&value, &mut out)
            .map_err(|e| TestCaseError::fail(format!("parsed value does not emit: {e}")))?;
        prop_assert_eq!(parse(&out).unwrap(), value);
    } else if bytes.len() < size {
        prop_assert_eq!(
            parse(bytes).unwrap_err(),
            Error::Truncated {
                needed: size,
                have: bytes.len()
            }
        );
    }
    Ok(())
}

fn any_slot() -> impl Strategy<Value = Vec<u8>> {
    // Valid headers are rare in random bytes: bias the version and kind bytes.
    (
        proptest::collection::vec(any::<u8>(), 0..260),
        any::<bool>(),
        0u8..0x50,
    )
        .prop_map(|(mut b, fix, kind)| {
            if fix && b.len() >= 2 {
                b[0] = kind;
                b[1] = PROTOCOL_VERSION;
            }
            b
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn ctrl_request_round_trips(req in ctrl_request()) {
        let mut buf = vec![0u8; CTRL_SLOT_SIZE];
        req.emit(&mut buf).unwrap();
        prop_assert_eq!(CtrlRequest::parse(&buf).unwrap(), req);
    }

    #[test]
    fn ctrl_response_round_trips(rsp in ctrl_response()) {
        let mut buf = vec![0u8; CTRL_SLOT_SIZE];
        rsp.emit(&mut buf).unwrap();
        prop_assert_eq!(CtrlResponse::parse(&buf).unwrap(), rsp);
    }

    #[test]
    fn send_request_round_trips(req in send_request()) {
        let mut buf = vec![0u8; SEND_SLOT_SIZE];
        req.emit(&mut buf).unwrap();
        prop_assert_eq!(SendRequest::parse(&buf).unwrap(), req);
    }

    #[test]
    fn event_round_trips(ev in event()) {
        let mut buf = vec![0u8; EVENT_SLOT_SIZE];
        ev.emit(&mut buf).unwrap();
        prop_assert_eq!(Event::parse(&buf).unwrap(), ev);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in any_slot()) {
        parse_is_canonical(&bytes, CTRL_SLOT_SIZE, CtrlRequest::parse, CtrlRequest::emit)?;
        parse_is_canonical(&bytes, CTRL_SLOT_SIZE, CtrlResponse::parse, CtrlResponse::emit)?;
        parse_is_canonical(&bytes, SEND_SLOT_SIZE, SendRequest::parse, SendRequest::emit)?;
        parse_is_canonical(&bytes, EVENT_SLOT_SIZE, Event::parse, Event::emit)?;
    }

    #[test]
    fn damaged_messages_never_panic(req in send_request(), ev in event(), ctrl in ctrl_request(),
                                    at in 0usize..192, value in any::<u8>()) {
        let mut s = vec![0u8; SEND_SLOT_SIZE];
        req.emit(&mut s).unwrap();
        s[at] = value;
        parse_is_canonical(&s, SEND_SLOT_SIZE, SendRequest::parse, SendRequest::emit)?;
        let mut e = vec![0u8; EVENT_SLOT_SIZE];
        ev.emit(&mut e).unwrap();
        e[at] = value;
        parse_is_canonical(&e, EVENT_SLOT_SIZE, Event::parse, Event::emit)?;
        let mut c = vec![0u8; CTRL_SLOT_SIZE];
        ctrl.emit(&mut c).unwrap();
        c[at % CTRL_SLOT_SIZE] = value;
        parse_is_canonical(&c, CTRL_SLOT_SIZE, CtrlRequest::parse, CtrlRequest::emit)?;
    }

    #[test]
    fn truncated_messages_are_refused(req in send_request(), cut in 0usize..SEND_SLOT_SIZE) {
        let mut buf = vec![0u8; SEND_SLOT_SIZE];
        req.emit(&mut buf).unwrap();
        prop_assert_eq!(SendRequest::parse(&buf[..cut]), Err(Error::Truncated { needed: SEND_SLOT_SIZE, have: cut }));
        prop_assert_eq!(Event::parse(&buf[..cut]), Err(Error::Truncated { needed: EVENT_SLOT_SIZE, have: cut }));
        let refused = matches!(req.emit(&mut buf[..cut]), Err(Error::BufferTooSmall { .. }));
        prop_assert!(refused, "emit into {} bytes was not refused", cut);
    }

    #[test]
    fn other_versions_are_refused(req in send_request(), version in any::<u8>()) {
        prop_assume!(version != PROTOCOL_VERSION);
        let mut buf = vec![0u8; SEND_SLOT_SIZE];
        req.emit(&mut buf).unwrap();
        buf[1] = version;
        prop_assert_eq!(SendRequest::parse(&buf), Err(Error::Unknown { what: "protocol version", value: version.into() }));
    }

    #[test]
    fn info_pages_round_trip(refs in proptest::collection::vec(any::<u32>(), 0..3000)) {
        let pages = pack_info_pages(&refs);
        prop_assert_eq!(pages.len(), info_pages_for(refs.len()));
        prop_assert_eq!(unpack_info_pages(&pages, refs.len()).unwrap(), refs);
    }
}

//! The protocol core's frames as the backend engine's messages, and back.
//!
//! The engine (the Open-MX driver role) takes [`SendRequest`]s and produces
//! [`Event`]s, the same messages a guest's send and event rings carry. A
//! transport that talks to an engine (in this process for `native`, across
//! shared rings for `xen`) converts the core's [`Frame`]s into requests on the
//! way out and the engine's events back into frames on the way in:
//!
//! - [`Outgoing`] turns one frame into one request, except MEDIUM: the core
//!   emits one frame per 4 KiB fragment while the engine sends a whole message
//!   from send-queue slots, so fragments are held until the message is whole
//!   ([`Outbound::Medium`]).
//! - [`incoming`] turns one event into a frame for the core, or into the
//!   completion of a request the transport posted (a pull, a refused send).
//! - [`PeerSessions`] remembers the session of every remote endpoint seen in
//!   a connect, because a PULL must name the session of the endpoint it pulls
//!   from and the core hands a pull only the remote's address.

use rustc_hash::FxHashMap;
use xmx_mx::frame::{
    ConnectReply as CoreConnectReply, ConnectRequest as CoreConnectRequest, Liback as CoreLiback,
    MediumFrag, Message, MessageKind, Nack as CoreNack, Notify as CoreNotify, Rndv as CoreRndv,
};
use xmx_mx::{Body, Frame, PeerAddr, RdmaWindow, Seqnum, Status};
use xmx_wire::msg::{
    medium_frags, DoneStatus, ErrorCode, Event, EventBody, InlineData, InlineMsg, LibackSend,
    MediumSend, MsgInfo, NackKind, NotifySend, Pull, QueueSlots, RingConnectReply,
    RingConnectRequest, RndvSend, Route, SendOp, SendRequest, MEDIUM_FRAGS_MAX, MEDIUM_FRAG_MAX,
    MEDIUM_MAX,
};

/// Why a frame of the core cannot become a send request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unsendable {
    /// Only a NIC sends this packet type (NACK_LIB answers frames the NIC
    /// refused), so no request exists for it.
    #[error("{0} is sent by the NIC, not requested by the library")]
    NotALibraryPacket(&'static str),
    /// A field does not fit the request format.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// A whole MEDIUM message, ready to be placed in send-queue slots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MediumMessage {
    /// Destination.
    pub(crate) route: Route,
    /// MX header fields.
    pub(crate) info: MsgInfo,
    /// Message length.
    pub(crate) length: u32,
    /// The fragments, in order: 4096 bytes each but the last.
    pub(crate) fragments: Vec<Vec<u8>>,
}

impl MediumMessage {
    /// The request that sends this message once fragment `i` is in send-queue
    /// slot `slots[i]`.
    pub(crate) fn request(&self, tag: u32, slots: &[u16]) -> Result<SendRequest, Unsendable> {
        let sendq_slots = QueueSlots::new(slots).map_err(|_| Unsendable::Invalid {
            field: "medium fragments",
            reason: "not 1 to 8 send-queue slots",
        })?;
        if slots.len() != self.fragments.len() {
            return Err(Unsendable::Invalid {
                field: "medium fragments",
                reason: "one send-queue slot per fragment",
            });
        }
        Ok(SendRequest {
            tag,
            route: self.route,
            op: SendOp::Medium(MediumSend {
                info: self.info,
                length: self.length,
                sendq_slots,
            }),
        })
    }
}

/// What a frame of the core becomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outbound {
    /// A request to post as is (its tag is 0: the caller numbers requests).
    Request(SendRequest),
    /// A MEDIUM message whose last fragment just arrived.
    Medium(MediumMessage),
}

/// Fragments of one MEDIUM message seen so far.
#[derive(Debug)]
struct Assembly {
    route: Route,
    info: MsgInfo,
    length: u32,
    fragments: Vec<Option<Vec<u8>>>,
}

/// Converts the core's outgoing frames into send requests, holding MEDIUM
/// fragments until their message is whole.
///
/// The core emits a MEDIUM message's fragments back to back (a first
/// transmission or a retransmission alike), so one message is assembled at a
/// time; a fragment of another message discards an incomplete one, which the
/// core sends again after its resend timeout.
#[derive(Debug, Default)]
pub(crate) struct Outgoing {
    assembly: Option<Assembly>,
}

impl Outgoing {
    /// Converts one frame; `Ok(None)` when a MEDIUM fragment was held.
    pub(crate) fn convert(
        &mut self,
        frame: Frame<Vec<u8>>,
    ) -> Result<Option<Outbound>, Unsendable> {
        let to = |session_id| Route {
            peer_index: frame.peer_index,
            endpoint: frame.dst_endpoint,
            session_id,
        };
        let request = |route, op| Ok(Some(Outbound::Request(SendRequest { tag: 0, route, op })));
        match frame.body {
            Body::Message(m) => {
                let route = to(m.session);
                let info = MsgInfo {
                    seqnum: m.seqnum.raw(),
                    piggyack: m.piggyack.raw(),
                    match_info: m.match_info,
                };
                let inline = |data: &[u8]| -> Result<InlineMsg, Unsendable> {
                    Ok(InlineMsg {
                        info,
                        data: InlineData::new(data).map_err(|_| Unsendable::Invalid {
                            field: "inline data",
                            reason: "longer than a SMALL message",
                        })?,
                    })
                };
                match m.kind {
                    MessageKind::Tiny => request(route, SendOp::Tiny(inline(&m.payload)?)),
                    MessageKind::Small => request(route, SendOp::Small(inline(&m.payload)?)),
                    MessageKind::Rndv(r) => request(
                        route,
                        SendOp::Rndv(RndvSend {
                            info,
                            length: r.msg_length,
                            region_id: r.window.id,
                            region_seqnum: r.window.seqnum,
                            region_offset: u32::from(r.window.offset),
                        }),
                    ),
                    MessageKind::Medium(f) => Ok(self
                        .add_fragment(route, info, f, m.payload)?
                        .map(Outbound::Medium)),
                }
            }
            Body::ConnectRequest(c) => request(
                to(0),
                SendOp::ConnectRequest(RingConnectRequest {
                    seqnum: c.lib_seqnum,
                    target_recv_seqnum_start: c.target_recv_seqnum_start.raw(),
                    app_key: c.app_key,
                    connect_seqnum: c.connect_seqnum,
                }),
            ),
            // The reply names the requester's session; the engine adds ours.
            Body::ConnectReply(c) => request(
                to(c.src_session),
                SendOp::ConnectReply(RingConnectReply {
                    seqnum: c.lib_seqnum,
                    target_recv_seqnum_start: c.target_recv_seqnum_start.raw(),
                    connect_seqnum: c.connect_seqnum,
                    status: c.status,
                }),
            ),
            Body::Notify(n) => request(
                to(n.session),
                SendOp::Notify(NotifySend {
                    seqnum: n.seqnum.raw(),
                    piggyack: n.piggyack.raw(),
                    total_length: n.total_length,
                    region_id: n.rdma_id,
                    region_seqnum: n.rdma_seqnum,
                }),
            ),
            Body::Liback(a) => request(
                to(a.session),
                SendOp::Liback(LibackSend {
                    lib_seqnum: a.lib_seqnum.raw(),
                    send_seq: a.send_seq.raw(),
                    acknum: a.acknum,
                    resent: a.resent != 0,
                }),
            ),
            Body::Nack(_) => Err(Unsendable::NotALibraryPacket("NACK_LIB")),
        }
    }

    fn add_fragment(
        &mut self,
        route: Route,
        info: MsgInfo,
        frag: MediumFrag,
        data: Vec<u8>,
    ) -> Result<Option<MediumMessage>, Unsendable> {
        if frag.msg_length as usize > MEDIUM_MAX {
            return Err(Unsendable::Invalid {
                field: "medium length",
                reason: "beyond 32 KiB",
            });
        }
        let count = medium_frags(frag.msg_length);
        let index = usize::from(frag.frag_seqnum);
        let start = index * MEDIUM_FRAG_MAX;
        let expected = (frag.msg_length as usize)
            .saturating_sub(start)
            .min(MEDIUM_FRAG_MAX);
        if index >= count || count > MEDIUM_FRAGS_MAX || data.len() != expected {
            return Err(Unsendable::Invalid {
                field: "medium fragment",
                reason: "does not fit its message",
            });
        }
        let same = self
            .assembly
            .as_ref()
            .is_some_and(|a| a.route == route && a.info == info && a.length == frag.msg_length);
        if !same {
            if self.assembly.is_some() {
                tracing::debug!("incomplete MEDIUM message discarded for a new one");
            }
            self.assembly = Some(Assembly {
                route,
                info,
                length: frag.msg_length,
                fragments: vec![None; count],
            });
        }
        let Some(a) = self.assembly.as_mut() else {
            return Ok(None);
        };
        if let Some(slot) = a.fragments.get_mut(index) {
            *slot = Some(data);
        }
        if a.fragments.iter().any(Option::is_none) {
            return Ok(None);
        }
        let Some(a) = self.assembly.take() else {
            return Ok(None);
        };
        Ok(Some(MediumMessage {
            route: a.route,
            info: a.info,
            length: a.length,
            fragments: a.fragments.into_iter().flatten().collect(),
        }))
    }
}

/// The PULL request that fetches `length` bytes of `source`'s `window` into
/// the start of local region `local_region`. `session` is the session of the
/// remote endpoint (see [`PeerSessions`]).
pub(crate) fn pull_request(
    tag: u32,
    source: PeerAddr,
    session: u32,
    window: RdmaWindow,
    local_region: u8,
    length: u32,
) -> SendRequest {
    SendRequest {
        tag,
        route: Route {
            peer_index: source.peer_index,
            endpoint: source.endpoint,
            session_id: session,
        },
        op: SendOp::Pull(Pull {
            length,
            local_region,
            local_offset: 0,
            remote_region: window.id,
            remote_region_seqnum: window.seqnum,
            remote_offset: u32::from(window.offset),
        }),
    }
}

/// What an engine event is for the library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Inbound {
    /// A frame for the protocol core.
    Frame(Frame<Vec<u8>>),
    /// The request tagged `tag` completed: bytes moved, or why it failed.
    Completed {
        /// The request's tag.
        tag: u32,
        /// Bytes sent or pulled, or the failure.
        result: Result<u32, Status>,
    },
    /// A peer pulls from `region`, whose fill mark is clear: fill it and set the mark.
    RegionWanted {
        /// The region.
        region: u8,
    },
    /// The first `length` bytes of the pull tagged `tag` are in its window.
    PullProgress {
        /// The pull request's tag.
        tag: u32,
        /// Bytes landed from the pull's start.
        length: u32,
    },
}

/// Why an event could not be turned into a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unreadable {
    /// A MEDIUM fragment's receive-queue slot could not be read.
    #[error("receive-queue slot {0} unreadable")]
    RecvQueueSlot(u16),
}

/// Converts an event for endpoint `endpoint` (whose session is `session`).
/// `fragment(slot, length)` reads a MEDIUM fragment out of the receive
/// queue; the caller hands the slot back to the engine afterwards.
pub(crate) fn incoming(
    endpoint: u8,
    session: u32,
    event: &Event,
    fragment: impl FnOnce(u16, u16) -> Option<Vec<u8>>,
) -> Result<Inbound, Unreadable> {
    let frame = |from: &Route, body| {
        Inbound::Frame(Frame {
            peer_index: from.peer_index,
            dst_endpoint: endpoint,
            src_endpoint: from.endpoint,
            body,
        })
    };
    let message = |info: &MsgInfo, kind, payload| {
        Body::Message(Message {
            session,
            seqnum: Seqnum::from_raw(info.seqnum),
            piggyack: Seqnum::from_raw(info.piggyack),
            match_info: info.match_info,
            kind,
            payload,
        })
    };
    let tag = event.tag;
    Ok(match &event.body {
        EventBody::RecvTiny { from, msg } => frame(
            from,
            message(&msg.info, MessageKind::Tiny, msg.data.as_slice().to_vec()),
        ),
        EventBody::RecvSmall { from, msg } => frame(
            from,
            message(&msg.info, MessageKind::Small, msg.data.as_slice().to_vec()),
        ),
        EventBody::RecvMedium { from, frag } => {
            let data = fragment(frag.recvq_slot, frag.frag_length)
                .ok_or(Unreadable::RecvQueueSlot(frag.recvq_slot))?;
            let kind = MessageKind::Medium(MediumFrag {
                msg_length: frag.length,
                frag_seqnum: frag.frag_seqnum,
                frag_pipeline: frag.frag_pipeline,
            });
            frame(from, message(&frag.info, kind, data))
        }
        EventBody::RecvRndv { from, rndv } => {
            let kind = MessageKind::Rndv(CoreRndv {
                msg_length: rndv.length,
                window: RdmaWindow {
                    id: rndv.region_id,
                    seqnum: rndv.region_seqnum,
                    // The wire carries 16 bits; the engine widened them.
                    offset: rndv.region_offset as u16,
                },
            });
            frame(from, message(&rndv.info, kind, Vec::new()))
        }
        EventBody::RecvConnectRequest { from, request } => frame(
            from,
            Body::ConnectRequest(CoreConnectRequest {
                lib_seqnum: request.seqnum,
                src_session: from.session_id,
                app_key: request.app_key,
                target_recv_seqnum_start: Seqnum::from_raw(request.target_recv_seqnum_start),
                connect_seqnum: request.connect_seqnum,
            }),
        ),
        EventBody::RecvConnectReply {
            from,
            reply,
            target_session_id,
        } => frame(
            from,
            Body::ConnectReply(CoreConnectReply {
                lib_seqnum: reply.seqnum,
                src_session: *target_session_id,
                target_session: from.session_id,
                target_recv_seqnum_start: Seqnum::from_raw(reply.target_recv_seqnum_start),
                connect_seqnum: reply.connect_seqnum,
                status: reply.status,
            }),
        ),
        EventBody::RecvNotify { from, notify } => frame(
            from,
            Body::Notify(CoreNotify {
                session,
                total_length: notify.total_length,
                rdma_id: notify.region_id,
                rdma_seqnum: notify.region_seqnum,
                seqnum: Seqnum::from_raw(notify.seqnum),
                piggyack: Seqnum::from_raw(notify.piggyack),
            }),
        ),
        EventBody::RecvLiback { from, ack } => frame(
            from,
            // The engine dropped acks whose two session copies differed.
            Body::Liback(CoreLiback {
                session,
                ack_session: session,
                acknum: ack.acknum,
                lib_seqnum: Seqnum::from_raw(ack.lib_seqnum),
                send_seq: Seqnum::from_raw(ack.send_seq),
                resent: ack.resent.into(),
            }),
        ),
        EventBody::RecvNack { from, kind, seqnum } => frame(
            from,
            Body::Nack(CoreNack {
                nack_type: nack_wire(*kind),
                lib_seqnum: Seqnum::from_raw(*seqnum),
            }),
        ),
        EventBody::SendDone { status, length } | EventBody::PullDone { status, length } => {
            Inbound::Completed {
                tag,
                result: done_result(*status, *length),
            }
        }
        EventBody::Error { code } => Inbound::Completed {
            tag,
            result: Err(error_status(*code)),
        },
        EventBody::RegionWanted { region } => Inbound::RegionWanted { region: *region },
        EventBody::PullProgress { length } => Inbound::PullProgress {
            tag,
            length: *length,
        },
    })
}

fn nack_wire(kind: NackKind) -> u8 {
    match kind {
        NackKind::BadEndpoint => 1,
        NackKind::EndpointClosed => 2,
        NackKind::BadSession => 3,
        NackKind::BadRdmaWindow => 4,
    }
}

/// The outcome a SEND_DONE or PULL_DONE reports.
pub(crate) fn done_result(status: DoneStatus, length: u32) -> Result<u32, Status> {
    Err(match status {
        DoneStatus::Success => return Ok(length),
        DoneStatus::BadEndpoint => Status::BadEndpoint,
        DoneStatus::EndpointClosed => Status::EndpointClosed,
        DoneStatus::BadSession => Status::BadSession,
        DoneStatus::BadRegion => Status::BadRdmawin,
        DoneStatus::Aborted => Status::Aborted,
        DoneStatus::Timeout => Status::Timeout,
        DoneStatus::BadPeer | DoneStatus::Denied => Status::EndpointUnreachable,
        DoneStatus::NoResources => Status::NoResources,
    })
}

/// The status a request refused by the engine fails with.
pub(crate) fn error_status(code: ErrorCode) -> Status {
    match code {
        ErrorCode::BadPeer | ErrorCode::Denied => Status::EndpointUnreachable,
        ErrorCode::BadEndpoint => Status::BadEndpoint,
        ErrorCode::BadRegion => Status::BadRdmawin,
        ErrorCode::NoResources => Status::NoResources,
        ErrorCode::Malformed | ErrorCode::Unsupported => Status::Aborted,
    }
}

/// Sessions of remote endpoints, learnt from the connects an endpoint sees.
///
/// A connect request carries the requester's session, a successful reply
/// the replier's; an endpoint exchanges one or the other with every partner
/// before any message, so the session of a LARGE sender is known when its
/// data is pulled. A reopened remote endpoint connects again with its new
/// session, which replaces the old one.
#[derive(Clone, Debug, Default)]
pub(crate) struct PeerSessions {
    sessions: FxHashMap<PeerAddr, u32>,
}

impl PeerSessions {
    /// Learns from a frame the core is about to receive.
    pub(crate) fn observe(&mut self, frame: &Frame<Vec<u8>>) {
        let source = frame.source();
        match &frame.body {
            Body::ConnectRequest(c) => {
                self.sessions.insert(source, c.src_session);
            }
            Body::ConnectReply(c) if c.status == 0 => {
                self.sessions.insert(source, c.target_session);
            }
            _ => {}
        }
    }

    /// Records `peer`'s session learnt otherwise than by a connect.
    pub(crate) fn learn(&mut self, peer: PeerAddr, session: u32) {
        self.sessions.insert(peer, session);
    }

    /// The session of the endpoint at `peer`, if a connect named it.
    pub(crate) fn get(&self, peer: PeerAddr) -> Option<u32> {
        self.sessions.get(&peer).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::time::Instant;
    use xmx_engine::{
        ClusterId, EndpointConfig, Engine, EngineConfig, GuestConfig, GuestEvent, GuestId,
        GuestMemory, InMemoryGuest, MemoryArea, PeerEntry, RegionHandle,
    };
    use xmx_wire::mxoe::Mac;

    const A: GuestId = GuestId(1);
    const B: GuestId = GuestId(2);
    const SESSION_A: u32 = 0x1111_0001;
    const SESSION_B: u32 = 0x2222_0002;
    const EP_A: u8 = 3;
    const EP_B: u8 = 5;
    const SLOTS: u16 = 8;

    /// Two co-located guests of one engine: what A's library sends reaches
    /// B's library through the engine's real receive path.
    struct EngineGuestPair {
        engine: Engine,
        mem_a: InMemoryGuest,
        mem_b: InMemoryGuest,
        out: Outgoing,
    }

    impl EngineGuestPair {
        fn new() -> Self {
            let mut engine = Engine::new(EngineConfig::default());
            let (mem_a, mem_b) = (InMemoryGuest::new(), InMemoryGuest::new());
            for (id, mac, mem, ep, session) in [
                (A, 1u8, &mem_a, EP_A, SESSION_A),
                (B, 2u8, &mem_b, EP_B, SESSION_B),
            ] {
                let size = usize::from(SLOTS) * MEDIUM_FRAG_MAX;
                mem.add_area(MemoryArea::SendQueue { endpoint: ep }, size);
                mem.add_area(MemoryArea::RecvQueue { endpoint: ep }, size);
                engine
                    .add_guest(GuestConfig {
                        id,
                        mac: Mac([2, 0, 0, 0, 0, mac]),
                        cluster: ClusterId(0),
                        hostname: format!("g{mac}:0"),
                        memory: Box::new(mem.clone()),
                    })
                    .unwrap();
                engine
                    .open_endpoint(
                        id,
                        ep,
                        EndpointConfig {
                            session_id: session,
                            send_queue_slots: SLOTS,
                            recv_queue_slots: SLOTS,
                        },
                    )
                    .unwrap();
            }
            engine
                .set_peers((1..=2u8).map(|i| PeerEntry {
                    index: u16::from(i - 1),
                    mac: Mac([2, 0, 0, 0, 0, i]),
                    hostname: format!("g{i}:0"),
                    cluster: ClusterId(0),
                }))
                .unwrap();
            EngineGuestPair {
                engine,
                mem_a,
                mem_b,
                out: Outgoing::default(),
            }
        }

        /// Sends a frame from A's endpoint; returns the frames B's core gets.
        fn send(&mut self, frame: Frame<Vec<u8>>) -> Vec<Frame<Vec<u8>>> {
            let now = Instant::now();
            let Some(out) = self.out.convert(frame).expect("convertible") else {
                return Vec::new();
            };
            let request = match out {
                Outbound::Request(r) => r,
                Outbound::Medium(m) => {
                    let slots: Vec<u16> = (0..m.fragments.len() as u16).collect();
                    for (i, f) in m.fragments.iter().enumerate() {
                        let area = MemoryArea::SendQueue { endpoint: EP_A };
                        self.mem_a
                            .write_at(area, (i * MEDIUM_FRAG_MAX) as u64, f)
                            .unwrap();
                    }
                    m.request(7, &slots).unwrap()
                }
            };
            self.engine.handle_send(now, A, EP_A, &request).unwrap();
            let mut events = VecDeque::new();
            while let Some(e) = self.engine.poll_event() {
                events.push_back(e);
            }
            let mut frames = Vec::new();
            for GuestEvent {
                guest,
                endpoint,
                event,
                ..
            } in events
            {
                if guest != B {
                    continue;
                }
                assert_eq!(endpoint, EP_B);
                let mem = self.mem_b.clone();
                let got = incoming(EP_B, SESSION_B, &event, |slot, len| {
                    let mut buf = vec![0u8; usize::from(len)];
                    let area = MemoryArea::RecvQueue { endpoint: EP_B };
                    mem.read(area, u64::from(slot) * MEDIUM_FRAG_MAX as u64, &mut buf)
                        .ok()?;
                    Some(buf)
                })
                .unwrap();
                if let (Inbound::Frame(f), EventBody::RecvMedium { frag, .. }) = (&got, &event.body)
                {
                    self.engine
                        .release_recvq_slot(B, EP_B, frag.recvq_slot)
                        .unwrap();
                    frames.push(f.clone());
                } else if let Inbound::Frame(f) = got {
                    frames.push(f);
                }
            }
            frames
        }
    }

    fn from_a(body: Body<Vec<u8>>) -> Frame<Vec<u8>> {
        Frame {
            peer_index: 1,
            dst_endpoint: EP_B,
            src_endpoint: EP_A,
            body,
        }
    }

    /// What B's core should see for a frame A's core sent.
    fn as_received(mut f: Frame<Vec<u8>>) -> Frame<Vec<u8>> {
        f.peer_index = 0;
        f
    }

    fn message(kind: MessageKind, payload: Vec<u8>, seq: u16) -> Body<Vec<u8>> {
        Body::Message(Message {
            session: SESSION_B,
            seqnum: Seqnum::from_raw(seq),
            piggyack: Seqnum::from_raw(0x8002),
            match_info: 0x0123_4567_89ab_cdef,
            kind,
            payload,
        })
    }

    #[test]
    fn messages_cross_the_engine_unchanged() {
        let mut p = EngineGuestPair::new();
        // The RNDV names a window the engine checks is registered.
        p.engine
            .register_region(A, EP_A, 9, RegionHandle(1), (1 << 20) + 0x123)
            .unwrap();
        let bodies = [
            message(MessageKind::Tiny, vec![], 1),
            message(MessageKind::Tiny, (0..32).collect(), 2),
            message(
                MessageKind::Small,
                (0..128).map(|i| i as u8 ^ 0x5a).collect(),
                3,
            ),
            message(
                MessageKind::Rndv(CoreRndv {
                    msg_length: 1 << 20,
                    window: RdmaWindow {
                        id: 9,
                        seqnum: 4,
                        offset: 0x123,
                    },
                }),
                vec![],
                4,
            ),
            Body::Notify(CoreNotify {
                session: SESSION_B,
                total_length: 77777,
                rdma_id: 3,
                rdma_seqnum: 8,
                seqnum: Seqnum::from_raw(5),
                piggyack: Seqnum::from_raw(6),
            }),
            Body::Liback(CoreLiback {
                session: SESSION_B,
                ack_session: SESSION_B,
                acknum: 42,
                lib_seqnum: Seqnum::from_raw(7),
                send_seq: Seqnum::from_raw(6),
                resent: 1,
            }),
        ];
        for body in bodies {
            let sent = from_a(body);
            assert_eq!(p.send(sent.clone()), vec![as_received(sent)]);
        }
    }

    #[test]
    fn connects_carry_sessions_both_ways() {
        let mut p = EngineGuestPair::new();
        let request = from_a(Body::ConnectRequest(CoreConnectRequest {
            lib_seqnum: 0,
            src_session: SESSION_A,
            app_key: 0xfeed,
            target_recv_seqnum_start: Seqnum::from_raw(0x10),
            connect_seqnum: 3,
        }));
        let got = p.send(request.clone());
        assert_eq!(got, vec![as_received(request)]);
        let mut sessions = PeerSessions::default();
        sessions.observe(&got[0]);
        assert_eq!(sessions.get(PeerAddr::new(0, EP_A)), Some(SESSION_A));

        // A answers a request from B: the reply names B's session as the
        // requester's, and B learns A's session from it.
        let reply = from_a(Body::ConnectReply(CoreConnectReply {
            lib_seqnum: 0,
            src_session: SESSION_B,
            target_session: SESSION_A,
            target_recv_seqnum_start: Seqnum::from_raw(0x20),
            connect_seqnum: 4,
            status: 0,
        }));
        let got = p.send(reply.clone());
        assert_eq!(got, vec![as_received(reply)]);
        let mut sessions = PeerSessions::default();
        sessions.observe(&got[0]);
        assert_eq!(sessions.get(PeerAddr::new(0, EP_A)), Some(SESSION_A));
        assert_eq!(sessions.get(PeerAddr::new(0, 9)), None);
    }

    #[test]
    fn medium_fragments_are_held_until_whole_then_sent_once() {
        let mut p = EngineGuestPair::new();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let frags: Vec<Frame<Vec<u8>>> = data
            .chunks(MEDIUM_FRAG_MAX)
            .enumerate()
            .map(|(i, c)| {
                from_a(message(
                    MessageKind::Medium(MediumFrag {
                        msg_length: data.len() as u32,
                        frag_seqnum: i as u8,
                        frag_pipeline: 12,
                    }),
                    c.to_vec(),
                    9,
                ))
            })
            .collect();
        assert_eq!(frags.len(), 3);
        // Out of order on purpose: reassembly does not depend on it.
        assert!(p.send(frags[2].clone()).is_empty());
        assert!(p.send(frags[0].clone()).is_empty());
        let got = p.send(frags[1].clone());
        let expected: Vec<_> = frags.into_iter().map(as_received).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn a_new_medium_message_discards_an_incomplete_one() {
        let mut out = Outgoing::default();
        let frag = |seq: u16, i: u8, len: usize| {
            from_a(message(
                MessageKind::Medium(MediumFrag {
                    msg_length: 5000,
                    frag_seqnum: i,
                    frag_pipeline: 12,
                }),
                vec![i; len],
                seq,
            ))
        };
        assert_eq!(out.convert(frag(1, 0, 4096)), Ok(None));
        assert_eq!(out.convert(frag(2, 0, 4096)), Ok(None));
        // Message 1's second fragment no longer completes anything.
        assert_eq!(out.convert(frag(1, 1, 904)), Ok(None));
        assert_eq!(
            out.convert(frag(1, 1, 900)),
            Err(Unsendable::Invalid {
                field: "medium fragment",
                reason: "does not fit its message"
            })
        );
        assert_eq!(
            out.convert(frag(1, 2, 0)),
            Err(Unsendable::Invalid {
                field: "medium fragment",
                reason: "does not fit its message"
            })
        );
    }

    #[test]
    fn nacks_and_oversized_inline_data_are_refused() {
        let mut out = Outgoing::default();
        let nack = from_a(Body::Nack(CoreNack {
            nack_type: 2,
            lib_seqnum: Seqnum::from_raw(1),
        }));
        assert_eq!(
            out.convert(nack),
            Err(Unsendable::NotALibraryPacket("NACK_LIB"))
        );
        let big = from_a(message(MessageKind::Small, vec![0; 129], 1));
        assert!(matches!(out.convert(big), Err(Unsendable::Invalid { .. })));
    }

    #[test]
    fn completions_and_nacks_from_events() {
        let done = |body| Event { tag: 31, body };
        let conv = |e: &Event| incoming(EP_B, SESSION_B, e, |_, _| None).unwrap();
        assert_eq!(
            conv(&done(EventBody::PullDone {
                status: DoneStatus::Success,
                length: 1000
            })),
            Inbound::Completed {
                tag: 31,
                result: Ok(1000)
            }
        );
        assert_eq!(
            conv(&done(EventBody::PullDone {
                status: DoneStatus::Timeout,
                length: 10
            })),
            Inbound::Completed {
                tag: 31,
                result: Err(Status::Timeout)
            }
        );
        assert_eq!(
            conv(&done(EventBody::Error {
                code: ErrorCode::Denied
            })),
            Inbound::Completed {
                tag: 31,
                result: Err(Status::EndpointUnreachable)
            }
        );
        let nack = done(EventBody::RecvNack {
            from: Route {
                peer_index: 4,
                endpoint: 6,
                session_id: 0,
            },
            kind: NackKind::BadSession,
            seqnum: 0x8003,
        });
        assert_eq!(
            conv(&nack),
            Inbound::Frame(Frame {
                peer_index: 4,
                dst_endpoint: EP_B,
                src_endpoint: 6,
                body: Body::Nack(CoreNack {
                    nack_type: 3,
                    lib_seqnum: Seqnum::from_raw(0x8003)
                })
            })
        );
        // A MEDIUM fragment whose slot cannot be read is refused.
        let medium = Event {
            tag: 1,
            body: EventBody::RecvMedium {
                from: Route::default(),
                frag: xmx_wire::msg::RecvMedium {
                    info: MsgInfo::default(),
                    length: 200,
                    recvq_slot: 3,
                    frag_length: 200,
                    frag_seqnum: 0,
                    frag_pipeline: 12,
                },
            },
        };
        assert_eq!(
            incoming(EP_B, SESSION_B, &medium, |_, _| None),
            Err(Unreadable::RecvQueueSlot(3))
        );
    }

    #[test]
    fn pull_requests_name_the_remote_window_and_session() {
        let r = pull_request(
            12,
            PeerAddr::new(3, 4),
            0xabcd,
            RdmaWindow {
                id: 7,
                seqnum: 2,
                offset: 100,
            },
            9,
            5000,
        );
        assert_eq!(
            r,
            SendRequest {
                tag: 12,
                route: Route {
                    peer_index: 3,
                    endpoint: 4,
                    session_id: 0xabcd
                },
                op: SendOp::Pull(Pull {
                    length: 5000,
                    local_region: 9,
                    local_offset: 0,
                    remote_region: 7,
                    remote_region_seqnum: 2,
                    remote_offset: 100
                })
            }
        );
    }
}

//! Endpoint event ring messages: what the backend tells an application.
//!
//! Slots are [`EVENT_SLOT_SIZE`] bytes. Events about a packet from a peer name the source in
//! the same place as send requests name the destination (8 u16 peer index, 10 u8 source
//! endpoint, 12 u32 session: the sender's session for connect events, else 0), and reuse the
//! send ring's layouts for the same MX fields:
//!
//! ```text
//! RECV_TINY 0x40 / RECV_SMALL 0x41   as SEND_TINY / SEND_SMALL
//! RECV_MEDIUM 0x42                   16..32 as SEND_TINY (20 = message length)
//!                                    32 u16 recv-queue slot   34 u16 fragment length
//!                                    36 u8  fragment seqnum   37 u8  fragment pipeline
//! RECV_RNDV 0x43                     as SEND_RNDV
//! RECV_CONNECT_REQUEST 0x44          as SEND_CONNECT_REQUEST
//! RECV_CONNECT_REPLY 0x45            as SEND_CONNECT_REPLY, 24 u32 target session
//! RECV_NOTIFY 0x46 / RECV_LIBACK 0x47  as SEND_NOTIFY / SEND_LIBACK
//! SEND_DONE 0x48 / PULL_DONE 0x49    8 u8 status, 12 u32 bytes transferred
//! RECV_NACK 0x4a                     16 u8 nack kind, 18 u16 seqnum
//! ERROR 0x4b                         8 u32 error code
//! REGION_WANTED 0x4c                 8 u8  region id
//! ```
//!
//! SEND_DONE, PULL_DONE and ERROR carry the tag of the send request they complete; the
//! backend numbers other events with a running tag of its choosing.

use super::field::{set_u16, set_u32, set_u8, u16, u32, u8};
use super::send::{medium_frags, off};
use super::{
    emit_header, parse_header, InlineMsg, LibackSend, MsgInfo, NotifySend, RingConnectReply,
    RingConnectRequest, RndvSend, Route, MEDIUM_FRAGS_MAX, MEDIUM_FRAG_MAX, MEDIUM_MAX, SMALL_MAX,
    TINY_MAX,
};
use crate::{Error, Result};

/// Size of an endpoint event ring slot.
pub const EVENT_SLOT_SIZE: usize = 192;

wire_enum! {
    /// Event kinds of the endpoint event ring.
    pub enum EventKind: u8 as "event kind" {
        /// A TINY message arrived.
        RecvTiny = 0x40,
        /// A SMALL message arrived.
        RecvSmall = 0x41,
        /// A MEDIUM fragment arrived in the receive queue.
        RecvMedium = 0x42,
        /// A LARGE message was announced.
        RecvRndv = 0x43,
        /// A peer asks to connect.
        RecvConnectRequest = 0x44,
        /// A peer answered a connect request.
        RecvConnectReply = 0x45,
        /// A peer finished pulling a LARGE message.
        RecvNotify = 0x46,
        /// A peer acknowledged messages explicitly.
        RecvLiback = 0x47,
        /// A send request completed.
        SendDone = 0x48,
        /// A pull request completed.
        PullDone = 0x49,
        /// A peer refused a message.
        RecvNack = 0x4a,
        /// The backend refused a send request.
        Error = 0x4b,
        /// A peer pulls from a region whose fill mark is clear.
        RegionWanted = 0x4c,
        /// Part of a pull's data has landed.
        PullProgress = 0x4d,
    }
}

wire_enum! {
    /// Outcome of a send or a pull. Values 0 to 6 are Open-MX's pull-done codes.
    pub enum DoneStatus: u8 as "completion status" {
        /// Done.
        Success = 0,
        /// The remote endpoint does not exist.
        BadEndpoint = 1,
        /// The remote endpoint is closed.
        EndpointClosed = 2,
        /// The remote endpoint's session changed.
        BadSession = 3,
        /// The remote region is unknown or too small.
        BadRegion = 4,
        /// Cancelled locally.
        Aborted = 5,
        /// The peer stopped answering.
        Timeout = 6,
        /// The peer index is not in the peer table.
        BadPeer = 7,
        /// The destination is outside this guest's virtual cluster.
        Denied = 8,
        /// The backend ran out of a resource.
        NoResources = 9,
    }
}

wire_enum! {
    /// Why a peer refused a message (the MXoE NACK types).
    pub enum NackKind: u8 as "nack kind" {
        /// No such endpoint at the peer.
        BadEndpoint = 1,
        /// The peer's endpoint exists but is closed.
        EndpointClosed = 2,
        /// The session id does not match the peer endpoint's.
        BadSession = 3,
        /// The pulled region does not exist at the peer.
        BadRdmaWindow = 4,
    }
}

wire_enum! {
    /// Why the backend refused a send request.
    pub enum ErrorCode: u32 as "error code" {
        /// The request did not parse or validate.
        Malformed = 1,
        /// Peer index not in the peer table.
        BadPeer = 2,
        /// Destination endpoint index out of range.
        BadEndpoint = 3,
        /// Region not registered.
        BadRegion = 4,
        /// The backend ran out of a resource (or a quota was reached).
        NoResources = 5,
        /// Forbidden by the guest's virtual cluster.
        Denied = 6,
        /// Not supported by this backend.
        Unsupported = 7,
    }
}

/// One received MEDIUM fragment, written into the receive queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvMedium {
    /// MX header fields.
    pub info: MsgInfo,
    /// Total message length (at most 32 KiB).
    pub length: u32,
    /// Receive-queue slot holding this fragment.
    pub recvq_slot: u16,
    /// Bytes of this fragment (at most 4096).
    pub frag_length: u16,
    /// Fragment number (below 8).
    pub frag_seqnum: u8,
    /// Fragment size as the sender's log2 (MX's pipeline field), as received.
    pub frag_pipeline: u8,
}

mod at {
    pub const RECVQ_SLOT: usize = 32;
    pub const FRAG_LENGTH: usize = 34;
    pub const FRAG_SEQNUM: usize = 36;
    pub const FRAG_PIPELINE: usize = 37;
    pub const TARGET_SESSION: usize = 24;
    pub const DONE_STATUS: usize = 8;
    pub const DONE_LENGTH: usize = 12;
    pub const NACK_KIND: usize = 16;
    pub const NACK_SEQNUM: usize = 18;
    pub const ERROR_CODE: usize = 8;
    pub const WANTED_REGION: usize = 8;
}

impl RecvMedium {
    fn validate(&self) -> Result<()> {
        if self.length as usize > MEDIUM_MAX {
            return Err(Error::Invalid {
                field: "medium length",
                reason: "beyond 32 KiB",
            });
        }
        if self.frag_length as usize > MEDIUM_FRAG_MAX || u32::from(self.frag_length) > self.length
        {
            return Err(Error::Invalid {
                field: "fragment length",
                reason: "beyond 4096 or the message",
            });
        }
        if self.frag_seqnum as usize >= MEDIUM_FRAGS_MAX.min(medium_frags(self.length)) {
            return Err(Error::Invalid {
                field: "fragment seqnum",
                reason: "beyond the message's fragments",
            });
        }
        Ok(())
    }
    fn read(buf: &[u8]) -> Result<Self> {
        let frag = RecvMedium {
            info: MsgInfo::read(buf),
            length: u32(buf, off::LENGTH),
            recvq_slot: u16(buf, at::RECVQ_SLOT),
            frag_length: u16(buf, at::FRAG_LENGTH),
            frag_seqnum: u8(buf, at::FRAG_SEQNUM),
            frag_pipeline: u8(buf, at::FRAG_PIPELINE),
        };
        frag.validate()?;
        Ok(frag)
    }
    fn write(&self, buf: &mut [u8]) -> Result<()> {
        self.validate()?;
        self.info.write(buf);
        set_u32(buf, off::LENGTH, self.length);
        set_u16(buf, at::RECVQ_SLOT, self.recvq_slot);
        set_u16(buf, at::FRAG_LENGTH, self.frag_length);
        set_u8(buf, at::FRAG_SEQNUM, self.frag_seqnum);
        set_u8(buf, at::FRAG_PIPELINE, self.frag_pipeline);
        Ok(())
    }
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventBody {
    /// A TINY message arrived.
    RecvTiny {
        /// The sender.
        from: Route,
        /// The message.
        msg: InlineMsg,
    },
    /// A SMALL message arrived.
    RecvSmall {
        /// The sender.
        from: Route,
        /// The message.
        msg: InlineMsg,
    },
    /// A MEDIUM fragment arrived in the receive queue.
    RecvMedium {
        /// The sender.
        from: Route,
        /// The fragment and where it lies in the receive queue.
        frag: RecvMedium,
    },
    /// A LARGE message was announced.
    RecvRndv {
        /// The sender.
        from: Route,
        /// The announcement: length and the sender's region to pull from.
        rndv: RndvSend,
    },
    /// A peer asks to connect (`from.session_id` is its session).
    RecvConnectRequest {
        /// The requesting endpoint.
        from: Route,
        /// The request's MX fields.
        request: RingConnectRequest,
    },
    /// A peer answered our connect request (`from.session_id` is its session).
    RecvConnectReply {
        /// The answering endpoint.
        from: Route,
        /// The reply's MX fields.
        reply: RingConnectReply,
        /// Our endpoint's session, as the peer names it in its reply.
        target_session_id: u32,
    },
    /// A peer finished pulling one of our LARGE messages.
    RecvNotify {
        /// The puller.
        from: Route,
        /// Which message was pulled.
        notify: NotifySend,
    },
    /// A peer acknowledged messages explicitly.
    RecvLiback {
        /// The acknowledging endpoint.
        from: Route,
        /// What it acknowledges.
        ack: LibackSend,
    },
    /// A send request completed; its queue slots or region may be reused.
    SendDone {
        /// Outcome.
        status: DoneStatus,
        /// Bytes sent (0 for requests that carry no data).
        length: u32,
    },
    /// A pull request completed.
    PullDone {
        /// Outcome.
        status: DoneStatus,
        /// Bytes pulled.
        length: u32,
    },
    /// A peer refused one of our messages.
    RecvNack {
        /// The refusing peer endpoint (session 0).
        from: Route,
        /// Why it refused.
        kind: NackKind,
        /// Library sequence number of the refused message.
        seqnum: u16,
    },
    /// The backend refused a send request.
    Error {
        /// Why.
        code: ErrorCode,
    },
    /// A peer pulled from a region whose fill mark (see [`super::send::fill_marks`]) is
    /// clear; the backend dropped the pull, and the peer asks again after its timeout. The
    /// application fills the region and sets the mark. Posted once until the backend sees
    /// the mark set.
    RegionWanted {
        /// The region.
        region: u8,
    },
    /// The first `length` bytes of the pull tagged as this event are in its region and
    /// stay as they are until the pull ends: the application may copy them out while the
    /// rest is still on the way, instead of all of them after [`EventBody::PullDone`].
    /// Advisory: a backend may post none, and `length` only grows for one pull.
    PullProgress {
        /// Bytes landed, counted from the pull's start.
        length: u32,
    },
}

impl EventBody {
    /// The kind this event is encoded as.
    pub fn kind(&self) -> EventKind {
        match self {
            EventBody::RecvTiny { .. } => EventKind::RecvTiny,
            EventBody::RecvSmall { .. } => EventKind::RecvSmall,
            EventBody::RecvMedium { .. } => EventKind::RecvMedium,
            EventBody::RecvRndv { .. } => EventKind::RecvRndv,
            EventBody::RecvConnectRequest { .. } => EventKind::RecvConnectRequest,
            EventBody::RecvConnectReply { .. } => EventKind::RecvConnectReply,
            EventBody::RecvNotify { .. } => EventKind::RecvNotify,
            EventBody::RecvLiback { .. } => EventKind::RecvLiback,
            EventBody::SendDone { .. } => EventKind::SendDone,
            EventBody::PullDone { .. } => EventKind::PullDone,
            EventBody::RecvNack { .. } => EventKind::RecvNack,
            EventBody::Error { .. } => EventKind::Error,
            EventBody::RegionWanted { .. } => EventKind::RegionWanted,
            EventBody::PullProgress { .. } => EventKind::PullProgress,
        }
    }
}

/// An entry of an endpoint's event ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// The completed request's tag, or a running number for unsolicited events.
    pub tag: u32,
    /// What happened.
    pub body: EventBody,
}

impl Event {
    /// Parse an event ring slot.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let (kind, tag) = parse_header(buf, EVENT_SLOT_SIZE)?;
        let from = Route::read(buf);
        let body = match EventKind::try_from(kind)? {
            EventKind::RecvTiny => EventBody::RecvTiny {
                from,
                msg: InlineMsg::read(buf, TINY_MAX, "tiny length")?,
            },
            EventKind::RecvSmall => EventBody::RecvSmall {
                from,
                msg: InlineMsg::read(buf, SMALL_MAX, "small length")?,
            },
            EventKind::RecvMedium => EventBody::RecvMedium {
                from,
                frag: RecvMedium::read(buf)?,
            },
            EventKind::RecvRndv => EventBody::RecvRndv {
                from,
                rndv: RndvSend::read(buf),
            },
            EventKind::RecvConnectRequest => EventBody::RecvConnectRequest {
                from,
                request: RingConnectRequest::read(buf),
            },
            EventKind::RecvConnectReply => EventBody::RecvConnectReply {
                from,
                reply: RingConnectReply::read(buf),
                target_session_id: u32(buf, at::TARGET_SESSION),
            },
            EventKind::RecvNotify => EventBody::RecvNotify {
                from,
                notify: NotifySend::read(buf),
            },
            EventKind::RecvLiback => EventBody::RecvLiback {
                from,
                ack: LibackSend::read(buf)?,
            },
            EventKind::SendDone => EventBody::SendDone {
                status: DoneStatus::try_from(u8(buf, at::DONE_STATUS))?,
                length: u32(buf, at::DONE_LENGTH),
            },
            EventKind::PullDone => EventBody::PullDone {
                status: DoneStatus::try_from(u8(buf, at::DONE_STATUS))?,
                length: u32(buf, at::DONE_LENGTH),
            },
            EventKind::RecvNack => EventBody::RecvNack {
                from,
                kind: NackKind::try_from(u8(buf, at::NACK_KIND))?,
                seqnum: u16(buf, at::NACK_SEQNUM),
            },
            EventKind::Error => EventBody::Error {
                code: ErrorCode::try_from(u32(buf, at::ERROR_CODE))?,
            },
            EventKind::RegionWanted => EventBody::RegionWanted {
                region: u8(buf, at::WANTED_REGION),
            },
            EventKind::PullProgress => EventBody::PullProgress {
                length: u32(buf, at::DONE_LENGTH),
            },
        };
        Ok(Event { tag, body })
    }

    /// Write this event into a slot of at least [`EVENT_SLOT_SIZE`] bytes.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        // Refuse before writing anything.
        match &self.body {
            EventBody::RecvTiny { msg, .. } if msg.data.len() > TINY_MAX => {
                return Err(Error::Invalid {
                    field: "tiny length",
                    reason: "length beyond the inline capacity",
                })
            }
            EventBody::RecvMedium { frag, .. } => frag.validate()?,
            _ => {}
        }
        emit_header(buf, EVENT_SLOT_SIZE, self.body.kind().into(), self.tag)?;
        match &self.body {
            EventBody::RecvTiny { from, msg } => {
                from.write(buf);
                msg.write(buf, TINY_MAX, "tiny length")?;
            }
            EventBody::RecvSmall { from, msg } => {
                from.write(buf);
                msg.write(buf, SMALL_MAX, "small length")?;
            }
            EventBody::RecvMedium { from, frag } => {
                from.write(buf);
                frag.write(buf)?;
            }
            EventBody::RecvRndv { from, rndv } => {
                from.write(buf);
                rndv.write(buf);
            }
            EventBody::RecvConnectRequest { from, request } => {
                from.write(buf);
                request.write(buf);
            }
            EventBody::RecvConnectReply {
                from,
                reply,
                target_session_id,
            } => {
                from.write(buf);
                reply.write(buf);
                set_u32(buf, at::TARGET_SESSION, *target_session_id);
            }
            EventBody::RecvNotify { from, notify } => {
                from.write(buf);
                notify.write(buf);
            }
            EventBody::RecvLiback { from, ack } => {
                from.write(buf);
                ack.write(buf);
            }
            EventBody::SendDone { status, length } | EventBody::PullDone { status, length } => {
                set_u8(buf, at::DONE_STATUS, (*status).into());
                set_u32(buf, at::DONE_LENGTH, *length);
            }
            EventBody::RecvNack { from, kind, seqnum } => {
                from.write(buf);
                set_u8(buf, at::NACK_KIND, (*kind).into());
                set_u16(buf, at::NACK_SEQNUM, *seqnum);
            }
            EventBody::Error { code } => set_u32(buf, at::ERROR_CODE, (*code).into()),
            EventBody::RegionWanted { region } => set_u8(buf, at::WANTED_REGION, *region),
            EventBody::PullProgress { length } => set_u32(buf, at::DONE_LENGTH, *length),
        }
        Ok(())
    }
}

impl crate::ring::Slot for Event {
    const SIZE: usize = EVENT_SLOT_SIZE;
    fn encode(&self, slot: &mut [u8]) -> Result<()> {
        self.emit(slot)
    }
    fn decode(slot: &[u8]) -> Result<Self> {
        Self::parse(slot)
    }
}

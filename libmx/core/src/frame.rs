//! Decoded MXoE frames, as the protocol core consumes and produces them.
//!
//! Each type carries the fields of one packet type of the wire (Open-MX in MX
//! wire-compatible mode), already converted to host order, so the library can
//! map a parsed wire frame to a [`Frame`] field by field and back. Payload
//! bytes are a type parameter: received frames borrow them (`Frame<&[u8]>`),
//! frames the core emits own them (`Frame<Vec<u8>>`).

use crate::seqnum::Seqnum;

/// The address of a remote endpoint as the NIC sees it: the peer-table index
/// of its host and its endpoint index there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerAddr {
    /// Index of the remote host in the peer table.
    pub peer_index: u16,
    /// Endpoint index on that host.
    pub endpoint: u8,
}

impl PeerAddr {
    /// The address of endpoint `endpoint` on peer `peer_index`.
    pub const fn new(peer_index: u16, endpoint: u8) -> Self {
        PeerAddr {
            peer_index,
            endpoint,
        }
    }
}

/// One frame between two endpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame<B> {
    /// The remote host: the destination of a frame the core emits, the source
    /// of a frame it receives (the wire's `dst_src_peer_index` after lookup).
    pub peer_index: u16,
    /// Endpoint index the frame is addressed to.
    pub dst_endpoint: u8,
    /// Endpoint index the frame comes from.
    pub src_endpoint: u8,
    /// What the frame carries.
    pub body: Body<B>,
}

impl<B: AsRef<[u8]>> Frame<B> {
    /// The same frame with its payload borrowed.
    pub fn as_borrowed(&self) -> Frame<&[u8]> {
        Frame {
            peer_index: self.peer_index,
            dst_endpoint: self.dst_endpoint,
            src_endpoint: self.src_endpoint,
            body: match &self.body {
                Body::Message(m) => Body::Message(Message {
                    session: m.session,
                    seqnum: m.seqnum,
                    piggyack: m.piggyack,
                    match_info: m.match_info,
                    kind: m.kind,
                    payload: m.payload.as_ref(),
                }),
                Body::Liback(x) => Body::Liback(*x),
                Body::ConnectRequest(x) => Body::ConnectRequest(*x),
                Body::ConnectReply(x) => Body::ConnectReply(*x),
                Body::Nack(x) => Body::Nack(*x),
                Body::Notify(x) => Body::Notify(*x),
            },
        }
    }

    /// The remote endpoint of a frame the core emits.
    pub fn destination(&self) -> PeerAddr {
        PeerAddr::new(self.peer_index, self.dst_endpoint)
    }

    /// The remote endpoint of a frame the core receives.
    pub fn source(&self) -> PeerAddr {
        PeerAddr::new(self.peer_index, self.src_endpoint)
    }
}

/// The packet types the library's protocol deals with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body<B> {
    /// TINY, SMALL, MEDIUM (one fragment) or RNDV.
    Message(Message<B>),
    /// TRUC of type ACK (0x55): an explicit library ack.
    Liback(Liback),
    /// CONNECT with `is_reply == 0`.
    ConnectRequest(ConnectRequest),
    /// CONNECT with `is_reply != 0`.
    ConnectReply(ConnectReply),
    /// NACK_LIB.
    Nack(Nack),
    /// NOTIFY: the receiver of a RNDV has pulled the data.
    Notify(Notify),
}

/// A sequenced application message (or one fragment of a MEDIUM).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message<B> {
    /// The destination endpoint's session id, as learned at connect.
    pub session: u32,
    /// The message's library sequence number.
    pub seqnum: Seqnum,
    /// Every message of the reverse direction before this seqnum has been received.
    pub piggyack: Seqnum,
    /// The 64-bit match info (wire `match_a` high half, `match_b` low half).
    pub match_info: u64,
    /// Packet type and its type-specific fields.
    pub kind: MessageKind,
    /// The data: the whole message for TINY/SMALL, one fragment for MEDIUM,
    /// empty for RNDV.
    pub payload: B,
}

/// Packet type of a [`Message`] and its specific header fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageKind {
    /// TINY: up to 32 bytes, length = payload length.
    Tiny,
    /// SMALL: up to 128 bytes, length = payload length.
    Small,
    /// MEDIUM fragment.
    Medium(MediumFrag),
    /// RNDV: announces a LARGE message to be pulled.
    Rndv(Rndv),
}

/// The MEDIUM-specific header fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MediumFrag {
    /// Length of the whole message (wire `length`).
    pub msg_length: u32,
    /// Index of this fragment in the message.
    pub frag_seqnum: u8,
    /// log2 of the fragment size; the fragment's offset is
    /// `frag_seqnum << frag_pipeline` (12 in wire-compatible mode).
    pub frag_pipeline: u8,
}

/// The RNDV-specific fields: where the receiver pulls the data from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rndv {
    /// Length of the LARGE message.
    pub msg_length: u32,
    /// The sender's registered window.
    pub window: RdmaWindow,
}

/// A registered memory window of the sender, named on the wire by id,
/// generation seqnum and offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RdmaWindow {
    /// Region id.
    pub id: u8,
    /// Generation of the region id, so a recycled id is not mistaken.
    pub seqnum: u8,
    /// Offset of the data in the first page of the region.
    pub offset: u16,
}

/// An explicit ack (TRUC type 0x55).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Liback {
    /// The destination endpoint's session id (TRUC header).
    pub session: u32,
    /// The same id repeated in the ack data; a frame whose two copies differ is dropped.
    pub ack_session: u32,
    /// Ack number, increasing per partner, so that a stale ack is recognised.
    pub acknum: u32,
    /// Every message before this seqnum has been received.
    pub lib_seqnum: Seqnum,
    /// Copy of the acked seqnum (MX's `send_seq`).
    pub send_seq: Seqnum,
    /// Resend flag; informative for MX. This core sets it on the ack an
    /// endpoint sends when its way to the network comes back after an outage,
    /// and answers it by resending its unacked messages at once.
    pub resent: u8,
}

/// A connect request (CONNECT, `is_reply == 0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectRequest {
    /// Always 0 on the wire; a NACK to this request echoes it.
    pub lib_seqnum: u16,
    /// The requester's endpoint session id.
    pub src_session: u32,
    /// The application key the target checks.
    pub app_key: u32,
    /// The seqnum the requester expects next from the target.
    pub target_recv_seqnum_start: Seqnum,
    /// Which of the requester's connect attempts this is.
    pub connect_seqnum: u8,
}

/// A connect reply (CONNECT, `is_reply != 0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectReply {
    /// Always 0 on the wire.
    pub lib_seqnum: u16,
    /// The requester's session id, echoed from the request.
    pub src_session: u32,
    /// The replier's endpoint session id.
    pub target_session: u32,
    /// The seqnum the replier expects next from the requester.
    pub target_recv_seqnum_start: Seqnum,
    /// Echo of the request's connect seqnum.
    pub connect_seqnum: u8,
    /// Raw status byte, see [`ConnectStatus`](crate::ConnectStatus).
    pub status: u8,
}

/// A library NACK (NACK_LIB).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nack {
    /// Raw NACK type, see [`NackType`](crate::NackType).
    pub nack_type: u8,
    /// Seqnum of the refused message (0 for a refused connect).
    pub lib_seqnum: Seqnum,
}

/// A NOTIFY: a sequenced message from a LARGE receiver back to its sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Notify {
    /// The destination endpoint's session id.
    pub session: u32,
    /// Bytes the receiver actually pulled.
    pub total_length: u32,
    /// Region id of the pulled window.
    pub rdma_id: u8,
    /// Generation of the pulled window.
    pub rdma_seqnum: u8,
    /// The notify's own library seqnum.
    pub seqnum: Seqnum,
    /// Piggybacked ack, as in [`Message::piggyack`].
    pub piggyack: Seqnum,
}

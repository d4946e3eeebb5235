//! CONNECT: MX's connect packet followed by the library's connect data, in a
//! request or a reply variant told apart by `is_reply` (same offset in both).

use super::access::{clamped_mut, expect_ptype, need, packet_fields, packet_view, room};
use super::{ConnectStatus, PacketType};
use crate::{Error, Result};

/// Byte offsets inside CONNECT (32 bytes: 16-byte header, 16-byte connect data).
pub mod field {
    /// Packet type.
    pub const PTYPE: usize = 0;
    /// Destination endpoint.
    pub const DST_ENDPOINT: usize = 1;
    /// Source endpoint.
    pub const SRC_ENDPOINT: usize = 2;
    /// Source endpoint generation.
    pub const SRC_GENERATION: usize = 3;
    /// Length of the connect data (16).
    pub const LENGTH: usize = 4;
    /// Padding (3 bytes).
    pub const PAD1: usize = 5;
    /// Library sequence number of this packet.
    pub const LIB_SEQNUM: usize = 8;
    /// The sender's index for the target peer (MX's dest_peer_index).
    pub const SRC_DST_PEER_INDEX: usize = 10;
    /// Padding (u32).
    pub const PAD2: usize = 12;
    /// Start of the connect data.
    pub const DATA: usize = 16;
    /// Both: the sender's session id.
    pub const SRC_SESSION_ID: usize = 16;
    /// Request: the application key the target checks.
    pub const REQUEST_APP_KEY: usize = 20;
    /// Reply: the target's session id.
    pub const REPLY_TARGET_SESSION_ID: usize = 20;
    /// Both: the sender's next receive sequence number.
    pub const TARGET_RECV_SEQNUM_START: usize = 24;
    /// Both: 0 in a request, 1 in a reply.
    pub const IS_REPLY: usize = 26;
    /// Both: sequence number of the connect attempt.
    pub const CONNECT_SEQNUM: usize = 27;
    /// Request: padding (u32).
    pub const REQUEST_PAD: usize = 28;
    /// Reply: status code.
    pub const REPLY_STATUS: usize = 28;
    /// Reply: padding (3 bytes).
    pub const REPLY_PAD: usize = 29;
    /// Length of the connect data, either variant.
    pub const DATA_LEN: usize = 16;
    /// Length of the packet.
    pub const LEN: usize = DATA + DATA_LEN;
}

packet_view! {
    /// A zero-copy view of a CONNECT packet.
    ConnectPacket
}

packet_fields!(ConnectPacket {
    /// Destination endpoint.
    dst_endpoint, set_dst_endpoint: u8 = field::DST_ENDPOINT;
    /// Source endpoint.
    src_endpoint, set_src_endpoint: u8 = field::SRC_ENDPOINT;
    /// Source endpoint generation.
    src_generation, set_src_generation: u8 = field::SRC_GENERATION;
    /// Connect data length.
    length, set_length: u8 = field::LENGTH;
    /// Library sequence number.
    lib_seqnum, set_lib_seqnum: u16 = field::LIB_SEQNUM;
    /// The sender's index for the target peer.
    src_dst_peer_index, set_src_dst_peer_index: u16 = field::SRC_DST_PEER_INDEX;
    /// The sender's session id.
    src_session_id, set_src_session_id: u32 = field::SRC_SESSION_ID;
    /// Request: application key.
    app_key, set_app_key: u32 = field::REQUEST_APP_KEY;
    /// Reply: the target's session id.
    target_session_id, set_target_session_id: u32 = field::REPLY_TARGET_SESSION_ID;
    /// The sender's next receive sequence number.
    target_recv_seqnum_start, set_target_recv_seqnum_start: u16 = field::TARGET_RECV_SEQNUM_START;
    /// 0 in a request, 1 in a reply.
    is_reply, set_is_reply: u8 = field::IS_REPLY;
    /// Sequence number of the connect attempt.
    connect_seqnum, set_connect_seqnum: u8 = field::CONNECT_SEQNUM;
    /// Reply: status code.
    status, set_status: u8 = field::REPLY_STATUS;
});

impl<T: AsRef<[u8]>> ConnectPacket<T> {
    fn check_len(&self) -> Result<()> {
        need(self.buffer.as_ref().len(), field::LEN)
    }
}

/// A connect request's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectRequestData {
    /// The requester's session id.
    pub src_session_id: u32,
    /// The application key the target checks.
    pub app_key: u32,
    /// The requester's next receive sequence number.
    pub target_recv_seqnum_start: u16,
    /// Sequence number of this attempt (requests may be resent).
    pub connect_seqnum: u8,
}

/// A connect reply's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectReplyData {
    /// The replier's session id.
    pub src_session_id: u32,
    /// The requester's session id, echoed.
    pub target_session_id: u32,
    /// The replier's next receive sequence number.
    pub target_recv_seqnum_start: u16,
    /// The attempt being answered.
    pub connect_seqnum: u8,
    /// Outcome.
    pub status: ConnectStatus,
}

/// Request or reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnectData {
    /// `is_reply` = 0.
    Request(ConnectRequestData),
    /// `is_reply` = 1.
    Reply(ConnectReplyData),
}

/// A CONNECT packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectRepr {
    /// Destination endpoint.
    pub dst_endpoint: u8,
    /// Source endpoint.
    pub src_endpoint: u8,
    /// Source endpoint generation.
    pub src_generation: u8,
    /// Library sequence number.
    pub lib_seqnum: u16,
    /// The sender's index for the target peer.
    pub src_dst_peer_index: u16,
    /// Request or reply data.
    pub data: ConnectData,
}

impl ConnectRepr {
    /// Reads a CONNECT; the data length must be 16 and `is_reply` 0 or 1.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &ConnectPacket<&T>) -> Result<Self> {
        packet.check_len()?;
        expect_ptype(packet.ptype(), PacketType::Connect)?;
        if usize::from(packet.length()) != field::DATA_LEN {
            return Err(Error::Invalid {
                field: "connect length",
                reason: "connect data is 16 bytes",
            });
        }
        let data = match packet.is_reply() {
            0 => ConnectData::Request(ConnectRequestData {
                src_session_id: packet.src_session_id(),
                app_key: packet.app_key(),
                target_recv_seqnum_start: packet.target_recv_seqnum_start(),
                connect_seqnum: packet.connect_seqnum(),
            }),
            1 => ConnectData::Reply(ConnectReplyData {
                src_session_id: packet.src_session_id(),
                target_session_id: packet.target_session_id(),
                target_recv_seqnum_start: packet.target_recv_seqnum_start(),
                connect_seqnum: packet.connect_seqnum(),
                status: ConnectStatus::try_from(packet.status())?,
            }),
            _ => {
                return Err(Error::Invalid {
                    field: "connect is_reply",
                    reason: "neither 0 nor 1",
                })
            }
        };
        Ok(Self {
            dst_endpoint: packet.dst_endpoint(),
            src_endpoint: packet.src_endpoint(),
            src_generation: packet.src_generation(),
            lib_seqnum: packet.lib_seqnum(),
            src_dst_peer_index: packet.src_dst_peer_index(),
            data,
        })
    }

    /// Bytes the packet occupies.
    pub const fn buffer_len(&self) -> usize {
        field::LEN
    }

    /// Writes the packet, padding included.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut ConnectPacket<T>) -> Result<()> {
        room(packet.buffer.as_ref().len(), field::LEN)?;
        clamped_mut(packet.buffer.as_mut(), 0, field::LEN).fill(0);
        packet.set_ptype(PacketType::Connect as u8);
        packet.set_dst_endpoint(self.dst_endpoint);
        packet.set_src_endpoint(self.src_endpoint);
        packet.set_src_generation(self.src_generation);
        packet.set_length(field::DATA_LEN as u8);
        packet.set_lib_seqnum(self.lib_seqnum);
        packet.set_src_dst_peer_index(self.src_dst_peer_index);
        match self.data {
            ConnectData::Request(request) => {
                packet.set_src_session_id(request.src_session_id);
                packet.set_app_key(request.app_key);
                packet.set_target_recv_seqnum_start(request.target_recv_seqnum_start);
                packet.set_is_reply(0);
                packet.set_connect_seqnum(request.connect_seqnum);
            }
            ConnectData::Reply(reply) => {
                packet.set_src_session_id(reply.src_session_id);
                packet.set_target_session_id(reply.target_session_id);
                packet.set_target_recv_seqnum_start(reply.target_recv_seqnum_start);
                packet.set_is_reply(1);
                packet.set_connect_seqnum(reply.connect_seqnum);
                packet.set_status(reply.status as u8);
            }
        }
        Ok(())
    }
}

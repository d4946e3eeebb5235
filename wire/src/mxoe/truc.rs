//! TRUC: library control data between endpoints. The one data kind defined
//! is the library ack (type 0x55), which MX sends as an explicit ack.

use super::access::{clamped_mut, expect_ptype, need, packet_fields, packet_view, room};
use super::{PacketType, TrucDataType};
use crate::{Error, Result};

/// Byte offsets inside TRUC (28 bytes: 12-byte header, 16-byte lib ack data).
pub mod field {
    /// Packet type.
    pub const PTYPE: usize = 0;
    /// Destination endpoint.
    pub const DST_ENDPOINT: usize = 1;
    /// Source endpoint.
    pub const SRC_ENDPOINT: usize = 2;
    /// Source endpoint generation.
    pub const SRC_GENERATION: usize = 3;
    /// Length of the data after the header (16 for a lib ack).
    pub const LENGTH: usize = 4;
    /// Padding (3 bytes).
    pub const PAD1: usize = 5;
    /// Destination session id.
    pub const SESSION: usize = 8;
    /// Start of the data; its first byte is the data type.
    pub const DATA: usize = 12;
    /// Data type (0x55: lib ack).
    pub const DATA_TYPE: usize = 12;
    /// Lib ack: padding.
    pub const LIBACK_PAD: usize = 13;
    /// Lib ack: the sequence number this ack packet carries.
    pub const LIBACK_LIB_SEQNUM: usize = 14;
    /// Lib ack: session id (repeats `session`).
    pub const LIBACK_SESSION_ID: usize = 16;
    /// Lib ack: the ack number.
    pub const LIBACK_ACKNUM: usize = 20;
    /// Lib ack: next send sequence number.
    pub const LIBACK_SEND_SEQ: usize = 24;
    /// Lib ack: whether this ack was resent.
    pub const LIBACK_RESENT: usize = 26;
    /// Lib ack: padding.
    pub const LIBACK_PAD1: usize = 27;
    /// Length of the lib ack data.
    pub const LIBACK_DATA_LEN: usize = 16;
    /// Length of the packet.
    pub const LEN: usize = DATA + LIBACK_DATA_LEN;
}

packet_view! {
    /// A zero-copy view of a TRUC packet.
    TrucPacket
}

packet_fields!(TrucPacket {
    /// Destination endpoint.
    dst_endpoint, set_dst_endpoint: u8 = field::DST_ENDPOINT;
    /// Source endpoint.
    src_endpoint, set_src_endpoint: u8 = field::SRC_ENDPOINT;
    /// Source endpoint generation.
    src_generation, set_src_generation: u8 = field::SRC_GENERATION;
    /// Data length.
    length, set_length: u8 = field::LENGTH;
    /// Destination session id.
    session, set_session: u32 = field::SESSION;
    /// Data type byte.
    data_type, set_data_type: u8 = field::DATA_TYPE;
    /// Lib ack: the sequence number this ack packet carries.
    liback_lib_seqnum, set_liback_lib_seqnum: u16 = field::LIBACK_LIB_SEQNUM;
    /// Lib ack: session id.
    liback_session_id, set_liback_session_id: u32 = field::LIBACK_SESSION_ID;
    /// Lib ack: ack number.
    liback_acknum, set_liback_acknum: u32 = field::LIBACK_ACKNUM;
    /// Lib ack: next send sequence number.
    liback_send_seq, set_liback_send_seq: u16 = field::LIBACK_SEND_SEQ;
    /// Lib ack: resent flag.
    liback_resent, set_liback_resent: u8 = field::LIBACK_RESENT;
});

impl<T: AsRef<[u8]>> TrucPacket<T> {
    fn check_len(&self) -> Result<()> {
        need(self.buffer.as_ref().len(), field::LEN)
    }
}

/// The lib ack carried by a TRUC packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LibAck {
    /// The sequence number this ack packet carries.
    pub lib_seqnum: u16,
    /// Session id (the receiver checks it against the packet's `session`).
    pub session_id: u32,
    /// Ack number.
    pub acknum: u32,
    /// Next send sequence number.
    pub send_seq: u16,
    /// Nonzero when the ack is a resend.
    pub resent: u8,
}

/// A TRUC packet carrying a lib ack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TrucRepr {
    /// Destination endpoint.
    pub dst_endpoint: u8,
    /// Source endpoint.
    pub src_endpoint: u8,
    /// Source endpoint generation.
    pub src_generation: u8,
    /// Destination session id.
    pub session: u32,
    /// The ack.
    pub liback: LibAck,
}

impl TrucRepr {
    /// Reads a TRUC; other data types and data lengths other than 16 are refused.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &TrucPacket<&T>) -> Result<Self> {
        packet.check_len()?;
        expect_ptype(packet.ptype(), PacketType::Truc)?;
        TrucDataType::try_from(packet.data_type())?;
        if usize::from(packet.length()) != field::LIBACK_DATA_LEN {
            return Err(Error::Invalid {
                field: "truc length",
                reason: "lib ack data is 16 bytes",
            });
        }
        Ok(Self {
            dst_endpoint: packet.dst_endpoint(),
            src_endpoint: packet.src_endpoint(),
            src_generation: packet.src_generation(),
            session: packet.session(),
            liback: LibAck {
                lib_seqnum: packet.liback_lib_seqnum(),
                session_id: packet.liback_session_id(),
                acknum: packet.liback_acknum(),
                send_seq: packet.liback_send_seq(),
                resent: packet.liback_resent(),
            },
        })
    }

    /// Bytes the packet occupies.
    pub const fn buffer_len(&self) -> usize {
        field::LEN
    }

    /// Writes the packet, padding included.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut TrucPacket<T>) -> Result<()> {
        room(packet.buffer.as_ref().len(), field::LEN)?;
        clamped_mut(packet.buffer.as_mut(), 0, field::LEN).fill(0);
        packet.set_ptype(PacketType::Truc as u8);
        packet.set_dst_endpoint(self.dst_endpoint);
        packet.set_src_endpoint(self.src_endpoint);
        packet.set_src_generation(self.src_generation);
        packet.set_length(field::LIBACK_DATA_LEN as u8);
        packet.set_session(self.session);
        packet.set_data_type(TrucDataType::LibAck as u8);
        packet.set_liback_lib_seqnum(self.liback.lib_seqnum);
        packet.set_liback_session_id(self.liback.session_id);
        packet.set_liback_acknum(self.liback.acknum);
        packet.set_liback_send_seq(self.liback.send_seq);
        packet.set_liback_resent(self.liback.resent);
        Ok(())
    }
}

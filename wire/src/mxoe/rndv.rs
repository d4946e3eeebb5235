//! RNDV: announces a large message. The message header's `length` holds the
//! length of the rendezvous data (8), which names the sender's region to pull.

use super::access::{need, packet_fields, packet_view, room};
use super::msg::{emit_header, join_match, parse_header, split_match, MsgHeader, MsgPacket};
use super::PacketType;
use crate::{Error, Result};

/// Byte offsets inside RNDV (32 bytes: the message header, then 8 bytes).
pub mod field {
    pub use super::super::msg::field::{
        CHECKSUM, DST_ENDPOINT, LENGTH, LIB_PIGGYACK, LIB_SEQNUM, MATCH_A, MATCH_B, PTYPE, SESSION,
        SRC_ENDPOINT, SRC_GENERATION,
    };
    /// Length of the whole large message.
    pub const MSG_LENGTH: usize = 24;
    /// Id of the sender's region to pull from.
    pub const PULLED_RDMA_ID: usize = 28;
    /// Sequence number of that region.
    pub const PULLED_RDMA_SEQNUM: usize = 29;
    /// Offset of the message in that region.
    pub const PULLED_RDMA_OFFSET: usize = 30;
    /// Length of the rendezvous data, the value of `LENGTH`.
    pub const DATA_LEN: usize = 8;
    /// Length of the packet.
    pub const LEN: usize = 32;
}

packet_view! {
    /// A zero-copy view of a RNDV packet.
    RndvPacket
}

packet_fields!(RndvPacket {
    /// Destination endpoint.
    dst_endpoint, set_dst_endpoint: u8 = field::DST_ENDPOINT;
    /// Source endpoint.
    src_endpoint, set_src_endpoint: u8 = field::SRC_ENDPOINT;
    /// Source endpoint generation.
    src_generation, set_src_generation: u8 = field::SRC_GENERATION;
    /// Length of the rendezvous data (8).
    length, set_length: u16 = field::LENGTH;
    /// Message checksum.
    checksum, set_checksum: u16 = field::CHECKSUM;
    /// Library sequence number.
    lib_seqnum, set_lib_seqnum: u16 = field::LIB_SEQNUM;
    /// Piggybacked ack.
    lib_piggyack, set_lib_piggyack: u16 = field::LIB_PIGGYACK;
    /// Match info, high half.
    match_a, set_match_a: u32 = field::MATCH_A;
    /// Match info, low half.
    match_b, set_match_b: u32 = field::MATCH_B;
    /// Destination session id.
    session, set_session: u32 = field::SESSION;
    /// Length of the whole large message.
    msg_length, set_msg_length: u32 = field::MSG_LENGTH;
    /// Sender's region id.
    pulled_rdma_id, set_pulled_rdma_id: u8 = field::PULLED_RDMA_ID;
    /// Sender's region sequence number.
    pulled_rdma_seqnum, set_pulled_rdma_seqnum: u8 = field::PULLED_RDMA_SEQNUM;
    /// Offset of the message in the sender's region.
    pulled_rdma_offset, set_pulled_rdma_offset: u16 = field::PULLED_RDMA_OFFSET;
});

impl<T: AsRef<[u8]>> RndvPacket<T> {
    fn check_len(&self) -> Result<()> {
        need(self.buffer.as_ref().len(), field::LEN)
    }

    /// The 64-bit match info.
    pub fn match_info(&self) -> u64 {
        join_match(self.match_a(), self.match_b())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RndvPacket<T> {
    /// Sets the 64-bit match info.
    pub fn set_match_info(&mut self, value: u64) {
        let (a, b) = split_match(value);
        self.set_match_a(a);
        self.set_match_b(b);
    }
}

/// A RNDV packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RndvRepr {
    /// Envelope.
    pub header: MsgHeader,
    /// Length of the whole large message.
    pub msg_length: u32,
    /// Sender's region id.
    pub pulled_rdma_id: u8,
    /// Sender's region sequence number.
    pub pulled_rdma_seqnum: u8,
    /// Offset of the message in the sender's region.
    pub pulled_rdma_offset: u16,
}

impl RndvRepr {
    /// Reads a RNDV; the rendezvous data length must be 8.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &RndvPacket<&T>) -> Result<Self> {
        packet.check_len()?;
        let header = parse_header(&MsgPacket::new_unchecked(packet.buffer), PacketType::Rndv)?;
        if usize::from(packet.length()) != field::DATA_LEN {
            return Err(Error::Invalid {
                field: "rndv length",
                reason: "rendezvous data is 8 bytes",
            });
        }
        Ok(Self {
            header,
            msg_length: packet.msg_length(),
            pulled_rdma_id: packet.pulled_rdma_id(),
            pulled_rdma_seqnum: packet.pulled_rdma_seqnum(),
            pulled_rdma_offset: packet.pulled_rdma_offset(),
        })
    }

    /// Bytes the packet occupies.
    pub const fn buffer_len(&self) -> usize {
        field::LEN
    }

    /// Writes the packet.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut RndvPacket<T>) -> Result<()> {
        room(packet.buffer.as_ref().len(), field::LEN)?;
        emit_header(
            &self.header,
            &mut MsgPacket::new_unchecked(packet.buffer.as_mut()),
            PacketType::Rndv,
            field::DATA_LEN as u16,
        );
        packet.set_msg_length(self.msg_length);
        packet.set_pulled_rdma_id(self.pulled_rdma_id);
        packet.set_pulled_rdma_seqnum(self.pulled_rdma_seqnum);
        packet.set_pulled_rdma_offset(self.pulled_rdma_offset);
        Ok(())
    }
}

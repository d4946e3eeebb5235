//! NOTIFY: the receiver of a large message tells the sender the pull is done.

use super::access::{clamped_mut, expect_ptype, need, packet_fields, packet_view, room};
use super::PacketType;
use crate::Result;

/// Byte offsets inside NOTIFY (24 bytes).
pub mod field {
    /// Packet type.
    pub const PTYPE: usize = 0;
    /// Destination endpoint (the data's sender).
    pub const DST_ENDPOINT: usize = 1;
    /// Source endpoint.
    pub const SRC_ENDPOINT: usize = 2;
    /// Source endpoint generation.
    pub const SRC_GENERATION: usize = 3;
    /// Destination session id.
    pub const SESSION: usize = 4;
    /// Bytes transferred.
    pub const TOTAL_LENGTH: usize = 8;
    /// Id of the pulled region.
    pub const PULLED_RDMA_ID: usize = 12;
    /// Sequence number of the pulled region.
    pub const PULLED_RDMA_SEQNUM: usize = 13;
    /// Padding (u16).
    pub const PAD1: usize = 14;
    /// Padding (u16).
    pub const PAD2: usize = 16;
    /// Library sequence number.
    pub const LIB_SEQNUM: usize = 18;
    /// Piggybacked ack.
    pub const LIB_PIGGYACK: usize = 20;
    /// Padding (u16).
    pub const PAD3: usize = 22;
    /// Length of the packet.
    pub const LEN: usize = 24;
}

packet_view! {
    /// A zero-copy view of a NOTIFY packet.
    NotifyPacket
}

packet_fields!(NotifyPacket {
    /// Destination endpoint.
    dst_endpoint, set_dst_endpoint: u8 = field::DST_ENDPOINT;
    /// Source endpoint.
    src_endpoint, set_src_endpoint: u8 = field::SRC_ENDPOINT;
    /// Source endpoint generation.
    src_generation, set_src_generation: u8 = field::SRC_GENERATION;
    /// Destination session id.
    session, set_session: u32 = field::SESSION;
    /// Bytes transferred.
    total_length, set_total_length: u32 = field::TOTAL_LENGTH;
    /// Pulled region id.
    pulled_rdma_id, set_pulled_rdma_id: u8 = field::PULLED_RDMA_ID;
    /// Pulled region sequence number.
    pulled_rdma_seqnum, set_pulled_rdma_seqnum: u8 = field::PULLED_RDMA_SEQNUM;
    /// Library sequence number.
    lib_seqnum, set_lib_seqnum: u16 = field::LIB_SEQNUM;
    /// Piggybacked ack.
    lib_piggyack, set_lib_piggyack: u16 = field::LIB_PIGGYACK;
});

impl<T: AsRef<[u8]>> NotifyPacket<T> {
    fn check_len(&self) -> Result<()> {
        need(self.buffer.as_ref().len(), field::LEN)
    }
}

/// A NOTIFY packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NotifyRepr {
    /// Destination endpoint (the data's sender).
    pub dst_endpoint: u8,
    /// Source endpoint.
    pub src_endpoint: u8,
    /// Source endpoint generation.
    pub src_generation: u8,
    /// Destination session id.
    pub session: u32,
    /// Bytes transferred.
    pub total_length: u32,
    /// Pulled region id.
    pub pulled_rdma_id: u8,
    /// Pulled region sequence number.
    pub pulled_rdma_seqnum: u8,
    /// Library sequence number.
    pub lib_seqnum: u16,
    /// Piggybacked ack.
    pub lib_piggyack: u16,
}

impl NotifyRepr {
    /// Reads a NOTIFY.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &NotifyPacket<&T>) -> Result<Self> {
        packet.check_len()?;
        expect_ptype(packet.ptype(), PacketType::Notify)?;
        Ok(Self {
            dst_endpoint: packet.dst_endpoint(),
            src_endpoint: packet.src_endpoint(),
            src_generation: packet.src_generation(),
            session: packet.session(),
            total_length: packet.total_length(),
            pulled_rdma_id: packet.pulled_rdma_id(),
            pulled_rdma_seqnum: packet.pulled_rdma_seqnum(),
            lib_seqnum: packet.lib_seqnum(),
            lib_piggyack: packet.lib_piggyack(),
        })
    }

    /// Bytes the packet occupies.
    pub const fn buffer_len(&self) -> usize {
        field::LEN
    }

    /// Writes the packet, padding included.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut NotifyPacket<T>) -> Result<()> {
        room(packet.buffer.as_ref().len(), field::LEN)?;
        clamped_mut(packet.buffer.as_mut(), 0, field::LEN).fill(0);
        packet.set_ptype(PacketType::Notify as u8);
        packet.set_dst_endpoint(self.dst_endpoint);
        packet.set_src_endpoint(self.src_endpoint);
        packet.set_src_generation(self.src_generation);
        packet.set_session(self.session);
        packet.set_total_length(self.total_length);
        packet.set_pulled_rdma_id(self.pulled_rdma_id);
        packet.set_pulled_rdma_seqnum(self.pulled_rdma_seqnum);
        packet.set_lib_seqnum(self.lib_seqnum);
        packet.set_lib_piggyack(self.lib_piggyack);
        Ok(())
    }
}

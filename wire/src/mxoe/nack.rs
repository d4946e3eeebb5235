//! NACK_LIB and NACK_MCP: a receiver refusing a packet. NACK_LIB answers
//! library traffic (it names the refused sequence number); NACK_MCP answers a
//! PULL (it names the puller's handle and magic).

use super::access::{clamped_mut, expect_ptype, need, packet_fields, packet_view, room};
use super::{NackType, PacketType};
use crate::Result;

/// Byte offsets inside NACK_LIB (16 bytes).
pub mod lib_field {
    /// Packet type.
    pub const PTYPE: usize = 0;
    /// Endpoint that refused the packet.
    pub const SRC_ENDPOINT: usize = 1;
    /// Its generation.
    pub const SRC_GENERATION: usize = 2;
    /// Why.
    pub const NACK_TYPE: usize = 3;
    /// Padding (u32).
    pub const PAD1: usize = 4;
    /// Padding (u8).
    pub const PAD2: usize = 8;
    /// Endpoint that sent the refused packet.
    pub const DST_ENDPOINT: usize = 9;
    /// The refuser's index for the refused packet's sender (MX's dest_peer_index).
    pub const DST_SRC_PEER_INDEX: usize = 10;
    /// Sequence number of the refused packet.
    pub const LIB_SEQNUM: usize = 12;
    /// Padding (u16).
    pub const PAD3: usize = 14;
    /// Length of the packet.
    pub const LEN: usize = 16;
}

/// Byte offsets inside NACK_MCP (16 bytes).
pub mod mcp_field {
    /// Packet type.
    pub const PTYPE: usize = 0;
    /// Endpoint that refused the PULL.
    pub const SRC_ENDPOINT: usize = 1;
    /// Its generation.
    pub const SRC_GENERATION: usize = 2;
    /// Why.
    pub const NACK_TYPE: usize = 3;
    /// Padding (u32).
    pub const PAD1: usize = 4;
    /// The puller's handle, from the PULL.
    pub const SRC_PULL_HANDLE: usize = 8;
    /// The puller's endpoint magic, from the PULL.
    pub const SRC_MAGIC: usize = 12;
    /// Length of the packet.
    pub const LEN: usize = 16;
}

packet_view! {
    /// A zero-copy view of a NACK_LIB packet.
    NackLibPacket
}

packet_fields!(NackLibPacket {
    /// Endpoint that refused the packet.
    src_endpoint, set_src_endpoint: u8 = lib_field::SRC_ENDPOINT;
    /// Its generation.
    src_generation, set_src_generation: u8 = lib_field::SRC_GENERATION;
    /// Why, as a raw byte.
    nack_type, set_nack_type: u8 = lib_field::NACK_TYPE;
    /// Endpoint that sent the refused packet.
    dst_endpoint, set_dst_endpoint: u8 = lib_field::DST_ENDPOINT;
    /// The refuser's index for the refused packet's sender.
    dst_src_peer_index, set_dst_src_peer_index: u16 = lib_field::DST_SRC_PEER_INDEX;
    /// Sequence number of the refused packet.
    lib_seqnum, set_lib_seqnum: u16 = lib_field::LIB_SEQNUM;
});

impl<T: AsRef<[u8]>> NackLibPacket<T> {
    fn check_len(&self) -> Result<()> {
        need(self.buffer.as_ref().len(), lib_field::LEN)
    }
}

/// A NACK_LIB packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NackLibRepr {
    /// Endpoint that refused the packet.
    pub src_endpoint: u8,
    /// Its generation.
    pub src_generation: u8,
    /// Why.
    pub nack_type: NackType,
    /// Endpoint that sent the refused packet.
    pub dst_endpoint: u8,
    /// The refuser's index for the refused packet's sender.
    pub dst_src_peer_index: u16,
    /// Sequence number of the refused packet.
    pub lib_seqnum: u16,
}

impl NackLibRepr {
    /// Reads a NACK_LIB, refusing unknown nack types.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &NackLibPacket<&T>) -> Result<Self> {
        packet.check_len()?;
        expect_ptype(packet.ptype(), PacketType::NackLib)?;
        Ok(Self {
            src_endpoint: packet.src_endpoint(),
            src_generation: packet.src_generation(),
            nack_type: NackType::try_from(packet.nack_type())?,
            dst_endpoint: packet.dst_endpoint(),
            dst_src_peer_index: packet.dst_src_peer_index(),
            lib_seqnum: packet.lib_seqnum(),
        })
    }

    /// Bytes the packet occupies.
    pub const fn buffer_len(&self) -> usize {
        lib_field::LEN
    }

    /// Writes the packet, padding included.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut NackLibPacket<T>) -> Result<()> {
        room(packet.buffer.as_ref().len(), lib_field::LEN)?;
        clamped_mut(packet.buffer.as_mut(), 0, lib_field::LEN).fill(0);
        packet.set_ptype(PacketType::NackLib as u8);
        packet.set_src_endpoint(self.src_endpoint);
        packet.set_src_generation(self.src_generation);
        packet.set_nack_type(self.nack_type as u8);
        packet.set_dst_endpoint(self.dst_endpoint);
        packet.set_dst_src_peer_index(self.dst_src_peer_index);
        packet.set_lib_seqnum(self.lib_seqnum);
        Ok(())
    }
}

packet_view! {
    /// A zero-copy view of a NACK_MCP packet.
    NackMcpPacket
}

packet_fields!(NackMcpPacket {
    /// Endpoint that refused the PULL.
    src_endpoint, set_src_endpoint: u8 = mcp_field::SRC_ENDPOINT;
    /// Its generation.
    src_generation, set_src_generation: u8 = mcp_field::SRC_GENERATION;
    /// Why, as a raw byte.
    nack_type, set_nack_type: u8 = mcp_field::NACK_TYPE;
    /// The puller's handle.
    src_pull_handle, set_src_pull_handle: u32 = mcp_field::SRC_PULL_HANDLE;
    /// The puller's endpoint magic.
    src_magic, set_src_magic: u32 = mcp_field::SRC_MAGIC;
});

impl<T: AsRef<[u8]>> NackMcpPacket<T> {
    fn check_len(&self) -> Result<()> {
        need(self.buffer.as_ref().len(), mcp_field::LEN)
    }
}

/// A NACK_MCP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NackMcpRepr {
    /// Endpoint that refused the PULL.
    pub src_endpoint: u8,
    /// Its generation.
    pub src_generation: u8,
    /// Why.
    pub nack_type: NackType,
    /// The puller's handle.
    pub src_pull_handle: u32,
    /// The puller's endpoint magic.
    pub src_magic: u32,
}

impl NackMcpRepr {
    /// Reads a NACK_MCP, refusing unknown nack types.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &NackMcpPacket<&T>) -> Result<Self> {
        packet.check_len()?;
        expect_ptype(packet.ptype(), PacketType::NackMcp)?;
        Ok(Self {
            src_endpoint: packet.src_endpoint(),
            src_generation: packet.src_generation(),
            nack_type: NackType::try_from(packet.nack_type())?,
            src_pull_handle: packet.src_pull_handle(),
            src_magic: packet.src_magic(),
        })
    }

    /// Bytes the packet occupies.
    pub const fn buffer_len(&self) -> usize {
        mcp_field::LEN
    }

    /// Writes the packet, padding included.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut NackMcpPacket<T>) -> Result<()> {
        room(packet.buffer.as_ref().len(), mcp_field::LEN)?;
        clamped_mut(packet.buffer.as_mut(), 0, mcp_field::LEN).fill(0);
        packet.set_ptype(PacketType::NackMcp as u8);
        packet.set_src_endpoint(self.src_endpoint);
        packet.set_src_generation(self.src_generation);
        packet.set_nack_type(self.nack_type as u8);
        packet.set_src_pull_handle(self.src_pull_handle);
        packet.set_src_magic(self.src_magic);
        Ok(())
    }
}

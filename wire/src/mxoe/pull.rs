//! PULL and PULL_REPLY: the receiver of a large message asks for one block at
//! a time; the sender answers each PULL with up to 8 PULL_REPLY frames of at
//! most 4096 bytes.
//!
//! A PULL names the sender's region (`pulled_rdma_*`), the receiver's handle
//! and endpoint magic (echoed in the replies as `dst_pull_handle` /
//! `dst_magic`), the block's first frame (`frame_index`), the offset of the
//! data in that first frame and the block's length. The first block of a
//! transfer starts at the region offset's position inside its frame; later
//! blocks start at offset 0. Reply `i` of a block carries `frame_seqnum` =
//! (`frame_index` + `i`) mod 256 and its data's offset in the message.

use super::access::{
    clamped, clamped_mut, expect_ptype, need, packet_fields, packet_view, put, room,
};
use super::{PacketType, PULL_BLOCK_LEN_MAX, PULL_REPLY_LEN_MAX};
use crate::{Error, Result};

/// Byte offsets inside PULL (32 bytes).
pub mod field {
    /// Packet type.
    pub const PTYPE: usize = 0;
    /// Destination endpoint (the data's sender).
    pub const DST_ENDPOINT: usize = 1;
    /// Source endpoint (the puller).
    pub const SRC_ENDPOINT: usize = 2;
    /// Source endpoint generation.
    pub const SRC_GENERATION: usize = 3;
    /// Destination session id.
    pub const SESSION: usize = 4;
    /// Total length of the transfer.
    pub const TOTAL_LENGTH: usize = 8;
    /// Id of the pulled region.
    pub const PULLED_RDMA_ID: usize = 12;
    /// Sequence number of the pulled region.
    pub const PULLED_RDMA_SEQNUM: usize = 13;
    /// Offset of the data in the pulled region.
    pub const PULLED_RDMA_OFFSET: usize = 14;
    /// The puller's handle (MX's src_send_handle).
    pub const SRC_PULL_HANDLE: usize = 16;
    /// The puller's endpoint magic.
    pub const SRC_MAGIC: usize = 20;
    /// Offset of the data in the block's first frame.
    pub const FIRST_FRAME_OFFSET: usize = 24;
    /// Length of this block.
    pub const BLOCK_LENGTH: usize = 26;
    /// Index of the block's first frame in the transfer.
    pub const FRAME_INDEX: usize = 28;
    /// Length of the packet.
    pub const LEN: usize = 32;
}

/// Byte offsets inside PULL_REPLY (16 bytes, then the data).
pub mod reply_field {
    /// Packet type.
    pub const PTYPE: usize = 0;
    /// Frame number in the transfer, modulo 256.
    pub const FRAME_SEQNUM: usize = 1;
    /// Length of this frame's data.
    pub const FRAME_LENGTH: usize = 2;
    /// Offset of this frame's data in the message.
    pub const MSG_OFFSET: usize = 4;
    /// The puller's handle, from the PULL.
    pub const DST_PULL_HANDLE: usize = 8;
    /// The puller's endpoint magic, from the PULL.
    pub const DST_MAGIC: usize = 12;
    /// Length of the header; the data follows.
    pub const LEN: usize = 16;
    /// The data starts here.
    pub const DATA: usize = LEN;
}

packet_view! {
    /// A zero-copy view of a PULL packet.
    PullPacket
}

packet_fields!(PullPacket {
    /// Destination endpoint.
    dst_endpoint, set_dst_endpoint: u8 = field::DST_ENDPOINT;
    /// Source endpoint.
    src_endpoint, set_src_endpoint: u8 = field::SRC_ENDPOINT;
    /// Source endpoint generation.
    src_generation, set_src_generation: u8 = field::SRC_GENERATION;
    /// Destination session id.
    session, set_session: u32 = field::SESSION;
    /// Total length of the transfer.
    total_length, set_total_length: u32 = field::TOTAL_LENGTH;
    /// Pulled region id.
    pulled_rdma_id, set_pulled_rdma_id: u8 = field::PULLED_RDMA_ID;
    /// Pulled region sequence number.
    pulled_rdma_seqnum, set_pulled_rdma_seqnum: u8 = field::PULLED_RDMA_SEQNUM;
    /// Offset of the data in the pulled region.
    pulled_rdma_offset, set_pulled_rdma_offset: u16 = field::PULLED_RDMA_OFFSET;
    /// The puller's handle.
    src_pull_handle, set_src_pull_handle: u32 = field::SRC_PULL_HANDLE;
    /// The puller's endpoint magic.
    src_magic, set_src_magic: u32 = field::SRC_MAGIC;
    /// Offset of the data in the block's first frame.
    first_frame_offset, set_first_frame_offset: u16 = field::FIRST_FRAME_OFFSET;
    /// Length of this block.
    block_length, set_block_length: u16 = field::BLOCK_LENGTH;
    /// Index of the block's first frame.
    frame_index, set_frame_index: u32 = field::FRAME_INDEX;
});

impl<T: AsRef<[u8]>> PullPacket<T> {
    fn check_len(&self) -> Result<()> {
        need(self.buffer.as_ref().len(), field::LEN)
    }
}

/// A PULL packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PullRepr {
    /// Destination endpoint (the data's sender).
    pub dst_endpoint: u8,
    /// Source endpoint (the puller).
    pub src_endpoint: u8,
    /// Source endpoint generation.
    pub src_generation: u8,
    /// Destination session id.
    pub session: u32,
    /// Total length of the transfer.
    pub total_length: u32,
    /// Pulled region id.
    pub pulled_rdma_id: u8,
    /// Pulled region sequence number.
    pub pulled_rdma_seqnum: u8,
    /// Offset of the data in the pulled region.
    pub pulled_rdma_offset: u16,
    /// The puller's handle.
    pub src_pull_handle: u32,
    /// The puller's endpoint magic.
    pub src_magic: u32,
    /// Offset of the data in the block's first frame (below 4096).
    pub first_frame_offset: u16,
    /// Length of this block; with `first_frame_offset`, at most 8 frames.
    pub block_length: u16,
    /// Index of the block's first frame.
    pub frame_index: u32,
}

impl PullRepr {
    fn validate(first_frame_offset: u16, block_length: u16) -> Result<()> {
        if usize::from(first_frame_offset) >= PULL_REPLY_LEN_MAX {
            return Err(Error::Invalid {
                field: "pull first frame offset",
                reason: "not inside a 4096-byte frame",
            });
        }
        if usize::from(first_frame_offset) + usize::from(block_length) > PULL_BLOCK_LEN_MAX {
            return Err(Error::Invalid {
                field: "pull block length",
                reason: "the block spans more than 8 replies",
            });
        }
        Ok(())
    }

    /// The number of PULL_REPLY frames that answer this block.
    pub const fn replies(&self) -> usize {
        (self.first_frame_offset as usize + self.block_length as usize).div_ceil(PULL_REPLY_LEN_MAX)
    }

    /// Reads a PULL, refusing blocks that do not fit in 8 replies.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &PullPacket<&T>) -> Result<Self> {
        packet.check_len()?;
        expect_ptype(packet.ptype(), PacketType::Pull)?;
        Self::validate(packet.first_frame_offset(), packet.block_length())?;
        Ok(Self {
            dst_endpoint: packet.dst_endpoint(),
            src_endpoint: packet.src_endpoint(),
            src_generation: packet.src_generation(),
            session: packet.session(),
            total_length: packet.total_length(),
            pulled_rdma_id: packet.pulled_rdma_id(),
            pulled_rdma_seqnum: packet.pulled_rdma_seqnum(),
            pulled_rdma_offset: packet.pulled_rdma_offset(),
            src_pull_handle: packet.src_pull_handle(),
            src_magic: packet.src_magic(),
            first_frame_offset: packet.first_frame_offset(),
            block_length: packet.block_length(),
            frame_index: packet.frame_index(),
        })
    }

    /// Bytes the packet occupies.
    pub const fn buffer_len(&self) -> usize {
        field::LEN
    }

    /// Writes the packet.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut PullPacket<T>) -> Result<()> {
        Self::validate(self.first_frame_offset, self.block_length)?;
        room(packet.buffer.as_ref().len(), field::LEN)?;
        packet.set_ptype(PacketType::Pull as u8);
        packet.set_dst_endpoint(self.dst_endpoint);
        packet.set_src_endpoint(self.src_endpoint);
        packet.set_src_generation(self.src_generation);
        packet.set_session(self.session);
        packet.set_total_length(self.total_length);
        packet.set_pulled_rdma_id(self.pulled_rdma_id);
        packet.set_pulled_rdma_seqnum(self.pulled_rdma_seqnum);
        packet.set_pulled_rdma_offset(self.pulled_rdma_offset);
        packet.set_src_pull_handle(self.src_pull_handle);
        packet.set_src_magic(self.src_magic);
        packet.set_first_frame_offset(self.first_frame_offset);
        packet.set_block_length(self.block_length);
        packet.set_frame_index(self.frame_index);
        Ok(())
    }
}

packet_view! {
    /// A zero-copy view of a PULL_REPLY packet and its data.
    PullReplyPacket
}

packet_fields!(PullReplyPacket {
    /// Frame number modulo 256.
    frame_seqnum, set_frame_seqnum: u8 = reply_field::FRAME_SEQNUM;
    /// Length of this frame's data.
    frame_length, set_frame_length: u16 = reply_field::FRAME_LENGTH;
    /// Offset of this frame's data in the message.
    msg_offset, set_msg_offset: u32 = reply_field::MSG_OFFSET;
    /// The puller's handle.
    dst_pull_handle, set_dst_pull_handle: u32 = reply_field::DST_PULL_HANDLE;
    /// The puller's endpoint magic.
    dst_magic, set_dst_magic: u32 = reply_field::DST_MAGIC;
});

impl<T: AsRef<[u8]>> PullReplyPacket<T> {
    fn check_len(&self) -> Result<()> {
        let have = self.buffer.as_ref().len();
        need(have, reply_field::LEN)?;
        need(have, reply_field::DATA + usize::from(self.frame_length()))
    }

    /// The `frame_length` data bytes (fewer if the buffer is shorter).
    pub fn data(&self) -> &[u8] {
        let len = usize::from(self.frame_length());
        clamped(self.buffer.as_ref(), reply_field::DATA, len)
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> PullReplyPacket<&'a T> {
    /// The data, borrowed for the buffer's lifetime.
    pub fn data_ref(&self) -> &'a [u8] {
        let len = usize::from(self.frame_length());
        clamped(self.buffer.as_ref(), reply_field::DATA, len)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> PullReplyPacket<T> {
    /// The data, writable (set `frame_length` first).
    pub fn data_mut(&mut self) -> &mut [u8] {
        let len = usize::from(self.frame_length());
        clamped_mut(self.buffer.as_mut(), reply_field::DATA, len)
    }
}

/// A PULL_REPLY packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PullReplyRepr<'a> {
    /// Frame number modulo 256.
    pub frame_seqnum: u8,
    /// Offset of this frame's data in the message.
    pub msg_offset: u32,
    /// The puller's handle.
    pub dst_pull_handle: u32,
    /// The puller's endpoint magic.
    pub dst_magic: u32,
    /// This frame's data: at most 4096 bytes (MX), or the data of up to a block's
    /// consecutive frames for a puller that asked for it ([`units_mark`](super::units_mark)).
    pub data: &'a [u8],
}

impl<'a> PullReplyRepr<'a> {
    /// Reads a PULL_REPLY; its data must be present and at most a block (32 KiB): MX
    /// sends at most 4096 bytes, xmx more only to a puller that asked
    /// ([`units_mark`](super::units_mark)), and the puller checks the data against the frames it
    /// requested.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &PullReplyPacket<&'a T>) -> Result<Self> {
        packet.check_len()?;
        expect_ptype(packet.ptype(), PacketType::PullReply)?;
        if usize::from(packet.frame_length()) > PULL_BLOCK_LEN_MAX {
            return Err(Error::Invalid {
                field: "pull reply frame length",
                reason: "above a block (32 KiB)",
            });
        }
        Ok(Self {
            frame_seqnum: packet.frame_seqnum(),
            msg_offset: packet.msg_offset(),
            dst_pull_handle: packet.dst_pull_handle(),
            dst_magic: packet.dst_magic(),
            data: packet.data_ref(),
        })
    }

    /// Bytes the packet occupies.
    pub const fn buffer_len(&self) -> usize {
        reply_field::DATA + self.data.len()
    }

    /// Writes the packet and its data.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut PullReplyPacket<T>,
    ) -> Result<()> {
        room(packet.buffer.as_ref().len(), self.buffer_len())?;
        self.emit_fields(packet, self.data.len())?;
        put(packet.buffer.as_mut(), reply_field::DATA, self.data)
    }

    /// Writes every field of a reply carrying `data_len` bytes, but not the data
    /// (`self.data` is not read): for a sender that reads the data straight into the
    /// frame at [`reply_field::DATA`] instead of through a buffer of its own. The
    /// packet needs room for the fields only.
    pub fn emit_fields<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut PullReplyPacket<T>,
        data_len: usize,
    ) -> Result<()> {
        if data_len > PULL_BLOCK_LEN_MAX {
            return Err(Error::Invalid {
                field: "pull reply frame length",
                reason: "above a block (32 KiB)",
            });
        }
        room(packet.buffer.as_ref().len(), reply_field::DATA)?;
        packet.set_ptype(PacketType::PullReply as u8);
        packet.set_frame_seqnum(self.frame_seqnum);
        // Bounded to 4096 above.
        packet.set_frame_length(data_len as u16);
        packet.set_msg_offset(self.msg_offset);
        packet.set_dst_pull_handle(self.dst_pull_handle);
        packet.set_dst_magic(self.dst_magic);
        Ok(())
    }
}

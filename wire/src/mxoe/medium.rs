//! MEDIUM: one fragment of a message of at most 32 KiB. Fragment `n` sits at offset
//! `n << frag_pipeline` of the message and carries at most `1 << frag_pipeline` bytes.
//! MX and Open-MX send and take pipeline 12 (4096-byte fragments) only; xmx sends wider
//! fragments (pipeline up to 15) to a board that allows them
//! ([`units_mark`](super::units_mark)), and takes them from anyone.

use super::access::{
    clamped, clamped_mut, expect_ptype, need, packet_fields, packet_view, put, room,
};
use super::msg::{join_match, split_match, MsgHeader};
use super::{PacketType, MEDIUM_FRAG_LEN_SHIFT, MEDIUM_FRAG_LEN_SHIFT_MAX, MEDIUM_MSG_LEN_MAX};
use crate::{Error, Result};

/// Byte offsets inside the MEDIUM fragment header (32 bytes).
pub mod field {
    /// Packet type.
    pub const PTYPE: usize = 0;
    /// Destination endpoint.
    pub const DST_ENDPOINT: usize = 1;
    /// Source endpoint.
    pub const SRC_ENDPOINT: usize = 2;
    /// Source endpoint generation.
    pub const SRC_GENERATION: usize = 3;
    /// Length of the whole message (u16 in wire-compatible mode).
    pub const LENGTH: usize = 4;
    /// Padding (u16).
    pub const PAD: usize = 6;
    /// Library sequence number.
    pub const LIB_SEQNUM: usize = 8;
    /// Piggybacked ack.
    pub const LIB_PIGGYACK: usize = 10;
    /// Match info, high 32 bits.
    pub const MATCH_A: usize = 12;
    /// Match info, low 32 bits.
    pub const MATCH_B: usize = 16;
    /// Destination session id.
    pub const SESSION: usize = 20;
    /// Length of this fragment's data.
    pub const FRAG_LENGTH: usize = 24;
    /// Index of this fragment in the message.
    pub const FRAG_SEQNUM: usize = 26;
    /// log2 of the fragment stride (12 in MX; up to 15 between xmx boards).
    pub const FRAG_PIPELINE: usize = 27;
    /// Message checksum.
    pub const CHECKSUM: usize = 28;
    /// Padding (u16).
    pub const PAD2: usize = 30;
    /// Length of the header; the fragment data follows.
    pub const LEN: usize = 32;
    /// The fragment data starts here.
    pub const DATA: usize = LEN;
}

packet_view! {
    /// A zero-copy view of a MEDIUM fragment and its data.
    MediumPacket
}

packet_fields!(MediumPacket {
    /// Destination endpoint.
    dst_endpoint, set_dst_endpoint: u8 = field::DST_ENDPOINT;
    /// Source endpoint.
    src_endpoint, set_src_endpoint: u8 = field::SRC_ENDPOINT;
    /// Source endpoint generation.
    src_generation, set_src_generation: u8 = field::SRC_GENERATION;
    /// Length of the whole message.
    length, set_length: u16 = field::LENGTH;
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
    /// Length of this fragment's data.
    frag_length, set_frag_length: u16 = field::FRAG_LENGTH;
    /// Index of this fragment.
    frag_seqnum, set_frag_seqnum: u8 = field::FRAG_SEQNUM;
    /// log2 of the fragment stride.
    frag_pipeline, set_frag_pipeline: u8 = field::FRAG_PIPELINE;
    /// Message checksum.
    checksum, set_checksum: u16 = field::CHECKSUM;
});

impl<T: AsRef<[u8]>> MediumPacket<T> {
    fn check_len(&self) -> Result<()> {
        let have = self.buffer.as_ref().len();
        need(have, field::LEN)?;
        need(have, field::DATA + usize::from(self.frag_length()))
    }

    /// The 64-bit match info.
    pub fn match_info(&self) -> u64 {
        join_match(self.match_a(), self.match_b())
    }

    /// The `frag_length` data bytes (fewer if the buffer is shorter).
    pub fn data(&self) -> &[u8] {
        let len = usize::from(self.frag_length());
        clamped(self.buffer.as_ref(), field::DATA, len)
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> MediumPacket<&'a T> {
    /// The fragment data, borrowed for the buffer's lifetime.
    pub fn data_ref(&self) -> &'a [u8] {
        let len = usize::from(self.frag_length());
        clamped(self.buffer.as_ref(), field::DATA, len)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> MediumPacket<T> {
    /// Sets the 64-bit match info.
    pub fn set_match_info(&mut self, value: u64) {
        let (a, b) = split_match(value);
        self.set_match_a(a);
        self.set_match_b(b);
    }

    /// The fragment data, writable (set `frag_length` first).
    pub fn data_mut(&mut self) -> &mut [u8] {
        let len = usize::from(self.frag_length());
        clamped_mut(self.buffer.as_mut(), field::DATA, len)
    }
}

/// One MEDIUM fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MediumRepr<'a> {
    /// Envelope.
    pub header: MsgHeader,
    /// Length of the whole message (at most 32 KiB).
    pub msg_length: u16,
    /// Index of this fragment (below 8 at MX's stride).
    pub frag_seqnum: u8,
    /// log2 of the fragment stride: [`MEDIUM_FRAG_LEN_SHIFT`] (MX's 4096 bytes), or
    /// wider, up to [`MEDIUM_FRAG_LEN_SHIFT_MAX`], toward an xmx board that allows it.
    pub frag_pipeline: u8,
    /// This fragment's data (at most `1 << frag_pipeline` bytes).
    pub data: &'a [u8],
}

impl<'a> MediumRepr<'a> {
    /// Byte offset of this fragment in the message.
    pub const fn frag_offset(&self) -> usize {
        (self.frag_seqnum as usize) << self.frag_pipeline
    }

    fn validate(
        msg_length: u16,
        frag_seqnum: u8,
        frag_pipeline: u8,
        frag_length: usize,
    ) -> Result<()> {
        let invalid = |field, reason| Err(Error::Invalid { field, reason });
        let pipeline = u32::from(frag_pipeline);
        if !(MEDIUM_FRAG_LEN_SHIFT..=MEDIUM_FRAG_LEN_SHIFT_MAX).contains(&pipeline) {
            return invalid("medium frag pipeline", "stride not 4 to 32 KiB");
        }
        if frag_length > 1 << pipeline {
            return invalid("medium frag length", "above the stride");
        }
        let start = usize::from(frag_seqnum) << pipeline;
        if start >= MEDIUM_MSG_LEN_MAX {
            return invalid("medium frag seqnum", "a message has at most 32 KiB");
        }
        if usize::from(msg_length) > MEDIUM_MSG_LEN_MAX {
            return invalid("medium length", "above 32 KiB");
        }
        let end = start + frag_length;
        if end > usize::from(msg_length) {
            return invalid("medium frag length", "fragment ends past the message");
        }
        Ok(())
    }

    /// Reads a MEDIUM fragment, checking it lies inside a message of at most 32 KiB.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &MediumPacket<&'a T>) -> Result<Self> {
        packet.check_len()?;
        expect_ptype(packet.ptype(), PacketType::Medium)?;
        Self::validate(
            packet.length(),
            packet.frag_seqnum(),
            packet.frag_pipeline(),
            usize::from(packet.frag_length()),
        )?;
        Ok(Self {
            header: MsgHeader {
                dst_endpoint: packet.dst_endpoint(),
                src_endpoint: packet.src_endpoint(),
                src_generation: packet.src_generation(),
                lib_seqnum: packet.lib_seqnum(),
                lib_piggyack: packet.lib_piggyack(),
                match_info: packet.match_info(),
                session: packet.session(),
                checksum: packet.checksum(),
            },
            msg_length: packet.length(),
            frag_seqnum: packet.frag_seqnum(),
            frag_pipeline: packet.frag_pipeline(),
            data: packet.data_ref(),
        })
    }

    /// Bytes the packet occupies.
    pub const fn buffer_len(&self) -> usize {
        field::DATA + self.data.len()
    }

    /// Writes the fragment header and data.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut MediumPacket<T>) -> Result<()> {
        room(packet.buffer.as_ref().len(), self.buffer_len())?;
        self.emit_fields(packet, self.data.len())?;
        put(packet.buffer.as_mut(), field::DATA, self.data)
    }

    /// Writes the header of a fragment carrying `data_len` bytes, but not the data
    /// (`self.data` is not read): for a sender that reads the data straight into the
    /// frame at [`field::DATA`]. The packet needs room for the header only.
    pub fn emit_fields<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut MediumPacket<T>,
        data_len: usize,
    ) -> Result<()> {
        let pipeline = self.frag_pipeline;
        Self::validate(self.msg_length, self.frag_seqnum, pipeline, data_len)?;
        room(packet.buffer.as_ref().len(), field::DATA)?;
        let h = &self.header;
        clamped_mut(packet.buffer.as_mut(), 0, field::LEN).fill(0);
        packet.set_ptype(PacketType::Medium as u8);
        packet.set_dst_endpoint(h.dst_endpoint);
        packet.set_src_endpoint(h.src_endpoint);
        packet.set_src_generation(h.src_generation);
        packet.set_length(self.msg_length);
        packet.set_lib_seqnum(h.lib_seqnum);
        packet.set_lib_piggyack(h.lib_piggyack);
        packet.set_match_info(h.match_info);
        packet.set_session(h.session);
        // validate() bounded the data to the stride, at most 32 KiB.
        packet.set_frag_length(data_len as u16);
        packet.set_frag_seqnum(self.frag_seqnum);
        packet.set_frag_pipeline(pipeline);
        packet.set_checksum(h.checksum);
        Ok(())
    }
}

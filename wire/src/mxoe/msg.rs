//! TINY and SMALL: a 24-byte message header followed by the whole message.
//! The same header opens RNDV; MEDIUM extends it.

use super::access::{
    clamped, clamped_mut, expect_ptype, need, packet_fields, packet_view, put, room,
};
use super::{PacketType, SMALL_MSG_LEN_MAX, TINY_MSG_LEN_MAX};
use crate::{Error, Result};

/// Byte offsets inside the message header (24 bytes).
pub mod field {
    /// Packet type.
    pub const PTYPE: usize = 0;
    /// Destination endpoint.
    pub const DST_ENDPOINT: usize = 1;
    /// Source endpoint.
    pub const SRC_ENDPOINT: usize = 2;
    /// Source endpoint generation.
    pub const SRC_GENERATION: usize = 3;
    /// TINY/SMALL: message length. RNDV: length of the rendezvous data.
    pub const LENGTH: usize = 4;
    /// Optional message checksum.
    pub const CHECKSUM: usize = 6;
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
    /// Length of the header; TINY/SMALL data follows.
    pub const LEN: usize = 24;
    /// TINY/SMALL: the message data starts here.
    pub const DATA: usize = LEN;
}

packet_view! {
    /// A zero-copy view of a TINY or SMALL packet (same layout) and its data.
    MsgPacket
}

/// A TINY packet view.
pub type TinyPacket<T> = MsgPacket<T>;
/// A SMALL packet view.
pub type SmallPacket<T> = MsgPacket<T>;

packet_fields!(MsgPacket {
    /// Destination endpoint.
    dst_endpoint, set_dst_endpoint: u8 = field::DST_ENDPOINT;
    /// Source endpoint.
    src_endpoint, set_src_endpoint: u8 = field::SRC_ENDPOINT;
    /// Source endpoint generation.
    src_generation, set_src_generation: u8 = field::SRC_GENERATION;
    /// Message length.
    length, set_length: u16 = field::LENGTH;
    /// Message checksum (0 when unused).
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
});

impl<T: AsRef<[u8]>> MsgPacket<T> {
    fn check_len(&self) -> Result<()> {
        let have = self.buffer.as_ref().len();
        need(have, field::LEN)?;
        need(have, field::DATA + usize::from(self.length()))
    }

    /// The 64-bit match info.
    pub fn match_info(&self) -> u64 {
        join_match(self.match_a(), self.match_b())
    }

    /// The `length` data bytes (fewer if the buffer is shorter).
    pub fn data(&self) -> &[u8] {
        clamped(
            self.buffer.as_ref(),
            field::DATA,
            usize::from(self.length()),
        )
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> MsgPacket<&'a T> {
    /// The data bytes, borrowed for the buffer's lifetime.
    pub fn data_ref(&self) -> &'a [u8] {
        clamped(
            self.buffer.as_ref(),
            field::DATA,
            usize::from(self.length()),
        )
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> MsgPacket<T> {
    /// Sets the 64-bit match info.
    pub fn set_match_info(&mut self, value: u64) {
        let (a, b) = split_match(value);
        self.set_match_a(a);
        self.set_match_b(b);
    }

    /// The data bytes, writable (set `length` first).
    pub fn data_mut(&mut self) -> &mut [u8] {
        let len = usize::from(self.length());
        clamped_mut(self.buffer.as_mut(), field::DATA, len)
    }
}

pub(crate) const fn join_match(a: u32, b: u32) -> u64 {
    ((a as u64) << 32) | b as u64
}

pub(crate) const fn split_match(value: u64) -> (u32, u32) {
    ((value >> 32) as u32, value as u32)
}

/// The envelope shared by TINY, SMALL, MEDIUM and RNDV.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MsgHeader {
    /// Destination endpoint.
    pub dst_endpoint: u8,
    /// Source endpoint.
    pub src_endpoint: u8,
    /// Source endpoint generation.
    pub src_generation: u8,
    /// Library sequence number.
    pub lib_seqnum: u16,
    /// Piggybacked ack.
    pub lib_piggyack: u16,
    /// 64-bit match info (high half first on the wire).
    pub match_info: u64,
    /// Destination session id.
    pub session: u32,
    /// Message checksum (0 when unused).
    pub checksum: u16,
}

impl MsgHeader {
    fn read<T: AsRef<[u8]>>(packet: &MsgPacket<T>) -> Self {
        Self {
            dst_endpoint: packet.dst_endpoint(),
            src_endpoint: packet.src_endpoint(),
            src_generation: packet.src_generation(),
            lib_seqnum: packet.lib_seqnum(),
            lib_piggyack: packet.lib_piggyack(),
            match_info: packet.match_info(),
            session: packet.session(),
            checksum: packet.checksum(),
        }
    }

    fn write<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut MsgPacket<T>) {
        packet.set_dst_endpoint(self.dst_endpoint);
        packet.set_src_endpoint(self.src_endpoint);
        packet.set_src_generation(self.src_generation);
        packet.set_checksum(self.checksum);
        packet.set_lib_seqnum(self.lib_seqnum);
        packet.set_lib_piggyack(self.lib_piggyack);
        packet.set_match_info(self.match_info);
        packet.set_session(self.session);
    }
}

/// Reads the envelope of a packet that must be of type `ptype` (TINY, SMALL, RNDV).
pub(crate) fn parse_header<T: AsRef<[u8]>>(
    packet: &MsgPacket<T>,
    ptype: PacketType,
) -> Result<MsgHeader> {
    expect_ptype(packet.ptype(), ptype)?;
    Ok(MsgHeader::read(packet))
}

/// Writes a message header of type `ptype` with `length` into the first 24 bytes.
pub(crate) fn emit_header<T: AsRef<[u8]> + AsMut<[u8]>>(
    header: &MsgHeader,
    packet: &mut MsgPacket<T>,
    ptype: PacketType,
    length: u16,
) {
    clamped_mut(packet.buffer.as_mut(), 0, field::LEN).fill(0);
    packet.set_ptype(ptype as u8);
    packet.set_length(length);
    header.write(packet);
}

fn parse_eager<'a, T: AsRef<[u8]> + ?Sized>(
    packet: &MsgPacket<&'a T>,
    ptype: PacketType,
    max_len: usize,
) -> Result<(MsgHeader, &'a [u8])> {
    packet.check_len()?;
    let header = parse_header(packet, ptype)?;
    if usize::from(packet.length()) > max_len {
        return Err(Error::Invalid {
            field: "message length",
            reason: "longer than the class allows",
        });
    }
    Ok((header, packet.data_ref()))
}

fn emit_eager<T: AsRef<[u8]> + AsMut<[u8]>>(
    header: &MsgHeader,
    data: &[u8],
    packet: &mut MsgPacket<T>,
    ptype: PacketType,
    max_len: usize,
) -> Result<()> {
    let length = u16::try_from(data.len())
        .ok()
        .filter(|&len| usize::from(len) <= max_len)
        .ok_or(Error::Invalid {
            field: "message length",
            reason: "longer than the class allows",
        })?;
    room(packet.buffer.as_ref().len(), field::DATA + data.len())?;
    emit_header(header, packet, ptype, length);
    put(packet.buffer.as_mut(), field::DATA, data)
}

/// A TINY packet: a message of at most 32 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TinyRepr<'a> {
    /// Envelope.
    pub header: MsgHeader,
    /// The whole message.
    pub data: &'a [u8],
}

impl<'a> TinyRepr<'a> {
    /// Reads a TINY; the length must be at most 32 and the data present.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &TinyPacket<&'a T>) -> Result<Self> {
        let (header, data) = parse_eager(packet, PacketType::Tiny, TINY_MSG_LEN_MAX)?;
        Ok(Self { header, data })
    }

    /// Bytes the packet occupies.
    pub const fn buffer_len(&self) -> usize {
        field::DATA + self.data.len()
    }

    /// Writes the packet and its data.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut TinyPacket<T>) -> Result<()> {
        emit_eager(
            &self.header,
            self.data,
            packet,
            PacketType::Tiny,
            TINY_MSG_LEN_MAX,
        )
    }
}

/// A SMALL packet: a message of at most 128 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SmallRepr<'a> {
    /// Envelope.
    pub header: MsgHeader,
    /// The whole message.
    pub data: &'a [u8],
}

impl<'a> SmallRepr<'a> {
    /// Reads a SMALL; the length must be at most 128 and the data present.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &SmallPacket<&'a T>) -> Result<Self> {
        let (header, data) = parse_eager(packet, PacketType::Small, SMALL_MSG_LEN_MAX)?;
        Ok(Self { header, data })
    }

    /// Bytes the packet occupies.
    pub const fn buffer_len(&self) -> usize {
        field::DATA + self.data.len()
    }

    /// Writes the packet and its data.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut SmallPacket<T>) -> Result<()> {
        emit_eager(
            &self.header,
            self.data,
            packet,
            PacketType::Small,
            SMALL_MSG_LEN_MAX,
        )
    }
}

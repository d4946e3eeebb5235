//! HOST_QUERY and HOST_REPLY: asking a board for its hostname.
//!
//! A query carries the querier's index for the queried peer; the reply echoes
//! the magic and carries the replier's index for the querier, then the
//! hostname (`length` bytes, NUL included as Open-MX sends it).

use super::access::{
    clamped, clamped_mut, expect_ptype, need, packet_fields, packet_view, put, room,
};
use super::PacketType;
use crate::{Error, Result};

/// Byte offsets inside HOST_QUERY and HOST_REPLY (same layout, 16 bytes).
pub mod field {
    /// Packet type.
    pub const PTYPE: usize = 0;
    /// HOST_QUERY: padding. HOST_REPLY: hostname length.
    pub const LENGTH: usize = 1;
    /// The sender's index for the other peer.
    pub const SRC_DST_PEER_INDEX: usize = 2;
    /// Padding (u32).
    pub const PAD0: usize = 4;
    /// Query magic, echoed by the reply.
    pub const MAGIC: usize = 8;
    /// Padding (u32).
    pub const PAD1: usize = 12;
    /// Length of the fixed part.
    pub const LEN: usize = 16;
    /// HOST_REPLY: the hostname starts here.
    pub const HOSTNAME: usize = LEN;
}

packet_view! {
    /// A zero-copy view of a HOST_QUERY packet.
    HostQueryPacket
}

packet_fields!(HostQueryPacket {
    /// The querier's index for the queried peer.
    src_dst_peer_index, set_src_dst_peer_index: u16 = field::SRC_DST_PEER_INDEX;
    /// Query magic.
    magic, set_magic: u32 = field::MAGIC;
});

impl<T: AsRef<[u8]>> HostQueryPacket<T> {
    fn check_len(&self) -> Result<()> {
        need(self.buffer.as_ref().len(), field::LEN)
    }
}

/// A HOST_QUERY packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HostQueryRepr {
    /// The querier's index for the queried peer.
    pub src_dst_peer_index: u16,
    /// Query magic; Open-MX uses [`super::HOST_QUERY_MAGIC`].
    pub magic: u32,
}

impl HostQueryRepr {
    /// Reads a HOST_QUERY.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &HostQueryPacket<&T>) -> Result<Self> {
        packet.check_len()?;
        expect_ptype(packet.ptype(), PacketType::HostQuery)?;
        Ok(Self {
            src_dst_peer_index: packet.src_dst_peer_index(),
            magic: packet.magic(),
        })
    }

    /// Bytes the packet occupies.
    pub const fn buffer_len(&self) -> usize {
        field::LEN
    }

    /// Writes the packet, padding included.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut HostQueryPacket<T>,
    ) -> Result<()> {
        room(packet.buffer.as_ref().len(), self.buffer_len())?;
        clamped_mut(packet.buffer.as_mut(), 0, field::LEN).fill(0);
        packet.set_ptype(PacketType::HostQuery as u8);
        packet.set_src_dst_peer_index(self.src_dst_peer_index);
        packet.set_magic(self.magic);
        Ok(())
    }
}

packet_view! {
    /// A zero-copy view of a HOST_REPLY packet and its hostname.
    HostReplyPacket
}

packet_fields!(HostReplyPacket {
    /// Hostname length in bytes, NUL included.
    length, set_length: u8 = field::LENGTH;
    /// The replier's index for the querier.
    src_dst_peer_index, set_src_dst_peer_index: u16 = field::SRC_DST_PEER_INDEX;
    /// The query's magic, echoed.
    magic, set_magic: u32 = field::MAGIC;
});

impl<T: AsRef<[u8]>> HostReplyPacket<T> {
    fn check_len(&self) -> Result<()> {
        let have = self.buffer.as_ref().len();
        need(have, field::LEN)?;
        need(have, field::HOSTNAME + usize::from(self.length()))
    }

    /// The `length` hostname bytes (fewer if the buffer is shorter).
    pub fn hostname(&self) -> &[u8] {
        clamped(
            self.buffer.as_ref(),
            field::HOSTNAME,
            usize::from(self.length()),
        )
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> HostReplyPacket<&'a T> {
    /// The hostname bytes, borrowed for the buffer's lifetime.
    pub fn hostname_ref(&self) -> &'a [u8] {
        clamped(
            self.buffer.as_ref(),
            field::HOSTNAME,
            usize::from(self.length()),
        )
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> HostReplyPacket<T> {
    /// The hostname bytes, writable (set `length` first).
    pub fn hostname_mut(&mut self) -> &mut [u8] {
        let len = usize::from(self.length());
        clamped_mut(self.buffer.as_mut(), field::HOSTNAME, len)
    }
}

/// A HOST_REPLY packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HostReplyRepr<'a> {
    /// The replier's index for the querier.
    pub src_dst_peer_index: u16,
    /// The query's magic, echoed.
    pub magic: u32,
    /// The hostname bytes exactly as carried (1 to 255 of them, normally
    /// NUL-terminated).
    pub hostname: &'a [u8],
}

impl<'a> HostReplyRepr<'a> {
    /// Reads a HOST_REPLY; an empty hostname is refused.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &HostReplyPacket<&'a T>) -> Result<Self> {
        packet.check_len()?;
        expect_ptype(packet.ptype(), PacketType::HostReply)?;
        if packet.length() == 0 {
            return Err(Error::Invalid {
                field: "host reply length",
                reason: "empty hostname",
            });
        }
        Ok(Self {
            src_dst_peer_index: packet.src_dst_peer_index(),
            magic: packet.magic(),
            hostname: packet.hostname_ref(),
        })
    }

    /// The hostname without its NUL terminator and anything after it.
    pub fn name(&self) -> &'a [u8] {
        let end = self
            .hostname
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.hostname.len());
        self.hostname.get(..end).unwrap_or(self.hostname)
    }

    /// Bytes the packet occupies.
    pub const fn buffer_len(&self) -> usize {
        field::HOSTNAME + self.hostname.len()
    }

    /// Writes the packet and the hostname.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut HostReplyPacket<T>,
    ) -> Result<()> {
        let length = u8::try_from(self.hostname.len())
            .ok()
            .filter(|&len| len > 0)
            .ok_or(Error::Invalid {
                field: "host reply length",
                reason: "hostname must be 1 to 255 bytes",
            })?;
        room(packet.buffer.as_ref().len(), self.buffer_len())?;
        clamped_mut(packet.buffer.as_mut(), 0, field::LEN).fill(0);
        packet.set_ptype(PacketType::HostReply as u8);
        packet.set_length(length);
        packet.set_src_dst_peer_index(self.src_dst_peer_index);
        packet.set_magic(self.magic);
        put(packet.buffer.as_mut(), field::HOSTNAME, self.hostname)
    }
}

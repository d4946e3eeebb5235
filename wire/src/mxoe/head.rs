//! The 16-byte head of every MXoE frame: the Ethernet header and the peer index.

use super::access::{need, room, BeField};
use super::{Mac, PacketType, ETHERTYPE};
use crate::{Error, Result};

/// Byte offsets inside the head.
pub mod field {
    /// Destination MAC.
    pub const DST: usize = 0;
    /// Source MAC.
    pub const SRC: usize = 6;
    /// Ethertype, 0x86DF.
    pub const ETHERTYPE: usize = 12;
    /// The sender's index in the receiver's peer table (MX's sender_peer_index).
    pub const DST_SRC_PEER_INDEX: usize = 14;
    /// Length of the head; the packet type byte follows.
    pub const LEN: usize = 16;
}

/// A zero-copy view of a frame's head (and, after it, the typed packet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> HeadPacket<T> {
    /// Wraps a buffer without checking its length (accessors then read zeros
    /// and ignore writes past its end).
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps a buffer holding at least the 16-byte head.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let packet = Self::new_unchecked(buffer);
        need(packet.buffer.as_ref().len(), field::LEN)?;
        Ok(packet)
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Destination MAC.
    pub fn dst(&self) -> Mac {
        Mac::read(self.buffer.as_ref(), field::DST)
    }

    /// Source MAC.
    pub fn src(&self) -> Mac {
        Mac::read(self.buffer.as_ref(), field::SRC)
    }

    /// Ethertype.
    pub fn ethertype(&self) -> u16 {
        u16::read(self.buffer.as_ref(), field::ETHERTYPE)
    }

    /// The sender's index in the receiver's peer table.
    pub fn dst_src_peer_index(&self) -> u16 {
        u16::read(self.buffer.as_ref(), field::DST_SRC_PEER_INDEX)
    }

    /// The packet type byte right after the head.
    pub fn packet_type(&self) -> Result<PacketType> {
        let buf = self.buffer.as_ref();
        let byte = buf.get(field::LEN).copied().ok_or(Error::Truncated {
            needed: field::LEN + 1,
            have: buf.len(),
        })?;
        PacketType::try_from(byte)
    }

    /// Everything after the head: the typed packet and any padding.
    pub fn payload(&self) -> &[u8] {
        self.buffer.as_ref().get(field::LEN..).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> HeadPacket<T> {
    /// Sets [`Self::dst`].
    pub fn set_dst(&mut self, value: Mac) {
        value.write(self.buffer.as_mut(), field::DST)
    }

    /// Sets [`Self::src`].
    pub fn set_src(&mut self, value: Mac) {
        value.write(self.buffer.as_mut(), field::SRC)
    }

    /// Sets [`Self::ethertype`].
    pub fn set_ethertype(&mut self, value: u16) {
        value.write(self.buffer.as_mut(), field::ETHERTYPE)
    }

    /// Sets [`Self::dst_src_peer_index`].
    pub fn set_dst_src_peer_index(&mut self, value: u16) {
        value.write(self.buffer.as_mut(), field::DST_SRC_PEER_INDEX)
    }

    /// Everything after the head, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        self.buffer
            .as_mut()
            .get_mut(field::LEN..)
            .unwrap_or(&mut [])
    }
}

impl<T: AsRef<[u8]>> AsRef<[u8]> for HeadPacket<T> {
    fn as_ref(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

/// The head of an MXoE frame. The ethertype is implied (always 0x86DF).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeadRepr {
    /// Destination board.
    pub dst: Mac,
    /// Source board.
    pub src: Mac,
    /// The sender's index in the receiver's peer table.
    pub dst_src_peer_index: u16,
}

impl HeadRepr {
    /// Reads a head, refusing other ethertypes.
    pub fn parse<T: AsRef<[u8]>>(packet: &HeadPacket<T>) -> Result<Self> {
        need(packet.buffer.as_ref().len(), field::LEN)?;
        let ethertype = packet.ethertype();
        if ethertype != ETHERTYPE {
            return Err(Error::Unknown {
                what: "ethertype",
                value: u32::from(ethertype),
            });
        }
        Ok(Self {
            dst: packet.dst(),
            src: packet.src(),
            dst_src_peer_index: packet.dst_src_peer_index(),
        })
    }

    /// Bytes the head occupies.
    pub const fn buffer_len(&self) -> usize {
        field::LEN
    }

    /// Writes the head.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut HeadPacket<T>) -> Result<()> {
        room(packet.buffer.as_ref().len(), field::LEN)?;
        packet.set_dst(self.dst);
        packet.set_src(self.src);
        packet.set_ethertype(ETHERTYPE);
        packet.set_dst_src_peer_index(self.dst_src_peer_index);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BYTES: [u8; 17] = [
        0x00, 0x60, 0xdd, 0x01, 0x02, 0x03, // dst
        0x02, 0x16, 0x3e, 0x0a, 0x0b, 0x0c, // src
        0x86, 0xdf, // ethertype
        0x01, 0x2c, // peer index 300
        37,   // TINY
    ];

    #[test]
    fn parse_known_head() {
        let packet = HeadPacket::new_checked(&BYTES[..]).unwrap();
        assert_eq!(packet.packet_type(), Ok(PacketType::Tiny));
        assert_eq!(packet.payload(), &[37]);
        let repr = HeadRepr::parse(&packet).unwrap();
        assert_eq!(
            repr,
            HeadRepr {
                dst: Mac([0x00, 0x60, 0xdd, 0x01, 0x02, 0x03]),
                src: Mac([0x02, 0x16, 0x3e, 0x0a, 0x0b, 0x0c]),
                dst_src_peer_index: 300,
            }
        );
        let mut out = [0u8; 16];
        repr.emit(&mut HeadPacket::new_unchecked(&mut out[..]))
            .unwrap();
        assert_eq!(out, BYTES[..16]);
    }

    #[test]
    fn short_and_foreign_heads_are_refused() {
        assert_eq!(
            HeadPacket::new_checked(&BYTES[..15]),
            Err(Error::Truncated {
                needed: 16,
                have: 15
            })
        );
        let packet = HeadPacket::new_checked(&BYTES[..16]).unwrap();
        assert_eq!(
            packet.packet_type(),
            Err(Error::Truncated {
                needed: 17,
                have: 16
            })
        );
        let mut ipv4 = BYTES;
        ipv4[12..14].copy_from_slice(&[0x08, 0x00]);
        assert_eq!(
            HeadRepr::parse(&HeadPacket::new_checked(&ipv4[..]).unwrap()),
            Err(Error::Unknown {
                what: "ethertype",
                value: 0x0800
            })
        );
        let mut out = [0u8; 15];
        let repr = HeadRepr::parse(&packet).unwrap();
        assert_eq!(
            repr.emit(&mut HeadPacket::new_unchecked(&mut out[..])),
            Err(Error::BufferTooSmall {
                needed: 16,
                have: 15
            })
        );
    }
}

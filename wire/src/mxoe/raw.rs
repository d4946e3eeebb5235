//! RAW: frames for mapper-style tools (MX's mx_raw interface). Past the type
//! byte the content is opaque and runs to the end of the frame, so a RAW
//! packet has no length of its own; the whole frame is bounded by
//! [`RAW_FRAME_LEN_MAX`].

use super::access::{expect_ptype, need, packet_view, put, room};
use super::{PacketType, HEAD_LEN, RAW_FRAME_LEN_MAX};
use crate::{Error, Result};

/// Byte offsets inside RAW.
pub mod field {
    /// Packet type.
    pub const PTYPE: usize = 0;
    /// The opaque payload starts here.
    pub const PAYLOAD: usize = 1;
    /// Length of the fixed part.
    pub const LEN: usize = 1;
}

/// The longest RAW payload: a RAW frame is at most 1024 bytes.
pub const RAW_PAYLOAD_LEN_MAX: usize = RAW_FRAME_LEN_MAX - HEAD_LEN - field::LEN;

packet_view! {
    /// A zero-copy view of a RAW packet: the type byte, then opaque bytes.
    RawPacket
}

impl<T: AsRef<[u8]>> RawPacket<T> {
    fn check_len(&self) -> Result<()> {
        need(self.buffer.as_ref().len(), field::LEN)
    }

    /// Everything after the type byte.
    pub fn payload(&self) -> &[u8] {
        self.buffer.as_ref().get(field::PAYLOAD..).unwrap_or(&[])
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> RawPacket<&'a T> {
    /// The payload, borrowed for the buffer's lifetime.
    pub fn payload_ref(&self) -> &'a [u8] {
        let buf: &'a [u8] = self.buffer.as_ref();
        buf.get(field::PAYLOAD..).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RawPacket<T> {
    /// The payload, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        self.buffer
            .as_mut()
            .get_mut(field::PAYLOAD..)
            .unwrap_or(&mut [])
    }
}

/// A RAW packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawRepr<'a> {
    /// The opaque bytes after the type byte (padding included, if any).
    pub payload: &'a [u8],
}

impl<'a> RawRepr<'a> {
    fn validate(payload_len: usize) -> Result<()> {
        if payload_len > RAW_PAYLOAD_LEN_MAX {
            return Err(Error::Invalid {
                field: "raw frame length",
                reason: "above 1024 bytes",
            });
        }
        Ok(())
    }

    /// Reads a RAW packet, refusing frames longer than 1024 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &RawPacket<&'a T>) -> Result<Self> {
        packet.check_len()?;
        expect_ptype(packet.ptype(), PacketType::Raw)?;
        let payload = packet.payload_ref();
        Self::validate(payload.len())?;
        Ok(Self { payload })
    }

    /// Bytes the packet occupies.
    pub const fn buffer_len(&self) -> usize {
        field::LEN + self.payload.len()
    }

    /// Writes the type byte and the payload.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut RawPacket<T>) -> Result<()> {
        Self::validate(self.payload.len())?;
        room(packet.buffer.as_ref().len(), self.buffer_len())?;
        packet.set_ptype(PacketType::Raw as u8);
        put(packet.buffer.as_mut(), field::PAYLOAD, self.payload)
    }
}

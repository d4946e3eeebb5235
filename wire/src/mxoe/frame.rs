//! Whole MXoE frames: the head, then one packet chosen by its type byte.

use super::connect::{ConnectPacket, ConnectRepr};
use super::head::{HeadPacket, HeadRepr};
use super::host::{HostQueryPacket, HostQueryRepr, HostReplyPacket, HostReplyRepr};
use super::medium::{MediumPacket, MediumRepr};
use super::msg::{MsgPacket, SmallRepr, TinyRepr};
use super::nack::{NackLibPacket, NackLibRepr, NackMcpPacket, NackMcpRepr};
use super::notify::{NotifyPacket, NotifyRepr};
use super::pull::{PullPacket, PullReplyPacket, PullReplyRepr, PullRepr};
use super::raw::{RawPacket, RawRepr};
use super::rndv::{RndvPacket, RndvRepr};
use super::truc::{TrucPacket, TrucRepr};
use super::{PacketType, ETH_FRAME_LEN_MIN, HEAD_LEN};
use crate::{Error, Result};

/// The typed packet of a frame. Payloads borrow from the parsed buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PacketRepr<'a> {
    /// RAW.
    Raw(RawRepr<'a>),
    /// HOST_QUERY.
    HostQuery(HostQueryRepr),
    /// HOST_REPLY.
    HostReply(HostReplyRepr<'a>),
    /// TRUC.
    Truc(TrucRepr),
    /// CONNECT.
    Connect(ConnectRepr),
    /// TINY.
    Tiny(TinyRepr<'a>),
    /// SMALL.
    Small(SmallRepr<'a>),
    /// MEDIUM.
    Medium(MediumRepr<'a>),
    /// RNDV.
    Rndv(RndvRepr),
    /// PULL.
    Pull(PullRepr),
    /// PULL_REPLY.
    PullReply(PullReplyRepr<'a>),
    /// NOTIFY.
    Notify(NotifyRepr),
    /// NACK_LIB.
    NackLib(NackLibRepr),
    /// NACK_MCP.
    NackMcp(NackMcpRepr),
}

/// Moves a packet-relative length error to frame-relative byte counts.
fn at_head(error: Error) -> Error {
    match error {
        Error::Truncated { needed, have } => Error::Truncated {
            needed: needed.saturating_add(HEAD_LEN),
            have: have.saturating_add(HEAD_LEN),
        },
        Error::BufferTooSmall { needed, have } => Error::BufferTooSmall {
            needed: needed.saturating_add(HEAD_LEN),
            have: have.saturating_add(HEAD_LEN),
        },
        other => other,
    }
}

impl<'a> PacketRepr<'a> {
    /// The packet's type.
    pub const fn packet_type(&self) -> PacketType {
        match self {
            PacketRepr::Raw(_) => PacketType::Raw,
            PacketRepr::HostQuery(_) => PacketType::HostQuery,
            PacketRepr::HostReply(_) => PacketType::HostReply,
            PacketRepr::Truc(_) => PacketType::Truc,
            PacketRepr::Connect(_) => PacketType::Connect,
            PacketRepr::Tiny(_) => PacketType::Tiny,
            PacketRepr::Small(_) => PacketType::Small,
            PacketRepr::Medium(_) => PacketType::Medium,
            PacketRepr::Rndv(_) => PacketType::Rndv,
            PacketRepr::Pull(_) => PacketType::Pull,
            PacketRepr::PullReply(_) => PacketType::PullReply,
            PacketRepr::Notify(_) => PacketType::Notify,
            PacketRepr::NackLib(_) => PacketType::NackLib,
            PacketRepr::NackMcp(_) => PacketType::NackMcp,
        }
    }

    /// Reads the packet that starts at `buf[0]` (the byte after the head).
    /// Types MX reserves but Open-MX never carries are refused as invalid.
    pub fn parse(buf: &'a [u8]) -> Result<Self> {
        let byte = buf
            .first()
            .copied()
            .ok_or(Error::Truncated { needed: 1, have: 0 })?;
        Ok(match PacketType::try_from(byte)? {
            PacketType::Raw => PacketRepr::Raw(RawRepr::parse(&RawPacket::new_checked(buf)?)?),
            PacketType::HostQuery => {
                PacketRepr::HostQuery(HostQueryRepr::parse(&HostQueryPacket::new_checked(buf)?)?)
            }
            PacketType::HostReply => {
                PacketRepr::HostReply(HostReplyRepr::parse(&HostReplyPacket::new_checked(buf)?)?)
            }
            PacketType::Truc => PacketRepr::Truc(TrucRepr::parse(&TrucPacket::new_checked(buf)?)?),
            PacketType::Connect => {
                PacketRepr::Connect(ConnectRepr::parse(&ConnectPacket::new_checked(buf)?)?)
            }
            PacketType::Tiny => PacketRepr::Tiny(TinyRepr::parse(&MsgPacket::new_checked(buf)?)?),
            PacketType::Small => {
                PacketRepr::Small(SmallRepr::parse(&MsgPacket::new_checked(buf)?)?)
            }
            PacketType::Medium => {
                PacketRepr::Medium(MediumRepr::parse(&MediumPacket::new_checked(buf)?)?)
            }
            PacketType::Rndv => PacketRepr::Rndv(RndvRepr::parse(&RndvPacket::new_checked(buf)?)?),
            PacketType::Pull => PacketRepr::Pull(PullRepr::parse(&PullPacket::new_checked(buf)?)?),
            PacketType::PullReply => {
                PacketRepr::PullReply(PullReplyRepr::parse(&PullReplyPacket::new_checked(buf)?)?)
            }
            PacketType::Notify => {
                PacketRepr::Notify(NotifyRepr::parse(&NotifyPacket::new_checked(buf)?)?)
            }
            PacketType::NackLib => {
                PacketRepr::NackLib(NackLibRepr::parse(&NackLibPacket::new_checked(buf)?)?)
            }
            PacketType::NackMcp => {
                PacketRepr::NackMcp(NackMcpRepr::parse(&NackMcpPacket::new_checked(buf)?)?)
            }
            PacketType::None
            | PacketType::MfmNicReply
            | PacketType::EtherUnicast
            | PacketType::EtherMulticast
            | PacketType::EtherNative => {
                return Err(Error::Invalid {
                    field: "ptype",
                    reason: "reserved type not carried in MX wire-compatible mode",
                })
            }
        })
    }

    /// Bytes the packet occupies (head excluded).
    pub const fn buffer_len(&self) -> usize {
        match self {
            PacketRepr::Raw(r) => r.buffer_len(),
            PacketRepr::HostQuery(r) => r.buffer_len(),
            PacketRepr::HostReply(r) => r.buffer_len(),
            PacketRepr::Truc(r) => r.buffer_len(),
            PacketRepr::Connect(r) => r.buffer_len(),
            PacketRepr::Tiny(r) => r.buffer_len(),
            PacketRepr::Small(r) => r.buffer_len(),
            PacketRepr::Medium(r) => r.buffer_len(),
            PacketRepr::Rndv(r) => r.buffer_len(),
            PacketRepr::Pull(r) => r.buffer_len(),
            PacketRepr::PullReply(r) => r.buffer_len(),
            PacketRepr::Notify(r) => r.buffer_len(),
            PacketRepr::NackLib(r) => r.buffer_len(),
            PacketRepr::NackMcp(r) => r.buffer_len(),
        }
    }

    /// Writes the packet at `buf[0]`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        match self {
            PacketRepr::Raw(r) => r.emit(&mut RawPacket::new_unchecked(buf)),
            PacketRepr::HostQuery(r) => r.emit(&mut HostQueryPacket::new_unchecked(buf)),
            PacketRepr::HostReply(r) => r.emit(&mut HostReplyPacket::new_unchecked(buf)),
            PacketRepr::Truc(r) => r.emit(&mut TrucPacket::new_unchecked(buf)),
            PacketRepr::Connect(r) => r.emit(&mut ConnectPacket::new_unchecked(buf)),
            PacketRepr::Tiny(r) => r.emit(&mut MsgPacket::new_unchecked(buf)),
            PacketRepr::Small(r) => r.emit(&mut MsgPacket::new_unchecked(buf)),
            PacketRepr::Medium(r) => r.emit(&mut MediumPacket::new_unchecked(buf)),
            PacketRepr::Rndv(r) => r.emit(&mut RndvPacket::new_unchecked(buf)),
            PacketRepr::Pull(r) => r.emit(&mut PullPacket::new_unchecked(buf)),
            PacketRepr::PullReply(r) => r.emit(&mut PullReplyPacket::new_unchecked(buf)),
            PacketRepr::Notify(r) => r.emit(&mut NotifyPacket::new_unchecked(buf)),
            PacketRepr::NackLib(r) => r.emit(&mut NackLibPacket::new_unchecked(buf)),
            PacketRepr::NackMcp(r) => r.emit(&mut NackMcpPacket::new_unchecked(buf)),
        }
    }
}

/// A whole MXoE frame: head and packet. Bytes past the packet (Ethernet
/// padding) are ignored by `parse` and not written by `emit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameRepr<'a> {
    /// Ethernet addresses and peer index.
    pub head: HeadRepr,
    /// The typed packet.
    pub packet: PacketRepr<'a>,
}

impl<'a> FrameRepr<'a> {
    /// Reads a frame from its first byte (the destination MAC). Length errors
    /// count bytes from the start of the frame.
    pub fn parse(frame: &'a [u8]) -> Result<Self> {
        let head = HeadRepr::parse(&HeadPacket::new_checked(frame)?)?;
        let body = frame.get(HEAD_LEN..).unwrap_or(&[]);
        let packet = PacketRepr::parse(body).map_err(at_head)?;
        Ok(Self { head, packet })
    }

    /// Bytes the frame occupies, without Ethernet padding.
    pub const fn buffer_len(&self) -> usize {
        HEAD_LEN + self.packet.buffer_len()
    }

    /// Bytes the frame occupies on the wire once padded to the Ethernet minimum.
    pub const fn wire_len(&self) -> usize {
        let len = self.buffer_len();
        if len < ETH_FRAME_LEN_MIN {
            ETH_FRAME_LEN_MIN
        } else {
            len
        }
    }

    /// Writes the frame at the start of `buf` and returns its length
    /// ([`Self::buffer_len`]); the rest of `buf` is left untouched.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let len = self.buffer_len();
        if buf.len() < len {
            return Err(Error::BufferTooSmall {
                needed: len,
                have: buf.len(),
            });
        }
        self.head.emit(&mut HeadPacket::new_unchecked(&mut *buf))?;
        let body = buf.get_mut(HEAD_LEN..len).unwrap_or(&mut []);
        self.packet.emit(body).map_err(at_head)?;
        Ok(len)
    }

    /// The frame as a new vector of [`Self::buffer_len`] bytes.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut buf = vec![0; self.buffer_len()];
        self.emit(&mut buf)?;
        Ok(buf)
    }
}

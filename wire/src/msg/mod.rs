//! The xmx messages carried in the split-driver rings.
//!
//! Three rings, each a [`crate::ring`] ring of fixed-size slots:
//!
//! | ring | front half (requests) | back half | slot |
//! |------|-----------------------|-----------|------|
//! | control | guest daemon: [`CtrlRequest`] | backend: [`CtrlResponse`] | [`CTRL_SLOT_SIZE`] B |
//! | endpoint send | application: [`SendRequest`] | backend: `()` | [`SEND_SLOT_SIZE`] B |
//! | endpoint event | backend: [`Event`] | application: `()` | [`EVENT_SLOT_SIZE`] B |
//!
//! The send and event rings are one-way: the consumer answers with the empty response `()`,
//! which only hands the slot back. Completions travel as events ([`EventBody::SendDone`],
//! [`EventBody::PullDone`], [`EventBody::Error`]) carrying the tag of the request.
//!
//! # Encoding
//!
//! Both ends of a ring run on the same host, so multi-byte fields are **little-endian**
//! (unlike the MXoE wire, which is big-endian). Every slot starts with the same 8-byte header:
//!
//! ```text
//! 0  u8   kind       message kind; the kind spaces of the rings do not overlap
//! 1  u8   version    PROTOCOL_VERSION
//! 2  u16  reserved   zero
//! 4  u32  tag        chosen by the requester; echoed by the response or completion
//! ```
//!
//! followed by the kind's fields at the offsets documented on each type. Reserved bytes and
//! the unused tail of a slot are written as zero and ignored when parsing. Parsing refuses a
//! short buffer ([`crate::Error::Truncated`]), another protocol version or an unknown kind
//! ([`crate::Error::Unknown`]) and any field out of range ([`crate::Error::Invalid`]), so a
//! parsed value is always one that `emit` accepts.

/// A fieldless enum carried as an integer, with `TryFrom` refusing unknown values.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident : $repr:ty as $what:literal {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr($repr)]
        pub enum $name {
            $( $(#[$vmeta])* $variant = $value ),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
        }

        impl TryFrom<$repr> for $name {
            type Error = crate::Error;
            fn try_from(value: $repr) -> crate::Result<Self> {
                $( if value == $value { return Ok($name::$variant); } )+
                Err(crate::Error::Unknown { what: $what, value: value.into() })
            }
        }

        impl From<$name> for $repr {
            fn from(value: $name) -> $repr {
                value as $repr
            }
        }
    };
}

mod ctrl;
mod event;
mod info;
mod send;

pub use ctrl::{
    CtrlKind, CtrlOp, CtrlReply, CtrlRequest, CtrlResponse, CtrlStatus, EndpointOpen,
    EndpointPages, RegionRegister, CTRL_SLOT_SIZE, ENDPOINT_RING_PAGES_MAX, REGION_INFO_REFS_MAX,
    REGION_PAGES_MAX,
};
pub use event::{
    DoneStatus, ErrorCode, Event, EventBody, EventKind, NackKind, RecvMedium, EVENT_SLOT_SIZE,
};
pub use info::{
    info_pages_for, pack_info_page, pack_info_pages, unpack_info_page, unpack_info_pages,
    INFO_PAGE_REFS, INFO_PAGE_SIZE,
};
pub use send::{
    fill_marks, medium_frags, DirectRegister, InlineMsg, LibackSend, MediumSend, NotifySend, Pull,
    QueueSlots, RingConnectReply, RingConnectRequest, RndvSend, SendKind, SendOp, SendRequest,
    KEPT_WINDOW_PAGES, SEND_SLOT_SIZE,
};

use crate::ring::{BackRing, FrontRing};
use crate::{Error, Result};

/// Version of the message formats in this module; carried in every slot and published in
/// xenstore by both ends.
pub const PROTOCOL_VERSION: u8 = 1;
/// Length of the common slot header.
pub const HEADER_LEN: usize = 8;

/// A grant reference, as carried in messages and info pages.
pub type GrantRef = u32;

// The MX size limits are MXoE's (one definition, in `mxoe`), under the names the ring
// messages use: SMALL_MAX is also the inline capacity of a slot, MEDIUM_FRAG_MAX the size of
// a send- or receive-queue slot.
pub use crate::mxoe::{
    MEDIUM_FRAG_LEN_MAX as MEDIUM_FRAG_MAX, MEDIUM_MSG_LEN_MAX as MEDIUM_MAX,
    SMALL_MSG_LEN_MAX as SMALL_MAX, TINY_MSG_LEN_MAX as TINY_MAX,
};
/// A MEDIUM message has at most this many fragments.
pub const MEDIUM_FRAGS_MAX: usize = MEDIUM_MAX / MEDIUM_FRAG_MAX;

/// Control ring as seen by the guest daemon.
pub type CtrlFront = FrontRing<CtrlRequest, CtrlResponse>;
/// Control ring as seen by the backend.
pub type CtrlBack = BackRing<CtrlRequest, CtrlResponse>;
/// Endpoint send ring as seen by the application (producer).
pub type SendFront = FrontRing<SendRequest, ()>;
/// Endpoint send ring as seen by the backend (consumer).
pub type SendBack = BackRing<SendRequest, ()>;
/// Endpoint event ring as seen by the backend (producer).
pub type EventFront = FrontRing<Event, ()>;
/// Endpoint event ring as seen by the application (consumer).
pub type EventBack = BackRing<Event, ()>;

/// Where an MX message goes or comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Route {
    /// Index of the remote NIC in the peer table.
    pub peer_index: u16,
    /// Remote endpoint index.
    pub endpoint: u8,
    /// Session id of the remote endpoint, learnt when connecting (0 where not yet known).
    pub session_id: u32,
}

/// The MX fields every message packet carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MsgInfo {
    /// Library sequence number of the message.
    pub seqnum: u16,
    /// Piggybacked acknowledgement.
    pub piggyack: u16,
    /// 64-bit match information.
    pub match_info: u64,
}

/// Up to [`SMALL_MAX`] bytes carried inside a slot.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct InlineData {
    len: u8,
    // Invariant: bytes past `len` are zero, so derived equality compares contents only.
    bytes: [u8; SMALL_MAX],
}

impl InlineData {
    /// Copy `data`; `Invalid` if longer than [`SMALL_MAX`].
    pub fn new(data: &[u8]) -> Result<Self> {
        if data.len() > SMALL_MAX {
            return Err(Error::Invalid {
                field: "inline data",
                reason: "longer than 128 bytes",
            });
        }
        let mut bytes = [0u8; SMALL_MAX];
        bytes[..data.len()].copy_from_slice(data);
        Ok(InlineData {
            len: data.len() as u8,
            bytes,
        })
    }

    /// The carried bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// Number of bytes carried.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// True if no byte is carried.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Default for InlineData {
    fn default() -> Self {
        InlineData {
            len: 0,
            bytes: [0; SMALL_MAX],
        }
    }
}

impl std::fmt::Debug for InlineData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InlineData({:02x?})", self.as_slice())
    }
}

/// Little-endian field access at fixed offsets of a buffer whose length was checked against
/// the slot size first; every offset used is below that size.
pub(crate) mod field {
    pub fn u8(b: &[u8], off: usize) -> u8 {
        b[off]
    }
    pub fn u16(b: &[u8], off: usize) -> u16 {
        u16::from_le_bytes([b[off], b[off + 1]])
    }
    pub fn u32(b: &[u8], off: usize) -> u32 {
        u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
    }
    pub fn u64(b: &[u8], off: usize) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[off..off + 8]);
        u64::from_le_bytes(w)
    }
    pub fn set_u8(b: &mut [u8], off: usize, v: u8) {
        b[off] = v;
    }
    pub fn set_u16(b: &mut [u8], off: usize, v: u16) {
        b[off..off + 2].copy_from_slice(&v.to_le_bytes());
    }
    pub fn set_u32(b: &mut [u8], off: usize, v: u32) {
        b[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }
    pub fn set_u64(b: &mut [u8], off: usize, v: u64) {
        b[off..off + 8].copy_from_slice(&v.to_le_bytes());
    }
}

/// Header offsets.
const KIND: usize = 0;
const VERSION: usize = 1;
const TAG: usize = 4;

/// Check length and version of a slot of `size` bytes; return its kind byte and tag.
pub(crate) fn parse_header(buf: &[u8], size: usize) -> Result<(u8, u32)> {
    if buf.len() < size {
        return Err(Error::Truncated {
            needed: size,
            have: buf.len(),
        });
    }
    let version = field::u8(buf, VERSION);
    if version != PROTOCOL_VERSION {
        return Err(Error::Unknown {
            what: "protocol version",
            value: version.into(),
        });
    }
    Ok((field::u8(buf, KIND), field::u32(buf, TAG)))
}

/// Zero a slot of `size` bytes and write the header; the slot must be checked first.
pub(crate) fn emit_header(buf: &mut [u8], size: usize, kind: u8, tag: u32) -> Result<()> {
    if buf.len() < size {
        return Err(Error::BufferTooSmall {
            needed: size,
            have: buf.len(),
        });
    }
    buf[..size].fill(0);
    field::set_u8(buf, KIND, kind);
    field::set_u8(buf, VERSION, PROTOCOL_VERSION);
    field::set_u32(buf, TAG, tag);
    Ok(())
}

/// Read `len` inline bytes at `off`, refusing more than `max`.
pub(crate) fn parse_inline(
    buf: &[u8],
    off: usize,
    len: usize,
    max: usize,
    what: &'static str,
) -> Result<InlineData> {
    if len > max {
        return Err(Error::Invalid {
            field: what,
            reason: "length beyond the inline capacity",
        });
    }
    InlineData::new(&buf[off..off + len])
}

/// Read a 0/1 flag.
pub(crate) fn parse_bool(buf: &[u8], off: usize, what: &'static str) -> Result<bool> {
    match field::u8(buf, off) {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(Error::Invalid {
            field: what,
            reason: "not 0 or 1",
        }),
    }
}

//! MXoE frames, as Open-MX sends them in MX wire-compatible mode.
//!
//! A frame is a 16-byte head (Ethernet header with ethertype 0x86DF, then the
//! sender's peer index) followed by one packet whose first byte is its
//! [`PacketType`]. Every multi-byte field is big-endian; every layout, pad
//! and offset follows the packed C structures MX and Open-MX put on the wire
//! (each module's `field` constants give them).
//!
//! Each packet type has a zero-copy view (`XxxPacket<T: AsRef<[u8]>>`, whose
//! `new_checked` bounds the buffer once so no accessor can leave it) and an
//! owned representation (`XxxRepr`, whose `parse` validates the packet's
//! semantics and whose `emit` writes it back byte for byte). [`FrameRepr`]
//! parses and emits a whole frame.
//!
//! ```
//! use xmx_wire::mxoe::{FrameRepr, HeadRepr, Mac, MsgHeader, PacketRepr, TinyRepr};
//!
//! let frame = FrameRepr {
//!     head: HeadRepr {
//!         dst: "02:00:00:00:00:02".parse()?,
//!         src: "02:00:00:00:00:01".parse()?,
//!         dst_src_peer_index: 7,
//!     },
//!     packet: PacketRepr::Tiny(TinyRepr {
//!         header: MsgHeader { dst_endpoint: 1, match_info: 0xfeed, ..Default::default() },
//!         data: b"hello",
//!     }),
//! };
//! let bytes = frame.to_vec()?;
//! assert_eq!(bytes.len(), 16 + 24 + 5);
//! assert_eq!(FrameRepr::parse(&bytes)?, frame);
//! # Ok::<(), xmx_wire::Error>(())
//! ```

mod access;
pub mod connect;
mod frame;
pub mod head;
pub mod host;
mod mac;
pub mod medium;
pub mod msg;
pub mod nack;
pub mod notify;
pub mod pull;
pub mod raw;
pub mod rndv;
pub mod truc;
mod types;
pub mod units_mark;

pub use connect::{ConnectData, ConnectPacket, ConnectReplyData, ConnectRepr, ConnectRequestData};
pub use frame::{FrameRepr, PacketRepr};
pub use head::{HeadPacket, HeadRepr};
pub use host::{HostQueryPacket, HostQueryRepr, HostReplyPacket, HostReplyRepr};
pub use mac::Mac;
pub use medium::{MediumPacket, MediumRepr};
pub use msg::{MsgHeader, MsgPacket, SmallPacket, SmallRepr, TinyPacket, TinyRepr};
pub use nack::{NackLibPacket, NackLibRepr, NackMcpPacket, NackMcpRepr};
pub use notify::{NotifyPacket, NotifyRepr};
pub use pull::{PullPacket, PullReplyPacket, PullReplyRepr, PullRepr};
pub use raw::{RawPacket, RawRepr, RAW_PAYLOAD_LEN_MAX};
pub use rndv::{RndvPacket, RndvRepr};
pub use truc::{LibAck, TrucPacket, TrucRepr};
pub use types::{ConnectStatus, MessageClass, NackType, PacketType, TrucDataType};

/// Ethertype of MXoE frames.
pub const ETHERTYPE: u16 = 0x86DF;
/// Length of the Ethernet header (two MACs and the ethertype).
pub const ETH_HEADER_LEN: usize = 14;
/// Length of the frame head: the Ethernet header and the 16-bit peer index.
pub const HEAD_LEN: usize = head::field::LEN;
/// Shortest Ethernet frame without FCS; shorter frames are padded to it.
pub const ETH_FRAME_LEN_MIN: usize = 60;

/// Length of a HOST_QUERY packet.
pub const HOST_QUERY_LEN: usize = host::field::LEN;
/// Length of a HOST_REPLY packet before its hostname.
pub const HOST_REPLY_LEN: usize = host::field::LEN;
/// Length of a TRUC packet.
pub const TRUC_LEN: usize = truc::field::LEN;
/// Length of the lib ack data in a TRUC packet.
pub const TRUC_LIBACK_DATA_LEN: usize = truc::field::LIBACK_DATA_LEN;
/// Type byte of a TRUC lib ack.
pub const TRUC_DATA_TYPE_ACK: u8 = TrucDataType::LibAck as u8;
/// Length of a CONNECT packet.
pub const CONNECT_LEN: usize = connect::field::LEN;
/// Length of the connect data (request or reply).
pub const CONNECT_DATA_LEN: usize = connect::field::DATA_LEN;
/// Length of the TINY/SMALL message header.
pub const MSG_LEN: usize = msg::field::LEN;
/// Length of the MEDIUM fragment header.
pub const MEDIUM_LEN: usize = medium::field::LEN;
/// Length of a RNDV packet.
pub const RNDV_LEN: usize = rndv::field::LEN;
/// Length of the rendezvous data after the RNDV message header.
pub const RNDV_DATA_LEN: usize = rndv::field::DATA_LEN;
/// Length of a PULL packet.
pub const PULL_LEN: usize = pull::field::LEN;
/// Length of the PULL_REPLY header.
pub const PULL_REPLY_LEN: usize = pull::reply_field::LEN;
/// Length of a NOTIFY packet.
pub const NOTIFY_LEN: usize = notify::field::LEN;
/// Length of a NACK_LIB packet.
pub const NACK_LIB_LEN: usize = nack::lib_field::LEN;
/// Length of a NACK_MCP packet.
pub const NACK_MCP_LEN: usize = nack::mcp_field::LEN;

/// Longest TINY message.
pub const TINY_MSG_LEN_MAX: usize = 32;
/// Longest SMALL message.
pub const SMALL_MSG_LEN_MAX: usize = 128;
/// Longest MEDIUM message (MX's limit, 32 KiB).
pub const MEDIUM_MSG_LEN_MAX: usize = 32 * 1024;
/// Longest MEDIUM fragment.
pub const MEDIUM_FRAG_LEN_MAX: usize = 4096;
/// log2 of [`MEDIUM_FRAG_LEN_MAX`]: fragment `n` starts at `n << 12`.
pub const MEDIUM_FRAG_LEN_SHIFT: u32 = 12;
/// The widest fragment stride (log2) xmx sends a board that allows it
/// ([`units_mark`]): one fragment for a whole 32 KiB message.
pub const MEDIUM_FRAG_LEN_SHIFT_MAX: u32 = 15;
/// Fragments in the longest MEDIUM message.
pub const MEDIUM_FRAGS_MAX: usize = MEDIUM_MSG_LEN_MAX / MEDIUM_FRAG_LEN_MAX;
/// Longest PULL_REPLY payload.
pub const PULL_REPLY_LEN_MAX: usize = 4096;
/// PULL_REPLY frames per pulled block.
pub const PULL_REPLIES_PER_BLOCK: usize = 8;
/// Longest pulled block.
pub const PULL_BLOCK_LEN_MAX: usize = PULL_REPLY_LEN_MAX * PULL_REPLIES_PER_BLOCK;

/// Longest MXoE frame (a full MEDIUM fragment), Ethernet header included.
pub const FRAME_LEN_MAX: usize = HEAD_LEN
    + max(
        MEDIUM_LEN + MEDIUM_FRAG_LEN_MAX,
        PULL_REPLY_LEN + PULL_REPLY_LEN_MAX,
    );
/// The interface MTU that frame needs (the MTU excludes the Ethernet header).
pub const MTU_MIN: usize = FRAME_LEN_MAX - ETH_HEADER_LEN;
/// Longest RAW frame a receiver accepts.
pub const RAW_FRAME_LEN_MAX: usize = 1024;

/// Endpoints per NIC (endpoint indices are one byte).
pub const ENDPOINTS_PER_NIC: usize = 256;
/// Peers in a peer table (peer indices are 16 bits).
pub const PEERS_MAX: usize = 65536;
/// Magic of HOST_QUERY, echoed by HOST_REPLY.
pub const HOST_QUERY_MAGIC: u32 = 0x1305_2008;
/// Longest hostname carried by HOST_REPLY, NUL included.
pub const HOSTNAME_LEN_MAX: usize = 80;

const fn max(a: usize, b: usize) -> usize {
    if a > b {
        a
    } else {
        b
    }
}

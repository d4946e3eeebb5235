//! Endpoint send ring messages: what an application asks its backend to put on the wire.
//!
//! Slots are [`SEND_SLOT_SIZE`] bytes: 16 slots in a one-page ring, 64 in four pages. Every
//! request names its destination after the common header, then its kind's fields:
//!
//! ```text
//!  8 u16 peer index      TINY 0x10 / SMALL 0x11     MEDIUM 0x12             RNDV 0x13
//! 10 u8  dest endpoint   16 u16 seqnum              16..32 as TINY          16..32 as TINY
//! 11 u8  reserved        18 u16 piggyack            32 u8  fragments        32 u8  region id
//! 12 u32 dest session    20 u32 length (<=32/128)   36 u16 x 8: send-queue  33 u8  region seqnum
//!                        24 u64 match info                 slot indices     36 u32 region offset
//!                        32 ..  data
//!
//! CONNECT_REQUEST 0x14     CONNECT_REPLY 0x15       NOTIFY 0x16            LIBACK 0x17
//! 16 u16 seqnum            16 u16 seqnum            16 u16 seqnum          16 u16 lib seqnum
//! 18 u16 recv seqnum start 18 u16 recv seqnum start 18 u16 piggyack        18 u16 send seq
//! 20 u32 application key   20 u8  connect seqnum    20 u32 total length    20 u32 acknum
//! 24 u8  connect seqnum    21 u8  status            24 u8  region id       24 u8  resent (0/1)
//!                                                   25 u8  region seqnum
//! PULL 0x18
//! 16 u32 length            21 u8 remote region id   24 u32 local offset
//! 20 u8  local region id   22 u8 remote region seqnum  28 u32 remote offset
//!
//! REGISTER 0x19                          DEREGISTER 0x1a
//! 16 u8  region id                       16 u8 region id
//! 17 u8  info refs (1 to 24)
//! 20 u32 length (the region starts at the first page's byte 0)
//! 24 u32 x n: grant refs of the info pages listing the region's pages
//! ```
//!
//! REGISTER and DEREGISTER carry no destination (the route is zero). They let an application
//! register the pages it granted itself (Xen2MX's way: no daemon on the path of a
//! registration); the backend maps the pages the info pages list in one batch before it takes
//! the next request of the ring, so a RNDV or PULL posted after a REGISTER finds the region.
//!
//! MEDIUM data sits in the endpoint's send queue, one 4096-byte fragment per queue slot; the
//! request lists the slots in fragment order. The backend answers every request with a
//! SEND_DONE or PULL_DONE event carrying the request's tag, or an ERROR event.
//!
//! # Fill marks
//!
//! The ring page's private area (ring.h's padding after the indices) holds one bit per region
//! id, written by the application only ([`fill_marks`]). A set bit says the region holds the
//! data of the LARGE send it is lent to, and the backend answers a peer's PULL of a region
//! only then: an application may lend a send's data to a co-located peer over a direct
//! channel without copying it into the region, and fills the region only if the backend is
//! asked for it (a REGION_WANTED event). The backend reads the bit before it reads the region
//! (acquire); the application fills, then sets it (release). A ring whose page the backend
//! maps starts with every mark clear: after a reconnection nothing is served from a region
//! until the application has said again what it holds.

use super::field::{set_u16, set_u32, set_u64, set_u8, u16, u32, u64, u8};
use super::{
    emit_header, info_pages_for, parse_bool, parse_header, parse_inline, InlineData, MsgInfo,
    Route, MEDIUM_FRAGS_MAX, MEDIUM_FRAG_MAX, MEDIUM_MAX, REGION_INFO_REFS_MAX, REGION_PAGES_MAX,
    SMALL_MAX, TINY_MAX,
};
use crate::{Error, Result};

/// Where the fill marks lie in the send ring's first page, and which bit is a region's.
pub mod fill_marks {
    use std::sync::atomic::Ordering;

    use crate::ring::SharedMem;

    /// Byte offset of the first mark word in the ring page.
    pub const OFFSET: usize = crate::ring::layout::PAD;
    /// 32-bit words of marks (256 region ids); native-endian, like the ring indices.
    pub const WORDS: usize = 8;
    /// Bytes of marks.
    pub const LEN: usize = WORDS * 4;

    /// The index of the word holding `region`'s mark.
    pub const fn word(region: u8) -> usize {
        region as usize / 32
    }

    /// `region`'s bit in its word.
    pub const fn bit(region: u8) -> u32 {
        1 << (region % 32)
    }

    /// Sets or clears `region`'s mark in `ring`, the send ring's memory. The application,
    /// the marks' only writer, calls it after the region holds the data of the send it is
    /// lent to: the store is a release, so a backend that sees the mark sees the data.
    pub fn write(ring: &SharedMem, region: u8, filled: bool) {
        let at = OFFSET + word(region) * 4;
        // A read-modify-write that races with nobody but a backend's reads.
        let old = ring.load_u32(at, Ordering::Relaxed).unwrap_or(0);
        let new = if filled {
            old | bit(region)
        } else {
            old & !bit(region)
        };
        ring.store_u32(at, new, Ordering::Release);
    }
}

/// Size of an endpoint send ring slot.
pub const SEND_SLOT_SIZE: usize = 192;

wire_enum! {
    /// Request kinds of the endpoint send ring.
    pub enum SendKind: u8 as "send request kind" {
        /// Send a TINY message.
        Tiny = 0x10,
        /// Send a SMALL message.
        Small = 0x11,
        /// Send a MEDIUM message from the send queue.
        Medium = 0x12,
        /// Announce a LARGE message.
        Rndv = 0x13,
        /// Send an MX connect request.
        ConnectRequest = 0x14,
        /// Answer an MX connect request.
        ConnectReply = 0x15,
        /// Tell a LARGE message's sender that its data was pulled.
        Notify = 0x16,
        /// Send an explicit library acknowledgement.
        Liback = 0x17,
        /// Pull a LARGE message's data.
        Pull = 0x18,
        /// Register a region the application granted itself.
        Register = 0x19,
        /// Deregister such a region.
        Deregister = 0x1a,
    }
}

/// Offsets shared by the send and event rings.
pub(crate) mod off {
    pub const PEER_INDEX: usize = 8;
    pub const ENDPOINT: usize = 10;
    pub const SESSION_ID: usize = 12;
    pub const SEQNUM: usize = 16;
    pub const PIGGYACK: usize = 18;
    pub const LENGTH: usize = 20;
    pub const MATCH_INFO: usize = 24;
    pub const DATA: usize = 32;
    pub const NR_FRAGS: usize = 32;
    pub const QUEUE_SLOTS: usize = 36;
    pub const REGION_ID: usize = 32;
    pub const REGION_SEQNUM: usize = 33;
    pub const REGION_OFFSET: usize = 36;
    pub const CONNECT_RECV_SEQNUM_START: usize = 18;
    pub const CONNECT_APP_KEY: usize = 20;
    pub const CONNECT_REQUEST_SEQNUM: usize = 24;
    pub const CONNECT_REPLY_SEQNUM: usize = 20;
    pub const CONNECT_STATUS: usize = 21;
    pub const NOTIFY_REGION_ID: usize = 24;
    pub const NOTIFY_REGION_SEQNUM: usize = 25;
    pub const LIBACK_SEND_SEQ: usize = 18;
    pub const LIBACK_ACKNUM: usize = 20;
    pub const LIBACK_RESENT: usize = 24;
    pub const PULL_LENGTH: usize = 16;
    pub const PULL_LOCAL_REGION: usize = 20;
    pub const PULL_REMOTE_REGION: usize = 21;
    pub const PULL_REMOTE_SEQNUM: usize = 22;
    pub const PULL_LOCAL_OFFSET: usize = 24;
    pub const PULL_REMOTE_OFFSET: usize = 28;
    pub const REGISTER_REGION: usize = 16;
    pub const REGISTER_NR_INFO: usize = 17;
    pub const REGISTER_LENGTH: usize = 20;
    pub const REGISTER_INFO_REFS: usize = 24;
}

impl Route {
    pub(crate) fn read(buf: &[u8]) -> Self {
        Route {
            peer_index: u16(buf, off::PEER_INDEX),
            endpoint: u8(buf, off::ENDPOINT),
            session_id: u32(buf, off::SESSION_ID),
        }
    }
    pub(crate) fn write(&self, buf: &mut [u8]) {
        set_u16(buf, off::PEER_INDEX, self.peer_index);
        set_u8(buf, off::ENDPOINT, self.endpoint);
        set_u32(buf, off::SESSION_ID, self.session_id);
    }
}

impl MsgInfo {
    pub(crate) fn read(buf: &[u8]) -> Self {
        MsgInfo {
            seqnum: u16(buf, off::SEQNUM),
            piggyack: u16(buf, off::PIGGYACK),
            match_info: u64(buf, off::MATCH_INFO),
        }
    }
    pub(crate) fn write(&self, buf: &mut [u8]) {
        set_u16(buf, off::SEQNUM, self.seqnum);
        set_u16(buf, off::PIGGYACK, self.piggyack);
        set_u64(buf, off::MATCH_INFO, self.match_info);
    }
}

/// A TINY or SMALL message with its data inline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InlineMsg {
    /// MX header fields.
    pub info: MsgInfo,
    /// The message (at most 32 bytes for TINY, 128 for SMALL).
    pub data: InlineData,
}

impl InlineMsg {
    pub(crate) fn read(buf: &[u8], max: usize, what: &'static str) -> Result<Self> {
        let len = u32(buf, off::LENGTH) as usize;
        Ok(InlineMsg {
            info: MsgInfo::read(buf),
            data: parse_inline(buf, off::DATA, len, max, what)?,
        })
    }
    pub(crate) fn write(&self, buf: &mut [u8], max: usize, what: &'static str) -> Result<()> {
        if self.data.len() > max {
            return Err(Error::Invalid {
                field: what,
                reason: "length beyond the inline capacity",
            });
        }
        self.info.write(buf);
        set_u32(buf, off::LENGTH, self.data.len() as u32);
        buf[off::DATA..off::DATA + self.data.len()].copy_from_slice(self.data.as_slice());
        Ok(())
    }
}

/// Send- or receive-queue slot indices of a MEDIUM message's fragments (1 to 8).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct QueueSlots {
    len: u8,
    // Invariant: entries past `len` are zero.
    slots: [u16; MEDIUM_FRAGS_MAX],
}

impl QueueSlots {
    /// Take 1 to 8 slot indices.
    pub fn new(slots: &[u16]) -> Result<Self> {
        if slots.is_empty() || slots.len() > MEDIUM_FRAGS_MAX {
            return Err(Error::Invalid {
                field: "medium fragments",
                reason: "not 1 to 8",
            });
        }
        let mut all = [0u16; MEDIUM_FRAGS_MAX];
        all[..slots.len()].copy_from_slice(slots);
        Ok(QueueSlots {
            len: slots.len() as u8,
            slots: all,
        })
    }

    /// The slot indices in fragment order.
    pub fn as_slice(&self) -> &[u16] {
        &self.slots[..self.len as usize]
    }

    /// Number of fragments.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Never true: a MEDIUM message has at least one fragment.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for QueueSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

/// Fragments a MEDIUM message of `length` bytes occupies.
pub const fn medium_frags(length: u32) -> usize {
    let n = (length as usize).div_ceil(MEDIUM_FRAG_MAX);
    if n == 0 {
        1
    } else {
        n
    }
}

/// A MEDIUM message whose data is in the send queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MediumSend {
    /// MX header fields.
    pub info: MsgInfo,
    /// Total length (at most 32 KiB).
    pub length: u32,
    /// Send-queue slots holding the fragments, one per 4096 bytes.
    pub sendq_slots: QueueSlots,
}

impl MediumSend {
    fn validate(&self) -> Result<()> {
        if self.length as usize > MEDIUM_MAX {
            return Err(Error::Invalid {
                field: "medium length",
                reason: "beyond 32 KiB",
            });
        }
        if self.sendq_slots.len() != medium_frags(self.length) {
            return Err(Error::Invalid {
                field: "medium fragments",
                reason: "count does not match the length",
            });
        }
        Ok(())
    }
    fn read(buf: &[u8]) -> Result<Self> {
        let nr = u8(buf, off::NR_FRAGS) as usize;
        if nr == 0 || nr > MEDIUM_FRAGS_MAX {
            return Err(Error::Invalid {
                field: "medium fragments",
                reason: "not 1 to 8",
            });
        }
        let mut slots = [0u16; MEDIUM_FRAGS_MAX];
        for (i, s) in slots.iter_mut().enumerate().take(nr) {
            *s = u16(buf, off::QUEUE_SLOTS + 2 * i);
        }
        let medium = MediumSend {
            info: MsgInfo::read(buf),
            length: u32(buf, off::LENGTH),
            sendq_slots: QueueSlots::new(&slots[..nr])?,
        };
        medium.validate()?;
        Ok(medium)
    }
    fn write(&self, buf: &mut [u8]) -> Result<()> {
        self.validate()?;
        self.info.write(buf);
        set_u32(buf, off::LENGTH, self.length);
        set_u8(buf, off::NR_FRAGS, self.sendq_slots.len() as u8);
        for (i, s) in self.sendq_slots.as_slice().iter().enumerate() {
            set_u16(buf, off::QUEUE_SLOTS + 2 * i, *s);
        }
        Ok(())
    }
}

/// A LARGE message announced by rendezvous: the receiver pulls it from a registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RndvSend {
    /// MX header fields.
    pub info: MsgInfo,
    /// Message length.
    pub length: u32,
    /// Region holding the data, on the sender.
    pub region_id: u8,
    /// Registration generation of that region (MX's rdma seqnum).
    pub region_seqnum: u8,
    /// Offset of the message within the region.
    pub region_offset: u32,
}

impl RndvSend {
    pub(crate) fn read(buf: &[u8]) -> Self {
        RndvSend {
            info: MsgInfo::read(buf),
            length: u32(buf, off::LENGTH),
            region_id: u8(buf, off::REGION_ID),
            region_seqnum: u8(buf, off::REGION_SEQNUM),
            region_offset: u32(buf, off::REGION_OFFSET),
        }
    }
    pub(crate) fn write(&self, buf: &mut [u8]) {
        self.info.write(buf);
        set_u32(buf, off::LENGTH, self.length);
        set_u8(buf, off::REGION_ID, self.region_id);
        set_u8(buf, off::REGION_SEQNUM, self.region_seqnum);
        set_u32(buf, off::REGION_OFFSET, self.region_offset);
    }
}

/// MX connect request fields (the sender's session is added by the backend).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RingConnectRequest {
    /// Library sequence number of the connect packet.
    pub seqnum: u16,
    /// Next sequence number the sender expects to receive.
    pub target_recv_seqnum_start: u16,
    /// Application key the target must match.
    pub app_key: u32,
    /// Which connect attempt this is.
    pub connect_seqnum: u8,
}

impl RingConnectRequest {
    pub(crate) fn read(buf: &[u8]) -> Self {
        RingConnectRequest {
            seqnum: u16(buf, off::SEQNUM),
            target_recv_seqnum_start: u16(buf, off::CONNECT_RECV_SEQNUM_START),
            app_key: u32(buf, off::CONNECT_APP_KEY),
            connect_seqnum: u8(buf, off::CONNECT_REQUEST_SEQNUM),
        }
    }
    pub(crate) fn write(&self, buf: &mut [u8]) {
        set_u16(buf, off::SEQNUM, self.seqnum);
        set_u16(
            buf,
            off::CONNECT_RECV_SEQNUM_START,
            self.target_recv_seqnum_start,
        );
        set_u32(buf, off::CONNECT_APP_KEY, self.app_key);
        set_u8(buf, off::CONNECT_REQUEST_SEQNUM, self.connect_seqnum);
    }
}

/// MX connect reply fields; the requester's session travels in the route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RingConnectReply {
    /// Library sequence number of the connect packet.
    pub seqnum: u16,
    /// Next sequence number the replier expects to receive.
    pub target_recv_seqnum_start: u16,
    /// The connect attempt answered.
    pub connect_seqnum: u8,
    /// MX connect status (0 success, 11 bad key).
    pub status: u8,
}

impl RingConnectReply {
    pub(crate) fn read(buf: &[u8]) -> Self {
        RingConnectReply {
            seqnum: u16(buf, off::SEQNUM),
            target_recv_seqnum_start: u16(buf, off::CONNECT_RECV_SEQNUM_START),
            connect_seqnum: u8(buf, off::CONNECT_REPLY_SEQNUM),
            status: u8(buf, off::CONNECT_STATUS),
        }
    }
    pub(crate) fn write(&self, buf: &mut [u8]) {
        set_u16(buf, off::SEQNUM, self.seqnum);
        set_u16(
            buf,
            off::CONNECT_RECV_SEQNUM_START,
            self.target_recv_seqnum_start,
        );
        set_u8(buf, off::CONNECT_REPLY_SEQNUM, self.connect_seqnum);
        set_u8(buf, off::CONNECT_STATUS, self.status);
    }
}

/// MX NOTIFY: the receiver finished pulling a LARGE message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NotifySend {
    /// Library sequence number.
    pub seqnum: u16,
    /// Piggybacked acknowledgement.
    pub piggyack: u16,
    /// Bytes transferred.
    pub total_length: u32,
    /// The sender's region that was pulled.
    pub region_id: u8,
    /// Its registration generation.
    pub region_seqnum: u8,
}

impl NotifySend {
    pub(crate) fn read(buf: &[u8]) -> Self {
        NotifySend {
            seqnum: u16(buf, off::SEQNUM),
            piggyack: u16(buf, off::PIGGYACK),
            total_length: u32(buf, off::LENGTH),
            region_id: u8(buf, off::NOTIFY_REGION_ID),
            region_seqnum: u8(buf, off::NOTIFY_REGION_SEQNUM),
        }
    }
    pub(crate) fn write(&self, buf: &mut [u8]) {
        set_u16(buf, off::SEQNUM, self.seqnum);
        set_u16(buf, off::PIGGYACK, self.piggyack);
        set_u32(buf, off::LENGTH, self.total_length);
        set_u8(buf, off::NOTIFY_REGION_ID, self.region_id);
        set_u8(buf, off::NOTIFY_REGION_SEQNUM, self.region_seqnum);
    }
}

/// MX library acknowledgement (sent as a TRUC packet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LibackSend {
    /// Sequence number acknowledged up to.
    pub lib_seqnum: u16,
    /// Sender's send sequence.
    pub send_seq: u16,
    /// Acknowledgement number.
    pub acknum: u32,
    /// True if this ack is a retransmission.
    pub resent: bool,
}

impl LibackSend {
    pub(crate) fn read(buf: &[u8]) -> Result<Self> {
        Ok(LibackSend {
            lib_seqnum: u16(buf, off::SEQNUM),
            send_seq: u16(buf, off::LIBACK_SEND_SEQ),
            acknum: u32(buf, off::LIBACK_ACKNUM),
            resent: parse_bool(buf, off::LIBACK_RESENT, "liback resent")?,
        })
    }
    pub(crate) fn write(&self, buf: &mut [u8]) {
        set_u16(buf, off::SEQNUM, self.lib_seqnum);
        set_u16(buf, off::LIBACK_SEND_SEQ, self.send_seq);
        set_u32(buf, off::LIBACK_ACKNUM, self.acknum);
        set_u8(buf, off::LIBACK_RESENT, self.resent.into());
    }
}

/// Pull `length` bytes of a remote region into a local one (the receive side of a LARGE
/// message). Completed by a PULL_DONE event with this request's tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pull {
    /// Bytes to pull.
    pub length: u32,
    /// Local region receiving the data.
    pub local_region: u8,
    /// Offset in the local region.
    pub local_offset: u32,
    /// Remote region (from the RNDV).
    pub remote_region: u8,
    /// Remote region's registration generation (from the RNDV).
    pub remote_region_seqnum: u8,
    /// Offset in the remote region.
    pub remote_offset: u32,
}

impl Pull {
    fn read(buf: &[u8]) -> Self {
        Pull {
            length: u32(buf, off::PULL_LENGTH),
            local_region: u8(buf, off::PULL_LOCAL_REGION),
            local_offset: u32(buf, off::PULL_LOCAL_OFFSET),
            remote_region: u8(buf, off::PULL_REMOTE_REGION),
            remote_region_seqnum: u8(buf, off::PULL_REMOTE_SEQNUM),
            remote_offset: u32(buf, off::PULL_REMOTE_OFFSET),
        }
    }
    fn write(&self, buf: &mut [u8]) {
        set_u32(buf, off::PULL_LENGTH, self.length);
        set_u8(buf, off::PULL_LOCAL_REGION, self.local_region);
        set_u32(buf, off::PULL_LOCAL_OFFSET, self.local_offset);
        set_u8(buf, off::PULL_REMOTE_REGION, self.remote_region);
        set_u8(buf, off::PULL_REMOTE_SEQNUM, self.remote_region_seqnum);
        set_u32(buf, off::PULL_REMOTE_OFFSET, self.remote_offset);
    }
}

/// Pages of one endpoint's deregistered windows kept for its next windows, by default: the
/// library's grant pool keeps their grants and the backend its mappings of them (two
/// 16 MiB windows and their info pages), as blkfront and blkback keep persistent grants.
pub const KEPT_WINDOW_PAGES: usize = 2 * (4096 + super::info_pages_for(4096));

/// Register a region whose pages the application granted itself: the grant refs of the
/// info pages that list them. Completed by SEND_DONE (the region is mapped) or ERROR.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DirectRegister {
    /// Region id (what RNDV and PULL name).
    pub region_id: u8,
    /// Bytes in the region, from byte 0 of its first page.
    pub length: u32,
    nr_info: u8,
    // Invariant: entries past `nr_info` are zero.
    info_refs: [u32; REGION_INFO_REFS_MAX],
}

impl DirectRegister {
    /// A registration of `length` bytes listed by the info pages `info_refs`; `Invalid` if
    /// the region is empty, larger than [`REGION_PAGES_MAX`] pages, or the info page count
    /// does not match its size.
    pub fn new(region_id: u8, length: u32, info_refs: &[u32]) -> Result<Self> {
        if info_refs.len() > REGION_INFO_REFS_MAX {
            return Err(Error::Invalid {
                field: "register info refs",
                reason: "more than 24",
            });
        }
        let mut refs = [0u32; REGION_INFO_REFS_MAX];
        refs[..info_refs.len()].copy_from_slice(info_refs);
        let r = DirectRegister {
            region_id,
            length,
            nr_info: info_refs.len() as u8,
            info_refs: refs,
        };
        r.validate()?;
        Ok(r)
    }

    /// Pages of the region.
    pub fn nr_pages(&self) -> usize {
        (self.length as usize).div_ceil(crate::ring::PAGE_SIZE)
    }

    /// Grant refs of the info pages, in order.
    pub fn info_refs(&self) -> &[u32] {
        &self.info_refs[..usize::from(self.nr_info)]
    }

    fn validate(&self) -> Result<()> {
        if self.length == 0 {
            return Err(Error::Invalid {
                field: "register length",
                reason: "zero",
            });
        }
        if self.nr_pages() > REGION_PAGES_MAX {
            return Err(Error::Invalid {
                field: "register length",
                reason: "more pages than 24 info pages list",
            });
        }
        if usize::from(self.nr_info) != info_pages_for(self.nr_pages()) {
            return Err(Error::Invalid {
                field: "register info refs",
                reason: "count does not match the region size",
            });
        }
        Ok(())
    }

    fn read(buf: &[u8]) -> Result<Self> {
        let nr = usize::from(u8(buf, off::REGISTER_NR_INFO));
        if nr > REGION_INFO_REFS_MAX {
            return Err(Error::Invalid {
                field: "register info refs",
                reason: "more than 24",
            });
        }
        let mut refs = [0u32; REGION_INFO_REFS_MAX];
        for (i, r) in refs.iter_mut().enumerate().take(nr) {
            *r = u32(buf, off::REGISTER_INFO_REFS + 4 * i);
        }
        DirectRegister::new(
            u8(buf, off::REGISTER_REGION),
            u32(buf, off::REGISTER_LENGTH),
            &refs[..nr],
        )
    }

    fn write(&self, buf: &mut [u8]) -> Result<()> {
        self.validate()?;
        set_u8(buf, off::REGISTER_REGION, self.region_id);
        set_u8(buf, off::REGISTER_NR_INFO, self.nr_info);
        set_u32(buf, off::REGISTER_LENGTH, self.length);
        for (i, r) in self.info_refs().iter().enumerate() {
            set_u32(buf, off::REGISTER_INFO_REFS + 4 * i, *r);
        }
        Ok(())
    }
}

impl std::fmt::Debug for DirectRegister {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectRegister")
            .field("region_id", &self.region_id)
            .field("length", &self.length)
            .field("info_refs", &self.info_refs())
            .finish()
    }
}

/// What a send request asks the backend to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// Send a TINY message (at most 32 bytes, inline).
    Tiny(InlineMsg),
    /// Send a SMALL message (at most 128 bytes, inline).
    Small(InlineMsg),
    /// Send a MEDIUM message from the send queue.
    Medium(MediumSend),
    /// Announce a LARGE message (RNDV).
    Rndv(RndvSend),
    /// Send an MX connect request.
    ConnectRequest(RingConnectRequest),
    /// Answer an MX connect request.
    ConnectReply(RingConnectReply),
    /// Tell the sender of a LARGE message that its data was pulled.
    Notify(NotifySend),
    /// Send an explicit library acknowledgement.
    Liback(LibackSend),
    /// Pull a LARGE message's data.
    Pull(Pull),
    /// Register a region the application granted itself.
    Register(DirectRegister),
    /// Deregister a region (its pages are unmapped before the next request is taken).
    Deregister {
        /// The region, as registered by [`SendOp::Register`].
        region_id: u8,
    },
}

impl SendOp {
    /// The kind this operation is encoded as.
    pub fn kind(&self) -> SendKind {
        match self {
            SendOp::Tiny(_) => SendKind::Tiny,
            SendOp::Small(_) => SendKind::Small,
            SendOp::Medium(_) => SendKind::Medium,
            SendOp::Rndv(_) => SendKind::Rndv,
            SendOp::ConnectRequest(_) => SendKind::ConnectRequest,
            SendOp::ConnectReply(_) => SendKind::ConnectReply,
            SendOp::Notify(_) => SendKind::Notify,
            SendOp::Liback(_) => SendKind::Liback,
            SendOp::Pull(_) => SendKind::Pull,
            SendOp::Register(_) => SendKind::Register,
            SendOp::Deregister { .. } => SendKind::Deregister,
        }
    }
}

/// A request on an endpoint's send ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendRequest {
    /// Echoed by the completion event.
    pub tag: u32,
    /// Destination.
    pub route: Route,
    /// The operation.
    pub op: SendOp,
}

impl SendRequest {
    /// Parse a send ring slot.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let (kind, tag) = parse_header(buf, SEND_SLOT_SIZE)?;
        let op = match SendKind::try_from(kind)? {
            SendKind::Tiny => SendOp::Tiny(InlineMsg::read(buf, TINY_MAX, "tiny length")?),
            SendKind::Small => SendOp::Small(InlineMsg::read(buf, SMALL_MAX, "small length")?),
            SendKind::Medium => SendOp::Medium(MediumSend::read(buf)?),
            SendKind::Rndv => SendOp::Rndv(RndvSend::read(buf)),
            SendKind::ConnectRequest => SendOp::ConnectRequest(RingConnectRequest::read(buf)),
            SendKind::ConnectReply => SendOp::ConnectReply(RingConnectReply::read(buf)),
            SendKind::Notify => SendOp::Notify(NotifySend::read(buf)),
            SendKind::Liback => SendOp::Liback(LibackSend::read(buf)?),
            SendKind::Pull => SendOp::Pull(Pull::read(buf)),
            SendKind::Register => SendOp::Register(DirectRegister::read(buf)?),
            SendKind::Deregister => SendOp::Deregister {
                region_id: u8(buf, off::REGISTER_REGION),
            },
        };
        Ok(SendRequest {
            tag,
            route: Route::read(buf),
            op,
        })
    }

    /// Write this request into a slot of at least [`SEND_SLOT_SIZE`] bytes.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        // Refuse before writing anything.
        match &self.op {
            SendOp::Tiny(m) if m.data.len() > TINY_MAX => {
                return Err(Error::Invalid {
                    field: "tiny length",
                    reason: "length beyond the inline capacity",
                })
            }
            SendOp::Medium(m) => m.validate()?,
            SendOp::Register(r) => r.validate()?,
            _ => {}
        }
        emit_header(buf, SEND_SLOT_SIZE, self.op.kind().into(), self.tag)?;
        self.route.write(buf);
        match &self.op {
            SendOp::Tiny(m) => m.write(buf, TINY_MAX, "tiny length")?,
            SendOp::Small(m) => m.write(buf, SMALL_MAX, "small length")?,
            SendOp::Medium(m) => m.write(buf)?,
            SendOp::Rndv(r) => r.write(buf),
            SendOp::ConnectRequest(c) => c.write(buf),
            SendOp::ConnectReply(c) => c.write(buf),
            SendOp::Notify(n) => n.write(buf),
            SendOp::Liback(a) => a.write(buf),
            SendOp::Pull(p) => p.write(buf),
            SendOp::Register(r) => r.write(buf)?,
            SendOp::Deregister { region_id } => set_u8(buf, off::REGISTER_REGION, *region_id),
        }
        Ok(())
    }
}

impl crate::ring::Slot for SendRequest {
    const SIZE: usize = SEND_SLOT_SIZE;
    fn encode(&self, slot: &mut [u8]) -> Result<()> {
        self.emit(slot)
    }
    fn decode(slot: &[u8]) -> Result<Self> {
        Self::parse(slot)
    }
}

//! Control ring messages: the guest daemon asks the backend to open and close endpoints and
//! to register and deregister memory regions.
//!
//! Slots are [`CTRL_SLOT_SIZE`] bytes: 16 slots in a one-page ring. After the common header:
//!
//! ```text
//! ENDPOINT_OPEN (0x01)          ENDPOINT_CLOSE (0x02)
//!  8 u8  endpoint                8 u8 endpoint
//!  9 u8  send ring pages
//! 10 u8  event ring pages       REGION_DEREGISTER (0x04)
//! 11 u8  flags                   8 u8 endpoint
//! 12 u32 event-channel port      9 u8 region id
//! 16 u32 info page grant ref
//! 20 u16 send queue pages       REGION_REGISTER (0x03)
//! 22 u16 recv queue pages        8 u8  endpoint
//! 24 u32 session to resume       9 u8  region id
//!        (0: a new one)
//! responses (request kind|0x80) 10 u16 offset of the data in its first page
//!  8 u32 status                 12 u32 length in bytes
//! 12 u8  endpoint               16 u32 number of pages
//! 13 u8  region id              20 u8  number of info pages
//! 16 u32 session id (OPEN)      24 u32 x 24: grant refs of the info pages
//! ```
//!
//! ENDPOINT_OPEN's flags: bit 0 [`EndpointOpen::quiet_send_done`]; the other bits are zero
//! (a request with any of them set is refused, so that a bit can be given a meaning later).
//!
//! The endpoint's info page lists the grant refs of its pages in this order: send ring,
//! event ring, send queue, receive queue (see [`EndpointPages`]). A region's info pages list
//! the grant refs of its pages in address order.

use std::ops::Range;

use super::field::{set_u16, set_u32, set_u8, u16, u32, u8};
use super::info::{info_pages_for, INFO_PAGE_REFS};
use super::{emit_header, parse_header, GrantRef};
use crate::{Error, Result};

/// Size of a control ring slot.
pub const CTRL_SLOT_SIZE: usize = 128;
/// A ring of an endpoint spans at most this many pages.
pub const ENDPOINT_RING_PAGES_MAX: u8 = 8;
/// A REGION_REGISTER names at most this many info pages.
pub const REGION_INFO_REFS_MAX: usize = 24;
/// A registered region spans at most this many pages (96 MiB).
pub const REGION_PAGES_MAX: usize = REGION_INFO_REFS_MAX * INFO_PAGE_REFS;

const PAGE: u64 = 4096;
const RESPONSE_BIT: u8 = 0x80;

wire_enum! {
    /// Request kinds of the control ring.
    pub enum CtrlKind: u8 as "control request kind" {
        /// Open an endpoint over pages the guest granted ([`EndpointOpen`]).
        EndpointOpen = 0x01,
        /// Close an endpoint and unmap its pages.
        EndpointClose = 0x02,
        /// Register a region for LARGE transfers ([`RegionRegister`]).
        RegionRegister = 0x03,
        /// Deregister a region and unmap its pages.
        RegionDeregister = 0x04,
    }
}

wire_enum! {
    /// Outcome of a control request.
    pub enum CtrlStatus: u32 as "control status" {
        /// Done.
        Ok = 0,
        /// The backend does not speak the request's protocol version.
        BadVersion = 1,
        /// Endpoint index out of range.
        BadEndpoint = 2,
        /// The endpoint is already open.
        EndpointBusy = 3,
        /// The endpoint is not open.
        EndpointNotOpen = 4,
        /// A grant reference could not be mapped.
        BadGrant = 5,
        /// Region id unknown, or already registered.
        BadRegion = 6,
        /// A per-guest limit (endpoints, regions, mapped grants) was reached.
        Quota = 7,
        /// The request did not pass validation.
        Malformed = 8,
    }
}

/// How many pages of each kind an endpoint shares, in info-page order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointPages {
    /// Pages of the send ring (1..=[`ENDPOINT_RING_PAGES_MAX`]).
    pub send_ring: u8,
    /// Pages of the event ring (1..=[`ENDPOINT_RING_PAGES_MAX`]).
    pub event_ring: u8,
    /// Pages of the send queue (one MEDIUM fragment each).
    pub send_queue: u16,
    /// Pages of the receive queue (one MEDIUM fragment each).
    pub recv_queue: u16,
}

impl EndpointPages {
    /// Total number of pages, i.e. of refs in the info page.
    pub fn total(&self) -> usize {
        self.send_ring as usize
            + self.event_ring as usize
            + self.send_queue as usize
            + self.recv_queue as usize
    }

    /// Info-page positions of the send ring's refs.
    pub fn send_ring_refs(&self) -> Range<usize> {
        0..self.send_ring as usize
    }

    /// Info-page positions of the event ring's refs.
    pub fn event_ring_refs(&self) -> Range<usize> {
        let start = self.send_ring_refs().end;
        start..start + self.event_ring as usize
    }

    /// Info-page positions of the send queue's refs.
    pub fn send_queue_refs(&self) -> Range<usize> {
        let start = self.event_ring_refs().end;
        start..start + self.send_queue as usize
    }

    /// Info-page positions of the receive queue's refs.
    pub fn recv_queue_refs(&self) -> Range<usize> {
        let start = self.send_queue_refs().end;
        start..start + self.recv_queue as usize
    }

    fn validate(&self) -> Result<()> {
        let ring_ok = |n: u8| (1..=ENDPOINT_RING_PAGES_MAX).contains(&n);
        if !ring_ok(self.send_ring) || !ring_ok(self.event_ring) {
            return Err(Error::Invalid {
                field: "endpoint ring pages",
                reason: "not in 1..=8",
            });
        }
        if self.total() > INFO_PAGE_REFS {
            return Err(Error::Invalid {
                field: "endpoint pages",
                reason: "more than one info page holds",
            });
        }
        Ok(())
    }
}

/// ENDPOINT_OPEN: share an endpoint's pages with the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointOpen {
    /// Endpoint index.
    pub endpoint: u8,
    /// Event-channel port the frontend allocated for the backend to bind.
    pub event_channel: u32,
    /// Grant ref of the info page listing the endpoint's page refs.
    pub info_ref: GrantRef,
    /// What the info page lists.
    pub pages: EndpointPages,
    /// The session the endpoint had before its device reconnected (a backend restart, a
    /// resume, a frontend that gave up on the backend and started over), or 0 for a new
    /// endpoint. The backend keeps it only if it recorded that very session for
    /// this endpoint of this device: a guest cannot choose a session, only keep its own.
    pub resume_session: u32,
    /// The event ring's consumer waits for no send's completion but a MEDIUM's (whose
    /// completion gives back its send-queue slots): the completions of the others are
    /// written to the ring without a notification, and the next event that is notified
    /// covers them. Without it every event is notified as `io/ring.h` has it, for a
    /// consumer that sleeps until its TINY has left.
    pub quiet_send_done: bool,
}

/// ENDPOINT_OPEN's flag bit for [`EndpointOpen::quiet_send_done`].
const OPEN_QUIET_SEND_DONE: u8 = 0x01;

/// REGION_REGISTER: grant a memory region for LARGE transfers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionRegister {
    /// Endpoint the region belongs to.
    pub endpoint: u8,
    /// Region id within the endpoint.
    pub region_id: u8,
    /// Offset of the region's first byte within its first page (< 4096).
    pub first_page_offset: u16,
    /// Length in bytes (at least 1).
    pub length: u32,
    /// Grant refs of the info pages listing the region's page refs, in order.
    pub info_refs: Vec<GrantRef>,
}

impl RegionRegister {
    /// Pages the region spans.
    pub fn nr_pages(&self) -> u64 {
        region_pages(self.first_page_offset, self.length)
    }

    /// Info pages needed to list the region's pages.
    pub fn nr_info_pages(&self) -> usize {
        info_pages_for(self.nr_pages() as usize)
    }

    fn validate(&self) -> Result<()> {
        if u64::from(self.first_page_offset) >= PAGE {
            return Err(Error::Invalid {
                field: "region first page offset",
                reason: "not below 4096",
            });
        }
        if self.length == 0 {
            return Err(Error::Invalid {
                field: "region length",
                reason: "zero",
            });
        }
        if self.nr_pages() > REGION_PAGES_MAX as u64 {
            return Err(Error::Invalid {
                field: "region length",
                reason: "more pages than 24 info pages list",
            });
        }
        if self.info_refs.len() != self.nr_info_pages() {
            return Err(Error::Invalid {
                field: "region info refs",
                reason: "count does not match the region size",
            });
        }
        Ok(())
    }
}

fn region_pages(first_page_offset: u16, length: u32) -> u64 {
    (u64::from(first_page_offset) + u64::from(length)).div_ceil(PAGE)
}

/// What a control request asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CtrlOp {
    /// Open an endpoint over the pages its info page lists.
    EndpointOpen(EndpointOpen),
    /// Close an endpoint and unmap its pages.
    EndpointClose {
        /// The endpoint to close.
        endpoint: u8,
    },
    /// Register a region.
    RegionRegister(RegionRegister),
    /// Deregister a region and unmap its pages.
    RegionDeregister {
        /// Endpoint the region belongs to.
        endpoint: u8,
        /// Region id within the endpoint.
        region_id: u8,
    },
}

impl CtrlOp {
    /// The kind this operation is encoded as.
    pub fn kind(&self) -> CtrlKind {
        match self {
            CtrlOp::EndpointOpen(_) => CtrlKind::EndpointOpen,
            CtrlOp::EndpointClose { .. } => CtrlKind::EndpointClose,
            CtrlOp::RegionRegister(_) => CtrlKind::RegionRegister,
            CtrlOp::RegionDeregister { .. } => CtrlKind::RegionDeregister,
        }
    }
}

/// A control ring request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtrlRequest {
    /// Echoed in the response.
    pub tag: u32,
    /// The operation.
    pub op: CtrlOp,
}

mod req {
    pub const ENDPOINT: usize = 8;
    pub const SEND_RING_PAGES: usize = 9;
    pub const EVENT_RING_PAGES: usize = 10;
    pub const OPEN_FLAGS: usize = 11;
    pub const EVENT_CHANNEL: usize = 12;
    pub const INFO_REF: usize = 16;
    pub const SEND_QUEUE_PAGES: usize = 20;
    pub const RECV_QUEUE_PAGES: usize = 22;
    pub const RESUME_SESSION: usize = 24;
    pub const REGION_ID: usize = 9;
    pub const FIRST_PAGE_OFFSET: usize = 10;
    pub const LENGTH: usize = 12;
    pub const NR_PAGES: usize = 16;
    pub const NR_INFO_REFS: usize = 20;
    pub const INFO_REFS: usize = 24;
}

impl CtrlRequest {
    /// Parse a control request slot.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let (kind, tag) = parse_header(buf, CTRL_SLOT_SIZE)?;
        let endpoint = u8(buf, req::ENDPOINT);
        let op = match CtrlKind::try_from(kind)? {
            CtrlKind::EndpointOpen => {
                let flags = u8(buf, req::OPEN_FLAGS);
                if flags & !OPEN_QUIET_SEND_DONE != 0 {
                    return Err(Error::Invalid {
                        field: "endpoint open flags",
                        reason: "unknown bits set",
                    });
                }
                let open = EndpointOpen {
                    endpoint,
                    event_channel: u32(buf, req::EVENT_CHANNEL),
                    info_ref: u32(buf, req::INFO_REF),
                    pages: EndpointPages {
                        send_ring: u8(buf, req::SEND_RING_PAGES),
                        event_ring: u8(buf, req::EVENT_RING_PAGES),
                        send_queue: u16(buf, req::SEND_QUEUE_PAGES),
                        recv_queue: u16(buf, req::RECV_QUEUE_PAGES),
                    },
                    resume_session: u32(buf, req::RESUME_SESSION),
                    quiet_send_done: flags & OPEN_QUIET_SEND_DONE != 0,
                };
                open.pages.validate()?;
                CtrlOp::EndpointOpen(open)
            }
            CtrlKind::EndpointClose => CtrlOp::EndpointClose { endpoint },
            CtrlKind::RegionRegister => {
                let first_page_offset = u16(buf, req::FIRST_PAGE_OFFSET);
                let length = u32(buf, req::LENGTH);
                let nr_info = u8(buf, req::NR_INFO_REFS) as usize;
                if nr_info > REGION_INFO_REFS_MAX {
                    return Err(Error::Invalid {
                        field: "region info refs",
                        reason: "more than 24",
                    });
                }
                if u64::from(u32(buf, req::NR_PAGES)) != region_pages(first_page_offset, length) {
                    return Err(Error::Invalid {
                        field: "region pages",
                        reason: "do not match offset and length",
                    });
                }
                let info_refs = (0..nr_info)
                    .map(|i| u32(buf, req::INFO_REFS + 4 * i))
                    .collect();
                let reg = RegionRegister {
                    endpoint,
                    region_id: u8(buf, req::REGION_ID),
                    first_page_offset,
                    length,
                    info_refs,
                };
                reg.validate()?;
                CtrlOp::RegionRegister(reg)
            }
            CtrlKind::RegionDeregister => CtrlOp::RegionDeregister {
                endpoint,
                region_id: u8(buf, req::REGION_ID),
            },
        };
        Ok(CtrlRequest { tag, op })
    }

    /// Write this request into a slot of at least [`CTRL_SLOT_SIZE`] bytes.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        match &self.op {
            CtrlOp::EndpointOpen(open) => open.pages.validate()?,
            CtrlOp::RegionRegister(reg) => reg.validate()?,
            CtrlOp::EndpointClose { .. } | CtrlOp::RegionDeregister { .. } => {}
        }
        emit_header(buf, CTRL_SLOT_SIZE, self.op.kind().into(), self.tag)?;
        match &self.op {
            CtrlOp::EndpointOpen(open) => {
                set_u8(buf, req::ENDPOINT, open.endpoint);
                set_u8(buf, req::SEND_RING_PAGES, open.pages.send_ring);
                set_u8(buf, req::EVENT_RING_PAGES, open.pages.event_ring);
                set_u32(buf, req::EVENT_CHANNEL, open.event_channel);
                set_u32(buf, req::INFO_REF, open.info_ref);
                set_u16(buf, req::SEND_QUEUE_PAGES, open.pages.send_queue);
                set_u16(buf, req::RECV_QUEUE_PAGES, open.pages.recv_queue);
                set_u32(buf, req::RESUME_SESSION, open.resume_session);
                let flags = if open.quiet_send_done {
                    OPEN_QUIET_SEND_DONE
                } else {
                    0
                };
                set_u8(buf, req::OPEN_FLAGS, flags);
            }
            CtrlOp::EndpointClose { endpoint } => set_u8(buf, req::ENDPOINT, *endpoint),
            CtrlOp::RegionRegister(reg) => {
                set_u8(buf, req::ENDPOINT, reg.endpoint);
                set_u8(buf, req::REGION_ID, reg.region_id);
                set_u16(buf, req::FIRST_PAGE_OFFSET, reg.first_page_offset);
                set_u32(buf, req::LENGTH, reg.length);
                // validate() bounded the page count by REGION_PAGES_MAX, which fits in u32.
                set_u32(buf, req::NR_PAGES, reg.nr_pages() as u32);
                set_u8(buf, req::NR_INFO_REFS, reg.info_refs.len() as u8);
                for (i, r) in reg.info_refs.iter().enumerate() {
                    set_u32(buf, req::INFO_REFS + 4 * i, *r);
                }
            }
            CtrlOp::RegionDeregister {
                endpoint,
                region_id,
            } => {
                set_u8(buf, req::ENDPOINT, *endpoint);
                set_u8(buf, req::REGION_ID, *region_id);
            }
        }
        Ok(())
    }
}

/// What a control response answers, with the request's identifying fields echoed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtrlReply {
    /// Answer to ENDPOINT_OPEN; `session_id` is the endpoint's MX session (0 on failure).
    EndpointOpen {
        /// The endpoint of the request.
        endpoint: u8,
        /// The session the backend gave the endpoint (0 on failure).
        session_id: u32,
    },
    /// Answer to ENDPOINT_CLOSE.
    EndpointClose {
        /// The endpoint of the request.
        endpoint: u8,
    },
    /// Answer to REGION_REGISTER.
    RegionRegister {
        /// The endpoint of the request.
        endpoint: u8,
        /// The region id of the request.
        region_id: u8,
    },
    /// Answer to REGION_DEREGISTER.
    RegionDeregister {
        /// The endpoint of the request.
        endpoint: u8,
        /// The region id of the request.
        region_id: u8,
    },
}

impl CtrlReply {
    /// The request kind this reply answers.
    pub fn kind(&self) -> CtrlKind {
        match self {
            CtrlReply::EndpointOpen { .. } => CtrlKind::EndpointOpen,
            CtrlReply::EndpointClose { .. } => CtrlKind::EndpointClose,
            CtrlReply::RegionRegister { .. } => CtrlKind::RegionRegister,
            CtrlReply::RegionDeregister { .. } => CtrlKind::RegionDeregister,
        }
    }
}

/// A control ring response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtrlResponse {
    /// The request's tag.
    pub tag: u32,
    /// Outcome.
    pub status: CtrlStatus,
    /// Which request this answers.
    pub reply: CtrlReply,
}

mod rsp {
    pub const STATUS: usize = 8;
    pub const ENDPOINT: usize = 12;
    pub const REGION_ID: usize = 13;
    pub const SESSION_ID: usize = 16;
}

impl CtrlResponse {
    /// The response to `request` with `status`, echoing its tag, endpoint and region
    /// (session id 0: set it for a successful ENDPOINT_OPEN).
    pub fn answering(request: &CtrlRequest, status: CtrlStatus) -> Self {
        let reply = match &request.op {
            CtrlOp::EndpointOpen(open) => CtrlReply::EndpointOpen {
                endpoint: open.endpoint,
                session_id: 0,
            },
            CtrlOp::EndpointClose { endpoint } => CtrlReply::EndpointClose {
                endpoint: *endpoint,
            },
            CtrlOp::RegionRegister(reg) => CtrlReply::RegionRegister {
                endpoint: reg.endpoint,
                region_id: reg.region_id,
            },
            CtrlOp::RegionDeregister {
                endpoint,
                region_id,
            } => CtrlReply::RegionDeregister {
                endpoint: *endpoint,
                region_id: *region_id,
            },
        };
        CtrlResponse {
            tag: request.tag,
            status,
            reply,
        }
    }

    /// Parse a control response slot.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let (kind, tag) = parse_header(buf, CTRL_SLOT_SIZE)?;
        if kind & RESPONSE_BIT == 0 {
            return Err(Error::Unknown {
                what: "control response kind",
                value: kind.into(),
            });
        }
        let kind = CtrlKind::try_from(kind & !RESPONSE_BIT).map_err(|_| Error::Unknown {
            what: "control response kind",
            value: kind.into(),
        })?;
        let status = CtrlStatus::try_from(u32(buf, rsp::STATUS))?;
        let endpoint = u8(buf, rsp::ENDPOINT);
        let region_id = u8(buf, rsp::REGION_ID);
        let reply = match kind {
            CtrlKind::EndpointOpen => CtrlReply::EndpointOpen {
                endpoint,
                session_id: u32(buf, rsp::SESSION_ID),
            },
            CtrlKind::EndpointClose => CtrlReply::EndpointClose { endpoint },
            CtrlKind::RegionRegister => CtrlReply::RegionRegister {
                endpoint,
                region_id,
            },
            CtrlKind::RegionDeregister => CtrlReply::RegionDeregister {
                endpoint,
                region_id,
            },
        };
        Ok(CtrlResponse { tag, status, reply })
    }

    /// Write this response into a slot of at least [`CTRL_SLOT_SIZE`] bytes.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        emit_header(
            buf,
            CTRL_SLOT_SIZE,
            u8::from(self.reply.kind()) | RESPONSE_BIT,
            self.tag,
        )?;
        set_u32(buf, rsp::STATUS, self.status.into());
        match self.reply {
            CtrlReply::EndpointOpen {
                endpoint,
                session_id,
            } => {
                set_u8(buf, rsp::ENDPOINT, endpoint);
                set_u32(buf, rsp::SESSION_ID, session_id);
            }
            CtrlReply::EndpointClose { endpoint } => set_u8(buf, rsp::ENDPOINT, endpoint),
            CtrlReply::RegionRegister {
                endpoint,
                region_id,
            }
            | CtrlReply::RegionDeregister {
                endpoint,
                region_id,
            } => {
                set_u8(buf, rsp::ENDPOINT, endpoint);
                set_u8(buf, rsp::REGION_ID, region_id);
            }
        }
        Ok(())
    }
}

impl crate::ring::Slot for CtrlRequest {
    const SIZE: usize = CTRL_SLOT_SIZE;
    fn encode(&self, slot: &mut [u8]) -> Result<()> {
        self.emit(slot)
    }
    fn decode(slot: &[u8]) -> Result<Self> {
        Self::parse(slot)
    }
}

impl crate::ring::Slot for CtrlResponse {
    const SIZE: usize = CTRL_SLOT_SIZE;
    fn encode(&self, slot: &mut [u8]) -> Result<()> {
        self.emit(slot)
    }
    fn decode(slot: &[u8]) -> Result<Self> {
        Self::parse(slot)
    }
}

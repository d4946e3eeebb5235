//! The `hv.sock` protocol between a domain's processes and `xmx-simhv`.
//!
//! Every message is a frame: a little-endian `u32` body length, then the body. File
//! descriptors travel with a response as `SCM_RIGHTS` ancillary data (see
//! [`super::transport`]). A connection carries one request at a time; the reply carries
//! the request's sequence number.
//!
//! Request body: `version u16 | op u16 | seq u32 | payload`.
//! Response body: `version u16 | op u16 | seq u32 | status u16 | nfds u16 | payload`;
//! `status` is 0 or an error code ([`error_code`]) and then the payload is a UTF-8 message.
//!
//! Payloads (all integers little-endian, `[T; n]` is `n u32` then the elements):
//!
//! | op | request | response (ok) | fds |
//! |----|---------|---------------|-----|
//! | Hello | – | `domid u16, instance u64, table_size u32` | own mem (rw) |
//! | GrantAlloc | `remote u16, writable u8, count u32` | `[(ref u32, frame u32)]` | – |
//! | GrantEnd | `defer u8, [ref u32]` | – | – |
//! | Map | `remote u16, writable u8, [ref u32]` | `handle u64, instance u64, [frame u32]` | remote mem, first time only |
//! | Unmap | `handle u64` | – | – |
//! | Copy | `[segment]`, then local source bytes | `[status u16]`, then local dest bytes | – |
//! | EvtchnOpen | – | `slots u32` | status page (ro) |
//! | EvtchnAllocUnbound | `remote u16` | `port u32, slot u32, generation u32` | rx, tx |
//! | EvtchnBind | `remote u16, remote_port u32` | as above | rx, tx |
//! | EvtchnClose | `port u32` | – | – |
//! | EvtchnStatus | `port u32` | `state u8, remote u16, remote_port u32` | – |
//! | GrantAdopt | `remote u16, writable u8, [ref u32]` | `[(ref u32, frame u32)]` | – |
//!
//! A copy segment is `source side, dest side, len u16`, a side being
//! `kind u8 (0 local, 1 foreign), domid u16, gref u32, offset u16`.
//!
//! Event-channel status page: one `u32` word per slot, `generation << 2 | state`, written
//! by the daemon only, so a notifier can tell in one load whether its port is still bound.

use crate::{DomId, Error, GrantRef, Port, Result, PAGE_SIZE};

/// Protocol version spoken by this build.
pub const VERSION: u16 = 1;
/// Largest frame body either side accepts.
pub const MAX_FRAME: usize = 8 << 20;
/// Most segments in one copy request.
pub const MAX_COPY_SEGMENTS: usize = 1024;
/// Most file descriptors attached to one response.
pub const MAX_FDS: usize = 4;
/// Bytes of a request header.
pub const REQUEST_HEADER_LEN: usize = 8;
/// Bytes of a response header.
pub const RESPONSE_HEADER_LEN: usize = 12;
/// Slots of an event-channel status page (one page of `u32` words).
pub const STATUS_SLOTS: usize = PAGE_SIZE / 4;

/// Slot state: no port.
pub const PORT_FREE: u32 = 0;
/// Slot state: allocated, waiting for the remote to bind; notifications are dropped.
pub const PORT_UNBOUND: u32 = 1;
/// Slot state: connected to a remote port.
pub const PORT_BOUND: u32 = 2;
/// Slot state: the remote end closed; the port can be bound again by the same remote.
pub const PORT_PEER_CLOSED: u32 = 3;

/// Generation numbers use the upper 30 bits of a status word.
pub const GENERATION_MASK: u32 = (1 << 30) - 1;

/// Compose a status-page word.
pub fn status_word(generation: u32, state: u32) -> u32 {
    ((generation & GENERATION_MASK) << 2) | (state & 3)
}

/// Split a status-page word into (generation, state).
pub fn split_status_word(word: u32) -> (u32, u32) {
    (word >> 2, word & 3)
}

/// Operation codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Op {
    /// Attach to the daemon: learn the domain's id, instance and grant table size, and get its memory file.
    Hello = 1,
    /// Allocate pages of the domain's memory and grant them to a remote domain.
    GrantAlloc = 2,
    /// End grants of this domain.
    GrantEnd = 3,
    /// Map grants of a remote domain.
    Map = 4,
    /// Release a mapping made by `Map`.
    Unmap = 5,
    /// Grant copy.
    Copy = 6,
    /// Open an event-channel handle and get its status page.
    EvtchnOpen = 7,
    /// Allocate a port a remote domain may bind to.
    EvtchnAllocUnbound = 8,
    /// Bind to a remote domain's unbound port.
    EvtchnBind = 9,
    /// Close a port.
    EvtchnClose = 10,
    /// Ask what a port is connected to.
    EvtchnStatus = 11,
    /// Take over grants a migration restored (their maker's connection stayed behind on
    /// the source host).
    GrantAdopt = 12,
}

impl Op {
    /// The op with this code, if any.
    pub fn from_code(code: u16) -> Option<Op> {
        Some(match code {
            1 => Op::Hello,
            2 => Op::GrantAlloc,
            3 => Op::GrantEnd,
            4 => Op::Map,
            5 => Op::Unmap,
            6 => Op::Copy,
            7 => Op::EvtchnOpen,
            8 => Op::EvtchnAllocUnbound,
            9 => Op::EvtchnBind,
            10 => Op::EvtchnClose,
            11 => Op::EvtchnStatus,
            12 => Op::GrantAdopt,
            _ => return None,
        })
    }
}

/// One side of a copy segment as sent on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopySide {
    /// Bytes carried in the message (source: in the request; dest: in the response).
    Local,
    /// `offset` bytes into the page `domid` granted as `gref`.
    Foreign {
        /// The domain that granted the page.
        domid: DomId,
        /// The grant ref of the page in `domid`'s table.
        gref: GrantRef,
        /// Byte offset into the page.
        offset: u16,
    },
}

/// A copy segment as sent on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopySpec {
    /// Where the bytes are read from.
    pub source: CopySide,
    /// Where the bytes are written to.
    pub dest: CopySide,
    /// Bytes to copy.
    pub len: u16,
}

const SEGMENT_LEN: usize = 2 * 9 + 2;

/// A request to the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimRequest {
    /// Attach; answered with [`SimResponse::Hello`] and the domain's memory file.
    Hello,
    /// Grant `count` new pages to `remote`; answered with [`SimResponse::Granted`].
    GrantAlloc {
        /// The grantee.
        remote: DomId,
        /// Whether the grantee may map the pages writable.
        writable: bool,
        /// Pages to allocate and grant.
        count: u32,
    },
    /// End the grants `refs`; answered with [`SimResponse::Done`].
    GrantEnd {
        /// Whether grants the remote still maps are kept alive until it unmaps them (the drop path)
        /// rather than refused as busy.
        defer: bool,
        /// The grants to end.
        refs: Vec<GrantRef>,
    },
    /// Map `refs` granted by `remote`; answered with [`SimResponse::Mapped`].
    Map {
        /// The granting domain.
        remote: DomId,
        /// Whether to map writable.
        writable: bool,
        /// The grants to map, in the order of the mapping.
        refs: Vec<GrantRef>,
    },
    /// Release a mapping; answered with [`SimResponse::Done`].
    Unmap {
        /// The handle [`SimResponse::Mapped`] gave.
        handle: u64,
    },
    /// `data` is the concatenated bytes of every segment whose source is local, in order.
    Copy {
        /// The segments, in order.
        segments: Vec<CopySpec>,
        /// The local source bytes.
        data: Vec<u8>,
    },
    /// Open an event-channel handle; answered with [`SimResponse::EvtchnOpened`] and its status page.
    EvtchnOpen,
    /// Allocate a port `remote` may bind to; answered with [`SimResponse::PortOpened`].
    EvtchnAllocUnbound {
        /// The domain that may bind.
        remote: DomId,
    },
    /// Bind to `remote_port` of `remote`; answered with [`SimResponse::PortOpened`].
    EvtchnBind {
        /// The domain that allocated the port.
        remote: DomId,
        /// The port, in `remote`'s numbering.
        remote_port: Port,
    },
    /// Close `port`; answered with [`SimResponse::Done`].
    EvtchnClose {
        /// The local port.
        port: Port,
    },
    /// Ask what `port` is connected to; answered with [`SimResponse::PortStatus`].
    EvtchnStatus {
        /// The local port.
        port: Port,
    },
    /// Make this connection the owner of grants restored by a migration, as if it had
    /// made them (it may end them, they end when it closes); answered with
    /// [`SimResponse::Granted`]. Every ref must be a restored grant to `remote` with this
    /// access, not adopted yet.
    GrantAdopt {
        /// The grantee the grants name.
        remote: DomId,
        /// Whether the grants let the grantee map them writable.
        writable: bool,
        /// The grants, in page order.
        refs: Vec<GrantRef>,
    },
}

/// The fixed part of a request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    /// Protocol version of the sender (see [`VERSION`]).
    pub version: u16,
    /// Raw op code (see [`Op::from_code`]).
    pub op: u16,
    /// Sequence number, echoed by the reply.
    pub seq: u32,
}

impl RequestHeader {
    /// Read the header at the start of a request body.
    pub fn parse(body: &[u8]) -> Result<RequestHeader> {
        let mut r = SimProtoReader::new(body);
        Ok(RequestHeader {
            version: r.u16()?,
            op: r.u16()?,
            seq: r.u32()?,
        })
    }
}

impl SimRequest {
    /// This request's op code.
    pub fn op(&self) -> Op {
        match self {
            SimRequest::Hello => Op::Hello,
            SimRequest::GrantAlloc { .. } => Op::GrantAlloc,
            SimRequest::GrantEnd { .. } => Op::GrantEnd,
            SimRequest::Map { .. } => Op::Map,
            SimRequest::Unmap { .. } => Op::Unmap,
            SimRequest::Copy { .. } => Op::Copy,
            SimRequest::EvtchnOpen => Op::EvtchnOpen,
            SimRequest::EvtchnAllocUnbound { .. } => Op::EvtchnAllocUnbound,
            SimRequest::EvtchnBind { .. } => Op::EvtchnBind,
            SimRequest::EvtchnClose { .. } => Op::EvtchnClose,
            SimRequest::EvtchnStatus { .. } => Op::EvtchnStatus,
            SimRequest::GrantAdopt { .. } => Op::GrantAdopt,
        }
    }

    /// Append the body (header and payload) of this request to `out`.
    pub fn emit(&self, seq: u32, out: &mut Vec<u8>) {
        put_u16(out, VERSION);
        put_u16(out, self.op() as u16);
        put_u32(out, seq);
        match self {
            SimRequest::Hello | SimRequest::EvtchnOpen => {}
            SimRequest::GrantAlloc {
                remote,
                writable,
                count,
            } => {
                put_u16(out, *remote);
                out.push(*writable as u8);
                put_u32(out, *count);
            }
            SimRequest::GrantEnd { defer, refs } => {
                out.push(*defer as u8);
                put_u32_array(out, refs);
            }
            SimRequest::Map {
                remote,
                writable,
                refs,
            }
            | SimRequest::GrantAdopt {
                remote,
                writable,
                refs,
            } => {
                put_u16(out, *remote);
                out.push(*writable as u8);
                put_u32_array(out, refs);
            }
            SimRequest::Unmap { handle } => put_u64(out, *handle),
            SimRequest::Copy { segments, data } => {
                put_u32(out, segments.len() as u32);
                for s in segments {
                    put_side(out, &s.source);
                    put_side(out, &s.dest);
                    put_u16(out, s.len);
                }
                out.extend_from_slice(data);
            }
            SimRequest::EvtchnAllocUnbound { remote } => put_u16(out, *remote),
            SimRequest::EvtchnBind {
                remote,
                remote_port,
            } => {
                put_u16(out, *remote);
                put_u32(out, *remote_port);
            }
            SimRequest::EvtchnClose { port } | SimRequest::EvtchnStatus { port } => {
                put_u32(out, *port)
            }
        }
    }

    /// Parse a whole request body: header, then the payload of its op.
    pub fn parse(body: &[u8]) -> Result<(RequestHeader, SimRequest)> {
        let header = RequestHeader::parse(body)?;
        if header.version != VERSION {
            return Err(Error::Protocol(format!(
                "protocol version {} (this side speaks {VERSION})",
                header.version
            )));
        }
        let payload = body.get(REQUEST_HEADER_LEN..).unwrap_or(&[]);
        let req = Self::parse_payload(header.op, payload)?;
        Ok((header, req))
    }

    /// Parse the payload of a request with op code `op`.
    pub fn parse_payload(op: u16, payload: &[u8]) -> Result<SimRequest> {
        let op = Op::from_code(op).ok_or_else(|| Error::Protocol(format!("unknown op {op}")))?;
        let mut r = SimProtoReader::new(payload);
        let req = match op {
            Op::Hello => SimRequest::Hello,
            Op::EvtchnOpen => SimRequest::EvtchnOpen,
            Op::GrantAlloc => SimRequest::GrantAlloc {
                remote: r.u16()?,
                writable: r.bool()?,
                count: r.u32()?,
            },
            Op::GrantEnd => SimRequest::GrantEnd {
                defer: r.bool()?,
                refs: r.u32_array()?,
            },
            Op::Map => SimRequest::Map {
                remote: r.u16()?,
                writable: r.bool()?,
                refs: r.u32_array()?,
            },
            Op::GrantAdopt => SimRequest::GrantAdopt {
                remote: r.u16()?,
                writable: r.bool()?,
                refs: r.u32_array()?,
            },
            Op::Unmap => SimRequest::Unmap { handle: r.u64()? },
            Op::Copy => {
                let n = r.u32()? as usize;
                if n > MAX_COPY_SEGMENTS {
                    return Err(Error::Protocol(format!("{n} copy segments")));
                }
                r.need(n.saturating_mul(SEGMENT_LEN))?;
                let mut segments = Vec::with_capacity(n);
                let mut local_bytes = 0usize;
                for _ in 0..n {
                    let source = r.side()?;
                    let dest = r.side()?;
                    let len = r.u16()?;
                    if source == CopySide::Local {
                        local_bytes += len as usize;
                    }
                    segments.push(CopySpec { source, dest, len });
                }
                let data = r.bytes(local_bytes)?.to_vec();
                SimRequest::Copy { segments, data }
            }
            Op::EvtchnAllocUnbound => SimRequest::EvtchnAllocUnbound { remote: r.u16()? },
            Op::EvtchnBind => SimRequest::EvtchnBind {
                remote: r.u16()?,
                remote_port: r.u32()?,
            },
            Op::EvtchnClose => SimRequest::EvtchnClose { port: r.u32()? },
            Op::EvtchnStatus => SimRequest::EvtchnStatus { port: r.u32()? },
        };
        r.finish()?;
        Ok(req)
    }
}

/// A successful reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimResponse {
    /// Reply to [`SimRequest::Hello`].
    Hello {
        /// The domain this connection belongs to.
        domid: DomId,
        /// The daemon's id for this incarnation of the domain.
        instance: u64,
        /// Entries in the domain's grant table.
        table_size: u32,
    },
    /// Reply to [`SimRequest::GrantAlloc`] and [`SimRequest::GrantAdopt`].
    Granted {
        /// One (grant ref, frame of the domain's memory file) pair per page, in page order.
        grants: Vec<(GrantRef, u32)>,
    },
    /// Reply to a request that returns nothing.
    Done,
    /// Reply to [`SimRequest::Map`].
    Mapped {
        /// Names the mapping in [`SimRequest::Unmap`].
        handle: u64,
        /// The remote domain's instance, which keys the cache of its memory file.
        instance: u64,
        /// The frame of each mapped page in the remote's memory file, in order.
        frames: Vec<u32>,
    },
    /// `data` holds `len` bytes for every segment whose destination is local, in order.
    Copied {
        /// One status per segment: 0 or an error code ([`error_code`]).
        status: Vec<u16>,
        /// The local destination bytes.
        data: Vec<u8>,
    },
    /// Reply to [`SimRequest::EvtchnOpen`].
    EvtchnOpened {
        /// Words in the handle's status page.
        slots: u32,
    },
    /// Reply to [`SimRequest::EvtchnAllocUnbound`] and [`SimRequest::EvtchnBind`].
    PortOpened {
        /// The new local port.
        port: Port,
        /// The port's word in the handle's status page.
        slot: u32,
        /// The slot's generation at the time, to tell this port from a later user of the slot.
        generation: u32,
    },
    /// Reply to [`SimRequest::EvtchnStatus`].
    PortStatus {
        /// 1: unbound, waiting for `remote`; 2: connected to `remote_port` of `remote`.
        state: u8,
        /// The remote domain.
        remote: DomId,
        /// The remote port (0 while unbound).
        remote_port: Port,
    },
}

/// The fixed part of a response body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseHeader {
    /// Protocol version of the daemon (see [`VERSION`]).
    pub version: u16,
    /// Op code of the request answered.
    pub op: u16,
    /// Sequence number of the request answered.
    pub seq: u32,
    /// 0, or the error code of a failure ([`error_code`]).
    pub status: u16,
    /// File descriptors attached to the response.
    pub nfds: u16,
}

impl ResponseHeader {
    /// Read the header at the start of a response body.
    pub fn parse(body: &[u8]) -> Result<ResponseHeader> {
        let mut r = SimProtoReader::new(body);
        Ok(ResponseHeader {
            version: r.u16()?,
            op: r.u16()?,
            seq: r.u32()?,
            status: r.u16()?,
            nfds: r.u16()?,
        })
    }
}

fn put_response_header(out: &mut Vec<u8>, op: u16, seq: u32, status: u16, nfds: u16) {
    put_u16(out, VERSION);
    put_u16(out, op);
    put_u32(out, seq);
    put_u16(out, status);
    put_u16(out, nfds);
}

/// Append an error reply body to `out`.
pub fn emit_error(op: u16, seq: u32, error: &Error, out: &mut Vec<u8>) {
    put_response_header(out, op, seq, error_code(error), 0);
    let msg = error_message(error);
    // Messages are informative only; a bounded length keeps replies small.
    let cut = floor_char_boundary(&msg, 1024);
    out.extend_from_slice(&msg.as_bytes()[..cut]);
}

fn floor_char_boundary(s: &str, max: usize) -> usize {
    if s.len() <= max {
        return s.len();
    }
    let mut i = max;
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl SimResponse {
    /// Append the body of this reply to `out`; `nfds` descriptors travel with it.
    pub fn emit(&self, op: Op, seq: u32, nfds: u16, out: &mut Vec<u8>) {
        put_response_header(out, op as u16, seq, 0, nfds);
        match self {
            SimResponse::Done => {}
            SimResponse::Hello {
                domid,
                instance,
                table_size,
            } => {
                put_u16(out, *domid);
                put_u64(out, *instance);
                put_u32(out, *table_size);
            }
            SimResponse::Granted { grants } => {
                put_u32(out, grants.len() as u32);
                for (r, f) in grants {
                    put_u32(out, *r);
                    put_u32(out, *f);
                }
            }
            SimResponse::Mapped {
                handle,
                instance,
                frames,
            } => {
                put_u64(out, *handle);
                put_u64(out, *instance);
                put_u32_array(out, frames);
            }
            SimResponse::Copied { status, data } => {
                put_u32(out, status.len() as u32);
                for s in status {
                    put_u16(out, *s);
                }
                out.extend_from_slice(data);
            }
            SimResponse::EvtchnOpened { slots } => put_u32(out, *slots),
            SimResponse::PortOpened {
                port,
                slot,
                generation,
            } => {
                put_u32(out, *port);
                put_u32(out, *slot);
                put_u32(out, *generation);
            }
            SimResponse::PortStatus {
                state,
                remote,
                remote_port,
            } => {
                out.push(*state);
                put_u16(out, *remote);
                put_u32(out, *remote_port);
            }
        }
    }

    /// Parse a whole reply body to a request of op `expect_op` with sequence `expect_seq`.
    /// Returns the reply and how many descriptors it says are attached; an error reply
    /// becomes the error it carries.
    pub fn parse(body: &[u8], expect_op: Op, expect_seq: u32) -> Result<(SimResponse, usize)> {
        let h = ResponseHeader::parse(body)?;
        if h.version != VERSION {
            return Err(Error::Protocol(format!(
                "daemon speaks protocol version {}",
                h.version
            )));
        }
        if h.seq != expect_seq || (h.status == 0 && h.op != expect_op as u16) {
            return Err(Error::Protocol(format!(
                "reply op {} seq {} to op {} seq {expect_seq}",
                h.op, h.seq, expect_op as u16
            )));
        }
        let payload = body.get(RESPONSE_HEADER_LEN..).unwrap_or(&[]);
        if h.status != 0 {
            let msg = String::from_utf8_lossy(payload).into_owned();
            return Err(error_from_code(h.status, msg));
        }
        let mut r = SimProtoReader::new(payload);
        let resp = match expect_op {
            Op::Hello => SimResponse::Hello {
                domid: r.u16()?,
                instance: r.u64()?,
                table_size: r.u32()?,
            },
            Op::GrantAlloc | Op::GrantAdopt => {
                let n = r.u32()? as usize;
                r.need(n.saturating_mul(8))?;
                let mut grants = Vec::with_capacity(n);
                for _ in 0..n {
                    grants.push((r.u32()?, r.u32()?));
                }
                SimResponse::Granted { grants }
            }
            Op::GrantEnd | Op::Unmap | Op::EvtchnClose => SimResponse::Done,
            Op::Map => SimResponse::Mapped {
                handle: r.u64()?,
                instance: r.u64()?,
                frames: r.u32_array()?,
            },
            Op::Copy => {
                let n = r.u32()? as usize;
                r.need(n.saturating_mul(2))?;
                let mut status = Vec::with_capacity(n);
                for _ in 0..n {
                    status.push(r.u16()?);
                }
                let data = r.rest().to_vec();
                SimResponse::Copied { status, data }
            }
            Op::EvtchnOpen => SimResponse::EvtchnOpened { slots: r.u32()? },
            Op::EvtchnAllocUnbound | Op::EvtchnBind => SimResponse::PortOpened {
                port: r.u32()?,
                slot: r.u32()?,
                generation: r.u32()?,
            },
            Op::EvtchnStatus => SimResponse::PortStatus {
                state: r.u8()?,
                remote: r.u16()?,
                remote_port: r.u32()?,
            },
        };
        r.finish()?;
        Ok((resp, h.nfds as usize))
    }
}

/// The wire code of an error (never 0).
pub fn error_code(e: &Error) -> u16 {
    match e {
        Error::NotFound(_) => 1,
        Error::Denied(_) => 2,
        Error::Busy(_) => 3,
        Error::Again => 4,
        Error::Exists(_) => 5,
        Error::Invalid(_) => 6,
        Error::Quota(_) => 7,
        Error::Unsupported(_) => 8,
        Error::Closed(_) => 9,
        Error::Protocol(_) => 10,
        Error::Xs(_) => 11,
        Error::Io(_) => 12,
    }
}

fn error_message(e: &Error) -> String {
    match e {
        Error::NotFound(m)
        | Error::Denied(m)
        | Error::Busy(m)
        | Error::Exists(m)
        | Error::Invalid(m)
        | Error::Quota(m)
        | Error::Unsupported(m)
        | Error::Closed(m)
        | Error::Protocol(m)
        | Error::Xs(m) => m.clone(),
        Error::Again => String::new(),
        Error::Io(io) => io.to_string(),
    }
}

/// The error a wire code and message stand for.
pub fn error_from_code(code: u16, message: String) -> Error {
    match code {
        1 => Error::NotFound(message),
        2 => Error::Denied(message),
        3 => Error::Busy(message),
        4 => Error::Again,
        5 => Error::Exists(message),
        6 => Error::Invalid(message),
        7 => Error::Quota(message),
        8 => Error::Unsupported(message),
        9 => Error::Closed(message),
        10 => Error::Protocol(message),
        11 => Error::Xs(message),
        12 => Error::Io(std::io::Error::other(message)),
        _ => Error::Protocol(format!("error code {code}: {message}")),
    }
}

fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u32_array(out: &mut Vec<u8>, v: &[u32]) {
    put_u32(out, v.len() as u32);
    out.reserve(v.len() * 4);
    for x in v {
        put_u32(out, *x);
    }
}
fn put_side(out: &mut Vec<u8>, side: &CopySide) {
    match side {
        CopySide::Local => {
            out.push(0);
            put_u16(out, 0);
            put_u32(out, 0);
            put_u16(out, 0);
        }
        CopySide::Foreign {
            domid,
            gref,
            offset,
        } => {
            out.push(1);
            put_u16(out, *domid);
            put_u32(out, *gref);
            put_u16(out, *offset);
        }
    }
}

/// A bounds-checked little-endian cursor; running short is a protocol error.
struct SimProtoReader<'a> {
    buf: &'a [u8],
}

impl<'a> SimProtoReader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        SimProtoReader { buf }
    }
    fn need(&self, n: usize) -> Result<()> {
        if self.buf.len() < n {
            Err(Error::Protocol(format!(
                "truncated message: need {n} more bytes, have {}",
                self.buf.len()
            )))
        } else {
            Ok(())
        }
    }
    fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        self.need(n)?;
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let b = self.bytes(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }
    fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(Error::Protocol(format!("boolean byte {v}"))),
        }
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn u32_array(&mut self) -> Result<Vec<u32>> {
        let n = self.u32()? as usize;
        // Check the bytes are there before allocating: a hostile count must not
        // make us reserve memory.
        self.need(n.saturating_mul(4))?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.u32()?);
        }
        Ok(v)
    }
    fn side(&mut self) -> Result<CopySide> {
        let kind = self.u8()?;
        let domid = self.u16()?;
        let gref = self.u32()?;
        let offset = self.u16()?;
        match kind {
            0 => Ok(CopySide::Local),
            1 => Ok(CopySide::Foreign {
                domid,
                gref,
                offset,
            }),
            k => Err(Error::Protocol(format!("copy side kind {k}"))),
        }
    }
    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
    fn finish(&self) -> Result<()> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(Error::Protocol(format!(
                "{} trailing bytes in message",
                self.buf.len()
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_requests() -> Vec<SimRequest> {
        vec![
            SimRequest::Hello,
            SimRequest::GrantAlloc {
                remote: 3,
                writable: true,
                count: 2048,
            },
            SimRequest::GrantEnd {
                defer: true,
                refs: vec![8, 9, 10],
            },
            SimRequest::Map {
                remote: 0,
                writable: false,
                refs: vec![100, 4000],
            },
            SimRequest::Unmap { handle: 1 << 40 },
            SimRequest::Copy {
                segments: vec![
                    CopySpec {
                        source: CopySide::Local,
                        dest: CopySide::Foreign {
                            domid: 2,
                            gref: 9,
                            offset: 100,
                        },
                        len: 3,
                    },
                    CopySpec {
                        source: CopySide::Foreign {
                            domid: 2,
                            gref: 9,
                            offset: 0,
                        },
                        dest: CopySide::Local,
                        len: 4096,
                    },
                ],
                data: vec![1, 2, 3],
            },
            SimRequest::EvtchnOpen,
            SimRequest::EvtchnAllocUnbound { remote: 1 },
            SimRequest::EvtchnBind {
                remote: 1,
                remote_port: 5,
            },
            SimRequest::EvtchnClose { port: 7 },
            SimRequest::EvtchnStatus { port: 7 },
            SimRequest::GrantAdopt {
                remote: 0,
                writable: true,
                refs: vec![8, 12],
            },
        ]
    }

    #[test]
    fn requests_round_trip() {
        for (i, req) in sample_requests().into_iter().enumerate() {
            let mut body = Vec::new();
            req.emit(i as u32, &mut body);
            let (h, back) = SimRequest::parse(&body).unwrap();
            assert_eq!(h.seq, i as u32);
            assert_eq!(h.op, req.op() as u16);
            assert_eq!(back, req);
        }
    }

    #[test]
    fn request_bytes_are_little_endian_as_documented() {
        let mut body = Vec::new();
        SimRequest::Map {
            remote: 0x0102,
            writable: true,
            refs: vec![0x0a0b0c0d],
        }
        .emit(0x11223344, &mut body);
        assert_eq!(
            body,
            [
                1, 0, // version
                4, 0, // op Map
                0x44, 0x33, 0x22, 0x11, // seq
                0x02, 0x01, // remote
                1,    // writable
                1, 0, 0, 0, // count
                0x0d, 0x0c, 0x0b, 0x0a
            ]
        );
    }

    #[test]
    fn every_truncation_of_every_request_is_an_error() {
        for req in sample_requests() {
            let mut body = Vec::new();
            req.emit(1, &mut body);
            for cut in 0..body.len() {
                let r = SimRequest::parse(&body[..cut]);
                assert!(matches!(r, Err(Error::Protocol(_))), "{req:?} cut at {cut}");
            }
            let mut longer = body.clone();
            longer.push(0);
            assert!(matches!(
                SimRequest::parse(&longer),
                Err(Error::Protocol(_))
            ));
        }
    }

    #[test]
    fn hostile_counts_do_not_allocate_or_panic() {
        let mut body = Vec::new();
        SimRequest::Map {
            remote: 1,
            writable: false,
            refs: vec![],
        }
        .emit(0, &mut body);
        let n = body.len();
        body[n - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(SimRequest::parse(&body), Err(Error::Protocol(_))));

        let mut copy = Vec::new();
        SimRequest::Copy {
            segments: vec![],
            data: vec![],
        }
        .emit(0, &mut copy);
        let n = copy.len();
        copy[n - 4..].copy_from_slice(&(MAX_COPY_SEGMENTS as u32 + 1).to_le_bytes());
        assert!(matches!(SimRequest::parse(&copy), Err(Error::Protocol(_))));
    }

    #[test]
    fn unknown_op_version_and_bool_are_rejected() {
        let mut body = Vec::new();
        SimRequest::Hello.emit(0, &mut body);
        body[2] = 99;
        assert!(matches!(SimRequest::parse(&body), Err(Error::Protocol(_))));

        let mut body = Vec::new();
        SimRequest::Hello.emit(0, &mut body);
        body[0] = 2;
        assert!(matches!(SimRequest::parse(&body), Err(Error::Protocol(_))));

        let mut body = Vec::new();
        SimRequest::GrantAlloc {
            remote: 1,
            writable: true,
            count: 1,
        }
        .emit(0, &mut body);
        body[REQUEST_HEADER_LEN + 2] = 7;
        assert!(matches!(SimRequest::parse(&body), Err(Error::Protocol(_))));
    }

    #[test]
    fn pseudo_random_garbage_never_panics() {
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for len in 0..600usize {
            let mut buf = Vec::with_capacity(len);
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                buf.push(x as u8);
            }
            if buf.len() >= 4 {
                buf[0] = 1;
                buf[1] = 0;
                buf[2] = (x % 13) as u8;
                buf[3] = 0;
            }
            let _ = SimRequest::parse(&buf);
            for op in 1..=12 {
                let _ = SimResponse::parse(&buf, Op::from_code(op).unwrap(), 0);
            }
        }
    }

    #[test]
    fn responses_round_trip() {
        let cases = vec![
            (
                Op::Hello,
                SimResponse::Hello {
                    domid: 4,
                    instance: 77,
                    table_size: 32768,
                },
            ),
            (
                Op::GrantAlloc,
                SimResponse::Granted {
                    grants: vec![(8, 0), (9, 1)],
                },
            ),
            (Op::GrantEnd, SimResponse::Done),
            (
                Op::GrantAdopt,
                SimResponse::Granted {
                    grants: vec![(10, 2)],
                },
            ),
            (
                Op::Map,
                SimResponse::Mapped {
                    handle: 3,
                    instance: 9,
                    frames: vec![5, 6, 7],
                },
            ),
            (
                Op::Copy,
                SimResponse::Copied {
                    status: vec![0, 2],
                    data: vec![9; 10],
                },
            ),
            (Op::EvtchnOpen, SimResponse::EvtchnOpened { slots: 1024 }),
            (
                Op::EvtchnBind,
                SimResponse::PortOpened {
                    port: 3,
                    slot: 0,
                    generation: 12,
                },
            ),
            (
                Op::EvtchnStatus,
                SimResponse::PortStatus {
                    state: 2,
                    remote: 1,
                    remote_port: 4,
                },
            ),
        ];
        for (op, resp) in cases {
            let mut body = Vec::new();
            resp.emit(op, 42, 2, &mut body);
            let (back, nfds) = SimResponse::parse(&body, op, 42).unwrap();
            assert_eq!(back, resp);
            assert_eq!(nfds, 2);
            assert!(SimResponse::parse(&body, op, 43).is_err());
        }
    }

    #[test]
    fn error_replies_carry_kind_and_message() {
        let errors = [
            Error::NotFound("a".into()),
            Error::Denied("b".into()),
            Error::Busy("c".into()),
            Error::Again,
            Error::Exists("d".into()),
            Error::Invalid("e".into()),
            Error::Quota("f".into()),
            Error::Unsupported("g".into()),
            Error::Closed("h".into()),
            Error::Protocol("i".into()),
            Error::Xs("j".into()),
        ];
        for e in errors {
            let mut body = Vec::new();
            emit_error(Op::Map as u16, 5, &e, &mut body);
            let got = SimResponse::parse(&body, Op::Map, 5).unwrap_err();
            assert_eq!(format!("{got}"), format!("{e}"));
            assert_eq!(error_code(&got), error_code(&e));
        }
    }

    #[test]
    fn status_words_split_back() {
        let w = status_word(12345, PORT_BOUND);
        assert_eq!(split_status_word(w), (12345, PORT_BOUND));
        let w = status_word(GENERATION_MASK + 5, PORT_PEER_CLOSED);
        assert_eq!(split_status_word(w), (4, PORT_PEER_CLOSED));
    }
}

//! The request protocol between applications and `xmx-frontd`.
//!
//! A unix stream socket; each message is framed by [`xmx_hv::handoff::send_message`] (a
//! little-endian `u32` length, then the body, descriptors attached as `SCM_RIGHTS`).
//! Body: `kind u8 | op u8 | seq u32 | payload`, integers little-endian.
//!
//! | kind | op | payload | descriptors |
//! |------|----|---------|-------------|
//! | request | INFO | – | – |
//! | request | OPEN_ENDPOINT | `endpoint u8` (255: any), `has_geometry u8`, `send_ring u8, event_ring u8, send_queue u16, recv_queue u16` | – |
//! | request | CLOSE_ENDPOINT | `endpoint u8` | – |
//! | request | REGISTER_REGION | `endpoint u8, length u32` | – |
//! | request | DEREGISTER_REGION | `endpoint u8, region_id u8` | – |
//! | request | REMAPPED | `endpoint u8, generation u32` | – |
//! | reply | OK | – | – |
//! | reply | ERROR | `code u8, ctrl_kind u8, ctrl_status u32, message str` | – |
//! | reply | INFO | [`FrontdBoardInfo`] | – |
//! | reply | ENDPOINT | [`EndpointHandoff`] | pages, port |
//! | reply | REGION | [`RegionHandoff`] | pages |
//! | notice | REOPENED | [`EndpointHandoff`] | pages, port |
//! | notice | LOST | `endpoint u8, reason str` | – |
//! | notice | DISCONNECTED / CONNECTED / SHUTDOWN | – | – |
//!
//! A reply carries its request's `seq`; notices (seq 0) come unsolicited, between replies.
//! Strings are `u16` length + UTF-8. Requests are answered in order.

use std::collections::VecDeque;
use std::os::fd::{BorrowedFd, OwnedFd};

use xmx_wire::msg::{CtrlKind, CtrlStatus, EndpointPages};
use xmx_wire::mxoe::Mac;

use crate::error::{Error, Result};
use crate::handoff::{put_string, EndpointHandoff, Fields, RegionHandoff};

/// Largest message body either side accepts.
pub const MAX_MESSAGE: usize = 1 << 20;
/// Longest string carried.
pub const MAX_STRING: usize = 1024;
/// Where the daemon listens unless told otherwise (`--socket`, `XMX_FRONTD_SOCKET`).
pub const DEFAULT_SOCKET: &str = "/run/xmx/frontd.sock";
/// The environment variable naming the daemon's socket.
pub const SOCKET_ENV: &str = "XMX_FRONTD_SOCKET";

const KIND_REQUEST: u8 = 1;
const KIND_REPLY: u8 = 2;
const KIND_NOTICE: u8 = 3;

const OP_INFO: u8 = 1;
const OP_OPEN_ENDPOINT: u8 = 2;
const OP_CLOSE_ENDPOINT: u8 = 3;
const OP_REGISTER_REGION: u8 = 4;
const OP_DEREGISTER_REGION: u8 = 5;
const OP_REMAPPED: u8 = 6;
const OP_REGION_PAGES: u8 = 7;

const REPLY_OK: u8 = 1;
const REPLY_ERROR: u8 = 2;
const REPLY_INFO: u8 = 3;
const REPLY_ENDPOINT: u8 = 4;
const REPLY_REGION: u8 = 5;

const NOTICE_REOPENED: u8 = 1;
const NOTICE_LOST: u8 = 2;
const NOTICE_DISCONNECTED: u8 = 3;
const NOTICE_CONNECTED: u8 = 4;
const NOTICE_SHUTDOWN: u8 = 5;
const NOTICE_GRANTS_SHORT: u8 = 6;

const ANY_ENDPOINT: u8 = u8::MAX;
/// OPEN_ENDPOINT's option bits: a geometry follows; quiet send completions.
const OPEN_HAS_GEOMETRY: u8 = 0x01;
const OPEN_QUIET_SEND_DONE: u8 = 0x02;

/// The socket path from `XMX_FRONTD_SOCKET`, else [`DEFAULT_SOCKET`].
pub fn default_socket_path() -> std::path::PathBuf {
    std::env::var_os(SOCKET_ENV)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| DEFAULT_SOCKET.into())
}

/// What an application asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrontdRequest {
    /// The board: MAC, hostname, limits.
    Info,
    /// Open an endpoint (index, or any free one) with a geometry (or the daemon's).
    OpenEndpoint {
        /// The endpoint index wanted; `None` for any free one.
        endpoint: Option<u8>,
        /// How many pages of each kind; `None` for the daemon's default.
        geometry: Option<EndpointPages>,
        /// The application waits for no send's completion but a MEDIUM's
        /// (`xmx_wire::msg::EndpointOpen::quiet_send_done`).
        quiet_send_done: bool,
    },
    /// Close an endpoint; the application has unmapped its pages.
    CloseEndpoint {
        /// The endpoint, one this application opened.
        endpoint: u8,
    },
    /// Register a region of `length` bytes.
    RegisterRegion {
        /// The endpoint the region belongs to, one this application opened.
        endpoint: u8,
        /// Bytes the region's window must hold.
        length: u32,
    },
    /// Deregister a region; the application has unmapped its window.
    DeregisterRegion {
        /// The endpoint the region belongs to.
        endpoint: u8,
        /// The region, one this application registered.
        region_id: u8,
    },
    /// The pages of a region as they are now (granted anew after the domain moved, see
    /// [`crate::EndpointHandoff::regions_moved`]); answered with a
    /// [`FrontdReply::Region`].
    RegionPages {
        /// The endpoint the region belongs to.
        endpoint: u8,
        /// The region, one this application registered.
        region_id: u8,
    },
    /// The application remapped `endpoint` at `generation`; older pages may go.
    Remapped {
        /// The endpoint, one this application opened.
        endpoint: u8,
        /// The generation of the [`EndpointHandoff`] now mapped.
        generation: u32,
    },
}

/// The board as the daemon sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontdBoardInfo {
    /// Whether the device is connected to its backend now.
    pub connected: bool,
    /// The guest's domain id.
    pub domid: u16,
    /// Board MAC (the MX NIC id).
    pub mac: Mac,
    /// Virtual cluster.
    pub cluster: u32,
    /// MX hostname.
    pub hostname: String,
    /// Endpoints the guest may open.
    pub max_endpoints: u32,
    /// Regions per endpoint.
    pub max_regions: u32,
    /// Whether co-located guests are served without the wire.
    pub local_delivery: bool,
}

/// Why a request failed, as sent back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrontdErrorCode {
    /// The backend refused (with a control status).
    Refused = 1,
    /// The device is not connected to its backend.
    NotConnected = 2,
    /// An argument is out of range, or names an endpoint or region of another application.
    Invalid = 3,
    /// Every endpoint index or region id is taken.
    Exhausted = 4,
    /// The backend or the device did not respond in time.
    Timeout = 5,
    /// Anything else (platform, protocol).
    Failed = 6,
}

/// An error reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorReply {
    /// What kind of failure.
    pub code: FrontdErrorCode,
    /// For [`FrontdErrorCode::Refused`]: what the backend refused and why.
    pub refused: Option<(CtrlKind, CtrlStatus)>,
    /// The daemon's description of the failure.
    pub message: String,
}

impl ErrorReply {
    /// The reply describing `e`.
    pub fn from_error(e: &Error) -> ErrorReply {
        let (code, refused) = match e {
            Error::Refused { op, status } => (FrontdErrorCode::Refused, Some((*op, *status))),
            Error::NotConnected(_) => (FrontdErrorCode::NotConnected, None),
            Error::Invalid(_) => (FrontdErrorCode::Invalid, None),
            Error::Exhausted(_) => (FrontdErrorCode::Exhausted, None),
            Error::Timeout(_) => (FrontdErrorCode::Timeout, None),
            _ => (FrontdErrorCode::Failed, None),
        };
        // What ran out, alone: the application's side words it again.
        let message = match e {
            Error::Exhausted(what) => what.to_string(),
            _ => e.to_string(),
        };
        ErrorReply {
            code,
            refused,
            message,
        }
    }

    /// The error this reply stands for, on the application's side.
    pub fn into_error(self) -> Error {
        match (self.code, self.refused) {
            (FrontdErrorCode::Refused, Some((op, status))) => Error::Refused { op, status },
            (FrontdErrorCode::NotConnected, _) => Error::NotConnected(self.message),
            (FrontdErrorCode::Invalid, _) => Error::Invalid(self.message),
            (FrontdErrorCode::Exhausted, _) => Error::Exhausted(self.message.into()),
            (FrontdErrorCode::Timeout, _) => Error::Timeout(self.message),
            _ => Error::Protocol(format!("xmx-frontd: {}", self.message)),
        }
    }
}

/// What the daemon answers.
#[derive(Debug)]
pub enum FrontdReply {
    /// Done: the answer to [`FrontdRequest::CloseEndpoint`], [`FrontdRequest::DeregisterRegion`] and
    /// [`FrontdRequest::Remapped`].
    Ok,
    /// The request failed.
    Error(ErrorReply),
    /// The answer to [`FrontdRequest::Info`].
    Info(FrontdBoardInfo),
    /// The answer to [`FrontdRequest::OpenEndpoint`]: the endpoint, its pages and its port.
    Endpoint(EndpointHandoff),
    /// The answer to [`FrontdRequest::RegisterRegion`]: the region and its window's pages.
    Region(RegionHandoff),
}

/// What the daemon says unasked.
#[derive(Debug)]
pub enum Notice {
    /// An endpoint was opened again after a reconnection: remap it, then say
    /// [`FrontdRequest::Remapped`].
    EndpointReopened(EndpointHandoff),
    /// An endpoint could not be opened again; it is gone.
    EndpointLost {
        /// The endpoint's index.
        endpoint: u8,
        /// Why opening it again failed.
        reason: String,
    },
    /// The device lost its backend.
    Disconnected,
    /// The device is connected again.
    Connected,
    /// The daemon is stopping: unmap everything and close the connection.
    Shutdown,
    /// A registration of the guest failed for want of grants: give back the windows
    /// your registration caches keep unused (another process, or another endpoint of
    /// yours, waits for their room).
    GrantsShort,
    /// A notice of a kind this side does not know (from a newer daemon), its body and
    /// descriptors dropped: nothing asks for an answer to a notice, so an application
    /// ignores it rather than taking the daemon for broken.
    Unknown(u8),
}

/// One message either way.
#[derive(Debug)]
pub enum FrontdMessage {
    /// From an application.
    Request {
        /// Chosen by the application (never 0); its reply carries it back.
        seq: u32,
        /// What it asks.
        request: FrontdRequest,
    },
    /// From the daemon, to one request.
    Reply {
        /// The request's `seq`.
        seq: u32,
        /// The answer.
        reply: FrontdReply,
    },
    /// From the daemon, unasked (sent with seq 0).
    Notice(Notice),
}

impl FrontdMessage {
    /// Encode; the descriptors borrow from `self`.
    pub fn emit(&self) -> (Vec<u8>, Vec<BorrowedFd<'_>>) {
        let mut out = Vec::with_capacity(64);
        let mut fds = Vec::new();
        match self {
            FrontdMessage::Request { seq, request } => {
                let op = match request {
                    FrontdRequest::Info => OP_INFO,
                    FrontdRequest::OpenEndpoint { .. } => OP_OPEN_ENDPOINT,
                    FrontdRequest::CloseEndpoint { .. } => OP_CLOSE_ENDPOINT,
                    FrontdRequest::RegisterRegion { .. } => OP_REGISTER_REGION,
                    FrontdRequest::DeregisterRegion { .. } => OP_DEREGISTER_REGION,
                    FrontdRequest::RegionPages { .. } => OP_REGION_PAGES,
                    FrontdRequest::Remapped { .. } => OP_REMAPPED,
                };
                header(&mut out, KIND_REQUEST, op, *seq);
                match request {
                    FrontdRequest::Info => {}
                    FrontdRequest::OpenEndpoint {
                        endpoint,
                        geometry,
                        quiet_send_done,
                    } => {
                        out.push(endpoint.unwrap_or(ANY_ENDPOINT));
                        let g = geometry.unwrap_or(EndpointPages {
                            send_ring: 0,
                            event_ring: 0,
                            send_queue: 0,
                            recv_queue: 0,
                        });
                        let mut options = 0;
                        if geometry.is_some() {
                            options |= OPEN_HAS_GEOMETRY;
                        }
                        if *quiet_send_done {
                            options |= OPEN_QUIET_SEND_DONE;
                        }
                        out.push(options);
                        out.push(g.send_ring);
                        out.push(g.event_ring);
                        out.extend_from_slice(&g.send_queue.to_le_bytes());
                        out.extend_from_slice(&g.recv_queue.to_le_bytes());
                    }
                    FrontdRequest::CloseEndpoint { endpoint } => out.push(*endpoint),
                    FrontdRequest::RegisterRegion { endpoint, length } => {
                        out.push(*endpoint);
                        out.extend_from_slice(&length.to_le_bytes());
                    }
                    FrontdRequest::DeregisterRegion {
                        endpoint,
                        region_id,
                    }
                    | FrontdRequest::RegionPages {
                        endpoint,
                        region_id,
                    } => out.extend_from_slice(&[*endpoint, *region_id]),
                    FrontdRequest::Remapped {
                        endpoint,
                        generation,
                    } => {
                        out.push(*endpoint);
                        out.extend_from_slice(&generation.to_le_bytes());
                    }
                }
            }
            FrontdMessage::Reply { seq, reply } => match reply {
                FrontdReply::Ok => header(&mut out, KIND_REPLY, REPLY_OK, *seq),
                FrontdReply::Error(e) => {
                    header(&mut out, KIND_REPLY, REPLY_ERROR, *seq);
                    out.push(e.code as u8);
                    let (kind, status) = e
                        .refused
                        .map(|(k, s)| (u8::from(k), u32::from(s)))
                        .unwrap_or((0, 0));
                    out.push(kind);
                    out.extend_from_slice(&status.to_le_bytes());
                    put_string(&mut out, &e.message);
                }
                FrontdReply::Info(i) => {
                    header(&mut out, KIND_REPLY, REPLY_INFO, *seq);
                    out.push(u8::from(i.connected));
                    out.extend_from_slice(&i.domid.to_le_bytes());
                    out.extend_from_slice(&i.mac.0);
                    out.extend_from_slice(&i.cluster.to_le_bytes());
                    put_string(&mut out, &i.hostname);
                    out.extend_from_slice(&i.max_endpoints.to_le_bytes());
                    out.extend_from_slice(&i.max_regions.to_le_bytes());
                    out.push(u8::from(i.local_delivery));
                }
                FrontdReply::Endpoint(h) => {
                    header(&mut out, KIND_REPLY, REPLY_ENDPOINT, *seq);
                    h.emit(&mut out, &mut fds);
                }
                FrontdReply::Region(h) => {
                    header(&mut out, KIND_REPLY, REPLY_REGION, *seq);
                    h.emit(&mut out, &mut fds);
                }
            },
            FrontdMessage::Notice(n) => match n {
                Notice::EndpointReopened(h) => {
                    header(&mut out, KIND_NOTICE, NOTICE_REOPENED, 0);
                    h.emit(&mut out, &mut fds);
                }
                Notice::EndpointLost { endpoint, reason } => {
                    header(&mut out, KIND_NOTICE, NOTICE_LOST, 0);
                    out.push(*endpoint);
                    put_string(&mut out, reason);
                }
                Notice::Disconnected => header(&mut out, KIND_NOTICE, NOTICE_DISCONNECTED, 0),
                Notice::Connected => header(&mut out, KIND_NOTICE, NOTICE_CONNECTED, 0),
                Notice::Shutdown => header(&mut out, KIND_NOTICE, NOTICE_SHUTDOWN, 0),
                Notice::GrantsShort => header(&mut out, KIND_NOTICE, NOTICE_GRANTS_SHORT, 0),
                Notice::Unknown(kind) => header(&mut out, KIND_NOTICE, *kind, 0),
            },
        }
        (out, fds)
    }

    /// Decode a body and the descriptors that came with it. Untrusted: every field is
    /// checked, trailing bytes and unused descriptors are refused.
    pub fn parse(body: &[u8], fds: Vec<OwnedFd>) -> Result<FrontdMessage> {
        let mut fds: VecDeque<OwnedFd> = fds.into();
        let mut f = Fields(body);
        let kind = f.u8()?;
        let op = f.u8()?;
        let seq = f.u32()?;
        let msg = match kind {
            KIND_REQUEST => {
                let request = match op {
                    OP_INFO => FrontdRequest::Info,
                    OP_OPEN_ENDPOINT => {
                        let endpoint = f.u8()?;
                        let options = f.u8()?;
                        if options & !(OPEN_HAS_GEOMETRY | OPEN_QUIET_SEND_DONE) != 0 {
                            return Err(Error::Protocol(format!(
                                "endpoint open options {options:#x}"
                            )));
                        }
                        let has = options & OPEN_HAS_GEOMETRY != 0;
                        let g = EndpointPages {
                            send_ring: f.u8()?,
                            event_ring: f.u8()?,
                            send_queue: f.u16()?,
                            recv_queue: f.u16()?,
                        };
                        FrontdRequest::OpenEndpoint {
                            endpoint: (endpoint != ANY_ENDPOINT).then_some(endpoint),
                            geometry: has.then_some(g),
                            quiet_send_done: options & OPEN_QUIET_SEND_DONE != 0,
                        }
                    }
                    OP_CLOSE_ENDPOINT => FrontdRequest::CloseEndpoint { endpoint: f.u8()? },
                    OP_REGISTER_REGION => FrontdRequest::RegisterRegion {
                        endpoint: f.u8()?,
                        length: f.u32()?,
                    },
                    OP_DEREGISTER_REGION => FrontdRequest::DeregisterRegion {
                        endpoint: f.u8()?,
                        region_id: f.u8()?,
                    },
                    OP_REGION_PAGES => FrontdRequest::RegionPages {
                        endpoint: f.u8()?,
                        region_id: f.u8()?,
                    },
                    OP_REMAPPED => FrontdRequest::Remapped {
                        endpoint: f.u8()?,
                        generation: f.u32()?,
                    },
                    other => return Err(Error::Protocol(format!("unknown request {other}"))),
                };
                FrontdMessage::Request { seq, request }
            }
            KIND_REPLY => {
                let reply = match op {
                    REPLY_OK => FrontdReply::Ok,
                    REPLY_ERROR => {
                        let code = match f.u8()? {
                            1 => FrontdErrorCode::Refused,
                            2 => FrontdErrorCode::NotConnected,
                            3 => FrontdErrorCode::Invalid,
                            4 => FrontdErrorCode::Exhausted,
                            5 => FrontdErrorCode::Timeout,
                            _ => FrontdErrorCode::Failed,
                        };
                        let kind = f.u8()?;
                        let status = f.u32()?;
                        let refused = if code == FrontdErrorCode::Refused {
                            Some((CtrlKind::try_from(kind)?, CtrlStatus::try_from(status)?))
                        } else {
                            None
                        };
                        FrontdReply::Error(ErrorReply {
                            code,
                            refused,
                            message: f.string(MAX_STRING)?,
                        })
                    }
                    REPLY_INFO => {
                        let connected = flag(f.u8()?)?;
                        let domid = f.u16()?;
                        let mut mac = [0u8; 6];
                        mac.copy_from_slice(f.bytes(6)?);
                        FrontdReply::Info(FrontdBoardInfo {
                            connected,
                            domid,
                            mac: Mac(mac),
                            cluster: f.u32()?,
                            hostname: f.string(MAX_STRING)?,
                            max_endpoints: f.u32()?,
                            max_regions: f.u32()?,
                            local_delivery: flag(f.u8()?)?,
                        })
                    }
                    REPLY_ENDPOINT => {
                        FrontdReply::Endpoint(EndpointHandoff::parse(&mut f.0, &mut fds)?)
                    }
                    REPLY_REGION => FrontdReply::Region(RegionHandoff::parse(&mut f.0, &mut fds)?),
                    other => return Err(Error::Protocol(format!("unknown reply {other}"))),
                };
                FrontdMessage::Reply { seq, reply }
            }
            KIND_NOTICE => FrontdMessage::Notice(match op {
                NOTICE_REOPENED => {
                    Notice::EndpointReopened(EndpointHandoff::parse(&mut f.0, &mut fds)?)
                }
                NOTICE_LOST => Notice::EndpointLost {
                    endpoint: f.u8()?,
                    reason: f.string(MAX_STRING)?,
                },
                NOTICE_DISCONNECTED => Notice::Disconnected,
                NOTICE_CONNECTED => Notice::Connected,
                NOTICE_SHUTDOWN => Notice::Shutdown,
                NOTICE_GRANTS_SHORT => Notice::GrantsShort,
                other => {
                    f.0 = &[];
                    fds.clear();
                    Notice::Unknown(other)
                }
            }),
            other => return Err(Error::Protocol(format!("unknown message kind {other}"))),
        };
        if !f.0.is_empty() {
            return Err(Error::Protocol(format!("{} trailing bytes", f.0.len())));
        }
        if !fds.is_empty() {
            return Err(Error::Protocol(format!(
                "{} unexpected descriptors",
                fds.len()
            )));
        }
        Ok(msg)
    }
}

fn header(out: &mut Vec<u8>, kind: u8, op: u8, seq: u32) {
    out.push(kind);
    out.push(op);
    out.extend_from_slice(&seq.to_le_bytes());
}

fn flag(v: u8) -> Result<bool> {
    match v {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(Error::Protocol(format!("flag byte {v}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(m: &FrontdMessage) -> FrontdMessage {
        let (body, fds) = m.emit();
        assert!(fds.is_empty());
        FrontdMessage::parse(&body, Vec::new()).unwrap()
    }

    #[test]
    fn requests_round_trip() {
        let reqs = [
            FrontdRequest::Info,
            FrontdRequest::OpenEndpoint {
                endpoint: None,
                geometry: None,
                quiet_send_done: false,
            },
            FrontdRequest::OpenEndpoint {
                endpoint: None,
                geometry: None,
                quiet_send_done: true,
            },
            FrontdRequest::OpenEndpoint {
                endpoint: Some(3),
                quiet_send_done: true,
                geometry: Some(EndpointPages {
                    send_ring: 1,
                    event_ring: 2,
                    send_queue: 300,
                    recv_queue: 400,
                }),
            },
            FrontdRequest::CloseEndpoint { endpoint: 7 },
            FrontdRequest::RegisterRegion {
                endpoint: 1,
                length: 1 << 24,
            },
            FrontdRequest::DeregisterRegion {
                endpoint: 1,
                region_id: 200,
            },
            FrontdRequest::Remapped {
                endpoint: 2,
                generation: 5,
            },
            FrontdRequest::RegionPages {
                endpoint: 4,
                region_id: 9,
            },
        ];
        for (i, r) in reqs.into_iter().enumerate() {
            let m = FrontdMessage::Request {
                seq: i as u32 + 1,
                request: r.clone(),
            };
            match round_trip(&m) {
                FrontdMessage::Request { seq, request } => {
                    assert_eq!(seq, i as u32 + 1);
                    assert_eq!(request, r);
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn replies_and_notices_round_trip() {
        let info = FrontdBoardInfo {
            connected: true,
            domid: 3,
            mac: Mac([2, 0, 0, 0, 0, 9]),
            cluster: 4,
            hostname: "g:0".into(),
            max_endpoints: 32,
            max_regions: 256,
            local_delivery: true,
        };
        match round_trip(&FrontdMessage::Reply {
            seq: 9,
            reply: FrontdReply::Info(info.clone()),
        }) {
            FrontdMessage::Reply {
                seq: 9,
                reply: FrontdReply::Info(got),
            } => assert_eq!(got, info),
            other => panic!("{other:?}"),
        }
        let e = ErrorReply::from_error(&Error::Refused {
            op: CtrlKind::RegionRegister,
            status: CtrlStatus::Quota,
        });
        match round_trip(&FrontdMessage::Reply {
            seq: 1,
            reply: FrontdReply::Error(e.clone()),
        }) {
            FrontdMessage::Reply {
                reply: FrontdReply::Error(got),
                ..
            } => {
                assert_eq!(got, e);
                assert!(matches!(
                    got.into_error(),
                    Error::Refused {
                        op: CtrlKind::RegionRegister,
                        status: CtrlStatus::Quota
                    }
                ));
            }
            other => panic!("{other:?}"),
        }
        // A resource the daemon ran out of keeps its name across the socket.
        let e = ErrorReply::from_error(&Error::Exhausted("region id".into()));
        match round_trip(&FrontdMessage::Reply {
            seq: 2,
            reply: FrontdReply::Error(e),
        }) {
            FrontdMessage::Reply {
                reply: FrontdReply::Error(got),
                ..
            } => assert_eq!(got.into_error().to_string(), "no free region id"),
            other => panic!("{other:?}"),
        }
        match round_trip(&FrontdMessage::Notice(Notice::EndpointLost {
            endpoint: 4,
            reason: "gone".into(),
        })) {
            FrontdMessage::Notice(Notice::EndpointLost {
                endpoint: 4,
                reason,
            }) => {
                assert_eq!(reason, "gone")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            round_trip(&FrontdMessage::Notice(Notice::Shutdown)),
            FrontdMessage::Notice(Notice::Shutdown)
        ));
        assert!(matches!(
            round_trip(&FrontdMessage::Notice(Notice::GrantsShort)),
            FrontdMessage::Notice(Notice::GrantsShort)
        ));
        // A newer daemon's notice, with a body this side cannot read: known as unknown.
        let mut body = Vec::new();
        header(&mut body, KIND_NOTICE, 200, 0);
        body.extend_from_slice(b"a body of some newer kind");
        assert!(matches!(
            FrontdMessage::parse(&body, Vec::new()).unwrap(),
            FrontdMessage::Notice(Notice::Unknown(200))
        ));
    }

    #[test]
    fn garbage_is_refused_without_panicking() {
        let (body, _) = FrontdMessage::Request {
            seq: 1,
            request: FrontdRequest::RegisterRegion {
                endpoint: 1,
                length: 10,
            },
        }
        .emit();
        for cut in 0..body.len() {
            assert!(
                FrontdMessage::parse(&body[..cut], Vec::new()).is_err(),
                "cut {cut}"
            );
        }
        let mut long = body.clone();
        long.push(0);
        assert!(FrontdMessage::parse(&long, Vec::new()).is_err());
        for kind in [0u8, 4, 255] {
            let mut b = body.clone();
            b[0] = kind;
            assert!(FrontdMessage::parse(&b, Vec::new()).is_err());
        }
        let mut b = body.clone();
        b[1] = 99;
        assert!(FrontdMessage::parse(&b, Vec::new()).is_err());
        // An endpoint reply without descriptors.
        let mut b = vec![KIND_REPLY, REPLY_ENDPOINT, 1, 0, 0, 0];
        b.extend_from_slice(&[0; 40]);
        assert!(FrontdMessage::parse(&b, Vec::new()).is_err());
        // A request carrying a descriptor.
        let f = std::fs::File::open("/dev/null").unwrap();
        assert!(FrontdMessage::parse(&body, vec![f.into()]).is_err());
        // Bad flags.
        let (mut b, _) = FrontdMessage::Request {
            seq: 1,
            request: FrontdRequest::OpenEndpoint {
                endpoint: None,
                geometry: None,
                quiet_send_done: false,
            },
        }
        .emit();
        b[7] = 4;
        assert!(FrontdMessage::parse(&b, Vec::new()).is_err());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let _ = FrontdMessage::parse(&body, Vec::new());
        }
    }
}

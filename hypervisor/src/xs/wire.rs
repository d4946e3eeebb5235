//! The xenstore wire protocol: `struct xsd_sockmsg` frames, message types, error names,
//! permission strings and payload layouts.
//!
//! Shared by [`XsClient`](super::XsClient) and the simulated xenstored, so both ends agree
//! byte for byte. Nothing here panics on untrusted input: every parser returns a
//! [`WireError`].
//!
//! A frame is a 16-byte header of four `u32` in host byte order (little-endian on x86, as
//! Xen's own tools write it) — type, request id, transaction id, payload length — followed by
//! at most [`PAYLOAD_MAX`] payload bytes.

use std::io::{self, Read, Write};

use crate::{DomId, XsAccess, XsPerm};

/// Size of the frame header.
pub const HEADER_LEN: usize = 16;
/// Largest payload either side may send; xenstored drops a client that exceeds it.
pub const PAYLOAD_MAX: usize = 4096;
/// Longest absolute path xenstored accepts.
pub const ABS_PATH_MAX: usize = 3072;
/// Longest relative path (below a domain's home) a domain should use.
pub const REL_PATH_MAX: usize = 2048;
/// The domid that matches every domain in a permission entry (Xen's DOMID_ANY).
pub const DOMID_ANY: DomId = 0x7FF5;
/// The domid that names the caller itself (Xen's DOMID_SELF).
pub const DOMID_SELF: DomId = 0x7FF0;
/// The special watch path fired when a domain is introduced.
pub const INTRODUCE_DOMAIN: &str = "@introduceDomain";
/// The special watch path fired when a domain is released.
pub const RELEASE_DOMAIN: &str = "@releaseDomain";

/// Why bytes are not a valid xenstore message or payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than the header or the announced payload need.
    #[error("truncated: need {needed} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes there are.
        have: usize,
    },
    /// The header announces a payload over [`PAYLOAD_MAX`].
    #[error("payload of {0} bytes exceeds the {PAYLOAD_MAX}-byte limit")]
    PayloadTooLong(u32),
    /// A string field lacks its terminating NUL.
    #[error("string not NUL-terminated")]
    MissingNul,
    /// A string field is not UTF-8.
    #[error("string is not UTF-8")]
    NotUtf8,
    /// A different number of string fields than the message type requires.
    #[error("expected {expected} string fields, found {found}")]
    FieldCount {
        /// Fields the message type requires.
        expected: usize,
        /// Fields present.
        found: usize,
    },
    /// A permission string that is not a letter n/r/w/b followed by a domid.
    #[error("bad permission string {0:?}")]
    BadPerm(String),
    /// A field that should be a decimal number.
    #[error("bad number {0:?}")]
    BadNumber(String),
}

/// Message types of `enum xsd_sockmsg_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum MsgType {
    /// `XS_CONTROL`: a control command to xenstored.
    Control = 0,
    /// `XS_DIRECTORY`: list the children of a node.
    Directory = 1,
    /// `XS_READ`: read the value of a node.
    Read = 2,
    /// `XS_GET_PERMS`: read the permission list of a node.
    GetPerms = 3,
    /// `XS_WATCH`: register a watch on a path with a token.
    Watch = 4,
    /// `XS_UNWATCH`: remove a watch.
    Unwatch = 5,
    /// `XS_TRANSACTION_START`: open a transaction; the reply carries its id.
    TransactionStart = 6,
    /// `XS_TRANSACTION_END`: commit (`T`) or abort (`F`) the transaction of the header.
    TransactionEnd = 7,
    /// `XS_INTRODUCE`: make a new domain and its ring known to xenstored.
    Introduce = 8,
    /// `XS_RELEASE`: forget a domain that is gone.
    Release = 9,
    /// `XS_GET_DOMAIN_PATH`: the home path of a domain.
    GetDomainPath = 10,
    /// `XS_WRITE`: set the value of a node.
    Write = 11,
    /// `XS_MKDIR`: create a node.
    Mkdir = 12,
    /// `XS_RM`: remove a node and everything below it.
    Rm = 13,
    /// `XS_SET_PERMS`: replace the permission list of a node.
    SetPerms = 14,
    /// `XS_WATCH_EVENT`: a fired watch, sent by xenstored without a request.
    WatchEvent = 15,
    /// `XS_ERROR`: a failed request's reply; the payload is an errno name ([`XsErrno`]).
    Error = 16,
    /// `XS_IS_DOMAIN_INTRODUCED`: whether xenstored knows a domain.
    IsDomainIntroduced = 17,
    /// `XS_RESUME`: a suspended domain runs again.
    Resume = 18,
    /// `XS_SET_TARGET`: let one domain act on another's nodes (a device model for its guest).
    SetTarget = 19,
    // 20 was XS_RESTRICT, removed from Xen.
    /// `XS_RESET_WATCHES`: drop every watch and transaction of the connection.
    ResetWatches = 21,
    /// `XS_DIRECTORY_PART`: part of a long list of children, from a given offset.
    DirectoryPart = 22,
    /// `XS_GET_FEATURE`: the optional features xenstored or a connection has.
    GetFeature = 23,
    /// `XS_SET_FEATURE`: set the features of a domain's connection.
    SetFeature = 24,
    /// `XS_GET_QUOTA`: read a quota, global or of one domain.
    GetQuota = 25,
    /// `XS_SET_QUOTA`: set a quota, global or of one domain.
    SetQuota = 26,
}

impl MsgType {
    /// The type for a raw header value, if it is one Xen defines.
    pub fn from_u32(value: u32) -> Option<MsgType> {
        use MsgType::*;
        Some(match value {
            0 => Control,
            1 => Directory,
            2 => Read,
            3 => GetPerms,
            4 => Watch,
            5 => Unwatch,
            6 => TransactionStart,
            7 => TransactionEnd,
            8 => Introduce,
            9 => Release,
            10 => GetDomainPath,
            11 => Write,
            12 => Mkdir,
            13 => Rm,
            14 => SetPerms,
            15 => WatchEvent,
            16 => Error,
            17 => IsDomainIntroduced,
            18 => Resume,
            19 => SetTarget,
            21 => ResetWatches,
            22 => DirectoryPart,
            23 => GetFeature,
            24 => SetFeature,
            25 => GetQuota,
            26 => SetQuota,
            _ => return None,
        })
    }

    /// The raw header value.
    pub fn as_u32(self) -> u32 {
        self as u32
    }
}

/// The errno names of `xsd_errors`, as carried by `XS_ERROR` replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum XsErrno {
    /// `EINVAL`: a malformed request or argument.
    Einval,
    /// `EACCES`: the caller's domain may not access the node.
    Eacces,
    /// `EEXIST`: the node or watch already exists.
    Eexist,
    /// `EISDIR`: the node is a directory.
    Eisdir,
    /// `ENOENT`: no such node, watch, transaction or domain.
    Enoent,
    /// `ENOMEM`: xenstored ran out of memory.
    Enomem,
    /// `ENOSPC`: no space left, or a per-domain quota was hit.
    Enospc,
    /// `EIO`: an I/O error or an internal failure of xenstored.
    Eio,
    /// `ENOTEMPTY`: the node has children.
    Enotempty,
    /// `ENOSYS`: a message type xenstored does not implement.
    Enosys,
    /// `EROFS`: the store is read-only.
    Erofs,
    /// `EBUSY`: busy; try later.
    Ebusy,
    /// `EAGAIN`: the transaction conflicted; retry it.
    Eagain,
    /// `EISCONN`: already connected (a domain introduced twice).
    Eisconn,
    /// `E2BIG`: a payload, path or value too long, or too many entries.
    E2big,
    /// `EPERM`: the operation is not permitted to the caller.
    Eperm,
}

impl XsErrno {
    const ALL: [XsErrno; 16] = [
        XsErrno::Einval,
        XsErrno::Eacces,
        XsErrno::Eexist,
        XsErrno::Eisdir,
        XsErrno::Enoent,
        XsErrno::Enomem,
        XsErrno::Enospc,
        XsErrno::Eio,
        XsErrno::Enotempty,
        XsErrno::Enosys,
        XsErrno::Erofs,
        XsErrno::Ebusy,
        XsErrno::Eagain,
        XsErrno::Eisconn,
        XsErrno::E2big,
        XsErrno::Eperm,
    ];

    /// The name sent on the wire, e.g. `"ENOENT"`.
    pub fn name(self) -> &'static str {
        match self {
            XsErrno::Einval => "EINVAL",
            XsErrno::Eacces => "EACCES",
            XsErrno::Eexist => "EEXIST",
            XsErrno::Eisdir => "EISDIR",
            XsErrno::Enoent => "ENOENT",
            XsErrno::Enomem => "ENOMEM",
            XsErrno::Enospc => "ENOSPC",
            XsErrno::Eio => "EIO",
            XsErrno::Enotempty => "ENOTEMPTY",
            XsErrno::Enosys => "ENOSYS",
            XsErrno::Erofs => "EROFS",
            XsErrno::Ebusy => "EBUSY",
            XsErrno::Eagain => "EAGAIN",
            XsErrno::Eisconn => "EISCONN",
            XsErrno::E2big => "E2BIG",
            XsErrno::Eperm => "EPERM",
        }
    }

    /// The errno for a wire name, if it is one of the table's.
    pub fn from_name(name: &str) -> Option<XsErrno> {
        XsErrno::ALL.iter().copied().find(|e| e.name() == name)
    }

    /// The `XS_ERROR` payload: the name, NUL-terminated.
    pub fn payload(self) -> Vec<u8> {
        let mut p = self.name().as_bytes().to_vec();
        p.push(0);
        p
    }
}

impl std::fmt::Display for XsErrno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Map an errno name from an `XS_ERROR` reply to the platform error; `context` names
/// what was asked (usually the path).
pub fn error_from_name(name: &str, context: &str) -> crate::Error {
    use crate::Error;
    let context = context.to_string();
    match name {
        "ENOENT" => Error::NotFound(context),
        "EACCES" | "EPERM" => Error::Denied(context),
        "EAGAIN" => Error::Again,
        "EEXIST" => Error::Exists(context),
        "EINVAL" => Error::Invalid(context),
        "E2BIG" | "ENOSPC" | "EQUOTA" => Error::Quota(context),
        "EBUSY" => Error::Busy(context),
        "ENOSYS" => Error::Unsupported(context),
        other => Error::Xs(other.to_string()),
    }
}

impl From<XsErrno> for crate::Error {
    fn from(e: XsErrno) -> Self {
        error_from_name(e.name(), "")
    }
}

impl From<WireError> for crate::Error {
    fn from(e: WireError) -> Self {
        crate::Error::Protocol(e.to_string())
    }
}

/// The fixed header of every message (`struct xsd_sockmsg`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Raw message type; see [`MsgType::from_u32`].
    pub msg_type: u32,
    /// Request id chosen by the sender; a reply carries its request's.
    pub req_id: u32,
    /// Transaction id, or [`XBT_NULL`](crate::XBT_NULL) for none.
    pub tx_id: u32,
    /// Payload length in bytes.
    pub len: u32,
}

impl Header {
    /// Parse the first [`HEADER_LEN`] bytes. A length over [`PAYLOAD_MAX`] is an error:
    /// the stream cannot be trusted past such a header.
    pub fn parse(bytes: &[u8]) -> Result<Header, WireError> {
        let field = |i: usize| -> Result<u32, WireError> {
            let b = bytes.get(i * 4..i * 4 + 4).ok_or(WireError::Truncated {
                needed: HEADER_LEN,
                have: bytes.len(),
            })?;
            let mut a = [0u8; 4];
            a.copy_from_slice(b);
            Ok(u32::from_ne_bytes(a))
        };
        let header = Header {
            msg_type: field(0)?,
            req_id: field(1)?,
            tx_id: field(2)?,
            len: field(3)?,
        };
        if header.len as usize > PAYLOAD_MAX {
            return Err(WireError::PayloadTooLong(header.len));
        }
        Ok(header)
    }

    /// Write the header into the first [`HEADER_LEN`] bytes of `out`.
    pub fn emit(&self, out: &mut [u8; HEADER_LEN]) {
        out[0..4].copy_from_slice(&self.msg_type.to_ne_bytes());
        out[4..8].copy_from_slice(&self.req_id.to_ne_bytes());
        out[8..12].copy_from_slice(&self.tx_id.to_ne_bytes());
        out[12..16].copy_from_slice(&self.len.to_ne_bytes());
    }

    /// The message type, if known.
    pub fn kind(&self) -> Option<MsgType> {
        MsgType::from_u32(self.msg_type)
    }
}

/// A zero-copy view of one complete message in a byte buffer.
#[derive(Debug, Clone)]
pub struct XsMessage<T: AsRef<[u8]>> {
    buffer: T,
    header: Header,
}

impl<T: AsRef<[u8]>> XsMessage<T> {
    /// Check that `buffer` starts with a valid header followed by its whole payload.
    pub fn new_checked(buffer: T) -> Result<XsMessage<T>, WireError> {
        let bytes = buffer.as_ref();
        let header = Header::parse(bytes)?;
        let needed = HEADER_LEN + header.len as usize;
        if bytes.len() < needed {
            return Err(WireError::Truncated {
                needed,
                have: bytes.len(),
            });
        }
        Ok(XsMessage { buffer, header })
    }

    /// The parsed header.
    pub fn header(&self) -> Header {
        self.header
    }

    /// The raw message type.
    pub fn msg_type(&self) -> u32 {
        self.header.msg_type
    }

    /// The request id a reply echoes.
    pub fn req_id(&self) -> u32 {
        self.header.req_id
    }

    /// The transaction id (0: none).
    pub fn tx_id(&self) -> u32 {
        self.header.tx_id
    }

    /// The payload (exactly `len` bytes; anything after it in the buffer is not part of it).
    pub fn payload(&self) -> &[u8] {
        let end = HEADER_LEN + self.header.len as usize;
        // new_checked guaranteed the buffer holds `end` bytes.
        self.buffer.as_ref().get(HEADER_LEN..end).unwrap_or(&[])
    }

    /// Bytes this message occupies in the buffer.
    pub fn total_len(&self) -> usize {
        HEADER_LEN + self.header.len as usize
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

/// An owned message: a header and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XsFrame {
    /// The header; its `len` is the payload's length.
    pub header: Header,
    /// Exactly `header.len` bytes.
    pub payload: Vec<u8>,
}

impl XsFrame {
    /// A frame of `msg_type` carrying `payload`; fails if the payload is over the limit.
    pub fn new(
        msg_type: MsgType,
        req_id: u32,
        tx_id: u32,
        payload: Vec<u8>,
    ) -> Result<XsFrame, WireError> {
        XsFrame::with_raw_type(msg_type.as_u32(), req_id, tx_id, payload)
    }

    /// As [`XsFrame::new`] with a raw type value (tests send unknown types with it).
    pub fn with_raw_type(
        msg_type: u32,
        req_id: u32,
        tx_id: u32,
        payload: Vec<u8>,
    ) -> Result<XsFrame, WireError> {
        if payload.len() > PAYLOAD_MAX {
            return Err(WireError::PayloadTooLong(
                u32::try_from(payload.len()).unwrap_or(u32::MAX),
            ));
        }
        Ok(XsFrame {
            header: Header {
                msg_type,
                req_id,
                tx_id,
                len: payload.len() as u32,
            },
            payload,
        })
    }

    /// An `XS_ERROR` reply to `req`.
    pub fn error_reply(req: &Header, errno: XsErrno) -> XsFrame {
        XsFrame {
            header: Header {
                msg_type: MsgType::Error.as_u32(),
                req_id: req.req_id,
                tx_id: req.tx_id,
                len: errno.payload().len() as u32,
            },
            payload: errno.payload(),
        }
    }

    /// Parse one complete frame from the start of `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<XsFrame, WireError> {
        let msg = XsMessage::new_checked(bytes)?;
        Ok(XsFrame {
            header: msg.header(),
            payload: msg.payload().to_vec(),
        })
    }

    /// The header and payload as one buffer, ready for a single write.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; HEADER_LEN + self.payload.len()];
        let mut hdr = [0u8; HEADER_LEN];
        self.header.emit(&mut hdr);
        out[..HEADER_LEN].copy_from_slice(&hdr);
        out[HEADER_LEN..].copy_from_slice(&self.payload);
        out
    }

    /// The message type, if known.
    pub fn kind(&self) -> Option<MsgType> {
        self.header.kind()
    }
}

/// Why a frame could not be read from a stream.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Reading the stream failed.
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    /// The stream ended inside a frame.
    #[error("stream ended inside a frame ({have} of {needed} bytes)")]
    Truncated {
        /// Bytes the frame needed.
        needed: usize,
        /// Bytes read before the stream ended.
        have: usize,
    },
    /// The header announced an oversized payload; the stream is out of sync.
    #[error(transparent)]
    Wire(#[from] WireError),
}

/// Read one frame. `Ok(None)` on a clean end of stream before any byte of a frame.
/// Never allocates more than [`PAYLOAD_MAX`] for the payload.
pub fn read_frame<R: Read + ?Sized>(r: &mut R) -> Result<Option<XsFrame>, ReadError> {
    let mut hdr = [0u8; HEADER_LEN];
    let got = read_full(r, &mut hdr)?;
    if got == 0 {
        return Ok(None);
    }
    if got < HEADER_LEN {
        return Err(ReadError::Truncated {
            needed: HEADER_LEN,
            have: got,
        });
    }
    let header = Header::parse(&hdr)?;
    let mut payload = vec![0u8; header.len as usize];
    let got = read_full(r, &mut payload)?;
    if got < payload.len() {
        return Err(ReadError::Truncated {
            needed: HEADER_LEN + payload.len(),
            have: HEADER_LEN + got,
        });
    }
    Ok(Some(XsFrame { header, payload }))
}

/// Write one frame with a single buffer (the xenbus device wants whole messages).
pub fn write_frame<W: Write + ?Sized>(w: &mut W, frame: &XsFrame) -> io::Result<()> {
    w.write_all(&frame.encode())
}

/// Fill `buf` unless the stream ends first; returns how many bytes were read.
fn read_full<R: Read + ?Sized>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut have = 0;
    while have < buf.len() {
        match r.read(&mut buf[have..]) {
            Ok(0) => break,
            Ok(n) => have += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(have)
}

/// Split a payload of NUL-terminated strings. Every byte must belong to a terminated
/// UTF-8 string; an empty payload is zero strings.
pub fn split_strings(payload: &[u8]) -> Result<Vec<&str>, WireError> {
    let mut out = Vec::new();
    let mut rest = payload;
    while !rest.is_empty() {
        let nul = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(WireError::MissingNul)?;
        let s = std::str::from_utf8(&rest[..nul]).map_err(|_| WireError::NotUtf8)?;
        out.push(s);
        rest = &rest[nul + 1..];
    }
    Ok(out)
}

/// The single NUL-terminated string that must make up the whole payload.
pub fn one_string(payload: &[u8]) -> Result<&str, WireError> {
    let strings = split_strings(payload)?;
    match strings.as_slice() {
        [s] => Ok(s),
        other => Err(WireError::FieldCount {
            expected: 1,
            found: other.len(),
        }),
    }
}

/// The leading NUL-terminated strings, then whatever bytes follow the last NUL that was
/// asked for (a WRITE is `path\0value` with a binary value).
pub fn split_prefix_strings(payload: &[u8], count: usize) -> Result<(Vec<&str>, &[u8]), WireError> {
    let mut out = Vec::with_capacity(count);
    let mut rest = payload;
    for _ in 0..count {
        let nul = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(WireError::MissingNul)?;
        let s = std::str::from_utf8(&rest[..nul]).map_err(|_| WireError::NotUtf8)?;
        out.push(s);
        rest = &rest[nul + 1..];
    }
    Ok((out, rest))
}

/// Encode strings, each followed by a NUL.
pub fn join_strings<S: AsRef<str>>(strings: &[S]) -> Vec<u8> {
    let mut out = Vec::new();
    for s in strings {
        out.extend_from_slice(s.as_ref().as_bytes());
        out.push(0);
    }
    out
}

/// `path\0value`: the WRITE payload.
pub fn write_payload(path: &str, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len() + 1 + value.len());
    out.extend_from_slice(path.as_bytes());
    out.push(0);
    out.extend_from_slice(value);
    out
}

/// The `OK\0` acknowledgement.
pub const OK_PAYLOAD: &[u8] = b"OK\0";

/// Parse a permission string such as `r5`.
pub fn parse_perm(s: &str) -> Result<XsPerm, WireError> {
    let bad = || WireError::BadPerm(s.chars().take(32).collect());
    let mut chars = s.chars();
    let access = match chars.next() {
        Some('n') => XsAccess::None,
        Some('r') => XsAccess::Read,
        Some('w') => XsAccess::Write,
        Some('b') => XsAccess::Both,
        _ => return Err(bad()),
    };
    let digits = chars.as_str();
    let domid = parse_domid(digits).map_err(|_| bad())?;
    Ok(XsPerm { domid, access })
}

/// Format a permission as xenstored does: access letter, then decimal domid.
pub fn format_perm(p: &XsPerm) -> String {
    let letter = match p.access {
        XsAccess::None => 'n',
        XsAccess::Read => 'r',
        XsAccess::Write => 'w',
        XsAccess::Both => 'b',
    };
    format!("{letter}{}", p.domid)
}

/// Parse a list of permission strings.
pub fn parse_perms(strings: &[&str]) -> Result<Vec<XsPerm>, WireError> {
    strings.iter().map(|s| parse_perm(s)).collect()
}

/// Parse a decimal domid (0..=65535) with nothing else around it.
pub fn parse_domid(s: &str) -> Result<DomId, WireError> {
    if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(WireError::BadNumber(s.chars().take(32).collect()));
    }
    s.parse::<DomId>()
        .map_err(|_| WireError::BadNumber(s.to_string()))
}

/// Parse a decimal `u32` (transaction ids, offsets).
pub fn parse_u32(s: &str) -> Result<u32, WireError> {
    if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(WireError::BadNumber(s.chars().take(32).collect()));
    }
    s.parse::<u32>()
        .map_err(|_| WireError::BadNumber(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_bytes(ty: u32, req: u32, tx: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&ty.to_ne_bytes());
        v.extend_from_slice(&req.to_ne_bytes());
        v.extend_from_slice(&tx.to_ne_bytes());
        v.extend_from_slice(&(payload.len() as u32).to_ne_bytes());
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn header_roundtrip_matches_c_layout() {
        let f = XsFrame::new(MsgType::Write, 7, 3, b"/a\0xyz".to_vec()).unwrap();
        let bytes = f.encode();
        assert_eq!(bytes, frame_bytes(11, 7, 3, b"/a\0xyz"));
        assert_eq!(XsFrame::parse(&bytes).unwrap(), f);
        let msg = XsMessage::new_checked(&bytes[..]).unwrap();
        assert_eq!(msg.msg_type(), 11);
        assert_eq!(msg.req_id(), 7);
        assert_eq!(msg.tx_id(), 3);
        assert_eq!(msg.payload(), b"/a\0xyz");
        assert_eq!(msg.total_len(), 22);
    }

    #[test]
    fn message_view_ignores_bytes_after_payload() {
        let mut bytes = frame_bytes(2, 1, 0, b"/x\0");
        bytes.extend_from_slice(b"trailing");
        let msg = XsMessage::new_checked(&bytes[..]).unwrap();
        assert_eq!(msg.payload(), b"/x\0");
    }

    #[test]
    fn short_header_is_truncated() {
        for n in 0..HEADER_LEN {
            let bytes = vec![0u8; n];
            assert_eq!(
                Header::parse(&bytes),
                Err(WireError::Truncated {
                    needed: HEADER_LEN,
                    have: n
                })
            );
        }
    }

    #[test]
    fn short_payload_is_truncated() {
        let mut bytes = frame_bytes(2, 1, 0, b"/abc\0");
        bytes.truncate(bytes.len() - 2);
        assert_eq!(
            XsMessage::new_checked(&bytes[..]).unwrap_err(),
            WireError::Truncated {
                needed: 21,
                have: 19
            }
        );
    }

    #[test]
    fn oversized_length_is_rejected() {
        let mut bytes = frame_bytes(2, 1, 0, b"");
        bytes[12..16].copy_from_slice(&4097u32.to_ne_bytes());
        assert_eq!(Header::parse(&bytes), Err(WireError::PayloadTooLong(4097)));
        bytes[12..16].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert_eq!(
            Header::parse(&bytes),
            Err(WireError::PayloadTooLong(u32::MAX))
        );
        assert!(XsFrame::new(MsgType::Read, 1, 0, vec![0; PAYLOAD_MAX + 1]).is_err());
        assert!(XsFrame::new(MsgType::Read, 1, 0, vec![0; PAYLOAD_MAX]).is_ok());
    }

    #[test]
    fn msg_type_numbers_match_xs_wire_h() {
        let expected = [
            (MsgType::Control, 0),
            (MsgType::Directory, 1),
            (MsgType::Read, 2),
            (MsgType::GetPerms, 3),
            (MsgType::Watch, 4),
            (MsgType::Unwatch, 5),
            (MsgType::TransactionStart, 6),
            (MsgType::TransactionEnd, 7),
            (MsgType::Introduce, 8),
            (MsgType::Release, 9),
            (MsgType::GetDomainPath, 10),
            (MsgType::Write, 11),
            (MsgType::Mkdir, 12),
            (MsgType::Rm, 13),
            (MsgType::SetPerms, 14),
            (MsgType::WatchEvent, 15),
            (MsgType::Error, 16),
            (MsgType::IsDomainIntroduced, 17),
            (MsgType::Resume, 18),
            (MsgType::SetTarget, 19),
            (MsgType::ResetWatches, 21),
            (MsgType::DirectoryPart, 22),
            (MsgType::GetFeature, 23),
            (MsgType::SetFeature, 24),
            (MsgType::GetQuota, 25),
            (MsgType::SetQuota, 26),
        ];
        for (t, n) in expected {
            assert_eq!(t.as_u32(), n);
            assert_eq!(MsgType::from_u32(n), Some(t));
        }
        assert_eq!(MsgType::from_u32(20), None);
        assert_eq!(MsgType::from_u32(27), None);
        assert_eq!(MsgType::from_u32(0xffff), None);
    }

    #[test]
    fn errno_names_roundtrip_in_table_order() {
        let names = [
            "EINVAL",
            "EACCES",
            "EEXIST",
            "EISDIR",
            "ENOENT",
            "ENOMEM",
            "ENOSPC",
            "EIO",
            "ENOTEMPTY",
            "ENOSYS",
            "EROFS",
            "EBUSY",
            "EAGAIN",
            "EISCONN",
            "E2BIG",
            "EPERM",
        ];
        for (e, name) in XsErrno::ALL.iter().zip(names) {
            assert_eq!(e.name(), name);
            assert_eq!(XsErrno::from_name(name), Some(*e));
        }
        assert_eq!(XsErrno::from_name("EQUOTA"), None);
        assert_eq!(XsErrno::Enoent.payload(), b"ENOENT\0");
    }

    #[test]
    fn error_names_map_to_platform_errors() {
        use crate::Error;
        assert!(matches!(error_from_name("ENOENT", "/a"), Error::NotFound(p) if p == "/a"));
        assert!(matches!(error_from_name("EACCES", ""), Error::Denied(_)));
        assert!(matches!(error_from_name("EPERM", ""), Error::Denied(_)));
        assert!(matches!(error_from_name("EAGAIN", ""), Error::Again));
        assert!(matches!(error_from_name("EEXIST", ""), Error::Exists(_)));
        assert!(matches!(error_from_name("EINVAL", ""), Error::Invalid(_)));
        assert!(matches!(error_from_name("E2BIG", ""), Error::Quota(_)));
        assert!(matches!(error_from_name("ENOSPC", ""), Error::Quota(_)));
        assert!(matches!(error_from_name("EQUOTA", ""), Error::Quota(_)));
        assert!(matches!(error_from_name("EBUSY", ""), Error::Busy(_)));
        assert!(matches!(error_from_name("EIO", ""), Error::Xs(n) if n == "EIO"));
    }

    #[test]
    fn error_reply_copies_ids() {
        let req = Header {
            msg_type: 2,
            req_id: 9,
            tx_id: 4,
            len: 0,
        };
        let f = XsFrame::error_reply(&req, XsErrno::Eacces);
        assert_eq!(f.encode(), frame_bytes(16, 9, 4, b"EACCES\0"));
    }

    #[test]
    fn read_frame_from_stream() {
        let mut bytes = frame_bytes(1, 5, 0, b"/\0");
        bytes.extend(frame_bytes(15, 0, 0, b"/a\0tok\0"));
        let mut cur = std::io::Cursor::new(bytes);
        let a = read_frame(&mut cur).unwrap().unwrap();
        assert_eq!(a.kind(), Some(MsgType::Directory));
        assert_eq!(a.payload, b"/\0");
        let b = read_frame(&mut cur).unwrap().unwrap();
        assert_eq!(b.kind(), Some(MsgType::WatchEvent));
        assert_eq!(split_strings(&b.payload).unwrap(), vec!["/a", "tok"]);
        assert!(read_frame(&mut cur).unwrap().is_none());
    }

    #[test]
    fn read_frame_reports_truncation_and_oversize() {
        let bytes = frame_bytes(2, 1, 0, b"/abc\0");
        let mut cur = std::io::Cursor::new(bytes[..10].to_vec());
        assert!(matches!(
            read_frame(&mut cur),
            Err(ReadError::Truncated {
                needed: 16,
                have: 10
            })
        ));
        let mut cur = std::io::Cursor::new(bytes[..18].to_vec());
        assert!(matches!(
            read_frame(&mut cur),
            Err(ReadError::Truncated {
                needed: 21,
                have: 18
            })
        ));
        let mut big = frame_bytes(2, 1, 0, b"");
        big[12..16].copy_from_slice(&100_000u32.to_ne_bytes());
        let mut cur = std::io::Cursor::new(big);
        assert!(matches!(
            read_frame(&mut cur),
            Err(ReadError::Wire(WireError::PayloadTooLong(100_000)))
        ));
    }

    #[test]
    fn read_frame_survives_arbitrary_bytes() {
        // A seeded stream: every outcome must be a value, never a panic.
        let mut rng = fastrand::Rng::with_seed(0x9e37_79b9_7f4a_7c15);
        for _ in 0..2000 {
            let n = rng.usize(0..64);
            let buf: Vec<u8> = (0..n).map(|_| rng.u8(..)).collect();
            let mut cur = std::io::Cursor::new(buf.clone());
            let _ = read_frame(&mut cur);
            let _ = XsFrame::parse(&buf);
            let _ = split_strings(&buf);
            let _ = one_string(&buf);
            let _ = split_prefix_strings(&buf, 2);
        }
    }

    #[test]
    fn strings_split_and_join() {
        assert_eq!(split_strings(b"").unwrap(), Vec::<&str>::new());
        assert_eq!(split_strings(b"a\0bc\0").unwrap(), vec!["a", "bc"]);
        assert_eq!(split_strings(b"a\0\0").unwrap(), vec!["a", ""]);
        assert_eq!(split_strings(b"a\0bc"), Err(WireError::MissingNul));
        assert_eq!(split_strings(b"\xff\0"), Err(WireError::NotUtf8));
        assert_eq!(join_strings(&["a", "bc"]), b"a\0bc\0");
        assert_eq!(one_string(b"/p\0").unwrap(), "/p");
        assert_eq!(
            one_string(b"/p\0x\0"),
            Err(WireError::FieldCount {
                expected: 1,
                found: 2
            })
        );
        assert_eq!(
            one_string(b""),
            Err(WireError::FieldCount {
                expected: 1,
                found: 0
            })
        );
        assert_eq!(one_string(b"/p"), Err(WireError::MissingNul));
    }

    #[test]
    fn write_payload_keeps_binary_value() {
        let p = write_payload("/a/b", b"\0\x01\xff");
        assert_eq!(p, b"/a/b\0\0\x01\xff");
        let (strings, rest) = split_prefix_strings(&p, 1).unwrap();
        assert_eq!(strings, vec!["/a/b"]);
        assert_eq!(rest, b"\0\x01\xff");
        assert_eq!(split_prefix_strings(b"/a", 1), Err(WireError::MissingNul));
    }

    #[test]
    fn perms_parse_and_format() {
        let cases = [
            ("n0", 0, XsAccess::None),
            ("r5", 5, XsAccess::Read),
            ("w65535", 65535, XsAccess::Write),
            ("b12", 12, XsAccess::Both),
        ];
        for (s, domid, access) in cases {
            let p = parse_perm(s).unwrap();
            assert_eq!(p, XsPerm { domid, access });
            assert_eq!(format_perm(&p), s);
        }
        for bad in [
            "", "x1", "r", "r-1", "r65536", "r1a", "R1", "r 1", "rr1", "r123456",
        ] {
            assert!(parse_perm(bad).is_err(), "{bad:?} should fail");
        }
        assert_eq!(
            parse_perms(&["n3", "r0"]).unwrap(),
            vec![
                XsPerm {
                    domid: 3,
                    access: XsAccess::None
                },
                XsPerm {
                    domid: 0,
                    access: XsAccess::Read
                }
            ]
        );
    }

    #[test]
    fn numbers_are_strict_decimal() {
        assert_eq!(parse_domid("0").unwrap(), 0);
        assert_eq!(parse_domid("65535").unwrap(), 65535);
        assert!(parse_domid("65536").is_err());
        assert!(parse_domid("+1").is_err());
        assert!(parse_domid("").is_err());
        assert_eq!(parse_u32("4294967295").unwrap(), u32::MAX);
        assert!(parse_u32("4294967296").is_err());
        assert!(parse_u32("12x").is_err());
    }
}

//! One client connection to a domain's `hv.sock`: synchronous request/reply.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Mutex;

use super::layout;
use super::proto::{SimRequest, SimResponse, MAX_FRAME};
use super::transport::{recv_frame, send_frame};
use crate::{DomId, Error, Result};

/// A connection; every request waits for its reply before the next one is sent. It can
/// be moved to another domain's socket when the domain migrated
/// ([`HvConn::reconnect`]): whoever shares it then talks to the new one.
pub(crate) struct HvConn {
    domid: AtomicU16,
    inner: Mutex<ConnInner>,
}

struct ConnInner {
    sock: UnixStream,
    seq: u32,
}

impl HvConn {
    /// Connect to `DIR/dom<domid>/hv.sock`.
    pub(crate) fn connect(dir: &Path, domid: DomId) -> Result<HvConn> {
        Ok(HvConn {
            domid: AtomicU16::new(domid),
            inner: Mutex::new(ConnInner {
                sock: Self::open(dir, domid)?,
                seq: 0,
            }),
        })
    }

    /// Talk to `DIR/dom<domid>/hv.sock` from now on; the old connection closes.
    pub(crate) fn reconnect(&self, dir: &Path, domid: DomId) -> Result<()> {
        let sock = Self::open(dir, domid)?;
        let mut inner = self
            .inner
            .lock()
            .map_err(|_| Error::Closed("hv connection poisoned".into()))?;
        inner.sock = sock;
        self.domid.store(domid, Ordering::Release);
        Ok(())
    }

    fn open(dir: &Path, domid: DomId) -> Result<UnixStream> {
        let path = layout::hv_sock(dir, domid);
        let sock = UnixStream::connect(&path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => Error::NotFound(format!(
                "no simulated domain {domid} at {} ({e})",
                dir.display()
            )),
            _ => Error::Io(e),
        })?;
        Ok(sock)
    }

    /// The domain this connection acts as.
    pub(crate) fn domid(&self) -> DomId {
        self.domid.load(Ordering::Acquire)
    }

    /// Send `req`, wait for its reply and the descriptors attached to it.
    pub(crate) fn call(&self, req: &SimRequest) -> Result<(SimResponse, Vec<OwnedFd>)> {
        let mut inner = self
            .inner
            .lock()
            .map_err(|_| Error::Closed("hv connection poisoned".into()))?;
        inner.seq = inner.seq.wrapping_add(1);
        let seq = inner.seq;
        let mut body = Vec::new();
        req.emit(seq, &mut body);
        if body.len() > MAX_FRAME {
            return Err(Error::Invalid(format!(
                "request of {} bytes exceeds the {MAX_FRAME}-byte limit",
                body.len()
            )));
        }
        send_frame(&inner.sock, &body, &[]).map_err(closed_or_io)?;
        let (reply, fds) = recv_frame(&inner.sock, MAX_FRAME)
            .map_err(closed_or_io)?
            .ok_or_else(|| Error::Closed("xmx-simhv closed the connection".into()))?;
        let (resp, nfds) = SimResponse::parse(&reply, req.op(), seq)?;
        if nfds != fds.len() {
            return Err(Error::Protocol(format!(
                "reply announced {nfds} descriptors, carried {}",
                fds.len()
            )));
        }
        Ok((resp, fds))
    }
}

fn closed_or_io(e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionAborted => {
            Error::Closed(format!("connection to xmx-simhv lost: {e}"))
        }
        _ => Error::Io(e),
    }
}

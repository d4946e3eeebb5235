//! Serving `hv.sock`: one acceptor thread per domain, one thread per connection.
//!
//! A connection that sends a frame the daemon cannot even frame (oversized, truncated,
//! no header, wrong version) is dropped; a request whose payload does not parse gets a
//! protocol-error reply and the connection goes on. Either way only that connection's
//! own state is touched, and its resources are released when it ends.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use xmx_hv::sim::proto::{emit_error, RequestHeader, SimRequest, MAX_FRAME, REQUEST_HEADER_LEN};
use xmx_hv::sim::transport::{recv_frame, send_frame};
use xmx_hv::{DomId, Error};

use super::{Hv, HvConnId};

/// Accept connections on `listener` as domain `domid` until `stop` becomes readable;
/// then wait for the connection threads (whose sockets the stopper shut down) to end.
pub(crate) fn spawn_acceptor(
    hv: Arc<Hv>,
    domid: DomId,
    listener: UnixListener,
    stop: Arc<OwnedFd>,
) -> std::io::Result<JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    std::thread::Builder::new()
        .name(format!("hv-accept-{domid}"))
        .spawn(move || accept_loop(hv, domid, listener, stop))
}

fn accept_loop(hv: Arc<Hv>, domid: DomId, listener: UnixListener, stop: Arc<OwnedFd>) {
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    loop {
        let mut fds = [
            PollFd::new(listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(stop.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                tracing::error!(domid, error = %e, "poll on hv.sock");
                break;
            }
        }
        if fds[1].any().unwrap_or(false) {
            break;
        }
        match listener.accept() {
            Ok((stream, _)) => {
                if let Err(e) = start_conn(&hv, domid, stream, &mut workers) {
                    tracing::warn!(domid, error = %e, "refusing an hv connection");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                // Out of descriptors or similar: back off instead of spinning on poll.
                tracing::warn!(domid, error = %e, "accept on hv.sock");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let (done, running): (Vec<_>, Vec<_>) = workers.drain(..).partition(|w| w.is_finished());
        workers = running;
        for w in done {
            let _ = w.join();
        }
    }
    for w in workers {
        let _ = w.join();
    }
    tracing::debug!(domid, "hv acceptor stopped");
}

fn start_conn(
    hv: &Arc<Hv>,
    domid: DomId,
    stream: UnixStream,
    workers: &mut Vec<JoinHandle<()>>,
) -> xmx_hv::Result<()> {
    stream.set_nonblocking(false)?;
    let id = hv.register_conn(domid, stream.try_clone()?)?;
    let hv2 = hv.clone();
    match std::thread::Builder::new()
        .name(format!("hv-{domid}-{id}"))
        .spawn(move || serve_conn(hv2, id, domid, stream))
    {
        Ok(w) => {
            workers.push(w);
            Ok(())
        }
        Err(e) => {
            hv.conn_closed(id);
            Err(Error::Io(e))
        }
    }
}

/// Serve one connection until it closes or misbehaves beyond framing.
fn serve_conn(hv: Arc<Hv>, conn: HvConnId, domid: DomId, stream: UnixStream) {
    tracing::debug!(domid, conn, fd = stream.as_raw_fd(), "hv connection");
    loop {
        let body = match recv_frame(&stream, MAX_FRAME) {
            Ok(Some((body, _ignored_fds))) => body,
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(domid, conn, error = %e, "dropping hv connection");
                break;
            }
        };
        let Ok(header) = RequestHeader::parse(&body) else {
            tracing::debug!(domid, conn, "frame without a header");
            break;
        };
        let mut out = Vec::new();
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut keep = true;
        match SimRequest::parse(&body) {
            Err(e) => {
                tracing::debug!(domid, conn, error = %e, "malformed request");
                emit_error(header.op, header.seq, &e, &mut out);
                keep = header.version == xmx_hv::sim::proto::VERSION
                    && body.len() >= REQUEST_HEADER_LEN;
            }
            Ok((_, req)) => {
                let op = req.op();
                tracing::trace!(domid, conn, ?op, "request");
                match hv.handle(conn, req) {
                    Ok((resp, f)) => {
                        resp.emit(op, header.seq, f.len() as u16, &mut out);
                        fds = f;
                    }
                    Err(e) => {
                        tracing::debug!(domid, conn, ?op, error = %e, "request refused");
                        let closed = matches!(e, Error::Closed(_));
                        emit_error(header.op, header.seq, &e, &mut out);
                        keep = !closed;
                    }
                }
            }
        }
        let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
        if let Err(e) = send_frame(&stream, &out, &borrowed) {
            tracing::debug!(domid, conn, error = %e, "reply not delivered");
            break;
        }
        if !keep {
            break;
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
    hv.conn_closed(conn);
}

//! The admin socket `DIR/ctl.sock`: JSON lines (see [`xmx_hv::sim::admin`]).
//!
//! A line that is not a valid request gets an `invalid` error reply and the connection
//! goes on; a line longer than [`MAX_LINE`] ends the connection.

use std::collections::HashMap;
use std::io::BufReader;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde_json::json;
use xmx_hv::sim::admin::{read_line_bounded, send_all, AdminReply, AdminRequest, MAX_LINE};
use xmx_hv::Error;

use crate::domains::Host;

/// The admin service: an acceptor and one thread per connection.
pub(crate) struct AdminServer {
    stop: Arc<OwnedFd>,
    acceptor: Option<JoinHandle<()>>,
    conns: Arc<Mutex<HashMap<u64, UnixStream>>>,
}

impl AdminServer {
    /// Serve `listener` for `host`.
    pub(crate) fn start(host: Arc<Host>, listener: UnixListener) -> xmx_hv::Result<AdminServer> {
        listener.set_nonblocking(true)?;
        let stop: OwnedFd = nix::sys::eventfd::EventFd::from_value_and_flags(
            0,
            nix::sys::eventfd::EfdFlags::EFD_CLOEXEC | nix::sys::eventfd::EfdFlags::EFD_NONBLOCK,
        )
        .map_err(|e| Error::Io(e.into()))?
        .into();
        let stop = Arc::new(stop);
        let conns = Arc::new(Mutex::new(HashMap::new()));
        let (s2, c2) = (stop.clone(), conns.clone());
        let acceptor = std::thread::Builder::new()
            .name("admin-accept".into())
            .spawn(move || accept_loop(host, listener, s2, c2))?;
        Ok(AdminServer {
            stop,
            acceptor: Some(acceptor),
            conns,
        })
    }

    /// Stop accepting, end every admin connection and wait for the threads.
    pub(crate) fn stop(&mut self) {
        let _ = nix::unistd::write(self.stop.as_fd(), &1u64.to_ne_bytes());
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop();
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

fn accept_loop(
    host: Arc<Host>,
    listener: UnixListener,
    stop: Arc<OwnedFd>,
    conns: Arc<Mutex<HashMap<u64, UnixStream>>>,
) {
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    let mut next_id = 0u64;
    loop {
        let mut fds = [
            PollFd::new(listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(stop.as_fd(), PollFlags::POLLIN),
        ];
        if let Err(e) = poll(&mut fds, PollTimeout::NONE) {
            if e != nix::errno::Errno::EINTR {
                tracing::error!(error = %e, "poll on ctl.sock");
                break;
            }
        }
        if fds[1].any().unwrap_or(false) {
            break;
        }
        match listener.accept() {
            Ok((stream, _)) => {
                next_id += 1;
                let id = next_id;
                let started = stream.set_nonblocking(false).and_then(|_| {
                    let clone = stream.try_clone()?;
                    conns
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(id, clone);
                    let (h, c) = (host.clone(), conns.clone());
                    std::thread::Builder::new()
                        .name(format!("admin-{id}"))
                        .spawn(move || {
                            serve(&h, stream);
                            c.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
                        })
                });
                match started {
                    Ok(w) => workers.push(w),
                    Err(e) => {
                        conns.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
                        tracing::warn!(error = %e, "refusing an admin connection");
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(error = %e, "accept on ctl.sock");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let (done, running): (Vec<_>, Vec<_>) = workers.drain(..).partition(|w| w.is_finished());
        workers = running;
        for w in done {
            let _ = w.join();
        }
    }
    for s in conns.lock().unwrap_or_else(|p| p.into_inner()).values() {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    for w in workers {
        let _ = w.join();
    }
}

fn serve(host: &Host, stream: UnixStream) {
    let Ok(writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let line = match read_line_bounded(&mut reader, MAX_LINE) {
            Ok(Some(l)) => l,
            Ok(None) => break,
            Err(e) => {
                let reply = AdminReply::err(&Error::Invalid(format!("request line: {e}")));
                let _ = send_reply(&writer, &reply);
                break;
            }
        };
        if line.iter().all(|b| b.is_ascii_whitespace()) {
            continue;
        }
        let reply = match serde_json::from_slice::<AdminRequest>(&line) {
            Err(e) => AdminReply::err(&Error::Invalid(format!("bad request: {e}"))),
            Ok(req) => {
                tracing::debug!(?req, "admin request");
                match execute(host, req) {
                    Ok(v) => AdminReply::ok(v),
                    Err(e) => AdminReply::err(&e),
                }
            }
        };
        if send_reply(&writer, &reply).is_err() {
            break;
        }
    }
}

fn send_reply(stream: &UnixStream, reply: &AdminReply) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(reply).map_err(std::io::Error::other)?;
    line.push(b'\n');
    send_all(stream, &line)
}

fn execute(host: &Host, req: AdminRequest) -> xmx_hv::Result<serde_json::Value> {
    let encoding = |e: serde_json::Error| Error::Protocol(format!("encoding: {e}"));
    match req {
        AdminRequest::Create { name, domid } => {
            let domid = host.create(&name, domid)?;
            Ok(json!({ "domid": domid }))
        }
        AdminRequest::Destroy { domid } => host.destroy(domid).map(|_| json!(null)),
        AdminRequest::Suspend { domid } => host.suspend(domid).map(|_| json!(null)),
        AdminRequest::Resume { domid } => host.resume(domid).map(|_| json!(null)),
        AdminRequest::List => serde_json::to_value(host.list()).map_err(encoding),
        AdminRequest::State { domid } => serde_json::to_value(host.state(domid)?).map_err(encoding),
    }
}

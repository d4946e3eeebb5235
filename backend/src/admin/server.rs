//! The control socket's server: one listening thread, one thread per connection (bounded),
//! each request handed to a dispatch function that answers it.
//!
//! The server knows nothing of the backend: the daemon gives it a function that forwards a
//! request to the service loop and waits for the answer.

use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use xmx_hv::sim::admin::send_all;

use super::{Reply, ReplyError, Request, MAX_LINE};

/// Answers one request.
pub type Dispatch = Arc<dyn Fn(Request) -> Reply + Send + Sync>;

/// Connections served at once; more are refused.
const MAX_CONNECTIONS: usize = 16;

/// A running control socket. Dropping it stops every thread and removes the socket file.
pub struct AdminServer {
    path: PathBuf,
    stop: Arc<EventFd>,
    acceptor: Option<JoinHandle<()>>,
    workers: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl AdminServer {
    /// Listen at `path` (a stale socket file there is replaced) and serve with `dispatch`.
    pub fn start(path: &Path, dispatch: Dispatch) -> io::Result<AdminServer> {
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir)?;
            }
        }
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let stop = Arc::new(EventFd::from_flags(
            EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK,
        )?);
        let workers = Arc::new(Mutex::new(Vec::new()));
        let acceptor = {
            let stop = stop.clone();
            let workers = workers.clone();
            std::thread::Builder::new()
                .name("backd-admin".into())
                .spawn(move || accept_loop(listener, stop, workers, dispatch))?
        };
        tracing::info!(path = %path.display(), "control socket listening");
        Ok(AdminServer {
            path: path.to_path_buf(),
            stop,
            acceptor: Some(acceptor),
            workers,
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stop serving, join every thread, remove the socket file.
    pub fn stop(&mut self) {
        let Some(acceptor) = self.acceptor.take() else {
            return;
        };
        let _ = self.stop.write(1);
        let _ = acceptor.join();
        let workers = std::mem::take(&mut *self.workers.lock().unwrap_or_else(|e| e.into_inner()));
        for w in workers {
            let _ = w.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Wait until `fd` is readable or `stop` fires; true if `fd` is readable.
fn wait_readable(fd: &impl AsFd, stop: &EventFd) -> io::Result<bool> {
    loop {
        let mut fds = [
            PollFd::new(fd.as_fd(), PollFlags::POLLIN),
            PollFd::new(stop.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
        if fds[1].revents().is_some_and(|r| !r.is_empty()) {
            return Ok(false);
        }
        if fds[0].revents().is_some_and(|r| !r.is_empty()) {
            return Ok(true);
        }
    }
}

fn accept_loop(
    listener: UnixListener,
    stop: Arc<EventFd>,
    workers: Arc<Mutex<Vec<JoinHandle<()>>>>,
    dispatch: Dispatch,
) {
    let active = Arc::new(AtomicUsize::new(0));
    loop {
        match wait_readable(&listener, &stop) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::error!(error = %e, "control socket poll failed");
                return;
            }
        }
        let conn = match listener.accept() {
            Ok((conn, _)) => conn,
            Err(e) => {
                tracing::warn!(error = %e, "control socket accept failed");
                continue;
            }
        };
        if active.load(Ordering::Acquire) >= MAX_CONNECTIONS {
            let reply = Reply::err(ReplyError::new("busy", "too many control connections"));
            let _ = write_reply(&conn, &reply);
            continue;
        }
        active.fetch_add(1, Ordering::AcqRel);
        let (stop, dispatch, active2) = (stop.clone(), dispatch.clone(), active.clone());
        let spawned = std::thread::Builder::new()
            .name("backd-admin-conn".into())
            .spawn(move || {
                if let Err(e) = serve_connection(conn, &stop, &dispatch) {
                    tracing::debug!(error = %e, "control connection ended");
                }
                active2.fetch_sub(1, Ordering::AcqRel);
            });
        match spawned {
            Ok(handle) => {
                let mut w = workers.lock().unwrap_or_else(|e| e.into_inner());
                w.retain(|h| !h.is_finished());
                w.push(handle);
            }
            Err(e) => {
                active.fetch_sub(1, Ordering::AcqRel);
                tracing::warn!(error = %e, "cannot start a control connection thread");
            }
        }
    }
}

fn write_reply(conn: &UnixStream, reply: &Reply) -> io::Result<()> {
    let mut line = serde_json::to_vec(reply).map_err(io::Error::other)?;
    line.push(b'\n');
    send_all(conn, &line)
}

fn serve_connection(mut conn: UnixStream, stop: &EventFd, dispatch: &Dispatch) -> io::Result<()> {
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if !wait_readable(&conn.as_fd(), stop)? {
            return Ok(());
        }
        let n = match conn.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        pending.extend_from_slice(&chunk[..n]);
        while let Some(pos) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=pos).collect();
            let line = &line[..line.len() - 1];
            let reply = match serde_json::from_slice::<Request>(line) {
                Ok(req) => dispatch(req),
                Err(e) => Reply::err(ReplyError::new("invalid", format!("request: {e}"))),
            };
            write_reply(&conn, &reply)?;
        }
        if pending.len() > MAX_LINE {
            let reply = Reply::err(ReplyError::new("invalid", "request line too long"));
            let _ = write_reply(&conn, &reply);
            tracing::warn!(
                fd = conn.as_raw_fd(),
                "control request too long; connection closed"
            );
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::AdminClient;

    #[test]
    fn requests_are_dispatched_and_garbage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let dispatch: Dispatch = Arc::new(|req| match req {
            Request::Guests => Reply::ok(serde_json::json!([])),
            _ => Reply::err(ReplyError::new("invalid", "not here")),
        });
        let mut server = AdminServer::start(&path, dispatch).unwrap();
        let mut client = AdminClient::connect(&path).unwrap();
        assert_eq!(
            client.call(&Request::Guests).unwrap(),
            serde_json::json!([])
        );
        assert_eq!(client.call(&Request::Counters).unwrap_err().kind, "invalid");
        // A line that is not a request gets an error reply on the same connection.
        let mut raw = UnixStream::connect(&path).unwrap();
        send_all(&raw, b"{\"op\":\"nope\"}\n").unwrap();
        let mut buf = [0u8; 256];
        let n = raw.read(&mut buf).unwrap();
        let reply: Reply = serde_json::from_slice(&buf[..n - 1]).unwrap();
        assert!(!reply.ok);
        assert_eq!(reply.error.unwrap().kind, "invalid");
        server.stop();
        assert!(!path.exists());
    }
}

//! The control sockets of the daemons (xmx-backd's, xmxd's, xmx-simhv's `ctl.sock`): one
//! server, [`LineServer`], and one client, [`LineClient`], so that every socket binds,
//! bounds, refuses and stops alike; what a daemon asks and answers is its own
//! ([`LineService`]).
//!
//! A unix stream socket; one JSON object per line each way, requests answered in order per
//! connection; blank lines are skipped. The replies of the three daemons share one shape,
//! [`Reply`]: `{"ok":true,"result":R}` or `{"ok":false,"error":{"kind":K,"message":M}}`.
//!
//! The server:
//! - appears at its path only once it listens: it is bound under a temporary name and
//!   renamed into place, so whoever waits for the file can connect at once (a socket bound
//!   at the path itself would refuse connections until `listen`);
//! - serves at most [`MAX_CONNECTIONS`] connections, each on a thread of its own; one more
//!   is answered a refusal and closed, so a runaway client cannot exhaust the daemon's
//!   threads;
//! - refuses a line longer than [`MAX_LINE`] and closes that connection, since the rest of
//!   such a line would otherwise be read as requests;
//! - when stopped, ends every connection, idle ones included (they wait on a stop event as
//!   well as on the socket), and removes the socket file.

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::lock;
use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{send, MsgFlags};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Longest request or reply line (newline excluded), on either side.
pub const MAX_LINE: usize = 1 << 20;

/// Connections a server serves at once.
pub const MAX_CONNECTIONS: usize = 16;

/// The error part of a failed [`Reply`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyError {
    /// Machine-readable class (each daemon documents the kinds it uses).
    pub kind: String,
    /// What went wrong, for people.
    pub message: String,
}

impl ReplyError {
    /// An error of `kind`.
    pub fn new(kind: &str, message: impl Into<String>) -> Self {
        ReplyError {
            kind: kind.to_string(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for ReplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl std::error::Error for ReplyError {}

/// One reply line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// True for success: `result` is set; false: `error` is.
    pub ok: bool,
    /// What the request returns, on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    /// Why the request failed, on failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ReplyError>,
}

impl Reply {
    /// A successful reply carrying `result`.
    pub fn ok(result: serde_json::Value) -> Self {
        Reply {
            ok: true,
            result: Some(result),
            error: None,
        }
    }

    /// A failed reply.
    pub fn err(error: ReplyError) -> Self {
        Reply {
            ok: false,
            result: None,
            error: Some(error),
        }
    }

    /// The result, or the error.
    pub fn into_result(self) -> Result<serde_json::Value, ReplyError> {
        if self.ok {
            Ok(self.result.unwrap_or(serde_json::Value::Null))
        } else {
            Err(self
                .error
                .unwrap_or_else(|| ReplyError::new("protocol", "failure without an error")))
        }
    }
}

/// Why the server answers with a refusal instead of the service's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The line is longer than [`MAX_LINE`]; the connection is closed after the refusal.
    TooLong,
    /// The line is not one of the service's requests (not JSON, or not of their shape);
    /// the decoder's words. The connection goes on.
    NotRequest(String),
    /// [`MAX_CONNECTIONS`] connections are served already; this one is closed after the
    /// refusal.
    Busy,
}

/// What a daemon's control socket asks and answers; served by a [`LineServer`].
pub trait LineService: Send + Sync + 'static {
    /// One request line, decoded.
    type RequestLine: DeserializeOwned;
    /// One reply line, before encoding.
    type ReplyLine: Serialize;

    /// Answers one request.
    fn answer(&self, request: Self::RequestLine) -> Self::ReplyLine;

    /// Words a refusal in the daemon's own terms.
    fn refuse(&self, refusal: Refusal) -> Self::ReplyLine;
}

/// A listening control socket. Dropping it stops it as [`LineServer::stop`] does.
pub struct LineServer {
    path: PathBuf,
    stop: Arc<EventFd>,
    acceptor: Option<JoinHandle<()>>,
    workers: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl LineServer {
    /// Listens at `path` (a stale file there is replaced; missing directories are
    /// created), with permissions `mode` if given, and serves `service`. `name` names the
    /// server's threads.
    pub fn start<S: LineService>(
        path: &Path,
        mode: Option<u32>,
        name: &str,
        service: S,
    ) -> io::Result<LineServer> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let stop = Arc::new(EventFd::from_flags(
            EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK,
        )?);
        let listener = bind_in_place(path, mode)?;
        let workers = Arc::new(Mutex::new(Vec::new()));
        let acceptor = {
            let (stop, workers, service) = (stop.clone(), workers.clone(), Arc::new(service));
            let conn_name = format!("{name}-conn");
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || accept_loop(&listener, &stop, &workers, &service, &conn_name))
        };
        let acceptor = match acceptor {
            Ok(a) => a,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(e);
            }
        };
        tracing::info!(path = %path.display(), "control socket listening");
        Ok(LineServer {
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

    /// Stops accepting, ends every connection (one being answered ends once its answer is
    /// sent), joins every thread and removes the socket file.
    pub fn stop(&mut self) {
        let Some(acceptor) = self.acceptor.take() else {
            return;
        };
        let _ = self.stop.write(1);
        // The acceptor first: once it is gone, no worker can be added to the list.
        let _ = acceptor.join();
        for w in std::mem::take(&mut *lock(&self.workers)) {
            let _ = w.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for LineServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Binds and listens under a temporary name next to `path`, then renames it into place.
fn bind_in_place(path: &Path, mode: Option<u32>) -> io::Result<UnixListener> {
    let file = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "control socket path has no file name",
        )
    })?;
    let mut tmp_name = OsString::from(".");
    tmp_name.push(file);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp)?;
    let placed = match mode {
        Some(mode) => std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)),
        None => Ok(()),
    }
    .and_then(|()| listener.set_nonblocking(true))
    .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(listener)
}

/// Waits until `fd` is readable or `stop` fires; true if `fd` is readable.
fn wait_readable(fd: &impl AsFd, stop: &EventFd) -> io::Result<bool> {
    loop {
        let mut fds = [
            PollFd::new(fd.as_fd(), PollFlags::POLLIN),
            PollFd::new(stop.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
        if fds[1].revents().is_some_and(|r| !r.is_empty()) {
            return Ok(false);
        }
        return Ok(fds[0].revents().is_some_and(|r| !r.is_empty()));
    }
}

/// One of the [`MAX_CONNECTIONS`] seats, given back when its connection's thread ends
/// (a panicking service included).
struct Seat(Arc<AtomicUsize>);

impl Drop for Seat {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn accept_loop<S: LineService>(
    listener: &UnixListener,
    stop: &Arc<EventFd>,
    workers: &Mutex<Vec<JoinHandle<()>>>,
    service: &Arc<S>,
    conn_name: &str,
) {
    let seats = Arc::new(AtomicUsize::new(0));
    loop {
        match wait_readable(listener, stop) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::error!(error = %e, "control socket poll failed");
                return;
            }
        }
        let conn = match listener.accept() {
            Ok((conn, _)) => conn,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(e) => {
                tracing::warn!(error = %e, "control socket accept failed");
                // Out of descriptors, say: a pause instead of a busy loop, cut short by a stop.
                if stopped_within(stop, Duration::from_millis(20)) {
                    return;
                }
                continue;
            }
        };
        if let Err(e) = conn.set_nonblocking(false) {
            tracing::warn!(error = %e, "control connection dropped");
            continue;
        }
        if seats.load(Ordering::Acquire) >= MAX_CONNECTIONS {
            // A client that does not read must not hold the acceptor.
            let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = write_line(&conn, &service.refuse(Refusal::Busy));
            tracing::warn!("control connection refused: {MAX_CONNECTIONS} served already");
            continue;
        }
        seats.fetch_add(1, Ordering::AcqRel);
        let seat = Seat(seats.clone());
        let (stop, service) = (stop.clone(), service.clone());
        let spawned = std::thread::Builder::new()
            .name(conn_name.into())
            .spawn(move || {
                let _seat = seat;
                if let Err(e) = serve(&conn, &stop, &*service) {
                    tracing::debug!(error = %e, "control connection ended");
                }
            });
        match spawned {
            Ok(handle) => {
                let mut w = lock(workers);
                w.retain(|h| !h.is_finished());
                w.push(handle);
            }
            Err(e) => tracing::warn!(error = %e, "no thread for a control connection"),
        }
    }
}

fn stopped_within(stop: &EventFd, timeout: Duration) -> bool {
    let timeout = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
    let mut fds = [PollFd::new(stop.as_fd(), PollFlags::POLLIN)];
    matches!(poll(&mut fds, timeout), Ok(n) if n > 0)
}

fn write_line<T: Serialize>(conn: &UnixStream, value: &T) -> io::Result<()> {
    let mut line = serde_json::to_vec(value).map_err(io::Error::other)?;
    line.push(b'\n');
    send_all(conn, &line)
}

fn serve<S: LineService>(mut conn: &UnixStream, stop: &EventFd, service: &S) -> io::Result<()> {
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        if !wait_readable(conn, stop)? {
            return Ok(());
        }
        let n = match conn.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        // Only the new bytes are searched: a long line arrives in many reads.
        let mut searched = pending.len();
        pending.extend_from_slice(&chunk[..n]);
        let mut start = 0;
        while let Some(at) = pending[searched..].iter().position(|&b| b == b'\n') {
            let end = searched + at;
            let line = &pending[start..end];
            start = end + 1;
            searched = start;
            if line.len() > MAX_LINE {
                return refuse_too_long(conn, service);
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let reply = match serde_json::from_slice::<S::RequestLine>(line) {
                Ok(request) => service.answer(request),
                Err(e) => service.refuse(Refusal::NotRequest(e.to_string())),
            };
            write_line(conn, &reply)?;
        }
        pending.drain(..start);
        if pending.len() > MAX_LINE {
            return refuse_too_long(conn, service);
        }
    }
}

fn refuse_too_long<S: LineService>(conn: &UnixStream, service: &S) -> io::Result<()> {
    tracing::warn!(
        fd = conn.as_raw_fd(),
        "control request line too long; connection closed"
    );
    write_line(conn, &service.refuse(Refusal::TooLong))
}

/// Writes all of `buf` to a socket without risking SIGPIPE.
fn send_all(sock: &UnixStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match send(sock.as_raw_fd(), buf, MsgFlags::MSG_NOSIGNAL) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Reads one line of at most `max` bytes (newline excluded). `Ok(None)` at end of stream.
fn read_line_bounded<R: BufRead>(r: &mut R, max: usize) -> io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    let n = r
        .by_ref()
        .take(max as u64 + 1)
        .read_until(b'\n', &mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
    } else if line.len() > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("line longer than {max} bytes"),
        ));
    }
    Ok(Some(line))
}

/// Why a [`LineClient::call`] got no reply.
#[derive(Debug)]
pub enum CallError {
    /// The request could not be encoded.
    Invalid(String),
    /// The connection failed (a reply line longer than [`MAX_LINE`] included).
    Io(io::Error),
    /// The server closed the connection before replying.
    Closed,
    /// The reply line is not a reply; the decoder's words.
    Protocol(String),
}

impl CallError {
    /// The error a client of `peer` (a daemon's name) reports in [`Reply`] terms.
    pub fn into_reply_error(self, peer: &str) -> ReplyError {
        match self {
            CallError::Invalid(m) => ReplyError::new("invalid", m),
            CallError::Io(e) => ReplyError::new("io", e.to_string()),
            CallError::Closed => ReplyError::new("closed", format!("{peer} closed the connection")),
            CallError::Protocol(m) => ReplyError::new("protocol", format!("reply: {m}")),
        }
    }
}

/// One connection to a control socket.
pub struct LineClient {
    conn: BufReader<UnixStream>,
}

impl LineClient {
    /// Connects to the socket at `path`; a reply not come within `read_timeout` (if given)
    /// fails the call.
    pub fn connect(path: &Path, read_timeout: Option<Duration>) -> io::Result<LineClient> {
        let sock = UnixStream::connect(path)?;
        sock.set_read_timeout(read_timeout)?;
        Ok(LineClient {
            conn: BufReader::new(sock),
        })
    }

    /// Sends one request and waits for its reply.
    pub fn call<Q: Serialize + ?Sized, R: DeserializeOwned>(
        &mut self,
        request: &Q,
    ) -> Result<R, CallError> {
        let mut line =
            serde_json::to_vec(request).map_err(|e| CallError::Invalid(e.to_string()))?;
        line.push(b'\n');
        send_all(self.conn.get_ref(), &line).map_err(CallError::Io)?;
        let reply = read_line_bounded(&mut self.conn, MAX_LINE)
            .map_err(CallError::Io)?
            .ok_or(CallError::Closed)?;
        serde_json::from_slice(&reply).map_err(|e| CallError::Protocol(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::Write;

    /// Answers a JSON value with itself.
    struct Echo;

    impl LineService for Echo {
        type RequestLine = serde_json::Value;
        type ReplyLine = Reply;

        fn answer(&self, request: serde_json::Value) -> Reply {
            Reply::ok(request)
        }

        fn refuse(&self, refusal: Refusal) -> Reply {
            let kind = match refusal {
                Refusal::TooLong => "too_long",
                Refusal::NotRequest(_) => "not_request",
                Refusal::Busy => "busy",
            };
            Reply::err(ReplyError::new(kind, "refused"))
        }
    }

    fn refusal_line(kind: &str) -> String {
        format!("{{\"ok\":false,\"error\":{{\"kind\":\"{kind}\",\"message\":\"refused\"}}}}\n")
    }

    fn start(dir: &Path) -> (PathBuf, LineServer) {
        let path = dir.join("ctl.sock");
        let server = LineServer::start(&path, Some(0o600), "test-ctl", Echo).unwrap();
        (path, server)
    }

    fn read_rest(mut conn: &UnixStream) -> String {
        let mut rest = String::new();
        conn.read_to_string(&mut rest).unwrap();
        rest
    }

    #[test]
    fn lines_are_answered_in_order_and_blank_ones_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _server) = start(dir.path());
        let mut client = LineClient::connect(&path, None).unwrap();
        let reply: Reply = client.call(&json!({"op": "status"})).unwrap();
        assert_eq!(reply, Reply::ok(json!({"op": "status"})));

        let conn = UnixStream::connect(&path).unwrap();
        send_all(&conn, b"\n  \n[1]\nnot json\n{\"a\":2}\n").unwrap();
        conn.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(
            read_rest(&conn),
            format!(
                "{}\n{}{}\n",
                r#"{"ok":true,"result":[1]}"#,
                refusal_line("not_request"),
                r#"{"ok":true,"result":{"a":2}}"#
            )
        );
    }

    #[test]
    fn a_line_of_max_line_bytes_is_answered() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _server) = start(dir.path());
        let text = "x".repeat(MAX_LINE - 2);
        let conn = UnixStream::connect(&path).unwrap();
        let writer = {
            let conn = conn.try_clone().unwrap();
            let line = format!("\"{text}\"\n");
            std::thread::spawn(move || send_all(&conn, line.as_bytes()))
        };
        let mut reader = BufReader::new(&conn);
        let mut reply = String::new();
        reader.read_line(&mut reply).unwrap();
        writer.join().unwrap().unwrap();
        assert_eq!(reply, format!("{{\"ok\":true,\"result\":\"{text}\"}}\n"));
    }

    #[test]
    fn an_over_long_line_is_refused_and_its_connection_closed() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _server) = start(dir.path());
        let conn = UnixStream::connect(&path).unwrap();
        // A line answered before the long one still gets its reply.
        let mut bytes = b"1\n".to_vec();
        bytes.resize(bytes.len() + MAX_LINE + 1, b'x');
        (&conn).write_all(&bytes).unwrap();
        assert_eq!(
            read_rest(&conn),
            format!(
                "{}\n{}",
                r#"{"ok":true,"result":1}"#,
                refusal_line("too_long")
            )
        );
        // Other connections are served as before.
        let mut client = LineClient::connect(&path, None).unwrap();
        let reply: Reply = client.call(&json!(2)).unwrap();
        assert_eq!(reply, Reply::ok(json!(2)));
    }

    #[test]
    fn a_connection_beyond_the_limit_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _server) = start(dir.path());
        // Each served once, so each holds its seat.
        let mut clients: Vec<LineClient> = (0..MAX_CONNECTIONS)
            .map(|i| {
                let mut c = LineClient::connect(&path, None).unwrap();
                let reply: Reply = c.call(&json!(i)).unwrap();
                assert_eq!(reply, Reply::ok(json!(i)));
                c
            })
            .collect();
        let extra = UnixStream::connect(&path).unwrap();
        assert_eq!(read_rest(&extra), refusal_line("busy"));
        // Refused, not disturbed: the others are still served.
        let reply: Reply = clients[0].call(&json!("again")).unwrap();
        assert_eq!(reply, Reply::ok(json!("again")));
    }

    #[test]
    fn stop_ends_an_idle_connection_and_removes_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut server) = start(dir.path());
        let mut client = LineClient::connect(&path, None).unwrap();
        let reply: Reply = client.call(&json!("hello")).unwrap();
        assert_eq!(reply, Reply::ok(json!("hello")));
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let stopper = std::thread::spawn(move || {
            server.stop();
            let _ = done_tx.send(());
        });
        // A bound, not a pause: a stop that waited for the idle client would never end.
        done_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("stop waits for an idle connection");
        stopper.join().unwrap();
        assert!(!path.exists());
        assert!(matches!(
            client.call::<_, Reply>(&json!("late")),
            Err(CallError::Closed | CallError::Io(_))
        ));
    }

    #[test]
    fn the_socket_appears_only_once_it_listens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        for round in 0..20 {
            let waiter = {
                let path = path.clone();
                std::thread::spawn(move || loop {
                    match UnixStream::connect(&path) {
                        Ok(conn) => return conn,
                        Err(e) if e.kind() == io::ErrorKind::NotFound => std::thread::yield_now(),
                        Err(e) => panic!("round {round}: connecting as the file appears: {e}"),
                    }
                })
            };
            let server = LineServer::start(&path, Some(0o600), "test-ctl", Echo).unwrap();
            let conn = waiter.join().unwrap();
            send_all(&conn, format!("{round}\n").as_bytes()).unwrap();
            let mut reply = String::new();
            BufReader::new(&conn).read_line(&mut reply).unwrap();
            assert_eq!(reply, format!("{{\"ok\":true,\"result\":{round}}}\n"));
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            let names: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, ["ctl.sock"], "no temporary name is left behind");
            drop(server);
            assert!(!path.exists());
        }
    }

    #[test]
    fn bounded_lines() {
        let mut r = io::Cursor::new(b"abc\ndefgh\n".to_vec());
        assert_eq!(read_line_bounded(&mut r, 4).unwrap().unwrap(), b"abc");
        assert!(read_line_bounded(&mut r, 4).is_err());
        let mut r = io::Cursor::new(b"last".to_vec());
        assert_eq!(read_line_bounded(&mut r, 4).unwrap().unwrap(), b"last");
        assert!(read_line_bounded(&mut r, 4).unwrap().is_none());
    }

    #[test]
    fn replies_have_the_documented_json_form() {
        let ok = Reply::ok(json!({"peers": 2}));
        assert_eq!(
            serde_json::to_string(&ok).unwrap(),
            r#"{"ok":true,"result":{"peers":2}}"#
        );
        let err = Reply::err(ReplyError::new("invalid", "bad mac"));
        let text = serde_json::to_string(&err).unwrap();
        assert_eq!(
            text,
            r#"{"ok":false,"error":{"kind":"invalid","message":"bad mac"}}"#
        );
        let back: Reply = serde_json::from_str(&text).unwrap();
        assert_eq!(
            back.into_result().unwrap_err(),
            ReplyError::new("invalid", "bad mac")
        );
    }
}

//! [`XsClient`]: the xenstore protocol over a unix socket or the xenbus device.
//!
//! One reader thread owns the receiving side. Replies are matched to their caller by
//! `req_id`; watch events go to a queue whose eventfd ([`Xenstore::watch_fd`]) is
//! readable while the queue is not empty. Requests may be issued from many threads
//! at once.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{self, MsgFlags};

use super::wire::{self, MsgType, XsFrame, PAYLOAD_MAX};
use crate::lock;
use crate::{DomId, Error, Port, Result, TxId, WatchEvent, Xenstore, XsPerm};

/// Where xenstored listens on a Xen host.
pub const DEFAULT_SOCKET: &str = "/run/xenstored/socket";
/// The kernel's xenstore device (guests, and dom0 without a local socket).
pub const XENBUS_DEVICE: &str = "/dev/xen/xenbus";
/// Environment variable naming the socket or device to use, as libxenstore reads it.
pub const PATH_ENV: &str = "XENSTORED_PATH";
/// How long a request waits for xenstored's reply by default. xenstored answers every
/// request at once (nothing in the protocol blocks), so a reply this late means a stuck or
/// starved daemon: the caller gets a clear error instead of hanging with whatever locks it
/// holds. Generous, because dom0's xenstored on a loaded host can be slow.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A xenstore connection; see the module documentation.
pub struct XsClient {
    shared: Arc<XsClientShared>,
    writer: Mutex<XsWriter>,
    stop: Arc<EventFd>,
    reader: Mutex<Option<JoinHandle<()>>>,
    next_req_id: AtomicU32,
    endpoint: String,
    /// Bound on each request's wait for its reply, in milliseconds.
    request_timeout_ms: AtomicU64,
}

/// The sending side of the connection.
struct XsWriter {
    file: File,
    is_socket: bool,
}

impl XsWriter {
    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        if !self.is_socket {
            return self.file.write_all(bytes);
        }
        // send(2) with MSG_NOSIGNAL: a closed peer must be an error, not a SIGPIPE that
        // kills whatever process (possibly a C program) embeds this client.
        let mut rest = bytes;
        while !rest.is_empty() {
            match socket::send(self.file.as_raw_fd(), rest, MsgFlags::MSG_NOSIGNAL) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => rest = &rest[n..],
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// State shared with the reader thread.
struct XsClientShared {
    pending: Mutex<Pending>,
    events: Mutex<Events>,
    events_cv: Condvar,
    /// Readable while `events.queue` is non-empty or the connection is closed.
    event_fd: EventFd,
}

struct Pending {
    waiting: HashMap<u32, SyncSender<XsFrame>>,
    closed: Option<String>,
}

struct Events {
    queue: VecDeque<WatchEvent>,
    closed: bool,
}

impl XsClientShared {
    fn close(&self, reason: String) {
        let waiting = {
            let mut p = lock(&self.pending);
            if p.closed.is_none() {
                p.closed = Some(reason);
            }
            std::mem::take(&mut p.waiting)
        };
        // Dropping the senders wakes every caller with a closed channel.
        drop(waiting);
        let mut ev = lock(&self.events);
        ev.closed = true;
        let _ = self.event_fd.write(1);
        self.events_cv.notify_all();
    }

    fn push_event(&self, event: WatchEvent) {
        let mut ev = lock(&self.events);
        ev.queue.push_back(event);
        let _ = self.event_fd.write(1);
        self.events_cv.notify_all();
    }

    fn deliver(&self, frame: XsFrame) {
        if frame.kind() == Some(MsgType::WatchEvent) {
            match wire::split_strings(&frame.payload) {
                Ok(fields) if fields.len() >= 2 => self.push_event(WatchEvent {
                    path: fields[0].to_string(),
                    token: fields[1].to_string(),
                }),
                _ => tracing::warn!(len = frame.payload.len(), "malformed watch event dropped"),
            }
            return;
        }
        let sender = lock(&self.pending).waiting.remove(&frame.header.req_id);
        match sender {
            Some(s) => {
                let _ = s.send(frame);
            }
            None => tracing::warn!(
                req_id = frame.header.req_id,
                msg_type = frame.header.msg_type,
                "reply to no outstanding request dropped"
            ),
        }
    }
}

impl XsClient {
    /// Connect to a xenstored unix socket (a simhv domain socket or /run/xenstored/socket).
    pub fn connect_unix<P: AsRef<Path>>(path: P) -> Result<XsClient> {
        let path = path.as_ref();
        let stream = UnixStream::connect(path)?;
        XsClient::from_fd(OwnedFd::from(stream), true, path.display().to_string())
    }

    /// Open the kernel's xenbus device, /dev/xen/xenbus.
    pub fn open_xenbus() -> Result<XsClient> {
        XsClient::open_device(XENBUS_DEVICE)
    }

    /// Open a character device that speaks the xenstore framing.
    pub fn open_device<P: AsRef<Path>>(path: P) -> Result<XsClient> {
        let path = path.as_ref();
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        XsClient::from_fd(OwnedFd::from(file), false, path.display().to_string())
    }

    /// Connect as libxenstore does: `XENSTORED_PATH` if set (socket or device), else
    /// /run/xenstored/socket, else /dev/xen/xenbus.
    pub fn from_env() -> Result<XsClient> {
        if let Some(path) = std::env::var_os(PATH_ENV) {
            let meta = std::fs::metadata(&path)?;
            return if meta.file_type().is_socket() {
                XsClient::connect_unix(&path)
            } else {
                XsClient::open_device(&path)
            };
        }
        match XsClient::connect_unix(DEFAULT_SOCKET) {
            Ok(c) => Ok(c),
            Err(e) => {
                tracing::debug!(error = %e, "no xenstored socket, trying the xenbus device");
                XsClient::open_xenbus()
            }
        }
    }

    /// Wrap an already connected socket (e.g. one end of a socketpair).
    pub fn from_unix_stream(stream: UnixStream) -> Result<XsClient> {
        XsClient::from_fd(OwnedFd::from(stream), true, "unix stream".to_string())
    }

    fn from_fd(fd: OwnedFd, is_socket: bool, endpoint: String) -> Result<XsClient> {
        let file = File::from(fd);
        let read_side = file.try_clone()?;
        let event_fd =
            EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .map_err(io::Error::from)?;
        let stop = Arc::new(
            EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .map_err(io::Error::from)?,
        );
        let shared = Arc::new(XsClientShared {
            pending: Mutex::new(Pending {
                waiting: HashMap::new(),
                closed: None,
            }),
            events: Mutex::new(Events {
                queue: VecDeque::new(),
                closed: false,
            }),
            events_cv: Condvar::new(),
            event_fd,
        });
        let reader = {
            let shared = Arc::clone(&shared);
            let stop = Arc::clone(&stop);
            let endpoint = endpoint.clone();
            std::thread::Builder::new()
                .name("xs-client-rx".into())
                .spawn(move || reader_loop(read_side, &shared, &stop, &endpoint))?
        };
        tracing::debug!(endpoint = %endpoint, "xenstore connection open");
        Ok(XsClient {
            shared,
            writer: Mutex::new(XsWriter { file, is_socket }),
            stop,
            reader: Mutex::new(Some(reader)),
            next_req_id: AtomicU32::new(1),
            endpoint,
            request_timeout_ms: AtomicU64::new(REQUEST_TIMEOUT.as_millis() as u64),
        })
    }

    /// Sets how long each request waits for its reply ([`REQUEST_TIMEOUT`] by default).
    pub fn set_request_timeout(&self, timeout: Duration) {
        let ms = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        self.request_timeout_ms.store(ms, Ordering::Relaxed);
    }

    /// Send one request and wait for its reply, at most the request timeout. Returns the
    /// reply payload, the error xenstored answered with, or a timed-out I/O error (a reply
    /// that comes later is dropped; the connection stays usable). `msg_type` is raw so any
    /// type can be sent.
    pub fn request(
        &self,
        msg_type: u32,
        tx: TxId,
        payload: Vec<u8>,
        what: &str,
    ) -> Result<Vec<u8>> {
        if payload.len() > PAYLOAD_MAX {
            return Err(Error::Quota(format!(
                "{what}: request payload of {} bytes exceeds {PAYLOAD_MAX}",
                payload.len()
            )));
        }
        let req_id = self.alloc_req_id();
        let frame = XsFrame::with_raw_type(msg_type, req_id, tx, payload)?;
        let (tx_reply, rx_reply) = mpsc::sync_channel(1);
        {
            let mut p = lock(&self.shared.pending);
            if let Some(reason) = &p.closed {
                return Err(Error::Closed(format!("{}: {reason}", self.endpoint)));
            }
            p.waiting.insert(req_id, tx_reply);
        }
        let sent = lock(&self.writer).send(&frame.encode());
        if let Err(e) = sent {
            lock(&self.shared.pending).waiting.remove(&req_id);
            return Err(Error::Closed(format!("{}: send: {e}", self.endpoint)));
        }
        let timeout = Duration::from_millis(self.request_timeout_ms.load(Ordering::Relaxed));
        let reply = match rx_reply.recv_timeout(timeout) {
            Ok(reply) => reply,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // Forget the request so its late reply is dropped rather than delivered
                // to nobody; a reply that raced in just now is taken after all.
                lock(&self.shared.pending).waiting.remove(&req_id);
                match rx_reply.try_recv() {
                    Ok(reply) => reply,
                    Err(_) => {
                        tracing::warn!(endpoint = %self.endpoint, what, ?timeout, "xenstore request unanswered");
                        return Err(Error::Io(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!(
                                "{what}: xenstore ({}) did not answer in {} ms",
                                self.endpoint,
                                timeout.as_millis()
                            ),
                        )));
                    }
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let reason = lock(&self.shared.pending)
                    .closed
                    .clone()
                    .unwrap_or_else(|| "closed".into());
                return Err(Error::Closed(format!("{}: {reason}", self.endpoint)));
            }
        };
        if reply.kind() == Some(MsgType::Error) {
            let name = wire::one_string(&reply.payload)
                .map_err(|e| Error::Protocol(format!("{what}: bad error reply: {e}")))?;
            return Err(wire::error_from_name(name, what));
        }
        if reply.header.msg_type != msg_type {
            return Err(Error::Protocol(format!(
                "{what}: reply of type {} to a request of type {msg_type}",
                reply.header.msg_type
            )));
        }
        Ok(reply.payload)
    }

    fn alloc_req_id(&self) -> u32 {
        loop {
            let id = self.next_req_id.fetch_add(1, Ordering::Relaxed);
            // 0 is what watch events carry; keep it out of the request space.
            if id != 0 {
                return id;
            }
        }
    }

    fn expect_ok(&self, ty: MsgType, tx: TxId, payload: Vec<u8>, what: &str) -> Result<()> {
        let reply = self.request(ty.as_u32(), tx, payload, what)?;
        if reply != wire::OK_PAYLOAD {
            tracing::debug!(?ty, reply = ?String::from_utf8_lossy(&reply), "unexpected acknowledgement");
        }
        Ok(())
    }

    fn string_reply(&self, ty: MsgType, tx: TxId, payload: Vec<u8>, what: &str) -> Result<String> {
        let reply = self.request(ty.as_u32(), tx, payload, what)?;
        // xenstored NUL-terminates these replies; accept a missing terminator too.
        let trimmed = reply.strip_suffix(&[0]).unwrap_or(&reply);
        String::from_utf8(trimmed.to_vec())
            .map_err(|_| Error::Protocol(format!("{what}: reply is not UTF-8")))
    }

    /// The children of `path` read piecewise with DIRECTORY_PART, for lists too long
    /// for one reply. Restarts if the node changes between pieces.
    pub fn directory_part(&self, tx: TxId, path: &str) -> Result<Vec<String>> {
        'restart: for _ in 0..16 {
            let mut names = Vec::new();
            let mut offset: usize = 0;
            let mut generation: Option<String> = None;
            loop {
                let payload = wire::join_strings(&[path, &offset.to_string()]);
                let reply = self.request(MsgType::DirectoryPart.as_u32(), tx, payload, path)?;
                let fields = wire::split_strings(&reply)?;
                let (gen, rest) = fields.split_first().ok_or_else(|| {
                    Error::Protocol(format!("{path}: empty DIRECTORY_PART reply"))
                })?;
                match &generation {
                    Some(g) if g != gen => continue 'restart,
                    Some(_) => {}
                    None => generation = Some(gen.to_string()),
                }
                let (done, chunk) = match rest.split_last() {
                    Some((&"", head)) => (true, head),
                    _ => (false, rest),
                };
                if !done && chunk.is_empty() {
                    return Err(Error::Protocol(format!(
                        "{path}: DIRECTORY_PART made no progress at offset {offset}"
                    )));
                }
                for name in chunk {
                    offset += name.len() + 1;
                    names.push(name.to_string());
                }
                if done {
                    return Ok(names);
                }
            }
        }
        Err(Error::Again)
    }

    /// The socket or device this client talks to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

fn reader_loop(mut file: File, shared: &XsClientShared, stop: &EventFd, endpoint: &str) {
    let reason = loop {
        let ready = {
            let mut fds = [
                PollFd::new(file.as_fd(), PollFlags::POLLIN),
                PollFd::new(stop.as_fd(), PollFlags::POLLIN),
            ];
            match nix::poll::poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(e) => break format!("poll: {e}"),
            }
            if fds[1].any().unwrap_or(false) {
                break "client closed".to_string();
            }
            fds[0].any().unwrap_or(false)
        };
        if !ready {
            continue;
        }
        match wire::read_frame(&mut file) {
            Ok(Some(frame)) => shared.deliver(frame),
            Ok(None) => break "xenstored closed the connection".to_string(),
            Err(e) => break format!("read: {e}"),
        }
    };
    tracing::debug!(endpoint, reason = %reason, "xenstore reader stopped");
    shared.close(reason);
}

impl Drop for XsClient {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        {
            let w = lock(&self.writer);
            if w.is_socket {
                // Unblocks a reader stuck in the middle of a frame.
                let _ = socket::shutdown(w.file.as_raw_fd(), socket::Shutdown::Both);
            }
        }
        if let Some(h) = lock(&self.reader).take() {
            let _ = h.join();
        }
    }
}

impl Xenstore for XsClient {
    fn read(&self, tx: TxId, path: &str) -> Result<Vec<u8>> {
        self.request(
            MsgType::Read.as_u32(),
            tx,
            wire::join_strings(&[path]),
            path,
        )
    }

    fn write(&self, tx: TxId, path: &str, value: &[u8]) -> Result<()> {
        self.expect_ok(MsgType::Write, tx, wire::write_payload(path, value), path)
    }

    fn mkdir(&self, tx: TxId, path: &str) -> Result<()> {
        self.expect_ok(MsgType::Mkdir, tx, wire::join_strings(&[path]), path)
    }

    fn rm(&self, tx: TxId, path: &str) -> Result<()> {
        self.expect_ok(MsgType::Rm, tx, wire::join_strings(&[path]), path)
    }

    fn directory(&self, tx: TxId, path: &str) -> Result<Vec<String>> {
        match self.request(
            MsgType::Directory.as_u32(),
            tx,
            wire::join_strings(&[path]),
            path,
        ) {
            Ok(reply) => Ok(wire::split_strings(&reply)?
                .into_iter()
                .map(str::to_string)
                .collect()),
            // E2BIG: the list does not fit one reply; fetch it in parts as libxenstore does.
            Err(Error::Quota(_)) => self.directory_part(tx, path),
            Err(e) => Err(e),
        }
    }

    fn get_perms(&self, tx: TxId, path: &str) -> Result<Vec<XsPerm>> {
        let reply = self.request(
            MsgType::GetPerms.as_u32(),
            tx,
            wire::join_strings(&[path]),
            path,
        )?;
        let fields = wire::split_strings(&reply)?;
        Ok(wire::parse_perms(&fields)?)
    }

    fn set_perms(&self, tx: TxId, path: &str, perms: &[XsPerm]) -> Result<()> {
        if perms.is_empty() {
            return Err(Error::Invalid(format!("{path}: empty permission list")));
        }
        let mut fields = vec![path.to_string()];
        fields.extend(perms.iter().map(wire::format_perm));
        self.expect_ok(MsgType::SetPerms, tx, wire::join_strings(&fields), path)
    }

    fn transaction_start(&self) -> Result<TxId> {
        let id = self.string_reply(MsgType::TransactionStart, 0, vec![0], "transaction start")?;
        Ok(wire::parse_u32(&id)?)
    }

    fn transaction_end(&self, tx: TxId, commit: bool) -> Result<()> {
        let flag = if commit { "T" } else { "F" };
        self.expect_ok(
            MsgType::TransactionEnd,
            tx,
            wire::join_strings(&[flag]),
            "transaction end",
        )
    }

    fn watch(&self, path: &str, token: &str) -> Result<()> {
        self.expect_ok(MsgType::Watch, 0, wire::join_strings(&[path, token]), path)
    }

    fn unwatch(&self, path: &str, token: &str) -> Result<()> {
        self.expect_ok(
            MsgType::Unwatch,
            0,
            wire::join_strings(&[path, token]),
            path,
        )
    }

    fn watch_fd(&self) -> RawFd {
        self.shared.event_fd.as_raw_fd()
    }

    fn next_watch_event(&self, timeout: Option<Duration>) -> Result<Option<WatchEvent>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut ev = lock(&self.shared.events);
        loop {
            if let Some(event) = ev.queue.pop_front() {
                if ev.queue.is_empty() && !ev.closed {
                    // Reset the counter: the fd is readable only while events wait.
                    let _ = self.shared.event_fd.read();
                }
                return Ok(Some(event));
            }
            if ev.closed {
                return Err(Error::Closed(format!(
                    "{}: connection closed",
                    self.endpoint
                )));
            }
            match deadline {
                None => {
                    ev = self
                        .shared
                        .events_cv
                        .wait(ev)
                        .unwrap_or_else(|p| p.into_inner());
                }
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(None);
                    }
                    ev = self
                        .shared
                        .events_cv
                        .wait_timeout(ev, d - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
    }

    fn get_domain_path(&self, domid: DomId) -> Result<String> {
        self.string_reply(
            MsgType::GetDomainPath,
            0,
            wire::join_strings(&[domid.to_string()]),
            "get domain path",
        )
    }

    fn introduce(&self, domid: DomId, mfn: u64, port: Port) -> Result<()> {
        self.expect_ok(
            MsgType::Introduce,
            0,
            wire::join_strings(&[domid.to_string(), mfn.to_string(), port.to_string()]),
            "introduce",
        )
    }

    fn release(&self, domid: DomId) -> Result<()> {
        self.expect_ok(
            MsgType::Release,
            0,
            wire::join_strings(&[domid.to_string()]),
            "release",
        )
    }

    fn is_domain_introduced(&self, domid: DomId) -> Result<bool> {
        let answer = self.string_reply(
            MsgType::IsDomainIntroduced,
            0,
            wire::join_strings(&[domid.to_string()]),
            "is domain introduced",
        )?;
        match answer.as_str() {
            "T" => Ok(true),
            "F" => Ok(false),
            other => Err(Error::Protocol(format!(
                "is domain introduced: unexpected answer {other:?}"
            ))),
        }
    }

    fn reset_watches(&self) -> Result<()> {
        self.expect_ok(MsgType::ResetWatches, 0, vec![0], "reset watches")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::XsAccess;
    use std::io::Read;

    /// A scripted peer on the other end of a socketpair: for each request it reads,
    /// it runs `answer`, which returns the frames to send back.
    fn scripted_server<F>(mut answer: F) -> (XsClient, std::thread::JoinHandle<Vec<XsFrame>>)
    where
        F: FnMut(&XsFrame) -> Vec<XsFrame> + Send + 'static,
    {
        let (a, mut b) = UnixStream::pair().unwrap();
        let client = XsClient::from_unix_stream(a).unwrap();
        let h = std::thread::spawn(move || {
            let mut seen = Vec::new();
            while let Ok(Some(req)) = wire::read_frame(&mut b) {
                for f in answer(&req) {
                    b.write_all(&f.encode()).unwrap();
                }
                seen.push(req);
            }
            seen
        });
        (client, h)
    }

    fn reply(req: &XsFrame, payload: &[u8]) -> XsFrame {
        XsFrame::with_raw_type(
            req.header.msg_type,
            req.header.req_id,
            req.header.tx_id,
            payload.to_vec(),
        )
        .unwrap()
    }

    #[test]
    fn an_unanswered_request_times_out_and_its_late_reply_is_dropped() {
        let mut held: Option<XsFrame> = None;
        let (client, h) = scripted_server(move |req| {
            let path = wire::split_strings(&req.payload).unwrap()[0].to_string();
            if path == "/stuck" {
                // Not answered until the next request comes.
                held = Some(req.clone());
                return Vec::new();
            }
            let mut out: Vec<XsFrame> = held
                .take()
                .map(|r| reply(&r, b"late"))
                .into_iter()
                .collect();
            out.push(reply(req, b"fresh"));
            out
        });
        client.set_request_timeout(Duration::from_millis(200));
        let Err(Error::Io(e)) = client.read(0, "/stuck") else {
            panic!("an unanswered read must time out");
        };
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("did not answer in 200 ms"), "{e}");
        // The late reply to the first read is not taken for the second's.
        assert_eq!(client.read(0, "/next").unwrap(), b"fresh");
        assert_eq!(client.read(0, "/again").unwrap(), b"fresh");
        drop(client);
        assert_eq!(h.join().unwrap().len(), 3);
    }

    #[test]
    fn requests_are_encoded_as_xenstored_expects() {
        let (client, h) = scripted_server(|req| {
            let payload: &[u8] = match req.kind() {
                Some(MsgType::Read) => b"value",
                Some(MsgType::Directory) => b"a\0bb\0",
                Some(MsgType::GetPerms) => b"n3\0r0\0",
                Some(MsgType::TransactionStart) => b"17\0",
                Some(MsgType::GetDomainPath) => b"/local/domain/4\0",
                Some(MsgType::IsDomainIntroduced) => b"F\0",
                _ => b"OK\0",
            };
            vec![reply(req, payload)]
        });
        assert_eq!(client.read(0, "/r").unwrap(), b"value");
        client.write(5, "/w", b"\0bin").unwrap();
        client.mkdir(0, "/m").unwrap();
        client.rm(0, "/x").unwrap();
        assert_eq!(client.directory(0, "/d").unwrap(), vec!["a", "bb"]);
        assert_eq!(
            client.get_perms(0, "/p").unwrap(),
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
        client
            .set_perms(
                0,
                "/p",
                &[XsPerm {
                    domid: 2,
                    access: XsAccess::Both,
                }],
            )
            .unwrap();
        assert_eq!(client.transaction_start().unwrap(), 17);
        client.transaction_end(17, false).unwrap();
        client.watch("/w", "tok").unwrap();
        client.unwatch("/w", "tok").unwrap();
        assert_eq!(client.get_domain_path(4).unwrap(), "/local/domain/4");
        client.introduce(4, 1234, 7).unwrap();
        client.release(4).unwrap();
        assert!(!client.is_domain_introduced(4).unwrap());
        client.reset_watches().unwrap();
        drop(client);
        let seen = h.join().unwrap();
        let got: Vec<(u32, u32, Vec<u8>)> = seen
            .iter()
            .map(|f| (f.header.msg_type, f.header.tx_id, f.payload.clone()))
            .collect();
        let expected: Vec<(u32, u32, &[u8])> = vec![
            (2, 0, b"/r\0"),
            (11, 5, b"/w\0\0bin"),
            (12, 0, b"/m\0"),
            (13, 0, b"/x\0"),
            (1, 0, b"/d\0"),
            (3, 0, b"/p\0"),
            (14, 0, b"/p\0b2\0"),
            (6, 0, b"\0"),
            (7, 17, b"F\0"),
            (4, 0, b"/w\0tok\0"),
            (5, 0, b"/w\0tok\0"),
            (10, 0, b"4\0"),
            (8, 0, b"4\x001234\x007\0"),
            (9, 0, b"4\0"),
            (17, 0, b"4\0"),
            (21, 0, b"\0"),
        ];
        assert_eq!(got.len(), expected.len());
        for (g, e) in got.iter().zip(expected) {
            assert_eq!((g.0, g.1, g.2.as_slice()), e);
        }
        // Every request carried a distinct, non-zero req_id.
        let mut ids: Vec<u32> = seen.iter().map(|f| f.header.req_id).collect();
        assert!(ids.iter().all(|&i| i != 0));
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), seen.len());
    }

    #[test]
    fn error_replies_map_to_errors() {
        let (client, _h) = scripted_server(|req| {
            let name: &[u8] = match wire::one_string(&req.payload).unwrap_or("") {
                "/noent" => b"ENOENT\0",
                "/acces" => b"EACCES\0",
                "/again" => b"EAGAIN\0",
                "/big" => b"E2BIG\0",
                _ => b"EIO\0",
            };
            vec![
                XsFrame::with_raw_type(16, req.header.req_id, req.header.tx_id, name.to_vec())
                    .unwrap(),
            ]
        });
        assert!(matches!(client.read(0, "/noent"), Err(Error::NotFound(p)) if p == "/noent"));
        assert!(matches!(client.read(0, "/acces"), Err(Error::Denied(_))));
        assert!(matches!(client.read(0, "/again"), Err(Error::Again)));
        assert!(matches!(client.read(0, "/big"), Err(Error::Quota(_))));
        assert!(matches!(client.read(0, "/other"), Err(Error::Xs(n)) if n == "EIO"));
    }

    #[test]
    fn watch_events_are_queued_apart_from_replies() {
        let (client, _h) = scripted_server(|req| {
            // An event arrives before the reply it races with.
            let ev =
                XsFrame::new(MsgType::WatchEvent, 0, 0, wire::join_strings(&["/k", "t1"])).unwrap();
            vec![ev, reply(req, b"v")]
        });
        let fd = client.watch_fd();
        assert!(!fd_readable(fd));
        assert_eq!(client.read(0, "/k").unwrap(), b"v");
        assert!(fd_readable(fd));
        assert_eq!(client.read(0, "/k").unwrap(), b"v");
        let e1 = client
            .next_watch_event(Some(Duration::ZERO))
            .unwrap()
            .unwrap();
        assert_eq!(
            e1,
            WatchEvent {
                path: "/k".into(),
                token: "t1".into()
            }
        );
        assert!(fd_readable(fd));
        assert!(client.next_watch_event(None).unwrap().is_some());
        assert!(!fd_readable(fd));
        assert!(client
            .next_watch_event(Some(Duration::from_millis(1)))
            .unwrap()
            .is_none());
    }

    #[test]
    fn replies_are_matched_by_req_id_across_threads() {
        // Each round, every thread has exactly one request in flight; the server reads
        // them all and answers in reverse order.
        const THREADS: usize = 6;
        const ROUNDS: usize = 20;
        let (a, mut b) = UnixStream::pair().unwrap();
        let client = Arc::new(XsClient::from_unix_stream(a).unwrap());
        let server = std::thread::spawn(move || {
            for _ in 0..ROUNDS {
                let mut batch = Vec::new();
                for _ in 0..THREADS {
                    let req = wire::read_frame(&mut b).unwrap().unwrap();
                    let path = wire::one_string(&req.payload).unwrap().to_string();
                    batch.push(reply(&req, path.as_bytes()));
                }
                for r in batch.iter().rev() {
                    b.write_all(&r.encode()).unwrap();
                }
            }
        });
        let barrier = Arc::new(std::sync::Barrier::new(THREADS));
        let threads: Vec<_> = (0..THREADS)
            .map(|i| {
                let c = Arc::clone(&client);
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    for j in 0..ROUNDS {
                        barrier.wait();
                        let path = format!("/t{i}/{j}");
                        assert_eq!(c.read(0, &path).unwrap(), path.as_bytes());
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        server.join().unwrap();
    }

    #[test]
    fn closed_connection_fails_pending_and_later_requests() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let client = XsClient::from_unix_stream(a).unwrap();
        let server = std::thread::spawn(move || {
            let mut hdr = [0u8; 16];
            b.read_exact(&mut hdr).unwrap();
            // Close without answering.
        });
        assert!(matches!(client.read(0, "/a"), Err(Error::Closed(_))));
        server.join().unwrap();
        assert!(matches!(client.read(0, "/a"), Err(Error::Closed(_))));
        assert!(matches!(
            client.next_watch_event(None),
            Err(Error::Closed(_))
        ));
        assert!(fd_readable(client.watch_fd()));
    }

    #[test]
    fn oversized_requests_are_refused_locally() {
        let (client, _h) = scripted_server(|req| vec![reply(req, b"OK\0")]);
        let big = vec![b'x'; PAYLOAD_MAX];
        assert!(matches!(client.write(0, "/a", &big), Err(Error::Quota(_))));
        client.write(0, "/a", &big[..PAYLOAD_MAX - 3]).unwrap();
    }

    #[test]
    fn directory_falls_back_to_parts_on_e2big() {
        let (client, h) = scripted_server(|req| match req.kind() {
            Some(MsgType::Directory) => {
                vec![XsFrame::with_raw_type(16, req.header.req_id, 0, b"E2BIG\0".to_vec()).unwrap()]
            }
            Some(MsgType::DirectoryPart) => {
                let f = wire::split_strings(&req.payload).unwrap();
                let body: &[u8] = match f[1] {
                    "0" => b"9\0alpha\0beta\0",
                    "11" => b"9\0gamma\0\0",
                    _ => b"9\0\0",
                };
                vec![reply(req, body)]
            }
            _ => vec![],
        });
        assert_eq!(
            client.directory(0, "/big").unwrap(),
            vec!["alpha", "beta", "gamma"]
        );
        drop(client);
        let seen = h.join().unwrap();
        assert_eq!(seen.len(), 3);
        assert_eq!(seen[2].payload, b"/big\x0011\0");
    }

    fn fd_readable(fd: RawFd) -> bool {
        // SAFETY: `fd` is the client's eventfd, open for the whole call.
        let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let mut fds = [PollFd::new(borrowed, PollFlags::POLLIN)];
        nix::poll::poll(&mut fds, PollTimeout::ZERO).unwrap() > 0
    }
}

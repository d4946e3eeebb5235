//! The service of `xmx-frontd`: one [`Frontend`] shared by every application connected to
//! the daemon's unix socket.
//!
//! - The main thread waits (epoll) on the listening socket, the frontend's xenstore watch
//!   queue and a stop descriptor. It accepts applications, drives the xenbus handshake,
//!   and pushes notices (endpoint re-opened, disconnected, ...) to the applications
//!   concerned. While the device is suspended it probes now and then whether the domain
//!   runs again (nothing signals a resume on the simulator).
//! - Each application is served by a thread of its own, requests in order (see
//!   [`xmx_frontend::frontd::proto`]). Endpoints and regions belong to the connection that
//!   opened them: when it closes (the application exits or crashes: the kernel closes
//!   the socket), they are closed in the backend and their grants ended. Only then: the
//!   application's mappings are gone with the process.
//! - The device may be removed and created again by dom0 (a detach, or a move to another
//!   virtual cluster): applications see the disconnection, and once the device is back
//!   their endpoints are re-opened and handed over again, as after a resume. The daemon
//!   stops only when told to (or when the frontend gives the device up for good).
//! - The guest's grants are shared by its applications: a registration that fails for
//!   want of them is answered with the error, and every application is told
//!   ([`Notice::GrantsShort`]) to give back the windows its registration caches keep
//!   unused; the library that failed tries again (a receive waits for room).
//! - Stopping: applications are told ([`Notice::Shutdown`]) and given `drain` to
//!   disconnect, then the device goes Closing, waits for the backend to let go, ends every
//!   grant and goes Closed.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use xmx_frontend::frontd::proto::{ErrorReply, MAX_MESSAGE};
use xmx_frontend::frontd::{FrontdBoardInfo, FrontdMessage, FrontdReply, FrontdRequest, Notice};
use xmx_frontend::{Error, Frontend, FrontendEvent, Mode};
use xmx_hv::handoff::{recv_message, send_message};
use xmx_hv::lock;

/// How the service runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where to listen.
    pub socket: PathBuf,
    /// Applications served at once.
    pub max_clients: usize,
    /// How long applications get to disconnect when the daemon stops.
    pub drain: Duration,
    /// First interval between resume probes while suspended.
    pub probe_min: Duration,
    /// Longest interval between resume probes while suspended.
    pub probe_max: Duration,
    /// Domain of the toolstack that brokers direct channels.
    pub toolstack: u16,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            socket: xmx_frontend::frontd::proto::default_socket_path(),
            max_clients: 128,
            drain: Duration::from_secs(2),
            probe_min: Duration::from_millis(5),
            probe_max: Duration::from_millis(500),
            toolstack: 0,
        }
    }
}

const TOKEN_LISTEN: u64 = 1;
const TOKEN_WATCH: u64 = 2;
const TOKEN_STOP: u64 = 3;

/// What one connection opened.
#[derive(Default)]
struct Owned {
    endpoints: BTreeSet<u8>,
    regions: BTreeSet<(u8, u8)>,
}

/// One connected application.
struct Client {
    id: u64,
    writer: Mutex<UnixStream>,
    owned: Mutex<Owned>,
}

/// How long a write to an application may wait for room in its socket. An application
/// that reads nothing for that long while its socket is full (one stopped in a debugger,
/// flooded with notices) loses its connection, as if it had closed it: the daemon's loop
/// and its other applications, whom a notice reaches in turn, wait no longer than this.
const CLIENT_WRITE_LIMIT: Duration = Duration::from_secs(5);

impl Client {
    /// Sends `msg`; an application that took none of it within the socket's write
    /// limit is disconnected (a write cut short would leave its stream mid-message).
    fn send(&self, msg: &FrontdMessage) -> io::Result<()> {
        let (body, fds) = msg.emit();
        let writer = lock(&self.writer);
        let sent = send_message(&writer, &body, &fds);
        if let Err(e) = &sent {
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                tracing::warn!(
                    client = self.id,
                    "an application took nothing from its socket for {CLIENT_WRITE_LIMIT:?}; disconnecting it"
                );
                let _ = writer.shutdown(std::net::Shutdown::Both);
            }
        }
        sent
    }
}

/// State shared by the main thread and the client threads.
struct FrontdShared {
    frontend: Mutex<Frontend>,
    /// Domain of the toolstack that brokers direct channels.
    toolstack: u16,
    clients: Mutex<BTreeMap<u64, Arc<Client>>>,
    /// Signalled when a client leaves (for the drain at stop).
    left: Condvar,
    /// When applications were last told the guest is short of grants.
    grants_short_told: Mutex<Option<Instant>>,
}

/// The shortest time between two [`Notice::GrantsShort`]: a receive waiting for room asks
/// again every few milliseconds, and an application that does not read its socket (one
/// stopped in a debugger) must not fill it with notices, which would block the daemon's
/// writes to it. A window given back after one notice serves the next try; one that goes
/// unused later waits at most this long for the next notice.
const GRANTS_SHORT_EVERY: Duration = Duration::from_millis(50);

impl FrontdShared {
    /// The client owning `endpoint`, if any.
    fn owner(&self, endpoint: u8) -> Option<Arc<Client>> {
        lock(&self.clients)
            .values()
            .find(|c| lock(&c.owned).endpoints.contains(&endpoint))
            .cloned()
    }

    /// Tells every application the guest is short of grants, unless it was told less
    /// than [`GRANTS_SHORT_EVERY`] ago.
    fn grants_short(&self) {
        let now = Instant::now();
        {
            let mut told = lock(&self.grants_short_told);
            if told.is_some_and(|t| now.duration_since(t) < GRANTS_SHORT_EVERY) {
                return;
            }
            *told = Some(now);
        }
        self.broadcast(Notice::GrantsShort);
    }

    fn broadcast(&self, notice: Notice) {
        let msg = FrontdMessage::Notice(notice);
        // Not under the clients' lock: a slow application holds up only the notice.
        let clients: Vec<Arc<Client>> = lock(&self.clients).values().cloned().collect();
        for c in &clients {
            if let Err(e) = c.send(&msg) {
                tracing::debug!(client = c.id, error = %e, "notice not delivered");
            }
        }
    }

    /// Hand frontend events to the applications concerned.
    fn dispatch(&self, fe: &mut Frontend) {
        for ev in fe.take_events() {
            match ev {
                FrontendEvent::Disconnected | FrontendEvent::Suspended => {
                    self.broadcast(Notice::Disconnected)
                }
                FrontendEvent::Connected => self.broadcast(Notice::Connected),
                FrontendEvent::EndpointLost { endpoint, reason } => {
                    if let Some(c) = self.owner(endpoint) {
                        let mut owned = lock(&c.owned);
                        owned.endpoints.remove(&endpoint);
                        owned.regions.retain(|(e, _)| *e != endpoint);
                        drop(owned);
                        let _ = c.send(&FrontdMessage::Notice(Notice::EndpointLost {
                            endpoint,
                            reason,
                        }));
                    }
                    // The application will unmap what it has when it reads the notice or
                    // exits; the retired pages stay until then.
                }
                FrontendEvent::Resumed | FrontendEvent::EndpointReopened { .. } => {}
            }
        }
        for h in fe.take_reopened() {
            let endpoint = h.endpoint;
            match self.owner(endpoint) {
                Some(c) => {
                    // Regions not registered again died with the old share; those that
                    // were are still the application's (its windows go on over them).
                    if !h.regions_kept {
                        lock(&c.owned).regions.retain(|(e, _)| *e != endpoint);
                    }
                    if let Err(e) = c.send(&FrontdMessage::Notice(Notice::EndpointReopened(h))) {
                        tracing::warn!(client = c.id, endpoint, error = %e, "re-opened endpoint not delivered");
                    }
                }
                None => {
                    // Its application left while the device was down.
                    drop(h);
                    let _ = fe.close_endpoint(endpoint);
                    fe.release_all_retired(endpoint);
                }
            }
        }
    }
}

/// A running `xmx-frontd` service; see the module documentation.
pub struct Server {
    cfg: ServerConfig,
    shared: Arc<FrontdShared>,
    listener: UnixListener,
    threads: Vec<JoinHandle<()>>,
    next_client: u64,
}

/// Bind `path`, replacing a stale socket (one nobody answers on). The socket listens
/// before it appears at `path` (it is bound under a temporary name and renamed), so
/// whoever waits for the file can connect at once.
fn bind(path: &Path) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir)?;
        }
    }
    if path.exists() && UnixStream::connect(path).is_ok() {
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("another xmx-frontd serves {}", path.display()),
        ));
    }
    let file = path
        .file_name()
        .ok_or_else(|| io::Error::other("socket path has no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp)?;
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(listener)
}

impl Server {
    /// Serve `frontend` on `cfg.socket`.
    pub fn new(frontend: Frontend, cfg: ServerConfig) -> io::Result<Server> {
        let listener = bind(&cfg.socket)?;
        listener.set_nonblocking(true)?;
        tracing::info!(socket = %cfg.socket.display(), "listening for applications");
        let toolstack = cfg.toolstack;
        Ok(Server {
            cfg,
            shared: Arc::new(FrontdShared {
                frontend: Mutex::new(frontend),
                toolstack,
                clients: Mutex::new(BTreeMap::new()),
                left: Condvar::new(),
                grants_short_told: Mutex::new(None),
            }),
            listener,
            threads: Vec::new(),
            next_client: 1,
        })
    }

    /// Where the service listens.
    pub fn socket(&self) -> &Path {
        &self.cfg.socket
    }

    /// Serve until `stop` polls readable, then stop as the module documentation says.
    pub fn run(mut self, stop: BorrowedFd<'_>) -> Result<(), Error> {
        let result = self.serve(stop);
        self.stop();
        result
    }

    fn serve(&mut self, stop: BorrowedFd<'_>) -> Result<(), Error> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(io_err)?;
        let mut watch_fd = lock(&self.shared.frontend).watch_fd();
        // SAFETY: the watch descriptor belongs to the frontend's xenstore connection,
        // which lives (inside `shared`) until the frontend follows its domain to another
        // host, when it is taken out of the set (below) before being dropped.
        let watch = unsafe { BorrowedFd::borrow_raw(watch_fd) };
        let ev = |t| EpollEvent::new(EpollFlags::EPOLLIN, t);
        epoll
            .add(self.listener.as_fd(), ev(TOKEN_LISTEN))
            .map_err(io_err)?;
        epoll.add(watch, ev(TOKEN_WATCH)).map_err(io_err)?;
        epoll.add(stop, ev(TOKEN_STOP)).map_err(io_err)?;
        {
            let mut fe = lock(&self.shared.frontend);
            if let Err(e) = fe.advance() {
                tracing::warn!(error = %e, "xenbus");
            }
            self.shared.dispatch(&mut fe);
        }
        let mut probe = self.cfg.probe_min;
        // Probe without waiting for the next interval (the xenstore connection closed).
        let mut probe_now = false;
        let mut events = [EpollEvent::empty(); 8];
        loop {
            let suspended = lock(&self.shared.frontend).mode() == Mode::Suspended;
            let timeout = if suspended {
                EpollTimeout::try_from(probe).unwrap_or(EpollTimeout::MAX)
            } else {
                probe = self.cfg.probe_min;
                EpollTimeout::NONE
            };
            let n = match epoll.wait(&mut events, timeout) {
                Ok(n) => n,
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(io_err(e)),
            };
            for e in &events[..n] {
                match e.data() {
                    TOKEN_STOP => return Ok(()),
                    TOKEN_LISTEN => self.accept(),
                    TOKEN_WATCH => {
                        let mut fe = lock(&self.shared.frontend);
                        if fe.moves_silently() {
                            match follow_move(&mut fe, &epoll, &mut watch_fd)? {
                                Ok(true) => {
                                    tracing::info!("the domain was migrated; taking the device up on this host");
                                    if let Err(e) = fe.resume() {
                                        tracing::warn!(error = %e, "resuming after the move");
                                    }
                                    self.shared.dispatch(&mut fe);
                                    continue;
                                }
                                Ok(false) => {}
                                Err(e) => tracing::warn!(error = %e, "looking for a migration"),
                            }
                        }
                        match fe.pump(Some(Duration::ZERO)) {
                            Ok(_) => {}
                            Err(e @ Error::Platform(xmx_hv::Error::Closed(_))) => {
                                if fe.mode() != Mode::Suspended {
                                    tracing::error!(error = %e, "xenstore is gone");
                                    return Err(e);
                                }
                                // A suspended domain's xenstore goes when the domain
                                // moves to another host: the probe below finds out at
                                // once (the domain is running there by then).
                                epoll.delete(watch_borrow(watch_fd)).map_err(io_err)?;
                                watch_fd = -1;
                                probe_now = true;
                            }
                            Err(e) => tracing::warn!(error = %e, "xenbus"),
                        }
                        self.shared.dispatch(&mut fe);
                        if fe.mode() == Mode::Stopped {
                            tracing::info!("the device is gone; stopping");
                            return Ok(());
                        }
                    }
                    _ => {}
                }
            }
            if (n == 0 || std::mem::take(&mut probe_now)) && suspended {
                let mut fe = lock(&self.shared.frontend);
                // The simulator stops serving a domain that moved; real Xen serves it on
                // its new host as if nothing happened, and the domid tells.
                if fe.moves_silently() || !fe.probe_running() {
                    match follow_move(&mut fe, &epoll, &mut watch_fd)? {
                        Ok(_) => {}
                        // Real Xen: a look that failed (xenstore busy) is tried again at
                        // the next probe.
                        Err(e) if fe.moves_silently() => {
                            tracing::warn!(error = %e, "looking for a migration")
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "following the domain to its new host");
                            return Err(e);
                        }
                    }
                }
                if fe.probe_running() {
                    tracing::info!("the domain runs again");
                    if let Err(e) = fe.resume() {
                        tracing::warn!(error = %e, "resuming");
                    }
                    self.shared.dispatch(&mut fe);
                } else {
                    probe = (probe * 2).min(self.cfg.probe_max);
                }
            }
        }
    }

    fn accept(&mut self) {
        loop {
            let sock = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "accept");
                    return;
                }
            };
            self.threads.retain(|t| !t.is_finished());
            if lock(&self.shared.clients).len() >= self.cfg.max_clients {
                tracing::warn!("too many applications; refusing one");
                continue;
            }
            if let Err(e) = self.start_client(sock) {
                tracing::warn!(error = %e, "serving an application");
            }
        }
    }

    fn start_client(&mut self, sock: UnixStream) -> io::Result<()> {
        sock.set_nonblocking(false)?;
        sock.set_write_timeout(Some(CLIENT_WRITE_LIMIT))?;
        let id = self.next_client;
        self.next_client += 1;
        let client = Arc::new(Client {
            id,
            writer: Mutex::new(sock.try_clone()?),
            owned: Mutex::new(Owned::default()),
        });
        lock(&self.shared.clients).insert(id, client.clone());
        let shared = self.shared.clone();
        let t = std::thread::Builder::new()
            .name(format!("frontd-client-{id}"))
            .spawn(move || serve_client(&shared, &client, sock));
        match t {
            Ok(t) => {
                self.threads.push(t);
                tracing::debug!(client = id, "application connected");
                Ok(())
            }
            Err(e) => {
                lock(&self.shared.clients).remove(&id);
                Err(e)
            }
        }
    }

    fn stop(&mut self) {
        tracing::info!("stopping");
        self.shared.broadcast(Notice::Shutdown);
        let deadline = Instant::now() + self.cfg.drain;
        let mut clients = lock(&self.shared.clients);
        while !clients.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(
                    applications = clients.len(),
                    "applications still connected; closing them"
                );
                break;
            }
            clients = self
                .shared
                .left
                .wait_timeout(clients, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        for c in clients.values() {
            let _ = lock(&c.writer).shutdown(std::net::Shutdown::Both);
        }
        drop(clients);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let mut fe = lock(&self.shared.frontend);
        if let Err(e) = fe.shutdown() {
            tracing::warn!(error = %e, "closing the device");
        }
        let _ = std::fs::remove_file(&self.cfg.socket);
    }
}

/// The frontend's watch descriptor, borrowed for the epoll set.
/// [`Frontend::follow_move`] with the frontend's watch descriptor kept in `epoll`'s set:
/// out of the set first (following replaces and closes it), the current one back in
/// after. The outer error is epoll's; the inner, the frontend's.
fn follow_move(
    fe: &mut Frontend,
    epoll: &Epoll,
    watch_fd: &mut std::os::fd::RawFd,
) -> Result<Result<bool, Error>, Error> {
    if *watch_fd >= 0 {
        epoll.delete(watch_borrow(*watch_fd)).map_err(io_err)?;
    }
    let moved = fe.follow_move();
    if matches!(moved, Ok(true)) {
        *watch_fd = fe.watch_fd();
    }
    if *watch_fd >= 0 {
        let ev = EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_WATCH);
        epoll.add(watch_borrow(*watch_fd), ev).map_err(io_err)?;
    }
    Ok(moved)
}

fn watch_borrow(fd: std::os::fd::RawFd) -> BorrowedFd<'static> {
    // SAFETY: `fd` is the watch descriptor of the frontend's current xenstore
    // connection, which `Server::serve` keeps in its epoll set only while it lives; the
    // borrow is used for one epoll call at once.
    unsafe { BorrowedFd::borrow_raw(fd) }
}

fn io_err(e: Errno) -> Error {
    Error::Io(e.into())
}

/// Serve one application until it disconnects, then release what it opened.
fn serve_client(shared: &FrontdShared, client: &Client, sock: UnixStream) {
    loop {
        let (body, fds) = match recv_message(&sock, MAX_MESSAGE) {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(client = client.id, error = %e, "application connection");
                break;
            }
        };
        let (seq, request) = match FrontdMessage::parse(&body, fds) {
            Ok(FrontdMessage::Request { seq, request }) => (seq, request),
            Ok(_) | Err(_) => {
                tracing::warn!(
                    client = client.id,
                    "malformed request; dropping the application"
                );
                break;
            }
        };
        let reply = handle(shared, client, request).unwrap_or_else(|e| {
            tracing::debug!(client = client.id, error = %e, "request failed");
            FrontdReply::Error(ErrorReply::from_error(&e))
        });
        if let Err(e) = client.send(&FrontdMessage::Reply { seq, reply }) {
            tracing::debug!(client = client.id, error = %e, "reply not delivered");
            break;
        }
    }
    release_client(shared, client);
}

fn handle(
    shared: &FrontdShared,
    client: &Client,
    request: FrontdRequest,
) -> Result<FrontdReply, Error> {
    let mut fe = lock(&shared.frontend);
    let owns = |endpoint: u8| lock(&client.owned).endpoints.contains(&endpoint);
    let not_yours = |endpoint: u8| Error::Invalid(format!("endpoint {endpoint} is not yours"));
    match request {
        FrontdRequest::Info => {
            let info = fe
                .backend_info()
                .cloned()
                .ok_or_else(|| Error::NotConnected("the device is not connected".into()))?;
            Ok(FrontdReply::Info(FrontdBoardInfo {
                connected: fe.is_connected(),
                domid: fe.domid(),
                mac: info.mac,
                cluster: info.cluster,
                hostname: info.hostname,
                max_endpoints: info.max_endpoints,
                max_regions: info.max_regions,
                local_delivery: info.local_delivery,
            }))
        }
        FrontdRequest::OpenEndpoint {
            endpoint,
            geometry,
            quiet_send_done,
        } => {
            let h = fe.open_endpoint_with(endpoint, geometry, quiet_send_done)?;
            lock(&client.owned).endpoints.insert(h.endpoint);
            Ok(FrontdReply::Endpoint(h))
        }
        FrontdRequest::CloseEndpoint { endpoint } => {
            if !owns(endpoint) {
                return Err(not_yours(endpoint));
            }
            {
                let mut owned = lock(&client.owned);
                owned.endpoints.remove(&endpoint);
                owned.regions.retain(|(e, _)| *e != endpoint);
            }
            fe.release_all_retired(endpoint);
            fe.close_endpoint(endpoint)?;
            Ok(FrontdReply::Ok)
        }
        FrontdRequest::RegisterRegion { endpoint, length } => {
            if !owns(endpoint) {
                return Err(not_yours(endpoint));
            }
            let h = match fe.register_region(endpoint, length) {
                Ok(h) => h,
                Err(e) => {
                    drop(fe);
                    if matches!(e, Error::Platform(_)) {
                        // The guest's grants ran out (the platform refused to grant the
                        // window's pages): every application, the asking one included
                        // (its other endpoints), gives back the windows its caches keep
                        // unused. The registration that failed is tried again by its
                        // library (a receive waits for room, a send retries).
                        tracing::debug!(client = client.id, %e, "grants short; asking for unused windows");
                        shared.grants_short();
                    }
                    return Err(e);
                }
            };
            lock(&client.owned).regions.insert((endpoint, h.region_id));
            Ok(FrontdReply::Region(h))
        }
        FrontdRequest::DeregisterRegion {
            endpoint,
            region_id,
        } => {
            if !lock(&client.owned).regions.remove(&(endpoint, region_id)) {
                return Err(Error::Invalid(format!(
                    "region {region_id} of endpoint {endpoint} is not yours"
                )));
            }
            fe.deregister_region(endpoint, region_id)?;
            Ok(FrontdReply::Ok)
        }
        FrontdRequest::RegionPages {
            endpoint,
            region_id,
        } => {
            if !lock(&client.owned).regions.contains(&(endpoint, region_id)) {
                return Err(Error::Invalid(format!(
                    "region {region_id} of endpoint {endpoint} is not yours"
                )));
            }
            Ok(FrontdReply::Region(fe.export_region(endpoint, region_id)?))
        }
        FrontdRequest::Remapped {
            endpoint,
            generation,
        } => {
            if !owns(endpoint) {
                return Err(not_yours(endpoint));
            }
            fe.release_retired(endpoint, generation);
            Ok(FrontdReply::Ok)
        }
    }
}

/// The application is gone: close what it opened, in the backend first.
fn release_client(shared: &FrontdShared, client: &Client) {
    let owned = std::mem::take(&mut *lock(&client.owned));
    {
        let mut fe = lock(&shared.frontend);
        for (endpoint, region_id) in &owned.regions {
            if let Err(e) = fe.deregister_region(*endpoint, *region_id) {
                tracing::debug!(endpoint, region_id, error = %e, "deregistering a region");
            }
        }
        for endpoint in &owned.endpoints {
            if let Err(e) = fe.close_endpoint(*endpoint) {
                tracing::debug!(endpoint, error = %e, "closing an endpoint");
            }
            fe.release_all_retired(*endpoint);
            fe.end_direct_channels(shared.toolstack, *endpoint);
        }
    }
    if !owned.endpoints.is_empty() {
        tracing::info!(
            client = client.id,
            endpoints = owned.endpoints.len(),
            "application gone; its endpoints are closed"
        );
    }
    lock(&shared.clients).remove(&client.id);
    shared.left.notify_all();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// An application that reads nothing while notices pile up is disconnected once its
    /// socket stays full past the write limit; the write returns, it does not hang.
    #[test]
    fn an_application_that_reads_nothing_is_disconnected_once_its_socket_stays_full() {
        let (daemon_end, mut app_end) = UnixStream::pair().expect("socketpair");
        daemon_end
            .set_write_timeout(Some(Duration::from_millis(20)))
            .expect("write limit");
        let client = Client {
            id: 7,
            writer: Mutex::new(daemon_end),
            owned: Mutex::new(Owned::default()),
        };
        let notice = FrontdMessage::Notice(Notice::GrantsShort);
        let mut sent = 0u32;
        let err = loop {
            match client.send(&notice) {
                Ok(()) => sent += 1,
                Err(e) => break e,
            }
            assert!(sent < 10_000_000, "the socket never filled");
        };
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
            "{err}"
        );
        assert!(sent > 0, "notices went out before the socket filled");
        // The application reads what was sent, then the end of the stream: it was cut off
        // between messages, not in the middle of one.
        let mut got = Vec::new();
        app_end.read_to_end(&mut got).expect("reading the notices");
        let (body, _) = notice.emit();
        let one = 4 + body.len();
        assert_eq!(
            got.len() % one,
            0,
            "whole messages only: {} bytes",
            got.len()
        );
        assert_eq!(got.len() / one, sent as usize);
        assert!(
            client.send(&notice).is_err(),
            "a disconnected application gets nothing more"
        );
    }
}

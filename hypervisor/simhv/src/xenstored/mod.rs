//! A xenstored speaking Xen's wire protocol, one unix socket per domain.
//!
//! Every connection accepted on a domain's socket acts as that domain, so permissions
//! are enforced as Xen's xenstored enforces them for ring-connected guests: dom0 may do
//! anything; another domain sees and changes only what its permission entries allow,
//! and names relative to its home `/local/domain/<domid>`.
//!
//! Structure:
//! - `store`: nodes by name, generation counters, transactions (staged changes
//!   validated against the generations they saw; a conflict is EAGAIN at commit).
//! - `ops`: the operations (read, write, mkdir, rm, directory, permissions) on the
//!   database or inside a transaction, with xenstored's permission and errno rules.
//! - `watch`: watches, events and who may see them.
//! - `dispatch`: request decoding with [`xmx_hv::xs::wire`], replies, event ordering.
//! - `conn`: per-connection output queue and writer thread; outstanding-reply
//!   accounting.
//! - `state`: everything behind the one lock (xenstored is single-threaded; one lock
//!   over the tree gives the same atomicity), introduce and release.
//!
//! Each connection has a reader thread (reads, runs requests under the lock, queues
//! output) and a writer thread (drains the queue), so a client that never reads stalls
//! only itself.
//!
//! Deviations from Xen's xenstored, kept on purpose: requests of unknown or
//! unsupported types (CONTROL, SET_TARGET, features, quota control) get ENOSYS as
//! xenstored answers unknown types; RESUME is accepted for introduced domains and does
//! nothing else; INTRODUCE also creates the domain's home if the toolstack has not.

mod conn;
mod dispatch;
mod ops;
mod path;
mod perms;
mod state;
mod store;
mod watch;

use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use serde::{Deserialize, Serialize};
use xmx_hv::xs::wire::{self, ReadError, XsErrno};
use xmx_hv::{DomId, XsPerm};

use conn::{ConnIo, Outstanding};
use state::{ConnEntry, ListenerEntry, XenstoredState};
use watch::NodeChange;
use xmx_hv::lock;

/// Per-domain limits for unprivileged domains (dom0 is unlimited). The defaults are
/// Xen xenstored's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct XenstoreQuotas {
    /// Nodes a domain may own (ENOSPC beyond).
    pub nodes: usize,
    /// Watches a domain may have registered (ENOSPC beyond).
    pub watches: usize,
    /// Transactions a domain may have open at once (ENOSPC beyond).
    pub transactions: usize,
    /// Largest value a domain may write, in bytes (ENOSPC beyond).
    pub value_size: usize,
    /// Replies a domain may leave unread before its further requests wait.
    pub outstanding: usize,
}

impl Default for XenstoreQuotas {
    fn default() -> XenstoreQuotas {
        XenstoreQuotas {
            nodes: 1000,
            watches: 128,
            transactions: 10,
            value_size: 2048,
            outstanding: 20,
        }
    }
}

/// What one domain currently holds in the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct XenstoredDomainUsage {
    /// Nodes it owns.
    pub nodes: usize,
    /// Watches registered.
    pub watches: usize,
    /// Open transactions.
    pub transactions: usize,
    /// Live connections.
    pub connections: usize,
    /// Replies queued to it and not yet written.
    pub outstanding: usize,
}

/// The simulated xenstored; see the module documentation.
pub struct Xenstored {
    quotas: XenstoreQuotas,
    state: Mutex<XenstoredState>,
    outstanding: Outstanding,
    next_conn: AtomicU64,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Xenstored {
    /// A daemon with the initial tree and dom0 introduced.
    pub fn new(quotas: XenstoreQuotas) -> Arc<Xenstored> {
        Arc::new(Xenstored {
            quotas,
            state: Mutex::new(XenstoredState::new()),
            outstanding: Outstanding::default(),
            next_conn: AtomicU64::new(1),
            threads: Mutex::new(Vec::new()),
        })
    }

    /// The limits this daemon enforces.
    pub fn quotas(&self) -> XenstoreQuotas {
        self.quotas
    }

    /// Serve every connection accepted on `listener` as domain `domid`, until
    /// [`Xenstored::shutdown`] or [`Xenstored::release_domain`] of `domid`. The
    /// returned thread ends then.
    pub fn serve(
        self: &Arc<Self>,
        domid: DomId,
        listener: UnixListener,
    ) -> std::io::Result<JoinHandle<()>> {
        listener.set_nonblocking(true)?;
        let stop = Arc::new(
            EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC)
                .map_err(std::io::Error::from)?,
        );
        {
            let mut st = lock(&self.state);
            if st.shut_down {
                return Err(std::io::Error::other("xenstored is shut down"));
            }
            st.listeners.push(ListenerEntry {
                domid,
                stop: Arc::clone(&stop),
            });
        }
        let me = Arc::clone(self);
        std::thread::Builder::new()
            .name(format!("xenstored-accept-{domid}"))
            .spawn(move || me.accept_loop(domid, listener, stop))
    }

    fn accept_loop(self: Arc<Self>, domid: DomId, listener: UnixListener, stop: Arc<EventFd>) {
        loop {
            let mut fds = [
                PollFd::new(listener.as_fd(), PollFlags::POLLIN),
                PollFd::new(stop.as_fd(), PollFlags::POLLIN),
            ];
            match nix::poll::poll(&mut fds, PollTimeout::NONE) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => {
                    tracing::error!(domid, error = %e, "poll on xenstore listener failed");
                    return;
                }
            }
            if fds[1].any().unwrap_or(false) {
                tracing::debug!(domid, "xenstore listener stopped");
                return;
            }
            match listener.accept() {
                Ok((stream, _)) => {
                    if let Err(e) = self.attach(domid, stream, Some(&stop)) {
                        tracing::warn!(domid, error = %e, "could not serve a xenstore connection");
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::Interrupted
                            | std::io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => {
                    tracing::error!(domid, error = %e, "accept on xenstore listener failed");
                    return;
                }
            }
        }
    }

    /// Serve an already connected stream as domain `domid` (e.g. one end of a
    /// socketpair handed to a process).
    pub fn connect(self: &Arc<Self>, domid: DomId, stream: UnixStream) -> std::io::Result<()> {
        self.attach(domid, stream, None)
    }

    /// Register and start serving a connection; one accepted by a listener that was
    /// stopped meanwhile (its domain released) is refused.
    fn attach(
        self: &Arc<Self>,
        domid: DomId,
        stream: UnixStream,
        listener: Option<&Arc<EventFd>>,
    ) -> std::io::Result<()> {
        stream.set_nonblocking(false)?;
        let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let io = Arc::new(ConnIo::new(id, domid, stream.try_clone()?));
        {
            let mut st = lock(&self.state);
            if st.shut_down {
                return Err(std::io::Error::other("xenstored is shut down"));
            }
            if let Some(stop) = listener {
                if !st.listeners.iter().any(|l| Arc::ptr_eq(&l.stop, stop)) {
                    return Err(std::io::Error::other("listener stopped"));
                }
            }
            st.conns.insert(id, ConnEntry::new(Arc::clone(&io)));
        }
        tracing::debug!(conn = id, domid, "xenstore connection");
        let writer = {
            let me = Arc::clone(self);
            let io = Arc::clone(&io);
            std::thread::Builder::new()
                .name(format!("xenstored-tx-{domid}"))
                .spawn(move || io.run_writer(&me.outstanding))
        };
        let writer = match writer {
            Ok(h) => h,
            Err(e) => {
                self.drop_connection(&io, false);
                return Err(e);
            }
        };
        let reader = {
            let me = Arc::clone(self);
            let io = Arc::clone(&io);
            std::thread::Builder::new()
                .name(format!("xenstored-rx-{domid}"))
                .spawn(move || me.run_reader(&io, stream))
        };
        let reader = match reader {
            Ok(h) => h,
            Err(e) => {
                self.drop_connection(&io, false);
                return Err(e);
            }
        };
        let mut threads = lock(&self.threads);
        threads.retain(|h| !h.is_finished());
        threads.push(writer);
        threads.push(reader);
        Ok(())
    }

    fn run_reader(&self, io: &ConnIo, mut stream: UnixStream) {
        let limit = self.quotas.outstanding.max(1);
        let graceful = loop {
            if !self.outstanding.wait_below(io, limit) {
                break false;
            }
            match wire::read_frame(&mut stream) {
                Ok(Some(frame)) => {
                    let mut st = lock(&self.state);
                    dispatch::process(&mut st, &self.quotas, &self.outstanding, io.id, frame);
                }
                Ok(None) => break true,
                Err(ReadError::Wire(e)) => {
                    tracing::warn!(conn = io.id, domid = io.domid, error = %e, "dropping client: bad message header");
                    break false;
                }
                Err(ReadError::Truncated { needed, have }) => {
                    tracing::debug!(
                        conn = io.id,
                        domid = io.domid,
                        needed,
                        have,
                        "client left mid-message"
                    );
                    break false;
                }
                Err(ReadError::Io(e)) => {
                    tracing::debug!(conn = io.id, domid = io.domid, error = %e, "client read failed");
                    break false;
                }
            }
        };
        self.drop_connection(io, graceful);
    }

    /// Forget a connection's watches and transactions; flush its output if it left
    /// cleanly, else discard it.
    fn drop_connection(&self, io: &ConnIo, graceful: bool) {
        lock(&self.state).conns.remove(&io.id);
        if graceful {
            io.finish();
        } else {
            io.close(&self.outstanding);
        }
        tracing::debug!(conn = io.id, domid = io.domid, "xenstore connection closed");
    }

    /// A domain came to life: /local/domain/<domid> exists, owned by it and private to
    /// it (unless the toolstack made it already); fires @introduceDomain.
    pub fn introduce_domain(&self, domid: DomId) {
        lock(&self.state).introduce(domid);
    }

    /// A domain died: its connections, watches and transactions are dropped, its
    /// listeners stop, its home and every node it owns are removed (watches on them
    /// fire), entries naming it leave other nodes' permissions; fires @releaseDomain.
    pub fn release_domain(&self, domid: DomId) {
        lock(&self.state).release(domid, &self.outstanding);
    }

    /// Whether `domid` is introduced (dom0 always is).
    pub fn is_introduced(&self, domid: DomId) -> bool {
        lock(&self.state).introduced.contains(&domid)
    }

    /// What `domid` currently holds.
    pub fn usage(&self, domid: DomId) -> XenstoredDomainUsage {
        let st = lock(&self.state);
        XenstoredDomainUsage {
            nodes: store::Tree::owned(&st.store, domid),
            watches: st.watches_of(domid),
            transactions: st.transactions_of(domid),
            connections: st.conns.values().filter(|c| c.domid() == domid).count(),
            outstanding: self.outstanding.of(domid),
        }
    }

    /// Stop accepting, close every connection and wait for their threads.
    pub fn shutdown(&self) {
        let ios: Vec<Arc<ConnIo>> = {
            let mut st = lock(&self.state);
            st.shut_down = true;
            for l in st.listeners.drain(..) {
                let _ = l.stop.write(1);
            }
            st.conns.drain().map(|(_, c)| c.io).collect()
        };
        for io in &ios {
            io.close(&self.outstanding);
        }
        let threads = std::mem::take(&mut *lock(&self.threads));
        let me = std::thread::current().id();
        for h in threads {
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
        tracing::info!(connections = ios.len(), "xenstored shut down");
    }

    /// Run a database operation as `caller` outside any connection (the daemon's own
    /// toolstack writes) and fire its events.
    fn local<R>(
        &self,
        op: impl FnOnce(&mut store::Store, ops::Limits) -> Result<(R, Vec<NodeChange>), XsErrno>,
    ) -> Result<R, XsErrno> {
        let mut st = lock(&self.state);
        let limits = ops::Limits {
            nodes: self.quotas.nodes,
            value_size: self.quotas.value_size,
        };
        let (r, events) = op(&mut st.store, limits)?;
        st.fire(&events);
        Ok(r)
    }

    /// READ as `caller`.
    pub fn read(&self, caller: DomId, name: &str) -> Result<Vec<u8>, XsErrno> {
        let name = path::canonicalize(caller, name, false)?;
        self.local(|s, _| Ok((ops::read(s, caller, &name.path)?, Vec::new())))
    }

    /// WRITE as `caller`, firing watches.
    pub fn write(&self, caller: DomId, name: &str, value: &[u8]) -> Result<(), XsErrno> {
        if value.len() + name.len() + 1 > wire::PAYLOAD_MAX {
            return Err(XsErrno::E2big);
        }
        let name = path::canonicalize(caller, name, false)?;
        self.local(|s, l| Ok(((), ops::write(s, caller, &l, &name.path, value)?)))
    }

    /// MKDIR as `caller`, firing watches.
    pub fn mkdir(&self, caller: DomId, name: &str) -> Result<(), XsErrno> {
        let name = path::canonicalize(caller, name, false)?;
        self.local(|s, l| Ok(((), ops::mkdir(s, caller, &l, &name.path)?)))
    }

    /// RM as `caller`, firing watches.
    pub fn rm(&self, caller: DomId, name: &str) -> Result<(), XsErrno> {
        let name = path::canonicalize(caller, name, false)?;
        self.local(|s, _| Ok(((), ops::rm(s, caller, &name.path)?)))
    }

    /// DIRECTORY as `caller`.
    pub fn directory(&self, caller: DomId, name: &str) -> Result<Vec<String>, XsErrno> {
        let name = path::canonicalize(caller, name, false)?;
        self.local(|s, _| Ok((ops::directory(s, caller, &name.path)?, Vec::new())))
    }

    /// GET_PERMS as `caller`.
    pub fn get_perms(&self, caller: DomId, name: &str) -> Result<Vec<XsPerm>, XsErrno> {
        let name = path::canonicalize(caller, name, true)?;
        self.local(|s, _| Ok((ops::get_perms(s, caller, &name.path)?, Vec::new())))
    }

    /// SET_PERMS as `caller`, firing watches.
    pub fn set_perms(&self, caller: DomId, name: &str, acl: &[XsPerm]) -> Result<(), XsErrno> {
        let name = path::canonicalize(caller, name, true)?;
        self.local(|s, _| Ok(((), ops::set_perms(s, caller, &name.path, acl)?)))
    }
}

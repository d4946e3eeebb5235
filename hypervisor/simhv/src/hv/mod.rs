//! Grant tables and event channels of every domain of the simulated host.
//!
//! All state sits behind one lock: operations that span two domains (mapping, copying,
//! binding) see both consistently, and these are control-path operations (the data path,
//! event notification and access to mapped pages, never comes here).
//!
//! Ownership follows the Linux devices: a grant belongs to the `hv.sock` connection that
//! made it (gntalloc's fd), a mapping to the connection that mapped it (gntdev's fd), a
//! port to the connection that opened it (evtchn's fd). When a connection closes, its
//! ports close, its mappings are undone and its grants end; grants still mapped by a
//! remote are kept ("deferred") until the last unmap, then freed.
//!
//! Access checks follow Xen's: a mapping or copy of `(granter, ref)` by domain D needs a
//! running granter, `ref` inside the table, an entry of type `GTF_permit_access` naming
//! D, and no `GTF_readonly` for write access. Refusals are [`Error::Denied`] (Linux's
//! gntdev folds them into one errno too); a suspended granter is [`Error::Busy`].
//! Event-channel errors follow Xen's errno: a missing remote domain is `NotFound`
//! (ESRCH), a port that is not unbound for the caller is `Invalid` (EINVAL).

pub(crate) mod mem;
mod migrate;
pub(crate) mod serve;
pub(crate) mod status;
mod stream;
pub(crate) mod table;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use nix::sys::eventfd::{EfdFlags, EventFd};
use xmx_hv::sim::admin::RunState;
use xmx_hv::sim::proto::{
    CopySide, CopySpec, SimRequest, SimResponse, PORT_BOUND, PORT_PEER_CLOSED, PORT_UNBOUND,
    STATUS_SLOTS,
};
use xmx_hv::sim::{layout, proto};
use xmx_hv::{DomId, Error, GrantRef, Port, Result, PAGE_SIZE};

use crate::config::SimhvConfig;
use mem::MemFile;
use status::StatusPageWriter;
use table::{TableFile, GTF_PERMIT_ACCESS, GTF_READING, GTF_READONLY, GTF_TYPE_MASK, GTF_WRITING};

/// Identifies one `hv.sock` connection.
pub(crate) type HvConnId = u64;

/// The hypervisor state of the host.
pub(crate) struct Hv {
    config: SimhvConfig,
    state: Mutex<HvState>,
}

#[derive(Default)]
struct HvState {
    domains: BTreeMap<DomId, HvDomain>,
    conns: HashMap<HvConnId, Conn>,
    next_conn: HvConnId,
    next_handle: u64,
    next_instance: u64,
}

struct HvDomain {
    name: String,
    instance: u64,
    run: RunState,
    mem: MemFile,
    table: TableFile,
    grants: HashMap<GrantRef, Grant>,
    mappings: HashMap<u64, GrantMapping>,
    mapped_pages: usize,
    ports: BTreeMap<Port, PortEntry>,
    /// Set while the domain is sent to another host (see [`migrate`]).
    outgoing: Option<migrate::OutgoingMigration>,
    /// Set while the domain receives a migration stream, until its last one.
    incoming: Option<migrate::Incoming>,
}

struct Grant {
    frame: u32,
    readonly: bool,
    owner: Owner,
    maps: u32,
    maps_rw: u32,
}

/// Who holds a grant, that is, who may end it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// The `hv.sock` connection that made it.
    Conn(HvConnId),
    /// Nobody: its owner let go while a remote still mapped it; freed at the last unmap.
    Released,
    /// The domain itself: restored by a migration, its maker's connection is on the
    /// source host. It lasts as long as the domain.
    Restored,
}

struct GrantMapping {
    conn: HvConnId,
    remote: DomId,
    remote_instance: u64,
    refs: Vec<GrantRef>,
    writable: bool,
}

struct PortEntry {
    conn: HvConnId,
    slot: u32,
    generation: u32,
    rx: OwnedFd,
    tx: OwnedFd,
    binding: Binding,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Binding {
    Unbound { remote: DomId },
    Interdomain { remote: DomId, remote_port: Port },
}

struct Conn {
    domid: DomId,
    instance: u64,
    stream: UnixStream,
    status: Option<StatusPageWriter>,
    /// Remote memory descriptors already sent: (instance, writable).
    sent_mem: HashSet<(u64, bool)>,
}

/// Per-domain counters (see [`xmx_hv::sim::admin::DomainState`]).
#[derive(Debug, Clone)]
pub(crate) struct Counters {
    pub name: String,
    pub run: RunState,
    pub instance: u64,
    pub grants_active: usize,
    pub grants_deferred: usize,
    pub grants_mapped_by_others: usize,
    pub mappings_held: usize,
    pub ports_open: usize,
    pub hv_connections: usize,
    pub mem_pages: usize,
    pub mem_limit: u64,
}

impl Hv {
    /// An empty host.
    pub(crate) fn new(config: SimhvConfig) -> Hv {
        Hv {
            config,
            state: Mutex::new(HvState {
                next_instance: 1,
                next_handle: 1,
                next_conn: 1,
                ..Default::default()
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HvState> {
        // A panic elsewhere must not take every domain down with it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Create the memory and grant-table files of `domid` in its (existing) directory,
    /// with a memory limit of `mem_limit` bytes (the host's default if none); an
    /// `incoming` domain is created suspended to receive a migration stream.
    pub(crate) fn add_domain(
        &self,
        dir: &Path,
        domid: DomId,
        name: &str,
        mem_limit: Option<u64>,
        incoming: bool,
    ) -> Result<u64> {
        let mut st = self.lock();
        if st.domains.contains_key(&domid) {
            return Err(Error::Exists(format!("domain {domid}")));
        }
        let limit = mem_limit.unwrap_or(self.config.mem_limit);
        let mem = MemFile::create(&layout::mem_file(dir, domid), limit)?;
        let table =
            TableFile::create(&layout::gnttab_file(dir, domid), self.config.gnttab_entries)?;
        let instance = st.next_instance;
        st.next_instance += 1;
        st.domains.insert(
            domid,
            HvDomain {
                name: name.to_string(),
                instance,
                run: if incoming {
                    RunState::Suspended
                } else {
                    RunState::Running
                },
                mem,
                table,
                grants: HashMap::new(),
                mappings: HashMap::new(),
                mapped_pages: 0,
                ports: BTreeMap::new(),
                outgoing: None,
                incoming: incoming.then(migrate::Incoming::default),
            },
        );
        Ok(instance)
    }

    /// Tear a domain down as Xen does when it dies: its ports close (peers see it), its
    /// mappings are undone, its grants end and others' mappings of them are released.
    /// Returns its connections, for the caller to shut down.
    pub(crate) fn remove_domain(&self, domid: DomId) -> Result<Vec<UnixStream>> {
        let mut st = self.lock();
        let streams = st.remove_domain(domid);
        st.flush_frees();
        streams
    }

    /// Every domain: (domid, name, state).
    pub(crate) fn list(&self) -> Vec<(DomId, String, RunState)> {
        let st = self.lock();
        st.domains
            .iter()
            .map(|(d, dom)| (*d, dom.name.clone(), dom.run))
            .collect()
    }

    /// Whether a domain is named `name`.
    pub(crate) fn name_taken(&self, name: &str) -> bool {
        self.lock().domains.values().any(|d| d.name == name)
    }

    /// Rename a domain; names stay unique.
    pub(crate) fn rename(&self, domid: DomId, name: &str) -> Result<()> {
        let mut st = self.lock();
        if st
            .domains
            .iter()
            .any(|(d, dom)| *d != domid && dom.name == name)
        {
            return Err(Error::Exists(format!("a domain is named {name:?}")));
        }
        let dom = st
            .domains
            .get_mut(&domid)
            .ok_or_else(|| Error::NotFound(format!("domain {domid}")))?;
        dom.name = name.to_string();
        Ok(())
    }

    /// Set a domain running or suspended.
    pub(crate) fn set_run(&self, domid: DomId, run: RunState) -> Result<()> {
        let mut st = self.lock();
        let dom = st
            .domains
            .get_mut(&domid)
            .ok_or_else(|| Error::NotFound(format!("domain {domid}")))?;
        if dom.run == run {
            return Err(Error::Invalid(format!(
                "domain {domid} is already {}",
                match run {
                    RunState::Running => "running",
                    RunState::Suspended => "suspended",
                }
            )));
        }
        if run == RunState::Running && dom.incoming.is_some() {
            return Err(Error::Invalid(format!(
                "domain {domid} has not received the last round of its migration"
            )));
        }
        dom.run = run;
        Ok(())
    }

    /// The counters of one domain.
    pub(crate) fn counters(&self, domid: DomId) -> Result<Counters> {
        let st = self.lock();
        let dom = st
            .domains
            .get(&domid)
            .ok_or_else(|| Error::NotFound(format!("domain {domid}")))?;
        Ok(Counters {
            name: dom.name.clone(),
            run: dom.run,
            instance: dom.instance,
            grants_active: dom.grants.len(),
            grants_deferred: dom
                .grants
                .values()
                .filter(|g| g.owner == Owner::Released)
                .count(),
            grants_mapped_by_others: dom.grants.values().filter(|g| g.maps > 0).count(),
            mappings_held: dom.mapped_pages,
            ports_open: dom.ports.len(),
            hv_connections: st
                .conns
                .values()
                .filter(|c| c.domid == domid && c.instance == dom.instance)
                .count(),
            mem_pages: dom.mem.in_use(),
            mem_limit: dom.mem.limit_bytes(),
        })
    }

    /// Who may touch a domain's memory: the inode of its memory file, the pids of the
    /// processes connected to its `hv.sock`, and those of the processes connected as
    /// another domain (see [`crate::procs`]).
    pub(crate) fn memory_users(&self, domid: DomId) -> Result<(u64, Vec<i32>, Vec<i32>)> {
        let st = self.lock();
        let dom = st
            .domains
            .get(&domid)
            .ok_or_else(|| Error::NotFound(format!("domain {domid}")))?;
        let inode = dom.mem.inode()?;
        let mut own = Vec::new();
        let mut others = Vec::new();
        for c in st.conns.values() {
            let cred =
                nix::sys::socket::getsockopt(&c.stream, nix::sys::socket::sockopt::PeerCredentials);
            let Ok(cred) = cred else { continue };
            if c.domid == domid && c.instance == dom.instance {
                own.push(cred.pid());
            } else if c.domid != domid {
                others.push(cred.pid());
            }
        }
        Ok((inode, own, others))
    }

    /// Register a new connection of `domid`; `stream` is a clone kept to shut it down.
    pub(crate) fn register_conn(&self, domid: DomId, stream: UnixStream) -> Result<HvConnId> {
        let mut st = self.lock();
        let instance = st
            .domains
            .get(&domid)
            .map(|d| d.instance)
            .ok_or_else(|| Error::NotFound(format!("domain {domid}")))?;
        let id = st.next_conn;
        st.next_conn += 1;
        st.conns.insert(
            id,
            Conn {
                domid,
                instance,
                stream,
                status: None,
                sent_mem: HashSet::new(),
            },
        );
        Ok(id)
    }

    /// A connection ended: release everything it held.
    pub(crate) fn conn_closed(&self, conn: HvConnId) {
        let mut st = self.lock();
        st.conn_closed(conn);
        st.flush_frees();
    }

    /// Serve one request of connection `conn`.
    pub(crate) fn handle(
        &self,
        conn: HvConnId,
        req: SimRequest,
    ) -> Result<(SimResponse, Vec<OwnedFd>)> {
        let mut st = self.lock();
        let domid = st
            .conns
            .get(&conn)
            .map(|c| c.domid)
            .ok_or_else(|| Error::Closed("the domain of this connection is gone".into()))?;
        let cfg = &self.config;
        let result = match req {
            SimRequest::Hello => st.hello(domid, cfg),
            SimRequest::GrantAlloc {
                remote,
                writable,
                count,
            } => st.grant_alloc(cfg, conn, domid, remote, writable, count),
            SimRequest::GrantEnd { defer, refs } => st.grant_end(conn, domid, defer, &refs),
            SimRequest::Map {
                remote,
                writable,
                refs,
            } => st.map(cfg, conn, domid, remote, writable, &refs),
            SimRequest::Unmap { handle } => st.unmap(conn, domid, handle),
            SimRequest::Copy { segments, data } => st.copy(domid, &segments, &data),
            SimRequest::EvtchnOpen => st.evtchn_open(conn),
            SimRequest::EvtchnAllocUnbound { remote } => st.alloc_unbound(cfg, conn, domid, remote),
            SimRequest::EvtchnBind {
                remote,
                remote_port,
            } => st.bind(cfg, conn, domid, remote, remote_port),
            SimRequest::EvtchnClose { port } => st.close(conn, domid, port),
            SimRequest::EvtchnStatus { port } => st.port_status(domid, port),
            SimRequest::GrantAdopt {
                remote,
                writable,
                refs,
            } => st.grant_adopt(conn, domid, remote, writable, &refs),
        };
        st.flush_frees();
        result
    }
}

fn no_fds(r: SimResponse) -> Result<(SimResponse, Vec<OwnedFd>)> {
    Ok((r, Vec::new()))
}

fn suspended(domid: DomId) -> Error {
    Error::Busy(format!("domain {domid} is suspended"))
}

/// The flags an entry shows for its grant's current state.
fn entry_flags(g: &Grant) -> u16 {
    let mut f = GTF_PERMIT_ACCESS;
    if g.readonly {
        f |= GTF_READONLY;
    }
    if g.maps > 0 {
        f |= GTF_READING;
    }
    if g.maps_rw > 0 {
        f |= GTF_WRITING;
    }
    f
}

fn new_eventfd() -> Result<OwnedFd> {
    EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
        .map(OwnedFd::from)
        .map_err(|e| Error::Io(e.into()))
}

fn kick(fd: &OwnedFd) {
    if let Err(e) = nix::unistd::write(fd.as_fd(), &1u64.to_ne_bytes()) {
        if e != nix::errno::Errno::EAGAIN {
            tracing::warn!(error = %e, "signalling an event channel");
        }
    }
}

fn drain(fd: &OwnedFd) {
    let mut b = [0u8; 8];
    let _ = nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(fd), &mut b);
}

impl HvDomain {
    fn free_grant(&mut self, r: GrantRef) {
        if let Some(g) = self.grants.remove(&r) {
            if let Err(e) = self.table.clear(r) {
                tracing::error!(gref = r, error = %e, "clearing a grant entry");
            }
            self.mem.free(g.frame);
            self.table.free_ref(r);
        }
    }

    fn grant_busy(&self, r: GrantRef, g: &Grant) -> bool {
        let flags = self.table.read(r).map(|e| e.flags).unwrap_or(0);
        g.maps > 0 || flags & (GTF_READING | GTF_WRITING) != 0
    }

    /// Xen's checks for access by `caller` to `(self, r)`; returns the frame.
    fn check_access(&self, me: DomId, r: GrantRef, caller: DomId, write: bool) -> Result<u32> {
        let size = self.table.entries();
        if r >= size {
            return Err(Error::Denied(format!(
                "grant ref {r} of domain {me} is out of range (table of {size})"
            )));
        }
        let entry = self.table.read(r)?;
        let not_granted = || {
            Error::Denied(format!(
                "grant ref {r} of domain {me} is not granted to domain {caller}"
            ))
        };
        if entry.flags & GTF_TYPE_MASK != GTF_PERMIT_ACCESS || entry.domid != caller {
            return Err(not_granted());
        }
        if write && entry.flags & GTF_READONLY != 0 {
            return Err(Error::Denied(format!(
                "grant ref {r} of domain {me} is read-only"
            )));
        }
        // The file is only a view: the grant must also be one we made, for that frame.
        match self.grants.get(&r) {
            Some(g) if g.frame == entry.frame && self.mem.contains(entry.frame) => Ok(g.frame),
            _ => Err(not_granted()),
        }
    }
}

impl HvState {
    /// Zero the frames freed by the last operation, in runs (see [`MemFile::flush`]).
    fn flush_frees(&mut self) {
        for dom in self.domains.values_mut() {
            if dom.mem.pending() > 0 {
                dom.mem.flush();
            }
        }
    }

    fn domain(&self, domid: DomId) -> Result<&HvDomain> {
        self.domains
            .get(&domid)
            .ok_or_else(|| Error::Closed(format!("domain {domid} is gone")))
    }

    fn domain_mut(&mut self, domid: DomId) -> Result<&mut HvDomain> {
        self.domains
            .get_mut(&domid)
            .ok_or_else(|| Error::Closed(format!("domain {domid} is gone")))
    }

    fn running_mut(&mut self, domid: DomId) -> Result<&mut HvDomain> {
        let dom = self.domain_mut(domid)?;
        if dom.run != RunState::Running {
            return Err(suspended(domid));
        }
        Ok(dom)
    }

    /// The remote side of a map or copy: must exist and run.
    fn granter(&self, remote: DomId) -> Result<&HvDomain> {
        let dom = self
            .domains
            .get(&remote)
            .ok_or_else(|| Error::Denied(format!("domain {remote} does not exist")))?;
        if dom.run != RunState::Running {
            return Err(suspended(remote));
        }
        Ok(dom)
    }

    fn hello(&mut self, domid: DomId, cfg: &SimhvConfig) -> Result<(SimResponse, Vec<OwnedFd>)> {
        let dom = self.domain(domid)?;
        let fd = dom.mem.fd(true).try_clone_to_owned()?;
        Ok((
            SimResponse::Hello {
                domid,
                instance: dom.instance,
                table_size: cfg.gnttab_entries,
            },
            vec![fd],
        ))
    }

    fn grant_alloc(
        &mut self,
        cfg: &SimhvConfig,
        conn: HvConnId,
        domid: DomId,
        remote: DomId,
        writable: bool,
        count: u32,
    ) -> Result<(SimResponse, Vec<OwnedFd>)> {
        let dom = self.running_mut(domid)?;
        let count = count as usize;
        if count == 0 {
            return Err(Error::Invalid("granting zero pages".into()));
        }
        if dom.grants.len() + count > cfg.max_grants {
            return Err(Error::Quota(format!(
                "domain {domid} has {} grants, {count} more exceed its quota of {}",
                dom.grants.len(),
                cfg.max_grants
            )));
        }
        if dom.table.available() < count {
            return Err(Error::Quota(format!(
                "grant table of domain {domid} has {} free entries, {count} asked",
                dom.table.available()
            )));
        }
        let frames = dom.mem.alloc(count)?;
        let flags = GTF_PERMIT_ACCESS | if writable { 0 } else { GTF_READONLY };
        let mut grants = Vec::with_capacity(count);
        let mut failure = None;
        for &frame in &frames {
            let Some(r) = dom.table.alloc_ref() else {
                failure = Some(Error::Quota("grant table full".into()));
                break;
            };
            dom.grants.insert(
                r,
                Grant {
                    frame,
                    readonly: !writable,
                    owner: Owner::Conn(conn),
                    maps: 0,
                    maps_rw: 0,
                },
            );
            grants.push((r, frame));
            if let Err(e) = dom.table.install(r, remote, frame, flags) {
                failure = Some(Error::Io(e));
                break;
            }
        }
        if let Some(e) = failure {
            for &(r, _) in &grants {
                dom.free_grant(r);
            }
            for &frame in &frames[grants.len()..] {
                dom.mem.free(frame);
            }
            return Err(e);
        }
        tracing::debug!(domid, remote, count, writable, "granted");
        no_fds(SimResponse::Granted { grants })
    }

    fn grant_end(
        &mut self,
        conn: HvConnId,
        domid: DomId,
        defer: bool,
        refs: &[GrantRef],
    ) -> Result<(SimResponse, Vec<OwnedFd>)> {
        let dom = self.domain_mut(domid)?;
        let mut seen = HashSet::with_capacity(refs.len());
        for &r in refs {
            if !seen.insert(r) {
                return Err(Error::Invalid(format!("grant ref {r} listed twice")));
            }
            match dom.grants.get(&r) {
                Some(g) if g.owner == Owner::Conn(conn) => {}
                _ => {
                    return Err(Error::NotFound(format!(
                        "grant ref {r} is not held by this handle"
                    )))
                }
            }
        }
        let busy: Vec<GrantRef> = refs
            .iter()
            .copied()
            .filter(|r| dom.grants.get(r).is_some_and(|g| dom.grant_busy(*r, g)))
            .collect();
        if !defer && !busy.is_empty() {
            return Err(Error::Busy(format!(
                "{} of {} grants are still mapped (first: ref {})",
                busy.len(),
                refs.len(),
                busy[0]
            )));
        }
        for &r in refs {
            if busy.contains(&r) {
                if let Some(g) = dom.grants.get_mut(&r) {
                    g.owner = Owner::Released;
                }
            } else {
                dom.free_grant(r);
            }
        }
        no_fds(SimResponse::Done)
    }

    fn map(
        &mut self,
        cfg: &SimhvConfig,
        conn: HvConnId,
        domid: DomId,
        remote: DomId,
        writable: bool,
        refs: &[GrantRef],
    ) -> Result<(SimResponse, Vec<OwnedFd>)> {
        if refs.is_empty() {
            return Err(Error::Invalid("mapping zero grants".into()));
        }
        let caller = self.running_mut(domid)?;
        if caller.mapped_pages + refs.len() > cfg.max_mappings {
            return Err(Error::Quota(format!(
                "domain {domid} maps {} pages, {} more exceed its quota of {}",
                caller.mapped_pages,
                refs.len(),
                cfg.max_mappings
            )));
        }
        let granter = self.granter(remote)?;
        let mut frames = Vec::with_capacity(refs.len());
        for &r in refs {
            frames.push(granter.check_access(remote, r, domid, writable)?);
        }
        let remote_instance = granter.instance;
        let sent_key = (remote_instance, writable);
        let needs_fd = !self
            .conns
            .get(&conn)
            .is_some_and(|c| c.sent_mem.contains(&sent_key));
        let fd = if needs_fd {
            Some(granter.mem.fd(writable).try_clone_to_owned()?)
        } else {
            None
        };
        let granter = self.domain_mut(remote)?;
        for &r in refs {
            if let Some(g) = granter.grants.get_mut(&r) {
                g.maps += 1;
                if writable {
                    g.maps_rw += 1;
                }
                let flags = entry_flags(g);
                if let Err(e) = granter.table.set_flags(r, flags) {
                    tracing::error!(gref = r, error = %e, "updating a grant entry");
                }
            }
        }
        let handle = self.next_handle;
        self.next_handle += 1;
        let caller = self.domain_mut(domid)?;
        caller.mapped_pages += refs.len();
        caller.mappings.insert(
            handle,
            GrantMapping {
                conn,
                remote,
                remote_instance,
                refs: refs.to_vec(),
                writable,
            },
        );
        if let Some(c) = self.conns.get_mut(&conn) {
            c.sent_mem.insert(sent_key);
        }
        tracing::debug!(
            domid,
            remote,
            count = refs.len(),
            writable,
            handle,
            "mapped"
        );
        Ok((
            SimResponse::Mapped {
                handle,
                instance: remote_instance,
                frames,
            },
            fd.into_iter().collect(),
        ))
    }

    fn unmap(
        &mut self,
        conn: HvConnId,
        domid: DomId,
        handle: u64,
    ) -> Result<(SimResponse, Vec<OwnedFd>)> {
        let dom = self.domain_mut(domid)?;
        match dom.mappings.get(&handle) {
            Some(m) if m.conn == conn => {}
            _ => {
                return Err(Error::NotFound(format!(
                    "mapping {handle} is not held by this handle"
                )))
            }
        }
        if let Some(m) = dom.mappings.remove(&handle) {
            dom.mapped_pages = dom.mapped_pages.saturating_sub(m.refs.len());
            self.release_at_granter(&m);
        }
        no_fds(SimResponse::Done)
    }

    /// Drop the granter's side of a mapping that went away.
    fn release_at_granter(&mut self, m: &GrantMapping) {
        let Some(g) = self.domains.get_mut(&m.remote) else {
            return;
        };
        if g.instance != m.remote_instance {
            return;
        }
        for &r in &m.refs {
            let Some(grant) = g.grants.get_mut(&r) else {
                continue;
            };
            grant.maps = grant.maps.saturating_sub(1);
            if m.writable {
                grant.maps_rw = grant.maps_rw.saturating_sub(1);
            }
            if grant.maps == 0 && grant.owner == Owner::Released {
                g.free_grant(r);
            } else {
                let flags = entry_flags(grant);
                if let Err(e) = g.table.set_flags(r, flags) {
                    tracing::error!(gref = r, error = %e, "updating a grant entry");
                }
            }
        }
    }

    fn copy(
        &mut self,
        domid: DomId,
        segments: &[CopySpec],
        data: &[u8],
    ) -> Result<(SimResponse, Vec<OwnedFd>)> {
        self.running_mut(domid)?;
        let mut at = 0usize;
        let mut status = Vec::with_capacity(segments.len());
        let mut out = Vec::new();
        for seg in segments {
            let len = seg.len as usize;
            let local_src = if seg.source == CopySide::Local {
                let b = data
                    .get(at..at + len)
                    .ok_or_else(|| Error::Protocol("copy data shorter than its segments".into()))?;
                at += len;
                Some(b)
            } else {
                None
            };
            let result = self.copy_one(domid, seg, local_src);
            match result {
                Ok(bytes) => {
                    if seg.dest == CopySide::Local {
                        out.extend_from_slice(&bytes);
                    }
                    status.push(0);
                }
                Err(e) => {
                    if seg.dest == CopySide::Local {
                        out.resize(out.len() + len, 0);
                    }
                    status.push(proto::error_code(&e));
                }
            }
        }
        no_fds(SimResponse::Copied { status, data: out })
    }

    /// One copy segment; returns the bytes for a local destination.
    fn copy_one(&self, caller: DomId, seg: &CopySpec, local_src: Option<&[u8]>) -> Result<Vec<u8>> {
        let len = seg.len as usize;
        if len > PAGE_SIZE {
            return Err(Error::Invalid(format!("copy segment of {len} bytes")));
        }
        let bytes = match (seg.source, local_src) {
            (CopySide::Local, Some(b)) => b.to_vec(),
            (
                CopySide::Foreign {
                    domid,
                    gref,
                    offset,
                },
                _,
            ) => {
                if offset as usize + len > PAGE_SIZE {
                    return Err(Error::Invalid("copy source crosses a page".into()));
                }
                let g = self.granter(domid)?;
                let frame = g.check_access(domid, gref, caller, false)?;
                let mut b = vec![0u8; len];
                g.mem.read(frame, offset as usize, &mut b)?;
                b
            }
            (CopySide::Local, None) => return Err(Error::Protocol("copy source missing".into())),
        };
        match seg.dest {
            CopySide::Local => Ok(bytes),
            CopySide::Foreign {
                domid,
                gref,
                offset,
            } => {
                if offset as usize + len > PAGE_SIZE {
                    return Err(Error::Invalid("copy destination crosses a page".into()));
                }
                let g = self.granter(domid)?;
                let frame = g.check_access(domid, gref, caller, true)?;
                g.mem.write(frame, offset as usize, &bytes)?;
                Ok(Vec::new())
            }
        }
    }

    fn evtchn_open(&mut self, conn: HvConnId) -> Result<(SimResponse, Vec<OwnedFd>)> {
        let c = self
            .conns
            .get_mut(&conn)
            .ok_or_else(|| Error::Closed("connection gone".into()))?;
        if c.status.is_none() {
            c.status = Some(StatusPageWriter::new()?);
        }
        let fd = match c.status.as_ref() {
            Some(page) => page.reader_fd()?,
            None => return Err(Error::Closed("connection gone".into())),
        };
        Ok((
            SimResponse::EvtchnOpened {
                slots: STATUS_SLOTS as u32,
            },
            vec![fd],
        ))
    }

    /// Check the caller may open one more port on `conn`.
    fn port_room(&mut self, cfg: &SimhvConfig, conn: HvConnId, domid: DomId) -> Result<()> {
        let dom = self.running_mut(domid)?;
        if dom.ports.len() >= cfg.max_ports {
            return Err(Error::Quota(format!(
                "domain {domid} has {} ports, its quota",
                dom.ports.len()
            )));
        }
        let c = self
            .conns
            .get(&conn)
            .ok_or_else(|| Error::Closed("connection gone".into()))?;
        match &c.status {
            None => Err(Error::Invalid(
                "not an event-channel handle (EvtchnOpen first)".into(),
            )),
            Some(p) if p.in_use() >= STATUS_SLOTS => Err(Error::Quota(format!(
                "a handle holds at most {STATUS_SLOTS} ports"
            ))),
            Some(_) => Ok(()),
        }
    }

    /// Install a new port of `domid` held by `conn`; returns the reply.
    fn open_port(
        &mut self,
        conn: HvConnId,
        domid: DomId,
        rx: OwnedFd,
        tx: OwnedFd,
        binding: Binding,
    ) -> Result<(SimResponse, Vec<OwnedFd>)> {
        let fds = vec![rx.try_clone()?, tx.try_clone()?];
        let page = self
            .conns
            .get_mut(&conn)
            .and_then(|c| c.status.as_mut())
            .ok_or_else(|| Error::Closed("connection gone".into()))?;
        let (slot, generation) = page
            .alloc()
            .ok_or_else(|| Error::Quota("status page full".into()))?;
        let state = match binding {
            Binding::Unbound { .. } => PORT_UNBOUND,
            Binding::Interdomain { .. } => PORT_BOUND,
        };
        page.set(slot, generation, state);
        let dom = self.domain_mut(domid)?;
        let port = lowest_free_port(&dom.ports);
        dom.ports.insert(
            port,
            PortEntry {
                conn,
                slot,
                generation,
                rx,
                tx,
                binding,
            },
        );
        Ok((
            SimResponse::PortOpened {
                port,
                slot,
                generation,
            },
            fds,
        ))
    }

    fn alloc_unbound(
        &mut self,
        cfg: &SimhvConfig,
        conn: HvConnId,
        domid: DomId,
        remote: DomId,
    ) -> Result<(SimResponse, Vec<OwnedFd>)> {
        self.port_room(cfg, conn, domid)?;
        let rx = new_eventfd()?;
        let tx = new_eventfd()?;
        let r = self.open_port(conn, domid, rx, tx, Binding::Unbound { remote })?;
        tracing::debug!(domid, remote, reply = ?r.0, "port allocated");
        Ok(r)
    }

    fn bind(
        &mut self,
        cfg: &SimhvConfig,
        conn: HvConnId,
        domid: DomId,
        remote: DomId,
        remote_port: Port,
    ) -> Result<(SimResponse, Vec<OwnedFd>)> {
        self.port_room(cfg, conn, domid)?;
        let rdom = self
            .domains
            .get(&remote)
            .ok_or_else(|| Error::NotFound(format!("domain {remote} does not exist")))?;
        if rdom.run != RunState::Running {
            return Err(suspended(remote));
        }
        let rp = rdom
            .ports
            .get(&remote_port)
            .ok_or_else(|| Error::Invalid(format!("domain {remote} has no port {remote_port}")))?;
        if rp.binding != (Binding::Unbound { remote: domid }) {
            return Err(Error::Invalid(format!(
                "port {remote_port} of domain {remote} is not open for domain {domid}"
            )));
        }
        // The binder's rx is the remote's tx and vice versa; drop anything stale.
        drain(&rp.tx);
        let rx = rp.tx.try_clone()?;
        let tx = rp.rx.try_clone()?;
        let (rconn, rslot, rgen) = (rp.conn, rp.slot, rp.generation);
        let (resp, fds) = self.open_port(
            conn,
            domid,
            rx,
            tx,
            Binding::Interdomain {
                remote,
                remote_port,
            },
        )?;
        let SimResponse::PortOpened { port, .. } = resp else {
            return Err(Error::Protocol("internal: port reply".into()));
        };
        if let Some(rp) = self
            .domains
            .get_mut(&remote)
            .and_then(|d| d.ports.get_mut(&remote_port))
        {
            rp.binding = Binding::Interdomain {
                remote: domid,
                remote_port: port,
            };
        }
        if let Some(page) = self.conns.get(&rconn).and_then(|c| c.status.as_ref()) {
            page.set(rslot, rgen, PORT_BOUND);
        }
        tracing::debug!(domid, port, remote, remote_port, "port bound");
        Ok((resp, fds))
    }

    fn close(
        &mut self,
        conn: HvConnId,
        domid: DomId,
        port: Port,
    ) -> Result<(SimResponse, Vec<OwnedFd>)> {
        let dom = self.domain(domid)?;
        match dom.ports.get(&port) {
            Some(p) if p.conn == conn => {}
            _ => {
                return Err(Error::NotFound(format!(
                    "port {port} is not bound by this handle"
                )))
            }
        }
        self.close_port(domid, port);
        no_fds(SimResponse::Done)
    }

    /// Close a port; an interdomain peer becomes unbound (it may be bound again by this
    /// domain, as in Xen), sees it on its status page and is woken once.
    fn close_port(&mut self, domid: DomId, port: Port) {
        let Some(entry) = self
            .domains
            .get_mut(&domid)
            .and_then(|d| d.ports.remove(&port))
        else {
            return;
        };
        if let Some(page) = self
            .conns
            .get_mut(&entry.conn)
            .and_then(|c| c.status.as_mut())
        {
            page.release(entry.slot);
        }
        if let Binding::Interdomain {
            remote,
            remote_port,
        } = entry.binding
        {
            let peer = self
                .domains
                .get_mut(&remote)
                .and_then(|d| d.ports.get_mut(&remote_port));
            if let Some(peer) = peer {
                if peer.binding
                    == (Binding::Interdomain {
                        remote: domid,
                        remote_port: port,
                    })
                {
                    peer.binding = Binding::Unbound { remote: domid };
                    if let Some(page) = self.conns.get(&peer.conn).and_then(|c| c.status.as_ref()) {
                        page.set(peer.slot, peer.generation, PORT_PEER_CLOSED);
                    }
                    kick(&peer.rx);
                }
            }
        }
        tracing::debug!(domid, port, "port closed");
    }

    fn port_status(&self, domid: DomId, port: Port) -> Result<(SimResponse, Vec<OwnedFd>)> {
        let dom = self.domain(domid)?;
        let p = dom
            .ports
            .get(&port)
            .ok_or_else(|| Error::NotFound(format!("port {port}")))?;
        let resp = match p.binding {
            Binding::Unbound { remote } => SimResponse::PortStatus {
                state: 1,
                remote,
                remote_port: 0,
            },
            Binding::Interdomain {
                remote,
                remote_port,
            } => SimResponse::PortStatus {
                state: 2,
                remote,
                remote_port,
            },
        };
        no_fds(resp)
    }

    fn conn_closed(&mut self, conn: HvConnId) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let domid = c.domid;
        match self.domains.get(&domid) {
            Some(d) if d.instance == c.instance => {}
            _ => {
                self.conns.remove(&conn);
                return;
            }
        }
        // Ports first, while the connection's status page is still there for their slots.
        let ports: Vec<Port> = self
            .domains
            .get(&domid)
            .map(|d| {
                d.ports
                    .iter()
                    .filter(|(_, p)| p.conn == conn)
                    .map(|(n, _)| *n)
                    .collect()
            })
            .unwrap_or_default();
        for p in ports {
            self.close_port(domid, p);
        }
        self.conns.remove(&conn);
        let mut released = Vec::new();
        if let Some(d) = self.domains.get_mut(&domid) {
            let handles: Vec<u64> = d
                .mappings
                .iter()
                .filter(|(_, m)| m.conn == conn)
                .map(|(h, _)| *h)
                .collect();
            for h in handles {
                if let Some(m) = d.mappings.remove(&h) {
                    d.mapped_pages = d.mapped_pages.saturating_sub(m.refs.len());
                    released.push(m);
                }
            }
        }
        for m in &released {
            self.release_at_granter(m);
        }
        if let Some(d) = self.domains.get_mut(&domid) {
            let owned: Vec<GrantRef> = d
                .grants
                .iter()
                .filter(|(_, g)| g.owner == Owner::Conn(conn))
                .map(|(r, _)| *r)
                .collect();
            for r in owned {
                let busy = d.grants.get(&r).is_some_and(|g| d.grant_busy(r, g));
                if busy {
                    if let Some(g) = d.grants.get_mut(&r) {
                        g.owner = Owner::Released;
                    }
                } else {
                    d.free_grant(r);
                }
            }
        }
        tracing::debug!(domid, conn, "connection closed");
    }

    fn remove_domain(&mut self, domid: DomId) -> Result<Vec<UnixStream>> {
        let instance = self
            .domains
            .get(&domid)
            .map(|d| d.instance)
            .ok_or_else(|| Error::NotFound(format!("domain {domid}")))?;
        let ports: Vec<Port> = self
            .domains
            .get(&domid)
            .map(|d| d.ports.keys().copied().collect())
            .unwrap_or_default();
        for p in ports {
            self.close_port(domid, p);
        }
        let ids: Vec<HvConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.domid == domid)
            .map(|(id, _)| *id)
            .collect();
        let streams: Vec<UnixStream> = ids
            .iter()
            .filter_map(|id| self.conns.remove(id))
            .map(|c| c.stream)
            .collect();
        let held: Vec<GrantMapping> = self
            .domains
            .get_mut(&domid)
            .map(|d| d.mappings.drain().map(|(_, m)| m).collect())
            .unwrap_or_default();
        for m in &held {
            self.release_at_granter(m);
        }
        // Others' mappings of this domain's grants: released (their pages stay valid in
        // the mappers' processes until they unmap; the accounting ends here).
        for (d, dom) in self.domains.iter_mut() {
            if *d == domid {
                continue;
            }
            let gone: Vec<u64> = dom
                .mappings
                .iter()
                .filter(|(_, m)| m.remote == domid && m.remote_instance == instance)
                .map(|(h, _)| *h)
                .collect();
            for h in gone {
                if let Some(m) = dom.mappings.remove(&h) {
                    dom.mapped_pages = dom.mapped_pages.saturating_sub(m.refs.len());
                }
            }
        }
        self.domains.remove(&domid);
        Ok(streams)
    }
}

fn lowest_free_port(ports: &BTreeMap<Port, PortEntry>) -> Port {
    // Port 0 is never valid in Xen.
    let mut want: Port = 1;
    for &p in ports.keys() {
        if p > want {
            break;
        }
        if p == want {
            want += 1;
        }
    }
    want
}

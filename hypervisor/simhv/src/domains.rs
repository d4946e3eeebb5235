//! Domain lifecycle: create, destroy, suspend, resume, and the counters of `state`.
//!
//! Creating domain N makes `DIR/dom<N>` (0700) with its memory and grant-table files,
//! serves `hv.sock` and `xenstore.sock` there, introduces the domain to xenstored
//! (`@introduceDomain`) and writes `/local/domain/N/name` and `domid` as the toolstack
//! does. Destroying it tears down its hypervisor state (see [`crate::hv`]), closes its
//! connections, releases it in xenstored (`@releaseDomain`, its nodes removed) and removes
//! the directory. Suspending writes `control/shutdown = "suspend"` in its xenstore home
//! and makes its grant and event-channel operations fail with `Busy` until resumed
//! (teardown operations — ending grants, unmapping, closing ports — still work, so a
//! process of a suspended domain can always let go of what it holds).
//!
//! Migration (the hypervisor's half; see `crate::hv`'s `migrate`): an incoming domain is
//! created suspended, without the `control/shutdown` request, receives its streams, is
//! renamed to the migrating domain's name and resumed; the source domain is destroyed.
//!
//! Lifecycle operations are serialised by one lock; the hypervisor state has its own.

use std::collections::BTreeMap;
use std::fs::DirBuilder;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use nix::sys::eventfd::{EfdFlags, EventFd};
use xmx_hv::sim::admin::{
    DomainInfo, DomainProcesses, DomainState, Restored, RunState, SaveInfo, SaveRound,
    XenstoreUsage,
};
use xmx_hv::sim::layout;
use xmx_hv::{DomId, Error, Result, XsAccess, XsPerm, DOM0};

use crate::config::SimhvConfig;
use crate::hv::{serve, Hv};
use crate::xenstored::Xenstored;
use xmx_hv::lock;

/// First domid Xen reserves for special purposes (DOMID_FIRST_RESERVED).
pub const DOMID_FIRST_RESERVED: DomId = 0x7ff0;
/// Longest domain name accepted.
pub const MAX_NAME_LEN: usize = 64;
/// dom0's name, as the toolstack writes it.
pub const DOM0_NAME: &str = "Domain-0";

/// How to create a domain, beyond its name and domid.
#[derive(Debug, Clone, Default)]
pub(crate) struct Spec {
    /// Memory limit in bytes; the host's configured one if none.
    pub mem_limit: Option<u64>,
    /// Created suspended to receive a migration stream.
    pub incoming: bool,
}

/// The threads serving one domain.
struct Runtime {
    stop: Arc<OwnedFd>,
    acceptor: Option<JoinHandle<()>>,
    xenstore: Option<JoinHandle<()>>,
}

/// Every domain of the host and the services around them.
pub(crate) struct HostDomains {
    dir: PathBuf,
    hv: Arc<Hv>,
    xenstored: Arc<Xenstored>,
    runtimes: Mutex<BTreeMap<DomId, Runtime>>,
    /// xenstore threads to join at shutdown.
    retired: Mutex<Vec<JoinHandle<()>>>,
}

fn bind_socket(path: &Path) -> Result<UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::Io(e)),
    }
    UnixListener::bind(path).map_err(|e| {
        if e.kind() == io::ErrorKind::InvalidInput {
            Error::Invalid(format!(
                "socket path {} is too long for a unix socket; use a shorter --dir",
                path.display()
            ))
        } else {
            Error::Io(e)
        }
    })
}

fn validate_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(Error::Invalid(format!(
            "domain names have 1 to {MAX_NAME_LEN} bytes"
        )));
    }
    if name
        .chars()
        .any(|c| c.is_control() || c == '/' || c.is_whitespace())
    {
        return Err(Error::Invalid(format!("domain name {name:?}")));
    }
    Ok(())
}

/// Stream files are named by the admin client, whose working directory is not ours.
fn stream_path(path: &Path) -> Result<()> {
    if !path.is_absolute() {
        return Err(Error::Invalid(format!(
            "stream file {} is not an absolute path",
            path.display()
        )));
    }
    Ok(())
}

impl HostDomains {
    /// A host with no domain yet.
    pub(crate) fn new(dir: &Path, config: SimhvConfig) -> HostDomains {
        let xenstored = Xenstored::new(config.xenstore);
        HostDomains {
            dir: dir.to_path_buf(),
            hv: Arc::new(Hv::new(config)),
            xenstored,
            runtimes: Mutex::new(BTreeMap::new()),
            retired: Mutex::new(Vec::new()),
        }
    }

    /// Bring up dom0.
    pub(crate) fn start_dom0(&self) -> Result<()> {
        let mut rt = lock(&self.runtimes);
        self.create_locked(&mut rt, DOM0, DOM0_NAME, &Spec::default())?;
        Ok(())
    }

    /// Create a domain; the lowest free domid from 1 unless `domid` is given.
    pub(crate) fn create(&self, name: &str, domid: Option<DomId>, spec: &Spec) -> Result<DomId> {
        validate_name(name)?;
        let mut rt = lock(&self.runtimes);
        if self.hv.name_taken(name) {
            return Err(Error::Exists(format!("a domain is named {name:?}")));
        }
        let domid = match domid {
            Some(0) => return Err(Error::Exists("domain 0".into())),
            Some(d) if d >= DOMID_FIRST_RESERVED => {
                return Err(Error::Invalid(format!("domid {d} is reserved")))
            }
            Some(d) if rt.contains_key(&d) => return Err(Error::Exists(format!("domain {d}"))),
            Some(d) => d,
            None => (1..DOMID_FIRST_RESERVED)
                .find(|d| !rt.contains_key(d))
                .ok_or_else(|| Error::Quota("no free domid".into()))?,
        };
        self.create_locked(&mut rt, domid, name, spec)?;
        Ok(domid)
    }

    /// Rename a domain (not dom0), in the hypervisor and in xenstore's
    /// `/local/domain/N/name`.
    pub(crate) fn rename(&self, domid: DomId, name: &str) -> Result<()> {
        if domid == DOM0 {
            return Err(Error::Invalid("dom0 cannot be renamed".into()));
        }
        validate_name(name)?;
        let _rt = lock(&self.runtimes);
        let old = self.hv.counters(domid)?.name;
        self.hv.rename(domid, name)?;
        let path = format!("/local/domain/{domid}/name");
        if let Err(e) = self.toolstack_write_identity(&path, name.as_bytes(), domid) {
            let _ = self.hv.rename(domid, &old);
            return Err(e);
        }
        tracing::info!(domid, from = %old, to = name, "domain renamed");
        Ok(())
    }

    fn create_locked(
        &self,
        rt: &mut BTreeMap<DomId, Runtime>,
        domid: DomId,
        name: &str,
        spec: &Spec,
    ) -> Result<()> {
        let dir = layout::dom_dir(&self.dir, domid);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        // Where an earlier domain with this id went is no concern of this one's processes.
        match std::fs::remove_file(layout::moved_file(&self.dir, domid)) {
            Ok(()) => tracing::debug!(domid, "stale forwarding record removed"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        DirBuilder::new().mode(0o700).create(&dir)?;
        match self.bring_up(rt, domid, name, spec) {
            Ok(()) => {
                tracing::info!(domid, name, incoming = spec.incoming, "domain created");
                Ok(())
            }
            Err(e) => {
                tracing::warn!(domid, name, error = %e, "domain creation failed");
                if let Ok(streams) = self.hv.remove_domain(domid) {
                    shut(streams);
                }
                if let Some(r) = rt.remove(&domid) {
                    if let Some(x) = self.stop_runtime(r) {
                        lock(&self.retired).push(x);
                    }
                }
                if domid != DOM0 {
                    self.xenstored.release_domain(domid);
                }
                let _ = std::fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    fn bring_up(
        &self,
        rt: &mut BTreeMap<DomId, Runtime>,
        domid: DomId,
        name: &str,
        spec: &Spec,
    ) -> Result<()> {
        self.hv
            .add_domain(&self.dir, domid, name, spec.mem_limit, spec.incoming)?;
        let hv_listener = bind_socket(&layout::hv_sock(&self.dir, domid))?;
        let xs_listener = bind_socket(&layout::xenstore_sock(&self.dir, domid))?;
        let stop: OwnedFd =
            EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
                .map_err(|e| Error::Io(e.into()))?
                .into();
        let stop = Arc::new(stop);
        let mut runtime = Runtime {
            stop: stop.clone(),
            acceptor: None,
            xenstore: None,
        };
        runtime.xenstore = Some(self.xenstored.serve(domid, xs_listener)?);
        runtime.acceptor = Some(serve::spawn_acceptor(
            self.hv.clone(),
            domid,
            hv_listener,
            stop,
        )?);
        rt.insert(domid, runtime);
        if domid != DOM0 {
            // xenstored starts with dom0 introduced.
            self.xenstored.introduce_domain(domid);
        }
        let home = format!("/local/domain/{domid}");
        if domid == DOM0 {
            self.toolstack_write(&format!("{home}/name"), name.as_bytes())?;
            self.toolstack_write(&format!("{home}/domid"), b"0")?;
        } else {
            // As libxl does: `vm` names this instance of the domain, so a daemon that missed
            // a destroy can tell a new domain given a freed domid from the old one.
            let vm = format!("/vm/{}", instance_uuid()?);
            self.toolstack_write_identity(&format!("{home}/vm"), vm.as_bytes(), domid)?;
            self.toolstack_write_identity(&format!("{home}/name"), name.as_bytes(), domid)?;
            let id = domid.to_string();
            self.toolstack_write_identity(&format!("{home}/domid"), id.as_bytes(), domid)?;
        }
        Ok(())
    }

    /// Write a node as the toolstack (dom0) does for a domain's identity: owned by dom0 and
    /// only readable by the domain, as libxl leaves `name` and `domid`, so the guest cannot
    /// rename itself.
    fn toolstack_write_identity(&self, path: &str, value: &[u8], domid: DomId) -> Result<()> {
        self.toolstack_write(path, value)?;
        let acl = [
            XsPerm {
                domid: DOM0,
                access: XsAccess::None,
            },
            XsPerm {
                domid,
                access: XsAccess::Read,
            },
        ];
        self.xenstored
            .set_perms(DOM0, path, &acl)
            .map_err(|e| Error::Xs(format!("toolstack permissions of {path}: {e:?}")))
    }

    /// Write a node as the toolstack (dom0) does.
    fn toolstack_write(&self, path: &str, value: &[u8]) -> Result<()> {
        self.xenstored
            .write(DOM0, path, value)
            .map_err(|e| Error::Xs(format!("toolstack write of {path}: {e:?}")))
    }

    /// Stop the domain's hv acceptor (its connections must be shut down already) and
    /// keep its xenstore thread, which ends once xenstored releases the domain or shuts
    /// down, for joining then.
    fn stop_runtime(&self, mut r: Runtime) -> Option<JoinHandle<()>> {
        if let Err(e) = nix::unistd::write(r.stop.as_ref(), &1u64.to_ne_bytes()) {
            tracing::error!(error = %e, "stopping an acceptor");
        }
        if let Some(a) = r.acceptor.take() {
            let _ = a.join();
        }
        r.xenstore.take()
    }

    /// Destroy a domain (not dom0).
    pub(crate) fn destroy(&self, domid: DomId) -> Result<()> {
        if domid == DOM0 {
            return Err(Error::Invalid("dom0 cannot be destroyed".into()));
        }
        let mut rt = lock(&self.runtimes);
        let runtime = rt
            .remove(&domid)
            .ok_or_else(|| Error::NotFound(format!("domain {domid}")))?;
        self.teardown(domid, runtime);
        tracing::info!(domid, "domain destroyed");
        Ok(())
    }

    fn teardown(&self, domid: DomId, runtime: Runtime) {
        match self.hv.remove_domain(domid) {
            Ok(streams) => shut(streams),
            Err(e) => tracing::error!(domid, error = %e, "tearing down"),
        }
        let xs_thread = self.stop_runtime(runtime);
        self.xenstored.release_domain(domid);
        if let Some(t) = xs_thread {
            let _ = t.join();
        }
        if let Err(e) = std::fs::remove_dir_all(layout::dom_dir(&self.dir, domid)) {
            tracing::warn!(domid, error = %e, "removing the domain directory");
        }
    }

    /// Suspend a domain (not dom0).
    pub(crate) fn suspend(&self, domid: DomId) -> Result<()> {
        if domid == DOM0 {
            return Err(Error::Invalid("dom0 cannot be suspended".into()));
        }
        let _rt = lock(&self.runtimes);
        self.hv.set_run(domid, RunState::Suspended)?;
        let path = format!("/local/domain/{domid}/control/shutdown");
        if let Err(e) = self.toolstack_write(&path, b"suspend") {
            let _ = self.hv.set_run(domid, RunState::Running);
            return Err(e);
        }
        tracing::info!(domid, "domain suspended");
        Ok(())
    }

    /// Start sending a domain to another host.
    pub(crate) fn save_begin(&self, domid: DomId) -> Result<SaveInfo> {
        self.hv.save_begin(domid)
    }

    /// One round of a domain's migration stream, written to a new file at `path`.
    pub(crate) fn save(&self, domid: DomId, path: &Path, last: bool) -> Result<SaveRound> {
        stream_path(path)?;
        self.hv.save_round(domid, path, last)
    }

    /// Stop sending a domain.
    pub(crate) fn save_end(&self, domid: DomId) -> Result<()> {
        self.hv.save_end(domid)
    }

    /// Apply a migration stream to an incoming domain.
    pub(crate) fn restore(&self, domid: DomId, path: &Path) -> Result<Restored> {
        stream_path(path)?;
        self.hv.restore(domid, path)
    }

    /// Resume a suspended domain.
    pub(crate) fn resume(&self, domid: DomId) -> Result<()> {
        let _rt = lock(&self.runtimes);
        self.hv.set_run(domid, RunState::Running)?;
        tracing::info!(domid, "domain resumed");
        Ok(())
    }

    /// A domain's processes (see [`crate::procs`]).
    pub(crate) fn processes(&self, domid: DomId) -> Result<DomainProcesses> {
        if domid == DOM0 {
            return Err(Error::Invalid("dom0's processes are the host's".into()));
        }
        let (inode, attached, others) = self.hv.memory_users(domid)?;
        Ok(DomainProcesses {
            pids: crate::procs::of_domain(inode, &attached, &others),
        })
    }

    /// Every domain.
    pub(crate) fn list(&self) -> Vec<DomainInfo> {
        self.hv
            .list()
            .into_iter()
            .map(|(domid, name, state)| DomainInfo { domid, name, state })
            .collect()
    }

    /// Counters of one domain.
    pub(crate) fn state(&self, domid: DomId) -> Result<DomainState> {
        let c = self.hv.counters(domid)?;
        let u = self.xenstored.usage(domid);
        Ok(DomainState {
            domid,
            name: c.name,
            state: c.run,
            instance: c.instance,
            grants_active: c.grants_active,
            grants_deferred: c.grants_deferred,
            grants_mapped_by_others: c.grants_mapped_by_others,
            mappings_held: c.mappings_held,
            ports_open: c.ports_open,
            hv_connections: c.hv_connections,
            mem_pages: c.mem_pages,
            mem_limit: c.mem_limit,
            xenstore: XenstoreUsage {
                nodes: u.nodes,
                watches: u.watches,
                transactions: u.transactions,
                connections: u.connections,
            },
        })
    }

    /// Stop everything: every domain's connections, acceptors and xenstore service.
    pub(crate) fn shutdown(&self) {
        let mut rt = lock(&self.runtimes);
        let all: Vec<DomId> = rt.keys().rev().copied().collect();
        for domid in all {
            if let Some(r) = rt.remove(&domid) {
                match self.hv.remove_domain(domid) {
                    Ok(streams) => shut(streams),
                    Err(e) => tracing::error!(domid, error = %e, "tearing down"),
                }
                if let Some(x) = self.stop_runtime(r) {
                    lock(&self.retired).push(x);
                }
                let _ = std::fs::remove_dir_all(layout::dom_dir(&self.dir, domid));
            }
        }
        drop(rt);
        self.xenstored.shutdown();
        for t in lock(&self.retired).drain(..) {
            let _ = t.join();
        }
    }
}

fn shut(streams: Vec<std::os::unix::net::UnixStream>) {
    for s in streams {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
}

/// A fresh random UUID from the kernel, for a domain instance's `vm` path.
fn instance_uuid() -> Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/random/uuid")?
        .trim()
        .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(validate_name("guest-1").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("a/b").is_err());
        assert!(validate_name("a b").is_err());
        assert!(validate_name("a\nb").is_err());
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN + 1)).is_err());
    }
}

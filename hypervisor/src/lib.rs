//! xmx-hv: what Xen offers a split driver, as traits, with two platforms behind them.
//!
//! - [`GrantTable`]: grant pages of this domain to another one, map another domain's
//!   grants in batches, grant-copy.
//! - [`EventChannels`]: inter-domain event channels with a pollable fd.
//! - [`Xenstore`]: the xenstore protocol, with transactions and watches.
//!
//! Platforms:
//! - `linux` ([`linux`]): real Xen from userspace (/dev/xen/gntalloc, gntdev, evtchn,
//!   and xenstored's socket or /dev/xen/xenbus).
//! - `sim` ([`sim`]): a domain attached to an `xmx-simhv` daemon, with the same semantics.
//!
//! Everything above this crate is written against the traits and a [`Platform`]
//! chosen at run time, so the same binaries run on real Xen and on the simulator.

pub mod conformance;
pub mod daemon;
pub mod error;
mod fdframe;
pub mod handoff;
pub mod linux;
pub mod platform;
pub mod sim;
pub mod sync;
pub mod xs;

use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

pub use error::{Error, Result};
pub use handoff::{ExportedPages, ExportedPort, ImportedPages, ImportedPort};
pub use platform::{Platform, PlatformKind};
pub use sync::lock;

/// A Xen domain id.
pub type DomId = u16;
/// A grant reference (index into the granting domain's grant table): the width the
/// ring messages carry.
pub use xmx_wire::msg::GrantRef;
/// An event-channel port, local to the domain that holds it.
pub type Port = u32;

/// The size of a page, the unit of granting.
pub const PAGE_SIZE: usize = 4096;
/// dom0's domain id.
pub const DOM0: DomId = 0;

/// Pages this domain allocated and granted to one remote domain.
///
/// The memory stays mapped in this process until [`GrantedPages::end_access`] or drop.
/// Dropping ends access if it can; if the remote still has the pages mapped, the platform
/// keeps them alive (leaks them to the remote, as Linux's gntalloc defers the free) rather
/// than hand memory the remote can still see back to the allocator.
pub struct GrantedPages {
    pub(crate) refs: Vec<GrantRef>,
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    pub(crate) remote: DomId,
    pub(crate) writable: bool,
    pub(crate) owner: Option<Box<dyn GrantedOwner>>,
}

// SAFETY: GrantedPages owns a mapping of shared memory; the raw pointer is only a handle
// to that mapping, which is valid from any thread until the owner releases it in drop.
unsafe impl Send for GrantedPages {}
// SAFETY: &GrantedPages only hands out the pointer and length; all access to the bytes
// goes through the caller's own synchronisation (rings with acquire/release indices).
unsafe impl Sync for GrantedPages {}

/// Platform side of [`GrantedPages`]: releases grants and the local mapping.
pub trait GrantedOwner: Send + Sync {
    /// End foreign access to every ref; `Err(Error::Busy)` if the remote still maps any,
    /// in which case nothing was released.
    fn end_access(&mut self, refs: &[GrantRef]) -> Result<()>;
    /// Release unconditionally (drop path): end what can be ended and keep the rest
    /// alive until the remote unmaps it.
    fn release(&mut self, refs: &[GrantRef]);
    /// Descriptors and layout through which another process of this domain can map the
    /// same pages (see [`handoff`]).
    fn export(&self) -> Result<handoff::PagesSource> {
        Err(Error::Unsupported("exporting granted pages".into()))
    }
}

impl GrantedPages {
    /// The grant refs of the pages, in page order.
    pub fn refs(&self) -> &[GrantRef] {
        &self.refs
    }
    /// Start of the pages' mapping in this process.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    /// Length of the mapping in bytes (a whole number of pages).
    pub fn len(&self) -> usize {
        self.len
    }
    /// True if no page is granted.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The domain the pages are granted to.
    pub fn remote(&self) -> DomId {
        self.remote
    }
    /// Whether the remote may map the pages writable.
    pub fn writable(&self) -> bool {
        self.writable
    }
    /// Access to these pages for another process of this domain (see [`handoff`]). The
    /// grants stay owned by `self`; do not end them while a receiver still maps them.
    pub fn export(&self) -> Result<ExportedPages> {
        let owner = self
            .owner
            .as_ref()
            .ok_or_else(|| Error::Closed("the grants were ended".into()))?;
        let source = owner.export()?;
        Ok(ExportedPages {
            fd: source.fd,
            layout: source.layout,
            refs: self.refs.clone(),
            remote: self.remote,
            writable: self.writable,
        })
    }
    /// End access to all pages. Refused with [`Error::Busy`] while the remote maps any
    /// of them; the pages are then handed back unchanged.
    pub fn end_access(mut self) -> std::result::Result<(), (Self, Error)> {
        let refs = std::mem::take(&mut self.refs);
        let res = match self.owner.as_mut() {
            Some(o) => o.end_access(&refs),
            None => Ok(()),
        };
        match res {
            Ok(()) => {
                self.owner = None;
                Ok(())
            }
            Err(e) => {
                self.refs = refs;
                Err((self, e))
            }
        }
    }
}

impl Drop for GrantedPages {
    fn drop(&mut self) {
        if let Some(mut o) = self.owner.take() {
            o.release(&self.refs);
        }
    }
}

/// Another domain's grants, mapped contiguously into this process.
pub struct MappedPages {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    pub(crate) remote: DomId,
    pub(crate) refs: Vec<GrantRef>,
    pub(crate) writable: bool,
    pub(crate) owner: Option<Box<dyn MappedOwner>>,
}

// SAFETY: as for GrantedPages: a handle to a mapping that is valid on every thread until
// the owner unmaps it in drop.
unsafe impl Send for MappedPages {}
// SAFETY: see GrantedPages; byte access is synchronised by the users of the mapping.
unsafe impl Sync for MappedPages {}

/// Platform side of [`MappedPages`]: unmaps.
pub trait MappedOwner: Send + Sync {
    /// Unmap the pages from this process; called once, from drop.
    fn unmap(&mut self);
}

impl MappedPages {
    /// Start of the mapping in this process.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    /// Length of the mapping in bytes (a whole number of pages).
    pub fn len(&self) -> usize {
        self.len
    }
    /// True if no page is mapped.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The domain that granted the pages.
    pub fn remote(&self) -> DomId {
        self.remote
    }
    /// The mapped grant refs, in the order their pages appear in the mapping.
    pub fn refs(&self) -> &[GrantRef] {
        &self.refs
    }
    /// Whether the pages are mapped writable.
    pub fn writable(&self) -> bool {
        self.writable
    }
}

impl Drop for MappedPages {
    fn drop(&mut self) {
        if let Some(mut o) = self.owner.take() {
            o.unmap();
        }
    }
}

/// One side of a grant copy: a foreign grant or local memory.
#[derive(Debug, Clone, Copy)]
pub enum CopyPtr {
    /// `offset` bytes into the page that `domid` granted as `gref`.
    Foreign {
        /// The domain that granted the page.
        domid: DomId,
        /// The grant ref of the page in `domid`'s table.
        gref: GrantRef,
        /// Byte offset into the page.
        offset: u16,
    },
    /// Local memory of the calling process.
    Local(*mut u8),
}

/// One grant-copy segment (at most one page, not crossing a page boundary on a foreign side).
#[derive(Debug, Clone, Copy)]
pub struct CopySegment {
    /// Where the bytes are read from.
    pub source: CopyPtr,
    /// Where the bytes are written to.
    pub dest: CopyPtr,
    /// Bytes to copy.
    pub len: u16,
}

/// The grant table of the calling domain, both as granter and as mapper.
pub trait GrantTable: Send + Sync {
    /// Allocate `count` zeroed pages and grant them to `remote` (read-only unless
    /// `writable`). The pages are mapped contiguously in this process.
    fn grant_pages(&self, remote: DomId, count: usize, writable: bool) -> Result<GrantedPages>;

    /// Map `refs` granted by `remote` in one call, contiguously. Fails as a whole (and
    /// maps nothing) if any ref is out of range, not granted to this domain, or
    /// read-only while `writable` is asked.
    fn map(&self, remote: DomId, refs: &[GrantRef], writable: bool) -> Result<MappedPages>;

    /// Grant copy, as GNTTABOP_copy: every segment is checked as a mapping would be.
    /// Returns per-segment results in the order given.
    fn copy(&self, segments: &[CopySegment]) -> Result<Vec<Result<()>>>;

    /// How many grant entries this domain's table holds.
    fn table_size(&self) -> usize;
}

/// A cheap handle that signals one event-channel port, for the data path.
pub trait PortNotifier: Send + Sync {
    /// Signal the other end of the port.
    fn notify(&self) -> Result<()>;
}

/// The event channels of the calling domain.
pub trait EventChannels: Send + Sync {
    /// Allocate a port that `remote` may bind to.
    fn alloc_unbound(&self, remote: DomId) -> Result<Port>;
    /// Bind to `remote_port` of `remote`, which must have been allocated unbound for us.
    fn bind_interdomain(&self, remote: DomId, remote_port: Port) -> Result<Port>;
    /// Signal the other end of `port`.
    fn notify(&self, port: Port) -> Result<()>;
    /// A notifier for `port` that does not go through this handle's locks.
    fn notifier(&self, port: Port) -> Result<Arc<dyn PortNotifier>>;
    /// Re-enable delivery on `port` after it was reported pending.
    fn unmask(&self, port: Port) -> Result<()>;
    /// Close `port`; the remote end sees it closed.
    fn close(&self, port: Port) -> Result<()>;
    /// A file descriptor that polls readable while any port is pending.
    fn fd(&self) -> RawFd;
    /// Append pending ports to `out` without blocking; each reported port is masked until
    /// [`EventChannels::unmask`].
    fn pending(&self, out: &mut Vec<Port>) -> Result<()>;
    /// Block until a port is pending or `timeout` elapses (None: forever), then report as
    /// [`EventChannels::pending`] does.
    fn wait(&self, out: &mut Vec<Port>, timeout: Option<Duration>) -> Result<()>;
    /// Access to `port` for another process of this domain (see [`handoff`]). From then
    /// on the receiver takes the port's events: this handle no longer reports it as
    /// pending. The port stays owned (and is closed) by this handle.
    fn export_port(&self, port: Port) -> Result<ExportedPort> {
        let _ = port;
        Err(Error::Unsupported("exporting event-channel ports".into()))
    }
}

/// A xenstore transaction id; [`XBT_NULL`] is no transaction.
pub type TxId = u32;
/// No transaction: the operation applies to the store directly.
pub const XBT_NULL: TxId = 0;

/// One entry of a node's permission list, as xenstored keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct XsPerm {
    /// The domain this entry is about; in the first entry, the node's owner.
    pub domid: DomId,
    /// What `domid` may do with the node.
    pub access: XsAccess,
}

/// Access letters of xenstore permissions: n, r, w, b.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum XsAccess {
    /// `n`: no access.
    None,
    /// `r`: read only.
    Read,
    /// `w`: write only.
    Write,
    /// `b`: read and write.
    Both,
}

/// A fired watch: the path that changed and the token it was registered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    /// The node that changed (for the firing at registration, the watched path itself).
    pub path: String,
    /// The token the watch was registered with.
    pub token: String,
}

/// The xenstore protocol as a client sees it.
pub trait Xenstore: Send + Sync {
    /// The value of the node at `path`.
    fn read(&self, tx: TxId, path: &str) -> Result<Vec<u8>>;
    /// Set the value of `path`, creating the node (and missing parents) if needed.
    fn write(&self, tx: TxId, path: &str, value: &[u8]) -> Result<()>;
    /// Create the node `path` (and missing parents) with an empty value; an existing node
    /// is left as it is.
    fn mkdir(&self, tx: TxId, path: &str) -> Result<()>;
    /// Remove the node `path` and everything below it.
    fn rm(&self, tx: TxId, path: &str) -> Result<()>;
    /// The names of the children of `path` (single components, not full paths).
    fn directory(&self, tx: TxId, path: &str) -> Result<Vec<String>>;
    /// First entry is the owner and the default access for other domains.
    fn get_perms(&self, tx: TxId, path: &str) -> Result<Vec<XsPerm>>;
    /// Replace the permission list of `path`; the first entry is as in
    /// [`Xenstore::get_perms`].
    fn set_perms(&self, tx: TxId, path: &str, perms: &[XsPerm]) -> Result<()>;
    /// Start a transaction; the operations that pass its id as `tx` belong to it.
    fn transaction_start(&self) -> Result<TxId>;
    /// Commit (or abort with `commit == false`); a conflicting commit is [`Error::Again`].
    fn transaction_end(&self, tx: TxId, commit: bool) -> Result<()>;
    /// Register a watch; xenstored fires it once at once and then on every change.
    fn watch(&self, path: &str, token: &str) -> Result<()>;
    /// Remove the watch registered with this `path` and `token`.
    fn unwatch(&self, path: &str, token: &str) -> Result<()>;
    /// A file descriptor that polls readable while a watch event is queued.
    fn watch_fd(&self) -> RawFd;
    /// The next queued watch event, waiting up to `timeout` (None: forever).
    fn next_watch_event(&self, timeout: Option<Duration>) -> Result<Option<WatchEvent>>;
    /// The home path of `domid` in the store (`/local/domain/<domid>`).
    fn get_domain_path(&self, domid: DomId) -> Result<String>;
    /// Tell xenstored about a new domain whose xenstore ring is the page at `mfn` and whose
    /// event channel to it is `port` (a toolstack operation of dom0).
    fn introduce(&self, domid: DomId, mfn: u64, port: Port) -> Result<()>;
    /// Tell xenstored that `domid` is gone, so it drops what the domain held.
    fn release(&self, domid: DomId) -> Result<()>;
    /// Whether xenstored knows `domid` (it was introduced and not released).
    fn is_domain_introduced(&self, domid: DomId) -> Result<bool>;
    /// Remove every watch and open transaction of this connection.
    fn reset_watches(&self) -> Result<()>;
}

/// Times [`in_transaction`] retries a conflicting transaction before giving up.
const TX_ATTEMPTS: usize = 16;

/// Runs `body` in a xenstore transaction, again while its commit conflicts
/// ([`Error::Again`], which any concurrent writer to the same nodes or their parent
/// causes), at most [`TX_ATTEMPTS`] times; an error of `body` aborts it.
pub fn in_transaction<T>(xs: &dyn Xenstore, mut body: impl FnMut(TxId) -> Result<T>) -> Result<T> {
    for _ in 0..TX_ATTEMPTS {
        let tx = xs.transaction_start()?;
        let value = match body(tx) {
            Ok(v) => v,
            Err(e) => {
                let _ = xs.transaction_end(tx, false);
                return Err(e);
            }
        };
        match xs.transaction_end(tx, true) {
            Ok(()) => return Ok(value),
            Err(Error::Again) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::Again)
}

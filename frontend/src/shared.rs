//! Small pieces shared by the daemon side and the application side: ring memory over
//! granted or imported pages, ending grants, and a port that closes itself.

use std::sync::Arc;

use xmx_hv::{DomId, EventChannels, GrantedPages, ImportedPages, Port, PortNotifier};
use xmx_wire::ring::SharedMem;

use crate::error::{Error, Result};

/// `len` bytes at `offset` of pages this domain granted, as ring memory that keeps the
/// pages mapped while in use.
pub(crate) fn granted_mem(
    pages: &Arc<GrantedPages>,
    offset: usize,
    len: usize,
) -> Result<SharedMem> {
    check_range(pages.len(), offset, len)?;
    let owner: Arc<dyn Send + Sync> = pages.clone();
    // SAFETY: offset..offset+len lies inside the writable mapping of the granted pages
    // (checked above), which `owner` keeps mapped for as long as the returned handle or a
    // clone of it lives; the memory is only touched through SharedMem's atomic accesses.
    let mem = unsafe { SharedMem::from_raw_with_owner(pages.as_ptr().add(offset), len, owner) }?;
    Ok(mem)
}

/// `len` bytes at `offset` of pages handed over by the daemon, as ring memory that keeps
/// the mapping alive while in use.
pub(crate) fn imported_mem(
    pages: &Arc<ImportedPages>,
    offset: usize,
    len: usize,
) -> Result<SharedMem> {
    check_range(pages.len(), offset, len)?;
    let owner: Arc<dyn Send + Sync> = pages.clone();
    // SAFETY: offset..offset+len lies inside the read-write mapping of the imported pages
    // (checked above), kept mapped by `owner` as long as the handle or a clone lives; the
    // memory is only touched through SharedMem's atomic accesses.
    let mem = unsafe { SharedMem::from_raw_with_owner(pages.as_ptr().add(offset), len, owner) }?;
    Ok(mem)
}

fn check_range(total: usize, offset: usize, len: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= total && len > 0 => Ok(()),
        _ => Err(Error::Invalid(format!(
            "{len} bytes at {offset} of a {total}-byte mapping"
        ))),
    }
}

/// End access to pages the remote no longer maps. If it still does, the pages are
/// released anyway and the platform keeps them until the remote unmaps them.
pub(crate) fn end_grants(pages: GrantedPages, what: &str) {
    match pages.end_access() {
        Ok(()) => {}
        // A backend that said Closing may not have unmapped yet; the platform frees the
        // pages when it does.
        Err((pages, xmx_hv::Error::Busy(_))) => {
            tracing::debug!(
                what,
                "grants still mapped by the backend; released when it unmaps"
            );
            drop(pages);
        }
        Err((pages, e)) => {
            tracing::warn!(what, error = %e, "ending grants; released on drop");
            drop(pages);
        }
    }
}

/// As [`end_grants`] for pages that ring handles may still share; the last holder ends
/// them.
pub(crate) fn end_shared_grants(pages: Arc<GrantedPages>, what: &str) {
    match Arc::try_unwrap(pages) {
        Ok(pages) => end_grants(pages, what),
        Err(still_shared) => {
            tracing::debug!(
                what,
                "grants still referenced; released with the last handle"
            );
            drop(still_shared);
        }
    }
}

/// An event-channel port with the handle it was allocated through, closed on drop.
pub(crate) struct OwnedPort {
    evtchn: Box<dyn EventChannels>,
    port: Port,
}

impl OwnedPort {
    /// Allocate a port for `remote` to bind, on `evtchn`.
    pub(crate) fn alloc_unbound(evtchn: Box<dyn EventChannels>, remote: DomId) -> Result<Self> {
        let port = evtchn.alloc_unbound(remote)?;
        Ok(OwnedPort { evtchn, port })
    }

    pub(crate) fn port(&self) -> Port {
        self.port
    }

    pub(crate) fn handle(&self) -> &dyn EventChannels {
        self.evtchn.as_ref()
    }

    pub(crate) fn notifier(&self) -> Result<Arc<dyn PortNotifier>> {
        Ok(self.evtchn.notifier(self.port)?)
    }

    /// Unbind the port now, keeping the handle (an application may still hold it).
    pub(crate) fn unbind(&mut self) {
        if self.port == 0 {
            return;
        }
        if let Err(e) = self.evtchn.close(self.port) {
            tracing::debug!(port = self.port, error = %e, "unbinding a port");
        }
        // Port 0 is never allocated: it marks the port as gone.
        self.port = 0;
    }
}

impl Drop for OwnedPort {
    fn drop(&mut self) {
        if self.port == 0 {
            return;
        }
        if let Err(e) = self.evtchn.close(self.port) {
            tracing::debug!(port = self.port, error = %e, "closing a port");
        }
    }
}

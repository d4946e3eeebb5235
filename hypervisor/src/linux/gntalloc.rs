//! /dev/xen/gntalloc: allocate pages in this domain and grant them to another one.
//!
//! One ioctl allocates and grants a batch of zeroed pages and returns an mmap offset for
//! the batch; mmap at that offset gives this process the pages. Deallocation ends
//! foreign access when the last local mapping goes away. The driver cannot report that
//! the remote still maps a page: Linux ends access lazily and keeps such pages alive
//! until the remote unmaps them, so [`crate::GrantedPages::end_access`] always succeeds
//! on this platform (see [`crate::conformance::Caps`]).

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use tracing::{debug, warn};

use super::abi::{
    GntallocAllocGref, GntallocDeallocGref, UnmapNotify, GNTALLOC_FLAG_WRITABLE,
    IOCTL_GNTALLOC_ALLOC_GREF, IOCTL_GNTALLOC_DEALLOC_GREF, IOCTL_GNTALLOC_SET_UNMAP_NOTIFY,
    UNMAP_NOTIFY_CLEAR_BYTE, UNMAP_NOTIFY_SEND_EVENT,
};
use super::sys::{self, errno_error, IoctlBuf};
use crate::handoff::{PagesLayout, PagesSource};
use crate::{DomId, Error, GrantRef, GrantedOwner, GrantedPages, Port, Result, PAGE_SIZE};

/// Domain ids from here up are Xen's reserved pseudo-domains (DOMID_SELF, DOMID_IO...),
/// never a grantee.
pub const DOMID_FIRST_RESERVED: DomId = 0x7FF0;

/// An open /dev/xen/gntalloc.
#[derive(Debug)]
pub struct Gntalloc {
    fd: OwnedFd,
}

/// A batch allocated by [`Gntalloc::alloc`]: its mmap offset and one ref per page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GntallocBatch {
    /// The mmap offset of the batch on the gntalloc descriptor.
    pub index: u64,
    /// One grant ref per page, in page order.
    pub refs: Vec<GrantRef>,
}

impl Gntalloc {
    /// Open the device node at `path` (normally `/dev/xen/gntalloc`).
    pub fn open(path: &Path) -> Result<Self> {
        Ok(Gntalloc {
            fd: sys::open_device(path, "xen-gntalloc", 0)?,
        })
    }

    /// Wrap an already open descriptor of the device.
    pub fn from_fd(fd: OwnedFd) -> Self {
        Gntalloc { fd }
    }

    /// Allocate `count` zeroed pages and grant them to `domid`.
    pub fn alloc(&self, domid: DomId, count: usize, writable: bool) -> Result<GntallocBatch> {
        check_batch(count)?;
        if domid >= DOMID_FIRST_RESERVED {
            return Err(Error::Invalid(format!(
                "cannot grant to reserved domain id {domid:#x}"
            )));
        }
        let tail = std::mem::offset_of!(GntallocAllocGref, gref_ids);
        let mut buf = IoctlBuf::new(std::cmp::max(
            std::mem::size_of::<GntallocAllocGref>(),
            tail + 4 * count,
        ));
        buf.write_header(GntallocAllocGref {
            domid,
            flags: if writable { GNTALLOC_FLAG_WRITABLE } else { 0 },
            count: count as u32,
            index: 0,
            gref_ids: [0],
        });
        // SAFETY: `buf` is 8-aligned and holds the header plus `count` u32 slots from
        // `gref_ids` on, which is all the driver reads and writes.
        unsafe {
            sys::ioctl_ptr(
                &self.fd,
                IOCTL_GNTALLOC_ALLOC_GREF,
                buf.as_mut_ptr::<GntallocAllocGref>(),
            )
        }
        .map_err(|e| alloc_error(e, count, domid))?;
        let index = buf.read_header::<GntallocAllocGref>().index;
        let refs = sys::read_u32s(buf.bytes(), tail, count)
            .ok_or_else(|| Error::Protocol("gntalloc reply shorter than the batch".into()))?;
        debug!(domid, count, index, "gntalloc: granted");
        Ok(GntallocBatch { index, refs })
    }

    /// Release the `count` grants allocated at `index`; they are freed once no local
    /// mapping of them remains.
    pub fn dealloc(&self, index: u64, count: usize) -> Result<()> {
        check_batch(count)?;
        let mut arg = GntallocDeallocGref {
            index,
            count: count as u32,
        };
        // SAFETY: `arg` is the exact struct the ioctl number encodes, live for the call.
        unsafe { sys::ioctl_ptr(&self.fd, IOCTL_GNTALLOC_DEALLOC_GREF, &mut arg) }
            .map_err(|e| errno_error(e, "gntalloc: dealloc"))?;
        Ok(())
    }

    /// Ask the driver to clear the byte at mmap offset `byte_index` and/or signal `port`
    /// when this side lets the page go: unmapped, freed, or this process dead (its last
    /// word to the peer that maps the page). `actions` is a
    /// combination of `UNMAP_NOTIFY_CLEAR_BYTE` and `UNMAP_NOTIFY_SEND_EVENT`.
    pub fn set_unmap_notify(&self, byte_index: u64, actions: u32, port: Port) -> Result<()> {
        check_notify_actions(actions)?;
        let mut arg = UnmapNotify {
            index: byte_index,
            action: actions,
            event_channel_port: port,
        };
        // SAFETY: `arg` is the exact struct the ioctl number encodes, live for the call.
        unsafe { sys::ioctl_ptr(&self.fd, IOCTL_GNTALLOC_SET_UNMAP_NOTIFY, &mut arg) }
            .map_err(|e| errno_error(e, "gntalloc: set unmap notify"))?;
        Ok(())
    }

    /// Map a batch into this process, read-write.
    pub fn mmap(&self, batch: &GntallocBatch) -> Result<*mut u8> {
        sys::mmap_shared(&self.fd, batch.refs.len() * PAGE_SIZE, batch.index, true)
            .map_err(|e| errno_error(e, "gntalloc: mmap"))
    }
}

/// Allocate, grant and map `count` pages for `remote` as a [`GrantedPages`].
pub(crate) fn grant_pages(
    dev: &Arc<Gntalloc>,
    remote: DomId,
    count: usize,
    writable: bool,
) -> Result<GrantedPages> {
    let batch = dev.alloc(remote, count, writable)?;
    let ptr = match dev.mmap(&batch) {
        Ok(p) => p,
        Err(e) => {
            if let Err(e2) = dev.dealloc(batch.index, count) {
                warn!(error = %e2, "gntalloc: dealloc after failed mmap");
            }
            return Err(e);
        }
    };
    let len = count * PAGE_SIZE;
    Ok(GrantedPages {
        refs: batch.refs,
        ptr,
        len,
        remote,
        writable,
        owner: Some(Box::new(GntallocOwner {
            dev: Arc::clone(dev),
            index: batch.index,
            count,
            addr: ptr as usize,
            len,
        })),
    })
}

/// Releases one batch: the local mapping and the grants.
struct GntallocOwner {
    dev: Arc<Gntalloc>,
    index: u64,
    count: usize,
    /// The local mapping, kept as an address so the owner is Send.
    addr: usize,
    len: usize,
}

impl GntallocOwner {
    fn release_all(&mut self) -> Result<()> {
        if self.addr != 0 {
            // SAFETY: `addr`/`len` is the mapping made in `grant_pages`; the GrantedPages
            // that exposed it is being consumed or dropped, so nothing uses it after this.
            unsafe { sys::munmap(self.addr as *mut u8, self.len) }
                .map_err(|e| errno_error(e, "gntalloc: munmap"))?;
            self.addr = 0;
        }
        self.dev.dealloc(self.index, self.count)
    }
}

impl GrantedOwner for GntallocOwner {
    fn end_access(&mut self, _refs: &[GrantRef]) -> Result<()> {
        // The driver ends foreign access itself once unmapped locally; a page the remote
        // still maps stays allocated until it unmaps, which gntalloc cannot report.
        self.release_all()
    }

    fn release(&mut self, _refs: &[GrantRef]) {
        if let Err(e) = self.release_all() {
            warn!(error = %e, index = self.index, "gntalloc: release");
        }
    }

    fn export(&self) -> Result<PagesSource> {
        if self.addr == 0 {
            return Err(Error::Closed("the grants were ended".into()));
        }
        // The receiver maps the batch through the same open file at the same offset; the
        // driver keeps the pages while any process maps them.
        Ok(PagesSource {
            fd: crate::handoff::dup(self.dev.fd.as_fd())?,
            layout: PagesLayout::Gntalloc { offset: self.index },
        })
    }
}

fn check_batch(count: usize) -> Result<()> {
    if count == 0 {
        return Err(Error::Invalid("a batch of zero pages".into()));
    }
    if u32::try_from(count).is_err() || count.checked_mul(PAGE_SIZE).is_none() {
        return Err(Error::Invalid(format!(
            "a batch of {count} pages is too large"
        )));
    }
    Ok(())
}

pub(crate) fn check_notify_actions(actions: u32) -> Result<()> {
    if actions & !(UNMAP_NOTIFY_CLEAR_BYTE | UNMAP_NOTIFY_SEND_EVENT) != 0 {
        return Err(Error::Invalid(format!(
            "unknown unmap-notify actions {actions:#x}"
        )));
    }
    Ok(())
}

fn alloc_error(e: std::io::Error, count: usize, domid: DomId) -> Error {
    if e.raw_os_error() == Some(libc::ENOSPC) {
        // The driver caps the grants one process may hold (module parameter `limit`,
        // 1024 by default).
        return Error::Quota(format!(
            "gntalloc: {count} pages for domain {domid}: {e} (raise \
             /sys/module/xen_gntalloc/parameters/limit)"
        ));
    }
    errno_error(
        e,
        &format!("gntalloc: alloc {count} pages for domain {domid}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    fn dev_null() -> Gntalloc {
        Gntalloc::from_fd(File::open("/dev/null").unwrap().into())
    }

    #[test]
    fn empty_and_oversized_batches_are_invalid() {
        let g = dev_null();
        assert!(matches!(g.alloc(1, 0, true), Err(Error::Invalid(_))));
        assert!(matches!(g.alloc(1, 1 << 33, true), Err(Error::Invalid(_))));
        assert!(matches!(g.dealloc(0, 0), Err(Error::Invalid(_))));
    }

    #[test]
    fn reserved_grantee_is_invalid() {
        let g = dev_null();
        assert!(matches!(
            g.alloc(DOMID_FIRST_RESERVED, 1, true),
            Err(Error::Invalid(_))
        ));
        assert!(matches!(g.alloc(0xFFFF, 1, true), Err(Error::Invalid(_))));
    }

    #[test]
    fn unknown_notify_actions_are_invalid() {
        let g = dev_null();
        assert!(matches!(
            g.set_unmap_notify(0, 0x4, 1),
            Err(Error::Invalid(_))
        ));
    }

    #[test]
    fn a_device_without_the_ioctls_reports_unsupported() {
        // /dev/null answers every ioctl with ENOTTY, as a kernel without the driver's
        // ioctl would.
        let g = dev_null();
        assert!(matches!(g.alloc(1, 1, true), Err(Error::Unsupported(_))));
        assert!(matches!(g.dealloc(0, 1), Err(Error::Unsupported(_))));
        assert!(matches!(
            g.set_unmap_notify(0, UNMAP_NOTIFY_SEND_EVENT, 3),
            Err(Error::Unsupported(_))
        ));
    }

    #[test]
    fn quota_error_says_which_limit() {
        match alloc_error(std::io::Error::from_raw_os_error(libc::ENOSPC), 2048, 1) {
            Error::Quota(m) => assert!(m.contains("xen_gntalloc/parameters/limit"), "{m}"),
            other => panic!("unexpected {other:?}"),
        }
    }
}

//! /dev/xen/gntdev: map other domains' grants into this process, and grant-copy.
//!
//! Mapping is two steps: one ioctl reserves an mmap offset for the whole batch of refs,
//! then one mmap at that offset makes the grant-map hypercalls for every page. If any
//! grant is refused the mmap fails and nothing stays mapped; the reservation is then
//! released with the unmap ioctl.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

use tracing::{debug, warn};

use super::abi::{
    GntdevCopyPtr, GntdevGetOffsetForVaddr, GntdevGrantCopy, GntdevGrantCopySegment,
    GntdevGrantRef, GntdevMapGrantRef, GntdevSetMaxGrants, GntdevUnmapGrantRef, UnmapNotify,
    GNTCOPY_DEST_GREF, GNTCOPY_SOURCE_GREF, GNTST_BAD_COPY_ARG, GNTST_BAD_DOMAIN, GNTST_BAD_GNTREF,
    GNTST_BAD_PAGE, GNTST_EAGAIN, GNTST_NO_SPACE, GNTST_OKAY, GNTST_PERMISSION_DENIED,
    IOCTL_GNTDEV_GET_OFFSET_FOR_VADDR, IOCTL_GNTDEV_GRANT_COPY, IOCTL_GNTDEV_MAP_GRANT_REF,
    IOCTL_GNTDEV_SET_MAX_GRANTS, IOCTL_GNTDEV_SET_UNMAP_NOTIFY, IOCTL_GNTDEV_UNMAP_GRANT_REF,
};
use super::gntalloc::check_notify_actions;
use super::sys::{self, errno_error, IoctlBuf};
use crate::{
    CopyPtr, CopySegment, DomId, Error, GrantRef, MappedOwner, MappedPages, Port, Result, PAGE_SIZE,
};

/// An open /dev/xen/gntdev.
#[derive(Debug)]
pub struct Gntdev {
    fd: OwnedFd,
}

impl Gntdev {
    /// Open the device node at `path` (normally `/dev/xen/gntdev`).
    pub fn open(path: &Path) -> Result<Self> {
        Ok(Gntdev {
            fd: sys::open_device(path, "xen-gntdev", 0)?,
        })
    }

    /// Wrap an already open descriptor of the device.
    pub fn from_fd(fd: OwnedFd) -> Self {
        Gntdev { fd }
    }

    /// Reserve an mmap offset for `refs` (the mapping happens at mmap time).
    pub fn map_grant_refs(&self, refs: &[GntdevGrantRef]) -> Result<u64> {
        check_batch(refs.len())?;
        let tail = std::mem::offset_of!(GntdevMapGrantRef, refs);
        let entry = std::mem::size_of::<GntdevGrantRef>();
        let mut buf = IoctlBuf::new(std::cmp::max(
            std::mem::size_of::<GntdevMapGrantRef>(),
            tail + std::mem::size_of_val(refs),
        ));
        buf.write_header(GntdevMapGrantRef {
            count: refs.len() as u32,
            ..Default::default()
        });
        for (slot, r) in buf.bytes_mut()[tail..].chunks_exact_mut(entry).zip(refs) {
            slot[..4].copy_from_slice(&r.domid.to_ne_bytes());
            slot[4..].copy_from_slice(&r.gref.to_ne_bytes());
        }
        // SAFETY: `buf` is 8-aligned and holds the header followed by `count` refs, which
        // is exactly what the driver reads; it writes back only `index`.
        unsafe {
            sys::ioctl_ptr(
                &self.fd,
                IOCTL_GNTDEV_MAP_GRANT_REF,
                buf.as_mut_ptr::<GntdevMapGrantRef>(),
            )
        }
        .map_err(|e| errno_error(e, &format!("gntdev: reserve {} grants", refs.len())))?;
        Ok(buf.read_header::<GntdevMapGrantRef>().index)
    }

    /// Release the reservation of `count` grants at `index` (after munmap, or instead
    /// of mmap).
    pub fn unmap_grant_refs(&self, index: u64, count: usize) -> Result<()> {
        check_batch(count)?;
        let mut arg = GntdevUnmapGrantRef {
            index,
            count: count as u32,
            pad: 0,
        };
        // SAFETY: `arg` is the exact struct the ioctl number encodes, live for the call.
        unsafe { sys::ioctl_ptr(&self.fd, IOCTL_GNTDEV_UNMAP_GRANT_REF, &mut arg) }
            .map_err(|e| errno_error(e, "gntdev: unmap"))?;
        Ok(())
    }

    /// The mmap offset and page count of the gntdev mapping that starts at `vaddr`.
    pub fn offset_for_vaddr(&self, vaddr: *const u8) -> Result<(u64, u32)> {
        let mut arg = GntdevGetOffsetForVaddr {
            vaddr: vaddr as u64,
            ..Default::default()
        };
        // SAFETY: `arg` is the exact struct the ioctl number encodes, live for the call;
        // the driver only looks `vaddr` up, it does not dereference it.
        unsafe { sys::ioctl_ptr(&self.fd, IOCTL_GNTDEV_GET_OFFSET_FOR_VADDR, &mut arg) }
            .map_err(|e| errno_error(e, "gntdev: offset for vaddr"))?;
        Ok((arg.offset, arg.count))
    }

    /// Cap the grants this descriptor may map at once (older kernels; newer ones
    /// answer Unsupported and use the module parameter instead).
    pub fn set_max_grants(&self, count: u32) -> Result<()> {
        let mut arg = GntdevSetMaxGrants { count };
        // SAFETY: `arg` is the exact struct the ioctl number encodes, live for the call.
        unsafe { sys::ioctl_ptr(&self.fd, IOCTL_GNTDEV_SET_MAX_GRANTS, &mut arg) }
            .map_err(|e| errno_error(e, "gntdev: set max grants"))?;
        Ok(())
    }

    /// Clear the byte at mmap offset `byte_index` and/or signal `port` when this side's
    /// mapping goes away (including when this process dies).
    pub fn set_unmap_notify(&self, byte_index: u64, actions: u32, port: Port) -> Result<()> {
        check_notify_actions(actions)?;
        let mut arg = UnmapNotify {
            index: byte_index,
            action: actions,
            event_channel_port: port,
        };
        // SAFETY: `arg` is the exact struct the ioctl number encodes, live for the call.
        unsafe { sys::ioctl_ptr(&self.fd, IOCTL_GNTDEV_SET_UNMAP_NOTIFY, &mut arg) }
            .map_err(|e| errno_error(e, "gntdev: set unmap notify"))?;
        Ok(())
    }

    /// Run a batch of grant-copy segments; each segment's `status` receives its
    /// `GNTST_*` result.
    pub fn grant_copy(&self, segments: &mut [GntdevGrantCopySegment]) -> Result<()> {
        if segments.is_empty() {
            return Ok(());
        }
        let count = libc::c_uint::try_from(segments.len())
            .map_err(|_| Error::Invalid("too many grant-copy segments".into()))?;
        let mut arg = GntdevGrantCopy {
            count,
            segments: segments.as_mut_ptr(),
        };
        // SAFETY: `arg` points at `count` initialised segments owned by the caller and
        // borrowed mutably for the call; the driver writes only their status fields and
        // touches local memory only through the `virt` pointers, which the caller
        // vouched for when building the segments.
        unsafe { sys::ioctl_ptr(&self.fd, IOCTL_GNTDEV_GRANT_COPY, &mut arg) }
            .map_err(|e| errno_error(e, "gntdev: grant copy"))?;
        Ok(())
    }
}

/// Map `refs` of `remote` in one batch as [`MappedPages`].
pub(crate) fn map(
    dev: &Arc<Gntdev>,
    remote: DomId,
    refs: &[GrantRef],
    writable: bool,
) -> Result<MappedPages> {
    let batch: Vec<GntdevGrantRef> = refs
        .iter()
        .map(|&gref| GntdevGrantRef {
            domid: u32::from(remote),
            gref,
        })
        .collect();
    let index = dev.map_grant_refs(&batch)?;
    let len = refs.len() * PAGE_SIZE;
    let ptr = match sys::mmap_shared(&dev.fd, len, index, writable) {
        Ok(p) => p,
        Err(e) => {
            if let Err(e2) = dev.unmap_grant_refs(index, refs.len()) {
                warn!(error = %e2, "gntdev: releasing a failed reservation");
            }
            // The driver folds every refused grant into EINVAL (or EFAULT/EPERM);
            // the hypervisor's per-page status is not passed up.
            return Err(match e.raw_os_error() {
                Some(libc::EINVAL) | Some(libc::EFAULT) | Some(libc::EPERM)
                | Some(libc::EACCES) => Error::Denied(format!(
                    "gntdev: domain {remote} refused mapping {} grant(s){}: {e}",
                    refs.len(),
                    if writable { " writable" } else { "" }
                )),
                _ => errno_error(e, "gntdev: mmap"),
            });
        }
    };
    debug!(
        remote,
        count = refs.len(),
        index,
        writable,
        "gntdev: mapped"
    );
    Ok(MappedPages {
        ptr,
        len,
        remote,
        refs: refs.to_vec(),
        writable,
        owner: Some(Box::new(GntdevOwner {
            dev: Arc::clone(dev),
            index,
            count: refs.len(),
            addr: ptr as usize,
            len,
        })),
    })
}

/// Unmaps one batch.
struct GntdevOwner {
    dev: Arc<Gntdev>,
    index: u64,
    count: usize,
    /// The local mapping, kept as an address so the owner is Send.
    addr: usize,
    len: usize,
}

impl MappedOwner for GntdevOwner {
    fn unmap(&mut self) {
        // SAFETY: `addr`/`len` is the mapping made in `map`; its MappedPages is being
        // dropped, so nothing refers to it any more.
        if let Err(e) = unsafe { sys::munmap(self.addr as *mut u8, self.len) } {
            warn!(error = %e, "gntdev: munmap");
        }
        if let Err(e) = self.dev.unmap_grant_refs(self.index, self.count) {
            warn!(error = %e, "gntdev: unmap");
        }
    }
}

/// Grant-copy `segments` through the device: segments that cannot be expressed are
/// reported as failed without reaching the kernel; the rest go in one ioctl.
pub(crate) fn copy(dev: &Gntdev, segments: &[CopySegment]) -> Result<Vec<Result<()>>> {
    let mut results: Vec<Result<()>> = Vec::with_capacity(segments.len());
    let mut kernel: Vec<GntdevGrantCopySegment> = Vec::new();
    let mut slots: Vec<usize> = Vec::new();
    for (i, seg) in segments.iter().enumerate() {
        match to_kernel_segment(seg) {
            Ok(k) => {
                results.push(Ok(()));
                kernel.push(k);
                slots.push(i);
            }
            Err(e) => results.push(Err(e)),
        }
    }
    dev.grant_copy(&mut kernel)?;
    for (k, &i) in kernel.iter().zip(&slots) {
        if let Some(r) = results.get_mut(i) {
            *r = status_result(k.status);
        }
    }
    Ok(results)
}

/// Validate one segment and lay it out as the driver wants it.
pub(crate) fn to_kernel_segment(seg: &CopySegment) -> Result<GntdevGrantCopySegment> {
    let len = usize::from(seg.len);
    if len == 0 || len > PAGE_SIZE {
        return Err(Error::Invalid(format!("grant-copy length {len}")));
    }
    let mut flags = 0;
    let mut side = |p: &CopyPtr, flag: u16| -> Result<GntdevCopyPtr> {
        match *p {
            CopyPtr::Foreign {
                domid,
                gref,
                offset,
            } => {
                if usize::from(offset) + len > PAGE_SIZE {
                    return Err(Error::Invalid(format!(
                        "grant-copy of {len} bytes at offset {offset} crosses a page"
                    )));
                }
                flags |= flag;
                Ok(GntdevCopyPtr::foreign(domid, gref, offset))
            }
            CopyPtr::Local(ptr) => {
                if ptr.is_null() {
                    return Err(Error::Invalid("grant-copy from/to a null pointer".into()));
                }
                Ok(GntdevCopyPtr::local(ptr))
            }
        }
    };
    let source = side(&seg.source, GNTCOPY_SOURCE_GREF)?;
    let dest = side(&seg.dest, GNTCOPY_DEST_GREF)?;
    Ok(GntdevGrantCopySegment {
        source,
        dest,
        len: seg.len,
        flags,
        status: GNTST_OKAY,
    })
}

/// A `GNTST_*` status as a result.
pub fn status_result(status: i16) -> Result<()> {
    match status {
        GNTST_OKAY => Ok(()),
        GNTST_BAD_DOMAIN => Err(Error::NotFound("grant status: unrecognised domain".into())),
        GNTST_BAD_GNTREF => Err(Error::NotFound(
            "grant status: invalid grant reference".into(),
        )),
        GNTST_PERMISSION_DENIED => Err(Error::Denied("grant status: permission denied".into())),
        GNTST_BAD_PAGE => Err(Error::Invalid("grant status: bad page".into())),
        GNTST_BAD_COPY_ARG => Err(Error::Invalid("grant status: copy crosses a page".into())),
        GNTST_EAGAIN => Err(Error::Again),
        GNTST_NO_SPACE => Err(Error::Quota("grant status: out of space".into())),
        other => Err(Error::Invalid(format!("grant status {other}"))),
    }
}

fn check_batch(count: usize) -> Result<()> {
    if count == 0 {
        return Err(Error::Invalid("a batch of zero grants".into()));
    }
    if u32::try_from(count).is_err() || count.checked_mul(PAGE_SIZE).is_none() {
        return Err(Error::Invalid(format!(
            "a batch of {count} grants is too large"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    fn dev_null() -> Gntdev {
        Gntdev::from_fd(File::open("/dev/null").unwrap().into())
    }

    #[test]
    fn empty_batches_are_invalid() {
        let d = dev_null();
        assert!(matches!(d.map_grant_refs(&[]), Err(Error::Invalid(_))));
        assert!(matches!(d.unmap_grant_refs(0, 0), Err(Error::Invalid(_))));
        let d = Arc::new(d);
        assert!(matches!(map(&d, 1, &[], true), Err(Error::Invalid(_))));
    }

    #[test]
    fn a_device_without_the_ioctls_reports_unsupported() {
        let d = dev_null();
        let r = [GntdevGrantRef { domid: 1, gref: 8 }];
        assert!(matches!(d.map_grant_refs(&r), Err(Error::Unsupported(_))));
        assert!(matches!(d.set_max_grants(16), Err(Error::Unsupported(_))));
        assert!(matches!(
            d.offset_for_vaddr(std::ptr::null()),
            Err(Error::Unsupported(_))
        ));
        let d = Arc::new(d);
        assert!(matches!(
            map(&d, 1, &[8], false),
            Err(Error::Unsupported(_))
        ));
    }

    #[test]
    fn copy_segments_are_validated_one_by_one() {
        let mut local = [0u8; 64];
        let lp = local.as_mut_ptr();
        let foreign = |offset| CopyPtr::Foreign {
            domid: 3,
            gref: 9,
            offset,
        };
        let ok = CopySegment {
            source: foreign(100),
            dest: CopyPtr::Local(lp),
            len: 64,
        };
        let k = to_kernel_segment(&ok).unwrap();
        assert_eq!(k.flags, GNTCOPY_SOURCE_GREF);
        assert_eq!(k.len, 64);
        // SAFETY: `source` was built through its foreign member, `dest` through `virt`.
        let (src, dst) = unsafe { (k.source.foreign, k.dest.virt) };
        assert_eq!((src.domid, src.gref, src.offset), (3, 9, 100));
        assert_eq!(dst, lp.cast());

        let both = CopySegment {
            source: foreign(0),
            dest: foreign(4001),
            len: 96,
        };
        let err = to_kernel_segment(&both).unwrap_err();
        assert!(err.to_string().contains("crosses"), "{err}");
        let flush = CopySegment {
            dest: foreign(4000),
            ..both
        };
        assert_eq!(
            to_kernel_segment(&flush).unwrap().flags,
            GNTCOPY_SOURCE_GREF | GNTCOPY_DEST_GREF
        );
        let zero = CopySegment { len: 0, ..ok };
        assert!(matches!(to_kernel_segment(&zero), Err(Error::Invalid(_))));
        let big = CopySegment {
            source: CopyPtr::Local(lp),
            dest: CopyPtr::Local(lp),
            len: (PAGE_SIZE + 1) as u16,
        };
        assert!(matches!(to_kernel_segment(&big), Err(Error::Invalid(_))));
        let null = CopySegment {
            dest: CopyPtr::Local(std::ptr::null_mut()),
            ..ok
        };
        assert!(matches!(to_kernel_segment(&null), Err(Error::Invalid(_))));
        let to_foreign = CopySegment {
            source: CopyPtr::Local(lp),
            dest: foreign(4032),
            len: 64,
        };
        assert_eq!(
            to_kernel_segment(&to_foreign).unwrap().flags,
            GNTCOPY_DEST_GREF
        );
    }

    #[test]
    fn invalid_segments_fail_alone_and_the_rest_reach_the_device() {
        let d = dev_null();
        let mut local = [0u8; 8];
        let lp = local.as_mut_ptr();
        let bad = CopySegment {
            source: CopyPtr::Local(lp),
            dest: CopyPtr::Local(lp),
            len: 0,
        };
        // Only invalid segments: the device is not called and each reports its error.
        let r = copy(&d, &[bad, bad]).unwrap();
        assert_eq!(r.len(), 2);
        assert!(r.iter().all(|x| matches!(x, Err(Error::Invalid(_)))));
        // A valid one makes the ioctl happen, which /dev/null refuses as a whole.
        let good = CopySegment { len: 8, ..bad };
        assert!(matches!(copy(&d, &[bad, good]), Err(Error::Unsupported(_))));
    }

    #[test]
    fn grant_status_codes_map_to_errors() {
        assert!(status_result(GNTST_OKAY).is_ok());
        assert!(matches!(
            status_result(GNTST_BAD_GNTREF),
            Err(Error::NotFound(_))
        ));
        assert!(matches!(
            status_result(GNTST_BAD_DOMAIN),
            Err(Error::NotFound(_))
        ));
        assert!(matches!(
            status_result(GNTST_PERMISSION_DENIED),
            Err(Error::Denied(_))
        ));
        assert!(matches!(status_result(GNTST_EAGAIN), Err(Error::Again)));
        assert!(matches!(status_result(-99), Err(Error::Invalid(_))));
    }
}

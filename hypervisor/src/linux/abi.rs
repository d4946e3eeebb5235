//! The userspace ABI of Linux's Xen devices: ioctl numbers and argument structs of
//! /dev/xen/gntalloc, /dev/xen/gntdev and /dev/xen/evtchn, as the uapi headers
//! `xen/gntalloc.h`, `xen/gntdev.h` and `xen/evtchn.h` define them, plus the grant
//! status codes of Xen's public `grant_table.h`.
//!
//! Every struct is `#[repr(C)]` and its size, alignment and field offsets are pinned
//! by tests against a C program compiled with the real headers
//! (`hypervisor/tests/linux_abi.rs`). Structs whose C definition ends in a one-element
//! array are variable-length: the kernel reads `count` elements from that offset.

use std::ffi::c_void;
use std::mem::size_of;

/// `_IOC_NONE`: every Xen device ioctl encodes "no direction" (the drivers copy in and
/// out themselves) together with the argument size.
const IOC_NONE: u64 = 0;
const IOC_NRSHIFT: u64 = 0;
const IOC_TYPESHIFT: u64 = 8;
const IOC_SIZESHIFT: u64 = 16;
const IOC_DIRSHIFT: u64 = 30;

/// `_IOC(_IOC_NONE, ty, nr, size)` as the generic Linux ioctl encoding computes it.
pub const fn ioc_none(ty: u8, nr: u8, size: usize) -> libc::Ioctl {
    ((IOC_NONE << IOC_DIRSHIFT)
        | ((ty as u64) << IOC_TYPESHIFT)
        | ((nr as u64) << IOC_NRSHIFT)
        | ((size as u64) << IOC_SIZESHIFT)) as libc::Ioctl
}

// ---------------------------------------------------------------------------------
// gntalloc
// ---------------------------------------------------------------------------------

/// Argument of `IOCTL_GNTALLOC_ALLOC_GREF`: allocate `count` pages, grant them to
/// `domid`, and learn the mmap offset (`index`) and one grant ref per page.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct GntallocAllocGref {
    /// The domain the pages are granted to.
    pub domid: u16,
    /// `GNTALLOC_FLAG_*` bits.
    pub flags: u16,
    /// Pages to allocate.
    pub count: u32,
    /// The mmap offset of the new batch, written back by the kernel.
    pub index: u64,
    /// First of `count` refs written back by the kernel.
    pub gref_ids: [u32; 1],
}

/// `GNTALLOC_FLAG_WRITABLE`: the remote may map the pages writable.
pub const GNTALLOC_FLAG_WRITABLE: u16 = 1;

/// Argument of `IOCTL_GNTALLOC_DEALLOC_GREF`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct GntallocDeallocGref {
    /// The mmap offset of the batch, as `IOCTL_GNTALLOC_ALLOC_GREF` returned it.
    pub index: u64,
    /// Pages of the batch to release.
    pub count: u32,
}

/// Argument of `IOCTL_GNTALLOC_SET_UNMAP_NOTIFY` and `IOCTL_GNTDEV_SET_UNMAP_NOTIFY`
/// (the two headers define the same layout under two names).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct UnmapNotify {
    /// mmap offset of the byte `UNMAP_NOTIFY_CLEAR_BYTE` clears; its page is the one watched.
    pub index: u64,
    /// `UNMAP_NOTIFY_*` bits.
    pub action: u32,
    /// The port to signal (`UNMAP_NOTIFY_SEND_EVENT`).
    pub event_channel_port: u32,
}

/// `UNMAP_NOTIFY_CLEAR_BYTE`: zero the byte at `index` when this side lets the page go
/// (unmaps, frees or dies), so the other side sees it.
pub const UNMAP_NOTIFY_CLEAR_BYTE: u32 = 0x1;
/// `UNMAP_NOTIFY_SEND_EVENT`: signal `event_channel_port` when this side lets the page go
/// (unmaps, frees or dies).
pub const UNMAP_NOTIFY_SEND_EVENT: u32 = 0x2;

/// gntalloc ioctl: allocate and grant pages ([`GntallocAllocGref`]).
pub const IOCTL_GNTALLOC_ALLOC_GREF: libc::Ioctl =
    ioc_none(b'G', 5, size_of::<GntallocAllocGref>());
/// gntalloc ioctl: release a batch of pages and their grants ([`GntallocDeallocGref`]).
pub const IOCTL_GNTALLOC_DEALLOC_GREF: libc::Ioctl =
    ioc_none(b'G', 6, size_of::<GntallocDeallocGref>());
/// gntalloc ioctl: have the driver clear a byte and/or signal a port when this side
/// frees the pages, so the remote learns it ([`UnmapNotify`]).
pub const IOCTL_GNTALLOC_SET_UNMAP_NOTIFY: libc::Ioctl =
    ioc_none(b'G', 7, size_of::<UnmapNotify>());

// ---------------------------------------------------------------------------------
// gntdev
// ---------------------------------------------------------------------------------

/// One foreign grant to map: `struct ioctl_gntdev_grant_ref`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GntdevGrantRef {
    /// The granting domain.
    pub domid: u32,
    /// The grant ref in that domain's table.
    pub gref: u32,
}

/// Argument of `IOCTL_GNTDEV_MAP_GRANT_REF`: reserve an mmap offset (`index`) for
/// `count` foreign grants; the mapping itself happens at mmap time.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct GntdevMapGrantRef {
    /// Grants to map.
    pub count: u32,
    /// Padding of the C struct.
    pub pad: u32,
    /// The mmap offset reserved for the grants, written back by the kernel.
    pub index: u64,
    /// First of `count` refs supplied by the caller.
    pub refs: [GntdevGrantRef; 1],
}

/// Argument of `IOCTL_GNTDEV_UNMAP_GRANT_REF`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct GntdevUnmapGrantRef {
    /// The mmap offset `IOCTL_GNTDEV_MAP_GRANT_REF` returned.
    pub index: u64,
    /// Grants to release from that offset.
    pub count: u32,
    /// Padding of the C struct.
    pub pad: u32,
}

/// Argument of `IOCTL_GNTDEV_GET_OFFSET_FOR_VADDR`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct GntdevGetOffsetForVaddr {
    /// An address inside a gntdev mapping of this process.
    pub vaddr: u64,
    /// The mapping's mmap offset, written back by the kernel.
    pub offset: u64,
    /// Grants in the mapping, written back by the kernel.
    pub count: u32,
    /// Padding of the C struct.
    pub pad: u32,
}

/// Argument of `IOCTL_GNTDEV_SET_MAX_GRANTS`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct GntdevSetMaxGrants {
    /// Most grants this gntdev open may map at once.
    pub count: u32,
}

/// The foreign side of a grant-copy segment: the `foreign` member of the union in
/// `struct gntdev_grant_copy_segment`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GntdevCopyForeign {
    /// The grant ref in the granting domain's table.
    pub gref: u32,
    /// Byte offset into the granted page.
    pub offset: u16,
    /// The granting domain.
    pub domid: u16,
}

/// One side of a grant-copy segment: a local virtual address or a foreign grant,
/// chosen by `GNTCOPY_source_gref` / `GNTCOPY_dest_gref` in the segment's flags.
#[repr(C)]
#[derive(Clone, Copy)]
pub union GntdevCopyPtr {
    /// A local address (the side's `GNTCOPY_*_gref` flag clear).
    pub virt: *mut c_void,
    /// A foreign grant (the side's `GNTCOPY_*_gref` flag set).
    pub foreign: GntdevCopyForeign,
}

impl GntdevCopyPtr {
    /// A local address of the calling process.
    pub fn local(virt: *mut u8) -> Self {
        GntdevCopyPtr { virt: virt.cast() }
    }
    /// A page granted by `domid` as `gref`, starting `offset` bytes in.
    pub fn foreign(domid: u16, gref: u32, offset: u16) -> Self {
        GntdevCopyPtr {
            foreign: GntdevCopyForeign {
                gref,
                offset,
                domid,
            },
        }
    }
}

impl std::fmt::Debug for GntdevCopyPtr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Which member is live depends on the segment's flags, which this value does
        // not know; both views of the same 8 bytes are valid plain data.
        // SAFETY: every bit pattern of the union's storage is a valid pointer value and
        // a valid `GntdevCopyForeign`; the union is fully initialised by its constructors.
        let virt = unsafe { self.virt };
        write!(f, "GntdevCopyPtr({virt:p})")
    }
}

/// `struct gntdev_grant_copy_segment`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GntdevGrantCopySegment {
    /// Where the bytes are read from.
    pub source: GntdevCopyPtr,
    /// Where the bytes are written to.
    pub dest: GntdevCopyPtr,
    /// Bytes to copy; neither side may cross a page boundary.
    pub len: u16,
    /// [`GNTCOPY_SOURCE_GREF`] and [`GNTCOPY_DEST_GREF`] bits: which sides are foreign.
    pub flags: u16,
    /// A `GNTST_*` code written back by the kernel.
    pub status: i16,
}

/// Argument of `IOCTL_GNTDEV_GRANT_COPY`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GntdevGrantCopy {
    /// Segments in the array.
    pub count: libc::c_uint,
    /// The segments; the kernel writes each one's `status` back.
    pub segments: *mut GntdevGrantCopySegment,
}

/// `GNTCOPY_source_gref`: the segment's source is a foreign grant.
pub const GNTCOPY_SOURCE_GREF: u16 = 1 << 0;
/// `GNTCOPY_dest_gref`: the segment's destination is a foreign grant.
pub const GNTCOPY_DEST_GREF: u16 = 1 << 1;

/// gntdev ioctl: reserve an mmap offset for foreign grants ([`GntdevMapGrantRef`]).
pub const IOCTL_GNTDEV_MAP_GRANT_REF: libc::Ioctl =
    ioc_none(b'G', 0, size_of::<GntdevMapGrantRef>());
/// gntdev ioctl: release grants reserved by `IOCTL_GNTDEV_MAP_GRANT_REF`
/// ([`GntdevUnmapGrantRef`]).
pub const IOCTL_GNTDEV_UNMAP_GRANT_REF: libc::Ioctl =
    ioc_none(b'G', 1, size_of::<GntdevUnmapGrantRef>());
/// gntdev ioctl: find the mapping an address belongs to ([`GntdevGetOffsetForVaddr`]).
pub const IOCTL_GNTDEV_GET_OFFSET_FOR_VADDR: libc::Ioctl =
    ioc_none(b'G', 2, size_of::<GntdevGetOffsetForVaddr>());
/// gntdev ioctl: limit how many grants the open may map ([`GntdevSetMaxGrants`]); older
/// kernels only.
pub const IOCTL_GNTDEV_SET_MAX_GRANTS: libc::Ioctl =
    ioc_none(b'G', 3, size_of::<GntdevSetMaxGrants>());
/// gntdev ioctl: have the driver clear a byte and/or signal a port when this side's
/// mapping goes away, so the granter learns it ([`UnmapNotify`]).
pub const IOCTL_GNTDEV_SET_UNMAP_NOTIFY: libc::Ioctl = ioc_none(b'G', 7, size_of::<UnmapNotify>());
/// gntdev ioctl: grant copy ([`GntdevGrantCopy`]).
pub const IOCTL_GNTDEV_GRANT_COPY: libc::Ioctl = ioc_none(b'G', 8, size_of::<GntdevGrantCopy>());

// ---------------------------------------------------------------------------------
// grant status codes (Xen public/grant_table.h)
// ---------------------------------------------------------------------------------

/// `GNTST_okay`: the operation succeeded.
pub const GNTST_OKAY: i16 = 0;
/// `GNTST_general_error`: a failure with no more specific code.
pub const GNTST_GENERAL_ERROR: i16 = -1;
/// `GNTST_bad_domain`: no such domain.
pub const GNTST_BAD_DOMAIN: i16 = -2;
/// `GNTST_bad_gntref`: the grant ref is out of range or not granted to the caller.
pub const GNTST_BAD_GNTREF: i16 = -3;
/// `GNTST_bad_handle`: no such mapping handle.
pub const GNTST_BAD_HANDLE: i16 = -4;
/// `GNTST_bad_virt_addr`: the address cannot take the mapping.
pub const GNTST_BAD_VIRT_ADDR: i16 = -5;
/// `GNTST_bad_dev_addr`: the device address cannot be unmapped.
pub const GNTST_BAD_DEV_ADDR: i16 = -6;
/// `GNTST_no_device_space`: the IOMMU has no room left.
pub const GNTST_NO_DEVICE_SPACE: i16 = -7;
/// `GNTST_permission_denied`: the caller may not do this (e.g. write a read-only grant).
pub const GNTST_PERMISSION_DENIED: i16 = -8;
/// `GNTST_bad_page`: the page is not valid for the operation.
pub const GNTST_BAD_PAGE: i16 = -9;
/// `GNTST_bad_copy_arg`: a copy segment crosses a page boundary.
pub const GNTST_BAD_COPY_ARG: i16 = -10;
/// `GNTST_address_too_big`: a page address beyond what the operation can use.
pub const GNTST_ADDRESS_TOO_BIG: i16 = -11;
/// `GNTST_eagain`: not done this time; retry.
pub const GNTST_EAGAIN: i16 = -12;
/// `GNTST_no_space`: out of tracking space (handles and the like).
pub const GNTST_NO_SPACE: i16 = -13;

// ---------------------------------------------------------------------------------
// evtchn
// ---------------------------------------------------------------------------------

/// Argument of `IOCTL_EVTCHN_BIND_INTERDOMAIN`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct EvtchnBindInterdomain {
    /// The domain that allocated the port.
    pub remote_domain: libc::c_uint,
    /// The port, in that domain's numbering.
    pub remote_port: libc::c_uint,
}

/// Argument of `IOCTL_EVTCHN_BIND_UNBOUND_PORT`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct EvtchnBindUnboundPort {
    /// The domain that may bind to the new port.
    pub remote_domain: libc::c_uint,
}

/// Argument of `IOCTL_EVTCHN_UNBIND`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct EvtchnUnbind {
    /// The local port to close.
    pub port: libc::c_uint,
}

/// Argument of `IOCTL_EVTCHN_NOTIFY`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct EvtchnNotify {
    /// The local port to signal.
    pub port: libc::c_uint,
}

/// Argument of `IOCTL_EVTCHN_RESTRICT_DOMID` (`domid_t` is 16 bits).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct EvtchnRestrictDomid {
    /// The only domain this evtchn open may bind ports with from now on (irreversible).
    pub domid: u16,
}

/// evtchn ioctl: bind to another domain's unbound port ([`EvtchnBindInterdomain`]);
/// returns the local port.
pub const IOCTL_EVTCHN_BIND_INTERDOMAIN: libc::Ioctl =
    ioc_none(b'E', 1, size_of::<EvtchnBindInterdomain>());
/// evtchn ioctl: allocate a port another domain may bind to ([`EvtchnBindUnboundPort`]);
/// returns the local port.
pub const IOCTL_EVTCHN_BIND_UNBOUND_PORT: libc::Ioctl =
    ioc_none(b'E', 2, size_of::<EvtchnBindUnboundPort>());
/// evtchn ioctl: unbind and close a port ([`EvtchnUnbind`]).
pub const IOCTL_EVTCHN_UNBIND: libc::Ioctl = ioc_none(b'E', 3, size_of::<EvtchnUnbind>());
/// evtchn ioctl: signal a port's other end ([`EvtchnNotify`]).
pub const IOCTL_EVTCHN_NOTIFY: libc::Ioctl = ioc_none(b'E', 4, size_of::<EvtchnNotify>());
/// evtchn ioctl: empty this open's ring of pending ports and clear its overflow flag
/// (no argument).
pub const IOCTL_EVTCHN_RESET: libc::Ioctl = ioc_none(b'E', 5, 0);
/// evtchn ioctl: restrict this open to ports with one domain ([`EvtchnRestrictDomid`]).
pub const IOCTL_EVTCHN_RESTRICT_DOMID: libc::Ioctl =
    ioc_none(b'E', 6, size_of::<EvtchnRestrictDomid>());

/// One layout fact of this module, for comparison against the C headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbiFact {
    /// `sizeof(struct x)`, `offsetof(struct x, f)`, an ioctl or constant name.
    pub name: &'static str,
    /// The value the Rust definition gives, to compare with the C one.
    pub value: i128,
}

macro_rules! size_fact {
    ($c:literal, $t:ty) => {
        AbiFact {
            name: concat!("sizeof(", $c, ")"),
            value: std::mem::size_of::<$t>() as i128,
        }
    };
}
macro_rules! align_fact {
    ($c:literal, $t:ty) => {
        AbiFact {
            name: concat!("alignof(", $c, ")"),
            value: std::mem::align_of::<$t>() as i128,
        }
    };
}
macro_rules! offset_fact {
    ($c:literal, $cf:literal, $t:ty, $f:ident) => {
        AbiFact {
            name: concat!("offsetof(", $c, ",", $cf, ")"),
            value: std::mem::offset_of!($t, $f) as i128,
        }
    };
}
macro_rules! const_fact {
    ($c:literal, $v:expr) => {
        AbiFact {
            name: $c,
            value: $v as i128,
        }
    };
}

/// Every size, alignment, offset, ioctl number and constant this module defines, named
/// as the C headers name them.
pub fn abi_facts() -> Vec<AbiFact> {
    vec![
        size_fact!("struct ioctl_gntalloc_alloc_gref", GntallocAllocGref),
        align_fact!("struct ioctl_gntalloc_alloc_gref", GntallocAllocGref),
        offset_fact!(
            "struct ioctl_gntalloc_alloc_gref",
            "domid",
            GntallocAllocGref,
            domid
        ),
        offset_fact!(
            "struct ioctl_gntalloc_alloc_gref",
            "flags",
            GntallocAllocGref,
            flags
        ),
        offset_fact!(
            "struct ioctl_gntalloc_alloc_gref",
            "count",
            GntallocAllocGref,
            count
        ),
        offset_fact!(
            "struct ioctl_gntalloc_alloc_gref",
            "index",
            GntallocAllocGref,
            index
        ),
        offset_fact!(
            "struct ioctl_gntalloc_alloc_gref",
            "gref_ids",
            GntallocAllocGref,
            gref_ids
        ),
        size_fact!("struct ioctl_gntalloc_dealloc_gref", GntallocDeallocGref),
        align_fact!("struct ioctl_gntalloc_dealloc_gref", GntallocDeallocGref),
        offset_fact!(
            "struct ioctl_gntalloc_dealloc_gref",
            "index",
            GntallocDeallocGref,
            index
        ),
        offset_fact!(
            "struct ioctl_gntalloc_dealloc_gref",
            "count",
            GntallocDeallocGref,
            count
        ),
        size_fact!("struct ioctl_gntalloc_unmap_notify", UnmapNotify),
        align_fact!("struct ioctl_gntalloc_unmap_notify", UnmapNotify),
        offset_fact!(
            "struct ioctl_gntalloc_unmap_notify",
            "index",
            UnmapNotify,
            index
        ),
        offset_fact!(
            "struct ioctl_gntalloc_unmap_notify",
            "action",
            UnmapNotify,
            action
        ),
        offset_fact!(
            "struct ioctl_gntalloc_unmap_notify",
            "event_channel_port",
            UnmapNotify,
            event_channel_port
        ),
        size_fact!("struct ioctl_gntdev_unmap_notify", UnmapNotify),
        offset_fact!(
            "struct ioctl_gntdev_unmap_notify",
            "index",
            UnmapNotify,
            index
        ),
        offset_fact!(
            "struct ioctl_gntdev_unmap_notify",
            "action",
            UnmapNotify,
            action
        ),
        offset_fact!(
            "struct ioctl_gntdev_unmap_notify",
            "event_channel_port",
            UnmapNotify,
            event_channel_port
        ),
        size_fact!("struct ioctl_gntdev_grant_ref", GntdevGrantRef),
        align_fact!("struct ioctl_gntdev_grant_ref", GntdevGrantRef),
        offset_fact!(
            "struct ioctl_gntdev_grant_ref",
            "domid",
            GntdevGrantRef,
            domid
        ),
        offset_fact!("struct ioctl_gntdev_grant_ref", "ref", GntdevGrantRef, gref),
        size_fact!("struct ioctl_gntdev_map_grant_ref", GntdevMapGrantRef),
        align_fact!("struct ioctl_gntdev_map_grant_ref", GntdevMapGrantRef),
        offset_fact!(
            "struct ioctl_gntdev_map_grant_ref",
            "count",
            GntdevMapGrantRef,
            count
        ),
        offset_fact!(
            "struct ioctl_gntdev_map_grant_ref",
            "pad",
            GntdevMapGrantRef,
            pad
        ),
        offset_fact!(
            "struct ioctl_gntdev_map_grant_ref",
            "index",
            GntdevMapGrantRef,
            index
        ),
        offset_fact!(
            "struct ioctl_gntdev_map_grant_ref",
            "refs",
            GntdevMapGrantRef,
            refs
        ),
        size_fact!("struct ioctl_gntdev_unmap_grant_ref", GntdevUnmapGrantRef),
        align_fact!("struct ioctl_gntdev_unmap_grant_ref", GntdevUnmapGrantRef),
        offset_fact!(
            "struct ioctl_gntdev_unmap_grant_ref",
            "index",
            GntdevUnmapGrantRef,
            index
        ),
        offset_fact!(
            "struct ioctl_gntdev_unmap_grant_ref",
            "count",
            GntdevUnmapGrantRef,
            count
        ),
        size_fact!(
            "struct ioctl_gntdev_get_offset_for_vaddr",
            GntdevGetOffsetForVaddr
        ),
        align_fact!(
            "struct ioctl_gntdev_get_offset_for_vaddr",
            GntdevGetOffsetForVaddr
        ),
        offset_fact!(
            "struct ioctl_gntdev_get_offset_for_vaddr",
            "vaddr",
            GntdevGetOffsetForVaddr,
            vaddr
        ),
        offset_fact!(
            "struct ioctl_gntdev_get_offset_for_vaddr",
            "offset",
            GntdevGetOffsetForVaddr,
            offset
        ),
        offset_fact!(
            "struct ioctl_gntdev_get_offset_for_vaddr",
            "count",
            GntdevGetOffsetForVaddr,
            count
        ),
        size_fact!("struct ioctl_gntdev_set_max_grants", GntdevSetMaxGrants),
        offset_fact!(
            "struct ioctl_gntdev_set_max_grants",
            "count",
            GntdevSetMaxGrants,
            count
        ),
        size_fact!("struct gntdev_grant_copy_segment", GntdevGrantCopySegment),
        align_fact!("struct gntdev_grant_copy_segment", GntdevGrantCopySegment),
        offset_fact!(
            "struct gntdev_grant_copy_segment",
            "source",
            GntdevGrantCopySegment,
            source
        ),
        offset_fact!(
            "struct gntdev_grant_copy_segment",
            "dest",
            GntdevGrantCopySegment,
            dest
        ),
        offset_fact!(
            "struct gntdev_grant_copy_segment",
            "len",
            GntdevGrantCopySegment,
            len
        ),
        offset_fact!(
            "struct gntdev_grant_copy_segment",
            "flags",
            GntdevGrantCopySegment,
            flags
        ),
        offset_fact!(
            "struct gntdev_grant_copy_segment",
            "status",
            GntdevGrantCopySegment,
            status
        ),
        AbiFact {
            name: "offsetof(struct gntdev_grant_copy_segment,source.foreign.ref)",
            value: (std::mem::offset_of!(GntdevGrantCopySegment, source)
                + std::mem::offset_of!(GntdevCopyForeign, gref)) as i128,
        },
        AbiFact {
            name: "offsetof(struct gntdev_grant_copy_segment,source.foreign.offset)",
            value: (std::mem::offset_of!(GntdevGrantCopySegment, source)
                + std::mem::offset_of!(GntdevCopyForeign, offset)) as i128,
        },
        AbiFact {
            name: "offsetof(struct gntdev_grant_copy_segment,source.foreign.domid)",
            value: (std::mem::offset_of!(GntdevGrantCopySegment, source)
                + std::mem::offset_of!(GntdevCopyForeign, domid)) as i128,
        },
        size_fact!("struct ioctl_gntdev_grant_copy", GntdevGrantCopy),
        align_fact!("struct ioctl_gntdev_grant_copy", GntdevGrantCopy),
        offset_fact!(
            "struct ioctl_gntdev_grant_copy",
            "count",
            GntdevGrantCopy,
            count
        ),
        offset_fact!(
            "struct ioctl_gntdev_grant_copy",
            "segments",
            GntdevGrantCopy,
            segments
        ),
        size_fact!(
            "struct ioctl_evtchn_bind_interdomain",
            EvtchnBindInterdomain
        ),
        offset_fact!(
            "struct ioctl_evtchn_bind_interdomain",
            "remote_domain",
            EvtchnBindInterdomain,
            remote_domain
        ),
        offset_fact!(
            "struct ioctl_evtchn_bind_interdomain",
            "remote_port",
            EvtchnBindInterdomain,
            remote_port
        ),
        size_fact!(
            "struct ioctl_evtchn_bind_unbound_port",
            EvtchnBindUnboundPort
        ),
        size_fact!("struct ioctl_evtchn_unbind", EvtchnUnbind),
        size_fact!("struct ioctl_evtchn_notify", EvtchnNotify),
        size_fact!("struct ioctl_evtchn_restrict_domid", EvtchnRestrictDomid),
        const_fact!("IOCTL_GNTALLOC_ALLOC_GREF", IOCTL_GNTALLOC_ALLOC_GREF),
        const_fact!("IOCTL_GNTALLOC_DEALLOC_GREF", IOCTL_GNTALLOC_DEALLOC_GREF),
        const_fact!(
            "IOCTL_GNTALLOC_SET_UNMAP_NOTIFY",
            IOCTL_GNTALLOC_SET_UNMAP_NOTIFY
        ),
        const_fact!("IOCTL_GNTDEV_MAP_GRANT_REF", IOCTL_GNTDEV_MAP_GRANT_REF),
        const_fact!("IOCTL_GNTDEV_UNMAP_GRANT_REF", IOCTL_GNTDEV_UNMAP_GRANT_REF),
        const_fact!(
            "IOCTL_GNTDEV_GET_OFFSET_FOR_VADDR",
            IOCTL_GNTDEV_GET_OFFSET_FOR_VADDR
        ),
        const_fact!("IOCTL_GNTDEV_SET_MAX_GRANTS", IOCTL_GNTDEV_SET_MAX_GRANTS),
        const_fact!(
            "IOCTL_GNTDEV_SET_UNMAP_NOTIFY",
            IOCTL_GNTDEV_SET_UNMAP_NOTIFY
        ),
        const_fact!("IOCTL_GNTDEV_GRANT_COPY", IOCTL_GNTDEV_GRANT_COPY),
        const_fact!(
            "IOCTL_EVTCHN_BIND_INTERDOMAIN",
            IOCTL_EVTCHN_BIND_INTERDOMAIN
        ),
        const_fact!(
            "IOCTL_EVTCHN_BIND_UNBOUND_PORT",
            IOCTL_EVTCHN_BIND_UNBOUND_PORT
        ),
        const_fact!("IOCTL_EVTCHN_UNBIND", IOCTL_EVTCHN_UNBIND),
        const_fact!("IOCTL_EVTCHN_NOTIFY", IOCTL_EVTCHN_NOTIFY),
        const_fact!("IOCTL_EVTCHN_RESET", IOCTL_EVTCHN_RESET),
        const_fact!("IOCTL_EVTCHN_RESTRICT_DOMID", IOCTL_EVTCHN_RESTRICT_DOMID),
        const_fact!("GNTALLOC_FLAG_WRITABLE", GNTALLOC_FLAG_WRITABLE),
        const_fact!("UNMAP_NOTIFY_CLEAR_BYTE", UNMAP_NOTIFY_CLEAR_BYTE),
        const_fact!("UNMAP_NOTIFY_SEND_EVENT", UNMAP_NOTIFY_SEND_EVENT),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioc_none_encodes_type_number_and_size() {
        // _IOC(_IOC_NONE, 'G', 5, 24): 24 << 16 | 'G' << 8 | 5.
        assert_eq!(ioc_none(b'G', 5, 24) as u64, 0x0018_4705);
        assert_eq!(ioc_none(b'E', 5, 0) as u64, 0x0000_4505);
    }

    #[test]
    fn struct_sizes_match_the_x86_64_headers() {
        assert_eq!(size_of::<GntallocAllocGref>(), 24);
        assert_eq!(size_of::<GntallocDeallocGref>(), 16);
        assert_eq!(size_of::<UnmapNotify>(), 16);
        assert_eq!(size_of::<GntdevMapGrantRef>(), 24);
        assert_eq!(size_of::<GntdevUnmapGrantRef>(), 16);
        assert_eq!(size_of::<GntdevGetOffsetForVaddr>(), 24);
        assert_eq!(size_of::<GntdevGrantCopySegment>(), 24);
        assert_eq!(size_of::<GntdevGrantCopy>(), 16);
        assert_eq!(size_of::<EvtchnBindInterdomain>(), 8);
        assert_eq!(size_of::<EvtchnRestrictDomid>(), 2);
    }

    #[test]
    fn foreign_copy_pointer_fills_the_whole_union() {
        let p = GntdevCopyPtr::foreign(0x1234, 0xdead_beef, 0x0567);
        // SAFETY: the union was written through its `foreign` member just above.
        let f = unsafe { p.foreign };
        assert_eq!(
            f,
            GntdevCopyForeign {
                gref: 0xdead_beef,
                offset: 0x0567,
                domid: 0x1234
            }
        );
        assert_eq!(size_of::<GntdevCopyForeign>(), size_of::<*mut c_void>());
    }

    #[test]
    fn fact_names_are_unique() {
        let facts = abi_facts();
        let mut names: Vec<_> = facts.iter().map(|f| f.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), facts.len());
    }
}

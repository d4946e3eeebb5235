//! The system calls behind a packet socket, each wrapped once with its safety argument.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::{self, NonNull};
use std::time::Duration;

use libc::{c_int, c_void, socklen_t};

use super::error::{NicError, Result};

/// An interface name as the kernel's `ifreq` wants it, after the kernel's own rules: 1 to
/// 15 bytes, not `.` or `..`, no `/`, `:`, whitespace or NUL.
pub(crate) fn ifname_field(name: &str) -> Result<[libc::c_char; libc::IFNAMSIZ]> {
    let invalid = |reason| NicError::InvalidInterfaceName {
        name: name.to_owned(),
        reason,
    };
    if name.is_empty() {
        return Err(invalid("empty"));
    }
    if name.len() >= libc::IFNAMSIZ {
        return Err(invalid("longer than 15 bytes"));
    }
    if name == "." || name == ".." {
        return Err(invalid("reserved name"));
    }
    if name
        .bytes()
        .any(|b| b == b'/' || b == b':' || b == 0 || b.is_ascii_whitespace())
    {
        return Err(invalid("contains '/', ':', whitespace or NUL"));
    }
    let mut field = [0 as libc::c_char; libc::IFNAMSIZ];
    for (dst, src) in field.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    Ok(field)
}

/// A new AF_PACKET raw socket that receives nothing until it is bound.
pub(crate) fn packet_socket() -> Result<OwnedFd> {
    // SAFETY: plain syscall with constant arguments; protocol 0 registers no receive hook,
    // so no frame is queued before the rings exist.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(NicError::last_os("socket(AF_PACKET)"));
    }
    // SAFETY: `fd` was just returned by socket() and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `setsockopt(fd, level, name, value)` for a plain-old-data `value`.
pub(crate) fn set_option<T: Copy>(
    fd: BorrowedFd<'_>,
    level: c_int,
    name: c_int,
    value: &T,
) -> io::Result<()> {
    // SAFETY: `value` points to `size_of::<T>()` readable bytes for the duration of the
    // call; the kernel only reads them.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast::<c_void>(),
            size_of::<T>() as socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `getsockopt(fd, level, name)` into a plain-old-data `T` the kernel fills completely.
fn get_option<T: Copy>(fd: BorrowedFd<'_>, level: c_int, name: c_int) -> io::Result<T> {
    // SAFETY: only used with integer structs, for which all-zero is a valid value.
    let mut value: T = unsafe { zeroed() };
    let mut len = size_of::<T>() as socklen_t;
    // SAFETY: `value` is writable for `len` bytes; the kernel writes at most `len` bytes
    // and reports how many.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut value as *mut T).cast::<c_void>(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != size_of::<T>() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "short getsockopt answer",
        ));
    }
    Ok(value)
}

/// Frames the kernel dropped since the last call (PACKET_STATISTICS resets on read).
pub(crate) fn packet_drops(fd: BorrowedFd<'_>) -> Result<u32> {
    let stats: libc::tpacket_stats = get_option(fd, libc::SOL_PACKET, libc::PACKET_STATISTICS)
        .map_err(|source| NicError::Sys {
            op: "getsockopt(PACKET_STATISTICS)",
            source,
        })?;
    Ok(stats.tp_drops)
}

/// The pending error of a socket (SO_ERROR), which reading clears.
pub(crate) fn take_socket_error(fd: BorrowedFd<'_>) -> io::Result<Option<io::Error>> {
    let errno: c_int = get_option(fd, libc::SOL_SOCKET, libc::SO_ERROR)?;
    Ok((errno != 0).then(|| io::Error::from_raw_os_error(errno)))
}

/// What the kernel says about a network interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InterfaceInfo {
    pub index: u32,
    pub mtu: u32,
    pub mac: [u8; 6],
    pub hw_type: u16,
}

/// Run one SIOCGIF* ioctl for interface `name` and return the filled request.
fn ifreq_ioctl(
    fd: BorrowedFd<'_>,
    name: &str,
    request: libc::c_ulong,
    op: &'static str,
) -> Result<libc::ifreq> {
    // SAFETY: `ifreq` is plain data (a name and a union of plain fields); all-zero is valid.
    let mut req: libc::ifreq = unsafe { zeroed() };
    req.ifr_name = ifname_field(name)?;
    // SAFETY: `request` is one of the SIOCGIF* getters, which read the NUL-terminated
    // name and write one member of the union inside `req`, which is writable.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request as _, &mut req as *mut libc::ifreq) };
    if rc < 0 {
        let source = io::Error::last_os_error();
        return Err(match source.raw_os_error() {
            Some(libc::ENODEV) => NicError::NoSuchInterface {
                name: name.to_owned(),
            },
            _ => NicError::Sys { op, source },
        });
    }
    Ok(req)
}

/// Index, MTU, MAC and hardware type of interface `name` in the socket's namespace.
pub(crate) fn interface_info(fd: BorrowedFd<'_>, name: &str) -> Result<InterfaceInfo> {
    let req = ifreq_ioctl(fd, name, libc::SIOCGIFINDEX, "ioctl(SIOCGIFINDEX)")?;
    // SAFETY: SIOCGIFINDEX filled the `ifru_ifindex` member.
    let index = unsafe { req.ifr_ifru.ifru_ifindex };
    let req = ifreq_ioctl(fd, name, libc::SIOCGIFMTU, "ioctl(SIOCGIFMTU)")?;
    // SAFETY: SIOCGIFMTU filled the `ifru_mtu` member.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    let req = ifreq_ioctl(fd, name, libc::SIOCGIFHWADDR, "ioctl(SIOCGIFHWADDR)")?;
    // SAFETY: SIOCGIFHWADDR filled the `ifru_hwaddr` member.
    let hwaddr = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (dst, src) in mac.iter_mut().zip(hwaddr.sa_data.iter()) {
        *dst = *src as u8;
    }
    let bad = |what: &'static str| NicError::Sys {
        op: what,
        source: io::Error::new(io::ErrorKind::InvalidData, "negative value from the kernel"),
    };
    Ok(InterfaceInfo {
        index: u32::try_from(index).map_err(|_| bad("ioctl(SIOCGIFINDEX)"))?,
        mtu: u32::try_from(mtu).map_err(|_| bad("ioctl(SIOCGIFMTU)"))?,
        mac,
        hw_type: hwaddr.sa_family,
    })
}

/// A link-layer address for interface `index` and ethertype `protocol`.
fn sockaddr_ll(index: u32, protocol: u16) -> libc::sockaddr_ll {
    // SAFETY: plain data; all-zero is valid.
    let mut addr: libc::sockaddr_ll = unsafe { zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = protocol.to_be();
    addr.sll_ifindex = index as c_int;
    addr
}

/// Bind the socket to interface `index` and ethertype `protocol`: from now on the kernel
/// queues matching frames to it.
pub(crate) fn bind(fd: BorrowedFd<'_>, index: u32, protocol: u16) -> Result<()> {
    let addr = sockaddr_ll(index, protocol);
    // SAFETY: `addr` is a complete sockaddr_ll and the length says so.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_ll).cast::<libc::sockaddr>(),
            size_of::<libc::sockaddr_ll>() as socklen_t,
        )
    };
    if rc < 0 {
        return Err(NicError::last_os("bind(AF_PACKET)"));
    }
    Ok(())
}

/// Add or drop a membership of kind `kind` (PACKET_MR_*) on interface `index`.
pub(crate) fn membership(
    fd: BorrowedFd<'_>,
    index: u32,
    kind: c_int,
    addr: Option<[u8; 6]>,
    add: bool,
) -> io::Result<()> {
    // SAFETY: plain data; all-zero is valid.
    let mut mreq: libc::packet_mreq = unsafe { zeroed() };
    mreq.mr_ifindex = index as c_int;
    mreq.mr_type = kind as u16;
    if let Some(mac) = addr {
        mreq.mr_alen = 6;
        mreq.mr_address[..6].copy_from_slice(&mac);
    }
    let name = if add {
        libc::PACKET_ADD_MEMBERSHIP
    } else {
        libc::PACKET_DROP_MEMBERSHIP
    };
    set_option(fd, libc::SOL_PACKET, name, &mreq)
}

/// Ask the kernel to transmit every frame marked in the transmit ring.
pub(crate) fn send_ring(fd: BorrowedFd<'_>, flags: c_int) -> io::Result<usize> {
    // SAFETY: with a transmit ring, send() takes its frames from the ring; the null buffer
    // of length zero is never read.
    let rc = unsafe { libc::send(fd.as_raw_fd(), ptr::null(), 0, flags) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as usize)
    }
}

/// Wait until `fd` reports one of `events`, an error or hang-up, or `timeout` passes
/// (`None`: no limit). Returns the reported events, empty on timeout.
pub(crate) fn poll_fd(
    fd: BorrowedFd<'_>,
    events: i16,
    timeout: Option<Duration>,
) -> io::Result<i16> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as _,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: one valid pollfd, a valid timespec or null, and no signal mask change.
    let rc = unsafe { libc::ppoll(&mut pfd, 1, ts_ptr, ptr::null()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(if rc == 0 { 0 } else { pfd.revents })
}

/// Bytes per page.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no memory effects.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|s| s.is_power_of_two())
        .unwrap_or(4096)
}

/// The rings of a packet socket mapped into our address space; unmapped on drop.
pub(crate) struct RingMapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl RingMapping {
    /// Map the `len` bytes of rings the kernel set up on `fd`.
    pub(crate) fn new(fd: BorrowedFd<'_>, len: usize) -> Result<Self> {
        // SAFETY: a fresh shared mapping chosen by the kernel: it aliases no Rust object.
        // The kernel checks `len` against the size of the rings configured on `fd`.
        let ptr = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(NicError::last_os("mmap(packet rings)"));
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(NicError::Sys {
            op: "mmap(packet rings)",
            source: io::Error::other("null mapping"),
        })?;
        Ok(Self { ptr, len })
    }

    /// Start of the mapping (page-aligned).
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The byte `offset` bytes into the mapping, or `None` past its end.
    pub(crate) fn at(&self, offset: usize) -> Option<NonNull<u8>> {
        if offset > self.len {
            return None;
        }
        // SAFETY: `offset <= len`, so the pointer stays within (or one past) the mapping.
        Some(unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(offset)) })
    }
}

impl Drop for RingMapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe a mapping we created and nobody uses any more: the
        // rings pointing into it are dropped with the socket that owns this mapping.
        if unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) } != 0 {
            tracing::warn!(error = %io::Error::last_os_error(), "munmap of packet rings failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_follow_kernel_rules() {
        for ok in ["eth0", "veth-a_1", "x", "123456789012345"] {
            let field = ifname_field(ok).unwrap();
            let bytes: Vec<u8> = field
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            assert_eq!(bytes, ok.as_bytes());
            assert_eq!(field[libc::IFNAMSIZ - 1], 0);
        }
        for bad in [
            "",
            ".",
            "..",
            "1234567890123456",
            "a/b",
            "a:b",
            "a b",
            "a\0b",
            "a\tb",
        ] {
            assert!(
                matches!(
                    ifname_field(bad),
                    Err(NicError::InvalidInterfaceName { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn sockaddr_ll_is_in_network_order() {
        let addr = sockaddr_ll(7, 0x86DF);
        assert_eq!(addr.sll_family, libc::AF_PACKET as u16);
        assert_eq!(addr.sll_protocol.to_ne_bytes(), [0x86, 0xDF]);
        assert_eq!(addr.sll_ifindex, 7);
    }

    #[test]
    fn page_size_is_sane() {
        let p = page_size();
        assert!(p.is_power_of_two() && p >= 4096);
    }

    #[test]
    fn mapping_bounds() {
        // An anonymous mapping exercises `at` without a packet socket.
        // SAFETY: a fresh private anonymous mapping of one page.
        let raw = unsafe {
            libc::mmap(
                ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(raw, libc::MAP_FAILED);
        let m = RingMapping {
            ptr: NonNull::new(raw.cast()).unwrap(),
            len: 4096,
        };
        assert_eq!(m.at(0), Some(m.base()));
        assert!(m.at(4096).is_some());
        assert!(m.at(4097).is_none());
    }
}

//! Small system-call helpers shared by the device wrappers: opening a device node,
//! issuing an ioctl, shared mappings, and turning errno values into [`Error`]s.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use crate::{Error, Result};

/// Open a Xen device node read-write (close-on-exec, plus `extra_flags`).
///
/// A missing node means this kernel is not running on Xen or the driver is not loaded;
/// that is reported as [`Error::Unsupported`] naming the node and the driver module.
pub(crate) fn open_device(path: &Path, module: &str, extra_flags: libc::c_int) -> Result<OwnedFd> {
    let cpath = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::Invalid(format!("device path {} contains NUL", path.display())))?;
    // SAFETY: `cpath` is a valid NUL-terminated string that outlives the call; open has
    // no other memory effects.
    let fd = unsafe { libc::open(cpath.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC | extra_flags) };
    if fd < 0 {
        let err = io::Error::last_os_error();
        return Err(match err.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENODEV) | Some(libc::ENXIO) => {
                Error::Unsupported(format!(
                    "{} is not available ({err}): not running on Xen, or the {module} driver \
                     is not loaded",
                    path.display()
                ))
            }
            Some(libc::EACCES) | Some(libc::EPERM) => {
                Error::Denied(format!("cannot open {}: {err}", path.display()))
            }
            _ => Error::Io(io::Error::new(
                err.kind(),
                format!("cannot open {}: {err}", path.display()),
            )),
        });
    }
    // SAFETY: `fd` was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Issue `request` on `fd` with a pointer argument; returns the ioctl's non-negative
/// result (the evtchn binds return the new port that way).
///
/// # Safety
/// `arg` must point to memory laid out as `request` expects, large enough for every
/// byte the driver reads or writes (including variable-length tails), and valid for
/// the duration of the call.
pub(crate) unsafe fn ioctl_ptr<T>(
    fd: &OwnedFd,
    request: libc::Ioctl,
    arg: *mut T,
) -> io::Result<libc::c_int> {
    loop {
        // SAFETY: forwarded from the caller's contract on `arg`; `fd` is open.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request, arg) };
        if rc >= 0 {
            return Ok(rc);
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// Map `len` bytes of `fd` at `offset`, shared.
pub(crate) fn mmap_shared(
    fd: &OwnedFd,
    len: usize,
    offset: u64,
    writable: bool,
) -> io::Result<*mut u8> {
    let prot = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    let off = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "mmap offset out of range"))?;
    // SAFETY: a fresh mapping chosen by the kernel (addr NULL) cannot alias any Rust
    // object; the result is checked against MAP_FAILED before use.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            off,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(ptr.cast())
}

/// Undo [`mmap_shared`].
///
/// # Safety
/// `ptr`/`len` must be exactly a mapping returned by [`mmap_shared`] that nothing will
/// touch afterwards.
pub(crate) unsafe fn munmap(ptr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: forwarded from the caller's contract.
    if unsafe { libc::munmap(ptr.cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An 8-byte aligned, zeroed scratch buffer for ioctl arguments that end in a
/// variable-length array.
pub(crate) struct IoctlBuf {
    words: Vec<u64>,
    len: usize,
}

impl IoctlBuf {
    /// A buffer of at least `len` bytes.
    pub(crate) fn new(len: usize) -> Self {
        IoctlBuf {
            words: vec![0; len.div_ceil(8)],
            len,
        }
    }

    pub(crate) fn as_mut_ptr<T>(&mut self) -> *mut T {
        self.words.as_mut_ptr().cast()
    }

    /// The buffer as bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the Vec owns `words.len() * 8 >= len` initialised bytes; u8 has no
        // alignment or validity requirements.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }

    /// The buffer as mutable bytes.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }

    /// Write `value` at the start of the buffer.
    pub(crate) fn write_header<T: Copy>(&mut self, value: T) {
        assert!(std::mem::size_of::<T>() <= self.len && std::mem::align_of::<T>() <= 8);
        // SAFETY: the buffer is 8-byte aligned and at least size_of::<T>() bytes long
        // (checked above), and T is plain data (Copy, no drop).
        unsafe { self.as_mut_ptr::<T>().write(value) }
    }

    /// Read a `T` from the start of the buffer.
    pub(crate) fn read_header<T: Copy>(&self) -> T {
        assert!(std::mem::size_of::<T>() <= self.len && std::mem::align_of::<T>() <= 8);
        // SAFETY: aligned and long enough (checked above); the callers' T are integer
        // structs for which every bit pattern is valid.
        unsafe { self.words.as_ptr().cast::<T>().read() }
    }
}

/// Read `count` native-endian u32 values starting `offset` bytes into `bytes`.
pub(crate) fn read_u32s(bytes: &[u8], offset: usize, count: usize) -> Option<Vec<u32>> {
    let end = count.checked_mul(4)?.checked_add(offset)?;
    let tail = bytes.get(offset..end)?;
    Some(
        tail.chunks_exact(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

/// Turn an errno from a Xen device into the platform's error, saying what was tried.
pub(crate) fn errno_error(err: io::Error, what: &str) -> Error {
    let msg = format!("{what}: {err}");
    match err.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ESRCH) | Some(libc::ENOTCONN) => Error::NotFound(msg),
        Some(libc::EACCES) | Some(libc::EPERM) => Error::Denied(msg),
        Some(libc::EBUSY) => Error::Busy(msg),
        Some(libc::EAGAIN) => Error::Again,
        Some(libc::EEXIST) => Error::Exists(msg),
        Some(libc::EINVAL) | Some(libc::EFAULT) | Some(libc::EBADF) => Error::Invalid(msg),
        Some(libc::ENOSPC) | Some(libc::E2BIG) | Some(libc::EDQUOT) | Some(libc::ENOMEM)
        | Some(libc::EFBIG) => Error::Quota(msg),
        Some(libc::ENOTTY) | Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) => Error::Unsupported(msg),
        _ => Error::Io(io::Error::new(err.kind(), msg)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_device_names_the_node_and_module() {
        let err = open_device(Path::new("/nonexistent/xen/gntdev"), "xen-gntdev", 0).unwrap_err();
        match err {
            Error::Unsupported(m) => {
                assert!(m.contains("/nonexistent/xen/gntdev"), "{m}");
                assert!(m.contains("xen-gntdev"), "{m}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn errno_values_map_to_platform_errors() {
        let e = |n| errno_error(io::Error::from_raw_os_error(n), "op");
        assert!(matches!(e(libc::ENOENT), Error::NotFound(_)));
        assert!(matches!(e(libc::EPERM), Error::Denied(_)));
        assert!(matches!(e(libc::EBUSY), Error::Busy(_)));
        assert!(matches!(e(libc::EAGAIN), Error::Again));
        assert!(matches!(e(libc::EINVAL), Error::Invalid(_)));
        assert!(matches!(e(libc::ENOSPC), Error::Quota(_)));
        assert!(matches!(e(libc::ENOTTY), Error::Unsupported(_)));
        assert!(matches!(e(libc::EIO), Error::Io(_)));
    }

    #[test]
    fn ioctl_buf_is_aligned_zeroed_and_round_trips() {
        let mut b = IoctlBuf::new(21);
        assert_eq!(b.bytes().len(), 21);
        assert!(b.bytes().iter().all(|&x| x == 0));
        assert_eq!(b.as_mut_ptr::<u64>() as usize % 8, 0);
        b.write_header::<[u32; 2]>([7, 9]);
        assert_eq!(b.read_header::<[u32; 2]>(), [7, 9]);
        b.bytes_mut()[16..20].copy_from_slice(&5u32.to_ne_bytes());
        assert_eq!(read_u32s(b.bytes(), 0, 2), Some(vec![7, 9]));
        assert_eq!(read_u32s(b.bytes(), 16, 1), Some(vec![5]));
        assert_eq!(read_u32s(b.bytes(), 16, 2), None);
        assert_eq!(read_u32s(b.bytes(), usize::MAX, 1), None);
    }
}

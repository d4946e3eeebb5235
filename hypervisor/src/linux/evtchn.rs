//! /dev/xen/evtchn: inter-domain event channels for a userspace process.
//!
//! Each open descriptor owns the ports bound through it. Reading it yields the pending
//! ports as native-endian u32 values; the driver masks a port when it reports it, and
//! writing the same u32 back unmasks it (an event that arrived meanwhile is then
//! delivered again).

use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::debug;

use super::abi::{
    EvtchnBindInterdomain, EvtchnBindUnboundPort, EvtchnNotify, EvtchnRestrictDomid, EvtchnUnbind,
    IOCTL_EVTCHN_BIND_INTERDOMAIN, IOCTL_EVTCHN_BIND_UNBOUND_PORT, IOCTL_EVTCHN_NOTIFY,
    IOCTL_EVTCHN_RESET, IOCTL_EVTCHN_RESTRICT_DOMID, IOCTL_EVTCHN_UNBIND,
};
use super::sys::{self, errno_error};
use crate::{DomId, Error, EventChannels, Port, PortNotifier, Result};

/// How many pending ports one read collects at most.
const READ_BATCH: usize = 64;

/// An open /dev/xen/evtchn, non-blocking.
#[derive(Debug, Clone)]
pub struct LinuxEventChannels {
    fd: Arc<EvtchnFile>,
}

/// The descriptor, and what is needed to close it safely after a migration (see
/// [`super::migration`]): a descriptor that still holds ports bound before a move is
/// kept open, never closed.
#[derive(Debug)]
struct EvtchnFile {
    fd: ManuallyDrop<OwnedFd>,
    /// Moves of the domain seen when it was opened.
    moves_at_open: u32,
    /// Ports bound through this handle and not unbound; `None` when unknown (a
    /// descriptor received from another process).
    bound: Mutex<Option<usize>>,
}

impl std::ops::Deref for EvtchnFile {
    type Target = OwnedFd;
    fn deref(&self) -> &OwnedFd {
        &self.fd
    }
}

impl Drop for EvtchnFile {
    fn drop(&mut self) {
        let bound = *self.bound.lock().unwrap_or_else(|e| e.into_inner());
        if bound != Some(0) && super::migration::moved_since(self.moves_at_open) {
            match bound {
                // Received from another process, which may have unbound everything.
                None => debug!(
                    fd = self.fd.as_raw_fd(),
                    "a descriptor received before the domain moved stays open"
                ),
                Some(n) => tracing::warn!(
                    fd = self.fd.as_raw_fd(),
                    ports = n,
                    "a descriptor with ports bound before the domain moved stays open"
                ),
            }
            return;
        }
        // SAFETY: dropped once, here; nothing uses the descriptor after its owner.
        unsafe { ManuallyDrop::drop(&mut self.fd) };
    }
}

impl EvtchnFile {
    fn new(fd: OwnedFd, bound: Option<usize>) -> Self {
        EvtchnFile {
            fd: ManuallyDrop::new(fd),
            moves_at_open: super::migration::moves(),
            bound: Mutex::new(bound),
        }
    }

    fn count(&self, change: isize) {
        let mut b = self.bound.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = b.as_mut() {
            *n = n.saturating_add_signed(change);
        }
    }
}

impl LinuxEventChannels {
    /// Open the device node at `path` (normally `/dev/xen/evtchn`).
    pub fn open(path: &Path) -> Result<Self> {
        let fd = sys::open_device(path, "xen-evtchn", libc::O_NONBLOCK)?;
        Ok(LinuxEventChannels {
            fd: Arc::new(EvtchnFile::new(fd, Some(0))),
        })
    }

    /// Wrap an already open, non-blocking descriptor of the device (which may hold
    /// ports bound elsewhere).
    pub fn from_fd(fd: OwnedFd) -> Self {
        LinuxEventChannels {
            fd: Arc::new(EvtchnFile::new(fd, None)),
        }
    }

    /// Empty this descriptor's ring of pending ports and clear an overflow condition
    /// (bound ports stay bound).
    pub fn reset(&self) -> Result<()> {
        // SAFETY: IOCTL_EVTCHN_RESET takes no argument; the null pointer is ignored.
        unsafe { sys::ioctl_ptr(&self.fd, IOCTL_EVTCHN_RESET, std::ptr::null_mut::<u8>()) }
            .map_err(|e| errno_error(e, "evtchn: reset"))?;
        Ok(())
    }

    /// From now on this descriptor may only bind ports of `domid` (a deprivileged
    /// device model's restriction; it cannot be lifted).
    pub fn restrict_domain(&self, domid: DomId) -> Result<()> {
        let mut arg = EvtchnRestrictDomid { domid };
        // SAFETY: `arg` is the exact struct the ioctl number encodes, live for the call.
        unsafe { sys::ioctl_ptr(&self.fd, IOCTL_EVTCHN_RESTRICT_DOMID, &mut arg) }
            .map_err(|e| errno_error(e, "evtchn: restrict domain"))?;
        Ok(())
    }

    /// Append what the device reports pending; true if it reported end-of-file (which
    /// the driver never does, but a stand-in descriptor may).
    fn read_pending(&self, out: &mut Vec<Port>) -> Result<bool> {
        let mut buf = [0u8; READ_BATCH * 4];
        loop {
            // SAFETY: `buf` is a live, writable local array of the length passed.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                let err = std::io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::EAGAIN) => return Ok(false),
                    Some(libc::EINTR) => continue,
                    Some(libc::EFBIG) => {
                        return Err(Error::Quota(
                            "evtchn: the pending-port ring overflowed; reset the channels".into(),
                        ))
                    }
                    _ => return Err(errno_error(err, "evtchn: read")),
                }
            }
            let n = n as usize;
            if n == 0 {
                return Ok(true);
            }
            let got = buf.get(..n).unwrap_or_default();
            if !got.chunks_exact(4).remainder().is_empty() {
                return Err(Error::Protocol(format!("evtchn: read of {n} bytes")));
            }
            out.extend(
                got.chunks_exact(4)
                    .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]])),
            );
            if n < buf.len() {
                return Ok(false);
            }
        }
    }
}

fn check_port(port: Port) -> Result<()> {
    // Port 0 is never allocated: Xen reserves it as "no port".
    if port == 0 {
        return Err(Error::Invalid("event-channel port 0".into()));
    }
    Ok(())
}

fn notify_fd(fd: &OwnedFd, port: Port) -> Result<()> {
    check_port(port)?;
    let mut arg = EvtchnNotify { port };
    // SAFETY: `arg` is the exact struct the ioctl number encodes, live for the call.
    unsafe { sys::ioctl_ptr(fd, IOCTL_EVTCHN_NOTIFY, &mut arg) }
        .map_err(|e| errno_error(e, &format!("evtchn: notify port {port}")))?;
    Ok(())
}

impl EventChannels for LinuxEventChannels {
    fn alloc_unbound(&self, remote: DomId) -> Result<Port> {
        let mut arg = EvtchnBindUnboundPort {
            remote_domain: libc::c_uint::from(remote),
        };
        // SAFETY: `arg` is the exact struct the ioctl number encodes, live for the call.
        let port = unsafe { sys::ioctl_ptr(&self.fd, IOCTL_EVTCHN_BIND_UNBOUND_PORT, &mut arg) }
            .map_err(|e| errno_error(e, &format!("evtchn: alloc unbound for domain {remote}")))?;
        self.fd.count(1);
        debug!(remote, port, "evtchn: allocated unbound");
        Ok(port as Port)
    }

    fn bind_interdomain(&self, remote: DomId, remote_port: Port) -> Result<Port> {
        check_port(remote_port)?;
        let mut arg = EvtchnBindInterdomain {
            remote_domain: libc::c_uint::from(remote),
            remote_port,
        };
        // SAFETY: `arg` is the exact struct the ioctl number encodes, live for the call.
        let port = unsafe { sys::ioctl_ptr(&self.fd, IOCTL_EVTCHN_BIND_INTERDOMAIN, &mut arg) }
            .map_err(|e| {
                errno_error(
                    e,
                    &format!("evtchn: bind to port {remote_port} of domain {remote}"),
                )
            })?;
        self.fd.count(1);
        debug!(remote, remote_port, port, "evtchn: bound");
        Ok(port as Port)
    }

    fn notify(&self, port: Port) -> Result<()> {
        notify_fd(&self.fd, port)
    }

    fn notifier(&self, port: Port) -> Result<Arc<dyn PortNotifier>> {
        check_port(port)?;
        Ok(Arc::new(EvtchnNotifier {
            fd: Arc::clone(&self.fd),
            port,
        }))
    }

    fn unmask(&self, port: Port) -> Result<()> {
        check_port(port)?;
        let bytes = port.to_ne_bytes();
        loop {
            // SAFETY: `bytes` is a live local array of the length passed.
            let n = unsafe { libc::write(self.fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
            if n == bytes.len() as isize {
                return Ok(());
            }
            if n >= 0 {
                return Err(Error::Protocol(format!(
                    "evtchn: short unmask write ({n} bytes)"
                )));
            }
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINTR) {
                return Err(errno_error(err, &format!("evtchn: unmask port {port}")));
            }
        }
    }

    fn close(&self, port: Port) -> Result<()> {
        check_port(port)?;
        if super::migration::moved_since(self.fd.moves_at_open) {
            // Bound before the domain moved: the kernel forgot it, and unbinding it
            // now would oops (see `super::migration`). It stays listed, harmlessly.
            debug!(
                port,
                "evtchn: port bound before the domain moved left alone"
            );
            return Ok(());
        }
        let mut arg = EvtchnUnbind { port };
        // SAFETY: `arg` is the exact struct the ioctl number encodes, live for the call.
        unsafe { sys::ioctl_ptr(&self.fd, IOCTL_EVTCHN_UNBIND, &mut arg) }
            .map_err(|e| errno_error(e, &format!("evtchn: unbind port {port}")))?;
        self.fd.count(-1);
        Ok(())
    }

    fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The receiver gets this handle's descriptor, hence every port bound through it:
    /// export ports of a handle that holds nothing else. Both processes then read the
    /// same pending queue, so this one must stop waiting on the handle.
    fn export_port(&self, port: Port) -> Result<crate::ExportedPort> {
        check_port(port)?;
        Ok(crate::ExportedPort {
            port,
            source: crate::handoff::PortSource::Linux {
                evtchn: crate::handoff::dup(self.fd.as_fd())?,
            },
        })
    }

    fn pending(&self, out: &mut Vec<Port>) -> Result<()> {
        self.read_pending(out).map(|_| ())
    }

    fn wait(&self, out: &mut Vec<Port>, timeout: Option<Duration>) -> Result<()> {
        let before = out.len();
        self.read_pending(out)?;
        if out.len() > before {
            return Ok(());
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let ms: libc::c_int = match deadline {
                None => -1,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    // Round up so a sub-millisecond remainder still waits.
                    let ms = left.as_micros().div_ceil(1000);
                    libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
                }
            };
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: `pfd` is one live pollfd, matching the count passed.
            let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
            if rc < 0 {
                let err = std::io::Error::last_os_error();
                if err.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(errno_error(err, "evtchn: poll"));
            }
            if rc > 0 {
                let eof = self.read_pending(out)?;
                if out.len() > before {
                    return Ok(());
                }
                if eof {
                    return Err(Error::Closed("evtchn: end of file".into()));
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(());
            }
        }
    }
}

/// Signals one port through the descriptor that bound it.
#[derive(Debug)]
pub struct EvtchnNotifier {
    fd: Arc<EvtchnFile>,
    port: Port,
}

impl PortNotifier for EvtchnNotifier {
    fn notify(&self) -> Result<()> {
        notify_fd(&self.fd, self.port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    fn dev_null() -> LinuxEventChannels {
        LinuxEventChannels::from_fd(
            File::options()
                .read(true)
                .write(true)
                .open("/dev/null")
                .unwrap()
                .into(),
        )
    }

    #[test]
    fn port_zero_is_refused_before_the_device() {
        let e = dev_null();
        assert!(matches!(e.notify(0), Err(Error::Invalid(_))));
        assert!(matches!(e.unmask(0), Err(Error::Invalid(_))));
        assert!(matches!(e.close(0), Err(Error::Invalid(_))));
        assert!(matches!(e.bind_interdomain(1, 0), Err(Error::Invalid(_))));
        assert!(e.notifier(0).is_err());
    }

    #[test]
    fn a_device_without_the_ioctls_reports_unsupported() {
        let e = dev_null();
        assert!(matches!(e.alloc_unbound(1), Err(Error::Unsupported(_))));
        assert!(matches!(
            e.bind_interdomain(1, 5),
            Err(Error::Unsupported(_))
        ));
        assert!(matches!(e.notify(5), Err(Error::Unsupported(_))));
        assert!(matches!(
            e.notifier(5).unwrap().notify(),
            Err(Error::Unsupported(_))
        ));
        assert!(matches!(e.close(5), Err(Error::Unsupported(_))));
        assert!(matches!(e.reset(), Err(Error::Unsupported(_))));
        assert!(matches!(e.restrict_domain(1), Err(Error::Unsupported(_))));
    }

    #[test]
    fn pending_ports_are_read_as_u32s_and_unmask_writes_them() {
        // A pipe stands in for the device: what the driver would queue is written into
        // it, and unmask's writes come out of the other end.
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK).unwrap();
        let ports: Vec<u32> = (1..=150).collect();
        let bytes: Vec<u8> = ports.iter().flat_map(|p| p.to_ne_bytes()).collect();
        nix::unistd::write(&w, &bytes).unwrap();
        let ev = LinuxEventChannels::from_fd(r);
        let mut out = Vec::new();
        ev.pending(&mut out).unwrap();
        assert_eq!(out, ports);
        out.clear();
        ev.pending(&mut out).unwrap();
        assert!(out.is_empty());

        nix::unistd::write(&w, &7u32.to_ne_bytes()).unwrap();
        ev.wait(&mut out, Some(Duration::from_secs(30))).unwrap();
        assert_eq!(out, vec![7]);

        let (r2, w2) = nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK).unwrap();
        let unmasker = LinuxEventChannels::from_fd(w2);
        unmasker.unmask(0x0102_0304).unwrap();
        let mut got = [0u8; 8];
        let n = nix::unistd::read(r2.as_raw_fd(), &mut got).unwrap();
        assert_eq!(&got[..n], &0x0102_0304u32.to_ne_bytes());
    }

    #[test]
    fn a_torn_read_is_a_protocol_error() {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK).unwrap();
        nix::unistd::write(&w, &[1, 2, 3]).unwrap();
        let ev = LinuxEventChannels::from_fd(r);
        assert!(matches!(
            ev.pending(&mut Vec::new()),
            Err(Error::Protocol(_))
        ));
    }

    #[test]
    fn end_of_file_ends_a_wait_instead_of_spinning() {
        let ev = LinuxEventChannels::from_fd(File::open("/dev/null").unwrap().into());
        let mut out = Vec::new();
        ev.pending(&mut out).unwrap();
        assert!(matches!(ev.wait(&mut out, None), Err(Error::Closed(_))));
        assert!(out.is_empty());
    }

    #[test]
    fn wait_returns_empty_after_the_timeout() {
        let (r, _w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK).unwrap();
        let ev = LinuxEventChannels::from_fd(r);
        let mut out = Vec::new();
        ev.wait(&mut out, Some(Duration::from_millis(1))).unwrap();
        assert!(out.is_empty());
    }
}

//! Handing granted pages and event-channel ports to another process of the same domain.
//!
//! A split-driver frontend that lives in a daemon still wants the data path to bypass it:
//! the daemon allocates the grants and the port, keeps owning them, and hands *access* to
//! an application process, which then talks to the remote domain through the shared pages
//! directly. Access travels as file descriptors over a unix socket (`SCM_RIGHTS`, see
//! [`send_message`] / [`recv_message`]) plus a short description:
//!
//! - [`GrantedPages::export`](crate::GrantedPages::export) gives an [`ExportedPages`]; the receiver maps the same pages
//!   with [`ExportedPages::import`] ([`ImportedPages`]).
//! - [`EventChannels::export_port`](crate::EventChannels::export_port) gives an [`ExportedPort`]; the receiver gets an
//!   [`ImportedPort`] that notifies the remote end and has a pollable descriptor (and a
//!   blocking wait) for the events the remote sends.
//!
//! What travels, per platform:
//!
//! | platform | pages | port |
//! |----------|-------|------|
//! | `sim`    | the domain's memory file and the frame of each page | the port's rx and tx eventfds and the handle's status page |
//! | `linux`  | the gntalloc descriptor and the batch's mmap offset | the evtchn descriptor the port is bound through |
//!
//! # Lifetimes
//!
//! The exporter keeps the grants and the port; the receiver only maps and signals. On `sim`
//! a page whose grant ends goes back to the domain's allocator and may be granted again
//! (to anyone), so **the exporter must not end a grant while a receiver still maps it**: it
//! ends them once the receiver said it unmapped, or once the receiver's process is gone
//! (its socket closed). On `linux` gntalloc keeps a page allocated while any process maps
//! it, so a late receiver mapping stays memory-safe (it just stops being shared).
//!
//! # Scope
//!
//! The descriptors give the receiver more than the one object: on `sim` the domain's whole
//! memory file, on `linux` every batch allocated through the same gntalloc descriptor and
//! every port bound through the same evtchn descriptor. An exporter therefore binds each
//! port it exports through an event-channel handle of its own. Processes of one domain
//! share one trust boundary on the simulator (as its directory permissions already say);
//! on real Xen an exporter serving mutually distrusting processes opens one grant device
//! per receiver.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};

use crate::{DomId, Error, GrantRef, Port, PortNotifier, Result, PAGE_SIZE};

/// Most descriptors one message may carry.
pub const MAX_MESSAGE_FDS: usize = 16;
/// Most pages one export may describe (a whole default grant table).
pub const MAX_EXPORT_PAGES: usize = 1 << 15;

const PAGES_SIM: u8 = 1;
const PAGES_GNTALLOC: u8 = 2;
const PORT_SIM: u8 = 1;
const PORT_LINUX: u8 = 2;

/// How the receiver finds the pages in the descriptor it gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PagesLayout {
    /// `sim`: page `i` is frame `frames[i]` of the domain's memory file.
    SimFrames {
        /// The frame of each page, in page order.
        frames: Vec<u32>,
    },
    /// `linux`: the pages are consecutive at this mmap offset of the gntalloc descriptor.
    Gntalloc {
        /// The mmap offset of the first page.
        offset: u64,
    },
}

/// Access to granted pages, ready to be sent to another process of the same domain.
#[derive(Debug)]
pub struct ExportedPages {
    /// The descriptor the layout refers to.
    pub fd: OwnedFd,
    /// Where the pages are in it.
    pub layout: PagesLayout,
    /// The grant refs of the pages, in page order (for the receiver's information).
    pub refs: Vec<GrantRef>,
    /// The domain the pages are granted to.
    pub remote: DomId,
    /// Whether the remote may write them (the receiver always may).
    pub writable: bool,
}

/// The platform half of [`ExportedPages`], as an owner produces it.
#[derive(Debug)]
pub struct PagesSource {
    /// The descriptor the layout refers to.
    pub fd: OwnedFd,
    /// Where the pages are in it.
    pub layout: PagesLayout,
}

/// Duplicate a descriptor (close-on-exec).
pub(crate) fn dup(fd: BorrowedFd<'_>) -> Result<OwnedFd> {
    fd.try_clone_to_owned().map_err(Error::Io)
}

impl ExportedPages {
    /// Pages described.
    pub fn page_count(&self) -> usize {
        self.refs.len()
    }

    /// Bytes described.
    pub fn len(&self) -> usize {
        self.refs.len() * PAGE_SIZE
    }

    /// True if no page is described (never the case for a valid export).
    pub fn is_empty(&self) -> bool {
        self.refs.is_empty()
    }

    /// Append the description to `out` and the descriptor to `fds` (see [`Self::parse`]).
    pub fn emit<'a>(&'a self, out: &mut Vec<u8>, fds: &mut Vec<BorrowedFd<'a>>) {
        let kind = match self.layout {
            PagesLayout::SimFrames { .. } => PAGES_SIM,
            PagesLayout::Gntalloc { .. } => PAGES_GNTALLOC,
        };
        out.push(kind);
        out.extend_from_slice(&self.remote.to_le_bytes());
        out.push(u8::from(self.writable));
        put_u32s(out, &self.refs);
        match &self.layout {
            PagesLayout::SimFrames { frames } => put_u32s(out, frames),
            PagesLayout::Gntalloc { offset } => out.extend_from_slice(&offset.to_le_bytes()),
        }
        fds.push(self.fd.as_fd());
    }

    /// Read a description written by [`Self::emit`] from the front of `buf`, taking its
    /// descriptor from the front of `fds`. Untrusted input: bounded and checked.
    pub fn parse(buf: &mut &[u8], fds: &mut VecDeque<OwnedFd>) -> Result<ExportedPages> {
        let mut r = HandoffReader(buf);
        let kind = r.u8()?;
        let remote = r.u16()?;
        let writable = r.bool()?;
        let refs = r.u32s(MAX_EXPORT_PAGES)?;
        if refs.is_empty() {
            return Err(Error::Protocol("an export of zero pages".into()));
        }
        let layout = match kind {
            PAGES_SIM => {
                let frames = r.u32s(MAX_EXPORT_PAGES)?;
                if frames.len() != refs.len() {
                    return Err(Error::Protocol(
                        "export frames do not match its refs".into(),
                    ));
                }
                PagesLayout::SimFrames { frames }
            }
            PAGES_GNTALLOC => {
                let offset = r.u64()?;
                if offset % PAGE_SIZE as u64 != 0 {
                    return Err(Error::Protocol("gntalloc offset not page aligned".into()));
                }
                PagesLayout::Gntalloc { offset }
            }
            other => {
                return Err(Error::Protocol(format!(
                    "unknown pages export kind {other}"
                )))
            }
        };
        *buf = r.0;
        let fd = fds
            .pop_front()
            .ok_or_else(|| Error::Protocol("pages export without its descriptor".into()))?;
        Ok(ExportedPages {
            fd,
            layout,
            refs,
            remote,
            writable,
        })
    }

    /// Map the pages into this process, readable and writable.
    pub fn import(self) -> Result<ImportedPages> {
        let len = self.len();
        let mapping = match &self.layout {
            PagesLayout::SimFrames { frames } => {
                let region = crate::sim::mmap::Region::map_frames(self.fd.as_fd(), frames, true)?;
                // Remapped onto the domain's new memory if it moves to another host.
                ImportMapping::Sim(crate::sim::imports::register(
                    region,
                    frames.clone(),
                    self.fd.as_fd(),
                )?)
            }
            PagesLayout::Gntalloc { offset } => {
                let ptr = mmap_shared(self.fd.as_fd(), len, *offset)?;
                ImportMapping::Raw { ptr, len }
            }
        };
        let ptr = NonNull::new(mapping.ptr())
            .ok_or_else(|| Error::Protocol("mapping at address zero".into()))?;
        Ok(ImportedPages {
            ptr,
            len,
            refs: self.refs,
            remote: self.remote,
            mapping,
        })
    }
}

fn mmap_shared(fd: BorrowedFd<'_>, len: usize, offset: u64) -> Result<*mut u8> {
    let off = libc::off_t::try_from(offset)
        .map_err(|_| Error::Invalid("mmap offset out of range".into()))?;
    // SAFETY: a fresh shared mapping at an address the kernel picks (no MAP_FIXED), so no
    // existing memory is affected; the descriptor is valid for the call.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            off,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(Error::Io(io::Error::last_os_error()));
    }
    Ok(ptr.cast())
}

enum ImportMapping {
    Sim(std::sync::Arc<crate::sim::mmap::Region>),
    Raw { ptr: *mut u8, len: usize },
}

impl ImportMapping {
    fn ptr(&self) -> *mut u8 {
        match self {
            ImportMapping::Sim(r) => r.as_ptr(),
            ImportMapping::Raw { ptr, .. } => *ptr,
        }
    }
}

impl Drop for ImportMapping {
    fn drop(&mut self) {
        if let ImportMapping::Raw { ptr, len } = *self {
            // SAFETY: ptr/len is exactly the mapping mmap_shared made for this value, which
            // owns it alone; the ImportedPages that exposed it is being dropped.
            if unsafe { libc::munmap(ptr.cast(), len) } != 0 {
                tracing::warn!(error = %io::Error::last_os_error(), "munmap of imported pages");
            }
        }
    }
}

/// Pages another process of this domain granted, mapped here; unmapped on drop.
pub struct ImportedPages {
    ptr: NonNull<u8>,
    len: usize,
    refs: Vec<GrantRef>,
    remote: DomId,
    mapping: ImportMapping,
}

// SAFETY: the value only holds a mapping of shared memory that stays valid until drop;
// every thread may use the address, and byte access is synchronised by its users.
unsafe impl Send for ImportedPages {}
// SAFETY: as Send; &ImportedPages exposes only the address and metadata.
unsafe impl Sync for ImportedPages {}

impl std::fmt::Debug for ImportedPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportedPages")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("pages", &self.refs.len())
            .field("remote", &self.remote)
            .finish()
    }
}

impl ImportedPages {
    /// First byte of the mapping (page aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        debug_assert_eq!(self.ptr.as_ptr(), self.mapping.ptr());
        self.ptr.as_ptr()
    }
    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Always false: exports of zero pages are refused.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The grant refs of the pages, in page order.
    pub fn refs(&self) -> &[GrantRef] {
        &self.refs
    }
    /// The domain the pages are granted to.
    pub fn remote(&self) -> DomId {
        self.remote
    }
}

/// The platform half of an exported port.
#[derive(Debug)]
pub enum PortSource {
    /// `sim`: the port's eventfds and the status page of the handle it belongs to.
    Sim {
        /// The port's own eventfd, signalled when the remote end notifies.
        rx: OwnedFd,
        /// The eventfd that signals the remote end (the remote port's `rx`).
        tx: OwnedFd,
        /// The status page of the handle the port belongs to.
        status: OwnedFd,
        /// The port's word in the status page.
        slot: u32,
        /// The generation the port's slot had when it was opened, so that a reused slot is not
        /// mistaken for this port.
        generation: u32,
    },
    /// `linux`: the evtchn descriptor the port is bound through.
    Linux {
        /// The evtchn descriptor.
        evtchn: OwnedFd,
    },
}

/// Access to one event-channel port, ready to be sent to another process of the domain.
#[derive(Debug)]
pub struct ExportedPort {
    /// The local port number.
    pub port: Port,
    /// The descriptors and what they mean.
    pub source: PortSource,
}

impl ExportedPort {
    /// Append the description to `out` and the descriptors to `fds` (see [`Self::parse`]).
    pub fn emit<'a>(&'a self, out: &mut Vec<u8>, fds: &mut Vec<BorrowedFd<'a>>) {
        match &self.source {
            PortSource::Sim {
                rx,
                tx,
                status,
                slot,
                generation,
            } => {
                out.push(PORT_SIM);
                out.extend_from_slice(&self.port.to_le_bytes());
                out.extend_from_slice(&slot.to_le_bytes());
                out.extend_from_slice(&generation.to_le_bytes());
                fds.extend([rx.as_fd(), tx.as_fd(), status.as_fd()]);
            }
            PortSource::Linux { evtchn } => {
                out.push(PORT_LINUX);
                out.extend_from_slice(&self.port.to_le_bytes());
                fds.push(evtchn.as_fd());
            }
        }
    }

    /// Read a description written by [`Self::emit`], taking its descriptors from `fds`.
    pub fn parse(buf: &mut &[u8], fds: &mut VecDeque<OwnedFd>) -> Result<ExportedPort> {
        let mut r = HandoffReader(buf);
        let kind = r.u8()?;
        let port = r.u32()?;
        let mut take = || {
            fds.pop_front()
                .ok_or_else(|| Error::Protocol("port export without its descriptors".into()))
        };
        let source = match kind {
            PORT_SIM => {
                let slot = r.u32()?;
                let generation = r.u32()?;
                if slot as usize >= crate::sim::proto::STATUS_SLOTS {
                    return Err(Error::Protocol(format!("status slot {slot} out of range")));
                }
                PortSource::Sim {
                    rx: take()?,
                    tx: take()?,
                    status: take()?,
                    slot,
                    generation,
                }
            }
            PORT_LINUX => PortSource::Linux { evtchn: take()? },
            other => return Err(Error::Protocol(format!("unknown port export kind {other}"))),
        };
        *buf = r.0;
        Ok(ExportedPort { port, source })
    }

    /// Start using the port in this process.
    pub fn import(self) -> Result<ImportedPort> {
        let inner = match self.source {
            PortSource::Sim {
                rx,
                tx,
                status,
                slot,
                generation,
            } => {
                let notifier = crate::sim::evtchn::SimNotifier::imported(
                    self.port, tx, status, slot, generation,
                )?;
                PortInner::Sim {
                    rx,
                    notifier: Arc::new(notifier),
                }
            }
            PortSource::Linux { evtchn } => {
                let handle = crate::linux::LinuxEventChannels::from_fd(evtchn);
                let notifier = crate::EventChannels::notifier(&handle, self.port)?;
                PortInner::Linux { handle, notifier }
            }
        };
        Ok(ImportedPort {
            port: self.port,
            inner,
        })
    }
}

enum PortInner {
    Sim {
        rx: OwnedFd,
        notifier: Arc<crate::sim::evtchn::SimNotifier>,
    },
    Linux {
        handle: crate::linux::LinuxEventChannels,
        notifier: Arc<dyn PortNotifier>,
    },
}

/// An event-channel port another process of this domain owns, used from here.
///
/// Incoming events make [`ImportedPort::fd`] readable; [`ImportedPort::take_pending`]
/// consumes that indication (and re-enables delivery), [`ImportedPort::wait`] blocks for
/// it. The usual discipline applies: re-check the ring after taking an event, and arm the
/// ring's event index before waiting.
pub struct ImportedPort {
    port: Port,
    inner: PortInner,
}

impl std::fmt::Debug for ImportedPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportedPort")
            .field("port", &self.port)
            .finish()
    }
}

impl ImportedPort {
    /// The port number (local to the domain).
    pub fn port(&self) -> Port {
        self.port
    }

    /// Signal the remote end.
    pub fn notify(&self) -> Result<()> {
        match &self.inner {
            PortInner::Sim { notifier, .. } => notifier.notify(),
            PortInner::Linux { notifier, .. } => notifier.notify(),
        }
    }

    /// A cheap notifier for the data path.
    pub fn notifier(&self) -> Arc<dyn PortNotifier> {
        match &self.inner {
            PortInner::Sim { notifier, .. } => notifier.clone(),
            PortInner::Linux { notifier, .. } => notifier.clone(),
        }
    }

    /// A descriptor that polls readable while an event is pending.
    pub fn fd(&self) -> RawFd {
        match &self.inner {
            PortInner::Sim { rx, .. } => rx.as_raw_fd(),
            PortInner::Linux { handle, .. } => crate::EventChannels::fd(handle),
        }
    }

    /// Consume a pending event without blocking; true if there was one.
    pub fn take_pending(&self) -> Result<bool> {
        match &self.inner {
            PortInner::Sim { rx, .. } => {
                let mut buf = [0u8; 8];
                loop {
                    match nix::unistd::read(rx.as_raw_fd(), &mut buf) {
                        Ok(_) => return Ok(true),
                        Err(Errno::EINTR) => continue,
                        Err(Errno::EAGAIN) => return Ok(false),
                        Err(e) => return Err(Error::Io(e.into())),
                    }
                }
            }
            PortInner::Linux { handle, .. } => {
                let mut ports = Vec::new();
                crate::EventChannels::pending(handle, &mut ports)?;
                let mine = ports.contains(&self.port);
                for p in ports {
                    crate::EventChannels::unmask(handle, p)?;
                }
                Ok(mine)
            }
        }
    }

    /// Block until an event is pending (and consume it) or `timeout` passes (None:
    /// forever); true if an event came.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<bool> {
        if self.take_pending()? {
            return Ok(true);
        }
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            let left = match deadline {
                None => PollTimeout::NONE,
                Some(d) => {
                    let left = d.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return self.take_pending();
                    }
                    let ms = left.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
                    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
                }
            };
            // SAFETY: the descriptor belongs to this value and stays open during the poll.
            let fd = unsafe { BorrowedFd::borrow_raw(self.fd()) };
            let mut pfd = [PollFd::new(fd, PollFlags::POLLIN)];
            match nix::poll::poll(&mut pfd, left) {
                Ok(0) => continue,
                Ok(_) => {
                    if self.take_pending()? {
                        return Ok(true);
                    }
                }
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(Error::Io(e.into())),
            }
        }
    }

    /// True once the port can no longer carry events: the remote end or the owner closed
    /// it. Only the simulator can tell; on `linux` this is always false.
    pub fn is_closed(&self) -> bool {
        match &self.inner {
            PortInner::Sim { notifier, .. } => notifier.is_closed(),
            PortInner::Linux { .. } => false,
        }
    }
}

/// Send one message (`body` prefixed by its little-endian `u32` length) with `fds`
/// attached to its first byte. Never raises SIGPIPE.
pub fn send_message(sock: &UnixStream, body: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    crate::fdframe::send(sock, body, fds, MAX_MESSAGE_FDS)
}

/// Receive one message of at most `max` body bytes with the descriptors sent along.
/// `Ok(None)` is an orderly close between messages.
pub fn recv_message(sock: &UnixStream, max: usize) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    crate::fdframe::recv(sock, max, MAX_MESSAGE_FDS)
}

fn put_u32s(out: &mut Vec<u8>, v: &[u32]) {
    out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

/// Bounded little-endian reads from the front of a slice.
struct HandoffReader<'a>(&'a [u8]);

impl<'a> HandoffReader<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(Error::Protocol(format!(
                "export description truncated: need {n} bytes, have {}",
                self.0.len()
            )));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.bytes(1)?[0])
    }
    fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(Error::Protocol(format!("flag byte {v}"))),
        }
    }
    fn u16(&mut self) -> Result<u16> {
        let b = self.bytes(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64> {
        let lo = u64::from(self.u32()?);
        let hi = u64::from(self.u32()?);
        Ok(hi << 32 | lo)
    }
    fn u32s(&mut self, max: usize) -> Result<Vec<u32>> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(Error::Protocol(format!(
                "list of {n} entries (at most {max})"
            )));
        }
        let body = self.bytes(n * 4)?;
        Ok(body
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn memfile(pages: usize) -> std::fs::File {
        let mut f = tempfile();
        for i in 0..pages {
            f.write_all(&vec![i as u8 + 10; PAGE_SIZE]).unwrap();
        }
        f
    }

    fn tempfile() -> std::fs::File {
        let path = std::env::temp_dir().join(format!(
            "xmx-handoff-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }

    fn sim_export(frames: Vec<u32>) -> ExportedPages {
        let f = memfile(8);
        ExportedPages {
            fd: f.into(),
            refs: frames.iter().map(|f| f + 100).collect(),
            layout: PagesLayout::SimFrames { frames },
            remote: 0,
            writable: true,
        }
    }

    #[test]
    fn pages_descriptions_round_trip_over_a_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let exp = sim_export(vec![3, 1, 7]);
        let mut body = Vec::new();
        let mut fds = Vec::new();
        exp.emit(&mut body, &mut fds);
        send_message(&a, &body, &fds).unwrap();
        let (got, fds) = recv_message(&b, 1 << 16).unwrap().unwrap();
        assert_eq!(got, body);
        let mut fds: VecDeque<OwnedFd> = fds.into();
        let mut rest = &got[..];
        let back = ExportedPages::parse(&mut rest, &mut fds).unwrap();
        assert!(rest.is_empty() && fds.is_empty());
        assert_eq!(back.refs, vec![103, 101, 107]);
        assert_eq!(back.layout, exp.layout);
        let pages = back.import().unwrap();
        assert_eq!(pages.len(), 3 * PAGE_SIZE);
        // Page i of the import is frame frames[i] of the file.
        for (i, frame) in [3u8, 1, 7].iter().enumerate() {
            // SAFETY: the mapping holds three readable pages.
            let b = unsafe { *pages.as_ptr().add(i * PAGE_SIZE + 5) };
            assert_eq!(b, frame + 10);
        }
    }

    #[test]
    fn gntalloc_layout_maps_at_its_offset() {
        let f = memfile(4);
        let exp = ExportedPages {
            fd: f.into(),
            refs: vec![9, 10],
            layout: PagesLayout::Gntalloc {
                offset: 2 * PAGE_SIZE as u64,
            },
            remote: 0,
            writable: true,
        };
        let pages = exp.import().unwrap();
        // SAFETY: two readable pages mapped.
        let (first, second) = unsafe { (*pages.as_ptr(), *pages.as_ptr().add(PAGE_SIZE)) };
        assert_eq!((first, second), (12, 13));
    }

    #[test]
    fn malformed_descriptions_are_refused() {
        let exp = sim_export(vec![0, 1]);
        let mut body = Vec::new();
        let mut fds = Vec::new();
        exp.emit(&mut body, &mut fds);
        // Every truncation is an error, never a panic.
        for cut in 0..body.len() {
            let mut fds: VecDeque<OwnedFd> = VecDeque::new();
            fds.push_back(exp.fd.try_clone().unwrap());
            let mut part = &body[..cut];
            assert!(
                ExportedPages::parse(&mut part, &mut fds).is_err(),
                "cut {cut}"
            );
        }
        // Missing descriptor.
        let mut whole = &body[..];
        assert!(ExportedPages::parse(&mut whole, &mut VecDeque::new()).is_err());
        // Unknown kind, bad flag, frames that do not match the refs, huge counts.
        let mut bad = body.clone();
        bad[0] = 9;
        assert!(ExportedPages::parse(&mut &bad[..], &mut one_fd()).is_err());
        let mut bad = body.clone();
        bad[3] = 2;
        assert!(ExportedPages::parse(&mut &bad[..], &mut one_fd()).is_err());
        let mut bad = Vec::from(&body[..4]);
        bad.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(ExportedPages::parse(&mut &bad[..], &mut one_fd()).is_err());
        let mut bad = Vec::from(&body[..4]);
        put_u32s(&mut bad, &[1, 2]);
        put_u32s(&mut bad, &[1]);
        assert!(ExportedPages::parse(&mut &bad[..], &mut one_fd()).is_err());
        let mut bad = Vec::from(&body[..4]);
        put_u32s(&mut bad, &[]);
        put_u32s(&mut bad, &[]);
        assert!(ExportedPages::parse(&mut &bad[..], &mut one_fd()).is_err());
    }

    fn one_fd() -> VecDeque<OwnedFd> {
        let mut v = VecDeque::new();
        v.push_back(tempfile().into());
        v
    }

    #[test]
    fn port_descriptions_refuse_garbage() {
        let mut fds = VecDeque::new();
        assert!(ExportedPort::parse(&mut &[][..], &mut fds).is_err());
        let mut body = vec![PORT_SIM];
        body.extend_from_slice(&5u32.to_le_bytes());
        body.extend_from_slice(&(crate::sim::proto::STATUS_SLOTS as u32).to_le_bytes());
        body.extend_from_slice(&1u32.to_le_bytes());
        assert!(ExportedPort::parse(&mut &body[..], &mut fds).is_err());
        let mut body = vec![PORT_LINUX];
        body.extend_from_slice(&5u32.to_le_bytes());
        // No descriptor.
        assert!(ExportedPort::parse(&mut &body[..], &mut fds).is_err());
        let mut body = vec![7u8];
        body.extend_from_slice(&[0; 4]);
        assert!(ExportedPort::parse(&mut &body[..], &mut one_fd()).is_err());
    }

    #[test]
    fn messages_refuse_too_many_descriptors() {
        let (a, _b) = UnixStream::pair().unwrap();
        let f = tempfile();
        let fds: Vec<BorrowedFd<'_>> = (0..MAX_MESSAGE_FDS + 1).map(|_| f.as_fd()).collect();
        assert!(send_message(&a, b"x", &fds).is_err());
    }

    #[test]
    fn messages_over_the_limit_and_torn_messages_are_errors() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&100u32.to_le_bytes()).unwrap();
        assert!(recv_message(&b, 99).is_err());
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&10u32.to_le_bytes()).unwrap();
        a.write_all(b"abc").unwrap();
        drop(a);
        assert!(recv_message(&b, 100).is_err());
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        assert!(recv_message(&b, 100).unwrap().is_none());
    }
}

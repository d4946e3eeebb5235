//! Event channels of a simulated domain (like one open of /dev/xen/evtchn).
//!
//! Each port is a pair of eventfds made by the daemon: `rx` wakes this port's holder,
//! `tx` wakes the remote end (it is the remote port's `rx`). Notifying is one `write(2)`
//! on `tx`, without talking to the daemon. The handle's pollable fd is an epoll set over
//! the ports' `rx` with `EPOLLONESHOT`: a port reported pending stays masked until
//! [`EventChannels::unmask`] re-arms it, which reports it again at once if it was
//! signalled meanwhile — evtchn's mask-on-delivery.
//!
//! Whether a port is still connected is read from a status page the daemon shares with
//! the handle (one word per port, see [`super::proto`]): notifying a port whose remote
//! end closed fails with [`Error::Closed`]; notifying one not yet bound is dropped, as
//! Xen drops sends on an unbound port. When the remote end closes, the port is also
//! signalled once so its holder wakes up and can see it.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};

use super::conn::HvConn;
use super::mmap::Region;
use super::proto::{
    split_status_word, SimRequest, SimResponse, GENERATION_MASK, PORT_BOUND, PORT_PEER_CLOSED,
    PORT_UNBOUND,
};
use crate::handoff::{dup, PortSource};
use crate::{DomId, Error, EventChannels, ExportedPort, Port, PortNotifier, Result};

/// What a port is connected to, as the daemon reports it (EVTCHNOP_status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortStatus {
    /// Waiting for `remote` to bind (also the state after the remote end closed).
    Unbound {
        /// The domain allowed to bind.
        remote: DomId,
    },
    /// Connected to `remote_port` of `remote`.
    Interdomain {
        /// The domain at the other end.
        remote: DomId,
        /// The port at the other end, in `remote`'s numbering.
        remote_port: Port,
    },
}

/// The shared, read-only status page of one handle.
struct StatusPageView {
    region: Region,
    slots: usize,
    /// Kept for handing the page to another process with a port (see [`crate::handoff`]).
    fd: OwnedFd,
}

impl StatusPageView {
    fn load(&self, slot: usize) -> u32 {
        if slot >= self.slots {
            return 0;
        }
        // SAFETY: slot < slots and the region holds `slots` u32 words (checked when the
        // page was mapped), so the address is in bounds and 4-byte aligned (the region is
        // page aligned). AtomicU32 has u32's layout; the daemon writes these words only
        // with atomic stores, and the Region stays mapped while `self` lives.
        let word = unsafe { &*(self.region.as_ptr().add(slot * 4) as *const AtomicU32) };
        word.load(Ordering::Acquire)
    }
}

/// Signals one port: a `write(2)` on its `tx` eventfd after one load of its status word.
pub struct SimNotifier {
    port: Port,
    tx: OwnedFd,
    status: Arc<StatusPageView>,
    slot: usize,
    generation: u32,
}

impl SimNotifier {
    /// A notifier for a port another process exported (see [`crate::handoff`]): its `tx`
    /// eventfd and the status page of the handle that owns it.
    pub(crate) fn imported(
        port: Port,
        tx: OwnedFd,
        status: OwnedFd,
        slot: u32,
        generation: u32,
    ) -> Result<SimNotifier> {
        let slot = slot as usize;
        if slot >= super::proto::STATUS_SLOTS {
            return Err(Error::Protocol(format!("status slot {slot} out of range")));
        }
        let region = Region::map_file(status.as_fd(), crate::PAGE_SIZE, false)?;
        Ok(SimNotifier {
            port,
            tx,
            status: Arc::new(StatusPageView {
                region,
                slots: super::proto::STATUS_SLOTS,
                fd: status,
            }),
            slot,
            generation: generation & GENERATION_MASK,
        })
    }

    /// True once the port is closed at either end (its status word says so).
    pub fn is_closed(&self) -> bool {
        let (generation, state) = split_status_word(self.status.load(self.slot));
        generation != self.generation || !matches!(state, PORT_BOUND | PORT_UNBOUND)
    }
}

impl PortNotifier for SimNotifier {
    fn notify(&self) -> Result<()> {
        let (generation, state) = split_status_word(self.status.load(self.slot));
        if generation != self.generation {
            return Err(Error::Closed(format!("port {} is closed", self.port)));
        }
        match state {
            PORT_BOUND => signal(&self.tx),
            PORT_UNBOUND => Ok(()),
            PORT_PEER_CLOSED => Err(Error::Closed(format!(
                "the remote end of port {} closed",
                self.port
            ))),
            _ => Err(Error::Closed(format!("port {} is closed", self.port))),
        }
    }
}

/// Add one to an eventfd's counter; a saturated counter is already pending.
pub(crate) fn signal(fd: &OwnedFd) -> Result<()> {
    loop {
        match nix::unistd::write(fd.as_fd(), &1u64.to_ne_bytes()) {
            Ok(_) | Err(Errno::EAGAIN) => return Ok(()),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(Error::Io(e.into())),
        }
    }
}

/// Reset an eventfd's counter; nothing to read is fine.
fn drain(fd: &OwnedFd) {
    let mut buf = [0u8; 8];
    loop {
        match nix::unistd::read(fd.as_raw_fd(), &mut buf) {
            Err(Errno::EINTR) => continue,
            _ => return,
        }
    }
}

struct LocalPort {
    rx: OwnedFd,
    notifier: Arc<SimNotifier>,
    /// Handed to another process: its events are no longer ours to take.
    exported: bool,
}

/// An event-channel handle of a simulated domain; dropping it closes its ports.
pub struct SimEventChannels {
    conn: HvConn,
    epoll: Epoll,
    status: Arc<StatusPageView>,
    ports: Mutex<HashMap<Port, LocalPort>>,
}

impl SimEventChannels {
    /// Open a handle for `domid` of the simhv at `dir`.
    pub fn open(dir: &Path, domid: DomId) -> Result<SimEventChannels> {
        let conn = HvConn::connect(dir, domid)?;
        let (resp, fds) = conn.call(&SimRequest::EvtchnOpen)?;
        let SimResponse::EvtchnOpened { slots } = resp else {
            return Err(Error::Protocol("unexpected reply to evtchn open".into()));
        };
        let slots = slots as usize;
        let page = fds
            .into_iter()
            .next()
            .ok_or_else(|| Error::Protocol("evtchn open without its status page".into()))?;
        if slots == 0 || slots > super::proto::STATUS_SLOTS {
            return Err(Error::Protocol(format!("status page of {slots} slots")));
        }
        let region = Region::map_file(page.as_fd(), crate::PAGE_SIZE, false)?;
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| Error::Io(e.into()))?;
        Ok(SimEventChannels {
            conn,
            epoll,
            status: Arc::new(StatusPageView {
                region,
                slots,
                fd: page,
            }),
            ports: Mutex::new(HashMap::new()),
        })
    }

    /// The daemon's view of `port` (EVTCHNOP_status).
    pub fn status(&self, port: Port) -> Result<PortStatus> {
        let (resp, _) = self.conn.call(&SimRequest::EvtchnStatus { port })?;
        match resp {
            SimResponse::PortStatus {
                state: 1, remote, ..
            } => Ok(PortStatus::Unbound { remote }),
            SimResponse::PortStatus {
                state: 2,
                remote,
                remote_port,
            } => Ok(PortStatus::Interdomain {
                remote,
                remote_port,
            }),
            _ => Err(Error::Protocol("unexpected reply to evtchn status".into())),
        }
    }

    fn lock(&self) -> Result<MutexGuard<'_, HashMap<Port, LocalPort>>> {
        self.ports
            .lock()
            .map_err(|_| Error::Closed("event channel handle poisoned".into()))
    }

    fn armed(port: Port) -> EpollEvent {
        EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLONESHOT, port as u64)
    }

    /// Take in a port the daemon just opened for us.
    fn adopt(&self, resp: SimResponse, fds: Vec<OwnedFd>) -> Result<Port> {
        let SimResponse::PortOpened {
            port,
            slot,
            generation,
        } = resp
        else {
            return Err(Error::Protocol("unexpected reply to a port request".into()));
        };
        let result = (|| {
            let mut fds = fds.into_iter();
            let (Some(rx), Some(tx), None) = (fds.next(), fds.next(), fds.next()) else {
                return Err(Error::Protocol(
                    "a port comes with exactly rx and tx".into(),
                ));
            };
            let slot = slot as usize;
            if slot >= self.status.slots {
                return Err(Error::Protocol(format!("status slot {slot} out of range")));
            }
            self.epoll
                .add(rx.as_fd(), Self::armed(port))
                .map_err(|e| Error::Io(e.into()))?;
            let notifier = Arc::new(SimNotifier {
                port,
                tx,
                status: self.status.clone(),
                slot,
                generation: generation & GENERATION_MASK,
            });
            self.lock()?.insert(
                port,
                LocalPort {
                    rx,
                    notifier,
                    exported: false,
                },
            );
            Ok(port)
        })();
        if result.is_err() {
            let _ = self.conn.call(&SimRequest::EvtchnClose { port });
        }
        result
    }

    fn collect(&self, events: &[EpollEvent], out: &mut Vec<Port>) -> Result<()> {
        let ports = self.lock()?;
        for ev in events {
            let port = ev.data() as Port;
            if let Some(p) = ports.get(&port) {
                drain(&p.rx);
                out.push(port);
            }
        }
        Ok(())
    }
}

impl EventChannels for SimEventChannels {
    fn alloc_unbound(&self, remote: DomId) -> Result<Port> {
        let (resp, fds) = self.conn.call(&SimRequest::EvtchnAllocUnbound { remote })?;
        self.adopt(resp, fds)
    }

    fn bind_interdomain(&self, remote: DomId, remote_port: Port) -> Result<Port> {
        let (resp, fds) = self.conn.call(&SimRequest::EvtchnBind {
            remote,
            remote_port,
        })?;
        self.adopt(resp, fds)
    }

    fn notify(&self, port: Port) -> Result<()> {
        let n = self
            .lock()?
            .get(&port)
            .map(|p| p.notifier.clone())
            .ok_or_else(|| Error::NotFound(format!("port {port}")))?;
        n.notify()
    }

    fn notifier(&self, port: Port) -> Result<Arc<dyn PortNotifier>> {
        let n = self
            .lock()?
            .get(&port)
            .map(|p| p.notifier.clone())
            .ok_or_else(|| Error::NotFound(format!("port {port}")))?;
        Ok(n)
    }

    fn unmask(&self, port: Port) -> Result<()> {
        let ports = self.lock()?;
        let p = ports
            .get(&port)
            .ok_or_else(|| Error::NotFound(format!("port {port}")))?;
        if p.exported {
            return Err(Error::Invalid(format!(
                "port {port} was handed to another process"
            )));
        }
        self.epoll
            .modify(p.rx.as_fd(), &mut Self::armed(port))
            .map_err(|e| Error::Io(e.into()))
    }

    fn close(&self, port: Port) -> Result<()> {
        if !self.lock()?.contains_key(&port) {
            return Err(Error::NotFound(format!("port {port}")));
        }
        let res = self.conn.call(&SimRequest::EvtchnClose { port });
        if let Some(p) = self.lock()?.remove(&port) {
            // The rx eventfd is shared with the daemon and the remote end, so closing our
            // descriptor would not take it out of the epoll set: remove it explicitly.
            let _ = self.epoll.delete(p.rx.as_fd());
        }
        res.map(|_| ())
    }

    fn fd(&self) -> RawFd {
        self.epoll.0.as_raw_fd()
    }

    fn pending(&self, out: &mut Vec<Port>) -> Result<()> {
        self.wait(out, Some(Duration::ZERO))
    }

    fn export_port(&self, port: Port) -> Result<ExportedPort> {
        let mut ports = self.lock()?;
        let p = ports
            .get_mut(&port)
            .ok_or_else(|| Error::NotFound(format!("port {port}")))?;
        let source = PortSource::Sim {
            rx: dup(p.rx.as_fd())?,
            tx: dup(p.notifier.tx.as_fd())?,
            status: dup(self.status.fd.as_fd())?,
            slot: p.notifier.slot as u32,
            generation: p.notifier.generation,
        };
        if !p.exported {
            // The receiver drains rx from now on; our epoll set must not race it for events.
            match self.epoll.delete(p.rx.as_fd()) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(Error::Io(e.into())),
            }
            p.exported = true;
        }
        Ok(ExportedPort { port, source })
    }

    fn wait(&self, out: &mut Vec<Port>, timeout: Option<Duration>) -> Result<()> {
        let timeout = match timeout {
            None => EpollTimeout::NONE,
            Some(d) => {
                // Round up so a short timeout never turns into a busy poll.
                let ms = d.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
                EpollTimeout::try_from(ms).unwrap_or(EpollTimeout::MAX)
            }
        };
        let mut events = [EpollEvent::empty(); 64];
        let n = match self.epoll.wait(&mut events, timeout) {
            Ok(n) => n,
            Err(Errno::EINTR) => 0,
            Err(e) => return Err(Error::Io(e.into())),
        };
        self.collect(&events[..n], out)
    }
}

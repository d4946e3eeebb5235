//! [`PacketSocket`]: one interface, MXoE frames in and out through mmap'd rings.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use libc::c_int;
use xmx_wire::mxoe::Mac;

use super::config::NicConfig;
use super::error::{NicError, Result};
use super::geometry::{rx_frame_size, tx_frame_size, RingGeometry};
use super::ring::{Push, PushWith, RxRing, TxRing};
use super::stats::NicStats;
use super::sys::{self, InterfaceInfo, RingMapping};
use super::{ETHERTYPE, ETH_HEADER_LEN};

/// PACKET_MR_UNICAST: a secondary unicast address in the NIC's receive filter.
const PACKET_MR_UNICAST: c_int = 3;

/// An AF_PACKET socket on one Ethernet interface, bound to the MXoE ethertype, with a
/// TPACKET_V2 receive ring and transmit ring mapped into this process.
///
/// Frames are whole Ethernet frames without FCS: destination MAC, source MAC, ethertype,
/// payload. The NIC pads short frames on real hardware; veth carries them as given.
pub struct PacketSocket {
    // Field order is drop order: the rings point into the mapping, which is unmapped
    // before `fd` is closed.
    rx: RxRing,
    tx: TxRing,
    _mapping: RingMapping,
    fd: OwnedFd,
    name: String,
    info: InterfaceInfo,
    max_frame_len: usize,
    tx_timeout: Duration,
    stats: NicStats,
    /// What it was opened with, to open it again on a re-created interface.
    cfg: NicConfig,
    netns: Option<String>,
}

// SAFETY: the raw pointers inside `rx`, `tx` and `mapping` refer to the mapping this value
// owns; no other Rust object references that memory. Moving the socket to another thread
// moves the only user of the rings along with it. It is not `Sync`: ring access needs
// `&mut self`.
unsafe impl Send for PacketSocket {}

impl PacketSocket {
    /// Open interface `ifname` of the calling thread's network namespace.
    ///
    /// Fails with [`NicError::NoSuchInterface`] when it does not exist,
    /// [`NicError::NotEthernet`] when it is not Ethernet, and [`NicError::MtuTooSmall`] when
    /// its MTU is below `cfg.min_mtu`.
    pub fn open(ifname: &str, cfg: NicConfig) -> Result<Self> {
        cfg.validate()?;
        sys::ifname_field(ifname)?;
        let fd = sys::packet_socket()?;
        let info = sys::interface_info(fd.as_fd(), ifname)?;
        if info.hw_type != libc::ARPHRD_ETHER {
            return Err(NicError::NotEthernet {
                name: ifname.to_owned(),
                hw_type: info.hw_type,
            });
        }
        if info.mtu < cfg.min_mtu {
            return Err(NicError::MtuTooSmall {
                name: ifname.to_owned(),
                mtu: info.mtu,
                min: cfg.min_mtu,
            });
        }
        let mtu = info.mtu as usize;
        let max_frame_len = mtu + ETH_HEADER_LEN;

        let version = libc::tpacket_versions::TPACKET_V2 as c_int;
        set(
            &fd,
            libc::PACKET_VERSION,
            &version,
            "setsockopt(PACKET_VERSION)",
        )?;
        let qdisc_bypass = cfg.qdisc_bypass && try_set(&fd, libc::PACKET_QDISC_BYPASS, 1);
        let ignore_outgoing = try_set(&fd, libc::PACKET_IGNORE_OUTGOING, 1);
        // Without PACKET_LOSS the kernel parks on a frame it refuses (say, too long after
        // the MTU shrank) and sends nothing behind it until that slot is rewritten; with
        // it, the frame is dropped and the ring keeps moving. MX retransmits.
        set(
            &fd,
            libc::PACKET_LOSS,
            &(1 as c_int),
            "setsockopt(PACKET_LOSS)",
        )?;
        let timeout = libc::timeval {
            tv_sec: cfg.tx_timeout.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
            tv_usec: cfg.tx_timeout.subsec_micros() as libc::suseconds_t,
        };
        sys::set_option(fd.as_fd(), libc::SOL_SOCKET, libc::SO_SNDTIMEO, &timeout).map_err(
            |source| NicError::Sys {
                op: "setsockopt(SO_SNDTIMEO)",
                source,
            },
        )?;

        let page = sys::page_size();
        let too_large = NicError::InvalidConfig("interface MTU too large for a ring slot");
        let rx_slot = rx_frame_size(mtu).ok_or(too_large)?;
        let tx_slot = tx_frame_size(max_frame_len).ok_or(NicError::InvalidConfig(
            "interface MTU too large for a ring slot",
        ))?;
        let rx_geometry = RingGeometry::new(rx_slot, cfg.rx_frames as usize, page)?;
        let tx_geometry = RingGeometry::new(tx_slot, cfg.tx_frames as usize, page)?;
        set(
            &fd,
            libc::PACKET_RX_RING,
            &rx_geometry.to_req(),
            "setsockopt(PACKET_RX_RING)",
        )?;
        set(
            &fd,
            libc::PACKET_TX_RING,
            &tx_geometry.to_req(),
            "setsockopt(PACKET_TX_RING)",
        )?;
        let total = rx_geometry
            .size()
            .checked_add(tx_geometry.size())
            .ok_or(NicError::InvalidConfig("rings too large"))?;
        let mapping = RingMapping::new(fd.as_fd(), total)?;
        // The kernel maps the receive ring first and the transmit ring right after it.
        let tx_base = mapping
            .at(rx_geometry.size())
            .ok_or(NicError::InvalidConfig("rings too large"))?;
        // SAFETY: the mapping holds `rx_geometry.size()` bytes of receive ring at its
        // page-aligned start and lives as long as the socket (field order); only this ring
        // and the kernel, which keeps the TPACKET_V2 protocol, access that memory.
        let rx = unsafe { RxRing::new(mapping.base(), rx_geometry) };
        // SAFETY: the transmit ring follows at `rx_geometry.size()`, a multiple of the page
        // size, and spans `tx_geometry.size()` bytes up to the end of the mapping; the
        // same lifetime and exclusivity hold.
        let tx = unsafe { TxRing::new(tx_base, tx_geometry) };

        if cfg.promiscuous {
            sys::membership(fd.as_fd(), info.index, libc::PACKET_MR_PROMISC, None, true).map_err(
                |source| NicError::Sys {
                    op: "setsockopt(PACKET_ADD_MEMBERSHIP, promiscuous)",
                    source,
                },
            )?;
        }
        sys::bind(fd.as_fd(), info.index, ETHERTYPE)?;

        tracing::debug!(
            ifname,
            ifindex = info.index,
            mtu,
            mac = %Mac(info.mac),
            rx_slots = rx_geometry.frame_nr(),
            rx_slot = rx_geometry.frame_size(),
            rx_block = rx_geometry.block_size(),
            tx_slots = tx_geometry.frame_nr(),
            tx_slot = tx_geometry.frame_size(),
            tx_block = tx_geometry.block_size(),
            qdisc_bypass,
            ignore_outgoing,
            "packet socket open"
        );
        Ok(Self {
            rx,
            tx,
            _mapping: mapping,
            fd,
            name: ifname.to_owned(),
            info,
            max_frame_len,
            tx_timeout: cfg.tx_timeout,
            stats: NicStats::default(),
            cfg,
            netns: None,
        })
    }

    /// Open interface `ifname` of network namespace `netns` (a name under /run/netns or a
    /// path). The socket stays in that namespace and may be used from any thread.
    pub fn open_in_netns(netns: &str, ifname: &str, cfg: NicConfig) -> Result<Self> {
        let mut socket = super::netns::run_in(netns, || Self::open(ifname, cfg))??;
        socket.netns = Some(netns.to_owned());
        Ok(socket)
    }

    /// Take the error the kernel holds for the socket: ENETDOWN once the interface went
    /// down or away. Until it is taken the socket polls as failed, so a poller that
    /// ignored it would spin.
    pub fn take_error(&self) -> Result<Option<io::Error>> {
        sys::take_socket_error(self.fd.as_fd()).map_err(|source| NicError::Sys {
            op: "getsockopt(SO_ERROR)",
            source,
        })
    }

    /// A socket on the interface that now bears this one's name, opened as this one was,
    /// when that is another interface (deleted and created again): this socket is bound
    /// to the old one and never carries a frame again. `None` while the name still names
    /// the interface of this socket (down, renamed back, or up again: the kernel resumes
    /// the socket by itself) or names nothing.
    pub fn reopen_if_replaced(&self) -> Result<Option<Self>> {
        let name = self.name.as_str();
        let lookup = || {
            let cname = std::ffi::CString::new(name).ok()?;
            // SAFETY: a NUL-terminated string that outlives the call.
            Some(unsafe { libc::if_nametoindex(cname.as_ptr()) })
        };
        let index = match &self.netns {
            None => lookup(),
            Some(ns) => super::netns::run_in(ns, lookup)?,
        };
        match index {
            Some(i) if i != 0 && i != self.info.index => match &self.netns {
                None => Self::open(&self.name, self.cfg.clone()).map(Some),
                Some(ns) => Self::open_in_netns(ns, &self.name, self.cfg.clone()).map(Some),
            },
            _ => Ok(None),
        }
    }

    /// Queue `frame` in the transmit ring. It leaves at the next [`flush`](Self::flush);
    /// when the ring is full, this flushes and waits (up to the configured `tx_timeout`)
    /// for the kernel to free a slot.
    pub fn send(&mut self, frame: &[u8]) -> Result<()> {
        if frame.len() < ETH_HEADER_LEN {
            return Err(NicError::FrameTooShort { len: frame.len() });
        }
        if frame.len() > self.max_frame_len {
            return Err(NicError::FrameTooLong {
                len: frame.len(),
                max: self.max_frame_len,
            });
        }
        if self.tx.try_push(frame, &mut self.stats)? == Push::Queued {
            return Ok(());
        }
        self.stats.tx_ring_full += 1;
        tracing::trace!(ifname = %self.name, "transmit ring full");
        // Hand over everything queued and wait until the kernel has sent it.
        self.send_blocking()?;
        self.tx.mark_flushed();
        match self.tx.try_push(frame, &mut self.stats)? {
            Push::Queued => Ok(()),
            Push::Full => Err(NicError::TxStalled {
                timeout: self.tx_timeout,
            }),
        }
    }

    /// Let `fill` write the next frame straight into the transmit ring (no copy through
    /// a buffer of the caller's); it gets a slot of [`max_frame_len`](Self::max_frame_len)
    /// bytes and returns the frame's length, 0 for none. The frame leaves at the next
    /// [`flush`](Self::flush); returns its length. When the ring is full this flushes
    /// and waits (up to `tx_timeout`) for a slot before `fill` is called.
    pub fn send_with(&mut self, mut fill: impl FnMut(&mut [u8]) -> usize) -> Result<usize> {
        let max = self.max_frame_len;
        match self.tx.try_push_with(max, &mut self.stats, &mut fill)? {
            PushWith::Queued(n) => return Ok(n),
            PushWith::Nothing => return Ok(0),
            PushWith::Full => {}
        }
        self.stats.tx_ring_full += 1;
        tracing::trace!(ifname = %self.name, "transmit ring full");
        self.send_blocking()?;
        self.tx.mark_flushed();
        match self.tx.try_push_with(max, &mut self.stats, &mut fill)? {
            PushWith::Queued(n) => Ok(n),
            PushWith::Nothing => Ok(0),
            PushWith::Full => Err(NicError::TxStalled {
                timeout: self.tx_timeout,
            }),
        }
    }

    /// Transmit everything queued, with one `send()` when the kernel takes the whole
    /// batch at once. Does nothing when nothing is queued.
    pub fn flush(&mut self) -> Result<()> {
        if !self.tx.has_unflushed() {
            return Ok(());
        }
        self.kick()?;
        if self.tx.last_queued_waiting() {
            // The kernel ran out of socket buffer before the end of the batch: finish it
            // with a call that waits for transmit completions.
            self.send_blocking()?;
        }
        self.tx.mark_flushed();
        Ok(())
    }

    /// Queue every frame of `frames` and flush once. Returns the number sent.
    pub fn send_batch<I>(&mut self, frames: I) -> Result<usize>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        let mut n = 0;
        for frame in frames {
            self.send(frame.as_ref())?;
            n += 1;
        }
        self.flush()?;
        tracing::trace!(ifname = %self.name, frames = n, "batch sent");
        Ok(n)
    }

    /// Lend every frame waiting in the receive ring to `f`, oldest first, without
    /// blocking and without copying. Returns the number of frames delivered. At most one
    /// ring's worth is drained per call, so a flood cannot keep the caller here forever.
    pub fn recv(&mut self, mut f: impl FnMut(&[u8])) -> usize {
        let max = self.rx.frames();
        self.rx.drain(max, &mut self.stats, &mut f)
    }

    /// Block until a frame is waiting or `timeout` passes (`None`: no limit). Returns
    /// whether a frame is waiting. Fails when the kernel reports a socket error (for
    /// example ENETDOWN when the interface goes down).
    pub fn wait_readable(&mut self, timeout: Option<Duration>) -> Result<bool> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if self.rx.is_ready() {
                return Ok(true);
            }
            let remaining = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(r) if !r.is_zero() => Some(r),
                    _ => return Ok(false),
                },
            };
            match sys::poll_fd(self.fd.as_fd(), libc::POLLIN, remaining) {
                Ok(0) => return Ok(self.rx.is_ready()),
                Ok(revents) => {
                    if revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
                        let source = sys::take_socket_error(self.fd.as_fd())
                            .ok()
                            .flatten()
                            .unwrap_or_else(|| {
                                io::Error::other(format!("poll events {revents:#x}"))
                            });
                        return Err(NicError::Sys {
                            op: "packet socket",
                            source,
                        });
                    }
                    if revents & libc::POLLIN != 0 {
                        return Ok(true);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(NicError::Sys {
                        op: "ppoll",
                        source,
                    })
                }
            }
        }
    }

    /// Receive with low latency without monopolising a core: poll the ring for up to
    /// `spin`, then sleep in the kernel until a frame arrives or `timeout` (counted from
    /// the end of the spin; `None`: no limit) passes. Returns the frames delivered to `f`;
    /// 0 only on timeout.
    pub fn poll_spin_then_block(
        &mut self,
        spin: Duration,
        timeout: Option<Duration>,
        mut f: impl FnMut(&[u8]),
    ) -> Result<usize> {
        let start = Instant::now();
        loop {
            let n = self.recv(&mut f);
            if n > 0 {
                return Ok(n);
            }
            if start.elapsed() >= spin {
                break;
            }
            std::hint::spin_loop();
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let remaining = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(r) if !r.is_zero() => Some(r),
                    _ => return Ok(0),
                },
            };
            if !self.wait_readable(remaining)? {
                return Ok(0);
            }
            let n = self.recv(&mut f);
            if n > 0 {
                return Ok(n);
            }
        }
    }

    /// Counters since open; folds in the kernel's drop count, which reading resets.
    pub fn stats(&mut self) -> Result<NicStats> {
        let drops = sys::packet_drops(self.fd.as_fd())?;
        self.stats.rx_drops += u64::from(drops);
        Ok(self.stats)
    }

    /// Also receive frames sent to `mac` on NICs that filter unicast addresses (a guest's
    /// virtual MAC). The kernel removes the address when the socket closes.
    pub fn add_unicast_address(&self, mac: Mac) -> Result<()> {
        sys::membership(
            self.fd.as_fd(),
            self.info.index,
            PACKET_MR_UNICAST,
            Some(mac.0),
            true,
        )
        .map_err(|source| NicError::Sys {
            op: "setsockopt(PACKET_ADD_MEMBERSHIP, unicast)",
            source,
        })
    }

    /// Undo [`add_unicast_address`](Self::add_unicast_address).
    pub fn remove_unicast_address(&self, mac: Mac) -> Result<()> {
        sys::membership(
            self.fd.as_fd(),
            self.info.index,
            PACKET_MR_UNICAST,
            Some(mac.0),
            false,
        )
        .map_err(|source| NicError::Sys {
            op: "setsockopt(PACKET_DROP_MEMBERSHIP, unicast)",
            source,
        })
    }

    /// The socket, for poll/epoll (readable: a frame is waiting).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The interface's MAC address.
    pub fn mac(&self) -> Mac {
        Mac(self.info.mac)
    }

    /// The interface's index.
    pub fn ifindex(&self) -> u32 {
        self.info.index
    }

    /// The interface's name.
    pub fn ifname(&self) -> &str {
        &self.name
    }

    /// The interface's MTU when the socket was opened.
    pub fn mtu(&self) -> u32 {
        self.info.mtu
    }

    /// Longest frame [`send`](Self::send) accepts: MTU plus Ethernet header.
    pub fn max_frame_len(&self) -> usize {
        self.max_frame_len
    }

    /// Slots in the receive ring.
    pub fn rx_ring_frames(&self) -> usize {
        self.rx.frames()
    }

    /// Slots in the transmit ring.
    pub fn tx_ring_frames(&self) -> usize {
        self.tx.frames()
    }

    /// One non-blocking `send()`: the kernel takes queued frames until it runs out of
    /// socket buffer.
    fn kick(&mut self) -> Result<()> {
        loop {
            let result = sys::send_ring(self.fd.as_fd(), libc::MSG_DONTWAIT);
            self.stats.tx_syscalls += 1;
            match result {
                Ok(_) => return Ok(()),
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR) => {}
                    Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                        self.stats.tx_backpressure += 1;
                        tracing::trace!(ifname = %self.name, error = %e, "transmit backpressure");
                        return Ok(());
                    }
                    _ => {
                        return Err(NicError::Sys {
                            op: "send(PACKET_TX_RING)",
                            source: e,
                        })
                    }
                },
            }
        }
    }

    /// A blocking `send()`: the kernel takes every queued frame and returns once all of
    /// them have left (bounded by SO_SNDTIMEO = `tx_timeout`).
    fn send_blocking(&mut self) -> Result<()> {
        let deadline = Instant::now() + self.tx_timeout;
        loop {
            let result = sys::send_ring(self.fd.as_fd(), 0);
            self.stats.tx_syscalls += 1;
            let e = match result {
                Ok(_) => return Ok(()),
                Err(e) => e,
            };
            match e.raw_os_error() {
                Some(libc::EINTR) => {}
                // The driver queue is full; the kernel keeps the frame queued in the ring.
                Some(libc::ENOBUFS) => {
                    self.stats.tx_backpressure += 1;
                    std::thread::yield_now();
                }
                Some(libc::EAGAIN) | Some(libc::ETIMEDOUT) => {
                    return Err(NicError::TxStalled {
                        timeout: self.tx_timeout,
                    })
                }
                _ => {
                    return Err(NicError::Sys {
                        op: "send(PACKET_TX_RING)",
                        source: e,
                    })
                }
            }
            if Instant::now() >= deadline {
                return Err(NicError::TxStalled {
                    timeout: self.tx_timeout,
                });
            }
        }
    }
}

impl AsFd for PacketSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for PacketSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl std::fmt::Debug for PacketSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacketSocket")
            .field("ifname", &self.name)
            .field("ifindex", &self.info.index)
            .field("mtu", &self.info.mtu)
            .field("mac", &Mac(self.info.mac))
            .field("fd", &self.fd.as_raw_fd())
            .finish()
    }
}

/// Set a SOL_PACKET option that must succeed.
fn set<T: Copy>(fd: &OwnedFd, name: c_int, value: &T, op: &'static str) -> Result<()> {
    sys::set_option(fd.as_fd(), libc::SOL_PACKET, name, value)
        .map_err(|source| NicError::Sys { op, source })
}

/// Set an optional SOL_PACKET flag; older kernels lack some. Returns whether it took.
fn try_set(fd: &OwnedFd, name: c_int, value: c_int) -> bool {
    match sys::set_option(fd.as_fd(), libc::SOL_PACKET, name, &value) {
        Ok(()) => true,
        Err(error) => {
            tracing::debug!(option = name, %error, "optional packet socket option not available");
            false
        }
    }
}

//! The native transport: the backend's MX engine and the AF_PACKET NIC in
//! this process, without Xen.
//!
//! The process is one MX board on the interface `XMX_IFACE`: one engine
//! ([`xmx_engine`]) serving one virtual NIC whose board address is
//! the interface's MAC, on a [`PacketSocket`]. A frame the protocol core
//! emits becomes the engine's send request at once, in the calling thread.
//! LARGE data moves between the wire and the application's buffers directly:
//! the engine's regions are the application's memory ([`memory`]).
//!
//! Frames arriving are taken in by whoever gets there first: an application
//! thread that polls its endpoint, which gets that endpoint's frames straight
//! into its port (one pass from the socket ring through the engine to the
//! core, no mailbox), or the [`driver`] thread (asleep on the socket until
//! then), which leaves them in the endpoints' mailboxes and rings their
//! doorbells.
//!
//! Several processes may share an interface, each with a board of its own:
//! an endpoint index belongs to one process at a time ([`claim`]), so a
//! second open of it is refused (`MX_BUSY`) and `MX_ANY_ENDPOINT` takes one
//! no process holds. Every board sees every frame of the interface and
//! leaves those for an endpoint another process holds to that process
//! (`claim::ClaimsElsewhere`), refusing only those for an endpoint nobody
//! holds. A board reaches another process's endpoints on its own interface
//! through the endpoints' lanes (`claim::BoardLanes`), not the link; the
//! driver and a sleeping application wake on the link and the lanes alike
//! (the lanes in one epoll set, `Board::lanes_fd`).
//!
//! Environment (read at `mx_init`; see libmx/README.md):
//! `XMX_IFACE`, `XMX_HOSTNAME`, `XMX_PEERS`, `XMX_NIC_SPIN_US`,
//! `XMX_QDISC_BYPASS`, `XMX_ACK_DELAY_US`, `XMX_RESEND_DELAY_US`,
//! `XMX_PULL_TIMEOUT_MS`, `XMX_DISCOVERY_MS`, `XMX_LINGER_MS`.

mod board;
mod claim;
mod driver;
mod filter;
mod memory;
mod peers;
mod port;
mod wire;

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use xmx_engine::{pull_reply_frames_for, EngineConfig};
use xmx_mx::Config;
use xmx_nic::{NicConfig, PacketSocket};
use xmx_wire::mxoe::Mac;
use xmx_wire::mxoe::PULL_REPLIES_PER_BLOCK;

use super::{BoardInfo, OpenError, RawPort, Transport, TransportPort};
use crate::abi::MxReturn;
use crate::doorbell::Doorbell;
use crate::errors::{Failure, MxResult};

#[cfg(test)]
pub(crate) use board::BoardCounters;
pub(crate) use peers::{board_name, PeersFileEntry};
#[cfg(test)]
pub(crate) use wire::SeqpacketWire;
pub(crate) use wire::Wire;

use board::{Board, BoardPeerView, Clock, Inbox};
use driver::WakeFd;
use port::NativePort;
use xmx_hv::lock;

/// Endpoints of the native board (MXoE's 8-bit endpoint id).
pub(crate) const MAX_ENDPOINTS: u32 = 256;
/// Default delay of an explicit ack: Open-MX's, a 64th of a second. Within
/// it, the partner's next message carries the ack: a ping-pong costs one
/// frame per message instead of a message and an ack. Nothing waits on it:
/// the core acks a NOTIFY at once, a stream is acked every
/// `imm_ack_threshold` messages, an eager send completes before its ack,
/// and a closing endpoint flushes the acks it owes.
pub(crate) const DEFAULT_ACK_DELAY: Duration = xmx_mx::config::DEFAULT_ACK_DELAY;

/// What the native transport is configured with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NativeConfig {
    /// `XMX_IFACE`: the interface.
    pub(crate) iface: String,
    /// `XMX_HOSTNAME` (else the system hostname), as `host:board`.
    pub(crate) hostname: String,
    /// `XMX_PEERS`: the peers listed in that file.
    pub(crate) peers: Vec<PeersFileEntry>,
    /// `XMX_NIC_SPIN_US` (default 0): how long the driver thread polls the
    /// link after traffic before it sleeps.
    pub(crate) nic_spin: Duration,
    /// `XMX_QDISC_BYPASS` (default 1): frames skip the interface's queueing
    /// discipline (0 lets `tc` shape or impair them).
    pub(crate) qdisc_bypass: bool,
    /// `XMX_ACK_DELAY_US`: the library's explicit-ack delay.
    pub(crate) ack_delay: Duration,
    /// `XMX_RESEND_DELAY_US`: the library's first retransmission delay
    /// (default: MX's).
    pub(crate) resend_delay: Option<Duration>,
    /// `XMX_PULL_TIMEOUT_MS`: how long a pull waits for replies before it
    /// asks again (default: the engine's).
    pub(crate) pull_timeout: Option<Duration>,
    /// `XMX_PULL_REPLY_FRAMES` (1 to 8; default: as many as the link's MTU
    /// takes): frames' worth of data one frame (a PULL_REPLY or a MEDIUM
    /// fragment) carries between xmx boards. 1 keeps to MX's frames, for a
    /// fabric whose switches drop frames longer than the interfaces' MTU
    /// suggests.
    pub(crate) pull_reply_frames: Option<u8>,
    /// `XMX_DISCOVERY_MS` (default 1000): how long a hostname lookup waits
    /// for HOST_REPLY answers.
    pub(crate) discovery_wait: Duration,
    /// `XMX_LINGER_MS` (default one and a half resend delays): how long a
    /// closed endpoint still repeats its last acks to peers that resend (see
    /// `board`); `mx_finalize` waits for the lingering endpoints.
    pub(crate) linger: Duration,
}

fn system_hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its whole length; gethostname
    // writes at most that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

impl NativeConfig {
    /// Reads the configuration through `lookup` (e.g. the environment).
    pub(crate) fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let iface = lookup("XMX_IFACE")
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .ok_or("XMX_IFACE names no interface")?;
        let hostname = board_name(&lookup("XMX_HOSTNAME").unwrap_or_else(system_hostname));
        peers::check_hostname(&hostname)?;
        let peers = match lookup("XMX_PEERS").filter(|p| !p.trim().is_empty()) {
            None => Vec::new(),
            Some(path) => {
                let text = std::fs::read_to_string(path.trim())
                    .map_err(|e| format!("XMX_PEERS={path}: {e}"))?;
                peers::parse_specs(&text).map_err(|e| format!("XMX_PEERS={path}: {e}"))?
            }
        };
        let number = |name: &str| -> Result<Option<u64>, String> {
            lookup(name)
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .map_err(|_| format!("{name}={v}: not a number"))
                })
                .transpose()
        };
        let resend_delay = number("XMX_RESEND_DELAY_US")?.map(Duration::from_micros);
        Ok(NativeConfig {
            iface,
            hostname,
            peers,
            nic_spin: Duration::from_micros(number("XMX_NIC_SPIN_US")?.unwrap_or(0)),
            qdisc_bypass: number("XMX_QDISC_BYPASS")?.unwrap_or(1) != 0,
            ack_delay: number("XMX_ACK_DELAY_US")?.map_or(DEFAULT_ACK_DELAY, Duration::from_micros),
            resend_delay,
            pull_timeout: number("XMX_PULL_TIMEOUT_MS")?.map(Duration::from_millis),
            pull_reply_frames: number("XMX_PULL_REPLY_FRAMES")?
                .map(|n| n.clamp(1, PULL_REPLIES_PER_BLOCK as u64) as u8),
            discovery_wait: Duration::from_millis(number("XMX_DISCOVERY_MS")?.unwrap_or(1000)),
            linger: number("XMX_LINGER_MS")?.map_or_else(
                || super::default_close_linger(resend_delay),
                Duration::from_millis,
            ),
        })
    }

    /// The engine's settings on a link whose longest frame is `max_frame_len`.
    fn engine_config(&self, max_frame_len: usize) -> EngineConfig {
        let mut c = EngineConfig {
            // Between xmx boards, as many frames per PULL_REPLY as the MTU
            // takes (one with MX peers, which never ask and are never sent more).
            pull_reply_frames: self
                .pull_reply_frames
                .unwrap_or_else(|| pull_reply_frames_for(max_frame_len)),
            // A pull lands straight in the application's buffer: nothing to copy
            // out while it goes on.
            pull_progress_step: 0,
            ..EngineConfig::default()
        };
        if let Some(t) = self.pull_timeout {
            c.pull_retransmit_timeout = t.max(Duration::from_millis(1));
        }
        c
    }
}

/// Whether the native transport is the default: no `XMX_TRANSPORT`, an
/// `XMX_IFACE`, and no Xen frontend device in this domain.
pub(crate) fn is_default(lookup: impl Fn(&str) -> Option<String>) -> bool {
    lookup("XMX_TRANSPORT").is_none()
        && lookup("XMX_IFACE").is_some_and(|s| !s.trim().is_empty())
        && !std::path::Path::new("/dev/xen/evtchn").exists()
}

/// What the transport, its ports and the driver thread share.
pub(crate) struct NativeShared {
    board: Mutex<Board>,
    view: Arc<BoardPeerView>,
    hostname: RwLock<String>,
    wake: WakeFd,
    wire_fd: RawFd,
    /// Readable when a lane of ours has frames (see [`Board::lanes_fd`]).
    lanes_fd: RawFd,
    /// Whether the driver thread sleeps on the link (else only on `wake`,
    /// because an application thread polls the link; see `driver`).
    watching: AtomicBool,
    stop: AtomicBool,
    mac: Mac,
    config: NativeConfig,
}

impl NativeShared {
    /// Runs `f` on the board, pumps the engine, and rings the doorbells of
    /// the endpoints that got something once the lock is released (rung
    /// under the lock, a woken thread would run straight into it).
    fn run<T>(&self, f: impl FnOnce(&mut Board, &mut Clock) -> T) -> T {
        let mut rings = Vec::new();
        let r = {
            let mut board = lock(&self.board);
            self.step(&mut board, None, &mut rings, f)
        };
        for m in rings {
            m.ring();
        }
        r
    }

    /// As [`NativeShared::run`] if nobody holds the board, else `None`; `inbox`'s
    /// endpoint gets its frames there (see [`Inbox`]).
    fn try_run<T>(
        &self,
        inbox: Option<Inbox<'_>>,
        f: impl FnOnce(&mut Board, &mut Clock) -> T,
    ) -> Option<T> {
        let mut rings = Vec::new();
        let r = {
            let mut board = match self.board.try_lock() {
                Ok(b) => b,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return None,
            };
            self.step(&mut board, inbox, &mut rings, f)
        };
        for m in rings {
            m.ring();
        }
        Some(r)
    }

    fn step<T>(
        &self,
        board: &mut Board,
        inbox: Option<Inbox<'_>>,
        rings: &mut Vec<Arc<crate::transport::mailbox::Mailbox>>,
        f: impl FnOnce(&mut Board, &mut Clock) -> T,
    ) -> T {
        let mut clock = Clock::default();
        let r = f(board, &mut clock);
        board.pump(&mut clock, inbox);
        if let Some(t) = board.next_timer() {
            let earlier = match board.driver_wake {
                Some(w) => t < w,
                None => true,
            };
            if earlier {
                board.driver_wake = Some(t);
                self.wake.notify();
            }
        }
        board.take_rings(rings);
        r
    }
}

/// The native board of this process. See the module documentation.
pub(crate) struct Native {
    shared: Arc<NativeShared>,
    driver: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Native {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Native")
            .field("mac", &self.shared.mac)
            .field("iface", &self.shared.config.iface)
            .finish_non_exhaustive()
    }
}

fn random_u32() -> u32 {
    let mut v = [0u8; 4];
    // SAFETY: `v` is writable for the 4 bytes getrandom is told.
    let n = unsafe { libc::getrandom(v.as_mut_ptr().cast(), v.len(), 0) };
    if n == 4 {
        return u32::from_ne_bytes(v);
    }
    // Without getrandom, the clock still tells two opens apart.
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0x5eed, |d| d.subsec_nanos() ^ d.as_secs() as u32)
}

impl Native {
    /// Starts a board on `wire` (its MAC is the board address) and its
    /// driver thread.
    pub(crate) fn start(config: NativeConfig, wire: Box<dyn Wire>) -> Result<Arc<Native>, String> {
        let mac = wire.mac();
        let entries = peers::initial_table(mac, &config.hostname, &config.peers)?;
        let view = Arc::new(BoardPeerView::default());
        let board = Board::new(
            config.engine_config(wire.max_frame_len()),
            wire,
            &config.hostname,
            entries,
            view.clone(),
        )?;
        let wire_fd = board.wire_fd();
        let lanes_fd = board.lanes_fd();
        let shared = Arc::new(NativeShared {
            board: Mutex::new(board),
            view,
            hostname: RwLock::new(config.hostname.clone()),
            wake: WakeFd::new().map_err(|e| format!("eventfd: {e}"))?,
            wire_fd,
            lanes_fd,
            watching: AtomicBool::new(true),
            stop: AtomicBool::new(false),
            mac,
            config,
        });
        let for_driver = shared.clone();
        let driver = std::thread::Builder::new()
            .name("mx-native".into())
            .spawn(move || driver::run(for_driver))
            .map_err(|e| format!("driver thread: {e}"))?;
        let native = Arc::new(Native {
            shared,
            driver: Mutex::new(Some(driver)),
        });
        // Ask the peers whose names are unknown now, so the answers are in
        // by the time the application looks a hostname up.
        let unnamed = native.unnamed_peers(None);
        if !unnamed.is_empty() {
            native.query(&unnamed);
        }
        tracing::info!(
            iface = %native.shared.config.iface,
            mac = %mac,
            hostname = %native.shared.config.hostname,
            "native board up"
        );
        Ok(native)
    }

    /// Opens interface `XMX_IFACE` and starts the board on it.
    pub(crate) fn open(config: NativeConfig) -> Result<Arc<Native>, String> {
        let nic = NicConfig {
            qdisc_bypass: config.qdisc_bypass,
            ..NicConfig::default()
        };
        let socket = PacketSocket::open(&config.iface, nic)
            .map_err(|e| format!("interface {}: {e}", config.iface))?;
        Native::start(config, Box::new(socket))
    }

    /// What went wrong so far.
    #[cfg(test)]
    pub(crate) fn counters(&self) -> BoardCounters {
        lock(&self.shared.board).counters().clone()
    }

    /// Frames the engine dropped for `reason`, and the NACKs it sent.
    #[cfg(test)]
    pub(crate) fn engine_drops(&self, reason: xmx_engine::DropReason) -> (u64, u64) {
        lock(&self.shared.board).engine_drops(reason)
    }

    /// Regions currently mapped for the engine.
    #[cfg(test)]
    pub(crate) fn mapped_regions(&self) -> usize {
        lock(&self.shared.board).mapped_regions()
    }

    /// Hits and misses of endpoint `index`'s registration cache.
    #[cfg(test)]
    pub(crate) fn cache_stats(&self, index: u8) -> Option<(u64, u64)> {
        lock(&self.shared.board).cache_stats(index)
    }

    /// Peers without a known hostname (only `only` if given).
    fn unnamed_peers(&self, only: Option<Mac>) -> Vec<Mac> {
        let own = self.shared.mac;
        self.shared.view.read(|t| {
            t.iter()
                .filter(|e| e.hostname.is_empty() && e.mac != own)
                .filter(|e| match only {
                    Some(m) => m == e.mac,
                    None => true,
                })
                .map(|e| e.mac)
                .collect()
        })
    }

    fn query(&self, macs: &[Mac]) {
        self.shared.run(|b, clock| {
            let now = clock.now();
            for &m in macs {
                b.query(now, m);
            }
        });
    }

    /// Looks `find` up in the peer table; while it finds nothing and some
    /// peers (`only`, if given) are unnamed, asks them by HOST_QUERY and
    /// waits for answers, up to `XMX_DISCOVERY_MS`.
    fn discover<T>(
        &self,
        only: Option<Mac>,
        find: impl Fn(&xmx_engine::PeerTable) -> Option<T>,
    ) -> Option<T> {
        const REASK: Duration = Duration::from_millis(100);
        let deadline = Instant::now() + self.shared.config.discovery_wait;
        loop {
            let seen = self.shared.view.learnt();
            if let Some(found) = self.shared.view.read(&find) {
                return Some(found);
            }
            let unnamed = self.unnamed_peers(only);
            let now = Instant::now();
            if unnamed.is_empty() || now >= deadline {
                return None;
            }
            self.query(&unnamed);
            self.shared
                .view
                .wait_learnt(seen, deadline.min(now + REASK));
        }
    }

    fn board_failure(e: String) -> Failure {
        Failure::new(MxReturn::BadParamVal, e)
    }
}

impl Drop for Native {
    fn drop(&mut self) {
        // Lingering endpoints answer through the driver thread until their
        // time is up; the process must not leave before.
        let until = lock(&self.shared.board).lingering_until();
        if let Some(until) = until {
            let left = until.saturating_duration_since(Instant::now());
            tracing::debug!(?left, "waiting for lingering endpoints");
            std::thread::sleep(left);
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.notify();
        if let Some(t) = lock(&self.driver).take() {
            if t.join().is_err() {
                tracing::warn!("native driver thread panicked");
            }
        }
    }
}

fn numa_node(iface: &str) -> u32 {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/device/numa_node"))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(u32::MAX)
}

impl Transport for Native {
    fn name(&self) -> &'static str {
        "native"
    }

    fn boards(&self) -> Vec<BoardInfo> {
        vec![BoardInfo {
            nic_id: self.shared.mac.to_board_addr(),
            hostname: self
                .shared
                .hostname
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            max_endpoints: MAX_ENDPOINTS,
            numa_node: numa_node(&self.shared.config.iface),
        }]
    }

    fn tune(&self, config: Config) -> Config {
        let c = &self.shared.config;
        Config {
            ack_delay: c.ack_delay,
            resend_delay: c.resend_delay.unwrap_or(config.resend_delay),
            ..config
        }
    }

    fn open(
        &self,
        board: u32,
        endpoint: Option<u8>,
        doorbell: Arc<Doorbell>,
        rcache: bool,
    ) -> Result<Box<dyn TransportPort>, OpenError> {
        if board != 0 {
            return Err(OpenError::BoardUnknown(board));
        }
        let session = random_u32();
        let (index, mailbox) = self
            .shared
            .run(|b, _| b.open(endpoint, session, doorbell.clone(), rcache))?;
        Ok(Box::new(NativePort::new(
            self.shared.clone(),
            index,
            session,
            mailbox,
            doorbell,
        )))
    }

    fn peer_index(&self, nic_id: u64) -> Option<u16> {
        let mac = Mac::from_board_addr(nic_id).ok()?;
        self.shared.view.read(|t| t.by_mac(mac).map(|e| e.index))
    }

    fn peer_nic_id(&self, peer_index: u16) -> Option<u64> {
        self.shared
            .view
            .read(|t| t.get(peer_index).map(|e| e.mac.to_board_addr()))
    }

    fn peer_hostname(&self, nic_id: u64) -> Option<String> {
        let mac = Mac::from_board_addr(nic_id).ok()?;
        let known = self.shared.view.read(|t| t.by_mac(mac).is_some());
        if !known {
            return None;
        }
        self.discover(Some(mac), |t| {
            t.by_mac(mac)
                .filter(|e| !e.hostname.is_empty())
                .map(|e| e.hostname.clone())
        })
    }

    fn peer_by_hostname(&self, hostname: &str) -> Option<u64> {
        if hostname.trim().is_empty() {
            return None;
        }
        let board = board_name(hostname);
        self.discover(None, |t| {
            t.iter()
                .find(|e| !e.hostname.is_empty() && (e.hostname == hostname || e.hostname == board))
                .map(|e| e.mac.to_board_addr())
        })
    }

    fn add_peer(&self, nic_id: u64, hostname: Option<&str>) -> MxResult<()> {
        let mac = Mac::from_board_addr(nic_id)
            .map_err(|e| Failure::new(MxReturn::BadParamVal, format!("NIC id: {e}")))?;
        let own = self.shared.mac;
        self.shared
            .run(|b, _| {
                let name = if mac == own { None } else { hostname };
                let entries = peers::with_peer(b.entries(), mac, name)?;
                b.set_peers(entries, name.is_some())
            })
            .map_err(Native::board_failure)
    }

    fn remove_peer(&self, nic_id: u64) -> bool {
        let Ok(mac) = Mac::from_board_addr(nic_id) else {
            return false;
        };
        if mac == self.shared.mac {
            return false;
        }
        self.shared.run(|b, _| {
            if !b.entries().iter().any(|e| e.mac == mac) {
                return false;
            }
            let entries = peers::without_peer(b.entries(), mac);
            b.set_peers(entries, false).is_ok()
        })
    }

    fn set_hostname(&self, board: u32, hostname: &str) -> MxResult<()> {
        if board != 0 {
            return Err(Failure::new(
                MxReturn::BoardUnknown,
                format!("no board {board}"),
            ));
        }
        let name = board_name(hostname);
        self.shared
            .run(|b, _| b.rename(&name))
            .map_err(|e| Failure::new(MxReturn::Busy, format!("renaming the board: {e}")))?;
        *self
            .shared
            .hostname
            .write()
            .unwrap_or_else(|e| e.into_inner()) = name;
        Ok(())
    }

    fn open_raw(&self, _board: u32, _doorbell: Arc<Doorbell>) -> MxResult<Box<dyn RawPort>> {
        Err(Failure::new(
            MxReturn::NoDriver,
            "raw endpoints are not available on the native transport",
        ))
    }
}

/// The process's native board, started on first use and shared by every
/// `mx_init` while it lives.
pub(crate) fn process_wide() -> MxResult<Arc<dyn Transport>> {
    static CURRENT: Mutex<Weak<Native>> = Mutex::new(Weak::new());
    super::process_wide(&CURRENT, "native", || {
        Native::open(NativeConfig::from_lookup(|k| std::env::var(k).ok())?)
    })
}

#[cfg(test)]
mod tests;

//! The loopback transport: the endpoints of one process, one board, frames
//! handed over in memory.
//!
//! MX lets a process open several endpoints and talk to itself; this
//! transport is that case on its own, and what the library's tests run on.
//! A process-wide registry maps endpoint ids to mailboxes; a frame for an
//! endpoint that is not open is answered with the NACK a NIC would send.
//! LARGE data is pulled by copying straight from the sender's registered
//! buffer into the receiver's.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};

use rustc_hash::FxHashMap;
use xmx_mx::{Config, Frame, NackType, PeerAddr, RdmaWindow, RequestId, Status};

use super::peers::PeerDirectory;
use super::rcache::RegCache;
use super::{
    refusal, BoardInfo, OpenError, PullProgress, RawPort, Regions, Transport, TransportPort,
};
use crate::abi::MxReturn;
use crate::doorbell::Doorbell;
use crate::errors::{Failure, MxResult};
use crate::segments::Segments;
use xmx_hv::lock;

/// Endpoints one loopback board can open (MXoE's 8-bit endpoint id).
pub(crate) const MAX_ENDPOINTS: u32 = 256;
/// The board's NIC id: a locally administered MAC, 02:58:4d:00:00:01.
pub(crate) const LOOPBACK_NIC_ID: u64 = 0x0258_4d00_0001;
/// The board's own index in its peer table.
pub(crate) const SELF_PEER: u16 = 0;

fn random_u32() -> u32 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    );
    h.finish() as u32
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

struct LoopMailbox {
    session: u32,
    inbox: Mutex<VecDeque<Frame<Vec<u8>>>>,
    doorbell: Arc<Doorbell>,
    regions: Arc<LoopRegions>,
}

impl LoopMailbox {
    fn deliver(&self, frame: Frame<Vec<u8>>) {
        lock(&self.inbox).push_back(frame);
        self.doorbell.ring();
    }
}

struct RawMailbox {
    id: u64,
    inbox: Mutex<VecDeque<Vec<u8>>>,
    doorbell: Arc<Doorbell>,
}

/// The loopback board and its registry of open endpoints.
pub(crate) struct Loopback {
    hostname: Mutex<String>,
    peers: RwLock<PeerDirectory>,
    ports: RwLock<FxHashMap<u8, Arc<LoopMailbox>>>,
    raws: Mutex<Vec<Arc<RawMailbox>>>,
    next_raw: std::sync::atomic::AtomicU64,
    myself: Weak<Loopback>,
}

impl std::fmt::Debug for Loopback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loopback").finish_non_exhaustive()
    }
}

impl Loopback {
    /// A board of its own (tests use several to stay apart).
    pub(crate) fn new() -> Arc<Self> {
        let hostname = format!("{}:0", system_hostname());
        let mut peers = PeerDirectory::default();
        // The table is empty: the board takes index 0 (SELF_PEER).
        let _ = peers.add(LOOPBACK_NIC_ID, Some(&hostname));
        Arc::new_cyclic(|me| Loopback {
            hostname: Mutex::new(hostname),
            peers: RwLock::new(peers),
            ports: RwLock::new(FxHashMap::default()),
            raws: Mutex::new(Vec::new()),
            next_raw: std::sync::atomic::AtomicU64::new(1),
            myself: me.clone(),
        })
    }

    /// The process's board, shared by every `mx_init` of the process.
    pub(crate) fn process_wide() -> Arc<dyn Transport> {
        static BOARD: OnceLock<Arc<Loopback>> = OnceLock::new();
        BOARD.get_or_init(Loopback::new).clone()
    }

    fn mailbox(&self, endpoint: u8) -> Option<Arc<LoopMailbox>> {
        self.ports
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&endpoint)
            .cloned()
    }
}

impl Transport for Loopback {
    fn name(&self) -> &'static str {
        "loopback"
    }

    fn boards(&self) -> Vec<BoardInfo> {
        vec![BoardInfo {
            nic_id: LOOPBACK_NIC_ID,
            hostname: lock(&self.hostname).clone(),
            max_endpoints: MAX_ENDPOINTS,
            numa_node: u32::MAX,
        }]
    }

    fn tune(&self, config: Config) -> Config {
        // Frames cost a queue push here: ack at once rather than wait for
        // traffic to piggyback on (a LARGE receive completes only when its
        // NOTIFY is acked).
        Config {
            ack_delay: std::time::Duration::ZERO,
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
        let mut ports = self.ports.write().unwrap_or_else(|e| e.into_inner());
        let index = match endpoint {
            Some(i) if ports.contains_key(&i) => return Err(OpenError::Busy(i)),
            Some(i) => i,
            None => (0..=255u8)
                .find(|i| !ports.contains_key(i))
                .ok_or(OpenError::NoResources)?,
        };
        let mailbox = Arc::new(LoopMailbox {
            session: random_u32(),
            inbox: Mutex::new(VecDeque::new()),
            doorbell,
            regions: Arc::new(LoopRegions {
                board: self.myself.clone(),
                table: Mutex::new(RegionTable::new(rcache)),
            }),
        });
        ports.insert(index, mailbox.clone());
        tracing::debug!(index, session = mailbox.session, "loopback endpoint open");
        Ok(Box::new(LoopPort {
            board: self.myself.upgrade().ok_or(OpenError::NoResources)?,
            index,
            mailbox,
        }))
    }

    fn peer_index(&self, nic_id: u64) -> Option<u16> {
        self.peers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .index_of(nic_id)
    }

    fn peer_nic_id(&self, peer_index: u16) -> Option<u64> {
        self.peers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .nic_at(peer_index)
    }

    fn peer_hostname(&self, nic_id: u64) -> Option<String> {
        self.peers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .hostname_of(nic_id)
    }

    fn peer_by_hostname(&self, hostname: &str) -> Option<u64> {
        self.peers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .nic_of(hostname)
    }

    fn add_peer(&self, nic_id: u64, hostname: Option<&str>) -> MxResult<()> {
        self.peers
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .add(nic_id, hostname)
            .map(|_| ())
    }

    fn remove_peer(&self, nic_id: u64) -> bool {
        if nic_id == LOOPBACK_NIC_ID {
            return false;
        }
        self.peers
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(nic_id)
    }

    fn set_hostname(&self, board: u32, hostname: &str) -> MxResult<()> {
        if board != 0 {
            return Err(Failure::new(
                MxReturn::BoardUnknown,
                format!("no board {board}"),
            ));
        }
        *lock(&self.hostname) = hostname.to_owned();
        self.add_peer(LOOPBACK_NIC_ID, Some(hostname))
    }

    fn open_raw(&self, board: u32, doorbell: Arc<Doorbell>) -> MxResult<Box<dyn RawPort>> {
        if board != 0 {
            return Err(Failure::new(
                MxReturn::BoardUnknown,
                format!("no board {board}"),
            ));
        }
        let mailbox = Arc::new(RawMailbox {
            id: self
                .next_raw
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            inbox: Mutex::new(VecDeque::new()),
            doorbell,
        });
        lock(&self.raws).push(mailbox.clone());
        let board = self
            .myself
            .upgrade()
            .ok_or_else(|| Failure::new(MxReturn::BadBadBad, "loopback board gone"))?;
        Ok(Box::new(LoopRaw { board, mailbox }))
    }
}

struct LoopPort {
    board: Arc<Loopback>,
    index: u8,
    mailbox: Arc<LoopMailbox>,
}

impl TransportPort for LoopPort {
    fn index(&self) -> u8 {
        self.index
    }

    fn session(&self) -> u32 {
        self.mailbox.session
    }

    fn transmit(&mut self, mut frame: Frame<Vec<u8>>) {
        if frame.peer_index != SELF_PEER {
            // No other host is reachable from here: lost, as on a wire
            // without that host; the sender times out.
            tracing::debug!(
                peer = frame.peer_index,
                "loopback frame to a remote peer dropped"
            );
            return;
        }
        match self.board.mailbox(frame.dst_endpoint) {
            Some(dst) => {
                frame.peer_index = SELF_PEER;
                dst.deliver(frame);
            }
            None => {
                if let Some(nack) = refusal(&frame, NackType::EndpointClosed) {
                    self.mailbox.deliver(nack);
                }
            }
        }
    }

    fn receive(&mut self) -> Option<Frame<Vec<u8>>> {
        lock(&self.mailbox.inbox).pop_front()
    }

    fn regions(&self) -> Arc<dyn Regions> {
        self.mailbox.regions.clone()
    }
}

impl Drop for LoopPort {
    fn drop(&mut self) {
        let mut ports = self.board.ports.write().unwrap_or_else(|e| e.into_inner());
        if ports
            .get(&self.index)
            .is_some_and(|m| Arc::ptr_eq(m, &self.mailbox))
        {
            ports.remove(&self.index);
        }
        drop(ports);
        // Pulls in progress hold the table lock: they finish first.
        lock(&self.mailbox.regions.table).clear();
        tracing::debug!(index = self.index, "loopback endpoint closed");
    }
}

struct LoopWindow {
    seqnum: u8,
    data: Segments,
}

struct RegionTable {
    windows: FxHashMap<u8, LoopWindow>,
    generations: [u8; 256],
    cursor: u8,
    cache: Option<RegCache<()>>,
}

impl RegionTable {
    fn new(rcache: bool) -> Self {
        RegionTable {
            windows: FxHashMap::default(),
            generations: [0; 256],
            cursor: 0,
            cache: rcache.then(RegCache::default),
        }
    }

    fn clear(&mut self) {
        self.windows.clear();
        if let Some(c) = &mut self.cache {
            *c = RegCache::default();
        }
    }
}

/// An endpoint's registered LARGE buffers.
struct LoopRegions {
    board: Weak<Loopback>,
    table: Mutex<RegionTable>,
}

impl Regions for LoopRegions {
    fn register(&self, data: &Segments) -> Option<RdmaWindow> {
        let mut t = lock(&self.table);
        let start = t.cursor;
        let id = (0..=255u8)
            .map(|k| start.wrapping_add(k))
            .find(|id| !t.windows.contains_key(id))?;
        t.cursor = id.wrapping_add(1);
        let seqnum = t.generations[id as usize].wrapping_add(1);
        t.generations[id as usize] = seqnum;
        if let (Some(cache), [(addr, len)]) = (&mut t.cache, data.parts()) {
            // Nothing to map in memory; the cache only counts reuse here.
            if cache.get(*addr, *len).is_none() {
                cache.insert(*addr, *len, ());
            }
        }
        t.windows.insert(
            id,
            LoopWindow {
                seqnum,
                data: data.clone(),
            },
        );
        Some(RdmaWindow {
            id,
            seqnum,
            offset: 0,
        })
    }

    fn release(&self, window: RdmaWindow) {
        let mut t = lock(&self.table);
        if t.windows
            .get(&window.id)
            .is_some_and(|w| w.seqnum == window.seqnum)
        {
            t.windows.remove(&window.id);
        }
    }

    fn invalidate(&self, addr: usize, len: usize) {
        if let Some(c) = &mut lock(&self.table).cache {
            c.invalidate(addr, len);
        }
    }

    fn pull(
        &self,
        _id: RequestId,
        source: PeerAddr,
        window: RdmaWindow,
        dest: &Segments,
        length: u32,
    ) -> PullProgress {
        let found = (source.peer_index == SELF_PEER)
            .then(|| self.board.upgrade())
            .flatten()
            .and_then(|b| b.mailbox(source.endpoint));
        let Some(src) = found else {
            return PullProgress::Done(Err(Status::BadRdmawin));
        };
        // Holding the sender's table keeps its window from being released
        // (or its endpoint closed) during the copy.
        let t = lock(&src.regions.table);
        let Some(w) = t
            .windows
            .get(&window.id)
            .filter(|w| w.seqnum == window.seqnum)
        else {
            return PullProgress::Done(Err(Status::BadRdmawin));
        };
        let copied = w.data.copy_into(dest, length as usize);
        if copied < (length as usize).min(dest.len()) {
            return PullProgress::Done(Err(Status::BadRdmawin));
        }
        PullProgress::Done(Ok(()))
    }
}

struct LoopRaw {
    board: Arc<Loopback>,
    mailbox: Arc<RawMailbox>,
}

impl RawPort for LoopRaw {
    fn send(&mut self, data: &[u8]) -> MxResult<()> {
        let others: Vec<Arc<RawMailbox>> = lock(&self.board.raws)
            .iter()
            .filter(|m| m.id != self.mailbox.id)
            .cloned()
            .collect();
        for m in others {
            lock(&m.inbox).push_back(data.to_vec());
            m.doorbell.ring();
        }
        Ok(())
    }

    fn receive(&mut self) -> Option<Vec<u8>> {
        lock(&self.mailbox.inbox).pop_front()
    }
}

impl Drop for LoopRaw {
    fn drop(&mut self) {
        lock(&self.board.raws).retain(|m| m.id != self.mailbox.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use xmx_mx::frame::ConnectRequest;
    use xmx_mx::{Body, Seqnum};

    fn bell() -> Arc<Doorbell> {
        Arc::new(Doorbell::new(Duration::ZERO, 0, None))
    }

    fn connect_frame(to: u8, from: u8) -> Frame<Vec<u8>> {
        Frame {
            peer_index: SELF_PEER,
            dst_endpoint: to,
            src_endpoint: from,
            body: Body::ConnectRequest(ConnectRequest {
                lib_seqnum: 0,
                src_session: 1,
                app_key: 2,
                target_recv_seqnum_start: Seqnum::from_raw(0),
                connect_seqnum: 0,
            }),
        }
    }

    #[test]
    fn delivery_and_refusal() {
        let lo = Loopback::new();
        let b1 = bell();
        let mut a = lo.open(0, Some(1), b1.clone(), false).unwrap();
        let mut b = lo.open(0, None, bell(), false).unwrap();
        assert_eq!(b.index(), 0);
        assert_eq!(
            lo.open(0, Some(1), bell(), false).err(),
            Some(OpenError::Busy(1))
        );
        assert_eq!(
            lo.open(1, None, bell(), false).err(),
            Some(OpenError::BoardUnknown(1))
        );

        b.transmit(connect_frame(1, 0));
        assert_eq!(b1.generation(), 1, "arrival rang the doorbell");
        let got = a.receive().expect("delivered");
        assert_eq!((got.src_endpoint, got.dst_endpoint), (0, 1));

        a.transmit(connect_frame(9, 1));
        let nack = a.receive().expect("refused");
        assert!(matches!(nack.body, Body::Nack(n) if n.nack_type == 2));
        assert_eq!(nack.src_endpoint, 9);

        drop(b);
        a.transmit(connect_frame(0, 1));
        assert!(matches!(a.receive().map(|f| f.body), Some(Body::Nack(_))));
    }

    #[test]
    fn pull_copies_from_the_registered_window_until_release() {
        let lo = Loopback::new();
        let sender = lo.open(0, Some(3), bell(), true).unwrap();
        let receiver = lo.open(0, Some(4), bell(), false).unwrap();
        let data: Vec<u8> = (0..100u8).collect();
        let mut out = vec![0u8; 60];
        // SAFETY: both buffers outlive the pulls below.
        let (src, dst) = unsafe {
            (
                Segments::from_parts(vec![(data.as_ptr() as usize, data.len())]),
                Segments::from_parts(vec![(out.as_mut_ptr() as usize, out.len())]),
            )
        };
        let w = sender.regions().register(&src).unwrap();
        let from = PeerAddr::new(SELF_PEER, 3);
        let r = receiver.regions();
        assert_eq!(
            r.pull(RequestId(1), from, w, &dst, 60),
            PullProgress::Done(Ok(()))
        );
        assert_eq!(out, data[..60]);
        let stale = RdmaWindow {
            seqnum: w.seqnum.wrapping_add(1),
            ..w
        };
        assert_eq!(
            r.pull(RequestId(1), from, stale, &dst, 60),
            PullProgress::Done(Err(Status::BadRdmawin))
        );
        sender.regions().release(w);
        assert_eq!(
            r.pull(RequestId(1), from, w, &dst, 60),
            PullProgress::Done(Err(Status::BadRdmawin))
        );
    }

    #[test]
    fn raw_frames_reach_the_other_raw_endpoints() {
        let lo = Loopback::new();
        let mut a = lo.open_raw(0, bell()).unwrap();
        let mut b = lo.open_raw(0, bell()).unwrap();
        a.send(b"query").unwrap();
        assert_eq!(b.receive().as_deref(), Some(&b"query"[..]));
        assert_eq!(a.receive(), None);
    }
}

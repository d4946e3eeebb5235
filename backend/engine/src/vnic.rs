//! One guest as the engine serves it: a virtual MX NIC with its own board MAC, virtual
//! cluster, endpoints, registered regions and counters.

use std::collections::VecDeque;
use std::time::Instant;

use rustc_hash::FxHashMap;
use xmx_wire::mxoe::{Mac, NackType};

use super::memory::{GuestMemory, RegionHandle};
use super::pull::PullSlots;
use super::wide::WideMedium;
use super::{ClusterId, EngineConfig, GuestId};

/// Why the engine dropped a frame or a packet for a guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The packet after the head did not parse.
    Malformed,
    /// The source MAC is not in the peer table.
    UnknownSource,
    /// The source belongs to another virtual cluster.
    CrossCluster,
    /// The destination endpoint index is beyond the guest's limit (NACK_LIB/MCP sent).
    BadEndpoint,
    /// The destination endpoint is closed (NACK sent, except for TRUC).
    EndpointClosed,
    /// The session id is not the endpoint's (NACK sent, except for TRUC).
    BadSession,
    /// A PULL for an unknown region or a range outside it (NACK_MCP sent).
    BadRegion,
    /// No free receive-queue slot for a MEDIUM fragment.
    RecvQueueFull,
    /// Too many events already wait for the endpoint.
    EventQueueFull,
    /// A PULL_REPLY or NACK_MCP for no outstanding pull of this guest, or from another peer.
    StalePull,
    /// A PULL_REPLY whose frame number, offset or length does not fit its pull.
    BadPullReply,
    /// A PULL_REPLY already received.
    DuplicatePullReply,
    /// Guest memory refused an access.
    MemoryFault,
    /// The transmit queue was full.
    TxQueueFull,
    /// The guest's share of the transmit queue was used up.
    TxQuota,
    /// A packet type the engine does not serve (RAW), or a HOST_REPLY with a foreign magic.
    Unsupported,
    /// The destination endpoint is closed while its guest opens it again (after a resume
    /// or a migration, keeping its session): no NACK, so the peer resends.
    EndpointReopening,
    /// A frame that did not fit the NIC's transmit slot, or could not be written into it.
    TxUnwritable,
    /// A PULL of a region whose fill mark the guest has not set (it lent the data another
    /// way): no NACK, the guest is asked to fill it and the peer asks again.
    RegionUnfilled,
    /// For an endpoint another board on the same link holds ([`EndpointsElsewhere`]):
    /// that board answers it, so no NACK.
    EndpointElsewhere,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 20] = [
        DropReason::Malformed,
        DropReason::UnknownSource,
        DropReason::CrossCluster,
        DropReason::BadEndpoint,
        DropReason::EndpointClosed,
        DropReason::BadSession,
        DropReason::BadRegion,
        DropReason::RecvQueueFull,
        DropReason::EventQueueFull,
        DropReason::StalePull,
        DropReason::BadPullReply,
        DropReason::DuplicatePullReply,
        DropReason::MemoryFault,
        DropReason::TxQueueFull,
        DropReason::TxQuota,
        DropReason::Unsupported,
        DropReason::EndpointReopening,
        DropReason::TxUnwritable,
        DropReason::RegionUnfilled,
        DropReason::EndpointElsewhere,
    ];

    fn slot(self) -> usize {
        self as usize
    }
}

/// What happened on one virtual NIC.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NicCounters {
    /// Frames this guest put on the wire.
    pub tx_frames: u64,
    /// Their bytes (Ethernet header included, padding included).
    pub tx_bytes: u64,
    /// Frames this guest sent to co-located guests without touching the wire.
    pub local_frames: u64,
    /// Their bytes.
    pub local_bytes: u64,
    /// Frames received for this guest (wire and co-located) from a known peer of its cluster.
    pub rx_frames: u64,
    /// Their bytes.
    pub rx_bytes: u64,
    /// NACK_LIB and NACK_MCP frames sent on this guest's behalf.
    pub nacks_sent: u64,
    /// Send requests refused because a per-guest quota was reached.
    pub quota_refusals: u64,
    /// Send requests completed with an ERROR event (unreachable peer, other cluster...).
    pub send_errors: u64,
    /// Pulls that completed successfully.
    pub pulls_done: u64,
    /// Pulls that failed (nack, timeout, abort).
    pub pulls_failed: u64,
    /// PULL block requests sent again after a timeout or an early later block.
    pub pull_rerequests: u64,
    /// Broadcasts that told the fabric where the guest's MAC is (not MX frames: not in
    /// `tx_frames`).
    pub announcements: u64,
    /// MEDIUM fragments sent wider than MX's 4 KiB, to xmx peers that allow them.
    pub wide_frags_sent: u64,
    /// Wide MEDIUM fragments received, each split into MX's fragments for the library.
    pub wide_frags_received: u64,
    /// Wide messages sent again at MX's stride (the peer stopped taking them).
    pub wide_downgrades: u64,
    drops: [u64; DropReason::ALL.len()],
}

impl NicCounters {
    /// Frames or packets dropped for `reason`.
    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops.get(reason.slot()).copied().unwrap_or(0)
    }

    /// Drops for all reasons.
    pub fn total_drops(&self) -> u64 {
        self.drops.iter().sum()
    }

    pub(crate) fn drop(&mut self, reason: DropReason) {
        if let Some(c) = self.drops.get_mut(reason.slot()) {
            *c += 1;
        }
    }
}

/// Size and session of an endpoint, decided by the control path when it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointConfig {
    /// Session id packets for this endpoint must carry (chosen by the backend).
    pub session_id: u32,
    /// Slots of the send queue (one 4096-byte MEDIUM fragment each).
    pub send_queue_slots: u16,
    /// Slots of the receive queue.
    pub recv_queue_slots: u16,
}

/// Which endpoint indices of a virtual NIC another board on the same link holds: in
/// native mode every process on an interface is a board of its own on the interface's
/// MAC and sees every frame, and only the process holding an endpoint must answer for
/// it. Asked only for frames to an endpoint this NIC does not have open.
pub trait EndpointsElsewhere: Send {
    /// Whether another board holds endpoint `endpoint` now.
    fn held_elsewhere(&mut self, endpoint: u8) -> bool;
}

/// The guest's identity on the wire, its counters and what it learnt from peers. Kept
/// apart from the endpoints so frames can be sent while an endpoint is borrowed.
pub(crate) struct GuestWire {
    pub id: GuestId,
    pub mac: Mac,
    pub cluster: ClusterId,
    pub hostname: String,
    pub counters: NicCounters,
    /// Our index in each peer's table, as the peer told us (CONNECT, HOST_QUERY/REPLY).
    pub reverse_index: FxHashMap<Mac, u16>,
    /// How long MEDIUM fragments toward each peer may be (their CONNECTs' marks).
    pub wide: WideMedium,
    /// Bytes of this guest's frames waiting in the transmit queue.
    pub tx_bytes_queued: usize,
    /// Its share of the pull budget against other guests' (dom0's QoS weight, >= 1).
    pub weight: u32,
    /// Endpoints the guest is opening again (see
    /// [`Engine::expect_reopen`](super::Engine::expect_reopen)), with the deadline of
    /// the mark: not open yet, but frames for them are not refused until then.
    pub reopening: FxHashMap<u8, Instant>,
    /// Endpoints held by other boards on the link, whose frames are left to them
    /// ([`Engine::set_endpoints_elsewhere`](super::Engine::set_endpoints_elsewhere)).
    pub elsewhere: Option<Box<dyn EndpointsElsewhere>>,
}

impl GuestWire {
    /// Whether a frame for closed endpoint `endpoint` is dropped without a NACK: the
    /// endpoint is coming back with its session, so the peer must resend, not fail; or
    /// another board on the link holds it and answers for it. Not for a frame from our
    /// own MAC (`from_local`): this engine's own frames for another board's endpoints are
    /// handed to that board before they get here (see
    /// [`Engine::transmit_to_boards`](super::Engine::transmit_to_boards)), so one that
    /// still does came from another board for an endpoint it believed ours, and its
    /// sender must hear of the refusal.
    pub fn refuse_silently(&mut self, endpoint: u8, nack_type: NackType, from_local: bool) -> bool {
        if nack_type != NackType::EndpointClosed {
            return false;
        }
        if self.reopening.contains_key(&endpoint) {
            self.counters.drop(DropReason::EndpointReopening);
            return true;
        }
        if from_local
            || !self
                .elsewhere
                .as_mut()
                .is_some_and(|e| e.held_elsewhere(endpoint))
        {
            return false;
        }
        self.counters.drop(DropReason::EndpointElsewhere);
        true
    }
}

/// Resources a guest holds, checked against the per-guest quotas.
#[derive(Debug, Default)]
pub(crate) struct EngineUsage {
    pub regions: usize,
    pub pulls: usize,
    pub pull_bytes: u64,
}

impl EngineUsage {
    /// Whether the quotas take one more pull of `length` bytes. The byte quota bounds
    /// what is outstanding together, never one message: a lone pull is taken whatever
    /// its length (MX's messages reach 4 GiB - 1).
    pub(crate) fn admits_pull(&self, config: &EngineConfig, length: u32) -> bool {
        self.pulls < config.max_pulls_per_guest
            && (self.pulls == 0
                || self.pull_bytes + u64::from(length) <= config.max_pull_bytes_per_guest)
    }
}

/// A registered region.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GuestRegion {
    pub handle: RegionHandle,
    pub length: u64,
}

/// Which receive-queue slots the library has handed back.
#[derive(Debug)]
pub(crate) struct RecvQueue {
    free: VecDeque<u16>,
    in_use: Vec<bool>,
}

impl RecvQueue {
    fn new(slots: u16) -> Self {
        RecvQueue {
            free: (0..slots).collect(),
            in_use: vec![false; usize::from(slots)],
        }
    }

    /// Take the oldest free slot.
    pub fn take(&mut self) -> Option<u16> {
        let slot = self.free.pop_front()?;
        if let Some(u) = self.in_use.get_mut(usize::from(slot)) {
            *u = true;
        }
        Some(slot)
    }

    /// Give a slot back; false if it is out of range or was not taken.
    pub fn give_back(&mut self, slot: u16) -> bool {
        match self.in_use.get_mut(usize::from(slot)) {
            Some(u) if *u => {
                *u = false;
                self.free.push_back(slot);
                true
            }
            _ => false,
        }
    }

    /// Slots currently free.
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }
}

/// An open endpoint.
pub(crate) struct GuestEndpoint {
    pub session: u32,
    pub send_queue_slots: u16,
    pub recvq: RecvQueue,
    pub regions: FxHashMap<u8, GuestRegion>,
    pub pulls: PullSlots,
    /// Re-opened with its session (see `Engine::expect_reopen`) and not used since: its
    /// guest registers its regions again under their ids first, so a PULL for a region
    /// not (yet) registered is dropped, not NACKed, and the peer asks again.
    pub regions_returning: bool,
    /// By region, the window (its seqnum) whose fill was last asked of the guest (a
    /// REGION_WANTED event posted) since the engine last saw the region's mark set: one
    /// event per window, however often its pullers ask. Keyed by window, not region, so
    /// that a stale PULL of a finished send cannot use up the request a later send of the
    /// same region needs.
    pub fill_asked: [Option<u8>; 256],
    next_event_tag: u32,
}

impl GuestEndpoint {
    pub fn new(config: EndpointConfig) -> Self {
        GuestEndpoint {
            session: config.session_id,
            send_queue_slots: config.send_queue_slots,
            recvq: RecvQueue::new(config.recv_queue_slots),
            regions: FxHashMap::default(),
            pulls: PullSlots::default(),
            regions_returning: false,
            fill_asked: [None; 256],
            next_event_tag: 0,
        }
    }

    /// The running tag of the next unsolicited event.
    pub fn next_tag(&mut self) -> u32 {
        let tag = self.next_event_tag;
        self.next_event_tag = tag.wrapping_add(1);
        tag
    }
}

/// A guest served by the engine: its virtual MX NIC.
pub struct VirtualNic {
    pub(crate) link: GuestWire,
    pub(crate) memory: Box<dyn GuestMemory>,
    pub(crate) endpoints: FxHashMap<u8, GuestEndpoint>,
    pub(crate) usage: EngineUsage,
}

impl VirtualNic {
    /// The guest.
    pub fn id(&self) -> GuestId {
        self.link.id
    }

    /// Its board address (chosen by dom0).
    pub fn mac(&self) -> Mac {
        self.link.mac
    }

    /// Its virtual cluster.
    pub fn cluster(&self) -> ClusterId {
        self.link.cluster
    }

    /// The hostname HOST_REPLY announces for it.
    pub fn hostname(&self) -> &str {
        &self.link.hostname
    }

    /// Its QoS weight (see [`Engine::set_guest_weight`](super::Engine::set_guest_weight)).
    pub fn weight(&self) -> u32 {
        self.link.weight
    }

    /// Its counters.
    pub fn counters(&self) -> &NicCounters {
        &self.link.counters
    }

    /// Indices of its open endpoints, ascending.
    pub fn open_endpoints(&self) -> Vec<u8> {
        let mut v: Vec<u8> = self.endpoints.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Free receive-queue slots of an open endpoint.
    pub fn free_recvq_slots(&self, endpoint: u8) -> Option<usize> {
        Some(self.endpoints.get(&endpoint)?.recvq.free_slots())
    }

    /// Pulls outstanding over all endpoints.
    pub fn outstanding_pulls(&self) -> usize {
        self.usage.pulls
    }

    /// Regions registered over all endpoints.
    pub fn registered_regions(&self) -> usize {
        self.usage.regions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recv_queue_hands_out_and_takes_back() {
        let mut q = RecvQueue::new(2);
        assert_eq!(q.take(), Some(0));
        assert_eq!(q.take(), Some(1));
        assert_eq!(q.take(), None);
        assert!(q.give_back(1));
        assert!(!q.give_back(1), "double release");
        assert!(!q.give_back(7), "out of range");
        assert_eq!(q.take(), Some(1));
    }

    #[test]
    fn drop_counters_are_per_reason() {
        let mut c = NicCounters::default();
        c.drop(DropReason::CrossCluster);
        c.drop(DropReason::CrossCluster);
        c.drop(DropReason::Unsupported);
        assert_eq!(c.drops(DropReason::CrossCluster), 2);
        assert_eq!(c.drops(DropReason::Unsupported), 1);
        assert_eq!(c.drops(DropReason::Malformed), 0);
        assert_eq!(c.total_drops(), 3);
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(r.slot(), i);
        }
    }
}

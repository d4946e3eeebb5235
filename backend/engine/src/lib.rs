//! The backend's MX engine: the Open-MX "driver" role, for many guests, as a sans-IO state
//! machine.
//!
//! The engine owns no socket, thread or clock. The daemon feeds it
//! - send requests it copied out of guests' send rings ([`Engine::handle_send`]),
//! - frames received from the NIC ([`Engine::handle_frame`]),
//! - the passing of time ([`Engine::handle_timeout`], due at [`Engine::poll_timeout`]),
//!
//! and collects what it produced: frames for the NIC ([`Engine::poll_transmit`], or
//! [`Engine::poll_transmit_into`] a buffer the caller provides, such as a slot of the NIC's
//! transmit ring: a PULL_REPLY's data is then read from guest memory straight into it),
//! events for endpoint event rings ([`Engine::poll_event`]) and host replies for the peer
//! service ([`Engine::poll_host_reply`]). Guest memory (queues, registered regions) is
//! reached through each guest's [`GuestMemory`].
//!
//! # Roles
//!
//! As Open-MX's kernel driver, the engine builds and parses MXoE frames, demultiplexes them
//! to guests (by destination MAC) and endpoints, NACKs packets for closed endpoints or stale
//! sessions, copies MEDIUM fragments into receive queues and runs the puller's side of
//! LARGE transfers (PULL per block, replies written straight into the registered region,
//! retransmission of PULL requests). Reliability of messages (sequence numbers, acks,
//! resends, matching) stays in the guest's library: the engine passes those fields through.
//!
//! # Identity and isolation
//!
//! Each guest is a virtual MX NIC with a MAC chosen by dom0 ([`GuestConfig`]); every frame
//! built for a guest carries that MAC as source, whatever the guest asks. Peers are named
//! by index in the [`PeerTable`] the peer service pushes; each peer belongs to a virtual
//! cluster and a guest only exchanges traffic with peers of its own cluster: a send
//! elsewhere completes with an ERROR event (`Denied`) and no frame, a received frame from
//! another cluster's peer is dropped. The sender of a received frame is identified by its
//! source MAC (the head's peer index is only the sender's claim); frames from MACs not in
//! the table are dropped. Frames from the wire claiming a co-located guest's MAC are
//! dropped as spoofed.
//!
//! # Co-located guests
//!
//! A frame whose destination is another guest of this engine never reaches the NIC: it is
//! looped back into the receive path before the call returns, so the receiver sees exactly
//! the events it would have seen over the wire and the data is copied from one guest's
//! memory to the other's.
//!
//! # Boards sharing a link
//!
//! In native mode every process on an interface is a board of its own with the
//! interface's MAC ([`Engine::set_endpoints_elsewhere`]). A looped-back frame for an
//! endpoint another board holds cannot reach it through the NIC (a frame sent to one's own
//! address never comes back in): it is handed out instead ([`Engine::transmit_to_boards`])
//! for the caller to deliver, and the other board takes it in with
//! [`Engine::handle_board_frame`], as Open-MX's driver delivers between processes of one
//! host without the wire.
//!
//! # Hostile guests
//!
//! Every field of a send request is checked again here (parsing checked only the format):
//! a request no correct library would issue returns [`Violation`] and changes nothing, so
//! the daemon can disconnect that guest alone. Per-guest quotas (pulls, pull bytes,
//! regions, queued transmit bytes) turn excess into ERROR events (`NoResources`), counted
//! as quota refusals. Nothing a guest or the wire sends makes the engine panic.
//!
//! # Receive-queue slots
//!
//! A RECV_MEDIUM event hands a receive-queue slot to the library. The library gives it
//! back through the daemon, which calls [`Engine::release_recvq_slot`] (the ring ABI has
//! no message for this yet; the daemon may equally release a slot when the application
//! consumes the event that carried it, as Open-MX ties the two).

mod budget;
mod config;
mod error;
mod host;
mod memory;
mod output;
mod peers;
mod pull;
mod rdma;
mod recv;
mod send;
mod vnic;
mod wide;

use std::time::Instant;

use rustc_hash::FxHashMap;
use xmx_wire::msg::{ErrorCode, Event, EventBody};
use xmx_wire::mxoe::{
    FrameRepr, HeadPacket, HeadRepr, Mac, NackType, PacketRepr, HEAD_LEN, HOSTNAME_LEN_MAX,
};

pub use config::{pull_reply_frames_for, EngineConfig};
pub use error::{EngineError, PeerTableError, Violation};
pub use memory::{
    checked_range, GuestMemory, InMemoryGuest, MemoryArea, MemoryError, RegionHandle,
};
pub use output::{GuestEvent, HostReply, Transmit};
pub use peers::{PeerEntry, PeerTable};
pub use pull::pull_magic;
pub use vnic::{DropReason, EndpointConfig, EndpointsElsewhere, NicCounters, VirtualNic};

use budget::{PullBudget, PullKey};
use output::{EngineOutput, Path, ReplyWriteError, TxFrame};
use vnic::{EngineUsage, GuestEndpoint, GuestRegion, GuestWire};

/// A guest, by the id dom0 gives it (its domain id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GuestId(pub u32);

/// A virtual cluster: guests and peers that may talk to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterId(pub u32);

/// How dom0 introduces a guest.
pub struct GuestConfig {
    /// The guest.
    pub id: GuestId,
    /// Its board address, unique among the engine's guests.
    pub mac: Mac,
    /// Its virtual cluster.
    pub cluster: ClusterId,
    /// What HOST_REPLY announces for it (1 to 79 bytes, no NUL).
    pub hostname: String,
    /// Its shared memory.
    pub memory: Box<dyn GuestMemory>,
}

/// What happened to frames before they reached a guest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineCounters {
    /// Frames handed to [`Engine::handle_frame`].
    pub rx_frames: u64,
    /// Frames whose head did not parse (short, other ethertype).
    pub rx_malformed: u64,
    /// Frames for a MAC that is none of our guests'.
    pub rx_unknown_destination: u64,
    /// Frames from the wire whose source MAC is one of our guests', and frames from
    /// other boards whose source MAC is not.
    pub rx_spoofed_source: u64,
    /// Frames handed to [`Engine::handle_board_frame`].
    pub rx_board_frames: u64,
    /// Frames for other boards dropped because too many waited for
    /// [`Engine::transmit_to_boards`].
    pub board_frames_dropped: u64,
}

/// The MX engine of one physical interface. See the module documentation.
pub struct Engine {
    config: EngineConfig,
    guests: FxHashMap<GuestId, VirtualNic>,
    /// Our guests by MAC, with their cluster.
    local: FxHashMap<Mac, (GuestId, ClusterId)>,
    peers: PeerTable,
    out: EngineOutput,
    counters: EngineCounters,
    /// PULL_REPLY frames in flight, all guests together.
    budget: PullBudget,
    /// The latest time a data-path call brought, for grants made on the control path.
    last_now: Option<Instant>,
}

/// The parts of the engine a handler needs besides the guest it works for.
pub(crate) struct Ctx<'a> {
    pub config: &'a EngineConfig,
    pub peers: &'a PeerTable,
    pub local: &'a FxHashMap<Mac, (GuestId, ClusterId)>,
    pub out: &'a mut EngineOutput,
    pub budget: &'a mut PullBudget,
}

impl Ctx<'_> {
    /// Where a frame for `dst` goes.
    pub fn path(&self, dst: Mac) -> Path {
        if self.local.contains_key(&dst) {
            Path::Local
        } else {
            Path::Wire
        }
    }

    /// The index the peer at `peer` knows this guest by: what it told us, else our own
    /// index in the (cluster-wide, hence shared) table, else "unknown".
    pub fn reverse_index(&self, link: &GuestWire, peer: Mac) -> u16 {
        link.reverse_index
            .get(&peer)
            .copied()
            .or_else(|| self.peers.by_mac(link.mac).map(|e| e.index))
            .unwrap_or(u16::MAX)
    }

    /// Complete a send request with an ERROR event.
    pub fn refuse(&mut self, link: &mut GuestWire, endpoint: u8, tag: u32, code: ErrorCode) {
        link.counters.send_errors += 1;
        tracing::debug!(guest = link.id.0, endpoint, tag, ?code, "send refused");
        let body = EventBody::Error { code };
        self.out.completion(link.id, endpoint, Event { tag, body });
    }

    /// Build a frame from the guest to `dst` and queue it; false if it was dropped.
    pub fn send(&mut self, link: &mut GuestWire, dst: Mac, packet: PacketRepr) -> bool {
        self.send_padded(link, dst, packet, &[])
    }

    /// [`Ctx::send`], with `after` written right after the packet, in the Ethernet
    /// padding (an extension MX peers never read; the frame grows if it must).
    pub fn send_padded(
        &mut self,
        link: &mut GuestWire,
        dst: Mac,
        packet: PacketRepr,
        after: &[u8],
    ) -> bool {
        let frame = FrameRepr {
            head: HeadRepr {
                dst,
                src: link.mac,
                dst_src_peer_index: self.reverse_index(link, dst),
            },
            packet,
        };
        let Some(path) = self.room_for(link, dst) else {
            return false;
        };
        let mut buf = match self.out.build(&frame) {
            Ok(buf) => buf,
            Err(e) => {
                tracing::warn!(guest = link.id.0, error = %e, "frame refused by its emitter");
                link.counters.drop(vnic::DropReason::Malformed);
                return false;
            }
        };
        if !after.is_empty() {
            let at = frame.buffer_len();
            if buf.len() < at + after.len() {
                buf.resize(at + after.len(), 0);
            }
            if let Some(pad) = buf.get_mut(at..at + after.len()) {
                pad.copy_from_slice(after);
            }
        }
        self.queue(link, path, buf);
        true
    }

    /// Where a frame from the guest to `dst` goes, or `None` (counted as a drop) when
    /// the NIC's queue is full: asked before a frame is built, so a dropped frame costs
    /// no copy.
    pub fn room_for(&self, link: &mut GuestWire, dst: Mac) -> Option<Path> {
        let path = self.path(dst);
        if path == Path::Wire && !self.out.tx_has_room() {
            link.counters.drop(vnic::DropReason::TxQueueFull);
            return None;
        }
        Some(path)
    }

    /// Queue a PULL_REPLY for the wire that is written only when it leaves (room
    /// asked first with [`Ctx::room_for`]), and count it.
    pub fn queue_reply(&mut self, link: &mut GuestWire, reply: output::DeferredReply) {
        let len = reply.wire_len();
        link.counters.tx_frames += 1;
        link.counters.tx_bytes += len as u64;
        link.tx_bytes_queued += len;
        self.out.tx.push(link.id, TxFrame::Reply(reply));
    }

    /// Queue a frame built for `path` ([`Ctx::room_for`]) and count it.
    pub fn queue(&mut self, link: &mut GuestWire, path: Path, buf: Vec<u8>) {
        let len = buf.len() as u64;
        match path {
            Path::Wire => {
                link.counters.tx_frames += 1;
                link.counters.tx_bytes += len;
                link.tx_bytes_queued += buf.len();
                self.out.tx.push(link.id, TxFrame::Built(buf));
            }
            Path::Local => {
                link.counters.local_frames += 1;
                link.counters.local_bytes += len;
                self.out.loopback.push_back(buf);
            }
        }
    }
}

impl Engine {
    /// An engine serving no guest yet, with an empty peer table.
    pub fn new(config: EngineConfig) -> Self {
        let budget = PullBudget::new(config.pull_frame_budget);
        let out = EngineOutput::new(
            config.buffer_pool_size,
            config.max_tx_frames,
            config.max_pending_events_per_endpoint,
            config.max_host_replies,
        );
        Engine {
            config,
            guests: FxHashMap::default(),
            local: FxHashMap::default(),
            peers: PeerTable::new(),
            out,
            counters: EngineCounters::default(),
            budget,
            last_now: None,
        }
    }

    /// The engine's configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Split the engine into one guest and the rest.
    fn split(&mut self, guest: GuestId) -> Option<(&mut VirtualNic, Ctx<'_>)> {
        let nic = self.guests.get_mut(&guest)?;
        Some((
            nic,
            Ctx {
                config: &self.config,
                peers: &self.peers,
                local: &self.local,
                out: &mut self.out,
                budget: &mut self.budget,
            },
        ))
    }

    // ----- control path -----

    /// Start serving a guest.
    pub fn add_guest(&mut self, guest: GuestConfig) -> Result<(), EngineError> {
        if self.guests.contains_key(&guest.id) {
            return Err(EngineError::GuestExists(guest.id));
        }
        if !guest.mac.is_unicast() || self.local.contains_key(&guest.mac) {
            return Err(EngineError::BadMac(guest.mac));
        }
        let name_ok = !guest.hostname.is_empty()
            && guest.hostname.len() < HOSTNAME_LEN_MAX
            && !guest.hostname.contains('\0');
        if !name_ok {
            return Err(EngineError::BadHostname);
        }
        self.local.insert(guest.mac, (guest.id, guest.cluster));
        self.guests.insert(
            guest.id,
            VirtualNic {
                link: GuestWire {
                    id: guest.id,
                    mac: guest.mac,
                    cluster: guest.cluster,
                    hostname: guest.hostname,
                    counters: NicCounters::default(),
                    reverse_index: FxHashMap::default(),
                    wide: Default::default(),
                    tx_bytes_queued: 0,
                    weight: 1,
                    reopening: Default::default(),
                    elsewhere: None,
                },
                memory: guest.memory,
                endpoints: FxHashMap::default(),
                usage: EngineUsage::default(),
            },
        );
        tracing::info!(guest = guest.id.0, mac = %guest.mac, cluster = guest.cluster.0, "guest attached");
        Ok(())
    }

    /// Stop serving a guest: its endpoints, regions and pulls are dropped without events,
    /// and its queued events are discarded. Its frames already queued for the NIC still go.
    pub fn remove_guest(&mut self, guest: GuestId) -> Result<VirtualNic, EngineError> {
        let nic = self
            .guests
            .remove(&guest)
            .ok_or(EngineError::UnknownGuest(guest))?;
        self.local.remove(&nic.link.mac);
        self.out.purge_events(guest, None);
        self.out.tx.retire(guest);
        let held: u32 = nic
            .endpoints
            .values()
            .flat_map(|ep| ep.pulls.iter())
            .map(|p| p.held_frames())
            .sum();
        self.budget.release(held);
        self.budget.remove_guest(guest);
        self.regrant();
        tracing::info!(guest = guest.0, "guest detached");
        Ok(nic)
    }

    /// A guest's virtual NIC.
    pub fn guest(&self, guest: GuestId) -> Option<&VirtualNic> {
        self.guests.get(&guest)
    }

    /// Whether a pull of `length` bytes by `guest` would be within its quotas now (a
    /// caller that can wait holds a pull back instead of seeing it refused).
    pub fn admits_pull(&self, guest: GuestId, length: u32) -> bool {
        self.guests
            .get(&guest)
            .is_some_and(|nic| nic.usage.admits_pull(&self.config, length))
    }

    /// Every guest's id, ascending.
    pub fn guest_ids(&self) -> Vec<GuestId> {
        let mut ids: Vec<GuestId> = self.guests.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Open endpoint `endpoint` of a guest.
    pub fn open_endpoint(
        &mut self,
        guest: GuestId,
        endpoint: u8,
        config: EndpointConfig,
    ) -> Result<(), EngineError> {
        let limit = self.config.endpoints_per_guest;
        let nic = self
            .guests
            .get_mut(&guest)
            .ok_or(EngineError::UnknownGuest(guest))?;
        if u16::from(endpoint) >= limit {
            return Err(EngineError::BadEndpoint(endpoint));
        }
        if nic.endpoints.contains_key(&endpoint) {
            return Err(EngineError::EndpointBusy(endpoint));
        }
        let mut ep = GuestEndpoint::new(config);
        ep.regions_returning = nic.link.reopening.remove(&endpoint).is_some();
        nic.endpoints.insert(endpoint, ep);
        Ok(())
    }

    /// Tell the fabric where the guest's MAC is now: queue one broadcast RARP request
    /// from it, as a hypervisor announces a migrated guest (QEMU's self-announce), so
    /// that switches learn its new port at once instead of sending its frames to the
    /// host it left. MX receivers ignore it (another ethertype). Done whenever the guest
    /// connects: after a migration, or a resume, the port may have changed.
    pub fn announce(&mut self, guest: GuestId) -> Result<(), EngineError> {
        let nic = self
            .guests
            .get_mut(&guest)
            .ok_or(EngineError::UnknownGuest(guest))?;
        if !self.out.tx_has_room() {
            nic.link.counters.drop(vnic::DropReason::TxQueueFull);
            return Ok(());
        }
        let frame = rarp_announcement(nic.link.mac);
        nic.link.counters.announcements += 1;
        nic.link.tx_bytes_queued += frame.len();
        self.out.tx.push(guest, TxFrame::Built(frame));
        Ok(())
    }

    /// The guest is about to open `endpoints` again, keeping their sessions (after a
    /// resume, or on the host a migration brought it to). Until each opens, frames for it
    /// are dropped without the NACK a closed endpoint gets, so peers resend rather than
    /// fail their requests; their retransmissions reach it once it is open. An endpoint
    /// not open [`EngineConfig::reopen_grace`] after `now` is taken for closed
    /// (its application most likely died meanwhile; see [`Engine::handle_timeout`]).
    pub fn expect_reopen(
        &mut self,
        now: Instant,
        guest: GuestId,
        endpoints: impl IntoIterator<Item = u8>,
    ) -> Result<(), EngineError> {
        let deadline = pull::deadline_after(now, self.config.reopen_grace);
        let nic = self
            .guests
            .get_mut(&guest)
            .ok_or(EngineError::UnknownGuest(guest))?;
        for endpoint in endpoints {
            if !nic.endpoints.contains_key(&endpoint) {
                nic.link.reopening.insert(endpoint, deadline);
            }
        }
        Ok(())
    }

    /// Leave frames for the endpoints `elsewhere` says another board on the link holds
    /// to that board: dropped (counted as [`DropReason::EndpointElsewhere`]) instead of
    /// refused as closed. For a link several boards share (native mode, one board per
    /// process on an interface); a backend owns its NIC and never sets it.
    pub fn set_endpoints_elsewhere(
        &mut self,
        guest: GuestId,
        elsewhere: Box<dyn EndpointsElsewhere>,
    ) -> Result<(), EngineError> {
        let nic = self
            .guests
            .get_mut(&guest)
            .ok_or(EngineError::UnknownGuest(guest))?;
        nic.link.elsewhere = Some(elsewhere);
        Ok(())
    }

    /// Close an endpoint: its regions and pulls are dropped without events, its queued
    /// events discarded; later packets for it are NACKed as closed.
    pub fn close_endpoint(&mut self, guest: GuestId, endpoint: u8) -> Result<(), EngineError> {
        let nic = self
            .guests
            .get_mut(&guest)
            .ok_or(EngineError::UnknownGuest(guest))?;
        let ep = nic
            .endpoints
            .remove(&endpoint)
            .ok_or(EngineError::EndpointNotOpen(endpoint))?;
        nic.usage.regions = nic.usage.regions.saturating_sub(ep.regions.len());
        for pull in ep.pulls.iter() {
            nic.usage.pulls = nic.usage.pulls.saturating_sub(1);
            nic.usage.pull_bytes = nic.usage.pull_bytes.saturating_sub(u64::from(pull.total()));
            self.budget.release(pull.held_frames());
        }
        self.budget.forget_endpoint(guest, endpoint);
        self.out.purge_events(guest, Some(endpoint));
        self.regrant();
        Ok(())
    }

    /// Register a region of `length` bytes whose memory `handle` names.
    pub fn register_region(
        &mut self,
        guest: GuestId,
        endpoint: u8,
        region_id: u8,
        handle: RegionHandle,
        length: u64,
    ) -> Result<(), EngineError> {
        let max = self.config.max_regions_per_guest;
        let nic = self
            .guests
            .get_mut(&guest)
            .ok_or(EngineError::UnknownGuest(guest))?;
        let ep = nic
            .endpoints
            .get_mut(&endpoint)
            .ok_or(EngineError::EndpointNotOpen(endpoint))?;
        if ep.regions.contains_key(&region_id) {
            return Err(EngineError::BadRegion(region_id));
        }
        if length == 0 {
            return Err(EngineError::EmptyRegion);
        }
        if nic.usage.regions >= max {
            nic.link.counters.quota_refusals += 1;
            return Err(EngineError::Quota("regions"));
        }
        ep.regions.insert(region_id, GuestRegion { handle, length });
        nic.usage.regions += 1;
        Ok(())
    }

    /// Deregister a region. Pulls writing into it complete with `Aborted`.
    pub fn deregister_region(
        &mut self,
        guest: GuestId,
        endpoint: u8,
        region_id: u8,
    ) -> Result<RegionHandle, EngineError> {
        let (nic, mut ctx) = self.split(guest).ok_or(EngineError::UnknownGuest(guest))?;
        let ep = nic
            .endpoints
            .get_mut(&endpoint)
            .ok_or(EngineError::EndpointNotOpen(endpoint))?;
        let region = ep
            .regions
            .remove(&region_id)
            .ok_or(EngineError::BadRegion(region_id))?;
        nic.usage.regions = nic.usage.regions.saturating_sub(1);
        let doomed: Vec<u32> = ep
            .pulls
            .iter()
            .filter(|p| p.sink.region == region_id)
            .map(|p| p.wire_handle)
            .collect();
        for handle in doomed {
            rdma::finish_pull(
                &mut ctx,
                &mut nic.link,
                &mut nic.usage,
                ep,
                endpoint,
                handle,
                xmx_wire::msg::DoneStatus::Aborted,
            );
        }
        self.regrant();
        Ok(region.handle)
    }

    /// The library handed a receive-queue slot back.
    pub fn release_recvq_slot(
        &mut self,
        guest: GuestId,
        endpoint: u8,
        slot: u16,
    ) -> Result<(), Violation> {
        let nic = self
            .guests
            .get_mut(&guest)
            .ok_or(Violation::UnknownGuest(guest))?;
        let ep = nic
            .endpoints
            .get_mut(&endpoint)
            .ok_or(Violation::EndpointNotOpen(endpoint))?;
        if ep.recvq.give_back(slot) {
            Ok(())
        } else {
            Err(Violation::BadRecvQueueSlot { slot })
        }
    }

    /// Replace the peer table. Reverse indices learnt from peers are kept (they are keyed
    /// by MAC).
    pub fn set_peers(
        &mut self,
        entries: impl IntoIterator<Item = PeerEntry>,
    ) -> Result<(), PeerTableError> {
        self.peers = PeerTable::from_entries(entries)?;
        tracing::debug!(peers = self.peers.iter().count(), "peer table replaced");
        Ok(())
    }

    /// The peer table.
    pub fn peers(&self) -> &PeerTable {
        &self.peers
    }

    // ----- data path -----

    /// Serve a request a guest put on endpoint `endpoint`'s send ring. `Err` means the
    /// guest broke the protocol and should be disconnected; nothing was done.
    pub fn handle_send(
        &mut self,
        now: Instant,
        guest: GuestId,
        endpoint: u8,
        request: &xmx_wire::msg::SendRequest,
    ) -> Result<(), Violation> {
        let result = self.send_request(now, guest, endpoint, request);
        self.settle(now);
        result
    }

    /// Take in a frame received from the NIC.
    pub fn handle_frame(&mut self, now: Instant, frame: &[u8]) {
        self.counters.rx_frames += 1;
        self.receive(now, frame, Path::Wire);
        self.settle(now);
    }

    /// Take in a frame another board on the link handed over
    /// ([`Engine::transmit_to_boards`] there): it carries one of our own MACs as source
    /// and destination, and is otherwise checked as any frame from the wire. One claiming
    /// any other source is dropped as spoofed.
    pub fn handle_board_frame(&mut self, now: Instant, frame: &[u8]) {
        self.counters.rx_board_frames += 1;
        let from_ours =
            HeadPacket::new_checked(frame).is_ok_and(|head| self.local.contains_key(&head.src()));
        if !from_ours {
            self.counters.rx_spoofed_source += 1;
            return;
        }
        self.receive(now, frame, Path::Local);
        self.settle(now);
    }

    /// Hands every frame waiting for another board on the link to `deliver`, with the
    /// endpoint it is for (which names that board); returns how many.
    pub fn transmit_to_boards(&mut self, mut deliver: impl FnMut(u8, &[u8])) -> usize {
        let mut n = 0;
        while let Some((endpoint, buf)) = self.out.to_boards.pop_front() {
            deliver(endpoint, &buf);
            self.out.recycle(buf);
            n += 1;
        }
        n
    }

    /// Frames waiting for [`Engine::transmit_to_boards`].
    pub fn pending_board_frames(&self) -> usize {
        self.out.to_boards.len()
    }

    /// The endpoint a looped-back frame is for, when another board on the link holds it
    /// and this engine does not: such a frame goes to that board instead of being
    /// refused here.
    fn held_by_another_board(&mut self, frame: &[u8]) -> Option<u8> {
        let head = HeadPacket::new_checked(frame).ok()?;
        let &(guest, _) = self.local.get(&head.dst())?;
        let nic = self.guests.get_mut(&guest)?;
        nic.link.elsewhere.as_ref()?;
        let packet = PacketRepr::parse(frame.get(HEAD_LEN..)?).ok()?;
        let endpoint = pull::addressed_endpoint(&packet)?;
        if nic.endpoints.contains_key(&endpoint) || nic.link.reopening.contains_key(&endpoint) {
            return None;
        }
        nic.link
            .elsewhere
            .as_mut()?
            .held_elsewhere(endpoint)
            .then_some(endpoint)
    }

    /// Let time pass: pulls without progress for a timeout request their blocks again or
    /// fail; endpoints marked re-opening that did not open in time lose the mark.
    pub fn handle_timeout(&mut self, now: Instant) {
        let ids: Vec<GuestId> = self.guests.keys().copied().collect();
        for nic in self.guests.values_mut() {
            nic.link.reopening.retain(|&endpoint, deadline| {
                let keep = *deadline > now;
                if !keep {
                    tracing::warn!(
                        endpoint,
                        mac = %nic.link.mac,
                        "endpoint not re-opened in time: peers' frames for it are refused as closed"
                    );
                }
                keep
            });
        }
        for guest in ids {
            if let Some((nic, mut ctx)) = self.split(guest) {
                rdma::on_timeouts(&mut ctx, nic, now);
            }
        }
        self.settle(now);
    }

    /// When [`Engine::handle_timeout`] should next run, if anything waits for time.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let pulls = self
            .guests
            .values()
            .flat_map(|nic| nic.endpoints.values())
            .flat_map(|ep| ep.pulls.iter())
            .filter(|p| p.has_blocks())
            .map(|p| p.deadline);
        let reopening = self
            .guests
            .values()
            .flat_map(|nic| nic.link.reopening.values().copied());
        pulls.chain(reopening).min()
    }

    /// Budget freed on the control path goes to waiting pulls at once, timed by the
    /// latest data-path call (none yet: nothing can wait for it).
    fn regrant(&mut self) {
        if let Some(now) = self.last_now {
            self.settle(now);
        }
    }

    /// The next frame to put on the NIC, in a buffer of its own (see
    /// [`Engine::poll_transmit_into`] for one the caller provides).
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        loop {
            let (guest, frame) = self.next_transmit()?;
            let reply = match frame {
                TxFrame::Built(bytes) => return Some(Transmit { bytes }),
                TxFrame::Reply(r) => r,
            };
            let Some(nic) = self.guests.get_mut(&guest) else {
                continue;
            };
            let memory = &*nic.memory;
            let written = self
                .out
                .build_in_place(reply.wire_len(), |buf| reply.write(memory, buf).map(drop));
            match written {
                Ok(bytes) => return Some(Transmit { bytes }),
                Err(e) => {
                    if let Some(nack) = refuse_deferred(&mut nic.link, &reply, e) {
                        if let Ok(bytes) = self.out.build(&nack) {
                            return Some(Transmit { bytes });
                        }
                    }
                }
            }
        }
    }

    /// Writes the next frame for the NIC at the start of `out` (a transmit slot) and
    /// returns its length; `None` when no frame waits. A PULL_REPLY's data is read from
    /// guest memory straight into `out`. A frame longer than `out` is dropped (counted),
    /// never cut.
    pub fn poll_transmit_into(&mut self, out: &mut [u8]) -> Option<usize> {
        loop {
            let (guest, frame) = self.next_transmit()?;
            let Some(nic) = self.guests.get_mut(&guest) else {
                if let TxFrame::Built(bytes) = frame {
                    self.out.recycle(bytes);
                }
                continue;
            };
            match frame {
                TxFrame::Built(bytes) => {
                    let len = bytes.len();
                    let fits = out.get_mut(..len).map(|o| o.copy_from_slice(&bytes));
                    self.out.recycle(bytes);
                    match fits {
                        Some(()) => return Some(len),
                        None => nic.link.counters.drop(DropReason::TxUnwritable),
                    }
                }
                TxFrame::Reply(r) => match r.write(&*nic.memory, out) {
                    Ok(len) => return Some(len),
                    Err(e) => {
                        let Some(nack) = refuse_deferred(&mut nic.link, &r, e) else {
                            continue;
                        };
                        let len = nack.wire_len();
                        if let Some(slot) = out.get_mut(..len) {
                            slot.fill(0);
                            if nack.emit(slot).is_ok() {
                                return Some(len);
                            }
                        }
                    }
                },
            }
        }
    }

    /// Writes every waiting frame into a link's transmit slots, one call of `send` per
    /// frame: `send` hands the filler a slot and returns the bytes it sent (0: no slot free,
    /// the rest waits). A frame the link fails is lost, as on a wire; one it fails before
    /// handing out a slot is dropped here, or the loop would not end. Returns the frames
    /// sent; `failed` sees each error.
    pub fn transmit_into<E>(
        &mut self,
        mut send: impl FnMut(&mut dyn FnMut(&mut [u8]) -> usize) -> Result<usize, E>,
        mut failed: impl FnMut(E),
    ) -> usize {
        let mut sent = 0;
        while self.pending_transmits() > 0 {
            let mut taken = false;
            let mut fill = |slot: &mut [u8]| {
                taken = true;
                self.poll_transmit_into(slot).unwrap_or(0)
            };
            match send(&mut fill) {
                Ok(0) => break,
                Ok(_) => sent += 1,
                Err(e) => {
                    failed(e);
                    if !taken {
                        if let Some(t) = self.poll_transmit() {
                            self.recycle(t);
                        }
                    }
                }
            }
        }
        sent
    }

    /// The next frame in the weighted round, its bytes taken off its guest's queue.
    fn next_transmit(&mut self) -> Option<(GuestId, TxFrame)> {
        let guests = &self.guests;
        let weight = |g: GuestId| guests.get(&g).map_or(1, |n| n.link.weight);
        let (guest, frame) = self.out.tx.pop(weight)?;
        if let Some(nic) = self.guests.get_mut(&guest) {
            nic.link.tx_bytes_queued = nic.link.tx_bytes_queued.saturating_sub(frame.len());
        }
        Some((guest, frame))
    }

    /// Give a transmitted frame's buffer back for reuse.
    pub fn recycle(&mut self, transmit: Transmit) {
        self.out.recycle(transmit.bytes);
    }

    /// The next event for an endpoint's event ring.
    pub fn poll_event(&mut self) -> Option<GuestEvent> {
        self.out.pop_event()
    }

    /// The next HOST_REPLY received, for the peer service.
    pub fn poll_host_reply(&mut self) -> Option<HostReply> {
        self.out.host_replies.pop_front()
    }

    /// Ask the board at `dst` for its hostname, on behalf of `guest` (whose MAC is the
    /// source and to which the reply comes back).
    pub fn host_query(
        &mut self,
        now: Instant,
        guest: GuestId,
        dst: Mac,
    ) -> Result<(), EngineError> {
        let (nic, mut ctx) = self.split(guest).ok_or(EngineError::UnknownGuest(guest))?;
        host::send_query(&mut ctx, &mut nic.link, dst);
        self.settle(now);
        Ok(())
    }

    /// Engine-wide counters.
    pub fn counters(&self) -> &EngineCounters {
        &self.counters
    }

    /// Frames waiting for [`Engine::poll_transmit`].
    pub fn pending_transmits(&self) -> usize {
        self.out.tx.len()
    }

    /// Grant free budget to waiting pulls, and process frames sent to co-located guests,
    /// until neither is left.
    fn settle(&mut self, now: Instant) {
        self.last_now = Some(now);
        loop {
            self.dispatch_pulls(now);
            let Some(buf) = self.out.loopback.pop_front() else {
                return;
            };
            if let Some(endpoint) = self.held_by_another_board(&buf) {
                if self.out.to_boards.len() < self.config.max_tx_frames {
                    self.out.to_boards.push_back((endpoint, buf));
                } else {
                    // As a full transmit queue would: MX sends it again.
                    self.counters.board_frames_dropped += 1;
                    self.out.recycle(buf);
                }
                continue;
            }
            self.receive(now, &buf, Path::Local);
            self.out.recycle(buf);
        }
    }

    /// Request blocks of waiting pulls while the budget has room, in the order its
    /// weighted round hands them out.
    fn dispatch_pulls(&mut self, now: Instant) {
        let timeout = self.config.pull_retransmit_timeout;
        loop {
            let guests = &self.guests;
            let weight = |g: GuestId| guests.get(&g).map_or(1, |n| n.link.weight);
            let Some(key) = self.budget.next_grant(weight) else {
                return;
            };
            let PullKey {
                guest,
                endpoint,
                handle,
            } = key;
            let Some((nic, mut ctx)) = self.split(guest) else {
                continue;
            };
            let Some(ep) = nic.endpoints.get_mut(&endpoint) else {
                continue;
            };
            let Some(pull) = ep.pulls.get_mut(handle) else {
                continue;
            };
            pull.queued = false;
            let idle = !pull.has_blocks();
            let Some((position, frames)) = pull.grow() else {
                continue;
            };
            if idle {
                // Its retransmit timer starts with its first requested block.
                pull.deadline = pull::deadline_after(now, timeout);
            }
            if pull.wants_block() {
                pull.queued = true;
                ctx.budget.enqueue(key);
            }
            ctx.budget.charge(guest, frames);
            rdma::request_blocks(&mut ctx, &mut nic.link, ep, endpoint, handle, 1 << position);
        }
    }

    /// Set a guest's weight (at least 1): its share of the pull budget and of the
    /// transmit queue against the other guests' while they all pull or send.
    pub fn set_guest_weight(&mut self, guest: GuestId, weight: u32) -> Result<(), EngineError> {
        let nic = self
            .guests
            .get_mut(&guest)
            .ok_or(EngineError::UnknownGuest(guest))?;
        nic.link.weight = weight.max(1);
        Ok(())
    }

    /// PULL_REPLY frames the engine's pulls may have in flight, all guests together.
    pub fn pull_frame_budget(&self) -> u32 {
        self.budget.frames_max()
    }

    /// Frames of the budget held by requested blocks now.
    pub fn pull_frames_in_flight(&self) -> u32 {
        self.budget.in_flight()
    }

    /// Frames of the budget granted to a guest since it was added.
    pub fn pull_frames_granted(&self, guest: GuestId) -> u64 {
        self.budget.granted(guest)
    }
}

/// Ethertype of RARP.
pub const ETHERTYPE_RARP: u16 = 0x8035;

/// A broadcast RARP request ("who am I", operation 3) from `mac`, padded to the
/// Ethernet minimum of 60 bytes: hardware Ethernet, protocol IPv4, sender and target
/// hardware address `mac`, protocol addresses zero.
pub fn rarp_announcement(mac: Mac) -> Vec<u8> {
    let mut f = Vec::with_capacity(60);
    f.extend_from_slice(&Mac::BROADCAST.0);
    f.extend_from_slice(&mac.0);
    f.extend_from_slice(&ETHERTYPE_RARP.to_be_bytes());
    f.extend_from_slice(&1u16.to_be_bytes());
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    f.extend_from_slice(&[6, 4]);
    f.extend_from_slice(&3u16.to_be_bytes());
    f.extend_from_slice(&mac.0);
    f.extend_from_slice(&[0; 4]);
    f.extend_from_slice(&mac.0);
    f.extend_from_slice(&[0; 4]);
    f.resize(60, 0);
    f
}

/// A deferred PULL_REPLY could not be written: counted, and its data unreadable, the
/// NACK_MCP to send instead (as a reply built at once would have been refused), unless
/// the endpoint re-opens after a move (its peers then ask again).
fn refuse_deferred(
    link: &mut GuestWire,
    reply: &output::DeferredReply,
    e: ReplyWriteError,
) -> Option<FrameRepr<'static>> {
    match e {
        ReplyWriteError::Emit => {
            link.counters.drop(DropReason::TxUnwritable);
            None
        }
        ReplyWriteError::Memory => {
            link.counters.drop(DropReason::MemoryFault);
            if link.refuse_silently(reply.src_endpoint, NackType::BadRdmaWindow, false) {
                return None;
            }
            link.counters.nacks_sent += 1;
            Some(reply.refusal())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guest(id: u32, mac: Mac, hostname: &str) -> GuestConfig {
        GuestConfig {
            id: GuestId(id),
            mac,
            cluster: ClusterId(1),
            hostname: hostname.into(),
            memory: Box::new(InMemoryGuest::new()),
        }
    }

    const MAC: Mac = Mac([2, 0, 0, 0, 0, 1]);

    #[test]
    fn engine_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<Engine>();
    }

    #[test]
    fn guests_need_unique_ids_unicast_macs_and_hostnames() {
        let mut e = Engine::new(EngineConfig::default());
        e.add_guest(guest(1, MAC, "a:0")).unwrap();
        assert_eq!(
            e.add_guest(guest(1, Mac([2, 0, 0, 0, 0, 2]), "b:0")),
            Err(EngineError::GuestExists(GuestId(1)))
        );
        assert_eq!(
            e.add_guest(guest(2, MAC, "b:0")),
            Err(EngineError::BadMac(MAC))
        );
        let group = Mac([3, 0, 0, 0, 0, 2]);
        assert_eq!(
            e.add_guest(guest(2, group, "b:0")),
            Err(EngineError::BadMac(group))
        );
        let other = Mac([2, 0, 0, 0, 0, 2]);
        for bad in ["", "a\0b", &"x".repeat(HOSTNAME_LEN_MAX)] {
            assert_eq!(
                e.add_guest(guest(2, other, bad)),
                Err(EngineError::BadHostname)
            );
        }
        e.add_guest(guest(2, other, &"x".repeat(HOSTNAME_LEN_MAX - 1)))
            .unwrap();
        assert_eq!(e.guest_ids(), vec![GuestId(1), GuestId(2)]);
        assert_eq!(e.remove_guest(GuestId(1)).unwrap().mac(), MAC);
        // The MAC is free again.
        e.add_guest(guest(3, MAC, "c:0")).unwrap();
    }

    #[test]
    fn endpoints_and_regions_are_checked() {
        let config = EngineConfig {
            endpoints_per_guest: 4,
            ..EngineConfig::default()
        };
        let mut e = Engine::new(config);
        e.add_guest(guest(1, MAC, "a:0")).unwrap();
        let g = GuestId(1);
        let ep = EndpointConfig {
            session_id: 7,
            send_queue_slots: 1,
            recv_queue_slots: 1,
        };
        assert_eq!(e.open_endpoint(g, 4, ep), Err(EngineError::BadEndpoint(4)));
        assert_eq!(
            e.open_endpoint(GuestId(9), 0, ep),
            Err(EngineError::UnknownGuest(GuestId(9)))
        );
        e.open_endpoint(g, 3, ep).unwrap();
        assert_eq!(e.open_endpoint(g, 3, ep), Err(EngineError::EndpointBusy(3)));
        let h = RegionHandle(5);
        assert_eq!(
            e.register_region(g, 2, 0, h, 10),
            Err(EngineError::EndpointNotOpen(2))
        );
        assert_eq!(
            e.register_region(g, 3, 0, h, 0),
            Err(EngineError::EmptyRegion)
        );
        e.register_region(g, 3, 0, h, 10).unwrap();
        assert_eq!(
            e.register_region(g, 3, 0, h, 10),
            Err(EngineError::BadRegion(0))
        );
        assert_eq!(e.guest(g).unwrap().registered_regions(), 1);
        assert_eq!(e.deregister_region(g, 3, 1), Err(EngineError::BadRegion(1)));
        assert_eq!(e.deregister_region(g, 3, 0), Ok(h));
        e.register_region(g, 3, 0, h, 10).unwrap();
        // Closing the endpoint releases its regions from the quota.
        e.close_endpoint(g, 3).unwrap();
        assert_eq!(e.guest(g).unwrap().registered_regions(), 0);
        assert_eq!(e.close_endpoint(g, 3), Err(EngineError::EndpointNotOpen(3)));
        assert_eq!(e.guest(g).unwrap().open_endpoints(), Vec::<u8>::new());
    }
}

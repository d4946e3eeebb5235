//! The direct channel between two co-located guests: frames to an endpoint
//! of another guest of this host go through memory the two guests share,
//! not through the backend.
//!
//! dom0 decides who may talk directly (xmxd offers a pair directory in
//! xenstore to two guests of one host and one virtual cluster, see
//! [`xmx_wire::direct`]); the libraries do the rest between themselves. The
//! channel is a second conduit under the same protocol core: a frame the
//! core emits for an endpoint reached by a channel goes onto the channel's
//! ring, and frames taken off the ring are fed to the core like the
//! backend's. The core sequences, acks and retransmits, so
//!
//! - nothing overtakes: the receiving core delivers in seqnum order whatever
//!   path each frame took (an early frame waits for its turn);
//! - nothing is lost: a frame left in a revoked or broken channel, or sent
//!   by the backend because the ring was full, is retransmitted by the
//!   backend path after the resend delay.
//!
//! A channel serves one pair of endpoints. The endpoint of the guest with
//! the lower domain id creates it the first time it sends to the other
//! (grants [`lane::CHANNEL_PAGES`] pages read-write to the peer, allocates an
//! unbound event channel, and writes `refs`, `port` and `state = offered`);
//! the process of the other guest that holds the named endpoint maps the
//! pages, binds the port and writes `state = connected`. Either side ends it
//! (the creator removes its directory, the acceptor writes `closed`); xmxd
//! ends all of a pair's at once by removing the pair directory.
//!
//! Why the library and not the guest daemon maps the channel: a channel
//! lives as long as its endpoint, which lives in the application process,
//! and the platform layer gives a process the same grant, event-channel and
//! xenstore primitives the daemon uses; going through the daemon would only
//! add a round trip and a descriptor hand-off per channel. The daemon stays
//! off the data path either way.
//!
//! The peer's memory is hostile ([`lane`]: copy, then validate, bounded
//! indices; [`codec`]: no panic on any bytes); a frame that claims another
//! endpoint than the channel's is dropped, and a peer that breaks the ring's
//! rules loses this channel only: the endpoint goes on through the backend.

pub(crate) mod codec;
pub(crate) mod lane;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustc_hash::FxHashMap;
use xmx_hv::{
    DomId, EventChannels, GrantTable, GrantedPages, MappedPages, Platform, Port, Xenstore, XBT_NULL,
};
use xmx_mx::frame::{Message, MessageKind};
use xmx_mx::medium::{FRAGS_MAX, FRAG_LENGTH_MAX};
use xmx_mx::{Body, Frame, PeerAddr, RdmaWindow, RequestId, Seqnum, Status, MEDIUM_MAX};
use xmx_wire::direct as names;
use xmx_wire::mxoe::Mac;

use self::codec::{PullHead, DATA, MAX_DATA, PULL, PULL_ERR, PULL_HEAD};
use self::lane::{Broken, Lanes, Pushed, CHANNEL_PAGES};
use super::peers::{read_nodes, PeerView};
use crate::counters::{self, Counter};
use crate::segments::Segments;
use crate::transport::mailbox::Mailbox;
use crate::transport::PullProgress;
use xmx_hv::lock;

/// The watch token of the hub's xenstore connection.
const TOKEN: &str = "xmx-libmx:direct";
/// Records taken off one channel per call, so one busy peer cannot starve
/// the others.
const TAKE_BATCH: usize = 256;
/// The most frames a take-in's list keeps room for between take-ins.
const KEPT_FRAMES: usize = 16;
/// How long a direct pull may go without data before it is finished
/// through the backend (the peer stopped serving it, or is gone).
pub(crate) const PULL_STALL: Duration = Duration::from_secs(1);
/// Frames a faulty side (`XMX_DIRECT_FAULT`) sends correctly first.
const FAULT_AFTER: u64 = 200;

/// Behaviour a test asks of this side of every channel
/// (`XMX_DIRECT_FAULT`): misbehaviour, to check that the peer's library
/// survives it, or a legal extreme no timing would reliably produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// `garbage-index`: a producer index that is not a multiple of 8.
    GarbageIndex,
    /// `rewritten-slot`: a record header claiming 4 GiB.
    RewrittenSlot,
    /// `stop-large`: pulls asked of this side are never served.
    StopLarge,
    /// `unarmed`: this side never asks its peers to signal a frame (a
    /// consumer that only looks when something else wakes it).
    Unarmed,
    /// `busy`: every pull asked of this side finds its list of pulls to
    /// serve full (and is refused: the peer pulls through the backends).
    Busy,
}

impl Fault {
    fn from_env() -> Option<Fault> {
        match std::env::var("XMX_DIRECT_FAULT").ok()?.trim() {
            "garbage-index" => Some(Fault::GarbageIndex),
            "rewritten-slot" => Some(Fault::RewrittenSlot),
            "stop-large" => Some(Fault::StopLarge),
            "unarmed" => Some(Fault::Unarmed),
            "busy" => Some(Fault::Busy),
            _ => None,
        }
    }
}

/// The channel's memory, as this side holds it. Dropping it ends the grant
/// (the creator; the platform keeps pages the peer still maps alive) or
/// unmaps (the acceptor).
enum Memory {
    Granted(GrantedPages),
    Mapped(MappedPages),
}

impl Memory {
    fn base(&self) -> *mut u8 {
        match self {
            Memory::Granted(g) => g.as_ptr(),
            Memory::Mapped(m) => m.as_ptr(),
        }
    }
}

/// One open channel of an endpoint.
struct DirectChannel {
    /// Its xenstore directory.
    dir: String,
    creator: bool,
    peer_domid: DomId,
    /// The acceptor said it is there (always true on the acceptor's side).
    connected: bool,
    /// This side's event-channel port.
    port: Port,
    /// The peer's index in this guest's peer table (the source of its frames).
    peer: PeerAddr,
    /// Declared before `memory`: dropped first, as it points into it.
    lanes: Lanes,
    memory: Memory,
}

/// What an endpoint knows about reaching one remote endpoint directly.
enum DirectSlot {
    Open(Box<DirectChannel>),
    /// No channel, as of offers generation `n`: looked at again when the
    /// offers change.
    Checked(u64),
}

/// A LARGE receive pulling over a channel.
pub(crate) struct DirectSink {
    /// The receive.
    pub(crate) id: RequestId,
    /// The sender.
    pub(crate) source: PeerAddr,
    /// Its window.
    pub(crate) window: RdmaWindow,
    /// Where the data goes.
    pub(crate) dest: Segments,
    /// Bytes pulled.
    pub(crate) length: u32,
    got: u64,
    /// When data last came (or the pull was asked).
    progress: std::time::Instant,
}

impl DirectSink {
    /// A pull of `length` bytes of `source`'s `window` into `dest`, for
    /// receive `id`.
    pub(crate) fn new(
        id: RequestId,
        source: PeerAddr,
        window: RdmaWindow,
        dest: Segments,
        length: u32,
    ) -> DirectSink {
        DirectSink {
            id,
            source,
            window,
            dest,
            length,
            got: 0,
            progress: std::time::Instant::now(),
        }
    }
}

/// A pull a peer asked this endpoint to serve.
struct Job {
    peer: PeerAddr,
    tag: u32,
    window: RdmaWindow,
    length: u32,
    sent: u32,
}

impl Job {
    /// Bytes of data the next DATA record carries.
    fn next_chunk(&self) -> u32 {
        self.length.saturating_sub(self.sent).min(MAX_DATA as u32)
    }
}

/// Pulls one endpoint serves at once; more asked are refused (the peer
/// then pulls through the backend).
const MAX_JOBS: usize = 64;

/// How a direct channel reads the LARGE data this endpoint lends and tells
/// its link what it learns.
/// An open endpoint of this process, as [`Hub::rescan`] sees it: its
/// channels, and where what they hold goes when one ends.
pub(crate) struct HubEndpoint<'a> {
    /// The endpoint's index.
    pub(crate) index: u8,
    /// Its direct state.
    pub(crate) direct: &'a Mutex<EndpointDirect>,
    /// Its mailbox.
    pub(crate) mailbox: &'a Mailbox,
    /// Its link.
    pub(crate) link: &'a mut dyn LinkAccess,
}

pub(crate) trait LinkAccess {
    /// A connect request or reply came off a channel.
    fn observe(&mut self, frame: &Frame<Vec<u8>>);
    /// Copies `n` bytes at `offset` of the data lent under `window` to
    /// `dst`; false if it is not lent or the range is beyond it.
    ///
    /// # Safety
    /// `dst` must be valid for `n` bytes of writes.
    unsafe fn read_lent(
        &mut self,
        window: RdmaWindow,
        offset: usize,
        dst: *mut u8,
        n: usize,
    ) -> bool;
    /// A peer that was lent `window` over a channel may pull it through the
    /// backends now: its data goes into the window.
    fn fill(&mut self, window: RdmaWindow);
}

/// An endpoint's direct channels.
#[derive(Default)]
pub(crate) struct EndpointDirect {
    slots: FxHashMap<PeerAddr, DirectSlot>,
    scratch: Vec<u8>,
    /// The channels a take-in goes through and the frames it took, kept
    /// between take-ins: a ping-pong takes one frame at a time, and
    /// allocating both lists cost it two allocations and frees per frame.
    take_peers: Vec<PeerAddr>,
    take_frames: Vec<Frame<Vec<u8>>>,
    sinks: FxHashMap<u32, DirectSink>,
    /// Pulls whose request found the lane full (of the data this side
    /// serves the same peer, when both pull at once), by tag, oldest first:
    /// asked as soon as there is room. Through the backend instead, the
    /// peer's window would not yet hold its data there, and the pull would
    /// wait for the backend's retry.
    unasked: VecDeque<u32>,
    /// Pulls a take-in finished, for the mailbox.
    finished: Vec<(RequestId, Result<(), Status>)>,
    next_tag: u32,
    jobs: VecDeque<Job>,
    /// Pulls whose channel ended before they finished: the caller pulls
    /// them again through the backend.
    orphans: Vec<DirectSink>,
    /// The endpoint each lent window was announced to (by its RNDV): only
    /// that endpoint may pull it over a channel.
    announced: FxHashMap<(u8, u8), PeerAddr>,
    /// The MEDIUM message (destination, seqnum) whose first fragment went
    /// through the backend: its other fragments follow it there.
    medium_via_backend: Option<(PeerAddr, Seqnum)>,
    /// Windows announced to a peer whose channel ended: it pulls them through
    /// the backends now, so their data goes into them (at once, rather than
    /// when the backend asks after the peer's first pull was refused).
    to_fill: Vec<RdmaWindow>,
}

impl EndpointDirect {
    /// Whether any channel is open (the driver then watches its lanes).
    pub(crate) fn any_open(&self) -> bool {
        self.slots
            .values()
            .any(|s| matches!(s, DirectSlot::Open(_)))
    }

    /// The remote endpoints this endpoint has a channel to.
    fn open_peers(&self) -> Vec<PeerAddr> {
        self.open_peer_addrs().collect()
    }

    fn open_peer_addrs(&self) -> impl Iterator<Item = PeerAddr> + '_ {
        self.slots
            .iter()
            .filter(|(_, s)| matches!(s, DirectSlot::Open(_)))
            .map(|(a, _)| *a)
    }

    /// Whether a take-in would find nothing to do: no record in any lane,
    /// no pull to serve or watch. A polling wait looks about once per
    /// microsecond and almost always finds this; it then costs a load per
    /// channel instead of a list of the peers and a hash per lookup.
    ///
    /// A producer waiting for room needs no look here: it asked (before it
    /// slept, `arm_room`) only while records were in the lane, and the
    /// take-in that took them saw its request (`advance`, then
    /// `room_wanted`: ring.h's check).
    pub(crate) fn idle(&self) -> bool {
        self.jobs.is_empty()
            && self.sinks.is_empty()
            && self.to_fill.is_empty()
            && self.slots.values().all(|s| match s {
                DirectSlot::Open(ch) => ch.lanes.rx.is_empty(),
                DirectSlot::Checked(_) => true,
            })
    }

    /// Whether a pull over a channel is under way (its stall must be
    /// noticed even if nothing else happens).
    pub(crate) fn pulling(&self) -> bool {
        !self.sinks.is_empty()
    }

    /// A RNDV announces `window` to `peer`.
    pub(crate) fn announce(&mut self, window: RdmaWindow, peer: PeerAddr) {
        self.announced.insert((window.id, window.seqnum), peer);
    }

    /// The send lending `window` is over.
    pub(crate) fn withdraw(&mut self, window: RdmaWindow) {
        self.announced.remove(&(window.id, window.seqnum));
    }

    /// The pulls to do again through the backend.
    pub(crate) fn take_orphans(&mut self) -> Vec<DirectSink> {
        std::mem::take(&mut self.orphans)
    }

    /// Ends the channel to `peer` (if open), leaving `Checked(generation)`:
    /// its pulls become orphans, the pulls it asked of us are dropped.
    fn end(&mut self, hub: &Hub, peer: PeerAddr, generation: u64, why: &str) {
        if let Some(DirectSlot::Open(ch)) = self.slots.insert(peer, DirectSlot::Checked(generation))
        {
            hub.close(ch, why);
        }
        let tags: Vec<u32> = self
            .sinks
            .iter()
            .filter(|(_, s)| s.source == peer)
            .map(|(t, _)| *t)
            .collect();
        for t in tags {
            if let Some(s) = self.sinks.remove(&t) {
                self.orphans.push(s);
            }
        }
        self.jobs.retain(|j| j.peer != peer);
        self.to_fill
            .extend(
                self.announced
                    .iter()
                    .filter(|(_, &p)| p == peer)
                    .map(|(&(id, seqnum), _)| RdmaWindow {
                        id,
                        seqnum,
                        offset: 0,
                    }),
            );
    }

    /// Fills the windows announced to peers whose channel ended.
    fn fill_ended(&mut self, link: &mut dyn LinkAccess) {
        for window in self.to_fill.drain(..) {
            link.fill(window);
        }
    }
}

/// What the hub knows of the offers xmxd made this guest.
#[derive(Default)]
struct Offers {
    /// Peer MAC -> its domain.
    by_mac: BTreeMap<Mac, DomId>,
}

/// The process's side of every direct channel: its xenstore connection,
/// grant table and event channels, and the offers.
pub(crate) struct Hub {
    domid: DomId,
    toolstack: DomId,
    gnttab: Arc<dyn GrantTable>,
    evtchn: Box<dyn EventChannels>,
    xs: Box<dyn Xenstore>,
    offers: Mutex<Offers>,
    generation: AtomicU64,
    fault: Option<Fault>,
    sent: AtomicU64,
    /// `XMX_DIRECT_STALL_MS`, else [`PULL_STALL`].
    stall: Duration,
}

/// Why the hub could not start (the library then uses the backend only).
pub(crate) type StartError = String;

impl Hub {
    /// Attaches to the platform and watches this guest's offers.
    pub(crate) fn start(platform: &dyn Platform, toolstack: DomId) -> Result<Hub, StartError> {
        Hub::start_at(platform, toolstack, 1)
    }

    /// The hub that takes over from `earlier` on the host the domain moved
    /// to ([`Hub::part`]): its offers generations come after the earlier
    /// hub's, so no endpoint's verdict of those offers passes for one of the
    /// new host's.
    pub(crate) fn start_after(
        platform: &dyn Platform,
        toolstack: DomId,
        earlier: &Hub,
    ) -> Result<Hub, StartError> {
        Hub::start_at(platform, toolstack, earlier.generation() + 1)
    }

    fn start_at(
        platform: &dyn Platform,
        toolstack: DomId,
        generation: u64,
    ) -> Result<Hub, StartError> {
        let err = |what: &str, e: xmx_hv::Error| format!("{what}: {e}");
        let domid = platform.domid();
        let gnttab = platform.grant_table().map_err(|e| err("grant table", e))?;
        let evtchn = platform
            .event_channels()
            .map_err(|e| err("event channels", e))?;
        let xs = platform.xenstore().map_err(|e| err("xenstore", e))?;
        xs.watch(&names::offers_dir(toolstack, domid), TOKEN)
            .map_err(|e| err("watching the offers", e))?;
        let hub = Hub {
            domid,
            toolstack,
            gnttab,
            evtchn,
            xs,
            offers: Mutex::new(Offers::default()),
            generation: AtomicU64::new(generation),
            fault: Fault::from_env(),
            sent: AtomicU64::new(0),
            stall: std::env::var("XMX_DIRECT_STALL_MS")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .map_or(PULL_STALL, Duration::from_millis),
        };
        hub.reload_offers();
        Ok(hub)
    }

    /// The descriptor that is readable when xenstore changed.
    pub(crate) fn store_fd(&self) -> std::os::fd::RawFd {
        self.xs.watch_fd()
    }

    /// The descriptor that is readable when a peer signalled.
    pub(crate) fn event_fd(&self) -> std::os::fd::RawFd {
        self.evtchn.fd()
    }

    /// Takes the pending signals (their lanes are looked at next).
    pub(crate) fn drain_events(&self) {
        let mut ports = Vec::new();
        if let Err(e) = self.evtchn.pending(&mut ports) {
            tracing::debug!(%e, "direct channel events");
        }
        for p in ports {
            let _ = self.evtchn.unmask(p);
        }
    }

    /// Takes the xenstore events; true if any came (call [`Hub::rescan`]).
    pub(crate) fn drain_store(&self) -> bool {
        let mut fired = false;
        while let Ok(Some(_)) = self.xs.next_watch_event(Some(Duration::ZERO)) {
            fired = true;
        }
        fired
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Rereads the offers; watches the pair directory of each offered peer.
    fn reload_offers(&self) {
        let dir = names::offers_dir(self.toolstack, self.domid);
        let nodes = match read_nodes(self.xs.as_ref(), &dir) {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(%e, dir, "reading the direct offers");
                Vec::new()
            }
        };
        let mut by_mac = BTreeMap::new();
        for (name, value) in nodes {
            match (name.parse::<DomId>(), value.trim().parse::<Mac>()) {
                (Ok(d), Ok(mac)) if d != self.domid => {
                    by_mac.insert(mac, d);
                }
                _ => tracing::warn!(name, value, "malformed direct offer"),
            }
        }
        let mut offers = lock(&self.offers);
        if offers.by_mac == by_mac {
            return;
        }
        for (mac, &d) in &by_mac {
            if offers.by_mac.get(mac) != Some(&d) {
                let pair = names::pair_dir(self.toolstack, self.domid, d);
                if let Err(e) = self.xs.watch(&pair, TOKEN) {
                    tracing::debug!(%e, pair, "watching a pair directory");
                }
            }
        }
        for (mac, &d) in &offers.by_mac {
            if by_mac.get(mac) != Some(&d) {
                let pair = names::pair_dir(self.toolstack, self.domid, d);
                let _ = self.xs.unwatch(&pair, TOKEN);
            }
        }
        tracing::debug!(offers = by_mac.len(), "direct offers changed");
        offers.by_mac = by_mac;
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    fn offered(&self, mac: Mac) -> Option<DomId> {
        lock(&self.offers).by_mac.get(&mac).copied()
    }

    /// Sends `frame` on a channel if the endpoint has one to its destination;
    /// false if the caller must send it through the backend. The first frame
    /// to an offered peer of a higher domain id creates the channel (that
    /// frame and those after it go through the backend until the peer
    /// accepts).
    ///
    /// A MEDIUM message takes one path whole. The core emits its fragments
    /// back to back; the first goes onto the channel only if the lane has
    /// room for all of them, and the others follow it. The backend sends a
    /// MEDIUM only once it holds every fragment, so a message whose first
    /// fragments went onto a lane that then filled up would reach the peer
    /// incomplete and wait for the core's resend delay (half a second): a
    /// full window of 32 KiB messages to a peer slower to take them than
    /// the sender (MPI's bandwidth test) paid that for every window.
    pub(crate) fn transmit(
        &self,
        endpoint: u8,
        d: &mut EndpointDirect,
        view: &PeerView,
        frame: &Frame<Vec<u8>>,
    ) -> bool {
        let Body::Message(Message {
            kind: MessageKind::Medium(frag),
            seqnum,
            ..
        }) = &frame.body
        else {
            return self.transmit_frame(endpoint, d, view, frame, &[]);
        };
        let message = (frame.destination(), *seqnum);
        if frag.frag_seqnum > 0 {
            if d.medium_via_backend == Some(message) {
                return false;
            }
            return self.transmit_frame(endpoint, d, view, frame, &[]);
        }
        // The records of the fragments after this one.
        let length = (frag.msg_length as usize).min(MEDIUM_MAX);
        let count = length.div_ceil(FRAG_LENGTH_MAX).clamp(1, FRAGS_MAX);
        let mut then = [0usize; FRAGS_MAX];
        for (i, rec) in then.iter_mut().enumerate().take(count).skip(1) {
            let payload = (length - i * FRAG_LENGTH_MAX).min(FRAG_LENGTH_MAX);
            *rec = codec::message_len(payload);
        }
        let direct = self.transmit_frame(endpoint, d, view, frame, &then[1..count]);
        d.medium_via_backend = (!direct).then_some(message);
        direct
    }

    /// [`transmit`](Self::transmit) of one frame, which goes onto the
    /// channel only if records of the lengths `then` would fit after it.
    fn transmit_frame(
        &self,
        endpoint: u8,
        d: &mut EndpointDirect,
        view: &PeerView,
        frame: &Frame<Vec<u8>>,
        then: &[usize],
    ) -> bool {
        let dest = frame.destination();
        let generation = self.generation();
        match d.slots.get_mut(&dest) {
            Some(DirectSlot::Open(ch)) if ch.connected => {
                d.scratch.clear();
                if !codec::encode(frame, &mut d.scratch) {
                    return false;
                }
                let pushed = if then.is_empty() {
                    ch.lanes.tx.push(&d.scratch)
                } else {
                    ch.lanes.tx.push_first_of(&d.scratch, then)
                };
                match pushed {
                    Ok(Pushed::Full) => return false,
                    Ok(Pushed::Sent { notify }) => {
                        // Counted only for a faulty side: the count is shared
                        // by every endpoint of the process.
                        let sent = match self.fault {
                            Some(_) => self.sent.fetch_add(1, Ordering::Relaxed) + 1,
                            None => 0,
                        };
                        match self.fault {
                            Some(Fault::GarbageIndex) if sent >= FAULT_AFTER => {
                                ch.lanes.tx.publish_garbage_index()
                            }
                            Some(Fault::RewrittenSlot) if sent >= FAULT_AFTER => {
                                ch.lanes.tx.publish_rewritten_slot()
                            }
                            _ => {}
                        }
                        let broke =
                            matches!(self.fault, Some(Fault::GarbageIndex | Fault::RewrittenSlot))
                                && sent >= FAULT_AFTER;
                        if notify || broke {
                            if let Err(e) = self.evtchn.notify(ch.port) {
                                tracing::debug!(%e, "signalling a direct channel");
                            }
                        }
                        counters::add(Counter::DirectFramesSent, 1);
                        return true;
                    }
                    Err(Broken(why)) => {
                        self.broken(d, dest, why);
                        return false;
                    }
                }
            }
            Some(DirectSlot::Open(_)) => return false,
            Some(DirectSlot::Checked(g)) if *g == generation => return false,
            _ => {}
        }
        let peer = view
            .read(|t| t.get(dest.peer_index).map(|e| e.mac))
            .and_then(|mac| self.offered(mac));
        let slot = match peer {
            Some(peer) if self.domid < peer => match self.create(endpoint, dest, peer) {
                Ok(ch) => DirectSlot::Open(Box::new(ch)),
                Err(e) => {
                    tracing::debug!(%e, peer, "no direct channel");
                    DirectSlot::Checked(generation)
                }
            },
            _ => DirectSlot::Checked(generation),
        };
        d.slots.insert(dest, slot);
        false
    }

    fn create(
        &self,
        endpoint: u8,
        dest: PeerAddr,
        peer: DomId,
    ) -> Result<DirectChannel, xmx_hv::Error> {
        let granted = self.gnttab.grant_pages(peer, CHANNEL_PAGES, true)?;
        // SAFETY: the grant is CHANNEL_PAGES pages mapped at `as_ptr()` for as
        // long as `granted` lives; the peer cannot map it before the refs are
        // published below, so zeroing the control page races with nobody.
        unsafe { std::ptr::write_bytes(granted.as_ptr(), 0, xmx_hv::PAGE_SIZE) };
        let port = self.evtchn.alloc_unbound(peer)?;
        let dir = format!(
            "{}/{}",
            names::pair_dir(self.toolstack, self.domid, peer),
            names::channel_name(endpoint, dest.endpoint)
        );
        let refs = names::format_refs(granted.refs());
        // Again while it conflicts: the other channels of the pair (their creation, their
        // end) write beside it, and a channel not offered now is not offered again
        // before the offers change.
        let published = xmx_hv::in_transaction(self.xs.as_ref(), |tx| {
            if self.xs.read(tx, &dir).is_ok() {
                self.xs.rm(tx, &dir)?;
            }
            self.xs.write(tx, &format!("{dir}/refs"), refs.as_bytes())?;
            self.xs
                .write(tx, &format!("{dir}/port"), port.to_string().as_bytes())?;
            self.xs.write(tx, &format!("{dir}/state"), b"offered")
        });
        if let Err(e) = published {
            let _ = self.evtchn.close(port);
            return Err(e);
        }
        // SAFETY: `granted` maps CHANNEL_PAGES pages and is kept in the same
        // DirectChannel as the lanes, which drops the lanes first.
        let lanes = unsafe { Lanes::new(granted.as_ptr(), true) };
        tracing::debug!(dir, "direct channel offered to the peer");
        Ok(DirectChannel {
            dir,
            creator: true,
            peer_domid: peer,
            connected: false,
            port,
            peer: dest,
            lanes,
            memory: Memory::Granted(granted),
        })
    }

    /// Maps the channel `dir` the peer created for `endpoint`.
    fn accept(&self, dir: &str, peer: DomId, source: PeerAddr) -> Result<DirectChannel, String> {
        let read = |n: &str| {
            self.xs
                .read(XBT_NULL, &format!("{dir}/{n}"))
                .map(|v| String::from_utf8_lossy(&v).into_owned())
                .map_err(|e| format!("{n}: {e}"))
        };
        let refs = names::parse_refs(&read("refs")?, CHANNEL_PAGES)
            .filter(|r| r.len() == CHANNEL_PAGES)
            .ok_or("malformed refs")?;
        let remote_port: Port = read("port")?.trim().parse().map_err(|_| "malformed port")?;
        let mapped = self
            .gnttab
            .map(peer, &refs, true)
            .map_err(|e| format!("mapping: {e}"))?;
        if mapped.len() < CHANNEL_PAGES * xmx_hv::PAGE_SIZE {
            return Err("short mapping".into());
        }
        let port = self
            .evtchn
            .bind_interdomain(peer, remote_port)
            .map_err(|e| format!("binding: {e}"))?;
        if let Err(e) = self
            .xs
            .write(XBT_NULL, &format!("{dir}/state"), b"connected")
        {
            let _ = self.evtchn.close(port);
            return Err(format!("state: {e}"));
        }
        // SAFETY: `mapped` is at least CHANNEL_PAGES pages (checked above)
        // and lives in the same DirectChannel as the lanes, which drop first.
        let lanes = unsafe { Lanes::new(mapped.as_ptr(), false) };
        tracing::debug!(dir, "direct channel accepted");
        Ok(DirectChannel {
            dir: dir.to_owned(),
            creator: false,
            peer_domid: peer,
            connected: true,
            port,
            peer: source,
            lanes,
            memory: Memory::Mapped(mapped),
        })
    }

    /// Ends a channel: says so in xenstore (if its nodes are still there),
    /// closes the port, unmaps or ends the grant.
    fn close(&self, ch: Box<DirectChannel>, why: &str) {
        let res = if ch.creator {
            self.xs.rm(XBT_NULL, &ch.dir)
        } else {
            self.xs
                .read(XBT_NULL, &format!("{}/state", ch.dir))
                .and_then(|_| {
                    self.xs
                        .write(XBT_NULL, &format!("{}/state", ch.dir), b"closed")
                })
        };
        if let Err(e) = res {
            tracing::trace!(%e, dir = ch.dir, "direct channel nodes already gone");
        }
        let _ = self.evtchn.close(ch.port);
        counters::add(Counter::DirectChannelsClosed, 1);
        tracing::debug!(dir = ch.dir, peer = ch.peer_domid, base = ?ch.memory.base(), why, "direct channel closed");
        drop(ch);
    }

    /// The peer broke the channel to `dest`: closed, and not opened again
    /// until the offers change.
    fn broken(&self, d: &mut EndpointDirect, dest: PeerAddr, why: &'static str) {
        tracing::warn!(
            ?dest,
            why,
            "the peer broke a direct channel; using the backend"
        );
        counters::add(Counter::DirectChannelsBroken, 1);
        d.end(self, dest, self.generation(), why);
    }

    /// Starts pulling a LARGE message over the channel to `source`, if it
    /// has one; `None`: pull through the backend.
    pub(crate) fn pull(
        &self,
        d: &mut EndpointDirect,
        endpoint: u8,
        sink: DirectSink,
    ) -> Option<PullProgress> {
        let Some(DirectSlot::Open(ch)) = d.slots.get_mut(&sink.source) else {
            return None;
        };
        if !ch.connected {
            return None;
        }
        d.next_tag = d.next_tag.wrapping_add(1);
        let tag = d.next_tag;
        d.sinks.insert(tag, sink);
        d.unasked.push_back(tag);
        self.ask(d, endpoint);
        Some(PullProgress::Started)
    }

    /// Sends the requests of the pulls not asked yet, in order, while their
    /// lanes have room. A lane stays full only while its peer does not take
    /// from it; a pull that waits that long stalls and goes to the backend
    /// (`take_in`).
    fn ask(&self, d: &mut EndpointDirect, endpoint: u8) {
        // Peers whose lane is full: their later pulls wait too (in order),
        // the others' go on.
        let mut full: Vec<PeerAddr> = Vec::new();
        let mut i = 0;
        while let Some(&tag) = d.unasked.get(i) {
            let Some(sink) = d.sinks.get(&tag) else {
                // Its channel ended: it is an orphan now.
                d.unasked.remove(i);
                continue;
            };
            if full.contains(&sink.source) {
                i += 1;
                continue;
            }
            let head = PullHead {
                kind: PULL,
                dst_endpoint: sink.source.endpoint,
                src_endpoint: endpoint,
                tag,
                window: sink.window,
                a: sink.length,
                b: 0,
            };
            let source = sink.source;
            let Some(DirectSlot::Open(ch)) = d.slots.get_mut(&source) else {
                d.unasked.remove(i);
                continue;
            };
            match ch.lanes.tx.push(&head.encode()) {
                Ok(Pushed::Sent { notify }) => {
                    if notify {
                        let _ = self.evtchn.notify(ch.port);
                    }
                    d.unasked.remove(i);
                }
                Ok(Pushed::Full) => {
                    full.push(source);
                    i += 1;
                }
                Err(Broken(why)) => self.broken(d, source, why),
            }
        }
    }

    /// Takes one pull record `rec` of the channel to `peer` (its head is
    /// `head`): data lands in its receive, a request becomes a job.
    fn pull_record(
        &self,
        d: &mut EndpointDirect,
        endpoint: u8,
        peer: PeerAddr,
        head: PullHead,
        rec: lane::LaneRecord,
        link: &mut dyn LinkAccess,
    ) {
        if head.dst_endpoint != endpoint || head.src_endpoint != peer.endpoint {
            return;
        }
        match head.kind {
            PULL => {
                // A peer pulls only what was announced to it: never the
                // data of a send to another endpoint.
                let window = (head.window.id, head.window.seqnum);
                if d.announced.get(&window) != Some(&peer) {
                    self.refuse(d, endpoint, peer, head.tag);
                } else if d.jobs.len() < MAX_JOBS && self.fault != Some(Fault::Busy) {
                    d.jobs.push_back(Job {
                        peer,
                        tag: head.tag,
                        window: head.window,
                        length: head.a,
                        sent: 0,
                    });
                } else {
                    // The peer pulls it through the backends now: the
                    // window's data must be there before its pull is.
                    link.fill(head.window);
                    self.refuse(d, endpoint, peer, head.tag);
                }
            }
            PULL_ERR if d.sinks.get(&head.tag).is_some_and(|s| s.source == peer) => {
                if let Some(s) = d.sinks.remove(&head.tag) {
                    d.orphans.push(s);
                }
            }
            DATA => {
                let Some(sink) = d.sinks.get_mut(&head.tag).filter(|s| s.source == peer) else {
                    return;
                };
                let (offset, n) = (head.a as usize, head.b as usize);
                if offset
                    .checked_add(n)
                    .is_none_or(|end| end > sink.length as usize)
                {
                    return;
                }
                let Some(DirectSlot::Open(ch)) = d.slots.get(&peer) else {
                    return;
                };
                let mut at = PULL_HEAD;
                sink.dest.for_range(offset, n, |addr, len| {
                    // SAFETY: `addr..addr + len` is part of the receive's
                    // buffer, which MX keeps valid and untouched until the
                    // receive completes (after this pull); `copy_out` bounds
                    // the read to the record in the lane.
                    at += unsafe { ch.lanes.rx.copy_out(rec, at, addr as *mut u8, len) };
                });
                sink.got += n as u64;
                sink.progress = std::time::Instant::now();
                if sink.got >= u64::from(sink.length) {
                    if let Some(s) = d.sinks.remove(&head.tag) {
                        d.finished.push((s.id, Ok(())));
                    }
                }
            }
            _ => {}
        }
    }

    /// Tells `peer` its pull `tag` is not served here.
    fn refuse(&self, d: &mut EndpointDirect, endpoint: u8, peer: PeerAddr, tag: u32) {
        let Some(DirectSlot::Open(ch)) = d.slots.get_mut(&peer) else {
            return;
        };
        let head = PullHead {
            kind: PULL_ERR,
            dst_endpoint: peer.endpoint,
            src_endpoint: endpoint,
            tag,
            window: RdmaWindow {
                id: 0,
                seqnum: 0,
                offset: 0,
            },
            a: 0,
            b: 0,
        };
        if let Ok(Pushed::Sent { notify: true }) = ch.lanes.tx.push(&head.encode()) {
            let _ = self.evtchn.notify(ch.port);
        }
    }

    /// Sends what the jobs can send until a lane is full.
    fn pump(&self, d: &mut EndpointDirect, endpoint: u8, link: &mut dyn LinkAccess) {
        // Requests first: a few bytes that start the peer's data flowing
        // this way, ahead of the data this side sends it.
        self.ask(d, endpoint);
        if self.fault == Some(Fault::StopLarge) {
            return;
        }
        while let Some(job) = d.jobs.front_mut() {
            let Some(DirectSlot::Open(ch)) = d.slots.get_mut(&job.peer) else {
                d.jobs.pop_front();
                continue;
            };
            let mut refused = false;
            let mut broken = None;
            let mut notify = false;
            while job.sent < job.length {
                let n = job.next_chunk();
                let head = PullHead {
                    kind: DATA,
                    dst_endpoint: job.peer.endpoint,
                    src_endpoint: endpoint,
                    tag: job.tag,
                    window: job.window,
                    a: job.sent,
                    b: n,
                };
                let mut lent = true;
                let pushed = ch.lanes.tx.push_parts(&head.encode(), n as usize, |dst| {
                    // SAFETY: `dst` is the record's body in the lane, room
                    // for exactly `n` bytes (push_parts reserved them).
                    lent =
                        unsafe { link.read_lent(job.window, job.sent as usize, dst, n as usize) };
                    lent
                });
                match pushed {
                    Ok(Pushed::Sent { notify: n2 }) => {
                        notify |= n2;
                        job.sent += n;
                    }
                    Ok(Pushed::Full) if !lent => {
                        refused = true;
                        break;
                    }
                    Ok(Pushed::Full) => break,
                    Err(Broken(why)) => {
                        broken = Some(why);
                        break;
                    }
                }
            }
            if notify {
                let _ = self.evtchn.notify(ch.port);
            }
            let (peer, tag, finished) = (job.peer, job.tag, job.sent >= job.length);
            if let Some(why) = broken {
                self.broken(d, peer, why);
                continue;
            }
            if refused {
                d.jobs.pop_front();
                self.refuse(d, endpoint, peer, tag);
                continue;
            }
            if !finished {
                return;
            }
            d.jobs.pop_front();
        }
    }

    /// Takes what the endpoint's channels hold into `mailbox` (frames for
    /// the core, finished pulls), serves the pulls peers asked of it, and
    /// returns how many things it delivered. `link` sees each connect
    /// request and reply first (the link learns the peers' sessions from
    /// them, which its pulls through the backend name) and lends the data
    /// of LARGE sends.
    pub(crate) fn take_in(
        &self,
        endpoint: u8,
        d: &mut EndpointDirect,
        mailbox: &Mailbox,
        link: &mut dyn LinkAccess,
    ) -> usize {
        self.take_in_first(endpoint, d, mailbox, link, false).0
    }

    /// [`take_in`](Self::take_in) for a caller that hands frames to the core
    /// itself (`first`): the first frame taken comes back to it instead of
    /// going through the mailbox, if the mailbox holds no frame (none then
    /// came before it: the driver thread takes this endpoint's lanes in
    /// under the same lock). A ping-pong's receiver took and released each
    /// mailbox lock twice per message for nothing.
    pub(crate) fn take_in_first(
        &self,
        endpoint: u8,
        d: &mut EndpointDirect,
        mailbox: &Mailbox,
        link: &mut dyn LinkAccess,
        first: bool,
    ) -> (usize, Option<Frame<Vec<u8>>>) {
        if d.idle() {
            return (0, None);
        }
        d.fill_ended(link);
        let mut frames = std::mem::take(&mut d.take_frames);
        let mut broken = Vec::new();
        let mut peers = std::mem::take(&mut d.take_peers);
        peers.clear();
        peers.extend(d.open_peer_addrs());
        for &addr in &peers {
            for _ in 0..TAKE_BATCH {
                let Some(DirectSlot::Open(ch)) = d.slots.get_mut(&addr) else {
                    break;
                };
                let rec = match ch.lanes.rx.peek() {
                    Ok(None) => break,
                    Ok(Some(rec)) => rec,
                    Err(Broken(why)) => {
                        broken.push((addr, why));
                        break;
                    }
                };
                let mut head = [0u8; PULL_HEAD];
                // SAFETY: `head` has room for PULL_HEAD bytes.
                let got = unsafe { ch.lanes.rx.copy_out(rec, 0, head.as_mut_ptr(), PULL_HEAD) };
                if got == PULL_HEAD && matches!(head[0], PULL | DATA | PULL_ERR) {
                    if let Some(h) = PullHead::decode(&head, rec.len) {
                        self.pull_record(d, endpoint, addr, h, rec, link);
                    }
                } else {
                    let scratch = &mut d.scratch;
                    scratch.clear();
                    scratch.reserve(rec.len);
                    // SAFETY: `scratch` has room for `rec.len` bytes, all
                    // initialised by the copy.
                    unsafe {
                        let n = ch.lanes.rx.copy_out(rec, 0, scratch.as_mut_ptr(), rec.len);
                        scratch.set_len(n);
                    }
                    match codec::decode(scratch, ch.peer.peer_index) {
                        Some(f)
                            if f.dst_endpoint == endpoint && f.src_endpoint == addr.endpoint =>
                        {
                            frames.push(f)
                        }
                        _ => tracing::debug!(?addr, "dropping a malformed direct frame"),
                    }
                }
                if let Some(DirectSlot::Open(ch)) = d.slots.get_mut(&addr) {
                    if ch.lanes.rx.advance(rec) {
                        let _ = self.evtchn.notify(ch.port);
                    }
                }
            }
            if let Some(DirectSlot::Open(ch)) = d.slots.get_mut(&addr) {
                if ch.lanes.rx.room_wanted() {
                    let _ = self.evtchn.notify(ch.port);
                }
            }
        }
        d.take_peers = peers;
        for (addr, why) in broken {
            self.broken(d, addr, why);
        }
        // A peer that stops serving a pull loses its channel: the pulls go
        // through the backend, and so does everything after them.
        let mut stalled: Vec<PeerAddr> = d
            .sinks
            .values()
            .filter(|s| s.progress.elapsed() >= self.stall)
            .map(|s| s.source)
            .collect();
        stalled.dedup();
        for peer in stalled {
            tracing::warn!(?peer, "a direct pull stalled; the peer's channel ends");
            counters::add(Counter::DirectPullsStalled, 1);
            d.end(self, peer, self.generation(), "a pull stalled");
        }
        d.fill_ended(link);
        for f in &frames {
            if matches!(f.body, Body::ConnectRequest(_) | Body::ConnectReply(_)) {
                link.observe(f);
            }
        }
        self.pump(d, endpoint, link);
        let done = std::mem::take(&mut d.finished);
        let n = frames.len() + done.len();
        let mut kept = None;
        if !frames.is_empty() {
            counters::add(Counter::DirectFramesReceived, frames.len() as u64);
            let mut rest = frames.drain(..);
            if first && !mailbox.has_frames() {
                kept = rest.next();
            }
            if rest.len() > 0 {
                mailbox.put_frames(rest);
            }
        }
        // A burst's list is not kept: a few frames' worth is.
        if frames.capacity() <= KEPT_FRAMES {
            d.take_frames = frames;
        }
        if !done.is_empty() {
            counters::add(Counter::DirectPulls, done.len() as u64);
            mailbox.put_pulls(done);
        }
        (n, kept)
    }

    /// Asks every channel's peer to signal the next frame, and the peer of
    /// a pull this side serves to signal room for its next record if the
    /// lane was full; true if either is there already.
    pub(crate) fn arm(&self, d: &mut EndpointDirect) -> bool {
        if self.fault == Some(Fault::Unarmed) {
            return false;
        }
        let mut ready = false;
        for s in d.slots.values() {
            if let DirectSlot::Open(ch) = s {
                ready |= ch.lanes.rx.arm();
            }
        }
        // A pull not asked yet waits for room in its peer's lane.
        let mut armed: Vec<PeerAddr> = Vec::new();
        for tag in &d.unasked {
            let Some(source) = d.sinks.get(tag).map(|s| s.source) else {
                continue;
            };
            if armed.contains(&source) {
                continue;
            }
            armed.push(source);
            if let Some(DirectSlot::Open(ch)) = d.slots.get_mut(&source) {
                ready |= ch.lanes.tx.arm_room(PULL_HEAD);
            }
        }
        // Jobs are served in order: only the first can be waiting for room.
        if let Some(job) = d.jobs.front() {
            let next = PULL_HEAD + job.next_chunk() as usize;
            if let Some(DirectSlot::Open(ch)) = d.slots.get_mut(&job.peer) {
                ready |= ch.lanes.tx.arm_room(next);
            }
        }
        ready
    }

    /// xenstore changed: follows the offers, closes what was revoked or
    /// closed by the peer, notes what the peer accepted, and accepts what
    /// peers created for `endpoints` (each open endpoint of this process).
    ///
    /// A channel that ends here is emptied into its endpoint's mailbox
    /// first, at the moment its end is seen. MX completes an eager send once
    /// it is buffered, so a peer may close its endpoint (which ends its
    /// channels) right after its last sends, and it will not resend them;
    /// a NIC delivers what a closed port sent, and so does the channel. What
    /// the peer wrote before the change seen here is all on the channel by
    /// then, whenever the rescan began.
    pub(crate) fn rescan(&self, endpoints: &mut [HubEndpoint<'_>], view: &PeerView) {
        self.reload_offers();
        let generation = self.generation();
        let offers: BTreeMap<Mac, DomId> = lock(&self.offers).by_mac.clone();
        for ep in endpoints.iter_mut() {
            let mut d = lock(ep.direct);
            let open = d.open_peers();
            for addr in open {
                let Some(DirectSlot::Open(ch)) = d.slots.get_mut(&addr) else {
                    continue;
                };
                let still_offered = offers.values().any(|&p| p == ch.peer_domid);
                let state = self
                    .xs
                    .read(XBT_NULL, &format!("{}/state", ch.dir))
                    .map(|v| String::from_utf8_lossy(&v).into_owned());
                let why = match state.as_deref() {
                    _ if !still_offered => Some("revoked by dom0"),
                    Ok("connected") => {
                        if !ch.connected {
                            tracing::debug!(dir = ch.dir, "direct channel connected");
                            counters::add(Counter::DirectChannelsOpened, 1);
                        }
                        ch.connected = true;
                        None
                    }
                    Ok("offered") if ch.creator => None,
                    Ok(_) => Some("closed by the peer"),
                    Err(_) => Some("its nodes are gone"),
                };
                if let Some(why) = why {
                    self.take_in(ep.index, &mut d, ep.mailbox, &mut *ep.link);
                    d.end(self, addr, generation, why);
                    d.fill_ended(&mut *ep.link);
                }
            }
        }
        // Endpoints that talked to a peer now offered again create their
        // channel at once, not at their next frame.
        for ep in endpoints.iter() {
            let (endpoint, mut d) = (&ep.index, lock(ep.direct));
            let stale: Vec<PeerAddr> = d
                .slots
                .iter()
                .filter(|(_, s)| matches!(s, DirectSlot::Checked(g) if *g != generation))
                .map(|(a, _)| *a)
                .collect();
            for addr in stale {
                let peer = view
                    .read(|t| t.get(addr.peer_index).map(|e| e.mac))
                    .and_then(|mac| offers.get(&mac).copied());
                let slot = match peer {
                    Some(peer) if self.domid < peer => match self.create(*endpoint, addr, peer) {
                        Ok(ch) => DirectSlot::Open(Box::new(ch)),
                        Err(e) => {
                            tracing::debug!(%e, peer, "no direct channel");
                            DirectSlot::Checked(generation)
                        }
                    },
                    _ => DirectSlot::Checked(generation),
                };
                d.slots.insert(addr, slot);
            }
        }
        // Channels created for us by peers of lower domain ids.
        for (&mac, &peer) in offers.iter().filter(|(_, &p)| p < self.domid) {
            let Some(peer_index) = view.read(|t| t.by_mac(mac).map(|e| e.index)) else {
                continue;
            };
            let pair = names::pair_dir(self.toolstack, self.domid, peer);
            let Ok(children) = self.xs.directory(XBT_NULL, &pair) else {
                continue;
            };
            for name in children {
                let Some((cep, aep)) = names::parse_channel_name(&name) else {
                    continue;
                };
                let Some(d) = endpoints.iter().find(|e| e.index == aep).map(|e| e.direct) else {
                    continue;
                };
                let source = PeerAddr::new(peer_index, cep);
                let mut d = lock(d);
                if matches!(d.slots.get(&source), Some(DirectSlot::Open(_))) {
                    continue;
                }
                let dir = format!("{pair}/{name}");
                let state = self.xs.read(XBT_NULL, &format!("{dir}/state"));
                if !state.is_ok_and(|v| v == b"offered") {
                    continue;
                }
                match self.accept(&dir, peer, source) {
                    Ok(ch) => {
                        counters::add(Counter::DirectChannelsOpened, 1);
                        d.slots.insert(source, DirectSlot::Open(Box::new(ch)));
                    }
                    Err(e) => {
                        tracing::warn!(dir, %e, "refusing a direct channel");
                        let _ = self.xs.write(XBT_NULL, &format!("{dir}/state"), b"closed");
                    }
                }
            }
        }
    }

    /// The domain moved to another host: every channel of `endpoints` ends,
    /// what it holds taken in first (its pulls become orphans), and no
    /// endpoint keeps a verdict of this hub's offers: the hub of the new host
    /// decides afresh.
    pub(crate) fn part(&self, endpoints: &mut [HubEndpoint<'_>]) {
        let generation = self.generation();
        for ep in endpoints.iter_mut() {
            let mut d = lock(ep.direct);
            let open = d.open_peers();
            if !open.is_empty() {
                self.take_in(ep.index, &mut d, ep.mailbox, &mut *ep.link);
            }
            for addr in open {
                d.end(self, addr, generation, "the domain moved to another host");
            }
            d.fill_ended(&mut *ep.link);
            d.slots.clear();
        }
    }

    /// The endpoint closes: so do its channels.
    pub(crate) fn close_endpoint(&self, d: &mut EndpointDirect) {
        for (_, slot) in d.slots.drain() {
            if let DirectSlot::Open(ch) = slot {
                self.close(ch, "endpoint closed");
            }
        }
        d.sinks.clear();
        d.jobs.clear();
        d.orphans.clear();
        d.announced.clear();
    }
}

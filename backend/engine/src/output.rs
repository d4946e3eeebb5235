//! What the engine produces and the daemon collects: frames for the NIC, frames looped
//! back to co-located guests, events for endpoint rings, and host replies for the peer
//! service. Frame buffers are recycled so steady traffic allocates nothing.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use xmx_wire::msg::Event;
use xmx_wire::mxoe::{
    FrameRepr, HeadPacket, HeadRepr, Mac, NackMcpRepr, NackType, PacketRepr, PullReplyPacket,
    PullReplyRepr, ETH_FRAME_LEN_MIN, HEAD_LEN, PULL_REPLY_LEN,
};

use super::memory::{GuestMemory, MemoryArea};
use super::GuestId;

/// A PULL_REPLY whose data stays in guest memory until the frame is written: then read
/// straight into the frame's last buffer (the NIC's transmit slot, see
/// [`Engine::poll_transmit_into`](super::Engine::poll_transmit_into)), with no copy
/// through a buffer of the engine's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeferredReply {
    /// The frame's head.
    pub head: HeadRepr,
    /// The reply's number in the transfer, modulo 256.
    pub frame_seqnum: u8,
    /// Where its data goes in the message.
    pub msg_offset: u32,
    /// The puller's handle.
    pub dst_pull_handle: u32,
    /// The puller's endpoint magic.
    pub dst_magic: u32,
    /// Our endpoint, whose region is pulled.
    pub src_endpoint: u8,
    /// Where the data is.
    pub area: MemoryArea,
    /// Its offset in the area.
    pub at: u64,
    /// Its length.
    pub len: usize,
}

/// Why a deferred reply could not be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplyWriteError {
    /// The data could no longer be read (the region went away).
    Memory,
    /// The frame does not fit the buffer, or its fields could not be emitted.
    Emit,
}

impl DeferredReply {
    /// The NACK_MCP that answers the pull instead when the data can no longer be read,
    /// as it would have been answered had the reply been built at once.
    pub fn refusal(&self) -> FrameRepr<'static> {
        FrameRepr {
            head: self.head,
            packet: PacketRepr::NackMcp(NackMcpRepr {
                src_endpoint: self.src_endpoint,
                src_generation: 0,
                nack_type: NackType::BadRdmaWindow,
                src_pull_handle: self.dst_pull_handle,
                src_magic: self.dst_magic,
            }),
        }
    }

    /// Bytes of the frame, Ethernet padding included.
    pub fn wire_len(&self) -> usize {
        (HEAD_LEN + PULL_REPLY_LEN + self.len).max(ETH_FRAME_LEN_MIN)
    }

    /// Writes the frame at the start of `out`, its data read from `memory`, and zeroes
    /// its Ethernet padding; returns [`Self::wire_len`]. Every byte of the frame is
    /// written: `out` may hold an earlier frame of any guest.
    pub fn write(
        &self,
        memory: &dyn GuestMemory,
        out: &mut [u8],
    ) -> Result<usize, ReplyWriteError> {
        let fields = HEAD_LEN + PULL_REPLY_LEN;
        let wire_len = self.wire_len();
        let frame = out.get_mut(..wire_len).ok_or(ReplyWriteError::Emit)?;
        let (front, rest) = frame.split_at_mut(fields);
        let (data, padding) = rest.split_at_mut(self.len.min(rest.len()));
        memory
            .read(self.area, self.at, data)
            .map_err(|_| ReplyWriteError::Memory)?;
        padding.fill(0);
        front.fill(0);
        self.head
            .emit(&mut HeadPacket::new_unchecked(&mut *front))
            .map_err(|_| ReplyWriteError::Emit)?;
        let reply = PullReplyRepr {
            frame_seqnum: self.frame_seqnum,
            msg_offset: self.msg_offset,
            dst_pull_handle: self.dst_pull_handle,
            dst_magic: self.dst_magic,
            data: &[],
        };
        let packet = front.get_mut(HEAD_LEN..).unwrap_or(&mut []);
        reply
            .emit_fields(&mut PullReplyPacket::new_unchecked(packet), self.len)
            .map_err(|_| ReplyWriteError::Emit)?;
        Ok(wire_len)
    }
}

/// A frame waiting for the NIC.
#[derive(Debug)]
pub(crate) enum TxFrame {
    /// Built whole.
    Built(Vec<u8>),
    /// A PULL_REPLY written when it leaves.
    Reply(DeferredReply),
}

impl TxFrame {
    /// Bytes it takes on the wire.
    pub fn len(&self) -> usize {
        match self {
            TxFrame::Built(b) => b.len(),
            TxFrame::Reply(r) => r.wire_len(),
        }
    }
}

/// A frame to put on the NIC. Hand it back with [`Engine::recycle`](super::Engine::recycle)
/// once sent so its buffer is reused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// The whole Ethernet frame (no FCS), padded to the Ethernet minimum.
    pub bytes: Vec<u8>,
}

/// An event for one endpoint's event ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestEvent {
    /// The guest.
    pub guest: GuestId,
    /// Its endpoint.
    pub endpoint: u8,
    /// The event to write in the ring.
    pub event: Event,
    /// Whether the application must be woken for it. False for the completion of a
    /// send that held nothing the library waits to get back (every send but a
    /// MEDIUM, whose completion frees its send-queue slots): an application that
    /// sleeps waits for a reply, not for its own send to have left.
    pub wakes: bool,
}

/// A HOST_REPLY received by one of our guests, for the peer service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostReply {
    /// The guest whose MAC the reply was addressed to.
    pub guest: GuestId,
    /// The replying board.
    pub from: Mac,
    /// The replier's index for the guest in its own peer table.
    pub reverse_index: u16,
    /// The hostname, up to its NUL terminator, as carried (may not be UTF-8).
    pub hostname: Vec<u8>,
}

/// Where a frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// Out of the NIC.
    Wire,
    /// Back into the engine, for a co-located guest.
    Local,
}

/// Bytes a guest of weight 1 may send per visit of the transmit round: a whole
/// jumbo frame, so every frame leaves on its guest's first visit.
const TX_QUANTUM: u64 = 9018;

/// One guest's frames waiting for the NIC, and its turn in the round.
#[derive(Debug, Default)]
struct GuestTx {
    frames: VecDeque<TxFrame>,
    deficit: u64,
    visited: bool,
    /// The guest was removed while frames of it still waited: the queue goes
    /// once they are sent.
    retired: bool,
}

/// Frames waiting for the NIC, one queue per guest, taken by deficit round robin over
/// bytes in proportion to the guests' weights. A guest's own frames keep their order.
#[derive(Debug, Default)]
pub(crate) struct TxQueues {
    guests: FxHashMap<GuestId, GuestTx>,
    round: VecDeque<GuestId>,
    len: usize,
}

impl TxQueues {
    /// Frames waiting, all guests together.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn push(&mut self, guest: GuestId, frame: TxFrame) {
        let q = self.guests.entry(guest).or_default();
        q.retired = false;
        if q.frames.is_empty() {
            self.round.push_back(guest);
        }
        q.frames.push_back(frame);
        self.len += 1;
    }

    /// A guest that left: its queue goes now if empty, else once its frames are sent.
    pub fn retire(&mut self, guest: GuestId) {
        match self.guests.get_mut(&guest) {
            Some(q) if q.frames.is_empty() => {
                self.guests.remove(&guest);
            }
            Some(q) => q.retired = true,
            None => {}
        }
    }

    /// The next frame in the weighted round.
    pub fn pop(&mut self, weight: impl Fn(GuestId) -> u32) -> Option<(GuestId, TxFrame)> {
        // Each visit either sends or ends the guest's turn after adding at least a whole
        // frame's worth to its deficit, so this ends.
        loop {
            let guest = *self.round.front()?;
            let q = self.guests.entry(guest).or_default();
            let Some(len) = q.frames.front().map(|f| f.len() as u64) else {
                self.round.pop_front();
                continue;
            };
            if !q.visited {
                q.visited = true;
                q.deficit += u64::from(weight(guest).max(1)) * TX_QUANTUM;
            }
            if q.deficit >= len {
                q.deficit -= len;
                let frame = q.frames.pop_front()?;
                self.len -= 1;
                if q.frames.is_empty() {
                    // The queue stays (its next frame would allocate it again),
                    // with the deficit an empty queue keeps in deficit round
                    // robin: none.
                    q.deficit = 0;
                    q.visited = false;
                    if q.retired {
                        self.guests.remove(&guest);
                    }
                    self.round.pop_front();
                }
                return Some((guest, frame));
            }
            q.visited = false;
            self.round.rotate_left(1);
        }
    }
}

pub(crate) struct EngineOutput {
    pool: Vec<Vec<u8>>,
    pool_size: usize,
    pub tx: TxQueues,
    max_tx_frames: usize,
    pub loopback: VecDeque<Vec<u8>>,
    /// Looped-back frames for endpoints other boards on the link hold, with the endpoint.
    pub to_boards: VecDeque<(u8, Vec<u8>)>,
    events: VecDeque<GuestEvent>,
    pending: FxHashMap<(GuestId, u8), usize>,
    max_pending: usize,
    pub host_replies: VecDeque<HostReply>,
    pub max_host_replies: usize,
}

impl EngineOutput {
    pub fn new(
        pool_size: usize,
        max_tx_frames: usize,
        max_pending: usize,
        max_host_replies: usize,
    ) -> Self {
        EngineOutput {
            pool: Vec::new(),
            pool_size,
            tx: TxQueues::default(),
            max_tx_frames,
            loopback: VecDeque::new(),
            to_boards: VecDeque::new(),
            events: VecDeque::new(),
            pending: FxHashMap::default(),
            max_pending,
            host_replies: VecDeque::new(),
            max_host_replies,
        }
    }

    /// Emit `frame` into a pooled buffer, zero-padded to the Ethernet minimum.
    pub fn build(&mut self, frame: &FrameRepr) -> xmx_wire::Result<Vec<u8>> {
        let mut buf = self.pool.pop().unwrap_or_default();
        buf.clear();
        buf.resize(frame.buffer_len().max(ETH_FRAME_LEN_MIN), 0);
        match frame.emit(&mut buf) {
            Ok(_) => Ok(buf),
            Err(e) => {
                self.recycle(buf);
                Err(e)
            }
        }
    }

    /// A frame of `len` bytes, zero-padded to the Ethernet minimum, that `fill` writes
    /// into a pooled buffer: for frames whose payload is read straight into place
    /// instead of through a buffer of its own. `fill` must write all of its `len`
    /// bytes: a pooled buffer still holds an earlier frame (of any guest), so only the
    /// padding is zeroed here. An error from `fill` gives the buffer back.
    pub fn build_in_place<E>(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<Vec<u8>, E> {
        let mut buf = self.pool.pop().unwrap_or_default();
        buf.resize(len.max(ETH_FRAME_LEN_MIN), 0);
        // At least `len` long since the resize: the split cannot fail.
        let (frame, padding) = buf.split_at_mut(len);
        padding.fill(0);
        match fill(frame) {
            Ok(()) => Ok(buf),
            Err(e) => {
                self.recycle(buf);
                Err(e)
            }
        }
    }

    /// Keep a buffer for a later frame.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if self.pool.len() < self.pool_size {
            self.pool.push(buf);
        }
    }

    /// True if the NIC queue has room for another frame.
    pub fn tx_has_room(&self) -> bool {
        self.tx.len() < self.max_tx_frames
    }

    /// Queue a completion: never refused, the library waits for it.
    pub fn completion(&mut self, guest: GuestId, endpoint: u8, event: Event) {
        self.push_event(guest, endpoint, event, true);
    }

    /// Queue the completion of a send that held nothing in the guest: written like
    /// any other, but no reason to wake a sleeping application ([`GuestEvent::wakes`]).
    pub fn quiet_completion(&mut self, guest: GuestId, endpoint: u8, event: Event) {
        self.push_event(guest, endpoint, event, false);
    }

    fn push_event(&mut self, guest: GuestId, endpoint: u8, event: Event, wakes: bool) {
        *self.pending.entry((guest, endpoint)).or_default() += 1;
        self.events.push_back(GuestEvent {
            guest,
            endpoint,
            event,
            wakes,
        });
    }

    /// True if an unsolicited event for the endpoint would be accepted.
    pub fn has_event_room(&self, guest: GuestId, endpoint: u8) -> bool {
        self.has_event_room_for(guest, endpoint, 1)
    }

    /// True if `events` more unsolicited events for the endpoint may be queued.
    pub fn has_event_room_for(&self, guest: GuestId, endpoint: u8, events: usize) -> bool {
        let pending = self.pending.get(&(guest, endpoint)).copied().unwrap_or(0);
        pending.saturating_add(events) <= self.max_pending
    }

    /// True if an advisory event (pull progress) for the endpoint may be queued: only
    /// while its queue is a quarter full, so that advice never crowds out a receive.
    pub fn has_room_for_advice(&self, guest: GuestId, endpoint: u8) -> bool {
        self.pending.get(&(guest, endpoint)).copied().unwrap_or(0) < self.max_pending / 4
    }

    /// Queue an unsolicited event (check [`EngineOutput::has_event_room`] first).
    pub fn unsolicited(&mut self, guest: GuestId, endpoint: u8, event: Event) {
        self.completion(guest, endpoint, event);
    }

    pub fn pop_event(&mut self) -> Option<GuestEvent> {
        let e = self.events.pop_front()?;
        if let Some(n) = self.pending.get_mut(&(e.guest, e.endpoint)) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.pending.remove(&(e.guest, e.endpoint));
            }
        }
        Some(e)
    }

    /// Forget the events of an endpoint (`None`: of every endpoint) of a guest.
    pub fn purge_events(&mut self, guest: GuestId, endpoint: Option<u8>) {
        let selected =
            |g: GuestId, ep: u8| g == guest && (endpoint.is_none() || endpoint == Some(ep));
        self.events.retain(|e| !selected(e.guest, e.endpoint));
        self.pending.retain(|&(g, ep), _| !selected(g, ep));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xmx_wire::msg::{DoneStatus, EventBody};

    fn done(tag: u32) -> Event {
        Event {
            tag,
            body: EventBody::SendDone {
                status: DoneStatus::Success,
                length: 0,
            },
        }
    }

    #[test]
    fn transmit_is_shared_by_weight_and_keeps_each_guests_order() {
        let mut tx = TxQueues::default();
        let weights = [1u32, 1, 2, 4];
        for g in 0..4u32 {
            for i in 0..400u32 {
                let mut frame = vec![0u8; 4200];
                frame[..4].copy_from_slice(&i.to_be_bytes());
                tx.push(GuestId(g), TxFrame::Built(frame));
            }
        }
        let mut sent = [0u32; 4];
        for _ in 0..800 {
            let (g, frame) = tx.pop(|g| weights[g.0 as usize]).unwrap();
            let TxFrame::Built(frame) = frame else {
                unreachable!("only built frames were queued")
            };
            let i = u32::from_be_bytes(frame[..4].try_into().unwrap());
            assert_eq!(i, sent[g.0 as usize], "a guest's frames keep their order");
            sent[g.0 as usize] += 1;
        }
        for (g, w) in weights.iter().enumerate() {
            let want = 800.0 * f64::from(*w) / 8.0;
            let got = f64::from(sent[g]);
            assert!(
                (got / want - 1.0).abs() <= 0.1,
                "guest {g}: {got} frames, {want} expected"
            );
        }
        assert_eq!(tx.len(), 1600 - 800);
        // Alone, a guest of weight 1 takes every frame in turn.
        let mut lone = TxQueues::default();
        for _ in 0..10 {
            lone.push(GuestId(9), TxFrame::Built(vec![0; 9018]));
        }
        assert_eq!((0..10).filter(|_| lone.pop(|_| 1).is_some()).count(), 10);
        assert!(lone.pop(|_| 1).is_none());
    }

    #[test]
    fn an_emptied_queue_is_kept_without_credit_and_a_retired_one_goes_once_sent() {
        let mut tx = TxQueues::default();
        let (a, b) = (GuestId(1), GuestId(2));
        tx.push(a, TxFrame::Built(vec![0; 100]));
        assert!(tx.pop(|_| 1).is_some());
        // Kept for its next frame, with no deficit left from the last turn: a guest
        // that went idle gains nothing over one that kept sending.
        assert_eq!(tx.guests[&a].deficit, 0);
        assert!(!tx.guests[&a].visited);
        assert!(tx.round.is_empty());
        // Retired while empty: gone at once.
        tx.retire(a);
        assert!(!tx.guests.contains_key(&a));
        // Retired with frames waiting: they still leave, in order, then the queue goes.
        tx.push(b, TxFrame::Built(vec![1; 100]));
        tx.push(b, TxFrame::Built(vec![2; 100]));
        tx.retire(b);
        for want in [1u8, 2] {
            let (g, TxFrame::Built(f)) = tx.pop(|_| 1).unwrap() else {
                unreachable!("only built frames were queued")
            };
            assert_eq!((g, f[0]), (b, want));
        }
        assert!(tx.pop(|_| 1).is_none());
        assert!(tx.guests.is_empty());
        assert_eq!(tx.len(), 0);
    }

    #[test]
    fn unsolicited_events_are_bounded_per_endpoint() {
        let mut out = EngineOutput::new(4, 4, 2, 4);
        let g = GuestId(1);
        out.unsolicited(g, 0, done(0));
        out.unsolicited(g, 0, done(1));
        assert!(!out.has_event_room(g, 0));
        assert!(out.has_event_room(g, 1));
        out.completion(g, 0, done(2));
        assert_eq!(out.pop_event().unwrap().event.tag, 0);
        assert!(!out.has_event_room(g, 0));
        out.pop_event();
        assert!(out.has_event_room(g, 0));
        out.unsolicited(g, 1, done(3));
        out.purge_events(g, Some(0));
        assert_eq!(out.pop_event().unwrap().endpoint, 1);
        assert!(out.pop_event().is_none());
    }

    #[test]
    fn advice_waits_while_an_endpoints_events_are_a_quarter_of_their_bound() {
        let mut out = EngineOutput::new(4, 4, 8, 4);
        let g = GuestId(1);
        out.unsolicited(g, 0, done(0));
        assert!(out.has_room_for_advice(g, 0));
        out.unsolicited(g, 0, done(1));
        assert!(!out.has_room_for_advice(g, 0), "2 of 8 waiting");
        assert!(out.has_event_room(g, 0), "a receive still passes");
        assert!(out.has_room_for_advice(g, 1));
        out.pop_event();
        assert!(out.has_room_for_advice(g, 0));
    }
}

//! The puller's side of a LARGE transfer: which frames of which blocks are requested,
//! which arrived, and when to ask again.
//!
//! The transfer is cut as Open-MX cuts it in MX wire-compatible mode. Frames are 4096
//! bytes of the *remote* region's layout: frame 0 starts at the remote offset and ends at
//! the next 4096 boundary, later frames are whole. A block is at most 8 frames; the first
//! block is shortened by the remote offset so later blocks start on a frame boundary.
//! Several blocks stay requested at once, as many as the engine's frame budget grants
//! (see `budget`), up to the pull's own limit; each arriving reply clears one bit of its
//! block's bitmap. When the oldest block is complete, completed blocks are retired and
//! their frames go back to the budget, which grants new blocks. When a later block completes while an older one still misses frames, a
//! frame was probably lost, so the older blocks are requested again (once per timeout).
//! When nothing arrives for a timeout, every incomplete block is requested again; after
//! too many consecutive timeouts the pull fails. Consecutive timeouts back off (each waits
//! twice the one before, up to [`PULL_BACKOFF_MAX`]), as the library's resends do: a lost
//! frame costs one timeout, while a link down for a while or a peer starved of CPU is
//! waited for rather than taken for dead after a few short timeouts.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use xmx_wire::mxoe::{Mac, PacketRepr, PullRepr, PULL_BLOCK_LEN_MAX, PULL_REPLY_LEN_MAX};

use super::memory::RegionHandle;

const FRAME: u64 = PULL_REPLY_LEN_MAX as u64;
const BLOCK: u32 = PULL_BLOCK_LEN_MAX as u32;

/// The longest wait between two re-requests of a pull that makes no progress.
pub(crate) const PULL_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Blocks are tracked in a `u32` mask of block positions.
pub(crate) const BLOCKS_IN_FLIGHT_MAX: usize = 32;

/// XORed with the endpoint index to form the magic a PULL carries and its replies echo.
const PULL_MAGIC_XOR: u32 = 0x584d_5830;

/// The magic naming `endpoint` in PULL frames, which their PULL_REPLY frames echo as
/// `dst_magic` (a link filter tells by it which endpoint a reply is for).
pub fn pull_magic(endpoint: u8) -> u32 {
    u32::from(endpoint) ^ PULL_MAGIC_XOR
}

/// The endpoint a magic names, if it is one of ours.
pub(crate) fn magic_endpoint(magic: u32) -> Option<u8> {
    u8::try_from(magic ^ PULL_MAGIC_XOR).ok()
}

/// The endpoint of ours a packet is for: the destination endpoint of a message or
/// control packet, the puller's endpoint (by its magic) for a PULL_REPLY or a NACK_MCP;
/// `None` for what goes to the board itself (host discovery, RAW).
pub(crate) fn addressed_endpoint(packet: &PacketRepr) -> Option<u8> {
    Some(match packet {
        PacketRepr::Tiny(p) => p.header.dst_endpoint,
        PacketRepr::Small(p) => p.header.dst_endpoint,
        PacketRepr::Medium(p) => p.header.dst_endpoint,
        PacketRepr::Rndv(p) => p.header.dst_endpoint,
        PacketRepr::Truc(p) => p.dst_endpoint,
        PacketRepr::Connect(p) => p.dst_endpoint,
        PacketRepr::Pull(p) => p.dst_endpoint,
        PacketRepr::Notify(p) => p.dst_endpoint,
        PacketRepr::NackLib(p) => p.dst_endpoint,
        PacketRepr::PullReply(p) => magic_endpoint(p.dst_magic)?,
        PacketRepr::NackMcp(p) => magic_endpoint(p.src_magic)?,
        PacketRepr::HostQuery(_) | PacketRepr::HostReply(_) | PacketRepr::Raw(_) => return None,
    })
}

/// Where the data comes from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PullSource {
    pub peer_mac: Mac,
    pub endpoint: u8,
    pub session: u32,
    pub region: u8,
    pub region_seqnum: u8,
    pub offset: u16,
}

/// Where the data goes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PullSink {
    pub region: u8,
    pub handle: RegionHandle,
    pub offset: u64,
}

#[derive(Debug, Clone, Copy)]
struct Block {
    frame_index: u32,
    first_frame_offset: u16,
    length: u16,
    frames: u32,
    missing: u8,
}

/// A reply that fits the pull: where its data goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AcceptedReply {
    block: usize,
    bit: u8,
    /// Offset in the sink region to write the data at.
    pub sink_offset: u64,
}

/// Why a reply was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplyRefusal {
    /// Its frame is not among the requested ones (late duplicate, old block).
    NotRequested,
    /// Its offset or length does not match its frame.
    Mismatch,
    /// Its frame already arrived.
    Duplicate,
}

/// Blocks to request after a reply: new ones, or older ones again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Requests {
    /// Positions of the blocks to request.
    pub blocks: u32,
    /// True if they were requested before (a frame was probably lost).
    pub again: bool,
    /// Frames of the blocks that retired, to give back to the budget.
    pub released_frames: u32,
}

/// What a timeout leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimeoutOutcome {
    /// Request these blocks (mask of positions) again.
    Rerequest(u32),
    /// Give up.
    Abort,
}

/// One outstanding pull.
#[derive(Debug)]
pub(crate) struct OutstandingPull {
    /// Tag of the Pull send request, echoed by PULL_DONE.
    pub tag: u32,
    pub source: PullSource,
    pub sink: PullSink,
    /// Handle the replies echo (slot and generation).
    pub wire_handle: u32,
    pub deadline: Instant,
    total: u32,
    first_frame_offset: u16,
    /// Bytes not yet put in a block.
    unrequested: u32,
    /// First frame of the oldest block.
    frame_index: u32,
    next_frame_index: u32,
    requested_frames: u32,
    blocks: VecDeque<Block>,
    blocks_max: usize,
    /// True while the pull waits in the budget's queue for a block.
    pub queued: bool,
    rerequested: usize,
    retries: u32,
    received: u64,
    /// Bytes of the retired blocks: the message's first `landed` bytes are all in the
    /// sink, and no later reply writes there again.
    landed: u64,
    /// `landed` as last told to the guest (see [`OutstandingPull::progress_due`]).
    told: u64,
}

impl OutstandingPull {
    /// A pull of `total` bytes with no block laid out yet: [`OutstandingPull::grow`] lays them out
    /// as the budget grants them, up to `blocks_max` at once.
    pub fn new(
        tag: u32,
        source: PullSource,
        sink: PullSink,
        total: u32,
        blocks_max: usize,
        deadline: Instant,
    ) -> Self {
        let first_frame_offset = (u64::from(source.offset) % FRAME) as u16;
        OutstandingPull {
            tag,
            source,
            sink,
            wire_handle: 0,
            deadline,
            total,
            first_frame_offset,
            unrequested: total,
            frame_index: 0,
            next_frame_index: 0,
            requested_frames: 0,
            blocks: VecDeque::new(),
            blocks_max: blocks_max.clamp(1, BLOCKS_IN_FLIGHT_MAX),
            queued: false,
            rerequested: 0,
            retries: 0,
            received: 0,
            landed: 0,
            told: 0,
        }
    }

    /// Bytes to pull.
    pub fn total(&self) -> u32 {
        self.total
    }

    /// Bytes written so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// If at least `step` bytes landed since the guest was last told, and the pull is not
    /// complete (its completion says it all): how many bytes have landed, now counted as
    /// told. `step` 0 tells nothing.
    pub fn progress_due(&mut self, step: u32) -> Option<u32> {
        if step == 0 || self.is_complete() || self.landed < self.told + u64::from(step) {
            return None;
        }
        self.told = self.landed;
        // At most the message's length, a u32.
        u32::try_from(self.landed).ok()
    }

    /// True once every byte arrived.
    pub fn is_complete(&self) -> bool {
        self.unrequested == 0 && self.blocks.is_empty()
    }

    /// True if the pull has data left to lay out and room for another block.
    pub fn wants_block(&self) -> bool {
        self.unrequested > 0 && self.blocks.len() < self.blocks_max
    }

    /// True if some block is requested (only then can the pull time out).
    pub fn has_blocks(&self) -> bool {
        !self.blocks.is_empty()
    }

    /// Frames of the blocks laid out and not retired: what the pull holds of the budget.
    pub fn held_frames(&self) -> u32 {
        self.requested_frames
    }

    /// Lay out the next block if the pull wants one; returns its position and frames.
    pub fn grow(&mut self) -> Option<(usize, u32)> {
        if !self.wants_block() {
            return None;
        }
        let before = self.requested_frames;
        if self.next_frame_index == 0 {
            // The first block ends at the first block boundary of the remote layout.
            let first = (BLOCK - u32::from(self.first_frame_offset)).min(self.unrequested);
            self.append_block(first, self.first_frame_offset);
        } else {
            self.append_block(BLOCK.min(self.unrequested), 0);
        }
        Some((self.blocks.len() - 1, self.requested_frames - before))
    }

    fn append_block(&mut self, length: u32, first_frame_offset: u16) {
        let frames = (u64::from(first_frame_offset) + u64::from(length)).div_ceil(FRAME) as u32;
        let missing = ((1u16 << frames) - 1) as u8;
        self.blocks.push_back(Block {
            frame_index: self.next_frame_index,
            first_frame_offset,
            length: length as u16,
            frames,
            missing,
        });
        self.requested_frames += frames;
        self.next_frame_index += frames;
        self.unrequested -= length;
    }

    /// The PULL frame body requesting the block at position `block`.
    pub fn request(&self, block: usize, src_endpoint: u8) -> Option<PullRepr> {
        let b = self.blocks.get(block)?;
        Some(PullRepr {
            dst_endpoint: self.source.endpoint,
            src_endpoint,
            src_generation: 0,
            session: self.source.session,
            total_length: self.total,
            pulled_rdma_id: self.source.region,
            pulled_rdma_seqnum: self.source.region_seqnum,
            pulled_rdma_offset: self.source.offset,
            src_pull_handle: self.wire_handle,
            src_magic: pull_magic(src_endpoint),
            first_frame_offset: b.first_frame_offset,
            block_length: b.length,
            frame_index: b.frame_index,
        })
    }

    /// The length of the data MX's reply for frame `frame_seqnum` carries, if that frame
    /// is requested: where one of xmx's replies carrying several frames is cut.
    pub fn frame_len(&self, frame_seqnum: u8) -> Option<usize> {
        let delta = u32::from(frame_seqnum.wrapping_sub(self.frame_index as u8));
        if delta >= self.requested_frames {
            return None;
        }
        let (_, len) = self.frame_span(self.frame_index + delta);
        usize::try_from(len).ok()
    }

    /// Offset in the message and length of frame `frame`'s data.
    fn frame_span(&self, frame: u32) -> (u64, u64) {
        let ffo = u64::from(self.first_frame_offset);
        let offset = if frame == 0 {
            0
        } else {
            u64::from(frame) * FRAME - ffo
        };
        let room = if frame == 0 { FRAME - ffo } else { FRAME };
        (
            offset,
            room.min(u64::from(self.total).saturating_sub(offset)),
        )
    }

    /// Check a reply against the requested frames, without changing anything.
    pub fn check_reply(
        &self,
        frame_seqnum: u8,
        msg_offset: u32,
        data_len: usize,
    ) -> Result<AcceptedReply, ReplyRefusal> {
        // Frame numbers travel modulo 256; at most 32 * 8 frames are requested at once.
        let delta = u32::from(frame_seqnum.wrapping_sub(self.frame_index as u8));
        if delta >= self.requested_frames {
            return Err(ReplyRefusal::NotRequested);
        }
        let frame = self.frame_index + delta;
        let (expected_offset, expected_len) = self.frame_span(frame);
        if u64::from(msg_offset) != expected_offset || data_len as u64 != expected_len {
            return Err(ReplyRefusal::Mismatch);
        }
        let (block, b) = self
            .blocks
            .iter()
            .enumerate()
            .find(|(_, b)| (b.frame_index..b.frame_index + b.frames).contains(&frame))
            .ok_or(ReplyRefusal::NotRequested)?;
        let bit = (frame - b.frame_index) as u8;
        if b.missing & (1 << bit) == 0 {
            return Err(ReplyRefusal::Duplicate);
        }
        Ok(AcceptedReply {
            block,
            bit,
            sink_offset: self.sink.offset + expected_offset,
        })
    }

    /// Record an accepted reply whose data was written; returns the blocks to request
    /// again and the frames retired blocks give back.
    pub fn record_reply(
        &mut self,
        reply: AcceptedReply,
        len: usize,
        now: Instant,
        timeout: Duration,
    ) -> Requests {
        let Some(b) = self.blocks.get_mut(reply.block) else {
            return Requests::default();
        };
        b.missing &= !(1 << reply.bit);
        let block_done = b.missing == 0;
        self.received += len as u64;
        self.retries = 0;
        self.deadline = deadline_after(now, timeout);

        let oldest_missing = self.blocks.front().is_some_and(|b| b.missing != 0);
        if oldest_missing {
            if block_done && reply.block > self.rerequested {
                // A later block completed before older ones: a frame was likely lost.
                let again = (self.rerequested..reply.block)
                    .filter(|&i| self.blocks.get(i).is_some_and(|b| b.missing != 0));
                let blocks = again.fold(0, |m, i| m | 1 << i);
                self.rerequested = reply.block;
                return Requests {
                    blocks,
                    again: true,
                    released_frames: 0,
                };
            }
            return Requests::default();
        }
        let mut released_frames = 0;
        while self.blocks.front().is_some_and(|b| b.missing == 0) {
            if let Some(b) = self.blocks.pop_front() {
                self.landed += u64::from(b.length);
                self.frame_index += b.frames;
                self.requested_frames -= b.frames;
                released_frames += b.frames;
                self.rerequested = self.rerequested.saturating_sub(1);
            }
        }
        Requests {
            blocks: 0,
            again: false,
            released_frames,
        }
    }

    /// The source's endpoint says it is back from an outage (see
    /// [`crate::rdma::source_back`]): every block still missing is requested again now.
    /// The retry count and the deadline stay as they are: only data that arrives is
    /// progress, so a source that keeps saying so and never answers still runs the pull
    /// out of retries. Returns the blocks to request; none if nothing is requested yet.
    pub fn source_back(&mut self) -> u32 {
        if self.blocks.is_empty() {
            return 0;
        }
        self.rerequested = 0;
        let incomplete =
            (0..self.blocks.len()).filter(|&i| self.blocks.get(i).is_some_and(|b| b.missing != 0));
        incomplete.fold(0, |m, i| m | 1 << i)
    }

    /// The deadline passed without progress.
    pub fn on_timeout(
        &mut self,
        now: Instant,
        timeout: Duration,
        retries_max: u32,
    ) -> TimeoutOutcome {
        if self.blocks.is_empty() {
            // Waiting for the budget is no failure of the peer's.
            self.deadline = deadline_after(now, timeout);
            return TimeoutOutcome::Rerequest(0);
        }
        self.retries += 1;
        if self.retries > retries_max {
            return TimeoutOutcome::Abort;
        }
        self.deadline = deadline_after(now, backed_off(timeout, self.retries));
        self.rerequested = 0;
        let incomplete =
            (0..self.blocks.len()).filter(|&i| self.blocks.get(i).is_some_and(|b| b.missing != 0));
        TimeoutOutcome::Rerequest(incomplete.fold(0, |m, i| m | 1 << i))
    }
}

/// The wait after the `retries`-th consecutive timeout: `timeout` doubled that many
/// times, up to [`PULL_BACKOFF_MAX`] (never below `timeout`).
fn backed_off(timeout: Duration, retries: u32) -> Duration {
    let cap = PULL_BACKOFF_MAX.max(timeout);
    let factor = 1u32 << retries.min(16);
    timeout.saturating_mul(factor).min(cap)
}

/// `now + timeout`, with the timeout capped so the sum cannot overflow.
pub(crate) fn deadline_after(now: Instant, timeout: Duration) -> Instant {
    const CAP: Duration = Duration::from_secs(24 * 3600);
    now.checked_add(timeout.min(CAP)).unwrap_or(now)
}

/// The block positions set in `mask`.
pub(crate) fn mask_positions(mask: u32) -> impl Iterator<Item = usize> {
    (0..BLOCKS_IN_FLIGHT_MAX).filter(move |i| mask & (1 << i) != 0)
}

/// An endpoint's outstanding pulls, found by the handle their replies echo. A handle is
/// the slot index and the slot's generation, so a reply for a finished pull whose slot
/// was reused does not match.
#[derive(Debug, Default)]
pub(crate) struct PullSlots {
    slots: Vec<(u16, Option<OutstandingPull>)>,
}

impl PullSlots {
    /// Store a pull; returns its wire handle, or `None` if 65536 slots are in use.
    pub fn insert(&mut self, mut pull: OutstandingPull) -> Option<u32> {
        let index = match self.slots.iter().position(|(_, p)| p.is_none()) {
            Some(i) => i,
            None if self.slots.len() < 1 << 16 => {
                self.slots.push((0, None));
                self.slots.len() - 1
            }
            None => return None,
        };
        let (generation, slot) = self.slots.get_mut(index)?;
        let handle = (u32::from(*generation) << 16) | index as u32;
        pull.wire_handle = handle;
        *slot = Some(pull);
        Some(handle)
    }

    /// The pull a handle names.
    pub fn get_mut(&mut self, handle: u32) -> Option<&mut OutstandingPull> {
        let (generation, slot) = self.slots.get_mut((handle & 0xffff) as usize)?;
        if u32::from(*generation) != handle >> 16 {
            return None;
        }
        slot.as_mut()
    }

    /// Take a pull out; its handle stops matching.
    pub fn remove(&mut self, handle: u32) -> Option<OutstandingPull> {
        let (generation, slot) = self.slots.get_mut((handle & 0xffff) as usize)?;
        if u32::from(*generation) != handle >> 16 {
            return None;
        }
        let pull = slot.take()?;
        *generation = generation.wrapping_add(1);
        Some(pull)
    }

    /// Handles of all pulls.
    pub fn handles(&self) -> Vec<u32> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, (_, p))| p.is_some())
            .map(|(i, (g, _))| (u32::from(*g) << 16) | i as u32)
            .collect()
    }

    /// All pulls.
    pub fn iter(&self) -> impl Iterator<Item = &OutstandingPull> {
        self.slots.iter().filter_map(|(_, p)| p.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_millis(100);

    fn pull(total: u32, remote_offset: u16, in_flight: usize) -> OutstandingPull {
        let source = PullSource {
            peer_mac: Mac([2, 0, 0, 0, 0, 9]),
            endpoint: 3,
            session: 0x1234,
            region: 5,
            region_seqnum: 1,
            offset: remote_offset,
        };
        let sink = PullSink {
            region: 2,
            handle: RegionHandle(1),
            offset: 100,
        };
        let mut p = OutstandingPull::new(7, source, sink, total, in_flight, Instant::now());
        grow_all(&mut p);
        p
    }

    /// Lay out every block the pull wants (an unlimited budget); their positions.
    fn grow_all(p: &mut OutstandingPull) -> u32 {
        let mut mask = 0;
        while let Some((pos, _)) = p.grow() {
            mask |= 1 << pos;
        }
        mask
    }

    /// Every (frame seqnum, msg offset, length) a sender answers `req` with.
    fn replies_for(req: &PullRepr) -> Vec<(u8, u32, usize)> {
        let mut out = vec![];
        let base = u64::from(req.pulled_rdma_offset);
        let mut off =
            (u64::from(req.frame_index) * FRAME + u64::from(req.first_frame_offset)) - base % FRAME;
        let mut left = u64::from(req.block_length);
        for i in 0..req.replies() {
            let room = if i == 0 {
                FRAME - u64::from(req.first_frame_offset)
            } else {
                FRAME
            };
            let len = room.min(left);
            out.push(((req.frame_index + i as u32) as u8, off as u32, len as usize));
            off += len;
            left -= len;
        }
        out
    }

    fn replies(p: &OutstandingPull, block: usize) -> Vec<(u8, u32, usize)> {
        replies_for(&p.request(block, 1).unwrap())
    }

    fn deliver(p: &mut OutstandingPull, r: (u8, u32, usize)) -> Result<u32, ReplyRefusal> {
        let a = p.check_reply(r.0, r.1, r.2)?;
        Ok(p.record_reply(a, r.2, Instant::now(), TIMEOUT).blocks)
    }

    /// The guest is told of what landed in order, once a step's worth more did, and never
    /// of what landed past a missing frame, nor once the pull is complete.
    #[test]
    fn progress_is_told_of_what_landed_in_order_a_step_at_a_time() {
        let mut p = pull(4 * 32768 + 100, 1000, 8);
        let step = 30_000;
        assert_eq!(p.progress_due(step), None);
        // Block 1 lands before block 0: nothing is in order yet.
        for r in replies(&p, 1) {
            deliver(&mut p, r).unwrap();
        }
        assert_eq!(p.progress_due(step), None);
        // Block 0 (shortened by the remote offset) lands: blocks 0 and 1 retire.
        for r in replies(&p, 0) {
            deliver(&mut p, r).unwrap();
        }
        let two = 31768 + 32768;
        assert_eq!(p.progress_due(step), Some(two));
        assert_eq!(p.progress_due(step), None, "told once");
        // Block 2 (now the oldest, at position 0) but its last frame: nothing more is in
        // order.
        let mut third = replies(&p, 0);
        let last = third.pop().unwrap();
        for r in third {
            deliver(&mut p, r).unwrap();
        }
        assert_eq!(p.progress_due(step), None);
        deliver(&mut p, last).unwrap();
        assert_eq!(p.progress_due(step), Some(two + 32768));
        // The rest, oldest block first (positions count from the oldest left): complete,
        // so its completion tells it.
        while !p.is_complete() {
            for r in replies(&p, 0) {
                deliver(&mut p, r).unwrap();
            }
        }
        assert!(p.is_complete());
        assert_eq!(p.progress_due(step), None);
        assert_eq!(p.progress_due(0), None);
    }

    #[test]
    fn first_block_is_shortened_by_the_remote_offset() {
        let p = pull(100_000, 1000, 4);
        let b0 = p.request(0, 1).unwrap();
        assert_eq!(
            (b0.first_frame_offset, b0.block_length, b0.frame_index),
            (1000, 31768, 0)
        );
        assert_eq!(b0.replies(), 8);
        let b1 = p.request(1, 1).unwrap();
        assert_eq!(
            (b1.first_frame_offset, b1.block_length, b1.frame_index),
            (0, 32768, 8)
        );
        let b3 = p.request(3, 1).unwrap();
        assert_eq!(b3.block_length as u32, 100_000 - 31768 - 2 * 32768);
        assert!(p.request(4, 1).is_none());
        assert_eq!(p.held_frames(), (1000u32 + 100_000).div_ceil(4096));
        assert!(!p.wants_block());
        assert_eq!(b0.src_magic, pull_magic(1));
        assert_eq!(magic_endpoint(b0.src_magic), Some(1));
    }

    #[test]
    fn in_order_replies_complete_the_pull() {
        let total = 5 * 32768 + 17;
        let mut p = pull(total, 0, 2);
        let mut requests: VecDeque<PullRepr> = mask_positions(0b11)
            .map(|i| p.request(i, 1).unwrap())
            .collect();
        let mut frames = 0;
        while let Some(req) = requests.pop_front() {
            for r in replies_for(&req) {
                let a = p.check_reply(r.0, r.1, r.2).unwrap();
                assert_eq!(a.sink_offset, 100 + u64::from(r.1));
                let held = p.held_frames();
                let next = p.record_reply(a, r.2, Instant::now(), TIMEOUT);
                assert!(!next.again);
                assert_eq!(p.held_frames(), held - next.released_frames);
                let new = grow_all(&mut p);
                requests.extend(mask_positions(new).map(|i| p.request(i, 1).unwrap()));
                assert!(p.held_frames() <= 2 * 8);
                frames += 1;
            }
        }
        assert!(p.is_complete());
        assert_eq!(p.received(), u64::from(total));
        assert_eq!(frames, (total as usize).div_ceil(4096));
    }

    #[test]
    fn bad_replies_are_refused() {
        let mut p = pull(70_000, 10, 4);
        let rs = replies(&p, 0);
        let (s, o, l) = rs[1];
        assert_eq!(p.check_reply(s, o + 1, l), Err(ReplyRefusal::Mismatch));
        assert_eq!(p.check_reply(s, o, l - 1), Err(ReplyRefusal::Mismatch));
        assert_eq!(p.check_reply(200, o, l), Err(ReplyRefusal::NotRequested));
        deliver(&mut p, rs[1]).unwrap();
        assert_eq!(deliver(&mut p, rs[1]), Err(ReplyRefusal::Duplicate));
    }

    #[test]
    fn later_block_done_early_rerequests_older_ones_once() {
        let mut p = pull(4 * 32768, 0, 4);
        let b0 = replies(&p, 0);
        // Block 0 misses its last frame.
        for r in &b0[..7] {
            assert_eq!(deliver(&mut p, *r), Ok(0));
        }
        let b1 = replies(&p, 1);
        let mut mask = 0;
        for r in b1 {
            mask |= deliver(&mut p, r).unwrap();
        }
        assert_eq!(mask, 0b1, "block 0 requested again");
        let b2 = replies(&p, 2);
        let mut mask = 0;
        for r in b2 {
            mask |= deliver(&mut p, r).unwrap();
        }
        assert_eq!(mask, 0, "block 0 was already requested again");
        // The missing frame arrives: blocks 0-2 retire, no more data to lay out.
        assert_eq!(deliver(&mut p, b0[7]), Ok(0));
        assert_eq!(p.blocks.len(), 1);
        for r in replies(&p, 0) {
            deliver(&mut p, r).unwrap();
        }
        assert!(p.is_complete());
    }

    #[test]
    fn timeouts_rerequest_incomplete_blocks_then_abort() {
        let mut p = pull(3 * 32768, 0, 4);
        for r in replies(&p, 1) {
            deliver(&mut p, r).unwrap();
        }
        let now = Instant::now();
        assert_eq!(
            p.on_timeout(now, TIMEOUT, 2),
            TimeoutOutcome::Rerequest(0b101)
        );
        assert_eq!(p.deadline, now + 2 * TIMEOUT, "the next timeout backs off");
        assert_eq!(
            p.on_timeout(now, TIMEOUT, 2),
            TimeoutOutcome::Rerequest(0b101)
        );
        assert_eq!(p.on_timeout(now, TIMEOUT, 2), TimeoutOutcome::Abort);
    }

    /// A link down for a second: with a 20 ms timeout and ten retries, the pull used to
    /// give up after 200 ms of silence; backing off, it outlasts the outage and its
    /// first reply afterwards starts the count again.
    #[test]
    fn timeouts_back_off_so_a_pull_outlasts_an_outage() {
        let timeout = Duration::from_millis(20);
        let mut p = pull(3 * 32768, 0, 4);
        let start = Instant::now();
        let mut now = start;
        let mut waits = Vec::new();
        while now < start + Duration::from_secs(1) {
            let TimeoutOutcome::Rerequest(_) = p.on_timeout(now, timeout, 10) else {
                panic!("gave up after {:?} of silence", now - start);
            };
            waits.push(p.deadline - now);
            now = p.deadline;
        }
        let ms: Vec<u128> = waits.iter().map(|w| w.as_millis()).collect();
        assert_eq!(
            ms,
            [40, 80, 160, 320, 640],
            "still pulling after {:?}",
            now - start
        );
        let first = replies(&p, 0)[0];
        let a = p.check_reply(first.0, first.1, first.2).unwrap();
        p.record_reply(a, first.2, now, timeout);
        assert_eq!(p.deadline, now + timeout, "progress: short timeouts again");
        assert_eq!(
            p.on_timeout(p.deadline, timeout, 10),
            TimeoutOutcome::Rerequest(0b111)
        );
        let long = Duration::from_secs(3);
        assert_eq!(backed_off(long, 5), long, "never below the timeout");
        assert_eq!(backed_off(timeout, u32::MAX), PULL_BACKOFF_MAX);
    }

    #[test]
    fn progress_resets_the_retry_count() {
        let mut p = pull(2 * 32768, 0, 1);
        let now = Instant::now();
        assert_eq!(p.on_timeout(now, TIMEOUT, 1), TimeoutOutcome::Rerequest(1));
        let first = replies(&p, 0)[0];
        deliver(&mut p, first).unwrap();
        assert_eq!(p.on_timeout(now, TIMEOUT, 1), TimeoutOutcome::Rerequest(1));
    }

    #[test]
    fn huge_timeouts_do_not_overflow() {
        let now = Instant::now();
        assert_eq!(deadline_after(now, TIMEOUT), now + TIMEOUT);
        assert!(deadline_after(now, Duration::MAX) > now);
    }

    #[test]
    fn handles_change_generation_when_a_slot_is_reused() {
        let mut slots = PullSlots::default();
        let h1 = slots.insert(pull(10, 0, 1)).unwrap();
        assert!(slots.get_mut(h1).is_some());
        assert!(slots.remove(h1).is_some());
        assert!(slots.get_mut(h1).is_none());
        let h2 = slots.insert(pull(10, 0, 1)).unwrap();
        assert_eq!(h2 & 0xffff, h1 & 0xffff);
        assert_ne!(h2, h1);
        assert!(slots.remove(h1).is_none());
        assert_eq!(slots.handles(), vec![h2]);
        assert_eq!(slots.iter().count(), 1);
        assert_eq!(slots.get_mut(h2).unwrap().wire_handle, h2);
    }
}

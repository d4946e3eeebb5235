//! LARGE transfers on the engine: a guest's Pull request becomes an [`OutstandingPull`] whose blocks
//! are requested from the peer; PULL requests from peers are answered with PULL_REPLY
//! frames read from the pulled region; replies and NACK_MCP complete the puller's pulls.

use std::sync::atomic::{fence, Ordering};
use std::time::Instant;

use xmx_wire::msg::{self, fill_marks, DoneStatus, ErrorCode, Event, EventBody, Route};
use xmx_wire::mxoe::{
    HeadRepr, Mac, NackMcpRepr, NackType, PacketRepr, PullReplyRepr, PullRepr, HEAD_LEN,
    PULL_REPLY_LEN, PULL_REPLY_LEN_MAX,
};

use super::budget::PullKey;
use super::memory::{GuestMemory, MemoryArea, MemoryError};
use super::output::{DeferredReply, Path, ReplyWriteError};
use super::pull::{
    deadline_after, magic_endpoint, mask_positions, OutstandingPull, PullSink, PullSource,
    ReplyRefusal, TimeoutOutcome,
};
use super::vnic::{DropReason, EngineUsage, GuestEndpoint, GuestWire, VirtualNic};
use super::wide::OurMark;
use super::Ctx;

const FRAME: u64 = PULL_REPLY_LEN_MAX as u64;

/// A Pull send request, checked and resolved.
pub(crate) struct PullStart {
    pub now: Instant,
    pub endpoint: u8,
    pub tag: u32,
    pub route: Route,
    pub dst: Mac,
    pub pull: msg::Pull,
}

/// Start pulling; the local region and range were checked by the caller.
pub(crate) fn start_pull(
    ctx: &mut Ctx,
    link: &mut GuestWire,
    usage: &mut EngineUsage,
    ep: &mut GuestEndpoint,
    s: PullStart,
) {
    let p = s.pull;
    // The wire carries the remote offset on 16 bits (MX's offset in the first page).
    let Ok(remote_offset) = u16::try_from(p.remote_offset) else {
        ctx.refuse(link, s.endpoint, s.tag, ErrorCode::Unsupported);
        return;
    };
    let Some(region) = ep.regions.get(&p.local_region).copied() else {
        ctx.refuse(link, s.endpoint, s.tag, ErrorCode::BadRegion);
        return;
    };
    if !usage.admits_pull(ctx.config, p.length) {
        link.counters.quota_refusals += 1;
        ctx.refuse(link, s.endpoint, s.tag, ErrorCode::NoResources);
        return;
    }
    if p.length == 0 {
        let body = EventBody::PullDone {
            status: DoneStatus::Success,
            length: 0,
        };
        ctx.out
            .completion(link.id, s.endpoint, Event { tag: s.tag, body });
        return;
    }
    let source = PullSource {
        peer_mac: s.dst,
        endpoint: s.route.endpoint,
        session: s.route.session_id,
        region: p.remote_region,
        region_seqnum: p.remote_region_seqnum,
        offset: remote_offset,
    };
    let sink = PullSink {
        region: p.local_region,
        handle: region.handle,
        offset: u64::from(p.local_offset),
    };
    let deadline = deadline_after(s.now, ctx.config.pull_retransmit_timeout);
    let mut pull = OutstandingPull::new(
        s.tag,
        source,
        sink,
        p.length,
        ctx.config.pull_blocks_in_flight,
        deadline,
    );
    pull.queued = true;
    let Some(handle) = ep.pulls.insert(pull) else {
        link.counters.quota_refusals += 1;
        ctx.refuse(link, s.endpoint, s.tag, ErrorCode::NoResources);
        return;
    };
    usage.pulls += 1;
    usage.pull_bytes += u64::from(p.length);
    // Its blocks are requested as the budget grants them (Engine::dispatch_pulls).
    ctx.budget.enqueue(PullKey {
        guest: link.id,
        endpoint: s.endpoint,
        handle,
    });
}

/// Whether the guest says `region` of `endpoint` holds the data it lends (its fill mark,
/// see [`MemoryArea::FillMarks`]); an endpoint without marks has every region filled, and
/// marks that cannot be read fill none.
fn region_filled(memory: &dyn GuestMemory, endpoint: u8, region: u8) -> bool {
    let mut word = [0u8; 4];
    let at = (fill_marks::word(region) * 4) as u64;
    match memory.read(MemoryArea::FillMarks { endpoint }, at, &mut word) {
        Ok(()) => {
            // Acquire (with the relaxed load under `read`): the region's bytes, read after
            // this, are at least those the guest wrote before it set the mark.
            fence(Ordering::Acquire);
            u32::from_ne_bytes(word) & fill_marks::bit(region) != 0
        }
        Err(MemoryError::NoSuchArea(_)) => true,
        Err(_) => false,
    }
}

/// Send the PULL requests for the blocks at the positions set in `mask`.
pub(crate) fn request_blocks(
    ctx: &mut Ctx,
    link: &mut GuestWire,
    ep: &mut GuestEndpoint,
    endpoint: u8,
    handle: u32,
    mask: u32,
) {
    let Some(pull) = ep.pulls.get_mut(handle) else {
        return;
    };
    let dst = pull.source.peer_mac;
    // Asking for several frames per reply costs MX peers nothing: they never read it.
    let mark = OurMark::new(ctx.config.pull_reply_frames);
    for block in mask_positions(mask) {
        if let Some(request) = pull.request(block, endpoint) {
            ctx.send_padded(link, dst, PacketRepr::Pull(request), mark.bytes());
        }
    }
}

/// Complete a pull with `status` and free its slot.
pub(crate) fn finish_pull(
    ctx: &mut Ctx,
    link: &mut GuestWire,
    usage: &mut EngineUsage,
    ep: &mut GuestEndpoint,
    endpoint: u8,
    handle: u32,
    status: DoneStatus,
) {
    let Some(pull) = ep.pulls.remove(handle) else {
        return;
    };
    // A queued key of a finished pull is skipped when its turn comes.
    ctx.budget.release(pull.held_frames());
    usage.pulls = usage.pulls.saturating_sub(1);
    usage.pull_bytes = usage.pull_bytes.saturating_sub(u64::from(pull.total()));
    if status == DoneStatus::Success {
        link.counters.pulls_done += 1;
    } else {
        link.counters.pulls_failed += 1;
        tracing::debug!(
            guest = link.id.0,
            endpoint,
            tag = pull.tag,
            ?status,
            "pull failed"
        );
    }
    let body = EventBody::PullDone {
        status,
        length: u32::try_from(pull.received()).unwrap_or(u32::MAX),
    };
    ctx.out.completion(
        link.id,
        endpoint,
        Event {
            tag: pull.tag,
            body,
        },
    );
}

/// A PULL_REPLY for one of this guest's pulls arrived from `src`.
pub(crate) fn on_pull_reply(
    ctx: &mut Ctx,
    nic: &mut VirtualNic,
    now: Instant,
    src: Mac,
    reply: &PullReplyRepr,
) {
    let link = &mut nic.link;
    let found = magic_endpoint(reply.dst_magic).and_then(|endpoint| {
        let ep = nic.endpoints.get_mut(&endpoint)?;
        let pull = ep.pulls.get_mut(reply.dst_pull_handle)?;
        (pull.source.peer_mac == src).then_some((endpoint, ep))
    });
    let Some((endpoint, ep)) = found else {
        link.counters.drop(DropReason::StalePull);
        return;
    };
    let handle = reply.dst_pull_handle;
    // One of xmx's replies carries several consecutive frames: each part is taken as
    // MX's reply for that frame would be, checked on its own.
    let (mut frame_seqnum, mut msg_offset, mut data) =
        (reply.frame_seqnum, reply.msg_offset, reply.data);
    loop {
        let Some(pull) = ep.pulls.get_mut(handle) else {
            return;
        };
        let part_len = match pull.frame_len(frame_seqnum) {
            // A frame of no data ends no reply: refused below as a mismatch.
            Some(0) | None => data.len(),
            Some(n) => n.min(data.len()),
        };
        let (part, rest) = data.split_at(part_len);
        // Within u32: the message's length bounds every part's offset.
        let next_part = (
            frame_seqnum.wrapping_add(1),
            msg_offset.wrapping_add(part_len as u32),
        );
        let accepted = match pull.check_reply(frame_seqnum, msg_offset, part.len()) {
            Ok(a) => a,
            Err(ReplyRefusal::Duplicate) if !rest.is_empty() => {
                // A block asked for again comes back whole: its frames that landed
                // the first time are skipped, the others taken.
                link.counters.drop(DropReason::DuplicatePullReply);
                (frame_seqnum, msg_offset) = next_part;
                data = rest;
                continue;
            }
            Err(refusal) => {
                link.counters.drop(match refusal {
                    ReplyRefusal::NotRequested => DropReason::StalePull,
                    ReplyRefusal::Mismatch => DropReason::BadPullReply,
                    ReplyRefusal::Duplicate => DropReason::DuplicatePullReply,
                });
                return;
            }
        };
        let area = MemoryArea::Region(pull.sink.handle);
        if nic.memory.write(area, accepted.sink_offset, part).is_err() {
            link.counters.drop(DropReason::MemoryFault);
            finish_pull(
                ctx,
                link,
                &mut nic.usage,
                ep,
                endpoint,
                handle,
                DoneStatus::Aborted,
            );
            return;
        }
        let timeout = ctx.config.pull_retransmit_timeout;
        let next = pull.record_reply(accepted, part.len(), now, timeout);
        ctx.budget.release(next.released_frames);
        if next.released_frames > 0 && ctx.out.has_room_for_advice(link.id, endpoint) {
            if let Some(length) = pull.progress_due(ctx.config.pull_progress_step) {
                let body = EventBody::PullProgress { length };
                let tag = pull.tag;
                ctx.out.unsolicited(link.id, endpoint, Event { tag, body });
            }
        }
        if next.released_frames > 0 && pull.wants_block() && !pull.queued {
            pull.queued = true;
            ctx.budget.enqueue(PullKey {
                guest: link.id,
                endpoint,
                handle,
            });
        }
        if pull.is_complete() {
            finish_pull(
                ctx,
                link,
                &mut nic.usage,
                ep,
                endpoint,
                handle,
                DoneStatus::Success,
            );
            return;
        }
        if next.again {
            link.counters.pull_rerequests += u64::from(next.blocks.count_ones());
        }
        request_blocks(ctx, link, ep, endpoint, handle, next.blocks);
        if rest.is_empty() {
            return;
        }
        (frame_seqnum, msg_offset) = next_part;
        data = rest;
    }
}

/// A peer refused one of this guest's PULL requests.
pub(crate) fn on_nack_mcp(ctx: &mut Ctx, nic: &mut VirtualNic, src: Mac, nack: &NackMcpRepr) {
    let link = &mut nic.link;
    let status = match nack.nack_type {
        NackType::BadEndpoint => DoneStatus::BadEndpoint,
        NackType::EndpointClosed => DoneStatus::EndpointClosed,
        NackType::BadSession => DoneStatus::BadSession,
        NackType::BadRdmaWindow => DoneStatus::BadRegion,
        NackType::None => {
            link.counters.drop(DropReason::Malformed);
            return;
        }
    };
    let found = magic_endpoint(nack.src_magic).and_then(|endpoint| {
        let ep = nic.endpoints.get_mut(&endpoint)?;
        let pull = ep.pulls.get_mut(nack.src_pull_handle)?;
        (pull.source.peer_mac == src).then_some((endpoint, ep))
    });
    let Some((endpoint, ep)) = found else {
        link.counters.drop(DropReason::StalePull);
        return;
    };
    let handle = nack.src_pull_handle;
    finish_pull(ctx, link, &mut nic.usage, ep, endpoint, handle, status);
}

/// Pulls whose deadline passed request their incomplete blocks again, or fail.
pub(crate) fn on_timeouts(ctx: &mut Ctx, nic: &mut VirtualNic, now: Instant) {
    let timeout = ctx.config.pull_retransmit_timeout;
    let retries_max = ctx.config.pull_retries_max;
    for (&endpoint, ep) in nic.endpoints.iter_mut() {
        for handle in ep.pulls.handles() {
            let Some(pull) = ep.pulls.get_mut(handle) else {
                continue;
            };
            if pull.deadline > now || !pull.has_blocks() {
                continue;
            }
            match pull.on_timeout(now, timeout, retries_max) {
                TimeoutOutcome::Abort => {
                    let (link, usage) = (&mut nic.link, &mut nic.usage);
                    finish_pull(ctx, link, usage, ep, endpoint, handle, DoneStatus::Timeout);
                }
                TimeoutOutcome::Rerequest(mask) => {
                    nic.link.counters.pull_rerequests += u64::from(mask.count_ones());
                    request_blocks(ctx, &mut nic.link, ep, endpoint, handle, mask);
                }
            }
        }
    }
}

/// A peer endpoint sent `endpoint` an explicit ack marked resent: its library does so
/// when the endpoint comes back from an outage (re-opened after a migration or a
/// reconnection), and what was pulled from it meanwhile was most likely lost. The pulls
/// of `endpoint` from that peer request their missing blocks again now rather than a
/// pull timeout (0.5 s by default) later. A duplicate reply is dropped as any is.
pub(crate) fn source_back(
    ctx: &mut Ctx,
    link: &mut GuestWire,
    ep: &mut GuestEndpoint,
    endpoint: u8,
    peer_mac: Mac,
    peer_endpoint: u8,
) {
    for handle in ep.pulls.handles() {
        let Some(pull) = ep.pulls.get_mut(handle) else {
            continue;
        };
        if pull.source.peer_mac != peer_mac || pull.source.endpoint != peer_endpoint {
            continue;
        }
        let mask = pull.source_back();
        if mask != 0 {
            tracing::debug!(endpoint, handle, mask, "pull source back; re-requesting");
            link.counters.pull_rerequests += u64::from(mask.count_ones());
            request_blocks(ctx, link, ep, endpoint, handle, mask);
        }
    }
}

/// A peer asks this guest for one block of a region: answer with PULL_REPLY frames, or
/// NACK_MCP if the endpoint, session, region or range is wrong.
///
/// `reply_frames` is what the puller's mark asked for (1 without one); a reply carries
/// up to that many consecutive frames, and at most this engine's own
/// [`pull_reply_frames`](crate::EngineConfig::pull_reply_frames).
pub(crate) fn serve_pull(
    ctx: &mut Ctx,
    nic: &mut VirtualNic,
    head: &HeadRepr,
    pull: &PullRepr,
    reply_frames: u8,
) {
    let link = &mut nic.link;
    let refuse = |ctx: &mut Ctx, link: &mut GuestWire, nack_type: NackType, reason: DropReason| {
        let from_local = ctx.path(head.src) == Path::Local;
        if link.refuse_silently(pull.dst_endpoint, nack_type, from_local) {
            return;
        }
        link.counters.drop(reason);
        link.counters.nacks_sent += 1;
        let nack = NackMcpRepr {
            src_endpoint: pull.dst_endpoint,
            src_generation: 0,
            nack_type,
            src_pull_handle: pull.src_pull_handle,
            src_magic: pull.src_magic,
        };
        ctx.send(link, head.src, PacketRepr::NackMcp(nack));
    };
    if u16::from(pull.dst_endpoint) >= ctx.config.endpoints_per_guest {
        return refuse(ctx, link, NackType::BadEndpoint, DropReason::BadEndpoint);
    }
    let Some(ep) = nic.endpoints.get_mut(&pull.dst_endpoint) else {
        return refuse(
            ctx,
            link,
            NackType::EndpointClosed,
            DropReason::EndpointClosed,
        );
    };
    if pull.session != ep.session {
        return refuse(ctx, link, NackType::BadSession, DropReason::BadSession);
    }
    let Some(region) = ep.regions.get(&pull.pulled_rdma_id).copied() else {
        if ep.regions_returning {
            link.counters.drop(DropReason::EndpointReopening);
            return;
        }
        return refuse(ctx, link, NackType::BadRdmaWindow, DropReason::BadRegion);
    };
    let rid = pull.pulled_rdma_id;
    let asked = &mut ep.fill_asked[usize::from(rid)];
    if !region_filled(nic.memory.as_ref(), pull.dst_endpoint, rid) {
        link.counters.drop(DropReason::RegionUnfilled);
        let window = Some(pull.pulled_rdma_seqnum);
        if *asked != window && ctx.out.has_event_room(link.id, pull.dst_endpoint) {
            *asked = window;
            let tag = ep.next_tag();
            let body = EventBody::RegionWanted { region: rid };
            ctx.out
                .unsolicited(link.id, pull.dst_endpoint, Event { tag, body });
        }
        return;
    }
    *asked = None;
    // The block's place in the message, then in the region (all in 64 bits: the frame
    // index is the peer's to choose).
    let base = u64::from(pull.pulled_rdma_offset);
    let msg_offset = (u64::from(pull.frame_index) * FRAME + u64::from(pull.first_frame_offset))
        .checked_sub(base % FRAME);
    let in_range = msg_offset.filter(|&off| {
        let end = off + u64::from(pull.block_length);
        end <= u64::from(u32::MAX) && base + end <= region.length
    });
    let Some(msg_offset) = in_range else {
        return refuse(ctx, link, NackType::BadRdmaWindow, DropReason::BadRegion);
    };
    let replies = pull.replies();
    let wire_bytes = replies * (HEAD_LEN + PULL_REPLY_LEN) + usize::from(pull.block_length);
    if ctx.path(head.src) == Path::Wire
        && link.tx_bytes_queued + wire_bytes > ctx.config.max_tx_bytes_per_guest
    {
        // The puller asks again after its timeout.
        link.counters.drop(DropReason::TxQuota);
        return;
    }
    let area = MemoryArea::Region(region.handle);
    let reply_head = HeadRepr {
        dst: head.src,
        src: link.mac,
        dst_src_peer_index: ctx.reverse_index(link, head.src),
    };
    let per_reply = reply_frames.min(ctx.config.pull_reply_frames).max(1) as usize;
    let mut offset = msg_offset;
    let mut left = u64::from(pull.block_length);
    for i in (0..replies).step_by(per_reply) {
        // The frames this reply carries, each as long as MX's reply for it would be.
        let room: u64 = (i..(i + per_reply).min(replies))
            .map(|f| {
                if f == 0 {
                    FRAME - u64::from(pull.first_frame_offset)
                } else {
                    FRAME
                }
            })
            .sum();
        let len = room.min(left) as usize;
        let reply = PullReplyRepr {
            frame_seqnum: pull.frame_index.wrapping_add(i as u32) as u8,
            // Bounded by u32::MAX above, and by the region's end.
            msg_offset: offset as u32,
            dst_pull_handle: pull.src_pull_handle,
            dst_magic: pull.src_magic,
            data: &[],
        };
        offset += len as u64;
        left -= len as u64;
        let Some(path) = ctx.room_for(link, head.src) else {
            continue;
        };
        let deferred = DeferredReply {
            head: reply_head,
            frame_seqnum: reply.frame_seqnum,
            msg_offset: reply.msg_offset,
            dst_pull_handle: reply.dst_pull_handle,
            dst_magic: reply.dst_magic,
            src_endpoint: pull.dst_endpoint,
            area,
            at: base + u64::from(reply.msg_offset),
            len,
        };
        if path == Path::Wire {
            // Read when the frame is written into the NIC's transmit slot: one copy
            // from guest memory to the wire's ring, none through the engine.
            ctx.queue_reply(link, deferred);
            continue;
        }
        let memory = &*nic.memory;
        let built = ctx.out.build_in_place(deferred.wire_len(), |frame| {
            deferred.write(memory, frame).map(drop)
        });
        match built {
            Ok(buf) => ctx.queue(link, path, buf),
            Err(ReplyWriteError::Memory) => {
                refuse(ctx, link, NackType::BadRdmaWindow, DropReason::MemoryFault);
                break;
            }
            Err(ReplyWriteError::Emit) => {
                tracing::warn!(guest = link.id.0, "pull reply refused by its emitter");
                link.counters.drop(DropReason::Malformed);
                break;
            }
        }
    }
}

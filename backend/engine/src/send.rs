//! Send requests: checked again, turned into frames from the guest's own MAC, completed
//! with an event.

use std::time::Instant;

use xmx_wire::msg::{
    medium_frags, DoneStatus, ErrorCode, Event, EventBody, MsgInfo, Route, SendOp, SendRequest,
    MEDIUM_FRAG_MAX, MEDIUM_MAX, SMALL_MAX, TINY_MAX,
};
use xmx_wire::mxoe::{
    ConnectData, ConnectRepr, ConnectStatus, HeadPacket, HeadRepr, LibAck, Mac, MediumPacket,
    MediumRepr, MsgHeader, NotifyRepr, PacketRepr, RndvRepr, SmallRepr, TinyRepr, TrucRepr,
    HEAD_LEN, MEDIUM_FRAGS_MAX, MEDIUM_FRAG_LEN_SHIFT, MEDIUM_LEN,
};

use super::memory::MemoryArea;
use super::output::Path;
use super::vnic::{DropReason, GuestEndpoint, GuestWire};
use super::wide::{OurMark, WideSend};
use super::{rdma, Ctx, Engine, GuestId, Violation};

impl Engine {
    pub(super) fn send_request(
        &mut self,
        now: Instant,
        guest: GuestId,
        endpoint: u8,
        request: &SendRequest,
    ) -> Result<(), Violation> {
        let (nic, mut ctx) = self.split(guest).ok_or(Violation::UnknownGuest(guest))?;
        let ep = nic
            .endpoints
            .get_mut(&endpoint)
            .ok_or(Violation::EndpointNotOpen(endpoint))?;
        check_op(&request.op, ep)?;
        if !matches!(request.op, SendOp::Register(_) | SendOp::Deregister { .. }) {
            // The guest uses the endpoint again: its regions are back.
            ep.regions_returning = false;
        }
        let tag = request.tag;
        let route = request.route;
        let dst = match resolve(&ctx, &nic.link, route.peer_index)? {
            Ok(mac) => mac,
            Err(code) => {
                ctx.refuse(&mut nic.link, endpoint, tag, code);
                return Ok(());
            }
        };
        let link = &mut nic.link;
        // Only a MEDIUM's completion gives the guest something back (its send-queue
        // slots); the others are quiet.
        let wakes = matches!(request.op, SendOp::Medium(_));
        let done = |ctx: &mut Ctx, link: &GuestWire, length: u32| {
            let body = EventBody::SendDone {
                status: DoneStatus::Success,
                length,
            };
            let event = Event { tag, body };
            if wakes {
                ctx.out.completion(link.id, endpoint, event);
            } else {
                ctx.out.quiet_completion(link.id, endpoint, event);
            }
        };
        match &request.op {
            SendOp::Tiny(m) => {
                let data = m.data.as_slice();
                let header = msg_header(&route, endpoint, &m.info);
                ctx.send(link, dst, PacketRepr::Tiny(TinyRepr { header, data }));
                done(&mut ctx, link, data.len() as u32);
            }
            SendOp::Small(m) => {
                let data = m.data.as_slice();
                let header = msg_header(&route, endpoint, &m.info);
                ctx.send(link, dst, PacketRepr::Small(SmallRepr { header, data }));
                done(&mut ctx, link, data.len() as u32);
            }
            SendOp::Medium(m) => {
                let header = msg_header(&route, endpoint, &m.info);
                let wide = WideSend {
                    dst,
                    dst_endpoint: route.endpoint,
                    src_endpoint: endpoint,
                    lib_seqnum: header.lib_seqnum,
                };
                let slots = m.sendq_slots.as_slice();
                // Counted at MX's stride, the most frames the message can take.
                let wire_bytes = slots.len() * (HEAD_LEN + MEDIUM_LEN) + m.length as usize;
                if ctx.path(dst) == Path::Wire
                    && link.tx_bytes_queued + wire_bytes > ctx.config.max_tx_bytes_per_guest
                {
                    link.counters.quota_refusals += 1;
                    ctx.refuse(link, endpoint, tag, ErrorCode::NoResources);
                    return Ok(());
                }
                // Chosen once the message goes: one refused is not taken for sent.
                let stride = link
                    .wide
                    .stride(wide, m.length, ctx.config.pull_reply_frames);
                let shift = stride.shift;
                // Send-queue slots (4 KiB each) per fragment: 1 at MX's stride.
                let per_frag = 1usize << (shift - MEDIUM_FRAG_LEN_SHIFT);
                let frags = slots.len().div_ceil(per_frag);
                if stride.downgraded {
                    link.counters.wide_downgrades += 1;
                }
                // Every fragment is read straight into its frame, and the frames are
                // queued only once all of them are read: the guest may rewrite its slots
                // at any time, and a fault must not leave half a message sent.
                let area = MemoryArea::SendQueue { endpoint };
                let fields = HEAD_LEN + MEDIUM_LEN;
                let frag_head = HeadRepr {
                    dst,
                    src: link.mac,
                    dst_src_peer_index: ctx.reverse_index(link, dst),
                };
                let mut built: [Option<Vec<u8>>; MEDIUM_FRAGS_MAX] = Default::default();
                let mut fault = false;
                for (i, group) in slots.chunks(per_frag).enumerate() {
                    let (start, len) = frag_span(m.length, i, shift);
                    let frag = MediumRepr {
                        header,
                        // At most 32 KiB: checked by check_op.
                        msg_length: m.length as u16,
                        frag_seqnum: i as u8,
                        frag_pipeline: shift as u8,
                        data: &[],
                    };
                    let memory = &nic.memory;
                    let frame = ctx.out.build_in_place(fields + len, |frame| {
                        let (front, data) = frame.split_at_mut(fields);
                        // The fragment's slots, 4 KiB of the message each.
                        for (j, &slot) in group.iter().enumerate() {
                            let piece = start / MEDIUM_FRAG_MAX + j;
                            let (at, n) = frag_span(m.length, piece, MEDIUM_FRAG_LEN_SHIFT);
                            let into = data.get_mut(at - start..at - start + n).ok_or(())?;
                            let offset = u64::from(slot) * MEDIUM_FRAG_MAX as u64;
                            memory.read(area, offset, into).map_err(|_| ())?;
                        }
                        // Zeroed first: the pooled buffer holds an earlier frame's bytes.
                        front.fill(0);
                        frag_head
                            .emit(&mut HeadPacket::new_unchecked(&mut *front))
                            .map_err(|_| ())?;
                        let packet = front.get_mut(HEAD_LEN..).unwrap_or(&mut []);
                        frag.emit_fields(&mut MediumPacket::new_unchecked(packet), len)
                            .map_err(|_| ())
                    });
                    match (frame, built.get_mut(i)) {
                        (Ok(buf), Some(place)) => *place = Some(buf),
                        (Ok(buf), None) => {
                            ctx.out.recycle(buf);
                            fault = true;
                            break;
                        }
                        (Err(()), _) => {
                            fault = true;
                            break;
                        }
                    }
                }
                if fault {
                    for buf in built.into_iter().flatten() {
                        ctx.out.recycle(buf);
                    }
                    link.counters.drop(DropReason::MemoryFault);
                    ctx.refuse(link, endpoint, tag, ErrorCode::Malformed);
                    return Ok(());
                }
                if shift > MEDIUM_FRAG_LEN_SHIFT {
                    link.counters.wide_frags_sent += frags as u64;
                }
                for buf in built.into_iter().flatten() {
                    match ctx.room_for(link, dst) {
                        Some(path) => ctx.queue(link, path, buf),
                        None => ctx.out.recycle(buf),
                    }
                }
                done(&mut ctx, link, m.length);
            }
            SendOp::Rndv(r) => {
                if let Err(why) =
                    check_region(ep, r.region_id, u64::from(r.region_offset), r.length)
                {
                    // Refused, not a violation: the send ring and the registration path are
                    // not ordered, so a library's resent RNDV can reach us after the window
                    // it names was deregistered (its send ended). A window is only read
                    // when a pull names it, and pulls are checked then.
                    tracing::debug!(guest = link.id.0, endpoint, %why, "RNDV of an unregistered window");
                    ctx.refuse(link, endpoint, tag, ErrorCode::BadRegion);
                    return Ok(());
                }
                let Ok(offset) = u16::try_from(r.region_offset) else {
                    ctx.refuse(link, endpoint, tag, ErrorCode::Unsupported);
                    return Ok(());
                };
                let rndv = RndvRepr {
                    header: msg_header(&route, endpoint, &r.info),
                    msg_length: r.length,
                    pulled_rdma_id: r.region_id,
                    pulled_rdma_seqnum: r.region_seqnum,
                    pulled_rdma_offset: offset,
                };
                ctx.send(link, dst, PacketRepr::Rndv(rndv));
                done(&mut ctx, link, 0);
            }
            SendOp::ConnectRequest(c) => {
                let connect = ConnectRepr {
                    dst_endpoint: route.endpoint,
                    src_endpoint: endpoint,
                    src_generation: 0,
                    lib_seqnum: c.seqnum,
                    src_dst_peer_index: route.peer_index,
                    data: ConnectData::Request(xmx_wire::mxoe::ConnectRequestData {
                        src_session_id: ep.session,
                        app_key: c.app_key,
                        target_recv_seqnum_start: c.target_recv_seqnum_start,
                        connect_seqnum: c.connect_seqnum,
                    }),
                };
                // Tells the peer how long our MEDIUM fragments may be (see `wide`).
                let mark = OurMark::new(ctx.config.pull_reply_frames);
                ctx.send_padded(link, dst, PacketRepr::Connect(connect), mark.bytes());
                done(&mut ctx, link, 0);
            }
            SendOp::ConnectReply(c) => {
                let connect = ConnectRepr {
                    dst_endpoint: route.endpoint,
                    src_endpoint: endpoint,
                    src_generation: 0,
                    lib_seqnum: c.seqnum,
                    src_dst_peer_index: route.peer_index,
                    data: ConnectData::Reply(xmx_wire::mxoe::ConnectReplyData {
                        src_session_id: ep.session,
                        target_session_id: route.session_id,
                        target_recv_seqnum_start: c.target_recv_seqnum_start,
                        connect_seqnum: c.connect_seqnum,
                        // Checked by check_op.
                        status: ConnectStatus::try_from(c.status).unwrap_or(ConnectStatus::BadKey),
                    }),
                };
                // Tells the peer how long our MEDIUM fragments may be (see `wide`).
                let mark = OurMark::new(ctx.config.pull_reply_frames);
                ctx.send_padded(link, dst, PacketRepr::Connect(connect), mark.bytes());
                done(&mut ctx, link, 0);
            }
            SendOp::Notify(n) => {
                let notify = NotifyRepr {
                    dst_endpoint: route.endpoint,
                    src_endpoint: endpoint,
                    src_generation: 0,
                    session: route.session_id,
                    total_length: n.total_length,
                    pulled_rdma_id: n.region_id,
                    pulled_rdma_seqnum: n.region_seqnum,
                    lib_seqnum: n.seqnum,
                    lib_piggyack: n.piggyack,
                };
                ctx.send(link, dst, PacketRepr::Notify(notify));
                done(&mut ctx, link, 0);
            }
            SendOp::Liback(a) => {
                let truc = TrucRepr {
                    dst_endpoint: route.endpoint,
                    src_endpoint: endpoint,
                    src_generation: 0,
                    session: route.session_id,
                    liback: LibAck {
                        lib_seqnum: a.lib_seqnum,
                        session_id: route.session_id,
                        acknum: a.acknum,
                        send_seq: a.send_seq,
                        resent: a.resent.into(),
                    },
                };
                ctx.send(link, dst, PacketRepr::Truc(truc));
                done(&mut ctx, link, 0);
            }
            SendOp::Register(_) | SendOp::Deregister { .. } => {
                // Mapping guest memory is the daemon's: it serves these before the engine.
                ctx.refuse(link, endpoint, tag, ErrorCode::Unsupported);
            }
            SendOp::Pull(p) => {
                rdma::start_pull(
                    &mut ctx,
                    link,
                    &mut nic.usage,
                    ep,
                    rdma::PullStart {
                        now,
                        endpoint,
                        tag,
                        route,
                        dst,
                        pull: *p,
                    },
                );
            }
        }
        Ok(())
    }
}

/// Re-check what parsing could not know: lengths against classes, queue slots against the
/// endpoint's queue, regions against the endpoint's registrations.
fn check_op(op: &SendOp, ep: &GuestEndpoint) -> Result<(), Violation> {
    match op {
        SendOp::Tiny(m) if m.data.len() > TINY_MAX => Err(Violation::BadLength {
            class: "tiny",
            length: m.data.len() as u32,
        }),
        SendOp::Small(m) if m.data.len() > SMALL_MAX => Err(Violation::BadLength {
            class: "small",
            length: m.data.len() as u32,
        }),
        SendOp::Medium(m) => {
            if m.length as usize > MEDIUM_MAX || m.sendq_slots.len() != medium_frags(m.length) {
                return Err(Violation::BadLength {
                    class: "medium",
                    length: m.length,
                });
            }
            match m
                .sendq_slots
                .as_slice()
                .iter()
                .find(|&&s| s >= ep.send_queue_slots)
            {
                Some(&slot) => Err(Violation::BadSendQueueSlot {
                    slot,
                    slots: ep.send_queue_slots,
                }),
                None => Ok(()),
            }
        }
        SendOp::Pull(p) => check_region(ep, p.local_region, u64::from(p.local_offset), p.length),
        SendOp::ConnectReply(c) => ConnectStatus::try_from(c.status)
            .map(|_| ())
            .map_err(|_| Violation::BadConnectStatus(c.status)),
        _ => Ok(()),
    }
}

fn check_region(ep: &GuestEndpoint, region: u8, offset: u64, length: u32) -> Result<(), Violation> {
    let r = ep
        .regions
        .get(&region)
        .ok_or(Violation::BadRegion(region))?;
    // Both operands fit in 32 bits, so the sum cannot overflow 64.
    if offset + u64::from(length) > r.length {
        return Err(Violation::RegionRange {
            region,
            offset,
            length: u64::from(length),
            region_len: r.length,
        });
    }
    Ok(())
}

/// The board a peer index names, or the ERROR code a send to it completes with.
fn resolve(
    ctx: &Ctx,
    link: &GuestWire,
    peer_index: u16,
) -> Result<Result<Mac, ErrorCode>, Violation> {
    // An index beyond the table is no violation: dom0 may shrink the table (a host
    // forgotten, a guest gone) between the library's lookup and its send, so a
    // correct library can name an entry that no longer exists.
    let Some(peer) = ctx.peers.get(peer_index) else {
        return Ok(Err(ErrorCode::BadPeer));
    };
    if peer.cluster != link.cluster {
        return Ok(Err(ErrorCode::Denied));
    }
    // A stale table could put a co-located guest of another cluster in ours.
    if let Some(&(_, cluster)) = ctx.local.get(&peer.mac) {
        if cluster != link.cluster {
            return Ok(Err(ErrorCode::Denied));
        }
    }
    Ok(Ok(peer.mac))
}

fn msg_header(route: &Route, src_endpoint: u8, info: &MsgInfo) -> MsgHeader {
    MsgHeader {
        dst_endpoint: route.endpoint,
        src_endpoint,
        src_generation: 0,
        lib_seqnum: info.seqnum,
        lib_piggyack: info.piggyack,
        match_info: info.match_info,
        session: route.session_id,
        checksum: 0,
    }
}

/// Start and length of fragment `i` of a MEDIUM message of `length` bytes, at a stride
/// of `1 << shift` bytes.
fn frag_span(length: u32, i: usize, shift: u32) -> (usize, usize) {
    let stride = 1usize << shift;
    let start = i * stride;
    let len = (length as usize).saturating_sub(start).min(stride);
    (start, len)
}

//! Frames in: demultiplexed by destination MAC to a guest, by endpoint index to an
//! endpoint, checked (source peer and cluster, endpoint open, session), then turned into
//! events, receive-queue copies, pull progress or PULL replies.

use std::time::Instant;

use rustc_hash::FxHashMap;
use xmx_wire::msg::{
    medium_frags, Event, EventBody, InlineData, InlineMsg, LibackSend, MsgInfo, NackKind,
    NotifySend, RecvMedium, RingConnectReply, RingConnectRequest, RndvSend, Route, MEDIUM_FRAG_MAX,
};
use xmx_wire::mxoe::units_mark;
use xmx_wire::mxoe::{
    ConnectData, HeadPacket, HeadRepr, Mac, MsgHeader, NackLibRepr, NackType, PacketRepr,
    CONNECT_LEN, HEAD_LEN, MEDIUM_FRAGS_MAX, MEDIUM_FRAG_LEN_SHIFT, PULL_LEN,
};

use super::memory::MemoryArea;
use super::output::Path;
use super::vnic::{DropReason, GuestEndpoint, GuestWire};
use super::{host, rdma, Ctx, Engine, EngineConfig};

/// Who sent a frame: its board and its index in the peer table.
#[derive(Debug, Clone, Copy)]
struct Sender {
    mac: Mac,
    index: u16,
}

impl Sender {
    fn route(&self, endpoint: u8, session_id: u32) -> Route {
        Route {
            peer_index: self.index,
            endpoint,
            session_id,
        }
    }
}

impl Engine {
    /// Take in one frame, from the wire or looped back from a co-located guest.
    pub(super) fn receive(&mut self, now: Instant, frame: &[u8], origin: Path) {
        let head = match HeadPacket::new_checked(frame).and_then(|p| HeadRepr::parse(&p)) {
            Ok(head) => head,
            Err(_) => {
                self.counters.rx_malformed += 1;
                return;
            }
        };
        let Some(&(guest, _)) = self.local.get(&head.dst) else {
            self.counters.rx_unknown_destination += 1;
            return;
        };
        if origin == Path::Wire && self.local.contains_key(&head.src) {
            // Our guests' frames never come from the wire.
            self.counters.rx_spoofed_source += 1;
            return;
        }
        let Some((nic, mut ctx)) = self.split(guest) else {
            return;
        };
        let packet = match PacketRepr::parse(frame.get(HEAD_LEN..).unwrap_or(&[])) {
            Ok(packet) => packet,
            Err(e) => {
                tracing::trace!(guest = guest.0, error = %e, "malformed packet");
                nic.link.counters.drop(DropReason::Malformed);
                return;
            }
        };
        // Host discovery precedes the peer table: a querier may not be known yet.
        match &packet {
            PacketRepr::HostQuery(q) => return host::on_query(&mut ctx, &mut nic.link, &head, q),
            PacketRepr::HostReply(r) => return host::on_reply(&mut ctx, &mut nic.link, &head, r),
            _ => {}
        }
        let Some(peer) = ctx.peers.by_mac(head.src) else {
            nic.link.counters.drop(DropReason::UnknownSource);
            return;
        };
        if peer.cluster != nic.link.cluster {
            nic.link.counters.drop(DropReason::CrossCluster);
            return;
        }
        let from = Sender {
            mac: head.src,
            index: peer.index,
        };
        nic.link.counters.rx_frames += 1;
        nic.link.counters.rx_bytes += frame.len() as u64;

        let endpoints = &mut nic.endpoints;
        let link = &mut nic.link;
        match packet {
            PacketRepr::Tiny(t) => deliver_inline(
                &mut ctx,
                link,
                endpoints,
                from,
                &t.header,
                t.data,
                |from, msg| EventBody::RecvTiny { from, msg },
            ),
            PacketRepr::Small(s) => deliver_inline(
                &mut ctx,
                link,
                endpoints,
                from,
                &s.header,
                s.data,
                |from, msg| EventBody::RecvSmall { from, msg },
            ),
            PacketRepr::Medium(m) => {
                let h = m.header;
                let length = u32::from(m.msg_length);
                // A fragment wider than MX's (from an xmx board we allowed it) goes to the
                // library as the MX fragments it covers, each in a slot of its own.
                let widen = u32::from(m.frag_pipeline).saturating_sub(MEDIUM_FRAG_LEN_SHIFT);
                let first = usize::from(m.frag_seqnum) << widen;
                if first >= medium_frags(length) {
                    // An empty fragment past the end of the message.
                    return link.counters.drop(DropReason::Malformed);
                }
                let Some(ep) = accept_message(&mut ctx, link, endpoints, from, &h) else {
                    return;
                };
                let pieces = m.data.len().div_ceil(MEDIUM_FRAG_MAX).max(1);
                if !ctx.out.has_event_room_for(link.id, h.dst_endpoint, pieces) {
                    return link.counters.drop(DropReason::EventQueueFull);
                }
                if ep.recvq.free_slots() < pieces {
                    return link.counters.drop(DropReason::RecvQueueFull);
                }
                let area = MemoryArea::RecvQueue {
                    endpoint: h.dst_endpoint,
                };
                let mut frags = [None; MEDIUM_FRAGS_MAX];
                for (k, place) in frags.iter_mut().take(pieces).enumerate() {
                    let data = m.data.chunks(MEDIUM_FRAG_MAX).nth(k).unwrap_or(&[]);
                    let Some(slot) = ep.recvq.take() else {
                        break;
                    };
                    let offset = u64::from(slot) * MEDIUM_FRAG_MAX as u64;
                    if nic.memory.write(area, offset, data).is_err() {
                        ep.recvq.give_back(slot);
                        break;
                    }
                    *place = Some(RecvMedium {
                        info: msg_info(&h),
                        length,
                        recvq_slot: slot,
                        // At most 4096: one chunk of the data.
                        frag_length: data.len() as u16,
                        frag_seqnum: (first + k) as u8,
                        frag_pipeline: MEDIUM_FRAG_LEN_SHIFT as u8,
                    });
                }
                if frags.iter().take(pieces).any(Option::is_none) {
                    // Nothing is delivered of a fragment not wholly written: the sender
                    // sends the message again.
                    for frag in frags.iter().flatten() {
                        ep.recvq.give_back(frag.recvq_slot);
                    }
                    return link.counters.drop(DropReason::MemoryFault);
                }
                if widen > 0 {
                    link.counters.wide_frags_received += 1;
                }
                let from = from.route(h.src_endpoint, 0);
                for frag in frags.into_iter().flatten() {
                    deliver(
                        &mut ctx,
                        link,
                        ep,
                        h.dst_endpoint,
                        EventBody::RecvMedium { from, frag },
                    );
                }
            }
            PacketRepr::Rndv(r) => {
                let h = r.header;
                let Some(ep) = accept_message(&mut ctx, link, endpoints, from, &h) else {
                    return;
                };
                let rndv = RndvSend {
                    info: msg_info(&h),
                    length: r.msg_length,
                    region_id: r.pulled_rdma_id,
                    region_seqnum: r.pulled_rdma_seqnum,
                    region_offset: u32::from(r.pulled_rdma_offset),
                };
                let from = from.route(h.src_endpoint, 0);
                deliver(
                    &mut ctx,
                    link,
                    ep,
                    h.dst_endpoint,
                    EventBody::RecvRndv { from, rndv },
                );
            }
            PacketRepr::Connect(c) => {
                // The sender tells us our index in its table, and how long our MEDIUM
                // fragments to it may be, whatever happens next.
                link.reverse_index.insert(from.mac, c.src_dst_peer_index);
                let after = frame.get(HEAD_LEN + CONNECT_LEN..).unwrap_or(&[]);
                link.wide.learn(from.mac, units_mark::read(after));
                let check = check_endpoint(ctx.config, endpoints, c.dst_endpoint, None);
                let ep = match check {
                    Ok(ep) => ep,
                    Err(t) => {
                        let nack = Refused {
                            our_endpoint: c.dst_endpoint,
                            their_endpoint: c.src_endpoint,
                            lib_seqnum: c.lib_seqnum,
                        };
                        return nack_lib(&mut ctx, link, from, nack, t);
                    }
                };
                let body = match c.data {
                    ConnectData::Request(r) => EventBody::RecvConnectRequest {
                        from: from.route(c.src_endpoint, r.src_session_id),
                        request: RingConnectRequest {
                            seqnum: c.lib_seqnum,
                            target_recv_seqnum_start: r.target_recv_seqnum_start,
                            app_key: r.app_key,
                            connect_seqnum: r.connect_seqnum,
                        },
                    },
                    ConnectData::Reply(r) => EventBody::RecvConnectReply {
                        from: from.route(c.src_endpoint, r.src_session_id),
                        reply: RingConnectReply {
                            seqnum: c.lib_seqnum,
                            target_recv_seqnum_start: r.target_recv_seqnum_start,
                            connect_seqnum: r.connect_seqnum,
                            status: r.status.into(),
                        },
                        target_session_id: r.target_session_id,
                    },
                };
                deliver(&mut ctx, link, ep, c.dst_endpoint, body);
            }
            PacketRepr::Notify(n) => {
                let check = check_endpoint(ctx.config, endpoints, n.dst_endpoint, Some(n.session));
                let ep = match check {
                    Ok(ep) => ep,
                    Err(t) => {
                        let nack = Refused {
                            our_endpoint: n.dst_endpoint,
                            their_endpoint: n.src_endpoint,
                            lib_seqnum: n.lib_seqnum,
                        };
                        return nack_lib(&mut ctx, link, from, nack, t);
                    }
                };
                let notify = NotifySend {
                    seqnum: n.lib_seqnum,
                    piggyack: n.lib_piggyack,
                    total_length: n.total_length,
                    region_id: n.pulled_rdma_id,
                    region_seqnum: n.pulled_rdma_seqnum,
                };
                let from = from.route(n.src_endpoint, 0);
                deliver(
                    &mut ctx,
                    link,
                    ep,
                    n.dst_endpoint,
                    EventBody::RecvNotify { from, notify },
                );
            }
            PacketRepr::Truc(t) => {
                // Acks are never NACKed: a lost ack is sent again anyway.
                let check = check_endpoint(ctx.config, endpoints, t.dst_endpoint, Some(t.session));
                let ep = match check {
                    Ok(ep) => ep,
                    Err(nack_type) => return link.counters.drop(drop_reason(nack_type)),
                };
                if t.liback.session_id != t.session {
                    return link.counters.drop(DropReason::BadSession);
                }
                let ack = LibackSend {
                    lib_seqnum: t.liback.lib_seqnum,
                    send_seq: t.liback.send_seq,
                    acknum: t.liback.acknum,
                    resent: t.liback.resent != 0,
                };
                let route = from.route(t.src_endpoint, 0);
                deliver(
                    &mut ctx,
                    link,
                    ep,
                    t.dst_endpoint,
                    EventBody::RecvLiback { from: route, ack },
                );
                if ack.resent {
                    let (mac, src) = (from.mac, t.src_endpoint);
                    rdma::source_back(&mut ctx, link, ep, t.dst_endpoint, mac, src);
                }
            }
            PacketRepr::NackLib(n) => {
                let kind = match n.nack_type {
                    NackType::BadEndpoint => NackKind::BadEndpoint,
                    NackType::EndpointClosed => NackKind::EndpointClosed,
                    NackType::BadSession => NackKind::BadSession,
                    NackType::BadRdmaWindow => NackKind::BadRdmaWindow,
                    NackType::None => return link.counters.drop(DropReason::Malformed),
                };
                let Some(ep) = endpoints.get_mut(&n.dst_endpoint) else {
                    return link.counters.drop(DropReason::EndpointClosed);
                };
                let body = EventBody::RecvNack {
                    from: from.route(n.src_endpoint, 0),
                    kind,
                    seqnum: n.lib_seqnum,
                };
                deliver(&mut ctx, link, ep, n.dst_endpoint, body);
            }
            PacketRepr::Pull(p) => {
                let after = frame.get(HEAD_LEN + PULL_LEN..).unwrap_or(&[]);
                let reply_frames = units_mark::read(after);
                rdma::serve_pull(&mut ctx, nic, &head, &p, reply_frames)
            }
            PacketRepr::PullReply(r) => rdma::on_pull_reply(&mut ctx, nic, now, from.mac, &r),
            PacketRepr::NackMcp(n) => rdma::on_nack_mcp(&mut ctx, nic, from.mac, &n),
            PacketRepr::Raw(_) | PacketRepr::HostQuery(_) | PacketRepr::HostReply(_) => {
                link.counters.drop(DropReason::Unsupported)
            }
        }
    }
}

/// The endpoint a packet is for, if open and (when `session` is given) in that session;
/// else the NACK type Open-MX answers with.
fn check_endpoint<'e>(
    config: &EngineConfig,
    endpoints: &'e mut FxHashMap<u8, GuestEndpoint>,
    endpoint: u8,
    session: Option<u32>,
) -> Result<&'e mut GuestEndpoint, NackType> {
    if u16::from(endpoint) >= config.endpoints_per_guest {
        return Err(NackType::BadEndpoint);
    }
    let ep = endpoints
        .get_mut(&endpoint)
        .ok_or(NackType::EndpointClosed)?;
    match session {
        Some(s) if s != ep.session => Err(NackType::BadSession),
        _ => Ok(ep),
    }
}

/// Endpoint and session checks of TINY/SMALL/MEDIUM/RNDV, NACKing a refusal.
fn accept_message<'e>(
    ctx: &mut Ctx,
    link: &mut GuestWire,
    endpoints: &'e mut FxHashMap<u8, GuestEndpoint>,
    from: Sender,
    h: &MsgHeader,
) -> Option<&'e mut GuestEndpoint> {
    match check_endpoint(ctx.config, endpoints, h.dst_endpoint, Some(h.session)) {
        Ok(ep) => Some(ep),
        Err(t) => {
            let refused = Refused {
                our_endpoint: h.dst_endpoint,
                their_endpoint: h.src_endpoint,
                lib_seqnum: h.lib_seqnum,
            };
            nack_lib(ctx, link, from, refused, t);
            None
        }
    }
}

/// The packet a NACK_LIB refuses.
struct Refused {
    our_endpoint: u8,
    their_endpoint: u8,
    lib_seqnum: u16,
}

fn drop_reason(t: NackType) -> DropReason {
    match t {
        NackType::BadEndpoint => DropReason::BadEndpoint,
        NackType::EndpointClosed => DropReason::EndpointClosed,
        NackType::BadSession => DropReason::BadSession,
        NackType::BadRdmaWindow => DropReason::BadRegion,
        NackType::None => DropReason::Malformed,
    }
}

fn nack_lib(
    ctx: &mut Ctx,
    link: &mut GuestWire,
    to: Sender,
    refused: Refused,
    nack_type: NackType,
) {
    let from_local = ctx.path(to.mac) == Path::Local;
    if link.refuse_silently(refused.our_endpoint, nack_type, from_local) {
        return;
    }
    link.counters.drop(drop_reason(nack_type));
    link.counters.nacks_sent += 1;
    let nack = NackLibRepr {
        src_endpoint: refused.our_endpoint,
        src_generation: 0,
        nack_type,
        dst_endpoint: refused.their_endpoint,
        dst_src_peer_index: ctx.reverse_index(link, to.mac),
        lib_seqnum: refused.lib_seqnum,
    };
    ctx.send(link, to.mac, PacketRepr::NackLib(nack));
}

/// A TINY or SMALL message: checked, then delivered inline in the event `body` makes.
fn deliver_inline(
    ctx: &mut Ctx,
    link: &mut GuestWire,
    endpoints: &mut FxHashMap<u8, GuestEndpoint>,
    from: Sender,
    h: &MsgHeader,
    data: &[u8],
    body: impl FnOnce(Route, InlineMsg) -> EventBody,
) {
    let Some(ep) = accept_message(ctx, link, endpoints, from, h) else {
        return;
    };
    let Ok(msg) = inline_msg(h, data) else {
        return link.counters.drop(DropReason::Malformed);
    };
    let from = from.route(h.src_endpoint, 0);
    deliver(ctx, link, ep, h.dst_endpoint, body(from, msg));
}

/// Queue an unsolicited event unless the endpoint already has too many waiting.
fn deliver(
    ctx: &mut Ctx,
    link: &mut GuestWire,
    ep: &mut GuestEndpoint,
    endpoint: u8,
    body: EventBody,
) {
    if !ctx.out.has_event_room(link.id, endpoint) {
        return link.counters.drop(DropReason::EventQueueFull);
    }
    let tag = ep.next_tag();
    ctx.out.unsolicited(link.id, endpoint, Event { tag, body });
}

fn msg_info(h: &MsgHeader) -> MsgInfo {
    MsgInfo {
        seqnum: h.lib_seqnum,
        piggyack: h.lib_piggyack,
        match_info: h.match_info,
    }
}

fn inline_msg(h: &MsgHeader, data: &[u8]) -> xmx_wire::Result<InlineMsg> {
    Ok(InlineMsg {
        info: msg_info(h),
        data: InlineData::new(data)?,
    })
}

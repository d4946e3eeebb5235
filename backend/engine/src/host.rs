//! Host discovery: HOST_QUERY asks a board for its hostname, HOST_REPLY answers. The engine
//! answers queries addressed to its guests with their hostnames and hands replies to the
//! peer service.

use xmx_wire::mxoe::{
    HeadRepr, HostQueryRepr, HostReplyRepr, Mac, PacketRepr, HOSTNAME_LEN_MAX, HOST_QUERY_MAGIC,
};

use super::output::HostReply;
use super::vnic::{DropReason, GuestWire};
use super::Ctx;

/// Send a HOST_QUERY from the guest to `dst`.
pub(crate) fn send_query(ctx: &mut Ctx, link: &mut GuestWire, dst: Mac) {
    let query = HostQueryRepr {
        src_dst_peer_index: ctx.peers.by_mac(dst).map_or(u16::MAX, |e| e.index),
        magic: HOST_QUERY_MAGIC,
    };
    ctx.send(link, dst, PacketRepr::HostQuery(query));
}

/// A peer asks the guest's hostname. Only peers of the guest's cluster get an answer.
pub(crate) fn on_query(
    ctx: &mut Ctx,
    link: &mut GuestWire,
    head: &HeadRepr,
    query: &HostQueryRepr,
) {
    let Some(peer) = ctx.peers.by_mac(head.src) else {
        link.counters.drop(DropReason::UnknownSource);
        return;
    };
    if peer.cluster != link.cluster {
        link.counters.drop(DropReason::CrossCluster);
        return;
    }
    let querier_index = peer.index;
    link.reverse_index
        .insert(head.src, query.src_dst_peer_index);
    // The hostname was checked at attach time: shorter than the limit, without NUL.
    let mut name = [0u8; HOSTNAME_LEN_MAX];
    let len = link.hostname.len().min(HOSTNAME_LEN_MAX - 1);
    if let (Some(dst), Some(src)) = (name.get_mut(..len), link.hostname.as_bytes().get(..len)) {
        dst.copy_from_slice(src);
    }
    let reply = HostReplyRepr {
        src_dst_peer_index: querier_index,
        magic: query.magic,
        hostname: name.get(..len + 1).unwrap_or(&name),
    };
    ctx.send(link, head.src, PacketRepr::HostReply(reply));
}

/// A board answered one of our queries: keep the answer for the peer service.
pub(crate) fn on_reply(
    ctx: &mut Ctx,
    link: &mut GuestWire,
    head: &HeadRepr,
    reply: &HostReplyRepr,
) {
    if reply.magic != HOST_QUERY_MAGIC {
        link.counters.drop(DropReason::Unsupported);
        return;
    }
    if let Some(peer) = ctx.peers.by_mac(head.src) {
        if peer.cluster == link.cluster {
            link.reverse_index
                .insert(head.src, reply.src_dst_peer_index);
        }
    }
    if ctx.out.host_replies.len() >= ctx.out.max_host_replies {
        link.counters.drop(DropReason::EventQueueFull);
        return;
    }
    ctx.out.host_replies.push_back(HostReply {
        guest: link.id,
        from: head.src,
        reverse_index: reply.src_dst_peer_index,
        hostname: reply.name().to_vec(),
    });
}

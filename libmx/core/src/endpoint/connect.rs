//! The connect handshake, session changes, and dropping a partner.

use super::*;

impl Endpoint {
    /// Connects the endpoint to itself at `me` (its own board's peer index
    /// and its index), as MX does at open: the application may send to its
    /// own address without a handshake. A later connect to itself finds the
    /// session already known and changes nothing.
    pub fn connect_self(&mut self, me: PeerAddr) {
        let session = self.session;
        let p = self.partner_entry(me);
        if p.true_session == Some(session) {
            return;
        }
        let start = p.next_match_recv_seq;
        p.set_send_start(start);
        p.true_session = Some(session);
        p.back_session = Some(session);
    }

    pub(super) fn on_connect_request(&mut self, src: PeerAddr, c: &ConnectRequest) {
        let status = if c.app_key == self.key {
            ConnectStatus::Success
        } else {
            ConnectStatus::BadKey
        };
        let back = self.partner_entry(src).back_session;
        if back != Some(c.src_session) {
            if back.is_some() {
                tracing::info!(
                    ?src,
                    "partner endpoint was reopened, dropping the old connection"
                );
                self.cleanup_partner(src, Status::EndpointUnreachable, false);
            }
            // A partner instance we connected to already counts its sends
            // from the start our connect request gave it (a LARGE's NOTIFY,
            // replies to a message's source) and keeps counting, as it knows
            // our session: restarting here would strand all it sends next.
            let p = self.partner_entry(src);
            if p.true_session != Some(c.src_session) {
                let start = p.next_match_recv_seq.restarted();
                p.set_recv_start(start);
            }
        }
        let my_session = self.session;
        let p = self.partner_entry(src);
        if p.true_session != Some(c.src_session) {
            p.set_send_start(c.target_recv_seqnum_start);
        }
        p.true_session = Some(c.src_session);
        p.back_session = Some(c.src_session);
        let reply = ConnectReply {
            lib_seqnum: 0,
            src_session: c.src_session,
            target_session: my_session,
            target_recv_seqnum_start: p.next_match_recv_seq,
            connect_seqnum: c.connect_seqnum,
            status: status.to_wire(),
        };
        tracing::debug!(?src, ?status, "connect request answered");
        self.transmits.push_back(Frame {
            peer_index: src.peer_index,
            dst_endpoint: src.endpoint,
            src_endpoint: self.index,
            body: Body::ConnectReply(reply),
        });
    }

    pub(super) fn on_connect_reply(&mut self, src: PeerAddr, c: &ConnectReply) {
        if c.src_session != self.session {
            return;
        }
        let Some(status) = ConnectStatus::from_wire(c.status) else {
            tracing::warn!(
                ?src,
                status = c.status,
                "connect reply with unknown status ignored"
            );
            return;
        };
        let Some(p) = self.partners.get_mut(&src) else {
            return;
        };
        let requests = &self.requests;
        let Some(pos) = p.connects.iter().position(
            |id| matches!(requests.get(id), Some(CoreRequest::Connect(r)) if r.connect_seqnum == c.connect_seqnum),
        ) else {
            return;
        };
        let id = p.connects.remove(pos);
        let addr = EndpointAddr {
            peer: src,
            session: c.target_session,
        };
        if status != ConnectStatus::Success {
            self.complete_connect(id, status.status(), None);
            return;
        }
        self.complete_connect(id, Status::Success, Some(addr));
        let back = self.partners.get(&src).and_then(|p| p.back_session);
        if back.is_some_and(|b| b != c.target_session) {
            tracing::info!(
                ?src,
                "partner endpoint was reopened, dropping the old connection"
            );
            self.cleanup_partner(src, Status::EndpointUnreachable, false);
        }
        let p = self.partner_entry(src);
        if p.true_session != Some(c.target_session) {
            p.set_send_start(c.target_recv_seqnum_start);
        }
        p.true_session = Some(c.target_session);
    }

    /// Fails everything pending with `peer` and forgets its connection. With
    /// `disconnect`, the receive session number moves on so that frames of
    /// the old connection are recognised and dropped.
    pub(super) fn cleanup_partner(&mut self, peer: PeerAddr, status: Status, disconnect: bool) {
        let Some(p) = self.partners.get_mut(&peer) else {
            return;
        };
        let non_acked = std::mem::take(&mut p.non_acked);
        let throttled = std::mem::take(&mut p.throttled);
        let awaiting = std::mem::take(&mut p.awaiting_notify);
        let connects = std::mem::take(&mut p.connects);
        let partials = std::mem::take(&mut p.partials);
        p.clear_early();
        for id in non_acked.into_iter().chain(throttled) {
            self.finish_sequenced(id, status);
        }
        for id in awaiting {
            self.complete_send(id, status, 0);
        }
        for id in connects {
            self.complete_connect(id, status, None);
        }
        for (_, iid) in partials {
            let Some(inb) = self.inbound.remove(&iid) else {
                continue;
            };
            match inb.recv {
                Some(rid) => self.complete_recv(
                    rid,
                    peer,
                    inb.match_info,
                    inb.msg_length,
                    Vec::new(),
                    Some(status),
                ),
                None => {
                    self.matcher.remove_unexpected(|&x| x == iid);
                    self.unexpected_bytes -= inb.stored_len();
                }
            }
        }
        // Unexpected rendezvous name the old connection's memory: unusable now
        // (one pulled early too: its NOTIFY has nobody to go to). Whole unexpected
        // messages were acked and stay deliverable.
        let inbound = &self.inbound;
        let stale = self.matcher.remove_unexpected(
            |iid| matches!(inbound.get(iid), Some(i) if i.source == peer && i.is_rendezvous()),
        );
        for iid in stale {
            if let Some(inb) = self.inbound.remove(&iid) {
                self.unexpected_bytes -= inb.stored_len();
            }
        }
        if let Some(p) = self.partners.get_mut(&peer) {
            p.reset();
            if disconnect {
                let next = p.next_match_recv_seq.next_session_scrambled();
                p.set_recv_start(next);
            }
        }
        self.ack_pending.remove(&peer);
    }
}

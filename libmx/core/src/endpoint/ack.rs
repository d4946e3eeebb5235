//! Acks and NACKs received, and the completion of requests they end.

use super::*;

impl Endpoint {
    pub(super) fn complete_send(&mut self, id: RequestId, status: Status, xfer_length: u32) {
        if self.requests.remove(&id).is_some() {
            tracing::debug!(?id, %status, "send done");
            self.events.push_back(EndpointEvent::SendDone {
                id,
                status,
                xfer_length,
            });
        }
    }

    pub(super) fn complete_connect(
        &mut self,
        id: RequestId,
        status: Status,
        addr: Option<EndpointAddr>,
    ) {
        if self.requests.remove(&id).is_some() {
            tracing::debug!(?id, %status, "connect done");
            self.events
                .push_back(EndpointEvent::Connected { id, status, addr });
        }
    }

    /// An acked LARGE send now waits for the receiver's pull, for at most the
    /// rendezvous timeout (a receiver that died after the ack never notifies).
    fn start_notify_wait(&mut self, now: Instant, id: RequestId) {
        // The limit only for a LARGE send: every acked eager send passes
        // here, and the retry budget is a sum over the retries.
        let config = &self.config;
        if let Some(CoreRequest::Send(s)) = self.requests.get_mut(&id) {
            if matches!(s.payload, SendPayload::Large { .. }) && s.notified.is_none() {
                let limit = config
                    .rendezvous_timeout
                    .unwrap_or_else(|| config.retry_budget());
                let wait_end = now + limit;
                s.deadline = Some(s.deadline.map_or(wait_end, |d| d.min(wait_end)));
            }
        }
    }

    /// The sequenced message of `id` was acknowledged (`Success`) or refused.
    pub(super) fn finish_sequenced(&mut self, id: RequestId, status: Status) {
        match self.requests.get_mut(&id) {
            Some(CoreRequest::Send(s)) => {
                s.retx = None;
                match s.payload {
                    SendPayload::Eager(ref data) => {
                        let len = data.len() as u32;
                        self.complete_send(id, status, len);
                    }
                    SendPayload::Large { .. } => {
                        if !status.is_success() {
                            self.complete_send(id, status, 0);
                        } else if let Some(len) = s.notified {
                            self.complete_send(id, status, len);
                        } else {
                            let peer = s.peer;
                            if let Some(p) = self.partners.get_mut(&peer) {
                                p.awaiting_notify.push(id);
                            }
                        }
                    }
                }
            }
            Some(CoreRequest::Recv(RecvReq {
                state: RecvState::Notifying { .. },
                ..
            })) => {
                // The receive was reported when its pull ended.
                if !status.is_success() {
                    tracing::debug!(?id, %status, "NOTIFY not acknowledged after its receive completed");
                }
                self.requests.remove(&id);
            }
            _ => {}
        }
    }

    /// Processes an ack (piggybacked or explicit) of our sends up to `ack_before`.
    pub(super) fn on_ack(&mut self, now: Instant, peer: PeerAddr, ack_before: Seqnum) {
        let Some(p) = self.partners.get(&peer) else {
            return;
        };
        let new = p.new_acks(ack_before);
        if new == 0 {
            return;
        }
        let mut acked = Vec::new();
        let mut count = 0;
        for &id in &p.non_acked {
            match self.retx_of(id) {
                Some(r) if p.send_index(r.seqnum) >= new => break,
                _ => {
                    acked.push(id);
                    count += 1;
                }
            }
        }
        let Some(p) = self.partners.get_mut(&peer) else {
            return;
        };
        p.non_acked.drain(..count);
        p.next_acked_send_seq = ack_before;
        tracing::trace!(?peer, ?ack_before, count, "acked");
        for id in acked {
            self.start_notify_wait(now, id);
            self.finish_sequenced(id, Status::Success);
        }
        self.release_throttled(now, peer);
    }

    pub(super) fn on_liback(&mut self, now: Instant, src: PeerAddr, a: &Liback) {
        if a.session != self.session || a.ack_session != a.session {
            tracing::debug!(?src, "ack for another session, dropped");
            return;
        }
        let Some(p) = self.partners.get_mut(&src) else {
            return;
        };
        if !a.lib_seqnum.same_session(p.next_send_seq) {
            return;
        }
        if a.acknum <= p.last_recv_acknum {
            tracing::trace!(?src, acknum = a.acknum, "stale explicit ack");
            return;
        }
        p.last_recv_acknum = a.acknum;
        self.on_ack(now, src, a.lib_seqnum);
        if a.resent != 0 {
            // The partner's way to the network came back after an outage
            // (`Endpoint::path_restored`): what we sent it meanwhile and is
            // still unacked was most likely lost, so it goes again now rather
            // than at its resend timer. At worst these are duplicates, which
            // the partner drops and acks. Forging this needs the session, as
            // forging any ack does.
            let unacked: Vec<RequestId> = self
                .partners
                .get(&src)
                .map(|p| p.non_acked.iter().copied().collect())
                .unwrap_or_default();
            tracing::debug!(
                ?src,
                unacked = unacked.len(),
                "partner back from an outage; resending"
            );
            for id in unacked {
                self.resend_now(id, now);
            }
        }
    }

    pub(super) fn on_nack(&mut self, now: Instant, src: PeerAddr, n: &Nack) {
        let Some(nack_type) = NackType::from_wire(n.nack_type) else {
            tracing::warn!(?src, nack_type = n.nack_type, "unknown NACK type ignored");
            return;
        };
        let status = nack_type.status();
        let Some(p) = self.partners.get(&src) else {
            return;
        };
        if n.lib_seqnum.same_session(p.next_send_seq) {
            let target = p.send_index(n.lib_seqnum);
            let mut found = None;
            for (pos, &id) in p.non_acked.iter().enumerate() {
                let Some(r) = self.retx_of(id) else { continue };
                let i = p.send_index(r.seqnum);
                if i > target {
                    break;
                }
                if i == target {
                    found = Some((pos, id));
                    break;
                }
            }
            if let Some((_, id)) = found {
                // MXoE's NACK_LIB names a seqnum and nothing else: no session,
                // nothing a third party on the fabric could not forge from a
                // captured or guessed seqnum. Believed at once, a spoofed one
                // aborts another endpoint's send. So a NACK only arms a
                // confirmation: the message is retransmitted now, and the
                // refusal takes effect one resend delay later unless the
                // partner acks the message meanwhile. A partner that really
                // refuses it (closed, reopened) never acks it and the send
                // fails after that delay, as Open-MX fails it; a live partner
                // acks the retransmission and the forged NACK is forgotten.
                // A forger would have to suppress the real partner's acks,
                // which only a host on the path can.
                if !self.refusals.contains_key(&id) {
                    tracing::debug!(?src, ?id, %status, "send refused by the peer; confirming");
                    let confirm_at = now + self.config.resend_delay;
                    self.refusals.insert(id, (status, confirm_at));
                    self.resend_now(id, now);
                }
                return;
            }
        }
        // Connects carry no seqnum; any pending one is equivalent to another.
        // A refused connect fails at once: it has no session to lose yet,
        // and the application may simply connect again.
        let Some(p) = self.partners.get_mut(&src) else {
            return;
        };
        if !p.connects.is_empty() {
            let id = p.connects.remove(0);
            self.complete_connect(id, status, None);
        }
    }

    /// Retransmits sequenced request `id` at the next timeout, now.
    fn resend_now(&mut self, id: RequestId, now: Instant) {
        match self.requests.get_mut(&id) {
            Some(CoreRequest::Send(SendReq { retx: Some(r), .. }))
            | Some(CoreRequest::Recv(RecvReq {
                state: RecvState::Notifying { retx: Some(r), .. },
                ..
            })) => r.next_resend = now,
            _ => {}
        }
    }

    /// Fails the messages whose refusal was not contradicted by an ack in
    /// time; forgets refusals of messages that were acked (or ended) since.
    pub(super) fn apply_refusals(&mut self, now: Instant) {
        let requests = &self.requests;
        self.refusals.retain(|id, _| requests.contains_key(id));
        let due: Vec<(RequestId, Status)> = self
            .refusals
            .iter()
            .filter(|(_, (_, at))| *at <= now)
            .map(|(id, (status, _))| (*id, *status))
            .collect();
        for (id, status) in due {
            self.refusals.remove(&id);
            let peer = self.partners.iter().find_map(|(peer, p)| {
                let pos = p.non_acked.iter().position(|x| *x == id)?;
                Some((*peer, pos))
            });
            let Some((peer, pos)) = peer else { continue };
            tracing::debug!(?peer, ?id, %status, "send refused by the peer, confirmed");
            if let Some(p) = self.partners.get_mut(&peer) {
                p.non_acked.remove(pos);
            }
            self.finish_sequenced(id, status);
            self.release_throttled(now, peer);
        }
    }
}

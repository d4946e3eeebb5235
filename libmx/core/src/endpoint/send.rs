//! Sending side: seqnums and the send window, (re)transmission of messages
//! and connects, and the acks and NACKs this endpoint emits.

use super::*;

impl Endpoint {
    pub(super) fn retx_of(&self, id: RequestId) -> Option<Retx> {
        match self.requests.get(&id)? {
            CoreRequest::Send(s) => s.retx,
            CoreRequest::Recv(RecvReq {
                state: RecvState::Notifying { retx, .. },
                ..
            }) => *retx,
            _ => None,
        }
    }

    fn retx_mut(&mut self, id: RequestId) -> Option<&mut Option<Retx>> {
        match self.requests.get_mut(&id)? {
            CoreRequest::Send(s) => Some(&mut s.retx),
            CoreRequest::Recv(RecvReq {
                state: RecvState::Notifying { retx, .. },
                ..
            }) => Some(retx),
            _ => None,
        }
    }

    /// Gives a sequenced request (send or NOTIFY) its seqnum and sends it, or
    /// holds it while the send window is full.
    pub(super) fn enqueue_sequenced(&mut self, now: Instant, peer: PeerAddr, id: RequestId) {
        let window = self.config.effective_send_window();
        let Some(p) = self.partners.get_mut(&peer) else {
            return;
        };
        if !p.throttled.is_empty() || p.send_window_full(window) {
            tracing::debug!(?peer, ?id, "send window full, holding");
            p.throttled.push_back(id);
            return;
        }
        let seqnum = p.take_send_seq();
        p.non_acked.push_back(id);
        if let Some(slot) = self.retx_mut(id) {
            *slot = Some(Retx {
                seqnum,
                transmissions: 0,
                next_resend: now,
            });
        }
        self.transmit_sequenced(now, id);
    }

    /// Lets held requests take seqnums as acks free the window.
    pub(super) fn release_throttled(&mut self, now: Instant, peer: PeerAddr) {
        let window = self.config.effective_send_window();
        loop {
            let Some(p) = self.partners.get_mut(&peer) else {
                return;
            };
            if p.send_window_full(window) {
                return;
            }
            let Some(id) = p.throttled.pop_front() else {
                return;
            };
            let seqnum = p.take_send_seq();
            p.non_acked.push_back(id);
            if let Some(slot) = self.retx_mut(id) {
                *slot = Some(Retx {
                    seqnum,
                    transmissions: 0,
                    next_resend: now,
                });
            }
            self.transmit_sequenced(now, id);
        }
    }

    /// (Re)sends the frames of a sequenced request with a fresh piggybacked ack.
    pub(super) fn transmit_sequenced(&mut self, now: Instant, id: RequestId) {
        let Endpoint {
            partners,
            requests,
            transmits,
            config,
            index,
            ..
        } = self;
        let Some(req) = requests.get_mut(&id) else {
            return;
        };
        let (peer, retx) = match req {
            CoreRequest::Send(s) => (s.peer, &mut s.retx),
            CoreRequest::Recv(RecvReq {
                state: RecvState::Notifying { large, retx, .. },
                ..
            }) => (large.source, retx),
            _ => return,
        };
        let Some(r) = retx.as_mut() else { return };
        let Some(p) = partners.get_mut(&peer) else {
            return;
        };
        let piggyack = p.next_frag_recv_seq;
        let seqnum = r.seqnum;
        r.transmissions += 1;
        r.next_resend = now + config.resend_wait(r.transmissions);
        let frame = |body| Frame {
            peer_index: peer.peer_index,
            dst_endpoint: peer.endpoint,
            src_endpoint: *index,
            body,
        };
        match req {
            CoreRequest::Send(s) => {
                let session = p.true_session.unwrap_or(0);
                let msg = |kind, payload: &[u8]| {
                    frame(Body::Message(Message {
                        session,
                        seqnum,
                        piggyack,
                        match_info: s.match_info,
                        kind,
                        payload: payload.to_vec(),
                    }))
                };
                match &s.payload {
                    SendPayload::Eager(data) => match MessageClass::of(data.len()) {
                        MessageClass::Tiny => transmits.push_back(msg(MessageKind::Tiny, data)),
                        MessageClass::Small => transmits.push_back(msg(MessageKind::Small, data)),
                        _ => {
                            let msg_length = data.len() as u32;
                            for f in medium::fragments(data) {
                                let kind = MessageKind::Medium(MediumFrag {
                                    msg_length,
                                    frag_seqnum: f.frag_seqnum,
                                    frag_pipeline: FRAG_PIPELINE,
                                });
                                transmits.push_back(msg(kind, f.data));
                            }
                        }
                    },
                    SendPayload::Large { msg_length, window } => {
                        transmits.push_back(msg(
                            MessageKind::Rndv(Rndv {
                                msg_length: *msg_length,
                                window: *window,
                            }),
                            &[],
                        ));
                    }
                }
            }
            CoreRequest::Recv(RecvReq {
                state: RecvState::Notifying { large, status, .. },
                ..
            }) => {
                let total_length = if status.is_success() {
                    large.xfer_length
                } else {
                    0
                };
                transmits.push_back(frame(Body::Notify(Notify {
                    // The sender may never have connected to us (a reply to
                    // `status.source`): then the session we connected with identifies it.
                    session: p.back_session.or(p.true_session).unwrap_or(0),
                    total_length,
                    rdma_id: large.window.id,
                    rdma_seqnum: large.window.seqnum,
                    seqnum,
                    piggyack,
                })));
            }
            _ => {}
        }
        p.ack_sent();
    }

    /// The endpoint's way to the network came back after an outage that may
    /// have lost frames (its backend reconnected, its domain moved to another
    /// host): every unacked message and NOTIFY, and every pending connect, is
    /// transmitted again now, and every partner gets an explicit ack marked
    /// resent, which makes a partner running this core resend to us at once
    /// what it sent meanwhile. Waiting out the resend timers instead leaves the application
    /// stalled for a resend delay after the path is back. A retransmission is
    /// a duplicate at worst, which the receiver's seqnum window drops and
    /// acks; requests past their retry budget are left to expire.
    pub fn path_restored(&mut self, now: Instant) {
        self.timers_changed();
        let max = self.config.max_retries;
        let peers: Vec<PeerAddr> = self.partners.keys().copied().collect();
        for peer in peers {
            let Some(p) = self.partners.get(&peer) else {
                continue;
            };
            let resend: Vec<RequestId> = p
                .non_acked
                .iter()
                .copied()
                .filter(|id| self.retx_of(*id).is_some_and(|r| r.transmissions <= max))
                .collect();
            let reconnect: Vec<RequestId> = p
                .connects
                .iter()
                .copied()
                .filter(|id| {
                    matches!(self.requests.get(id), Some(CoreRequest::Connect(c)) if c.transmissions <= max)
                })
                .collect();
            tracing::debug!(
                ?peer,
                resend = resend.len(),
                connects = reconnect.len(),
                "path restored, resending"
            );
            for id in &resend {
                self.transmit_sequenced(now, *id);
            }
            for id in reconnect {
                self.transmit_connect(now, id);
            }
            // The partner's frames of the outage were lost too, and it would
            // resend them only at its own resend timer. An explicit ack marked
            // resent tells a partner running this core to resend its unacked
            // messages now (see `on_liback`); it is an ordinary MXoE ack
            // otherwise (the flag is informative for MX and Open-MX), and it
            // also replaces acks of ours lost in the outage.
            // (`send_liback_marked` skips a partner with no session yet.)
            self.send_liback_marked(peer, 1);
        }
    }

    pub(super) fn transmit_connect(&mut self, now: Instant, id: RequestId) {
        let Some(CoreRequest::Connect(c)) = self.requests.get_mut(&id) else {
            return;
        };
        let Some(p) = self.partners.get(&c.peer) else {
            return;
        };
        c.transmissions += 1;
        c.next_resend = now + self.config.resend_wait(c.transmissions);
        self.transmits.push_back(Frame {
            peer_index: c.peer.peer_index,
            dst_endpoint: c.peer.endpoint,
            src_endpoint: self.index,
            body: Body::ConnectRequest(ConnectRequest {
                lib_seqnum: 0,
                src_session: self.session,
                app_key: c.key,
                target_recv_seqnum_start: p.next_match_recv_seq,
                connect_seqnum: c.connect_seqnum,
            }),
        });
    }

    pub(super) fn send_liback(&mut self, peer: PeerAddr) {
        self.send_liback_marked(peer, 0);
    }

    /// An explicit ack to `peer`, its resent flag `resent`.
    fn send_liback_marked(&mut self, peer: PeerAddr, resent: u8) {
        let Some(p) = self.partners.get_mut(&peer) else {
            return;
        };
        // Both name the partner endpoint's session; a partner that never
        // connected to us can still send NOTIFYs back on our connection.
        let Some(session) = p.back_session.or(p.true_session) else {
            p.ack_sent();
            return;
        };
        p.last_send_acknum = p.last_send_acknum.wrapping_add(1);
        let upto = p.next_frag_recv_seq;
        tracing::trace!(?peer, ?upto, "explicit ack");
        self.transmits.push_back(Frame {
            peer_index: peer.peer_index,
            dst_endpoint: peer.endpoint,
            src_endpoint: self.index,
            body: Body::Liback(Liback {
                session,
                ack_session: session,
                acknum: p.last_send_acknum,
                lib_seqnum: upto,
                send_seq: upto,
                resent,
            }),
        });
        p.ack_sent();
    }

    /// Queues an explicit ack to every partner owed one, delayed or not.
    /// Called when the endpoint closes: a partner whose last messages were
    /// delivered here must not retransmit them into a closed endpoint and
    /// read the NACK as a failed send.
    pub fn flush_acks(&mut self) {
        self.timers_changed();
        let owed: Vec<PeerAddr> = self
            .partners
            .iter()
            .filter(|(_, p)| p.ack != AckNeed::None)
            .map(|(&peer, _)| peer)
            .collect();
        for peer in owed {
            self.send_liback(peer);
        }
        self.ack_pending.clear();
    }

    pub(super) fn flush_immediate_acks(&mut self) {
        // Drivers ask after every input, and a ping-pong's receiver owes a
        // delayed ack until its reply carries it: those calls make no list.
        let partners = &self.partners;
        let delayed = |peer: &PeerAddr| {
            matches!(
                partners.get(peer).map(|p| p.ack),
                Some(AckNeed::Delayed { .. })
            )
        };
        if self.ack_pending.iter().all(delayed) {
            return;
        }
        let candidates: Vec<PeerAddr> = self.ack_pending.iter().copied().collect();
        for peer in candidates {
            match self.partners.get(&peer).map(|p| p.ack) {
                Some(AckNeed::Immediate) => {
                    self.send_liback(peer);
                    self.ack_pending.remove(&peer);
                }
                Some(AckNeed::Delayed { .. }) => {}
                _ => {
                    self.ack_pending.remove(&peer);
                }
            }
        }
    }

    pub(super) fn send_nack(&mut self, to: PeerAddr, nack_type: NackType, lib_seqnum: Seqnum) {
        self.transmits.push_back(Frame {
            peer_index: to.peer_index,
            dst_endpoint: to.endpoint,
            src_endpoint: self.index,
            body: Body::Nack(Nack {
                nack_type: nack_type.to_wire(),
                lib_seqnum,
            }),
        });
    }
}

//! Receiving side: the receive window, early frames, matching, MEDIUM
//! reassembly and the LARGE pull/NOTIFY bookkeeping.

use super::*;

/// A sequenced frame being processed, payload borrowed.
#[derive(Clone, Copy, Debug)]
enum Sequenced<'a> {
    Message(&'a Message<&'a [u8]>),
    Notify(&'a Notify),
}

impl Sequenced<'_> {
    fn seqnum(&self) -> Seqnum {
        match self {
            Sequenced::Message(m) => m.seqnum,
            Sequenced::Notify(n) => n.seqnum,
        }
    }

    fn to_early(self) -> EarlyFrame {
        match self {
            Sequenced::Message(m) => EarlyFrame::Message {
                seqnum: m.seqnum,
                match_info: m.match_info,
                kind: m.kind,
                payload: m.payload.to_vec(),
            },
            Sequenced::Notify(n) => EarlyFrame::Notify(*n),
        }
    }
}

/// Why a message frame is refused before it touches any state.
#[derive(Debug, thiserror::Error)]
enum BadMessage {
    #[error("{kind} message of {len} bytes")]
    TooLong { kind: &'static str, len: usize },
    #[error(transparent)]
    Fragment(FragError),
}

fn validate(m: &Message<&[u8]>) -> Result<(), BadMessage> {
    match m.kind {
        MessageKind::Tiny if m.payload.len() > TINY_MAX => Err(BadMessage::TooLong {
            kind: "tiny",
            len: m.payload.len(),
        }),
        MessageKind::Small if m.payload.len() > SMALL_MAX => Err(BadMessage::TooLong {
            kind: "small",
            len: m.payload.len(),
        }),
        MessageKind::Medium(f) => medium::check_fragment(
            f.msg_length,
            f.frag_seqnum,
            f.frag_pipeline,
            m.payload.len(),
        )
        .map(|_| ())
        .map_err(BadMessage::Fragment),
        _ => Ok(()),
    }
}

impl Endpoint {
    /// A TINY/SMALL/MEDIUM/RNDV frame: the session must be ours (else the
    /// sender learns it with a NACK, as a NIC would answer) and the frame
    /// well formed before it touches any state.
    pub(super) fn on_message(&mut self, now: Instant, src: PeerAddr, m: &Message<&[u8]>) {
        if m.session != self.session {
            tracing::debug!(?src, "message for another session, refused");
            self.send_nack(src, NackType::BadSession, m.seqnum);
            return;
        }
        if let Err(e) = validate(m) {
            tracing::warn!(?src, %e, "malformed message dropped");
            return;
        }
        self.on_sequenced(now, src, m.piggyack, Sequenced::Message(m));
    }

    /// A NOTIFY frame, checked like a message.
    pub(super) fn on_notify_frame(&mut self, now: Instant, src: PeerAddr, n: &Notify) {
        if n.session != self.session {
            self.send_nack(src, NackType::BadSession, n.seqnum);
            return;
        }
        self.on_sequenced(now, src, n.piggyack, Sequenced::Notify(n));
    }

    /// Completes a receive; `failure` overrides the status (and empties the data).
    pub(super) fn complete_recv(
        &mut self,
        id: RequestId,
        source: PeerAddr,
        match_info: u64,
        msg_length: u32,
        mut data: Vec<u8>,
        failure: Option<Status>,
    ) {
        let capacity = match self.requests.get(&id) {
            Some(CoreRequest::Recv(RecvReq {
                state: RecvState::Notifying { .. },
                ..
            })) => {
                // Reported when its pull ended; only the NOTIFY was still pending.
                self.requests.remove(&id);
                return;
            }
            Some(CoreRequest::Recv(r)) => r.capacity,
            _ => return,
        };
        self.requests.remove(&id);
        let xfer = (msg_length as usize).min(capacity);
        data.truncate(xfer);
        let (status, xfer_length) = match failure {
            Some(s) => {
                data.clear();
                (s, 0)
            }
            None if xfer < msg_length as usize => (Status::Truncated, xfer as u32),
            None => (Status::Success, xfer as u32),
        };
        let source = self.addr_of(source);
        self.events.push_back(EndpointEvent::RecvDone(RecvDone {
            id,
            status,
            source,
            match_info,
            msg_length,
            xfer_length,
            data,
        }));
    }

    fn on_sequenced(&mut self, now: Instant, src: PeerAddr, piggyack: Seqnum, s: Sequenced<'_>) {
        let Some(p) = self.partners.get(&src) else {
            tracing::debug!(?src, "message from a partner that never connected, dropped");
            return;
        };
        if !s.seqnum().same_session(p.next_frag_recv_seq) {
            tracing::debug!(?src, seq = ?s.seqnum(), "message of an old connection, dropped");
            return;
        }
        if !piggyack.same_session(p.next_send_seq) {
            tracing::debug!(?src, ?piggyack, "ack of an old connection, dropped");
            return;
        }
        self.on_ack(now, src, piggyack);
        let Some(p) = self.partners.get_mut(&src) else {
            return;
        };
        p.last_heard = Some(now);
        match p.arrival(s.seqnum()) {
            Arrival::InWindow => {
                self.process_in_window(now, src, s);
                self.drain_early(now, src);
            }
            Arrival::Early => {
                let max = self.config.early_frames_max;
                if !p.keep_early(s.to_early(), max) {
                    tracing::trace!(?src, seq = ?s.seqnum(), "early frame not kept");
                }
            }
            Arrival::Obsolete { ack_now } => {
                if ack_now {
                    p.need_ack_now();
                    self.ack_pending.insert(src);
                }
            }
        }
    }

    fn drain_early(&mut self, now: Instant, src: PeerAddr) {
        while let Some(f) = self
            .partners
            .get_mut(&src)
            .and_then(Partner::next_due_early)
        {
            match &f {
                EarlyFrame::Message {
                    seqnum,
                    match_info,
                    kind,
                    payload,
                } => {
                    // Session and piggyback were checked and used on arrival.
                    let m = Message {
                        session: self.session,
                        seqnum: *seqnum,
                        piggyack: *seqnum,
                        match_info: *match_info,
                        kind: *kind,
                        payload: payload.as_slice(),
                    };
                    self.process_in_window(now, src, Sequenced::Message(&m));
                }
                EarlyFrame::Notify(n) => self.process_in_window(now, src, Sequenced::Notify(n)),
            }
        }
    }

    /// A frame inside the receive window: the next message, a fragment of a
    /// partial MEDIUM, or a duplicate.
    fn process_in_window(&mut self, now: Instant, src: PeerAddr, s: Sequenced<'_>) {
        let Some(p) = self.partners.get(&src) else {
            return;
        };
        let seq = s.seqnum();
        if seq == p.next_match_recv_seq {
            let accepted = match s {
                Sequenced::Message(m) => self.match_new(now, src, m),
                Sequenced::Notify(n) => {
                    self.on_notify(src, n);
                    true
                }
            };
            if accepted {
                let threshold = self.config.imm_ack_threshold;
                let notify = matches!(s, Sequenced::Notify(_));
                if let Some(p) = self.partners.get_mut(&src) {
                    p.next_match_recv_seq = p.next_match_recv_seq.next();
                    p.update_next_frag(now, threshold);
                    // A NOTIFY ends a LARGE transfer: the receiver keeps its
                    // state (and may hold its close) until this ack, so it
                    // leaves now rather than after the ack delay.
                    if notify {
                        p.need_ack_now();
                    }
                }
                self.ack_pending.insert(src);
            }
        } else if let Sequenced::Message(
            m @ Message {
                kind: MessageKind::Medium(_),
                ..
            },
        ) = s
        {
            if p.is_partial_seq(seq) {
                self.continue_partial(now, src, m);
            }
        }
    }

    /// The next message of `src` arrived: match it and keep or deliver it.
    /// Returns false if it could not be accepted (it will be resent).
    fn match_new(&mut self, now: Instant, src: PeerAddr, m: &Message<&[u8]>) -> bool {
        let (msg_length, content) = match m.kind {
            MessageKind::Tiny | MessageKind::Small => {
                (m.payload.len() as u32, Content::Whole(m.payload.to_vec()))
            }
            MessageKind::Medium(f) => {
                let Ok(mut r) = Reassembly::new(f.msg_length) else {
                    return false;
                };
                match r.insert(f.frag_seqnum, f.frag_pipeline, m.payload) {
                    Ok(Inserted::Complete) => (f.msg_length, Content::Whole(r.into_data())),
                    Ok(_) => (f.msg_length, Content::Assembling(r)),
                    Err(_) => return false,
                }
            }
            MessageKind::Rndv(r) => (r.msg_length, Content::Rndv(r.window)),
        };
        let mut inb = InboundMessage {
            source: src,
            match_info: m.match_info,
            msg_length,
            content,
            recv: None,
        };
        let recv = self.matcher.arrive(m.match_info);
        if recv.is_none()
            && self.unexpected_bytes + inb.stored_len() > self.config.unexpected_bytes_max
        {
            tracing::warn!(
                ?src,
                msg_length,
                "unexpected-message memory full, refusing (the sender will resend)"
            );
            return false;
        }
        let iid = InboundId(self.next_inbound);
        self.next_inbound += 1;
        if matches!(inb.content, Content::Assembling(_)) {
            if let Some(p) = self.partners.get_mut(&src) {
                p.partials.push_back((m.seqnum, iid));
            }
        }
        match recv {
            Some(rid) => {
                inb.recv = Some(rid);
                self.inbound.insert(iid, inb);
                self.settle(now, iid);
            }
            None => {
                if let Content::Rndv(window) = inb.content {
                    // Only into the first half of the unexpected memory: eager
                    // messages, which have nowhere else to wait, keep the rest.
                    // And a bounded number at once: a transport's pulls are a
                    // shared quota (256 per guest in the engine), which
                    // receives already posted must still find room in.
                    let fits = self.unexpected_bytes + msg_length as usize
                        <= self.config.unexpected_bytes_max / 2
                        && self.early_pulls.len() < EARLY_PULLS_IN_FLIGHT_MAX;
                    if msg_length > 0 && msg_length <= self.config.early_pull_max && fits {
                        let pull = self.alloc_request();
                        self.early_pulls.insert(pull, iid);
                        inb.content = Content::EarlyPull {
                            window,
                            pull: Some(pull),
                            data: Vec::new(),
                        };
                        let source = self.addr_of(src);
                        self.events
                            .push_back(EndpointEvent::EarlyPullNeeded(PullNeeded {
                                id: pull,
                                source,
                                window,
                                length: msg_length,
                            }));
                    }
                }
                self.unexpected_bytes += inb.stored_len();
                if self.report_unexpected {
                    let source = self.addr_of(src);
                    self.events
                        .push_back(EndpointEvent::Unexpected(UnexpectedArrival {
                            id: iid,
                            source,
                            match_info: m.match_info,
                            msg_length,
                        }));
                }
                self.inbound.insert(iid, inb);
                self.matcher.push_unexpected(m.match_info, iid);
            }
        }
        true
    }

    fn continue_partial(&mut self, now: Instant, src: PeerAddr, m: &Message<&[u8]>) {
        let MessageKind::Medium(f) = m.kind else {
            return;
        };
        let Some(p) = self.partners.get_mut(&src) else {
            return;
        };
        let Some((pos, iid)) = p
            .partials
            .iter()
            .enumerate()
            .find_map(|(pos, &(s, iid))| (s == m.seqnum).then_some((pos, iid)))
        else {
            return;
        };
        let Some(inb) = self.inbound.get_mut(&iid) else {
            return;
        };
        if inb.match_info != m.match_info || inb.msg_length != f.msg_length {
            tracing::warn!(?src, "fragment disagrees with its message, dropped");
            return;
        }
        let Content::Assembling(r) = &mut inb.content else {
            return;
        };
        match r.insert(f.frag_seqnum, f.frag_pipeline, m.payload) {
            Ok(Inserted::Complete) => {
                if let Content::Assembling(done) =
                    std::mem::replace(&mut inb.content, Content::Whole(Vec::new()))
                {
                    inb.content = Content::Whole(done.into_data());
                }
                p.partials.remove(pos);
                p.update_next_frag(now, self.config.imm_ack_threshold);
                self.ack_pending.insert(src);
                self.settle(now, iid);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(?src, %e, "bad fragment dropped"),
        }
    }

    /// Moves a message forward once it has a receive: deliver it whole, wait
    /// for more fragments, or ask for the pull of a LARGE one.
    pub(super) fn settle(&mut self, now: Instant, iid: InboundId) {
        let Some(inb) = self.inbound.get(&iid) else {
            return;
        };
        let Some(rid) = inb.recv else { return };
        match inb.content {
            Content::Assembling(_) => {
                if let Some(CoreRequest::Recv(r)) = self.requests.get_mut(&rid) {
                    r.state = RecvState::Assembling;
                }
            }
            Content::Whole(_) => {
                let Some(inb) = self.inbound.remove(&iid) else {
                    return;
                };
                let Content::Whole(data) = inb.content else {
                    return;
                };
                self.complete_recv(rid, inb.source, inb.match_info, inb.msg_length, data, None);
            }
            Content::EarlyPull { pull: Some(_), .. } => {
                // Matched while its early pull runs: done when the pull ends.
                if let Some(CoreRequest::Recv(r)) = self.requests.get_mut(&rid) {
                    r.state = RecvState::Assembling;
                }
            }
            Content::EarlyPull { pull: None, .. } => {
                let Some(inb) = self.inbound.remove(&iid) else {
                    return;
                };
                let Content::EarlyPull { window, data, .. } = inb.content else {
                    return;
                };
                let capacity = match self.requests.get(&rid) {
                    Some(CoreRequest::Recv(r)) => r.capacity,
                    _ => return,
                };
                let large = LargeRecv {
                    source: inb.source,
                    window,
                    match_info: inb.match_info,
                    msg_length: inb.msg_length,
                    xfer_length: (inb.msg_length as usize).min(capacity) as u32,
                };
                self.start_notify(now, rid, large, Status::Success, data);
            }
            Content::Rndv(window) => {
                let Some(inb) = self.inbound.remove(&iid) else {
                    return;
                };
                let capacity = match self.requests.get(&rid) {
                    Some(CoreRequest::Recv(r)) => r.capacity,
                    _ => return,
                };
                let xfer_length = (inb.msg_length as usize).min(capacity) as u32;
                let large = LargeRecv {
                    source: inb.source,
                    window,
                    match_info: inb.match_info,
                    msg_length: inb.msg_length,
                    xfer_length,
                };
                if xfer_length == 0 {
                    self.start_notify(now, rid, large, Status::Success, Vec::new());
                } else {
                    if let Some(CoreRequest::Recv(r)) = self.requests.get_mut(&rid) {
                        r.state = RecvState::Pulling(large);
                    }
                    let source = self.addr_of(large.source);
                    self.events.push_back(EndpointEvent::PullNeeded(PullNeeded {
                        id: rid,
                        source,
                        window,
                        length: xfer_length,
                    }));
                }
            }
        }
    }

    /// `data` is the message's bytes where the library holds them (an early pull,
    /// see [`Config::early_pull_max`](crate::Config::early_pull_max)); empty where
    /// they were pulled into the application's buffer.
    pub(super) fn start_notify(
        &mut self,
        now: Instant,
        id: RequestId,
        large: LargeRecv,
        status: Status,
        mut data: Vec<u8>,
    ) {
        if !matches!(self.requests.get(&id), Some(CoreRequest::Recv(_))) {
            return;
        }
        if self
            .partners
            .get(&large.source)
            .and_then(|p| p.back_session.or(p.true_session))
            .is_none()
        {
            // We know no session of the sender (its connection is gone); nobody to notify.
            self.complete_recv(
                id,
                large.source,
                large.match_info,
                large.msg_length,
                Vec::new(),
                Some(Status::EndpointUnreachable),
            );
            return;
        }
        let deadline = self.deadline_from(now);
        if let Some(CoreRequest::Recv(r)) = self.requests.get_mut(&id) {
            r.state = RecvState::Notifying {
                large,
                status,
                deadline,
                retx: None,
            };
        }
        // The data is in the application's buffer already (or in `data`, pulled
        // before the receive was posted): the receive completes
        // now, as MX completes it, and the NOTIFY stays queued until the sender
        // acks it. A sender that closes as soon as it is notified never acks,
        // and that must not turn a delivered message into a failed receive.
        let status = match status {
            Status::Success if large.xfer_length < large.msg_length => Status::Truncated,
            s => s,
        };
        let xfer_length = if status.is_success() || status == Status::Truncated {
            large.xfer_length
        } else {
            0
        };
        let source = self.addr_of(large.source);
        self.events.push_back(EndpointEvent::RecvDone(RecvDone {
            id,
            status,
            source,
            match_info: large.match_info,
            msg_length: large.msg_length,
            xfer_length,
            data: {
                data.truncate(xfer_length as usize);
                data
            },
        }));
        self.enqueue_sequenced(now, large.source, id);
    }

    /// A NOTIFY arrived in order: the matching LARGE send is done.
    fn on_notify(&mut self, src: PeerAddr, n: &Notify) {
        let Some(p) = self.partners.get_mut(&src) else {
            return;
        };
        let is_it = |req: Option<&CoreRequest>| {
            matches!(req, Some(CoreRequest::Send(SendReq { payload: SendPayload::Large { window, .. }, .. }))
                if window.id == n.rdma_id && window.seqnum == n.rdma_seqnum)
        };
        if let Some(pos) = p
            .awaiting_notify
            .iter()
            .position(|id| is_it(self.requests.get(id)))
        {
            let id = p.awaiting_notify.remove(pos);
            self.complete_send(id, Status::Success, n.total_length);
            return;
        }
        // Notified before its RNDV was acked: complete when the ack comes.
        if let Some(&id) = p.non_acked.iter().find(|id| is_it(self.requests.get(id))) {
            if let Some(CoreRequest::Send(s)) = self.requests.get_mut(&id) {
                s.notified = Some(n.total_length);
            }
        }
    }
}

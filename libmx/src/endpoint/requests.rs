//! The application's requests: posting sends, receives and connects, and
//! testing, waiting for, cancelling and forgetting them.

use std::time::Duration;

use xmx_mx::{MessageClass, PeerAddr, RequestId, Status};

use super::{AppEndpoint, CoreRequestOwner, EndpointState};
use crate::abi::{MxEndpointAddr, MxReturn, MxStatus};
use crate::addr::Addr;
use crate::counters::{self, Counter};
use crate::errors::{Failure, MxResult};
use crate::runtime;
use crate::segments::Segments;

/// What a request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RequestKind {
    /// A send; `eager` when its data was copied at posting.
    Send {
        /// Copied at posting (TINY/SMALL/MEDIUM `mx_isend`).
        eager: bool,
    },
    /// A receive.
    Recv,
    /// A connect (`mx_iconnect`, or the hidden request of `mx_connect`).
    Connect,
}

/// One request of the application.
#[derive(Debug)]
pub(crate) struct AppRequest {
    pub(crate) kind: RequestKind,
    pub(crate) context: usize,
    pub(crate) code: Status,
    pub(crate) source: Addr,
    pub(crate) match_info: u64,
    pub(crate) msg_length: u32,
    pub(crate) xfer_length: u32,
    /// Completion order once complete.
    pub(crate) done: Option<u64>,
    /// The application no longer wants the completion.
    pub(crate) forgotten: bool,
    /// Not visible to `mx_test_any`/`mx_ipeek` (`mx_connect`'s own).
    pub(crate) internal: bool,
    pub(crate) segs: Segments,
    /// An eager send's data while it waits behind a LARGE send.
    pub(crate) data: Option<Vec<u8>>,
    pub(crate) window: Option<xmx_mx::RdmaWindow>,
    pub(crate) dest: Option<PeerAddr>,
    pub(crate) core: Option<RequestId>,
}

impl AppRequest {
    pub(crate) fn new(kind: RequestKind, context: usize) -> Self {
        AppRequest {
            kind,
            context,
            code: Status::Pending,
            source: Addr {
                nic_id: 0,
                endpoint: 0,
                session: 0,
                local: 0,
            },
            match_info: 0,
            msg_length: 0,
            xfer_length: 0,
            done: None,
            forgotten: false,
            internal: false,
            segs: Segments::default(),
            data: None,
            window: None,
            dest: None,
            core: None,
        }
    }
}

fn not_connected(e: xmx_mx::Error) -> Failure {
    Failure::new(MxReturn::ConnectionFailed, e.to_string())
}

impl AppEndpoint {
    /// An eager send `seq` was handed to the core as `id`: MX completes it
    /// once its data is buffered (the ack arrives later), up to the zombie
    /// limit; beyond it, at its ack.
    pub(super) fn eager_sent(&self, st: &mut EndpointState, seq: u64, id: RequestId) {
        if self.zombie_max > 0 && st.zombies < self.zombie_max {
            st.zombies += 1;
            st.links.insert(id, CoreRequestOwner::Zombie);
            let mut len = 0;
            if let Some(r) = st.requests.get_mut(&seq) {
                r.code = Status::Success;
                r.xfer_length = r.msg_length;
                len = r.msg_length;
            }
            counters::add(Counter::BytesSent, len as u64);
            self.complete(st, seq);
        } else {
            st.links.insert(id, CoreRequestOwner::Request(seq));
            if let Some(r) = st.requests.get_mut(&seq) {
                r.core = Some(id);
            }
        }
    }

    /// `mx_isend` (`sync == false`) and `mx_issend` (`sync == true`).
    /// Returns the request token.
    pub(crate) fn isend(
        &self,
        segs: Segments,
        dest: MxEndpointAddr,
        match_info: u64,
        context: usize,
        sync: bool,
    ) -> MxResult<usize> {
        let addr = Addr::decode(dest);
        let peer = match self.peer_of(&addr) {
            Ok(peer) => Some(peer),
            // An address a connect gave (it carries the partner's session) whose NIC
            // left the peer table since (its guest destroyed, its host gone): the send is
            // taken and fails with a status, as one to a partner that stopped answering
            // does; an error return would be fatal to the application by default.
            Err(_) if addr.session != 0 && Addr::is_ours(dest) => None,
            Err(e) => return Err(e),
        };
        let len = segs.len() as u32;
        counters::add(Counter::Sends, 1);
        self.with_state_posting(|ep, st| {
            let now = st.now;
            let eager = !sync && MessageClass::of(segs.len()) != MessageClass::Large;
            let mut r = AppRequest::new(RequestKind::Send { eager }, context);
            r.source = Addr {
                local: ep.handle,
                ..addr
            };
            r.match_info = match_info;
            r.msg_length = len;
            let Some(peer) = peer else {
                r.code = Status::EndpointUnreachable;
                let seq = ep.new_request(st, r);
                ep.complete(st, seq);
                return Ok(ep.token(seq));
            };
            r.dest = Some(peer);
            if eager {
                let data = segs.gather();
                if !st.waiting_large.is_empty() {
                    // Behind a LARGE send still waiting for a window: sent
                    // after it, so messages keep their posting order.
                    r.data = Some(data);
                    let seq = ep.new_request(st, r);
                    st.waiting_large.push_back((seq, now));
                    return Ok(ep.token(seq));
                }
                // The gathered copy is the core's to keep: a second one
                // cost an allocation and a copy per message.
                let id = st
                    .core
                    .send_owned(now, peer, match_info, data)
                    .map_err(not_connected)?;
                let seq = ep.new_request(st, r);
                ep.eager_sent(st, seq, id);
                Ok(ep.token(seq))
            } else {
                if Self::beyond_one_window(st, segs.len()) {
                    r.code = Status::NoResources;
                    let seq = ep.new_request(st, r);
                    ep.complete(st, seq);
                    return Ok(ep.token(seq));
                }
                r.segs = segs;
                let seq = ep.new_request(st, r);
                if st.waiting_large.is_empty() {
                    if let Some(w) = ep.window_for(st, seq) {
                        ep.launch_large(st, now, seq, w);
                        return Ok(ep.token(seq));
                    }
                }
                st.waiting_large.push_back((seq, now));
                Ok(ep.token(seq))
            }
        })
    }

    /// `mx_irecv`.
    pub(crate) fn irecv(
        &self,
        segs: Segments,
        match_info: u64,
        match_mask: u64,
        context: usize,
    ) -> MxResult<usize> {
        self.check_match(match_info, match_mask)?;
        counters::add(Counter::Recvs, 1);
        self.with_state_posting(|ep, st| {
            let now = st.now;
            let mut r = AppRequest::new(RequestKind::Recv, context);
            r.segs = segs;
            r.match_info = match_info;
            let seq = ep.new_request(st, r);
            let capacity = st.requests[&seq].segs.len();
            let id = st
                .core
                .post_recv(now, match_info, match_mask, capacity)
                .map_err(|e| Failure::new(MxReturn::BadMatchMask, e.to_string()))?;
            if let Some(r) = st.requests.get_mut(&seq) {
                r.core = Some(id);
            }
            st.links.insert(id, CoreRequestOwner::Request(seq));
            Ok(ep.token(seq))
        })
    }

    /// Starts a connect; returns the request number.
    #[allow(clippy::too_many_arguments)] // mx_iconnect's arguments, plus who waits
    fn start_connect(
        &self,
        st: &mut EndpointState,
        nic_id: u64,
        endpoint_id: u32,
        key: u32,
        match_info: u64,
        context: usize,
        internal: bool,
    ) -> MxResult<u64> {
        let endpoint = u8::try_from(endpoint_id).map_err(|_| {
            Failure::new(
                MxReturn::BadEndpointId,
                format!("endpoint id {endpoint_id} out of range"),
            )
        })?;
        let addr = Addr {
            nic_id,
            endpoint,
            session: 0,
            local: self.handle,
        };
        let peer = self.peer_of(&addr)?;
        counters::add(Counter::Connects, 1);
        let id = st.core.connect(runtime::now(), peer, key);
        let mut r = AppRequest::new(RequestKind::Connect, context);
        r.source = addr;
        r.match_info = match_info;
        r.dest = Some(peer);
        r.core = Some(id);
        r.internal = internal;
        let seq = self.new_request(st, r);
        st.links.insert(id, CoreRequestOwner::Request(seq));
        Ok(seq)
    }

    /// `mx_iconnect`.
    pub(crate) fn iconnect(
        &self,
        nic_id: u64,
        endpoint_id: u32,
        key: u32,
        match_info: u64,
        context: usize,
    ) -> MxResult<usize> {
        self.with_state(|ep, st| {
            let seq = ep.start_connect(st, nic_id, endpoint_id, key, match_info, context, false)?;
            Ok(ep.token(seq))
        })
    }

    /// `mx_connect`: connects and waits up to `timeout_ms` (0: no limit).
    pub(crate) fn connect(
        &self,
        nic_id: u64,
        endpoint_id: u32,
        key: u32,
        timeout_ms: u32,
    ) -> MxResult<MxEndpointAddr> {
        let seq =
            self.with_state(|ep, st| ep.start_connect(st, nic_id, endpoint_id, key, 0, 0, true))?;
        let outcome = self.block(timeout_ms, |_, st| {
            let r = st.requests.get(&seq)?;
            r.done?;
            let r = st.requests.remove(&seq)?;
            Some((r.code, r.source))
        })?;
        let Some((code, source)) = outcome else {
            let mut st = self.lock()?;
            if let Some(r) = st.requests.remove(&seq) {
                if let Some(id) = r.core {
                    st.links.insert(id, CoreRequestOwner::Discard);
                }
            }
            return Err(Failure::new(
                MxReturn::Timeout,
                format!(
                    "connecting to NIC {nic_id:012x} endpoint {endpoint_id}: no answer within {timeout_ms} ms"
                ),
            ));
        };
        let what = format!("connecting to NIC {nic_id:012x} endpoint {endpoint_id}");
        match code {
            Status::Success => Ok(source.encode()),
            Status::BadKey => Err(Failure::new(
                MxReturn::BadConnectionKey,
                format!("{what}: key refused"),
            )),
            Status::BadEndpoint => Err(Failure::new(
                MxReturn::BadEndpointId,
                format!("{what}: no such endpoint"),
            )),
            Status::Timeout | Status::EndpointUnreachable => Err(Failure::new(
                MxReturn::Timeout,
                format!("{what}: no answer"),
            )),
            other => Err(Failure::new(
                MxReturn::ConnectionFailed,
                format!("{what}: {other}"),
            )),
        }
    }

    /// `mx_disconnect`.
    pub(crate) fn disconnect(&self, addr: MxEndpointAddr) -> MxResult<()> {
        let peer = self.peer_of(&Addr::decode(addr))?;
        self.with_state(|_, st| {
            st.core.disconnect(peer);
            Ok(())
        })
    }

    /// Takes request `seq` out if it is complete, with its status.
    fn take_done(&self, st: &mut EndpointState, seq: u64) -> Option<MxStatus> {
        let order = st.requests.get(&seq)?.done?;
        st.done.remove(&order);
        let r = st.requests.remove(&seq)?;
        Some(self.status_of(&r))
    }

    fn known(&self, st: &EndpointState, seq: u64) -> MxResult<()> {
        if st.requests.get(&seq).is_some_and(|r| !r.forgotten) {
            Ok(())
        } else {
            Err(Failure::new(
                MxReturn::BadRequest,
                format!("request {seq} is unknown or already completed"),
            ))
        }
    }

    /// `mx_test`: the status if the request is complete (it is then freed).
    pub(crate) fn test(&self, token: usize) -> MxResult<Option<MxStatus>> {
        let seq = self.seq_of(token)?;
        self.poll_state(|ep, st| {
            ep.known(st, seq)?;
            Ok(ep.take_done(st, seq))
        })
    }

    /// `mx_wait`.
    pub(crate) fn wait(&self, token: usize, timeout_ms: u32) -> MxResult<Option<MxStatus>> {
        let seq = self.seq_of(token)?;
        self.known(&*self.lock()?, seq)?;
        self.block(timeout_ms, |ep, st| ep.take_done(st, seq))
    }

    fn take_any(
        &self,
        st: &mut EndpointState,
        match_info: u64,
        match_mask: u64,
    ) -> Option<MxStatus> {
        let seq = st.done.values().copied().find(|seq| {
            st.requests
                .get(seq)
                .is_some_and(|r| r.match_info & match_mask == match_info)
        })?;
        self.take_done(st, seq)
    }

    /// `mx_test_any`: the first completed request whose match info satisfies
    /// the pair.
    pub(crate) fn test_any(&self, match_info: u64, match_mask: u64) -> MxResult<Option<MxStatus>> {
        self.check_mask_only(match_info, match_mask)?;
        self.poll_state(|ep, st| Ok(ep.take_any(st, match_info, match_mask)))
    }

    /// `mx_wait_any`.
    pub(crate) fn wait_any(
        &self,
        timeout_ms: u32,
        match_info: u64,
        match_mask: u64,
    ) -> MxResult<Option<MxStatus>> {
        self.check_mask_only(match_info, match_mask)?;
        self.block(timeout_ms, |ep, st| ep.take_any(st, match_info, match_mask))
    }

    fn check_mask_only(&self, match_info: u64, match_mask: u64) -> MxResult<()> {
        if match_info & !match_mask != 0 {
            return Err(Failure::new(
                MxReturn::BadMatchMask,
                format!("match info {match_info:#x} has bits outside mask {match_mask:#x}"),
            ));
        }
        Ok(())
    }

    /// `mx_ipeek`: the first completed request, left in place.
    pub(crate) fn ipeek(&self) -> MxResult<Option<usize>> {
        self.poll_state(|ep, st| Ok(st.done.values().next().map(|&seq| ep.token(seq))))
    }

    /// `mx_peek`.
    pub(crate) fn peek(&self, timeout_ms: u32) -> MxResult<Option<usize>> {
        self.block(timeout_ms, |ep, st| {
            st.done.values().next().map(|&seq| ep.token(seq))
        })
    }

    /// `mx_iprobe`: the first unexpected message satisfying the pair, left
    /// in place.
    pub(crate) fn iprobe(&self, match_info: u64, match_mask: u64) -> MxResult<Option<MxStatus>> {
        self.check_match(match_info, match_mask)?;
        self.poll_state(|ep, st| Ok(ep.probe_now(st, match_info, match_mask)))
    }

    /// `mx_probe`.
    pub(crate) fn probe(
        &self,
        timeout_ms: u32,
        match_info: u64,
        match_mask: u64,
    ) -> MxResult<Option<MxStatus>> {
        self.check_match(match_info, match_mask)?;
        self.block(timeout_ms, |ep, st| {
            ep.probe_now(st, match_info, match_mask)
        })
    }

    fn probe_now(
        &self,
        st: &mut EndpointState,
        match_info: u64,
        match_mask: u64,
    ) -> Option<MxStatus> {
        let p = st.core.probe(match_info, match_mask).ok()??;
        Some(MxStatus {
            code: Status::Success.code(),
            source: self.addr_of(p.source.peer, p.source.session).encode(),
            match_info: p.match_info,
            msg_length: p.msg_length,
            // As MX reports it: what a receive of the whole message would
            // take (MPI sizes a probed message by it).
            xfer_length: p.msg_length,
            context: std::ptr::null_mut(),
        })
    }

    /// `mx_ibuffered`: whether a send no longer needs its buffer.
    pub(crate) fn ibuffered(&self, token: usize) -> MxResult<bool> {
        let seq = self.seq_of(token)?;
        self.with_state(|ep, st| {
            ep.known(st, seq)?;
            let r = &st.requests[&seq];
            match r.kind {
                RequestKind::Send { eager: true } => Ok(true),
                RequestKind::Send { eager: false } => Ok(r.done.is_some()),
                _ => Err(Failure::new(
                    MxReturn::BadRequest,
                    "only sends can be buffered",
                )),
            }
        })
    }

    /// `mx_buffered`: waits until [`ibuffered`](Self::ibuffered) holds.
    pub(crate) fn buffered(&self, token: usize, timeout_ms: u32) -> MxResult<bool> {
        if self.ibuffered(token)? {
            return Ok(true);
        }
        let seq = self.seq_of(token)?;
        Ok(self
            .block(timeout_ms, |_, st| {
                st.requests.get(&seq).and_then(|r| r.done).map(|_| ())
            })?
            .is_some())
    }

    /// `mx_cancel`: withdraws a receive not matched yet, or a connect not
    /// answered yet. Returns whether it was withdrawn (and freed).
    pub(crate) fn cancel(&self, token: usize) -> MxResult<bool> {
        let seq = self.seq_of(token)?;
        self.with_state(|ep, st| {
            ep.known(st, seq)?;
            let r = &st.requests[&seq];
            if r.done.is_some() {
                return Ok(false);
            }
            match r.kind {
                RequestKind::Send { .. } => Err(Failure::new(
                    MxReturn::CancelNotSupported,
                    "sends cannot be cancelled",
                )),
                RequestKind::Recv => {
                    let Some(id) = r.core else { return Ok(false) };
                    if !st.core.cancel(id) {
                        return Ok(false);
                    }
                    st.links.remove(&id);
                    st.requests.remove(&seq);
                    Ok(true)
                }
                RequestKind::Connect => {
                    if let Some(id) = r.core {
                        st.links.insert(id, CoreRequestOwner::Discard);
                    }
                    st.requests.remove(&seq);
                    Ok(true)
                }
            }
        })
    }

    /// `mx_forget`: the application will not test this request; it is freed
    /// when it completes.
    pub(crate) fn forget(&self, token: usize) -> MxResult<()> {
        let seq = self.seq_of(token)?;
        let mut st = self.lock()?;
        self.known(&st, seq)?;
        let done = st.requests.get(&seq).and_then(|r| r.done);
        match done {
            Some(order) => {
                st.done.remove(&order);
                st.requests.remove(&seq);
            }
            None => {
                if let Some(r) = st.requests.get_mut(&seq) {
                    r.forgotten = true;
                }
            }
        }
        Ok(())
    }

    /// `mx_context`: the context the request was posted with.
    pub(crate) fn context_of(&self, token: usize) -> MxResult<usize> {
        let seq = self.seq_of(token)?;
        let st = self.lock()?;
        self.known(&st, seq)?;
        Ok(st.requests[&seq].context)
    }

    /// `mx_set_request_timeout`: a deadline for a pending send or connect.
    pub(crate) fn set_request_timeout(&self, token: usize, timeout_ms: u32) -> MxResult<()> {
        let seq = self.seq_of(token)?;
        self.with_state(|ep, st| {
            ep.known(st, seq)?;
            if let Some(id) = st.requests[&seq].core {
                st.core
                    .set_request_timeout(id, Duration::from_millis(timeout_ms as u64));
            }
            Ok(())
        })
    }
}

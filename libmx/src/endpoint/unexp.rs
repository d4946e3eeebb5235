//! Unexpected-message handlers (`mx_register_unexp_handler`, and the older
//! `mx_register_unexp_callback`).
//!
//! MX calls the handler for a message that matches no posted receive, before
//! the message joins the unexpected queue; the handler may post a receive
//! for it and returns whether the library should go on matching it or drop
//! it. The protocol core matches internally, so while a handler is
//! registered the endpoint keeps a catch-all receive (the sentinel) at the
//! end of the posted queue: whatever no application receive takes lands
//! there, is kept in the library's own unexpected queue below, and is handed
//! to the handler. Receives and probes look at this queue first. A LARGE
//! message taken by the sentinel is pulled into a library buffer first (its
//! match info only comes with the end of the pull).

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};

use xmx_mx::{PullNeeded, RecvDone, RequestId, Status};

use super::{Endpoint, Link, State, IN_HANDLER};
use crate::abi::{MxMatchingCallback, MxReturn, MxStatus, MxUnexpHandler, MX_RECV_FINISHED};
use crate::addr::Addr;
use crate::counters::{self, Counter};
use crate::errors::{Failure, MxResult};
use crate::runtime;
use crate::segments::Segments;
use crate::transport::PullProgress;

/// A registered handler.
#[derive(Clone, Copy, Debug)]
pub enum UnexpHandler {
    /// `mx_unexp_handler_t`.
    Handler(MxUnexpHandler),
    /// `mx_matching_callback_t` (always lets matching go on).
    Callback(MxMatchingCallback),
}

#[derive(Debug)]
struct Stored {
    id: u64,
    source: Addr,
    match_info: u64,
    msg_length: u32,
    data: Vec<u8>,
}

/// The endpoint's handler state and the library-side unexpected queue.
#[derive(Debug, Default)]
pub(crate) struct Unexp {
    handler: Option<(UnexpHandler, usize)>,
    sentinel: Option<RequestId>,
    store: VecDeque<Stored>,
    next_id: u64,
    /// Stored messages not yet shown to the handler.
    calls: VecDeque<u64>,
    /// LARGE messages being pulled for the sentinel.
    bounce: HashMap<RequestId, Vec<u8>>,
}

impl Endpoint {
    /// Registers (or with `None` removes) the endpoint's unexpected handler.
    pub fn register_unexp_handler(
        &self,
        handler: Option<UnexpHandler>,
        context: usize,
    ) -> MxResult<()> {
        if Endpoint::in_handler() {
            return Err(Failure::new(
                MxReturn::CloseInHandler,
                "registering a handler from a handler",
            ));
        }
        self.with_state(|ep, st| {
            let now = runtime::now();
            st.unexp.handler = handler.map(|h| (h, context));
            match (handler, st.unexp.sentinel) {
                (Some(_), None) => ep.post_sentinel(st, now),
                (None, Some(id)) => {
                    if st.core.cancel(id) {
                        st.links.remove(&id);
                    }
                    st.unexp.sentinel = None;
                }
                _ => {}
            }
            Ok(())
        })
    }

    fn post_sentinel(&self, st: &mut State, now: xmx_mx::Instant) {
        match st.core.post_recv(now, 0, 0, u32::MAX as usize) {
            Ok(id) => {
                st.links.insert(id, Link::Sentinel);
                st.unexp.sentinel = Some(id);
            }
            Err(e) => tracing::warn!(%e, "catch-all receive refused"),
        }
    }

    /// Keeps the sentinel behind every application receive.
    pub(super) fn repost_sentinel(&self, st: &mut State, now: xmx_mx::Instant) {
        let Some(id) = st.unexp.sentinel else { return };
        if st.core.cancel(id) {
            st.links.remove(&id);
            st.unexp.sentinel = None;
            self.post_sentinel(st, now);
        }
    }

    fn sentinel_taken(&self, st: &mut State, now: xmx_mx::Instant, id: RequestId) {
        if st.unexp.sentinel == Some(id) {
            st.unexp.sentinel = None;
            if st.unexp.handler.is_some() {
                self.post_sentinel(st, now);
            }
        }
    }

    /// The sentinel received a whole message.
    pub(super) fn unexp_arrived(&self, st: &mut State, now: xmx_mx::Instant, done: RecvDone) {
        self.sentinel_taken(st, now, done.id);
        let data = match st.unexp.bounce.remove(&done.id) {
            Some(mut b) => {
                b.truncate(done.xfer_length as usize);
                b
            }
            None => done.data,
        };
        if !done.status.is_success() {
            tracing::debug!(status = %done.status, "unexpected message lost");
            return;
        }
        let id = st.unexp.next_id;
        st.unexp.next_id += 1;
        st.unexp.store.push_back(Stored {
            id,
            source: Addr {
                nic_id: self
                    .transport
                    .peer_nic_id(done.source.peer.peer_index)
                    .unwrap_or(0),
                endpoint: done.source.peer.endpoint,
                session: done.source.session,
                local: self.handle,
            },
            match_info: done.match_info,
            msg_length: done.msg_length,
            data,
        });
        if st.unexp.handler.is_some() {
            st.unexp.calls.push_back(id);
        }
    }

    /// The sentinel matched a LARGE message: pull it into a library buffer.
    pub(super) fn unexp_large_arrived(&self, st: &mut State, now: xmx_mx::Instant, p: PullNeeded) {
        self.sentinel_taken(st, now, p.id);
        let buf = vec![0u8; p.length as usize];
        // SAFETY: the buffer is owned by `bounce` until the receive ends
        // (RecvDone removes it); its heap block does not move meanwhile.
        let segs = unsafe { Segments::from_parts(vec![(buf.as_ptr() as usize, buf.len())]) };
        st.unexp.bounce.insert(p.id, buf);
        let progress = st
            .regions
            .pull(p.id, p.source.peer, p.window, &segs, p.length);
        if let PullProgress::Done(result) = progress {
            self.finish_pull(st, now, p.id, result);
        }
    }

    /// A new receive takes the first stored message it matches, if any.
    pub(super) fn take_stored(
        &self,
        st: &mut State,
        _now: xmx_mx::Instant,
        seq: u64,
        match_info: u64,
        match_mask: u64,
    ) -> bool {
        let Some(pos) = st
            .unexp
            .store
            .iter()
            .position(|m| m.match_info & match_mask == match_info)
        else {
            return false;
        };
        let Some(m) = st.unexp.store.remove(pos) else {
            return false;
        };
        let Some(r) = st.requests.get_mut(&seq) else {
            return false;
        };
        let written = r.segs.scatter(&m.data) as u32;
        r.code = if written < m.msg_length {
            Status::Truncated
        } else {
            Status::Success
        };
        r.source = m.source;
        r.match_info = m.match_info;
        r.msg_length = m.msg_length;
        r.xfer_length = written;
        counters::add(Counter::BytesReceived, written as u64);
        self.complete(st, seq);
        true
    }

    /// The first stored message matching the pair, as `mx_iprobe` shows it.
    pub(super) fn probe_stored(
        &self,
        st: &State,
        match_info: u64,
        match_mask: u64,
    ) -> Option<MxStatus> {
        let m = st
            .unexp
            .store
            .iter()
            .find(|m| m.match_info & match_mask == match_info)?;
        Some(MxStatus {
            code: Status::Success.code(),
            source: m.source.encode(),
            match_info: m.match_info,
            msg_length: m.msg_length,
            xfer_length: 0,
            context: std::ptr::null_mut(),
        })
    }

    /// Shows pending stored messages to the handler, with the endpoint
    /// unlocked; one thread at a time.
    pub(super) fn run_handlers(&self) {
        let Ok(_one_at_a_time) = self.handlers.try_lock() else {
            return;
        };
        loop {
            let call = {
                let Ok(mut st) = self.lock() else { return };
                let Some(id) = st.unexp.calls.pop_front() else {
                    return;
                };
                let Some((handler, context)) = st.unexp.handler else {
                    continue;
                };
                let Some(m) = st.unexp.store.iter().find(|m| m.id == id) else {
                    // A receive took it meanwhile.
                    continue;
                };
                let data = (m.data.len() == m.msg_length as usize
                    && m.msg_length as usize <= xmx_mx::MEDIUM_MAX)
                    .then(|| m.data.clone());
                (
                    id,
                    handler,
                    context,
                    m.source,
                    m.match_info,
                    m.msg_length,
                    data,
                )
            };
            let (id, handler, context, source, match_info, length, mut data) = call;
            counters::add(Counter::UnexpHandlerCalls, 1);
            IN_HANDLER.with(|h| h.set(true));
            let action = match handler {
                UnexpHandler::Handler(h) => {
                    let ptr = data
                        .as_mut()
                        .map_or(std::ptr::null_mut(), |d| d.as_mut_ptr() as *mut c_void);
                    // SAFETY: an application handler with MX's signature;
                    // `data` outlives the call.
                    unsafe {
                        h(
                            context as *mut c_void,
                            source.encode(),
                            match_info,
                            length,
                            ptr,
                        )
                    }
                }
                UnexpHandler::Callback(cb) => {
                    // SAFETY: an application callback with MX's signature.
                    unsafe { cb(context as *mut c_void, match_info, length as c_int) };
                    0
                }
            };
            IN_HANDLER.with(|h| h.set(false));
            if action == MX_RECV_FINISHED {
                if let Ok(mut st) = self.lock() {
                    st.unexp.store.retain(|m| m.id != id);
                }
            }
        }
    }
}

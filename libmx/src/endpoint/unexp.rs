//! Unexpected-message handlers (`mx_register_unexp_handler`, and the older
//! `mx_register_unexp_callback`).
//!
//! MX calls the handler for a message that matches no posted receive, in
//! arrival order; the handler may post a receive for it and returns whether
//! the library should go on matching it or drop it. Unexpected messages stay
//! in the protocol core's one unexpected queue, in arrival order, whatever
//! their size: while a handler is registered the core reports each arrival
//! into that queue, and the handler is shown it with the endpoint unlocked
//! (so it can post receives). A receive the handler posts takes the earliest
//! queued message it matches, exactly as any other receive; a LARGE message
//! is pulled only once a receive takes it, straight into that receive's
//! buffer.

use std::cell::Cell;
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};

use xmx_mx::{InboundId, UnexpectedArrival};

use super::{AppEndpoint, CoreRequestOwner, EndpointState, IN_HANDLER};
use crate::abi::{MxMatchingCallback, MxReturn, MxUnexpHandler, MX_RECV_FINISHED};
use crate::counters::{self, Counter};
use crate::errors::{Failure, MxResult};
use crate::runtime;

thread_local! {
    /// Whether this thread is showing arrivals to a handler.
    static SHOWING: Cell<bool> = const { Cell::new(false) };
}

/// Clears [`SHOWING`] when a run ends, however it ends.
struct ShowingGuard;

impl Drop for ShowingGuard {
    fn drop(&mut self) {
        SHOWING.with(|s| s.set(false));
    }
}

/// Who shows arrivals to the handler.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Caller {
    /// The application, inside one of its MX calls.
    Application,
    /// The library's progression thread.
    ProgressionThread,
}

/// A registered handler.
#[derive(Clone, Copy, Debug)]
pub(crate) enum UnexpHandler {
    /// `mx_unexp_handler_t`.
    Handler(MxUnexpHandler),
    /// `mx_matching_callback_t` (always lets matching go on).
    Callback(MxMatchingCallback),
}

/// The endpoint's handler and the arrivals it has not been shown yet.
#[derive(Debug, Default)]
pub(crate) struct Unexp {
    handler: Option<(UnexpHandler, usize)>,
    calls: VecDeque<UnexpectedArrival>,
}

impl AppEndpoint {
    /// Registers (or with `None` removes) the endpoint's unexpected handler.
    pub(crate) fn register_unexp_handler(
        &self,
        handler: Option<UnexpHandler>,
        context: usize,
    ) -> MxResult<()> {
        if AppEndpoint::in_handler() {
            return Err(Failure::new(
                MxReturn::CloseInHandler,
                "registering a handler from a handler",
            ));
        }
        self.with_state(|_, st| {
            st.unexp.handler = handler.map(|h| (h, context));
            st.core.set_unexpected_events(handler.is_some());
            if handler.is_none() {
                st.unexp.calls.clear();
            }
            Ok(())
        })
    }

    /// A message joined the core's unexpected queue.
    pub(super) fn unexp_arrived(&self, st: &mut EndpointState, arrival: UnexpectedArrival) {
        if st.unexp.handler.is_some() {
            st.unexp.calls.push_back(arrival);
        }
    }

    /// Whether arrivals wait for the handler: the caller that progressed
    /// the endpoint calls [`Self::run_handlers`] only then, as taking the
    /// endpoint's lock again (and reading the clock to renew the lease) in
    /// every look of a polling wait cost as much as the look itself.
    pub(super) fn handlers_pending(st: &EndpointState) -> bool {
        !st.unexp.calls.is_empty()
    }

    /// Shows pending unexpected arrivals to the handler, in arrival order,
    /// with the endpoint unlocked; one thread at a time. For the
    /// application's own MX calls.
    pub(super) fn run_handlers(&self) {
        self.run_handlers_from(Caller::Application);
    }

    /// [`Self::run_handlers`] for `caller`: the progression thread shows
    /// nothing while progression is disabled, and looks again before each
    /// arrival under the lock `mx_disable_progression` waits for, so none
    /// begins after the switch (it looked before its progress began, which
    /// the application's section may have begun during).
    ///
    /// An application call waits for another thread's run to end rather
    /// than return before the handler has posted the receives of what its
    /// own progress met (the look after the handlers must see them); the
    /// progression thread never waits, and a run never starts inside this
    /// thread's own run (a handler's MX calls, the library's own calls
    /// between handlers).
    pub(super) fn run_handlers_from(&self, caller: Caller) {
        if SHOWING.with(Cell::get) {
            return;
        }
        let _one_at_a_time = if caller == Caller::Application {
            self.handlers.lock().unwrap_or_else(|e| e.into_inner())
        } else {
            let Ok(guard) = self.handlers.try_lock() else {
                return;
            };
            guard
        };
        SHOWING.with(|s| s.set(true));
        let _showing = ShowingGuard;
        loop {
            if caller == Caller::ProgressionThread && self.progression_disabled() {
                return;
            }
            let call = {
                let Ok(mut st) = self.lock() else { return };
                let Some(arrival) = st.unexp.calls.pop_front() else {
                    return;
                };
                let Some((handler, context)) = st.unexp.handler else {
                    continue;
                };
                if !st.core.is_unexpected(arrival.id) {
                    // A receive took it meanwhile.
                    continue;
                }
                let data = st.core.unexpected_data(arrival.id).map(<[u8]>::to_vec);
                let source = self.addr_of(arrival.source.peer, arrival.source.session);
                (arrival, handler, context, source, data)
            };
            let (arrival, handler, context, source, mut data) = call;
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
                            arrival.match_info,
                            arrival.msg_length,
                            ptr,
                        )
                    }
                }
                UnexpHandler::Callback(cb) => {
                    // SAFETY: an application callback with MX's signature.
                    unsafe {
                        cb(
                            context as *mut c_void,
                            arrival.match_info,
                            arrival.msg_length as c_int,
                        )
                    };
                    0
                }
            };
            IN_HANDLER.with(|h| h.set(false));
            if action == MX_RECV_FINISHED {
                let _ = self.with_state(|ep, st| {
                    ep.drop_unexpected(st, arrival.id);
                    Ok(())
                });
            }
        }
    }

    /// The handler finished with message `id`: it leaves the queue, taken
    /// by an empty receive nobody waits for (a LARGE sender is still
    /// notified, of 0 bytes taken).
    fn drop_unexpected(&self, st: &mut EndpointState, id: InboundId) {
        if let Some(rid) = st.core.receive_unexpected(runtime::now(), id, 0) {
            st.links.insert(rid, CoreRequestOwner::Discard);
        }
    }
}

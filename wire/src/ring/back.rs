//! The back half: consumes requests, produces responses.

use std::marker::PhantomData;
use std::sync::atomic::{fence, Ordering};

use super::{
    check_geometry, layout, needs_notify, slot_offset, slot_size, RingError, SharedMem, Slot,
};

/// The request-consuming half of a shared ring (ring.h's `BACK_RING`).
///
/// Writes `rsp_prod` and `req_event` and nothing else of the header. Treats every value the
/// front half wrote as untrusted.
pub struct BackRing<Req: Slot, Rsp: Slot> {
    mem: SharedMem,
    size: u32,
    rsp_prod_pvt: u32,
    /// The last value this side stored in `rsp_prod`.
    rsp_prod_published: u32,
    req_cons: u32,
    scratch: Box<[u8]>,
    _slots: PhantomData<fn(Req) -> Rsp>,
}

impl<Req: Slot, Rsp: Slot> std::fmt::Debug for BackRing<Req, Rsp> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackRing")
            .field("size", &self.size)
            .field("rsp_prod_pvt", &self.rsp_prod_pvt)
            .field("rsp_prod_published", &self.rsp_prod_published)
            .field("req_cons", &self.req_cons)
            .finish()
    }
}

impl<Req: Slot, Rsp: Slot> BackRing<Req, Rsp> {
    /// Take the back half of a ring the front half initialised (`BACK_RING_INIT`): private
    /// indices 0, shared memory untouched.
    pub fn new(mem: SharedMem) -> Result<Self, RingError> {
        Self::new_at(mem, 0)
    }

    /// As [`BackRing::new`] with private indices at `start`, matching a front half made with
    /// [`super::FrontRing::new_at`].
    pub fn new_at(mem: SharedMem, start: u32) -> Result<Self, RingError> {
        let size = check_geometry::<Req, Rsp>(&mem)?;
        Ok(Self::with_indices(mem, size, start, start))
    }

    /// Take the back half of a ring in use, resuming from its shared indices
    /// (`BACK_RING_ATTACH`): requests not yet consumed are skipped.
    pub fn attach(mem: SharedMem) -> Result<Self, RingError> {
        let size = check_geometry::<Req, Rsp>(&mem)?;
        let req_prod = mem
            .load_u32(layout::REQ_PROD, Ordering::Acquire)
            .unwrap_or(0);
        let rsp_prod = mem
            .load_u32(layout::RSP_PROD, Ordering::Acquire)
            .unwrap_or(0);
        if req_prod.wrapping_sub(rsp_prod) > size {
            return Err(RingError::Overflow {
                index: "req_prod",
                value: req_prod,
                cons: rsp_prod,
                limit: size,
            });
        }
        Ok(Self::with_indices(mem, size, rsp_prod, req_prod))
    }

    fn with_indices(mem: SharedMem, size: u32, rsp_prod: u32, req_cons: u32) -> Self {
        BackRing {
            mem,
            size,
            rsp_prod_pvt: rsp_prod,
            rsp_prod_published: rsp_prod,
            req_cons,
            scratch: vec![0u8; slot_size::<Req, Rsp>()].into_boxed_slice(),
            _slots: PhantomData,
        }
    }

    /// Number of slots.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The memory the ring lives in.
    pub fn mem(&self) -> &SharedMem {
        &self.mem
    }

    /// Next request index to be consumed.
    pub fn req_cons(&self) -> u32 {
        self.req_cons
    }

    /// Next response index to be produced (private, not yet necessarily published).
    pub fn rsp_prod_pvt(&self) -> u32 {
        self.rsp_prod_pvt
    }

    /// Requests consumed that have no response yet.
    pub fn unanswered(&self) -> u32 {
        self.req_cons.wrapping_sub(self.rsp_prod_pvt)
    }

    /// Requests published by the front half and not consumed yet
    /// (`RING_HAS_UNCONSUMED_REQUESTS`), or `Overflow` if `req_prod` is impossible:
    /// more than a ring's worth ahead of the responses (`RING_REQUEST_PROD_OVERFLOW`), or
    /// behind requests already consumed.
    pub fn unconsumed_requests(&self) -> Result<u32, RingError> {
        let prod = self
            .mem
            .load_u32(layout::REQ_PROD, Ordering::Acquire)
            .unwrap_or(0);
        let ahead = prod.wrapping_sub(self.rsp_prod_pvt);
        let consumed = self.req_cons.wrapping_sub(self.rsp_prod_pvt);
        if ahead > self.size || ahead < consumed {
            return Err(RingError::Overflow {
                index: "req_prod",
                value: prod,
                cons: self.req_cons,
                limit: self.size - consumed,
            });
        }
        Ok(ahead - consumed)
    }

    /// Consume the next request: `Ok(None)` if there is none, `Err(Overflow)` (nothing
    /// consumed) if `req_prod` is impossible, `Err(Message)` if the slot was consumed but
    /// does not decode (it still needs a response to free its slot).
    pub fn next_request(&mut self) -> Result<Option<Req>, RingError> {
        if self.unconsumed_requests()? == 0 {
            return Ok(None);
        }
        let off = slot_offset(self.req_cons, self.size, self.scratch.len());
        let buf = &mut self.scratch[..Req::SIZE];
        // One copy out of shared memory (ring.h's RING_COPY_REQUEST); decoding and every
        // later check see only the private copy, so there is no double fetch.
        self.mem.read_bytes(off, buf);
        self.req_cons = self.req_cons.wrapping_add(1);
        Ok(Some(Req::decode(buf)?))
    }

    /// Encode `rsp` into the slot of the oldest unanswered request. `Full` if every consumed
    /// request already has its response.
    pub fn push_response(&mut self, rsp: &Rsp) -> Result<(), RingError> {
        if self.unanswered() == 0 {
            return Err(RingError::Full);
        }
        let buf = &mut self.scratch[..Rsp::SIZE];
        buf.fill(0);
        rsp.encode(buf)?;
        let off = slot_offset(self.rsp_prod_pvt, self.size, self.scratch.len());
        self.mem.write_bytes(off, &self.scratch[..Rsp::SIZE]);
        self.rsp_prod_pvt = self.rsp_prod_pvt.wrapping_add(1);
        Ok(())
    }

    /// Publish pushed responses (`RING_PUSH_RESPONSES`), without the notify check.
    pub fn push_responses(&mut self) {
        // Release: the slot contents are visible before the index that covers them.
        self.mem
            .store_u32(layout::RSP_PROD, self.rsp_prod_pvt, Ordering::Release);
        self.rsp_prod_published = self.rsp_prod_pvt;
    }

    /// Publish pushed responses and say whether the front half asked to be notified
    /// (`RING_PUSH_RESPONSES_AND_CHECK_NOTIFY`).
    pub fn push_responses_and_check_notify(&mut self) -> bool {
        let old = self.rsp_prod_published;
        let new = self.rsp_prod_pvt;
        self.push_responses();
        // Full fence: pairs with the fence in the front half's final check.
        fence(Ordering::SeqCst);
        let event = self
            .mem
            .load_u32(layout::RSP_EVENT, Ordering::Relaxed)
            .unwrap_or(0);
        needs_notify(old, new, event)
    }

    /// Before sleeping: ask for an event on the next request and re-check
    /// (`RING_FINAL_CHECK_FOR_REQUESTS`). True means requests are waiting: do not sleep.
    pub fn final_check_for_requests(&mut self) -> Result<bool, RingError> {
        if self.unconsumed_requests()? > 0 {
            return Ok(true);
        }
        self.mem.store_u32(
            layout::REQ_EVENT,
            self.req_cons.wrapping_add(1),
            Ordering::Relaxed,
        );
        // Full fence: the store of req_event is visible before we re-read req_prod; pairs
        // with the fence in the front half's push-and-check-notify.
        fence(Ordering::SeqCst);
        Ok(self.unconsumed_requests()? > 0)
    }
}

impl<Req: Slot> BackRing<Req, ()> {
    /// On a one-way ring: return every consumed slot to the producer in one step (the empty
    /// responses carry no bytes). Publish with one of the push methods.
    pub fn retire_consumed(&mut self) -> u32 {
        let n = self.unanswered();
        self.rsp_prod_pvt = self.req_cons;
        n
    }
}

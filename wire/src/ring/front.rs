//! The front half: produces requests, consumes responses.

use std::marker::PhantomData;
use std::sync::atomic::{fence, Ordering};

use super::{
    check_geometry, init_shared, layout, needs_notify, slot_offset, slot_size, RingError,
    SharedMem, Slot,
};

/// The request-producing half of a shared ring (ring.h's `FRONT_RING`).
///
/// Writes `req_prod` and `rsp_event` and nothing else of the header.
pub struct FrontRing<Req: Slot, Rsp: Slot> {
    mem: SharedMem,
    size: u32,
    req_prod_pvt: u32,
    /// The last value this side stored in `req_prod`: kept here rather than read back from
    /// memory the peer can write.
    req_prod_published: u32,
    rsp_cons: u32,
    scratch: Box<[u8]>,
    _slots: PhantomData<fn(Req) -> Rsp>,
}

impl<Req: Slot, Rsp: Slot> std::fmt::Debug for FrontRing<Req, Rsp> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontRing")
            .field("size", &self.size)
            .field("req_prod_pvt", &self.req_prod_pvt)
            .field("req_prod_published", &self.req_prod_published)
            .field("rsp_cons", &self.rsp_cons)
            .finish()
    }
}

impl<Req: Slot, Rsp: Slot> FrontRing<Req, Rsp> {
    /// Initialise the shared header of `mem` (indices 0, events 1, padding zeroed) and
    /// take the front half, as `SHARED_RING_INIT` + `FRONT_RING_INIT`.
    pub fn new(mem: SharedMem) -> Result<Self, RingError> {
        Self::new_at(mem, 0)
    }

    /// As [`FrontRing::new`] with every index starting at `start` instead of 0 (a legal
    /// state of a ring that has carried `start` messages; used to exercise index wrap).
    pub fn new_at(mem: SharedMem, start: u32) -> Result<Self, RingError> {
        let size = check_geometry::<Req, Rsp>(&mem)?;
        init_shared(&mem, start)?;
        Ok(Self::with_indices(mem, size, start, start))
    }

    /// Take the front half of an already initialised ring, resuming from its shared indices
    /// (`FRONT_RING_ATTACH`): responses not yet consumed are dropped.
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
                index: "rsp_prod",
                value: rsp_prod,
                cons: req_prod,
                limit: size,
            });
        }
        Ok(Self::with_indices(mem, size, req_prod, rsp_prod))
    }

    fn with_indices(mem: SharedMem, size: u32, req_prod: u32, rsp_cons: u32) -> Self {
        FrontRing {
            mem,
            size,
            req_prod_pvt: req_prod,
            req_prod_published: req_prod,
            rsp_cons,
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

    /// Next request index to be produced (private, not yet necessarily published).
    pub fn req_prod_pvt(&self) -> u32 {
        self.req_prod_pvt
    }

    /// Next response index to be consumed.
    pub fn rsp_cons(&self) -> u32 {
        self.rsp_cons
    }

    /// Slots free for new requests (`RING_FREE_REQUESTS`).
    pub fn free_requests(&self) -> u32 {
        self.size - self.req_prod_pvt.wrapping_sub(self.rsp_cons)
    }

    /// True if no request can be pushed until responses are consumed (`RING_FULL`).
    pub fn is_full(&self) -> bool {
        self.free_requests() == 0
    }

    /// Requests pushed whose responses have not been consumed yet.
    pub fn outstanding(&self) -> u32 {
        self.req_prod_pvt.wrapping_sub(self.rsp_cons)
    }

    /// Requests pushed but not yet published with [`FrontRing::push_requests`].
    pub fn unpublished(&self) -> u32 {
        self.req_prod_pvt.wrapping_sub(self.req_prod_published)
    }

    /// Encode `req` into the next free slot. It becomes visible to the back half on the next
    /// publish.
    pub fn push_request(&mut self, req: &Req) -> Result<(), RingError> {
        if self.is_full() {
            return Err(RingError::Full);
        }
        let buf = &mut self.scratch[..Req::SIZE];
        buf.fill(0);
        req.encode(buf)?;
        let off = slot_offset(self.req_prod_pvt, self.size, self.scratch.len());
        self.mem.write_bytes(off, &self.scratch[..Req::SIZE]);
        self.req_prod_pvt = self.req_prod_pvt.wrapping_add(1);
        Ok(())
    }

    /// Publish pushed requests (`RING_PUSH_REQUESTS`), without the notify check.
    pub fn push_requests(&mut self) {
        // Release: the slot contents are visible before the index that covers them.
        self.mem
            .store_u32(layout::REQ_PROD, self.req_prod_pvt, Ordering::Release);
        self.req_prod_published = self.req_prod_pvt;
    }

    /// Publish pushed requests and say whether the back half asked to be notified
    /// (`RING_PUSH_REQUESTS_AND_CHECK_NOTIFY`): true iff the new `req_prod` passed
    /// `req_event`.
    pub fn push_requests_and_check_notify(&mut self) -> bool {
        let since = self.req_prod_published;
        self.push_requests_and_check_notify_since(since)
    }

    /// `req_prod` as last published.
    pub fn published(&self) -> u32 {
        self.req_prod_published
    }

    /// As [`FrontRing::push_requests_and_check_notify`], counting as new every request
    /// after `since` (an earlier [`FrontRing::published`]): requests published meanwhile
    /// without a notification are covered, so a back half that asked to be told of one
    /// of them is told now.
    pub fn push_requests_and_check_notify_since(&mut self, since: u32) -> bool {
        let old = since;
        let new = self.req_prod_pvt;
        self.push_requests();
        // Full fence: the back half sees the new req_prod before we read its req_event, and
        // pairs with the fence in its final check.
        fence(Ordering::SeqCst);
        let event = self
            .mem
            .load_u32(layout::REQ_EVENT, Ordering::Relaxed)
            .unwrap_or(0);
        needs_notify(old, new, event)
    }

    /// Responses published by the back half and not consumed yet
    /// (`RING_HAS_UNCONSUMED_RESPONSES`), or `Overflow` if `rsp_prod` is impossible.
    pub fn unconsumed_responses(&self) -> Result<u32, RingError> {
        let prod = self
            .mem
            .load_u32(layout::RSP_PROD, Ordering::Acquire)
            .unwrap_or(0);
        self.check_rsp_prod(prod)
    }

    fn check_rsp_prod(&self, prod: u32) -> Result<u32, RingError> {
        let avail = prod.wrapping_sub(self.rsp_cons);
        // The back half can only answer requests it was shown.
        let limit = self.req_prod_published.wrapping_sub(self.rsp_cons);
        if avail > limit {
            return Err(RingError::Overflow {
                index: "rsp_prod",
                value: prod,
                cons: self.rsp_cons,
                limit,
            });
        }
        Ok(avail)
    }

    /// Consume the next response: `Ok(None)` if there is none, `Err(Overflow)` (nothing
    /// consumed) if `rsp_prod` is impossible, `Err(Message)` if the slot was consumed but
    /// does not decode.
    pub fn next_response(&mut self) -> Result<Option<Rsp>, RingError> {
        if self.unconsumed_responses()? == 0 {
            return Ok(None);
        }
        let off = slot_offset(self.rsp_cons, self.size, self.scratch.len());
        let buf = &mut self.scratch[..Rsp::SIZE];
        // One copy out of shared memory; decoding sees only the private copy.
        self.mem.read_bytes(off, buf);
        self.rsp_cons = self.rsp_cons.wrapping_add(1);
        Ok(Some(Rsp::decode(buf)?))
    }

    /// Before sleeping: ask for an event on the next response and re-check
    /// (`RING_FINAL_CHECK_FOR_RESPONSES`). True means responses are waiting: do not sleep.
    pub fn final_check_for_responses(&mut self) -> Result<bool, RingError> {
        if self.unconsumed_responses()? > 0 {
            return Ok(true);
        }
        self.mem.store_u32(
            layout::RSP_EVENT,
            self.rsp_cons.wrapping_add(1),
            Ordering::Relaxed,
        );
        // Full fence: the store of rsp_event is visible before we re-read rsp_prod; pairs
        // with the fence in the back half's push-and-check-notify.
        fence(Ordering::SeqCst);
        Ok(self.unconsumed_responses()? > 0)
    }
}

impl<Req: Slot> FrontRing<Req, ()> {
    /// On a one-way ring: take back every slot the consumer returned, in one step.
    /// Returns how many were reclaimed.
    pub fn reclaim(&mut self) -> Result<u32, RingError> {
        let n = self.unconsumed_responses()?;
        self.rsp_cons = self.rsp_cons.wrapping_add(n);
        Ok(n)
    }
}

//! An endpoint's mailbox: what a transport's driver (or a polling thread)
//! took in for the endpoint, kept for its port and regions to take without
//! the transport's own lock.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use xmx_mx::{Frame, RequestId, Status};

use crate::doorbell::Doorbell;
use xmx_hv::lock;

/// Frames for an endpoint's protocol core and its finished pulls.
pub(crate) struct Mailbox {
    frames: Mutex<VecDeque<Frame<Vec<u8>>>>,
    pulls: Mutex<VecDeque<(RequestId, Result<(), Status>)>>,
    doorbell: Arc<Doorbell>,
}

impl Mailbox {
    /// An empty mailbox whose arrivals ring `doorbell`.
    pub(crate) fn new(doorbell: Arc<Doorbell>) -> Mailbox {
        Mailbox {
            frames: Mutex::new(VecDeque::new()),
            pulls: Mutex::new(VecDeque::new()),
            doorbell,
        }
    }

    /// The next frame for the protocol core.
    pub(crate) fn next_frame(&self) -> Option<Frame<Vec<u8>>> {
        lock(&self.frames).pop_front()
    }

    /// The next pull that finished.
    pub(crate) fn next_pull(&self) -> Option<(RequestId, Result<(), Status>)> {
        lock(&self.pulls).pop_front()
    }

    /// Keeps `frames` for the protocol core (the caller rings).
    pub(crate) fn put_frames(&self, frames: impl IntoIterator<Item = Frame<Vec<u8>>>) {
        lock(&self.frames).extend(frames);
    }

    /// Keeps finished pulls (the caller rings).
    pub(crate) fn put_pulls(
        &self,
        pulls: impl IntoIterator<Item = (RequestId, Result<(), Status>)>,
    ) {
        lock(&self.pulls).extend(pulls);
    }

    /// Whether frames or finished pulls are kept.
    pub(crate) fn is_empty(&self) -> bool {
        lock(&self.frames).is_empty() && lock(&self.pulls).is_empty()
    }

    /// Forgets everything kept (the endpoint closed).
    pub(crate) fn clear(&self) {
        lock(&self.frames).clear();
        lock(&self.pulls).clear();
    }

    /// Wakes whoever waits on the endpoint.
    pub(crate) fn ring(&self) {
        self.doorbell.ring();
    }

    /// Until when an application thread takes the endpoint's arrivals in
    /// itself, so a driver need not watch for them; see
    /// [`Doorbell::driven_until`].
    pub(crate) fn driven_until(&self, now_ns: u64) -> Option<u64> {
        self.doorbell.driven_until(now_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn pulls_come_out_in_order_until_cleared() {
        let m = Mailbox::new(Arc::new(Doorbell::new(Duration::ZERO, 0, None)));
        assert!(m.next_frame().is_none());
        assert_eq!(m.next_pull(), None);
        let (a, b) = (RequestId(1), RequestId(2));
        m.put_pulls([(a, Ok(())), (b, Err(Status::Aborted))]);
        assert_eq!(m.next_pull(), Some((a, Ok(()))));
        m.put_pulls([(a, Ok(()))]);
        m.clear();
        assert_eq!(m.next_pull(), None, "cleared");
    }
}

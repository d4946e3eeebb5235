//! An endpoint's mailbox: what a transport's driver (or a polling thread)
//! took in for the endpoint, kept for its port and regions to take without
//! the transport's own lock.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use xmx_mx::{Frame, RequestId, Status};

use crate::doorbell::Doorbell;
use xmx_hv::lock;

/// Frames for an endpoint's protocol core and its finished pulls.
///
/// A polling wait asks for both at every look and almost always finds
/// neither: each queue's length is kept beside it, so an empty one is seen
/// with a load instead of a lock and an unlock. The length is written under
/// the queue's lock after the queue; a taker that reads it just before a
/// put sees the put at its next look, which the put's ring brings about.
pub(crate) struct Mailbox {
    frames: Mutex<VecDeque<Frame<Vec<u8>>>>,
    frames_len: AtomicUsize,
    pulls: Mutex<VecDeque<(RequestId, Result<(), Status>)>>,
    pulls_len: AtomicUsize,
    doorbell: Arc<Doorbell>,
}

impl Mailbox {
    /// An empty mailbox whose arrivals ring `doorbell`.
    pub(crate) fn new(doorbell: Arc<Doorbell>) -> Mailbox {
        Mailbox {
            frames: Mutex::new(VecDeque::new()),
            frames_len: AtomicUsize::new(0),
            pulls: Mutex::new(VecDeque::new()),
            pulls_len: AtomicUsize::new(0),
            doorbell,
        }
    }

    /// The next frame for the protocol core.
    pub(crate) fn next_frame(&self) -> Option<Frame<Vec<u8>>> {
        take(&self.frames, &self.frames_len)
    }

    /// The next pull that finished.
    pub(crate) fn next_pull(&self) -> Option<(RequestId, Result<(), Status>)> {
        take(&self.pulls, &self.pulls_len)
    }

    /// Keeps `frames` for the protocol core (the caller rings).
    pub(crate) fn put_frames(&self, frames: impl IntoIterator<Item = Frame<Vec<u8>>>) {
        put(&self.frames, &self.frames_len, frames);
    }

    /// Keeps finished pulls (the caller rings).
    pub(crate) fn put_pulls(
        &self,
        pulls: impl IntoIterator<Item = (RequestId, Result<(), Status>)>,
    ) {
        put(&self.pulls, &self.pulls_len, pulls);
    }

    /// Whether frames are kept.
    pub(crate) fn has_frames(&self) -> bool {
        self.frames_len.load(Ordering::Acquire) != 0
    }

    /// Whether frames or finished pulls are kept.
    pub(crate) fn is_empty(&self) -> bool {
        self.frames_len.load(Ordering::Acquire) == 0 && self.pulls_len.load(Ordering::Acquire) == 0
    }

    /// Forgets everything kept (the endpoint closed).
    pub(crate) fn clear(&self) {
        let mut frames = lock(&self.frames);
        frames.clear();
        self.frames_len.store(0, Ordering::Release);
        drop(frames);
        let mut pulls = lock(&self.pulls);
        pulls.clear();
        self.pulls_len.store(0, Ordering::Release);
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

    /// Until when the transport's arrival descriptor needs no driver; see
    /// [`Doorbell::port_taken_until`].
    pub(crate) fn port_taken_until(&self, now_ns: u64) -> Option<u64> {
        self.doorbell.port_taken_until(now_ns)
    }
}

fn take<T>(queue: &Mutex<VecDeque<T>>, len: &AtomicUsize) -> Option<T> {
    if len.load(Ordering::Acquire) == 0 {
        return None;
    }
    let mut q = lock(queue);
    let item = q.pop_front();
    len.store(q.len(), Ordering::Release);
    item
}

fn put<T>(queue: &Mutex<VecDeque<T>>, len: &AtomicUsize, items: impl IntoIterator<Item = T>) {
    let mut q = lock(queue);
    q.extend(items);
    len.store(q.len(), Ordering::Release);
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

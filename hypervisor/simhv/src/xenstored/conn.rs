//! One client connection's I/O: an outgoing queue drained by a writer thread, and the
//! accounting of replies not yet delivered ("outstanding requests").
//!
//! Replies and watch events are queued, never written by the thread that produced
//! them, so a client that stops reading can stall only itself: the thread holding the
//! database lock never blocks on a socket.

use std::collections::{HashMap, VecDeque};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

use nix::errno::Errno;
use nix::sys::socket::{self, MsgFlags};
use xmx_hv::DomId;

use super::perms;
use xmx_hv::lock;

/// Identifies one connection for the daemon's lifetime.
pub(crate) type XsConnId = u64;

/// Watch events an unprivileged connection may have waiting before new ones are
/// dropped (xenstored bounds them by a memory quota).
const MAX_QUEUED_EVENTS: usize = 4096;

enum QueuedFrame {
    Reply(Vec<u8>),
    Event(Vec<u8>),
}

struct Queue {
    items: VecDeque<QueuedFrame>,
    /// Queued event frames, to drop duplicates as xenstored does.
    pending_events: HashMap<Vec<u8>, usize>,
    /// How many events `items` holds.
    queued_events: usize,
    /// Set once the connection is torn down: nothing more is queued or sent.
    closed: bool,
    /// Set when the client finished sending: flush what is queued, then close.
    draining: bool,
}

/// The daemon's handle on a connected client.
pub(crate) struct ConnIo {
    pub id: XsConnId,
    pub domid: DomId,
    stream: UnixStream,
    queue: Mutex<Queue>,
    ready: Condvar,
    /// Mirrors `Queue::closed` for readers that must not take the queue lock.
    closed: AtomicBool,
}

impl ConnIo {
    pub fn new(id: XsConnId, domid: DomId, stream: UnixStream) -> ConnIo {
        ConnIo {
            id,
            domid,
            stream,
            queue: Mutex::new(Queue {
                items: VecDeque::new(),
                pending_events: HashMap::new(),
                queued_events: 0,
                closed: false,
                draining: false,
            }),
            ready: Condvar::new(),
            closed: AtomicBool::new(false),
        }
    }

    /// Queue a reply; counted as outstanding until the writer takes it.
    pub fn push_reply(&self, frame: Vec<u8>, outstanding: &Outstanding) {
        let mut q = lock(&self.queue);
        if q.closed {
            return;
        }
        outstanding.add(self.domid, 1);
        q.items.push_back(QueuedFrame::Reply(frame));
        self.ready.notify_one();
    }

    /// Queue a watch event unless an identical one is still waiting (not for `@`
    /// events, which xenstored never merges) or too many are.
    pub fn push_event(&self, frame: Vec<u8>, special: bool) {
        let mut q = lock(&self.queue);
        if q.closed || q.draining {
            return;
        }
        if !special && q.pending_events.contains_key(&frame) {
            return;
        }
        if !perms::privileged(self.domid) && q.queued_events >= MAX_QUEUED_EVENTS {
            tracing::warn!(
                conn = self.id,
                domid = self.domid,
                "watch event queue full, event dropped"
            );
            return;
        }
        *q.pending_events.entry(frame.clone()).or_insert(0) += 1;
        q.queued_events += 1;
        q.items.push_back(QueuedFrame::Event(frame));
        self.ready.notify_one();
    }

    /// Tear the connection down now: queued output is discarded and both directions of
    /// the socket are shut, which ends the reader and writer threads.
    pub fn close(&self, outstanding: &Outstanding) {
        let dropped_replies = {
            let mut q = lock(&self.queue);
            if q.closed {
                return;
            }
            q.closed = true;
            self.closed.store(true, Ordering::Release);
            let n = q
                .items
                .iter()
                .filter(|i| matches!(i, QueuedFrame::Reply(_)))
                .count();
            q.items.clear();
            q.pending_events.clear();
            q.queued_events = 0;
            self.ready.notify_all();
            n
        };
        outstanding.add(self.domid, -(dropped_replies as isize));
        let _ = self.stream.shutdown(Shutdown::Both);
        // A reader waiting for room sees the connection closed.
        outstanding.wake();
    }

    /// The client will send nothing more: deliver what is queued, then close.
    pub fn finish(&self) {
        let mut q = lock(&self.queue);
        q.draining = true;
        self.ready.notify_all();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn send(&self, bytes: &[u8]) -> std::io::Result<()> {
        // MSG_NOSIGNAL: a vanished client is an error here, not a SIGPIPE.
        let mut rest = bytes;
        while !rest.is_empty() {
            match socket::send(self.stream.as_raw_fd(), rest, MsgFlags::MSG_NOSIGNAL) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => rest = &rest[n..],
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// The writer thread: send queued frames in order until closed.
    pub fn run_writer(&self, outstanding: &Outstanding) {
        loop {
            let item = {
                let mut q = lock(&self.queue);
                loop {
                    if q.closed {
                        return;
                    }
                    if let Some(item) = q.items.pop_front() {
                        // A reply leaves the count as it leaves the queue, under the
                        // queue's lock: `close` counts the queued ones under it, so a reply
                        // being written when the domain is released is not counted twice
                        // or left over. The request reader waiting for room hears of it
                        // now (`add`), not once the write ends: a client that reads
                        // nothing blocks that write, and its quota must still fill up.
                        if matches!(item, QueuedFrame::Reply(_)) {
                            outstanding.add(self.domid, -1);
                        }
                        if let QueuedFrame::Event(f) = &item {
                            q.queued_events = q.queued_events.saturating_sub(1);
                            if let Some(n) = q.pending_events.get_mut(f) {
                                *n -= 1;
                                if *n == 0 {
                                    q.pending_events.remove(f);
                                }
                            }
                        }
                        break item;
                    }
                    if q.draining {
                        drop(q);
                        self.close(outstanding);
                        return;
                    }
                    q = self.ready.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            let bytes = match &item {
                QueuedFrame::Reply(b) | QueuedFrame::Event(b) => b,
            };
            if let Err(e) = self.send(bytes) {
                tracing::debug!(conn = self.id, error = %e, "client gone while sending");
                self.close(outstanding);
                return;
            }
        }
    }
}

/// Replies queued but not yet written, per domain. An unprivileged domain at its
/// quota has no further requests read until some are delivered, as xenstored stops
/// reading from a domain with too many outstanding requests.
#[derive(Default)]
pub(crate) struct Outstanding {
    counts: Mutex<HashMap<DomId, usize>>,
    changed: Condvar,
}

impl Outstanding {
    fn add(&self, domid: DomId, delta: isize) {
        if delta == 0 {
            return;
        }
        let mut c = lock(&self.counts);
        let v = c.entry(domid).or_insert(0);
        *v = v.saturating_add_signed(delta);
        if *v == 0 {
            c.remove(&domid);
        }
        if delta < 0 {
            self.changed.notify_all();
        }
    }

    fn wake(&self) {
        let _g = lock(&self.counts);
        self.changed.notify_all();
    }

    pub fn of(&self, domid: DomId) -> usize {
        lock(&self.counts).get(&domid).copied().unwrap_or(0)
    }

    /// Wait until `conn`'s domain is below `limit` outstanding replies; false if the
    /// connection closed meanwhile.
    pub fn wait_below(&self, conn: &ConnIo, limit: usize) -> bool {
        let mut c = lock(&self.counts);
        loop {
            if conn.is_closed() {
                return false;
            }
            if perms::privileged(conn.domid) || c.get(&conn.domid).copied().unwrap_or(0) < limit {
                return true;
            }
            c = self.changed.wait(c).unwrap_or_else(|p| p.into_inner());
        }
    }
}

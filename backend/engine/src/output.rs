//! What the engine produces and the daemon collects: frames for the NIC, frames looped
//! back to co-located guests, events for endpoint rings, and host replies for the peer
//! service. Frame buffers are recycled so steady traffic allocates nothing.

use std::collections::{HashMap, VecDeque};

use xmx_wire::msg::Event;
use xmx_wire::mxoe::{FrameRepr, Mac, ETH_FRAME_LEN_MIN};

use super::GuestId;

/// A frame to put on the NIC. Hand it back with [`Engine::recycle`](super::Engine::recycle)
/// once sent so its buffer is reused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// The whole Ethernet frame (no FCS), padded to the Ethernet minimum.
    pub bytes: Vec<u8>,
}

/// An event for one endpoint's event ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestEvent {
    /// The guest.
    pub guest: GuestId,
    /// Its endpoint.
    pub endpoint: u8,
    /// The event to write in the ring.
    pub event: Event,
}

/// A HOST_REPLY received by one of our guests, for the peer service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostReply {
    /// The guest whose MAC the reply was addressed to.
    pub guest: GuestId,
    /// The replying board.
    pub from: Mac,
    /// The replier's index for the guest in its own peer table.
    pub reverse_index: u16,
    /// The hostname, up to its NUL terminator, as carried (may not be UTF-8).
    pub hostname: Vec<u8>,
}

/// Where a frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// Out of the NIC.
    Wire,
    /// Back into the engine, for a co-located guest.
    Local,
}

pub(crate) struct Output {
    pool: Vec<Vec<u8>>,
    pool_size: usize,
    pub tx: VecDeque<(GuestId, Vec<u8>)>,
    max_tx_frames: usize,
    pub loopback: VecDeque<Vec<u8>>,
    events: VecDeque<GuestEvent>,
    pending: HashMap<(GuestId, u8), usize>,
    max_pending: usize,
    pub host_replies: VecDeque<HostReply>,
    pub max_host_replies: usize,
}

impl Output {
    pub fn new(
        pool_size: usize,
        max_tx_frames: usize,
        max_pending: usize,
        max_host_replies: usize,
    ) -> Self {
        Output {
            pool: Vec::new(),
            pool_size,
            tx: VecDeque::new(),
            max_tx_frames,
            loopback: VecDeque::new(),
            events: VecDeque::new(),
            pending: HashMap::new(),
            max_pending,
            host_replies: VecDeque::new(),
            max_host_replies,
        }
    }

    /// Emit `frame` into a pooled buffer, zero-padded to the Ethernet minimum.
    pub fn build(&mut self, frame: &FrameRepr) -> xmx_wire::Result<Vec<u8>> {
        let mut buf = self.pool.pop().unwrap_or_default();
        buf.clear();
        buf.resize(frame.buffer_len().max(ETH_FRAME_LEN_MIN), 0);
        match frame.emit(&mut buf) {
            Ok(_) => Ok(buf),
            Err(e) => {
                self.recycle(buf);
                Err(e)
            }
        }
    }

    /// Keep a buffer for a later frame.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if self.pool.len() < self.pool_size {
            self.pool.push(buf);
        }
    }

    /// True if the NIC queue has room for another frame.
    pub fn tx_has_room(&self) -> bool {
        self.tx.len() < self.max_tx_frames
    }

    /// Queue a completion: never refused, the library waits for it.
    pub fn completion(&mut self, guest: GuestId, endpoint: u8, event: Event) {
        *self.pending.entry((guest, endpoint)).or_default() += 1;
        self.events.push_back(GuestEvent {
            guest,
            endpoint,
            event,
        });
    }

    /// True if an unsolicited event for the endpoint would be accepted.
    pub fn has_event_room(&self, guest: GuestId, endpoint: u8) -> bool {
        self.pending.get(&(guest, endpoint)).copied().unwrap_or(0) < self.max_pending
    }

    /// Queue an unsolicited event (check [`Output::has_event_room`] first).
    pub fn unsolicited(&mut self, guest: GuestId, endpoint: u8, event: Event) {
        self.completion(guest, endpoint, event);
    }

    pub fn pop_event(&mut self) -> Option<GuestEvent> {
        let e = self.events.pop_front()?;
        if let Some(n) = self.pending.get_mut(&(e.guest, e.endpoint)) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.pending.remove(&(e.guest, e.endpoint));
            }
        }
        Some(e)
    }

    /// Forget the events of an endpoint (`None`: of every endpoint) of a guest.
    pub fn purge_events(&mut self, guest: GuestId, endpoint: Option<u8>) {
        let selected =
            |g: GuestId, ep: u8| g == guest && (endpoint.is_none() || endpoint == Some(ep));
        self.events.retain(|e| !selected(e.guest, e.endpoint));
        self.pending.retain(|&(g, ep), _| !selected(g, ep));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xmx_wire::msg::{DoneStatus, EventBody};

    fn done(tag: u32) -> Event {
        Event {
            tag,
            body: EventBody::SendDone {
                status: DoneStatus::Success,
                length: 0,
            },
        }
    }

    #[test]
    fn unsolicited_events_are_bounded_per_endpoint() {
        let mut out = Output::new(4, 4, 2, 4);
        let g = GuestId(1);
        out.unsolicited(g, 0, done(0));
        out.unsolicited(g, 0, done(1));
        assert!(!out.has_event_room(g, 0));
        assert!(out.has_event_room(g, 1));
        out.completion(g, 0, done(2));
        assert_eq!(out.pop_event().unwrap().event.tag, 0);
        assert!(!out.has_event_room(g, 0));
        out.pop_event();
        assert!(out.has_event_room(g, 0));
        out.unsolicited(g, 1, done(3));
        out.purge_events(g, Some(0));
        assert_eq!(out.pop_event().unwrap().endpoint, 1);
        assert!(out.pop_event().is_none());
    }
}

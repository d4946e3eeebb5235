//! A deterministic simulated network for endpoint tests.
//!
//! Endpoints sit on hosts (peer indexes); frames travel through a channel that
//! loses, duplicates and delays them at random from a seeded generator, so
//! reordering emerges from the delays. Time is virtual: the simulation jumps
//! to the next frame arrival or endpoint timer. The same seed always replays
//! the same run.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use xmx_mx::frame::Nack;
use xmx_mx::{
    Body, Endpoint, EndpointEvent, Frame, Instant, NackType, PeerAddr, PullNeeded, RdmaWindow,
    RecvDone, Status,
};

/// The seeded generator that picks losses and delays: a seed replays a run.
pub use fastrand::Rng;

/// What the channel does to frames.
#[derive(Clone, Debug)]
pub struct SimChannel {
    pub loss: f64,
    pub dup: f64,
    pub delay_min: Duration,
    pub delay_max: Duration,
}

impl SimChannel {
    pub fn perfect() -> Self {
        SimChannel {
            loss: 0.0,
            dup: 0.0,
            delay_min: Duration::from_micros(10),
            delay_max: Duration::from_micros(10),
        }
    }

    pub fn lossy(loss: f64, dup: f64, jitter: Duration) -> Self {
        SimChannel {
            loss,
            dup,
            delay_min: Duration::from_micros(10),
            delay_max: Duration::from_micros(10) + jitter,
        }
    }
}

/// One endpoint in the simulation and what it reported.
pub struct SimNode {
    pub host: u16,
    pub ep: Endpoint,
    pub events: Vec<EndpointEvent>,
    /// Frames this node emitted, by kind, for assertions.
    pub sent_frames: u64,
    /// Closed with this linger: its port stays open while
    /// [`Endpoint::linger_until`] lies ahead; afterwards the NIC refuses
    /// what arrives for it, as the engine does.
    pub closed: Option<Duration>,
}

impl SimNode {
    /// Whether the port is closed for good at `now`.
    fn port_closed(&self, now: Instant) -> bool {
        self.closed
            .is_some_and(|l| !matches!(self.ep.linger_until(l), Some(t) if t > now))
    }
}

impl SimNode {
    pub fn addr(&self) -> PeerAddr {
        PeerAddr::new(self.host, self.ep.index())
    }

    /// Removes and returns the events for which `pick` holds.
    pub fn take_events(
        &mut self,
        mut pick: impl FnMut(&EndpointEvent) -> bool,
    ) -> Vec<EndpointEvent> {
        let (taken, kept) = std::mem::take(&mut self.events)
            .into_iter()
            .partition(|e| pick(e));
        self.events = kept;
        taken
    }
}

/// A scripted loss: given the sending host and the frame, whether to lose it.
pub type LoseFn = Box<dyn FnMut(u16, &Frame<Vec<u8>>) -> bool>;

struct InFlight {
    to: PeerAddr,
    frame: Frame<Vec<u8>>,
}

/// The simulation.
pub struct Sim {
    pub now: Instant,
    pub nodes: Vec<SimNode>,
    pub rng: Rng,
    pub channel: SimChannel,
    /// Drop every frame from now on.
    pub blackhole: bool,
    /// Arrival time and tie-break sequence -> frame.
    in_flight: BTreeMap<(Instant, u64), InFlight>,
    seq: u64,
    pub delivered: u64,
    pub dropped: u64,
    /// Memory of registered LARGE windows: (host, endpoint, window id) -> data.
    pub windows: HashMap<(u16, u8, u8), Vec<u8>>,
    /// Where each receive's pulled data lands: (node, request) -> bytes.
    pub pulled: HashMap<(usize, u64), Vec<u8>>,
    /// Answer pulls automatically.
    pub auto_pull: bool,
    /// Print every frame and event (debugging aid).
    pub trace: bool,
    /// Decides, for each frame a host sends, whether the channel loses it
    /// (on top of the random losses): scripted losses.
    pub lose: Option<LoseFn>,
}

impl Sim {
    pub fn new(seed: u64, channel: SimChannel) -> Self {
        Sim {
            now: Instant::ZERO,
            nodes: Vec::new(),
            rng: Rng::with_seed(seed),
            channel,
            blackhole: false,
            in_flight: BTreeMap::new(),
            seq: 0,
            delivered: 0,
            dropped: 0,
            windows: HashMap::new(),
            pulled: HashMap::new(),
            auto_pull: true,
            trace: false,
            lose: None,
        }
    }

    /// Adds an endpoint on host `host`; returns its node index.
    pub fn add(&mut self, host: u16, ep: Endpoint) -> usize {
        self.nodes.push(SimNode {
            host,
            ep,
            events: Vec::new(),
            sent_frames: 0,
            closed: None,
        });
        self.nodes.len() - 1
    }

    pub fn addr(&self, node: usize) -> PeerAddr {
        self.nodes[node].addr()
    }

    fn node_at(&self, addr: PeerAddr) -> Option<usize> {
        self.nodes.iter().position(|n| n.addr() == addr)
    }

    /// The first `p.length` bytes (fewer if it is shorter) of the window a pull names;
    /// `None` if no such window was registered.
    fn window_bytes(&self, p: &PullNeeded) -> Option<Vec<u8>> {
        let key = (
            p.source.peer.peer_index,
            p.source.peer.endpoint,
            p.window.id,
        );
        let d = self.windows.get(&key)?;
        Some(d[..(p.length as usize).min(d.len())].to_vec())
    }

    /// Puts every frame node `i` has ready on the simulated network.
    fn transmit_all(&mut self, i: usize) {
        while let Some(frame) = self.nodes[i].ep.poll_transmit() {
            self.nodes[i].sent_frames += 1;
            let src_host = self.nodes[i].host;
            self.submit(src_host, frame);
        }
    }

    /// Collects every frame and event the endpoints have ready.
    pub fn pump(&mut self) {
        for i in 0..self.nodes.len() {
            self.transmit_all(i);
            while let Some(ev) = self.nodes[i].ep.poll_event() {
                if self.trace {
                    println!("{:?} node {i} event {:?}", self.now, ev);
                }
                if let EndpointEvent::EarlyPullNeeded(p) = &ev {
                    if self.auto_pull {
                        let data = self
                            .window_bytes(p)
                            .filter(|d| d.len() == p.length as usize)
                            .ok_or(Status::BadRdmawin);
                        let now = self.now;
                        // Gone if its partner's connection was reset meanwhile.
                        let _ = self.nodes[i].ep.early_pull_done(now, p.id, data);
                        self.nodes[i].events.push(ev);
                        self.transmit_all(i);
                        continue;
                    }
                }
                if let EndpointEvent::RecvDone(r) = &ev {
                    // Pulled before its receive: the bytes come with the receive, and
                    // tests find them where a pull into the receive's buffer puts them.
                    if r.msg_length as usize > xmx_mx::MEDIUM_MAX && !r.data.is_empty() {
                        self.pulled.insert((i, r.id.0), r.data.clone());
                    }
                }
                if let EndpointEvent::PullNeeded(p) = &ev {
                    if self.auto_pull {
                        let data = self.window_bytes(p);
                        let status = if data.is_some() {
                            Status::Success
                        } else {
                            Status::BadRdmawin
                        };
                        self.pulled.insert((i, p.id.0), data.unwrap_or_default());
                        let now = self.now;
                        self.nodes[i]
                            .ep
                            .pull_done(now, p.id, status)
                            .expect("pull_done");
                        self.nodes[i].events.push(ev);
                        // pull_done may have queued a NOTIFY.
                        self.transmit_all(i);
                        continue;
                    }
                }
                self.nodes[i].events.push(ev);
            }
        }
    }

    fn submit(&mut self, src_host: u16, mut frame: Frame<Vec<u8>>) {
        if self.trace {
            println!("{:?} host {src_host} sends {:?}", self.now, frame);
        }
        let to = frame.destination();
        let scripted = self
            .lose
            .as_mut()
            .is_some_and(|lose| lose(src_host, &frame));
        if scripted || self.blackhole || self.rng.f64() < self.channel.loss {
            self.dropped += 1;
            return;
        }
        // The receiver sees the sender's host in the peer index.
        frame.peer_index = src_host;
        let copies = if self.rng.f64() < self.channel.dup {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let span = self
                .channel
                .delay_max
                .saturating_sub(self.channel.delay_min)
                .as_nanos() as u64;
            let delay = self.channel.delay_min
                + Duration::from_nanos(if span == 0 {
                    0
                } else {
                    self.rng.u64(0..span + 1)
                });
            self.seq += 1;
            self.in_flight.insert(
                (self.now + delay, self.seq),
                InFlight {
                    to,
                    frame: frame.clone(),
                },
            );
        }
    }

    /// Closes node `node`'s endpoint, its port lingering for up to
    /// `linger` after the last frame it heard (as the library does), then
    /// closed for good: the NIC refuses messages, NOTIFYs and connects for
    /// it with `ENDPT_CLOSED`.
    ///
    /// First, as the library does, the endpoint waits (for at most its
    /// settle limit) until its NOTIFYs are acked and its held sends left.
    pub fn close(&mut self, node: usize, linger: Duration) {
        let settle = self.now + self.nodes[node].ep.settle_limit();
        self.run_until(settle, |s| {
            let ep = &s.nodes[node].ep;
            ep.unacked_notifies() + ep.held_sends() == 0
        });
        let now = self.now;
        let n = &mut self.nodes[node];
        n.ep.close(now);
        n.closed = Some(linger);
    }

    fn refuse_for_closed(&mut self, node: usize, frame: &Frame<Vec<u8>>) {
        self.dropped += 1;
        let lib_seqnum = match &frame.body {
            Body::Message(m) => m.seqnum,
            Body::Notify(n) => n.seqnum,
            Body::ConnectRequest(_) => xmx_mx::Seqnum::from_raw(0),
            _ => return,
        };
        let n = &self.nodes[node];
        let nack = Frame {
            peer_index: frame.peer_index,
            dst_endpoint: frame.src_endpoint,
            src_endpoint: n.ep.index(),
            body: Body::Nack(Nack {
                nack_type: NackType::EndpointClosed.to_wire(),
                lib_seqnum,
            }),
        };
        let host = n.host;
        self.submit(host, nack);
    }

    /// Injects a frame as if `from` had sent it.
    pub fn inject(&mut self, from_host: u16, frame: Frame<Vec<u8>>) {
        self.submit(from_host, frame);
    }

    /// The earliest pending frame arrival or endpoint timer.
    pub fn next_instant(&self) -> Option<Instant> {
        let frames = self.in_flight.keys().next().map(|k| k.0);
        let timers = self.nodes.iter().filter_map(|n| n.ep.next_timeout()).min();
        match (frames, timers) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Advances to the next instant something happens and handles it.
    /// Returns false when nothing is left to happen.
    pub fn step(&mut self) -> bool {
        self.pump();
        let Some(next) = self.next_instant() else {
            return false;
        };
        self.now = self.now.max(next);
        let now = self.now;
        let due: Vec<(Instant, u64)> = self
            .in_flight
            .range(..=(now, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in due {
            let Some(f) = self.in_flight.remove(&k) else {
                continue;
            };
            match self.node_at(f.to) {
                Some(i) if self.nodes[i].port_closed(now) => {
                    self.refuse_for_closed(i, &f.frame);
                }
                Some(i) => {
                    self.delivered += 1;
                    self.nodes[i].ep.handle_frame(now, f.frame.as_borrowed());
                }
                None => self.dropped += 1,
            }
        }
        for n in &mut self.nodes {
            if n.ep.next_timeout().is_some_and(|t| t <= now) {
                n.ep.handle_timeout(now);
            }
        }
        self.pump();
        true
    }

    /// Steps until `done` holds (true) or nothing is left / `limit` passes (false).
    pub fn run_until(&mut self, limit: Instant, mut done: impl FnMut(&mut Sim) -> bool) -> bool {
        let mut steps = 0u64;
        loop {
            self.pump();
            if done(self) {
                return true;
            }
            match self.next_instant() {
                Some(t) if t <= limit => {}
                _ => return false,
            }
            steps += 1;
            assert!(steps < 50_000_000, "simulation does not converge");
            self.step();
        }
    }

    /// Runs until nothing is left to happen or `limit`.
    pub fn run_to_quiescence(&mut self, limit: Instant) {
        self.run_until(limit, |_| false);
    }

    /// Connects `a` to `b` with key `key`, running the simulation until done.
    /// Runs what is due now, then takes `node`'s completed receives, in the
    /// order they completed.
    pub fn recv_dones(&mut self, node: usize) -> Vec<RecvDone> {
        self.pump();
        self.nodes[node]
            .take_events(|e| matches!(e, EndpointEvent::RecvDone(_)))
            .into_iter()
            .filter_map(|e| match e {
                EndpointEvent::RecvDone(r) => Some(r),
                _ => None,
            })
            .collect()
    }

    /// Runs what is due now, then takes `node`'s completed sends (request
    /// number and status), in the order they completed.
    pub fn send_dones(&mut self, node: usize) -> Vec<(u64, Status)> {
        self.pump();
        self.nodes[node]
            .take_events(|e| matches!(e, EndpointEvent::SendDone { .. }))
            .into_iter()
            .filter_map(|e| match e {
                EndpointEvent::SendDone { id, status, .. } => Some((id.0, status)),
                _ => None,
            })
            .collect()
    }

    pub fn connect(&mut self, a: usize, b: usize, key: u32) -> Status {
        let to = self.addr(b);
        let now = self.now;
        let id = self.nodes[a].ep.connect(now, to, key);
        let limit = self.now + Duration::from_secs(100_000);
        let mut status = None;
        self.run_until(limit, |s| {
            for e in s.nodes[a]
                .take_events(|e| matches!(e, EndpointEvent::Connected { id: x, .. } if *x == id))
            {
                if let EndpointEvent::Connected { status: st, .. } = e {
                    status = Some(st);
                }
            }
            status.is_some()
        });
        status.expect("connect did not complete")
    }

    /// Registers a LARGE window on node `node`.
    pub fn register_window(&mut self, node: usize, window: RdmaWindow, data: Vec<u8>) {
        let a = self.addr(node);
        self.windows
            .insert((a.peer_index, a.endpoint, window.id), data);
    }
}

/// Whether a frame is a message frame (TINY/SMALL/MEDIUM/RNDV).
pub fn is_message<B>(f: &Frame<B>) -> bool {
    matches!(f.body, Body::Message(_))
}

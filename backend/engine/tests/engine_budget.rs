//! The host-wide pull budget: a lone pull gets a deep pipeline, many pulls share the
//! budget, the PULL_REPLY frames in flight towards the pulling host never exceed it under
//! any interleaving of the two hosts, lost frames are requested again within bounds, no
//! pull starves, and guests get shares of the budget in proportion to their weights.
//!
//! Host A's guests pull from host B's; frames cross two FIFO wires whose steps (transmit,
//! deliver, in either direction) a seeded generator interleaves.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use xmx_engine::{
    ClusterId, EndpointConfig, Engine, EngineConfig, GuestConfig, GuestId, InMemoryGuest,
    MemoryArea, PeerEntry, RegionHandle,
};
use xmx_wire::msg::{DoneStatus, EventBody, Pull, Route, SendOp, SendRequest};
use xmx_wire::mxoe::{FrameRepr, Mac, PacketRepr};

const EP: u8 = 0;
const SOURCE_REGION: u8 = 1;
const SINK_REGION: u8 = 2;
const REGION_HANDLE: u64 = 10;
const BLOCK_FRAMES: u32 = 8;

fn mac(host: u8, n: u16) -> Mac {
    let [hi, lo] = n.to_be_bytes();
    Mac([0x02, 0x16, 0x3e, host, hi, lo])
}

fn data_of(pair: u16, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761) as u8 ^ pair as u8)
        .collect()
}

/// `pairs` guests on host A (ids 1000+i), each pulling `length` bytes from its partner on
/// host B (ids 2000+i).
struct Hosts {
    a: Engine,
    b: Engine,
    now: Instant,
    pairs: u16,
    length: usize,
    sinks: Vec<InMemoryGuest>,
    /// Frames A sent not yet delivered to B, and the reverse.
    a_to_b: VecDeque<Vec<u8>>,
    b_to_a: VecDeque<Vec<u8>>,
    /// Most PULL_REPLY frames seen on their way to A at once (B's queue and the wire).
    max_replies_in_transit: usize,
    /// Reply bytes delivered to each guest of A.
    delivered: HashMap<Mac, u64>,
    /// Pulls done, by guest of A, with their status.
    done: HashMap<GuestId, DoneStatus>,
    lost: usize,
}

fn puller(i: u16) -> GuestId {
    GuestId(1000 + u32::from(i))
}

impl Hosts {
    fn new(config: EngineConfig, pairs: u16, length: usize) -> Self {
        let mut a = Engine::new(config.clone());
        let mut b = Engine::new(config);
        let mut table = vec![];
        let mut sinks = vec![];
        for i in 0..pairs {
            for (host, engine) in [(0u8, &mut a), (1u8, &mut b)] {
                let id = GuestId(1000 * (u32::from(host) + 1) + u32::from(i));
                let mem = InMemoryGuest::new();
                let bytes = if host == 0 {
                    vec![0; length]
                } else {
                    data_of(i, length)
                };
                mem.add_area_with(MemoryArea::Region(RegionHandle(REGION_HANDLE)), bytes);
                engine
                    .add_guest(GuestConfig {
                        id,
                        mac: mac(host, i),
                        cluster: ClusterId(1),
                        hostname: format!("h{host}g{i}:0"),
                        memory: Box::new(mem.clone()),
                    })
                    .unwrap();
                engine
                    .open_endpoint(
                        id,
                        EP,
                        EndpointConfig {
                            session_id: id.0,
                            send_queue_slots: 1,
                            recv_queue_slots: 1,
                        },
                    )
                    .unwrap();
                let region = if host == 0 {
                    SINK_REGION
                } else {
                    SOURCE_REGION
                };
                engine
                    .register_region(id, EP, region, RegionHandle(REGION_HANDLE), length as u64)
                    .unwrap();
                table.push(PeerEntry {
                    index: u16::from(host) * pairs + i,
                    mac: mac(host, i),
                    hostname: format!("h{host}g{i}:0"),
                    cluster: ClusterId(1),
                });
                if host == 0 {
                    sinks.push(mem);
                }
            }
        }
        a.set_peers(table.clone()).unwrap();
        b.set_peers(table).unwrap();
        Hosts {
            a,
            b,
            now: Instant::now(),
            pairs,
            length,
            sinks,
            a_to_b: VecDeque::new(),
            b_to_a: VecDeque::new(),
            max_replies_in_transit: 0,
            delivered: HashMap::new(),
            done: HashMap::new(),
            lost: 0,
        }
    }

    fn set_weight(&mut self, i: u16, weight: u32) {
        self.a.set_guest_weight(puller(i), weight).unwrap();
    }

    /// Guest `i` of A asks its engine to pull its partner's whole region.
    fn start_pull(&mut self, i: u16) {
        let request = SendRequest {
            tag: u32::from(i),
            route: Route {
                peer_index: self.pairs + i,
                endpoint: EP,
                session_id: 2000 + u32::from(i),
            },
            op: SendOp::Pull(Pull {
                length: self.length as u32,
                local_region: SINK_REGION,
                local_offset: 0,
                remote_region: SOURCE_REGION,
                remote_region_seqnum: 0,
                remote_offset: 0,
            }),
        };
        self.a
            .handle_send(self.now, puller(i), EP, &request)
            .unwrap();
        self.check();
    }

    fn check(&mut self) {
        let budget = self.a.pull_frame_budget();
        assert!(
            self.a.pull_frames_in_flight() <= budget,
            "{} frames held, budget {budget}",
            self.a.pull_frames_in_flight()
        );
        let in_transit = self.b.pending_transmits() + self.b_to_a.len();
        self.max_replies_in_transit = self.max_replies_in_transit.max(in_transit);
        while let Some(ev) = self.a.poll_event() {
            if let EventBody::PullDone { status, length } = ev.event.body {
                if status == DoneStatus::Success {
                    assert_eq!(length as usize, self.length);
                }
                assert!(
                    self.done.insert(ev.guest, status).is_none(),
                    "one PULL_DONE"
                );
            }
        }
    }

    /// One step chosen by `rng` among those that can move; false if none can.
    fn step(&mut self, rng: &mut fastrand::Rng, lose: &mut impl FnMut(&[u8]) -> bool) -> bool {
        let can = [
            self.a.pending_transmits() > 0,
            !self.a_to_b.is_empty(),
            self.b.pending_transmits() > 0,
            !self.b_to_a.is_empty(),
        ];
        let choices: Vec<usize> = (0..4).filter(|&k| can[k]).collect();
        if choices.is_empty() {
            return false;
        }
        let now = self.now;
        match choices[rng.usize(0..choices.len())] {
            0 => {
                let t = self.a.poll_transmit().unwrap();
                self.a_to_b.push_back(t.bytes.clone());
                self.a.recycle(t);
            }
            1 => {
                let f = self.a_to_b.pop_front().unwrap();
                self.b.handle_frame(now, &f);
            }
            2 => {
                let t = self.b.poll_transmit().unwrap();
                self.b_to_a.push_back(t.bytes.clone());
                self.b.recycle(t);
            }
            _ => {
                let f = self.b_to_a.pop_front().unwrap();
                if lose(&f) {
                    self.lost += 1;
                } else {
                    let repr = FrameRepr::parse(&f).unwrap();
                    if let PacketRepr::PullReply(r) = repr.packet {
                        *self.delivered.entry(repr.head.dst).or_default() += r.data.len() as u64;
                    }
                    self.a.handle_frame(now, &f);
                }
            }
        }
        self.check();
        true
    }

    /// Run until every pull is done, firing timers when the wires are quiet.
    fn run(&mut self, seed: u64, mut lose: impl FnMut(&[u8]) -> bool) {
        let mut rng = fastrand::Rng::with_seed(seed);
        while self.done.len() < usize::from(self.pairs) {
            if self.step(&mut rng, &mut lose) {
                continue;
            }
            let at = self.a.poll_timeout().expect("a pull waits for time");
            self.now = self.now.max(at);
            self.a.handle_timeout(self.now);
            self.check();
        }
    }

    fn check_data(&self) {
        for i in 0..self.pairs {
            assert_eq!(self.done.get(&puller(i)), Some(&DoneStatus::Success));
            let got = self.sinks[usize::from(i)]
                .area(MemoryArea::Region(RegionHandle(REGION_HANDLE)))
                .unwrap();
            assert!(got == data_of(i, self.length), "pull {i}: bytes differ");
        }
    }
}

fn config(budget: u32) -> EngineConfig {
    EngineConfig {
        pull_frame_budget: budget,
        pull_retransmit_timeout: Duration::from_millis(10),
        ..EngineConfig::default()
    }
}

#[test]
fn a_lone_pull_gets_a_deep_pipeline() {
    let mut h = Hosts::new(config(512), 1, 4 << 20);
    h.start_pull(0);
    assert_eq!(h.a.pull_frames_in_flight(), 32 * BLOCK_FRAMES);
    assert_eq!(h.a.pending_transmits(), 32, "32 PULL requests at once");
    h.run(7, |_| false);
    h.check_data();
    assert_eq!(h.a.pull_frames_in_flight(), 0, "every frame given back");
}

#[test]
fn a_lone_guest_gets_the_whole_budget_whatever_its_weight() {
    let mut h = Hosts::new(config(128), 4, 1 << 20);
    for (i, w) in [(0, 8), (1, 8), (2, 8), (3, 1)] {
        h.set_weight(i, w);
    }
    h.start_pull(3);
    assert_eq!(h.a.pull_frames_in_flight(), 128);
    let mut rng = fastrand::Rng::with_seed(3);
    while h.done.is_empty() {
        assert!(h.step(&mut rng, &mut |_| false), "the wires went quiet");
        // Every retired block is granted again at once while data is left to request.
        let left = (1u64 << 20).div_ceil(4096) - h.a.pull_frames_granted(puller(3));
        if left >= 128 {
            assert_eq!(h.a.pull_frames_in_flight(), 128);
        }
    }
    assert_eq!(h.done.get(&puller(3)), Some(&DoneStatus::Success));
    assert_eq!(h.a.pull_frames_in_flight(), 0);
}

#[test]
fn many_pulls_share_the_budget_and_never_exceed_it_under_any_interleaving() {
    for seed in [1, 2, 3, 0x5eed] {
        let mut h = Hosts::new(config(96), 40, 200_000);
        for i in 0..40 {
            h.start_pull(i);
        }
        let held = h.a.pull_frames_in_flight();
        assert!(
            held + BLOCK_FRAMES > 96,
            "the budget is used up: {held} held"
        );
        h.run(seed, |_| false);
        h.check_data();
        assert!(
            h.max_replies_in_transit <= 96,
            "seed {seed}: {} replies towards A at once",
            h.max_replies_in_transit
        );
        let rerequests: u64 = (0..40)
            .map(|i| h.a.guest(puller(i)).unwrap().counters().pull_rerequests)
            .sum();
        assert_eq!(rerequests, 0, "a FIFO wire loses nothing");
        assert_eq!(h.a.pull_frames_in_flight(), 0);
    }
}

#[test]
fn no_pull_starves_when_pulls_outnumber_the_budget() {
    // 100 pulls, room for 4 blocks: every pull waits its turn, none times out.
    let mut h = Hosts::new(config(32), 100, 40_000);
    for i in 0..100 {
        h.start_pull(i);
    }
    h.run(11, |_| false);
    h.check_data();
    for i in 0..100 {
        let c = h.a.guest(puller(i)).unwrap().counters().clone();
        assert_eq!((c.pulls_done, c.pulls_failed, c.pull_rerequests), (1, 0, 0));
    }
}

#[test]
fn lost_replies_are_requested_again_within_the_budget() {
    let mut h = Hosts::new(config(64), 6, 300_000);
    for i in 0..6 {
        h.start_pull(i);
    }
    let mut n = 0u64;
    h.run(5, |f| {
        n += 1;
        matches!(
            FrameRepr::parse(f).unwrap().packet,
            PacketRepr::PullReply(_)
        ) && n.is_multiple_of(37)
    });
    h.check_data();
    assert!(h.lost > 0);
    let rerequests: u64 = (0..6)
        .map(|i| h.a.guest(puller(i)).unwrap().counters().pull_rerequests)
        .sum();
    assert!(rerequests > 0);
    assert!(
        rerequests <= h.lost as u64,
        "{rerequests} blocks requested again for {} lost frames",
        h.lost
    );
    // A block requested again brings back its frames that already arrived, never more.
    assert!(
        h.max_replies_in_transit as u64 <= 64 + u64::from(BLOCK_FRAMES) * rerequests,
        "{} replies in transit",
        h.max_replies_in_transit
    );
}

#[test]
fn weighted_guests_get_shares_of_the_budget_in_proportion() {
    let weights = [1u32, 1, 2, 4];
    let mut h = Hosts::new(config(128), 4, 16 << 20);
    for (i, &w) in weights.iter().enumerate() {
        h.set_weight(i as u16, w);
    }
    for i in 0..4 {
        h.start_pull(i);
    }
    // The first pull started alone and took the whole budget; shares are counted once
    // that head start has been handed back (twice the budget delivered), until the
    // heaviest guest's pull is done: all four pulled the whole time.
    let mut rng = fastrand::Rng::with_seed(99);
    let mut start: Option<HashMap<Mac, u64>> = None;
    while !h.done.contains_key(&puller(3)) {
        assert!(h.step(&mut rng, &mut |_| false), "the wires went quiet");
        if start.is_none() && h.delivered.values().sum::<u64>() >= 2 * 128 * 4096 {
            start = Some(h.delivered.clone());
        }
    }
    let start = start.unwrap();
    let got_of = |i: u16| h.delivered[&mac(0, i)] - start.get(&mac(0, i)).copied().unwrap_or(0);
    let total: u64 = (0..4).map(got_of).sum();
    let weight_sum: u32 = weights.iter().sum();
    for (i, &w) in weights.iter().enumerate() {
        let got = got_of(i as u16) as f64 / total as f64;
        let want = f64::from(w) / f64::from(weight_sum);
        assert!(
            (got / want - 1.0).abs() <= 0.10,
            "guest {i} (weight {w}): {got:.3} of the bytes, {want:.3} expected"
        );
    }
}

#[test]
fn weighted_senders_share_the_transmit_queue_in_proportion() {
    let weights = [1u32, 1, 2, 4];
    let mut h = Hosts::new(config(4 * 256), 4, 1 << 20);
    for (i, &w) in weights.iter().enumerate() {
        h.b.set_guest_weight(GuestId(2000 + i as u32), w).unwrap();
    }
    for i in 0..4 {
        h.start_pull(i);
    }
    // Every PULL reaches B before B sends anything: all four senders have a backlog.
    while let Some(t) = h.a.poll_transmit() {
        h.b.handle_frame(h.now, &t.bytes);
        h.a.recycle(t);
    }
    assert_eq!(h.b.pending_transmits(), 4 * 256);
    let mut sent: HashMap<Mac, u64> = HashMap::new();
    for _ in 0..400 {
        let t = h.b.poll_transmit().unwrap();
        let repr = FrameRepr::parse(&t.bytes).unwrap();
        *sent.entry(repr.head.src).or_default() += t.bytes.len() as u64;
        h.b.recycle(t);
    }
    let total: u64 = sent.values().sum();
    for (i, &w) in weights.iter().enumerate() {
        let got = sent[&mac(1, i as u16)] as f64 / total as f64;
        let want = f64::from(w) / 8.0;
        assert!(
            (got / want - 1.0).abs() <= 0.10,
            "sender {i} (weight {w}): {got:.3} of the bytes, {want:.3} expected"
        );
    }
}

#[test]
fn closing_an_endpoint_or_removing_a_guest_gives_its_frames_to_waiting_pulls() {
    let mut h = Hosts::new(config(64), 3, 1 << 20);
    h.start_pull(0);
    h.start_pull(1);
    h.start_pull(2);
    assert_eq!(
        h.a.pull_frames_in_flight(),
        64,
        "pull 0 holds the whole budget"
    );
    assert_eq!(h.a.pull_frames_granted(puller(1)), 0, "pull 1 waits");
    h.a.close_endpoint(puller(0), EP).unwrap();
    assert_eq!(h.a.pull_frames_in_flight(), 64);
    assert_eq!(
        h.a.pull_frames_granted(puller(1)) + h.a.pull_frames_granted(puller(2)),
        64,
        "the closed endpoint's frames went to the waiting pulls"
    );
    h.a.remove_guest(puller(1)).unwrap();
    assert_eq!(h.a.pull_frames_granted(puller(2)), 64);
    // Replies for the closed and removed guests' blocks are dropped; pull 2 completes.
    h.done.insert(puller(0), DoneStatus::Aborted);
    h.done.insert(puller(1), DoneStatus::Aborted);
    h.run(13, |_| false);
    assert_eq!(h.done.get(&puller(2)), Some(&DoneStatus::Success));
    let got = h.sinks[2]
        .area(MemoryArea::Region(RegionHandle(REGION_HANDLE)))
        .unwrap();
    assert!(got == data_of(2, 1 << 20));
    assert_eq!(h.a.pull_frames_in_flight(), 0);
}

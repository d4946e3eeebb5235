//! LARGE messages: RNDV, then the receiver's engine pulls the data block by block
//! (PULL / PULL_REPLY) into the receiver's region; NOTIFY ends it. Between hosts and
//! between co-located guests, clean and under seeded loss.

mod engine_util;

use engine_util::*;
use xmx_engine::{DropReason, EngineConfig, MemoryArea, RegionHandle};
use xmx_wire::msg::{
    fill_marks, DoneStatus, Event, EventBody, LibackSend, NotifySend, Pull, RndvSend, SendOp,
    SendRequest,
};
use xmx_wire::mxoe::pull::PullPacket;
use xmx_wire::mxoe::{PacketRepr, PacketType, HEAD_LEN, PULL_LEN, PULL_REPLY_LEN};

const SENDER_REGION: u8 = 1;
const RECEIVER_REGION: u8 = 2;

/// One LARGE transfer from guest 1 to guest `to`, returning the testbed after RNDV and the
/// Pull request were handed over (nothing pumped after the Pull).
struct Large {
    tb: Testbed,
    to: u32,
    data: Vec<u8>,
    local_offset: u32,
    /// The lengths the pull's progress events told, in order.
    told: Vec<u32>,
}

impl Large {
    fn start(
        config: EngineConfig,
        to: u32,
        length: usize,
        remote_offset: u32,
        local_offset: u32,
    ) -> Self {
        Self::start_between(
            config.clone(),
            config,
            to,
            length,
            remote_offset,
            local_offset,
        )
    }

    /// [`Large::start`] with host 0 (the sender's) and host 1 configured apart.
    fn start_between(
        host0: EngineConfig,
        host1: EngineConfig,
        to: u32,
        length: usize,
        remote_offset: u32,
        local_offset: u32,
    ) -> Self {
        let mut tb = Testbed::with_configs(host0, host1);
        let data = pattern(length, 0x5a);
        let mut sender_region = vec![0u8; remote_offset as usize + length + 7];
        sender_region[remote_offset as usize..][..length].copy_from_slice(&data);
        tb.region(1, SENDER_REGION, 100, sender_region);
        tb.region(
            to,
            RECEIVER_REGION,
            200,
            vec![0u8; local_offset as usize + length],
        );

        let rndv = RndvSend {
            info: info(40),
            length: length as u32,
            region_id: SENDER_REGION,
            region_seqnum: 3,
            region_offset: remote_offset,
        };
        let route = tb.route(to);
        tb.send(
            1,
            SendRequest {
                tag: 1,
                route,
                op: SendOp::Rndv(rndv),
            },
        )
        .unwrap();
        tb.pump();
        assert_eq!(tb.take_events(1), vec![send_done(1, 0)]);
        let ev = tb.take_events(to);
        assert_eq!(ev.len(), 1);
        let EventBody::RecvRndv { from, rndv: got } = ev[0].body else {
            panic!("{ev:?}")
        };
        assert_eq!(got, rndv);
        assert_eq!(from.peer_index, tb.guest(1).peer_index);

        // The receiver's library matched the message and asks to pull it.
        let pull = Pull {
            length: length as u32,
            local_region: RECEIVER_REGION,
            local_offset,
            remote_region: got.region_id,
            remote_region_seqnum: got.region_seqnum,
            remote_offset: got.region_offset,
        };
        let back = tb.route(1);
        tb.send(
            to,
            SendRequest {
                tag: 2,
                route: back,
                op: SendOp::Pull(pull),
            },
        )
        .unwrap();
        Large {
            tb,
            to,
            data,
            local_offset,
            told: Vec::new(),
        }
    }

    /// The receiver's PULL_DONE, once it arrived.
    fn pull_done(&mut self) -> Option<Event> {
        self.tb.collect_events();
        let id = self.tb.guest(self.to).id;
        loop {
            let pos = self.tb.events.iter().position(|e| e.guest == id)?;
            let event = self.tb.events.remove(pos).event;
            let EventBody::PullProgress { length } = event.body else {
                return Some(event);
            };
            self.check_progress(event.tag, length);
        }
    }

    /// A progress event of the pull: for its tag, beyond the one before, short of the
    /// whole (its completion tells that), and the bytes it counts are there.
    fn check_progress(&mut self, tag: u32, length: u32) {
        assert_eq!(tag, 2, "progress of the pull");
        let before = self.told.last().copied().unwrap_or(0);
        assert!(
            length > before,
            "progress only grows: {length} after {before}"
        );
        assert!(
            (length as usize) < self.data.len(),
            "{length} of {}",
            self.data.len()
        );
        let got = self.tb.region_bytes(self.to, 200);
        let start = self.local_offset as usize;
        assert!(
            got[start..][..length as usize] == self.data[..length as usize],
            "the {length} bytes told of are the message's"
        );
        self.told.push(length);
    }

    /// Check the received bytes, then NOTIFY the sender.
    fn finish(&mut self) {
        let got = self.tb.region_bytes(self.to, 200);
        let start = self.local_offset as usize;
        assert!(
            got[..start].iter().all(|&b| b == 0),
            "nothing written before the offset"
        );
        assert!(got[start..] == self.data[..], "received bytes differ");
        let notify = NotifySend {
            seqnum: 41,
            piggyack: 40,
            total_length: self.data.len() as u32,
            region_id: SENDER_REGION,
            region_seqnum: 3,
        };
        let back = self.tb.route(1);
        self.tb
            .send(
                self.to,
                SendRequest {
                    tag: 3,
                    route: back,
                    op: SendOp::Notify(notify),
                },
            )
            .unwrap();
        self.tb.pump();
        assert_eq!(self.tb.take_events(self.to), vec![send_done(3, 0)]);
        let ev = self.tb.take_events(1);
        assert_eq!(ev.len(), 1);
        let EventBody::RecvNotify { notify: got, .. } = ev[0].body else {
            panic!("{ev:?}")
        };
        assert_eq!(got, notify);
    }
}

fn success(length: usize) -> Event {
    Event {
        tag: 2,
        body: EventBody::PullDone {
            status: DoneStatus::Success,
            length: length as u32,
        },
    }
}

/// A clean transfer; checks every PULL and PULL_REPLY frame on the wire.
fn transfer(to: u32, length: usize, remote_offset: u32, local_offset: u32) {
    let mut l = Large::start(
        EngineConfig::default(),
        to,
        length,
        remote_offset,
        local_offset,
    );
    let before = l.tb.wire.len();
    l.tb.pump();
    assert_eq!(l.pull_done(), Some(success(length)));
    let local = l.tb.guest(to).host == l.tb.guest(1).host;
    let frames = &l.tb.wire[before..];
    if local {
        assert!(frames.is_empty(), "co-located pulls never touch the wire");
    } else {
        let replies: Vec<_> = frames
            .iter()
            .filter(|f| f.ptype() == PacketType::PullReply)
            .collect();
        let pulls: Vec<_> = frames
            .iter()
            .filter(|f| f.ptype() == PacketType::Pull)
            .collect();
        assert_eq!(pulls.len() + replies.len(), frames.len());
        let in_frame = remote_offset as usize % 4096;
        assert_eq!(replies.len(), (in_frame + length).div_ceil(4096));
        assert_eq!(pulls.len(), (in_frame + length).div_ceil(32768));
        let mut total = 0;
        for f in &replies {
            let PacketRepr::PullReply(r) = packet(f) else {
                unreachable!()
            };
            assert!(r.data.len() <= 4096);
            assert_eq!(
                f.parse().buffer_len(),
                HEAD_LEN + PULL_REPLY_LEN + r.data.len()
            );
            assert_eq!(f.parse().head.src, l.tb.guest(1).mac);
            let off = r.msg_offset as usize;
            assert_eq!(r.data, &l.data[off..off + r.data.len()]);
            total += r.data.len();
        }
        assert_eq!(total, length);
        for f in &pulls {
            let PacketRepr::Pull(p) = packet(f) else {
                unreachable!()
            };
            assert_eq!(f.parse().buffer_len(), HEAD_LEN + PULL_LEN);
            assert_eq!(f.bytes.len(), 60);
            assert!(p.replies() <= 8);
            assert_eq!(p.session, l.tb.guest(1).session);
            assert_eq!(p.total_length as usize, length);
            assert_eq!(u32::from(p.pulled_rdma_offset), remote_offset);
            assert_eq!(f.parse().head.src, l.tb.guest(to).mac);
        }
    }
    l.finish();
    assert_eq!(l.tb.engine(to).poll_timeout(), None, "no pull left");
}

#[test]
fn large_just_past_medium_between_hosts() {
    transfer(3, 32 * 1024 + 1024, 0, 0);
}

#[test]
fn large_with_unaligned_offsets_between_hosts() {
    transfer(3, 32 * 1024 + 1024, 100, 7);
    transfer(3, 200_000, 4095, 1);
}

#[test]
fn large_1mib_between_hosts() {
    transfer(3, 1 << 20, 0, 0);
}

#[test]
fn large_16mib_between_hosts() {
    transfer(4, 16 << 20, 12, 0);
}

/// Replies are read straight into pooled frame buffers that still hold earlier frames
/// (here 64 KiB of the sender's pattern): a reply of one byte carries that byte, whole
/// fields and zero padding (checked for every frame by the test bed), and nothing else.
#[test]
fn a_short_reply_built_in_a_used_buffer_carries_only_its_own_bytes() {
    let length = 64 * 1024;
    let mut l = Large::start(EngineConfig::default(), 3, length, 0, 0);
    l.tb.pump();
    assert_eq!(l.pull_done(), Some(success(length)));
    let before = l.tb.wire.len();
    let pull = Pull {
        length: 1,
        local_region: RECEIVER_REGION,
        local_offset: 10,
        remote_region: SENDER_REGION,
        remote_region_seqnum: 3,
        remote_offset: 4095,
    };
    let back = l.tb.route(1);
    l.tb.send(
        3,
        SendRequest {
            tag: 2,
            route: back,
            op: SendOp::Pull(pull),
        },
    )
    .unwrap();
    l.tb.pump();
    assert_eq!(l.pull_done(), Some(success(1)));
    let replies: Vec<_> = l.tb.wire[before..]
        .iter()
        .filter(|f| f.ptype() == PacketType::PullReply)
        .collect();
    assert_eq!(replies.len(), 1);
    let f = replies[0];
    assert_eq!(f.bytes.len(), 60, "33 bytes padded to the Ethernet minimum");
    let PacketRepr::PullReply(r) = packet(f) else {
        unreachable!()
    };
    assert_eq!(r.data, &l.data[4095..4096]);
    assert_eq!(r.msg_offset, 0);
    assert_eq!(f.parse().head.src, l.tb.guest(1).mac);
    assert_eq!(l.tb.region_bytes(3, 200)[10], l.data[4095]);
}

#[test]
fn large_co_located() {
    transfer(2, 32 * 1024 + 1024, 0, 0);
    transfer(2, 1 << 20, 300, 5);
    transfer(2, 16 << 20, 0, 0);
}

/// A 1 MiB pull between hosts configured `sender` and `puller`, with 15% of PULLs and
/// replies lost at random (`seed`): it finishes with every byte, by re-requests.
fn pull_under_random_loss(sender: EngineConfig, puller: EngineConfig, seed: u64) {
    let length = (1 << 20) + 333;
    let mut l = Large::start_between(sender, puller, 3, length, 64, 0);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut done = None;
    for _ in 0..10_000 {
        l.tb.pump_with(|f| {
            matches!(f.ptype(), PacketType::Pull | PacketType::PullReply) && rng.u8(0..100) < 15
        });
        done = l.pull_done();
        if done.is_some() {
            break;
        }
        assert!(l.tb.fire_timers(), "a pull in progress has a deadline");
    }
    assert_eq!(done, Some(success(length)), "seed {seed}");
    assert!(
        !l.tb.lost.is_empty(),
        "seed {seed}: the loss pattern dropped frames"
    );
    let c = l.tb.engines[1]
        .guest(l.tb.guest(3).id)
        .unwrap()
        .counters()
        .clone();
    assert!(c.pull_rerequests > 0);
    assert_eq!(c.pulls_done, 1);
    l.finish();
}

#[test]
fn pull_survives_random_loss() {
    for seed in [1u64, 7, 42, 1234] {
        pull_under_random_loss(EngineConfig::default(), EngineConfig::default(), seed);
    }
}

#[test]
fn pull_survives_lost_replies_only_via_early_rerequest_and_timeouts() {
    // Lose exactly the 3rd reply of the transfer: the later blocks complete first.
    let length = 4 * 32768;
    let mut l = Large::start(EngineConfig::default(), 3, length, 0, 0);
    let mut replies = 0;
    l.tb.pump_with(|f| {
        if f.ptype() == PacketType::PullReply {
            replies += 1;
            return replies == 3;
        }
        false
    });
    assert_eq!(
        l.pull_done(),
        Some(success(length)),
        "re-requested without a timeout"
    );
    assert_eq!(l.tb.lost.len(), 1);
    l.finish();
}

/// The source guest was away (its domain moving) while guest 3 pulled from it: every
/// PULL was lost. Back, its library sends guest 3 an explicit ack marked resent; guest
/// 3's engine then requests the missing blocks at once, and the pull completes with
/// the clock where it was, not a pull timeout later. `resent: false` (an ordinary ack)
/// leaves the pull waiting for its timeout.
fn pull_after_an_outage(resent: bool) -> (Large, Vec<Event>) {
    let length = 3 * 32768 + 100;
    let mut l = Large::start(EngineConfig::default(), 3, length, 0, 0);
    l.tb.pump_with(|f| f.ptype() == PacketType::Pull);
    assert!(l.pull_done().is_none(), "nothing pulled during the outage");
    assert!(!l.tb.lost.is_empty());
    let before = l.tb.now;
    let ack = LibackSend {
        lib_seqnum: 41,
        send_seq: 41,
        acknum: 1,
        resent,
    };
    let route = l.tb.route(3);
    l.tb.send(
        1,
        SendRequest {
            tag: 9,
            route,
            op: SendOp::Liback(ack),
        },
    )
    .unwrap();
    l.tb.pump();
    assert_eq!(l.tb.now, before, "no time passed");
    let sent = l.tb.take_events(1);
    assert!(matches!(sent[..], [Event { tag: 9, .. }]), "{sent:?}");
    let events = l.tb.take_events(3);
    // The library gets its ack either way.
    assert!(
        matches!(events.first(), Some(Event { body: EventBody::RecvLiback { ack: a, .. }, .. }) if *a == ack),
        "{events:?}"
    );
    (l, events[1..].to_vec())
}

#[test]
fn an_ack_marked_resent_makes_pulls_from_its_sender_rerequest_at_once() {
    let length = 3 * 32768 + 100;
    let (mut l, events) = pull_after_an_outage(true);
    assert_eq!(events, vec![success(length)]);
    l.finish();
}

#[test]
fn an_ordinary_ack_leaves_the_pull_to_its_timeout() {
    let length = 3 * 32768 + 100;
    let (mut l, events) = pull_after_an_outage(false);
    assert_eq!(events, vec![], "nothing before the pull's timeout");
    assert!(l.tb.fire_timers());
    l.tb.pump();
    assert_eq!(l.pull_done(), Some(success(length)));
    l.finish();
}

#[test]
fn a_source_that_says_it_is_back_but_never_answers_still_runs_the_pull_out_of_retries() {
    let config = EngineConfig {
        pull_retries_max: 3,
        ..EngineConfig::default()
    };
    let mut l = Large::start(config, 3, 100_000, 0, 0);
    let route = l.tb.route(3);
    let mut rounds = 0u32;
    let done = 'pull: loop {
        l.tb.pump_with(|f| f.ptype() == PacketType::Pull);
        while let Some(e) = l.pull_done() {
            if matches!(e.body, EventBody::PullDone { .. }) {
                break 'pull e;
            }
        }
        // Before every timeout, the source's library says it is back (an ack marked
        // resent); its pulls are requested again, and lost again.
        let ack = LibackSend {
            lib_seqnum: 41,
            send_seq: 41,
            acknum: rounds + 1,
            resent: true,
        };
        let op = SendOp::Liback(ack);
        let tag = 100 + rounds;
        l.tb.send(1, SendRequest { tag, route, op }).unwrap();
        l.tb.pump_with(|f| f.ptype() == PacketType::Pull);
        l.tb.take_events(1);
        assert!(l.tb.fire_timers());
        rounds += 1;
        assert!(rounds < 20, "the pull outlived its retries");
    };
    assert_eq!(
        done.body,
        EventBody::PullDone {
            status: DoneStatus::Timeout,
            length: 0
        }
    );
    assert_eq!(rounds, 4, "three retransmissions, then the abort");
    let g3 = l.tb.guest(3).id;
    assert_eq!(l.tb.engines[1].guest(g3).unwrap().outstanding_pulls(), 0);
}

#[test]
fn pull_aborts_after_the_retry_limit_under_total_loss() {
    let config = EngineConfig {
        pull_retries_max: 3,
        ..EngineConfig::default()
    };
    let mut l = Large::start(config, 3, 100_000, 0, 0);
    let mut rounds = 0;
    let done = loop {
        l.tb.pump_with(|f| f.ptype() == PacketType::Pull);
        if let Some(done) = l.pull_done() {
            break done;
        }
        assert!(l.tb.fire_timers());
        rounds += 1;
        assert!(rounds < 100);
    };
    assert_eq!(
        done,
        Event {
            tag: 2,
            body: EventBody::PullDone {
                status: DoneStatus::Timeout,
                length: 0
            }
        }
    );
    assert_eq!(rounds, 4, "three retransmissions, then the abort");
    // 4 blocks at the start and each retransmission.
    assert_eq!(l.tb.lost.len(), 4 * 4);
    assert!(l.tb.wire.iter().all(|f| f.ptype() != PacketType::PullReply));
    assert_eq!(l.tb.engines[1].poll_timeout(), None);
    let g3 = l.tb.guest(3).id;
    let c = l.tb.engines[1].guest(g3).unwrap().counters().clone();
    assert_eq!((c.pulls_failed, c.pull_rerequests), (1, 12));
    assert_eq!(l.tb.engines[1].guest(g3).unwrap().outstanding_pulls(), 0);
}

#[test]
fn by_default_a_pull_outlasts_a_source_away_for_a_real_xen_migration() {
    // A source guest that real Xen migrates is away from the hold of its device to its
    // reconnection on the other host: the whole of the toolstack's copy, 50-55 s on the
    // emulated hosts of tests/xen. A pull from it must wait that out, and still fail in
    // bounded time when the source never comes back.
    let mut l = Large::start(EngineConfig::default(), 3, 100_000, 0, 0);
    let start = l.tb.now;
    let done = loop {
        l.tb.pump_with(|f| f.ptype() == PacketType::Pull);
        if let Some(done) = l.pull_done() {
            break done;
        }
        assert!(l.tb.fire_timers());
    };
    assert!(matches!(
        done.body,
        EventBody::PullDone {
            status: DoneStatus::Timeout,
            ..
        }
    ));
    let silence = l.tb.now - start;
    assert!(
        silence >= std::time::Duration::from_secs(90),
        "a pull gave up after {silence:?} of silence"
    );
    assert!(
        silence <= std::time::Duration::from_secs(180),
        "a pull waited {silence:?} for a source that never answers"
    );
}

#[test]
fn stale_and_foreign_replies_are_dropped() {
    let length = 50_000;
    let mut l = Large::start(EngineConfig::default(), 3, length, 0, 0);
    l.tb.pump();
    assert_eq!(l.pull_done(), Some(success(length)));
    // Replay every reply: the pull is gone, so they are stale and change nothing.
    let replies: Vec<_> = frames_of(&l.tb, PacketType::PullReply);
    let now = l.tb.now;
    for f in &replies {
        l.tb.engines[1].handle_frame(now, &f.bytes);
    }
    let g3 = l.tb.guest(3).id;
    let c = l.tb.engines[1].guest(g3).unwrap().counters().clone();
    assert_eq!(c.drops(DropReason::StalePull), replies.len() as u64);
    assert!(l.tb.take_events(3).is_empty());
    l.finish();
}

fn reply_frames(n: u8) -> EngineConfig {
    EngineConfig {
        pull_reply_frames: n,
        ..EngineConfig::default()
    }
}

/// What one transfer between hosts put on the wire: (PULLs, replies, their data lengths),
/// the bytes checked against the sender's and delivered whole.
fn transfer_between(
    sender: EngineConfig,
    puller: EngineConfig,
    length: usize,
    remote_offset: u32,
    local_offset: u32,
) -> (Vec<WireFrame>, Vec<usize>) {
    let mut l = Large::start_between(sender, puller, 3, length, remote_offset, local_offset);
    let before = l.tb.wire.len();
    l.tb.pump();
    assert_eq!(l.pull_done(), Some(success(length)));
    let frames = l.tb.wire[before..].to_vec();
    let mut lens = vec![];
    for f in frames.iter().filter(|f| f.ptype() == PacketType::PullReply) {
        let PacketRepr::PullReply(r) = packet(f) else {
            unreachable!()
        };
        let off = r.msg_offset as usize;
        assert_eq!(r.data, &l.data[off..off + r.data.len()]);
        lens.push(r.data.len());
    }
    assert_eq!(lens.iter().sum::<usize>(), length);
    let pulls = frames
        .into_iter()
        .filter(|f| f.ptype() == PacketType::Pull)
        .collect();
    l.finish();
    (pulls, lens)
}

fn mark_of(pull: &WireFrame) -> u8 {
    xmx_wire::mxoe::units_mark::read(&pull.bytes[HEAD_LEN + PULL_LEN..])
}

/// Between two xmx hosts that both allow it, a reply carries two frames' data: half the
/// replies, each cut where MX's replies would be, the bytes the same.
#[test]
fn xmx_hosts_that_allow_it_carry_two_frames_per_reply() {
    for (length, remote_offset, local_offset) in [
        (1 << 20, 0, 0),
        (200_000, 4095, 1),
        (32 * 1024 + 1024, 100, 7),
        (5000, 0, 3),
    ] {
        let (pulls, lens) = transfer_between(
            reply_frames(2),
            reply_frames(2),
            length,
            remote_offset,
            local_offset,
        );
        assert!(pulls.iter().all(|p| mark_of(p) == 2), "every PULL asks");
        let in_frame = remote_offset as usize % 4096;
        let frames = (in_frame + length).div_ceil(4096);
        // Two frames per reply, block by block (a block's frame count may be odd).
        let blocks = (in_frame + length).div_ceil(32768);
        assert!(
            lens.len() <= frames.div_ceil(2) + blocks,
            "{} replies",
            lens.len()
        );
        assert!(
            lens.len() < frames || frames == 1,
            "fewer replies than frames"
        );
        assert!(lens.iter().all(|&n| n <= 8192));
        assert!(lens.iter().any(|&n| n > 4096) || frames == 1);
    }
}

/// MX's wire with every other peer: an engine that allows one frame per reply asks
/// nobody for more and answers one frame per reply even to a puller that asks.
#[test]
fn a_puller_or_a_sender_limited_to_one_frame_gets_mx_replies() {
    // The puller asks, the sender keeps to MX.
    let (pulls, lens) = transfer_between(reply_frames(1), reply_frames(2), 1 << 20, 12, 0);
    assert!(pulls.iter().all(|p| mark_of(p) == 2));
    assert!(lens.iter().all(|&n| n <= 4096));
    assert_eq!(lens.len(), (12usize + (1 << 20)).div_ceil(4096));
    // The puller keeps to MX (as Open-MX would): no mark, one frame per reply.
    let (pulls, lens) = transfer_between(reply_frames(2), reply_frames(1), 1 << 20, 12, 0);
    assert!(pulls.iter().all(|p| mark_of(p) == 1));
    assert!(pulls
        .iter()
        .all(|p| p.bytes[HEAD_LEN + PULL_LEN..].iter().all(|&b| b == 0)));
    assert!(lens.iter().all(|&n| n <= 4096));
}

/// Lost two-frame replies are asked for again and arrive whole.
#[test]
fn two_frame_replies_survive_random_loss() {
    for seed in [3u64, 99] {
        pull_under_random_loss(reply_frames(2), reply_frames(2), seed);
    }
}

/// A two-frame reply whose second part is short is refused for that part: the first
/// frame lands, the second is asked for again.
#[test]
fn a_multi_frame_reply_with_a_bad_part_lands_only_its_good_parts() {
    let length = 3 * 4096;
    let mut tb = Testbed::with_configs(reply_frames(2), reply_frames(2));
    let data = pattern(length, 0x33);
    tb.region(1, SENDER_REGION, 100, data.clone());
    tb.region(3, RECEIVER_REGION, 200, vec![0u8; length]);
    let pull = Pull {
        length: length as u32,
        local_region: RECEIVER_REGION,
        local_offset: 0,
        remote_region: SENDER_REGION,
        remote_region_seqnum: 3,
        remote_offset: 0,
    };
    let back = tb.route(1);
    tb.send(
        3,
        SendRequest {
            tag: 2,
            route: back,
            op: SendOp::Pull(pull),
        },
    )
    .unwrap();
    // Deliver the PULL, keep the replies, then hand the puller a forged two-frame reply
    // whose second part is one byte short.
    let mut replies = vec![];
    tb.pump_with(|f| {
        if f.ptype() == PacketType::PullReply {
            replies.push(f.clone());
            true
        } else {
            false
        }
    });
    assert!(!replies.is_empty());
    let first = &replies[0];
    let PacketRepr::PullReply(r) = packet(first) else {
        unreachable!()
    };
    assert_eq!(r.data.len(), 8192);
    let mut forged = first.bytes.clone();
    forged.truncate(HEAD_LEN + PULL_REPLY_LEN + 8191);
    forged[HEAD_LEN + 2..HEAD_LEN + 4].copy_from_slice(&8191u16.to_be_bytes());
    let puller = tb.guest(3);
    let bad_before = tb
        .engine(3)
        .guest(puller.id)
        .unwrap()
        .counters()
        .drops(DropReason::BadPullReply);
    let now = tb.now;
    tb.engines[1].handle_frame(now, &forged);
    let nic = tb.engine(3).guest(puller.id).unwrap();
    assert_eq!(
        nic.counters().drops(DropReason::BadPullReply),
        bad_before + 1
    );
    let got = tb.region_bytes(3, 200);
    assert_eq!(&got[..4096], &data[..4096], "the good first part landed");
    assert!(got[4096..].iter().all(|&b| b == 0), "nothing else did");
    // The rest comes on the puller's retry.
    let mut done = false;
    for _ in 0..100 {
        tb.fire_timers();
        tb.pump();
        if tb.take_events(3).iter().any(|e| *e == success(length)) {
            done = true;
            break;
        }
    }
    assert!(done, "the pull finished on its retries");
    assert_eq!(tb.region_bytes(3, 200), data);
}

/// Move the frames host `from` has queued to the other host, nothing else.
fn deliver_from(tb: &mut Testbed, from: usize) -> usize {
    let mut n = 0;
    while let Some(t) = tb.engines[from].poll_transmit() {
        let now = tb.now;
        tb.engines[1 - from].handle_frame(now, &t.bytes);
        tb.engines[from].recycle(t);
        n += 1;
    }
    n
}

/// Replies for the wire are written only when they leave: into a buffer the caller
/// provides (a dirty one here), byte for byte what a buffer of the engine's own would
/// hold; a buffer too short for the next frame drops it (counted), never cuts it.
#[test]
fn replies_are_written_into_the_callers_buffer_as_they_leave() {
    let length = 64 * 1024 + 100;
    let mut a = Large::start(EngineConfig::default(), 3, length, 0, 0);
    let mut b = Large::start(EngineConfig::default(), 3, length, 0, 0);
    // Both deliver their PULLs to the sender's host, which queues the replies.
    assert!(deliver_from(&mut a.tb, 1) > 0);
    assert!(deliver_from(&mut b.tb, 1) > 0);
    let mut slot = vec![0xa5u8; 9014];
    let mut n = 0;
    loop {
        let own = a.tb.engines[0].poll_transmit();
        let into = b.tb.engines[0].poll_transmit_into(&mut slot);
        match (own, into) {
            (Some(t), Some(len)) => {
                assert_eq!(&slot[..len], &t.bytes[..], "frame {n}");
                a.tb.engines[0].recycle(t);
                n += 1;
            }
            (None, None) => break,
            other => panic!("one engine ran out first: {other:?}"),
        }
    }
    assert!(n > length / 4096, "{n} frames");

    // A slot too short for a reply: the reply is dropped and counted, the next
    // frame (after the short one) still leaves whole.
    let mut c = Large::start(EngineConfig::default(), 3, 3 * 4096, 0, 0);
    assert!(deliver_from(&mut c.tb, 1) > 0);
    let mut short = vec![0u8; 100];
    assert_eq!(c.tb.engines[0].poll_transmit_into(&mut short), None);
    let sender = c.tb.guest(1);
    let nic = c.tb.engine(1).guest(sender.id).unwrap();
    assert_eq!(nic.counters().drops(DropReason::TxUnwritable), 3);
}

/// A region given back between its PULL and the replies' departure is answered with a
/// NACK_MCP, as if it had been gone at the PULL: the puller's pull fails at once
/// instead of re-requesting into nothing until its retries run out.
#[test]
fn a_region_gone_before_its_replies_leave_is_refused_with_a_nack() {
    let length = 3 * 4096;
    let mut l = Large::start(EngineConfig::default(), 3, length, 0, 0);
    assert!(
        deliver_from(&mut l.tb, 1) > 0,
        "the PULL reached the sender"
    );
    let sender = l.tb.guest(1);
    sender
        .mem
        .remove_area(xmx_engine::MemoryArea::Region(xmx_engine::RegionHandle(
            100,
        )));
    let before = l.tb.wire.len();
    l.tb.pump();
    let nacks = l.tb.wire[before..]
        .iter()
        .filter(|f| f.ptype() == PacketType::NackMcp)
        .count();
    assert!(nacks >= 1, "the puller was told");
    assert!(
        l.tb.wire[before..]
            .iter()
            .all(|f| f.ptype() != PacketType::PullReply),
        "no reply of unreadable memory left"
    );
    let nic = l.tb.engine(1).guest(sender.id).unwrap();
    assert!(nic.counters().drops(DropReason::MemoryFault) >= 1);
    let done = l.pull_done().expect("the pull ended");
    let EventBody::PullDone { status, .. } = done.body else {
        panic!("{done:?}")
    };
    assert_ne!(status, DoneStatus::Success);
}

/// A sender's guest that lent a region's data another way (a direct channel) leaves its fill
/// mark clear: the engine serves none of it. The peer's PULLs are dropped without a NACK,
/// the guest is asked for the region once however often the peer asks, and once the guest
/// filled it and set the mark, the peer's next request after its timeout gets every byte.
#[test]
fn a_region_without_its_fill_mark_is_asked_for_once_and_served_once_marked() {
    let length = 100_000;
    let mut l = Large::start(EngineConfig::default(), 3, length, 0, 0);
    let marks = MemoryArea::FillMarks { endpoint: EP };
    let sender = l.tb.guest(1);
    sender.mem.add_area(marks, fill_marks::LEN);
    // What the region holds before the guest fills it: nothing of the message.
    let real = l.tb.region_bytes(1, 100);
    sender
        .mem
        .write_at(
            MemoryArea::Region(RegionHandle(100)),
            0,
            &vec![0xee; real.len()],
        )
        .unwrap();
    let counters = |l: &Large| {
        l.tb.engines[0]
            .guest(l.tb.guest(1).id)
            .unwrap()
            .counters()
            .clone()
    };
    l.tb.pump();
    let wanted = Event {
        tag: 0,
        body: EventBody::RegionWanted {
            region: SENDER_REGION,
        },
    };
    assert_eq!(l.tb.take_events(1), vec![wanted]);
    let c = counters(&l);
    assert!(c.drops(DropReason::RegionUnfilled) >= 1);
    assert_eq!(c.nacks_sent, 0);
    assert_eq!(l.pull_done(), None);
    // The puller asks again; the guest has not answered yet: dropped, not asked again.
    assert!(l.tb.fire_timers());
    l.tb.pump();
    assert!(l.tb.take_events(1).is_empty(), "one request per window");
    assert!(counters(&l).drops(DropReason::RegionUnfilled) > c.drops(DropReason::RegionUnfilled));
    assert_eq!(l.pull_done(), None);
    // A PULL of another window of the region (a stale one of an earlier send, or a later
    // send's) is asked for on its own: an earlier request cannot use up a later one's.
    let mut other = frames_of(&l.tb, PacketType::Pull)
        .pop()
        .expect("a PULL on the wire")
        .bytes;
    PullPacket::new_unchecked(&mut other[HEAD_LEN..]).set_pulled_rdma_seqnum(4);
    let now = l.tb.now;
    l.tb.engines[0].handle_frame(now, &other);
    l.tb.collect_events();
    let asked: Vec<EventBody> = l.tb.take_events(1).into_iter().map(|e| e.body).collect();
    assert_eq!(asked, vec![wanted.body]);
    // The guest fills the region, then sets the mark (word 0, the region's bit).
    sender
        .mem
        .write_at(MemoryArea::Region(RegionHandle(100)), 0, &real)
        .unwrap();
    let word = fill_marks::bit(SENDER_REGION).to_ne_bytes();
    sender
        .mem
        .write_at(marks, (fill_marks::word(SENDER_REGION) * 4) as u64, &word)
        .unwrap();
    let mut done = None;
    while done.is_none() {
        assert!(l.tb.fire_timers(), "the pull goes on");
        l.tb.pump();
        done = l.pull_done();
    }
    assert_eq!(done, Some(success(length)));
    assert_eq!(counters(&l).nacks_sent, 0);
    l.finish();
}

/// `transmit_into` writes each waiting frame into a slot the link hands out, stops while
/// the link has no slot free, and drops a frame whose send failed before a slot was
/// handed out (the loop ends; the puller asks again).
#[test]
fn transmit_into_fills_the_links_slots_and_loses_only_what_the_link_failed() {
    let length = 5 * 4096;
    let mut l = Large::start(EngineConfig::default(), 3, length, 0, 0);
    assert!(deliver_from(&mut l.tb, 1) > 0);
    let engine = &mut l.tb.engines[0];
    let queued = engine.pending_transmits();
    assert_eq!(queued, 5, "one reply per 4 KiB");
    // A full ring: nothing leaves, nothing is lost.
    let sent = engine.transmit_into(|_| Ok::<usize, ()>(0), |_| panic!("no error"));
    assert_eq!((sent, engine.pending_transmits()), (0, queued));
    // The first send fails before a slot, the second after writing it; the rest leave.
    let mut frames: Vec<Vec<u8>> = Vec::new();
    let mut errors = 0;
    let mut call = 0;
    let sent = engine.transmit_into(
        |fill| {
            call += 1;
            if call == 1 {
                return Err("no slot");
            }
            let mut slot = vec![0u8; 9014];
            let len = fill(&mut slot);
            if call == 2 {
                return Err("written, then lost");
            }
            slot.truncate(len);
            frames.push(slot);
            Ok(len)
        },
        |_| errors += 1,
    );
    assert_eq!((sent, errors, engine.pending_transmits()), (3, 2, 0));
    for f in &frames {
        let repr = xmx_wire::mxoe::FrameRepr::parse(f).expect("a whole frame");
        assert!(matches!(repr.packet, PacketRepr::PullReply(_)));
    }
}

/// The puller's guest is told, a step at a time, how much of its pull has landed in
/// order, so its library can copy that out while the rest is on the way: never past a
/// frame still missing, those bytes in its region when it is told, and never the whole
/// (the completion says that).
#[test]
fn a_pull_tells_its_guest_what_landed_in_order_while_the_rest_is_on_the_way() {
    let length = 1 << 20;
    let step = 64 << 10;
    let config = EngineConfig {
        pull_progress_step: step,
        ..EngineConfig::default()
    };
    let mut l = Large::start(config, 3, length, 0, 0);
    // The reply for the frame at the middle of the message is lost, each time it is
    // sent for now: everything after it may land, but nothing past it is in order.
    let half = (length / 2) as u32;
    l.tb.pump_with(|f| matches!(packet(f), PacketRepr::PullReply(r) if r.msg_offset == half));
    assert!(!l.tb.lost.is_empty(), "the reply at the middle was sent");
    assert_eq!(l.pull_done(), None, "the pull waits for the lost reply");
    let told = l.told.clone();
    assert!(told.len() >= (half / step) as usize - 1, "told {told:?}");
    assert!(
        *told.last().unwrap() <= half,
        "told {told:?}: past the lost frame"
    );
    // The puller asks again after its timeout; the rest lands, the completion says so.
    while l
        .pull_done()
        .is_none_or(|e| panic!("{e:?} before the pull ended"))
    {
        assert!(l.tb.fire_timers(), "the pull goes on");
        l.tb.pump();
        if let Some(done) = l.pull_done() {
            assert_eq!(done, success(length));
            break;
        }
    }
    // Every block but the lost frame's had landed: the gap filled completes the pull,
    // and the completion alone tells the rest.
    assert_eq!(l.told, told);
    l.finish();
}

/// An engine told a step of 0 (an in-process engine, whose pulls land in the
/// application's buffers) tells nothing but the completion.
#[test]
fn a_pull_with_no_progress_step_tells_only_its_completion() {
    let config = EngineConfig {
        pull_progress_step: 0,
        ..EngineConfig::default()
    };
    let mut l = Large::start(config, 3, 4 << 20, 0, 0);
    l.tb.pump();
    assert_eq!(l.pull_done(), Some(success(4 << 20)));
    assert!(l.told.is_empty(), "told {:?}", l.told);
    l.finish();
}

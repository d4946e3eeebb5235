//! Property tests over the simulated network: whatever the loss, duplication
//! and reordering, every message arrives exactly once, in order, intact; and
//! when the network goes silent, every pending send ends with `Timeout`
//! within the retry budget.

mod sim;

use std::time::Duration;

use proptest::prelude::*;
use sim::{Sim, SimChannel};
use xmx_mx::{Config, Endpoint, EndpointEvent, RdmaWindow, RecvDone, Status, MEDIUM_MAX};

const KEY: u32 = 77;

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        3 => 0..=32usize,
        2 => 33..=128usize,
        3 => 129..=MEDIUM_MAX,
        1 => Just(4096usize),
        1 => Just(MEDIUM_MAX),
        1 => (MEDIUM_MAX + 1)..=70_000usize,
    ]
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut r = sim::Rng::with_seed(seed ^ 0x5eed);
    (0..len).map(|_| r.u8(..)).collect()
}

/// Sends message `i` from node 0 to node 1, LARGE ones by rendezvous.
fn send(s: &mut Sim, i: usize, data: &[u8]) {
    let now = s.now;
    let to = s.addr(1);
    if data.len() > MEDIUM_MAX {
        let window = RdmaWindow {
            id: i as u8,
            seqnum: (i / 256) as u8,
            offset: 0,
        };
        s.register_window(0, window, data.to_vec());
        s.nodes[0]
            .ep
            .send_large(now, to, i as u64, data.len() as u32, window)
            .unwrap();
    } else {
        s.nodes[0].ep.send(now, to, i as u64, data).unwrap();
    }
}

/// (receive request id, match info, bytes).
type Received = (u64, u64, Vec<u8>);

/// Successfully received messages of node 1 as (receive request id, match
/// info, bytes), in matching order, and the other completions.
fn received(s: &mut Sim) -> (Vec<Received>, Vec<RecvDone>) {
    s.pump();
    let mut done: Vec<RecvDone> = s.nodes[1]
        .take_events(|e| matches!(e, EndpointEvent::RecvDone(_)))
        .into_iter()
        .filter_map(|e| {
            if let EndpointEvent::RecvDone(r) = e {
                Some(r)
            } else {
                None
            }
        })
        .collect();
    done.sort_by_key(|r| r.id);
    let pulled = std::mem::take(&mut s.pulled);
    let (ok, failed): (Vec<RecvDone>, Vec<RecvDone>) =
        done.into_iter().partition(|r| r.status == Status::Success);
    let ok = ok
        .into_iter()
        .map(|r| {
            let data = if r.data.is_empty() {
                pulled.get(&(1, r.id.0)).cloned().unwrap_or_default()
            } else {
                r.data
            };
            (r.id.0, r.match_info, data)
        })
        .collect();
    (ok, failed)
}

fn sim_pair(seed: u64, channel: SimChannel, config: Config) -> Sim {
    let mut s = Sim::new(seed, channel);
    s.add(
        10,
        Endpoint::new(config.clone(), 1, 0x1000 + seed as u32, KEY),
    );
    s.add(20, Endpoint::new(config, 2, 0x2000 + seed as u32, KEY));
    s
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_message_arrives_once_in_order(
        seed in any::<u64>(),
        loss in 0.0..0.35f64,
        dup in 0.0..0.35f64,
        jitter_us in 0u64..40_000,
        sizes in prop::collection::vec(size(), 1..24),
        post_first in any::<bool>(),
    ) {
        let channel = SimChannel::lossy(loss, dup, Duration::from_micros(jitter_us));
        let mut s = sim_pair(seed, channel, Config::default());
        prop_assert_eq!(s.connect(0, 1, KEY), Status::Success);
        let msgs: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| bytes(seed.wrapping_add(i as u64), n)).collect();
        let now = s.now;
        if post_first {
            for _ in &msgs {
                s.nodes[1].ep.post_recv(now, 0, 0, 1 << 20).unwrap();
            }
        }
        for (i, m) in msgs.iter().enumerate() {
            send(&mut s, i, m);
        }
        let limit = s.now + Duration::from_secs(24 * 3600);
        let n = msgs.len();
        let b = s.addr(1);
        // Everything acked (LARGE sends also wait for the receiver's pull).
        prop_assert!(s.run_until(limit, |s| s.nodes[0].ep.is_settled_with(b)));
        if !post_first {
            let now = s.now;
            for _ in &msgs {
                s.nodes[1].ep.post_recv(now, 0, 0, 1 << 20).unwrap();
            }
        }
        s.run_to_quiescence(limit);
        let (got, failed) = received(&mut s);
        prop_assert!(failed.is_empty(), "failed receives {:?}", failed);
        prop_assert_eq!(got.len(), n);
        for (i, (_, info, data)) in got.iter().enumerate() {
            prop_assert_eq!(*info, i as u64);
            prop_assert!(data == &msgs[i], "message {} bytes differ", i);
        }
        let sends = s.nodes[0].take_events(|e| matches!(e, EndpointEvent::SendDone { status: Status::Success, .. }));
        prop_assert_eq!(sends.len(), n);
        prop_assert!(s.nodes[0].events.is_empty(), "stray events {:?}", s.nodes[0].events);
        prop_assert!(s.nodes[1].events.iter().all(|e| matches!(e, EndpointEvent::PullNeeded(_) | EndpointEvent::EarlyPullNeeded(_))));
        prop_assert_eq!(s.nodes[0].ep.pending_requests(), 0);
        prop_assert_eq!(s.nodes[1].ep.pending_requests(), 0);
    }

    #[test]
    fn silence_ends_every_send_within_the_retry_budget(
        seed in any::<u64>(),
        loss in 0.0..0.3f64,
        sizes in prop::collection::vec(size(), 1..12),
        cut_after in 0u64..120,
        max_retries in 0u32..6,
    ) {
        let config = Config { max_retries, resend_delay: Duration::from_millis(50), ..Config::default() };
        let budget = config.retry_budget();
        let mut s = sim_pair(seed, SimChannel::perfect(), config);
        prop_assert_eq!(s.connect(0, 1, KEY), Status::Success);
        s.channel = SimChannel::lossy(loss, 0.1, Duration::from_millis(5));
        let msgs: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| bytes(seed ^ i as u64, n)).collect();
        let now = s.now;
        let mut recv_ids = Vec::new();
        for _ in &msgs {
            recv_ids.push(s.nodes[1].ep.post_recv(now, 0, 0, 1 << 20).unwrap().0);
        }
        let first_recv = recv_ids[0];
        // Request ids count per endpoint: node 0 used one for the connect.
        let first_send = 2;
        for (i, m) in msgs.iter().enumerate() {
            send(&mut s, i, m);
        }
        let cut = s.delivered + cut_after;
        let far = s.now + Duration::from_secs(365 * 24 * 3600);
        s.run_until(far, |s| s.delivered >= cut);
        s.blackhole = true;
        let cut_time = s.now;
        let n = msgs.len();
        prop_assert!(s.run_until(far, |s| s.nodes[0].events.len() >= n), "a send never completed");
        // Every request still pending went out before the cut (or was acked by
        // a frame still in flight then), so the budget runs from there.
        let bound = cut_time + budget + s.channel.delay_max;
        prop_assert!(s.now <= bound, "took {:?} after the cut, budget {:?}", s.now.saturating_since(cut_time), budget);
        let mut outcome = vec![None; n];
        for e in s.nodes[0].take_events(|_| true) {
            match e {
                EndpointEvent::SendDone { id, status, .. } => {
                    let i = (id.0 - first_send) as usize;
                    prop_assert!(outcome[i].is_none(), "send {} completed twice", i);
                    prop_assert!(matches!(status, Status::Success | Status::Timeout), "status {:?}", status);
                    outcome[i] = Some(status);
                }
                other => prop_assert!(false, "unexpected {:?}", other),
            }
        }
        // The k-th receive got the k-th message, once and intact (a MEDIUM cut
        // short leaves its receive pending); every acknowledged send arrived.
        s.run_to_quiescence(far);
        let (got, failed) = received(&mut s);
        // Receives fail only when the receiver itself gave up on the sender
        // (a NOTIFY went unanswered): LARGE ones had their data (arrived),
        // MEDIUMs cut short had not.
        let mut arrived = vec![false; n];
        for r in &failed {
            let k = (r.id.0 - first_recv) as usize;
            prop_assert_eq!(r.status, Status::Timeout);
            arrived[k] = msgs[k].len() > MEDIUM_MAX;
        }
        for (id, info, data) in &got {
            let k = (id - first_recv) as usize;
            prop_assert_eq!(*info, k as u64);
            prop_assert!(data == &msgs[k]);
            prop_assert!(!arrived[k], "receive {} completed twice", k);
            arrived[k] = true;
        }
        for (i, o) in outcome.iter().enumerate() {
            if *o == Some(Status::Success) {
                prop_assert!(arrived[i], "send {} acked but not delivered", i);
            }
        }
        prop_assert_eq!(s.nodes[0].ep.next_timeout(), None);
    }
}

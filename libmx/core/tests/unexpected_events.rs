//! The unexpected queue as MX's unexpected handlers see it: arrivals
//! reported in arrival order whatever the message class (a LARGE message
//! keeps its place, unpulled, until a receive takes it), receives that take
//! them in that order, and one chosen message taken out of the queue.

mod sim;

use std::time::Duration;

use sim::{Sim, SimChannel};
use xmx_mx::{Config, Endpoint, EndpointEvent, RdmaWindow, Status};

const KEY: u32 = 0x1234_5678;

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = sim::Rng::with_seed(seed);
    (0..len).map(|_| r.u8(..)).collect()
}

fn pair(seed: u64, channel: SimChannel) -> Sim {
    let mut s = Sim::new(seed, channel);
    s.add(1, Endpoint::new(Config::default(), 0, 0xAAAA_0001, KEY));
    s.add(2, Endpoint::new(Config::default(), 3, 0xBBBB_0002, KEY));
    s
}

fn arrivals(s: &mut Sim, node: usize) -> Vec<xmx_mx::UnexpectedArrival> {
    s.pump();
    s.nodes[node]
        .take_events(|e| matches!(e, EndpointEvent::Unexpected(_)))
        .into_iter()
        .filter_map(|e| match e {
            EndpointEvent::Unexpected(a) => Some(a),
            _ => None,
        })
        .collect()
}

const WINDOW: RdmaWindow = RdmaWindow {
    id: 4,
    seqnum: 9,
    offset: 0,
};

/// Node 0 sends, with match info 5: a LARGE message, then a MEDIUM, then a
/// TINY one, none expected by node 1, which reports arrivals. Returns the
/// three payloads.
fn large_then_small(s: &mut Sim) -> [Vec<u8>; 3] {
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    s.nodes[1].ep.set_unexpected_events(true);
    let to = s.addr(1);
    let now = s.now;
    let msgs = [pattern(1, 300_001), pattern(2, 20_000), pattern(3, 4)];
    s.register_window(0, WINDOW, msgs[0].clone());
    let len = msgs[0].len() as u32;
    s.nodes[0].ep.send_large(now, to, 5, len, WINDOW).unwrap();
    s.nodes[0].ep.send(now, to, 5, &msgs[1]).unwrap();
    s.nodes[0].ep.send(now, to, 5, &msgs[2]).unwrap();
    msgs
}

#[test]
fn arrivals_are_reported_in_arrival_order_and_received_in_it() {
    let mut s = pair(21, SimChannel::lossy(0.2, 0.1, Duration::from_millis(5)));
    let msgs = large_then_small(&mut s);
    let limit = s.now + Duration::from_secs(600);
    let mut seen = Vec::new();
    assert!(s.run_until(limit, |s| {
        seen.extend(arrivals(s, 1));
        seen.len() == 3
    }));
    let lengths: Vec<u32> = seen.iter().map(|a| a.msg_length).collect();
    assert_eq!(lengths, [300_001, 20_000, 4], "arrival order, LARGE first");
    assert!(seen
        .iter()
        .all(|a| a.match_info == 5 && a.source.peer == s.addr(0)));
    assert!(
        s.pulled.is_empty(),
        "nothing is pulled before a receive takes it"
    );
    assert!(seen.iter().all(|a| s.nodes[1].ep.is_unexpected(a.id)));
    assert_eq!(
        s.nodes[1].ep.unexpected_data(seen[0].id),
        None,
        "LARGE: no data"
    );
    s.run_to_quiescence(limit);
    assert_eq!(
        s.nodes[1].ep.unexpected_data(seen[1].id),
        Some(&msgs[1][..]),
        "a reassembled MEDIUM"
    );
    assert_eq!(
        s.nodes[1].ep.unexpected_data(seen[2].id),
        Some(&msgs[2][..])
    );
    let probe = s.nodes[1].ep.probe(5, u64::MAX).unwrap().unwrap();
    assert_eq!(probe.msg_length, 300_001);

    // Receives of the exact sizes, posted now, take them in arrival order.
    let now = s.now;
    let ids: Vec<_> = [300_001usize, 20_000, 4]
        .iter()
        .map(|&cap| s.nodes[1].ep.post_recv(now, 5, u64::MAX, cap).unwrap())
        .collect();
    s.run_to_quiescence(limit);
    let mut done = s.recv_dones(1);
    done.sort_by_key(|r| r.id);
    assert_eq!(done.len(), 3);
    for (i, r) in done.iter().enumerate() {
        assert_eq!(r.id, ids[i]);
        assert_eq!(r.status, Status::Success, "receive {i}");
        assert_eq!(
            (r.match_info, r.msg_length, r.xfer_length),
            (5, msgs[i].len() as u32, msgs[i].len() as u32),
            "receive {i}"
        );
        assert_eq!(r.source.peer, s.addr(0));
    }
    assert_eq!(s.pulled[&(1, ids[0].0)], msgs[0], "pulled into the receive");
    assert_eq!(done[1].data, msgs[1]);
    assert_eq!(done[2].data, msgs[2]);
    assert!(seen.iter().all(|a| !s.nodes[1].ep.is_unexpected(a.id)));
    assert!(
        arrivals(&mut s, 1).is_empty(),
        "taken messages are not reported again"
    );
}

#[test]
fn a_chosen_unexpected_message_is_taken_out_of_its_place() {
    let mut s = pair(22, SimChannel::perfect());
    let msgs = large_then_small(&mut s);
    // Well within the rendezvous timeout (the retry budget): the LARGE
    // send waits for its receiver meanwhile.
    let limit = s.now + Duration::from_secs(60);
    s.run_to_quiescence(limit);
    let seen = arrivals(&mut s, 1);
    assert_eq!(seen.len(), 3);
    // Drop the LARGE one and the TINY one (as a handler returning
    // MX_RECV_FINISHED does): the MEDIUM is then the first in the queue.
    let now = s.now;
    let dropped_large = s.nodes[1]
        .ep
        .receive_unexpected(now, seen[0].id, 0)
        .unwrap();
    let dropped_tiny = s.nodes[1]
        .ep
        .receive_unexpected(now, seen[2].id, 0)
        .unwrap();
    assert_eq!(
        s.nodes[1].ep.receive_unexpected(now, seen[2].id, 0),
        None,
        "taken already"
    );
    let next = s.nodes[1].ep.probe(5, u64::MAX).unwrap().unwrap();
    assert_eq!(next.msg_length, 20_000);
    let medium = s.nodes[1].ep.post_recv(now, 5, u64::MAX, 100_000).unwrap();
    s.run_to_quiescence(now + Duration::from_secs(60));
    let mut done = s.recv_dones(1);
    done.sort_by_key(|r| r.id);
    let summary: Vec<_> = done
        .iter()
        .map(|r| (r.id, r.status, r.msg_length, r.xfer_length))
        .collect();
    assert_eq!(
        summary,
        [
            (dropped_large, Status::Truncated, 300_001, 0),
            (dropped_tiny, Status::Truncated, 4, 0),
            (medium, Status::Success, 20_000, 20_000),
        ]
    );
    assert_eq!(done[2].data, msgs[1]);
    assert!(s.pulled.is_empty(), "a dropped LARGE message is not pulled");
    // Its sender learns that nothing was taken.
    let sends = s.nodes[0].take_events(|e| matches!(e, EndpointEvent::SendDone { .. }));
    assert!(
        sends.iter().any(|e| matches!(
            e,
            EndpointEvent::SendDone {
                status: Status::Success,
                xfer_length: 0,
                ..
            }
        )),
        "{sends:?}"
    );
    assert_eq!(s.nodes[1].ep.pending_requests(), 0);
}

#[test]
fn turning_reports_on_shows_the_messages_queued_already() {
    let mut s = pair(23, SimChannel::perfect());
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    let to = s.addr(1);
    let now = s.now;
    for i in 0..3u64 {
        s.nodes[0]
            .ep
            .send(now, to, 0x10 + i, &[i as u8; 7])
            .unwrap();
    }
    let limit = s.now + Duration::from_secs(60);
    s.run_to_quiescence(limit);
    assert!(arrivals(&mut s, 1).is_empty(), "not reported while off");
    s.nodes[1].ep.set_unexpected_events(true);
    let seen: Vec<u64> = arrivals(&mut s, 1).iter().map(|a| a.match_info).collect();
    assert_eq!(seen, [0x10, 0x11, 0x12]);
    s.nodes[1].ep.set_unexpected_events(true);
    assert!(arrivals(&mut s, 1).is_empty(), "reported once");
    s.nodes[0].ep.send(s.now, to, 0x13, b"late").unwrap();
    s.run_to_quiescence(limit);
    let seen: Vec<u64> = arrivals(&mut s, 1).iter().map(|a| a.match_info).collect();
    assert_eq!(seen, [0x13]);
    s.nodes[1].ep.set_unexpected_events(false);
    s.nodes[0].ep.send(s.now, to, 0x14, b"off").unwrap();
    s.run_to_quiescence(limit);
    assert!(arrivals(&mut s, 1).is_empty());
}

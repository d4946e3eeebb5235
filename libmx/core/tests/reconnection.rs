//! An endpoint whose way to the network was cut (its guest suspended, its
//! domain moved to another host) and came back: `Endpoint::path_restored`
//! sends at once what the outage may have lost, instead of waiting out the
//! resend delay, and nothing is delivered twice.
//!
//! Time is the simulation's: "at once" means before the virtual clock reaches
//! the resend delay, never a measured wall-clock time.

mod sim;

use std::time::Duration;

use sim::{Sim, SimChannel};
use xmx_mx::{Config, Endpoint, EndpointEvent, Status};

const KEY: u32 = 0x5eed_0001;

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = sim::Rng::with_seed(seed);
    (0..len).map(|_| r.u8(..)).collect()
}

/// Two endpoints on two hosts, connected both ways.
fn connected_pair() -> Sim {
    let mut s = Sim::new(11, SimChannel::perfect());
    s.add(1, Endpoint::new(Config::default(), 0, 0xAAAA_0001, KEY));
    s.add(2, Endpoint::new(Config::default(), 2, 0xBBBB_0002, KEY));
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    assert_eq!(s.connect(1, 0, KEY), Status::Success);
    s
}

fn sends_done(s: &mut Sim, node: usize) -> Vec<Status> {
    s.send_dones(node).into_iter().map(|(_, st)| st).collect()
}

fn has_events(s: &Sim, node: usize, n: usize, recv: bool) -> bool {
    s.nodes[node]
        .events
        .iter()
        .filter(|e| match e {
            EndpointEvent::RecvDone(_) => recv,
            EndpointEvent::SendDone { .. } => !recv,
            _ => false,
        })
        .count()
        >= n
}

#[test]
fn sends_lost_in_an_outage_leave_at_once_when_the_path_is_back() {
    let mut s = connected_pair();
    let (to_peer, to_moved) = (s.addr(1), s.addr(0));
    let now = s.now;
    let msgs = [pattern(1, 100), pattern(2, 9000)];
    for _ in &msgs {
        s.nodes[1].ep.post_recv(now, 0, 0, 1 << 16).unwrap();
    }
    let back = pattern(3, 40);
    s.nodes[0].ep.post_recv(now, 0, 0, 1 << 16).unwrap();

    // The outage: both ways lose everything sent meanwhile.
    s.blackhole = true;
    for (i, m) in msgs.iter().enumerate() {
        s.nodes[0].ep.send(now, to_peer, i as u64, m).unwrap();
    }
    s.nodes[1].ep.send(now, to_moved, 7, &back).unwrap();
    s.pump();
    s.blackhole = false;

    // The path is back: node 0 learns it (a reconnection notice) and resends
    // without waiting for its resend timer; its ack marked resent makes the
    // peer resend too.
    let restored = s.now;
    s.nodes[0].ep.path_restored(restored);
    let soon = restored + Duration::from_millis(1);
    assert!(
        soon < restored + Config::default().resend_delay,
        "the bound is below the resend delay"
    );
    assert!(
        s.run_until(soon, |s| has_events(s, 1, 2, true)
            && has_events(s, 0, 1, true)),
        "the lost sends were not resent before the resend delay"
    );

    // Nothing twice.
    let limit = s.now + Duration::from_secs(60);
    s.run_to_quiescence(limit);
    let got = s.recv_dones(1);
    assert_eq!(got.len(), msgs.len(), "each message delivered exactly once");
    for (i, r) in got.iter().enumerate() {
        assert_eq!((r.status, r.match_info), (Status::Success, i as u64));
        assert_eq!(r.data, msgs[i], "bytes of message {i}");
    }
    let got = s.recv_dones(0);
    assert_eq!(got.len(), 1, "the peer's message delivered exactly once");
    assert_eq!((got[0].match_info, &got[0].data), (7, &back));
    assert_eq!(sends_done(&mut s, 0), vec![Status::Success; 2]);
    assert_eq!(sends_done(&mut s, 1), vec![Status::Success]);
    assert_eq!(s.nodes[0].ep.pending_requests(), 0);
    assert_eq!(s.nodes[1].ep.pending_requests(), 0);
}

#[test]
fn messages_that_arrived_before_the_outage_are_acked_and_not_delivered_twice() {
    let mut s = connected_pair();
    let to_moved = s.addr(1);
    let now = s.now;
    let msgs = [pattern(4, 20), pattern(5, 3000), pattern(6, 200)];
    for _ in &msgs {
        s.nodes[1].ep.post_recv(now, 0, 0, 1 << 16).unwrap();
    }
    // Node 1 is the one cut off: the messages reach it, its acks are lost.
    let moved_host = s.nodes[1].host;
    s.lose = Some(Box::new(move |from, _| from == moved_host));
    for (i, m) in msgs.iter().enumerate() {
        s.nodes[0].ep.send(now, to_moved, i as u64, m).unwrap();
    }
    let cut = s.now + Config::default().ack_delay * 2;
    s.run_until(cut, |_| false);
    assert_eq!(
        s.recv_dones(1).len(),
        msgs.len(),
        "delivered before the outage"
    );
    assert!(
        sends_done(&mut s, 0).is_empty(),
        "no ack got through the outage"
    );
    s.lose = None;

    // Both ends learn the path is back (the peer too, in this test): the
    // moved one acks what it holds, the peer resends what it thinks is lost;
    // the receiver drops the duplicates.
    let restored = s.now;
    s.nodes[1].ep.path_restored(restored);
    s.nodes[0].ep.path_restored(restored);
    let soon = restored + Duration::from_millis(1);
    assert!(
        s.run_until(soon, |s| has_events(s, 0, msgs.len(), false)),
        "the sends were not acked before the resend delay"
    );
    let limit = s.now + Duration::from_secs(60);
    s.run_to_quiescence(limit);
    assert!(s.recv_dones(1).is_empty(), "a resend was delivered again");
    assert_eq!(sends_done(&mut s, 0), vec![Status::Success; msgs.len()]);
    assert_eq!(s.nodes[0].ep.pending_requests(), 0);
}

#[test]
fn an_acked_endpoint_has_nothing_to_resend() {
    let mut s = connected_pair();
    s.run_to_quiescence(s.now + Duration::from_secs(1));
    let sent = s.nodes[0].sent_frames;
    let now = s.now;
    s.nodes[0].ep.path_restored(now);
    s.pump();
    // At most an explicit ack, and no timer moved earlier than it was.
    assert!(s.nodes[0].sent_frames <= sent + 1);
    assert_eq!(s.nodes[0].ep.next_timeout(), None);
}

#[test]
fn an_ack_marked_resent_makes_the_partner_resend_at_once() {
    let mut s = connected_pair();
    let to_moved = s.addr(0);
    let now = s.now;
    let msg = pattern(7, 500);
    s.nodes[0].ep.post_recv(now, 0, 0, 1 << 16).unwrap();
    // Node 0 must have heard from its peer to ack it: one message first.
    s.nodes[0].ep.post_recv(now, 0, 0, 1 << 16).unwrap();
    s.nodes[1].ep.send(now, to_moved, 1, b"before").unwrap();
    s.run_until(now + Duration::from_millis(100), |s| {
        has_events(s, 0, 1, true)
    });

    // The peer's next message is lost while node 0 is away.
    s.blackhole = true;
    let t = s.now;
    s.nodes[1].ep.send(t, to_moved, 2, &msg).unwrap();
    s.pump();
    s.blackhole = false;
    let restored = s.now;
    s.nodes[0].ep.path_restored(restored);
    assert!(
        s.run_until(restored + Duration::from_millis(1), |s| has_events(
            s, 0, 2, true
        )),
        "the peer did not resend before its resend delay"
    );
    s.run_to_quiescence(s.now + Duration::from_secs(60));
    let got = s.recv_dones(0);
    assert_eq!(got.len(), 2, "each message delivered exactly once");
    assert_eq!((got[1].match_info, &got[1].data), (2, &msg));
    assert_eq!(sends_done(&mut s, 1), vec![Status::Success; 2]);
}

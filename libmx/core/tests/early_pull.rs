//! LARGE messages that arrive before their receive: pulled at once into the library's
//! memory (`Config::early_pull_max`), delivered whole when a receive takes them, with
//! the sender completing only then; and every way that can go otherwise (too large, no
//! room, a failed pull, a receive posted while the pull runs, a reset partner).

mod sim;

use std::time::Duration;

use sim::{Sim, SimChannel};
use xmx_mx::{Config, Endpoint, EndpointEvent, PullNeeded, RdmaWindow, RecvDone, Status};

const KEY: u32 = 0x1234_5678;

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = sim::Rng::with_seed(seed);
    (0..len).map(|_| r.u8(..)).collect()
}

fn pair(config: Config) -> Sim {
    let mut s = Sim::new(7, SimChannel::perfect());
    s.add(1, Endpoint::new(config.clone(), 0, 0xAAAA_0001, KEY));
    s.add(2, Endpoint::new(config, 3, 0xBBBB_0002, KEY));
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    s
}

fn window(id: u8) -> RdmaWindow {
    RdmaWindow {
        id,
        seqnum: 0,
        offset: 0,
    }
}

/// Node 0 sends `data` as a LARGE message through window `id`; returns the send.
fn send(s: &mut Sim, id: u8, data: &[u8]) -> u64 {
    s.register_window(0, window(id), data.to_vec());
    let (now, to) = (s.now, s.addr(1));
    s.nodes[0]
        .ep
        .send_large(now, to, u64::from(id), data.len() as u32, window(id))
        .unwrap()
        .0
}

fn run(s: &mut Sim) {
    let until = s.now + Duration::from_secs(5);
    s.run_to_quiescence(until);
}

fn early_pulls(s: &mut Sim) -> Vec<PullNeeded> {
    s.nodes[1]
        .take_events(|e| matches!(e, EndpointEvent::EarlyPullNeeded(_)))
        .into_iter()
        .filter_map(|e| match e {
            EndpointEvent::EarlyPullNeeded(p) => Some(p),
            _ => None,
        })
        .collect()
}

fn pulls(s: &mut Sim) -> Vec<PullNeeded> {
    s.nodes[1]
        .take_events(|e| matches!(e, EndpointEvent::PullNeeded(_)))
        .into_iter()
        .filter_map(|e| match e {
            EndpointEvent::PullNeeded(p) => Some(p),
            _ => None,
        })
        .collect()
}

fn recv(s: &mut Sim, capacity: usize) -> u64 {
    let now = s.now;
    s.nodes[1].ep.post_recv(now, 0, 0, capacity).unwrap().0
}

fn recv_done(s: &mut Sim) -> Vec<RecvDone> {
    s.pump();
    s.recv_dones(1)
}

#[test]
fn an_unexpected_large_message_is_pulled_at_once_and_its_sender_waits_for_the_receive() {
    let mut s = pair(Config::default());
    let big = pattern(1, 100_000);
    let a = send(&mut s, 1, &big);
    let b = send(&mut s, 2, &big);
    run(&mut s);
    assert_eq!(
        early_pulls(&mut s).len(),
        2,
        "both pulled before any receive"
    );
    assert!(
        s.send_dones(0).is_empty(),
        "a sender completes once a receive took its message, as MX's does"
    );

    let full = recv(&mut s, 200_000);
    let done = recv_done(&mut s);
    assert_eq!(done.len(), 1, "completes as it is posted");
    assert_eq!(
        (done[0].id.0, done[0].status, done[0].xfer_length),
        (full, Status::Success, 100_000)
    );
    assert_eq!(done[0].data, big, "the bytes come with the completion");
    let short = recv(&mut s, 1000);
    let done = recv_done(&mut s);
    assert_eq!(
        (done[0].id.0, done[0].status, done[0].xfer_length),
        (short, Status::Truncated, 1000)
    );
    assert_eq!(done[0].data, big[..1000]);
    assert!(pulls(&mut s).is_empty(), "nothing pulled twice");

    run(&mut s);
    let mut sends = s.send_dones(0);
    sends.sort_by_key(|&(id, _)| id);
    assert_eq!(sends, vec![(a, Status::Success), (b, Status::Success)]);
    assert_eq!(s.nodes[1].ep.pending_requests(), 0);
}

#[test]
fn messages_above_the_limit_or_beyond_the_unexpected_room_wait_for_their_receive() {
    let config = Config {
        early_pull_max: 64 << 10,
        // Early pulls take at most half: 100,000.
        unexpected_bytes_max: 200_000,
        ..Config::default()
    };
    let mut s = pair(config);
    let big = pattern(2, 70_000);
    let small = pattern(3, 60_000);
    send(&mut s, 1, &big);
    send(&mut s, 2, &small);
    send(&mut s, 3, &small);
    run(&mut s);
    let early = early_pulls(&mut s);
    assert_eq!(
        early.len(),
        1,
        "one of 60,000 fits in 100,000; 70,000 is above 64 KiB"
    );
    assert_eq!(early[0].length, 60_000);
    for (want, data) in [(70_000, &big), (60_000, &small), (60_000, &small)] {
        recv(&mut s, 100_000);
        let done = recv_done(&mut s);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].xfer_length, want);
        let got = if done[0].data.is_empty() {
            s.pulled.remove(&(1, done[0].id.0)).unwrap()
        } else {
            done[0].data.clone()
        };
        assert_eq!(&got, data);
    }
}

#[test]
fn a_failed_early_pull_is_pulled_again_into_the_receive_and_a_late_one_completes_it() {
    let mut s = pair(Config::default());
    s.auto_pull = false;
    let first = pattern(4, 50_000);
    let second = pattern(5, 40_000);
    send(&mut s, 1, &first);
    send(&mut s, 2, &second);
    run(&mut s);
    let early = early_pulls(&mut s);
    assert_eq!(early.len(), 2);

    // The first pull fails: the message stays a rendezvous, pulled for its receive.
    let now = s.now;
    s.nodes[1]
        .ep
        .early_pull_done(now, early[0].id, Err(Status::BadRdmawin))
        .unwrap();
    let r1 = recv(&mut s, 50_000);
    assert!(recv_done(&mut s).is_empty());
    let again = pulls(&mut s);
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].id.0, again[0].length), (r1, 50_000));
    let now = s.now;
    s.nodes[1]
        .ep
        .pull_done(now, again[0].id, Status::Success)
        .unwrap();
    let done = recv_done(&mut s);
    assert_eq!((done[0].id.0, done[0].status), (r1, Status::Success));

    // The second's receive comes while its pull runs: it completes when it lands.
    let r2 = recv(&mut s, 40_000);
    assert!(recv_done(&mut s).is_empty());
    assert!(
        !s.nodes[1].ep.cancel(xmx_mx::RequestId(r2)),
        "taken: no longer cancellable"
    );
    let now = s.now;
    s.nodes[1]
        .ep
        .early_pull_done(now, early[1].id, Ok(second.clone()))
        .unwrap();
    let done = recv_done(&mut s);
    assert_eq!((done[0].id.0, done[0].status), (r2, Status::Success));
    assert_eq!(done[0].data, second);
    assert!(
        s.nodes[1]
            .ep
            .early_pull_done(now, early[1].id, Ok(second))
            .is_err(),
        "reported once"
    );

    run(&mut s);
    assert_eq!(s.send_dones(0).len(), 2);
}

#[test]
fn a_reset_partner_takes_its_early_pulled_messages_with_it() {
    let mut s = pair(Config::default());
    let big = pattern(6, 80_000);
    send(&mut s, 1, &big);
    run(&mut s);
    assert_eq!(early_pulls(&mut s).len(), 1);
    assert!(s.nodes[1].ep.probe(0, 0).unwrap().is_some());
    // The sender comes back as a new endpoint (a new session): what it lent before is
    // gone, and so is the message pulled from it that no receive took.
    s.nodes[0].ep = Endpoint::new(Config::default(), 0, 0xAAAA_0009, KEY);
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    run(&mut s);
    assert!(s.nodes[1].ep.probe(0, 0).unwrap().is_none());
    let small = pattern(7, 50_000);
    send(&mut s, 2, &small);
    run(&mut s);
    recv(&mut s, 100_000);
    let done = recv_done(&mut s);
    assert_eq!(done.len(), 1);
    assert_eq!(
        done[0].data, small,
        "the new connection's message, not the old one"
    );
}

/// Early pulls run a bounded number at once: a transport's pulls are a shared quota,
/// and receives posted later must still find room. The rest wait for their receive.
#[test]
fn a_burst_of_unexpected_messages_runs_at_most_sixteen_early_pulls_at_once() {
    let mut s = pair(Config::default());
    s.auto_pull = false;
    let data: Vec<Vec<u8>> = (0..20).map(|i| pattern(10 + i, 40_000)).collect();
    for (i, d) in data.iter().enumerate() {
        send(&mut s, i as u8 + 1, d);
    }
    run(&mut s);
    let early = early_pulls(&mut s);
    assert_eq!(early.len(), 16);
    for (p, d) in early.iter().zip(&data) {
        let now = s.now;
        s.nodes[1]
            .ep
            .early_pull_done(now, p.id, Ok(d.clone()))
            .unwrap();
    }
    for d in &data[..16] {
        recv(&mut s, 40_000);
        let done = recv_done(&mut s);
        assert_eq!(done.len(), 1);
        assert_eq!(&done[0].data, d);
    }
    for _ in 16..20 {
        let r = recv(&mut s, 40_000);
        assert!(recv_done(&mut s).is_empty());
        let p = pulls(&mut s);
        assert_eq!((p.len(), p[0].id.0), (1, r), "pulled for its receive");
    }
}

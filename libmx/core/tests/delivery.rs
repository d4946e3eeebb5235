//! End-to-end scenarios over the simulated network: connect, exactly-once
//! in-order delivery under loss, timeouts, restarts, LARGE messages.

mod sim;

use std::time::Duration;

use sim::{Sim, SimChannel};
use xmx_mx::{Config, Endpoint, EndpointEvent, Instant, RdmaWindow, RecvDone, Status};

const KEY: u32 = 0x1234_5678;

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = sim::Rng::with_seed(seed);
    (0..len).map(|_| r.u8(..)).collect()
}

fn pair(seed: u64, channel: SimChannel, config: Config) -> Sim {
    let mut s = Sim::new(seed, channel);
    s.add(1, Endpoint::new(config.clone(), 0, 0xAAAA_0001, KEY));
    s.add(2, Endpoint::new(config, 3, 0xBBBB_0002, KEY));
    s
}

/// Completed receives of `node`, in the order of their requests (which is
/// matching order: MEDIUMs may complete after later TINYs).
fn recvs(s: &mut Sim, node: usize) -> Vec<RecvDone> {
    let mut v = s.recv_dones(node);
    v.sort_by_key(|r| r.id);
    v
}

fn send_statuses(s: &mut Sim, node: usize) -> Vec<(u64, Status)> {
    let mut v = s.send_dones(node);
    v.sort_by_key(|&(id, _)| id);
    v
}

/// Sends `sizes` from node 0 to node 1 (receives posted first), runs to the
/// end, and checks exactly-once in-order delivery with identical bytes.
fn exchange(s: &mut Sim, sizes: &[usize]) {
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    let to = s.addr(1);
    let now = s.now;
    for _ in sizes {
        s.nodes[1].ep.post_recv(now, 0, 0, 1 << 20).unwrap();
    }
    let msgs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(i as u64, n))
        .collect();
    for (i, m) in msgs.iter().enumerate() {
        s.nodes[0].ep.send(now, to, i as u64, m).unwrap();
    }
    let limit = s.now + Duration::from_secs(3600);
    let n = sizes.len();
    assert!(s.run_until(limit, |s| s.nodes[0].events.len() >= n
        && s.nodes[1].events.len() >= n));
    s.run_to_quiescence(limit);
    let got = recvs(s, 1);
    assert_eq!(got.len(), n, "each message delivered exactly once");
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.match_info, i as u64, "in order");
        assert_eq!(r.status, Status::Success);
        assert_eq!(r.data, msgs[i], "bytes of message {i}");
        assert_eq!(r.source.peer, s.addr(0));
    }
    let sends = send_statuses(s, 0);
    assert_eq!(sends.len(), n);
    assert!(sends.iter().all(|&(_, st)| st == Status::Success));
    assert!(
        s.nodes[0].events.is_empty() && s.nodes[1].events.is_empty(),
        "no stray completions"
    );
    assert_eq!(s.nodes[0].ep.pending_requests(), 0);
    assert_eq!(s.nodes[1].ep.pending_requests(), 0);
}

#[test]
fn lossless_exchange_every_class() {
    let mut s = pair(1, SimChannel::perfect(), Config::default());
    exchange(&mut s, &[0, 1, 32, 33, 128, 129, 4096, 4097, 20000, 32768]);
}

#[test]
fn lossy_reordering_duplicating_exchange() {
    let mut s = pair(
        7,
        SimChannel::lossy(0.25, 0.2, Duration::from_millis(30)),
        Config::default(),
    );
    let sizes: Vec<usize> = (0..60)
        .map(|i| [5, 100, 3000, 9000, 32768, 0][i % 6])
        .collect();
    exchange(&mut s, &sizes);
    assert!(s.dropped > 0);
}

#[test]
fn unexpected_messages_are_kept_in_arrival_order() {
    let mut s = pair(
        3,
        SimChannel::lossy(0.1, 0.1, Duration::from_millis(5)),
        Config::default(),
    );
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    let to = s.addr(1);
    let now = s.now;
    let msgs: Vec<Vec<u8>> = (0..10)
        .map(|i| pattern(100 + i, 50 + 700 * i as usize))
        .collect();
    for (i, m) in msgs.iter().enumerate() {
        s.nodes[0].ep.send(now, to, 0x100 + i as u64, m).unwrap();
    }
    let limit = s.now + Duration::from_secs(600);
    assert!(s.run_until(limit, |s| s.nodes[0].events.len() == 10));
    // All arrived unexpected; a receive matching the odd ones takes them oldest first.
    let now = s.now;
    let info = s.nodes[1]
        .ep
        .probe(0x101, 0xfff_ffff_ffff_ff01)
        .unwrap()
        .unwrap();
    assert_eq!(
        (info.match_info, info.msg_length),
        (0x101, msgs[1].len() as u32)
    );
    for i in [1usize, 3, 5, 7, 9] {
        s.nodes[1]
            .ep
            .post_recv(now, 0x101, 0xfff_ffff_ffff_ff01, 100_000)
            .unwrap();
        let r = recvs(&mut s, 1);
        assert_eq!(r.len(), 1, "completes at once");
        assert_eq!((r[0].match_info, &r[0].data), (0x100 + i as u64, &msgs[i]));
    }
    // A short buffer truncates.
    s.nodes[1].ep.post_recv(now, 0, 0, 10).unwrap();
    let r = recvs(&mut s, 1);
    assert_eq!(
        (r[0].status, r[0].xfer_length, r[0].msg_length),
        (Status::Truncated, 10, msgs[0].len() as u32)
    );
    assert_eq!(r[0].data, msgs[0][..10]);
}

#[test]
fn silent_peer_fails_every_pending_send_with_timeout() {
    let config = Config {
        max_retries: 4,
        ..Config::default()
    };
    let budget = config.retry_budget();
    let mut s = pair(11, SimChannel::perfect(), config);
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    s.blackhole = true;
    let to = s.addr(1);
    let start = s.now;
    let ids: Vec<u64> = (0..5)
        .map(|i| {
            s.nodes[0]
                .ep
                .send(start, to, i, &pattern(i, 3000 * i as usize))
                .unwrap()
                .0
        })
        .collect();
    let limit = start + Duration::from_secs(100_000);
    assert!(s.run_until(limit, |s| s.nodes[0].events.len() == 5));
    assert!(
        s.now <= start + budget,
        "finished within the retry budget ({:?} > {:?})",
        s.now.saturating_since(start),
        budget
    );
    assert_eq!(
        send_statuses(&mut s, 0),
        ids.iter()
            .map(|&i| (i, Status::Timeout))
            .collect::<Vec<_>>()
    );
    // Each message went out once plus max_retries times (MEDIUMs as several frames).
    assert_eq!(s.nodes[0].ep.next_timeout(), None, "nothing left to time");
    // The partner was dropped: sending again needs a new connection.
    assert!(s.nodes[0].ep.send(s.now, to, 0, b"x").is_err());
}

#[test]
fn silent_peer_fails_a_connect_with_timeout() {
    let config = Config {
        max_retries: 2,
        resend_delay: Duration::from_millis(10),
        ..Config::default()
    };
    let mut s = pair(12, SimChannel::perfect(), config);
    s.blackhole = true;
    assert_eq!(s.connect(0, 1, KEY), Status::Timeout);
    assert!(s.now <= Instant::ZERO + Duration::from_millis(10 + 20 + 40));
}

#[test]
fn request_timeout_bounds_a_send() {
    let mut s = pair(13, SimChannel::perfect(), Config::default());
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    s.blackhole = true;
    let to = s.addr(1);
    let start = s.now;
    let id = s.nodes[0].ep.send(start, to, 1, b"hello").unwrap();
    assert!(s.nodes[0]
        .ep
        .set_request_timeout(id, Duration::from_millis(1200)));
    assert!(s.run_until(start + Duration::from_secs(60), |s| !s.nodes[0]
        .events
        .is_empty()));
    assert_eq!(s.now, start + Duration::from_millis(1200));
    assert_eq!(send_statuses(&mut s, 0), vec![(id.0, Status::Timeout)]);
}

#[test]
fn wrong_key_is_refused() {
    let mut s = pair(4, SimChannel::perfect(), Config::default());
    assert_eq!(s.connect(0, 1, KEY ^ 1), Status::BadKey);
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
}

#[test]
fn connects_survive_loss() {
    let mut s = pair(
        5,
        SimChannel::lossy(0.5, 0.3, Duration::from_millis(50)),
        Config::default(),
    );
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    assert_eq!(s.connect(1, 0, KEY), Status::Success);
}

#[test]
fn restarted_peer_gets_bad_session_then_reconnects() {
    let mut s = pair(6, SimChannel::perfect(), Config::default());
    exchange(&mut s, &[10, 200]);
    // Node 1 closes and reopens: same address, new session.
    s.nodes[1].ep = Endpoint::new(Config::default(), 3, 0xBBBB_0003, KEY);
    let to = s.addr(1);
    let now = s.now;
    let id = s.nodes[0]
        .ep
        .send(now, to, 9, b"to the old session")
        .unwrap();
    assert!(s.run_until(now + Duration::from_secs(60), |s| !s.nodes[0]
        .events
        .is_empty()));
    assert_eq!(send_statuses(&mut s, 0), vec![(id.0, Status::BadSession)]);
    // Reconnecting learns the new session and restarts the sequence numbers.
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    let now = s.now;
    s.nodes[1].ep.post_recv(now, 0, 0, 64).unwrap();
    s.nodes[0].ep.send(now, to, 10, b"new").unwrap();
    s.run_to_quiescence(now + Duration::from_secs(60));
    let r = recvs(&mut s, 1);
    assert_eq!((r.len(), r[0].data.as_slice()), (1, &b"new"[..]));
}

#[test]
fn restarted_sender_is_seen_as_a_new_partner() {
    let mut s = pair(8, SimChannel::perfect(), Config::default());
    exchange(&mut s, &[10, 5000]);
    s.nodes[0].ep = Endpoint::new(Config::default(), 0, 0xAAAA_0009, KEY);
    exchange(&mut s, &[7, 7000, 70]);
}

#[test]
fn replies_go_back_to_the_source_without_connecting() {
    let mut s = pair(
        9,
        SimChannel::lossy(0.2, 0.1, Duration::from_millis(3)),
        Config::default(),
    );
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    let now = s.now;
    let to = s.addr(1);
    s.nodes[1].ep.post_recv(now, 0, 0, 100).unwrap();
    s.nodes[0].ep.post_recv(now, 0, 0, 100).unwrap();
    s.nodes[0].ep.send(now, to, 1, b"ping").unwrap();
    assert!(s.run_until(now + Duration::from_secs(60), |s| !s.nodes[1]
        .events
        .is_empty()));
    let src = recvs(&mut s, 1)[0].source;
    let now = s.now;
    s.nodes[1].ep.send(now, src.peer, 2, b"pong").unwrap();
    s.run_to_quiescence(now + Duration::from_secs(60));
    let r = recvs(&mut s, 0);
    assert_eq!(r[0].data, b"pong");
    assert_eq!(r[0].source.session, 0xBBBB_0002);
}

#[test]
fn sequence_numbers_wrap() {
    // 20000 messages each way cross the 14-bit wrap of both directions.
    let mut s = pair(10, SimChannel::perfect(), Config::default());
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    assert_eq!(s.connect(1, 0, KEY), Status::Success);
    let (a, b) = (s.addr(0), s.addr(1));
    let total = 20_000u64;
    let mut sent = 0;
    let mut received = [0u64; 2];
    while received[0] < total || received[1] < total {
        let now = s.now;
        // Keep a bounded number in flight so the run stays small.
        if sent < total && s.nodes[0].ep.pending_requests() < 64 {
            for _ in 0..32 {
                s.nodes[0]
                    .ep
                    .send(now, b, sent, &sent.to_le_bytes())
                    .unwrap();
                s.nodes[1]
                    .ep
                    .send(now, a, sent, &sent.to_le_bytes())
                    .unwrap();
                s.nodes[0].ep.post_recv(now, 0, 0, 8).unwrap();
                s.nodes[1].ep.post_recv(now, 0, 0, 8).unwrap();
                sent += 1;
            }
        }
        s.step();
        for (n, count) in received.iter_mut().enumerate() {
            for r in recvs(&mut s, n) {
                assert_eq!(r.match_info, *count, "in order across the wrap");
                assert_eq!(r.data, count.to_le_bytes());
                *count += 1;
            }
            s.nodes[n].take_events(|e| {
                matches!(
                    e,
                    EndpointEvent::SendDone {
                        status: Status::Success,
                        ..
                    }
                )
            });
            assert!(s.nodes[n].events.is_empty());
        }
    }
}

#[test]
fn throttled_sends_wait_for_acks_and_all_arrive() {
    // Frames take a long time: more than the send window is outstanding.
    let channel = SimChannel {
        loss: 0.0,
        dup: 0.0,
        delay_min: Duration::from_millis(100),
        delay_max: Duration::from_millis(100),
    };
    let config = Config {
        send_window: xmx_mx::seqnum::THROTTLE_WINDOW,
        ..Config::default()
    };
    let mut s = pair(14, channel, config);
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    let to = s.addr(1);
    let now = s.now;
    let n = 9000u64;
    for i in 0..n {
        s.nodes[1].ep.post_recv(now, 0, 0, 8).unwrap();
        s.nodes[0].ep.send(now, to, i, &i.to_be_bytes()).unwrap();
    }
    s.pump();
    // Only the window's worth left at once.
    assert_eq!(
        s.nodes[0].sent_frames,
        u64::from(xmx_mx::seqnum::THROTTLE_WINDOW) + 1
    );
    s.run_to_quiescence(now + Duration::from_secs(3600));
    let r = recvs(&mut s, 1);
    assert_eq!(r.len() as u64, n);
    assert!(r
        .iter()
        .enumerate()
        .all(|(i, r)| r.match_info == i as u64 && r.data == (i as u64).to_be_bytes()));
    assert_eq!(send_statuses(&mut s, 0).len() as u64, n);
}

#[test]
fn large_messages_are_pulled_and_notified() {
    let mut s = pair(
        15,
        SimChannel::lossy(0.2, 0.2, Duration::from_millis(10)),
        Config::default(),
    );
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    let to = s.addr(1);
    let now = s.now;
    let big = pattern(99, 100_000);
    let window = RdmaWindow {
        id: 7,
        seqnum: 3,
        offset: 0,
    };
    s.register_window(0, window, big.clone());
    let full = s.nodes[1].ep.post_recv(now, 0, 0, 200_000).unwrap();
    let short = s.nodes[1].ep.post_recv(now, 0, 0, 1000).unwrap();
    let a = s.nodes[0]
        .ep
        .send_large(now, to, 1, big.len() as u32, window)
        .unwrap();
    let b = s.nodes[0]
        .ep
        .send_large(now, to, 2, big.len() as u32, window)
        .unwrap();
    s.run_to_quiescence(now + Duration::from_secs(600));
    let r = recvs(&mut s, 1);
    assert_eq!(r.len(), 2);
    assert_eq!(
        (r[0].id, r[0].status, r[0].xfer_length),
        (full, Status::Success, 100_000)
    );
    assert_eq!(
        (r[1].id, r[1].status, r[1].xfer_length),
        (short, Status::Truncated, 1000)
    );
    assert_eq!(s.pulled[&(1, full.0)], big);
    assert_eq!(s.pulled[&(1, short.0)], big[..1000]);
    let sends: Vec<EndpointEvent> = s.nodes[0].take_events(|_| true);
    assert!(sends.contains(&EndpointEvent::SendDone {
        id: a,
        status: Status::Success,
        xfer_length: 100_000
    }));
    assert!(sends.contains(&EndpointEvent::SendDone {
        id: b,
        status: Status::Success,
        xfer_length: 1000
    }));
}

#[test]
fn large_message_into_empty_buffer_needs_no_pull() {
    let mut s = pair(16, SimChannel::perfect(), Config::default());
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    let now = s.now;
    let to = s.addr(1);
    s.nodes[1].ep.post_recv(now, 0, 0, 0).unwrap();
    s.nodes[0]
        .ep
        .send_large(
            now,
            to,
            1,
            50_000,
            RdmaWindow {
                id: 1,
                seqnum: 0,
                offset: 0,
            },
        )
        .unwrap();
    s.run_to_quiescence(now + Duration::from_secs(60));
    assert!(s.pulled.is_empty());
    let r = recvs(&mut s, 1);
    assert_eq!((r[0].status, r[0].xfer_length), (Status::Truncated, 0));
    assert_eq!(send_statuses(&mut s, 0)[0].1, Status::Success);
}

#[test]
fn large_send_whose_receiver_never_pulls_times_out() {
    let config = Config {
        rendezvous_timeout: Some(Duration::from_secs(30)),
        ..Config::default()
    };
    let mut s = pair(17, SimChannel::perfect(), config);
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    let now = s.now;
    let to = s.addr(1);
    // No receive is posted: the RNDV is acked and waits, unexpected.
    let id = s.nodes[0]
        .ep
        .send_large(
            now,
            to,
            1,
            40_000,
            RdmaWindow {
                id: 2,
                seqnum: 0,
                offset: 0,
            },
        )
        .unwrap();
    assert!(s.run_until(now + Duration::from_secs(3600), |s| !s.nodes[0]
        .events
        .is_empty()));
    // The RNDV arrives after 10 us, its delayed ack leaves one ack delay later
    // and arrives 10 us after that; the wait for the pull starts there.
    let acked_at = now + Duration::from_micros(20) + Config::default().ack_delay;
    assert_eq!(s.now, acked_at + Duration::from_secs(30));
    assert_eq!(send_statuses(&mut s, 0), vec![(id.0, Status::Timeout)]);
}

#[test]
fn an_endpoint_can_talk_to_itself() {
    let mut s = Sim::new(18, SimChannel::lossy(0.2, 0.2, Duration::from_millis(2)));
    s.add(1, Endpoint::new(Config::default(), 0, 0x5E1F, KEY));
    assert_eq!(s.connect(0, 0, KEY), Status::Success);
    let me = s.addr(0);
    let now = s.now;
    let msgs: Vec<Vec<u8>> = (0..5).map(|i| pattern(i, 1000 * i as usize)).collect();
    for (i, m) in msgs.iter().enumerate() {
        s.nodes[0].ep.post_recv(now, 0, 0, 10_000).unwrap();
        s.nodes[0].ep.send(now, me, i as u64, m).unwrap();
    }
    s.run_to_quiescence(now + Duration::from_secs(600));
    let got = recvs(&mut s, 0);
    assert_eq!(
        got.iter().map(|r| &r.data).collect::<Vec<_>>(),
        msgs.iter().collect::<Vec<_>>()
    );
    assert_eq!(send_statuses(&mut s, 0).len(), 5);
}

/// Node 1 answers node 0 (sequenced NOTIFY or replies to the source) before
/// it connects back; then it connects back and sends `pong` to the address
/// the connect returned, which node 0 must receive.
fn answer_then_connect_back(s: &mut Sim, first: &[u8], replies_before: usize) {
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    let (a, b) = (s.addr(0), s.addr(1));
    let now = s.now;
    let window = RdmaWindow {
        id: 4,
        seqnum: 1,
        offset: 0,
    };
    s.register_window(0, window, first.to_vec());
    s.nodes[1].ep.post_recv(now, 0, 0, first.len()).unwrap();
    s.nodes[0]
        .ep
        .send_large(now, b, 1, first.len() as u32, window)
        .unwrap();
    let limit = now + Duration::from_secs(600);
    assert!(s.run_until(limit, |s| s.nodes[1]
        .events
        .iter()
        .any(|e| matches!(e, EndpointEvent::RecvDone(_)))));
    let got = recvs(s, 1);
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].status, got[0].xfer_length),
        (Status::Success, first.len() as u32)
    );
    assert_eq!(s.pulled[&(1, got[0].id.0)], first);
    let source = got[0].source;
    let now = s.now;
    for i in 0..replies_before {
        s.nodes[0].ep.post_recv(now, 0, 0, 100).unwrap();
        s.nodes[1]
            .ep
            .send(now, source.peer, 10 + i as u64, b"early")
            .unwrap();
    }
    s.run_to_quiescence(limit);
    assert_eq!(s.connect(1, 0, KEY), Status::Success);
    let now = s.now;
    s.nodes[0].ep.post_recv(now, 0, 0, 100).unwrap();
    s.nodes[1].ep.send(now, a, 2, b"pong").unwrap();
    s.run_to_quiescence(s.now + Duration::from_secs(600));
    let r = recvs(s, 0);
    let data: Vec<(u64, &[u8])> = r.iter().map(|r| (r.match_info, &r.data[..])).collect();
    let mut want: Vec<(u64, &[u8])> = (0..replies_before)
        .map(|i| (10 + i as u64, &b"early"[..]))
        .collect();
    want.push((2, b"pong"));
    assert_eq!(data, want, "every reply arrives once, in order");
    assert!(r.iter().all(|r| r.source.session == 0xBBBB_0002));
    assert!(send_statuses(s, 0)
        .iter()
        .all(|&(_, st)| st == Status::Success));
    let sends = send_statuses(s, 1);
    assert_eq!(sends.len(), replies_before + 1);
    assert!(sends.iter().all(|&(_, st)| st == Status::Success));
    assert_eq!(s.nodes[0].ep.pending_requests(), 0);
    assert_eq!(s.nodes[1].ep.pending_requests(), 0);
}

/// The NOTIFY of a first LARGE message is a sequenced frame from the receiver:
/// when the receiver then connects back, the sender must not restart its
/// receive window, or everything after the NOTIFY looks early forever.
#[test]
fn connecting_back_after_a_first_large_message() {
    let mut s = pair(19, SimChannel::perfect(), Config::default());
    answer_then_connect_back(&mut s, &pattern(19, 65_536), 0);
}

#[test]
fn connecting_back_after_a_first_large_message_under_loss() {
    let mut s = pair(
        20,
        SimChannel::lossy(0.2, 0.2, Duration::from_millis(5)),
        Config::default(),
    );
    answer_then_connect_back(&mut s, &pattern(20, 200_000), 0);
}

#[test]
fn connecting_back_after_replying_to_the_source() {
    let mut s = pair(21, SimChannel::perfect(), Config::default());
    answer_then_connect_back(&mut s, &pattern(21, 40_000), 3);
}

#[test]
fn large_receive_completes_even_if_the_sender_leaves_before_acking_the_notify() {
    let mut s = pair(18, SimChannel::perfect(), Config::default());
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    let to = s.addr(1);
    let now = s.now;
    let big = pattern(5, 40_000);
    let window = RdmaWindow {
        id: 3,
        seqnum: 1,
        offset: 0,
    };
    s.register_window(0, window, big.clone());
    let rid = s.nodes[1].ep.post_recv(now, 0, 0, 40_000).unwrap();
    let sid = s.nodes[0]
        .ep
        .send_large(now, to, 9, big.len() as u32, window)
        .unwrap();
    // The sender is notified; it closes at once, so nothing of it reaches the
    // receiver again: not the ack of the NOTIFY either.
    assert!(s.run_until(now + Duration::from_secs(60), |s| s.nodes[0]
        .events
        .iter()
        .any(|e| matches!(e, EndpointEvent::SendDone { .. }))));
    s.blackhole = true;
    assert_eq!(send_statuses(&mut s, 0), vec![(sid.0, Status::Success)]);
    s.run_to_quiescence(s.now + Duration::from_secs(3600));
    let r = recvs(&mut s, 1);
    assert_eq!(r.len(), 1, "one completion, not a late failure: {r:?}");
    assert_eq!(
        (r[0].id, r[0].status, r[0].match_info, r[0].xfer_length),
        (rid, Status::Success, 9, 40_000)
    );
    assert_eq!(s.pulled[&(1, rid.0)], big);
    // The receiver gave up on the NOTIFY quietly: no timer is left running.
    assert_eq!(s.nodes[1].ep.next_timeout(), None);
}

#[test]
fn closing_flushes_the_acks_still_owed() {
    let mut s = pair(19, SimChannel::perfect(), Config::default());
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    let to = s.addr(1);
    let now = s.now;
    s.nodes[1].ep.post_recv(now, 0, 0, 64).unwrap();
    let id = s.nodes[0].ep.send(now, to, 4, &[7u8; 32]).unwrap();
    // Deliver the message, then close the receiver before its delayed ack is due.
    assert!(s.run_until(now + Duration::from_secs(1), |s| s.nodes[1]
        .events
        .iter()
        .any(|e| matches!(e, EndpointEvent::RecvDone(_)))));
    assert!(send_statuses(&mut s, 0).is_empty(), "not acked yet");
    s.nodes[1].ep.flush_acks();
    let mut acks = Vec::new();
    while let Some(f) = s.nodes[1].ep.poll_transmit() {
        acks.push(f);
    }
    assert_eq!(acks.len(), 1, "one explicit ack: {acks:?}");
    let from = s.nodes[1].host;
    for f in acks {
        s.inject(from, f);
    }
    // The receiver is gone: nothing else of it reaches the sender.
    s.blackhole = true;
    s.step();
    assert_eq!(send_statuses(&mut s, 0), vec![(id.0, Status::Success)]);
}

#[test]
fn a_small_send_window_holds_sends_until_acks_and_all_arrive() {
    let config = Config {
        send_window: 2,
        imm_ack_threshold: 1,
        ..Config::default()
    };
    assert_eq!(config.effective_send_window(), 2);
    let mut s = pair(20, SimChannel::perfect(), config);
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    let to = s.addr(1);
    let now = s.now;
    for i in 0..10u64 {
        s.nodes[1].ep.post_recv(now, 0, 0, 64).unwrap();
        s.nodes[0].ep.send(now, to, i, &[i as u8; 8]).unwrap();
    }
    // Only the window's worth leaves before any ack comes back.
    let mut first = 0;
    while let Some(f) = s.nodes[0].ep.poll_transmit() {
        assert!(sim::is_message(&f), "{f:?}");
        first += 1;
        s.inject(s.nodes[0].host, f);
    }
    assert_eq!(first, 2);
    s.run_to_quiescence(now + Duration::from_secs(60));
    let r = recvs(&mut s, 1);
    let got: Vec<u64> = r.iter().map(|r| r.match_info).collect();
    assert_eq!(got, (0..10).collect::<Vec<_>>());
    assert!(send_statuses(&mut s, 0)
        .iter()
        .all(|&(_, st)| st == Status::Success));
}

#[test]
fn the_send_window_never_falls_below_twice_the_ack_threshold() {
    let c = Config {
        send_window: 1,
        imm_ack_threshold: 4,
        ..Config::default()
    };
    assert_eq!(c.effective_send_window(), 8);
    let big = Config {
        send_window: u16::MAX,
        ..Config::default()
    };
    assert_eq!(big.effective_send_window(), xmx_mx::seqnum::THROTTLE_WINDOW);
}

/// An application streams 128 TINY sends and closes as soon as MX reports
/// them complete (at buffering, before their acks): the endpoint lets the
/// sends the window held back leave before it goes, and the receiver gets
/// every one.
#[test]
fn a_closing_sender_lets_its_held_sends_leave_first() {
    let mut s = pair(21, SimChannel::perfect(), Config::default());
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    let to = s.addr(1);
    let now = s.now;
    let n = 128u64;
    for i in 0..n {
        s.nodes[1].ep.post_recv(now, 0, 0, 8).unwrap();
        s.nodes[0].ep.send(now, to, i, &i.to_be_bytes()).unwrap();
    }
    let window = u64::from(xmx_mx::config::DEFAULT_SEND_WINDOW);
    assert_eq!(s.nodes[0].ep.held_sends() as u64, n - window);
    // The close: acks flushed, then progress only until nothing it owes is
    // left (what the close waits for), then the sender is gone.
    s.nodes[0].ep.flush_acks();
    let limit = s.now + Duration::from_secs(60);
    assert!(s.run_until(limit, |s| {
        let ep = &s.nodes[0].ep;
        ep.held_sends() + ep.unacked_notifies() == 0
    }));
    s.pump();
    s.blackhole = true;
    s.run_to_quiescence(limit);
    let r = recvs(&mut s, 1);
    assert_eq!(r.len() as u64, n, "every send reached the receiver");
    assert!(r
        .iter()
        .enumerate()
        .all(|(i, r)| r.match_info == i as u64 && r.data == (i as u64).to_be_bytes()));
}

/// A receiver that reopened refuses every message of the old connection
/// with a NACK, which acks nothing: sends held behind a window full of
/// refused messages are sent (and refused) in their turn instead of waiting
/// for acks that never come.
#[test]
fn refused_messages_free_the_send_window() {
    let config = Config::default();
    let window = u64::from(config.effective_send_window());
    let mut s = pair(22, SimChannel::perfect(), config.clone());
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    s.nodes[1].ep = Endpoint::new(config, 3, 0xBBBB_0003, KEY);
    let to = s.addr(1);
    let now = s.now;
    let n = 3 * window + 5;
    let ids: Vec<u64> = (0..n)
        .map(|i| s.nodes[0].ep.send(now, to, i, b"old").unwrap().0)
        .collect();
    assert_eq!(s.nodes[0].ep.held_sends() as u64, n - window);
    // Each window's refusals are believed a resend delay after their NACKs.
    let rounds = (n / window + 1) as u32;
    let limit = now + Duration::from_secs(1) + s.nodes[0].ep.config().resend_delay * rounds;
    assert!(s.run_until(limit, |s| s.nodes[0].events.len() as u64 >= n));
    let done = send_statuses(&mut s, 0);
    assert_eq!(
        done,
        ids.iter()
            .map(|&id| (id, Status::BadSession))
            .collect::<Vec<_>>()
    );
    assert_eq!(s.nodes[0].ep.held_sends(), 0);
    assert_eq!(s.nodes[0].ep.pending_requests(), 0);
}

/// One partner streaming the largest MEDIUMs never has more fragments in
/// flight than a receiving guest queues (128), with the default window.
#[test]
fn the_default_window_bounds_medium_fragments_in_flight() {
    let frags_per_medium = xmx_mx::medium::FRAGS_MAX as u64;
    let window = u64::from(Config::default().effective_send_window());
    assert!(window * frags_per_medium <= 128);
    assert!(window >= 2 * u64::from(Config::default().imm_ack_threshold));
    let channel = SimChannel {
        loss: 0.0,
        dup: 0.0,
        delay_min: Duration::from_millis(1),
        delay_max: Duration::from_millis(1),
    };
    let mut s = pair(23, channel, Config::default());
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    let to = s.addr(1);
    let now = s.now;
    let data = pattern(5, xmx_mx::MEDIUM_MAX);
    let before = s.nodes[0].sent_frames;
    for i in 0..64 {
        s.nodes[1].ep.post_recv(now, 0, 0, 1 << 20).unwrap();
        s.nodes[0].ep.send(now, to, i, &data).unwrap();
    }
    s.pump();
    assert_eq!(s.nodes[0].sent_frames - before, window * frags_per_medium);
    s.run_to_quiescence(now + Duration::from_secs(60));
    let r = recvs(&mut s, 1);
    assert_eq!(r.len(), 64);
    assert!(r.iter().all(|r| r.data == data));
}

/// MX connects an endpoint to itself at open: after `connect_self`, sends
/// to its own address go without a handshake (under loss too), and a later
/// connect to itself succeeds without disturbing the sequence numbers.
#[test]
fn an_endpoint_connected_to_itself_at_open_sends_at_once() {
    let mut s = Sim::new(19, SimChannel::lossy(0.2, 0.2, Duration::from_millis(2)));
    s.add(1, Endpoint::new(Config::default(), 0, 0x5E1F, KEY));
    let me = s.addr(0);
    s.nodes[0].ep.connect_self(me);
    let now = s.now;
    let msgs: Vec<Vec<u8>> = (0..6).map(|i| pattern(i, 700 * i as usize)).collect();
    for (i, m) in msgs.iter().enumerate().take(3) {
        s.nodes[0].ep.post_recv(now, 0, 0, 10_000).unwrap();
        s.nodes[0].ep.send(now, me, i as u64, m).unwrap();
    }
    s.run_to_quiescence(now + Duration::from_secs(600));
    assert_eq!(s.connect(0, 0, KEY), Status::Success);
    let now = s.now;
    for (i, m) in msgs.iter().enumerate().skip(3) {
        s.nodes[0].ep.post_recv(now, 0, 0, 10_000).unwrap();
        s.nodes[0].ep.send(now, me, i as u64, m).unwrap();
    }
    s.run_to_quiescence(now + Duration::from_secs(600));
    let got = recvs(&mut s, 0);
    assert_eq!(
        got.iter().map(|r| &r.data).collect::<Vec<_>>(),
        msgs.iter().collect::<Vec<_>>()
    );
    assert!(got.iter().all(|r| r.source.session == 0x5E1F));
    let sent = send_statuses(&mut s, 0);
    assert_eq!(sent.len(), 6);
    assert!(
        sent.iter().all(|(_, st)| *st == Status::Success),
        "{sent:?}"
    );
}

#[test]
fn a_stall_report_names_what_waits_and_nothing_once_it_is_done() {
    let mut s = pair(21, SimChannel::perfect(), Config::default());
    assert_eq!(s.connect(0, 1, KEY), Status::Success);
    let to = s.addr(1);
    let now = s.now;
    let big = pattern(5, 70_000);
    let window = RdmaWindow {
        id: 4,
        seqnum: 9,
        offset: 0,
    };
    s.register_window(0, window, big.clone());
    let id = s.nodes[0]
        .ep
        .send_large(now, to, 0x77, big.len() as u32, window)
        .unwrap();
    let waiting = s.nodes[0].ep.stall_report(now);
    assert!(
        waiting.contains("sends eager 0, large 1"),
        "the LARGE send is counted:\n{waiting}"
    );
    assert!(
        waiting.contains(&format!(
            "send {} to {}:{} match 0x77",
            id.0, to.peer_index, to.endpoint
        )) && waiting.contains("70000 bytes window 4/9, notified None"),
        "the LARGE send is listed with its window:\n{waiting}"
    );
    assert!(
        waiting.contains(&format!("partner {}:{}", to.peer_index, to.endpoint))
            && waiting.contains("unacked 1"),
        "the partner shows the message unacked:\n{waiting}"
    );
    let recv = s.nodes[1].ep.post_recv(now, 0x77, !0, 70_000).unwrap();
    s.run_to_quiescence(now + Duration::from_secs(60));
    assert_eq!(recvs(&mut s, 1)[0].id, recv);
    assert_eq!(s.pulled[&(1, recv.0)], big);
    let done = s.nodes[0].ep.stall_report(s.now);
    assert!(
        done.contains(": 0 requests") && !done.contains("partner"),
        "nothing waits once the message is through:\n{done}"
    );
}

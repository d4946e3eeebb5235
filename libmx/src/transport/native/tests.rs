//! Two native boards joined by a datagram socket pair: the transport's
//! behaviour without an interface or privileges.

use std::sync::Arc;
use std::time::{Duration, Instant};

use xmx_engine::DropReason;
use xmx_mx::frame::{ConnectRequest, MediumFrag, Message, MessageKind};
use xmx_mx::{Body, Frame, PeerAddr, RequestId, Seqnum, Status};
use xmx_wire::mxoe::{Mac, NackType};

use super::*;
use crate::segments::Segments;
use crate::transport::PullProgress;

const MAC_A: Mac = Mac([2, 0, 0, 0, 0xa, 1]);
const MAC_B: Mac = Mac([2, 0, 0, 0, 0xb, 2]);
/// Index of A and B in both tables.
const IDX_A: u16 = 0;
const IDX_B: u16 = 1;

fn config(name: &str, peers: Vec<PeersFileEntry>) -> NativeConfig {
    NativeConfig {
        iface: "test".into(),
        hostname: board_name(name),
        peers,
        nic_spin: Duration::ZERO,
        qdisc_bypass: true,
        ack_delay: DEFAULT_ACK_DELAY,
        resend_delay: None,
        pull_timeout: Some(Duration::from_millis(50)),
        pull_reply_frames: None,
        discovery_wait: Duration::from_secs(2),
        linger: Duration::ZERO,
    }
}

fn spec(index: u16, mac: Mac, hostname: Option<&str>) -> PeersFileEntry {
    PeersFileEntry {
        index: Some(index),
        mac: mac.to_string(),
        hostname: hostname.map(Into::into),
    }
}

/// Boards A ("ha") and B ("hb"), each listing the other; A does not know
/// B's hostname unless `a_knows_b`.
fn boards(a_knows_b: bool) -> (Arc<Native>, Arc<Native>) {
    let (wa, wb) = SeqpacketWire::pair(MAC_A, MAC_B).expect("socketpair");
    (board_a(wa, a_knows_b), board_b(wb))
}

/// Board A ("ha") on `wire`, knowing B's hostname if `knows_b`.
fn board_a(wire: SeqpacketWire, knows_b: bool) -> Arc<Native> {
    let b_name = knows_b.then_some("hb");
    let peers = vec![spec(IDX_A, MAC_A, None), spec(IDX_B, MAC_B, b_name)];
    Native::start(config("ha", peers), Box::new(wire)).expect("board A")
}

/// Board B ("hb") on `wire`.
fn board_b(wire: SeqpacketWire) -> Arc<Native> {
    let peers = vec![spec(IDX_A, MAC_A, Some("ha")), spec(IDX_B, MAC_B, None)];
    Native::start(config("hb", peers), Box::new(wire)).expect("board B")
}

fn bell() -> Arc<Doorbell> {
    Arc::new(Doorbell::new(Duration::ZERO, 0, None))
}

/// Waits on `bell` until `f` finds something (5 s at most).
fn wait_for<T>(bell: &Doorbell, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let seen = bell.generation();
        if let Some(x) = f() {
            return x;
        }
        assert!(Instant::now() < deadline, "nothing arrived in time");
        bell.wait(seen, Some(deadline));
    }
}

/// The next frame of `port`, waited for as the library's own waits do: a
/// round that finds nothing looks at the port once more before sleeping
/// (`before_sleep`), since its last look may have left frames another thread
/// took in since (5 s at most).
fn next_frame(port: &mut Box<dyn TransportPort>, bell: &Doorbell) -> Frame<Vec<u8>> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let seen = bell.generation();
        if let Some(f) = port.receive() {
            return f;
        }
        if port.before_sleep() {
            continue;
        }
        assert!(Instant::now() < deadline, "no frame in time");
        bell.wait(seen, Some(deadline));
    }
}

/// The fragments of a MEDIUM message of `data` from endpoint `ends.0` to
/// endpoint `ends.1` of peer `to_peer`, whose session is `session`.
fn medium_fragments(
    data: &[u8],
    to_peer: u16,
    ends: (u8, u8),
    session: u32,
    match_info: u64,
) -> Vec<Frame<Vec<u8>>> {
    data.chunks(4096)
        .enumerate()
        .map(|(i, chunk)| Frame {
            peer_index: to_peer,
            dst_endpoint: ends.1,
            src_endpoint: ends.0,
            body: Body::Message(Message {
                session,
                seqnum: Seqnum::from_raw(1),
                piggyack: Seqnum::from_raw(0),
                match_info,
                kind: MessageKind::Medium(MediumFrag {
                    msg_length: data.len() as u32,
                    frag_seqnum: i as u8,
                    frag_pipeline: 12,
                }),
                payload: chunk.to_vec(),
            }),
        })
        .collect()
}

fn connect(from: u8, to_peer: u16, to: u8, session: u32) -> Frame<Vec<u8>> {
    Frame {
        peer_index: to_peer,
        dst_endpoint: to,
        src_endpoint: from,
        body: Body::ConnectRequest(ConnectRequest {
            lib_seqnum: 0,
            src_session: session,
            app_key: 0x5eed,
            target_recv_seqnum_start: Seqnum::from_raw(0),
            connect_seqnum: 1,
        }),
    }
}

fn segments(buf: &mut [u8]) -> Segments {
    // SAFETY: every buffer passed here outlives the transfers of its test.
    unsafe { Segments::from_parts(vec![(buf.as_mut_ptr() as usize, buf.len())]) }
}

#[test]
fn connects_and_medium_messages_cross_between_boards() {
    let (a, b) = boards(true);
    let mut pa = a.open(0, Some(1), bell(), false).unwrap();
    let bell_b = bell();
    let mut pb = b.open(0, Some(2), bell_b.clone(), false).unwrap();
    assert_eq!(
        b.open(0, Some(2), bell(), false).err(),
        Some(OpenError::Busy(2))
    );
    assert_eq!(
        b.open(1, None, bell(), false).err(),
        Some(OpenError::BoardUnknown(1))
    );

    let sent = connect(1, IDX_B, 2, pa.session());
    pa.transmit(sent.clone());
    let got = next_frame(&mut pb, &bell_b);
    assert_eq!(
        got,
        Frame {
            peer_index: IDX_A,
            ..sent
        }
    );

    // A MEDIUM message goes as one request once its fragments are in.
    let data: Vec<u8> = (0..9000u32).map(|i| (i % 251) as u8).collect();
    let frags = medium_fragments(&data, IDX_B, (1, 2), pb.session(), 77);
    for f in &frags {
        pa.transmit(f.clone());
    }
    let mut got = Vec::new();
    while got.len() < frags.len() {
        got.push(next_frame(&mut pb, &bell_b));
    }
    let expected: Vec<_> = frags
        .into_iter()
        .map(|f| Frame {
            peer_index: IDX_A,
            ..f
        })
        .collect();
    assert_eq!(got, expected);
    assert_eq!(a.counters(), BoardCounters::default());
    assert_eq!(b.counters(), BoardCounters::default());
}

#[test]
fn a_closed_endpoint_is_nacked_by_the_peer_board() {
    let (a, b) = boards(true);
    let bell_a = bell();
    let mut pa = a.open(0, Some(1), bell_a.clone(), false).unwrap();
    let pb = b.open(0, Some(2), bell(), false).unwrap();
    drop(pb);
    pa.transmit(connect(1, IDX_B, 2, pa.session()));
    let got = next_frame(&mut pa, &bell_a);
    assert_eq!(
        got,
        Frame {
            peer_index: IDX_B,
            dst_endpoint: 1,
            src_endpoint: 2,
            body: Body::Nack(xmx_mx::frame::Nack {
                nack_type: 2,
                lib_seqnum: Seqnum::from_raw(0)
            })
        }
    );
}

/// Boards A and B, endpoint 1's port on A, endpoint 2's on B, B's doorbell.
type ConnectedBoards = (
    Arc<Native>,
    Arc<Native>,
    Box<dyn TransportPort>,
    Box<dyn TransportPort>,
    Arc<Doorbell>,
);

/// Boards A and B with endpoint 1 open on A and 2 on B, B knowing A's session from A's
/// connect request.
fn connected_boards() -> ConnectedBoards {
    let (a, b) = boards(true);
    let mut pa = a.open(0, Some(1), bell(), false).unwrap();
    let bell_b = bell();
    let mut pb = b.open(0, Some(2), bell_b.clone(), false).unwrap();
    pa.transmit(connect(1, IDX_B, 2, pa.session()));
    next_frame(&mut pb, &bell_b);
    (a, b, pa, pb, bell_b)
}

#[test]
fn large_data_is_pulled_from_the_senders_buffer_until_released() {
    let (a, b, pa, pb, bell_b) = connected_boards();

    let mut src: Vec<u8> = (0..300_000u32).map(|i| (i * 13 % 256) as u8).collect();
    let window = pa.regions().register(&segments(&mut src)).expect("window");
    let mut dst = vec![0u8; 300_000];
    let from = PeerAddr::new(IDX_A, 1);
    let regions = pb.regions();
    let started = regions.pull(RequestId(9), from, window, &segments(&mut dst), 250_001);
    assert_eq!(started, PullProgress::Started);
    let done = wait_for(&bell_b, || regions.completed_pull());
    assert_eq!(done, (RequestId(9), Ok(())));
    assert_eq!(dst[..250_001], src[..250_001]);
    assert!(
        dst[250_001..].iter().all(|&b| b == 0),
        "only the length asked"
    );
    assert_eq!(b.mapped_regions(), 0, "the destination is unmapped");

    // Released: the sender's board refuses the window.
    pa.regions().release(window);
    assert_eq!(a.mapped_regions(), 0);
    let started = regions.pull(RequestId(10), from, window, &segments(&mut dst), 10);
    assert_eq!(started, PullProgress::Started);
    let done = wait_for(&bell_b, || regions.completed_pull());
    assert_eq!(done, (RequestId(10), Err(Status::BadRdmawin)));

    // Nothing to pull completes at once.
    assert_eq!(
        regions.pull(RequestId(11), from, window, &segments(&mut dst), 0),
        PullProgress::Done(Ok(()))
    );
    // A destination shorter than the length asked is refused.
    assert_eq!(
        regions.pull(RequestId(12), from, window, &segments(&mut dst[..5]), 6),
        PullProgress::Done(Err(Status::BadRdmawin))
    );
}

/// More LARGE receives pulling at once than the engine's pull quota (256 per
/// process) and an endpoint's region ids (256) allow: the pulls beyond wait for room
/// and start as others end, and every receive gets its bytes (MX fails none of them).
#[test]
fn pulls_beyond_the_quota_wait_for_room_instead_of_failing() {
    let (_a, b, pa, pb, bell_b) = connected_boards();

    const PULLS: usize = 300;
    // Long enough that the 45 pulls beyond the quota are posted long before 45
    // others could have ended.
    const LEN: usize = 512 << 10;
    let mut src: Vec<u8> = (0..LEN as u32).map(|i| (i * 7 % 251) as u8).collect();
    let window = pa.regions().register(&segments(&mut src)).expect("window");
    let mut dst = vec![vec![0u8; LEN]; PULLS];
    let from = PeerAddr::new(IDX_A, 1);
    let regions = pb.regions();
    for (i, d) in dst.iter_mut().enumerate() {
        let started = regions.pull(RequestId(i as u64), from, window, &segments(d), LEN as u32);
        assert_eq!(started, PullProgress::Started, "pull {i}");
    }
    assert!(b.counters().pulls_held > 0, "no pull waited for room");
    let mut done = vec![false; PULLS];
    for _ in 0..PULLS {
        let (id, result) = wait_for(&bell_b, || regions.completed_pull());
        assert_eq!(result, Ok(()), "pull {id:?}");
        assert!(
            !std::mem::replace(&mut done[id.0 as usize], true),
            "{id:?} twice"
        );
    }
    for (i, d) in dst.iter().enumerate() {
        assert_eq!(d[..], src[..], "pull {i}'s bytes");
    }
    assert_eq!(b.mapped_regions(), 0, "every destination unmapped");
}

#[test]
fn a_pull_from_an_endpoint_never_connected_fails() {
    let (a, b) = boards(true);
    let pa = a.open(0, Some(1), bell(), false).unwrap();
    let pb = b.open(0, Some(2), bell(), false).unwrap();
    let mut src = vec![1u8; 100_000];
    let window = pa.regions().register(&segments(&mut src)).unwrap();
    let mut dst = vec![0u8; 100_000];
    assert_eq!(
        pb.regions().pull(
            RequestId(1),
            PeerAddr::new(IDX_A, 1),
            window,
            &segments(&mut dst),
            100_000
        ),
        PullProgress::Done(Err(Status::EndpointUnreachable))
    );
}

#[test]
fn the_registration_cache_keeps_a_buffer_mapped_until_invalidated() {
    let (a, _b) = boards(true);
    let pa = a.open(0, Some(3), bell(), true).unwrap();
    let mut buf = vec![0u8; 100_000];
    let r = pa.regions();
    let w1 = r.register(&segments(&mut buf)).unwrap();
    r.release(w1);
    let w2 = r.register(&segments(&mut buf)).unwrap();
    assert_ne!(
        (w1.id, w1.seqnum),
        (w2.id, w2.seqnum),
        "a new window each send"
    );
    assert_eq!(a.cache_stats(3), Some((1, 1)));
    r.release(w2);
    assert_eq!(a.mapped_regions(), 1, "kept mapped");
    r.invalidate(buf.as_ptr() as usize + 10, 1);
    assert_eq!(a.mapped_regions(), 0);
    // Invalidated while in use: unmapped at release.
    let w3 = r.register(&segments(&mut buf)).unwrap();
    r.invalidate(buf.as_ptr() as usize, buf.len());
    assert_eq!(a.mapped_regions(), 1);
    r.release(w3);
    assert_eq!(a.mapped_regions(), 0);
}

#[test]
fn hostnames_are_learnt_by_host_query() {
    let (a, b) = boards(false);
    // B knows A's name from its list; A asks B for its own.
    assert_eq!(b.peer_by_hostname("ha"), Some(MAC_A.to_board_addr()));
    assert_eq!(a.peer_by_hostname("hb:0"), Some(MAC_B.to_board_addr()));
    assert_eq!(
        a.peer_hostname(MAC_B.to_board_addr()).as_deref(),
        Some("hb:0")
    );
    assert_eq!(a.peer_index(MAC_B.to_board_addr()), Some(IDX_B));
    assert_eq!(a.peer_nic_id(IDX_A), Some(MAC_A.to_board_addr()));
    // A name nobody has is not found once every peer is named.
    assert_eq!(a.peer_by_hostname("nobody"), None);
    assert_eq!(a.peer_hostname(0x0200_0000_0099), None);
}

#[test]
fn peers_added_and_removed_by_mappers() {
    let (a, _b) = boards(true);
    let far = 0x0200_0000_0c03u64;
    a.add_peer(far, Some("far")).unwrap();
    assert_eq!(a.peer_index(far), Some(2));
    assert_eq!(a.peer_by_hostname("far"), Some(far));
    assert!(a.remove_peer(far));
    assert!(!a.remove_peer(far));
    assert!(!a.remove_peer(MAC_A.to_board_addr()), "the board stays");
    assert!(a.add_peer(1 << 50, None).is_err());
    // Renaming needs an idle board.
    a.set_hostname(0, "renamed").unwrap();
    assert_eq!(a.boards()[0].hostname, "renamed:0");
    let _p = a.open(0, None, bell(), false).unwrap();
    assert!(a.set_hostname(0, "again").is_err());
}

#[test]
fn configuration_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("peers.json");
    std::fs::write(&file, r#"[{"mac": "02:00:00:00:00:07", "hostname": "h7"}]"#).unwrap();
    let path = file.to_string_lossy().into_owned();
    let env = |pairs: &'static [(&'static str, &'static str)], peers: Option<&str>| {
        let peers = peers.map(str::to_owned);
        move |k: &str| {
            if k == "XMX_PEERS" {
                return peers.clone();
            }
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    };
    let c = NativeConfig::from_lookup(env(
        &[
            ("XMX_IFACE", "eth1"),
            ("XMX_HOSTNAME", "node3"),
            ("XMX_NIC_SPIN_US", "15"),
            ("XMX_QDISC_BYPASS", "0"),
            ("XMX_RESEND_DELAY_US", "20000"),
            ("XMX_PULL_TIMEOUT_MS", "30"),
        ],
        Some(&path),
    ))
    .unwrap();
    assert_eq!(c.iface, "eth1");
    assert_eq!(c.hostname, "node3:0");
    assert_eq!(c.peers.len(), 1);
    assert_eq!(c.nic_spin, Duration::from_micros(15));
    assert!(!c.qdisc_bypass);
    assert_eq!(c.ack_delay, DEFAULT_ACK_DELAY);
    assert_eq!(c.resend_delay, Some(Duration::from_millis(20)));
    assert_eq!(
        c.engine_config(9014).pull_retransmit_timeout,
        Duration::from_millis(30)
    );
    assert!(
        NativeConfig::from_lookup(env(&[], None)).is_err(),
        "no interface"
    );
    assert!(
        NativeConfig::from_lookup(env(&[("XMX_IFACE", "e"), ("XMX_NIC_SPIN_US", "x")], None))
            .is_err()
    );
    assert!(NativeConfig::from_lookup(env(&[("XMX_IFACE", "e")], Some("/nonexistent"))).is_err());
    assert!(
        is_default(env(&[("XMX_IFACE", "e")], None))
            || std::path::Path::new("/dev/xen/evtchn").exists()
    );
    assert!(!is_default(env(
        &[("XMX_IFACE", "e"), ("XMX_TRANSPORT", "loopback")],
        None
    )));
    assert!(!is_default(env(&[], None)));
}

#[test]
fn tuning_follows_the_configuration() {
    let (a, _b) = boards(true);
    let c = a.tune(Config::default());
    assert_eq!(c.ack_delay, DEFAULT_ACK_DELAY);
    assert_eq!(c.resend_delay, Config::default().resend_delay);
    assert!(a.open_raw(0, bell()).is_err());
    assert_eq!(a.boards()[0].nic_id, MAC_A.to_board_addr());
    assert_eq!(a.boards()[0].hostname, "ha:0");
}

#[test]
fn a_closed_endpoint_lingers_repeating_its_last_ack() {
    let (wa, wb) = SeqpacketWire::pair(MAC_A, MAC_B).expect("socketpair");
    let mut ca = config(
        "ha",
        vec![spec(IDX_A, MAC_A, None), spec(IDX_B, MAC_B, Some("hb"))],
    );
    ca.linger = Duration::from_millis(300);
    let a = Native::start(ca, Box::new(wa)).expect("board A");
    let b = Native::start(
        config(
            "hb",
            vec![spec(IDX_A, MAC_A, Some("ha")), spec(IDX_B, MAC_B, None)],
        ),
        Box::new(wb),
    )
    .expect("board B");
    let bell_a = bell();
    let mut pa = a.open(0, Some(1), bell_a.clone(), false).unwrap();
    let bell_b = bell();
    let mut pb = b.open(0, Some(2), bell_b.clone(), false).unwrap();

    let message = Frame {
        peer_index: IDX_A,
        dst_endpoint: 1,
        src_endpoint: 2,
        body: Body::Message(Message {
            session: pa.session(),
            seqnum: Seqnum::from_raw(1),
            piggyack: Seqnum::from_raw(0),
            match_info: 5,
            kind: MessageKind::Tiny,
            payload: b"last".to_vec(),
        }),
    };
    pb.transmit(message.clone());
    next_frame(&mut pa, &bell_a);
    // A's core acknowledges it, then A closes.
    let ack = Frame {
        peer_index: IDX_B,
        dst_endpoint: 2,
        src_endpoint: 1,
        body: Body::Liback(xmx_mx::frame::Liback {
            session: pb.session(),
            ack_session: pb.session(),
            acknum: 9,
            lib_seqnum: Seqnum::from_raw(2),
            send_seq: Seqnum::from_raw(2),
            resent: 0,
        }),
    };
    pa.transmit(ack.clone());
    drop(pa);
    let first = next_frame(&mut pb, &bell_b);
    assert_eq!(
        first,
        Frame {
            peer_index: IDX_A,
            ..ack.clone()
        }
    );

    // B missed nothing but resends anyway: the ack comes again, marked resent.
    pb.transmit(message.clone());
    let again = next_frame(&mut pb, &bell_b);
    let Body::Liback(l) = again.body else {
        panic!("expected the ack again, got {again:?}");
    };
    assert_eq!(
        (l.acknum, l.lib_seqnum, l.resent),
        (9, Seqnum::from_raw(2), 1)
    );
    // Once the linger is over, the closed endpoint is NACKed.
    let closed = loop {
        pb.transmit(message.clone());
        let f = next_within(&bell_b, &mut pb, Duration::from_millis(100));
        match f.map(|f| f.body) {
            Some(Body::Nack(n)) => break n,
            Some(Body::Liback(_)) | None => continue,
            Some(other) => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(closed.nack_type, 2, "endpoint closed");

    // A reopened index answers with its own session: the old one is stale.
    let bell_a2 = bell();
    let _pa2 = a.open(0, Some(1), bell_a2, false).unwrap();
    pb.transmit(message);
    let stale = next_frame(&mut pb, &bell_b);
    assert!(
        matches!(stale.body, Body::Nack(n) if n.nack_type == 3),
        "bad session: {stale:?}"
    );
}

/// The next frame `port` receives within `limit`, if any.
fn next_within(
    bell: &Doorbell,
    port: &mut Box<dyn TransportPort>,
    limit: Duration,
) -> Option<Frame<Vec<u8>>> {
    let deadline = Instant::now() + limit;
    loop {
        let seen = bell.generation();
        if let Some(f) = port.receive() {
            return Some(f);
        }
        if Instant::now() >= deadline {
            return None;
        }
        bell.wait(seen, Some(deadline));
    }
}

/// Takes every frame `from` emits and hands it to `to` as a board would
/// (the peer index becomes the sender's), running due timers before and
/// after as the library's progress does. Returns what crossed.
fn carry(
    now: xmx_mx::Instant,
    from: &mut xmx_mx::Endpoint,
    from_index: u16,
    to: &mut xmx_mx::Endpoint,
) -> Vec<&'static str> {
    for ep in [&mut *from, &mut *to] {
        if ep.next_timeout().is_some_and(|t| t <= now) {
            ep.handle_timeout(now);
        }
    }
    let mut kinds = Vec::new();
    while let Some(mut f) = from.poll_transmit() {
        kinds.push(match f.body {
            Body::Message(_) => "message",
            Body::Liback(_) => "ack",
            Body::ConnectRequest(_) => "connect",
            Body::ConnectReply(_) => "connect reply",
            Body::Notify(_) => "notify",
            Body::Nack(_) => "nack",
        });
        f.peer_index = from_index;
        to.handle_frame(now, f.as_borrowed());
    }
    if to.next_timeout().is_some_and(|t| t <= now) {
        to.handle_timeout(now);
    }
    kinds
}

#[test]
fn ping_pong_replies_carry_the_acks() {
    let (a, _b) = boards(true);
    let config = a.tune(xmx_mx::Config::default());
    let mut ea = xmx_mx::Endpoint::new(config.clone(), 1, 0xa0, 7);
    let mut eb = xmx_mx::Endpoint::new(config, 2, 0xb0, 7);
    let (to_b, to_a) = (PeerAddr::new(IDX_B, 2), PeerAddr::new(IDX_A, 1));
    let step = Duration::from_micros(40);
    let mut now = xmx_mx::Instant::from_millis(1);
    ea.connect(now, to_b, 7);
    assert_eq!(carry(now, &mut ea, IDX_A, &mut eb), ["connect"]);
    assert_eq!(carry(now, &mut eb, IDX_B, &mut ea), ["connect reply"]);
    assert!(matches!(
        ea.poll_event(),
        Some(xmx_mx::EndpointEvent::Connected {
            status: Status::Success,
            ..
        })
    ));
    let mut crossed = Vec::new();
    for round in 0..20u64 {
        eb.post_recv(now, 0, 0, 64).unwrap();
        ea.send(now, to_b, round, b"ping").unwrap();
        crossed.extend(carry(now, &mut ea, IDX_A, &mut eb));
        now = now + step;
        ea.post_recv(now, 0, 0, 64).unwrap();
        eb.send(now, to_a, round, b"pong").unwrap();
        crossed.extend(carry(now, &mut eb, IDX_B, &mut ea));
        crossed.extend(carry(now, &mut ea, IDX_A, &mut eb));
        now = now + step;
    }
    assert_eq!(crossed, vec!["message"; 40], "one frame per message");
    let sent_done = |ep: &mut xmx_mx::Endpoint| {
        std::iter::from_fn(|| ep.poll_event())
            .filter(|e| {
                matches!(
                    e,
                    xmx_mx::EndpointEvent::SendDone {
                        status: Status::Success,
                        ..
                    }
                )
            })
            .count()
    };
    assert_eq!(sent_done(&mut ea), 20, "every ping acked by its pong");
    assert_eq!(
        sent_done(&mut eb),
        19,
        "the last pong waits for the delayed ack"
    );
    // Nothing flows back: the last pong is acked once the delay is over.
    let due = ea.next_timeout().expect("an ack is owed");
    assert_eq!(carry(due, &mut ea, IDX_A, &mut eb), ["ack"]);
    assert_eq!(sent_done(&mut eb), 1);
    assert_eq!(ea.next_timeout(), None);
}

#[test]
fn frames_reach_the_port_in_order_whichever_thread_takes_them_in() {
    let (a, b) = boards(true);
    let mut pa = a.open(0, Some(1), bell(), false).unwrap();
    let bell_b = bell();
    let mut pb = b.open(0, Some(2), bell_b.clone(), false).unwrap();
    let session_b = pb.session();
    let tiny = |n: u16| Frame {
        peer_index: IDX_B,
        dst_endpoint: 2,
        src_endpoint: 1,
        body: Body::Message(Message {
            session: session_b,
            seqnum: Seqnum::from_raw(n),
            piggyack: Seqnum::from_raw(0),
            match_info: u64::from(n),
            kind: MessageKind::Tiny,
            payload: n.to_be_bytes().to_vec(),
        }),
    };
    let match_info = |f: Frame<Vec<u8>>| match f.body {
        Body::Message(m) => m.match_info,
        other => panic!("not a message: {other:?}"),
    };
    const BURSTS: u16 = 20;
    const PER_BURST: u16 = 8;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    for burst in 0..BURSTS {
        // Read before the burst leaves, so a ring for it is never missed.
        let seen = bell_b.generation();
        for k in 0..PER_BURST {
            pa.transmit(tiny(burst * PER_BURST + k));
        }
        let want = usize::from((burst + 1) * PER_BURST);
        // Even bursts: B sleeps first, so the driver thread takes frames in
        // (into the mailbox); odd ones: B polls the link itself (into its
        // inbox). Either may take part of a burst.
        if burst % 2 == 0 {
            bell_b.wait(seen, Some(deadline));
        }
        while got.len() < want {
            assert!(
                Instant::now() < deadline,
                "burst {burst} incomplete: {got:?}"
            );
            match pb.receive() {
                Some(f) => got.push(match_info(f)),
                None => std::thread::yield_now(),
            }
        }
    }
    let sent: Vec<u64> = (0..u64::from(BURSTS * PER_BURST)).collect();
    assert_eq!(got, sent, "frames came out of order or twice");
    assert_eq!(b.counters(), BoardCounters::default());
}

/// A blocked wait sleeps on the link itself: the frame wakes the waiting
/// thread, which takes it in, and the driver leaves the link alone meanwhile
/// (it would wake for the same frame and ring the thread, two wake-ups for
/// one arrival).
/// A thread asleep on `port`'s arrival descriptors (until `deadline`), once
/// `native`'s driver has stopped watching them: it joins with whether an
/// arrival woke it, and the port.
fn asleep_on_arrivals(
    native: &Native,
    mut port: Box<dyn TransportPort>,
    bell: &Arc<Doorbell>,
    deadline: Instant,
) -> std::thread::JoinHandle<(Option<bool>, Box<dyn TransportPort>)> {
    let fds = port.arrival_fds().expect("arrival descriptors");
    let sleeper = {
        let bell = bell.clone();
        std::thread::spawn(move || {
            let _waiting = bell.attend();
            let seen = bell.generation();
            assert!(!port.before_sleep(), "nothing was sent yet");
            let woke = bell.sleep_on(fds, seen, Some(deadline));
            (woke, port)
        })
    };
    // The thread is asleep once the doorbell says so.
    while bell
        .port_taken_until(crate::runtime::now().as_nanos())
        .is_none()
    {
        assert!(Instant::now() < deadline, "the thread never slept");
        std::thread::yield_now();
    }
    let now = crate::runtime::now().as_nanos();
    assert!(
        native
            .shared
            .run(|board, _| board.driven_until(now))
            .is_some(),
        "the driver must leave the arrivals to the thread asleep on them"
    );
    // The driver watched before the thread slept (nothing told it since):
    // have it look again, as its next timer or frame would.
    native.shared.wake.notify();
    while native.shared.watching.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the driver kept watching");
        std::thread::yield_now();
    }
    sleeper
}

#[test]
fn a_thread_asleep_on_the_link_takes_its_frame_and_the_driver_leaves_it() {
    let (a, b) = boards(true);
    let mut pa = a.open(0, Some(1), bell(), false).unwrap();
    let bell_b = bell();
    let pb = b.open(0, Some(2), bell_b.clone(), false).unwrap();
    let session_b = pb.session();
    let deadline = Instant::now() + Duration::from_secs(10);
    let sleeper = asleep_on_arrivals(&b, pb, &bell_b, deadline);
    pa.transmit(Frame {
        peer_index: IDX_B,
        dst_endpoint: 2,
        src_endpoint: 1,
        body: Body::Message(Message {
            session: session_b,
            seqnum: Seqnum::from_raw(0),
            piggyack: Seqnum::from_raw(0),
            match_info: 77,
            kind: MessageKind::Tiny,
            payload: b"wake".to_vec(),
        }),
    });
    let (woke, mut pb) = sleeper.join().unwrap();
    assert_eq!(woke, Some(true), "woken by the link, not by a ring");
    let frame = loop {
        if let Some(f) = pb.receive() {
            break f;
        }
        assert!(Instant::now() < deadline, "the frame never came");
        std::thread::yield_now();
    };
    match frame.body {
        Body::Message(m) => assert_eq!((m.match_info, m.payload), (77, b"wake".to_vec())),
        other => panic!("not the message: {other:?}"),
    }
}

/// Two processes on one interface (two boards whose links share their
/// claims): an endpoint one holds is refused to the other (`MX_BUSY`), "any
/// endpoint" skips what either holds, and an index comes free when its
/// endpoint closes.
#[test]
fn boards_sharing_an_interface_never_open_the_same_endpoint() {
    let (wa, _wb) = SeqpacketWire::pair(MAC_A, MAC_B).expect("socketpair");
    let (wc, _wd) = SeqpacketWire::pair(MAC_A, MAC_B).expect("socketpair");
    let wc = wc.sharing_claims_with(&wa);
    let a = board_a(wa, true);
    let c = board_a(wc, true);
    let held = a.open(0, Some(3), bell(), false).unwrap();
    assert_eq!(
        c.open(0, Some(3), bell(), false).err(),
        Some(OpenError::Busy(3)),
        "open in the other process"
    );
    let first = a.open(0, None, bell(), false).unwrap();
    assert_eq!(first.index(), 0);
    let second = c.open(0, None, bell(), false).unwrap();
    assert_eq!(second.index(), 1, "0 and 3 are the other board's");
    let third = a.open(0, None, bell(), false).unwrap();
    assert_eq!(third.index(), 2);
    drop(held);
    let reused = c.open(0, Some(3), bell(), false).unwrap();
    assert_eq!(reused.index(), 3, "free once closed");
    drop((first, second, third, reused));
}

/// A frame for an endpoint another process on the interface holds is that
/// process's to answer: this board drops it without a NACK (which would cost
/// the sender a resend), and still refuses one for an endpoint nobody holds.
#[test]
fn a_frame_for_another_process_endpoint_is_left_to_it() {
    let (wa, wb) = SeqpacketWire::pair(MAC_A, MAC_B).expect("socketpair");
    let (wc, _wd) = SeqpacketWire::pair(MAC_A, MAC_B).expect("socketpair");
    let wc = wc.sharing_claims_with(&wa);
    let (a, b) = (board_a(wa, true), board_b(wb));
    let c = board_a(wc, true);
    let _held_by_c = c.open(0, Some(4), bell(), false).unwrap();
    let bell_b = bell();
    let mut pb = b.open(0, Some(2), bell_b.clone(), false).unwrap();
    let tiny = |to: u8| Frame {
        peer_index: IDX_A,
        dst_endpoint: to,
        src_endpoint: 2,
        body: Body::Message(Message {
            session: 0x1234,
            seqnum: Seqnum::from_raw(0),
            piggyack: Seqnum::from_raw(0),
            match_info: u64::from(to),
            kind: MessageKind::Tiny,
            payload: b"who?".to_vec(),
        }),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    pb.transmit(tiny(4));
    while a.engine_drops(DropReason::EndpointElsewhere).0 == 0 {
        assert!(Instant::now() < deadline, "A never took the frame in");
        std::thread::yield_now();
    }
    assert_eq!(
        a.engine_drops(DropReason::EndpointElsewhere),
        (1, 0),
        "no NACK"
    );
    // Nobody holds endpoint 5: refused as closed, and B hears of it.
    pb.transmit(tiny(5));
    let nack = next_frame(&mut pb, &bell_b);
    match nack.body {
        Body::Nack(n) => assert_eq!(n.nack_type, u8::from(NackType::EndpointClosed)),
        other => panic!("expected a NACK, got {other:?}"),
    }
    assert_eq!(a.engine_drops(DropReason::EndpointClosed), (1, 1));
}

/// Two processes on one interface reach each other's endpoints through the
/// endpoints' lanes, not the link (a frame to one's own address never comes
/// back in from it): a connect, a MEDIUM message and a LARGE pull cross, every
/// byte as sent, and nothing of it goes on the link.
#[test]
fn processes_on_one_interface_exchange_through_the_lanes() {
    let (wa, wb) = SeqpacketWire::pair(MAC_A, MAC_B).expect("socketpair");
    let (wc, _wd) = SeqpacketWire::pair(MAC_A, MAC_B).expect("socketpair");
    let wc = wc.sharing_claims_with(&wa);
    let a = board_a(wa, true);
    let c = board_a(wc, true);
    let _b = board_b(wb);
    let bell_a = bell();
    let mut pa = a.open(0, Some(1), bell_a.clone(), false).unwrap();
    let bell_c = bell();
    let mut pc = c.open(0, Some(4), bell_c.clone(), false).unwrap();

    let sent = connect(1, IDX_A, 4, pa.session());
    pa.transmit(sent.clone());
    assert_eq!(next_frame(&mut pc, &bell_c), sent, "the connect crosses");
    pc.transmit(connect(4, IDX_A, 1, pc.session()));
    let back = next_frame(&mut pa, &bell_a);
    assert_eq!((back.src_endpoint, back.dst_endpoint), (4, 1));

    let data: Vec<u8> = (0..9000u32).map(|i| (i * 7 % 251) as u8).collect();
    let frags = medium_fragments(&data, IDX_A, (1, 4), pc.session(), 78);
    for f in &frags {
        pa.transmit(f.clone());
    }
    let mut got = Vec::new();
    while got.len() < frags.len() {
        got.push(next_frame(&mut pc, &bell_c));
    }
    assert_eq!(
        got, frags,
        "the MEDIUM's fragments cross whole and in order"
    );

    // C pulls 300 kB from A's buffer: PULLs one way, replies the other.
    let mut src: Vec<u8> = (0..300_000u32).map(|i| (i * 13 % 256) as u8).collect();
    let window = pa.regions().register(&segments(&mut src)).expect("window");
    let mut dst = vec![0u8; 300_000];
    let regions = pc.regions();
    let started = regions.pull(
        RequestId(5),
        PeerAddr::new(IDX_A, 1),
        window,
        &segments(&mut dst),
        300_000,
    );
    assert_eq!(started, PullProgress::Started);
    let done = wait_for(&bell_c, || regions.completed_pull());
    assert_eq!(done, (RequestId(5), Ok(())));
    assert!(dst == src, "every byte pulled as it is in A's buffer");

    let (ca, cc) = (a.counters(), c.counters());
    assert!(ca.lane_sent > 0 && cc.lane_sent > 0, "{ca:?} {cc:?}");
    assert_eq!(
        (ca.lane_lost, cc.lane_lost, ca.lane_refused, cc.lane_refused),
        (0, 0, 0, 0)
    );
    assert_eq!((ca.lane_taken, cc.lane_taken), (cc.lane_sent, ca.lane_sent));
    assert_eq!((ca.tx_errors, cc.tx_errors), (0, 0));
    assert_eq!(
        a.engine_drops(DropReason::EndpointClosed),
        (0, 0),
        "nothing refused"
    );
}

/// A thread asleep on its endpoint's arrivals wakes for a frame another
/// process on its interface sent to the endpoint's lane (the driver leaves
/// the lanes to it, as it leaves the link).
#[test]
fn a_thread_asleep_wakes_for_a_frame_from_another_process_on_its_interface() {
    let (wa, _wb) = SeqpacketWire::pair(MAC_A, MAC_B).expect("socketpair");
    let (wc, _wd) = SeqpacketWire::pair(MAC_A, MAC_B).expect("socketpair");
    let wc = wc.sharing_claims_with(&wa);
    let a = board_a(wa, true);
    let c = board_a(wc, true);
    let mut pa = a.open(0, Some(1), bell(), false).unwrap();
    let bell_c = bell();
    let pc = c.open(0, Some(4), bell_c.clone(), false).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let sleeper = asleep_on_arrivals(&c, pc, &bell_c, deadline);
    let sent = connect(1, IDX_A, 4, pa.session());
    pa.transmit(sent.clone());
    let (woke, mut pc) = sleeper.join().unwrap();
    assert_eq!(woke, Some(true), "woken by the lane, not by a ring");
    assert_eq!(next_frame(&mut pc, &bell_c), sent);
    assert_eq!(c.counters().lane_taken, 1);
}

/// A board's link filter follows its endpoints: a PULL_REPLY for an endpoint
/// the process does not hold stays in the kernel (the engine would count it a
/// stale pull), one for an endpoint it holds arrives, and a close and an open
/// move the filter with them.
#[test]
fn pull_replies_for_endpoints_not_held_stay_in_the_kernel() {
    use xmx_wire::mxoe::{FrameRepr, HeadRepr, MsgHeader, PacketRepr, TinyRepr};
    let (wa, mut wb) = SeqpacketWire::pair(MAC_A, MAC_B).expect("socketpair");
    let a = board_a(wa, true);
    let head = HeadRepr {
        dst: MAC_A,
        src: MAC_B,
        dst_src_peer_index: IDX_B,
    };
    let emit = |packet: PacketRepr| {
        let repr = FrameRepr { head, packet };
        let mut f = vec![0u8; repr.buffer_len()];
        repr.emit(&mut f).expect("emit");
        f
    };
    let data = [5u8; 4096];
    let reply = |endpoint: u8| filter::pull_reply_frame(head, endpoint, &data);
    // A TINY for an endpoint nobody holds: refused as closed, which tells when
    // everything sent before it has been through the engine.
    let marker = emit(PacketRepr::Tiny(TinyRepr {
        header: MsgHeader {
            dst_endpoint: 9,
            src_endpoint: 2,
            src_generation: 0,
            lib_seqnum: 0,
            lib_piggyack: 0,
            match_info: 0,
            session: 0,
            checksum: 0,
        },
        data: b"",
    }));
    let mut markers = 0;
    let mut after = |wb: &mut SeqpacketWire, frame: Vec<u8>| {
        wb.send(&frame).unwrap();
        wb.send(&marker).unwrap();
        markers += 1;
        let deadline = Instant::now() + Duration::from_secs(10);
        while a.engine_drops(DropReason::EndpointClosed).0 < markers {
            assert!(Instant::now() < deadline, "A never took the marker in");
            std::thread::yield_now();
        }
        a.engine_drops(DropReason::StalePull).0
    };
    let p1 = a.open(0, Some(1), bell(), false).unwrap();
    assert_eq!(after(&mut wb, reply(4)), 0, "endpoint 4 is not ours");
    assert_eq!(after(&mut wb, reply(1)), 1, "endpoint 1 is");
    drop(p1);
    let _p4 = a.open(0, Some(4), bell(), false).unwrap();
    assert_eq!(after(&mut wb, reply(1)), 1, "endpoint 1 is closed");
    assert_eq!(after(&mut wb, reply(4)), 2, "endpoint 4 is open");
}

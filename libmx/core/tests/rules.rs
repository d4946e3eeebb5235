//! One test per protocol rule, driving two endpoints frame by frame.

use std::time::Duration;

use xmx_mx::frame::{ConnectReply, Liback, MediumFrag, Message, MessageKind, Nack};
use xmx_mx::{
    Body, Config, Endpoint, EndpointEvent, Frame, Instant, PeerAddr, RecvDone, RequestId, Seqnum,
    Status,
};

const KEY: u32 = 42;
const A: PeerAddr = PeerAddr::new(1, 0);
const B: PeerAddr = PeerAddr::new(2, 5);
const SESSION_A: u32 = 0x0A0A;
const SESSION_B: u32 = 0x0B0B;

type OwnedFrame = Frame<Vec<u8>>;

struct EndpointPair {
    a: Endpoint,
    b: Endpoint,
    now: Instant,
}

fn drain(ep: &mut Endpoint) -> Vec<OwnedFrame> {
    std::iter::from_fn(|| ep.poll_transmit()).collect()
}

fn events(ep: &mut Endpoint) -> Vec<EndpointEvent> {
    std::iter::from_fn(|| ep.poll_event()).collect()
}

/// Hands frames emitted by the endpoint on `from` to `to`, as the network would.
fn deliver(to: &mut Endpoint, now: Instant, from: PeerAddr, frames: &[OwnedFrame]) {
    for f in frames {
        let mut f = f.clone();
        f.peer_index = from.peer_index;
        to.handle_frame(now, f.as_borrowed());
    }
}

fn recv_done(e: &[EndpointEvent]) -> Vec<&RecvDone> {
    e.iter()
        .filter_map(|e| match e {
            EndpointEvent::RecvDone(r) => Some(r),
            _ => None,
        })
        .collect()
}

impl EndpointPair {
    /// A connected to B and B connected to A.
    fn new(config: Config) -> EndpointPair {
        let mut p = EndpointPair {
            a: Endpoint::new(config.clone(), A.endpoint, SESSION_A, KEY),
            b: Endpoint::new(config, B.endpoint, SESSION_B, KEY),
            now: Instant::from_millis(1000),
        };
        p.connect_a_to_b();
        let id = p.b.connect(p.now, A, KEY);
        let req = drain(&mut p.b);
        deliver(&mut p.a, p.now, B, &req);
        let rep = drain(&mut p.a);
        deliver(&mut p.b, p.now, A, &rep);
        assert!(
            matches!(events(&mut p.b)[..], [EndpointEvent::Connected { id: x, status: Status::Success, .. }] if x == id)
        );
        p
    }

    fn connect_a_to_b(&mut self) {
        let id = self.a.connect(self.now, B, KEY);
        let req = drain(&mut self.a);
        deliver(&mut self.b, self.now, A, &req);
        let rep = drain(&mut self.b);
        deliver(&mut self.a, self.now, B, &rep);
        let ev = events(&mut self.a);
        assert_eq!(
            ev,
            vec![EndpointEvent::Connected {
                id,
                status: Status::Success,
                addr: Some(xmx_mx::EndpointAddr {
                    peer: B,
                    session: SESSION_B
                })
            }]
        );
    }

    fn a_sends(&mut self, info: u64, data: &[u8]) -> (RequestId, Vec<OwnedFrame>) {
        let id = self.a.send(self.now, B, info, data).unwrap();
        (id, drain(&mut self.a))
    }

    fn at(&mut self, ms: u64) -> Instant {
        self.now = self.now + Duration::from_millis(ms);
        self.now
    }
}

fn message(f: &OwnedFrame) -> &Message<Vec<u8>> {
    match &f.body {
        Body::Message(m) => m,
        other => panic!("not a message: {other:?}"),
    }
}

fn liback(f: &OwnedFrame) -> Liback {
    match f.body {
        Body::Liback(a) => a,
        ref other => panic!("not an ack: {other:?}"),
    }
}

#[test]
fn reverse_traffic_carries_the_ack() {
    let mut p = EndpointPair::new(Config::default());
    p.b.post_recv(p.now, 0, 0, 100).unwrap();
    let (id, frames) = p.a_sends(7, b"ping");
    let seq = message(&frames[0]).seqnum;
    deliver(&mut p.b, p.now, A, &frames);
    assert_eq!(recv_done(&events(&mut p.b))[0].data, b"ping");
    let reply = p.b.send(p.now, A, 8, b"pong").unwrap();
    let back = drain(&mut p.b);
    assert_eq!(back.len(), 1, "no separate ack");
    assert_eq!(message(&back[0]).piggyack, seq.next());
    // Nothing more to ack later either.
    let t = p.b.next_timeout().unwrap();
    p.b.handle_timeout(t);
    assert!(drain(&mut p.b)
        .iter()
        .all(|f| !matches!(f.body, Body::Liback(_))));
    deliver(&mut p.a, p.now, B, &back);
    assert!(events(&mut p.a).contains(&EndpointEvent::SendDone {
        id,
        status: Status::Success,
        xfer_length: 4
    }));
    let _ = reply;
}

#[test]
fn lone_message_is_acked_after_the_ack_delay() {
    let mut p = EndpointPair::new(Config::default());
    let (id, frames) = p.a_sends(1, b"x");
    let seq = message(&frames[0]).seqnum;
    let t0 = p.now;
    deliver(&mut p.b, t0, A, &frames);
    assert!(drain(&mut p.b).is_empty(), "no ack yet");
    let due = t0 + Config::default().ack_delay;
    assert_eq!(p.b.next_timeout(), Some(due));
    p.b.handle_timeout(due - Duration::from_nanos(1));
    assert!(drain(&mut p.b).is_empty());
    p.b.handle_timeout(due);
    let acks = drain(&mut p.b);
    assert_eq!(acks.len(), 1);
    let a = liback(&acks[0]);
    assert_eq!(
        (a.session, a.ack_session, a.acknum, a.lib_seqnum),
        (SESSION_A, SESSION_A, 1, seq.next())
    );
    deliver(&mut p.a, due, B, &acks);
    assert_eq!(
        events(&mut p.a),
        vec![EndpointEvent::SendDone {
            id,
            status: Status::Success,
            xfer_length: 1
        }]
    );
    assert_eq!(p.a.next_timeout(), None);
}

#[test]
fn four_unacked_messages_force_an_immediate_ack() {
    let mut p = EndpointPair::new(Config::default());
    for i in 0..3 {
        let (_, f) = p.a_sends(i, b"m");
        deliver(&mut p.b, p.now, A, &f);
        assert!(drain(&mut p.b).is_empty());
    }
    let (_, f) = p.a_sends(3, b"m");
    let last = message(&f[0]).seqnum;
    deliver(&mut p.b, p.now, A, &f);
    let acks = drain(&mut p.b);
    assert_eq!(acks.len(), 1);
    assert_eq!(liback(&acks[0]).lib_seqnum, last.next());
    deliver(&mut p.a, p.now, B, &acks);
    assert_eq!(events(&mut p.a).len(), 4);
}

#[test]
fn imm_ack_of_one_acks_every_message() {
    let config = Config::default().with_env(|k| (k == "MX_IMM_ACK").then(|| "1".to_string()));
    let mut p = EndpointPair::new(config);
    for i in 0..3u16 {
        let (_, f) = p.a_sends(i.into(), b"m");
        deliver(&mut p.b, p.now, A, &f);
        let acks = drain(&mut p.b);
        assert_eq!(acks.len(), 1);
        assert_eq!(liback(&acks[0]).acknum, u32::from(i) + 1);
    }
}

#[test]
fn unacked_message_is_resent_unchanged() {
    let mut p = EndpointPair::new(Config::default());
    let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    let (_, first) = p.a_sends(99, &data);
    assert_eq!(first.len(), 3, "three MEDIUM fragments");
    let due = p.now + Duration::from_millis(500);
    assert_eq!(p.a.next_timeout(), Some(due));
    p.a.handle_timeout(due - Duration::from_nanos(1));
    assert!(drain(&mut p.a).is_empty());
    p.a.handle_timeout(due);
    assert_eq!(drain(&mut p.a), first);
    // The resent copy is accepted.
    p.b.post_recv(due, 99, u64::MAX, 20_000).unwrap();
    deliver(&mut p.b, due, A, &first);
    assert_eq!(recv_done(&events(&mut p.b))[0].data, data);
}

#[test]
fn resend_waits_grow_exponentially_then_cap() {
    let config = Config {
        resend_delay_max: Duration::from_millis(3000),
        ..Config::default()
    };
    let mut p = EndpointPair::new(config);
    let (_, first) = p.a_sends(1, b"lost");
    let mut t = p.now;
    let mut waits = Vec::new();
    for _ in 0..6 {
        let next = p.a.next_timeout().unwrap();
        waits.push(next.saturating_since(t).as_millis());
        t = next;
        p.a.handle_timeout(t);
        assert_eq!(drain(&mut p.a), first);
    }
    assert_eq!(waits, vec![500, 1000, 2000, 3000, 3000, 3000]);
}

#[test]
fn exhausted_retries_time_out_every_pending_request_to_the_partner() {
    let config = Config {
        max_retries: 3,
        ..Config::default()
    };
    let mut p = EndpointPair::new(config);
    let (s1, _) = p.a_sends(1, b"one");
    p.at(100);
    let (s2, _) = p.a_sends(2, &[7; 500]);
    let c = p.a.connect(p.now, B, KEY);
    drain(&mut p.a);
    let mut transmissions_of_first = 1;
    let mut completions = Vec::new();
    while let Some(t) = p.a.next_timeout() {
        p.a.handle_timeout(t);
        transmissions_of_first += drain(&mut p.a)
            .iter()
            .filter(|f| matches!(&f.body, Body::Message(m) if m.match_info == 1))
            .count();
        completions.extend(events(&mut p.a));
    }
    assert_eq!(
        transmissions_of_first, 4,
        "one transmission and three retries"
    );
    assert_eq!(completions.len(), 3);
    assert!(completions.contains(&EndpointEvent::SendDone {
        id: s1,
        status: Status::Timeout,
        xfer_length: 3
    }));
    assert!(completions.contains(&EndpointEvent::SendDone {
        id: s2,
        status: Status::Timeout,
        xfer_length: 500
    }));
    assert!(completions.contains(&EndpointEvent::Connected {
        id: c,
        status: Status::Timeout,
        addr: None
    }));
    assert_eq!(
        p.a.send(p.now, B, 0, b"").unwrap_err(),
        xmx_mx::Error::NotConnected(B)
    );
}

#[test]
fn nacks_end_the_named_send_with_the_mapped_status() {
    let mut p = EndpointPair::new(Config::default());
    let sent: Vec<(RequestId, Seqnum)> = (0..3)
        .map(|i| {
            let (id, f) = p.a_sends(i, b"data");
            (id, message(&f[0]).seqnum)
        })
        .collect();
    let nack = |t: u8, seq: Seqnum| Frame {
        peer_index: B.peer_index,
        dst_endpoint: A.endpoint,
        src_endpoint: B.endpoint,
        body: Body::<Vec<u8>>::Nack(Nack {
            nack_type: t,
            lib_seqnum: seq,
        }),
    };
    // A NACK takes effect once no ack contradicted it for a resend delay.
    let confirm = Config::default().resend_delay;
    p.a.handle_frame(p.now, nack(2, sent[1].1).as_borrowed());
    assert!(events(&mut p.a).is_empty(), "believed before confirmation");
    let now = p.at(confirm.as_millis() as u64);
    p.a.handle_timeout(now);
    assert_eq!(
        events(&mut p.a),
        vec![EndpointEvent::SendDone {
            id: sent[1].0,
            status: Status::EndpointClosed,
            xfer_length: 4
        }]
    );
    p.a.handle_frame(p.now, nack(9, sent[0].1).as_borrowed());
    p.a.handle_frame(
        p.now,
        nack(1, Seqnum::new(2, sent[0].1.seq())).as_borrowed(),
    );
    let now = p.at(confirm.as_millis() as u64);
    p.a.handle_timeout(now);
    assert!(
        events(&mut p.a).is_empty(),
        "unknown type and other session ignored"
    );
    p.a.handle_frame(p.now, nack(1, sent[0].1).as_borrowed());
    p.a.handle_frame(p.now, nack(3, sent[2].1).as_borrowed());
    p.a.handle_frame(p.now, nack(3, sent[2].1).as_borrowed());
    let now = p.at(confirm.as_millis() as u64);
    p.a.handle_timeout(now);
    assert_eq!(
        events(&mut p.a),
        vec![
            EndpointEvent::SendDone {
                id: sent[0].0,
                status: Status::BadEndpoint,
                xfer_length: 4
            },
            EndpointEvent::SendDone {
                id: sent[2].0,
                status: Status::BadSession,
                xfer_length: 4
            },
        ]
    );
    assert_eq!(p.a.pending_requests(), 0);
}

#[test]
fn a_forged_nack_does_not_end_a_send_its_partner_acks() {
    let mut p = EndpointPair::new(Config::default());
    let (id, frames) = p.a_sends(1, b"data");
    let seq = message(&frames[0]).seqnum;
    // The message is lost on the way; a third party that guessed its seqnum
    // forges B's refusal (NACK_LIB carries no session to check).
    let forged = Frame {
        peer_index: B.peer_index,
        dst_endpoint: A.endpoint,
        src_endpoint: B.endpoint,
        body: Body::<Vec<u8>>::Nack(Nack {
            nack_type: 2,
            lib_seqnum: seq,
        }),
    };
    p.a.handle_frame(p.now, forged.as_borrowed());
    assert!(
        events(&mut p.a).is_empty(),
        "the send ended on a NACK alone"
    );
    // A resends at once to confirm the refusal; the real B is alive and
    // acks the message.
    p.a.handle_timeout(p.now);
    let probe = drain(&mut p.a);
    assert_eq!(probe.len(), 1);
    assert_eq!(message(&probe[0]).seqnum, seq);
    p.b.post_recv(p.now, 1, u64::MAX, 16).unwrap();
    deliver(&mut p.b, p.now, A, &probe);
    p.b.flush_acks();
    let acks = drain(&mut p.b);
    deliver(&mut p.a, p.now, B, &acks);
    let now = p.at(2 * Config::default().resend_delay.as_millis() as u64);
    p.a.handle_timeout(now);
    assert_eq!(
        events(&mut p.a),
        vec![EndpointEvent::SendDone {
            id,
            status: Status::Success,
            xfer_length: 4
        }]
    );
    let got = events(&mut p.b);
    let done = recv_done(&got);
    assert_eq!(done.len(), 1, "{got:?}");
    assert_eq!(
        (done[0].status, &done[0].data[..]),
        (Status::Success, &b"data"[..])
    );
}

#[test]
fn nack_ends_a_connect() {
    let mut a = Endpoint::new(Config::default(), 0, SESSION_A, KEY);
    let id = a.connect(Instant::ZERO, B, KEY);
    let Body::ConnectRequest(req) = drain(&mut a)[0].body else {
        panic!()
    };
    assert_eq!(
        (req.lib_seqnum, req.src_session, req.app_key),
        (0, SESSION_A, KEY)
    );
    let nack = Frame {
        peer_index: 2,
        dst_endpoint: 0,
        src_endpoint: 5,
        body: Body::<&[u8]>::Nack(Nack {
            nack_type: 1,
            lib_seqnum: Seqnum::from_raw(0),
        }),
    };
    a.handle_frame(Instant::ZERO, nack);
    assert_eq!(
        events(&mut a),
        vec![EndpointEvent::Connected {
            id,
            status: Status::BadEndpoint,
            addr: None
        }]
    );
}

#[test]
fn wrong_key_gets_bad_key() {
    let mut a = Endpoint::new(Config::default(), 0, SESSION_A, KEY);
    let mut b = Endpoint::new(Config::default(), 5, SESSION_B, KEY + 1);
    let id = a.connect(Instant::ZERO, B, KEY);
    deliver(&mut b, Instant::ZERO, A, &drain(&mut a));
    let reply = drain(&mut b);
    match reply[0].body {
        Body::ConnectReply(ConnectReply {
            status,
            src_session,
            target_session,
            ..
        }) => {
            assert_eq!(
                (status, src_session, target_session),
                (11, SESSION_A, SESSION_B)
            );
        }
        ref other => panic!("{other:?}"),
    }
    deliver(&mut a, Instant::ZERO, B, &reply);
    assert_eq!(
        events(&mut a),
        vec![EndpointEvent::Connected {
            id,
            status: Status::BadKey,
            addr: None
        }]
    );
}

#[test]
fn message_for_another_session_is_nacked() {
    let mut p = EndpointPair::new(Config::default());
    let (_, mut f) = p.a_sends(1, b"hi");
    let seq = message(&f[0]).seqnum;
    if let Body::Message(m) = &mut f[0].body {
        m.session = SESSION_B + 1;
    }
    deliver(&mut p.b, p.now, A, &f);
    let out = drain(&mut p.b);
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0].body,
        Body::Nack(Nack {
            nack_type: 3,
            lib_seqnum: seq
        })
    );
    assert_eq!(out[0].destination(), A);
    assert!(events(&mut p.b).is_empty());
}

#[test]
fn duplicates_are_delivered_once_and_reacked() {
    let mut p = EndpointPair::new(Config::default());
    p.b.post_recv(p.now, 0, 0, 10).unwrap();
    p.b.post_recv(p.now, 0, 0, 10).unwrap();
    let (_, f) = p.a_sends(1, b"once");
    let seq = message(&f[0]).seqnum;
    deliver(&mut p.b, p.now, A, &f);
    assert!(drain(&mut p.b).is_empty());
    // The copy (e.g. a resend whose ack was lost) is dropped but acked at once.
    deliver(&mut p.b, p.now, A, &f);
    let out = drain(&mut p.b);
    assert_eq!(out.len(), 1);
    assert_eq!(liback(&out[0]).lib_seqnum, seq.next());
    assert_eq!(recv_done(&events(&mut p.b)).len(), 1);
}

#[test]
fn out_of_order_frames_are_matched_in_order() {
    let mut p = EndpointPair::new(Config::default());
    let frames: Vec<OwnedFrame> = (0..4).flat_map(|i| p.a_sends(i, &[i as u8; 3]).1).collect();
    for i in 0..4 {
        p.b.post_recv(p.now, 0, 0, 10).unwrap();
        let _ = i;
    }
    for i in [3, 1, 2, 1, 0] {
        deliver(&mut p.b, p.now, A, &frames[i..=i]);
    }
    let ev = events(&mut p.b);
    let got: Vec<u64> = recv_done(&ev).iter().map(|r| r.match_info).collect();
    assert_eq!(got, vec![0, 1, 2, 3]);
}

#[test]
fn medium_fragments_reassemble_across_reordering_and_duplication() {
    let mut p = EndpointPair::new(Config::default());
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    let (_, f) = p.a_sends(5, &data);
    let (_, tiny) = p.a_sends(6, b"after");
    let r1 = p.b.post_recv(p.now, 0, 0, 20_000).unwrap();
    let r2 = p.b.post_recv(p.now, 0, 0, 20_000).unwrap();
    deliver(
        &mut p.b,
        p.now,
        A,
        &[
            f[2].clone(),
            tiny[0].clone(),
            f[0].clone(),
            f[2].clone(),
            f[0].clone(),
        ],
    );
    let ev = events(&mut p.b);
    assert_eq!(
        recv_done(&ev).iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![r2],
        "TINY after a partial MEDIUM completes"
    );
    // Nothing is acked past the partial MEDIUM, so no ack is even scheduled.
    assert_eq!(p.b.next_timeout(), None);
    assert!(drain(&mut p.b).is_empty());
    let t = p.at(1);
    deliver(&mut p.b, t, A, &f[1..2]);
    let ev = events(&mut p.b);
    let done = recv_done(&ev);
    assert_eq!((done[0].id, &done[0].data), (r1, &data));
    let t = p.b.next_timeout().unwrap();
    p.b.handle_timeout(t);
    assert_eq!(
        liback(&drain(&mut p.b)[0]).lib_seqnum,
        message(&tiny[0]).seqnum.next()
    );
}

#[test]
fn frames_of_a_dropped_connection_are_ignored() {
    let mut p = EndpointPair::new(Config::default());
    let (_, f) = p.a_sends(1, b"old");
    p.b.disconnect(A);
    p.b.post_recv(p.now, 0, 0, 10).unwrap();
    deliver(&mut p.b, p.now, A, &f);
    assert!(drain(&mut p.b).is_empty());
    assert!(events(&mut p.b).is_empty());
}

#[test]
fn malformed_frames_are_dropped_without_effect() {
    let mut p = EndpointPair::new(Config::default());
    p.b.post_recv(p.now, 0, 0, 100_000).unwrap();
    let (_, f) = p.a_sends(1, &[1; 5000]);
    let base = message(&f[0]).clone();
    let bad = |kind, payload: Vec<u8>| Frame {
        peer_index: A.peer_index,
        dst_endpoint: B.endpoint,
        src_endpoint: A.endpoint,
        body: Body::Message(Message {
            kind,
            payload,
            ..base.clone()
        }),
    };
    let medium = |msg_length, frag_seqnum, frag_pipeline| {
        MessageKind::Medium(MediumFrag {
            msg_length,
            frag_seqnum,
            frag_pipeline,
        })
    };
    let frames = vec![
        bad(MessageKind::Tiny, vec![0; 33]),
        bad(MessageKind::Small, vec![0; 129]),
        bad(medium(5000, 0, 12), vec![0; 100]),
        bad(medium(5000, 3, 12), vec![0; 904]),
        bad(medium(70000, 0, 12), vec![0; 4096]),
        bad(medium(5000, 0, 11), vec![0; 2048]),
        Frame {
            dst_endpoint: 9,
            ..f[0].clone()
        },
    ];
    deliver(&mut p.b, p.now, A, &frames);
    assert!(events(&mut p.b).is_empty());
    assert!(drain(&mut p.b).is_empty());
    // A fragment claiming another length than its message is dropped too.
    deliver(&mut p.b, p.now, A, &f[..1]);
    deliver(&mut p.b, p.now, A, &[bad(medium(4097, 1, 12), vec![0; 1])]);
    assert!(events(&mut p.b).is_empty());
    deliver(&mut p.b, p.now, A, &f[1..]);
    assert_eq!(recv_done(&events(&mut p.b))[0].data, vec![1; 5000]);
}

#[test]
fn stale_and_foreign_acks_are_ignored() {
    let mut p = EndpointPair::new(Config::default());
    let (id, f) = p.a_sends(1, b"x");
    let seq = message(&f[0]).seqnum;
    let ack = |acknum, session, ack_session| Frame {
        peer_index: B.peer_index,
        dst_endpoint: A.endpoint,
        src_endpoint: B.endpoint,
        body: Body::<Vec<u8>>::Liback(Liback {
            session,
            ack_session,
            acknum,
            lib_seqnum: seq.next(),
            send_seq: seq.next(),
            resent: 0,
        }),
    };
    deliver(
        &mut p.a,
        p.now,
        B,
        &[ack(5, SESSION_A + 1, SESSION_A + 1), ack(5, SESSION_A, 7)],
    );
    assert!(events(&mut p.a).is_empty());
    deliver(&mut p.a, p.now, B, &[ack(5, SESSION_A, SESSION_A)]);
    assert_eq!(
        events(&mut p.a),
        vec![EndpointEvent::SendDone {
            id,
            status: Status::Success,
            xfer_length: 1
        }]
    );
    // An older ack number cannot ack the next send.
    let (id2, f2) = p.a_sends(2, b"y");
    let seq2 = message(&f2[0]).seqnum;
    let mut old = ack(4, SESSION_A, SESSION_A);
    if let Body::Liback(a) = &mut old.body {
        a.lib_seqnum = seq2.next();
    }
    deliver(&mut p.a, p.now, B, &[old.clone()]);
    assert!(events(&mut p.a).is_empty());
    if let Body::Liback(a) = &mut old.body {
        a.acknum = 6;
    }
    deliver(&mut p.a, p.now, B, &[old]);
    assert_eq!(
        events(&mut p.a),
        vec![EndpointEvent::SendDone {
            id: id2,
            status: Status::Success,
            xfer_length: 1
        }]
    );
}

#[test]
fn messages_from_strangers_are_dropped() {
    let mut b = Endpoint::new(Config::default(), 5, SESSION_B, KEY);
    b.post_recv(Instant::ZERO, 0, 0, 10).unwrap();
    let f = Frame {
        peer_index: 9,
        dst_endpoint: 5,
        src_endpoint: 0,
        body: Body::Message(Message {
            session: SESSION_B,
            seqnum: Seqnum::new(0, 1),
            piggyack: Seqnum::new(0, 1),
            match_info: 0,
            kind: MessageKind::Tiny,
            payload: &b"who"[..],
        }),
    };
    b.handle_frame(Instant::ZERO, f);
    assert!(events(&mut b).is_empty());
    assert!(b.poll_transmit().is_none());
}

#[test]
fn receive_requests_post_cancel_probe() {
    let mut p = EndpointPair::new(Config::default());
    assert!(matches!(
        p.b.post_recv(p.now, 0x10, 0x0f, 1),
        Err(xmx_mx::Error::BadMatchMask(_))
    ));
    assert!(p.b.probe(0x10, 0x0f).is_err());
    let r = p.b.post_recv(p.now, 0x1, 0xf, 10).unwrap();
    assert!(p.b.cancel(r));
    assert!(!p.b.cancel(r));
    let (_, f) = p.a_sends(0x21, b"abc");
    deliver(&mut p.b, p.now, A, &f);
    assert!(
        events(&mut p.b).is_empty(),
        "the cancelled receive did not take it"
    );
    let info = p.b.probe(0x1, 0xf).unwrap().unwrap();
    assert_eq!(
        (info.match_info, info.msg_length, info.source.peer),
        (0x21, 3, A)
    );
    assert_eq!(p.b.probe(0x2, 0xf).unwrap(), None);
    let r2 = p.b.post_recv(p.now, 0x21, u64::MAX, 2).unwrap();
    assert!(!p.b.cancel(r2), "already matched");
    let ev = events(&mut p.b);
    let d = recv_done(&ev)[0];
    assert_eq!(
        (d.status, d.msg_length, d.xfer_length, d.data.as_slice()),
        (Status::Truncated, 3, 2, &b"ab"[..])
    );
    assert_eq!(p.b.probe(0, 0).unwrap(), None);
}

#[test]
fn reconnect_request_is_idempotent() {
    let mut p = EndpointPair::new(Config::default());
    p.b.post_recv(p.now, 0, 0, 10).unwrap();
    let (_, f) = p.a_sends(1, b"1");
    deliver(&mut p.b, p.now, A, &f);
    // A connects again (same session): the stream continues unharmed.
    p.connect_a_to_b();
    p.b.post_recv(p.now, 0, 0, 10).unwrap();
    let (_, f) = p.a_sends(2, b"2");
    deliver(&mut p.b, p.now, A, &f);
    let ev = events(&mut p.b);
    assert_eq!(
        recv_done(&ev)
            .iter()
            .map(|r| r.match_info)
            .collect::<Vec<_>>(),
        vec![1, 2]
    );
}

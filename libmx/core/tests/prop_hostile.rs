//! Arbitrary frames from a connected but hostile peer never panic the
//! endpoint, and never disturb an honest partner's traffic.

use proptest::prelude::*;
use xmx_mx::frame::{
    ConnectReply, ConnectRequest, Liback, MediumFrag, Message, MessageKind, Nack, Notify, Rndv,
};
use xmx_mx::{
    Body, Config, Endpoint, EndpointEvent, Frame, Instant, PeerAddr, RdmaWindow, Seqnum, Status,
};

const ME: PeerAddr = PeerAddr::new(1, 0);
const HONEST: PeerAddr = PeerAddr::new(2, 0);
const HOSTILE: PeerAddr = PeerAddr::new(3, 0);
const SESSION: u32 = 0x5E55;

fn seq() -> impl Strategy<Value = Seqnum> {
    prop_oneof![
        3 => (0u16..12).prop_map(|n| Seqnum::new(0, n)),
        1 => any::<u16>().prop_map(Seqnum::from_raw),
    ]
}

fn session() -> impl Strategy<Value = u32> {
    prop_oneof![4 => Just(SESSION), 1 => any::<u32>()]
}

fn kind() -> impl Strategy<Value = MessageKind> {
    prop_oneof![
        Just(MessageKind::Tiny),
        Just(MessageKind::Small),
        (0u32..40_000, 0u8..10, prop_oneof![Just(12u8), any::<u8>()]).prop_map(|(l, f, p)| {
            MessageKind::Medium(MediumFrag {
                msg_length: l,
                frag_seqnum: f,
                frag_pipeline: p,
            })
        }),
        (any::<u32>(), any::<u8>()).prop_map(|(l, id)| MessageKind::Rndv(Rndv {
            msg_length: l,
            window: RdmaWindow {
                id,
                seqnum: 0,
                offset: 0
            }
        })),
    ]
}

fn body() -> impl Strategy<Value = Body<Vec<u8>>> {
    prop_oneof![
        6 => (session(), seq(), seq(), 0u64..4, kind(), prop::collection::vec(any::<u8>(), 0..5000))
            .prop_map(|(session, seqnum, piggyack, match_info, kind, payload)| {
                Body::Message(Message { session, seqnum, piggyack, match_info, kind, payload })
            }),
        1 => (session(), any::<u32>(), seq()).prop_map(|(session, acknum, s)| {
            Body::Liback(Liback { session, ack_session: session, acknum, lib_seqnum: s, send_seq: s, resent: 0 })
        }),
        1 => (any::<u32>(), any::<u32>(), seq(), any::<u8>()).prop_map(|(src_session, app_key, s, c)| {
            Body::ConnectRequest(ConnectRequest {
                lib_seqnum: 0, src_session, app_key, target_recv_seqnum_start: s, connect_seqnum: c,
            })
        }),
        1 => (session(), any::<u32>(), seq(), any::<u8>(), any::<u8>()).prop_map(|(src, tgt, s, c, st)| {
            Body::ConnectReply(ConnectReply {
                lib_seqnum: 0, src_session: src, target_session: tgt,
                target_recv_seqnum_start: s, connect_seqnum: c, status: st,
            })
        }),
        1 => (any::<u8>(), seq()).prop_map(|(t, s)| Body::Nack(Nack { nack_type: t, lib_seqnum: s })),
        1 => (session(), any::<u32>(), any::<u8>(), seq(), seq()).prop_map(|(session, total_length, id, seqnum, piggyack)| {
            Body::Notify(Notify { session, total_length, rdma_id: id, rdma_seqnum: 0, seqnum, piggyack })
        }),
    ]
}

fn pass(from: &mut Endpoint, from_addr: PeerAddr, to: &mut Endpoint, now: Instant) {
    while let Some(mut f) = from.poll_transmit() {
        if f.destination() == ME || f.destination().peer_index == ME.peer_index {
            f.peer_index = from_addr.peer_index;
            to.handle_frame(now, f.as_borrowed());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn hostile_frames_do_no_harm(bodies in prop::collection::vec(body(), 1..60), post in any::<bool>()) {
        let mut me = Endpoint::new(Config::default(), ME.endpoint, SESSION, 9);
        let mut honest = Endpoint::new(Config::default(), HONEST.endpoint, 0xAB, 9);
        let mut now = Instant::from_millis(1);
        // Both peers connect to us; the hostile one speaks the handshake right.
        honest.connect(now, ME, 9);
        pass(&mut honest, HONEST, &mut me, now);
        let hostile_connect = Frame {
            peer_index: HOSTILE.peer_index, dst_endpoint: ME.endpoint, src_endpoint: HOSTILE.endpoint,
            body: Body::<&[u8]>::ConnectRequest(ConnectRequest {
                lib_seqnum: 0, src_session: 0xBAD, app_key: 9,
                target_recv_seqnum_start: Seqnum::new(0, 1), connect_seqnum: 0,
            }),
        };
        me.handle_frame(now, hostile_connect);
        // Our replies go to the honest peer only.
        while let Some(f) = me.poll_transmit() {
            if f.destination() == HONEST {
                let mut f = f;
                f.peer_index = ME.peer_index;
                honest.handle_frame(now, f.as_borrowed());
            }
        }
        if post {
            for _ in 0..8 {
                // Takes the hostile match infos (0..4), not the honest one.
                me.post_recv(now, 0, !3, 3000).unwrap();
            }
        }
        let honest_msg = b"honest bytes".to_vec();
        honest.send(now, ME, 77, &honest_msg).unwrap();
        for b in bodies {
            now = now + std::time::Duration::from_millis(3);
            let f = Frame { peer_index: HOSTILE.peer_index, dst_endpoint: ME.endpoint, src_endpoint: HOSTILE.endpoint, body: b };
            me.handle_frame(now, f.as_borrowed());
            if let Some(t) = me.next_timeout() {
                if t <= now { me.handle_timeout(now); }
            }
            while me.poll_transmit().is_some() {}
        }
        // The honest partner's message still gets through intact.
        pass(&mut honest, HONEST, &mut me, now);
        let r = me.post_recv(now, 77, u64::MAX, 100).unwrap();
        let mut got = None;
        while let Some(e) = me.poll_event() {
            if let EndpointEvent::RecvDone(d) = e {
                if d.source.peer == HONEST {
                    got = Some((d.id, d.status, d.data));
                }
            }
        }
        prop_assert_eq!(got, Some((r, Status::Success, honest_msg)));
    }
}

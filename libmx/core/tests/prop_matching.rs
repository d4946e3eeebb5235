//! The matching engine against a reference model, alone and inside an endpoint.

use proptest::prelude::*;
use xmx_mx::matching::{satisfies, Matcher, Posting};
use xmx_mx::{Config, Endpoint, EndpointEvent, Instant, PeerAddr, Status};

#[derive(Clone, Debug)]
enum MatchingOp {
    Post {
        info: u64,
        mask: u64,
        capacity: usize,
    },
    Arrive {
        info: u64,
        len: usize,
    },
    Cancel {
        nth: usize,
    },
    Probe {
        info: u64,
        mask: u64,
    },
}

/// Match info from a small space so that matches are frequent.
fn info() -> impl Strategy<Value = u64> {
    prop_oneof![0..8u64, Just(u64::MAX), Just(1 << 63)]
}

fn mask() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(3),
        Just(7),
        Just(6),
        Just(u64::MAX)
    ]
}

fn op() -> impl Strategy<Value = MatchingOp> {
    prop_oneof![
        3 => (info(), mask(), 0..40usize).prop_map(|(i, m, capacity)| MatchingOp::Post { info: i & m, mask: m, capacity }),
        3 => (info(), 0..40usize).prop_map(|(info, len)| MatchingOp::Arrive { info, len }),
        1 => (0..8usize).prop_map(|nth| MatchingOp::Cancel { nth }),
        1 => (info(), mask()).prop_map(|(i, m)| MatchingOp::Probe { info: i & m, mask: m }),
    ]
}

/// The model: every receive and message ever seen, in order, with a flag for
/// whether it is still waiting. Matching is defined directly by MX's rule:
/// the earliest waiting counterpart whose masked match info agrees.
#[derive(Default)]
struct Model {
    recvs: Vec<(u64, u64, u64, bool)>, // id, info, mask, waiting
    msgs: Vec<(u64, u64, bool)>,       // id, info, waiting
}

impl Model {
    fn post(&mut self, id: u64, info: u64, mask: u64) -> Option<u64> {
        let hit = self.msgs.iter_mut().find(|m| m.2 && m.1 & mask == info);
        match hit {
            Some(m) => {
                m.2 = false;
                self.recvs.push((id, info, mask, false));
                Some(m.0)
            }
            None => {
                self.recvs.push((id, info, mask, true));
                None
            }
        }
    }

    fn arrive(&mut self, id: u64, info: u64) -> Option<u64> {
        let hit = self.recvs.iter_mut().find(|r| r.3 && info & r.2 == r.1);
        match hit {
            Some(r) => {
                r.3 = false;
                self.msgs.push((id, info, false));
                Some(r.0)
            }
            None => {
                self.msgs.push((id, info, true));
                None
            }
        }
    }

    fn waiting_recvs(&self) -> Vec<u64> {
        self.recvs.iter().filter(|r| r.3).map(|r| r.0).collect()
    }

    fn waiting_msgs(&self) -> Vec<u64> {
        self.msgs.iter().filter(|m| m.2).map(|m| m.0).collect()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn matcher_follows_the_model(ops in prop::collection::vec(op(), 0..80)) {
        let mut m: Matcher<u64, u64> = Matcher::new();
        let mut model = Model::default();
        for (n, op) in ops.into_iter().enumerate() {
            let id = n as u64;
            match op {
                MatchingOp::Post { info, mask, .. } => {
                    let got = match m.post(info, mask, id).unwrap() {
                        Posting::Matched(r, msg) => { prop_assert_eq!(r, id); Some(msg) }
                        Posting::Queued => None,
                    };
                    prop_assert_eq!(got, model.post(id, info, mask));
                }
                MatchingOp::Arrive { info, .. } => {
                    let got = m.arrive(info);
                    if got.is_none() {
                        m.push_unexpected(info, id);
                    }
                    prop_assert_eq!(got, model.arrive(id, info));
                }
                MatchingOp::Cancel { nth } => {
                    let target = model.waiting_recvs().get(nth).copied();
                    let got = m.cancel(|&r| Some(r) == target);
                    prop_assert_eq!(got, target);
                    if let Some(t) = target {
                        model.recvs.iter_mut().filter(|r| r.0 == t).for_each(|r| r.3 = false);
                    }
                }
                MatchingOp::Probe { info, mask } => {
                    let want = model.msgs.iter().find(|x| x.2 && x.1 & mask == info).map(|x| (x.1, x.0));
                    prop_assert_eq!(m.probe(info, mask).map(|(i, &u)| (i, u)), want);
                }
            }
            prop_assert_eq!(m.posted().map(|p| *p.2).collect::<Vec<_>>(), model.waiting_recvs());
            prop_assert_eq!(m.unexpected().map(|u| *u.1).collect::<Vec<_>>(), model.waiting_msgs());
            // The queues never hold a pair that should have matched.
            for (pi, pm, _) in m.posted() {
                for (ui, _) in m.unexpected() {
                    prop_assert!(!satisfies(ui, pi, pm));
                }
            }
        }
    }

    #[test]
    fn endpoint_matching_and_truncation_follow_the_model(ops in prop::collection::vec(op(), 0..60)) {
        // B receives; A's messages are handed over directly, in order.
        let a_addr = PeerAddr::new(1, 0);
        let b_addr = PeerAddr::new(2, 0);
        let mut a = Endpoint::new(Config::default(), 0, 11, 5);
        let mut b = Endpoint::new(Config::default(), 0, 22, 5);
        let now = Instant::ZERO;
        let pass = |from: &mut Endpoint, to: &mut Endpoint, src: PeerAddr| {
            while let Some(mut f) = from.poll_transmit() {
                f.peer_index = src.peer_index;
                to.handle_frame(now, f.as_borrowed());
            }
        };
        a.connect(now, b_addr, 5);
        pass(&mut a, &mut b, a_addr);
        pass(&mut b, &mut a, b_addr);
        let connected = matches!(a.poll_event(), Some(EndpointEvent::Connected { status: Status::Success, .. }));
        prop_assert!(connected);

        let mut model = Model::default();
        let mut capacity = std::collections::HashMap::new();
        let mut payload = std::collections::HashMap::new();
        let mut recv_id_of_op = std::collections::HashMap::new();
        let mut completions = Vec::new();
        for (n, op) in ops.into_iter().enumerate() {
            let tag = n as u64;
            match op {
                MatchingOp::Post { info, mask, capacity: cap } => {
                    let rid = b.post_recv(now, info, mask, cap).unwrap();
                    recv_id_of_op.insert(rid, tag);
                    capacity.insert(tag, cap);
                    if let Some(msg) = model.post(tag, info, mask) {
                        completions.push((tag, msg));
                    }
                }
                MatchingOp::Arrive { info, len } => {
                    let data: Vec<u8> = (0..len).map(|i| (i as u64 ^ tag) as u8).collect();
                    payload.insert(tag, (info, data.clone()));
                    a.send(now, b_addr, info, &data).unwrap();
                    // B's acks go back too: they reopen A's send window.
                    pass(&mut a, &mut b, a_addr);
                    pass(&mut b, &mut a, b_addr);
                    pass(&mut a, &mut b, a_addr);
                    if let Some(r) = model.arrive(tag, info) {
                        completions.push((r, tag));
                    }
                }
                MatchingOp::Cancel { nth } => {
                    let target = model.waiting_recvs().get(nth).copied();
                    if let Some(t) = target {
                        let rid = *recv_id_of_op.iter().find(|(_, &v)| v == t).unwrap().0;
                        prop_assert!(b.cancel(rid));
                        model.recvs.iter_mut().filter(|r| r.0 == t).for_each(|r| r.3 = false);
                    }
                }
                MatchingOp::Probe { info, mask } => {
                    let want = model.msgs.iter().find(|x| x.2 && x.1 & mask == info).map(|x| payload[&x.0].clone());
                    let got = b.probe(info, mask).unwrap().map(|p| (p.match_info, p.msg_length as usize));
                    prop_assert_eq!(got, want.map(|(i, d)| (i, d.len())));
                }
            }
            // Every completion the model predicts, in order, with truncation.
            while let Some(ev) = b.poll_event() {
                let r = match ev {
                    EndpointEvent::RecvDone(r) => r,
                    other => return Err(TestCaseError::fail(format!("unexpected {other:?}"))),
                };
                prop_assert!(!completions.is_empty(), "completion the model did not predict");
                let (recv_tag, msg_tag) = completions.remove(0);
                prop_assert_eq!(recv_id_of_op[&r.id], recv_tag);
                let (info, data) = &payload[&msg_tag];
                let cap = capacity[&recv_tag];
                prop_assert_eq!(r.match_info, *info);
                prop_assert_eq!(r.msg_length as usize, data.len());
                prop_assert_eq!(r.xfer_length as usize, data.len().min(cap));
                prop_assert_eq!(&r.data[..], &data[..data.len().min(cap)]);
                prop_assert_eq!(r.status, if cap < data.len() { Status::Truncated } else { Status::Success });
                prop_assert_eq!(r.source.peer, a_addr);
            }
            prop_assert!(completions.is_empty(), "predicted completions missing: {:?}", completions);
        }
    }
}

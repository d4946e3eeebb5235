//! Two simulated hosts, each with its backend on one end of a veth pair: guests on
//! different hosts talk over MXoE frames on the wire. Needs root (network namespaces);
//! without it the test reports the skip and passes.

mod backd_util;

use backd_util::{counters, small_endpoint, BackdTestHost, FakeGuest, FakeGuestEndpoint};
use xmx_nic::testbed::VethPair;
use xmx_wire::msg::{
    fill_marks, CtrlStatus, DoneStatus, EventBody, InlineData, InlineMsg, MediumSend, MsgInfo,
    Pull, QueueSlots, RndvSend, Route, SendOp, SendRequest,
};

fn next_non_completion(g: &FakeGuest, ep: &mut FakeGuestEndpoint) -> EventBody {
    loop {
        let ev = g.next_event(ep);
        if !matches!(ev.body, EventBody::SendDone { .. }) {
            return ev.body;
        }
        assert!(
            matches!(
                ev.body,
                EventBody::SendDone {
                    status: DoneStatus::Success,
                    ..
                }
            ),
            "{ev:?}"
        );
        g.retire_events(ep);
    }
}

#[test]
fn guests_on_two_hosts_exchange_tiny_medium_and_large_over_the_wire() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    let pair = VethPair::create("backd", 9000).expect("veth pair");
    let host1 = BackdTestHost::start();
    let host2 = BackdTestHost::start();
    let backend1 = host1.start_wire_backend(&pair.ns_a, &pair.if_a);
    let backend2 = host2.start_wire_backend(&pair.ns_b, &pair.if_b);
    let mut a = host1.guest("a", 1, 1);
    let mut b = host2.guest("b", 2, 1);
    a.connect();
    b.connect();
    let mut ea = a.open_endpoint(0, small_endpoint(8)).1.unwrap();
    let mut eb = b.open_endpoint(0, small_endpoint(8)).1.unwrap();
    let to_b = Route {
        peer_index: 1,
        endpoint: 0,
        session_id: eb.session,
    };

    // TINY.
    a.send(
        &mut ea,
        SendRequest {
            tag: 1,
            route: to_b,
            op: SendOp::Tiny(InlineMsg {
                info: MsgInfo {
                    seqnum: 1,
                    piggyack: 0,
                    match_info: 99,
                },
                data: InlineData::new(b"over the wire").unwrap(),
            }),
        },
    );
    match next_non_completion(&b, &mut eb) {
        EventBody::RecvTiny { from, msg } => {
            assert_eq!(from.peer_index, 0);
            assert_eq!(msg.data.as_slice(), b"over the wire");
            assert_eq!(msg.info.match_info, 99);
        }
        other => panic!("expected a TINY, got {other:?}"),
    }
    b.retire_events(&mut eb);

    // MEDIUM of 5 fragments.
    let message: Vec<u8> = (0..(4 * 4096 + 123u32)).map(|i| (i * 13) as u8).collect();
    for (slot, chunk) in message.chunks(4096).enumerate() {
        assert!(ea.sendq.write_bytes(slot * 4096, chunk));
    }
    a.send(
        &mut ea,
        SendRequest {
            tag: 2,
            route: to_b,
            op: SendOp::Medium(MediumSend {
                info: MsgInfo::default(),
                length: message.len() as u32,
                sendq_slots: QueueSlots::new(&[0, 1, 2, 3, 4]).unwrap(),
            }),
        },
    );
    let mut got = vec![0u8; message.len()];
    for _ in 0..5 {
        let EventBody::RecvMedium { frag, .. } = next_non_completion(&b, &mut eb) else {
            panic!("expected MEDIUM fragments");
        };
        let start = usize::from(frag.frag_seqnum) * 4096;
        let end = start + usize::from(frag.frag_length);
        assert!(eb
            .recvq
            .read_bytes(usize::from(frag.recvq_slot) * 4096, &mut got[start..end]));
    }
    b.retire_events(&mut eb);
    assert!(got == message, "MEDIUM bytes differ");

    // LARGE: 1 MiB pulled by B's backend from A's region.
    let len = 1 << 20;
    let (rsp, src) = a.register_region(0, 1, 0, len);
    assert_eq!(rsp.status, CtrlStatus::Ok);
    let (rsp, dst) = b.register_region(0, 2, 0, len);
    assert_eq!(rsp.status, CtrlStatus::Ok);
    let data: Vec<u8> = (0..len).map(|i| (i % 241) as u8 ^ 0x5c).collect();
    assert!(src.mem.write_bytes(0, &data));
    fill_marks::write(ea.send.mem(), 1, true);
    a.send(
        &mut ea,
        SendRequest {
            tag: 3,
            route: to_b,
            op: SendOp::Rndv(RndvSend {
                info: MsgInfo::default(),
                length: len,
                region_id: 1,
                region_seqnum: 0,
                region_offset: 0,
            }),
        },
    );
    let EventBody::RecvRndv { from, rndv } = next_non_completion(&b, &mut eb) else {
        panic!("expected a RNDV");
    };
    b.retire_events(&mut eb);
    b.send(
        &mut eb,
        SendRequest {
            tag: 4,
            route: Route {
                peer_index: from.peer_index,
                endpoint: from.endpoint,
                session_id: ea.session,
            },
            op: SendOp::Pull(Pull {
                length: len,
                local_region: 2,
                local_offset: 0,
                remote_region: rndv.region_id,
                remote_region_seqnum: rndv.region_seqnum,
                remote_offset: 0,
            }),
        },
    );
    // The backend tells how much has landed as the pull goes (each step, in order),
    // then that it is done.
    let mut told = 0;
    let ev = loop {
        let ev = b.next_event(&mut eb);
        let EventBody::PullProgress { length } = ev.body else {
            break ev;
        };
        assert_eq!(ev.tag, 4);
        assert!(
            told < length && length < len,
            "{length} after {told} of {len}"
        );
        told = length;
    };
    assert_eq!(ev.tag, 4);
    assert_eq!(
        ev.body,
        EventBody::PullDone {
            status: DoneStatus::Success,
            length: len
        }
    );
    b.retire_events(&mut eb);
    let mut pulled = vec![0u8; len as usize];
    assert!(dst.mem.read_bytes(0, &mut pulled));
    assert!(pulled == data, "LARGE bytes differ");

    let c1 = counters(&backend1);
    let c2 = counters(&backend2);
    let na = c1.guests[0].nic.as_ref().unwrap();
    let nb = c2.guests[0].nic.as_ref().unwrap();
    assert_eq!(na.local_frames, 0);
    assert!(na.tx_frames >= 1 + 5 + 1 + 256, "{na:?}");
    assert!(nb.rx_frames >= 1 + 5 + 1 + 256, "{nb:?}");
    assert!(c1.backend.nic_tx_frames >= na.tx_frames);
    assert_eq!(c1.backend.tx_without_link, 0);
    a.close();
    b.close();
}

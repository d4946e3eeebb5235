//! A guest destroyed in the middle of a transfer: the backend lets go of all of it and keeps
//! serving the other guest.

mod backd_util;

use backd_util::{
    set_two_guest_peers, small_endpoint, BackdTestHost, FakeGuest, FakeGuestEndpoint,
};
use xmx_backend::admin::{BackdRequest, CountersReport};
use xmx_backend::service::GuestQuotas;
use xmx_hv::{Platform, DOM0};
use xmx_wire::msg::{
    CtrlStatus, DoneStatus, EventBody, InlineData, InlineMsg, MediumSend, MsgInfo, QueueSlots,
    Route, SendOp, SendRequest,
};
use xmx_wire::xenbus;

fn tiny(tag: u32, to: Route, text: &[u8]) -> SendRequest {
    SendRequest {
        tag,
        route: to,
        op: SendOp::Tiny(InlineMsg {
            info: MsgInfo {
                seqnum: tag as u16,
                piggyack: 0,
                match_info: u64::from(tag),
            },
            data: InlineData::new(text).unwrap(),
        }),
    }
}

/// Take events until the completion of `tag`; returns it.
fn completion(g: &FakeGuest, ep: &mut FakeGuestEndpoint, tag: u32) -> EventBody {
    loop {
        let ev = g.next_event(ep);
        g.retire_events(ep);
        if ev.tag == tag
            && matches!(
                ev.body,
                EventBody::SendDone { .. } | EventBody::Error { .. }
            )
        {
            return ev.body;
        }
    }
}

#[test]
fn a_destroyed_guest_is_released_and_the_other_one_carries_on() {
    let host = BackdTestHost::start();
    let backend = host.start_backend(GuestQuotas::default());
    set_two_guest_peers(&backend);
    let mut a = host.guest("a", 1, 1);
    let mut b = host.guest("b", 2, 1);
    a.connect();
    b.connect();
    let mut a0 = a.open_endpoint(0, small_endpoint(2)).1.unwrap();
    let mut a1 = a.open_endpoint(1, small_endpoint(2)).1.unwrap();
    let b0 = b.open_endpoint(0, small_endpoint(8)).1.unwrap();
    let (rsp, _region) = b.register_region(0, 0, 0, 16 * 4096);
    assert_eq!(rsp.status, CtrlStatus::Ok);
    let a_pages = 1 + 2 * 6;
    assert_eq!(host.dom0_mappings(), a_pages + 1 + 18 + 16);

    // A floods B, which never reads: B's event ring fills and a backlog builds up in dom0,
    // with MEDIUM fragments holding B's receive-queue slots.
    let to_b = Route {
        peer_index: 1,
        endpoint: 0,
        session_id: b0.session,
    };
    let mut tag = 0;
    for _ in 0..24 {
        tag += 1;
        a.send(&mut a0, tiny(tag, to_b, b"are you there?"));
        assert!(matches!(
            completion(&a, &mut a0, tag),
            EventBody::SendDone {
                status: DoneStatus::Success,
                ..
            }
        ));
    }
    assert!(a0.sendq.write_bytes(0, &[0x5a; 4096]));
    tag += 1;
    a.send(
        &mut a0,
        SendRequest {
            tag,
            route: to_b,
            op: SendOp::Medium(MediumSend {
                info: MsgInfo::default(),
                length: 4096,
                sendq_slots: QueueSlots::new(&[0]).unwrap(),
            }),
        },
    );
    completion(&a, &mut a0, tag);
    let counters: CountersReport = serde_json::from_value(
        backend
            .control()
            .call(BackdRequest::Counters)
            .into_result()
            .unwrap(),
    )
    .unwrap();
    let gb = counters.guests.iter().find(|g| g.domid == b.domid).unwrap();
    assert!(gb.endpoints[0].backlog > 0, "B's ring is full: {gb:?}");

    // B dies.
    let bdom = b.domid;
    drop(b0);
    drop(b);
    host.admin.destroy(bdom).unwrap();
    // The backend removes B's backend directory once it let go of everything B shared.
    let xs0 = host.attach(DOM0).xenstore().unwrap();
    backd_util::wait_removed(
        xs0.as_ref(),
        &format!("{}/{bdom}", xenbus::backend_root(DOM0)),
    );
    assert_eq!(host.dom0_mappings(), a_pages);
    assert_eq!(host.state(DOM0).ports_open, 1 + 2);
    let guests = backd_util::guest_reports(&backend);
    assert!(guests.iter().all(|g| g.domid != bdom));

    // A carries on: between its own endpoints, and towards B's now-unreachable address
    // (it leaves for the wire, and there is none), with completions either way.
    let a1_session = a1.session;
    for i in 0..3 {
        tag += 1;
        let to_self = Route {
            peer_index: 0,
            endpoint: 1,
            session_id: a1_session,
        };
        let text = format!("alone {i}");
        a.send(&mut a0, tiny(tag, to_self, text.as_bytes()));
        let ev = a.next_event(&mut a1);
        match ev.body {
            EventBody::RecvTiny { msg, .. } => assert_eq!(msg.data.as_slice(), text.as_bytes()),
            other => panic!("expected a TINY, got {other:?}"),
        }
        a.retire_events(&mut a1);
        completion(&a, &mut a0, tag);
    }
    tag += 1;
    a.send(&mut a0, tiny(tag, to_b, b"gone?"));
    completion(&a, &mut a0, tag);
    let counters: CountersReport = serde_json::from_value(
        backend
            .control()
            .call(BackdRequest::Counters)
            .into_result()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(counters.backend.tx_without_link, 1);
    a.close();
    assert_eq!(host.dom0_mappings(), 0);
    assert_eq!(host.state(DOM0).ports_open, 0);
}

//! Hostile frontends: the offender alone is refused or disconnected, with everything it
//! shared released, and the other guest's traffic goes on.

mod backd_util;

use std::sync::atomic::Ordering;

use backd_util::{
    guest_report, set_two_guest_peers, small_endpoint, BackdTestHost, FakeGuest, FakeGuestEndpoint,
};
use xmx_backend::admin::{BackdRequest, CountersReport};
use xmx_backend::service::{BackendThread, GuestQuotas};
use xmx_hv::{DomId, DOM0};
use xmx_wire::msg::{
    CtrlOp, CtrlStatus, EndpointOpen, EventBody, InlineData, InlineMsg, MsgInfo, Pull, Route,
    SendOp, SendRequest, CTRL_SLOT_SIZE, SEND_SLOT_SIZE,
};
use xmx_wire::ring::layout;
use xmx_wire::xenbus::XenbusState;

/// A well-behaved guest with two endpoints that talks to itself through the backend.
struct Bystander {
    g: FakeGuest,
    e0: FakeGuestEndpoint,
    e1: FakeGuestEndpoint,
    sent: u32,
}

/// Pages the bystander keeps mapped: control ring + two endpoints of 4 pages.
const BYSTANDER_PAGES: usize = 1 + 2 * 4;
/// Ports the bystander keeps bound in dom0.
const BYSTANDER_PORTS: usize = 3;

impl Bystander {
    fn start(host: &BackdTestHost) -> Bystander {
        let mut g = host.guest("bystander", 2, 1);
        g.connect();
        let e0 = g.open_endpoint(0, small_endpoint(1)).1.unwrap();
        let e1 = g.open_endpoint(1, small_endpoint(1)).1.unwrap();
        let mut b = Bystander { g, e0, e1, sent: 0 };
        b.exchange();
        b
    }

    /// A TINY from endpoint 0 to endpoint 1 of the same guest (peer 1), received intact.
    fn exchange(&mut self) {
        self.sent += 1;
        let text = format!("still here {}", self.sent);
        let req = SendRequest {
            tag: self.sent,
            route: Route {
                peer_index: 1,
                endpoint: 1,
                session_id: self.e1.session,
            },
            op: SendOp::Tiny(InlineMsg {
                info: MsgInfo {
                    seqnum: self.sent as u16,
                    piggyack: 0,
                    match_info: u64::from(self.sent),
                },
                data: InlineData::new(text.as_bytes()).unwrap(),
            }),
        };
        self.g.send(&mut self.e0, req);
        let ev = self.g.next_event(&mut self.e1);
        match ev.body {
            EventBody::RecvTiny { msg, .. } => assert_eq!(msg.data.as_slice(), text.as_bytes()),
            other => panic!("bystander expected its TINY, got {other:?}"),
        }
        self.g.retire_events(&mut self.e1);
        let done = self.g.next_event(&mut self.e0);
        assert_eq!(done.tag, self.sent);
        self.g.retire_events(&mut self.e0);
    }
}

fn setup(quotas: GuestQuotas) -> (BackdTestHost, BackendThread, Bystander, FakeGuest) {
    let host = BackdTestHost::start();
    let backend = host.start_backend(quotas);
    set_two_guest_peers(&backend);
    let bystander = Bystander::start(&host);
    let mut offender = host.guest("offender", 1, 1);
    offender.connect();
    (host, backend, bystander, offender)
}

/// The offender holds nothing in dom0 any more; the bystander still holds its share.
fn assert_released(host: &BackdTestHost, offender: DomId) {
    assert_eq!(host.mapped_by_others(offender), 0);
    assert_eq!(host.dom0_mappings(), BYSTANDER_PAGES);
    assert_eq!(host.state(DOM0).ports_open, BYSTANDER_PORTS);
}

#[test]
fn garbage_on_the_control_ring_disconnects_only_the_offender() {
    let (host, backend, mut bystander, mut h) = setup(GuestQuotas::default());
    let (_, _ep) = h.open_endpoint(0, small_endpoint(2));
    let (rsp, _region) = h.register_region(0, 1, 0, 3 * 4096);
    assert_eq!(rsp.status, CtrlStatus::Ok);
    assert_eq!(host.mapped_by_others(h.domid), 1 + 6 + 3);

    let mut slot = [0u8; CTRL_SLOT_SIZE];
    slot[0] = 0x7f; // no such request kind
    slot[1] = 1;
    h.push_raw_ctrl(&slot);
    h.wait_backend_state(XenbusState::Closed);
    assert_released(&host, h.domid);
    let r = guest_report(&backend, h.domid);
    assert!(!r.connected);
    assert!(r.last_error.unwrap().contains("control ring"));
    assert!(h.read_backend("error").unwrap().contains("control ring"));
    bystander.exchange();

    // The offender may start over, and is served again.
    h.set_state(XenbusState::Closed);
    h.set_state(XenbusState::Initialising);
    h.connect();
    let (rsp, _ep) = h.open_endpoint(0, small_endpoint(1));
    assert_eq!(rsp.status, CtrlStatus::Ok);
    bystander.exchange();
    h.close();
    assert_released(&host, h.domid);
}

#[test]
fn a_send_ring_index_past_the_ring_disconnects_only_the_offender() {
    let (host, backend, mut bystander, mut h) = setup(GuestQuotas::default());
    let (_, ep) = h.open_endpoint(0, small_endpoint(2));
    let ep = ep.unwrap();
    // req_prod jumps a thousand slots ahead of a 16-slot ring.
    ep.send
        .mem()
        .store_u32(layout::REQ_PROD, 1000, Ordering::Release);
    h.evtchn.notify(ep.port).unwrap();
    h.wait_backend_state(XenbusState::Closed);
    assert_released(&host, h.domid);
    assert!(guest_report(&backend, h.domid)
        .last_error
        .unwrap()
        .contains("send ring"));
    bystander.exchange();
    let counters: CountersReport = serde_json::from_value(
        backend
            .control()
            .call(BackdRequest::Counters)
            .into_result()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(counters.backend.disconnects, 1);
}

#[test]
fn an_undecodable_send_request_or_a_violation_disconnects_only_the_offender() {
    let (host, _backend, mut bystander, mut h) = setup(GuestQuotas::default());
    let (_, ep) = h.open_endpoint(0, small_endpoint(1));
    let mut ep = ep.unwrap();
    // A pull into a region the endpoint never registered: the engine calls it a
    // violation. (An RNDV naming one is only refused: a correct library can resend one
    // after its window was deregistered.)
    h.send(
        &mut ep,
        SendRequest {
            tag: 1,
            route: Route {
                peer_index: 0,
                endpoint: 0,
                session_id: 0,
            },
            op: SendOp::Pull(Pull {
                length: 100_000,
                local_region: 7,
                local_offset: 0,
                remote_region: 2,
                remote_region_seqnum: 0,
                remote_offset: 0,
            }),
        },
    );
    h.wait_backend_state(XenbusState::Closed);
    assert_released(&host, h.domid);
    bystander.exchange();

    // Again, with bytes that are no send request at all.
    h.set_state(XenbusState::Closed);
    h.set_state(XenbusState::Initialising);
    h.connect();
    let (_, ep) = h.open_endpoint(0, small_endpoint(1));
    let ep = ep.unwrap();
    let mut slot = [0u8; SEND_SLOT_SIZE];
    slot[0] = 0x10; // TINY
    slot[1] = 1;
    slot[20] = 200; // inline length far beyond 32
    assert!(ep.send.mem().write_bytes(layout::SLOTS, &slot));
    ep.send
        .mem()
        .store_u32(layout::REQ_PROD, 1, Ordering::Release);
    h.evtchn.notify(ep.port).unwrap();
    h.wait_backend_state(XenbusState::Closed);
    assert_released(&host, h.domid);
    bystander.exchange();
}

#[test]
fn grant_refs_that_are_invalid_or_granted_elsewhere_are_refused_without_mapping() {
    let (host, backend, mut bystander, mut h) = setup(GuestQuotas::default());
    let before = host.dom0_mappings();
    let port = h.evtchn.alloc_unbound(DOM0).unwrap();
    let open = |info_ref| {
        CtrlOp::EndpointOpen(EndpointOpen {
            endpoint: 0,
            event_channel: port,
            info_ref,
            pages: small_endpoint(1),
            resume_session: 0,
            quiet_send_done: false,
        })
    };
    // No such grant.
    assert_eq!(h.call(open(30000)).status, CtrlStatus::BadGrant);
    // A page granted to the bystander, not to dom0.
    let elsewhere = h.gnttab.grant_pages(bystander.g.domid, 1, true).unwrap();
    assert_eq!(
        h.call(open(elsewhere.refs()[0])).status,
        CtrlStatus::BadGrant
    );
    // A genuine info page listing a ref granted elsewhere: the batch maps nothing.
    let mine = h.gnttab.grant_pages(DOM0, 3, true).unwrap();
    let mut refs = mine.refs().to_vec();
    refs.push(elsewhere.refs()[0]);
    let info = h.gnttab.grant_pages(DOM0, 1, true).unwrap();
    let mut page = vec![0u8; 4096];
    xmx_wire::msg::pack_info_page(&refs, &mut page).unwrap();
    // SAFETY: the info page is this guest's own writable page, one page long.
    unsafe { std::ptr::copy_nonoverlapping(page.as_ptr(), info.as_ptr(), 4096) };
    assert_eq!(h.call(open(info.refs()[0])).status, CtrlStatus::BadGrant);
    // The same for a region's info page, on an endpoint that does exist.
    let (_, _ep) = h.open_endpoint(1, small_endpoint(1));
    let rsp = h.call(CtrlOp::RegionRegister(xmx_wire::msg::RegionRegister {
        endpoint: 1,
        region_id: 0,
        first_page_offset: 0,
        length: 4 * 4096,
        info_refs: vec![info.refs()[0]],
    }));
    assert_eq!(rsp.status, CtrlStatus::BadGrant);
    // Refusals are no violations: the guest stays connected, holding only what succeeded.
    assert_eq!(h.backend_state(), Some(XenbusState::Connected));
    assert_eq!(host.dom0_mappings(), before + 4);
    assert_eq!(host.mapped_by_others(bystander.g.domid), BYSTANDER_PAGES);
    assert!(guest_report(&backend, h.domid).connected);
    bystander.exchange();
    h.close();
    assert_released(&host, h.domid);
}

#[test]
fn a_quota_flood_is_refused_and_counted() {
    let quotas = GuestQuotas {
        max_endpoints: 2,
        max_regions_per_endpoint: 2,
        max_mapped_pages: 40,
        ..GuestQuotas::default()
    };
    let (host, backend, mut bystander, mut h) = setup(quotas);
    let (r0, _e0) = h.open_endpoint(0, small_endpoint(1));
    let (r1, _e1) = h.open_endpoint(1, small_endpoint(1));
    let (r2, e2) = h.open_endpoint(2, small_endpoint(1));
    assert_eq!(
        (r0.status, r1.status, r2.status),
        (CtrlStatus::Ok, CtrlStatus::Ok, CtrlStatus::Quota)
    );
    assert!(e2.is_none());
    let mut regions = Vec::new();
    for id in 0..3 {
        let (rsp, region) = h.register_region(0, id, 0, 4096);
        regions.push((rsp.status, region));
    }
    let statuses: Vec<CtrlStatus> = regions.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        statuses,
        [CtrlStatus::Ok, CtrlStatus::Ok, CtrlStatus::Quota]
    );
    // 1 + 8 + 2 pages mapped; 30 more would pass the 40-page quota.
    let (rsp, _big) = h.register_region(1, 0, 0, 30 * 4096);
    assert_eq!(rsp.status, CtrlStatus::Quota);
    assert_eq!(host.mapped_by_others(h.domid), 11);
    let counters: CountersReport = serde_json::from_value(
        backend
            .control()
            .call(BackdRequest::Counters)
            .into_result()
            .unwrap(),
    )
    .unwrap();
    let offender = counters.guests.iter().find(|g| g.domid == h.domid).unwrap();
    assert_eq!(offender.quota_refusals, 3);
    bystander.exchange();
    h.close();
    assert_released(&host, h.domid);
    bystander.exchange();
}

/// A frontend that rewrites its send-ring slots while the backend reads them: every slot
/// holds a well-formed request one instant and garbage the next. The backend copies each
/// slot out once before parsing, so whatever snapshot it takes is either served as it is or
/// refused; the offender ends disconnected with everything released, and the backend and the
/// other guest never notice.
#[test]
fn slots_rewritten_while_the_backend_reads_them_disconnect_only_the_offender() {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    let (host, backend, mut bystander, mut h) = setup(GuestQuotas::default());
    let (_, ep) = h.open_endpoint(0, small_endpoint(1));
    let mut ep = ep.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let scribbler = {
        let mem = ep.send.mem().clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
            let mut garbage = [0u8; SEND_SLOT_SIZE];
            let slots = (mem.len() - layout::SLOTS) / SEND_SLOT_SIZE;
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for slot in 0..slots {
                    for b in garbage.iter_mut() {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        *b = x as u8;
                    }
                    mem.write_bytes(layout::SLOTS + slot * SEND_SLOT_SIZE, &garbage);
                }
                rounds += 1;
            }
            rounds
        })
    };

    let deadline = Instant::now() + Duration::from_secs(30);
    let mut pushed = 0u32;
    while h.backend_state() != Some(XenbusState::Closed) {
        assert!(
            Instant::now() < deadline,
            "the backend neither refused nor served the rewritten ring"
        );
        ep.send.reclaim().unwrap();
        if ep.send.is_full() {
            // The backend consumes (and the offender's state changes) on its own schedule;
            // wake on its notification or re-check the state soon.
            let mut ports = Vec::new();
            h.evtchn
                .wait(&mut ports, Some(Duration::from_millis(20)))
                .unwrap();
            for p in ports {
                h.evtchn.unmask(p).unwrap();
            }
            continue;
        }
        pushed += 1;
        let req = SendRequest {
            tag: pushed,
            route: Route {
                peer_index: 0,
                endpoint: 0,
                session_id: ep.session,
            },
            op: SendOp::Tiny(InlineMsg::default()),
        };
        ep.send.push_request(&req).unwrap();
        if ep.send.push_requests_and_check_notify() {
            h.evtchn.notify(ep.port).unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = scribbler.join().unwrap();
    assert!(rounds > 0 && pushed > 0);

    assert_released(&host, h.domid);
    let last_error = guest_report(&backend, h.domid).last_error.unwrap();
    assert!(!last_error.is_empty());
    bystander.exchange();
    let counters: CountersReport = serde_json::from_value(
        backend
            .control()
            .call(BackdRequest::Counters)
            .into_result()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(counters.backend.disconnects, 1);
}

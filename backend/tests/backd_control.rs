//! The control ring: endpoints and regions map and unmap exactly their pages.

mod backd_util;

use backd_util::{guest_report, small_endpoint, BackdTestHost};
use xmx_backend::service::GuestQuotas;
use xmx_hv::DOM0;
use xmx_wire::msg::{
    CtrlOp, CtrlReply, CtrlStatus, DirectRegister, DoneStatus, EndpointPages, ErrorCode, EventBody,
    Route, SendOp, SendRequest,
};

#[test]
fn endpoints_and_regions_map_and_unmap_exactly_their_pages() {
    let host = BackdTestHost::start();
    let _backend = host.start_backend(GuestQuotas::default());
    let mut g = host.guest("g1", 1, 1);
    g.connect();
    let d = g.domid;
    assert_eq!((host.dom0_mappings(), host.mapped_by_others(d)), (1, 1));

    // 2 + 1 ring pages, 3 + 4 queue pages: 10 pages mapped; the info page is read and let go.
    let pages = EndpointPages {
        send_ring: 2,
        event_ring: 1,
        send_queue: 3,
        recv_queue: 4,
    };
    let (rsp, ep) = g.open_endpoint(5, pages);
    assert_eq!(rsp.status, CtrlStatus::Ok);
    let ep = ep.unwrap();
    assert_ne!(ep.session, 0);
    assert_eq!(host.dom0_mappings(), 1 + 10);
    assert_eq!(host.mapped_by_others(d), 1 + 10);
    assert_eq!(host.state(DOM0).ports_open, 2);

    // A region of 3 pages (100 bytes into its first page, 2 pages + 200 bytes long).
    let (rsp, region) = g.register_region(5, 9, 100, 2 * 4096 + 200);
    assert_eq!(rsp.status, CtrlStatus::Ok);
    assert_eq!(
        rsp.reply,
        CtrlReply::RegionRegister {
            endpoint: 5,
            region_id: 9
        }
    );
    assert_eq!(region.pages.refs().len(), 3);
    assert_eq!(host.dom0_mappings(), 1 + 10 + 3);
    assert_eq!(host.mapped_by_others(d), 1 + 10 + 3);

    // The same id again, or on a closed endpoint, is refused and maps nothing.
    let (rsp, _dup) = g.register_region(5, 9, 0, 10);
    assert_eq!(rsp.status, CtrlStatus::BadRegion);
    let (rsp, _closed) = g.register_region(6, 1, 0, 10);
    assert_eq!(rsp.status, CtrlStatus::EndpointNotOpen);
    assert_eq!(host.dom0_mappings(), 14);

    let rsp = g.call(CtrlOp::RegionDeregister {
        endpoint: 5,
        region_id: 9,
    });
    assert_eq!(rsp.status, CtrlStatus::Ok);
    assert_eq!(host.dom0_mappings(), 11);
    assert_eq!(host.mapped_by_others(d), 11);
    let rsp = g.call(CtrlOp::RegionDeregister {
        endpoint: 5,
        region_id: 9,
    });
    assert_eq!(rsp.status, CtrlStatus::BadRegion);

    // Closing the endpoint releases its pages, its port and any region still registered.
    let (rsp, _r) = g.register_region(5, 1, 0, 4096);
    assert_eq!(rsp.status, CtrlStatus::Ok);
    assert_eq!(host.dom0_mappings(), 12);
    let rsp = g.call(CtrlOp::EndpointClose { endpoint: 5 });
    assert_eq!(rsp.status, CtrlStatus::Ok);
    assert_eq!(host.dom0_mappings(), 1);
    assert_eq!(host.mapped_by_others(d), 1);
    assert_eq!(host.state(DOM0).ports_open, 1);
    let rsp = g.call(CtrlOp::EndpointClose { endpoint: 5 });
    assert_eq!(rsp.status, CtrlStatus::EndpointNotOpen);

    // The guest's grants can all be ended now: nothing of them is mapped any more.
    drop(ep);
    g.close();
    assert_eq!(host.dom0_mappings(), 0);
    assert_eq!(host.mapped_by_others(d), 0);
}

#[test]
fn an_endpoint_opened_twice_is_busy_and_closing_the_device_releases_everything() {
    let host = BackdTestHost::start();
    let _backend = host.start_backend(GuestQuotas::default());
    let mut g = host.guest("g1", 1, 1);
    g.connect();
    let (rsp, _a) = g.open_endpoint(0, small_endpoint(2));
    assert_eq!(rsp.status, CtrlStatus::Ok);
    let (rsp, none) = g.open_endpoint(0, small_endpoint(2));
    assert_eq!(rsp.status, CtrlStatus::EndpointBusy);
    assert!(none.is_none());
    let (rsp, _b) = g.open_endpoint(1, small_endpoint(1));
    assert_eq!(rsp.status, CtrlStatus::Ok);
    let (rsp, _region) = g.register_region(1, 0, 0, 5 * 4096);
    assert_eq!(rsp.status, CtrlStatus::Ok);
    assert_eq!(host.dom0_mappings(), 1 + 6 + 4 + 5);
    assert_eq!(host.state(DOM0).ports_open, 3);
    g.close();
    assert_eq!(host.dom0_mappings(), 0);
    assert_eq!(host.mapped_by_others(g.domid), 0);
    assert_eq!(host.state(DOM0).ports_open, 0);
}

/// Grant `nr` data pages and the info pages listing `listed` (the data refs unless a hostile
/// list is given), as an application registering without the daemon does.
fn grant_direct(
    g: &backd_util::FakeGuest,
    nr: usize,
    listed: Option<&[u32]>,
) -> (xmx_hv::GrantedPages, xmx_hv::GrantedPages) {
    let pages = g.gnttab.grant_pages(DOM0, nr, true).unwrap();
    let refs = listed.map_or_else(|| pages.refs().to_vec(), |l| l.to_vec());
    let packed = xmx_wire::msg::pack_info_pages(&refs);
    let info = g.gnttab.grant_pages(DOM0, packed.len(), true).unwrap();
    for (i, p) in packed.iter().enumerate() {
        // SAFETY: the info pages are mapped writable here, `packed.len()` pages long, and the
        // backend has not been told their refs yet.
        unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), info.as_ptr().add(i * 4096), p.len()) };
    }
    (pages, info)
}

fn region_op(
    g: &backd_util::FakeGuest,
    ep: &mut backd_util::FakeGuestEndpoint,
    tag: u32,
    op: SendOp,
) -> EventBody {
    g.send(
        ep,
        SendRequest {
            tag,
            route: Route::default(),
            op,
        },
    );
    let ev = g.next_event(ep);
    g.retire_events(ep);
    assert_eq!(ev.tag, tag);
    ev.body
}

/// A backend with `quotas` and guest g1 (domain 1) connected, its endpoint 2 open.
fn guest_with_endpoint(
    host: &BackdTestHost,
    quotas: GuestQuotas,
) -> (
    xmx_backend::service::BackendThread,
    backd_util::FakeGuest,
    backd_util::FakeGuestEndpoint,
) {
    let backend = host.start_backend(quotas);
    let mut g = host.guest("g1", 1, 1);
    g.connect();
    let (rsp, ep) = g.open_endpoint(2, small_endpoint(1));
    assert_eq!(rsp.status, CtrlStatus::Ok);
    (backend, g, ep.unwrap())
}

#[test]
fn regions_registered_on_the_send_ring_map_exactly_their_pages_and_hostile_ones_are_refused() {
    let host = BackdTestHost::start();
    let (_backend, mut g, mut ep) = guest_with_endpoint(&host, GuestQuotas::default());
    let d = g.domid;
    let base = host.dom0_mappings();

    // Three data pages, mapped in one batch, and the info page, mapped and kept to read the
    // lists of the next windows over these grants without a copy.
    let (data, info) = grant_direct(&g, 3, None);
    let len = 2 * 4096 + 10;
    let reg = |id, refs: &[u32]| SendOp::Register(DirectRegister::new(id, len, refs).unwrap());
    let ok = EventBody::SendDone {
        status: DoneStatus::Success,
        length: len,
    };
    assert_eq!(region_op(&g, &mut ep, 1, reg(4, info.refs())), ok);
    assert_eq!(host.dom0_mappings(), base + 4);
    assert_eq!(host.mapped_by_others(d), base + 4);

    // The same id again: refused, nothing more mapped, the guest stays connected.
    assert_eq!(
        region_op(&g, &mut ep, 2, reg(4, info.refs())),
        EventBody::Error {
            code: ErrorCode::BadRegion
        }
    );
    // An info ref the guest never granted, and info pages listing refs it never granted.
    assert_eq!(
        region_op(&g, &mut ep, 3, reg(5, &[60_000])),
        EventBody::Error {
            code: ErrorCode::Malformed
        }
    );
    let (_d2, bad_info) = grant_direct(&g, 3, Some(&[u32::MAX, 12_345, 7]));
    assert_eq!(
        region_op(&g, &mut ep, 4, reg(6, bad_info.refs())),
        EventBody::Error {
            code: ErrorCode::Malformed
        }
    );
    // Only that info page is mapped (and kept, within the endpoint's bound).
    assert_eq!(host.dom0_mappings(), base + 5);

    // Deregistering retires the id (a second time is refused); the mapping is kept for the
    // next window over these grants.
    let done = EventBody::SendDone {
        status: DoneStatus::Success,
        length: 0,
    };
    assert_eq!(
        region_op(&g, &mut ep, 5, SendOp::Deregister { region_id: 4 }),
        done
    );
    assert_eq!(
        region_op(&g, &mut ep, 6, SendOp::Deregister { region_id: 4 }),
        EventBody::Error {
            code: ErrorCode::BadRegion
        }
    );
    assert_eq!(host.dom0_mappings(), base + 5);
    // The guest ends the grants: the pages wait for the backend to let go, which it does
    // when the endpoint closes.
    drop((data, info));
    assert_eq!(host.mapped_by_others(d), base + 5);
    assert_eq!(host.state(d).grants_deferred, 4);
    let rsp = g.call(CtrlOp::EndpointClose { endpoint: 2 });
    assert_eq!(rsp.status, CtrlStatus::Ok);
    assert_eq!(host.mapped_by_others(d), 1, "only the control ring is left");
    assert_eq!(host.state(d).grants_deferred, 0);
    assert!(g.backend_state() == Some(xmx_wire::xenbus::XenbusState::Connected));
}

/// What the library's grant pool relies on (`xmx_frontend::own_grants::GrantPool`): grants
/// a guest keeps after a DEREGISTER and registers again under another id, listing fewer
/// pages, serve only the new id; the backend keeps its mapping of them in between
/// (blkback's persistent grants), so the second registration maps and the deregistrations
/// unmap nothing, and the endpoint's close lets them go.
#[test]
fn grants_kept_after_a_deregister_serve_only_the_id_they_are_registered_again_under() {
    let host = BackdTestHost::start();
    let (backend, mut g, mut ep) = guest_with_endpoint(&host, GuestQuotas::default());
    let d = g.domid;
    let base = host.dom0_mappings();
    let done = |length| EventBody::SendDone {
        status: DoneStatus::Success,
        length,
    };
    let refused = EventBody::Error {
        code: ErrorCode::BadRegion,
    };

    let (data, info) = grant_direct(&g, 3, None);
    let len = 2 * 4096 + 10;
    let first = DirectRegister::new(4, len, info.refs()).unwrap();
    assert_eq!(
        region_op(&g, &mut ep, 1, SendOp::Register(first)),
        done(len)
    );
    // The data pages and the info page.
    assert_eq!(host.dom0_mappings(), base + 4);
    assert_eq!(
        region_op(&g, &mut ep, 2, SendOp::Deregister { region_id: 4 }),
        done(0)
    );
    // Still granted, still mapped and counted against the guest, named by no id.
    assert_eq!(host.mapped_by_others(d), base + 4);
    let r = guest_report(&backend, d);
    assert_eq!((r.regions, r.kept_pages, r.kept_reuses), (0, 4, 0));
    assert_eq!(r.mapped_pages, host.mapped_by_others(d));

    // The same grants as a window of two pages: the info page lists only those (the pool
    // rewrites it, zeroing what follows).
    let packed = xmx_wire::msg::pack_info_pages(&data.refs()[..2]);
    // SAFETY: the info page is mapped writable here and one page long; the backend copies
    // it only at the REGISTER posted below.
    unsafe { std::ptr::copy_nonoverlapping(packed[0].as_ptr(), info.as_ptr(), packed[0].len()) };
    let len2 = 4096 + 1;
    let second = DirectRegister::new(5, len2, info.refs()).unwrap();
    assert_eq!(
        region_op(&g, &mut ep, 3, SendOp::Register(second)),
        done(len2)
    );
    // Served from the kept mappings: the info page's, read again, and the data pages' of
    // three pages (a fresh one would map two).
    assert_eq!(host.dom0_mappings(), base + 4);
    let r = guest_report(&backend, d);
    assert_eq!((r.regions, r.kept_pages, r.kept_reuses), (1, 1, 2));
    // The old id is gone for good; the new one holds the pages until its DEREGISTER.
    assert_eq!(
        region_op(&g, &mut ep, 4, SendOp::Deregister { region_id: 4 }),
        refused
    );
    assert_eq!(
        region_op(&g, &mut ep, 5, SendOp::Deregister { region_id: 5 }),
        done(0)
    );
    assert_eq!(
        region_op(&g, &mut ep, 6, SendOp::Deregister { region_id: 5 }),
        refused
    );
    assert_eq!(host.mapped_by_others(d), base + 4);
    let rsp = g.call(CtrlOp::EndpointClose { endpoint: 2 });
    assert_eq!(rsp.status, CtrlStatus::Ok);
    assert_eq!(host.mapped_by_others(d), 1);
    assert_eq!(guest_report(&backend, d).mapped_pages, 1);
    drop((data, info));
    assert!(g.backend_state() == Some(xmx_wire::xenbus::XenbusState::Connected));
}

/// Kept mappings give way: a registration the guest's mapping quota could not take
/// otherwise unmaps them first, and one that fits nowhere is refused as before.
#[test]
fn kept_mappings_give_way_to_a_registration_that_needs_their_pages() {
    let host = BackdTestHost::start();
    // The control ring, the endpoint, one info page and four region pages.
    let endpoint_pages = {
        let p = small_endpoint(1);
        usize::from(p.send_ring)
            + usize::from(p.event_ring)
            + usize::from(p.send_queue)
            + usize::from(p.recv_queue)
    };
    let quotas = GuestQuotas {
        max_mapped_pages: 1 + endpoint_pages + 1 + 4,
        ..GuestQuotas::default()
    };
    let (backend, g, mut ep) = guest_with_endpoint(&host, quotas);
    let d = g.domid;
    let base = host.mapped_by_others(d);
    assert_eq!(base, 1 + endpoint_pages);
    let reg = |id, len, refs: &[u32]| SendOp::Register(DirectRegister::new(id, len, refs).unwrap());
    let done = |length| EventBody::SendDone {
        status: DoneStatus::Success,
        length,
    };

    let (_a, a_info) = grant_direct(&g, 3, None);
    assert_eq!(
        region_op(&g, &mut ep, 1, reg(1, 3 * 4096, a_info.refs())),
        done(3 * 4096)
    );
    assert_eq!(
        region_op(&g, &mut ep, 2, SendOp::Deregister { region_id: 1 }),
        done(0)
    );
    assert_eq!(guest_report(&backend, d).kept_pages, 4);
    // Three other pages and their info page: with the kept four they would pass the
    // quota, so those go, oldest first.
    let (_b, b_info) = grant_direct(&g, 3, None);
    assert_eq!(
        region_op(&g, &mut ep, 3, reg(2, 3 * 4096, b_info.refs())),
        done(3 * 4096)
    );
    let r = guest_report(&backend, d);
    assert_eq!((r.kept_pages, r.mapped_pages), (1, base + 4));
    assert_eq!(host.mapped_by_others(d), base + 4);
    // Five pages fit nowhere while region 2 holds three: refused, nothing mapped.
    let (_c, c_info) = grant_direct(&g, 5, None);
    assert_eq!(
        region_op(&g, &mut ep, 4, reg(3, 5 * 4096, c_info.refs())),
        EventBody::Error {
            code: ErrorCode::NoResources
        }
    );
    assert_eq!(host.mapped_by_others(d), base + 4);
    assert!(g.backend_state() == Some(xmx_wire::xenbus::XenbusState::Connected));
}

//! The xenbus handshake of the backend daemon: InitWait, Connected, teardown, reconnect.

mod backd_util;

use backd_util::{small_endpoint, BackdTestHost};
use xmx_backend::service::GuestQuotas;
use xmx_backend::xenbus::toolstack;
use xmx_hv::{Platform, XsAccess, XsPerm, DOM0};
use xmx_wire::msg::{CtrlOp, CtrlStatus};
use xmx_wire::xenbus::{keys, XenbusState};

#[test]
fn states_go_initwait_connected_closed_and_back() {
    let host = BackdTestHost::start();
    let backend = host.start_backend(GuestQuotas::default());
    let mut g = host.guest("g1", 1, 7);

    g.wait_backend_state(XenbusState::InitWait);
    assert_eq!(g.read_backend(keys::MAX_ENDPOINTS).as_deref(), Some("32"));
    assert_eq!(g.read_backend(keys::MAX_REGIONS).as_deref(), Some("256"));
    assert_eq!(g.read_backend(keys::FEATURE_RCACHE).as_deref(), Some("1"));
    assert_eq!(g.read_backend(keys::PROTOCOL_VERSION).as_deref(), Some("1"));
    assert_eq!(
        g.read_backend(keys::MAC).as_deref(),
        Some("02:00:00:00:00:01")
    );

    g.connect();
    assert_eq!(host.dom0_mappings(), 1, "the control ring");
    assert_eq!(host.mapped_by_others(g.domid), 1);
    assert_eq!(host.state(DOM0).ports_open, 1);
    let guests = backd_util::guest_reports(&backend);
    assert_eq!(guests.len(), 1);
    assert_eq!(guests[0].domid, g.domid);
    assert_eq!(guests[0].state_name, "Connected");
    assert!(guests[0].connected);
    assert_eq!(guests[0].cluster, 7);
    assert_eq!(guests[0].hostname, "g1:0");
    assert_eq!(guests[0].mapped_pages, 1);

    // The frontend closes: everything is released before the backend says Closed.
    g.close();
    assert_eq!(host.dom0_mappings(), 0);
    assert_eq!(host.mapped_by_others(g.domid), 0);
    assert_eq!(host.state(DOM0).ports_open, 0);

    // The frontend starts again (a resumed guest): InitWait, then Connected again.
    g.set_state(XenbusState::Initialising);
    g.connect();
    assert_eq!(host.dom0_mappings(), 1);
    assert_eq!(host.mapped_by_others(g.domid), 1);

    // Stopping the daemon disconnects the guest cleanly.
    backend.stop().unwrap();
    assert_eq!(g.backend_state(), Some(XenbusState::Closing));
    assert_eq!(host.dom0_mappings(), 0);
    assert_eq!(host.mapped_by_others(g.domid), 0);
    assert_eq!(host.state(DOM0).ports_open, 0);
}

#[test]
fn a_frontend_restarting_while_connected_is_released_and_served_again() {
    let host = BackdTestHost::start();
    let _backend = host.start_backend(GuestQuotas::default());
    let mut g = host.guest("g1", 1, 1);
    g.connect();
    assert_eq!(host.dom0_mappings(), 1);
    // The guest lost its state without closing (as after a resume): Initialising.
    g.set_state(XenbusState::Initialising);
    g.wait_backend_state(XenbusState::InitWait);
    assert_eq!(host.dom0_mappings(), 0);
    assert_eq!(host.mapped_by_others(g.domid), 0);
    g.connect();
    assert_eq!(host.dom0_mappings(), 1);
}

#[test]
fn detaching_the_device_releases_the_guest() {
    let host = BackdTestHost::start();
    let backend = host.start_backend(GuestQuotas::default());
    let mut g = host.guest("g1", 1, 1);
    g.connect();
    let xs0 = host.attach(DOM0).xenstore().unwrap();
    toolstack::detach(xs0.as_ref(), DOM0, g.domid, 0).unwrap();
    backd_util::eventually("the guest is released", || {
        host.dom0_mappings() == 0 && host.state(DOM0).ports_open == 0
    });
    assert_eq!(host.mapped_by_others(g.domid), 0);
    assert!(backd_util::guest_reports(&backend).is_empty());
    // Neither half was re-created behind the toolstack's back.
    assert_eq!(g.backend_state(), None);
}

#[test]
fn a_frontend_with_a_bad_ring_is_refused_and_may_try_again() {
    let host = BackdTestHost::start();
    let _backend = host.start_backend(GuestQuotas::default());
    let mut g = host.guest("g1", 1, 1);
    g.wait_backend_state(XenbusState::InitWait);
    // A ring-ref that grants nothing, and an unbound port.
    g.write_front(keys::RING_REF, "12345");
    g.write_front(keys::EVENT_CHANNEL, "1");
    g.write_front(keys::PROTOCOL_VERSION, "1");
    g.set_state(XenbusState::Initialised);
    g.wait_backend_state(XenbusState::Closed);
    let error = g.read_backend("error").unwrap();
    assert!(error.contains("ring-ref"), "{error}");
    assert_eq!(host.dom0_mappings(), 0);
    assert_eq!(host.state(DOM0).ports_open, 0);
    // Restarting with a correct ring works.
    g.set_state(XenbusState::Closed);
    g.set_state(XenbusState::Initialising);
    g.connect();
    assert_eq!(host.dom0_mappings(), 1);
}

#[test]
fn a_device_with_refused_values_stays_closed_until_the_toolstack_fixes_them() {
    let host = BackdTestHost::start();
    let backend = host.start_backend(GuestQuotas::default());
    let mut g = host.guest("g1", 1, 1);
    g.connect();
    // A second guest's device claims a multicast MAC (written by hand: attach refuses it).
    let d2 = host.create("g2");
    let xs0 = host.attach(DOM0).xenstore().unwrap();
    let bdir = xmx_wire::xenbus::backend_dir(DOM0, d2, 0);
    let fdir = xmx_wire::xenbus::frontend_dir(d2, 0);
    let mac_key = xmx_wire::xenbus::key_path(&bdir, keys::MAC);
    toolstack::in_transaction(xs0.as_ref(), |tx| {
        let put = |dir: &str, k: &str, v: &str| {
            xs0.write(tx, &xmx_wire::xenbus::key_path(dir, k), v.as_bytes())
        };
        let perms = |owner, reader| {
            [
                XsPerm {
                    domid: owner,
                    access: XsAccess::None,
                },
                XsPerm {
                    domid: reader,
                    access: XsAccess::Read,
                },
            ]
        };
        xs0.mkdir(tx, &bdir)?;
        xs0.set_perms(tx, &bdir, &perms(DOM0, d2))?;
        xs0.mkdir(tx, &fdir)?;
        xs0.set_perms(tx, &fdir, &perms(d2, DOM0))?;
        put(&fdir, keys::BACKEND, &bdir)?;
        put(&fdir, keys::BACKEND_ID, "0")?;
        put(&fdir, keys::STATE, "1")?;
        put(&bdir, keys::FRONTEND, &fdir)?;
        put(&bdir, keys::FRONTEND_ID, &d2.to_string())?;
        put(&bdir, keys::MAC, "01:00:5e:00:00:01")?;
        put(&bdir, keys::HOSTNAME, "g2:0")?;
        put(&bdir, keys::STATE, "1")
    })
    .unwrap();
    let mut g2 = backd_util::FakeGuest::new(&host, d2, 0);
    g2.wait_backend_state(XenbusState::Closed);
    assert!(g2.read_backend("error").unwrap().contains("MAC"));
    let guests = backd_util::guest_reports(&backend);
    let r = guests.iter().find(|r| r.domid == d2).unwrap();
    assert_eq!(r.state_name, "Closed");
    assert!(!r.connected);
    // The first guest was never disturbed.
    assert_eq!(g.backend_state(), Some(XenbusState::Connected));
    // Fixed by the toolstack: the device starts again and connects.
    xs0.write(xmx_hv::XBT_NULL, &mac_key, b"02:00:00:00:00:0a")
        .unwrap();
    g2.connect();
    assert_eq!(host.dom0_mappings(), 2);
}

#[test]
fn attach_writes_both_halves_with_the_toolstack_permissions() {
    let host = BackdTestHost::start();
    let g = host.guest("g1", 1, 4);
    let other = backd_util::FakeGuest::new(&host, host.create("other"), 0);
    let xs0 = host.attach(DOM0).xenstore().unwrap();
    let (bdir, fdir) = (g.backend_dir(), g.frontend_dir());
    let perm = |domid, access| XsPerm { domid, access };
    assert_eq!(
        xs0.get_perms(xmx_hv::XBT_NULL, &bdir).unwrap(),
        [perm(DOM0, XsAccess::None), perm(g.domid, XsAccess::Read)]
    );
    assert_eq!(
        xs0.get_perms(xmx_hv::XBT_NULL, &fdir).unwrap(),
        [perm(g.domid, XsAccess::None), perm(DOM0, XsAccess::Read)]
    );
    // Keys inherit their directory's permissions.
    let key = |dir: &str, k: &str| xmx_wire::xenbus::key_path(dir, k);
    assert_eq!(
        xs0.get_perms(xmx_hv::XBT_NULL, &key(&bdir, keys::MAC))
            .unwrap(),
        [perm(DOM0, XsAccess::None), perm(g.domid, XsAccess::Read)]
    );
    assert_eq!(g.read_backend(keys::CLUSTER).as_deref(), Some("4"));
    assert_eq!(
        g.read_backend(keys::FRONTEND).as_deref(),
        Some(fdir.as_str())
    );
    // The guest writes its own half, not the backend's; another guest sees neither.
    g.write_front(keys::RING_REF, "8");
    assert!(g
        .xs
        .write(
            xmx_hv::XBT_NULL,
            &key(&bdir, keys::MAC),
            b"02:00:00:00:00:66"
        )
        .is_err());
    assert!(other
        .xs
        .read(xmx_hv::XBT_NULL, &key(&bdir, keys::MAC))
        .is_err());
    assert!(other
        .xs
        .read(xmx_hv::XBT_NULL, &key(&fdir, keys::STATE))
        .is_err());
    // A second attach of the same device is refused; detach removes both halves.
    let spec = toolstack::DeviceSpec {
        domu: g.domid,
        devid: 0,
        mac: backd_util::guest_mac(1),
        cluster: 4,
        hostname: "g1:0".into(),
    };
    assert!(matches!(
        toolstack::attach(xs0.as_ref(), DOM0, &spec),
        Err(xmx_hv::Error::Exists(_))
    ));
    toolstack::detach(xs0.as_ref(), DOM0, g.domid, 0).unwrap();
    assert!(xs0.read(xmx_hv::XBT_NULL, &bdir).is_err());
    assert!(xs0.read(xmx_hv::XBT_NULL, &fdir).is_err());
    assert!(matches!(
        toolstack::detach(xs0.as_ref(), DOM0, g.domid, 0),
        Err(xmx_hv::Error::NotFound(_))
    ));
}

#[test]
fn a_restarted_backend_lets_each_reopened_endpoint_keep_only_its_own_session() {
    let host = BackdTestHost::start();
    let backend = host.start_backend(GuestQuotas::default());
    let mut g = host.guest("g1", 1, 1);
    g.connect();
    let a = g.open_endpoint(0, small_endpoint(1)).1.expect("endpoint 0");
    let b = g.open_endpoint(1, small_endpoint(1)).1.expect("endpoint 1");
    assert_ne!(a.session, b.session);
    // The backend goes with both endpoints open; what it recorded stays in xenstore,
    // as after a crash.
    backend.stop().unwrap();
    let _backend = host.start_backend(GuestQuotas::default());
    // The frontend still says Connected to the backend that is gone: the new one does
    // not adopt that ring (its endpoints died with the old backend) but closes the
    // device, so that the frontend starts over.
    g.wait_backend_state(XenbusState::Closed);
    g.set_state(XenbusState::Closed);
    g.set_state(XenbusState::Initialising);
    g.connect();
    // An endpoint re-opened with its own session keeps it; one claiming another
    // endpoint's session, or one never given, gets a fresh one.
    let a2 = g
        .open_endpoint_resuming(0, small_endpoint(1), a.session)
        .1
        .expect("endpoint 0 again");
    assert_eq!(a2.session, a.session);
    let b2 = g
        .open_endpoint_resuming(1, small_endpoint(1), a.session)
        .1
        .expect("endpoint 1 again");
    assert_ne!(b2.session, a.session);
    assert_ne!(b2.session, b.session);
    let c = g
        .open_endpoint_resuming(2, small_endpoint(1), 0x1234_5678)
        .1
        .expect("endpoint 2");
    assert_ne!(c.session, 0x1234_5678);
    // A frontend that closes its device with endpoints open (a suspend, or one that gave
    // up on an unanswered request) comes back to the sessions it had.
    g.close();
    g.set_state(XenbusState::Initialising);
    g.connect();
    let a3 = g
        .open_endpoint_resuming(0, small_endpoint(1), a.session)
        .1
        .expect("endpoint 0 after the device came back");
    assert_eq!(a3.session, a.session);
    // An endpoint the guest closed lets its session go: nothing is kept for it.
    let closed = g.call(CtrlOp::EndpointClose { endpoint: 0 });
    assert_eq!(closed.status, CtrlStatus::Ok);
    g.close();
    g.set_state(XenbusState::Initialising);
    g.connect();
    let a4 = g
        .open_endpoint_resuming(0, small_endpoint(1), a.session)
        .1
        .expect("endpoint 0 after its close");
    assert_ne!(a4.session, a.session);
}

#[test]
fn a_device_this_host_never_served_keeps_the_sessions_its_frontend_names() {
    // A guest migrated by real Xen arrives with endpoints whose sessions were recorded
    // on the host it left: its frontend names them, and a backend with no record of
    // its own lets each endpoint keep the one named for it.
    let host = BackdTestHost::start();
    let _backend = host.start_backend(GuestQuotas::default());
    let mut g = host.guest("g1", 1, 1);
    g.write_front("endpoint-sessions/0", "2864434397");
    g.write_front("endpoint-sessions/200", "77");
    g.connect();
    let a = g
        .open_endpoint_resuming(0, small_endpoint(1), 2_864_434_397)
        .1
        .expect("endpoint 0");
    assert_eq!(a.session, 2_864_434_397);
    // Only the endpoint named, and only with the session named for it.
    let b = g
        .open_endpoint_resuming(1, small_endpoint(1), 2_864_434_397)
        .1
        .expect("endpoint 1");
    assert_ne!(b.session, 2_864_434_397);
    // Once this host has served the device, its own records decide: a frontend that
    // comes back names nothing the backend did not record.
    g.write_front("endpoint-sessions/2", "4242");
    g.close();
    g.set_state(XenbusState::Initialising);
    g.connect();
    let c = g
        .open_endpoint_resuming(2, small_endpoint(1), 4242)
        .1
        .expect("endpoint 2");
    assert_ne!(c.session, 4242);
    // A guest the backend threw out starts over with new sessions, whatever its
    // frontend names.
    let mut slot = [0u8; xmx_wire::msg::CTRL_SLOT_SIZE];
    slot[0] = 0x7f; // no such request kind
    slot[1] = 1;
    g.push_raw_ctrl(&slot);
    g.wait_backend_state(XenbusState::Closed);
    g.set_state(XenbusState::Closed);
    g.write_front("endpoint-sessions/0", "2864434397");
    g.set_state(XenbusState::Initialising);
    g.connect();
    let a2 = g
        .open_endpoint_resuming(0, small_endpoint(1), 2_864_434_397)
        .1
        .expect("endpoint 0 after the guest was thrown out");
    assert_ne!(a2.session, 2_864_434_397);
}

#[test]
fn a_device_dom0_holds_stays_closed_until_released_and_its_endpoints_keep_their_sessions() {
    // What `xmx-hook migrate` does before a real-Xen migration: the guest must let go of
    // its event channels before its kernel suspends, so dom0 holds the device closed.
    let host = BackdTestHost::start();
    let _backend = host.start_backend(GuestQuotas::default());
    let mut g = host.guest("g1", 1, 1);
    g.connect();
    let a = g.open_endpoint(0, small_endpoint(1)).1.expect("endpoint 0");
    let xs0 = host.attach(DOM0).xenstore().unwrap();
    let hold = format!("{}/hold", g.backend_dir());
    xs0.write(xmx_hv::XBT_NULL, &hold, b"1").unwrap();
    g.wait_backend_state(XenbusState::Closed);
    // The frontend lets go and asks to start again: the backend does not answer while held.
    g.set_state(XenbusState::Closed);
    g.set_state(XenbusState::Initialising);
    // Nothing to wait for when nothing should happen: watch the backend's state for a
    // while instead, and see it stay Closed.
    let bstate = format!("{}/state", g.backend_dir());
    xs0.watch(&bstate, "held").unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_millis(500);
    loop {
        assert_eq!(g.backend_state(), Some(XenbusState::Closed));
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break;
        }
        let _ = xs0.next_watch_event(Some(left)).unwrap();
    }
    // Released: served again, and the endpoint re-opens in its session.
    xs0.rm(xmx_hv::XBT_NULL, &hold).unwrap();
    g.connect();
    let a2 = g
        .open_endpoint_resuming(0, small_endpoint(1), a.session)
        .1
        .expect("endpoint 0 after the hold");
    assert_eq!(a2.session, a.session);
}

/// A new domain given a destroyed one's id before the backend saw the destroy: the
/// toolstack writes the device again (both states Initialising) under a key the backend
/// still serves, here in InitWait. The backend serves the new device from the start
/// (InitWait published again), instead of keeping its record of the old one over it.
#[test]
fn a_device_written_again_under_a_served_key_is_served_as_a_new_one() {
    let host = BackdTestHost::start();
    let _backend = host.start_backend(GuestQuotas::default());
    let mut g = host.guest("g1", 1, 1);
    g.wait_backend_state(XenbusState::InitWait);
    // What the toolstack's attach leaves, as one write of both halves.
    let xs0 = host.attach(DOM0).xenstore().unwrap();
    let initialising = XenbusState::Initialising.to_string();
    xmx_hv::in_transaction(xs0.as_ref(), |tx| {
        let state = |dir: String| format!("{dir}/{}", keys::STATE);
        xs0.write(tx, &state(g.backend_dir()), initialising.as_bytes())?;
        xs0.write(tx, &state(g.frontend_dir()), initialising.as_bytes())
    })
    .unwrap();
    g.wait_backend_state(XenbusState::InitWait);
    g.connect();
    assert_eq!(host.dom0_mappings(), 1);
}

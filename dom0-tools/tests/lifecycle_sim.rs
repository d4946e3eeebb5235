//! xmxd follows the lifecycle of guests on a simulated host: a domain that wants xmx gets
//! its device, with an identity the guest cannot change; a destroyed one leaves nothing
//! behind; a re-created one gets the same MAC.

mod xmxd_util;

use std::time::Duration;

use xmx_hv::{DomId, XsAccess, XsPerm, DOM0, XBT_NULL};
use xmx_tools::xmxd::control::{GuestStatus, PeersReport, XmxdRequest};
use xmx_tools::xmxd::names;
use xmx_tools::xmxd::xsnodes;
use xmx_wire::xenbus::{self, keys};
use xmxd_util::{children, eventually, read, wait_node, MinimalFrontend, XmxdHost, WAIT};

const INTERVAL: Duration = Duration::from_millis(100);

fn backend_dir(domid: DomId) -> String {
    xenbus::backend_dir(DOM0, domid, 0)
}

fn peers(host: &XmxdHost) -> PeersReport {
    serde_json::from_value(host.call(XmxdRequest::Peers {
        guest: None,
        after: None,
        timeout_ms: None,
    }))
    .unwrap()
}

#[test]
fn a_flagged_domain_gets_its_device_and_a_destroyed_one_leaves_nothing() {
    let mut host = XmxdHost::start("h0");
    host.start_xmxd(None, INTERVAL);
    let xs = host.dom0_xs();
    let dom0_before = host.admin.state(DOM0).unwrap();

    // The hook's route: the domain exists, then its wish is written by the toolstack.
    let d = host.create("vm1");
    xs.write(XBT_NULL, &xsnodes::wish_path(DOM0, d), b"")
        .unwrap();
    host.wait("vm1 attached", |c| c.is_attached(d));

    // Both halves exist, owned as xl makes them, with the identity dom0 chose.
    let bdir = backend_dir(d);
    let fdir = xenbus::frontend_dir(d, 0);
    assert_eq!(
        xs.get_perms(XBT_NULL, &bdir).unwrap(),
        [
            XsPerm {
                domid: DOM0,
                access: XsAccess::None
            },
            XsPerm {
                domid: d,
                access: XsAccess::Read
            },
        ]
    );
    assert_eq!(
        xs.get_perms(XBT_NULL, &fdir).unwrap(),
        [
            XsPerm {
                domid: d,
                access: XsAccess::None
            },
            XsPerm {
                domid: DOM0,
                access: XsAccess::Read
            },
        ]
    );
    let mac = names::guest_mac("vm1");
    let key = |k| read(xs.as_ref(), &xenbus::key_path(&bdir, k));
    assert_eq!(key(keys::MAC), Some(mac.to_string()));
    assert_eq!(key(keys::CLUSTER).as_deref(), Some("0"));
    assert_eq!(key(keys::HOSTNAME).as_deref(), Some("vm1:0"));
    assert_eq!(key(keys::FRONTEND_ID), Some(d.to_string()));
    assert_eq!(
        read(xs.as_ref(), &xenbus::key_path(&fdir, keys::BACKEND)),
        Some(bdir.clone())
    );

    // The guest can read its identity but not change it, nor touch xmxd's nodes.
    let mut front = MinimalFrontend::new(&host.hv_dir(), d);
    assert_eq!(
        read(front.xs.as_ref(), &xenbus::key_path(&bdir, keys::MAC)),
        Some(mac.to_string())
    );
    for (path, value) in [
        (xenbus::key_path(&bdir, keys::CLUSTER), "7"),
        (xenbus::key_path(&bdir, keys::MAC), "06:00:00:00:00:01"),
        (xsnodes::wish_path(DOM0, d), "other"),
        (format!("{}/evil", xsnodes::clusters_dir(DOM0)), "1"),
    ] {
        let r = front.xs.write(XBT_NULL, &path, value.as_bytes());
        assert!(
            matches!(r, Err(xmx_hv::Error::Denied(_))),
            "guest wrote {path}: {r:?}"
        );
    }
    assert!(matches!(
        front.xs.read(XBT_NULL, &xsnodes::clusters_dir(DOM0)),
        Err(xmx_hv::Error::Denied(_))
    ));
    assert_eq!(key(keys::CLUSTER).as_deref(), Some("0"));
    // Where the store lets a guest rewrite its own name, doing so does not give it
    // another guest's identity. (A domain attached after the rename shows that xmxd has
    // handled the rename's watch event, which came first.)
    if front
        .xs
        .write(XBT_NULL, &xsnodes::name_path(d), b"victim")
        .is_ok()
    {
        let marker = host.create("marker");
        xs.write(XBT_NULL, &xsnodes::wish_path(DOM0, marker), b"")
            .unwrap();
        host.wait("marker attached", |c| c.is_attached(marker));
        assert_eq!(key(keys::MAC), Some(mac.to_string()));
        let g: Vec<GuestStatus> = serde_json::from_value(host.call(XmxdRequest::Guests)).unwrap();
        let vm1 = g.iter().find(|g| g.name == "vm1").unwrap();
        assert_eq!((vm1.domid, vm1.attached), (Some(d), true));
        assert!(g.iter().all(|g| g.name != "victim"));
        host.destroy(marker);
        host.wait("marker gone", |c| !c.is_attached(marker));
    }

    // The guest connects: the backend maps its ring and binds its channel.
    front.connect();
    let mapped = host.admin.state(DOM0).unwrap();
    assert_eq!(mapped.mappings_held, dom0_before.mappings_held + 1);
    assert_eq!(mapped.ports_open, dom0_before.ports_open + 1);
    let table = peers(&host);
    assert_eq!(table.peers.len(), 1);
    assert_eq!(table.peers[0].mac, mac);
    assert_eq!(table.peers[0].index, 0);
    assert!(table.peers[0].local);
    host.wait("table pushed to the backend", |c| c.backend_synced());
    // The guest reads the peers it may reach (here, itself) from its view in xenstore.
    let view = xsnodes::peers_dir(DOM0, d);
    assert_eq!(
        read(front.xs.as_ref(), &format!("{view}/0")),
        Some(format!("{mac} vm1:0"))
    );

    // Destroyed: the device, the wish and everything dom0 held for the guest go.
    drop(front);
    host.destroy(d);
    host.wait("vm1 detached", |c| !c.is_attached(d));
    wait_node(xs.as_ref(), &bdir, |v| v.is_none());
    assert!(!children(xs.as_ref(), &xenbus::backend_root(DOM0)).contains(&d.to_string()));
    assert_eq!(read(xs.as_ref(), &xsnodes::wish_path(DOM0, d)), None);
    assert_eq!(read(xs.as_ref(), &xsnodes::peers_dir(DOM0, d)), None);
    assert_eq!(read(xs.as_ref(), &fdir), None);
    // The backend lets go on its own schedule and publishes no event for it: poll.
    eventually("dom0 holds nothing of vm1", || {
        let now = host.admin.state(DOM0).unwrap();
        now.mappings_held == dom0_before.mappings_held && now.ports_open == dom0_before.ports_open
    });
    host.wait("vm1 left the table", |c| c.table().peers.is_empty());

    // Created again under the same name: attached again (its name is recorded) with the
    // same MAC and the same peer index.
    let d2 = host.create("vm1");
    host.wait("vm1 attached again", |c| c.is_attached(d2));
    assert_eq!(
        read(xs.as_ref(), &xenbus::key_path(&backend_dir(d2), keys::MAC)),
        Some(mac.to_string())
    );
    host.wait("vm1 back in the table", |c| c.table().peers.len() == 1);
    let table = peers(&host);
    assert_eq!((table.peers[0].index, table.peers[0].mac), (0, mac));
}

#[test]
fn a_domid_reused_before_xmxd_sees_the_destroy_gets_a_device_of_its_own() {
    let mut host = XmxdHost::start("h0");
    host.start_xmxd(None, INTERVAL);
    let xs = host.dom0_xs();
    let d = host.create("vm1");
    xs.write(XBT_NULL, &xsnodes::wish_path(DOM0, d), b"")
        .unwrap();
    host.wait("vm1 attached", |c| c.is_attached(d));
    let fdir = xenbus::frontend_dir(d, 0);
    wait_node(xs.as_ref(), &fdir, |v| v.is_some());

    // Destroyed and created again under the same name while xmxd is held: the new domain
    // gets the freed domid and xmxd sees both changes at once, as after a busy moment.
    let mut d2 = None;
    host.xmxd().wait_until(WAIT, |_| {
        host.destroy(d);
        d2 = Some(host.create("vm1"));
        true
    });
    let d2 = d2.unwrap();
    assert_eq!(
        d2, d,
        "the simulated toolstack gives out the lowest free domid"
    );

    // The new domain gets its own device: both halves, the guest's half in its new home.
    wait_node(xs.as_ref(), &fdir, |v| v.is_some());
    let bdir = backend_dir(d2);
    assert_eq!(
        read(xs.as_ref(), &xenbus::key_path(&bdir, keys::MAC)),
        Some(names::guest_mac("vm1").to_string())
    );
    assert_eq!(
        read(xs.as_ref(), &xenbus::key_path(&fdir, keys::BACKEND)),
        Some(bdir)
    );
    let mut front = MinimalFrontend::new(&host.hv_dir(), d2);
    front.connect();
    host.wait("vm1 in the table", |c| c.table().peers.len() == 1);
}

#[test]
fn guests_recorded_by_name_are_attached_when_they_start_and_clusters_are_mirrored() {
    let mut host = XmxdHost::start("h0");
    host.start_xmxd(None, INTERVAL);
    let xs = host.dom0_xs();
    host.call(XmxdRequest::ClusterCreate {
        name: "blue".into(),
    });
    // Recorded before the domain exists.
    host.call(XmxdRequest::ClusterAdd {
        name: "blue".into(),
        guest: "web".into(),
        new: true,
    });
    let cdir = xsnodes::clusters_dir(DOM0);
    assert_eq!(
        read(xs.as_ref(), &format!("{cdir}/blue/id")),
        Some(names::cluster_id("blue").to_string())
    );
    assert_eq!(
        read(xs.as_ref(), &format!("{cdir}/blue/members/web")),
        Some(names::guest_mac("web").to_string())
    );
    assert_eq!(
        read(xs.as_ref(), &format!("{cdir}/default/id")).as_deref(),
        Some("0")
    );
    assert_eq!(
        xs.get_perms(XBT_NULL, &xsnodes::root(DOM0)).unwrap(),
        [XsPerm {
            domid: DOM0,
            access: XsAccess::None
        }]
    );

    // A domain nobody asked for stays without a device.
    let other = host.create("other");
    let web = host.create("web");
    host.wait("web attached", |c| c.is_attached(web));
    assert_eq!(
        read(
            xs.as_ref(),
            &xenbus::key_path(&backend_dir(web), keys::CLUSTER)
        ),
        Some(names::cluster_id("blue").to_string())
    );
    assert!(host.xmxd().inspect(|c| !c.is_attached(other)));
    assert_eq!(read(xs.as_ref(), &backend_dir(other)), None);

    // `attach` by domid with a cluster; `detach` takes it away and it stays away.
    let g: GuestStatus = serde_json::from_value(host.call(XmxdRequest::Attach {
        domid: other,
        cluster: Some("red".into()),
    }))
    .unwrap();
    assert!(g.attached);
    assert_eq!(g.cluster, "red");
    assert_eq!(g.domid, Some(other));
    assert_eq!(
        read(
            xs.as_ref(),
            &xenbus::key_path(&backend_dir(other), keys::CLUSTER)
        ),
        Some(names::cluster_id("red").to_string())
    );
    host.call(XmxdRequest::Detach { domid: other });
    assert!(host.xmxd().inspect(|c| !c.is_attached(other)));
    assert_eq!(read(xs.as_ref(), &backend_dir(other)), None);
    assert_eq!(read(xs.as_ref(), &xsnodes::wish_path(DOM0, other)), None);

    // Moving a running guest re-attaches its device with the new cluster.
    host.call(XmxdRequest::ClusterRemove {
        name: "blue".into(),
        guest: web.to_string(),
    });
    assert_eq!(
        read(
            xs.as_ref(),
            &xenbus::key_path(&backend_dir(web), keys::CLUSTER)
        )
        .as_deref(),
        Some("0")
    );
    assert_eq!(read(xs.as_ref(), &format!("{cdir}/blue/members/web")), None);
    assert!(read(xs.as_ref(), &format!("{cdir}/default/members/web")).is_some());
    let e = host
        .xmxd()
        .call(XmxdRequest::ClusterDelete {
            name: "default".into(),
            force: true,
        })
        .into_result()
        .unwrap_err();
    assert_eq!(e.kind, "invalid");
    let e = host
        .xmxd()
        .call(XmxdRequest::Attach {
            domid: 999,
            cluster: None,
        })
        .into_result()
        .unwrap_err();
    assert_eq!(e.kind, "not_found");

    // The state survives a restart of xmxd; the running guest's device is kept.
    host.xmxd = None;
    host.start_xmxd(None, INTERVAL);
    host.wait("web adopted after the restart", |c| c.is_attached(web));
    let clusters = host.call(XmxdRequest::Clusters);
    let names_of: Vec<&str> = clusters
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names_of, ["blue", "default", "red"]);
}

fn offered_pairs(host: &XmxdHost) -> Vec<(DomId, DomId)> {
    let report = host.call(XmxdRequest::Direct { enabled: None });
    serde_json::from_value(report["pairs"].clone()).unwrap()
}

#[test]
fn a_guest_whose_frontend_closes_loses_its_direct_pair_until_it_connects_again() {
    use xmx_hv::Platform;
    let mut host = XmxdHost::start("h0");
    host.start_xmxd(None, INTERVAL);
    let xs = host.dom0_xs();
    let (a, b) = (host.create("sus1"), host.create("sus2"));
    for d in [a, b] {
        xs.write(XBT_NULL, &xsnodes::wish_path(DOM0, d), b"")
            .unwrap();
    }
    host.wait("both attached", |c| c.is_attached(a) && c.is_attached(b));
    eventually("their pair offered", || {
        offered_pairs(&host) == vec![(a, b)]
    });

    // The guest's frontend closes its device, as it does for a suspend: the pair goes.
    let guest_xs = host.attach(b).xenstore().unwrap();
    let state = xenbus::key_path(&xenbus::frontend_dir(b, 0), keys::STATE);
    guest_xs.write(XBT_NULL, &state, b"5").unwrap();
    eventually("the pair revoked", || offered_pairs(&host).is_empty());
    guest_xs.write(XBT_NULL, &state, b"6").unwrap();

    // Back (a resume on this host): it starts its handshake again and is offered the pair.
    guest_xs.write(XBT_NULL, &state, b"1").unwrap();
    eventually("the pair offered again", || {
        offered_pairs(&host) == vec![(a, b)]
    });
    guest_xs.write(XBT_NULL, &state, b"4").unwrap();

    // A state that does not parse is not taken for a close; a close again revokes again.
    guest_xs.write(XBT_NULL, &state, b"garbage").unwrap();
    guest_xs.write(XBT_NULL, &state, b"5").unwrap();
    eventually("revoked once more", || offered_pairs(&host).is_empty());
    host.destroy(b);
    host.wait("sus2 gone", |c| !c.is_attached(b));
    assert!(offered_pairs(&host).is_empty());
}

//! Two hosts joined by a veth pair (each end in its own network namespace; needs root):
//! their xmxd find each other's guests over MXoE RAW frames and agree on one peer table;
//! clusters split what guests see; a guest moved between clusters or between hosts keeps
//! its MAC and index, and both tables follow.

mod xmxd_util;

use std::time::Duration;

use xmx_hv::sim::SimPlatform;
use xmx_hv::{Platform, Xenstore, DOM0, XBT_NULL};
use xmx_nic::testbed::VethPair;
use xmx_tools::xmxd::control::{PeersReport, XmxdRequest};
use xmx_tools::xmxd::table::Peer;
use xmx_tools::xmxd::{names, xsnodes, Core, PacketFabric};
use xmxd_util::XmxdHost;

const INTERVAL: Duration = Duration::from_millis(100);

/// A peer without the "local" flag, which differs from one host's view to the other's.
fn fabric_view(peers: &[Peer]) -> Vec<(u16, String, String, String, String)> {
    peers
        .iter()
        .map(|p| {
            (
                p.index,
                p.mac.to_string(),
                p.guest.clone(),
                p.cluster.clone(),
                p.host.clone(),
            )
        })
        .collect()
}

fn view(core: &Core) -> Vec<(u16, String, String, String, String)> {
    fabric_view(&core.table().peers)
}

/// Wait until both hosts hold the same table of `n` peers in which `cond` holds; return it.
fn agree(a: &XmxdHost, b: &XmxdHost, n: usize, mut cond: impl FnMut(&[Peer]) -> bool) -> Vec<Peer> {
    loop {
        a.wait("table complete", |c| {
            c.table().peers.len() == n && cond(&c.table().peers)
        });
        let want = a.xmxd().inspect(view);
        let agreed = b
            .xmxd()
            .wait_until(Duration::from_secs(2), |c| view(c) == want);
        // A's table may itself still move (a contested index): try again if B disagrees.
        if agreed && a.xmxd().inspect(view) == want {
            return a.xmxd().inspect(|c| c.table().peers.clone());
        }
    }
}

fn guest_view(host: &XmxdHost, guest: &str) -> Vec<String> {
    let r: PeersReport = serde_json::from_value(host.call(XmxdRequest::Peers {
        guest: Some(guest.into()),
        after: None,
        timeout_ms: None,
    }))
    .unwrap();
    r.peers.into_iter().map(|p| p.guest).collect()
}

fn attach(host: &XmxdHost, domid: u16) {
    host.call(XmxdRequest::Attach {
        domid,
        cluster: None,
    });
}

#[test]
fn two_hosts_agree_on_one_table_and_clusters_split_it() {
    let pair = VethPair::create("xd", 9000).unwrap();
    let mut a = XmxdHost::start("ha");
    let mut b = XmxdHost::start("hb");
    let fa = PacketFabric::open_in_netns(&pair.ns_a, &pair.if_a).unwrap();
    let fb = PacketFabric::open_in_netns(&pair.ns_b, &pair.if_b).unwrap();
    let (mac_a, mac_b) = (fa.mac(), fb.mac());
    a.start_xmxd(Some(fa), INTERVAL);
    b.start_xmxd(Some(fb), INTERVAL);

    let a1 = a.create("a1");
    let a2 = a.create("a2");
    let b1 = b.create("b1");
    attach(&a, a1);
    attach(&a, a2);
    attach(&b, b1);

    let table = agree(&a, &b, 3, |_| true);
    let mut indices: Vec<u16> = table.iter().map(|p| p.index).collect();
    indices.dedup();
    assert_eq!(indices.len(), 3, "indices are unique: {table:?}");
    for p in &table {
        assert_eq!(p.mac, names::guest_mac(&p.guest));
        assert_eq!(p.hostname, format!("{}:0", p.guest));
        assert_eq!(p.cluster, "default");
        let (host, mac) = if p.guest.starts_with('a') {
            ("ha", mac_a)
        } else {
            ("hb", mac_b)
        };
        assert_eq!((p.host.as_str(), p.host_mac), (host, mac));
    }
    // Each side marks its own guests local.
    let locals = |h: &XmxdHost| -> Vec<String> {
        let mut l: Vec<String> = h.xmxd().inspect(|c| {
            c.table()
                .peers
                .iter()
                .filter(|p| p.local)
                .map(|p| p.guest.clone())
                .collect()
        });
        l.sort();
        l
    };
    assert_eq!(locals(&a), ["a1", "a2"]);
    assert_eq!(locals(&b), ["b1"]);
    a.wait("pushed to A's backend", |c| c.backend_synced());
    b.wait("pushed to B's backend", |c| c.backend_synced());
    assert_eq!(a.xmxd().inspect(|c| c.remote_hosts()), ["hb"]);

    // A cluster on host A only: its id comes from its name, so B needs no setup.
    a.call(XmxdRequest::ClusterCreate {
        name: "blue".into(),
    });
    a.call(XmxdRequest::ClusterAdd {
        name: "blue".into(),
        guest: "a1".into(),
        new: false,
    });
    let moved = agree(&a, &b, 3, |t| {
        t.iter().any(|p| p.guest == "a1" && p.cluster == "blue")
    });
    let same_places: Vec<(u16, &str)> = moved.iter().map(|p| (p.index, p.guest.as_str())).collect();
    let before: Vec<(u16, &str)> = table.iter().map(|p| (p.index, p.guest.as_str())).collect();
    assert_eq!(same_places, before, "moving a guest keeps every index");
    assert_eq!(guest_view(&a, "a1"), ["a1"]);
    let mut rest = guest_view(&a, "a2");
    rest.sort();
    assert_eq!(rest, ["a2", "b1"]);
    let mut from_b = guest_view(&b, "b1");
    from_b.sort();
    assert_eq!(from_b, ["a2", "b1"]);
    assert_eq!(guest_view(&b, "a1"), ["a1"]);
    // Each guest finds the same view in xenstore, and only its own.
    let xs_of = |h: &XmxdHost, d: u16| {
        SimPlatform::attach(h.hv_dir(), d)
            .unwrap()
            .xenstore()
            .unwrap()
    };
    let published = |xs: &dyn Xenstore, d: u16| -> Vec<String> {
        let dir = xsnodes::peers_dir(DOM0, d);
        let mut v: Vec<String> = xs
            .directory(XBT_NULL, &dir)
            .unwrap()
            .iter()
            .map(|i| String::from_utf8(xs.read(XBT_NULL, &format!("{dir}/{i}")).unwrap()).unwrap())
            .map(|v| {
                v.split(' ')
                    .nth(1)
                    .unwrap()
                    .trim_end_matches(":0")
                    .to_string()
            })
            .collect();
        v.sort();
        v
    };
    let (xs_a1, xs_a2) = (xs_of(&a, a1), xs_of(&a, a2));
    assert_eq!(published(xs_a1.as_ref(), a1), ["a1"]);
    assert_eq!(published(xs_a2.as_ref(), a2), ["a2", "b1"]);
    assert!(matches!(
        xs_a2.directory(XBT_NULL, &xsnodes::peers_dir(DOM0, a1)),
        Err(xmx_hv::Error::Denied(_))
    ));
    let xs_b1 = xs_of(&b, b1);
    assert_eq!(published(xs_b1.as_ref(), b1), ["a2", "b1"]);

    // Back to the default cluster: both tables follow.
    a.call(XmxdRequest::ClusterRemove {
        name: "blue".into(),
        guest: "a1".into(),
    });
    agree(&a, &b, 3, |t| t.iter().all(|p| p.cluster == "default"));
    assert_eq!(guest_view(&b, "b1").len(), 3);

    // Migration as xl does it: the receiving copy appears as b1--incoming on A while B
    // still runs b1; A takes b1's identity from B's announcement without being asked.
    let b1_index = table.iter().find(|p| p.guest == "b1").unwrap().index;
    let incoming = a.create("b1--incoming");
    a.wait("b1 attached on A", |c| c.is_attached(incoming));
    b.destroy(b1);
    let after = agree(&a, &b, 3, |t| {
        t.iter().any(|p| p.guest == "b1" && p.host == "ha")
    });
    let b1_now = after.iter().find(|p| p.guest == "b1").unwrap();
    assert_eq!(b1_now.index, b1_index, "a migrated guest keeps its index");
    assert_eq!(b1_now.mac, names::guest_mac("b1"), "and its MAC");
    assert_eq!(locals(&a), ["a1", "a2", "b1"]);
    assert!(locals(&b).is_empty());

    // A host that goes silent is forgotten by the other after its TTL.
    a.xmxd = None;
    b.wait("A forgotten", |c| c.table().peers.is_empty());
    drop(pair);
}

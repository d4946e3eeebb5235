//! xmxd through link faults (two hosts on a veth pair, each end in its own network
//! namespace; needs root): a link taken down for 2 s and brought up again, and a link
//! deleted and created again. xmxd keeps running, resumes on the link when it is back,
//! and the other host never forgets this host's guests over a flap.

mod xmxd_util;

use std::process::Command;
use std::time::Duration;

use xmx_nic::testbed::VethPair;
use xmx_tools::xmxd::control::XmxdRequest;
use xmx_tools::xmxd::PacketFabric;
use xmxd_util::XmxdHost;

/// Announcements as often as the simulated clusters send them.
const INTERVAL: Duration = Duration::from_millis(100);

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn attach(host: &XmxdHost, name: &str) {
    let domid = host.create(name);
    host.call(XmxdRequest::Attach {
        domid,
        cluster: None,
    });
}

fn guests_of(host: &XmxdHost) -> Vec<String> {
    let mut g: Vec<String> = host
        .xmxd()
        .inspect(|c| c.table().peers.iter().map(|p| p.guest.clone()).collect());
    g.sort();
    g
}

/// Two hosts with one guest each, both tables complete.
fn two_hosts(pair: &VethPair) -> (XmxdHost, XmxdHost) {
    let mut a = XmxdHost::start("ha");
    let mut b = XmxdHost::start("hb");
    a.start_xmxd(
        Some(PacketFabric::open_in_netns(&pair.ns_a, &pair.if_a).unwrap()),
        INTERVAL,
    );
    b.start_xmxd(
        Some(PacketFabric::open_in_netns(&pair.ns_b, &pair.if_b).unwrap()),
        INTERVAL,
    );
    attach(&a, "a1");
    attach(&b, "b1");
    for h in [&a, &b] {
        h.wait("both guests in the table", |c| c.table().peers.len() == 2);
    }
    (a, b)
}

#[test]
fn a_two_second_link_flap_loses_no_peer() {
    let pair = VethPair::create("xf", 9000).unwrap();
    let (a, b) = two_hosts(&pair);
    let generation_b = b.xmxd().inspect(|c| c.generation());

    ip(&["-n", &pair.ns_a, "link", "set", &pair.if_a, "down"]);
    a.wait("A's xmxd sees its link fail", |c| c.fabric_failing());
    // The flap itself is the fault under test: 2 s of silence from A.
    std::thread::sleep(Duration::from_secs(2));
    ip(&["-n", &pair.ns_a, "link", "set", &pair.if_a, "up"]);
    a.wait("A's xmxd back on its link", |c| !c.fabric_failing());

    // A's xmxd still serves: a guest started after the flap reaches B's table.
    attach(&a, "a2");
    b.wait("a2 in B's table", |c| {
        c.table().peers.iter().any(|p| p.guest == "a2")
    });
    assert_eq!(guests_of(&b), ["a1", "a2", "b1"]);
    // B's table changed once, for a2: a1 was never forgotten.
    assert_eq!(b.xmxd().inspect(|c| c.generation()), generation_b + 1);
}

#[test]
fn a_re_created_interface_is_opened_again() {
    let pair = VethPair::create("xr", 9000).unwrap();
    let (a, b) = two_hosts(&pair);

    // Deleting one end of a veth pair deletes both; create them again, same names.
    ip(&["-n", &pair.ns_a, "link", "del", &pair.if_a]);
    a.wait("A's xmxd sees its interface go", |c| c.fabric_failing());
    ip(&[
        "-n", &pair.ns_a, "link", "add", &pair.if_a, "mtu", "9000", "type", "veth", "peer", "name",
        &pair.if_b, "mtu", "9000", "netns", &pair.ns_b,
    ]);
    ip(&["-n", &pair.ns_a, "link", "set", &pair.if_a, "up"]);
    ip(&["-n", &pair.ns_b, "link", "set", &pair.if_b, "up"]);
    for h in [&a, &b] {
        h.wait("xmxd on the new interface", |c| !c.fabric_failing());
    }

    // Only the new sockets can carry this news.
    attach(&a, "a2");
    attach(&b, "b2");
    for h in [&a, &b] {
        h.wait("every guest in the table", |c| c.table().peers.len() == 4);
    }
    assert_eq!(guests_of(&a), ["a1", "a2", "b1", "b2"]);
    assert_eq!(guests_of(&b), ["a1", "a2", "b1", "b2"]);
}

//! A backend through link faults (two simulated hosts on a veth pair; needs root, skipped
//! without): the link taken down for 2 s and brought up, and the interface deleted and
//! created again. The backend keeps running, takes the socket's error when it comes, and
//! carries frames again once the link is back.

mod backd_util;

use std::process::Command;
use std::time::Duration;

use backd_util::{
    counters, eventually, small_endpoint, BackdTestHost, FakeGuest, FakeGuestEndpoint,
};
use xmx_backend::service::BackendThread;
use xmx_nic::testbed::VethPair;
use xmx_wire::msg::{EventBody, InlineData, InlineMsg, MsgInfo, Route, SendOp, SendRequest};

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two hosts, guest a (peer 0) on the first, guest b (peer 1) on the second, each with
/// endpoint 0 open.
struct CrossHostPair {
    backends: [BackendThread; 2],
    a: FakeGuest,
    b: FakeGuest,
    ea: FakeGuestEndpoint,
    eb: FakeGuestEndpoint,
    _hosts: [BackdTestHost; 2],
}

fn pair(veth: &VethPair) -> CrossHostPair {
    let hosts = [BackdTestHost::start(), BackdTestHost::start()];
    let backends = [
        hosts[0].start_wire_backend(&veth.ns_a, &veth.if_a),
        hosts[1].start_wire_backend(&veth.ns_b, &veth.if_b),
    ];
    let mut a = hosts[0].guest("a", 1, 1);
    let mut b = hosts[1].guest("b", 2, 1);
    a.connect();
    b.connect();
    let ea = a.open_endpoint(0, small_endpoint(8)).1.unwrap();
    let eb = b.open_endpoint(0, small_endpoint(8)).1.unwrap();
    CrossHostPair {
        backends,
        a,
        b,
        ea,
        eb,
        _hosts: hosts,
    }
}

/// A TINY from a to b arrives, bytes intact.
fn tiny_arrives(p: &mut CrossHostPair, seqnum: u16, text: &[u8]) {
    let route = Route {
        peer_index: 1,
        endpoint: 0,
        session_id: p.eb.session,
    };
    p.a.send(
        &mut p.ea,
        SendRequest {
            tag: u32::from(seqnum),
            route,
            op: SendOp::Tiny(InlineMsg {
                info: MsgInfo {
                    seqnum,
                    piggyack: 0,
                    match_info: 7,
                },
                data: InlineData::new(text).unwrap(),
            }),
        },
    );
    loop {
        let ev = p.b.next_event(&mut p.eb);
        p.b.retire_events(&mut p.eb);
        if let EventBody::RecvTiny { msg, .. } = ev.body {
            assert_eq!(msg.data.as_slice(), text);
            return;
        }
    }
}

fn root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!("skipped: needs root for network namespaces");
    false
}

#[test]
fn a_link_down_for_two_seconds_is_survived() {
    if !root() {
        return;
    }
    let veth = VethPair::create("bkf", 9000).expect("veth pair");
    let mut p = pair(&veth);
    tiny_arrives(&mut p, 1, b"before");

    ip(&["-n", &veth.ns_a, "link", "set", &veth.if_a, "down"]);
    eventually("the backend took the link's error", || {
        counters(&p.backends[0]).backend.nic_link_errors > 0
    });
    // The flap itself is the fault under test.
    std::thread::sleep(Duration::from_secs(2));
    ip(&["-n", &veth.ns_a, "link", "set", &veth.if_a, "up"]);
    // The error was taken when it came, so the first frame after the flap is not the one
    // that collects it from the socket (and is lost with it).
    tiny_arrives(&mut p, 2, b"after the flap");
    assert_eq!(counters(&p.backends[0]).backend.nic_tx_errors, 0);
}

#[test]
fn a_re_created_interface_is_opened_again() {
    if !root() {
        return;
    }
    let veth = VethPair::create("bkr", 9000).expect("veth pair");
    let mut p = pair(&veth);
    tiny_arrives(&mut p, 1, b"before");

    // Deleting one end of a veth pair deletes both; create them again, same names.
    ip(&["-n", &veth.ns_a, "link", "del", &veth.if_a]);
    ip(&[
        "-n", &veth.ns_a, "link", "add", &veth.if_a, "mtu", "9000", "type", "veth", "peer", "name",
        &veth.if_b, "mtu", "9000", "netns", &veth.ns_b,
    ]);
    ip(&["-n", &veth.ns_a, "link", "set", &veth.if_a, "up"]);
    ip(&["-n", &veth.ns_b, "link", "set", &veth.if_b, "up"]);
    for backend in &p.backends {
        eventually("the backend reopened its link", || {
            counters(backend).backend.nic_link_reopens > 0
        });
    }
    tiny_arrives(&mut p, 2, b"on the new link");
}

//! The C programs of tests/c as two processes on two hosts (network
//! namespaces joined by a veth, MTU 9000), on the native transport: the
//! passive side (`-l 2`) on h0, the active side (`-d h0 -e 2`) on h1.
//! Needs root; skipped with a printed reason otherwise.

mod common;
#[path = "common/twohost.rs"]
mod twohost;

use common::{build, our_include, scratch};
use twohost::{passed, TwoHosts};

/// Runs `name` across two hosts; returns (passive, active) stdout.
fn across(name: &str, tag: &str) -> Option<(String, String)> {
    let hosts = TwoHosts::direct(tag)?;
    let dir = scratch();
    let bin = build(name, &our_include(), dir.path());
    let (p, a) = hosts.run_pair(&bin, &[]);
    let (p, a) = (passed("passive side", &p), passed("active side", &a));
    print!("{a}{p}");
    Some((p, a))
}

#[test]
fn pingpong_every_size_up_to_16_mib() {
    if let Some((_, a)) = across("pingpong", "npp") {
        for size in ["0 ", "32 ", "4096 ", "32769 ", "16777216 "] {
            assert!(
                a.lines().any(|l| l.trim_start().starts_with(size)),
                "a line for {size}in:\n{a}"
            );
        }
    }
}

#[test]
fn first_message_large_then_connect_back() {
    if let Some((_, a)) = across("first_large", "nfl") {
        assert!(a.contains("first message of 65536 bytes, 6 rounds answered"));
    }
}

#[test]
fn stream_keeps_order() {
    if let Some((p, a)) = across("stream", "nst") {
        assert!(p.contains("received 1500 messages in order"));
        assert!(a.contains("sent 1500 messages"));
    }
}

#[test]
fn wait_any_over_many_requests() {
    across("waitany", "nwa");
}

#[test]
fn many_outstanding_requests() {
    if let Some((_, a)) = across("outstanding", "nou") {
        assert!(a.contains("1000 sends outstanding at once"));
    }
}

#[test]
fn connect_refusals() {
    if let Some((_, a)) = across("badkey", "nbk") {
        assert!(a.contains("refusals: bad key, closed endpoint, unknown NIC, bad id"));
    }
}

#[test]
fn truncation_and_synchronous_send() {
    across("truncate", "ntr");
}

#[test]
fn cancel_forget_peek() {
    if let Some((_, a)) = across("cancel", "nca") {
        assert!(a.contains("cancel, forget, context, peek checked"));
    }
}

#[test]
fn probe_unexpected_messages() {
    across("probe", "npr");
}

#[test]
fn unexpected_handler() {
    across("unexp", "nun");
}

#[test]
fn large_reply_without_connecting_back() {
    across("reply_large", "nrl");
}

/// mx_wakeup needs no peer: one process on one host.
#[test]
fn wakeup_from_another_thread() {
    let Some(hosts) = TwoHosts::direct("nwk") else {
        return;
    };
    let dir = scratch();
    let bin = build("wakeup", &our_include(), dir.path());
    let o = hosts
        .command(1, &bin, &[], &[])
        .output()
        .expect("running wakeup");
    let out = passed("wakeup", &o);
    assert_eq!(out.matches("returned on mx_wakeup").count(), 4);
}

/// The active side finds h0 with no hostname in its peer list: by
/// HOST_QUERY / HOST_REPLY through the engines.
#[test]
fn hostnames_are_discovered() {
    let Some(hosts) = TwoHosts::direct("ndi") else {
        return;
    };
    let dir = scratch();
    let bin = build("badkey", &our_include(), dir.path());
    let unnamed = hosts.peers_unnamed.to_string_lossy().into_owned();
    let (p, a) = hosts.run_pair(&bin, &[("XMX_PEERS", &unnamed)]);
    passed("passive side", &p);
    passed("active side", &a);
}

/// Without an interface the native transport is refused at mx_init with
/// MX's "no driver" error, and an unknown interface likewise.
#[test]
fn native_without_an_interface_is_refused() {
    let dir = scratch();
    let bin = build("info", &our_include(), dir.path());
    for iface in [None, Some("xmx-no-such-if")] {
        let mut env = vec![("XMX_TRANSPORT", "native")];
        if let Some(i) = iface {
            env.push(("XMX_IFACE", i));
        }
        let o = common::run(&bin, &[], &env);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("mx_init") && stderr.contains("MX driver not available"),
            "{iface:?}: {stderr}"
        );
    }
}

/// Without XMX_TRANSPORT, XMX_IFACE alone selects the native transport.
#[test]
fn an_interface_selects_native_by_default() {
    let Some(hosts) = TwoHosts::direct("ndf") else {
        return;
    };
    let dir = scratch();
    let bin = build("cancel", &our_include(), dir.path());
    let mut passive = hosts
        .command(0, &bin, &["-l", "2"], &[])
        .env_remove("XMX_TRANSPORT")
        .spawn()
        .expect("passive side");
    twohost::wait_endpoint_open(&mut passive);
    let active = hosts
        .command(1, &bin, &["-d", "h0", "-e", "2"], &[])
        .env_remove("XMX_TRANSPORT")
        .output()
        .expect("active side");
    let passive = passive.wait_with_output().expect("passive side");
    passed("passive side", &passive);
    passed("active side", &active);
}

/// Sending to oneself goes through the NIC (the engine loops it back).
#[test]
fn sends_to_oneself_without_connecting() {
    if let Some((p, a)) = across("self_send", "nss") {
        assert!(p.contains("75 messages to itself checked"));
        assert!(a.contains("75 messages to itself checked"));
    }
}

/// A 0-byte mx_issend has no buffer to lend for a pull: it completes, and
/// the sends behind it go.
#[test]
fn zero_byte_synchronous_send() {
    if let Some((_, a)) = across("zero_issend", "nzi") {
        assert!(a.contains("20 rounds of 0 B issends"));
    }
}

/// MX's internals on the native transport, registration cache on.
#[test]
fn mx_internals_for_open_mpi() {
    let Some(hosts) = TwoHosts::direct("nmi") else {
        return;
    };
    let dir = scratch();
    let bin = build("mx_internals", &our_include(), dir.path());
    let o = hosts
        .command(1, &bin, &[], &[])
        .output()
        .expect("running mx_internals");
    assert!(passed("mx_internals", &o).contains("mx__regcache_clean checked"));
}

/// Unexpected LARGE messages keep their place in the queue while later
/// small ones of the same match info arrive (the pull is not instantaneous
/// here, unlike on loopback).
#[test]
fn mpi_transport_pattern() {
    if let Some((p, _)) = across("mpi_pattern", "nmp") {
        assert!(p.contains("received 4 rounds in arrival order"));
    }
}

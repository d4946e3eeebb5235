//! Opening a packet socket: what it finds out about the interface, and what it refuses.

mod nic_util;

use nic_util::{privileged, VethSockets};
use xmx_nic::testbed::VethPair;
use xmx_nic::{NicConfig, NicError, PacketSocket};

#[test]
fn reports_the_interface_it_is_bound_to() {
    if !privileged("reports_the_interface_it_is_bound_to") {
        return;
    }
    let link = VethSockets::jumbo("info");
    let a = &link.a;
    let sys = |attr: &str| {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &link.pair.ns_a, "cat"])
            .arg(format!("/sys/class/net/{}/{attr}", link.pair.if_a))
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    assert_eq!(a.ifname(), link.pair.if_a);
    assert_eq!(a.ifindex().to_string(), sys("ifindex"));
    assert_eq!(a.mtu().to_string(), sys("mtu"));
    assert_eq!(a.mac().to_string(), sys("address"));
    assert_ne!(a.mac(), link.b.mac());
    assert!(a.rx_ring_frames() >= 1024 && a.tx_ring_frames() >= 512);
}

#[test]
fn missing_interface_is_refused() {
    if !privileged("missing_interface_is_refused") {
        return;
    }
    let pair = VethPair::create("missing", 9000).unwrap();
    let err =
        PacketSocket::open_in_netns(&pair.ns_a, "xmx-nothere", NicConfig::default()).unwrap_err();
    assert!(
        matches!(&err, NicError::NoSuchInterface { name } if name == "xmx-nothere"),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "no network interface named \"xmx-nothere\""
    );
}

#[test]
fn small_mtu_is_refused_unless_allowed() {
    if !privileged("small_mtu_is_refused_unless_allowed") {
        return;
    }
    let pair = VethPair::create("mtu", 1500).unwrap();
    let err =
        PacketSocket::open_in_netns(&pair.ns_a, &pair.if_a, NicConfig::default()).unwrap_err();
    assert!(
        matches!(&err, NicError::MtuTooSmall { name, mtu: 1500, min: 4130 } if *name == pair.if_a),
        "{err}"
    );
    assert!(err.to_string().contains("MTU 1500"), "{err}");
    // The minimum is configurable; frames are then limited by the MTU.
    let cfg = NicConfig {
        min_mtu: 1500,
        ..NicConfig::default()
    };
    let mut sock = PacketSocket::open_in_netns(&pair.ns_a, &pair.if_a, cfg).unwrap();
    assert_eq!(sock.max_frame_len(), 1514);
    let err = sock.send(&[0u8; 1515]).unwrap_err();
    assert!(
        matches!(
            err,
            NicError::FrameTooLong {
                len: 1515,
                max: 1514
            }
        ),
        "{err}"
    );
    // One byte short of the MXoE minimum is still refused.
    pair.set_mtu_b(4129).unwrap();
    let err =
        PacketSocket::open_in_netns(&pair.ns_b, &pair.if_b, NicConfig::default()).unwrap_err();
    assert!(
        matches!(err, NicError::MtuTooSmall { mtu: 4129, .. }),
        "{err}"
    );
}

#[test]
fn non_ethernet_and_bad_names_are_refused() {
    if !privileged("non_ethernet_and_bad_names_are_refused") {
        return;
    }
    let pair = VethPair::create("names", 9000).unwrap();
    let cfg = NicConfig {
        min_mtu: 0,
        ..NicConfig::default()
    };
    let err = PacketSocket::open_in_netns(&pair.ns_a, "lo", cfg.clone()).unwrap_err();
    assert!(
        matches!(err, NicError::NotEthernet { hw_type: 772, .. }),
        "{err}"
    );
    for bad in ["", "much-too-long-name0", "a/b"] {
        let err = PacketSocket::open_in_netns(&pair.ns_a, bad, cfg.clone()).unwrap_err();
        assert!(
            matches!(err, NicError::InvalidInterfaceName { .. }),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn frames_outside_ethernet_bounds_are_refused() {
    if !privileged("frames_outside_ethernet_bounds_are_refused") {
        return;
    }
    let mut link = VethSockets::jumbo("bounds");
    let err = link.a.send(&[0u8; 13]).unwrap_err();
    assert!(matches!(err, NicError::FrameTooShort { len: 13 }), "{err}");
    let err = link.a.send(&vec![0u8; 9015]).unwrap_err();
    assert!(
        matches!(
            err,
            NicError::FrameTooLong {
                len: 9015,
                max: 9014
            }
        ),
        "{err}"
    );
    link.a.flush().unwrap();
    let s = link.a.stats().unwrap();
    assert_eq!((s.tx_frames, s.tx_syscalls), (0, 0));
}

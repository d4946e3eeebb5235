//! Shared pieces of the NIC tests: a veth pair with a socket on each end, frame makers.

#![allow(dead_code)]

use std::time::Duration;

use xmx_nic::testbed::VethPair;
use xmx_nic::{NicConfig, PacketSocket, ETHERTYPE};

/// The tests create namespaces and veth pairs, which needs root. Without it they report
/// the skip and pass, so unprivileged `cargo test` runs still check everything else.
pub fn privileged(test: &str) -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        eprintln!("{test}: skipped, needs root for network namespaces");
    }
    root
}

/// A veth pair (MTU `mtu`) and a socket on each end.
pub struct VethSockets {
    pub a: PacketSocket,
    pub b: PacketSocket,
    // Dropped last: the namespaces outlive the sockets.
    pub pair: VethPair,
}

impl VethSockets {
    pub fn new(tag: &str, mtu: u32, cfg_a: NicConfig, cfg_b: NicConfig) -> Self {
        let pair = VethPair::create(tag, mtu).expect("veth pair");
        let a = PacketSocket::open_in_netns(&pair.ns_a, &pair.if_a, cfg_a).expect("open end a");
        let b = PacketSocket::open_in_netns(&pair.ns_b, &pair.if_b, cfg_b).expect("open end b");
        Self { a, b, pair }
    }

    pub fn jumbo(tag: &str) -> Self {
        Self::new(tag, 9000, NicConfig::default(), NicConfig::default())
    }
}

/// A seeded generator for frame payloads, different in every process so that concurrent
/// runs never share frames.
pub fn payload_rng(seed: u64) -> fastrand::Rng {
    fastrand::Rng::with_seed(seed ^ u64::from(std::process::id()))
}

/// A frame of `len` bytes from `src` to `dst` with `ethertype` and a random payload.
pub fn frame_with_type(
    dst: [u8; 6],
    src: [u8; 6],
    ethertype: u16,
    len: usize,
    rng: &mut fastrand::Rng,
) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[0..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&ethertype.to_be_bytes());
    rng.fill(&mut f[14..]);
    f
}

/// An MXoE-ethertype frame of `len` bytes from `from` to `to`.
pub fn mxoe_frame(
    from: &PacketSocket,
    to: &PacketSocket,
    len: usize,
    rng: &mut fastrand::Rng,
) -> Vec<u8> {
    frame_with_type(to.mac().0, from.mac().0, ETHERTYPE, len, rng)
}

/// Receive exactly `n` frames, failing the test if they take more than 5 s.
pub fn recv_frames(sock: &mut PacketSocket, n: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let got = sock
            .poll_spin_then_block(
                Duration::from_micros(20),
                Some(Duration::from_secs(5)),
                |f| out.push(f.to_vec()),
            )
            .expect("receive");
        assert!(got > 0, "timed out with {} of {n} frames", out.len());
    }
    out
}

/// Compare received frames with sent ones, reporting the first difference.
pub fn assert_same_frames(got: &[Vec<u8>], sent: &[Vec<u8>]) {
    assert_eq!(got.len(), sent.len(), "frame count");
    for (i, (g, s)) in got.iter().zip(sent).enumerate() {
        assert_eq!(g.len(), s.len(), "length of frame {i}");
        if let Some(at) = g.iter().zip(s.iter()).position(|(x, y)| x != y) {
            panic!("frame {i} ({} bytes) differs at byte {at}", s.len());
        }
    }
}

/// A counter of `iface` in namespace `ns` from /sys/class/net/IFACE/statistics.
pub fn iface_counter(ns: &str, iface: &str, counter: &str) -> u64 {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "cat"])
        .arg(format!("/sys/class/net/{iface}/statistics/{counter}"))
        .output()
        .expect("ip netns exec");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("counter")
}

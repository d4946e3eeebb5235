//! The impairing relay of the test bed: between two veth pairs, it passes every frame
//! untouched when told to, and its seed replays the same losses and duplicates.

mod nic_util;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use nic_util::{assert_same_frames, mxoe_frame, payload_rng, privileged, recv_frames};
use xmx_nic::testbed::relay::{Impairment, Relay, RelayStats};
use xmx_nic::testbed::VethPair;
use xmx_nic::{NicConfig, PacketSocket};

/// Two hosts joined through a relay: `a` — relay — `b`.
struct Relayed {
    a: PacketSocket,
    b: PacketSocket,
    relay: Option<Relay>,
    // Dropped last: the namespaces outlive the sockets.
    _pairs: [VethPair; 2],
}

fn relayed(tag: &str, from_a: Impairment, from_b: Impairment, seed: u64) -> Relayed {
    let p1 = VethPair::create(&format!("{tag}1"), 9000).expect("veth pair");
    let p2 = VethPair::create(&format!("{tag}2"), 9000).expect("veth pair");
    let promiscuous = NicConfig {
        promiscuous: true,
        ..NicConfig::default()
    };
    let a = PacketSocket::open_in_netns(&p1.ns_a, &p1.if_a, NicConfig::default()).unwrap();
    let b = PacketSocket::open_in_netns(&p2.ns_b, &p2.if_b, NicConfig::default()).unwrap();
    let ra = PacketSocket::open_in_netns(&p1.ns_b, &p1.if_b, promiscuous.clone()).unwrap();
    let rb = PacketSocket::open_in_netns(&p2.ns_a, &p2.if_a, promiscuous).unwrap();
    let relay = Relay::start("test-relay", ra, rb, from_a, from_b, seed).unwrap();
    Relayed {
        a,
        b,
        relay: Some(relay),
        _pairs: [p1, p2],
    }
}

fn send_all(from: &mut PacketSocket, frames: &[Vec<u8>]) {
    for f in frames {
        from.send(f).unwrap();
    }
    from.flush().unwrap();
}

/// Waits (bounded) until the relay has taken `n` frames from side A and released them all.
fn relayed_from_a(r: &Relay, n: u64) -> RelayStats {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = r.stats();
        if s.from_a == n {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "the relay took {s:?} of {n} frames"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn an_unimpaired_relay_passes_every_frame_in_order_both_ways() {
    if !privileged("an_unimpaired_relay_passes_every_frame_in_order_both_ways") {
        return;
    }
    let mut h = relayed("rlyok", Impairment::NONE, Impairment::NONE, 1);
    let mut rng = payload_rng(7);
    let there: Vec<Vec<u8>> = (0..200)
        .map(|i| mxoe_frame(&h.a, &h.b, 60 + i * 7, &mut rng))
        .collect();
    send_all(&mut h.a, &there);
    assert_same_frames(&recv_frames(&mut h.b, there.len()), &there);
    let back: Vec<Vec<u8>> = (0..50)
        .map(|i| mxoe_frame(&h.b, &h.a, 1500 + i, &mut rng))
        .collect();
    send_all(&mut h.b, &back);
    assert_same_frames(&recv_frames(&mut h.a, back.len()), &back);
    let s = h.relay.take().unwrap().stats();
    assert_eq!(
        (s.from_a, s.from_b, s.lost, s.duplicated),
        (200, 50, 0, 0),
        "{s:?}"
    );
}

/// Frames numbered in their payload; what arrives, by number, and the relay's counts.
fn lossy_run(tag: &str, seed: u64) -> (BTreeMap<u32, usize>, RelayStats) {
    let imp = Impairment {
        loss: 0.2,
        duplicate: 0.1,
        reorder: 0.1,
        delay: Duration::from_millis(1),
        down: None,
    };
    let mut h = relayed(tag, imp, Impairment::NONE, seed);
    let mut rng = payload_rng(3);
    let sent: Vec<Vec<u8>> = (0..300u32)
        .map(|i| {
            let mut f = mxoe_frame(&h.a, &h.b, 100, &mut rng);
            f[14..18].copy_from_slice(&i.to_le_bytes());
            f
        })
        .collect();
    send_all(&mut h.a, &sent);
    let relay = h.relay.take().unwrap();
    let s = relayed_from_a(&relay, 300);
    let expected = 300 - s.lost as usize + s.duplicated as usize;
    let got = recv_frames(&mut h.b, expected);
    let mut seen = BTreeMap::new();
    for f in got {
        let n = u32::from_le_bytes(f[14..18].try_into().unwrap());
        assert_eq!(f, sent[n as usize], "frame {n} arrived changed");
        *seen.entry(n).or_insert(0) += 1;
    }
    (seen, relay.stats())
}

#[test]
fn a_seed_replays_the_same_losses_and_duplicates() {
    if !privileged("a_seed_replays_the_same_losses_and_duplicates") {
        return;
    }
    let (first, s1) = lossy_run("rlya", 0x5eed);
    let (second, s2) = lossy_run("rlyb", 0x5eed);
    assert!(
        s1.lost > 0 && s1.duplicated > 0 && s1.reordered > 0,
        "{s1:?}"
    );
    assert!(
        first.values().all(|&c| c <= 2),
        "a frame came more than twice"
    );
    assert_eq!(first.len(), 300 - s1.lost as usize);
    assert_eq!(s1, s2, "the same seed, the same decisions");
    assert_eq!(first, second, "the same frames lost and duplicated");
    let (_, other) = lossy_run("rlyc", 0x5eee);
    assert_ne!(other, s1, "another seed, other decisions");
}

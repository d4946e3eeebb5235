//! What the split driver costs, measured in one run on one simulated
//! cluster: half round trips and bandwidth of the C ping-pong between guests
//! on different hosts and on the same host, beside the same program on the
//! native transport and raw AF_PACKET frames, both over a veth pair (the
//! cluster's hosts are joined by a bridge: one hop more).
//!
//! A measurement, not a check: it runs only with `XMX_SPLIT_BENCH=1`. The
//! figures of a shared two-core machine are noisy; the ratios are what count.

use std::collections::BTreeMap;
use std::time::Duration;

use xmx_nic::baseline::{raw_pingpong, raw_stream, BaselineEnd, PollPolicy};
use xmx_nic::testbed::VethPair;
use xmx_tests::app::App;
use xmx_tests::cluster::{exclusive, netns_cmd, unavailable, SimCluster};
use xmx_tests::cprog::{self, parse_pingpong, PingpongLine};

const SIZES: [u64; 8] = [0, 32, 128, 4096, 32 << 10, 64 << 10, 1 << 20, 16 << 20];

#[test]
fn guest_to_guest_beside_native_and_raw() {
    if std::env::var("XMX_SPLIT_BENCH").as_deref() != Ok("1") {
        println!(
            "guest_to_guest_beside_native_and_raw: a measurement; set XMX_SPLIT_BENCH=1 to run it"
        );
        return;
    }
    if let Some(why) = unavailable() {
        println!("skipped: {why}");
        return;
    }
    let _one = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let bin = cprog::build("pingpong", dir.path());
    let mut tables: BTreeMap<&str, Vec<PingpongLine>> = BTreeMap::new();

    // The baselines on a veth pair of their own: raw frames, and the same
    // program on the native transport (each end its own MX board). The
    // cluster's NICs carry its daemons' frames, which would disturb them.
    let pair = VethPair::create("sbn", 9000).expect("veth pair");
    let macs = ["02:00:00:00:b0:01", "02:00:00:00:b0:02"];
    for ((ns, ifname), mac) in [(&pair.ns_a, &pair.if_a), (&pair.ns_b, &pair.if_b)]
        .into_iter()
        .zip(macs)
    {
        let ok = std::process::Command::new("ip")
            .args(["-n", ns, "link", "set", ifname, "address", mac])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "setting {ifname}'s MAC");
    }
    let (a, b) = (
        BaselineEnd::in_netns(&pair.ns_a, &pair.if_a),
        BaselineEnd::in_netns(&pair.ns_b, &pair.if_b),
    );
    let policy = PollPolicy {
        spin: Duration::from_micros(20),
        ..PollPolicy::default()
    };
    let mut raw = Vec::new();
    for frame in [60usize, 16 + 32 + 4096] {
        let s = raw_pingpong(&a, &b, frame, 2000, policy).expect("raw ping-pong");
        raw.push(format!(
            "{frame} B frames: {:.1} us",
            s.half_rtt_median.as_secs_f64() * 1e6
        ));
    }
    let s = raw_stream(&a, &b, 9000, 50_000, 64, policy).expect("raw stream");
    raw.push(format!(
        "9000 B frames: {:.0} MB/s",
        s.gbit_per_s() * 1e3 / 8.0
    ));

    let peers = dir.path().join("peers.json");
    std::fs::write(
        &peers,
        format!(
            r#"[{{"index":0,"mac":"{}","hostname":"a:0"}},{{"index":1,"mac":"{}","hostname":"b:0"}}]"#,
            macs[0], macs[1]
        ),
    )
    .unwrap();
    let peers = peers.display().to_string();
    let native = |iface: &str, host: &str| {
        let env: Vec<(String, String)> = vec![
            ("XMX_TRANSPORT".into(), "native".into()),
            ("XMX_IFACE".into(), iface.into()),
            ("XMX_HOSTNAME".into(), host.into()),
            ("XMX_PEERS".into(), peers.clone()),
        ];
        env
    };
    let env_b = native(&pair.if_b, "b");
    let env_b: Vec<(&str, &str)> = env_b
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let env_a = native(&pair.if_a, "a");
    let env_a: Vec<(&str, &str)> = env_a
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut p = App::spawn(
        "native passive",
        netns_cmd(&pair.ns_b, &bin, &["-l", "2"], &env_b),
    );
    assert!(
        p.wait_thread("mx-progress", Duration::from_secs(30)),
        "native passive side"
    );
    let a = App::spawn(
        "native active",
        netns_cmd(&pair.ns_a, &bin, &["-d", "b", "-e", "2"], &env_a),
    )
    .finish();
    p.finish().passed();
    tables.insert("native", parse_pingpong(a.passed()));
    drop(pair);

    let c = SimCluster::up("sbench", &[]);
    for (name, passive, active, rcache) in [
        ("guests across hosts", (1, 0), (0, 0), "1"),
        ("guests across hosts, no rcache", (1, 0), (0, 0), "0"),
        ("co-located guests", (0, 1), (0, 0), "1"),
    ] {
        let (p, a) = c.run_pair(&bin, passive, active, &[("MX_RCACHE", rcache)]);
        p.passed();
        tables.insert(name, parse_pingpong(a.passed()));
    }

    println!("raw AF_PACKET between the hosts: {}", raw.join(", "));
    println!("ping-pong: half round trip in us / MB/s");
    print!("{:>10}", "bytes");
    for name in tables.keys() {
        print!(" | {name:>30}");
    }
    println!();
    for size in SIZES {
        print!("{size:>10}");
        for t in tables.values() {
            match t.iter().find(|l| l.bytes == size) {
                Some(l) => print!(" | {:>21.1} / {:>6.1}", l.latency_us, l.mb_s),
                None => print!(" | {:>30}", "-"),
            }
        }
        println!();
    }
}

//! Native MX against raw AF_PACKET on the same veth, in one run: ping-pong
//! latency at 0 B, 32 B and 4 KiB, bandwidth at 1 MiB, as ratios.
//!
//! Ignored by default (it measures, it checks nothing about speed):
//! `cargo test --release -p xmx-libmx --test native_bench -- --ignored --nocapture`.
//! Needs root. Each side is one process with an application thread and the
//! driver thread; the raw baseline is two threads of one process spinning
//! 50 us before they block, as `raw_pingpong` does by default.

mod common;
#[path = "common/twohost.rs"]
mod twohost;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{build, lib_dir, our_include, scratch, OPEN_MX_INCLUDE};
use twohost::TwoHosts;
use xmx_nic::baseline::{raw_pingpong, raw_stream, BaselineEnd, PollPolicy};

const OPEN_MX_TESTS: &str = "/work/ref/xen2mx/tests/mx";

/// Frame lengths of the MX messages compared: TINY 0 B (padded to the
/// Ethernet minimum), TINY 32 B, one 4 KiB MEDIUM fragment; bulk data moves
/// in 4 KiB PULL_REPLY frames.
const FRAMES: [(u32, usize); 3] = [(0, 60), (32, 80), (4096, 4144)];
const BULK_FRAME: usize = 4144;

/// `(length, latency us, MB/s)` rows of a ping-pong table.
fn rows(out: &str) -> Vec<(u32, f64, f64)> {
    out.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let len = f.next()?.parse().ok()?;
            let lat = f.next()?.parse().ok()?;
            let bw = f.next()?.parse().ok()?;
            Some((len, lat, bw))
        })
        .collect()
}

/// Native ping-pong rows: Myricom's `mx_pingpong` (blocking waits) when
/// Open-MX's copy is here, else our pingpong.
fn native(hosts: &TwoHosts, dir: &Path) -> Vec<(u32, f64, f64)> {
    let src = Path::new(OPEN_MX_TESTS).join("mx_pingpong.c");
    if !src.exists() || !Path::new(OPEN_MX_INCLUDE).exists() {
        println!("mx_pingpong not found: using tests/c/pingpong (20 iterations a size)");
        let bin = build("pingpong", &our_include(), dir);
        let (_, a) = hosts.run_pair(&bin, &[]);
        return rows(&String::from_utf8_lossy(&a.stdout));
    }
    let bin = dir.join("mx_pingpong");
    let o = Command::new("cc")
        .args([
            "-std=gnu99",
            "-O2",
            "-w",
            "-I",
            OPEN_MX_INCLUDE,
            "-I",
            OPEN_MX_TESTS,
        ])
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .arg("-L")
        .arg(lib_dir())
        .arg("-lmyriexpress")
        .output()
        .expect("cc");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut all = Vec::new();
    for (lens, iters) in [("0\n32\n4096\n", "3000"), ("1048576\n", "200")] {
        let file = dir.join(format!("lens-{iters}"));
        std::fs::write(&file, lens).expect("length file");
        let file = file.to_string_lossy().into_owned();
        let sender = [
            "-d", "h0", "-r", "1", "-e", "3", "-L", &file, "-N", iters, "-w",
        ];
        let (p, a) = hosts.run_pair_args(&bin, &["-e", "1", "-L", &file], &sender, &[]);
        assert!(
            p.status.success() && a.status.success(),
            "mx_pingpong failed"
        );
        all.extend(rows(&String::from_utf8_lossy(&a.stdout)));
    }
    all
}

#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn native_against_raw_af_packet() {
    let Some(hosts) = TwoHosts::direct("bench") else {
        return;
    };
    let a = BaselineEnd::in_netns(&hosts.hosts[1].ns, &hosts.hosts[1].iface);
    let b = BaselineEnd::in_netns(&hosts.hosts[0].ns, &hosts.hosts[0].iface);
    let policy = PollPolicy::default();
    let us = |d: Duration| d.as_secs_f64() * 1e6;

    let dir = scratch();
    let native = native(&hosts, dir.path());

    println!("\nraw AF_PACKET (one process, spin {:?}):", policy.spin);
    let mut raw = Vec::new();
    for (len, frame) in FRAMES {
        let s = raw_pingpong(&a, &b, frame, 20_000, policy).expect("raw ping-pong");
        println!(
            "  {frame:>5} B frames: half round trip mean {:.2} us, median {:.2} us",
            us(s.half_rtt_mean),
            us(s.half_rtt_median)
        );
        raw.push((len, us(s.half_rtt_mean), us(s.half_rtt_median)));
    }
    let stream = raw_stream(&a, &b, BULK_FRAME, 200_000, 64, policy).expect("raw stream");
    let raw_mbps = stream.bytes_received as f64 / stream.elapsed.as_secs_f64() / 1e6;
    println!("  {BULK_FRAME} B frames streamed: {raw_mbps:.0} MB/s");

    println!("\nnative MX ping-pong vs raw:");
    println!(
        "{:>9} {:>12} {:>10} {:>14} {:>14}",
        "bytes", "native us", "MB/s", "/ raw mean", "/ raw median"
    );
    for &(len, lat, bw) in &native {
        match raw.iter().find(|r| r.0 == len) {
            Some(&(_, mean, median)) => println!(
                "{len:>9} {lat:>12.2} {bw:>10.1} {:>14.2} {:>14.2}",
                lat / mean,
                lat / median
            ),
            None if len >= 1 << 20 => println!(
                "{len:>9} {lat:>12.2} {bw:>10.1}   bandwidth {:.2} of raw streaming",
                bw / raw_mbps
            ),
            None => {}
        }
    }
}

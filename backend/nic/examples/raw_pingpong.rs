//! Raw AF_PACKET baseline: ping-pong latency and one-way streaming bandwidth of
//! MXoE-ethertype frames between the two ends of a veth pair.
//!
//! By default it builds its own pair of namespaces joined by a veth (needs root); with
//! `--ns-a/--if-a/--ns-b/--if-b` it measures an existing link instead.

use std::time::Duration;

use clap::{Parser, ValueEnum};
use tracing_subscriber::EnvFilter;
use xmx_nic::baseline::{raw_pingpong, raw_stream, BaselineEnd, PollPolicy};
use xmx_nic::testbed::VethPair;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum MeasureMode {
    /// Half round-trip latency.
    Pingpong,
    /// One-way bandwidth.
    Stream,
    /// Both.
    Both,
}

/// Raw AF_PACKET ping-pong and streaming baseline over a veth pair.
#[derive(Debug, Parser)]
#[command(version)]
struct RawPingpongArgs {
    /// What to measure.
    #[arg(long, value_enum, default_value_t = MeasureMode::Both)]
    mode: MeasureMode,
    /// Frame sizes in bytes, Ethernet header included.
    #[arg(long, value_delimiter = ',', default_value = "64,4096")]
    sizes: Vec<usize>,
    /// Measured round trips per size (a warm-up of a tenth, at most 1000, runs first).
    #[arg(long, default_value_t = 20_000)]
    iters: u32,
    /// Frames per size in streaming mode.
    #[arg(long, default_value_t = 200_000)]
    frames: u64,
    /// Frames per flush in streaming mode.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Busy-poll budget before blocking, in microseconds.
    #[arg(long, default_value_t = 50)]
    spin_us: u64,
    /// MTU of the veth pair this tool creates.
    #[arg(long, default_value_t = 9000)]
    mtu: u32,
    /// Namespace of end A of an existing link (with --if-a, --ns-b, --if-b).
    #[arg(long, requires_all = ["if_a", "ns_b", "if_b"])]
    ns_a: Option<String>,
    /// Interface of end A of an existing link.
    #[arg(long)]
    if_a: Option<String>,
    /// Namespace of end B of an existing link.
    #[arg(long)]
    ns_b: Option<String>,
    /// Interface of end B of an existing link.
    #[arg(long)]
    if_b: Option<String>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = RawPingpongArgs::parse();

    let (_pair, a, b) = match (&args.ns_a, &args.if_a, &args.ns_b, &args.if_b) {
        (Some(ns_a), Some(if_a), Some(ns_b), Some(if_b)) => (
            None,
            BaselineEnd::in_netns(ns_a, if_a),
            BaselineEnd::in_netns(ns_b, if_b),
        ),
        _ => {
            let pair = VethPair::create("bench", args.mtu)?;
            let a = BaselineEnd::in_netns(&pair.ns_a, &pair.if_a);
            let b = BaselineEnd::in_netns(&pair.ns_b, &pair.if_b);
            (Some(pair), a, b)
        }
    };
    let policy = PollPolicy {
        spin: Duration::from_micros(args.spin_us),
        ..PollPolicy::default()
    };
    println!(
        "raw AF_PACKET over veth: A={a:?} B={b:?}, spin {} us",
        args.spin_us
    );

    if matches!(args.mode, MeasureMode::Pingpong | MeasureMode::Both) {
        println!(
            "{:>8} {:>8} {:>12} {:>12} {:>12} {:>12}",
            "bytes", "iters", "mean(us)", "median(us)", "p99(us)", "min(us)"
        );
        for &size in &args.sizes {
            let s = raw_pingpong(&a, &b, size, args.iters, policy)?;
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            println!(
                "{:>8} {:>8} {:>12.2} {:>12.2} {:>12.2} {:>12.2}",
                s.frame_len,
                s.iters,
                us(s.half_rtt_mean),
                us(s.half_rtt_median),
                us(s.half_rtt_p99),
                us(s.half_rtt_min)
            );
        }
    }
    if matches!(args.mode, MeasureMode::Stream | MeasureMode::Both) {
        println!(
            "{:>8} {:>10} {:>10} {:>8} {:>10} {:>10}",
            "bytes", "sent", "received", "drops", "Gbit/s", "Mframes/s"
        );
        for &size in &args.sizes {
            let s = raw_stream(&a, &b, size, args.frames, args.batch, policy)?;
            println!(
                "{:>8} {:>10} {:>10} {:>8} {:>10.2} {:>10.3}",
                s.frame_len,
                s.frames_sent,
                s.frames_received,
                s.rx_drops,
                s.gbit_per_s(),
                s.frames_per_s() / 1e6
            );
        }
    }
    Ok(())
}

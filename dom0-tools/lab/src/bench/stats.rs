//! Figures from raw measurements: quantiles of round trips, rates of streams, CPU time.

use serde::{Deserialize, Serialize};

/// What one measuring process reports to the bench driver (one JSON line on stdout).
///
/// A ping-pong client fills `round_trips_ns`; a stream receiver fills `messages`,
/// `bytes` and `elapsed_ns`; every agent fills `cpu_ns` with the user + system time it
/// spent in its measured phase (warm-up excluded).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentReport {
    /// Round-trip times of the measured iterations, in nanoseconds.
    #[serde(default)]
    pub round_trips_ns: Vec<u64>,
    /// Messages received in the measured phase.
    #[serde(default)]
    pub messages: u64,
    /// Payload bytes received in the measured phase.
    #[serde(default)]
    pub bytes: u64,
    /// Duration of the measured phase as the receiver saw it, in nanoseconds.
    #[serde(default)]
    pub elapsed_ns: u64,
    /// User + system CPU time of this process during the measured phase, in nanoseconds.
    #[serde(default)]
    pub cpu_ns: u64,
    /// CLOCK_MONOTONIC at the start of the measured phase, nanoseconds (0: not reported);
    /// one clock for every process of the machine, so concurrent streams can be lined up.
    #[serde(default)]
    pub start_ns: u64,
}

/// Half-round-trip latency of one ping-pong cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Measured round trips.
    pub iters: u64,
    /// Round trips run before measuring.
    pub warmup: u64,
    /// Median half round trip, microseconds.
    pub median_us: f64,
    /// 99th-percentile half round trip, microseconds.
    pub p99_us: f64,
    /// Fastest half round trip, microseconds.
    pub min_us: f64,
    /// Mean half round trip, microseconds.
    pub mean_us: f64,
}

impl Latency {
    /// Half-round-trip figures from round-trip samples; `None` without samples.
    pub fn from_round_trips(round_trips_ns: &[u64], warmup: u64) -> Option<Self> {
        if round_trips_ns.is_empty() {
            return None;
        }
        let mut sorted = round_trips_ns.to_vec();
        sorted.sort_unstable();
        let half_us = |ns: u64| ns as f64 / 2.0 / 1000.0;
        let sum: u128 = sorted.iter().map(|&n| u128::from(n)).sum();
        Some(Self {
            iters: sorted.len() as u64,
            warmup,
            median_us: half_us(quantile(&sorted, 0.5)),
            p99_us: half_us(quantile(&sorted, 0.99)),
            min_us: half_us(sorted[0]),
            mean_us: sum as f64 / sorted.len() as f64 / 2.0 / 1000.0,
        })
    }
}

/// The sample at quantile `q` (0..=1) of `sorted` by the nearest-rank method: the smallest
/// sample with at least `q` of the samples at or below it. `sorted` must not be empty.
pub fn quantile(sorted: &[u64], q: f64) -> u64 {
    let n = sorted.len();
    let rank = (q.clamp(0.0, 1.0) * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

/// Streaming bandwidth of one cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bandwidth {
    /// Messages received in the measured phase.
    pub messages: u64,
    /// Payload bytes received in the measured phase.
    pub bytes: u64,
    /// Seconds the measured phase took at the receiver.
    pub seconds: f64,
    /// Payload megabytes (10^6 bytes) per second.
    pub mb_per_s: f64,
    /// Messages per second.
    pub msgs_per_s: f64,
    /// CPU seconds (user + system) of sender and receiver together in the measured phase.
    pub cpu_s: f64,
    /// CPU seconds per gigabyte (10^9 bytes) moved; `null` when no byte moved.
    pub cpu_s_per_gb: Option<f64>,
    /// Every process of the setup over the whole cell (see [`super::cost`]); `null` where
    /// not sampled.
    #[serde(default)]
    pub cost: Option<super::cost::CpuCost>,
}

impl Bandwidth {
    /// Rates from what the receiver counted and the CPU time of both ends; `None` when the
    /// receiver measured no time.
    pub fn from_counts(messages: u64, bytes: u64, elapsed_ns: u64, cpu_ns: u64) -> Option<Self> {
        if elapsed_ns == 0 {
            return None;
        }
        let seconds = elapsed_ns as f64 / 1e9;
        let cpu_s = cpu_ns as f64 / 1e9;
        Some(Self {
            messages,
            bytes,
            seconds,
            mb_per_s: bytes as f64 / seconds / 1e6,
            msgs_per_s: messages as f64 / seconds,
            cpu_s,
            cpu_s_per_gb: (bytes > 0).then(|| cpu_s / (bytes as f64 / 1e9)),
            cost: None,
        })
    }
}

/// User + system CPU time of the calling process so far, in nanoseconds.
pub fn process_cpu_ns() -> u64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one `struct rusage` to the pointer, which points to a
    // properly sized and aligned (zeroed) value we own; RUSAGE_SELF is always valid.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return 0;
    }
    // SAFETY: getrusage succeeded, so the value is initialised (it was zeroed anyway).
    let usage = unsafe { usage.assume_init() };
    let ns = |tv: libc::timeval| tv.tv_sec as u64 * 1_000_000_000 + tv.tv_usec as u64 * 1000;
    ns(usage.ru_utime) + ns(usage.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let s: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&s, 0.5), 50);
        assert_eq!(quantile(&s, 0.99), 99);
        assert_eq!(quantile(&s, 1.0), 100);
        assert_eq!(quantile(&s, 0.0), 1);
        assert_eq!(quantile(&[7], 0.99), 7);
        assert_eq!(quantile(&[1, 2], 0.5), 1);
    }

    #[test]
    fn latency_halves_round_trips() {
        let rt = [4000, 2000, 6000, 2000];
        let l = Latency::from_round_trips(&rt, 3).unwrap();
        assert_eq!(l.iters, 4);
        assert_eq!(l.warmup, 3);
        assert_eq!(l.median_us, 1.0);
        assert_eq!(l.p99_us, 3.0);
        assert_eq!(l.min_us, 1.0);
        assert_eq!(l.mean_us, 1.75);
        assert_eq!(Latency::from_round_trips(&[], 0), None);
    }

    #[test]
    fn bandwidth_rates() {
        let b = Bandwidth::from_counts(1000, 2_000_000_000, 2_000_000_000, 500_000_000).unwrap();
        assert_eq!(b.seconds, 2.0);
        assert_eq!(b.mb_per_s, 1000.0);
        assert_eq!(b.msgs_per_s, 500.0);
        assert_eq!(b.cpu_s, 0.5);
        assert_eq!(b.cpu_s_per_gb, Some(0.25));
        let empty = Bandwidth::from_counts(10, 0, 1_000, 0).unwrap();
        assert_eq!(empty.cpu_s_per_gb, None);
        assert_eq!(empty.mb_per_s, 0.0);
        assert_eq!(Bandwidth::from_counts(1, 1, 0, 0), None);
    }

    #[test]
    fn cpu_time_advances() {
        let t0 = process_cpu_ns();
        let mut x = 0u64;
        while process_cpu_ns() == t0 {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(process_cpu_ns() > t0);
    }
}

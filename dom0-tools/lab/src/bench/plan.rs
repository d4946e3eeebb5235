//! What a run measures: message sizes and how many iterations each size gets.
//!
//! Counts are fixed by size (never by elapsed time), so two runs do the same work: small
//! messages get many iterations, large ones enough to move a fixed byte budget.

use std::fmt;

use super::BenchError;

/// Largest message size measured: 16 MiB.
pub const MAX_SIZE: u64 = 16 << 20;

/// Full runs or CI smoke runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Every size, enough iterations for stable medians.
    Full,
    /// A few sizes and few iterations: about a minute for all setups.
    Quick,
}

/// Iterations of one ping-pong or stream cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Unmeasured iterations first.
    pub warmup: u64,
    /// Measured iterations.
    pub iters: u64,
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} + {} warm-up", self.iters, self.warmup)
    }
}

/// 0 and every power of two from 1 B to 16 MiB.
pub fn all_sizes() -> Vec<u64> {
    std::iter::once(0)
        .chain((0..=24).map(|p| 1u64 << p))
        .collect()
}

/// The sizes of `--quick`.
pub fn quick_sizes() -> Vec<u64> {
    vec![0, 64, 4096, 65536, 1 << 20]
}

/// Parse a `--sizes` list: comma-separated byte counts, each optionally suffixed with
/// K, KiB, M or MiB (powers of 1024). Sizes are sorted and deduplicated.
pub fn parse_sizes(list: &str) -> Result<Vec<u64>, BenchError> {
    let mut sizes = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (digits, unit) = match item.find(|c: char| !c.is_ascii_digit()) {
            Some(i) => item.split_at(i),
            None => (item, ""),
        };
        let shift = match unit {
            "" | "B" => 0,
            "K" | "KiB" | "k" => 10,
            "M" | "MiB" => 20,
            _ => return Err(BenchError::BadSize(item.to_owned())),
        };
        let n: u64 = digits
            .parse()
            .map_err(|_| BenchError::BadSize(item.to_owned()))?;
        let size = n.checked_shl(shift).filter(|s| s >> shift == n);
        match size {
            Some(s) if s <= MAX_SIZE => sizes.push(s),
            _ => return Err(BenchError::BadSize(item.to_owned())),
        }
    }
    if sizes.is_empty() {
        return Err(BenchError::BadSize(list.to_owned()));
    }
    sizes.sort_unstable();
    sizes.dedup();
    Ok(sizes)
}

/// Round trips of a ping-pong of `size`-byte messages: all the small ones up to a cap, then
/// enough to move a fixed byte budget each way, never fewer than a floor.
pub fn pingpong_counts(size: u64, depth: Depth) -> Counts {
    let (budget, floor, cap) = match depth {
        Depth::Full => (64u64 << 20, 20, 10_000),
        Depth::Quick => (8u64 << 20, 10, 1_000),
    };
    let iters = (budget / size.max(1)).clamp(floor, cap);
    Counts {
        warmup: (iters / 10).clamp(2, 1_000),
        iters,
    }
}

/// Messages of a stream of `size`-byte messages, on the same principle.
pub fn stream_counts(size: u64, depth: Depth) -> Counts {
    let (budget, floor, cap) = match depth {
        Depth::Full => (256u64 << 20, 50, 200_000),
        Depth::Quick => (32u64 << 20, 10, 20_000),
    };
    let iters = (budget / size.max(1)).clamp(floor, cap);
    Counts {
        warmup: (iters / 10).clamp(2, 10_000),
        iters,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_power_of_two_to_16_mib() {
        let s = all_sizes();
        assert_eq!(s.len(), 26);
        assert_eq!(s[0], 0);
        assert_eq!(s[1], 1);
        assert_eq!(*s.last().unwrap(), MAX_SIZE);
        assert!(s.windows(2).skip(1).all(|w| w[1] == 2 * w[0]));
    }

    #[test]
    fn size_lists() {
        assert_eq!(parse_sizes("4096,0").unwrap(), vec![0, 4096]);
        assert_eq!(
            parse_sizes("1K, 2KiB,1M,16MiB,1M").unwrap(),
            vec![1024, 2048, 1 << 20, 16 << 20]
        );
        for bad in ["", "x", "17MiB", "4G", "-1", "1.5K", "99999999999999999999"] {
            assert!(
                matches!(parse_sizes(bad), Err(BenchError::BadSize(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn counts_scale_with_size() {
        let small = pingpong_counts(0, Depth::Full);
        assert_eq!(small.iters, 10_000);
        assert_eq!(small.warmup, 1_000);
        let big = pingpong_counts(MAX_SIZE, Depth::Full);
        assert_eq!(big.iters, 20);
        assert_eq!(big.warmup, 2);
        assert_eq!(pingpong_counts(1 << 20, Depth::Full).iters, 64);
        assert!(pingpong_counts(0, Depth::Quick).iters < small.iters);
        assert_eq!(stream_counts(MAX_SIZE, Depth::Full).iters, 50);
        assert_eq!(stream_counts(4096, Depth::Full).iters, 65_536);
        assert_eq!(stream_counts(1, Depth::Quick).iters, 20_000);
    }
}

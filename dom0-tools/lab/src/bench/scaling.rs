//! Setup `guest-scaling`: N guests per host, each streaming 256 KiB messages to its partner
//! on the other host (h0/gJ to h1/gJ), all at once; for N in 1, 2, 4, 8, 16 and 40.
//!
//! The N receivers start their measured phase together: each passes a start gate (two
//! FIFOs, see `mx_bench -g`) that the driver opens once all of them have arrived, so no
//! stream runs alone at the start. Aggregate throughput is every byte over the span from
//! the first start to the last end (one monotonic clock for all processes); fairness is
//! Jain's index over the per-guest rates. The programs block rather than spin
//! (`XMX_SPIN_US=0`): with 80 applications on a few cores, spinning only steals the cores
//! the others need.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde::{Deserialize, Serialize};

use super::agent::Test;
use super::cost::{self, CpuCost};
use super::guests::{BenchPair, GuestAt, GuestBed};
use super::plan::{Counts, Depth};
use super::runner::{self, CellReports};
use crate::interrupt;

/// Name of the setup, as `--setups` spells it.
pub const NAME: &str = "guest-scaling";
/// One line for readers.
pub const DESCRIPTION: &str =
    "N guests per host, each streaming 256 KiB messages to a partner on the other host, concurrently";
/// Message size of every stream.
pub const MESSAGE_SIZE: u64 = 256 << 10;
/// The ratio the reports show: aggregate throughput at this many guests per host ...
pub const RATIO_NUMERATOR: usize = 40;
/// ... over that at this many.
pub const RATIO_DENOMINATOR: usize = 8;

/// Guests per host measured.
pub fn guest_counts(depth: Depth) -> Vec<usize> {
    match depth {
        Depth::Full => vec![1, 2, 4, 8, 16, 40],
        Depth::Quick => vec![1, 2, 4],
    }
}

/// Messages each guest streams.
pub fn counts(depth: Depth) -> Counts {
    match depth {
        // 64 MiB a guest.
        Depth::Full => Counts {
            warmup: 4,
            iters: 256,
        },
        Depth::Quick => Counts {
            warmup: 2,
            iters: 32,
        },
    }
}

/// The figures of one guest count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScalingPoint {
    /// Guests per host (= concurrent streams).
    pub guests_per_host: usize,
    /// Every measured byte over the span from the first start to the last end, MB/s.
    pub aggregate_mb_per_s: Option<f64>,
    /// Each guest's rate over its own measured phase, MB/s, guest 0 first.
    pub per_guest_mb_per_s: Vec<f64>,
    /// Jain's fairness index over `per_guest_mb_per_s` (1: all equal).
    pub jain: Option<f64>,
    /// The span, seconds.
    pub seconds: Option<f64>,
    /// CPU of every process over the whole point.
    pub cost: Option<CpuCost>,
    /// What failed, if anything.
    pub error: Option<String>,
}

/// The `guest-scaling` section of the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScalingReport {
    /// `ok` or `n/a`.
    pub status: super::report::SetupStatus,
    /// Why it is n/a.
    pub reason: Option<String>,
    /// Message size, bytes.
    pub message_size: u64,
    /// Measured messages per guest (after `warmup` unmeasured ones).
    pub messages: u64,
    /// Unmeasured messages per guest.
    pub warmup: u64,
    /// One per guest count, ascending.
    pub points: Vec<ScalingPoint>,
    /// Aggregate throughput at 40 guests per host over that at 8 (`null` without both).
    pub ratio_40_vs_8: Option<f64>,
}

impl ScalingReport {
    /// A section for a setup that cannot run.
    pub fn not_available(reason: String, depth: Depth) -> ScalingReport {
        let c = counts(depth);
        ScalingReport {
            status: super::report::SetupStatus::NotAvailable,
            reason: Some(reason),
            message_size: MESSAGE_SIZE,
            messages: c.iters,
            warmup: c.warmup,
            points: vec![],
            ratio_40_vs_8: None,
        }
    }

    /// The point of `n` guests per host.
    pub fn point(&self, n: usize) -> Option<&ScalingPoint> {
        self.points.iter().find(|p| p.guests_per_host == n)
    }
}

/// Jain's fairness index of `rates`: (sum x)^2 / (n * sum x^2); `None` when empty or all 0.
pub fn jain(rates: &[f64]) -> Option<f64> {
    let sum: f64 = rates.iter().sum();
    let squares: f64 = rates.iter().map(|x| x * x).sum();
    (!rates.is_empty() && squares > 0.0).then(|| sum * sum / (rates.len() as f64 * squares))
}

/// Aggregate MB/s, per-stream MB/s and the span in seconds from the receivers' reports
/// `(start_ns, elapsed_ns, bytes)`; `None` if any stream has no time.
pub fn aggregate(streams: &[(u64, u64, u64)]) -> Option<(f64, Vec<f64>, f64)> {
    if streams.is_empty() || streams.iter().any(|&(s, e, _)| s == 0 || e == 0) {
        return None;
    }
    let first = streams.iter().map(|s| s.0).min()?;
    let last = streams.iter().map(|s| s.0.saturating_add(s.1)).max()?;
    let span = last.saturating_sub(first) as f64 / 1e9;
    let bytes: u64 = streams.iter().map(|s| s.2).sum();
    let rates = streams
        .iter()
        .map(|&(_, e, b)| b as f64 / (e as f64 / 1e9) / 1e6)
        .collect();
    (span > 0.0).then(|| (bytes as f64 / span / 1e6, rates, span))
}

/// The start gate: the FIFOs `arrive` and `gate` in a directory, both held open here.
struct Gate {
    arrive: File,
    gate: Option<File>,
}

impl Gate {
    fn new(dir: &Path) -> Result<Gate, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let open = |name: &str| -> Result<File, String> {
            let p = dir.join(name);
            let _ = std::fs::remove_file(&p);
            nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600))
                .map_err(|e| format!("mkfifo {}: {e}", p.display()))?;
            // Read and write: opening does not wait for a peer, and the FIFO has a writer
            // (this process) for as long as the file is open.
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&p)
                .map_err(|e| format!("opening {}: {e}", p.display()))
        };
        Ok(Gate {
            arrive: open("arrive")?,
            gate: Some(open("gate")?),
        })
    }

    /// Wait until `n` receivers arrived (or `done` says every pair ended, or the deadline),
    /// then open the gate. Returns how many arrived.
    fn open_after(
        &mut self,
        n: usize,
        done: &AtomicUsize,
        pairs: usize,
        deadline: Instant,
    ) -> usize {
        use std::io::Read;
        let mut arrived = 0;
        let mut buf = [0u8; 64];
        while arrived < n && done.load(Ordering::Acquire) < pairs && interrupt::check().is_ok() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            // A bounded slice, so pairs that ended without arriving are noticed.
            let slice = left.min(Duration::from_millis(250));
            let mut fds = [PollFd::new(self.arrive.as_fd(), PollFlags::POLLIN)];
            let ms = u16::try_from(slice.as_millis()).unwrap_or(u16::MAX);
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(0) => continue,
                Ok(_) => match self.arrive.read(&mut buf) {
                    Ok(k) => arrived += k,
                    Err(_) => break,
                },
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => break,
            }
        }
        // Closing the only writer is end-of-file for every receiver waiting at the gate.
        self.gate.take();
        arrived
    }
}

/// Measure `n` guests per host.
pub fn measure_point(
    bed: &GuestBed,
    xmx: &Path,
    scratch: &Path,
    n: usize,
    c: Counts,
    timeout: Duration,
    progress: &mut dyn FnMut(&str),
) -> ScalingPoint {
    let mut point = ScalingPoint {
        guests_per_host: n,
        aggregate_mb_per_s: None,
        per_guest_mb_per_s: vec![],
        jain: None,
        seconds: None,
        cost: None,
        error: None,
    };
    if bed.guests_per_host() < n {
        point.error = Some(format!(
            "the cluster has {} guests per host",
            bed.guests_per_host()
        ));
        return point;
    }
    let gate_dir = scratch.join(format!("gate-{n}"));
    let mut gate = match Gate::new(&gate_dir) {
        Ok(g) => g,
        Err(e) => {
            point.error = Some(e);
            return point;
        }
    };
    let extra = vec![("XMX_SPIN_US".to_owned(), "0".to_owned())];
    let server_extra = vec!["-g".to_owned(), gate_dir.display().to_string()];
    let mut cells = Vec::with_capacity(n);
    for j in 0..n {
        let pair = BenchPair {
            server: GuestAt::new(1, j),
            client: GuestAt::new(0, j),
        };
        match bed.programs.cell_with(
            &bed.state,
            &pair,
            Test::Stream,
            MESSAGE_SIZE,
            c,
            &extra,
            &server_extra,
        ) {
            Ok(cell) => cells.push(cell),
            Err(e) => {
                point.error = Some(format!("h0/g{j}: {e}"));
                return point;
            }
        }
    }
    let involved: Vec<GuestAt> = (0..n)
        .flat_map(|j| [GuestAt::new(0, j), GuestAt::new(1, j)])
        .collect();
    let daemons = bed.daemons(&involved);
    let before = cost::snapshot(&daemons);
    let done = AtomicUsize::new(0);
    let deadline = Instant::now() + timeout;
    progress(&format!(
        "{NAME} {n} guest(s) per host: {n} streams of {} x 256 KiB",
        c.iters
    ));
    let results: Vec<Result<CellReports, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = cells
            .into_iter()
            .map(|cell| {
                let done = &done;
                s.spawn(move || {
                    let r = runner::run_cell(xmx, cell, timeout, &mut |_| {});
                    done.fetch_add(1, Ordering::Release);
                    r
                })
            })
            .collect();
        let arrived = gate.open_after(n, &done, n, deadline);
        progress(&format!(
            "{NAME} {n} guest(s) per host: {arrived}/{n} receivers at the start gate, started"
        ));
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("measuring thread panicked".into()))
            })
            .collect()
    });
    drop(gate);
    let _ = std::fs::remove_dir_all(&gate_dir);
    let after = cost::snapshot(&daemons);
    let mut streams = Vec::with_capacity(n);
    let mut errors = Vec::new();
    for (j, r) in results.into_iter().enumerate() {
        match r {
            Ok(r) => streams.push((r.server.start_ns, r.server.elapsed_ns, r.server.bytes)),
            Err(e) => errors.push(format!("h0/g{j} -> h1/g{j}: {e}")),
        }
    }
    if !errors.is_empty() {
        point.error = Some(errors.join("; "));
        return point;
    }
    match aggregate(&streams) {
        Some((agg, rates, span)) => {
            point.aggregate_mb_per_s = Some(agg);
            point.jain = jain(&rates);
            point.per_guest_mb_per_s = rates;
            point.seconds = Some(span);
        }
        None => point.error = Some("a receiver reported no start or no time".into()),
    }
    let moved = n as u64 * (c.warmup + c.iters) * MESSAGE_SIZE;
    point.cost = Some(CpuCost::between(before, after, moved));
    point
}

/// Every guest count of `depth`.
pub fn run(
    bed: &GuestBed,
    xmx: &Path,
    scratch: &Path,
    depth: Depth,
    timeout: Duration,
    progress: &mut dyn FnMut(&str),
) -> Result<ScalingReport, interrupt::Interrupted> {
    let c = counts(depth);
    let mut points = Vec::new();
    for n in guest_counts(depth) {
        interrupt::check()?;
        let p = measure_point(bed, xmx, scratch, n, c, timeout, progress);
        progress(&match (&p.error, p.aggregate_mb_per_s, p.jain) {
            (Some(e), _, _) => format!("{NAME} {n} guest(s) per host: error: {e}"),
            (None, Some(a), Some(j)) => {
                format!("{NAME} {n} guest(s) per host: {a:.1} MB/s aggregate, Jain {j:.3}")
            }
            _ => format!("{NAME} {n} guest(s) per host: -"),
        });
        points.push(p);
    }
    let agg = |n: usize| {
        points
            .iter()
            .find(|p| p.guests_per_host == n)
            .and_then(|p| p.aggregate_mb_per_s)
    };
    let ratio_40_vs_8 = match (agg(RATIO_NUMERATOR), agg(RATIO_DENOMINATOR)) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    Ok(ScalingReport {
        status: super::report::SetupStatus::Ok,
        reason: None,
        message_size: MESSAGE_SIZE,
        messages: c.iters,
        warmup: c.warmup,
        points,
        ratio_40_vs_8,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_index() {
        assert_eq!(jain(&[10.0, 10.0, 10.0]), Some(1.0));
        assert_eq!(jain(&[10.0, 0.0]), Some(0.5));
        let j = jain(&[1.0, 2.0, 3.0, 4.0]).unwrap();
        assert!((j - 100.0 / 120.0).abs() < 1e-12, "{j}");
        assert_eq!(jain(&[]), None);
        assert_eq!(jain(&[0.0, 0.0]), None);
    }

    #[test]
    fn aggregate_spans_first_start_to_last_end() {
        // Two streams of 100 MB, one second each, the second starting half a second later:
        // 200 MB over 1.5 s.
        let s = [
            (1_000_000_000, 1_000_000_000, 100_000_000),
            (1_500_000_000, 1_000_000_000, 100_000_000),
        ];
        let (agg, rates, span) = aggregate(&s).unwrap();
        assert_eq!(span, 1.5);
        assert!((agg - 200.0 / 1.5).abs() < 1e-9, "{agg}");
        assert_eq!(rates, [100.0, 100.0]);
        assert_eq!(aggregate(&[]), None);
        assert_eq!(aggregate(&[(0, 5, 5)]), None);
        assert_eq!(aggregate(&[(5, 0, 5)]), None);
    }

    #[test]
    fn counts_and_the_ratio_points() {
        let full = guest_counts(Depth::Full);
        assert_eq!(full, [1, 2, 4, 8, 16, 40]);
        assert!(full.contains(&RATIO_NUMERATOR) && full.contains(&RATIO_DENOMINATOR));
        assert!(guest_counts(Depth::Quick).len() < full.len());
        assert_eq!(counts(Depth::Full).iters * MESSAGE_SIZE, 64 << 20);
    }

    #[test]
    fn the_gate_opens_after_every_arrival() {
        use std::io::{Read, Write};
        let dir = tempfile::tempdir().unwrap();
        let mut gate = Gate::new(dir.path()).unwrap();
        let waiter = |d: std::path::PathBuf| {
            std::thread::spawn(move || {
                let mut g = File::open(d.join("gate")).unwrap();
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(d.join("arrive"))
                    .unwrap()
                    .write_all(&[1])
                    .unwrap();
                let mut buf = Vec::new();
                g.read_to_end(&mut buf).unwrap();
                buf.len()
            })
        };
        let a = waiter(dir.path().to_path_buf());
        let b = waiter(dir.path().to_path_buf());
        let done = AtomicUsize::new(0);
        let arrived = gate.open_after(2, &done, 2, Instant::now() + Duration::from_secs(30));
        assert_eq!(arrived, 2);
        assert_eq!(a.join().unwrap(), 0);
        assert_eq!(b.join().unwrap(), 0);
    }
}

//! Steps 3 and 5: MX ping-pongs and streams between guests, and TCP between the same two
//! hosts, measured with `xmx bench`'s machinery so the figures mean what the bench's do.
//!
//! A guest cell runs the bench's MX program (`mx_bench.c`, built the way the native setup
//! builds it) as an application of each guest: `xmx bench-agent --transport exec` enters
//! the host's namespace and executes it with the guest's environment (its frontd socket,
//! `XMX_TRANSPORT=xen`), exactly what `xmx sim run` does. The TCP cells are the bench's
//! `tcp` setup on hosts h0 and h1 of the demo cluster: the veth the guests' frames cross.
//! Iteration counts follow the bench's rule (a byte budget per size, between a floor and a
//! cap) with smaller budgets, so the whole tour stays within two minutes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use super::layout::Pair;
use crate::bench::agent::Test;
pub use crate::bench::guests::GuestPrograms;
use crate::bench::guests::{GuestAt, GuestPair};
use crate::bench::link::BenchLink;
use crate::bench::plan::Counts;
use crate::bench::report::Cell;
use crate::bench::runner::{self, CellAgents};
use crate::bench::setups::{self, Env, Setup};
use crate::bench::stats::{Bandwidth, Latency};
use crate::bench::table::size_label;
use crate::interrupt;

/// Longest time one measurement (two processes) may take.
pub const CELL_TIMEOUT: Duration = Duration::from_secs(30);

/// Ping-pong round trips for `size`-byte messages: 4 MiB each way, 10 to 500 of them.
pub fn pingpong_counts(size: u64) -> Counts {
    let iters = ((4u64 << 20) / size.max(1)).clamp(10, 500);
    Counts {
        warmup: (iters / 10).clamp(2, 50),
        iters,
    }
}

/// Stream messages of `size` bytes: 32 MiB, 10 to 8000 of them. A stream of 8 MiB
/// showed guests at 64 KiB at 450 MB/s where `xmx bench` measures 1100-1250: too short to
/// leave its start (windows registered, pulls filling) behind.
pub fn stream_counts(size: u64) -> Counts {
    let iters = ((32u64 << 20) / size.max(1)).clamp(10, 8000);
    Counts {
        warmup: (iters / 10).clamp(2, 800),
        iters,
    }
}

/// How one cell is started.
pub type MakeAgents<'a> = dyn Fn(Test, u64, Counts) -> Result<CellAgents, String> + 'a;

impl GuestPair for Pair {
    fn server(&self) -> GuestAt {
        GuestAt::new(self.server.host, self.server.guest)
    }
    fn client(&self) -> GuestAt {
        GuestAt::new(self.client.host, self.client.guest)
    }
}

/// Ping-pong then stream of `size`-byte messages: one [`Cell`] of the figures. `progress`
/// gets the live line (setup, test, size, iteration).
pub fn measure(
    xmx: &Path,
    setup: &str,
    size: u64,
    make: &MakeAgents<'_>,
    progress: &mut dyn FnMut(&str),
) -> Cell {
    let mut cell = Cell {
        size,
        pingpong: None,
        stream: None,
        error: None,
    };
    let mut errors = Vec::new();
    for test in [Test::Pingpong, Test::Stream] {
        if interrupt::check().is_err() {
            errors.push("interrupted".to_owned());
            break;
        }
        let counts = match test {
            Test::Pingpong => pingpong_counts(size),
            Test::Stream => stream_counts(size),
        };
        let label = format!("{setup} {} {}", test.as_str(), size_label(size));
        // The programs count warm-up iterations in a ping-pong's progress, not in a stream's.
        let total = match test {
            Test::Pingpong => counts.warmup + counts.iters,
            Test::Stream => counts.iters,
        };
        progress(&format!("{label}: iteration 0/{total}"));
        let reports = make(test, size, counts).and_then(|agents| {
            runner::run_cell(xmx, agents, CELL_TIMEOUT, &mut |p| {
                progress(&format!("{label}: iteration {p}"))
            })
        });
        match (test, reports) {
            (Test::Pingpong, Ok(r)) => {
                match Latency::from_round_trips(&r.client.round_trips_ns, counts.warmup) {
                    Some(l) => cell.pingpong = Some(l),
                    None => errors.push("ping-pong: no round trip measured".to_owned()),
                }
            }
            (Test::Stream, Ok(r)) => {
                let cpu = r.server.cpu_ns.saturating_add(r.client.cpu_ns);
                match Bandwidth::from_counts(
                    r.server.messages,
                    r.server.bytes,
                    r.server.elapsed_ns,
                    cpu,
                ) {
                    Some(b) => cell.stream = Some(b),
                    None => errors.push("stream: the receiver measured no time".to_owned()),
                }
            }
            (_, Err(e)) => {
                errors.push(format!("{}: {e}", test.as_str()));
                // The stream would fail the same way; do not wait for it too.
                break;
            }
        }
    }
    if !errors.is_empty() {
        cell.error = Some(errors.join("; "));
    }
    cell
}

/// The bench's `tcp` setup between hosts h0 and h1 of the simulated cluster `sim_name`.
pub struct TcpBaseline {
    link: BenchLink,
    setup: Box<dyn Setup>,
    scratch: PathBuf,
    xmx: PathBuf,
}

impl TcpBaseline {
    /// Ready the setup; `scratch` is a directory for its files.
    pub fn new(sim_name: &str, xmx: &Path, scratch: &Path) -> Result<TcpBaseline> {
        let link = BenchLink::sim_cluster(sim_name).map_err(anyhow::Error::msg)?;
        let mut setup = setups::select(&["tcp".to_owned()])?
            .pop()
            .context("the bench has no tcp setup")?;
        let env = Env {
            link: Ok(&link),
            xmx,
            scratch,
            spin_us: 0,
            guests: Err("the demo's guests are measured by the traffic step"),
        };
        setup
            .prepare(&env)
            .map_err(|e| anyhow::anyhow!("tcp baseline: {e}"))?;
        Ok(TcpBaseline {
            link,
            setup,
            scratch: scratch.to_path_buf(),
            xmx: xmx.to_path_buf(),
        })
    }

    fn env(&self) -> Env<'_> {
        Env {
            link: Ok(&self.link),
            xmx: &self.xmx,
            scratch: &self.scratch,
            spin_us: 0,
            guests: Err("the demo's guests are measured by the traffic step"),
        }
    }

    /// The two processes of one cell.
    pub fn cell(&self, test: Test, size: u64, counts: Counts) -> Result<CellAgents, String> {
        self.setup.cell(&self.env(), test, size, counts)
    }

    /// The setup's name in the figures.
    pub fn name(&self) -> &'static str {
        self.setup.name()
    }

    /// Its description.
    pub fn description(&self) -> &'static str {
        self.setup.description()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_move_a_budget_within_bounds() {
        assert_eq!(
            pingpong_counts(0),
            Counts {
                warmup: 50,
                iters: 500
            }
        );
        assert_eq!(
            pingpong_counts(64 << 10),
            Counts {
                warmup: 6,
                iters: 64
            }
        );
        assert_eq!(
            pingpong_counts(1 << 20),
            Counts {
                warmup: 2,
                iters: 10
            }
        );
        assert_eq!(
            stream_counts(4096),
            Counts {
                warmup: 800,
                iters: 8000
            }
        );
        assert_eq!(
            stream_counts(1 << 20),
            Counts {
                warmup: 3,
                iters: 32
            }
        );
    }
}

//! `xmx bench`: latency and bandwidth by message size for every setup, baselines included,
//! in one run, on one link, with the same counts, so the figures can be compared.
//!
//! For each setup (see [`setups::registry`]) and each message size the driver starts two
//! processes (`xmx bench-agent`, see [`agent`]): a server in namespace B and a client in
//! namespace A, joined by a veth pair made for the run (or hosts h0/h1 of a simulated
//! cluster with `--cluster`). Each cell runs a ping-pong (half round trip: median, p99)
//! and a one-way stream (MB/s, and the CPU seconds both processes spent per GB moved,
//! from their own getrusage over the measured phase). Iteration counts depend on the size
//! only ([`plan`]), warm-up iterations are not measured. A setup that cannot run here is
//! reported "n/a" with the reason; a figure is never made up.
//!
//! # JSON (`--json`, and `bench.json` in the output directory)
//!
//! ```text
//! {
//!   "schema": "xmx-bench/1",
//!   "date": "2026-01-31T12:00:00Z",          // start of the run, UTC
//!   "command": "xmx bench --quick",
//!   "quick": true,
//!   "machine": { "nproc": 2, "cpu_model": "...", "kernel": "6.1.0" },
//!   "link": { "kind": "veth", "mtu": 9000 } | null,
//!   "sizes": [0, 4096],                      // bytes, ascending
//!   "setups": [ {
//!       "name": "shm", "description": "...",
//!       "status": "ok" | "n/a", "reason": null | "why it is n/a",
//!       "cells": [ {                         // one per size when "ok", none when "n/a"
//!           "size": 4096,
//!           "pingpong": { "iters": 1000, "warmup": 100, "median_us": 2.1,
//!                         "p99_us": 5.0, "min_us": 1.8, "mean_us": 2.3 } | null,
//!           "stream": { "messages": 8192, "bytes": 33554432, "seconds": 0.01,
//!                       "mb_per_s": 3355.4, "msgs_per_s": 819200.0, "cpu_s": 0.02,
//!                       "cpu_s_per_gb": 0.6 | null } | null,   // null: 0 bytes moved
//!           "error": null | "what failed" } ] } ],
//!   "ratios": [ {
//!       "name": "native/afpacket", "numerator": "native", "denominator": "afpacket",
//!       "cells": [ { "size": 4096, "latency": 1.4 | null, "bandwidth": 0.7 | null } ] } ]
//! }
//! ```
//!
//! Latencies are microseconds, bandwidths megabytes (10^6 B) per second of payload.
//! Ratio `latency` divides the medians, `bandwidth` the MB/s; `null` where either side
//! has no figure. Fields are only ever added within one schema version.
//!
//! # Outputs
//!
//! The table on stdout (or the JSON with `--json`), progress on stderr, and in `--out`
//! (default `target/bench/`): bench.json, bench.txt, latency.png/svg, bandwidth.png/svg.

pub mod afpacket;
pub mod agent;
pub mod exchange;
pub mod link;
pub mod native;
pub mod plan;
pub mod plot;
pub mod report;
pub mod runner;
pub mod setups;
pub mod shm;
pub mod stats;
pub mod table;
pub mod tcp;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;

use agent::Test;
use link::Link;
use plan::Depth;
use report::{Cell, LinkInfo, Machine, Report, SetupResult, Status};
use setups::Env;
use stats::{Bandwidth, Latency};

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// `--setups` named a setup the registry does not have.
    #[error("unknown setup {name:?} (known setups: {known})")]
    UnknownSetup {
        /// The name given.
        name: String,
        /// Every registered name.
        known: String,
    },
    /// `--sizes` held something that is not a size up to 16 MiB.
    #[error("invalid message size {0:?}: expected bytes (optionally with K, KiB, M or MiB), at most 16 MiB")]
    BadSize(String),
    /// The scratch directory could not be made.
    #[error("scratch directory: {0}")]
    Scratch(#[source] std::io::Error),
    /// A signal stopped the run; what it built was removed on the way out.
    #[error(transparent)]
    Interrupted(#[from] crate::interrupt::Interrupted),
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Setup names; empty: all.
    pub setups: Vec<String>,
    /// Message sizes; `None`: those of `depth`.
    pub sizes: Option<Vec<u64>>,
    /// Full or quick.
    pub depth: Depth,
    /// Use this simulated cluster instead of a fresh veth pair.
    pub cluster: Option<String>,
    /// The `xmx` binary, which agents are started from.
    pub xmx: PathBuf,
    /// The command line, for the report.
    pub command: String,
    /// Longest time one measurement (two processes) may take.
    pub cell_timeout: Duration,
    /// Microseconds a polling waiter (shm, afpacket) spins before it blocks.
    pub spin_us: u64,
}

/// A directory removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn measure(
    env: &Env<'_>,
    setup: &dyn setups::Setup,
    test: Test,
    size: u64,
    opts: &Options,
    progress: &mut dyn FnMut(&str),
) -> Result<runner::CellReports, String> {
    crate::interrupt::check().map_err(|i| i.to_string())?;
    let counts = match test {
        Test::Pingpong => plan::pingpong_counts(size, opts.depth),
        Test::Stream => plan::stream_counts(size, opts.depth),
    };
    let label = format!(
        "{} {} {}",
        setup.name(),
        test.as_str(),
        table::size_label(size)
    );
    progress(&format!("{label}: {counts} iterations"));
    let agents = setup.cell(env, test, size, counts)?;
    let mut on_progress = |p: &str| progress(&format!("{label}: iteration {p}"));
    runner::run_cell(env.xmx, agents, opts.cell_timeout, &mut on_progress)
}

fn run_cell(
    env: &Env<'_>,
    setup: &dyn setups::Setup,
    size: u64,
    opts: &Options,
    progress: &mut dyn FnMut(&str),
) -> Cell {
    let mut errors = Vec::new();
    let pingpong = match measure(env, setup, Test::Pingpong, size, opts, progress) {
        Ok(r) => Latency::from_round_trips(
            &r.client.round_trips_ns,
            plan::pingpong_counts(size, opts.depth).warmup,
        )
        .or_else(|| {
            errors.push("ping-pong: no round trip measured".to_owned());
            None
        }),
        Err(e) => {
            errors.push(format!("ping-pong: {e}"));
            None
        }
    };
    let stream = match measure(env, setup, Test::Stream, size, opts, progress) {
        Ok(r) => {
            let cpu = r.server.cpu_ns.saturating_add(r.client.cpu_ns);
            Bandwidth::from_counts(r.server.messages, r.server.bytes, r.server.elapsed_ns, cpu)
                .or_else(|| {
                    errors.push("stream: the receiver measured no time".to_owned());
                    None
                })
        }
        Err(e) => {
            errors.push(format!("stream: {e}"));
            None
        }
    };
    let summary = format!(
        "{} {}: {} median, {}",
        setup.name(),
        table::size_label(size),
        pingpong
            .as_ref()
            .map_or("-".into(), |l| format!("{:.2} us", l.median_us)),
        stream
            .as_ref()
            .map_or("-".into(), |b| format!("{:.1} MB/s", b.mb_per_s)),
    );
    progress(&summary);
    for e in &errors {
        progress(&format!(
            "{} {}: error: {e}",
            setup.name(),
            table::size_label(size)
        ));
    }
    Cell {
        size,
        pingpong,
        stream,
        error: (!errors.is_empty()).then(|| errors.join("; ")),
    }
}

/// Run every requested setup at every size. `progress` receives one line per step.
pub fn run(opts: &Options, progress: &mut dyn FnMut(&str)) -> Result<Report, BenchError> {
    let date = rfc3339_now();
    let mut chosen = setups::select(&opts.setups)?;
    let sizes = opts.sizes.clone().unwrap_or_else(|| match opts.depth {
        Depth::Full => plan::all_sizes(),
        Depth::Quick => plan::quick_sizes(),
    });
    let scratch = Scratch(std::env::temp_dir().join(format!("xmx-bench-{}", std::process::id())));
    std::fs::create_dir_all(&scratch.0).map_err(BenchError::Scratch)?;

    let link = if chosen.iter().any(|s| s.name() != "shm") {
        progress(&match &opts.cluster {
            Some(c) => format!("link: hosts h0 and h1 of simulated cluster {c}"),
            None => format!("link: veth pair across two namespaces, MTU {}", link::MTU),
        });
        match &opts.cluster {
            Some(c) => Link::sim_cluster(c),
            None => Link::veth(),
        }
    } else {
        Err("no network setup requested".to_owned())
    };
    if let Err(e) = &link {
        progress(&format!("link: none: {e}"));
    }
    let env = Env {
        link: link.as_ref().map_err(String::as_str),
        xmx: &opts.xmx,
        scratch: &scratch.0,
        spin_us: opts.spin_us,
    };

    let mut results = Vec::new();
    for setup in chosen.iter_mut() {
        crate::interrupt::check()?;
        let prepared = setup.prepare(&env);
        let mut result = SetupResult {
            name: setup.name().to_owned(),
            description: setup.description().to_owned(),
            status: Status::Ok,
            reason: None,
            cells: Vec::new(),
        };
        match prepared {
            Err(reason) => {
                progress(&format!("{}: n/a ({reason})", setup.name()));
                result.status = Status::NotAvailable;
                result.reason = Some(reason);
            }
            Ok(()) => {
                // After a measurement ran out of time, larger sizes of the same setup would
                // most likely too: they are skipped rather than waited for.
                let mut timed_out: Option<u64> = None;
                for &size in &sizes {
                    crate::interrupt::check()?;
                    if let Some(at) = timed_out {
                        let why = format!("skipped: {} ran out of time", table::size_label(at));
                        progress(&format!(
                            "{} {}: {why}",
                            setup.name(),
                            table::size_label(size)
                        ));
                        result.cells.push(Cell {
                            size,
                            pingpong: None,
                            stream: None,
                            error: Some(why),
                        });
                        continue;
                    }
                    let cell = run_cell(&env, setup.as_ref(), size, opts, progress);
                    if cell
                        .error
                        .as_deref()
                        .is_some_and(|e| e.contains(runner::TIMED_OUT))
                    {
                        timed_out = Some(size);
                    }
                    result.cells.push(cell);
                }
            }
        }
        results.push(result);
    }
    let pairs: Vec<(String, String)> = chosen
        .iter()
        .flat_map(|s| {
            s.compare_with()
                .iter()
                .map(move |d| (s.name().to_owned(), (*d).to_owned()))
        })
        .collect();
    let ratios = report::ratios(&sizes, &results, &pairs);
    crate::interrupt::check()?;
    Ok(Report {
        schema: report::SCHEMA.to_owned(),
        date,
        command: opts.command.clone(),
        quick: opts.depth == Depth::Quick,
        machine: Machine::this(),
        link: link.as_ref().ok().map(|l| LinkInfo {
            kind: l.kind.clone(),
            mtu: l.mtu,
        }),
        sizes,
        setups: results,
        ratios,
    })
}

fn rfc3339_now() -> String {
    report::rfc3339(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    )
}

/// Arguments of `xmx bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Smoke-test subset: sizes 0, 64 B, 4 KiB, 64 KiB, 1 MiB and few iterations.
    #[arg(long)]
    pub quick: bool,
    /// Print the report as JSON (schema xmx-bench/1) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Message sizes, comma-separated, K/M suffixes allowed [default: 0 and every power
    /// of two from 1 B to 16 MiB].
    #[arg(long, value_name = "LIST")]
    pub sizes: Option<String>,
    /// Setups, comma-separated [default: all]: shm, afpacket, tcp, native, guest-remote,
    /// guest-local, guest-nocache, guest-x4.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub setups: Vec<String>,
    /// Directory for bench.json, bench.txt and the plots.
    #[arg(long, value_name = "DIR", default_value = "target/bench")]
    pub out: PathBuf,
    /// Measure between hosts h0 and h1 of this simulated cluster (`xmx sim up`) instead of
    /// a veth pair made for the run.
    #[arg(long, value_name = "NAME")]
    pub cluster: Option<String>,
    /// Microseconds a waiting process polls before it blocks, in every polling setup (shm,
    /// afpacket, and xmx through XMX_SPIN_US, whose default this is). Spinning pays only
    /// while every waiter owns a core.
    #[arg(long, value_name = "US", default_value_t = 20)]
    pub spin_us: u64,
}

/// `xmx bench`: run, print, write the files. Exits non-zero when a cell failed.
pub fn main(args: BenchArgs) -> anyhow::Result<i32> {
    let sizes = args.sizes.as_deref().map(plan::parse_sizes).transpose()?;
    let opts = Options {
        setups: args
            .setups
            .iter()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect(),
        sizes,
        depth: if args.quick {
            Depth::Quick
        } else {
            Depth::Full
        },
        cluster: args.cluster,
        xmx: std::env::current_exe().context("locating the xmx binary")?,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        cell_timeout: Duration::from_secs(if args.quick { 60 } else { 120 }),
        spin_us: args.spin_us,
    };
    // A Ctrl-C stops the run between cells, which removes its namespaces and files.
    crate::interrupt::install().map_err(anyhow::Error::msg)?;
    let report = match run(&opts, &mut |line| eprintln!("bench: {line}")) {
        Err(BenchError::Interrupted(i)) => {
            eprintln!("bench: {i}; the run's namespaces and files are removed");
            return Ok(i.exit_code());
        }
        r => r?,
    };
    let text = table::render(&report);
    write_outputs(&report, &text, &args.out)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{text}");
    }
    let failed = report
        .setups
        .iter()
        .flat_map(|s| &s.cells)
        .filter(|c| c.error.is_some())
        .count();
    if failed > 0 {
        eprintln!("bench: {failed} cell(s) failed; see the table");
        return Ok(1);
    }
    Ok(0)
}

fn write_outputs(report: &Report, text: &str, out: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    std::fs::write(
        out.join("bench.json"),
        serde_json::to_string_pretty(report)? + "\n",
    )?;
    std::fs::write(out.join("bench.txt"), text)?;
    match plot::write_plots(report, out) {
        Ok(files) => {
            for f in files.files {
                eprintln!("bench: wrote {}", f.display());
            }
        }
        Err(e) => anyhow::bail!("plots: {e}"),
    }
    eprintln!(
        "bench: wrote {} and {}",
        out.join("bench.json").display(),
        out.join("bench.txt").display()
    );
    Ok(())
}

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
//! The guest setups (`guest-remote`, `guest-local`, `guest-nocache`, `guest-scaling`) run
//! MX programs as applications of guests of a simulated cluster of two hosts
//! ([`guests`]): one this run makes (`b<pid>`, removed at the end and on Ctrl-C), or the
//! one `--cluster` names. The baselines keep their veth pair, whose link carries nothing
//! else (the cluster's NICs carry its daemons' frames). Every stream cell also samples the
//! CPU of every process the setup needs over the whole cell ([`cost`]): programs, and for
//! guests the backends and frontends.
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
//!                       "cpu_s_per_gb": 0.6 | null,            // null: 0 bytes moved
//!                       "cost": COST | null } | null,
//!           "error": null | "what failed" } ] } ],
//!   "ratios": [ {
//!       "name": "native/afpacket", "numerator": "native", "denominator": "afpacket",
//!       "cells": [ { "size": 4096, "latency": 1.4 | null, "bandwidth": 0.7 | null } ] } ],
//!   "guests": { "kind": "sim:b4242", "guests_per_host": 4, "made_for_run": true } | null,
//!   "scaling": { "status": "ok" | "n/a", "reason": null | "...", "message_size": 262144,
//!       "messages": 32, "warmup": 2,
//!       "points": [ { "guests_per_host": 4, "aggregate_mb_per_s": 900.0 | null,
//!                     "per_guest_mb_per_s": [230.1, ...], "jain": 0.99 | null,
//!                     "seconds": 0.3 | null, "cost": COST | null,
//!                     "error": null | "..." } ],
//!       "ratio_40_vs_8": 0.93 | null } | null
//! }
//! COST: { "bytes": 36700160, "apps_s": 0.1, "backends_s": 0.05, "frontends_s": 0.01,
//!         "other_s": 0.0, "cpu_s_per_gb": 4.4 | null }   // whole cell, warm-up included
//! ```
//!
//! Latencies are microseconds, bandwidths megabytes (10^6 B) per second of payload.
//! Ratio `latency` divides the medians, `bandwidth` the MB/s; `null` where either side
//! has no figure. Fields are only ever added within one schema version.
//!
//! # Outputs
//!
//! The table on stdout (or the JSON with `--json`), progress on stderr, and in `--out`
//! (default `target/bench/`): bench.json, bench.txt, latency.png/svg, bandwidth.png/svg,
//! and scaling.png/svg when `guest-scaling` ran.

pub mod afpacket;
pub mod agent;
pub mod cost;
pub mod exchange;
pub mod guests;
pub mod link;
pub mod native;
pub mod plan;
pub mod plot;
pub mod report;
pub mod runner;
pub mod scaling;
pub mod setups;
pub mod shm;
pub mod stats;
pub mod table;
pub mod tcp;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;

use agent::Test;
use cost::CpuCost;
use guests::GuestBed;
use link::BenchLink;
use plan::Depth;
use report::{BenchReport, Cell, GuestsInfo, LinkInfo, Machine, Report, SetupResult, SetupStatus};
use scaling::ScalingReport;
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
    /// Use this simulated cluster instead of a fresh veth pair, and for the guests.
    pub cluster: Option<String>,
    /// The `xmx` binary, which agents are started from.
    pub xmx: PathBuf,
    /// Where the daemons of a cluster made for the run are (xmx-simhv, ...).
    pub bin_dir: PathBuf,
    /// The command line, for the report.
    pub command: String,
    /// Longest time one measurement (two processes) may take.
    pub cell_timeout: Duration,
    /// Microseconds a polling waiter (shm, afpacket) spins before it blocks.
    pub spin_us: u64,
}

/// A directory removed when dropped.
struct BenchScratchDir(PathBuf);

impl Drop for BenchScratchDir {
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
) -> Result<(runner::CellReports, CpuCost), String> {
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
    let daemons = setup.daemons(env);
    let before = cost::snapshot(&daemons);
    let reports = runner::run_cell(env.xmx, agents, opts.cell_timeout, &mut on_progress)?;
    let after = cost::snapshot(&daemons);
    let moved = (counts.warmup + counts.iters).saturating_mul(size);
    Ok((reports, CpuCost::between(before, after, moved)))
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
        Ok((r, _)) => Latency::from_round_trips(
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
        Ok((r, cost)) => {
            let cpu = r.server.cpu_ns.saturating_add(r.client.cpu_ns);
            Bandwidth::from_counts(r.server.messages, r.server.bytes, r.server.elapsed_ns, cpu)
                .map(|b| Bandwidth {
                    cost: Some(cost),
                    ..b
                })
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

/// The guests' cluster: the one `--cluster` names, or one made for the run with enough
/// guests for what is requested.
fn guest_bed(
    opts: &Options,
    scratch: &Path,
    scaling_wanted: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<GuestBed, String> {
    match &opts.cluster {
        Some(name) => {
            progress(&format!("guests: simulated cluster {name}"));
            GuestBed::existing(name, &opts.xmx, scratch).map_err(|e| format!("{e:#}"))
        }
        None => {
            if !nix::unistd::geteuid().is_root() {
                return Err("needs root (a simulated cluster: namespaces and daemons)".into());
            }
            let most = if scaling_wanted {
                scaling::guest_counts(opts.depth)
                    .into_iter()
                    .max()
                    .unwrap_or(1)
            } else {
                1
            };
            let per_host = most.max(2);
            let name = guests::cluster_name(std::process::id());
            progress(&format!(
                "guests: simulated cluster {name}, 2 hosts x {per_host} guests"
            ));
            GuestBed::up(&name, per_host, &opts.bin_dir, &opts.xmx, scratch, progress)
                .map_err(|e| format!("{e:#}"))
        }
    }
}

/// Run every requested setup at every size. `progress` receives one line per step.
pub fn run(opts: &Options, progress: &mut dyn FnMut(&str)) -> Result<BenchReport, BenchError> {
    let date = rfc3339_now();
    let mut chosen = setups::select(&opts.setups)?;
    let scaling_wanted = setups::wanted(&opts.setups, scaling::NAME);
    let sizes = opts.sizes.clone().unwrap_or_else(|| match opts.depth {
        Depth::Full => plan::all_sizes(),
        Depth::Quick => plan::quick_sizes(),
    });
    let scratch =
        BenchScratchDir(std::env::temp_dir().join(format!("xmx-bench-{}", std::process::id())));
    std::fs::create_dir_all(&scratch.0).map_err(BenchError::Scratch)?;

    let is_guest = |name: &str| name.starts_with("guest-");
    let link = if chosen
        .iter()
        .any(|s| s.name() != "shm" && !is_guest(s.name()))
    {
        progress(&match &opts.cluster {
            Some(c) => format!("link: hosts h0 and h1 of simulated cluster {c}"),
            None => format!("link: veth pair across two namespaces, MTU {}", link::MTU),
        });
        match &opts.cluster {
            Some(c) => BenchLink::sim_cluster(c),
            None => BenchLink::veth(),
        }
    } else {
        Err("no network setup requested".to_owned())
    };
    if let Err(e) = &link {
        progress(&format!("link: none: {e}"));
    }
    crate::interrupt::check()?;
    let mut bed = if scaling_wanted || chosen.iter().any(|s| is_guest(s.name())) {
        guest_bed(opts, &scratch.0, scaling_wanted, progress)
    } else {
        Err("no guest setup requested".to_owned())
    };
    if let Err(e) = &bed {
        progress(&format!("guests: none: {e}"));
    }
    // A signal during the cluster's start fails it; say so rather than the daemon's death.
    crate::interrupt::check()?;
    let env = Env {
        link: link.as_ref().map_err(String::as_str),
        xmx: &opts.xmx,
        scratch: &scratch.0,
        spin_us: opts.spin_us,
        guests: bed.as_ref().map_err(String::as_str),
    };

    let mut results = Vec::new();
    for setup in chosen.iter_mut() {
        crate::interrupt::check()?;
        let prepared = setup.prepare(&env);
        let mut result = SetupResult {
            name: setup.name().to_owned(),
            description: setup.description().to_owned(),
            status: SetupStatus::Ok,
            reason: None,
            cells: Vec::new(),
        };
        match prepared {
            Err(reason) => {
                progress(&format!("{}: n/a ({reason})", setup.name()));
                result.status = SetupStatus::NotAvailable;
                result.reason = Some(reason);
            }
            Ok(()) => {
                // After a measurement ran out of time, larger sizes of the same setup would
                // most likely too: they are skipped rather than waited for.
                let mut timed_out: Option<u64> = None;
                for &size in sizes.iter().filter(|&&s| setup.measures(s)) {
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
    let scaling = if scaling_wanted {
        crate::interrupt::check()?;
        Some(match &bed {
            Ok(b) => scaling::run(
                b,
                &opts.xmx,
                &scratch.0,
                opts.depth,
                opts.cell_timeout,
                progress,
            )?,
            Err(e) => {
                progress(&format!("{}: n/a ({e})", scaling::NAME));
                ScalingReport::not_available(e.clone(), opts.depth)
            }
        })
    } else {
        None
    };
    let guests_info = bed.as_ref().ok().map(|b| GuestsInfo {
        kind: b.kind(),
        guests_per_host: b.guests_per_host(),
        made_for_run: opts.cluster.is_none(),
    });
    if let Ok(b) = &mut bed {
        b.teardown(progress);
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
    Ok(BenchReport {
        report: Report {
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
        },
        guests: guests_info,
        scaling,
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
    /// Setups, comma-separated [default: all]: shm, afpacket, afpacket-mx (4 KiB payloads,
    /// MX's data frames), tcp, native, guest-remote, guest-local, guest-nocache,
    /// guest-remote-poll, guest-scaling.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub setups: Vec<String>,
    /// Directory for bench.json, bench.txt and the plots.
    #[arg(long, value_name = "DIR", default_value = "target/bench")]
    pub out: PathBuf,
    /// Measure between hosts h0 and h1 of this simulated cluster (`xmx sim up`) instead of
    /// a veth pair made for the run, and run the guest setups on its guests instead of on
    /// a cluster made (and removed) by the run.
    #[arg(long, value_name = "NAME")]
    pub cluster: Option<String>,
    /// Microseconds a waiting process polls before it blocks, in every polling setup (shm,
    /// afpacket, and xmx through XMX_SPIN_US, whose default this is). Spinning pays only
    /// while every waiter owns a core.
    #[arg(long, value_name = "US", default_value_t = DEFAULT_SPIN_US)]
    pub spin_us: u64,
}

/// The library's own default spin (libmx's `XMX_SPIN_US`), so the bench measures what
/// applications get.
pub const DEFAULT_SPIN_US: u64 = 50;

/// `xmx bench`: run, print, write the files. Exits non-zero when a cell failed. `bin_dir`
/// holds the daemons of a simulated cluster.
pub fn main(args: BenchArgs, bin_dir: PathBuf) -> anyhow::Result<i32> {
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
        bin_dir,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        cell_timeout: Duration::from_secs(if args.quick { 60 } else { 120 }),
        spin_us: args.spin_us,
    };
    // A Ctrl-C stops the run between cells, which removes its namespaces and files.
    crate::interrupt::install().map_err(anyhow::Error::msg)?;
    let report = match run(&opts, &mut |line| say(line)) {
        Err(BenchError::Interrupted(i)) => {
            say(&format!("{i}; the run's namespaces and files are removed"));
            return Ok(i.exit_code());
        }
        r => r?,
    };
    let text = table::render_all(&report);
    write_outputs(&report, &text, &args.out)?;
    let printed = if args.json {
        serde_json::to_string_pretty(&report)? + "\n"
    } else {
        text
    };
    // A reader that went away wanted no more of it; the files above hold the report.
    if let Err(e) = std::io::Write::write_all(&mut std::io::stdout().lock(), printed.as_bytes()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err(e).context("printing the report");
        }
    }
    let failed = report
        .report
        .setups
        .iter()
        .flat_map(|s| &s.cells)
        .filter(|c| c.error.is_some())
        .count()
        + report
            .scaling
            .iter()
            .flat_map(|s| &s.points)
            .filter(|p| p.error.is_some())
            .count();
    if failed > 0 {
        say(&format!("{failed} cell(s) failed; see the table"));
        return Ok(1);
    }
    Ok(0)
}

/// One progress line on stderr. A reader that went away (`xmx bench ... | head`) loses the
/// lines but does not end the run: `eprintln!` would panic, and a second panic in the
/// cluster's teardown would abort and leave the cluster's daemons and namespaces behind.
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "bench: {line}");
}

fn write_outputs(report: &BenchReport, text: &str, out: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    std::fs::write(
        out.join("bench.json"),
        serde_json::to_string_pretty(report)? + "\n",
    )?;
    std::fs::write(out.join("bench.txt"), text)?;
    let mut plots = vec![plot::write_plots(&report.report, out)];
    if let Some(s) = &report.scaling {
        plots.push(plot::write_scaling_plot(s, out));
    }
    for written in plots {
        match written {
            Ok(files) => {
                for f in files.files {
                    say(&format!("wrote {}", f.display()));
                }
            }
            Err(e) => anyhow::bail!("plots: {e}"),
        }
    }
    say(&format!(
        "wrote {} and {}",
        out.join("bench.json").display(),
        out.join("bench.txt").display()
    ));
    Ok(())
}

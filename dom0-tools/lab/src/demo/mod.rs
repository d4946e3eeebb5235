//! `xmx demo`: the guided tour, on the simulated platform.
//!
//! 1. `cluster`: a simulated cluster `demo` of two hosts with three guests each
//!    (`xmx sim up`), and the virtual clusters `blue` and `red` on every host's xmxd (see
//!    [`layout`] for who is where and why each host has a third guest);
//! 2. `peers`: each virtual cluster's peer table as its members see it (`xmx peers`);
//! 3. `traffic`: MX ping-pongs and streams between blue guests across hosts and on one
//!    host, through libmyriexpress in the guests, with a live progress line;
//! 4. `isolation`: a blue guest tries to connect to every red guest, and MX refuses;
//! 5. `figures`: the same sizes over TCP between the two hosts, and the latency and
//!    bandwidth table with ratios (the bench's table);
//! 6. `migration` (with `--migration`, skipped otherwise): blue h0/g2 moves to h1 and
//!    back (`xmx sim migrate`; `--moves N` times) under a two-way MX stream with h0/g0,
//!    while red h0/g1 streams to h1/g1, every message of both checked; the downtimes and
//!    the longest gap each receiver saw ([`migration`]);
//! 7. `teardown`: everything removed (`xmx sim down`), unless `--keep`.
//!
//! Steps run in order; the first that fails ends the tour (the rest are skipped) and the
//! teardown still runs, as it does on SIGINT, SIGTERM and SIGHUP ([`crate::interrupt`]).
//! Nothing is made up: a figure that could not be measured fails its step and the exit
//! status is non-zero (1, or 128 + the signal's number).
//!
//! # JSON (`--json`: stdout carries only this document; headings and tables go to stderr)
//!
//! ```text
//! {
//!   "schema": "xmx-demo/2",
//!   "ok": true,                      // every step ok (teardown skipped under --keep,
//!                                    // migration skipped without --migration)
//!   "interrupted": null | "SIGINT",
//!   "wall_s": 74.1,
//!   "kept": false,
//!   "layout": { "sim_name": "demo", "hosts": 2, "guests_per_host": 3,
//!               "vclusters": { "blue": ["h0/g0", ...], "red": [...] },
//!               "pairs": [ { "name": "guest-remote", "client": "h0/g0", "server": "h1/g0",
//!                            "description": "..." }, ... ] },
//!   "steps": [ { "name": "cluster", "title": "...", "status": "ok" | "failed" |
//!                "skipped" | "interrupted", "seconds": 9.5, "error": null | "...",
//!                "note": null | "..." }, ... ],          // the seven steps, in order
//!   "peers": [ { "cluster": "blue", "seen_by": "h0/g0", "command": "xmx peers ...",
//!                "report": { xmxd's peers report } }, ... ],
//!   "isolation": null | { "from": "h0/g0", "from_cluster": "blue", "refused": true,
//!                "attempts": [ { "guest": "h0/g1", "cluster": "red", "target": "h0-g1:0",
//!                  "nic_id": "...", "lookup": ANSWER, "connect": ANSWER } ] },
//!                // ANSWER: { "code": 36, "name": "MX_NIC_NOT_FOUND",
//!                //           "message": "...", "ms": 0.02 }
//!   "figures": null | { an `xmx bench` report (schema xmx-bench/1) with setups
//!                guest-remote, guest-local and tcp, and ratios guest-*/tcp },
//!   "migration": null | { "guest": "h0/g2", "partner": "h0/g0", "messages": 12000,
//!                "moves": [ { `xmx sim migrate --json`'s report }, ... ],   // --moves
//!                "longest_gap_ms": 76.0,
//!                "direct": { "frames_sent": .., "frames_received": .., "opened": ..,
//!                            "closed": .. },
//!                "bystander": { "receiver": "h1/g1", "sender": "h0/g1",
//!                               "messages": 12000, "longest_gap_ms": 16.0,
//!                               "moves_during": 2 } }
//! }
//! ```

pub mod console;
pub mod isolation;
pub mod layout;
pub mod migration;
pub mod peers;
pub mod traffic;
pub mod vclusters;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;

use crate::bench::native;
use crate::bench::report::{
    self as bench_report, Cell, LinkInfo, Machine, Report, SetupResult, SetupStatus,
};
use crate::bench::table;
use crate::interrupt;
use crate::sim::cluster::{self, ClusterState, UpOptions};
use crate::sim::netns;
use console::Console;
use isolation::Isolation;
use layout::{Pair, PAIRS, SIM_NAME};
use peers::ClusterView;
use traffic::{GuestPrograms, TcpBaseline};

/// The MX library the guests' programs run with.
const LIBRARY: &str = "libmyriexpress.so";

/// Version of the JSON document.
pub const SCHEMA: &str = "xmx-demo/2";

/// Printed under the figures: TCP's bandwidth over the simulated hosts' veth is no wire's.
const TCP_BASELINE_CAVEAT: &str =
    "TCP here crosses a veth, which no wire bounds: it moves 64 KiB segments \
(segmentation\noffload) where MXoE frames carry at most 9000 bytes; on a real link both meet the \
wire's rate\n(docs/mpi.md, \"Bandwidth over a veth\").";

/// Arguments of `xmx demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Leave the simulated cluster running at the end (inspect it with `xmx sim status
    /// --name demo`, remove it with `xmx sim down --name demo`).
    #[arg(long)]
    pub keep: bool,
    /// Print one JSON document (schema xmx-demo/2) with every figure and step outcome on
    /// stdout at the end; headings and tables go to stderr.
    #[arg(long)]
    pub json: bool,
    /// Run step 6, a guest moved to the other host and back under a checked MX stream
    /// while a pair of the other cluster streams across the hosts (skipped otherwise: it
    /// adds a few seconds and two migrations; see docs/architecture.md).
    #[arg(long)]
    pub migration: bool,
    /// How many moves step 6 makes, back and forth (1 to 20); the stream grows with them.
    #[arg(long, value_name = "N", default_value_t = migration::DEFAULT_MOVES,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(migration::MAX_MOVES)),
          requires = "migration")]
    pub moves: u32,
}

/// How a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StepStatus {
    /// It did what it says.
    Ok,
    /// It failed; `error` says why.
    Failed,
    /// It did not run (an earlier step failed, or `--keep` for the teardown).
    Skipped,
    /// A signal stopped it.
    Interrupted,
}

/// One step's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct StepRecord {
    /// Short name (`cluster`, `peers`, `traffic`, `isolation`, `figures`, `migration`,
    /// `teardown`).
    pub name: &'static str,
    /// Its heading.
    pub title: &'static str,
    /// How it ended.
    pub status: StepStatus,
    /// How long it took.
    pub seconds: f64,
    /// Why it failed.
    pub error: Option<String>,
    /// Anything else the reader should know.
    pub note: Option<String>,
}

/// The JSON document (see the module documentation).
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    /// [`SCHEMA`].
    pub schema: &'static str,
    /// Every step ok.
    pub ok: bool,
    /// The signal that stopped the demo.
    pub interrupted: Option<String>,
    /// Wall time of the whole demo, seconds.
    pub wall_s: f64,
    /// The cluster was left running (`--keep`).
    pub kept: bool,
    /// Who is where.
    pub layout: LayoutReport,
    /// The seven steps, in order.
    pub steps: Vec<StepRecord>,
    /// Step 2's tables.
    pub peers: Vec<ClusterView>,
    /// Step 4's attempts.
    pub isolation: Option<Isolation>,
    /// Steps 3 and 5's figures.
    pub figures: Option<Report>,
    /// Step 6's moves and stream.
    pub migration: Option<migration::MigrationRun>,
}

/// The demo's layout, for readers of the document.
#[derive(Debug, Clone, Serialize)]
pub struct LayoutReport {
    /// The simulated cluster's name.
    pub sim_name: &'static str,
    /// Hosts.
    pub hosts: usize,
    /// Guests per host.
    pub guests_per_host: usize,
    /// Members of each virtual cluster.
    pub vclusters: BTreeMap<&'static str, Vec<String>>,
    /// The measured pairs.
    pub pairs: Vec<PairReport>,
}

/// A measured pair.
#[derive(Debug, Clone, Serialize)]
pub struct PairReport {
    /// Its setup name in the figures.
    pub name: &'static str,
    /// The active side.
    pub client: String,
    /// The passive side.
    pub server: String,
    /// What it measures.
    pub description: &'static str,
}

impl LayoutReport {
    fn new() -> LayoutReport {
        LayoutReport {
            sim_name: SIM_NAME,
            hosts: layout::HOSTS,
            guests_per_host: layout::GUESTS_PER_HOST,
            vclusters: layout::VCLUSTERS
                .iter()
                .map(|c| {
                    (
                        *c,
                        layout::members(c).iter().map(ToString::to_string).collect(),
                    )
                })
                .collect(),
            pairs: PAIRS
                .iter()
                .map(|p| PairReport {
                    name: p.name,
                    client: p.client.to_string(),
                    server: p.server.to_string(),
                    description: p.description,
                })
                .collect(),
        }
    }
}

/// The steps: name and heading.
pub const STEPS: [(&str, &str); 7] = [
    (
        "cluster",
        "Simulated cluster `demo`: 2 hosts x 3 guests, virtual clusters blue and red",
    ),
    ("peers", "Peer table of each virtual cluster"),
    (
        "traffic",
        "MX ping-pong and stream between blue guests, across hosts and co-located",
    ),
    ("isolation", "Blue h0/g0 tries to reach the red guests"),
    (
        "figures",
        "Latency and bandwidth beside TCP on the same link",
    ),
    (
        "migration",
        "Blue h0/g2 moves to h1 and back under a two-way MX stream",
    ),
    ("teardown", "Teardown"),
];

/// A scratch directory removed when dropped.
struct DemoScratchDir(PathBuf);

impl Drop for DemoScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A failed step, told apart from one a signal stopped.
enum StepError {
    Failed(anyhow::Error),
    Interrupted(interrupt::Interrupted),
}

impl From<anyhow::Error> for StepError {
    fn from(e: anyhow::Error) -> Self {
        // Whatever failed once a signal came in failed because of it (its helpers were
        // ended): say so rather than report the helper's death.
        match interrupt::check() {
            Err(i) => StepError::Interrupted(i),
            Ok(()) => StepError::Failed(e),
        }
    }
}

impl From<interrupt::Interrupted> for StepError {
    fn from(i: interrupt::Interrupted) -> Self {
        StepError::Interrupted(i)
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StepError::Failed(e) => write!(f, "{e:#}"),
            StepError::Interrupted(i) => write!(f, "{i}"),
        }
    }
}

type StepResult = std::result::Result<Option<String>, StepError>;

/// What the steps share.
struct Demo {
    console: Console,
    bin_dir: PathBuf,
    xmx: PathBuf,
    scratch: DemoScratchDir,
    /// The cluster is ours to remove: this run made it.
    owned: bool,
    state: Option<ClusterState>,
    programs: Option<GuestPrograms>,
    isolation_prog: Option<PathBuf>,
    migration_prog: Option<PathBuf>,
    /// Moves step 6 makes.
    moves: u32,
    peers: Vec<ClusterView>,
    guest_results: Vec<SetupResult>,
    isolation: Option<Isolation>,
    figures: Option<Report>,
    migration: Option<migration::MigrationRun>,
}

/// `xmx demo`; returns the exit status. `bin_dir` holds the daemons `xmx sim` starts.
pub fn main(args: DemoArgs, bin_dir: PathBuf) -> Result<i32> {
    cluster::require_root()?;
    interrupt::install().map_err(|e| anyhow!(e))?;
    interrupt::set_force_hint(Some(format!("xmx sim down --name {SIM_NAME}")));
    let started = Instant::now();
    let xmx = std::env::current_exe().context("locating the xmx binary")?;
    let scratch = std::env::temp_dir().join(format!("xmx-demo-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let mut demo = Demo {
        console: Console::new(args.json),
        bin_dir,
        xmx,
        scratch: DemoScratchDir(scratch),
        owned: false,
        state: None,
        programs: None,
        isolation_prog: None,
        migration_prog: None,
        moves: args.moves,
        peers: Vec::new(),
        guest_results: Vec::new(),
        isolation: None,
        figures: None,
        migration: None,
    };
    let total = STEPS.len();
    let mut records = Vec::new();
    let mut stopped = false;
    for (i, (name, title)) in STEPS.iter().enumerate() {
        let last = i + 1 == total;
        if stopped && !last {
            records.push(record(name, title, StepStatus::Skipped, 0.0, None, None));
            continue;
        }
        if *name == "migration" && !args.migration {
            let note = "not asked for (--migration)".to_owned();
            records.push(record(
                name,
                title,
                StepStatus::Skipped,
                0.0,
                None,
                Some(note),
            ));
            continue;
        }
        demo.console.heading(i + 1, total, title);
        let t0 = Instant::now();
        let outcome = if *name == "teardown" {
            demo.teardown(args.keep)
        } else if let Err(i) = interrupt::check() {
            // Between steps, a signal ends the tour.
            Err(StepError::from(i))
        } else {
            match *name {
                "cluster" => demo.cluster(),
                "peers" => demo.show_peers(),
                "traffic" => demo.traffic(),
                "isolation" => demo.isolation(),
                "figures" => demo.figures(),
                "migration" => demo.migration(),
                other => Err(StepError::Failed(anyhow!("unknown step {other}"))),
            }
        };
        let seconds = t0.elapsed().as_secs_f64();
        let rec = match outcome {
            Ok(note) if *name == "teardown" && args.keep && demo.owned => {
                record(name, title, StepStatus::Skipped, seconds, None, note)
            }
            Ok(note) => record(name, title, StepStatus::Ok, seconds, None, note),
            Err(e) => {
                let status = match e {
                    StepError::Interrupted(_) => StepStatus::Interrupted,
                    StepError::Failed(_) => StepStatus::Failed,
                };
                demo.console
                    .note(&format!("{name}: {}: {e}", status_word(status)));
                stopped = true;
                record(name, title, status, seconds, Some(e.to_string()), None)
            }
        };
        records.push(rec);
    }
    demo.console.finish();
    let interrupted = interrupt::received();
    let ok = interrupted.is_none()
        && records.iter().all(|r| {
            r.status == StepStatus::Ok
                || (r.name == "teardown" && r.status == StepStatus::Skipped)
                || (r.name == "migration" && r.status == StepStatus::Skipped && !args.migration)
        });
    let wall_s = started.elapsed().as_secs_f64();
    let report = DemoReport {
        schema: SCHEMA,
        ok,
        interrupted: interrupted.map(|s| s.as_str().to_owned()),
        wall_s,
        kept: args.keep && demo.owned,
        layout: LayoutReport::new(),
        steps: records,
        peers: std::mem::take(&mut demo.peers),
        isolation: demo.isolation.take(),
        figures: demo.figures.take(),
        migration: demo.migration.take(),
    };
    eprintln!();
    eprintln!("{}", summary(&report));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(match interrupted {
        Some(sig) => interrupt::Interrupted { signal: sig }.exit_code(),
        None if ok => 0,
        None => 1,
    })
}

fn record(
    name: &'static str,
    title: &'static str,
    status: StepStatus,
    seconds: f64,
    error: Option<String>,
    note: Option<String>,
) -> StepRecord {
    StepRecord {
        name,
        title,
        status,
        seconds,
        error,
        note,
    }
}

fn status_word(s: StepStatus) -> &'static str {
    match s {
        StepStatus::Ok => "ok",
        StepStatus::Failed => "FAILED",
        StepStatus::Skipped => "skipped",
        StepStatus::Interrupted => "interrupted",
    }
}

/// The closing lines: each step's outcome and the verdict.
pub fn summary(report: &DemoReport) -> String {
    let mut out = String::from("Summary:\n");
    for s in &report.steps {
        let detail = s
            .error
            .as_deref()
            .or(s.note.as_deref())
            .map(|d| format!(" ({d})"))
            .unwrap_or_default();
        out.push_str(&format!(
            "  {:<10} {:<11} {:>6.1} s{detail}\n",
            s.name,
            status_word(s.status),
            s.seconds
        ));
    }
    let verdict = match (&report.interrupted, report.ok) {
        (Some(sig), _) => format!(
            "xmx demo: interrupted by {sig} after {:.1} s",
            report.wall_s
        ),
        (None, true) => format!("xmx demo: every step ok in {:.1} s", report.wall_s),
        (None, false) => format!("xmx demo: FAILED after {:.1} s", report.wall_s),
    };
    out.push_str(&verdict);
    out
}

/// The command that builds what is missing from `bin_dir`.
fn build_hint(bin_dir: &Path) -> &'static str {
    if bin_dir.ends_with("debug") || bin_dir.ends_with("deps") {
        "cargo build --workspace"
    } else {
        "cargo build --release --workspace"
    }
}

impl Demo {
    fn state(&self) -> Result<&ClusterState> {
        self.state.as_ref().context("the cluster is not up")
    }

    /// Everything the tour runs must be there before anything is built.
    fn preflight(&mut self) -> Result<()> {
        let hint = build_hint(&self.bin_dir);
        for (bin, package, what) in [
            ("xmx-simhv", "xmx-simhv", "the simulated hypervisor"),
            ("xmx-backd", "xmx-backend", "the backend daemon"),
            ("xmxd", "xmx-tools", "the peer-table service"),
            ("xmx-frontd", "xmx-guests", "the guest daemon"),
        ] {
            if !self.bin_dir.join(bin).is_file() {
                bail!(
                    "{bin} ({what}, package {package}) is not in {}: build it with `{hint}`",
                    self.bin_dir.display()
                );
            }
        }
        let built = native::find_library(&self.xmx).with_context(|| {
            format!("libmyriexpress.so (package xmx-libmx) is not next to xmx: build it with `{hint}` or set XMX_LIB_DIR")
        })?;
        // Every program of the tour uses one copy of the library, which a build running
        // meanwhile cannot replace under it.
        let lib_dir = self.scratch.0.join("lib");
        std::fs::create_dir_all(&lib_dir)?;
        std::fs::copy(built.join(LIBRARY), lib_dir.join(LIBRARY))
            .with_context(|| format!("copying {}", built.join(LIBRARY).display()))?;
        self.console.progress(
            "building mx_bench.c, mx_isolation.c and migrate_stream.c against libmyriexpress",
        );
        let mx_bench = native::build_program(&self.scratch.0, &native::include_dir(), &lib_dir)
            .map_err(|e| anyhow!(e))?;
        let probe = isolation::build(
            "mx_isolation",
            isolation::MX_ISOLATION_C,
            &self.scratch.0,
            &lib_dir,
        )
        .map_err(|e| anyhow!(e))?;
        let stream = migration::build(&self.scratch.0, &lib_dir).map_err(|e| anyhow!(e))?;
        self.programs = Some(GuestPrograms { mx_bench, lib_dir });
        self.isolation_prog = Some(probe);
        self.migration_prog = Some(stream);
        Ok(())
    }

    fn cluster(&mut self) -> StepResult {
        let root = cluster::root_of(SIM_NAME);
        if ClusterState::load(&root)?.is_some() || !netns::list_ours(SIM_NAME)?.is_empty() {
            return Err(StepError::Failed(anyhow!(
                "a simulated cluster named {SIM_NAME:?} exists already (see `xmx sim status --name {SIM_NAME}`); \
                 remove it with `xmx sim down --name {SIM_NAME}` and run the demo again"
            )));
        }
        self.preflight()?;
        let opts = UpOptions {
            name: SIM_NAME.into(),
            hosts: layout::HOSTS,
            guests: layout::GUESTS_PER_HOST,
            mtu: layout::MTU,
            bin_dir: self.bin_dir.clone(),
            guest_clusters: vclusters::guest_clusters(),
            back_to_back: false,
        };
        // From here the cluster is ours; `up` removes what it built if it fails.
        self.owned = true;
        let console = &mut self.console;
        let state = cluster::up(&opts, &mut |step| {
            console.progress(&format!("sim up: {step}"))
        })?;
        self.state = Some(state);
        interrupt::check()?;
        let state = self.state.as_ref().context("the cluster is not up")?;
        let console = &mut self.console;
        console.progress("waiting for the devices to connect and the peer views to settle");
        vclusters::wait_settled(state, vclusters::SETTLE_TIMEOUT)?;
        vclusters::check_members(state, &mut |line| console.note(line))?;
        let hosts: Vec<String> = self
            .state()?
            .hosts
            .iter()
            .map(|h| format!("{} ({}, {} {})", h.name, h.netns, h.iface, h.addr))
            .collect();
        self.console.note(&format!("hosts: {}", hosts.join(", ")));
        Ok(Some(format!(
            "{} hosts, {} guests, clusters settled",
            layout::HOSTS,
            layout::places().len()
        )))
    }

    fn show_peers(&mut self) -> StepResult {
        let state = self.state.as_ref().context("the cluster is not up")?;
        let console = &mut self.console;
        self.peers = peers::views(state, &self.xmx, &mut |text| console.show(text))?;
        Ok(None)
    }

    fn traffic(&mut self) -> StepResult {
        let state = self.state.as_ref().context("the cluster is not up")?;
        let programs = self.programs.as_ref().context("programs not built")?;
        for pair in &PAIRS {
            self.console.note(pair.description);
            let result = measure_setup(
                &mut self.console,
                &self.xmx,
                pair.name,
                pair.description,
                &|test, size, counts| programs.cell(state, pair, test, size, counts),
            );
            let failed = failure(&result);
            self.guest_results.push(result);
            if let Some(e) = failed {
                interrupt::check()?;
                return Err(StepError::Failed(anyhow!(
                    "MX between guests failed ({}): {e}. This traffic is carried by libmyriexpress's xen \
                     transport in the guests, xmx-frontd and xmx-backd: rerun with --keep and read their logs \
                     under /run/xmx/{SIM_NAME}/h*/logs",
                    pair_label(pair)
                )));
            }
        }
        Ok(Some(format!(
            "{} sizes x ping-pong and stream x {} pairs",
            layout::SIZES.len(),
            PAIRS.len()
        )))
    }

    fn isolation(&mut self) -> StepResult {
        let state = self.state.as_ref().context("the cluster is not up")?;
        let programs = self.programs.as_ref().context("programs not built")?;
        let prog = self
            .isolation_prog
            .as_ref()
            .context("mx_isolation not built")?;
        let result = isolation::run(state, prog, &programs.lib_dir, &self.xmx)?;
        let mut lines = vec![format!(
            "from {} (cluster {}):",
            result.from, result.from_cluster
        )];
        for a in &result.attempts {
            lines.push(format!(
                "  to {} (cluster {}, {} = {}): hostname lookup: {} in {:.1} ms; mx_connect: {} in {:.1} ms",
                a.guest,
                a.cluster,
                a.attempt.target,
                a.attempt.nic_id,
                a.attempt.lookup.name,
                a.attempt.lookup.ms,
                a.attempt.connect.status(),
                a.attempt.connect.ms
            ));
        }
        self.console.show(&lines.join("\n"));
        let verdict = result.refused;
        let first = result.attempts.first().map(|a| a.attempt.connect.status());
        self.isolation = Some(result);
        if !verdict {
            return Err(StepError::Failed(anyhow!(
                "a blue guest was not refused by every red guest (see the attempts above): virtual clusters do not isolate"
            )));
        }
        Ok(first.map(|s| format!("refused: {s}")))
    }

    fn figures(&mut self) -> StepResult {
        let sim = self.state()?.name.clone();
        let mtu = self.state()?.mtu;
        let tcp = TcpBaseline::new(&sim, &self.xmx, &self.scratch.0)?;
        self.console.note(&format!("tcp: {}", tcp.description()));
        let result = measure_setup(
            &mut self.console,
            &self.xmx,
            tcp.name(),
            tcp.description(),
            &|test, size, counts| tcp.cell(test, size, counts),
        );
        let failed = failure(&result);
        let mut setups = std::mem::take(&mut self.guest_results);
        setups.push(result);
        let sizes = layout::SIZES.to_vec();
        let pairs: Vec<(String, String)> = PAIRS
            .iter()
            .map(|p| (p.name.to_owned(), tcp.name().to_owned()))
            .collect();
        let ratios = bench_report::ratios(&sizes, &setups, &pairs);
        let report = Report {
            schema: bench_report::SCHEMA.to_owned(),
            date: bench_report::rfc3339(
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
            ),
            command: "xmx demo".into(),
            quick: true,
            machine: Machine::this(),
            link: Some(LinkInfo {
                kind: format!("sim:{sim}"),
                mtu,
            }),
            sizes,
            setups,
            ratios,
        };
        self.console.show(&table::render(&report));
        // The ratios to TCP are the first figures a newcomer reads: say what bounds them.
        self.console.show(TCP_BASELINE_CAVEAT);
        self.figures = Some(report);
        if let Some(e) = failed {
            interrupt::check()?;
            return Err(StepError::Failed(anyhow!("the TCP baseline failed: {e}")));
        }
        Ok(None)
    }

    fn migration(&mut self) -> StepResult {
        let prog = self
            .migration_prog
            .clone()
            .context("migrate_stream not built")?;
        let lib_dir = self
            .programs
            .as_ref()
            .context("programs not built")?
            .lib_dir
            .clone();
        let state = self.state.as_mut().context("the cluster is not up")?;
        let console = &mut self.console;
        let moves = self.moves;
        let result = migration::run(state, &prog, &lib_dir, moves, &mut |step| {
            console.progress(step)
        });
        let run = match result {
            Ok(run) => run,
            Err(e) => {
                interrupt::check()?;
                return Err(StepError::Failed(e.context(format!(
                    "MX across a migration failed: rerun with --keep and read the logs under /run/xmx/{SIM_NAME}/h*/logs"
                ))));
            }
        };
        self.console.show(&migration::render(&run));
        let worst = run
            .moves
            .iter()
            .map(|m| m.downtime_ms)
            .fold(0.0_f64, f64::max);
        let note = format!(
            "{} moves, downtime at most {worst:.1} ms, longest gap {:.0} ms, {} messages each way checked; bystander's longest gap {:.0} ms",
            run.moves.len(),
            run.longest_gap_ms,
            run.messages,
            run.bystander.longest_gap_ms
        );
        self.migration = Some(run);
        Ok(Some(note))
    }

    fn teardown(&mut self, keep: bool) -> StepResult {
        let _shield = interrupt::shield();
        if !self.owned {
            return Ok(Some("nothing of this run to remove".into()));
        }
        if keep && ClusterState::load(&cluster::root_of(SIM_NAME))?.is_some() {
            let note = format!(
                "--keep: cluster {SIM_NAME} stays up; `xmx sim status --name {SIM_NAME}`, \
                 `xmx sim run --name {SIM_NAME} h0 g0 -- PROGRAM`, `xmx sim down --name {SIM_NAME}`"
            );
            self.console.note(&note);
            return Ok(Some(note));
        }
        let console = &mut self.console;
        cluster::down(SIM_NAME, &mut |step| {
            console.progress(&format!("sim down: {step}"))
        })
        .map_err(StepError::Failed)?;
        self.owned = false;
        self.console.note(&format!(
            "cluster {SIM_NAME} removed: daemons, namespaces, /run/xmx/{SIM_NAME}"
        ));
        Ok(None)
    }
}

fn pair_label(pair: &Pair) -> String {
    format!("{}: {} -> {}", pair.name, pair.client, pair.server)
}

/// Every size of one setup; stops at the first failed cell (a broken setup would only
/// fail again, each time after a timeout).
fn measure_setup(
    console: &mut Console,
    xmx: &Path,
    name: &str,
    description: &str,
    make: &traffic::MakeAgents<'_>,
) -> SetupResult {
    let mut cells: Vec<Cell> = Vec::new();
    for &size in &layout::SIZES {
        let cell = traffic::measure(xmx, name, size, make, &mut |line| console.progress(line));
        let summary = format!(
            "{name} {}: {}, {}",
            table::size_label(size),
            cell.pingpong.as_ref().map_or("-".into(), |l| format!(
                "{:.2} us median half round trip",
                l.median_us
            )),
            cell.stream.as_ref().map_or("-".into(), |b| match size {
                0 => format!("{:.0} msg/s", b.msgs_per_s),
                _ => format!("{:.1} MB/s", b.mb_per_s),
            }),
        );
        console.note(&summary);
        let failed = cell.error.is_some();
        cells.push(cell);
        if failed {
            break;
        }
    }
    SetupResult {
        name: name.to_owned(),
        description: description.to_owned(),
        status: SetupStatus::Ok,
        reason: None,
        cells,
    }
}

/// What went wrong in a setup's cells, if anything: an error, or a figure missing or not
/// positive.
fn failure(result: &SetupResult) -> Option<String> {
    for &size in &layout::SIZES {
        let label = table::size_label(size);
        let Some(c) = result.cell(size) else {
            return Some(format!("{label}: not measured"));
        };
        if let Some(e) = &c.error {
            return Some(format!("{label}: {e}"));
        }
        match (&c.pingpong, &c.stream) {
            (Some(l), Some(b))
                if l.median_us > 0.0 && (size == 0 || b.mb_per_s > 0.0) && b.msgs_per_s > 0.0 => {}
            _ => return Some(format!("{label}: a figure is missing or not positive")),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::stats::{Bandwidth, Latency};

    fn cell(size: u64, ok: bool) -> Cell {
        Cell {
            size,
            pingpong: ok.then_some(Latency {
                iters: 10,
                warmup: 2,
                median_us: 12.0,
                p99_us: 30.0,
                min_us: 10.0,
                mean_us: 13.0,
            }),
            stream: Bandwidth::from_counts(10, size * 10, 1_000_000, 500_000),
            error: (!ok).then(|| "client: mx_init: no device".to_owned()),
        }
    }

    fn setup(cells: Vec<Cell>) -> SetupResult {
        SetupResult {
            name: "guest-remote".into(),
            description: String::new(),
            status: SetupStatus::Ok,
            reason: None,
            cells,
        }
    }

    #[test]
    fn a_setup_fails_on_any_missing_or_failed_cell() {
        let all: Vec<Cell> = layout::SIZES.iter().map(|&s| cell(s, true)).collect();
        assert_eq!(failure(&setup(all.clone())), None);
        let mut short = all.clone();
        short.pop();
        assert_eq!(failure(&setup(short)), Some("1 MiB: not measured".into()));
        let mut broken = all;
        broken[1] = cell(4096, false);
        assert_eq!(
            failure(&setup(broken)),
            Some("4 KiB: client: mx_init: no device".into())
        );
    }

    #[test]
    fn the_summary_says_what_happened() {
        let mut report = DemoReport {
            schema: SCHEMA,
            ok: true,
            interrupted: None,
            wall_s: 61.25,
            kept: false,
            layout: LayoutReport::new(),
            steps: STEPS
                .iter()
                .map(|(n, t)| record(n, t, StepStatus::Ok, 1.0, None, None))
                .collect(),
            peers: vec![],
            isolation: None,
            figures: None,
            migration: None,
        };
        let text = summary(&report);
        assert!(
            text.ends_with("xmx demo: every step ok in 61.2 s"),
            "{text}"
        );
        assert_eq!(text.lines().count(), 2 + STEPS.len());
        report.steps[2].status = StepStatus::Interrupted;
        report.steps[2].error = Some("interrupted by SIGINT".into());
        report.interrupted = Some("SIGINT".into());
        let text = summary(&report);
        assert!(text.contains("traffic    interrupted"), "{text}");
        assert!(text.contains("(interrupted by SIGINT)"), "{text}");
        assert!(
            text.ends_with("interrupted by SIGINT after 61.2 s"),
            "{text}"
        );
        let v = serde_json::to_value(&report).unwrap();
        assert_eq!(v["schema"], SCHEMA);
        assert_eq!(v["steps"][2]["status"], "interrupted");
        assert_eq!(v["layout"]["vclusters"]["blue"][0], "h0/g0");
        assert_eq!(v["layout"]["pairs"][1]["server"], "h0/g2");
    }
}

//! Run one role of the platform conformance suite in this domain.
//!
//! On real Xen, start the granter in a guest and the mapper in dom0 (or another guest):
//!
//! ```text
//! guest$ xmx-hv-conformance --role granter --peer 0
//! dom0#  xmx-hv-conformance --role mapper --peer <guest domid>
//! ```
//!
//! Exit status 0 iff no check of this role failed.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use tracing_subscriber::EnvFilter;
use xmx_hv::conformance::{self, ConformanceRole, ConformanceSetup, DEFAULT_BASE};
use xmx_hv::linux::LinuxPlatform;
use xmx_hv::sim::SimPlatform;
use xmx_hv::{DomId, Platform};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum RoleArg {
    Granter,
    Mapper,
    Outsider,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum PlatformArg {
    /// Real Xen through /dev/xen and xenstored.
    Linux,
    /// A domain of an xmx-simhv (needs --sim-dir and --domid).
    Sim,
}

/// Check that this domain's grant tables, event channels and xenstore behave as Xen's
/// do, against a peer domain running the opposite role.
#[derive(Debug, Parser)]
#[command(name = "xmx-hv-conformance", version)]
struct ConformanceArgs {
    /// The part this domain plays.
    #[arg(long, value_enum)]
    role: RoleArg,
    /// The other domain: the mapper for a granter, the granter for the others.
    #[arg(long)]
    peer: DomId,
    /// Xenstore area of each role: relative to `/local/domain/<domid>`, or absolute.
    #[arg(long, default_value = DEFAULT_BASE)]
    base: String,
    /// Granter only: a third domain that runs the outsider role.
    #[arg(long)]
    third: Option<DomId>,
    /// Granter only: the domain to grant "someone else's" pages and ports to.
    #[arg(long)]
    other: Option<DomId>,
    /// Longest wait for the peer or an event, in seconds.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// Print the report as JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Which platform to test.
    #[arg(long, value_enum, default_value = "linux")]
    platform: PlatformArg,
    /// The simhv directory (platform sim).
    #[arg(long)]
    sim_dir: Option<std::path::PathBuf>,
    /// The domain to attach as (platform sim).
    #[arg(long)]
    domid: Option<DomId>,
}

fn open_platform(args: &ConformanceArgs) -> Result<Box<dyn Platform>, String> {
    match args.platform {
        PlatformArg::Linux => LinuxPlatform::open()
            .map(|p| Box::new(p) as Box<dyn Platform>)
            .map_err(|e| e.to_string()),
        PlatformArg::Sim => {
            let dir = args
                .sim_dir
                .as_ref()
                .ok_or("--platform sim needs --sim-dir")?;
            let domid = args.domid.ok_or("--platform sim needs --domid")?;
            SimPlatform::attach(dir, domid)
                .map(|p| Box::new(p) as Box<dyn Platform>)
                .map_err(|e| e.to_string())
        }
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = ConformanceArgs::parse();
    let platform = match open_platform(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("xmx-hv-conformance: {e}");
            return ExitCode::from(2);
        }
    };
    let role = match args.role {
        RoleArg::Granter => ConformanceRole::Granter,
        RoleArg::Mapper => ConformanceRole::Mapper,
        RoleArg::Outsider => ConformanceRole::Outsider,
    };
    let mut setup = ConformanceSetup::new(role, args.peer, &args.base);
    setup.third = args.third;
    setup.other = args.other;
    setup.timeout = Duration::from_secs(args.timeout);
    let report = conformance::run_with(platform.as_ref(), &setup);
    if args.json {
        println!("{}", report.to_json());
    } else {
        println!("{report}");
    }
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

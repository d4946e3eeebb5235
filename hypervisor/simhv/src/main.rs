//! `xmx-simhv`: run a simulated Xen host's hypervisor services on a directory.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use nix::unistd::{fork, setsid, ForkResult};
use xmx_simhv::config::{DEFAULT_GNTTAB_ENTRIES, DEFAULT_MAX_MAPPINGS, DEFAULT_MAX_PORTS};
use xmx_simhv::{Daemon, SimhvConfig};

/// A one-machine Xen hypervisor for xmx: xenstored, grant tables, event channels and
/// domain lifecycle, served under DIR (see the layout in the xmx-hv `sim` module).
///
/// Without --foreground the daemon goes to the background and this command returns once
/// it is ready (logs then go to DIR/simhv.log). Either way DIR/ready appears when it
/// serves requests, and a line "xmx-simhv ready dir=DIR pid=PID" is printed.
/// SIGTERM or SIGINT stops it cleanly. Log level: RUST_LOG (default info).
#[derive(Debug, Parser)]
#[command(name = "xmx-simhv", version)]
struct SimhvArgs {
    /// Directory to serve (created if missing).
    #[arg(long)]
    dir: PathBuf,
    /// Stay in the foreground, logging to stderr.
    #[arg(long)]
    foreground: bool,
    /// Grant-table entries per domain.
    #[arg(long, default_value_t = DEFAULT_GNTTAB_ENTRIES)]
    gnttab_entries: u32,
    /// Memory a domain may grant from, in MiB.
    #[arg(long, default_value_t = 1024)]
    mem_limit_mib: u64,
    /// Grants a domain may have in use (default: the grant-table size). The variable lets
    /// a cluster started by `xmx sim up` give its guests fewer.
    #[arg(long, env = "XMX_SIMHV_MAX_GRANTS")]
    max_grants: Option<usize>,
    /// Foreign pages a domain may map at once.
    #[arg(long, default_value_t = DEFAULT_MAX_MAPPINGS)]
    max_mappings: usize,
    /// Event-channel ports per domain.
    #[arg(long, default_value_t = DEFAULT_MAX_PORTS)]
    max_ports: usize,
}

fn config(args: &SimhvArgs) -> SimhvConfig {
    SimhvConfig {
        gnttab_entries: args.gnttab_entries,
        mem_limit: args.mem_limit_mib.saturating_mul(1 << 20),
        max_grants: args.max_grants.unwrap_or(args.gnttab_entries as usize),
        max_mappings: args.max_mappings,
        max_ports: args.max_ports,
        ..SimhvConfig::default()
    }
}

/// Fork into the background. In the parent, wait for the child's verdict and exit;
/// in the child, return the pipe end on which to report readiness.
fn daemonize(dir: &Path) -> std::io::Result<OwnedFd> {
    std::fs::create_dir_all(dir)?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("simhv.log"))?;
    let (rd, wr) = nix::unistd::pipe()?;
    // SAFETY: called from main before any thread is started (no logging, no daemon yet),
    // so the child is a faithful single-threaded copy and may keep running Rust code.
    match unsafe { fork() }? {
        ForkResult::Parent { child } => {
            drop(wr);
            let mut verdict = String::new();
            let _ = std::fs::File::from(rd).read_to_string(&mut verdict);
            if verdict.starts_with('R') {
                println!("xmx-simhv ready dir={} pid={child}", dir.display());
                std::process::exit(0);
            }
            eprintln!(
                "xmx-simhv: the daemon failed to start; see {}",
                dir.join("simhv.log").display()
            );
            std::process::exit(1);
        }
        ForkResult::Child => {
            drop(rd);
            setsid()?;
            let null = std::fs::File::open("/dev/null")?;
            nix::unistd::dup2(null.as_raw_fd(), 0)?;
            nix::unistd::dup2(log.as_raw_fd(), 1)?;
            nix::unistd::dup2(log.as_raw_fd(), 2)?;
            Ok(wr)
        }
    }
}

fn main() -> ExitCode {
    let args = SimhvArgs::parse();
    let ready_pipe = if args.foreground {
        None
    } else {
        match daemonize(&args.dir) {
            Ok(w) => Some(w),
            Err(e) => {
                eprintln!("xmx-simhv: cannot go to the background: {e}");
                return ExitCode::FAILURE;
            }
        }
    };
    xmx_hv::daemon::init_logging();

    // Before any thread exists: the main thread alone takes them, synchronously.
    let signals = match xmx_hv::daemon::block_stop_signals() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::FAILURE;
        }
    };

    let handle = match Daemon::start(&args.dir, config(&args)) {
        Ok(h) => h,
        Err(e) => {
            tracing::error!(error = %e, dir = %args.dir.display(), "cannot start");
            eprintln!("xmx-simhv: {e}");
            return ExitCode::FAILURE;
        }
    };
    match ready_pipe {
        Some(w) => {
            let mut f = std::fs::File::from(w);
            let _ = f.write_all(b"R");
        }
        None => {
            println!(
                "xmx-simhv ready dir={} pid={}",
                args.dir.display(),
                std::process::id()
            );
            let _ = std::io::stdout().flush();
        }
    }

    match signals.wait() {
        Ok(sig) => tracing::info!(signal = %sig, "stopping"),
        Err(e) => tracing::error!(error = %e, "waiting for signals; stopping"),
    }
    handle.shutdown();
    ExitCode::SUCCESS
}

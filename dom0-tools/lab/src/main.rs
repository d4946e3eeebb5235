//! `xmx`: the administrator's command for an xmx host or a simulated cluster.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use xmx_lab::sim::cluster::{self, ClusterState, UpOptions};

#[derive(Parser)]
#[command(
    name = "xmx",
    version,
    about = "Manage xmx: MX over Ethernet for Xen guests"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Simulated clusters on this machine (needs root for network namespaces).
    Sim {
        #[command(subcommand)]
        cmd: SimCmd,
    },
    /// The guided tour: a simulated 2-host cluster with guests in two virtual clusters, MX
    /// ping-pongs and streams between them, isolation, and latency/bandwidth beside TCP
    /// (needs root for namespaces; removes everything at the end, also on Ctrl-C).
    Demo(xmx_lab::demo::DemoArgs),
    /// Latency and bandwidth by message size: xmx beside shared memory, raw AF_PACKET and
    /// TCP on the same link, with ratios, JSON and plots (needs root for namespaces).
    Bench(xmx_lab::bench::BenchArgs),
    /// One measuring process of `xmx bench` (started by it).
    #[command(hide = true)]
    BenchAgent(xmx_lab::bench::agent::AgentArgs),
    #[command(flatten)]
    Admin(xmx_tools::cli::AdminCmd),
}

#[derive(clap::Args)]
struct ClusterArg {
    /// Name of the cluster (several can coexist); its state, sockets and logs are under
    /// /run/xmx/NAME and its namespaces are called xmx-NAME-*.
    #[arg(long, env = "XMX_SIM_NAME", default_value = cluster::DEFAULT_NAME)]
    name: String,
}

#[derive(Subcommand)]
enum SimCmd {
    /// Create HOSTS hosts joined by a bridge, each with its simhv and GUESTS guests.
    Up {
        #[command(flatten)]
        cluster: ClusterArg,
        #[arg(long, default_value_t = 2)]
        hosts: usize,
        #[arg(long, default_value_t = 2)]
        guests: usize,
        /// MTU of every link; MXoE in MX wire-compatible mode needs at least 4130.
        #[arg(long, default_value_t = 9000, value_parser = clap::value_parser!(u32).range(4130..=65535))]
        mtu: u32,
        /// Join the two hosts by one veth pair instead of a bridge (`--hosts 2` only): no
        /// simulated switch on the path, as `xmx bench` measures; impairment relays need
        /// the bridge.
        #[arg(long)]
        back_to_back: bool,
        /// Print the resulting cluster as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run CMD as an application in GUEST on HOST (e.g. `xmx sim run h0 g1 -- ./pingpong`).
    Run {
        #[command(flatten)]
        cluster: ClusterArg,
        host: String,
        guest: String,
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Show hosts, guests and whether their daemons are alive.
    Status {
        #[command(flatten)]
        cluster: ClusterArg,
        #[arg(long)]
        json: bool,
    },
    /// Move running guest GUEST of HOST to host TO, as `xl migrate` does: its memory is
    /// copied while it runs, then it is suspended and frozen, the rest copied, and it
    /// resumes on TO with its MX identity (MAC, endpoints, sessions); its guest daemon
    /// follows it, peers reach it there. Afterwards it is listed under TO by its domain
    /// name (e.g. `xmx sim migrate h0 g1 --to h1`, then `xmx sim run h1 h0-g1 -- ...`).
    Migrate {
        #[command(flatten)]
        cluster: ClusterArg,
        /// The host the guest runs on (`h0`, or its index).
        host: String,
        /// The guest (`g1`, its index, or the domain name of a guest moved there).
        guest: String,
        /// The host to move it to.
        #[arg(long)]
        to: String,
        /// Print what was done (rounds, bytes, downtime) as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove the cluster: daemons, namespaces, state (also after a crash).
    Down {
        #[command(flatten)]
        cluster: ClusterArg,
    },
}

/// Where the sibling binaries (xmx-simhv, ...) are: XMX_BIN_DIR, else next to this program.
fn bin_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("XMX_BIN_DIR") {
        return Ok(PathBuf::from(d));
    }
    let exe = std::env::current_exe().context("locating the xmx binary")?;
    Ok(exe
        .parent()
        .context("xmx binary has no directory")?
        .to_path_buf())
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("xmx: {e:#}");
            std::process::exit(1);
        }
    }
}

fn run(cli: Cli) -> Result<i32> {
    match cli.cmd {
        Cmd::Sim { cmd } => sim(cmd),
        Cmd::Bench(args) => xmx_lab::bench::main(args, bin_dir()?),
        Cmd::BenchAgent(args) => xmx_lab::bench::agent::run(&args).map(|()| 0),
        Cmd::Admin(cmd) => xmx_tools::cli::run(cmd),
        Cmd::Demo(args) => xmx_lab::demo::main(args, bin_dir()?),
    }
}

fn sim(cmd: SimCmd) -> Result<i32> {
    match cmd {
        SimCmd::Up {
            cluster,
            hosts,
            guests,
            mtu,
            back_to_back,
            json,
        } => {
            let opts = UpOptions {
                name: cluster.name,
                hosts,
                guests,
                mtu,
                bin_dir: bin_dir()?,
                guest_clusters: Vec::new(),
                back_to_back,
            };
            let state = cluster::up(&opts, &mut |step| eprintln!("sim up: {step}"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&state)?);
            } else {
                print_state(&state);
            }
            Ok(0)
        }
        SimCmd::Run {
            cluster,
            host,
            guest,
            cmd,
        } => {
            let state = ClusterState::load(&cluster::root_of(&cluster.name))?
                .context("no simulated cluster (start one with `xmx sim up`)")?;
            cluster::run(&state, &host, &guest, &cmd, &bin_dir()?)
        }
        SimCmd::Status { cluster, json } => {
            let Some(state) = ClusterState::load(&cluster::root_of(&cluster.name))? else {
                if json {
                    println!("null");
                } else {
                    println!("no simulated cluster");
                }
                return Ok(0);
            };
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&cluster::status(&state))?
                );
            } else {
                print_state(&state);
            }
            Ok(0)
        }
        SimCmd::Migrate {
            cluster,
            host,
            guest,
            to,
            json,
        } => {
            let mut state = ClusterState::load(&cluster::root_of(&cluster.name))?
                .context("no simulated cluster (start one with `xmx sim up`)")?;
            let s = xmx_lab::sim::migrate::migrate(&mut state, &host, &guest, &to, &mut |step| {
                eprintln!("sim migrate: {step}")
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                println!(
                    "{} moved from {} (domain {}) to {} (domain {}): {} rounds, {} bytes, \
                     downtime {:.1} ms, total {:.1} ms, {} processes frozen, {} sessions carried",
                    s.guest,
                    s.from,
                    s.source_domid,
                    s.to,
                    s.dest_domid,
                    s.rounds.len(),
                    s.bytes,
                    s.downtime_ms,
                    s.total_ms,
                    s.frozen_processes,
                    s.sessions_carried
                        .map_or_else(|| "no device, no".to_string(), |n| n.to_string()),
                );
            }
            Ok(0)
        }
        SimCmd::Down { cluster } => {
            cluster::down(&cluster.name, &mut |step| eprintln!("sim down: {step}"))?;
            Ok(0)
        }
    }
}

fn print_state(state: &ClusterState) {
    println!(
        "simulated cluster {} at {} (MTU {})",
        state.name,
        state.root.display(),
        state.mtu
    );
    for h in &state.hosts {
        println!(
            "  host {} ({}, {} {} {})",
            h.name, h.netns, h.iface, h.mac, h.addr
        );
        for d in &h.daemons {
            let alive = if cluster_alive(d.pid) {
                "running"
            } else {
                "DEAD"
            };
            println!("    {:<12} pid {:<8} {alive}", d.name, d.pid);
        }
        for g in &h.guests {
            println!("    guest {} = domain {}", g.name, g.domid);
        }
    }
}

fn cluster_alive(pid: i32) -> bool {
    xmx_lab::sim::wait::alive(pid)
}

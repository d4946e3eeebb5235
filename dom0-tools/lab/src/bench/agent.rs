//! `xmx bench-agent`: one measuring process of a setup (hidden from `--help`).
//!
//! The bench driver starts two agents per cell, a server and then a client. The server
//! prints `ready` (optionally followed by a token the client needs: a TCP port, a MAC
//! address) on stdout once it can be reached, and each agent ends by printing its
//! [`AgentReport`] as one JSON line. Errors go to stderr; `progress K/N` lines on stderr
//! report iterations.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use super::afpacket::AfPacketChannel;
use super::exchange::{self, Channel};
use super::shm::{self, ShmChannel};
use super::stats::AgentReport;
use super::tcp::TcpChannel;

/// How the two agents of a setup talk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AgentTransport {
    /// A shared mapping (`--shm PATH`).
    Shm,
    /// Raw frames on an interface (`--iface`).
    Afpacket,
    /// TCP (`--addr`: the server's address).
    Tcp,
    /// Enter the namespace and run the command after `--` (programs of other setups).
    Exec,
}

/// Which end an agent is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// Answers ping-pongs, receives streams; starts first.
    Server,
    /// Starts ping-pongs, sends streams.
    Client,
}

/// Which measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Test {
    /// Half-round-trip latency.
    Pingpong,
    /// One-way bandwidth.
    Stream,
}

impl Test {
    /// The name used on command lines and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Test::Pingpong => "pingpong",
            Test::Stream => "stream",
        }
    }
}

/// Arguments of `xmx bench-agent`.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    /// Channel between the two agents.
    #[arg(long, value_enum)]
    pub transport: AgentTransport,
    /// Which end this is.
    #[arg(long, value_enum, default_value = "server")]
    pub role: Role,
    /// Which measurement.
    #[arg(long, value_enum, default_value = "pingpong")]
    pub test: Test,
    /// Message size in bytes.
    #[arg(long, default_value_t = 0)]
    pub size: u64,
    /// Unmeasured iterations first.
    #[arg(long, default_value_t = 0)]
    pub warmup: u64,
    /// Measured iterations.
    #[arg(long, default_value_t = 1)]
    pub iters: u64,
    /// Network namespace to run in.
    #[arg(long)]
    pub netns: Option<String>,
    /// Interface (afpacket).
    #[arg(long)]
    pub iface: Option<String>,
    /// Payload bytes per frame (afpacket) [default: as much as a 9000-byte frame holds].
    #[arg(long)]
    pub frame_payload: Option<usize>,
    /// The server's address (tcp).
    #[arg(long)]
    pub addr: Option<Ipv4Addr>,
    /// What the server printed after `ready`.
    #[arg(long)]
    pub peer: Option<String>,
    /// The shared file (shm).
    #[arg(long)]
    pub shm: Option<PathBuf>,
    /// Microseconds a waiter polls before it blocks (shm, afpacket).
    #[arg(long, default_value_t = 20)]
    pub spin_us: u64,
    /// Program and arguments (exec).
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// Run an agent to the end; its report goes to stdout.
pub fn run(args: &AgentArgs) -> Result<()> {
    if let Some(ns) = &args.netns {
        xmx_nic::netns::enter(ns)?;
    }
    let size = usize::try_from(args.size).context("message size")?;
    let spin = std::time::Duration::from_micros(args.spin_us);
    let report = match args.transport {
        AgentTransport::Exec => return exec(&args.command),
        AgentTransport::Shm => {
            let path = args.shm.as_deref().context("--shm is required")?;
            let ch = match args.role {
                Role::Server => {
                    let ch = ShmChannel::create(path, size, shm::slots_for(args.size), spin)
                        .with_context(|| format!("creating {}", path.display()))?;
                    ready(None);
                    ch
                }
                Role::Client => ShmChannel::open(path, spin)
                    .with_context(|| format!("opening {}", path.display()))?,
            };
            measure(ch, args, size)?
        }
        AgentTransport::Afpacket => {
            let iface = args.iface.as_deref().context("--iface is required")?;
            let peer = match &args.peer {
                Some(p) => Some(
                    p.parse::<xmx_wire::mxoe::Mac>()
                        .map_err(|e| anyhow::anyhow!("--peer {p}: {e}"))?
                        .0,
                ),
                None => None,
            };
            let ch = AfPacketChannel::open(iface, peer, spin, args.frame_payload)
                .with_context(|| format!("opening {iface}"))?;
            if args.role == Role::Server {
                ready(Some(&xmx_wire::mxoe::Mac(ch.mac()).to_string()));
            }
            measure(ch, args, size)?
        }
        AgentTransport::Tcp => {
            let ip = args.addr.context("--addr is required")?;
            let ch = match args.role {
                Role::Server => {
                    let listener = TcpListener::bind(SocketAddr::from((ip, 0)))
                        .with_context(|| format!("binding {ip}"))?;
                    ready(Some(&listener.local_addr()?.port().to_string()));
                    TcpChannel::accept(&listener)?
                }
                Role::Client => {
                    let port: u16 = args
                        .peer
                        .as_deref()
                        .context("--peer PORT is required")?
                        .parse()
                        .context("--peer")?;
                    TcpChannel::connect(SocketAddr::from((ip, port)))
                        .with_context(|| format!("connecting to {ip}:{port}"))?
                }
            };
            measure(ch, args, size)?
        }
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Tell the driver this server can be reached.
fn ready(token: Option<&str>) {
    match token {
        Some(t) => println!("ready {t}"),
        None => println!("ready"),
    }
}

fn measure<C: Channel>(mut ch: C, args: &AgentArgs, size: usize) -> io::Result<AgentReport> {
    let (w, n) = (args.warmup, args.iters);
    match (args.test, args.role) {
        (Test::Pingpong, Role::Client) => exchange::pingpong_client(&mut ch, size, w, n),
        (Test::Pingpong, Role::Server) => exchange::pingpong_server(&mut ch, size, w, n),
        (Test::Stream, Role::Client) => exchange::stream_sender(&mut ch, size, w, n),
        (Test::Stream, Role::Server) => exchange::stream_receiver(&mut ch, size, w, n),
    }
}

/// Replace this process with `command` (the namespace entered above stays).
fn exec(command: &[String]) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let Some((prog, rest)) = command.split_first() else {
        bail!("exec: no command given after --");
    };
    let err = std::process::Command::new(prog).args(rest).exec();
    Err(err).with_context(|| format!("executing {prog}"))
}

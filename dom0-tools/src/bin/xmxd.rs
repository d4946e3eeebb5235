//! `xmxd`: the dom0 peer-table and lifecycle service of xmx.
//!
//! Attaches the xmx device to the guests configured for it as they start, detaches it as
//! they go, exchanges guest lists with the other hosts' xmxd over MXoE RAW frames on
//! `--iface`, and pushes the resulting peer table to the local `xmx-backd`. The platform
//! comes from the environment (`XMX_PLATFORM`, and for the simulator `XMX_SIM_DIR`,
//! `XMX_DOMID`). SIGTERM or SIGINT stops it; guests keep their devices.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use xmx_tools::xmxd::state::DEFAULT_STATE_DIR;
use xmx_tools::xmxd::{self, discovery::DiscoveryConfig, PacketFabric, Xmxd, XmxdConfig};

/// How long the orderly stop after SIGTERM may take before the process ends anyway.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// The xmx peer-table and lifecycle service of one host.
#[derive(Debug, Parser)]
#[command(
    name = "xmxd",
    version,
    about = "The xmx peer-table and lifecycle service of one host"
)]
struct XmxdArgs {
    /// The interface the backend serves (discovery frames go there); `none`: this host only.
    #[arg(long)]
    iface: String,
    /// This host's name, as other hosts show it [default: the kernel's hostname].
    #[arg(long)]
    hostname: Option<String>,
    /// The domain xmxd and the backend run in.
    #[arg(long, default_value_t = 0)]
    domid: u16,
    /// Where the state (clusters, guests, indices) is kept.
    #[arg(long, default_value = DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// The control socket for `xmx` [default: $XMX_SIM_DIR/xmxd.sock on the simulator,
    /// /run/xmx/xmxd.sock on Xen].
    #[arg(long)]
    control: Option<PathBuf>,
    /// The backend's control socket; `none` to run without a backend [default: where
    /// xmx-backd puts it].
    #[arg(long)]
    backend_socket: Option<String>,
    /// Milliseconds between two announcements of this host's guests; others forget us
    /// after four silent intervals (and never sooner than after 8 s), unless `--ttl-ms`
    /// says otherwise.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(10..=600_000))]
    announce_ms: u64,
    /// Milliseconds other hosts keep this host's guests without news from it [default:
    /// four announcement intervals].
    #[arg(long, value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    ttl_ms: Option<u64>,
}

fn main() -> ExitCode {
    let args = XmxdArgs::parse();
    xmx_hv::daemon::main(|| run(args))
}

fn run(args: XmxdArgs) -> Result<(), String> {
    // Before any thread exists (see block_stop_signals).
    let signals = xmx_hv::daemon::block_stop_signals()?;
    let platform =
        xmx_hv::platform::from_env_as(Some(args.domid)).map_err(|e| format!("platform: {e}"))?;
    let fabric = if args.iface == "none" {
        tracing::warn!("no interface: this host's guests only");
        None
    } else {
        Some(PacketFabric::open(&args.iface).map_err(|e| format!("{}: {e}", args.iface))?)
    };
    let mut cfg = XmxdConfig::new(
        &args
            .hostname
            .unwrap_or_else(xmx_hv::daemon::kernel_host_name),
        &args.state_dir,
    );
    cfg.toolstack = args.domid;
    cfg.discovery = DiscoveryConfig::every(Duration::from_millis(args.announce_ms));
    if let Some(ttl) = args.ttl_ms {
        cfg.discovery.ttl = Duration::from_millis(ttl).max(cfg.discovery.interval);
    }
    cfg.settle = cfg.discovery.interval;
    cfg.control_socket = Some(args.control.unwrap_or_else(xmxd::default_control_socket));
    cfg.backend_socket = match args.backend_socket.as_deref() {
        Some("none") => None,
        Some(path) => Some(PathBuf::from(path)),
        None => Some(xmxd::default_backend_socket()),
    };
    let service = Xmxd::start(platform.as_ref(), fabric, cfg).map_err(|e| e.to_string())?;
    let stopper = service.stopper();
    xmx_hv::daemon::stop_on_signals(signals, "xmxd-signals", STOP_GRACE, move || stopper.stop())?;
    service.join().map_err(|e| e.to_string())
}

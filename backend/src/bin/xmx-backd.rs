//! `xmx-backd`: the dom0 backend daemon of device `xmx`.
//!
//! Serves every guest's xmx device from one thread: xenbus handshake, control and endpoint
//! rings, the MX engine, and MXoE frames on `--iface` over AF_PACKET. The platform comes from
//! the environment (`XMX_PLATFORM`, and for the simulator `XMX_SIM_DIR`, `XMX_DOMID`).
//! SIGTERM or SIGINT moves every device to Closing, releases what guests shared and exits 0.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use xmx_backend::service::{Backend, BackendConfig, FrameLink, GuestQuotas};
use xmx_engine::{pull_reply_frames_for, EngineConfig};
use xmx_nic::{NicConfig, PacketSocket};

/// How long the orderly stop after SIGTERM may take before the process ends anyway.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// The dom0 backend of the xmx split driver.
#[derive(Debug, Parser)]
#[command(name = "xmx-backd", version, about)]
struct BackdArgs {
    /// Physical interface carrying MXoE frames; `none` serves co-located guests only.
    #[arg(long)]
    iface: String,
    /// Domain this backend runs in.
    #[arg(long, default_value_t = 0)]
    domid: u16,
    /// Microseconds an idle service loop keeps polling (yielding the core between
    /// rounds) before it sleeps.
    #[arg(long = "spin-us", env = "XMX_BACKD_SPIN_US", default_value_t = 200, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    spin_us: u64,
    /// This host's name (guests without a hostname are named after it).
    #[arg(long)]
    hostname: Option<String>,
    /// Path of the status and control socket [default: $XMX_SIM_DIR/backd.sock on the
    /// simulator, /run/xmx/backd.sock on Xen].
    #[arg(long)]
    control: Option<PathBuf>,
    /// Endpoints a guest may have open at once.
    #[arg(long, default_value_t = GuestQuotas::default().max_endpoints)]
    max_endpoints: usize,
    /// Regions an endpoint may have registered at once.
    #[arg(long, default_value_t = GuestQuotas::default().max_regions_per_endpoint)]
    max_regions: usize,
    /// Guest pages a guest may have mapped in dom0 at once.
    #[arg(long, default_value_t = GuestQuotas::default().max_mapped_pages)]
    max_mapped_pages: usize,
    /// Do not put the interface in promiscuous mode (guests' MACs then need the NIC's
    /// unicast filter to pass them).
    #[arg(long)]
    no_promiscuous: bool,
    /// Milliseconds a pull waits for replies before requesting its blocks again.
    #[arg(long, env = "XMX_PULL_TIMEOUT_MS", default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pull_timeout_ms: u64,
    /// Re-requests without progress after which a pull fails (each waits twice the one
    /// before, up to 2 s; the default, 60, waits out about two minutes of silence, such
    /// as a source guest that real Xen is migrating).
    #[arg(long, env = "XMX_PULL_RETRIES", default_value_t = EngineConfig::default().pull_retries_max, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pull_retries: u32,
    /// Frames' worth of data (4 KiB each) one frame carries between xmx hosts, a
    /// PULL_REPLY or a MEDIUM fragment, 1 to 8 (default: as many as the interface's MTU
    /// takes, 2 at 9000). 1 keeps to MX's frames, for a fabric whose switches drop frames
    /// the interfaces would take. MX and Open-MX peers are never asked for more than
    /// one, nor sent more.
    #[arg(long, env = "XMX_PULL_REPLY_FRAMES", value_parser = clap::value_parser!(u8).range(1..=8))]
    pull_reply_frames: Option<u8>,
    /// KiB of a guest's pull landed in order after which its library is told, so that it
    /// copies them out of its window while the rest arrives (0: only at the end).
    #[arg(long, env = "XMX_PULL_PROGRESS_KIB", default_value_t = EngineConfig::default().pull_progress_step >> 10, value_parser = clap::value_parser!(u32).range(0..=1 << 21))]
    pull_progress_kib: u32,
}

fn default_control_socket() -> PathBuf {
    let sim = std::env::var("XMX_PLATFORM").map_or(true, |p| p == "sim" || p.is_empty());
    match std::env::var_os("XMX_SIM_DIR") {
        Some(dir) if sim => PathBuf::from(dir).join("backd.sock"),
        _ => PathBuf::from("/run/xmx/backd.sock"),
    }
}

fn main() -> ExitCode {
    let args = BackdArgs::parse();
    xmx_hv::daemon::main(|| run(args))
}

fn run(args: BackdArgs) -> Result<(), String> {
    // Before any thread exists (see block_stop_signals).
    let signals = xmx_hv::daemon::block_stop_signals()?;

    let platform =
        xmx_hv::platform::from_env_as(Some(args.domid)).map_err(|e| format!("platform: {e}"))?;
    if platform.domid() != args.domid {
        return Err(format!(
            "the platform says this is domain {}, --domid says {}",
            platform.domid(),
            args.domid
        ));
    }
    let mut pull_frame_budget = EngineConfig::default().pull_frame_budget;
    let mut pull_reply_frames = EngineConfig::default().pull_reply_frames;
    let link: Option<Box<dyn FrameLink>> = if args.iface == "none" {
        tracing::warn!("no interface: only co-located guests can talk");
        None
    } else {
        let cfg = NicConfig {
            promiscuous: !args.no_promiscuous,
            ..NicConfig::default()
        };
        let sock =
            PacketSocket::open(&args.iface, cfg).map_err(|e| format!("{}: {e}", args.iface))?;
        tracing::info!(iface = %args.iface, mac = %sock.mac(), mtu = sock.mtu(), "NIC open");
        // Half the receive ring: the other half is for every other frame that arrives
        // while a burst of replies waits to be read.
        pull_frame_budget = u32::try_from(sock.rx_ring_frames() / 2).unwrap_or(u32::MAX);
        pull_reply_frames = pull_reply_frames_for(sock.max_frame_len());
        Some(Box::new(sock))
    };
    let cfg = BackendConfig {
        spin: Duration::from_micros(args.spin_us),
        host_name: args
            .hostname
            .unwrap_or_else(xmx_hv::daemon::kernel_host_name),
        quotas: GuestQuotas {
            max_endpoints: args.max_endpoints,
            max_regions_per_endpoint: args.max_regions,
            max_mapped_pages: args.max_mapped_pages,
            ..GuestQuotas::default()
        },
        control_socket: Some(args.control.unwrap_or_else(default_control_socket)),
        engine: EngineConfig {
            pull_retransmit_timeout: Duration::from_millis(args.pull_timeout_ms.max(1)),
            pull_retries_max: args.pull_retries,
            pull_frame_budget,
            pull_reply_frames: args.pull_reply_frames.unwrap_or(pull_reply_frames),
            pull_progress_step: args.pull_progress_kib << 10,
            ..EngineConfig::default()
        },
    };
    let backend = Backend::new(platform.as_ref(), link, cfg).map_err(|e| e.to_string())?;
    let stopper = backend.stopper();
    xmx_hv::daemon::stop_on_signals(signals, "backd-signals", STOP_GRACE, move || stopper.stop())?;
    backend.run().map_err(|e| e.to_string())
}

//! `xmx-frontd`: the guest daemon of device `xmx`.
//!
//! Runs inside a guest (on the simulator: `XMX_SIM_DIR`, `XMX_DOMID`; on Xen:
//! `XMX_PLATFORM=linux`), does the xenbus handshake with the dom0 backend, and serves
//! applications on a unix socket: it opens endpoints and registers regions for them and
//! hands over the shared memory and event channels as file descriptors. An application
//! that disconnects (or dies) has its endpoints closed. SIGTERM or SIGINT tells the
//! applications, closes the device (Closing, then Closed once the backend let go) and
//! exits 0; a second signal, or a stop that outlives its bounds, exits at once. The
//! daemon follows the device when dom0 removes it and creates it again (a move to
//! another virtual cluster): it reconnects and re-opens the applications' endpoints.

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use nix::sys::eventfd::{EfdFlags, EventFd};
use xmx_frontend::{Frontend, FrontendConfig};
use xmx_guests::{Server, ServerConfig};
use xmx_wire::msg::EndpointPages;

/// The guest daemon of the xmx split driver.
#[derive(Debug, Parser)]
#[command(name = "xmx-frontd", version, about)]
struct FrontdArgs {
    /// Where applications connect.
    #[arg(
        long,
        env = "XMX_FRONTD_SOCKET",
        default_value = "/run/xmx/frontd.sock"
    )]
    socket: PathBuf,
    /// Device index of the guest's xmx device.
    #[arg(long, default_value_t = 0)]
    devid: u32,
    /// Seconds to wait for the toolstack to create the device.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    device_timeout: u64,
    /// Seconds a control request may wait for the backend.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    ctrl_timeout: u64,
    /// Milliseconds applications get to disconnect when the daemon stops.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    drain_ms: u64,
    /// Keep no region registered across messages (published as feature-rcache=0).
    #[arg(long)]
    no_rcache: bool,
    /// Default endpoint geometry: send-ring pages, event-ring pages, send-queue and
    /// receive-queue pages, as `S,E,SQ,RQ`.
    #[arg(long, value_parser = parse_geometry)]
    endpoint_pages: Option<EndpointPages>,
    /// Applications served at once.
    #[arg(long, default_value_t = 128)]
    max_clients: usize,
    /// Domain of the toolstack whose xmxd brokers direct channels (the libraries read
    /// the same variable).
    #[arg(long, env = "XMX_TOOLSTACK_DOMID", default_value_t = 0)]
    toolstack_domid: u16,
}

fn parse_geometry(s: &str) -> Result<EndpointPages, String> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    let [a, b, c, d] = parts.as_slice() else {
        return Err("expected S,E,SQ,RQ".into());
    };
    let g = EndpointPages {
        send_ring: a.parse().map_err(|e| format!("send ring: {e}"))?,
        event_ring: b.parse().map_err(|e| format!("event ring: {e}"))?,
        send_queue: c.parse().map_err(|e| format!("send queue: {e}"))?,
        recv_queue: d.parse().map_err(|e| format!("receive queue: {e}"))?,
    };
    xmx_frontend::handoff::check_geometry(&g).map_err(|e| e.to_string())?;
    Ok(g)
}

fn main() -> ExitCode {
    let args = FrontdArgs::parse();
    xmx_hv::daemon::main(|| run(args))
}

fn run(args: FrontdArgs) -> Result<(), String> {
    // Before any thread exists (see block_stop_signals).
    let signals = xmx_hv::daemon::block_stop_signals()?;
    let stop = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
        .map_err(|e| format!("eventfd: {e}"))?;
    let stop_writer = stop
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| format!("eventfd: {e}"))?;
    // The orderly stop is bounded by the drain and the device's close; a stop that
    // outlives them, or a second signal, ends the process at once.
    let grace = Duration::from_millis(args.drain_ms) + CLOSE_TIMEOUT + Duration::from_secs(2);
    xmx_hv::daemon::stop_on_signals(signals, "frontd-signals", grace, move || {
        let _ = nix::unistd::write(&stop_writer, &1u64.to_ne_bytes());
    })?;

    let platform = xmx_hv::platform::from_env().map_err(|e| format!("platform: {e}"))?;
    let present = Frontend::wait_for_device_or_stop(
        platform.as_ref(),
        args.devid,
        Duration::from_secs(args.device_timeout),
        Some(stop.as_fd()),
    )
    .map_err(|e| format!("waiting for device {}: {e}", args.devid))?;
    if !present {
        tracing::info!("stopped before the device appeared");
        return Ok(());
    }
    let mut cfg = FrontendConfig {
        devid: args.devid,
        rcache: !args.no_rcache,
        ctrl_timeout: Duration::from_secs(args.ctrl_timeout),
        close_timeout: CLOSE_TIMEOUT,
        ..FrontendConfig::default()
    };
    if let Some(g) = args.endpoint_pages {
        cfg.endpoint_pages = g;
    }
    let frontend = Frontend::new(platform, cfg).map_err(|e| format!("frontend: {e}"))?;
    let server = Server::new(
        frontend,
        ServerConfig {
            socket: args.socket,
            max_clients: args.max_clients,
            drain: Duration::from_millis(args.drain_ms),
            toolstack: args.toolstack_domid,
            ..ServerConfig::default()
        },
    )
    .map_err(|e| format!("socket: {e}"))?;
    server.run(stop.as_fd()).map_err(|e| e.to_string())
}

/// How long closing the device waits for the backend to let go.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometries_parse_and_are_checked() {
        let g = parse_geometry("1, 2,30,40").unwrap();
        assert_eq!(
            (g.send_ring, g.event_ring, g.send_queue, g.recv_queue),
            (1, 2, 30, 40)
        );
        for bad in [
            "",
            "1,2,3",
            "1,2,3,4,5",
            "0,1,1,1",
            "9,1,1,1",
            "1,1,0,1",
            "1,1,x,1",
            "1,1,1000,1000",
        ] {
            assert!(parse_geometry(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_arguments_are_consistent() {
        use clap::CommandFactory;
        FrontdArgs::command().debug_assert();
    }
}

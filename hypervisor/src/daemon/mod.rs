//! How a daemon of the platform starts: every xmx daemon (xmx-simhv, xmx-backd, xmxd,
//! xmx-frontd) logs alike, takes its stop signals alike and names its host alike, so the
//! administrator meets one behaviour and each daemon's `main` keeps only what is its own.
//!
//! Their control sockets are served and called alike too ([`control`]). That part is built
//! without the `daemon` feature: the clients of those sockets (tools, tests, [`crate::sim`]'s
//! admin client) are not daemons.

pub mod control;

use nix::sys::signal::{SigSet, Signal};

/// Logs to standard error through `tracing`, filtered by `RUST_LOG` (`info` when unset or
/// unreadable).
#[cfg(feature = "daemon")]
pub fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Starts logging, then runs the daemon: an error it returns is logged and the process
/// exits with failure.
#[cfg(feature = "daemon")]
pub fn main(run: impl FnOnce() -> Result<(), String>) -> std::process::ExitCode {
    init_logging();
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Blocks SIGTERM and SIGINT in the calling thread and returns their set, to be taken
/// synchronously (`sigwait`) by one thread. Call it before any thread exists: threads
/// inherit the mask, so no other thread is interrupted by a stop.
pub fn block_stop_signals() -> Result<SigSet, String> {
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals
        .thread_block()
        .map_err(|e| format!("blocking signals: {e}"))?;
    Ok(signals)
}

/// This machine's host name (the kernel's), or `xmx` when it has none.
pub fn kernel_host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "xmx".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_name_is_never_empty() {
        let name = kernel_host_name();
        assert!(!name.is_empty() && name == name.trim(), "{name:?}");
    }

    #[test]
    fn the_stop_signals_are_blocked_in_the_caller() {
        // A thread of its own: the mask is the calling thread's.
        std::thread::spawn(|| {
            let set = block_stop_signals().unwrap();
            let now = SigSet::thread_get_mask().unwrap();
            for s in [Signal::SIGTERM, Signal::SIGINT] {
                assert!(set.contains(s) && now.contains(s), "{s:?}");
            }
        })
        .join()
        .unwrap();
    }
}

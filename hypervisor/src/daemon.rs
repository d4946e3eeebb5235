//! How a daemon of the platform starts: every xmx daemon (xmx-simhv, xmx-backd, xmxd,
//! xmx-frontd) logs alike, takes its stop signals alike and names its host alike, so the
//! administrator meets one behaviour and each daemon's `main` keeps only what is its own.

use std::process::ExitCode;

use nix::sys::signal::{SigSet, Signal};
use tracing_subscriber::EnvFilter;

/// Logs to standard error through `tracing`, filtered by `RUST_LOG` (`info` when unset or
/// unreadable).
pub fn init_logging() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Starts logging, then runs the daemon: an error it returns is logged and the process
/// exits with failure.
pub fn main(run: impl FnOnce() -> Result<(), String>) -> ExitCode {
    init_logging();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
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

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

/// Takes the stop signals (blocked by [`block_stop_signals`]) on a thread named `name`: the
/// first SIGTERM or SIGINT runs `stop`, the daemon's orderly stop; a second one, or `grace`
/// passing without the process having exited, ends the process with failure, so a stop
/// that hangs (a peer that never lets go, a wedged thread) never keeps it alive.
pub fn stop_on_signals(
    signals: SigSet,
    name: &str,
    grace: std::time::Duration,
    stop: impl FnOnce() + Send + 'static,
) -> Result<(), String> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let Ok(sig) = signals.wait() else { return };
            tracing::info!(signal = ?sig, "stopping");
            stop();
            if let Some(second) = wait_signal_within(&signals, grace) {
                tracing::warn!(signal = second, "second signal; exiting now");
            } else {
                tracing::warn!(?grace, "the orderly stop takes too long; exiting now");
            }
            std::process::exit(1);
        })
        .map(drop)
        .map_err(|e| format!("signal thread: {e}"))
}

/// The number of a signal of `signals` taken within `timeout`, if one comes.
fn wait_signal_within(signals: &SigSet, timeout: std::time::Duration) -> Option<i32> {
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    loop {
        // SAFETY: sigtimedwait reads the signal set and the timeout, both valid for the
        // call, and is given no siginfo buffer (null is allowed).
        let r = unsafe { libc::sigtimedwait(signals.as_ref(), std::ptr::null_mut(), &ts) };
        if r > 0 {
            return Some(r);
        }
        // EINTR restarts the whole grace; any other failure (EAGAIN) is the timeout.
        if nix::errno::Errno::last() != nix::errno::Errno::EINTR {
            return None;
        }
    }
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

    /// The role a re-run of this test binary plays: a daemon whose orderly stop never ends.
    const ROLE_ENV: &str = "XMX_DAEMON_TEST_HANGING_STOP_GRACE_MS";

    #[test]
    fn role_a_daemon_whose_stop_hangs() {
        let Ok(grace) = std::env::var(ROLE_ENV) else {
            return;
        };
        let grace = std::time::Duration::from_millis(grace.parse().unwrap());
        let signals = block_stop_signals().unwrap();
        stop_on_signals(signals, "test-signals", grace, || {}).unwrap();
        println!("ready");
        loop {
            std::thread::park();
        }
    }

    /// Runs the hanging daemon, sends it `signals` once it is ready, and returns its exit
    /// code (the test fails if it outlives 20 s).
    fn hanging_daemon_exit(grace_ms: u64, signals: &[Signal]) -> Option<i32> {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "daemon::tests::role_a_daemon_whose_stop_hangs",
            "--exact",
            "--nocapture",
        ])
        .env(ROLE_ENV, grace_ms.to_string())
        .stdout(std::process::Stdio::piped());
        // The test harness starts threads before any test runs; a daemon blocks the stop
        // signals before it has any. The mask survives exec, so the role starts as a
        // daemon does, every thread with them blocked.
        // SAFETY: runs in the forked child before exec and only changes its signal mask
        // (pthread_sigmask is async-signal-safe); no memory is touched.
        unsafe {
            cmd.pre_exec(|| {
                let mut set = SigSet::empty();
                set.add(Signal::SIGTERM);
                set.add(Signal::SIGINT);
                set.thread_block().map_err(std::io::Error::from)
            });
        }
        let mut child = cmd.spawn().unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while !line.starts_with("ready") {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "the role ended before ready"
            );
        }
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        for &s in signals {
            nix::sys::signal::kill(pid, s).unwrap();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status.code();
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("the daemon outlived its stop");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    #[test]
    fn a_second_stop_signal_ends_a_stop_that_hangs() {
        // The grace is far beyond the test's bound: only the second signal can end it.
        // Two different signals, because a second SIGTERM pending with the first is one.
        let code = hanging_daemon_exit(600_000, &[Signal::SIGTERM, Signal::SIGINT]);
        assert_eq!(code, Some(1));
    }

    #[test]
    fn a_stop_that_outlives_its_grace_ends_the_process() {
        assert_eq!(hanging_daemon_exit(200, &[Signal::SIGTERM]), Some(1));
    }
}

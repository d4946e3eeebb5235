//! Ctrl-C (SIGINT), SIGTERM and SIGHUP for commands that build things: namespaces,
//! daemons, files in /dev/shm.
//!
//! Left to its default action, a signal ends the process where it stands and whatever the
//! command built stays behind. Once [`install`]ed, a signal instead
//!
//! - is recorded ([`received`], [`check`]), so the command stops at its next step and
//!   leaves through its ordinary error path, which removes what it built;
//! - ends the command's foreground helpers at once: its direct children that share its
//!   process group (measuring agents, the C compiler, `ip`). Whatever the command is
//!   waiting for then returns now instead of at its timeout. Daemons started in a process
//!   group of their own are not touched: stopping them is the teardown's job.
//!
//! The handler only writes the signal number to a pipe, which is async-signal-safe; a
//! thread reading the pipe does the rest outside signal context. While a [`Shield`] is
//! held (during a teardown), helpers are left alone, since they are then the teardown's own
//! commands. The [`FORCE_AFTER`]th signal ends the process at once: the way out of a
//! teardown that hangs.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::unistd::{getpgrp, getpid, Pid};

/// The signals handled.
pub const SIGNALS: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];
/// The signal count at which the process exits at once, cleanup or not.
pub const FORCE_AFTER: u32 = 3;

/// The first signal received (0: none).
static FIRST: AtomicI32 = AtomicI32::new(0);
/// Signals received so far.
static COUNT: AtomicU32 = AtomicU32::new(0);
/// Write end of the pipe to the watcher thread (-1 until installed).
static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);
/// Live [`Shield`]s.
static SHIELDS: AtomicUsize = AtomicUsize::new(0);
/// What to tell the user when a forced exit leaves things behind.
static FORCE_HINT: Mutex<Option<String>> = Mutex::new(None);
static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
/// Signals the watcher thread has finished acting on, and a condition to wait for more.
static HANDLED: Mutex<u32> = Mutex::new(0);
static HANDLED_CHANGED: Condvar = Condvar::new();

/// A command was interrupted by a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("interrupted by {signal}")]
pub struct Interrupted {
    /// The (first) signal received.
    pub signal: Signal,
}

impl Interrupted {
    /// The exit status a shell reports for a process this signal ended: 128 + its number.
    pub fn exit_code(&self) -> i32 {
        128 + self.signal as i32
    }
}

extern "C" fn on_signal(signo: libc::c_int) {
    // Only async-signal-safe operations here: atomics and write(2). errno is restored, as
    // the interrupted code may be about to read it.
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    let errno = unsafe { *libc::__errno_location() };
    let _ = FIRST.compare_exchange(0, signo, Ordering::AcqRel, Ordering::Acquire);
    let fd = PIPE_WRITE.load(Ordering::Acquire);
    if fd >= 0 {
        let byte = signo as u8;
        // SAFETY: `byte` lives across the call and is one byte long; `fd` is the write end
        // of the pipe made in `install`, which is never closed. It is non-blocking, so a
        // full pipe drops the byte instead of blocking the handler.
        unsafe { libc::write(fd, (&byte as *const u8).cast(), 1) };
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Handle [`SIGNALS`] as the module describes, from now on, for the whole process.
/// Idempotent.
pub fn install() -> Result<(), String> {
    INSTALLED.get_or_init(install_once).clone()
}

fn install_once() -> Result<(), String> {
    let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| format!("signal pipe: {e}"))?;
    nix::fcntl::fcntl(
        write_end.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .map_err(|e| format!("signal pipe: {e}"))?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || watch(read_end))
        .map_err(|e| format!("signal thread: {e}"))?;
    // The write end stays open for the life of the process: the handler may run any time.
    PIPE_WRITE.store(
        std::mem::ManuallyDrop::new(write_end).as_raw_fd(),
        Ordering::Release,
    );
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in SIGNALS {
        // SAFETY: the handler only touches atomics and calls write(2), which are
        // async-signal-safe; no previous handler is chained or needed.
        unsafe { sigaction(sig, &action) }.map_err(|e| format!("handling {sig}: {e}"))?;
    }
    Ok(())
}

/// The first signal received since [`install`], if any.
pub fn received() -> Option<Signal> {
    match FIRST.load(Ordering::Acquire) {
        0 => None,
        n => Signal::try_from(n).ok(),
    }
}

/// `Err` once a signal was received: the point where a command stops and cleans up.
pub fn check() -> Result<(), Interrupted> {
    match received() {
        Some(signal) => Err(Interrupted { signal }),
        None => Ok(()),
    }
}

/// Set what a forced exit (the [`FORCE_AFTER`]th signal) tells the user, e.g. the command
/// that removes what may be left.
pub fn set_force_hint(hint: Option<String>) {
    *FORCE_HINT.lock().unwrap_or_else(|e| e.into_inner()) = hint;
}

/// While held, a signal does not end the process's helpers (see the module documentation).
#[must_use = "the shield protects helpers only while held"]
pub struct Shield(());

/// Protect the helpers started from now until the returned [`Shield`] is dropped.
pub fn shield() -> Shield {
    SHIELDS.fetch_add(1, Ordering::AcqRel);
    Shield(())
}

impl Drop for Shield {
    fn drop(&mut self) {
        SHIELDS.fetch_sub(1, Ordering::AcqRel);
    }
}

fn watch(read_end: OwnedFd) {
    let mut pipe = File::from(read_end);
    let mut byte = [0u8; 1];
    loop {
        match pipe.read(&mut byte) {
            Ok(1) => {}
            Ok(_) => return,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
        let count = COUNT.fetch_add(1, Ordering::AcqRel) + 1;
        let name = Signal::try_from(i32::from(byte[0])).map_or("a signal", Signal::as_str);
        if count >= FORCE_AFTER {
            let hint = FORCE_HINT.lock().unwrap_or_else(|e| e.into_inner()).clone();
            eprintln!(
                "xmx: {name} again: exiting now, without cleaning up{}",
                hint.map(|h| format!("; what is left can be removed with `{h}`"))
                    .unwrap_or_default()
            );
            std::process::exit(128 + i32::from(byte[0]));
        }
        if SHIELDS.load(Ordering::Acquire) > 0 {
            eprintln!(
                "xmx: {name}: cleaning up already; {} more to exit at once",
                FORCE_AFTER - count
            );
        } else {
            eprintln!("xmx: {name}: stopping and cleaning up");
            let ended = end_helpers();
            tracing::debug!(?ended, "helpers ended after {name}");
        }
        *HANDLED.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        HANDLED_CHANGED.notify_all();
    }
}

/// Signals whose handling (ending helpers, or not under a [`Shield`]) is complete.
pub fn handled() -> u32 {
    *HANDLED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Wait until at least `n` signals were handled, up to `timeout`; whether they were.
pub fn wait_handled(n: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut done = HANDLED.lock().unwrap_or_else(|e| e.into_inner());
    while *done < n {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        done = HANDLED_CHANGED
            .wait_timeout(done, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    true
}

/// SIGKILL every direct child of this process that is in this process's group; returns
/// their pids.
pub fn end_helpers() -> Vec<i32> {
    let me = getpid().as_raw();
    let group = getpgrp().as_raw();
    let mut ended = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return ended;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if parent_and_group(&stat) == Some((me, group))
            && kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok()
        {
            ended.push(pid);
        }
    }
    ended
}

/// The parent pid and process group of a `/proc/PID/stat` line. The command name in
/// parentheses may hold spaces and parentheses, so fields are counted after the last `)`.
pub fn parent_and_group(stat: &str) -> Option<(i32, i32)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let _state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((ppid, pgrp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_read_after_the_command_name() {
        assert_eq!(
            parent_and_group("4242 (xmx bench) S 17 4242 4242 0 -1 4194560 1 0"),
            Some((17, 4242))
        );
        assert_eq!(parent_and_group("9 (a) b) (c) R 1 9 9 0"), Some((1, 9)));
        assert_eq!(parent_and_group("9 (cut"), None);
        assert_eq!(parent_and_group("9 (x) S one 9"), None);
        assert_eq!(parent_and_group(""), None);
    }

    #[test]
    fn exit_codes_are_the_shells() {
        assert_eq!(
            Interrupted {
                signal: Signal::SIGINT
            }
            .exit_code(),
            130
        );
        assert_eq!(
            Interrupted {
                signal: Signal::SIGTERM
            }
            .exit_code(),
            143
        );
        assert_eq!(
            Interrupted {
                signal: Signal::SIGINT
            }
            .to_string(),
            "interrupted by SIGINT"
        );
    }
}

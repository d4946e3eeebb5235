//! Waiting on events, not on the clock: a file appearing, a process ending.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

fn poll_timeout(left: Duration) -> PollTimeout {
    PollTimeout::try_from(left.as_millis().min(i32::MAX as u128) as i32).unwrap_or(PollTimeout::MAX)
}

/// Wait until `path` exists (created or renamed into place), up to `timeout`.
pub fn file_appears(path: &Path, timeout: Duration) -> Result<()> {
    let dir = path.parent().context("path without a parent")?;
    let ino = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)?;
    ino.add_watch(dir, AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
        .with_context(|| format!("watching {}", dir.display()))?;
    let deadline = Instant::now() + timeout;
    // The watch is armed before this check, so a file that appears in between is not missed.
    while !path.exists() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("{} did not appear within {:?}", path.display(), timeout);
        }
        let mut fds = [PollFd::new(ino.as_fd(), PollFlags::POLLIN)];
        poll(&mut fds, poll_timeout(left))?;
        // Drain; the loop condition re-checks the path itself.
        let _ = ino.read_events();
    }
    Ok(())
}

/// A pidfd for `pid`, or None if the process is gone.
fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1; no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the syscall returned a fresh descriptor that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Wait until process `pid` (not necessarily our child) has exited, up to `timeout`.
/// Returns whether it exited.
pub fn process_exits(pid: i32, timeout: Duration) -> bool {
    let Some(fd) = pidfd_open(pid) else {
        return true;
    };
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, poll_timeout(timeout)) {
        Ok(n) => n > 0 || fd.as_raw_fd() < 0,
        Err(_) => false,
    }
}

/// Whether `pid` is a running process. A zombie (exited, not yet reaped by whoever inherited
/// it) counts as gone.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state letter follows the parenthesised command name, which may hold spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

//! Freezing a simulated domain's processes for the last round of a migration.
//!
//! Suspending a simulated domain pauses its hypervisor operations, but its processes go
//! on running and may write its memory: a write after the last round was read would be
//! lost on the destination. So the processes the simhv names as the domain's (see
//! [`super::admin::SimAdmin::processes`]) are stopped with `SIGSTOP` before the last
//! round and continued with `SIGCONT` afterwards, on the destination once the domain runs
//! there or on the source when the migration rolls back.
//!
//! Why signals and not a cgroup freezer: a simulated host is a network namespace only,
//! so the domain's processes share the pid namespace and the cgroups of whoever started
//! them (a test, a shell, `xmx sim run`); nothing puts a domain's processes in a cgroup
//! of their own, and moving them into one would change their accounting and limits.
//! The cgroup interface also differs between machines (v1 `freezer` or v2
//! `cgroup.freeze`, delegated or not). `SIGSTOP` needs none of that, cannot be caught or
//! ignored, and stops every thread of a process; whether it took effect is read from
//! `/proc/PID/task/*/stat`. Its cost: a `SIGCONT` from anyone else would wake a process
//! early (none of the simulator's tools sends one), and a parent waiting with
//! `WUNTRACED` would see the stop.

use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::{Error, Result};

/// How often a freeze checks whether the processes stopped. A process stopping gives
/// no event to a process that is not its parent, so the check polls `/proc`.
const STOP_POLL: Duration = Duration::from_millis(1);

/// Processes stopped by [`FrozenProcesses::freeze`]; continued by
/// [`FrozenProcesses::thaw`] or when dropped.
#[derive(Debug)]
pub struct FrozenProcesses {
    pids: Vec<i32>,
}

impl FrozenProcesses {
    /// Stop every process of `pids` and wait, at most `timeout`, until each one's
    /// threads are all stopped (or it is gone). This process is never stopped. On a
    /// timeout the processes are continued again and the error names one that did not
    /// stop.
    pub fn freeze(pids: &[i32], timeout: Duration) -> Result<FrozenProcesses> {
        let me = std::process::id() as i32;
        let mut frozen = FrozenProcesses { pids: Vec::new() };
        for &pid in pids {
            if pid <= 0 || pid == me || frozen.pids.contains(&pid) {
                continue;
            }
            match kill(Pid::from_raw(pid), Signal::SIGSTOP) {
                Ok(()) => frozen.pids.push(pid),
                // Gone already: nothing of it can write any more.
                Err(Errno::ESRCH) => {}
                Err(e) => {
                    return Err(Error::Denied(format!("stopping process {pid}: {e}")));
                }
            }
        }
        let deadline = Instant::now() + timeout;
        for &pid in &frozen.pids {
            while !is_stopped(pid) {
                if Instant::now() >= deadline {
                    return Err(Error::Busy(format!(
                        "process {pid} of the domain did not stop within {} ms",
                        timeout.as_millis()
                    )));
                }
                std::thread::sleep(STOP_POLL);
            }
        }
        tracing::debug!(pids = ?frozen.pids, "processes frozen");
        Ok(frozen)
    }

    /// The processes stopped.
    pub fn pids(&self) -> &[i32] {
        &self.pids
    }

    /// Continue every process.
    pub fn thaw(mut self) {
        self.continue_all();
    }

    fn continue_all(&mut self) {
        for pid in self.pids.drain(..) {
            match kill(Pid::from_raw(pid), Signal::SIGCONT) {
                Ok(()) | Err(Errno::ESRCH) => {}
                Err(e) => tracing::warn!(pid, error = %e, "continuing a frozen process"),
            }
        }
    }
}

impl Drop for FrozenProcesses {
    fn drop(&mut self) {
        self.continue_all();
    }
}

/// Whether every thread of `pid` is stopped (or the process is gone or a zombie).
pub fn is_stopped(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            // The thread ended meanwhile.
            continue;
        };
        match stat_state(&stat) {
            Some('T' | 't' | 'Z' | 'X') | None => {}
            Some(_) => return false,
        }
    }
    true
}

/// The state letter of a `/proc/.../stat` line: the field after the command name, which
/// is in parentheses and may itself hold spaces and parentheses.
fn stat_state(stat: &str) -> Option<char> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().next()?.chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn the_state_letter_follows_the_command_name() {
        assert_eq!(stat_state("42 (a) b) T 1 2"), Some('T'));
        assert_eq!(stat_state("42 (sleep) S 1 2"), Some('S'));
        assert_eq!(stat_state("nonsense"), None);
    }

    #[test]
    fn a_frozen_process_stops_and_thaws() {
        let mut child = Command::new("sleep")
            .arg("30")
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        assert!(!is_stopped(pid));
        let frozen = FrozenProcesses::freeze(
            &[pid, pid, std::process::id() as i32],
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(frozen.pids(), &[pid]);
        assert!(is_stopped(pid));
        frozen.thaw();
        let deadline = Instant::now() + Duration::from_secs(10);
        while is_stopped(pid) {
            assert!(Instant::now() < deadline, "the process was not continued");
            std::thread::sleep(STOP_POLL);
        }
        child.kill().unwrap();
        child.wait().unwrap();
        // A process gone is no error.
        assert!(FrozenProcesses::freeze(&[pid], Duration::from_secs(1))
            .unwrap()
            .pids()
            .is_empty());
    }
}

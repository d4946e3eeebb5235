//! An application running in a guest, watched line by line.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A spawned application: its output lines arrive as it prints them.
pub struct App {
    what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

/// How an application ended.
#[derive(Debug)]
pub struct Finished {
    /// What it was.
    pub what: String,
    /// Its exit status (of `xmx sim run`, which passes the program's on).
    pub status: ExitStatus,
    /// Everything it printed.
    pub stdout: String,
    /// Everything it complained about.
    pub stderr: String,
}

impl Finished {
    /// Requires a clean exit with `PASS` printed; returns stdout.
    pub fn passed(&self) -> &str {
        assert!(
            self.status.success() && self.stdout.contains("PASS"),
            "{} failed ({:?}):\nstdout:\n{}\nstderr:\n{}",
            self.what,
            self.status,
            self.stdout,
            self.stderr
        );
        &self.stdout
    }
}

impl App {
    /// Starts `cmd`, described as `what` in failures.
    pub fn spawn(what: &str, mut cmd: Command) -> App {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e}"));
        let (tx, lines) = channel();
        let out = child.stdout.take().expect("piped stdout");
        let stdout = std::thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                all.push_str(&line);
                all.push('\n');
                let _ = tx.send(line);
            }
            all
        });
        let mut err = child.stderr.take().expect("piped stderr");
        let stderr = std::thread::spawn(move || {
            let mut all = Vec::new();
            let _ = err.read_to_end(&mut all);
            String::from_utf8_lossy(&all).into_owned()
        });
        let stdin = child.stdin.take();
        App {
            what: what.to_owned(),
            child,
            stdin,
            lines,
            stdout: Some(stdout),
            stderr: Some(stderr),
        }
    }

    /// Writes `line` to the application's standard input.
    pub fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("standard input still open");
        writeln!(stdin, "{line}")
            .unwrap_or_else(|e| panic!("{}: writing to its input: {e}", self.what));
        let _ = stdin.flush();
    }

    /// The process id of `xmx sim run`.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits for a line `pred` accepts; panics (with what the application
    /// said) if it ends or `timeout` passes first.
    pub fn wait_line(&mut self, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if pred(&l) => return l,
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    panic!(
                        "{}: the line awaited did not come in {timeout:?}",
                        self.what
                    )
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let what = self.what.clone();
                    let f = self.finish_now();
                    panic!("{what} ended before the line awaited: {f:?}");
                }
            }
        }
    }

    fn finish_now(&mut self) -> Finished {
        drop(self.stdin.take());
        let status = self.child.wait().expect("waiting for the application");
        let stdout = self
            .stdout
            .take()
            .map(|t| t.join().unwrap_or_default())
            .unwrap_or_default();
        let stderr = self
            .stderr
            .take()
            .map(|t| t.join().unwrap_or_default())
            .unwrap_or_default();
        Finished {
            what: self.what.clone(),
            status,
            stdout,
            stderr,
        }
    }

    /// Waits for the application to end.
    pub fn finish(mut self) -> Finished {
        self.finish_now()
    }

    /// Whether the application has ended (its result is read by
    /// [`finish`](Self::finish)).
    pub fn ended(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_some()
    }

    /// Waits until a process of the application has a thread named
    /// `thread` (libmyriexpress's `mx-progress` runs once an endpoint is
    /// open). Nothing announces another process's threads: /proc is read
    /// until it shows one. False if the application ended or `timeout`
    /// passed first.
    pub fn wait_thread(&mut self, thread: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let found = descendants(self.pid()).into_iter().any(|p| {
                std::fs::read_dir(format!("/proc/{p}/task"))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .any(|t| {
                        std::fs::read_to_string(t.path().join("comm"))
                            .is_ok_and(|c| c.trim() == thread)
                    })
            });
            if found {
                return true;
            }
            if Instant::now() >= deadline || self.child.try_wait().ok().flatten().is_some() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// SIGKILLs the program `name` this application runs (a descendant of
    /// `xmx sim run`); true if it was found.
    pub fn kill_program(&self, name: &str) -> bool {
        self.signal_program(name, libc::SIGKILL)
    }

    /// Sends `signal` to the program `name` this application runs (a
    /// descendant of `xmx sim run`); true if it was found.
    pub fn signal_program(&self, name: &str, signal: libc::c_int) -> bool {
        let Some(pid) = self.program(name) else {
            return false;
        };
        // SAFETY: plain syscall on a process this test started (through
        // `xmx sim run`).
        unsafe { libc::kill(pid, signal) == 0 }
    }

    /// Stops the program `name` this application runs (SIGSTOP) and waits
    /// until every thread of it is stopped: from then on nothing in it runs,
    /// its library's threads included, until [`signal_program`]
    /// (Self::signal_program) sends SIGCONT. Nothing announces another
    /// process's stop: /proc is read until it shows it. False if the program
    /// was not found or `timeout` passed first.
    pub fn stop_program(&self, name: &str, timeout: Duration) -> bool {
        let Some(pid) = self.program(name) else {
            return false;
        };
        // SAFETY: plain syscall on a process this test started.
        if unsafe { libc::kill(pid, libc::SIGSTOP) } != 0 {
            return false;
        }
        let deadline = Instant::now() + timeout;
        loop {
            let tasks: Vec<_> = std::fs::read_dir(format!("/proc/{pid}/task"))
                .into_iter()
                .flatten()
                .flatten()
                .collect();
            let stopped = !tasks.is_empty()
                && tasks.iter().all(|t| {
                    std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
                        stat.rfind(')')
                            .and_then(|at| stat[at + 1..].split_whitespace().next())
                            == Some("T")
                    })
                });
            if stopped {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The process id of the program `name` this application runs.
    fn program(&self, name: &str) -> Option<i32> {
        descendants(self.pid())
            .into_iter()
            .find(|&p| comm(p).as_deref() == Some(name))
    }
}

impl Drop for App {
    fn drop(&mut self) {
        if self.stdout.is_some() {
            // Not finished: the test failed midway. End the whole tree.
            for p in descendants(self.pid()).into_iter().rev() {
                // SAFETY: plain syscall on processes this test started.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `text` without the terminal colour sequences logs carry.
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters final-byte.
            if chars.next() == Some('[') {
                for d in chars.by_ref() {
                    if ('@'..='~').contains(&d) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// The value of `key=` in the last log line mentioning `message`.
pub fn log_field(log: &str, message: &str, key: &str) -> Option<u64> {
    let log = strip_ansi(log);
    let line = log.lines().rev().find(|l| l.contains(message))?;
    let at = line.find(&format!("{key}="))? + key.len() + 1;
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// The command name of process `pid`.
fn comm(pid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// The parent of process `pid`.
fn parent(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields start
    // after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Every descendant of `root`, parents before children.
pub fn descendants(root: i32) -> Vec<i32> {
    let all: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|p| Some((p, parent(p)?)))
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(all.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found.remove(0);
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_fields_are_read_through_colours() {
        let log = "\u{1b}[2m2026\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m registration cache \u{1b}[3mhits\u{1b}[0m\u{1b}[2m=\u{1b}[0m41 \u{1b}[3mmisses\u{1b}[0m\u{1b}[2m=\u{1b}[0m2\n";
        assert_eq!(log_field(log, "registration cache", "hits"), Some(41));
        assert_eq!(log_field(log, "registration cache", "misses"), Some(2));
        assert_eq!(log_field(log, "registration cache", "evictions"), None);
        assert_eq!(log_field(log, "nothing like it", "hits"), None);
    }
}

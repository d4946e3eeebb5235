//! What the `xmx demo` tests share: the programs, a running demo watched line by line, and
//! a look for anything a demo could leave behind.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The demo's cluster name, hence `xmx-demo-*` namespaces and /run/xmx/demo.
pub const SIM_NAME: &str = "demo";

pub fn xmx() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_xmx"))
}

/// Whether the demo can run here; the reason if not.
pub fn unavailable() -> Option<&'static str> {
    (!nix::unistd::geteuid().is_root()).then_some("needs root (network namespaces)")
}

/// The daemons and the library the demo needs; `cargo test --workspace` builds them all.
pub fn ensure_built() {
    let dir = xmx().parent().unwrap().to_path_buf();
    for (bin, package) in [
        ("xmx-simhv", "xmx-simhv"),
        ("xmx-backd", "xmx-backend"),
        ("xmxd", "xmx-tools"),
        ("xmx-frontd", "xmx-guests"),
    ] {
        assert!(
            dir.join(bin).is_file(),
            "{} is missing: run the workspace tests (`cargo test --workspace`) or `cargo build -p {package}` first",
            dir.join(bin).display()
        );
    }
    assert!(
        dir.join("libmyriexpress.so").is_file() || dir.join("deps/libmyriexpress.so").is_file(),
        "libmyriexpress.so is missing from {}: `cargo build -p xmx-libmx` first",
        dir.display()
    );
}

/// A running `xmx demo`: its stderr arrives line by line.
pub struct DemoRun {
    pub child: Child,
    lines: Receiver<String>,
    stderr: Option<JoinHandle<String>>,
    stdout: Option<JoinHandle<String>>,
}

/// How a demo ended.
pub struct Ended {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl DemoRun {
    pub fn start(args: &[&str]) -> DemoRun {
        let mut child = Command::new(xmx())
            .arg("demo")
            .args(args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting xmx demo");
        let (tx, lines) = channel();
        let err = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                all.push_str(&line);
                all.push('\n');
                let _ = tx.send(line);
            }
            all
        });
        let mut out = child.stdout.take().unwrap();
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        DemoRun {
            child,
            lines,
            stderr: Some(stderr),
            stdout: Some(stdout),
        }
    }

    /// Wait for a stderr line containing `text`; the line. Panics with everything said so
    /// far if the demo ends or `timeout` passes first.
    pub fn wait_line(&mut self, text: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(text) => return l,
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    let e = self.finish(Duration::from_secs(60));
                    panic!("no {text:?} within {timeout:?}; stderr:\n{}", e.stderr);
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let e = self.finish(Duration::from_secs(60));
                    panic!(
                        "the demo ended ({}) before {text:?}; stderr:\n{}",
                        e.status, e.stderr
                    );
                }
            }
        }
    }

    /// Wait for the end, killing the demo after `timeout` (which fails the test).
    pub fn finish(&mut self, timeout: Duration) -> Ended {
        let pid = self.child.id() as i32;
        let exited = xmx_lab::sim::wait::process_exits(pid, timeout);
        if !exited {
            let _ = self.child.kill();
        }
        let status = self.child.wait().expect("waiting for xmx demo");
        let stderr = self
            .stderr
            .take()
            .map(|t| t.join().unwrap_or_default())
            .unwrap_or_default();
        let stdout = self
            .stdout
            .take()
            .map(|t| t.join().unwrap_or_default())
            .unwrap_or_default();
        assert!(
            exited,
            "xmx demo did not end within {timeout:?}; stderr:\n{stderr}"
        );
        Ended {
            status,
            stdout,
            stderr,
        }
    }
}

/// Everything a demo may leave behind: its namespaces, its state directory, processes
/// started for it (daemons name files under /run/xmx/demo, guest programs under the
/// demo's scratch directory).
pub fn leftovers() -> Vec<String> {
    let mut found = Vec::new();
    let ns = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let prefix = format!("xmx-{SIM_NAME}-");
    for name in String::from_utf8_lossy(&ns.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
    {
        if name.starts_with(&prefix) {
            found.push(format!("namespace {name}"));
        }
    }
    let root = Path::new("/run/xmx").join(SIM_NAME);
    if root.exists() {
        found.push(format!("directory {}", root.display()));
    }
    let marks = [format!("/run/xmx/{SIM_NAME}/"), "/xmx-demo-".to_owned()];
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if marks.iter().any(|m| cmd.contains(m.as_str())) && xmx_lab::sim::wait::alive(pid) {
            found.push(format!("process {pid}: {}", cmd.trim()));
        }
    }
    found
}

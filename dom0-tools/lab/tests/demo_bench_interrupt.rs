//! Ctrl-C during `xmx bench` (as root): the run stops between measurements, removes its
//! veth namespaces and /dev/shm files, writes no report and exits 130.

mod demo_util;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc::channel;
use std::time::Duration;

use demo_util::{unavailable, xmx};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// What of run `pid` exists: its namespaces and its shared-memory files.
fn traces(pid: u32) -> Vec<String> {
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let prefix = format!("xmx-bench-{pid}-");
    let mut found: Vec<String> = String::from_utf8_lossy(&ns.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&prefix))
        .map(|n| format!("namespace {n}"))
        .collect();
    if let Ok(dir) = std::fs::read_dir("/dev/shm") {
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix) {
                found.push(format!("/dev/shm/{name}"));
            }
        }
    }
    found
}

#[test]
fn sigint_during_a_bench_run_removes_its_namespaces_and_files() {
    if let Some(why) = unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let mut child = Command::new(xmx())
        .args([
            "bench",
            "--json",
            "--quick",
            "--setups",
            "shm,tcp",
            "--sizes",
            "0,4K,64K,1M",
            "--out",
        ])
        .arg(out.path())
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = channel();
    let err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            all.push_str(&line);
            all.push('\n');
            let _ = tx.send(line);
        }
        all
    });
    // The shm setup measures after the link is made: both exist from here on.
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("xmx bench said nothing for 2 minutes");
        if line.contains("bench: shm stream 64 KiB") {
            break;
        }
    }
    assert!(
        traces(pid).iter().any(|t| t.starts_with("namespace")),
        "{:?}",
        traces(pid)
    );
    kill(Pid::from_raw(pid as i32), Signal::SIGINT).unwrap();
    let status = child.wait().unwrap();
    let stderr = reader.join().unwrap();
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("bench: interrupted by SIGINT"), "{stderr}");
    assert_eq!(traces(pid), Vec::<String>::new(), "{stderr}");
    assert!(
        !out.path().join("bench.json").exists(),
        "an interrupted run writes no report"
    );
}

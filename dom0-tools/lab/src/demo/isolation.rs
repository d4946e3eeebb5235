//! Step 4: a guest of one virtual cluster tries to reach the guests of the other, through
//! the MX API, and the refusal is shown with MX's own status.
//!
//! The program (`mx_isolation.c`, next to this file) runs in blue h0/g0 and, for every
//! red guest, asks for its hostname and then calls `mx_connect` on its board address as
//! dom0's peer table gives it: a guest cannot even name a peer of another cluster, since
//! its peer view (published by xmxd) holds its own cluster only, and the backend drops
//! whatever crosses clusters regardless. Each attempt must end with a refusal, not
//! success and not a timeout (a hang): that is the step's verdict.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::layout::{self, Place};
use crate::sim::cluster::{self, ClusterState};
use xmx_tools::xmxd::control::PeersReport;
use xmx_tools::xmxd::{ControlClient, XmxdRequest};

/// Source of the program.
pub const MX_ISOLATION_C: &str = include_str!("mx_isolation.c");
/// How long `mx_connect` may wait for an answer.
pub const CONNECT_TIMEOUT_MS: u32 = 5000;
/// How long the whole program may take before it counts as hung.
const RUN_TIMEOUT: Duration = Duration::from_secs(30);
/// `MX_SUCCESS` and `MX_TIMEOUT`, the two answers that are not a refusal.
const MX_SUCCESS: i32 = 0;
const MX_TIMEOUT: i32 = 30;

/// One MX call's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    /// `mx_return_t` value.
    pub code: i32,
    /// Its name in myriexpress.h (`MX_NIC_NOT_FOUND`).
    pub name: String,
    /// `mx_strerror`'s text.
    pub message: String,
    /// How long the call took, milliseconds.
    pub ms: f64,
}

impl Answer {
    /// `MX_NIC_NOT_FOUND (NIC not in the peer table)`.
    pub fn status(&self) -> String {
        format!("{} ({})", self.name, self.message)
    }
}

/// What the program printed for one target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IsolationAttempt {
    /// The target's MX hostname.
    pub target: String,
    /// Its board address, as dom0 knows it.
    pub nic_id: String,
    /// `mx_hostname_to_nic_id`.
    pub lookup: Answer,
    /// `mx_connect` to its endpoint 2.
    pub connect: Answer,
}

impl IsolationAttempt {
    /// The connection was refused: neither accepted nor left to time out.
    pub fn refused(&self) -> bool {
        self.connect.code != MX_SUCCESS && self.connect.code != MX_TIMEOUT
    }
}

/// The step's result.
#[derive(Debug, Clone, Serialize)]
pub struct Isolation {
    /// The guest that tried (`h0/g0`).
    pub from: String,
    /// Its virtual cluster.
    pub from_cluster: String,
    /// One per guest of the other cluster.
    pub attempts: Vec<TargetAttempt>,
    /// Every attempt was refused, and no hostname was found.
    pub refused: bool,
}

/// An attempt with where its target is.
#[derive(Debug, Clone, Serialize)]
pub struct TargetAttempt {
    /// `h1/g1`.
    pub guest: String,
    /// Its virtual cluster.
    pub cluster: String,
    /// `mx_connect`'s answer as a status line (`MX_NIC_NOT_FOUND (NIC not in the peer table)`).
    pub status: String,
    /// What MX answered.
    #[serde(flatten)]
    pub attempt: IsolationAttempt,
}

/// Compile `source` (named `name`.c) with the system C compiler against our MX header and
/// the built library, as the bench builds its MX program; returns the program.
pub fn build(name: &str, source: &str, out_dir: &Path, lib_dir: &Path) -> Result<PathBuf, String> {
    let src = out_dir.join(format!("{name}.c"));
    std::fs::write(&src, source).map_err(|e| format!("writing {}: {e}", src.display()))?;
    let prog = out_dir.join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=gnu11", "-O2", "-Wall", "-Wextra", "-I"])
        .arg(crate::bench::native::include_dir())
        .arg(&src)
        .arg("-o")
        .arg(&prog)
        .arg("-L")
        .arg(lib_dir)
        .arg("-lmyriexpress")
        .output()
        .map_err(|e| format!("C compiler {cc} not usable: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "{name}.c does not build: {}",
            err.lines().next().unwrap_or("")
        ));
    }
    Ok(prog)
}

/// Parse the program's output: one JSON object per line.
pub fn parse(stdout: &str) -> Result<Vec<IsolationAttempt>> {
    stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("mx_isolation printed {l:?}")))
        .collect()
}

/// The board address of `hostname` in `table`, as the program takes it (hex, no colons).
fn nic_id(table: &PeersReport, hostname: &str) -> Option<String> {
    table
        .peers
        .iter()
        .find(|p| p.hostname == hostname)
        .map(|p| p.mac.0.iter().map(|b| format!("{b:02x}")).collect())
}

/// Run the program in [`layout::PROBE_FROM`] against every guest of the other cluster.
pub fn run(state: &ClusterState, prog: &Path, lib_dir: &Path, xmx: &Path) -> Result<Isolation> {
    let from = layout::PROBE_FROM;
    let host = state.host(&from.host_name())?;
    let guest = host.guest(&from.guest_name())?;
    let table: PeersReport = ControlClient::connect(&host.simhv_dir.join("xmxd.sock"))
        .context("connecting to xmxd")?
        .call_as(&XmxdRequest::Peers {
            guest: None,
            after: None,
            timeout_ms: None,
        })
        .context("dom0's peer table")?;
    let targets: Vec<Place> = layout::probe_targets();
    let mut args: Vec<String> = [
        "bench-agent",
        "--transport",
        "exec",
        "--netns",
        &host.netns,
        "--",
    ]
    .map(str::to_owned)
    .to_vec();
    args.push(prog.display().to_string());
    args.extend(["-t".to_owned(), CONNECT_TIMEOUT_MS.to_string()]);
    for t in &targets {
        let hostname = format!("{}:0", t.domain_name());
        let nic = nic_id(&table, &hostname)
            .with_context(|| format!("{hostname} is not in dom0's peer table"))?;
        args.push(format!("{hostname}={nic}"));
    }
    let mut env: Vec<(String, String)> = cluster::guest_env(host, guest, lib_dir)
        .into_iter()
        .filter(|(k, _)| k != "LD_LIBRARY_PATH")
        .collect();
    env.push(("LD_LIBRARY_PATH".into(), lib_dir.display().to_string()));
    env.push(("XMX_TRANSPORT".into(), "xen".into()));
    let (stdout, stderr) = run_bounded(xmx, &args, &env, RUN_TIMEOUT)?;
    let attempts = parse(&stdout)?;
    if attempts.len() != targets.len() {
        bail!(
            "mx_isolation in {from} reported {} of {} attempts: {}",
            attempts.len(),
            targets.len(),
            stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no error printed")
        );
    }
    let attempts: Vec<TargetAttempt> = targets
        .iter()
        .zip(attempts)
        .map(|(t, a)| TargetAttempt {
            guest: t.to_string(),
            cluster: t.vcluster().into(),
            status: a.connect.status(),
            attempt: a,
        })
        .collect();
    let refused = attempts
        .iter()
        .all(|a| a.attempt.refused() && a.attempt.lookup.code != MX_SUCCESS);
    Ok(Isolation {
        from: from.to_string(),
        from_cluster: from.vcluster().into(),
        attempts,
        refused,
    })
}

/// Run `xmx ARGS` with `env` added; its stdout and stderr. It is killed after `timeout`.
fn run_bounded(
    xmx: &Path,
    args: &[String],
    env: &[(String, String)],
    timeout: Duration,
) -> Result<(String, String)> {
    let mut child = Command::new(xmx)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting mx_isolation")?;
    let mut out = child.stdout.take().context("stdout")?;
    let mut err = child.stderr.take().context("stderr")?;
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    // Standard output ends when the program does; a program that outlives `timeout` hangs.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        let _ = tx.send(s);
    });
    let stdout = rx.recv_timeout(timeout);
    if stdout.is_err() {
        let _ = child.kill();
    }
    let status = child.wait().context("waiting for mx_isolation")?;
    let stderr = reader.join().unwrap_or_default();
    let Ok(stdout) = stdout else {
        bail!("mx_isolation hung: no result within {timeout:?}");
    };
    if !status.success() {
        let why = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no error printed");
        bail!("mx_isolation failed ({status}): {why}");
    }
    Ok((stdout, stderr))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"target":"h1-g1:0","nic_id":"02aabbccddee","lookup":{"code":28,"name":"MX_HOST_NOT_FOUND","message":"Host not found","ms":1000.250},"connect":{"code":36,"name":"MX_NIC_NOT_FOUND","message":"NIC not in the peer table","ms":0.012}}"#;

    #[test]
    fn program_lines_parse_and_refusals_are_told_from_hangs() {
        let mut v = parse(&format!("{LINE}\n\n")).unwrap();
        assert_eq!(v.len(), 1);
        let a = v.pop().unwrap();
        assert_eq!(a.target, "h1-g1:0");
        assert_eq!(a.lookup.code, 28);
        assert_eq!(
            a.connect.status(),
            "MX_NIC_NOT_FOUND (NIC not in the peer table)"
        );
        assert!(a.refused());
        let mut hung = a.clone();
        hung.connect.code = MX_TIMEOUT;
        assert!(!hung.refused());
        let mut accepted = a;
        accepted.connect.code = MX_SUCCESS;
        assert!(!accepted.refused());
        assert!(parse("not json\n").is_err());
    }
}

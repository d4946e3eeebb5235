//! Running the two agent processes of one cell and collecting their reports.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use super::stats::AgentReport;

/// How to start one agent: arguments after the `xmx` binary, and extra environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentSpec {
    /// Arguments, starting with the (hidden) subcommand.
    pub args: Vec<String>,
    /// Environment variables to set.
    pub env: Vec<(String, String)>,
}

/// The two agents of a cell. The client is built once the server is ready, from the token
/// the server printed after `ready` (if any).
pub struct CellAgents {
    /// Started first; must print `ready`.
    pub server: AgentSpec,
    /// Started once the server is ready.
    pub client: Box<dyn FnOnce(Option<String>) -> AgentSpec + Send>,
    /// Files the agents create, removed once both have ended.
    pub cleanup: Vec<PathBuf>,
}

/// The reports of both agents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellReports {
    /// The server's report.
    pub server: AgentReport,
    /// The client's report.
    pub client: AgentReport,
}

/// How the error of a cell that ran out of time begins.
pub const TIMED_OUT: &str = "no result within";

#[derive(Debug)]
enum AgentOutput {
    Line {
        agent: usize,
        stdout: bool,
        text: String,
    },
    Closed {
        agent: usize,
    },
}

/// One agent process and what it said so far.
struct Agent {
    name: &'static str,
    child: Child,
    open_streams: u8,
    report: Option<AgentReport>,
    last_error: Option<String>,
}

fn pump(agent: usize, stdout: bool, stream: impl Read + Send + 'static, tx: Sender<AgentOutput>) {
    std::thread::spawn(move || {
        for text in BufReader::new(stream).lines().map_while(Result::ok) {
            if tx
                .send(AgentOutput::Line {
                    agent,
                    stdout,
                    text,
                })
                .is_err()
            {
                return;
            }
        }
        let _ = tx.send(AgentOutput::Closed { agent });
    });
}

fn spawn(
    xmx: &Path,
    spec: &AgentSpec,
    index: usize,
    name: &'static str,
    tx: &Sender<AgentOutput>,
) -> Result<Agent, String> {
    let mut cmd = Command::new(xmx);
    cmd.args(&spec.args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in &spec.env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("starting {}: {e}", xmx.display()))?;
    tracing::debug!(agent = name, args = ?spec.args, pid = child.id(), "agent started");
    if let Some(out) = child.stdout.take() {
        pump(index, true, out, tx.clone());
    }
    if let Some(err) = child.stderr.take() {
        pump(index, false, err, tx.clone());
    }
    Ok(Agent {
        name,
        child,
        open_streams: 2,
        report: None,
        last_error: None,
    })
}

/// Start the server, then the client once the server is ready, and wait for both reports.
/// `progress` receives the client's `K/N` iteration lines. Every process is gone when this
/// returns: on failure or after `timeout`, the remaining ones are killed.
pub fn run_cell(
    xmx: &Path,
    agents: CellAgents,
    timeout: Duration,
    progress: &mut dyn FnMut(&str),
) -> Result<CellReports, String> {
    let deadline = Instant::now() + timeout;
    let cleanup = agents.cleanup;
    let (tx, rx) = channel();
    let mut procs: Vec<Agent> = vec![spawn(xmx, &agents.server, 0, "server", &tx)?];
    let mut client = Some(agents.client);
    let result = loop {
        if procs.iter().all(|a| a.open_streams == 0) {
            break Ok(());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let event = match rx.recv_timeout(left) {
            Ok(e) => e,
            Err(RecvTimeoutError::Timeout) => break Err(format!("{TIMED_OUT} {timeout:?}")),
            Err(RecvTimeoutError::Disconnected) => break Ok(()),
        };
        match event {
            AgentOutput::Closed { agent } => {
                let a = &mut procs[agent];
                a.open_streams -= 1;
                // An agent that ended without a report has failed: the other one would only
                // wait for it until its own timeout.
                if a.open_streams == 0 && a.report.is_none() {
                    let why = a
                        .last_error
                        .clone()
                        .unwrap_or_else(|| "ended without a report".into());
                    break Err(format!("{}: {why}", a.name));
                }
            }
            AgentOutput::Line {
                agent,
                stdout: true,
                text,
            } => {
                if let Some(token) = text.strip_prefix("ready").filter(|_| agent == 0) {
                    if let Some(make) = client.take() {
                        let token = Some(token.trim())
                            .filter(|t| !t.is_empty())
                            .map(str::to_owned);
                        match spawn(xmx, &make(token), 1, "client", &tx) {
                            Ok(a) => procs.push(a),
                            Err(e) => break Err(e),
                        }
                    }
                } else if text.starts_with('{') {
                    match serde_json::from_str::<AgentReport>(&text) {
                        Ok(r) => procs[agent].report = Some(r),
                        Err(e) => {
                            break Err(format!(
                                "{} printed an unreadable report: {e}",
                                procs[agent].name
                            ))
                        }
                    }
                } else {
                    tracing::debug!(agent = procs[agent].name, "{text}");
                }
            }
            AgentOutput::Line {
                agent,
                stdout: false,
                text,
            } => {
                if let Some(p) = text.strip_prefix("progress ") {
                    progress(p);
                } else {
                    tracing::debug!(agent = procs[agent].name, "{text}");
                    procs[agent].last_error = Some(text);
                }
            }
        }
    };
    // Reap everything; kill what is still running after a failure.
    let mut failures = Vec::new();
    for a in &mut procs {
        if result.is_err() {
            let _ = a.child.kill();
        }
        match a.child.wait() {
            Ok(s) if s.success() => {}
            Ok(s) => failures.push(format!(
                "{} {s}{}",
                a.name,
                a.last_error
                    .as_deref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            )),
            Err(e) => failures.push(format!("{}: {e}", a.name)),
        }
    }
    for f in &cleanup {
        let _ = std::fs::remove_file(f);
    }
    result?;
    if !failures.is_empty() {
        return Err(failures.join("; "));
    }
    let mut reports = procs.into_iter().map(|a| (a.name, a.report));
    let mut take = || match reports.next() {
        Some((_, Some(r))) => Ok(r),
        Some((name, None)) => Err(format!("{name} printed no report")),
        None => Err("client never started".to_owned()),
    };
    let server = take()?;
    let client = take()?;
    Ok(CellReports { server, client })
}

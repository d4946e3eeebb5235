//! Step 6: a guest moves to the other host and back under MX traffic, and nothing is
//! lost.
//!
//! Blue h0/g2 runs the receiving side of `migrate_stream.c`, the program the test suite
//! checks migrations with (tests/c, built here from the same source), and its co-located
//! blue partner h0/g0 the sending side: a two-way stream of every message class, LARGE
//! included, each message checked where it arrives (once, in order, its length and its
//! bytes). The two start side by side and talk over a direct channel. When the receiver
//! has taken a third of the stream, `xmx sim migrate` moves h0/g2 to h1 as `xl migrate`
//! would (memory copied while it runs, a short suspend, the rest, resume there); at two
//! thirds it moves back (`--moves N`: N moves back and forth, evenly spread over a stream
//! that grows with N). Meanwhile a bystander pair of the other cluster, red h0/g1 to
//! h1/g1, runs the same checked stream across the hosts. Shown: each move's downtime
//! (suspend to resume), the longest gap each receiver saw between two messages (what a
//! move costs the application, and what it costs the pairs that stay), and what went by
//! direct channels. Any program failing a check, or a move failing, fails the step.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::isolation;
use super::layout::Place;
use crate::sim::cluster::{self, ClusterState};
use crate::sim::migrate::{self, MigrateSummary};

/// The program, and the helpers it shares with the suite's other C programs.
const MIGRATE_STREAM_C: &str = include_str!("../../../../tests/c/migrate_stream.c");
const XMX_TEST_H: &str = include_str!("../../../../tests/c/xmx_test.h");
/// The guest that moves, and its partner (which stays).
pub const MOVER: Place = Place::new(0, 2);
/// See [`MOVER`].
pub const PARTNER: Place = Place::new(0, 0);
/// The host the mover visits.
const AWAY_HOST: usize = 1;
/// Messages each way per stretch between two moves (and before the first, after the last).
pub const MESSAGES_PER_STRETCH: u32 = 4_000;
/// The moves of the default run: there and back.
pub const DEFAULT_MOVES: u32 = 2;
/// The most moves one run makes.
pub const MAX_MOVES: u32 = 20;
/// The bystander pair's receiver and sender: the other cluster, across the hosts.
pub const BYSTANDER: Place = Place::new(1, 1);
/// See [`BYSTANDER`].
pub const BYSTANDER_SENDER: Place = Place::new(0, 1);
/// The receiver's endpoint.
const RECEIVER_EID: &str = "2";
/// How long the receiver may go without reaching the next mark.
const MARK_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the programs may take to end once the moves are done.
const END_TIMEOUT: Duration = Duration::from_secs(120);

/// Builds the program into `out_dir` against the library in `lib_dir`.
pub fn build(out_dir: &Path, lib_dir: &Path) -> Result<PathBuf, String> {
    let header = out_dir.join("xmx_test.h");
    std::fs::write(&header, XMX_TEST_H)
        .map_err(|e| format!("writing {}: {e}", header.display()))?;
    isolation::build("migrate_stream", MIGRATE_STREAM_C, out_dir, lib_dir)
}

/// What went by direct channels, as one side's program counted it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DirectUse {
    /// Frames sent on direct channels.
    pub frames_sent: u64,
    /// Frames taken off them.
    pub frames_received: u64,
    /// Channels that came up.
    pub opened: u64,
    /// Channels that ended.
    pub closed: u64,
}

impl DirectUse {
    /// The program's line `direct: S frames sent, R received, O channels opened, C closed`.
    pub fn parse(lines: &[String]) -> Option<DirectUse> {
        let line = lines.iter().find_map(|l| l.strip_prefix("direct: "))?;
        let n: Vec<u64> = line
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|w| w.parse().ok())
            .collect();
        match n[..] {
            [frames_sent, frames_received, opened, closed] => Some(DirectUse {
                frames_sent,
                frames_received,
                opened,
                closed,
            }),
            _ => None,
        }
    }
}

/// The step's result.
#[derive(Debug, Clone, Serialize)]
pub struct MigrationRun {
    /// The guest that moved (`h0/g2`).
    pub guest: String,
    /// Its partner (`h0/g0`).
    pub partner: String,
    /// Messages each way, every one checked.
    pub messages: u32,
    /// Each move, as `xmx sim migrate --json` reports it.
    pub moves: Vec<MigrateSummary>,
    /// The longest time between two messages the mover received, milliseconds.
    pub longest_gap_ms: f64,
    /// The mover's direct channels.
    pub direct: DirectUse,
    /// The pair that stays: its stream, checked as the mover's is, across the moves.
    pub bystander: Bystander,
}

/// The bystander pair's stream.
#[derive(Debug, Clone, Serialize)]
pub struct Bystander {
    /// Its receiver (`h1/g1`).
    pub receiver: String,
    /// Its sender (`h0/g1`).
    pub sender: String,
    /// Messages each way, every one checked.
    pub messages: u32,
    /// The longest time between two messages its receiver saw, milliseconds.
    pub longest_gap_ms: f64,
    /// How many of the moves began while it was still streaming.
    pub moves_during: usize,
}

/// What a program's stream is: its length, and whether it must come up over a direct
/// channel.
#[derive(Debug, Clone, Copy)]
struct Stream {
    messages: u32,
    direct: bool,
}

/// The receiver's `longest gap N us` line, in milliseconds.
fn reported_gap_ms(lines: &[String]) -> Option<f64> {
    lines
        .iter()
        .find_map(|l| l.strip_prefix("longest gap "))
        .and_then(|l| l.strip_suffix(" us"))
        .and_then(|us| us.trim().parse::<f64>().ok())
        .map(|us| us / 1e3)
}

/// The receiver's marks: after how many messages each of `moves` moves begins, evenly
/// spread over `messages` and on the program's 250-message progress lines.
fn marks(messages: u32, moves: u32) -> Vec<u32> {
    (1..=moves)
        .map(|k| (u64::from(messages) * u64::from(k) / u64::from(moves + 1)) as u32 / 250 * 250)
        .collect()
}

/// A program running in a guest, its standard output read line by line.
struct GuestProgram {
    what: String,
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
    stderr: Option<JoinHandle<String>>,
}

impl GuestProgram {
    fn spawn(
        what: String,
        state: &ClusterState,
        place: Place,
        prog: &Path,
        args: &[&str],
        lib_dir: &Path,
        stream: Stream,
    ) -> Result<GuestProgram> {
        let host = state.host(&place.host_name())?;
        let guest = host.guest(&place.guest_name())?;
        let mut child = Command::new("ip")
            .args(["netns", "exec", &host.netns])
            .arg(prog)
            .args(args)
            .envs(cluster::guest_env(host, guest, lib_dir))
            .envs([
                ("XMX_TRANSPORT", "xen"),
                ("XMX_TEST_COUNT", &stream.messages.to_string()),
                ("XMX_TEST_DIRECT", if stream.direct { "1" } else { "0" }),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {what}"))?;
        let out = child.stdout.take().context("stdout")?;
        let mut err = child.stderr.take().context("stderr")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Ok(GuestProgram {
            what,
            child,
            lines,
            seen: Vec::new(),
            stderr: Some(stderr),
        })
    }

    /// `e`, a wait on another program that failed, with this one's end if it has ended:
    /// the other may only have waited for what this one never sent.
    fn explain(&mut self, e: anyhow::Error) -> anyhow::Error {
        match self.child.try_wait() {
            Ok(Some(status)) => {
                let why = self.last_words();
                e.context(format!("{} had ended ({status}): {why}", self.what))
            }
            _ => e,
        }
    }

    /// Its last words on standard error, once it has ended.
    fn last_words(&mut self) -> String {
        let text = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        text.lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no error printed")
            .to_owned()
    }

    /// Reads its output until the line `want`.
    fn wait_line(&mut self, want: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line == want;
                    self.seen.push(line);
                    if found {
                        return Ok(());
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    bail!("{} did not print {want:?} within {timeout:?}", self.what)
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().context("waiting")?;
                    let why = self.last_words();
                    bail!("{} ended ({status}) before {want:?}: {why}", self.what)
                }
            }
        }
    }

    /// Whether it is still running.
    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for it to end, successfully; every line it printed.
    fn finish(mut self, timeout: Duration) -> Result<Vec<String>> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    bail!("{} did not end within {timeout:?}", self.what)
                }
            }
        }
        let status = self.child.wait().context("waiting")?;
        if !status.success() {
            let why = self.last_words();
            bail!("{} failed ({status}): {why}", self.what);
        }
        Ok(std::mem::take(&mut self.seen))
    }
}

impl Drop for GuestProgram {
    fn drop(&mut self) {
        // A program left running by a failed step would outlive the tour.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs the step: the stream, the two moves, the verdict. `progress` hears each stage.
pub fn run(
    state: &mut ClusterState,
    prog: &Path,
    lib_dir: &Path,
    moves: u32,
    progress: &mut dyn FnMut(&str),
) -> Result<MigrationRun> {
    if !(1..=MAX_MOVES).contains(&moves) {
        bail!("--moves: 1 to {MAX_MOVES}, not {moves}");
    }
    let messages = MESSAGES_PER_STRETCH * (moves + 1);
    let mover = MOVER.domain_name();
    let checked = Stream {
        messages,
        direct: true,
    };
    let mut receiver = GuestProgram::spawn(
        format!("the receiver in {MOVER}"),
        state,
        MOVER,
        prog,
        &["-l", RECEIVER_EID],
        lib_dir,
        checked,
    )?;
    // A connect to an endpoint that is not open yet is refused at once (MX's behaviour):
    // started together, the sender lost that race about one run in ten and ended, and the
    // receiver waited out its bound for a stream that never came.
    receiver.wait_line("listening", MARK_TIMEOUT)?;
    let mut sender = GuestProgram::spawn(
        format!("the sender in {PARTNER}"),
        state,
        PARTNER,
        prog,
        &["-d", &mover, "-e", RECEIVER_EID],
        lib_dir,
        checked,
    )?;
    receiver
        .wait_line("direct channel up", MARK_TIMEOUT)
        .map_err(|e| sender.explain(e))?;
    progress(&format!(
        "{messages} messages each way between {PARTNER} and {MOVER}, over a direct channel"
    ));
    // The pair that stays, across the hosts (no direct channel there).
    let across = Stream {
        messages,
        direct: false,
    };
    let mut by_receiver = GuestProgram::spawn(
        format!("the bystander's receiver in {BYSTANDER}"),
        state,
        BYSTANDER,
        prog,
        &["-l", RECEIVER_EID],
        lib_dir,
        across,
    )?;
    by_receiver.wait_line("listening", MARK_TIMEOUT)?;
    let by_sender = GuestProgram::spawn(
        format!("the bystander's sender in {BYSTANDER_SENDER}"),
        state,
        BYSTANDER_SENDER,
        prog,
        &["-d", &BYSTANDER.domain_name(), "-e", RECEIVER_EID],
        lib_dir,
        across,
    )?;
    progress(&format!(
        "{messages} messages each way between {BYSTANDER_SENDER} and {BYSTANDER}, which stay"
    ));
    let home = MOVER.host_name();
    let away = crate::sim::cluster::host_name(AWAY_HOST);
    let mut done = Vec::new();
    let mut moves_during = 0;
    for (k, mark) in marks(messages, moves).into_iter().enumerate() {
        // The mover is listed as `g2` on its first host, by its domain name after a move.
        let (from, guest, to) = if k % 2 == 0 {
            let guest = if k == 0 {
                MOVER.guest_name()
            } else {
                mover.clone()
            };
            (home.clone(), guest, away.clone())
        } else {
            (away.clone(), mover.clone(), home.clone())
        };
        let mark = format!("received {mark}");
        receiver
            .wait_line(&mark, MARK_TIMEOUT)
            .map_err(|e| sender.explain(e))?;
        crate::interrupt::check().map_err(|i| anyhow::anyhow!("{i}"))?;
        if by_receiver.running() {
            moves_during += 1;
        }
        progress(&format!("{mark}: moving {mover} from {from} to {to}"));
        let summary = migrate::migrate(state, &from, &guest, &to, progress)
            .with_context(|| format!("moving {mover} from {from} to {to}"))?;
        done.push(summary);
    }
    let received = receiver.finish(END_TIMEOUT)?;
    sender.finish(END_TIMEOUT)?;
    let by_received = by_receiver.finish(END_TIMEOUT)?;
    by_sender.finish(END_TIMEOUT)?;
    let longest_gap_ms =
        reported_gap_ms(&received).context("the receiver did not report its longest gap")?;
    let direct =
        DirectUse::parse(&received).context("the receiver did not report its direct channels")?;
    let bystander = Bystander {
        receiver: BYSTANDER.to_string(),
        sender: BYSTANDER_SENDER.to_string(),
        messages,
        longest_gap_ms: reported_gap_ms(&by_received)
            .context("the bystander's receiver did not report its longest gap")?,
        moves_during,
    };
    Ok(MigrationRun {
        guest: MOVER.to_string(),
        partner: PARTNER.to_string(),
        messages,
        moves: done,
        longest_gap_ms,
        direct,
        bystander,
    })
}

/// The step's table.
pub fn render(run: &MigrationRun) -> String {
    let mut lines = Vec::new();
    for (i, m) in run.moves.iter().enumerate() {
        lines.push(format!(
            "move {}: {} -> {} (domain {} -> {}): downtime {:.1} ms, {} rounds, {:.1} MiB copied, {:.0} ms in all, {} endpoint session(s) carried",
            i + 1,
            m.from,
            m.to,
            m.source_domid,
            m.dest_domid,
            m.downtime_ms,
            m.rounds.len(),
            m.bytes as f64 / (1u64 << 20) as f64,
            m.total_ms,
            m.sessions_carried.unwrap_or(0),
        ));
    }
    lines.push(format!(
        "stream: {} messages each way, every one checked once, in order and byte-exact; longest gap the receiver saw {:.0} ms",
        run.messages, run.longest_gap_ms
    ));
    lines.push(format!(
        "bystander {} -> {}: {} messages each way, every one checked once, in order and byte-exact; longest gap {:.0} ms; {} of the {} moves began while it streamed",
        run.bystander.sender,
        run.bystander.receiver,
        run.bystander.messages,
        run.bystander.longest_gap_ms,
        run.bystander.moves_during,
        run.moves.len()
    ));
    lines.push(format!(
        "direct channels of {}: {} opened, {} ended (each move ends them; back beside {} it opens one again), {} frames sent and {} received on them",
        run.guest,
        run.direct.opened,
        run.direct.closed,
        run.partner,
        run.direct.frames_sent,
        run.direct.frames_received
    ));
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_moves_are_spread_over_the_stream_on_its_progress_lines() {
        assert_eq!(marks(12_000, 2), vec![4_000, 8_000]);
        let ten = marks(MESSAGES_PER_STRETCH * 11, 10);
        assert_eq!(ten.len(), 10);
        assert!(ten.windows(2).all(|w| w[0] < w[1]), "{ten:?}");
        assert!(ten.iter().all(|m| m % 250 == 0 && *m > 0 && *m < 44_000));
        let most = marks(MESSAGES_PER_STRETCH * (MAX_MOVES + 1), MAX_MOVES);
        assert!(most.windows(2).all(|w| w[0] < w[1]), "{most:?}");
    }

    #[test]
    fn the_receivers_gap_line_parses() {
        let lines = vec![
            "received 4000".to_owned(),
            "longest gap 76000 us".to_owned(),
        ];
        assert_eq!(reported_gap_ms(&lines), Some(76.0));
        assert_eq!(reported_gap_ms(&lines[..1]), None);
    }

    #[test]
    fn the_programs_direct_line_parses() {
        let lines = vec![
            "received 12000 messages in order, every reply sent".to_owned(),
            "direct: 15193 frames sent, 15245 received, 3 channels opened, 2 closed".to_owned(),
        ];
        assert_eq!(
            DirectUse::parse(&lines),
            Some(DirectUse {
                frames_sent: 15193,
                frames_received: 15245,
                opened: 3,
                closed: 2
            })
        );
        assert_eq!(DirectUse::parse(&lines[..1]), None);
        assert_eq!(
            DirectUse::parse(&["direct: 1 frames sent".to_owned()]),
            None
        );
    }
}

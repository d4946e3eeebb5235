//! Moving a domain from one simulated host to another, shaped like `xl migrate`: the
//! hypervisor's half (memory, grant table, the domain's processes frozen for the last
//! round and pointed to the new host; the xmx device is the toolstack's, see the
//! simulated cluster's `xmx sim migrate`).
//!
//! 1. The source starts sending (`save_begin`); the destination creates `NAME--incoming`,
//!    paused, with the source's memory limit (refused if `NAME` or `NAME--incoming`
//!    exists there).
//! 2. Live rounds while the domain runs: the first sends every non-zero frame, the next
//!    ones the frames that changed since, until a round sends few frames
//!    ([`MigrateOptions::converged_frames`]) or [`MigrateOptions::max_live_rounds`] are
//!    done, or a round sends no fewer frames than the one before (the guest writes faster
//!    than the rounds copy).
//! 3. The source domain is suspended (the downtime starts). A guest that said it handles
//!    suspends (`control/feature-suspend = 1`) is waited for until it acknowledges, by
//!    clearing `control/shutdown`, that its devices are down. Then the domain's processes
//!    are frozen (see [`super::freeze`]: a suspended domain's processes could still write
//!    its memory), the last round sends what changed and the grant table, the
//!    destination renames the domain `NAME` and resumes it (the downtime ends), the
//!    source domain is destroyed and the processes are thawed.
//!
//! Each round is a stream file (format and the reason for files in the simhv's
//! `hv::stream`) in a fresh directory under [`MigrateOptions::work_dir`], which both
//! daemons must be able to reach; it is removed once applied, and the directory at the
//! end. Any failure before the destination resumes rolls back: the incoming domain is
//! destroyed, the source stops sending and is resumed if this migration suspended it,
//! and its processes are thawed.
//!
//! A domain already suspended when the migration begins is not suspended again (nor
//! resumed on a rollback); it runs on the destination afterwards, as `xl migrate`
//! unpauses the domain it moved.
//!
//! The domain's processes do not move with it: once thawed they find its hypervisor
//! gone and read where it went from its forwarding record [`Forwarding`], left in the
//! source's directory; [`super::SimPlatform::follow_move`] re-attaches a process to the
//! destination (its grant table follows with its grants mapped at the same addresses).
//!
//! Frames keep their numbers, grant refs their entries (granted-to domid included: dom0
//! is 0 on both hosts; a grant to another guest names a domid that means something else
//! on the destination, as on Xen, and is the guest's to revoke). The domain gets a new
//! domid. Event channels and mappings held by others do not move: the backend must unmap
//! the guest's grants before the source domain goes (a suspended domain's grants already
//! refuse new mappings with `Busy`).

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::admin::{RunState, SaveRound, SimAdmin};
use super::freeze::FrozenProcesses;
use super::layout;
use crate::xs::XsClient;
use crate::{DomId, Error, Result, Xenstore, DOM0, XBT_NULL};

/// Suffix of the destination's domain while it receives the migration, as `xl` names it.
pub const INCOMING_SUFFIX: &str = "--incoming";

/// How [`migrate_domain`] runs the rounds.
#[derive(Debug, Clone)]
pub struct MigrateOptions {
    /// Live rounds at most (the first, full, one included; there is always one) before
    /// the suspend.
    pub max_live_rounds: u32,
    /// Stop the live rounds once one sends at most this many frames.
    pub converged_frames: u32,
    /// Where the stream files go (in a new directory of their own); the system's
    /// temporary directory if none. Both daemons must reach it.
    pub work_dir: Option<PathBuf>,
    /// How long a guest that handles suspends may take to acknowledge one.
    pub guest_suspend_timeout: Duration,
    /// How long the domain's processes may take to stop.
    pub freeze_timeout: Duration,
}

impl Default for MigrateOptions {
    fn default() -> Self {
        // Xen's defaults are alike: a few iterations, stop when little is dirty.
        MigrateOptions {
            max_live_rounds: 5,
            converged_frames: 64,
            work_dir: None,
            // A frontend's suspend waits up to 10 s for its backend to close.
            guest_suspend_timeout: Duration::from_secs(15),
            freeze_timeout: Duration::from_secs(5),
        }
    }
}

/// Where a migrated domain went: written to `moved-dom<N>` in the source's directory
/// (see [`layout::moved_file`]) before its processes are thawed, as lines `dir PATH`,
/// `domid N`, `instance I` (the source incarnation, so that a later domain with the same
/// domid does not take the record as its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forwarding {
    /// The destination's simhv directory.
    pub dir: PathBuf,
    /// The domain's domid there.
    pub domid: DomId,
    /// The daemon's id of the source incarnation that moved.
    pub source_instance: u64,
}

impl Forwarding {
    /// The record as its file holds it.
    pub fn emit(&self) -> String {
        format!(
            "dir {}\ndomid {}\ninstance {}\n",
            self.dir.display(),
            self.domid,
            self.source_instance
        )
    }

    /// Parse a record; anything else than the three lines is refused.
    pub fn parse(text: &str) -> Result<Forwarding> {
        let bad = |what: &str| Error::Protocol(format!("forwarding record: {what}"));
        let mut dir = None;
        let mut domid = None;
        let mut instance = None;
        for line in text.lines() {
            let (key, value) = line
                .split_once(' ')
                .ok_or_else(|| bad("a line without a value"))?;
            match key {
                "dir" if dir.is_none() && value.starts_with('/') => {
                    dir = Some(PathBuf::from(value))
                }
                "domid" if domid.is_none() => {
                    domid = Some(value.parse().map_err(|_| bad("domid"))?)
                }
                "instance" if instance.is_none() => {
                    instance = Some(value.parse().map_err(|_| bad("instance"))?)
                }
                _ => return Err(bad(&format!("unexpected line {line:?}"))),
            }
        }
        Ok(Forwarding {
            dir: dir.ok_or_else(|| bad("no dir"))?,
            domid: domid.ok_or_else(|| bad("no domid"))?,
            source_instance: instance.ok_or_else(|| bad("no instance"))?,
        })
    }

    /// Read the record of domain `domid` of the simhv at `dir`, if there is one.
    pub fn read(dir: &Path, domid: DomId) -> Result<Option<Forwarding>> {
        match std::fs::read_to_string(layout::moved_file(dir, domid)) {
            Ok(text) => Self::parse(&text).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::Io(e)),
        }
    }

    /// Write the record of domain `domid` of the simhv at `dir` (atomically).
    pub fn write(&self, dir: &Path, domid: DomId) -> Result<()> {
        let path = layout::moved_file(dir, domid);
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, self.emit())?;
        std::fs::rename(&tmp, &path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::Io(e)
        })
    }
}

/// One round of a migration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundReport {
    /// 1 for the first round.
    pub round: u32,
    /// Whether the domain ran during the round (false for the last round).
    pub live: bool,
    /// Frames the round read on the source.
    pub frames_scanned: u32,
    /// Frames the round copied (changed since the round before).
    pub frames_sent: u32,
    /// Grant entries copied (the last round only).
    pub grants: usize,
    /// Grants another domain still mapped at the last round: their mappings stay behind
    /// on the source (a backend should have let go once the guest acknowledged the
    /// suspend).
    pub grants_still_mapped: usize,
    /// Bytes of the round's stream.
    pub bytes: u64,
    /// Time to save and restore the round.
    pub duration: Duration,
}

/// What a migration did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// The domain's name, on both hosts.
    pub name: String,
    /// Its domid on the source host (destroyed now).
    pub source_domid: DomId,
    /// Its domid on the destination host.
    pub dest_domid: DomId,
    /// Every round, the last one last.
    pub rounds: Vec<RoundReport>,
    /// From the suspend on the source to the resume on the destination.
    pub downtime: Duration,
    /// The whole migration.
    pub total: Duration,
}

impl MigrationReport {
    /// Bytes of every round's stream.
    pub fn bytes(&self) -> u64 {
        self.rounds.iter().map(|r| r.bytes).sum()
    }
}

/// Move domain `domid` of `source` to `dest` (see the module docs).
pub fn migrate_domain(
    source: &SimAdmin,
    dest: &SimAdmin,
    domid: DomId,
    options: &MigrateOptions,
) -> Result<MigrationReport> {
    let mut m = Migration::begin_with(source, dest, domid, options)?;
    m.live_rounds()?;
    m.finish()
}

/// A migration step by step, for callers that act between the steps (a test writing to
/// the guest's memory between two rounds, a toolstack telling the guest's peers).
/// Dropped before [`Migration::finish`] succeeds, it rolls back.
pub struct Migration<'a> {
    source: &'a SimAdmin,
    dest: &'a SimAdmin,
    domid: DomId,
    name: String,
    incoming: DomId,
    work: WorkDir,
    options: MigrateOptions,
    source_instance: u64,
    /// The domain's processes, frozen for the last round until the domain runs again.
    frozen: Option<FrozenProcesses>,
    rounds: Vec<RoundReport>,
    started: Instant,
    /// Whether this migration suspended the source domain (to resume it on a rollback).
    suspended_here: bool,
    /// When [`Migration::suspend`] began.
    suspended_at: Option<Instant>,
    /// Whether the source domain was suspended before the migration.
    was_suspended: bool,
    done: bool,
}

impl<'a> Migration<'a> {
    /// Start moving `domid` of `source` to `dest`: the source starts sending, the
    /// destination creates `NAME--incoming`. Stream files go in a new directory under
    /// `work_dir` (the system's temporary directory if none).
    pub fn begin(
        source: &'a SimAdmin,
        dest: &'a SimAdmin,
        domid: DomId,
        work_dir: Option<&Path>,
    ) -> Result<Migration<'a>> {
        let options = MigrateOptions {
            work_dir: work_dir.map(Path::to_path_buf),
            ..MigrateOptions::default()
        };
        Self::begin_with(source, dest, domid, &options)
    }

    /// [`Migration::begin`] with every option (the rounds' ones are the caller's to apply).
    pub fn begin_with(
        source: &'a SimAdmin,
        dest: &'a SimAdmin,
        domid: DomId,
        options: &MigrateOptions,
    ) -> Result<Migration<'a>> {
        let work_dir = options.work_dir.as_deref();
        let started = Instant::now();
        let state = source.state(domid)?;
        let was_suspended = state.state == RunState::Suspended;
        let source_instance = state.instance;
        let info = source.save_begin(domid)?;
        let name = info.name.clone();
        let end_sending = |e: Error| {
            if let Err(e2) = source.save_end(domid) {
                tracing::warn!(domid, error = %e2, "ending the sending after a failure");
            }
            e
        };
        let incoming_name = format!("{name}{INCOMING_SUFFIX}");
        let taken = dest.list().map_err(end_sending)?;
        if let Some(d) = taken
            .iter()
            .find(|d| d.name == name || d.name == incoming_name)
        {
            return Err(end_sending(Error::Exists(format!(
                "the destination has a domain named {:?} (domid {})",
                d.name, d.domid
            ))));
        }
        let work = WorkDir::create(work_dir, &name).map_err(end_sending)?;
        let incoming = dest
            .create_incoming(&incoming_name, info.mem_limit)
            .map_err(end_sending)?;
        tracing::info!(
            domid,
            name = %name,
            incoming,
            frames = info.frames,
            grants = info.grants,
            "migration started"
        );
        Ok(Migration {
            source,
            dest,
            domid,
            name,
            incoming,
            work,
            options: options.clone(),
            source_instance,
            frozen: None,
            rounds: Vec::new(),
            started,
            suspended_here: false,
            suspended_at: None,
            was_suspended,
            done: false,
        })
    }

    /// The incoming domain's domid on the destination.
    pub fn incoming_domid(&self) -> DomId {
        self.incoming
    }

    /// The rounds so far.
    pub fn rounds(&self) -> &[RoundReport] {
        &self.rounds
    }

    /// One round while the domain runs.
    pub fn live_round(&mut self) -> Result<RoundReport> {
        self.round(false)
    }

    /// Live rounds until they converge (see the module docs and [`MigrateOptions`]).
    pub fn live_rounds(&mut self) -> Result<()> {
        let mut before: Option<u32> = None;
        loop {
            let r = self.live_round()?;
            let converged = r.frames_sent <= self.options.converged_frames;
            let not_shrinking = before.is_some_and(|b| r.frames_sent >= b);
            if converged || not_shrinking || r.round >= self.options.max_live_rounds {
                return Ok(());
            }
            before = Some(r.frames_sent);
        }
    }

    fn round(&mut self, last: bool) -> Result<RoundReport> {
        let n = self.rounds.len() as u32 + 1;
        let at = Instant::now();
        let path = self.work.path.join(format!("round-{n}"));
        let saved: SaveRound = self.source.save(self.domid, &path, last)?;
        let restored = self.dest.restore(self.incoming, &path);
        if let Err(e) = std::fs::remove_file(&path) {
            tracing::warn!(path = %path.display(), error = %e, "removing a stream file");
        }
        let restored = restored?;
        if last && !restored.complete {
            return Err(Error::Protocol(
                "the destination did not complete the domain with the last round".into(),
            ));
        }
        let report = RoundReport {
            round: n,
            live: !last,
            frames_scanned: saved.frames_scanned,
            frames_sent: saved.frames_sent,
            grants: saved.grants_sent,
            grants_still_mapped: saved.grants_still_mapped,
            bytes: saved.bytes,
            duration: at.elapsed(),
        };
        tracing::info!(
            domid = self.domid,
            round = n,
            live = !last,
            frames_sent = report.frames_sent,
            frames_scanned = report.frames_scanned,
            bytes = report.bytes,
            millis = report.duration.as_millis() as u64,
            "migration round"
        );
        self.rounds.push(report.clone());
        Ok(report)
    }

    /// Suspend the source domain (the downtime starts), wait for the guest to acknowledge
    /// it (if it announced `control/feature-suspend`) and freeze its processes: what
    /// [`Migration::finish`] does first, for a toolstack that reads the guest's device
    /// state once it cannot change any more (to carry it to the destination). Once it
    /// succeeded, later calls do nothing; after a failure, drop the migration (it rolls
    /// back).
    pub fn suspend(&mut self) -> Result<()> {
        if self.suspended_at.is_some() {
            return Ok(());
        }
        let at = Instant::now();
        if !self.was_suspended && !self.suspended_here {
            self.source.suspend(self.domid)?;
            self.suspended_here = true;
            self.wait_guest_suspended()?;
        }
        let pids = self.source.processes(self.domid)?;
        self.frozen = Some(FrozenProcesses::freeze(&pids, self.options.freeze_timeout)?);
        self.suspended_at = Some(at);
        Ok(())
    }

    /// Suspend the source domain, freeze its processes, copy the rest and the grant
    /// table, rename and resume the domain on the destination, destroy the source domain
    /// and thaw the processes.
    pub fn finish(self) -> Result<MigrationReport> {
        let (report, frozen) = self.finish_frozen()?;
        frozen.thaw();
        Ok(report)
    }

    /// [`Migration::finish`], leaving the domain's processes frozen for the caller to
    /// thaw (dropping them thaws them too).
    pub fn finish_frozen(mut self) -> Result<(MigrationReport, FrozenProcesses)> {
        self.suspend()?;
        let suspended_at = self.suspended_at.unwrap_or_else(Instant::now);
        self.round(true)?;
        self.dest.rename(self.incoming, &self.name)?;
        self.dest.resume(self.incoming)?;
        let downtime = suspended_at.elapsed();
        // The domain runs on the destination now: whatever happens below, no rollback.
        self.done = true;
        let destroyed = self.source.destroy(self.domid);
        let forwarding = Forwarding {
            dir: std::path::absolute(self.dest.dir())?,
            domid: self.incoming,
            source_instance: self.source_instance,
        };
        let forwarded = forwarding.write(self.source.dir(), self.domid);
        let frozen = self
            .frozen
            .take()
            .ok_or_else(|| Error::Protocol("the processes were thawed early".into()))?;
        let report = MigrationReport {
            name: self.name.clone(),
            source_domid: self.domid,
            dest_domid: self.incoming,
            rounds: std::mem::take(&mut self.rounds),
            downtime,
            total: self.started.elapsed(),
        };
        if let Err(e) = destroyed {
            return Err(Error::Protocol(format!(
                "{} runs as domain {} on the destination, but destroying domain {} on the \
                 source failed: {e}",
                self.name, self.incoming, self.domid
            )));
        }
        if let Err(e) = forwarded {
            return Err(Error::Protocol(format!(
                "{} runs as domain {} on the destination, but its processes cannot learn \
                 it: writing its forwarding record failed: {e}",
                self.name, self.incoming
            )));
        }
        tracing::info!(
            name = %report.name,
            source = report.source_domid,
            dest = report.dest_domid,
            rounds = report.rounds.len(),
            bytes = report.bytes(),
            downtime_ms = report.downtime.as_millis() as u64,
            frozen = frozen.pids().len(),
            "migration done"
        );
        Ok((report, frozen))
    }

    /// Wait until the guest acknowledges the suspend request (it clears
    /// `control/shutdown` once its devices are down), if it says it handles them.
    fn wait_guest_suspended(&self) -> Result<()> {
        let xs = XsClient::connect_unix(layout::xenstore_sock(self.source.dir(), DOM0))?;
        let control = format!("/local/domain/{}/control", self.domid);
        match xs.read(XBT_NULL, &format!("{control}/feature-suspend")) {
            Ok(v) if v.trim_ascii() == b"1" => {}
            Ok(_) | Err(Error::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e),
        }
        let path = format!("{control}/shutdown");
        let token = "xmx-migrate:suspend";
        xs.watch(&path, token)?;
        let timeout = self.options.guest_suspend_timeout;
        let deadline = Instant::now() + timeout;
        let result = loop {
            match xs.read(XBT_NULL, &path) {
                Ok(v) if v.trim_ascii().is_empty() => break Ok(()),
                Err(Error::NotFound(_)) => break Ok(()),
                Ok(_) => {}
                Err(e) => break Err(e),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Err(Error::Busy(format!(
                    "domain {} did not acknowledge the suspend within {} ms",
                    self.domid,
                    timeout.as_millis()
                )));
            }
            if let Err(e) = xs.next_watch_event(Some(left)) {
                break Err(e);
            }
        };
        let _ = xs.unwatch(&path, token);
        tracing::debug!(
            domid = self.domid,
            ok = result.is_ok(),
            "guest suspend acknowledged"
        );
        result
    }

    fn roll_back(&mut self) {
        tracing::warn!(domid = self.domid, name = %self.name, "migration rolled back");
        if let Err(e) = self.dest.destroy(self.incoming) {
            tracing::warn!(incoming = self.incoming, error = %e, "destroying the incoming domain");
        }
        if let Err(e) = self.source.save_end(self.domid) {
            tracing::debug!(domid = self.domid, error = %e, "ending the sending");
        }
        if self.suspended_here {
            if let Err(e) = self.source.resume(self.domid) {
                tracing::warn!(domid = self.domid, error = %e, "resuming the source domain");
            }
        }
        // Thawed once the domain runs again, as it does after a suspend.
        if let Some(f) = self.frozen.take() {
            f.thaw();
        }
    }
}

impl Drop for Migration<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.roll_back();
        }
    }
}

/// The directory of one migration's stream files, removed with it.
struct WorkDir {
    path: PathBuf,
}

impl WorkDir {
    fn create(base: Option<&Path>, name: &str) -> Result<WorkDir> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let base = match base {
            Some(b) => b.to_path_buf(),
            None => std::env::temp_dir(),
        };
        // The daemons run elsewhere: they need a path that does not depend on our cwd.
        let base = std::path::absolute(&base)?;
        let path = base.join(format!(
            "xmx-migrate-{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| {
                Error::Io(std::io::Error::new(
                    e.kind(),
                    format!("creating {}: {e}", path.display()),
                ))
            })?;
        Ok(WorkDir { path })
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "removing the migration directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarding_records_round_trip_and_refuse_garbage() {
        let f = Forwarding {
            dir: "/run/sim/h1".into(),
            domid: 7,
            source_instance: 42,
        };
        assert_eq!(f.emit(), "dir /run/sim/h1\ndomid 7\ninstance 42\n");
        assert_eq!(Forwarding::parse(&f.emit()).unwrap(), f);
        for bad in [
            "",
            "dir /a\ndomid 7\n",
            "dir a\ndomid 7\ninstance 1\n",
            "dir /a\ndomid 70000\ninstance 1\n",
            "dir /a\ndomid 7\ninstance x\n",
            "dir /a\ndomid 7\ninstance 1\ninstance 2\n",
            "dir /a\ndomid 7\ninstance 1\nmore\n",
            "\u{0}\u{ff}",
        ] {
            assert!(
                matches!(Forwarding::parse(bad), Err(Error::Protocol(_))),
                "{bad:?}"
            );
        }
        let dir = std::env::temp_dir().join(format!("xmx-fwd-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(Forwarding::read(&dir, 7).unwrap(), None);
        f.write(&dir, 7).unwrap();
        assert_eq!(Forwarding::read(&dir, 7).unwrap(), Some(f));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! `xmx sim migrate`: move a running guest of a simulated cluster to another host, as
//! `xl migrate` does, with its xmx device.
//!
//! The toolstack's part around the hypervisor's (`xmx_hv::sim::migrate`):
//! 0. the source's xmxd marks the guest leaving (`direct-leaving`): its direct channels to
//!    co-located guests are revoked while it runs, so its peers fall back to the backend
//!    path before it freezes (undone if the migration fails);
//! 1. the destination creates `NAME--incoming`; live rounds copy the guest's memory while
//!    it runs (the destination's xmxd sees the guest arrive and takes its identity, MAC
//!    and peer index, from the fabric);
//! 2. the guest is suspended: its frontend closes its device and acknowledges, its
//!    processes are frozen;
//! 3. the device's record (identity and the sessions the backend recorded for its
//!    endpoints) is read from the source;
//! 4. the last round, the rename and the resume on the destination; the source domain is
//!    destroyed (its xmxd stops announcing the guest);
//! 5. the device is created on the destination with the sessions, before the guest can
//!    connect;
//! 6. the processes are thawed: the guest daemon follows its domain to the new host, its
//!    frontend connects to the new backend (which announces the guest's MAC on the
//!    fabric) and re-opens the endpoints in their sessions, and peers' retransmissions
//!    reach them there.
//!
//! The cluster's state file then lists the guest under the new host, with its new domid,
//! by its domain name (unique in the cluster, where a host's own guests are `g0`, `g1`...).
//! Its guest daemon keeps running where it was started (its supervisor with it); one the
//! supervisor restarts there still finds the guest, through the forwarding records the
//! moves left (`SimPlatform::locate`).

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use xmx_backend::xenbus::toolstack::{self, DeviceRecord};
use xmx_hv::sim::admin::SimAdmin;
use xmx_hv::sim::migrate::{MigrateOptions, Migration, MigrationReport};
use xmx_hv::sim::SimPlatform;
use xmx_hv::{DomId, Platform, DOM0};
use xmx_tools::xmxd::{ControlClient, XmxdRequest};

use super::cluster::{require_root, ClusterState, GuestState};

/// Device index of the xmx device the simulated cluster attaches.
const DEVID: u32 = 0;

/// One round, as reported.
#[derive(Debug, Clone, Serialize)]
pub struct RoundSummary {
    /// 1 for the first.
    pub round: u32,
    /// Whether the guest ran during it.
    pub live: bool,
    /// Frames it copied.
    pub frames_sent: u32,
    /// Bytes of its stream.
    pub bytes: u64,
    /// How long it took, in milliseconds.
    pub millis: f64,
}

/// What `xmx sim migrate` did.
#[derive(Debug, Clone, Serialize)]
pub struct MigrateSummary {
    /// The guest's name in the cluster state, after the move.
    pub guest: String,
    /// The host it left.
    pub from: String,
    /// The host it runs on now.
    pub to: String,
    /// Its domid on the host it left.
    pub source_domid: DomId,
    /// Its domid now.
    pub dest_domid: DomId,
    /// Every round, the last one last.
    pub rounds: Vec<RoundSummary>,
    /// Bytes of all rounds.
    pub bytes: u64,
    /// From the suspend to the resume on the new host, in milliseconds.
    pub downtime_ms: f64,
    /// The whole migration, in milliseconds.
    pub total_ms: f64,
    /// Processes of the guest frozen for the last round.
    pub frozen_processes: usize,
    /// Endpoint sessions carried with the device (None: the guest had no xmx device).
    pub sessions_carried: Option<usize>,
    /// Direct channel pairs of the guest revoked before it was suspended (None: the
    /// source's xmxd could not be asked; its pairs then ended with its domain).
    pub direct_revoked: Option<usize>,
}

fn millis(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Move guest `guest` of host `from` to host `to`; the state file follows.
pub fn migrate(
    state: &mut ClusterState,
    from: &str,
    guest: &str,
    to: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<MigrateSummary> {
    require_root()?;
    let src = state.host(from)?.clone();
    let dst = state.host(to)?.clone();
    if src.name == dst.name {
        bail!("{} already runs on {}", guest, src.name);
    }
    let g = src.guest(guest)?.clone();
    let source =
        SimAdmin::connect(&src.simhv_dir).with_context(|| format!("the simhv of {}", src.name))?;
    let dest =
        SimAdmin::connect(&dst.simhv_dir).with_context(|| format!("the simhv of {}", dst.name))?;
    let work = state.root.join("migrate");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let options = MigrateOptions {
        work_dir: Some(work),
        ..MigrateOptions::default()
    };
    progress(&format!(
        "{}/{} (domain {}): copying its memory to {} while it runs",
        src.name, g.name, g.domid, dst.name
    ));
    let leaving = Leaving::mark(&src.simhv_dir.join("xmxd.sock"), g.domid);
    let direct_revoked = match &leaving {
        Ok(l) => Some(l.revoked),
        Err(e) => {
            progress(&format!(
                "its direct channels are left to end with its domain: {e:#}"
            ));
            None
        }
    };
    let mut m = Migration::begin_with(&source, &dest, g.domid, &options)
        .with_context(|| format!("starting to move domain {} of {}", g.domid, src.name))?;
    m.live_rounds().context("live rounds")?;
    progress("suspending the guest");
    m.suspend().context("suspending the guest")?;
    let record = read_device(&src.simhv_dir, g.domid)?;
    progress("last round");
    let (report, frozen) = m.finish_frozen().context("the last round")?;
    // The source domain is gone, and its mark with it.
    if let Ok(l) = leaving {
        l.done();
    }
    let d = report.dest_domid;
    // The guest runs on the destination now: record it there whatever happens next.
    let moved = move_in_state(state, &src.name, &g, &dst.name, &report.name, d)?;
    let attached = match &record {
        Some(r) => attach_device(&dst.simhv_dir, d, r),
        None => Ok(()),
    };
    let frozen_processes = frozen.pids().len();
    frozen.thaw();
    attached.with_context(|| {
        format!(
            "{} runs on {} as domain {d}, but its xmx device could not be created there",
            moved, dst.name
        )
    })?;
    progress(&format!("{moved} runs on {} as domain {d}", dst.name));
    Ok(summary(
        &report,
        moved,
        &src.name,
        &dst.name,
        frozen_processes,
        record.map(|r| r.sessions.len()),
        direct_revoked,
    ))
}

/// The guest marked leaving in its source's xmxd; dropped before [`Leaving::done`] (the
/// migration failed and rolled back), the mark is lifted and the guest's pairs offered
/// again.
struct Leaving {
    socket: std::path::PathBuf,
    domid: DomId,
    revoked: usize,
    armed: bool,
}

impl Leaving {
    fn mark(socket: &Path, domid: DomId) -> Result<Leaving> {
        let mut xmxd = ControlClient::connect(socket)
            .with_context(|| format!("connecting to xmxd at {}", socket.display()))?;
        let pairs_of = |v: &serde_json::Value| {
            v["pairs"].as_array().map_or(0, |p| {
                p.iter()
                    .filter(|x| {
                        x.as_array()
                            .is_some_and(|ab| ab.iter().any(|d| d.as_u64() == Some(domid.into())))
                    })
                    .count()
            })
        };
        let before = xmxd
            .call(&XmxdRequest::Direct { enabled: None })
            .context("reading the direct channels")?;
        let after = xmxd
            .call(&XmxdRequest::DirectLeaving {
                domid,
                leaving: true,
            })
            .context("marking the guest leaving")?;
        Ok(Leaving {
            socket: socket.to_path_buf(),
            domid,
            revoked: pairs_of(&before).saturating_sub(pairs_of(&after)),
            armed: true,
        })
    }

    /// The guest left: nothing to undo.
    fn done(mut self) {
        self.armed = false;
    }
}

impl Drop for Leaving {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let undo = ControlClient::connect(&self.socket)
            .map_err(|e| e.to_string())
            .and_then(|mut x| {
                x.call(&XmxdRequest::DirectLeaving {
                    domid: self.domid,
                    leaving: false,
                })
                .map_err(|e| e.to_string())
            });
        if let Err(e) = undo {
            tracing::warn!(domid = self.domid, %e, "lifting the guest's leaving mark");
        }
    }
}

fn read_device(simhv_dir: &Path, domid: DomId) -> Result<Option<DeviceRecord>> {
    let xs = SimPlatform::attach(simhv_dir, DOM0)?.xenstore()?;
    match DeviceRecord::read(xs.as_ref(), DOM0, domid, DEVID) {
        Ok(r) => Ok(Some(r)),
        Err(xmx_hv::Error::NotFound(_)) => Ok(None),
        Err(e) => Err(e).context("reading the guest's xmx device"),
    }
}

fn attach_device(simhv_dir: &Path, domid: DomId, record: &DeviceRecord) -> Result<()> {
    let xs = SimPlatform::attach(simhv_dir, DOM0)?.xenstore()?;
    toolstack::attach_moved(xs.as_ref(), DOM0, domid, record)?;
    Ok(())
}

/// List the guest under host `to` as `name` (its domain's name: guests are named per
/// host, `g0`, `g1`..., domains across the cluster) with domid `domid`.
fn move_in_state(
    state: &mut ClusterState,
    from: &str,
    g: &GuestState,
    to: &str,
    name: &str,
    domid: DomId,
) -> Result<String> {
    let src = state
        .hosts
        .iter_mut()
        .find(|h| h.name == from)
        .context("the source host left the state")?;
    src.guests.retain(|x| x.name != g.name);
    let dst = state
        .hosts
        .iter_mut()
        .find(|h| h.name == to)
        .context("the destination host left the state")?;
    dst.guests.push(GuestState {
        name: name.to_string(),
        domid,
        frontd_socket: g.frontd_socket.clone(),
    });
    state.save()?;
    Ok(name.to_string())
}

fn summary(
    r: &MigrationReport,
    guest: String,
    from: &str,
    to: &str,
    frozen_processes: usize,
    sessions_carried: Option<usize>,
    direct_revoked: Option<usize>,
) -> MigrateSummary {
    MigrateSummary {
        guest,
        from: from.to_string(),
        to: to.to_string(),
        source_domid: r.source_domid,
        dest_domid: r.dest_domid,
        rounds: r
            .rounds
            .iter()
            .map(|x| RoundSummary {
                round: x.round,
                live: x.live,
                frames_sent: x.frames_sent,
                bytes: x.bytes,
                millis: millis(x.duration),
            })
            .collect(),
        bytes: r.bytes(),
        downtime_ms: millis(r.downtime),
        total_ms: millis(r.total),
        frozen_processes,
        sessions_carried,
        direct_revoked,
    }
}

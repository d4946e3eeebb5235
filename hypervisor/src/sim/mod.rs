//! Platform `sim`: a domain attached to an `xmx-simhv` daemon.
//!
//! Directory layout of a simhv (`--dir DIR`):
//! - `DIR/ctl.sock`: the admin socket (create, destroy, suspend, resume, list, state dump).
//! - `DIR/dom<N>/xenstore.sock`: xenstore wire protocol, connections are domain N.
//! - `DIR/dom<N>/hv.sock`: grant-table and event-channel operations of domain N.
//! - `DIR/dom<N>/...`: shared-memory files of domain N (its pages, its grant table).
//!
//! In detail:
//! - `DIR/simhv.lock`: `flock`ed by the live daemon; a second daemon on DIR refuses to start.
//! - `DIR/ready`: written (atomically, holding the daemon's pid) once it serves requests.
//! - `DIR/dom<N>/mem`: domain N's memory; page `f` of the file is frame `f`. The memory is
//!   an anonymous shared-memory file (memfd) held by the daemon, RAM as a guest's is, never
//!   disk; `mem` is a link to the daemon's descriptor of it (`/proc/<pid>/fd/<n>`), for
//!   inspection. Clients receive the descriptor over `hv.sock`. It grows on demand up to
//!   the domain's memory limit; freed frames are zeroed (in runs) before reuse.
//! - `DIR/dom<N>/gnttab`: domain N's grant table, an array of Xen v1 entries
//!   `{u16 flags, u16 domid, u32 frame}` little-endian, flags as in Xen's public
//!   grant_table.h (`GTF_permit_access` 1, `GTF_readonly` 1<<2, `GTF_reading` 1<<3,
//!   `GTF_writing` 1<<4). Refs 0..8 are reserved as Xen guests reserve them.
//! - Each `dom<N>` directory is mode 0700; the connecting process of a domain's sockets
//!   *is* that domain.
//!
//! The `hv.sock` protocol is in [`proto`], framing and descriptor passing in [`transport`],
//! the admin protocol and its client in [`admin`], moving a domain to another simhv in
//! [`migrate`].
//!
//! Isolation is enforced on every request (which domain may map or copy which grant,
//! bind which port). It does not extend to processes of the same user tampering with the
//! files under DIR directly: a simulated host trusts its own user.

pub mod admin;
mod conn;
pub mod evtchn;
pub mod freeze;
pub mod gnttab;
pub(crate) mod imports;
pub mod layout;
pub mod migrate;
pub mod mmap;
pub mod proto;
pub mod transport;

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use admin::SimAdmin;
pub use evtchn::{PortStatus, SimEventChannels, SimNotifier};
pub use gnttab::SimGrantTable;

use crate::{DomId, Error, EventChannels, GrantTable, Platform, PlatformKind, Result, Xenstore};

/// Forwarding records [`SimPlatform::locate`] follows at most: a chain of moves, each
/// leaving a record, that no migration makes this long is a loop of stale records.
pub const MAX_FORWARDS: usize = 16;

/// A domain of a running `xmx-simhv`, as seen by one of its processes. It can follow
/// the domain to another host after a migration ([`SimPlatform::follow_move`]).
pub struct SimPlatform {
    place: Mutex<(PathBuf, DomId)>,
    grant_table: Mutex<Option<Arc<SimGrantTable>>>,
}

impl SimPlatform {
    /// Attach to domain `domid` of the simhv serving `dir`, or, if that domain migrated
    /// away, to the domain it became (see [`SimPlatform::locate`]).
    pub fn attach(dir: impl AsRef<Path>, domid: DomId) -> Result<SimPlatform> {
        let (dir, domid) = Self::locate(dir.as_ref(), domid)?;
        Ok(SimPlatform {
            place: Mutex::new((dir, domid)),
            grant_table: Mutex::new(None),
        })
    }

    /// Where domain `domid` of the simhv at `dir` runs now: there, or where the forwarding
    /// records of its moves lead (at most [`MAX_FORWARDS`] of them). A process started after
    /// its domain moved, from an environment that names the old host (a guest daemon its
    /// supervisor restarts, say), so finds the domain as a running process follows it. A
    /// domain created since with the same id has no record: it is the one attached to.
    pub fn locate(dir: &Path, domid: DomId) -> Result<(PathBuf, DomId)> {
        let (mut dir, mut domid) = (dir.to_path_buf(), domid);
        for _ in 0..=MAX_FORWARDS {
            if layout::hv_sock(&dir, domid).exists() {
                return Ok((dir, domid));
            }
            let Some(to) = migrate::Forwarding::read(&dir, domid)? else {
                return Err(Error::NotFound(format!(
                    "no simulated domain {domid} at {}",
                    dir.display()
                )));
            };
            tracing::info!(from = domid, to = to.domid, dir = %to.dir.display(), "the domain moved; attaching where it went");
            (dir, domid) = (to.dir, to.domid);
        }
        Err(Error::NotFound(format!(
            "domain {domid} at {}: more than {MAX_FORWARDS} forwarding records in a row",
            dir.display()
        )))
    }

    fn place(&self) -> (PathBuf, DomId) {
        self.place.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The simhv directory.
    pub fn dir(&self) -> PathBuf {
        self.place().0
    }

    /// If the domain was migrated away (its forwarding record says where to, see
    /// [`migrate::Forwarding`]), attach to it on its new host: from now on new handles
    /// are the destination's, the grant table follows with its grants (see
    /// [`SimGrantTable::follow`]), and pages imported from another process of the domain
    /// (see [`crate::handoff`]) are mapped from the destination's memory at the same
    /// addresses. Event-channel handles and xenstore connections opened
    /// before are the old host's: their owners open new ones. True if it moved.
    pub fn follow_move(&self) -> Result<bool> {
        let (dir, domid) = self.place();
        let Some(to) = migrate::Forwarding::read(&dir, domid)? else {
            return Ok(false);
        };
        let gt = self
            .grant_table
            .lock()
            .map_err(|_| Error::Closed("platform poisoned".into()))?
            .clone();
        if let Some(gt) = &gt {
            if gt.instance() != to.source_instance {
                // The record of an earlier domain with this domid.
                return Ok(false);
            }
        }
        if !layout::hv_sock(&to.dir, to.domid).exists() {
            return Err(Error::NotFound(format!(
                "domain {domid} moved to domain {} at {}, which does not exist",
                to.domid,
                to.dir.display()
            )));
        }
        // The memory this process imported pages of, before the move (unknown to a process
        // without a grant table of its own: then it held only its own domain's).
        let from = match &gt {
            Some(gt) => Some(imports::memory_id(gt.memory().as_fd())?),
            None => None,
        };
        let gt = match gt {
            Some(gt) => {
                gt.follow(&to.dir, to.domid)?;
                gt
            }
            // Only for the destination's memory, to remap what was imported.
            None => Arc::new(SimGrantTable::open(&to.dir, to.domid)?),
        };
        let imports = imports::remap_all(from, gt.memory().as_fd())?;
        *self
            .grant_table
            .lock()
            .map_err(|_| Error::Closed("platform poisoned".into()))? = Some(gt);
        tracing::info!(from = domid, to = to.domid, dir = %to.dir.display(), imports, "followed the domain to its new host");
        *self.place.lock().unwrap_or_else(|p| p.into_inner()) = (to.dir, to.domid);
        Ok(true)
    }

    /// The shared grant table as its concrete type.
    pub fn sim_grant_table(&self) -> Result<Arc<SimGrantTable>> {
        let mut slot = self
            .grant_table
            .lock()
            .map_err(|_| Error::Closed("platform poisoned".into()))?;
        if let Some(gt) = slot.as_ref() {
            return Ok(gt.clone());
        }
        let (dir, domid) = self.place();
        let gt = Arc::new(SimGrantTable::open(&dir, domid)?);
        *slot = Some(gt.clone());
        Ok(gt)
    }

    /// A new event-channel handle as its concrete type.
    pub fn sim_event_channels(&self) -> Result<SimEventChannels> {
        let (dir, domid) = self.place();
        SimEventChannels::open(&dir, domid)
    }
}

impl Platform for SimPlatform {
    fn kind(&self) -> PlatformKind {
        PlatformKind::Sim
    }

    fn domid(&self) -> DomId {
        self.place().1
    }

    fn grant_table(&self) -> Result<Arc<dyn GrantTable>> {
        Ok(self.sim_grant_table()?)
    }

    fn event_channels(&self) -> Result<Box<dyn EventChannels>> {
        Ok(Box::new(self.sim_event_channels()?))
    }

    fn follow_move(&self) -> Result<bool> {
        SimPlatform::follow_move(self)
    }

    fn xenstore(&self) -> Result<Box<dyn Xenstore>> {
        let (dir, domid) = self.place();
        let path = layout::xenstore_sock(&dir, domid);
        Ok(Box::new(crate::xs::XsClient::connect_unix(&path)?))
    }
}

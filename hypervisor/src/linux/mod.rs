//! Platform `linux`: real Xen from a userspace process.
//!
//! - grants given: /dev/xen/gntalloc ([`Gntalloc`]),
//! - grants mapped and grant copy: /dev/xen/gntdev ([`Gntdev`]),
//! - event channels: /dev/xen/evtchn ([`LinuxEventChannels`]),
//! - xenstore: [`crate::xs::XsClient`] (xenstored's socket or /dev/xen/xenbus).
//!
//! Ioctl layouts are in [`abi`], checked against the kernel's uapi headers.
//!
//! One difference from the hypervisor's own semantics leaks through: gntalloc ends
//! foreign access lazily, so ending access to pages the remote still maps succeeds here
//! (the pages stay alive until the remote unmaps them) instead of failing with
//! [`Error::Busy`]. [`LinuxPlatform::END_ACCESS_REPORTS_BUSY`] says so,
//! and the conformance suite skips that check on this platform.

pub mod abi;
mod evtchn;
mod gntalloc;
mod gntdev;
mod sys;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use tracing::{debug, info};

pub use evtchn::{EvtchnNotifier, LinuxEventChannels};
pub use gntalloc::{Gntalloc, GntallocBatch, DOMID_FIRST_RESERVED};
pub use gntdev::{status_result, Gntdev};

use crate::platform::{Platform, PlatformKind};
use crate::xs::XsClient;
use crate::{
    CopySegment, DomId, Error, EventChannels, GrantRef, GrantTable, GrantedPages, MappedPages,
    Result, Xenstore, XBT_NULL,
};

/// Where the Xen device nodes live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinuxConfig {
    /// Directory of `gntalloc`, `gntdev` and `evtchn` (normally `/dev/xen`).
    pub dev_dir: PathBuf,
}

impl Default for LinuxConfig {
    fn default() -> Self {
        LinuxConfig {
            dev_dir: PathBuf::from("/dev/xen"),
        }
    }
}

impl LinuxConfig {
    fn node(&self, name: &str) -> PathBuf {
        self.dev_dir.join(name)
    }
}

/// This domain on real Xen.
pub struct LinuxPlatform {
    config: LinuxConfig,
    /// Changes when the domain is migrated: the destination gives it a new id (or,
    /// by chance, the same one).
    domid: AtomicU16,
    /// The moves this instance has reported (see [`migration`]).
    moves_seen: AtomicU32,
    grant_table: OnceLock<Arc<LinuxGrantTable>>,
}

impl std::fmt::Debug for LinuxPlatform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinuxPlatform")
            .field("config", &self.config)
            .field("domid", &self.domid.load(Ordering::Relaxed))
            .finish()
    }
}

impl LinuxPlatform {
    /// Whether ending access to pages the remote still maps fails with `Busy` (it does
    /// not: gntalloc defers the release instead).
    pub const END_ACCESS_REPORTS_BUSY: bool = false;

    /// Open the devices under /dev/xen and learn this domain's id from xenstore.
    pub fn open() -> Result<Self> {
        Self::open_with(LinuxConfig::default())
    }

    /// As [`LinuxPlatform::open`], with the device nodes under `config.dev_dir`.
    ///
    /// Fails with [`Error::Unsupported`] naming /dev/xen/evtchn when it is missing (every
    /// Xen domain with the Xen drivers has it), before any xenstore access.
    pub fn open_with(config: LinuxConfig) -> Result<Self> {
        // Opening (and dropping) the evtchn device is the cheapest proof of running on Xen.
        LinuxEventChannels::open(&config.node("evtchn"))?;
        let xs = XsClient::from_env()?;
        let domid = read_domid(&xs)?;
        migration::opened_as(domid);
        // Take note of the domain's mark now, so that a move before the first look is
        // still seen as one.
        let moves = match migration::check() {
            Ok((_, moves)) => moves,
            Err(e) => {
                tracing::warn!(error = %e, "linux platform: cannot mark the domain's xenstore home; moves to a host that gives the same domid go unnoticed");
                migration::moves()
            }
        };
        info!(domid, dev_dir = %config.dev_dir.display(), "linux platform: opened");
        Ok(LinuxPlatform {
            config,
            domid: AtomicU16::new(domid),
            moves_seen: AtomicU32::new(moves),
            grant_table: OnceLock::new(),
        })
    }

    /// The device directory in use.
    pub fn config(&self) -> &LinuxConfig {
        &self.config
    }
}

/// What this process knows of its domain's migrations.
///
/// After a migration the guest kernel has forgotten every interdomain event channel a
/// process bound through /dev/xen/evtchn, but the device still lists them: unbinding one,
/// or closing a descriptor that still holds one, then trips a `BUG_ON` in the driver
/// (`evtchn_unbind_from_user`, Linux 6.1) and takes the process down with a kernel oops.
/// So a handle bound before a move must never unbind nor close what it bound
/// ([`LinuxEventChannels`] asks [`moved_since`](migration::moved_since)); the xmx guest
/// daemon lets go of its ports before a planned move (`xmx-hook migrate`) so that
/// nothing is left to leak.
pub(crate) mod migration {
    use std::sync::Mutex;

    use super::{read_domid, XsClient};
    use crate::{DomId, Error, Result, Xenstore};

    /// A mark in the domain's own xenstore home. Its xenstore is not part of a migration
    /// (the destination's toolstack builds the home anew), so the mark's absence, or
    /// another process's newer mark, tells a move even when the destination happens to
    /// give the domain the id it had (which the domid alone could not).
    const EPOCH: &str = "data/xmx-epoch";

    /// What this process last saw: the domid, the mark, and the moves counted.
    struct Seen {
        domid: Option<DomId>,
        epoch: Option<String>,
        moves: u32,
    }

    static SEEN: Mutex<Seen> = Mutex::new(Seen {
        domid: None,
        epoch: None,
        moves: 0,
    });

    fn seen() -> std::sync::MutexGuard<'static, Seen> {
        SEEN.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn opened_as(domid: DomId) {
        let mut s = seen();
        if s.domid.is_none() {
            s.domid = Some(domid);
        }
    }

    /// Moves seen so far, without looking.
    pub(crate) fn moves() -> u32 {
        seen().moves
    }

    /// The mark as it is, written first if there is none (by whichever process of the
    /// domain gets there first: the others then read that one).
    fn epoch(xs: &dyn Xenstore) -> Result<String> {
        crate::in_transaction(xs, |tx| match xs.read(tx, EPOCH) {
            Ok(v) => Ok(String::from_utf8_lossy(&v).into_owned()),
            Err(Error::NotFound(_)) => {
                let mark = format!("{:016x}", fresh());
                xs.write(tx, EPOCH, mark.as_bytes())?;
                Ok(mark)
            }
            Err(e) => Err(e),
        })
    }

    /// A number unlikely to repeat: the clock mixed with this process's id.
    fn fresh() -> u64 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        t ^ (u64::from(std::process::id()) << 40)
    }

    /// Look again: (the domid now, moves seen including this one). dom0 never moves, and
    /// a process that opened no platform does not know its domain: neither looks.
    pub(crate) fn check() -> Result<(DomId, u32)> {
        {
            let s = seen();
            if !matches!(s.domid, Some(d) if d != crate::DOM0) {
                return Ok((s.domid.unwrap_or(crate::DOM0), s.moves));
            }
        }
        let xs = XsClient::from_env()?;
        let now = read_domid(&xs)?;
        let mark = epoch(&xs)?;
        let mut s = seen();
        let moved = match &s.epoch {
            // The first look only takes note.
            None => s.domid != Some(now),
            Some(before) => *before != mark || s.domid != Some(now),
        };
        s.domid = Some(now);
        s.epoch = Some(mark);
        if moved {
            s.moves += 1;
        }
        Ok((now, s.moves))
    }

    /// Whether the domain moved since `moves` were seen (looking again; a failed look
    /// answers yes: leaking a descriptor is harmless, a kernel oops is not).
    pub(crate) fn moved_since(moves: u32) -> bool {
        match check() {
            Ok((_, now)) => now != moves,
            Err(e) => {
                tracing::warn!(error = %e, "cannot tell whether the domain moved; assuming it did");
                true
            }
        }
    }
}

/// This domain's id: the `domid` key of its xenstore home, absent in dom0 on some
/// toolstacks (hence 0).
fn read_domid(xs: &dyn Xenstore) -> Result<DomId> {
    match xs.read(XBT_NULL, "domid") {
        Ok(v) => parse_domid(&v),
        Err(Error::NotFound(_)) => {
            debug!("xenstore has no domid key: dom0");
            Ok(crate::DOM0)
        }
        Err(e) => Err(e),
    }
}

/// Parse a xenstore `domid` value (decimal, maybe NUL- or newline-terminated).
fn parse_domid(v: &[u8]) -> Result<DomId> {
    let s = std::str::from_utf8(v)
        .map_err(|_| Error::Protocol("xenstore domid is not UTF-8".into()))?
        .trim_end_matches(['\0', '\n'])
        .trim();
    s.parse::<DomId>()
        .ok()
        .filter(|&d| d < DOMID_FIRST_RESERVED)
        .ok_or_else(|| Error::Protocol(format!("xenstore domid {s:?} is not a domain id")))
}

impl Platform for LinuxPlatform {
    fn kind(&self) -> PlatformKind {
        PlatformKind::Linux
    }

    fn domid(&self) -> DomId {
        self.domid.load(Ordering::Acquire)
    }

    /// A migrated Linux guest runs on under a new domid, with the same kernel
    /// connections (xenbus, the grant and event-channel devices), but everything it had
    /// granted or bound is gone: Xen does not carry a PV guest's grant table or its
    /// interdomain event channels across a migration. Nothing tells a process that it
    /// happened; the domain's mark in its xenstore home (and its domid) show it, so this
    /// looks at them (see [`migration`]).
    fn follow_move(&self) -> Result<bool> {
        let (now, moves) = migration::check()?;
        let before = self.domid.swap(now, Ordering::AcqRel);
        if self.moves_seen.swap(moves, Ordering::AcqRel) == moves {
            return Ok(false);
        }
        info!(
            from = before,
            to = now,
            "linux platform: the domain was migrated"
        );
        Ok(true)
    }

    fn handles_follow_move(&self) -> bool {
        false
    }

    fn grant_table(&self) -> Result<Arc<dyn GrantTable>> {
        if let Some(gt) = self.grant_table.get() {
            return Ok(gt.clone());
        }
        let gt = Arc::new(LinuxGrantTable::open(&self.config.dev_dir)?);
        Ok(self.grant_table.get_or_init(|| gt).clone())
    }

    fn event_channels(&self) -> Result<Box<dyn EventChannels>> {
        Ok(Box::new(LinuxEventChannels::open(
            &self.config.node("evtchn"),
        )?))
    }

    fn xenstore(&self) -> Result<Box<dyn Xenstore>> {
        Ok(Box::new(XsClient::from_env()?))
    }
}

/// The grant table through gntalloc (granting) and gntdev (mapping, copying).
///
/// A domain may have only one of the two drivers (a guest that never maps, say); the
/// missing half answers [`Error::Unsupported`] naming its device.
#[derive(Debug)]
pub struct LinuxGrantTable {
    gntalloc: std::result::Result<Arc<Gntalloc>, String>,
    gntdev: std::result::Result<Arc<Gntdev>, String>,
}

impl LinuxGrantTable {
    /// Xen's default grant-table size for a domain: `gnttab_max_frames` (64) pages of
    /// v1 entries (8 bytes each). Userspace cannot query the real value.
    pub const DEFAULT_TABLE_ENTRIES: usize = 64 * crate::PAGE_SIZE / 8;

    /// Open `dev_dir/gntalloc` and `dev_dir/gntdev`; fails only if both are missing.
    pub fn open(dev_dir: &Path) -> Result<Self> {
        let gntalloc = Gntalloc::open(&dev_dir.join("gntalloc"));
        let gntdev = Gntdev::open(&dev_dir.join("gntdev"));
        match (gntalloc, gntdev) {
            (Err(a), Err(d)) => Err(Error::Unsupported(format!("no grant devices: {a}; {d}"))),
            (a, d) => Ok(LinuxGrantTable {
                gntalloc: a.map(Arc::new).map_err(|e| e.to_string()),
                gntdev: d.map(Arc::new).map_err(|e| e.to_string()),
            }),
        }
    }

    /// Both halves from open devices.
    pub fn from_devices(gntalloc: Gntalloc, gntdev: Gntdev) -> Self {
        LinuxGrantTable {
            gntalloc: Ok(Arc::new(gntalloc)),
            gntdev: Ok(Arc::new(gntdev)),
        }
    }

    /// The granting device, for its Linux-only operations (unmap notify).
    pub fn gntalloc(&self) -> Result<&Arc<Gntalloc>> {
        self.gntalloc
            .as_ref()
            .map_err(|e| Error::Unsupported(e.clone()))
    }

    /// The mapping device, for its Linux-only operations (unmap notify, offsets).
    pub fn gntdev(&self) -> Result<&Arc<Gntdev>> {
        self.gntdev
            .as_ref()
            .map_err(|e| Error::Unsupported(e.clone()))
    }
}

impl GrantTable for LinuxGrantTable {
    fn grant_pages(&self, remote: DomId, count: usize, writable: bool) -> Result<GrantedPages> {
        gntalloc::grant_pages(self.gntalloc()?, remote, count, writable)
    }

    fn map(&self, remote: DomId, refs: &[GrantRef], writable: bool) -> Result<MappedPages> {
        gntdev::map(self.gntdev()?, remote, refs, writable)
    }

    fn copy(&self, segments: &[CopySegment]) -> Result<Vec<Result<()>>> {
        gntdev::copy(self.gntdev()?, segments)
    }

    fn table_size(&self) -> usize {
        Self::DEFAULT_TABLE_ENTRIES
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    #[test]
    fn domid_values_parse_strictly() {
        assert_eq!(parse_domid(b"7").unwrap(), 7);
        assert_eq!(parse_domid(b"0\0").unwrap(), 0);
        assert_eq!(parse_domid(b"32751\n").unwrap(), 32751);
        assert!(matches!(parse_domid(b"32752"), Err(Error::Protocol(_))));
        assert!(matches!(parse_domid(b"-1"), Err(Error::Protocol(_))));
        assert!(matches!(parse_domid(b"dom1"), Err(Error::Protocol(_))));
        assert!(matches!(parse_domid(b""), Err(Error::Protocol(_))));
        assert!(matches!(
            parse_domid(&[0xff, 0xfe]),
            Err(Error::Protocol(_))
        ));
    }

    #[test]
    fn open_without_xen_names_the_evtchn_device() {
        let dir = std::env::temp_dir().join(format!("xmx-linux-nodev-{}", std::process::id()));
        let err = LinuxPlatform::open_with(LinuxConfig {
            dev_dir: dir.clone(),
        })
        .unwrap_err();
        match err {
            Error::Unsupported(m) => {
                assert!(m.contains(&dir.join("evtchn").display().to_string()), "{m}");
                assert!(m.contains("xen-evtchn"), "{m}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn grant_table_needs_at_least_one_device() {
        let dir = std::env::temp_dir().join(format!("xmx-linux-nogt-{}", std::process::id()));
        match LinuxGrantTable::open(&dir).unwrap_err() {
            Error::Unsupported(m) => {
                assert!(m.contains("gntalloc") && m.contains("gntdev"), "{m}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn a_missing_half_reports_its_device() {
        let dir = tempdir_with_fake_node("gntdev");
        let gt = LinuxGrantTable::open(&dir).unwrap();
        match gt.grant_pages(1, 1, true) {
            Err(Error::Unsupported(m)) => assert!(m.contains("gntalloc"), "{m}"),
            Err(other) => panic!("unexpected {other:?}"),
            Ok(_) => panic!("granted without gntalloc"),
        }
        // The present half is the fake node, which refuses the ioctl itself.
        assert!(
            matches!(gt.map(1, &[3], false), Err(Error::Unsupported(m)) if !m.contains("not available"))
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn table_size_is_xens_default() {
        let gt = LinuxGrantTable::from_devices(
            Gntalloc::from_fd(File::open("/dev/null").unwrap().into()),
            Gntdev::from_fd(File::open("/dev/null").unwrap().into()),
        );
        assert_eq!(gt.table_size(), 32768);
    }

    /// A directory whose `name` is a character device without Xen's ioctls.
    fn tempdir_with_fake_node(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "xmx-linux-fake-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink("/dev/null", dir.join(name)).unwrap();
        dir
    }
}

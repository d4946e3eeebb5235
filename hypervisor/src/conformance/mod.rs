//! The platform conformance suite: one set of checks that runs unchanged on `sim` and
//! on real Xen, where the domains are separate VMs.
//!
//! Each domain runs one [`ConformanceRole`]; the roles coordinate only through xenstore and the
//! primitives under test, never through memory of one process:
//! - [`ConformanceRole::Granter`] (a guest) grants pages and allocates event channels,
//! - [`ConformanceRole::Mapper`] (dom0 or another guest) maps, copies and binds them,
//! - [`ConformanceRole::Outsider`] (optional, a third domain) checks that it can neither map nor
//!   bind what was meant for the mapper, nor read the granter's private nodes.
//!
//! # Xenstore layout
//! Each role writes only under its own area: `/local/domain/<domid>/<base>` for a
//! relative `base` (default [`DEFAULT_BASE`]), `<base>/<domid>` for an absolute one. It
//! starts by removing what a previous run left there, lets the other roles read the
//! area, runs the local xenstore checks under `<area>/local`, and for
//! the granter writes `<area>/run = <run id>`. Everything of one run lives under
//! `<area>/<run id>/`, so the granter never mistakes a stale key of an earlier mapper
//! for an answer. A run that crashed can leave a stale `run` in the granter's area that
//! a mapper started before the next granter would follow; start the granter first
//! after a crash.
//!
//! Waits are xenstore watches on the peers' areas, each bounded by
//! [`ConformanceSetup::timeout`]; a wait that times out ends the role with a failed `sync` check.
//!
//! # Platform differences
//! Real Xen seen through Linux's gntalloc cannot refuse to end access to pages the
//! remote still maps: the driver defers the release instead (see [`Caps`]). The check
//! `grant.end-access-busy-while-mapped` is then reported as skipped, not passed.
//! Linux userspace also cannot learn the grant table's exact size, so the out-of-range
//! check uses only refs beyond any possible table there.

mod bytes;
mod coord;
mod granter;
mod mapper;
mod outsider;
mod report;
mod xs_checks;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

pub use report::{Check, ConformanceReport, Outcome};

use crate::platform::{Platform, PlatformKind};
use crate::{DomId, EventChannels, Port, Xenstore};
use coord::{SyncError, SyncResult};

/// Page counts of the grant/map/unmap scenarios, each mapped in one batch.
pub const GRANT_SIZES: [usize; 4] = [1, 16, 256, 2048];

/// The default area of a role, relative to its domain's xenstore home.
pub const DEFAULT_BASE: &str = "data/xmx-conformance";

/// A domain id that is neither party: the grantee of pages and ports the mapper must
/// not be able to use, when no third domain takes part (grants and unbound ports
/// may name a domain that does not exist).
pub const UNRELATED_DOMID: DomId = 0x7FEF;

/// A grant ref beyond any grant table Xen can give a domain.
pub const OUT_OF_RANGE_REF: u32 = 0xFFFF_FFF0;

/// Which part a domain plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConformanceRole {
    /// A guest that grants pages and allocates event channels for the others to use.
    Granter,
    /// dom0 or another guest that maps, copies and binds what the granter offered it.
    Mapper,
    /// An optional third domain that must be refused what was meant for the mapper.
    Outsider,
}

impl ConformanceRole {
    /// The role's name as the command line and reports spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            ConformanceRole::Granter => "granter",
            ConformanceRole::Mapper => "mapper",
            ConformanceRole::Outsider => "outsider",
        }
    }
}

impl fmt::Display for ConformanceRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ConformanceRole {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "granter" => Ok(ConformanceRole::Granter),
            "mapper" => Ok(ConformanceRole::Mapper),
            "outsider" => Ok(ConformanceRole::Outsider),
            _ => Err(format!("unknown role {s:?} (granter, mapper or outsider)")),
        }
    }
}

/// What a platform can observe, where platforms legitimately differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Ending access to pages the remote still maps fails with `Busy` (Xen's own
    /// semantics; not observable through Linux's gntalloc).
    pub end_access_reports_busy: bool,
    /// [`crate::GrantTable::table_size`] is the exact size of the granter's table, so
    /// the first ref past it must be refused.
    pub table_size_exact: bool,
}

impl Caps {
    /// The capabilities of a platform kind.
    pub fn of(kind: PlatformKind) -> Caps {
        match kind {
            PlatformKind::Linux => Caps {
                end_access_reports_busy: crate::linux::LinuxPlatform::END_ACCESS_REPORTS_BUSY,
                table_size_exact: false,
            },
            PlatformKind::Sim => Caps {
                end_access_reports_busy: true,
                table_size_exact: true,
            },
        }
    }
}

/// Everything one role needs to know.
#[derive(Debug, Clone)]
pub struct ConformanceSetup {
    /// The part this domain plays.
    pub role: ConformanceRole,
    /// The granter's peer is the mapper; the mapper's and the outsider's is the granter.
    pub peer: DomId,
    /// The xenstore area, relative to each domain's home or absolute.
    pub base: String,
    /// Granter only: the domain running [`ConformanceRole::Outsider`], if any.
    pub third: Option<DomId>,
    /// Granter only: the grantee of pages and ports meant for neither the mapper nor
    /// the outsider (default: the third domain, else [`UNRELATED_DOMID`]).
    pub other: Option<DomId>,
    /// The longest wait for another role or an event.
    pub timeout: Duration,
    /// Overrides the capabilities of the platform's kind.
    pub caps: Option<Caps>,
}

impl ConformanceSetup {
    /// A two-role setup with the defaults.
    pub fn new(role: ConformanceRole, peer: DomId, base: &str) -> Self {
        ConformanceSetup {
            role,
            peer,
            base: base.to_string(),
            third: None,
            other: None,
            timeout: Duration::from_secs(60),
            caps: None,
        }
    }

    fn other_domain(&self) -> DomId {
        self.other.or(self.third).unwrap_or(UNRELATED_DOMID)
    }
}

/// Run `role` against `peer` with the defaults of [`ConformanceSetup::new`].
pub fn run(
    role: ConformanceRole,
    platform: &dyn Platform,
    peer: DomId,
    base: &str,
) -> ConformanceReport {
    run_with(platform, &ConformanceSetup::new(role, peer, base))
}

/// Run the role of `setup` on `platform`; never panics on a platform or peer failure,
/// which become failed checks.
pub fn run_with(platform: &dyn Platform, setup: &ConformanceSetup) -> ConformanceReport {
    let kind = match platform.kind() {
        PlatformKind::Linux => "linux",
        PlatformKind::Sim => "sim",
    };
    let mut ctx = RoleCtx {
        platform,
        setup,
        me: platform.domid(),
        caps: setup.caps.unwrap_or_else(|| Caps::of(platform.kind())),
        report: ConformanceReport::new(setup.role.as_str(), platform.domid(), setup.peer, kind),
    };
    tracing::info!(role = %setup.role, domid = ctx.me, peer = setup.peer, "conformance: start");
    let result = match setup.role {
        ConformanceRole::Granter => granter::run(&mut ctx),
        ConformanceRole::Mapper => mapper::run(&mut ctx),
        ConformanceRole::Outsider => outsider::run(&mut ctx),
    };
    if let Err(SyncError(e)) = result {
        ctx.report.fail("sync", e);
    }
    tracing::info!(role = %setup.role, passed = ctx.report.passed(), "conformance: done");
    ctx.report
}

/// One role's run.
pub(crate) struct RoleCtx<'a> {
    pub(crate) platform: &'a dyn Platform,
    pub(crate) setup: &'a ConformanceSetup,
    pub(crate) me: DomId,
    pub(crate) caps: Caps,
    pub(crate) report: ConformanceReport,
}

impl RoleCtx<'_> {
    /// The area of `domid` under the setup's base.
    pub(crate) fn area(&self, xs: &dyn Xenstore, domid: DomId) -> SyncResult<String> {
        let base = self.setup.base.trim_end_matches('/');
        if base.starts_with('/') {
            return Ok(format!("{base}/{domid}"));
        }
        let home = xs
            .get_domain_path(domid)
            .map_err(|e| SyncError(format!("domain path of {domid}: {e}")))?;
        Ok(format!("{home}/{base}"))
    }
}

/// A run id: unique enough to tell this run's keys from a previous run's.
pub(crate) fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    format!("{:x}", nanos ^ (u64::from(std::process::id()) << 40))
}

/// Accept a run id read from the granter's area: it becomes part of paths.
pub(crate) fn parse_run_id(v: &str) -> SyncResult<String> {
    let v = v.trim();
    if v.is_empty() || v.len() > 32 || !v.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(SyncError(format!("run id {v:?} is not a short hex string")));
    }
    Ok(v.to_string())
}

/// Parse a domain id published by a peer.
pub(crate) fn parse_domid(v: &str) -> SyncResult<DomId> {
    v.trim()
        .parse::<DomId>()
        .map_err(|_| SyncError(format!("domain id {v:?}")))
}

/// Expect `result` to be a refusal: any error but Unsupported (a missing operation is
/// not a refusal). Ok passes the error text as the detail.
pub(crate) fn expect_refused<T>(what: &str, result: crate::Result<T>) -> Result<String, String> {
    match result {
        Ok(_) => Err(format!("{what} was allowed")),
        Err(crate::Error::Unsupported(m)) => Err(format!("{what}: unsupported: {m}")),
        Err(e) => Ok(format!("refused: {e}")),
    }
}

/// Wait up to `timeout` for `port` to be reported pending on `ev` (other ports that
/// turn up meanwhile are ignored). Leaves `port` masked.
pub(crate) fn wait_port(
    ev: &dyn EventChannels,
    port: Port,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = std::time::Instant::now() + timeout;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(format!("port {port} not pending within {timeout:?}"));
        }
        seen.clear();
        ev.wait(&mut seen, Some(left))
            .map_err(|e| format!("wait: {e}"))?;
        if seen.contains(&port) {
            return Ok(());
        }
    }
}

/// Result text published for a step: "ok" or the error.
pub(crate) fn verdict<T>(r: &Result<T, String>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("error: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_parse_and_print() {
        for r in [
            ConformanceRole::Granter,
            ConformanceRole::Mapper,
            ConformanceRole::Outsider,
        ] {
            assert_eq!(r.to_string().parse::<ConformanceRole>().unwrap(), r);
        }
        assert!("dom0".parse::<ConformanceRole>().is_err());
    }

    #[test]
    fn caps_follow_the_platform() {
        assert!(Caps::of(PlatformKind::Sim).end_access_reports_busy);
        assert!(!Caps::of(PlatformKind::Linux).end_access_reports_busy);
        assert!(!Caps::of(PlatformKind::Linux).table_size_exact);
    }

    #[test]
    fn peer_values_are_validated() {
        assert_eq!(parse_run_id(" 1a2b\n").unwrap(), "1a2b");
        assert!(parse_run_id("../x").is_err());
        assert!(parse_run_id("").is_err());
        assert!(parse_run_id(&"a".repeat(33)).is_err());
        assert!(parse_run_id(&run_id()).is_ok());
        assert_eq!(parse_domid("7").unwrap(), 7);
        assert!(parse_domid("65536").is_err());
    }

    #[test]
    fn refusals_must_be_real_errors() {
        assert!(expect_refused("map", Ok::<(), _>(())).is_err());
        assert!(expect_refused::<()>("map", Err(crate::Error::Unsupported("x".into()))).is_err());
        let d = expect_refused::<()>("map", Err(crate::Error::Denied("no".into()))).unwrap();
        assert!(d.contains("no"), "{d}");
    }

    #[test]
    fn the_other_domain_defaults_to_the_third_then_an_unrelated_id() {
        let mut s = ConformanceSetup::new(ConformanceRole::Granter, 1, DEFAULT_BASE);
        assert_eq!(s.other_domain(), UNRELATED_DOMID);
        s.third = Some(3);
        assert_eq!(s.other_domain(), 3);
        s.other = Some(9);
        assert_eq!(s.other_domain(), 9);
    }
}

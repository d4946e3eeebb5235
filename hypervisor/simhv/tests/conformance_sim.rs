//! The platform conformance suite on the simulated hypervisor: an in-process simhv, each
//! role in its own thread attached as its own domain, coordinating only through
//! xenstore and the primitives.

use std::collections::BTreeSet;
use std::time::Duration;

use xmx_hv::conformance::{
    self, ConformanceReport, ConformanceRole, ConformanceSetup, Outcome, DEFAULT_BASE, GRANT_SIZES,
};
use xmx_hv::sim::{SimAdmin, SimPlatform};
use xmx_hv::{DomId, DOM0};
use xmx_simhv::{Daemon, SimhvConfig};

const LOCAL_XS: [&str; 10] = [
    "xs.domain-path",
    "xs.write-read",
    "xs.directory",
    "xs.rm",
    "xs.perms",
    "xs.transaction-commit",
    "xs.transaction-abort",
    "xs.transaction-conflict",
    "xs.watch-token",
    "xs.watch-special",
];

fn granter_checks() -> BTreeSet<String> {
    let mut names: BTreeSet<String> = LOCAL_XS.iter().map(|s| s.to_string()).collect();
    for n in GRANT_SIZES {
        for step in ["grant", "mapper-to-granter", "end-access"] {
            names.insert(format!("grant.{n}.{step}"));
        }
    }
    for name in [
        "xs.perm-publish",
        "grant.aux",
        "grant.end-access-busy-while-mapped",
        "grant.end-access-after-unmap",
        "grant.copy-to-foreign-seen",
        "grant.aux-end-access",
        "evtchn.alloc-unbound",
        "evtchn.notify-from-mapper",
        "evtchn.masked-until-unmask",
        "evtchn.notify-to-mapper",
        "evtchn.close",
    ] {
        names.insert(name.to_string());
    }
    names
}

fn mapper_checks() -> BTreeSet<String> {
    let mut names: BTreeSet<String> = LOCAL_XS.iter().map(|s| s.to_string()).collect();
    for n in GRANT_SIZES {
        names.insert(format!("grant.{n}.map"));
        names.insert(format!("grant.{n}.granter-to-mapper"));
    }
    for name in [
        "xs.perm-read-allowed",
        "xs.perm-read-denied",
        "xs.perm-write-denied",
        "grant.readonly-refuses-writable",
        "grant.readonly-maps-readonly",
        "grant.not-granted-refused",
        "grant.out-of-range-refused",
        "grant.busy-map",
        "grant.copy-from-foreign",
        "grant.copy-to-foreign",
        "grant.copy-bad-ref-fails-alone",
        "grant.copy-to-readonly-refused",
        "evtchn.bind-other-refused",
        "evtchn.bind",
        "evtchn.notify-to-granter",
        "evtchn.notify-from-granter",
        "evtchn.close",
    ] {
        names.insert(name.to_string());
    }
    names
}

fn outsider_checks() -> BTreeSet<String> {
    let mut names: BTreeSet<String> = LOCAL_XS.iter().map(|s| s.to_string()).collect();
    for name in [
        "xs.outsider-read-denied",
        "grant.outsider-map-refused",
        "grant.outsider-copy-refused",
        "evtchn.outsider-bind-refused",
    ] {
        names.insert(name.to_string());
    }
    names
}

/// Every expected check ran exactly once, and each passed, except `skipped` which
/// must have been skipped.
fn assert_report(report: &ConformanceReport, expected: &BTreeSet<String>, skipped: &[&str]) {
    let names = report.names();
    let ran: BTreeSet<String> = names.iter().map(|s| s.to_string()).collect();
    assert_eq!(ran.len(), names.len(), "a check ran twice:\n{report}");
    assert_eq!(
        &ran, expected,
        "checks of the {} differ:\n{report}",
        report.role
    );
    for check in &report.checks {
        let want = if skipped.contains(&check.name.as_str()) {
            Outcome::Skip
        } else {
            Outcome::Pass
        };
        assert_eq!(
            check.outcome, want,
            "{}: {}\n{report}",
            check.name, check.detail
        );
    }
}

struct Run {
    granter: DomId,
    mapper: DomId,
    outsider: Option<DomId>,
}

/// Run the roles of `run` concurrently against one simhv and return their reports.
fn run_roles(
    dir: &std::path::Path,
    run: &Run,
) -> (
    ConformanceReport,
    ConformanceReport,
    Option<ConformanceReport>,
) {
    let timeout = Duration::from_secs(120);
    std::thread::scope(|s| {
        let granter = s.spawn(|| {
            let p = SimPlatform::attach(dir, run.granter).unwrap();
            let mut setup =
                ConformanceSetup::new(ConformanceRole::Granter, run.mapper, DEFAULT_BASE);
            setup.third = run.outsider;
            setup.timeout = timeout;
            conformance::run_with(&p, &setup)
        });
        let mapper = s.spawn(|| {
            let p = SimPlatform::attach(dir, run.mapper).unwrap();
            let mut setup =
                ConformanceSetup::new(ConformanceRole::Mapper, run.granter, DEFAULT_BASE);
            setup.timeout = timeout;
            conformance::run_with(&p, &setup)
        });
        let outsider = run.outsider.map(|o| {
            s.spawn(move || {
                let p = SimPlatform::attach(dir, o).unwrap();
                let mut setup =
                    ConformanceSetup::new(ConformanceRole::Outsider, run.granter, DEFAULT_BASE);
                setup.timeout = timeout;
                conformance::run_with(&p, &setup)
            })
        });
        (
            granter.join().unwrap(),
            mapper.join().unwrap(),
            outsider.map(|h| h.join().unwrap()),
        )
    })
}

fn start() -> (tempfile::TempDir, xmx_simhv::DaemonHandle, SimAdmin) {
    let dir = tempfile::Builder::new()
        .prefix("simhv-conf")
        .tempdir()
        .unwrap();
    let daemon = Daemon::start(dir.path(), SimhvConfig::default()).unwrap();
    let admin = SimAdmin::connect(dir.path()).unwrap();
    (dir, daemon, admin)
}

/// The areas of every role are gone after a run.
fn assert_clean(dir: &std::path::Path, domids: &[DomId]) {
    let dom0 = SimPlatform::attach(dir, DOM0).unwrap();
    let xs = xmx_hv::Platform::xenstore(&dom0).unwrap();
    for &d in domids {
        let area = format!("/local/domain/{d}/{DEFAULT_BASE}");
        assert!(
            matches!(
                xs.read(xmx_hv::XBT_NULL, &area),
                Err(xmx_hv::Error::NotFound(_))
            ),
            "{area} left behind"
        );
    }
}

#[test]
fn two_guests_pass_every_check() {
    let (dir, daemon, admin) = start();
    let g = admin.create("granter", None).unwrap();
    let m = admin.create("mapper", None).unwrap();
    let (granter, mapper, _) = run_roles(
        dir.path(),
        &Run {
            granter: g,
            mapper: m,
            outsider: None,
        },
    );
    assert_report(&granter, &granter_checks(), &[]);
    assert_report(&mapper, &mapper_checks(), &[]);
    assert_clean(dir.path(), &[g, m]);
    daemon.shutdown();
}

#[test]
fn a_third_domain_can_use_nothing_meant_for_the_mapper() {
    let (dir, daemon, admin) = start();
    let g = admin.create("granter", None).unwrap();
    let m = admin.create("mapper", None).unwrap();
    let o = admin.create("outsider", None).unwrap();
    let (granter, mapper, outsider) = run_roles(
        dir.path(),
        &Run {
            granter: g,
            mapper: m,
            outsider: Some(o),
        },
    );
    assert_report(&granter, &granter_checks(), &[]);
    assert_report(&mapper, &mapper_checks(), &[]);
    assert_report(&outsider.unwrap(), &outsider_checks(), &[]);
    assert_clean(dir.path(), &[g, m, o]);
    daemon.shutdown();
}

#[test]
fn a_guest_and_dom0_as_mapper_pass_with_dom0s_privilege_noted() {
    let (dir, daemon, admin) = start();
    let g = admin.create("guest", None).unwrap();
    let (granter, mapper, _) = run_roles(
        dir.path(),
        &Run {
            granter: g,
            mapper: DOM0,
            outsider: None,
        },
    );
    assert_report(&granter, &granter_checks(), &[]);
    // dom0 reads and writes every node in xenstore, so these denials cannot be shown.
    assert_report(
        &mapper,
        &mapper_checks(),
        &["xs.perm-read-denied", "xs.perm-write-denied"],
    );
    assert_clean(dir.path(), &[g, DOM0]);
    daemon.shutdown();
}

/// A platform with two planted faults, to show the suite notices them: a refused
/// writable map silently falls back to a read-only mapping, and a conflicting
/// transaction commit is reported as success.
mod faulty {
    use std::os::fd::RawFd;
    use std::sync::Arc;
    use std::time::Duration;

    use xmx_hv::{
        CopySegment, DomId, EventChannels, GrantRef, GrantTable, GrantedPages, MappedPages,
        Platform, PlatformKind, Port, Result, TxId, WatchEvent, Xenstore, XsPerm,
    };

    pub struct Faulty(pub xmx_hv::sim::SimPlatform);

    impl Platform for Faulty {
        fn kind(&self) -> PlatformKind {
            self.0.kind()
        }
        fn domid(&self) -> DomId {
            self.0.domid()
        }
        fn grant_table(&self) -> Result<Arc<dyn GrantTable>> {
            Ok(Arc::new(LaxGrants(self.0.grant_table()?)))
        }
        fn event_channels(&self) -> Result<Box<dyn EventChannels>> {
            self.0.event_channels()
        }
        fn xenstore(&self) -> Result<Box<dyn Xenstore>> {
            Ok(Box::new(LaxCommits(self.0.xenstore()?)))
        }
    }

    struct LaxGrants(Arc<dyn GrantTable>);

    impl GrantTable for LaxGrants {
        fn grant_pages(&self, remote: DomId, count: usize, writable: bool) -> Result<GrantedPages> {
            self.0.grant_pages(remote, count, writable)
        }
        fn map(&self, remote: DomId, refs: &[GrantRef], writable: bool) -> Result<MappedPages> {
            self.0.map(remote, refs, writable).or_else(|e| {
                if writable {
                    self.0.map(remote, refs, false)
                } else {
                    Err(e)
                }
            })
        }
        fn copy(&self, segments: &[CopySegment]) -> Result<Vec<Result<()>>> {
            self.0.copy(segments)
        }
        fn table_size(&self) -> usize {
            self.0.table_size()
        }
    }

    struct LaxCommits(Box<dyn Xenstore>);

    impl Xenstore for LaxCommits {
        fn read(&self, tx: TxId, path: &str) -> Result<Vec<u8>> {
            self.0.read(tx, path)
        }
        fn write(&self, tx: TxId, path: &str, value: &[u8]) -> Result<()> {
            self.0.write(tx, path, value)
        }
        fn mkdir(&self, tx: TxId, path: &str) -> Result<()> {
            self.0.mkdir(tx, path)
        }
        fn rm(&self, tx: TxId, path: &str) -> Result<()> {
            self.0.rm(tx, path)
        }
        fn directory(&self, tx: TxId, path: &str) -> Result<Vec<String>> {
            self.0.directory(tx, path)
        }
        fn get_perms(&self, tx: TxId, path: &str) -> Result<Vec<XsPerm>> {
            self.0.get_perms(tx, path)
        }
        fn set_perms(&self, tx: TxId, path: &str, perms: &[XsPerm]) -> Result<()> {
            self.0.set_perms(tx, path, perms)
        }
        fn transaction_start(&self) -> Result<TxId> {
            self.0.transaction_start()
        }
        fn transaction_end(&self, tx: TxId, commit: bool) -> Result<()> {
            match self.0.transaction_end(tx, commit) {
                Err(xmx_hv::Error::Again) => Ok(()),
                other => other,
            }
        }
        fn watch(&self, path: &str, token: &str) -> Result<()> {
            self.0.watch(path, token)
        }
        fn unwatch(&self, path: &str, token: &str) -> Result<()> {
            self.0.unwatch(path, token)
        }
        fn watch_fd(&self) -> RawFd {
            self.0.watch_fd()
        }
        fn next_watch_event(&self, timeout: Option<Duration>) -> Result<Option<WatchEvent>> {
            self.0.next_watch_event(timeout)
        }
        fn get_domain_path(&self, domid: DomId) -> Result<String> {
            self.0.get_domain_path(domid)
        }
        fn introduce(&self, domid: DomId, mfn: u64, port: Port) -> Result<()> {
            self.0.introduce(domid, mfn, port)
        }
        fn release(&self, domid: DomId) -> Result<()> {
            self.0.release(domid)
        }
        fn is_domain_introduced(&self, domid: DomId) -> Result<bool> {
            self.0.is_domain_introduced(domid)
        }
        fn reset_watches(&self) -> Result<()> {
            self.0.reset_watches()
        }
    }
}

#[test]
fn a_faulty_mapper_platform_fails_exactly_the_checks_of_its_faults() {
    let (dir, daemon, admin) = start();
    let g = admin.create("granter", None).unwrap();
    let m = admin.create("mapper", None).unwrap();
    let timeout = Duration::from_secs(120);
    let path = dir.path();
    let (granter, mapper) = std::thread::scope(|s| {
        let granter = s.spawn(|| {
            let p = SimPlatform::attach(path, g).unwrap();
            let mut setup = ConformanceSetup::new(ConformanceRole::Granter, m, DEFAULT_BASE);
            setup.timeout = timeout;
            conformance::run_with(&p, &setup)
        });
        let mapper = s.spawn(|| {
            let p = faulty::Faulty(SimPlatform::attach(path, m).unwrap());
            let mut setup = ConformanceSetup::new(ConformanceRole::Mapper, g, DEFAULT_BASE);
            setup.timeout = timeout;
            conformance::run_with(&p, &setup)
        });
        (granter.join().unwrap(), mapper.join().unwrap())
    });
    assert_report(&granter, &granter_checks(), &[]);
    let failed: BTreeSet<&str> = mapper.failures().map(|c| c.name.as_str()).collect();
    assert_eq!(
        failed,
        BTreeSet::from(["grant.readonly-refuses-writable", "xs.transaction-conflict"]),
        "{mapper}"
    );
    assert!(!mapper.passed());
    daemon.shutdown();
}

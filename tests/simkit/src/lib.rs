//! xmx-simkit: what the integration tests of the hypervisor, backend, frontend, guest and
//! dom0 crates share: a simulated host ([`SimHost`], an in-process simhv in a temporary
//! directory), bounded waits ([`eventually`], [`wait_removed`]), the guest MACs the
//! tests give ([`guest_mac`]). Each crate's test helpers wrap a [`SimHost`] with what only
//! they need (a backend thread, a fake guest, a daemon process).
//!
//! Test code: a failed set-up or an expired wait panics with what it waited for.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use xmx_hv::sim::admin::DomainState;
use xmx_hv::sim::{SimAdmin, SimPlatform};
use xmx_hv::{DomId, Platform, Xenstore, DOM0, XBT_NULL};
use xmx_simhv::{Daemon, DaemonHandle, SimhvConfig};
use xmx_wire::mxoe::Mac;
use xmx_wire::xenbus::{self, keys, XenbusState};

/// How long any wait of a test may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// A simulated host living in a temporary directory; its hypervisor stops on drop.
pub struct SimHost {
    daemon: Option<DaemonHandle>,
    /// The hypervisor's admin connection (create, destroy, suspend, state...).
    pub admin: SimAdmin,
    hv_dir: PathBuf,
    dir: tempfile::TempDir,
}

impl SimHost {
    /// A host whose hypervisor directory is the temporary directory itself.
    pub fn start() -> SimHost {
        SimHost::start_with(SimhvConfig::default())
    }

    /// [`SimHost::start`] with a hypervisor configuration.
    pub fn start_with(config: SimhvConfig) -> SimHost {
        SimHost::start_in(None, config)
    }

    /// A host whose hypervisor lives in `subdir` of the temporary directory, leaving its
    /// root to the daemons' sockets.
    pub fn start_with_hv_subdir(subdir: &str) -> SimHost {
        SimHost::start_in(Some(subdir), SimhvConfig::default())
    }

    fn start_in(subdir: Option<&str>, config: SimhvConfig) -> SimHost {
        let dir = tempfile::Builder::new().prefix("xmxsim").tempdir().unwrap();
        let hv_dir = match subdir {
            Some(s) => dir.path().join(s),
            None => dir.path().to_path_buf(),
        };
        let daemon = Daemon::start(&hv_dir, config).unwrap();
        let admin = SimAdmin::connect(&hv_dir).unwrap();
        SimHost {
            daemon: Some(daemon),
            admin,
            hv_dir,
            dir,
        }
    }

    /// The hypervisor's directory (what `XMX_SIM_DIR` names).
    pub fn path(&self) -> &Path {
        &self.hv_dir
    }

    /// The temporary directory the host lives in.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Creates a domain.
    pub fn create(&self, name: &str) -> DomId {
        self.admin.create(name, None).unwrap()
    }

    /// Attaches this process to the host as `domid`.
    pub fn attach(&self, domid: DomId) -> SimPlatform {
        SimPlatform::attach(self.path(), domid).unwrap()
    }

    /// What the hypervisor counts of `domid`.
    pub fn state(&self, domid: DomId) -> DomainState {
        self.admin.state(domid).unwrap()
    }

    /// A xenstore connection of dom0.
    pub fn xs0(&self) -> Box<dyn Xenstore> {
        self.attach(DOM0).xenstore().unwrap()
    }

    /// Foreign pages dom0 (the backend) has mapped.
    pub fn dom0_mappings(&self) -> usize {
        self.state(DOM0).mappings_held
    }

    /// Grants of `domid` that another domain maps.
    pub fn mapped_by_others(&self, domid: DomId) -> usize {
        self.state(domid).grants_mapped_by_others
    }

    /// Waits (bounded) until `domid`'s counters satisfy `cond`, for a change the hypervisor
    /// makes after a connection closes, which no event announces.
    pub fn settle(&self, domid: DomId, cond: impl Fn(&DomainState) -> bool) -> DomainState {
        let mut last = self.state(domid);
        eventually(&format!("domain {domid} to settle"), || {
            last = self.state(domid);
            cond(&last)
        });
        last
    }

    /// Stops the hypervisor now (also done on drop).
    pub fn shutdown(&mut self) {
        if let Some(d) = self.daemon.take() {
            d.shutdown();
        }
    }
}

impl Drop for SimHost {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The board MAC the tests give guest `last`.
pub fn guest_mac(last: u8) -> Mac {
    Mac([0x02, 0x00, 0x00, 0x00, 0x00, last])
}

/// Polls `cond` until it holds, for state that changes without an event to wait on; fails
/// the test after [`WAIT`].
pub fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::yield_now();
    }
}

/// Waits, on a xenstore watch, until `path` does not exist; fails the test after [`WAIT`].
pub fn wait_removed(xs: &dyn Xenstore, path: &str) {
    let token = format!("removed:{path}");
    xs.watch(path, &token).unwrap();
    let deadline = Instant::now() + WAIT;
    while xs.read(XBT_NULL, path).is_ok() {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "{path} was never removed");
        let _ = xs.next_watch_event(Some(left)).unwrap();
    }
    xs.unwatch(path, &token).unwrap();
}

/// The state the frontend of device 0 of `domid` last wrote, if any.
pub fn front_state(xs: &dyn Xenstore, domid: DomId) -> Option<XenbusState> {
    let path = xenbus::key_path(&xenbus::frontend_dir(domid, 0), keys::STATE);
    xs.read(XBT_NULL, &path)
        .ok()
        .and_then(|v| String::from_utf8(v).ok())
        .and_then(|s| s.parse().ok())
}

/// Waits (a watch, bounded by [`WAIT`]) for the frontend of device 0 of `domid` to write
/// `want`.
pub fn wait_front_state(xs: &dyn Xenstore, domid: DomId, want: XenbusState) {
    let path = xenbus::key_path(&xenbus::frontend_dir(domid, 0), keys::STATE);
    xs.watch(&path, "wait-front").unwrap();
    let deadline = Instant::now() + WAIT;
    while front_state(xs, domid) != Some(want) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "frontend never reached {want:?} (at {:?})",
            front_state(xs, domid)
        );
        let _ = xs.next_watch_event(Some(left)).unwrap();
    }
    xs.unwatch(&path, "wait-front").unwrap();
}

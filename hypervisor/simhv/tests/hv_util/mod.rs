//! Helpers shared by the simhv integration tests: a host in a temporary directory.
#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use xmx_hv::sim::admin::DomainState;
use xmx_hv::sim::{SimAdmin, SimPlatform};
use xmx_hv::DomId;
use xmx_simhv::{Config, Daemon, DaemonHandle};

/// A simulated host living in a temporary directory.
pub struct Host {
    pub daemon: Option<DaemonHandle>,
    pub admin: SimAdmin,
    pub dir: tempfile::TempDir,
}

impl Host {
    pub fn start() -> Host {
        Self::start_with(Config::default())
    }

    pub fn start_with(config: Config) -> Host {
        let dir = tempfile::Builder::new().prefix("simhv").tempdir().unwrap();
        let daemon = Daemon::start(dir.path(), config).unwrap();
        let admin = SimAdmin::connect(dir.path()).unwrap();
        Host {
            daemon: Some(daemon),
            admin,
            dir,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn create(&self, name: &str) -> DomId {
        self.admin.create(name, None).unwrap()
    }

    pub fn attach(&self, domid: DomId) -> SimPlatform {
        SimPlatform::attach(self.path(), domid).unwrap()
    }

    pub fn state(&self, domid: DomId) -> DomainState {
        self.admin.state(domid).unwrap()
    }

    /// Wait (bounded) until the daemon has processed a connection close that this
    /// process cannot observe directly; `cond` reads the daemon's counters.
    pub fn settle(&self, domid: DomId, cond: impl Fn(&DomainState) -> bool) -> DomainState {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = self.state(domid);
            if cond(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "daemon never settled: {s:?}");
            std::thread::yield_now();
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(d) = self.daemon.take() {
            d.shutdown();
        }
    }
}

/// Bytes of `slice` as a slice (for mapped memory).
///
/// # Safety
/// `ptr` must be valid for reads of `len` bytes for the returned lifetime.
pub unsafe fn bytes<'a>(ptr: *const u8, len: usize) -> &'a [u8] {
    // SAFETY: forwarded to the caller.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

/// A deterministic byte pattern for page `i`.
pub fn pattern(seed: u8, i: usize) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(seed)
}

/// Whether this process was started by [`spawn_role`] to play `role`.
pub fn is_role(role: &str) -> bool {
    std::env::var("XMX_TEST_ROLE").as_deref() == Ok(role)
}

/// Re-run this test binary as a separate process that runs only the test named `role`,
/// attached (through `xmx_hv::platform::from_env`) as `domid` of `host`.
pub fn spawn_role(
    role: &str,
    host: &Host,
    domid: DomId,
    extra: &[(&str, String)],
) -> std::process::Child {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([role, "--exact", "--nocapture", "--test-threads=1"])
        .env("XMX_PLATFORM", "sim")
        .env("XMX_SIM_DIR", host.path())
        .env("XMX_DOMID", domid.to_string())
        .env("XMX_TEST_ROLE", role)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// An environment variable the parent passed to a role process.
pub fn role_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}

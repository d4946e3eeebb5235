//! Shared pieces of the xmxd tests: a simulated host (in-process simhv, backend and xmxd)
//! in a temporary directory, and a minimal guest frontend that connects its device.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use xmx_backend::service::{Backend, BackendConfig, BackendThread};
use xmx_hv::sim::SimPlatform;
use xmx_hv::{
    DomId, EventChannels, GrantTable, GrantedPages, Platform, Port, Xenstore, DOM0, PAGE_SIZE,
    XBT_NULL,
};
use xmx_tools::xmxd::control::XmxdRequest;
use xmx_tools::xmxd::discovery::DiscoveryConfig;
use xmx_tools::xmxd::{PacketFabric, Xmxd, XmxdConfig};
use xmx_wire::msg::{CtrlFront, PROTOCOL_VERSION};
use xmx_wire::ring::SharedMem;
use xmx_wire::xenbus::{self, keys, XenbusState};

#[allow(unused_imports)] // each test binary uses its part
pub use xmx_simkit::{eventually, SimHost, WAIT};

/// One simulated host: its hypervisor, its backend (no NIC) and, once started, its xmxd.
pub struct XmxdHost {
    pub name: String,
    pub xmxd: Option<Xmxd>,
    pub backend: Option<BackendThread>,
    sim: SimHost,
}

impl std::ops::Deref for XmxdHost {
    type Target = SimHost;
    fn deref(&self) -> &SimHost {
        &self.sim
    }
}

impl XmxdHost {
    /// A host with its simhv and backend running.
    pub fn start(name: &str) -> XmxdHost {
        let sim = SimHost::start_with_hv_subdir("hv");
        let cfg = BackendConfig {
            host_name: name.into(),
            control_socket: Some(sim.root().join("backd.sock")),
            ..BackendConfig::default()
        };
        let backend = Backend::new(&sim.attach(DOM0), None, cfg)
            .unwrap()
            .spawn()
            .unwrap();
        XmxdHost {
            name: name.into(),
            xmxd: None,
            backend: Some(backend),
            sim,
        }
    }

    pub fn hv_dir(&self) -> PathBuf {
        self.sim.path().to_path_buf()
    }

    pub fn backend_socket(&self) -> PathBuf {
        self.sim.root().join("backd.sock")
    }

    pub fn xmxd_socket(&self) -> PathBuf {
        self.sim.root().join("xmxd.sock")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.sim.root().join("state")
    }

    /// xmxd's configuration for this host, announcing every `interval`.
    pub fn xmxd_config(&self, interval: Duration) -> XmxdConfig {
        let mut cfg = XmxdConfig::new(&self.name, &self.state_dir());
        cfg.control_socket = Some(self.xmxd_socket());
        cfg.backend_socket = Some(self.backend_socket());
        cfg.discovery = DiscoveryConfig::every(interval);
        cfg.settle = interval * 2;
        cfg
    }

    /// Start xmxd in-process.
    pub fn start_xmxd(&mut self, fabric: Option<PacketFabric>, interval: Duration) {
        let dom0 = SimPlatform::attach(self.hv_dir(), DOM0).unwrap();
        let cfg = self.xmxd_config(interval);
        self.xmxd = Some(Xmxd::start(&dom0, fabric, cfg).unwrap());
    }

    pub fn xmxd(&self) -> &Xmxd {
        self.xmxd.as_ref().expect("xmxd started")
    }

    /// A control request that must succeed.
    pub fn call(&self, request: XmxdRequest) -> serde_json::Value {
        self.xmxd()
            .call(request.clone())
            .into_result()
            .unwrap_or_else(|e| panic!("{request:?}: {e}"))
    }

    /// Wait until `cond` holds of this host's xmxd.
    pub fn wait(&self, what: &str, cond: impl FnMut(&xmx_tools::xmxd::Core) -> bool) {
        assert!(
            self.xmxd().wait_until(WAIT, cond),
            "{}: never happened: {what}",
            self.name
        );
    }

    /// A xenstore connection as dom0.
    pub fn dom0_xs(&self) -> Box<dyn Xenstore> {
        self.xs0()
    }

    pub fn destroy(&self, domid: DomId) {
        self.admin.destroy(domid).unwrap()
    }
}

impl Drop for XmxdHost {
    fn drop(&mut self) {
        self.xmxd = None;
        // The daemons go before the hypervisor they run on (the field drops after this).
        if let Some(b) = self.backend.take() {
            let _ = b.stop();
        }
    }
}

/// The `xmx` binary (package xmx-lab, the one entry point over the administration
/// subcommands and the lab), next to this package's xmxd.
pub fn xmx_bin() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_BIN_EXE_xmxd")).with_file_name("xmx");
    assert!(
        path.exists(),
        "{} is missing: run the workspace tests (`make test`) or `cargo build -p xmx-lab` first",
        path.display()
    );
    path
}

/// A xenstore value as text, if the node exists.
pub fn read(xs: &dyn Xenstore, path: &str) -> Option<String> {
    xs.read(XBT_NULL, path)
        .ok()
        .map(|v| String::from_utf8(v).unwrap())
}

/// Children of a node (none if it does not exist).
pub fn children(xs: &dyn Xenstore, path: &str) -> Vec<String> {
    xs.directory(XBT_NULL, path).unwrap_or_default()
}

/// Wait, on a xenstore watch, until `cond` holds of `path`'s value.
pub fn wait_node(xs: &dyn Xenstore, path: &str, mut cond: impl FnMut(Option<String>) -> bool) {
    let token = format!("test:{path}");
    xs.watch(path, &token).unwrap();
    let deadline = Instant::now() + WAIT;
    while !cond(read(xs, path)) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "{path} never reached the expected value");
        let _ = xs.next_watch_event(Some(left)).unwrap();
    }
    xs.unwatch(path, &token).unwrap();
    while let Ok(Some(_)) = xs.next_watch_event(Some(Duration::ZERO)) {}
}

/// The guest's side of a device: just enough of a frontend to connect the control ring.
pub struct MinimalFrontend {
    pub domid: DomId,
    pub platform: SimPlatform,
    pub xs: Box<dyn Xenstore>,
    pub gnttab: Arc<dyn GrantTable>,
    pub evtchn: Box<dyn EventChannels>,
    pub ring: Option<(CtrlFront, Arc<GrantedPages>, Port)>,
}

impl MinimalFrontend {
    pub fn new(hv_dir: &Path, domid: DomId) -> MinimalFrontend {
        let platform = SimPlatform::attach(hv_dir, domid).unwrap();
        let xs = platform.xenstore().unwrap();
        let gnttab = platform.grant_table().unwrap();
        let evtchn = platform.event_channels().unwrap();
        MinimalFrontend {
            domid,
            platform,
            xs,
            gnttab,
            evtchn,
            ring: None,
        }
    }

    fn backend_state_path(&self) -> String {
        xenbus::key_path(&xenbus::backend_dir(DOM0, self.domid, 0), keys::STATE)
    }

    fn write_front(&self, key: &str, value: &str) {
        let path = xenbus::key_path(&xenbus::frontend_dir(self.domid, 0), key);
        self.xs.write(XBT_NULL, &path, value.as_bytes()).unwrap();
    }

    fn wait_backend(&self, state: XenbusState) {
        let want = state.to_string();
        wait_node(self.xs.as_ref(), &self.backend_state_path(), |v| {
            v.as_deref() == Some(want.as_str())
        });
    }

    /// Publish a control ring and an event channel and wait until the backend connects.
    pub fn connect(&mut self) {
        self.wait_backend(XenbusState::InitWait);
        let pages = Arc::new(self.gnttab.grant_pages(DOM0, 1, true).unwrap());
        let owner: Arc<dyn Send + Sync> = pages.clone();
        // SAFETY: one writable page granted by this domain, kept mapped by `owner` for as
        // long as the ring memory lives; touched only through SharedMem.
        let mem =
            unsafe { SharedMem::from_raw_with_owner(pages.as_ptr(), PAGE_SIZE, owner) }.unwrap();
        let ring = CtrlFront::new(mem).unwrap();
        let port = self.evtchn.alloc_unbound(DOM0).unwrap();
        self.write_front(keys::RING_REF, &pages.refs()[0].to_string());
        self.write_front(keys::EVENT_CHANNEL, &port.to_string());
        self.write_front(keys::PROTOCOL_VERSION, &PROTOCOL_VERSION.to_string());
        self.write_front(keys::STATE, &XenbusState::Initialised.to_string());
        self.ring = Some((ring, pages, port));
        self.wait_backend(XenbusState::Connected);
        self.write_front(keys::STATE, &XenbusState::Connected.to_string());
    }
}

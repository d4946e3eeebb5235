//! A simulated host with the real backend, guests with their xmx device, and `xmx-frontd`
//! running as a separate process inside a guest.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use xmx_backend::admin::{BackdRequest, CountersReport, GuestReport, PeerSpec};
use xmx_backend::service::{Backend, BackendConfig, BackendThread};
use xmx_backend::xenbus::toolstack::{self, DeviceSpec};
use xmx_hv::{DomId, DOM0};
pub use xmx_simhv::SimhvConfig;
use xmx_wire::xenbus::XenbusState;

#[allow(unused_imports)] // each test binary uses its part
pub use xmx_simkit::{eventually, front_state, guest_mac, wait_front_state, SimHost, WAIT};

/// A simulated host with the backend running in dom0.
pub struct GuestsTestHost {
    pub backend: Option<BackendThread>,
    sim: SimHost,
}

impl std::ops::Deref for GuestsTestHost {
    type Target = SimHost;
    fn deref(&self) -> &SimHost {
        &self.sim
    }
}

impl GuestsTestHost {
    /// A simulated host with the backend running in dom0.
    pub fn start() -> GuestsTestHost {
        GuestsTestHost::start_with(SimhvConfig::default())
    }

    /// [`GuestsTestHost::start`] with a hypervisor configuration.
    pub fn start_with(config: SimhvConfig) -> GuestsTestHost {
        let sim = SimHost::start_with(config);
        let cfg = BackendConfig {
            host_name: "testhost".into(),
            ..BackendConfig::default()
        };
        let backend = Backend::new(&sim.attach(DOM0), None, cfg)
            .unwrap()
            .spawn()
            .unwrap();
        GuestsTestHost {
            backend: Some(backend),
            sim,
        }
    }

    /// Create a guest with its xmx device 0 and put it in the peer table as peer 0.
    pub fn guest(&self, name: &str, mac_last: u8) -> DomId {
        let domid = self.admin.create(name, None).unwrap();
        self.device(domid, name, mac_last);
        domid
    }

    /// Create the xmx device 0 of guest `domid` and put it in the peer table as peer 0.
    pub fn device(&self, domid: DomId, name: &str, mac_last: u8) {
        let spec = DeviceSpec {
            domu: domid,
            devid: 0,
            mac: guest_mac(mac_last),
            cluster: 1,
            hostname: format!("{name}:0"),
        };
        toolstack::attach(self.xs0().as_ref(), DOM0, &spec).unwrap();
        let peers = vec![PeerSpec {
            index: 0,
            mac: guest_mac(mac_last).to_string(),
            hostname: format!("{name}:0"),
            cluster: 1,
        }];
        self.backend()
            .control()
            .call(BackdRequest::SetPeers { peers })
            .into_result()
            .unwrap();
    }

    pub fn backend(&self) -> &BackendThread {
        self.backend.as_ref().unwrap()
    }

    /// The backend's view of `domid`'s device.
    pub fn guest_report(&self, domid: DomId) -> GuestReport {
        let v = self
            .backend()
            .control()
            .call(BackdRequest::Guests)
            .into_result()
            .unwrap();
        let all: Vec<GuestReport> = serde_json::from_value(v).unwrap();
        all.into_iter().find(|g| g.domid == domid).unwrap()
    }

    /// Control requests the backend served for `domid`.
    pub fn ctrl_requests(&self, domid: DomId) -> u64 {
        let v = self
            .backend()
            .control()
            .call(BackdRequest::Counters)
            .into_result()
            .unwrap();
        let r: CountersReport = serde_json::from_value(v).unwrap();
        r.guests
            .iter()
            .find(|g| g.domid == domid)
            .map(|g| g.ctrl_requests)
            .unwrap()
    }

    /// Start `xmx-frontd` in guest `domid`; returns once the device is connected.
    pub fn frontd(&self, domid: DomId, extra: &[&str]) -> FrontdProcess {
        let socket = self.path().join(format!("frontd{domid}.sock"));
        let child = Command::new(env!("CARGO_BIN_EXE_xmx-frontd"))
            .arg("--socket")
            .arg(&socket)
            .args(extra)
            .env("XMX_PLATFORM", "sim")
            .env("XMX_SIM_DIR", self.path())
            .env("XMX_DOMID", domid.to_string())
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "error".into()),
            )
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let f = FrontdProcess {
            child: Some(child),
            socket,
            domid,
        };
        wait_front_state(self.xs0().as_ref(), domid, XenbusState::Connected);
        f
    }
}

impl Drop for GuestsTestHost {
    fn drop(&mut self) {
        // The backend goes before the hypervisor it runs on (the field drops after this).
        if let Some(b) = self.backend.take() {
            let _ = b.stop();
        }
    }
}

/// A running `xmx-frontd`; killed on drop if still running.
pub struct FrontdProcess {
    pub child: Option<Child>,
    pub socket: PathBuf,
    pub domid: DomId,
}

impl FrontdProcess {
    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().unwrap().id() as i32)
    }

    /// Send SIGTERM and wait for the exit status (bounded).
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        kill(self.pid(), Signal::SIGTERM).unwrap();
        wait_child(self.child.take().unwrap())
    }
}

impl Drop for FrontdProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Wait for a child to exit; kill it if it takes longer than [`WAIT`].
pub fn wait_child(mut child: Child) -> std::process::ExitStatus {
    let pid = Pid::from_raw(child.id() as i32);
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    match rx.recv_timeout(WAIT) {
        Ok(status) => {
            waiter.join().unwrap();
            status.unwrap()
        }
        Err(_) => {
            let _ = kill(pid, Signal::SIGKILL);
            let _ = waiter.join();
            panic!("child {pid} did not exit in time");
        }
    }
}

/// Run this test binary's `test` as a child process with `env` set; its stdout is
/// readable line by line.
pub fn spawn_child_test(
    test: &str,
    env: &[(&str, String)],
) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

/// Read lines until one ends with `want` (the test harness may print before it on the
/// same line).
pub fn read_until_line(out: &mut BufReader<std::process::ChildStdout>, want: &str) {
    let mut line = String::new();
    loop {
        line.clear();
        let n = out.read_line(&mut line).unwrap();
        assert!(n > 0, "the child ended before saying {want:?}");
        if line.trim_end().ends_with(want) {
            return;
        }
    }
}

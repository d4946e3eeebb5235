//! The `xmx-backd` binary: command line, control socket, clean exit on SIGTERM.

mod backd_util;

use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

use backd_util::{BackdTestHost, FakeGuest, WAIT};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use xmx_backend::admin::{AdminClient, BackdRequest, CountersReport, GuestReport, PeerSpec};
use xmx_hv::DOM0;
use xmx_wire::xenbus::XenbusState;

const BIN: &str = env!("CARGO_BIN_EXE_xmx-backd");

#[test]
fn help_lists_the_options() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for opt in ["--iface", "--domid", "--spin-us", "--hostname", "--control"] {
        assert!(text.contains(opt), "--help does not mention {opt}:\n{text}");
    }
    let out = Command::new(BIN).output().unwrap();
    assert!(!out.status.success(), "--iface is required");
}

/// A progress step whose bytes do not fit the engine's 32 bits is refused with a clear
/// error before anything starts (it overflowed the KiB-to-bytes conversion).
#[test]
fn a_pull_progress_step_beyond_two_gib_is_refused() {
    let out = Command::new(BIN)
        .args(["--iface", "lo", "--pull-progress-kib", "4194304"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--pull-progress-kib") && err.contains("0..=2097152"),
        "{err}"
    );
}

/// Wait for the child to exit, at most [`WAIT`]; kill it and fail otherwise.
fn wait_exit(mut child: Child) -> std::process::ExitStatus {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    match rx.recv_timeout(WAIT) {
        Ok(status) => {
            waiter.join().unwrap();
            status.unwrap()
        }
        Err(_) => {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            panic!("xmx-backd did not exit");
        }
    }
}

#[test]
fn the_daemon_serves_its_socket_and_stops_cleanly_on_sigterm() {
    let host = BackdTestHost::start();
    // A device exists before the daemon starts: the daemon finds it.
    let mut g = host.guest("g1", 1, 3);
    let socket = host.path().join("backd-test.sock");
    let child = Command::new(BIN)
        .args([
            "--iface",
            "none",
            "--spin-us",
            "0",
            "--hostname",
            "testhost",
        ])
        .arg("--control")
        .arg(&socket)
        .env("XMX_PLATFORM", "sim")
        .env("XMX_SIM_DIR", host.path())
        .env_remove("XMX_DOMID")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The socket exists before the daemon touches xenstore, so once it says InitWait the
    // socket answers.
    g.wait_backend_state(XenbusState::InitWait);
    let mut client = AdminClient::connect(&socket).unwrap();

    // attach through the socket, then the new guest is found too.
    let d2 = host.create("g2");
    let r = client.call(&BackdRequest::Attach {
        domid: d2,
        devid: 0,
        mac: "02:00:00:00:00:02".into(),
        cluster: 3,
        hostname: None,
    });
    assert_eq!(r.unwrap(), serde_json::Value::Null);
    let mut g2 = FakeGuest::new(&host, d2, 0);
    g2.wait_backend_state(XenbusState::InitWait);
    let dup = client.call(&BackdRequest::Attach {
        domid: d2,
        devid: 0,
        mac: "02:00:00:00:00:02".into(),
        cluster: 3,
        hostname: None,
    });
    assert_eq!(dup.unwrap_err().kind, "exists");

    g.connect();
    let guests: Vec<GuestReport> =
        serde_json::from_value(client.call(&BackdRequest::Guests).unwrap()).unwrap();
    assert_eq!(guests.len(), 2);
    let g1 = guests.iter().find(|r| r.domid == g.domid).unwrap();
    assert!(g1.connected);
    assert_eq!(g1.cluster, 3);
    let g2r = guests.iter().find(|r| r.domid == d2).unwrap();
    assert_eq!(g2r.hostname, format!("testhost-{d2}:0"));
    assert_eq!(g2r.state_name, "InitWait");

    let peers = vec![PeerSpec {
        index: 0,
        mac: "02:00:00:00:00:01".into(),
        hostname: "g1:0".into(),
        cluster: 3,
    }];
    assert_eq!(
        client.call(&BackdRequest::SetPeers { peers }).unwrap(),
        serde_json::json!({"peers": 1})
    );
    let bad = vec![PeerSpec {
        index: 0,
        mac: "ff:ff:ff:ff:ff:ff".into(),
        hostname: "x".into(),
        cluster: 3,
    }];
    assert_eq!(
        client
            .call(&BackdRequest::SetPeers { peers: bad })
            .unwrap_err()
            .kind,
        "invalid"
    );
    let counters: CountersReport =
        serde_json::from_value(client.call(&BackdRequest::Counters).unwrap()).unwrap();
    assert_eq!(counters.guests.len(), 2);
    assert!(counters.backend.rounds > 0);

    assert_eq!(
        client
            .call(&BackdRequest::Detach {
                domid: d2,
                devid: 0
            })
            .unwrap(),
        serde_json::Value::Null
    );
    assert_eq!(
        client
            .call(&BackdRequest::Detach {
                domid: d2,
                devid: 0
            })
            .unwrap_err()
            .kind,
        "not_found"
    );
    assert_eq!(host.dom0_mappings(), 1);

    // SIGTERM: the guest is told Closing, everything is unmapped, exit status 0.
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = wait_exit(child);
    assert!(status.success(), "{status:?}");
    assert_eq!(g.backend_state(), Some(XenbusState::Closing));
    assert_eq!(host.dom0_mappings(), 0);
    assert_eq!(host.mapped_by_others(g.domid), 0);
    assert_eq!(host.state(DOM0).ports_open, 0);
    assert!(!socket.exists(), "the socket is removed on exit");
}

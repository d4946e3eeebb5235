//! The `xmx` administration subcommands against a running host (in-process simulated
//! hypervisor, backend and xmxd, reached through their control sockets).

mod xmxd_util;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use xmx_backend::admin::CountersReport;
use xmx_tools::xmxd::control::{ClusterReport, GuestStatus, PeersReport, QosReport};
use xmx_tools::xmxd::names;
use xmxd_util::{xmx_bin, XmxdHost};

fn xmx(args: &[&str]) -> Output {
    Command::new(xmx_bin())
        .args(args)
        .env_remove("XMX_SIM_DIR")
        .env_remove("XMX_SIM_HOST")
        .output()
        .expect("running xmx")
}

fn ok(args: &[&str]) -> String {
    let out = xmx(args);
    assert!(
        out.status.success(),
        "xmx {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn fails(args: &[&str]) -> String {
    let out = xmx(args);
    assert!(!out.status.success(), "xmx {} succeeded", args.join(" "));
    String::from_utf8(out.stderr).unwrap()
}

fn json<T: serde::de::DeserializeOwned>(args: &[&str]) -> T {
    let text = ok(args);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("xmx {}: {e}\n{text}", args.join(" ")))
}

struct Sockets {
    xmxd: String,
    backd: String,
}

impl Sockets {
    fn of(host: &XmxdHost) -> Sockets {
        let s = |p: PathBuf| p.display().to_string();
        Sockets {
            xmxd: s(host.xmxd_socket()),
            backd: s(host.backend_socket()),
        }
    }

    /// `args` followed by `--xmxd-socket PATH`.
    fn to_xmxd<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        let mut v = args.to_vec();
        v.extend(["--xmxd-socket", &self.xmxd]);
        v
    }
}

#[test]
fn every_admin_subcommand_has_help() {
    for args in [
        vec!["peers", "--help"],
        vec!["attach", "--help"],
        vec!["detach", "--help"],
        vec!["cluster", "--help"],
        vec!["cluster", "create", "--help"],
        vec!["cluster", "delete", "--help"],
        vec!["cluster", "add", "--help"],
        vec!["cluster", "remove", "--help"],
        vec!["cluster", "list", "--help"],
        vec!["counters", "--help"],
        vec!["qos", "--help"],
    ] {
        let out = ok(&args);
        assert!(out.contains("Usage"), "{args:?}: {out}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_xmxd"))
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    for opt in [
        "--iface",
        "--state-dir",
        "--control",
        "--backend-socket",
        "--announce-ms",
    ] {
        assert!(text.contains(opt), "xmxd --help lacks {opt}:\n{text}");
    }
}

#[test]
fn the_subcommands_drive_a_running_host() {
    let mut host = XmxdHost::start("h0");
    host.start_xmxd(None, Duration::from_millis(100));
    let s = Sockets::of(&host);
    let vm1 = host.create("vm1");
    let vm2 = host.create("vm2");

    // attach, with a cluster that does not exist yet (it is created), and without.
    let d1 = vm1.to_string();
    let g: GuestStatus = json(&s.to_xmxd(&["attach", &d1, "--cluster", "blue", "--json"]));
    assert!(g.attached);
    assert_eq!((g.name.as_str(), g.cluster.as_str()), ("vm1", "blue"));
    assert_eq!(g.mac, names::guest_mac("vm1"));
    assert_eq!(g.domid, Some(vm1));
    let d2 = vm2.to_string();
    let text = ok(&s.to_xmxd(&["attach", &d2]));
    assert!(
        text.contains("attached") && text.contains(&names::guest_mac("vm2").to_string()),
        "{text}"
    );

    // peers: JSON equals what xmxd holds; the text lists every MAC; a guest's view is its
    // cluster only.
    let report: PeersReport =
        json(&s.to_xmxd(&["peers", "--json", "--wait", "2", "--timeout", "10"]));
    assert_eq!(report, host.xmxd().peers());
    assert_eq!(report.peers.len(), 2);
    let text = ok(&s.to_xmxd(&["peers"]));
    assert!(text.contains("INDEX") && text.contains("2 peers"), "{text}");
    for p in &report.peers {
        assert!(
            text.contains(&p.mac.to_string()) && text.contains(&p.hostname),
            "{text}"
        );
    }
    let view: PeersReport = json(&s.to_xmxd(&["peers", "--json", "--guest", "vm1"]));
    assert_eq!(view.cluster.as_deref(), Some("blue"));
    assert_eq!(
        view.peers
            .iter()
            .map(|p| p.guest.as_str())
            .collect::<Vec<_>>(),
        ["vm1"]
    );
    let view: PeersReport = json(&s.to_xmxd(&["peers", "--json", "--guest", &d2]));
    assert_eq!(
        view.peers
            .iter()
            .map(|p| p.guest.as_str())
            .collect::<Vec<_>>(),
        ["vm2"]
    );
    // --changed-after with the current generation waits and reports the table unchanged.
    let gen = report.generation.to_string();
    let same: PeersReport =
        json(&s.to_xmxd(&["peers", "--json", "--changed-after", &gen, "--timeout", "0"]));
    assert_eq!(same.generation, report.generation);
    let err = fails(&s.to_xmxd(&["peers", "--wait", "5", "--timeout", "0"]));
    assert!(err.contains("not 5"), "{err}");
    // A timeout past what the clock represents is no deadline, not a crash.
    let huge: PeersReport = json(&s.to_xmxd(&[
        "peers",
        "--json",
        "--wait",
        "2",
        "--timeout",
        "18446744073709551615",
    ]));
    assert_eq!(huge.peers.len(), 2);

    // cluster create / add / list / delete / remove.
    ok(&s.to_xmxd(&["cluster", "create", "red"]));
    let err = fails(&s.to_xmxd(&["cluster", "create", "red"]));
    assert!(err.contains("exists"), "{err}");
    let err = fails(&s.to_xmxd(&["cluster", "create", "no/slash"]));
    assert!(err.contains("invalid"), "{err}");
    // A guest nobody knows is refused (a typo must not look like a move) and the state
    // is left as it was; --new records it for its first start.
    let err = fails(&s.to_xmxd(&["cluster", "add", "red", "vm9"]));
    assert!(err.contains("not found") && err.contains("--new"), "{err}");
    let list: Vec<ClusterReport> = json(&s.to_xmxd(&["cluster", "list", "--json"]));
    assert!(list.iter().all(|c| !c.members.iter().any(|m| m == "vm9")));
    let text = ok(&s.to_xmxd(&["cluster", "add", "--new", "red", "vm9"]));
    assert!(
        text.contains("recorded") && text.contains("starts"),
        "{text}"
    );
    ok(&s.to_xmxd(&["cluster", "remove", "red", "vm9"]));
    let text = ok(&s.to_xmxd(&["cluster", "add", "red", "vm2"]));
    assert!(text.contains("vm2 is in cluster red"), "{text}");
    let list: Vec<ClusterReport> = json(&s.to_xmxd(&["cluster", "list", "--json"]));
    let red = list.iter().find(|c| c.name == "red").unwrap();
    assert_eq!(
        (red.id, red.members.clone()),
        (names::cluster_id("red"), vec!["vm2".to_string()])
    );
    let blue = list.iter().find(|c| c.name == "blue").unwrap();
    assert_eq!(blue.members, ["vm1"]);
    let text = ok(&s.to_xmxd(&["cluster", "list"]));
    assert!(text.contains("red") && text.contains("vm2"), "{text}");
    host.wait("vm2 moved in the table", |c| {
        c.table()
            .peers
            .iter()
            .any(|p| p.guest == "vm2" && p.cluster == "red")
    });
    let err = fails(&s.to_xmxd(&["cluster", "delete", "red"]));
    assert!(err.contains("busy") && err.contains("vm2"), "{err}");
    let text = ok(&s.to_xmxd(&["cluster", "delete", "red", "--force"]));
    assert!(text.contains("vm2 moved"), "{text}");
    ok(&s.to_xmxd(&["cluster", "remove", "blue", "vm1"]));
    let err = fails(&s.to_xmxd(&["cluster", "remove", "blue", "vm1"]));
    assert!(err.contains("not found"), "{err}");
    host.wait("everyone in default", |c| {
        c.table().peers.iter().all(|p| p.cluster == "default")
    });

    // counters come from the backend.
    let counters: CountersReport = json(&["counters", "--json", "--backd-socket", &s.backd]);
    let mut domids: Vec<u16> = counters.guests.iter().map(|g| g.domid).collect();
    domids.sort();
    assert_eq!(domids, [vm1, vm2]);
    let text = ok(&["counters", "--backd-socket", &s.backd]);
    assert!(
        text.contains("TX_FRAMES") && text.contains("QUOTA_REFUSALS"),
        "{text}"
    );

    // detach.
    ok(&s.to_xmxd(&["detach", &d2]));
    assert!(host.xmxd().inspect(|c| !c.is_attached(vm2)));
    let err = fails(&s.to_xmxd(&["detach", "4000"]));
    assert!(err.contains("not found"), "{err}");

    // No daemon: a clear error.
    let err = fails(&["peers", "--xmxd-socket", "/nonexistent/xmxd.sock"]);
    assert!(err.contains("is it running"), "{err}");
    let err = fails(&["counters", "--backd-socket", "/nonexistent/backd.sock"]);
    assert!(err.contains("is it running"), "{err}");
}

#[test]
fn qos_weights_follow_the_guests_name_and_reach_the_backend() {
    use xmx_hv::{Error, XBT_NULL};
    use xmx_wire::xenbus::{self, keys};
    use xmxd_util::{eventually, read, MinimalFrontend};

    let mut host = XmxdHost::start("h0");
    host.start_xmxd(None, Duration::from_millis(100));
    let s = Sockets::of(&host);
    let vm1 = host.create("vm1");
    let d1 = vm1.to_string();
    ok(&s.to_xmxd(&["attach", &d1]));
    let mut front = MinimalFrontend::new(&host.hv_dir(), vm1);
    front.connect();
    let weight_of = |domid: u16| -> Option<u32> {
        let c: CountersReport = json(&["counters", "--json", "--backd-socket", &s.backd]);
        let g = c.guests.into_iter().find(|g| g.domid == domid)?;
        g.nic.map(|n| n.weight)
    };

    let q: QosReport = json(&s.to_xmxd(&["qos", "vm1", "--json"]));
    assert_eq!(
        (q.guest.as_str(), q.weight, q.domains.clone()),
        ("vm1", 1, vec![vm1])
    );
    assert_eq!(weight_of(vm1), Some(1));

    // By domid or by name; kept by name in dom0's tree, copied to the running device.
    let q: QosReport = json(&s.to_xmxd(&["qos", &d1, "4", "--json"]));
    assert_eq!((q.guest.as_str(), q.weight), ("vm1", 4));
    let xs0 = host.dom0_xs();
    let record = "/local/domain/0/xmx/qos/vm1";
    assert_eq!(read(xs0.as_ref(), record).as_deref(), Some("4"));
    let device = xenbus::key_path(&xenbus::backend_dir(0, vm1, 0), keys::QOS_WEIGHT);
    assert_eq!(read(xs0.as_ref(), &device).as_deref(), Some("4"));
    eventually("the backend applies weight 4", || weight_of(vm1) == Some(4));
    let text = ok(&["counters", "--backd-socket", &s.backd]);
    assert!(text.contains("WEIGHT"), "{text}");

    // The guest can change neither its record nor its device's copy.
    for path in [record, device.as_str()] {
        assert!(
            matches!(
                front.xs.write(XBT_NULL, path, b"1000"),
                Err(Error::Denied(_))
            ),
            "{path}"
        );
    }
    assert!(matches!(
        front.xs.read(XBT_NULL, record),
        Err(Error::Denied(_))
    ));

    // Bad weights and unknown guests are refused, the weight unchanged.
    for bad in ["0", "1001"] {
        let err = fails(&s.to_xmxd(&["qos", "vm1", bad]));
        assert!(err.contains("invalid") || err.contains("1000"), "{err}");
    }
    let err = fails(&s.to_xmxd(&["qos", "4000", "2"]));
    assert!(err.contains("not found"), "{err}");
    assert_eq!(read(xs0.as_ref(), record).as_deref(), Some("4"));

    // A new domain of the same name gets the weight when its device is attached.
    drop(front);
    host.destroy(vm1);
    let again = host.create("vm1");
    ok(&s.to_xmxd(&["attach", &again.to_string()]));
    let device = xenbus::key_path(&xenbus::backend_dir(0, again, 0), keys::QOS_WEIGHT);
    eventually("the weight follows the name", || {
        read(xs0.as_ref(), &device).as_deref() == Some("4")
    });
    let text = ok(&s.to_xmxd(&["qos", "vm1"]));
    assert!(
        text.contains("weight 4") && text.contains(&again.to_string()),
        "{text}"
    );
}

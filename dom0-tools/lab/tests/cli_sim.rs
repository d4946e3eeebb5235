//! `xmx sim up` starts xmx-backd and xmxd on every host; the administration subcommands
//! reach them with `--sim-host`, and the hosts' xmxd agree on one peer table (real
//! processes in network namespaces; needs root).

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;
use xmx_backend::admin::CountersReport;
use xmx_tools::xmxd::control::PeersReport;
use xmx_tools::xmxd::names;

fn xmx() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_xmx"))
}

fn run(args: &[&str]) -> Output {
    Command::new(xmx())
        .args(args)
        .env_remove("XMX_SIM_DIR")
        .output()
        .expect("running xmx")
}

fn ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "xmx {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn siblings_built() {
    for bin in ["xmx-simhv", "xmx-backd", "xmxd"] {
        let path = xmx().parent().unwrap().join(bin);
        assert!(
            path.exists(),
            "{} is missing: run the workspace tests (`cargo test --workspace`) or build it first",
            path.display()
        );
    }
}

/// Removes the cluster when the test ends, passed or not.
struct Cluster(String);

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = run(&["sim", "down", "--name", &self.0]);
    }
}

/// The table as every host should see it: without the per-host "local" flag.
fn shared(r: &PeersReport) -> Vec<(u16, String, String, String, String)> {
    r.peers
        .iter()
        .map(|p| {
            (
                p.index,
                p.mac.to_string(),
                p.guest.clone(),
                p.cluster.clone(),
                p.host.clone(),
            )
        })
        .collect()
}

/// `xmx peers --json` on `host`, waiting for `n` peers and for `cond`, through long-polls
/// on table changes.
fn peers_until(
    name: &str,
    host: &str,
    n: usize,
    cond: impl Fn(&PeersReport) -> bool,
) -> PeersReport {
    let n = n.to_string();
    let mut args = vec![
        "peers",
        "--json",
        "--sim-name",
        name,
        "--sim-host",
        host,
        "--wait",
        &n,
    ];
    let mut report: PeersReport = serde_json::from_str(&ok(&args)).unwrap();
    let mut gen;
    for _ in 0..100 {
        if cond(&report) {
            return report;
        }
        gen = report.generation.to_string();
        args = vec![
            "peers",
            "--json",
            "--sim-name",
            name,
            "--sim-host",
            host,
            "--changed-after",
            &gen,
            "--timeout",
            "10",
        ];
        report = serde_json::from_str(&ok(&args)).unwrap();
    }
    panic!("{host} never reached the expected table: {report:?}");
}

#[test]
fn a_simulated_cluster_runs_the_dom0_daemons_and_agrees_on_its_peers() {
    siblings_built();
    let name = format!("x{}", std::process::id() % 100000);
    let _ = run(&["sim", "down", "--name", &name]);
    let state: Value = serde_json::from_str(&ok(&[
        "sim", "up", "--name", &name, "--hosts", "2", "--guests", "2", "--json",
    ]))
    .unwrap();
    let _cleanup = Cluster(name.clone());
    for h in state["hosts"].as_array().unwrap() {
        let daemons: Vec<&str> = h["daemons"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            daemons[..3],
            ["xmx-simhv", "xmx-backd", "xmxd"],
            "{daemons:?}"
        );
    }

    // Both hosts' xmxd hold the same four guests at the same indices.
    let h0 = peers_until(&name, "h0", 4, |_| true);
    let h1 = peers_until(&name, "h1", 4, |r| shared(r) == shared(&h0));
    assert_eq!(shared(&h0), shared(&h1));
    for p in &h0.peers {
        assert_eq!(p.mac, names::guest_mac(&p.guest));
        assert_eq!(p.local, p.host == "h0");
    }

    // A cluster made on h0 splits the table on h1 too.
    ok(&[
        "cluster",
        "create",
        "blue",
        "--sim-name",
        &name,
        "--sim-host",
        "h0",
    ]);
    ok(&[
        "cluster",
        "add",
        "blue",
        "1",
        "--sim-name",
        &name,
        "--sim-host",
        "h0",
    ]);
    let blue = |r: &PeersReport| {
        r.peers
            .iter()
            .any(|p| p.guest == "h0-g0" && p.cluster == "blue")
    };
    let h1 = peers_until(&name, "h1", 4, blue);
    let indices = |r: &PeersReport| {
        r.peers
            .iter()
            .map(|p| (p.index, p.guest.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(indices(&h1), indices(&h0), "indices stay put");
    let seen: PeersReport = serde_json::from_str(&ok(&[
        "peers",
        "--json",
        "--guest",
        "h1-g0",
        "--sim-name",
        &name,
        "--sim-host",
        "h1",
    ]))
    .unwrap();
    assert!(
        seen.peers.iter().all(|p| p.cluster == "default") && seen.peers.len() == 3,
        "{seen:?}"
    );

    // The backend of each host has its guests' devices.
    let counters: CountersReport = serde_json::from_str(&ok(&[
        "counters",
        "--json",
        "--sim-name",
        &name,
        "--sim-host",
        "h1",
    ]))
    .unwrap();
    let mut domids: Vec<u16> = counters.guests.iter().map(|g| g.domid).collect();
    domids.sort();
    assert_eq!(domids, [1, 2]);

    // A guest moves to the other host: refused when it makes no sense, then done, and
    // the state lists it there by its domain name.
    let refused = |args: &[&str], why: &str| {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(why),
            "{args:?}: {err}"
        );
    };
    let migrate = ["sim", "migrate", "--name", &name];
    refused(
        &[&migrate[..], &["h0", "g1", "--to", "h0"]].concat(),
        "already runs on",
    );
    refused(
        &[&migrate[..], &["h0", "g7", "--to", "h1"]].concat(),
        "no guest",
    );
    refused(
        &[&migrate[..], &["h0", "g1", "--to", "h9"]].concat(),
        "no host",
    );
    refused(
        &[
            "sim",
            "migrate",
            "--name",
            "nosuchsim",
            "h0",
            "g1",
            "--to",
            "h1",
        ],
        "no simulated cluster",
    );
    let report: Value =
        serde_json::from_str(&ok(
            &[&migrate[..], &["h0", "g1", "--to", "h1", "--json"]].concat()
        ))
        .unwrap();
    assert_eq!(
        (
            report["guest"].as_str(),
            report["from"].as_str(),
            report["to"].as_str()
        ),
        (Some("h0-g1"), Some("h0"), Some("h1")),
        "{report}"
    );
    let moved = report["dest_domid"].as_u64().unwrap();
    let status: Value =
        serde_json::from_str(&ok(&["sim", "status", "--name", &name, "--json"])).unwrap();
    let guests = |host: usize| -> Vec<(String, u64)> {
        status["hosts"][host]["guests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                (
                    g["name"].as_str().unwrap().to_owned(),
                    g["domid"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    assert_eq!(guests(0), [("g0".to_owned(), 1)]);
    assert!(guests(1).contains(&("h0-g1".to_owned(), moved)), "{status}");

    ok(&["sim", "down", "--name", &name]);
}

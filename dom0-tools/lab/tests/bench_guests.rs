//! `xmx bench --quick --json` with every setup (as root): the guest setups run on a
//! simulated cluster the bench makes, every guest cell and every scaling point has positive
//! figures, the CPU accounting covers the guests' daemons, and the cluster is gone after.
//! No figure is compared with a threshold: shape and positivity only.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;

fn xmx() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_xmx"))
}

fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

/// The daemons and the library a cluster needs, next to `xmx`.
fn assert_built() {
    let dir = xmx().parent().unwrap().to_path_buf();
    for (bin, package) in [
        ("xmx-simhv", "xmx-simhv"),
        ("xmx-backd", "xmx-backend"),
        ("xmxd", "xmx-tools"),
        ("xmx-frontd", "xmx-guests"),
    ] {
        assert!(
            dir.join(bin).is_file(),
            "{} is missing: `cargo build -p {package}` first",
            dir.join(bin).display()
        );
    }
    assert!(
        dir.join("libmyriexpress.so").is_file() || dir.join("deps/libmyriexpress.so").is_file(),
        "libmyriexpress.so is missing from {}: `cargo build -p xmx-libmx` first",
        dir.display()
    );
}

/// True when the machine can run a cluster (root, and everything built); says why not.
fn can_run_a_cluster() -> bool {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (namespaces, a simulated cluster)");
        return false;
    }
    assert_built();
    true
}

/// `xmx bench ARGS --out OUT` with both output streams piped.
fn bench_child(args: &[&str], out: &std::path::Path) -> std::process::Child {
    Command::new(xmx())
        .arg("bench")
        .args(args)
        .arg("--out")
        .arg(out)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Whether the namespaces of run `pid`'s cluster are all gone.
fn cluster_gone(pid: u32) -> bool {
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    !String::from_utf8_lossy(&ns.stdout).contains(&format!("xmx-b{pid}-"))
        && !PathBuf::from(format!("/run/xmx/b{pid}")).exists()
}

#[test]
fn quick_run_measures_every_guest_setup() {
    if !can_run_a_cluster() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let child = bench_child(&["--quick", "--json"], dir.path());
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "xmx bench failed: {stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("stdout is the JSON report");
    assert_eq!(report["schema"], "xmx-bench/1");
    assert_eq!(report["quick"], true);
    let sizes: Vec<u64> = report["sizes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [0, 64, 4096, 65536, 1 << 20]);

    let guests = &report["guests"];
    assert_eq!(guests["kind"], format!("sim:b{pid}"));
    assert_eq!(guests["made_for_run"], true);
    assert!(guests["guests_per_host"].as_u64().unwrap() >= 4, "{guests}");

    let setups = report["setups"].as_array().unwrap();
    let names: Vec<&str> = setups.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "shm",
            "afpacket",
            "afpacket-mx",
            "tcp",
            "native",
            "guest-remote",
            "guest-local",
            "guest-direct",
            "guest-nocache",
            "guest-remote-poll"
        ]
    );
    for s in setups
        .iter()
        .filter(|s| s["name"].as_str().unwrap().starts_with("guest-"))
    {
        let name = s["name"].as_str().unwrap();
        assert_eq!(s["status"], "ok", "{name}: {}", s["reason"]);
        let cells = s["cells"].as_array().unwrap();
        let measured: Vec<u64> = cells.iter().map(|c| c["size"].as_u64().unwrap()).collect();
        if name == "guest-nocache" {
            // LARGE messages only: above 32 KiB.
            assert_eq!(measured, [65536, 1 << 20], "{name}");
        } else {
            assert_eq!(measured, sizes, "{name}");
        }
        for c in cells {
            let size = c["size"].as_u64().unwrap();
            assert!(c["error"].is_null(), "{name} {size}: {}", c["error"]);
            let pp = &c["pingpong"];
            for k in ["median_us", "p99_us", "min_us", "mean_us"] {
                assert!(num(pp, k) > 0.0, "{name} {size} {k}");
            }
            let st = &c["stream"];
            assert!(
                num(st, "seconds") > 0.0 && num(st, "msgs_per_s") > 0.0,
                "{name} {size}"
            );
            assert_eq!(num(st, "bytes"), num(st, "messages") * size as f64);
            let cost = &st["cost"];
            assert!(
                num(cost, "apps_s") >= 0.0 && num(cost, "backends_s") >= 0.0,
                "{cost}"
            );
            if size > 0 {
                assert!(num(st, "mb_per_s") > 0.0, "{name} {size}");
                assert!(num(cost, "cpu_s_per_gb") > 0.0, "{name} {size}: {cost}");
                assert!(
                    num(cost, "bytes") > num(st, "bytes"),
                    "warm-up included: {cost}"
                );
            }
        }
    }
    // The CPU accounting of the baselines has no daemons.
    let tcp = setups.iter().find(|s| s["name"] == "tcp").unwrap();
    for c in tcp["cells"].as_array().unwrap() {
        assert_eq!(c["stream"]["cost"]["backends_s"], 0.0);
    }

    let ratios: Vec<&str> = report["ratios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    for wanted in [
        "native/afpacket",
        "native/afpacket-mx",
        "guest-remote/native",
        "guest-remote/tcp",
        "guest-local/shm",
        "guest-nocache/guest-remote",
    ] {
        assert!(ratios.contains(&wanted), "{wanted} missing from {ratios:?}");
    }

    let scaling = &report["scaling"];
    assert_eq!(scaling["status"], "ok", "{scaling}");
    assert_eq!(scaling["message_size"], 256 << 10);
    let points = scaling["points"].as_array().unwrap();
    let counts: Vec<u64> = points
        .iter()
        .map(|p| p["guests_per_host"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, [1, 2, 4]);
    for p in points {
        let n = p["guests_per_host"].as_u64().unwrap();
        assert!(p["error"].is_null(), "{n}: {}", p["error"]);
        assert!(num(p, "aggregate_mb_per_s") > 0.0, "{p}");
        let per: Vec<f64> = p["per_guest_mb_per_s"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(per.len() as u64, n);
        assert!(per.iter().all(|&r| r > 0.0), "{p}");
        let jain = num(p, "jain");
        assert!(jain > 0.0 && jain <= 1.0 + 1e-9, "{p}");
        assert!(num(&p["cost"], "cpu_s_per_gb") > 0.0, "{p}");
    }
    assert!(
        scaling["ratio_40_vs_8"].is_null(),
        "quick runs have no 40 or 8"
    );

    let table = std::fs::read_to_string(dir.path().join("bench.txt")).unwrap();
    assert!(table.contains("CPU seconds per GB moved"), "{table}");
    assert!(table.contains("Aggregate throughput"), "{table}");
    assert!(
        table.contains("ratio 40 vs 8 guests per host: -"),
        "{table}"
    );
    for stem in ["latency", "bandwidth", "scaling"] {
        assert!(
            dir.path().join(format!("{stem}.png")).is_file(),
            "{stem}.png"
        );
        assert!(
            dir.path().join(format!("{stem}.svg")).is_file(),
            "{stem}.svg"
        );
    }

    // The run's cluster is gone: state directory and namespaces.
    assert!(
        cluster_gone(pid),
        "the cluster of run {pid} was left behind"
    );
}

#[test]
fn a_reader_that_goes_away_leaves_no_cluster_behind() {
    if !can_run_a_cluster() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Both output streams are pipes whose reader is gone before the run prints anything,
    // as for `xmx bench ... 2>&1 | head -1` once head has exited.
    let mut child = bench_child(
        &["--quick", "--setups", "guest-local", "--sizes", "0"],
        dir.path(),
    );
    let pid = child.id();
    drop(child.stdout.take());
    drop(child.stderr.take());
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "the run went on to its end without its readers: {status}"
    );
    assert!(
        cluster_gone(pid),
        "the cluster of run {pid} was left behind"
    );
    // The report was still written.
    assert!(dir.path().join("bench.json").is_file());
}

//! `xmx bench` end to end: the JSON of a quick run, refusals, n/a setups, plots.
//! The runs over the veth need root (network namespaces); the others do not.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn xmx() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_xmx"))
}

/// Run `xmx bench ARGS --out OUT`; also returns the process id, which names its namespaces.
fn bench_pid(args: &[&str], out: &Path) -> (Output, u32) {
    let child = Command::new(xmx())
        .arg("bench")
        .args(args)
        .arg("--out")
        .arg(out)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running xmx bench");
    let pid = child.id();
    (
        child.wait_with_output().expect("waiting for xmx bench"),
        pid,
    )
}

fn bench(args: &[&str], out: &Path) -> Output {
    bench_pid(args, out).0
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn num(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

fn assert_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        bytes.len() > 1000,
        "{} is {} bytes",
        path.display(),
        bytes.len()
    );
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}", path.display());
}

fn assert_svg(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        text.starts_with("<svg") && text.trim_end().ends_with("</svg>"),
        "{}",
        path.display()
    );
}

#[test]
fn quick_run_reports_every_requested_cell() {
    if !is_root() {
        eprintln!("skipped: needs root for the veth pair");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, pid) = bench_pid(
        &[
            "--quick",
            "--json",
            "--setups",
            "shm,afpacket,tcp",
            "--sizes",
            "0,4096",
        ],
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "xmx bench failed: {stderr}");
    // Progress names setup, size and iteration counts.
    assert!(
        stderr.contains("bench: tcp pingpong 4 KiB: 1000 + 100 warm-up iterations"),
        "{stderr}"
    );

    let report: Value = serde_json::from_slice(&out.stdout).expect("stdout is the JSON report");
    assert_eq!(report["schema"], "xmx-bench/1");
    assert_eq!(report["quick"], true);
    assert_eq!(report["sizes"], serde_json::json!([0, 4096]));
    assert_eq!(report["link"]["kind"], "veth");
    assert_eq!(report["link"]["mtu"], 9000);
    assert!(report["machine"]["nproc"].as_u64().unwrap() >= 1);
    assert!(!report["machine"]["kernel"].as_str().unwrap().is_empty());
    assert!(report["date"].as_str().unwrap().ends_with('Z'));

    let setups = report["setups"].as_array().unwrap();
    let names: Vec<&str> = setups.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["shm", "afpacket", "tcp"]);
    for s in setups {
        let name = &s["name"];
        assert_eq!(s["status"], "ok", "{name}");
        assert!(s["reason"].is_null());
        let cells = s["cells"].as_array().unwrap();
        assert_eq!(cells.len(), 2, "{name}");
        for (cell, size) in cells.iter().zip([0u64, 4096]) {
            assert_eq!(cell["size"], size);
            assert!(cell["error"].is_null(), "{name} {size}: {}", cell["error"]);
            let pp = &cell["pingpong"];
            assert_eq!(pp["iters"], 1000);
            assert_eq!(pp["warmup"], 100);
            for k in ["median_us", "p99_us", "min_us", "mean_us"] {
                assert!(num(pp, k) > 0.0, "{name} {size} {k}");
            }
            assert!(num(pp, "p99_us") >= num(pp, "median_us"));
            assert!(num(pp, "median_us") >= num(pp, "min_us"));
            let st = &cell["stream"];
            assert!(
                num(st, "messages") > 0.0
                    && num(st, "seconds") > 0.0
                    && num(st, "msgs_per_s") > 0.0
            );
            assert!(num(st, "cpu_s") >= 0.0);
            assert_eq!(
                num(st, "bytes"),
                num(st, "messages") * size as f64,
                "{name} {size}"
            );
            if size == 0 {
                assert_eq!(num(st, "mb_per_s"), 0.0);
                assert!(st["cpu_s_per_gb"].is_null());
            } else {
                assert!(num(st, "mb_per_s") > 0.0);
                assert!(num(st, "cpu_s_per_gb") > 0.0, "{name}: {st}");
            }
        }
    }
    let ratios: Vec<&str> = report["ratios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(ratios, ["afpacket/shm", "tcp/afpacket"]);
    for r in report["ratios"].as_array().unwrap() {
        let cells = r["cells"].as_array().unwrap();
        assert!(num(&cells[0], "latency") > 0.0);
        assert!(
            cells[0]["bandwidth"].is_null(),
            "no bandwidth ratio of empty messages"
        );
        assert!(num(&cells[1], "latency") > 0.0 && num(&cells[1], "bandwidth") > 0.0);
    }

    // The same report and the plots are in the output directory.
    let saved: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("bench.json")).unwrap())
            .unwrap();
    assert_eq!(saved, report);
    let table = std::fs::read_to_string(dir.path().join("bench.txt")).unwrap();
    assert!(
        table.contains("afpacket/shm") && table.lines().any(|l| l.starts_with("4 KiB")),
        "{table}"
    );
    for stem in ["latency", "bandwidth"] {
        assert_png(&dir.path().join(format!("{stem}.png")));
        assert_svg(&dir.path().join(format!("{stem}.svg")));
    }
    // The run's namespaces (named after its process id) and shared files are gone.
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let ns = String::from_utf8_lossy(&ns.stdout);
    assert!(!ns.contains(&format!("xmx-bench-{pid}-")), "{ns}");
    let leftovers: Vec<_> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        !leftovers
            .iter()
            .any(|f: &String| f.starts_with(&format!("xmx-bench-{pid}-"))),
        "{leftovers:?}"
    );
}

#[test]
fn unknown_setups_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = bench(&["--quick", "--setups", "shm,infiniband"], dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("unknown setup \"infiniband\""), "{stderr}");
    assert!(
        stderr.contains("known setups: shm, afpacket, afpacket-mx, tcp, native"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
    assert!(
        !dir.path().join("bench.json").exists(),
        "nothing measured, nothing written"
    );
}

#[test]
fn bad_sizes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for sizes in ["32MiB", "1G", "abc"] {
        let out = bench(&["--setups", "shm", "--sizes", sizes], dir.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{sizes}: {stderr}");
        assert!(stderr.contains("invalid message size"), "{sizes}: {stderr}");
    }
}

#[test]
fn guest_setups_without_a_cluster_are_na_with_a_reason() {
    // shm needs no namespace; the guests' cluster named here does not exist.
    let dir = tempfile::tempdir().unwrap();
    let out = bench(
        &[
            "--quick",
            "--json",
            "--setups",
            "guest-local,shm,guest-scaling",
            "--sizes",
            "64",
            "--cluster",
            "nosuchcluster",
        ],
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let setups = report["setups"].as_array().unwrap();
    assert_eq!(setups[0]["name"], "shm");
    assert_eq!(setups[0]["status"], "ok");
    let guest = &setups[1];
    assert_eq!(guest["name"], "guest-local");
    assert_eq!(guest["status"], "n/a");
    assert!(
        guest["reason"]
            .as_str()
            .unwrap()
            .contains("no simulated cluster \"nosuchcluster\""),
        "{guest}"
    );
    assert_eq!(guest["cells"], serde_json::json!([]));
    assert!(report["guests"].is_null());
    assert_eq!(report["scaling"]["status"], "n/a");
    assert_eq!(report["scaling"]["points"], serde_json::json!([]));
    let ratio = &report["ratios"][0];
    assert_eq!(ratio["name"], "guest-local/shm");
    assert!(ratio["cells"][0]["latency"].is_null() && ratio["cells"][0]["bandwidth"].is_null());
    let table = std::fs::read_to_string(dir.path().join("bench.txt")).unwrap();
    assert!(
        table.contains("guest-local: n/a (no simulated cluster"),
        "{table}"
    );
    assert!(
        table.contains("guest-scaling: n/a (no simulated cluster"),
        "{table}"
    );
    let row = table.lines().find(|l| l.starts_with("64 B")).unwrap();
    assert!(row.contains("n/a"), "{row}");
    assert!(stderr.contains("bench: guest-local: n/a ("), "{stderr}");
}

#[test]
fn help_lists_the_options_and_hides_the_agent() {
    let out = Command::new(xmx())
        .args(["bench", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for opt in [
        "--quick",
        "--json",
        "--sizes",
        "--setups",
        "--out",
        "--cluster",
        "--spin-us",
    ] {
        assert!(help.contains(opt), "{opt} missing from:\n{help}");
    }
    let top = Command::new(xmx()).arg("--help").output().unwrap();
    let top = String::from_utf8_lossy(&top.stdout);
    assert!(
        top.contains("bench") && !top.contains("bench-agent"),
        "{top}"
    );
}

//! `xmx demo --json` from start to end (as root): every step ok (the migration step, which
//! needs `--migration`, skipped), every figure measured and positive, the cross-cluster
//! attempt refused with MX's status, and nothing left behind.

mod demo_util;

use std::time::Duration;

use demo_util::{ensure_built, leftovers, unavailable, DemoRun};
use serde_json::Value;

const SIZES: [u64; 4] = [0, 4096, 65536, 1 << 20];

fn number(v: &Value, what: &str) -> f64 {
    v.as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"))
}

#[test]
fn the_tour_runs_to_the_end_and_leaves_nothing() {
    if let Some(why) = unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    ensure_built();
    assert_eq!(
        leftovers(),
        Vec::<String>::new(),
        "a demo cluster exists before the test"
    );
    let mut run = DemoRun::start(&["--json"]);
    let end = run.finish(Duration::from_secs(300));
    assert!(
        end.status.success(),
        "xmx demo failed ({}):\n{}",
        end.status,
        end.stderr
    );
    let doc: Value = serde_json::from_str(&end.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{}", end.stdout));

    assert_eq!(doc["schema"], "xmx-demo/2");
    assert_eq!(doc["ok"], true, "{doc:#}");
    assert_eq!(doc["interrupted"], Value::Null);
    assert_eq!(doc["kept"], false);
    let steps: Vec<(&str, &str)> = doc["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or(""),
                s["status"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        steps,
        [
            ("cluster", "ok"),
            ("peers", "ok"),
            ("traffic", "ok"),
            ("isolation", "ok"),
            ("figures", "ok"),
            ("migration", "skipped"),
            ("teardown", "ok")
        ]
    );
    // Every heading was printed, in order.
    let headings: Vec<&str> = end
        .stderr
        .lines()
        .filter(|l| l.starts_with("== ["))
        .collect();
    assert_eq!(headings.len(), 6, "{}", end.stderr);
    assert!(
        headings[2].starts_with("== [3/7] MX ping-pong"),
        "{headings:?}"
    );

    // Each virtual cluster's view lists its three members and nobody else.
    let peers = doc["peers"].as_array().expect("peers");
    assert_eq!(peers.len(), 2);
    for view in peers {
        let cluster = view["cluster"].as_str().unwrap();
        let rows = view["report"]["peers"].as_array().unwrap();
        assert_eq!(rows.len(), 3, "{view}");
        assert!(rows.iter().all(|p| p["cluster"] == cluster), "{view}");
    }

    // The figures: guests across hosts, co-located, and TCP, at every size, all positive.
    let figures = &doc["figures"];
    assert_eq!(figures["schema"], "xmx-bench/1");
    let sizes: Vec<u64> = figures["sizes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect();
    assert_eq!(sizes, SIZES);
    let setups = figures["setups"].as_array().unwrap();
    let names: Vec<&str> = setups.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["guest-remote", "guest-local", "tcp"]);
    for setup in setups {
        let name = setup["name"].as_str().unwrap();
        let cells = setup["cells"].as_array().unwrap();
        assert_eq!(cells.len(), SIZES.len(), "{name}");
        for (cell, size) in cells.iter().zip(SIZES) {
            assert_eq!(cell["size"], size);
            assert_eq!(cell["error"], Value::Null, "{name} {size}");
            assert!(
                number(&cell["pingpong"]["median_us"], "median") > 0.0,
                "{name} {size}: {cell}"
            );
            assert!(
                number(&cell["stream"]["msgs_per_s"], "msgs/s") > 0.0,
                "{name} {size}: {cell}"
            );
            if size > 0 {
                assert!(
                    number(&cell["stream"]["mb_per_s"], "MB/s") > 0.0,
                    "{name} {size}: {cell}"
                );
            }
        }
    }
    let ratios: Vec<&str> = figures["ratios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(ratios, ["guest-remote/tcp", "guest-local/tcp"]);
    for r in figures["ratios"].as_array().unwrap() {
        for c in r["cells"].as_array().unwrap() {
            assert!(number(&c["latency"], "latency ratio") > 0.0, "{r}");
        }
    }

    // The blue guest was refused by every red guest, with MX's status, and did not hang.
    let iso = &doc["isolation"];
    assert_eq!(iso["from"], "h0/g0");
    assert_eq!(iso["from_cluster"], "blue");
    assert_eq!(iso["refused"], true);
    let attempts = iso["attempts"].as_array().unwrap();
    let targets: Vec<&str> = attempts
        .iter()
        .map(|a| a["guest"].as_str().unwrap())
        .collect();
    assert_eq!(targets, ["h0/g1", "h1/g1", "h1/g2"]);
    for a in attempts {
        assert_eq!(a["cluster"], "red");
        assert_eq!(a["lookup"]["name"], "MX_HOST_NOT_FOUND", "{a}");
        assert_eq!(a["connect"]["name"], "MX_NIC_NOT_FOUND", "{a}");
        assert_eq!(
            a["status"], "MX_NIC_NOT_FOUND (NIC not in the peer table)",
            "{a}"
        );
    }
    assert!(
        end.stderr.contains("mx_connect: MX_NIC_NOT_FOUND"),
        "{}",
        end.stderr
    );

    assert_eq!(doc["migration"], Value::Null);

    assert_eq!(leftovers(), Vec::<String>::new(), "left behind by the demo");
}

#[test]
fn help_names_the_options() {
    let out = std::process::Command::new(demo_util::xmx())
        .args(["demo", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for want in ["--keep", "--json", "xmx sim down --name demo"] {
        assert!(text.contains(want), "{want} missing from:\n{text}");
    }
}

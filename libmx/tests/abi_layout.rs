//! The C view of the MX types and values, compared with libmx's Rust
//! definitions: our header against `abi::constants()`/`abi::layouts()`, and
//! Open-MX's header against the same (ABI identical both ways).

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{build, our_include, run, scratch, OPEN_MX_INCLUDE};

fn c_view(include: &Path) -> BTreeMap<String, i128> {
    let dir = scratch();
    let bin = build("abi_layout", include, dir.path());
    let o = run(&bin, &[], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').expect("`name value` lines");
            (k.to_string(), v.parse().expect("a number"))
        })
        .collect()
}

fn rust_view() -> BTreeMap<String, i128> {
    myriexpress::abi::constants()
        .into_iter()
        .chain(myriexpress::abi::layouts())
        .collect()
}

fn compare(c: &BTreeMap<String, i128>, rust: &BTreeMap<String, i128>, which: &str) {
    let mut diffs = Vec::new();
    for (k, v) in rust {
        match c.get(k) {
            Some(cv) if cv == v => {}
            other => diffs.push(format!("{k}: Rust {v}, {which} {other:?}")),
        }
    }
    for k in c.keys().filter(|k| !rust.contains_key(*k)) {
        diffs.push(format!("{k}: printed by C, unknown to Rust"));
    }
    assert!(diffs.is_empty(), "{which} differs:\n{}", diffs.join("\n"));
}

#[test]
fn our_header_matches_the_rust_definitions() {
    let rust = rust_view();
    assert!(rust.len() > 100, "every constant and layout is listed");
    compare(&c_view(&our_include()), &rust, "our header");
}

#[test]
fn open_mx_header_matches_the_rust_definitions() {
    if !Path::new(OPEN_MX_INCLUDE).join("myriexpress.h").exists() {
        println!("skipped: Open-MX headers not found at {OPEN_MX_INCLUDE}");
        return;
    }
    compare(
        &c_view(Path::new(OPEN_MX_INCLUDE)),
        &rust_view(),
        "Open-MX's header",
    );
}

#[test]
fn program_built_against_open_mx_header_runs_on_our_library() {
    if !Path::new(OPEN_MX_INCLUDE).join("myriexpress.h").exists() {
        println!("skipped: Open-MX headers not found at {OPEN_MX_INCLUDE}");
        return;
    }
    let dir = scratch();
    for name in ["pingpong", "unexp"] {
        let bin = build(name, Path::new(OPEN_MX_INCLUDE), dir.path());
        common::run_ok(&bin, &[]);
    }
}

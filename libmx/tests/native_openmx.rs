//! Programs compiled against Open-MX's own `myriexpress.h` (the MX ABI as
//! Open-MX mimics it), linked with our library, across two hosts on the
//! native transport: our pingpong, and Myricom's `mx_pingpong` test tool as
//! Open-MX ships it. Skipped with a printed reason when the Open-MX checkout
//! or root is missing.

mod common;
#[path = "common/twohost.rs"]
mod twohost;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{build, lib_dir, scratch, OPEN_MX_INCLUDE};
use twohost::{passed, TwoHosts};

/// Open-MX's copies of the MX test programs.
const OPEN_MX_TESTS: &str = "/work/ref/xen2mx/tests/mx";

fn open_mx_present() -> bool {
    if Path::new(OPEN_MX_INCLUDE).join("myriexpress.h").exists() {
        return true;
    }
    println!("skipped: Open-MX headers not found at {OPEN_MX_INCLUDE}");
    false
}

#[test]
fn pingpong_built_against_open_mx_header_runs_across_hosts() {
    if !open_mx_present() {
        return;
    }
    let Some(hosts) = TwoHosts::direct("omp") else {
        return;
    };
    let dir = scratch();
    let bin = build("pingpong", Path::new(OPEN_MX_INCLUDE), dir.path());
    let (p, a) = hosts.run_pair(&bin, &[]);
    passed("passive side", &p);
    let out = passed("active side", &a);
    assert!(out.lines().any(|l| l.trim_start().starts_with("16777216 ")));
}

/// Builds Open-MX's `mx_pingpong.c` against Open-MX's header.
fn build_mx_pingpong(out_dir: &Path) -> PathBuf {
    let out = out_dir.join("mx_pingpong");
    let o = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-std=gnu99", "-O1", "-w"])
        .args(["-I", OPEN_MX_INCLUDE, "-I", OPEN_MX_TESTS])
        .arg(Path::new(OPEN_MX_TESTS).join("mx_pingpong.c"))
        .arg("-o")
        .arg(&out)
        .arg("-L")
        .arg(lib_dir())
        .arg("-lmyriexpress")
        .output()
        .expect("running cc");
    assert!(
        o.status.success(),
        "compiling mx_pingpong.c:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// Myricom's own ping-pong, polling with `mx_test`, every message verified
/// (`-V`), lengths 0 to 1 MiB.
#[test]
fn myricom_mx_pingpong_verifies_every_length_across_hosts() {
    if !open_mx_present() {
        return;
    }
    if !Path::new(OPEN_MX_TESTS).join("mx_pingpong.c").exists() {
        println!("skipped: {OPEN_MX_TESTS}/mx_pingpong.c not found");
        return;
    }
    let Some(hosts) = TwoHosts::direct("omm") else {
        return;
    };
    let dir = scratch();
    let bin = build_mx_pingpong(dir.path());
    let sender = [
        "-d", "h0", "-r", "1", "-e", "3", "-S", "0", "-E", "1048577", "-M", "4", "-N", "20", "-W",
        "2", "-V",
    ];
    let (p, a) = hosts.run_pair_args(&bin, &["-e", "1"], &sender, &[]);
    let check = |what: &str, o: &std::process::Output| {
        let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "{what} failed ({:?}):\nstdout:\n{stdout}\nstderr:\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        stdout
    };
    check("receiver", &p);
    let out = check("sender", &a);
    print!("{out}");
    assert!(out.contains("Verifying results"), "{out}");
    assert!(
        out.lines().any(|l| l.trim_start().starts_with("1048576 ")),
        "a line for 1 MiB:\n{out}"
    );
}

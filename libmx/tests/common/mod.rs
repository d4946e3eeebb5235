//! Building and running the C programs of tests/c against the built library.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Where Open-MX's own MX headers are, when the reference checkout exists.
pub const OPEN_MX_INCLUDE: &str = "/work/ref/xen2mx/common/mx";

/// The directory holding the built `libmyriexpress.so`: the `deps/` directory next to this
/// test executable first, because rustc writes the cdylib there on every build while the copy
/// in the profile directory is refreshed only by `cargo build`; then the profile directory.
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe
        .parent()
        .map(Path::to_path_buf)
        .expect("target/<profile>/deps/<test>");
    let profile = deps.parent().map(Path::to_path_buf);
    [Some(deps), profile]
        .into_iter()
        .flatten()
        .find(|d| d.join("libmyriexpress.so").exists())
        .expect("libmyriexpress.so is built next to the tests (cdylib of xmx-libmx)")
}

/// The built library.
pub fn library() -> PathBuf {
    lib_dir().join("libmyriexpress.so")
}

/// Our headers.
pub fn our_include() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("include")
}

/// The C test programs.
pub fn c_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("tests")
        .join("c")
}

/// A scratch directory for binaries, kept for the test's duration.
pub fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().expect("temporary directory")
}

/// Compiles `tests/c/<name>.c` against the headers in `include`, linked with
/// the built library; returns the binary.
pub fn build(name: &str, include: &Path, out_dir: &Path) -> PathBuf {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = out_dir.join(name);
    let src = c_dir().join(format!("{name}.c"));
    let o = Command::new(&cc)
        .args(["-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(include)
        .arg("-I")
        .arg(c_dir())
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .arg("-L")
        .arg(lib_dir())
        .args(["-lmyriexpress", "-lpthread"])
        .output()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(
        o.status.success(),
        "compiling {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// Runs a built program on the loopback transport, with a watchdog.
pub fn run(bin: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new("timeout");
    cmd.args(["-k", "5", "300"])
        .arg(bin)
        .args(args)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("XMX_TRANSPORT", "loopback")
        .env_remove("MX_ERRORS_ARE_FATAL")
        .env_remove("RUST_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running the test program")
}

/// Runs a program and requires it to pass.
pub fn run_ok(bin: &Path, args: &[&str]) -> String {
    let o = run(bin, args, &[]);
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success() && stdout.contains("PASS"),
        "{} failed ({:?}):\nstdout:\n{}\nstderr:\n{}",
        bin.display(),
        o.status,
        stdout,
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

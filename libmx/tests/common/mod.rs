//! Building and running the C programs of tests/c against the built library.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Where Open-MX's own MX headers are, when the reference checkout exists.
pub const OPEN_MX_INCLUDE: &str = "/work/ref/xen2mx/common/mx";

pub use xmx_cprog::lib_dir;

/// The built library.
pub fn library() -> PathBuf {
    lib_dir().join("libmyriexpress.so")
}

/// Our headers.
pub fn our_include() -> PathBuf {
    xmx_cprog::include_dir()
}

/// The C test programs.
pub fn c_dir() -> PathBuf {
    xmx_cprog::shared_dir()
}

/// A scratch directory for binaries, kept for the test's duration.
pub fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().expect("temporary directory")
}

/// Compiles `tests/c/<name>.c` against the headers in `include`, linked with
/// the built library; returns the binary.
pub fn build(name: &str, include: &Path, out_dir: &Path) -> PathBuf {
    xmx_cprog::compile(&c_dir().join(format!("{name}.c")), include, out_dir)
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

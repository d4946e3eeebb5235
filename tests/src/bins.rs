//! Where the workspace's programs and `libmyriexpress.so` are, for tests
//! that run them.
//!
//! Test executables live in `target/<profile>/deps/`; the binaries of the
//! other packages in `target/<profile>/`. `cargo test --workspace` builds
//! them all; a test run on its own package does not, so a missing binary is
//! reported with the command that builds it.

use std::path::{Path, PathBuf};

/// `target/<profile>/deps`, the directory of the running test executable.
pub fn deps_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .map(Path::to_path_buf)
        .expect("target/<profile>/deps/<test>")
}

/// `target/<profile>`.
pub fn profile_dir() -> PathBuf {
    deps_dir()
        .parent()
        .map(Path::to_path_buf)
        .expect("target/<profile>")
}

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The built program `name` of package `package`; panics with the command
/// that builds it when it is missing.
pub fn program(name: &str, package: &str) -> PathBuf {
    let path = profile_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build -p {package}` (or run the \
         whole workspace's tests: `cargo test --workspace`)",
        path.display()
    );
    path
}

/// Every program a simulated cluster runs, checked at once.
pub fn cluster_programs() -> PathBuf {
    for (name, package) in [
        ("xmx-simhv", "xmx-simhv"),
        ("xmx-backd", "xmx-backend"),
        ("xmxd", "xmx-tools"),
        ("xmx-frontd", "xmx-guests"),
    ] {
        program(name, package);
    }
    program("xmx", "xmx-lab")
}

/// The directory of the built `libmyriexpress.so`.
pub use xmx_cprog::lib_dir;

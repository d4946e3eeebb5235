//! xmx-cprog: the project's C test programs, compiled against its MX headers and linked
//! with the built `libmyriexpress.so`: one compiler invocation for every crate whose tests
//! run them (the library's own, and the cross-crate ones). It depends on nothing, so the
//! library's tests take it without pulling in a daemon crate.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory holding the built `libmyriexpress.so`: the `deps/` directory next to the
/// running test executable first, because rustc writes the cdylib there on every build
/// while the copy in the profile directory is refreshed only by `cargo build`; then the
/// profile directory.
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
        .expect("libmyriexpress.so is built with the tests (xmx-libmx is a dependency)")
}

/// The C test programs and their helpers (`tests/c`).
pub fn shared_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/cprog has a parent")
        .join("c")
}

/// The project's MX headers (`libmx/include`).
pub fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the workspace holds tests/cprog")
        .join("libmx")
        .join("include")
}

/// Compiles the C program `src` against the headers in `include` (and the helpers of
/// [`shared_dir`]) into `out_dir`, linked with the built library; returns the binary,
/// named after the source. A program that does not build fails the test with the
/// compiler's words.
pub fn compile(src: &Path, include: &Path, out_dir: &Path) -> PathBuf {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let name = src.file_stem().expect("a C source file name");
    let out = out_dir.join(name);
    let o = Command::new(&cc)
        .args(["-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(include)
        .arg("-I")
        .arg(shared_dir())
        .arg(src)
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

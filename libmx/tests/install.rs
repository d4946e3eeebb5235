//! `make install` puts the library under MX's and Open-MX's names with a
//! pkg-config file for each, and a program linked against Open-MX (which
//! records `libopen-mx.so.0`) loads and runs on the installed library.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{c_dir, library, our_include, scratch};

const PREFIX: &str = "/opt/xmx";

fn sh(cmd: &mut Command) -> String {
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Installs into `root` what a build directory holding the library (and
/// stand-ins for the binaries `install` also wants) contains.
fn install(work: &Path) -> PathBuf {
    let build = work.join("build");
    std::fs::create_dir_all(&build).expect("build dir");
    std::fs::copy(library(), build.join("libmyriexpress.so")).expect("library");
    for bin in ["xmx", "xmxd", "xmx-backd", "xmx-simhv"] {
        std::fs::write(build.join(bin), "").expect("stand-in binary");
    }
    let root = work.join("root");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    sh(Command::new("make")
        .arg("-C")
        .arg(&repo)
        .arg("install")
        .arg(format!("DESTDIR={}", root.display()))
        .arg(format!("PREFIX={PREFIX}"))
        .arg(format!("SYSCONFDIR={PREFIX}/etc"))
        .arg(format!("BUILD_DIR={}", build.display())));
    root
}

/// A library with Open-MX's soname and MX's version nodes that defines
/// (as empty stubs) the MX functions `object` calls: linking against it
/// records what linking against Open-MX records.
fn open_mx_stand_in(object: &Path, dir: &Path) -> PathBuf {
    let undefined = sh(Command::new("nm")
        .args(["-u", "--format=just-symbols"])
        .arg(object));
    let stubs: String = undefined
        .lines()
        .filter(|s| s.starts_with("mx_") || s.starts_with("mx__"))
        .map(|s| format!("void {s}(void) {{}}\n"))
        .collect();
    assert!(stubs.contains("mx_isend"), "{undefined}");
    let src = dir.join("stubs.c");
    std::fs::write(&src, stubs).expect("stub source");
    let lib = dir.join("libopen-mx.so");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("libmyriexpress.version");
    sh(Command::new("cc")
        .args(["-shared", "-fPIC", "-Wl,-soname,libopen-mx.so.0"])
        .arg(format!("-Wl,--version-script={}", script.display()))
        .arg(&src)
        .arg("-o")
        .arg(&lib));
    lib
}

#[test]
fn open_mx_names_are_installed_and_load_xmx() {
    let work = scratch();
    let root = install(work.path());
    let libdir = root.join(&PREFIX[1..]).join("lib");
    for name in ["libmyriexpress.so", "libopen-mx.so.0", "libopen-mx.so"] {
        let target = std::fs::canonicalize(libdir.join(name))
            .unwrap_or_else(|e| panic!("{name} installed: {e}"));
        assert_eq!(
            std::fs::read(&target).expect("installed library"),
            std::fs::read(library()).expect("built library"),
            "{name} is the library"
        );
    }

    let pc = libdir.join("pkgconfig");
    for (module, lib) in [
        ("libmyriexpress", "-lmyriexpress"),
        ("open-mx", "-lopen-mx"),
    ] {
        let libs = sh(Command::new("pkg-config")
            .env("PKG_CONFIG_PATH", &pc)
            .env_remove("PKG_CONFIG_LIBDIR")
            .args(["--libs", "--cflags", module]));
        assert!(
            libs.contains(&format!("-L{PREFIX}/lib")) && libs.contains(lib),
            "{module}: {libs}"
        );
    }

    // A program built as against Open-MX: its NEEDED entry is Open-MX's.
    let stand_in = work.path().join("open-mx");
    std::fs::create_dir_all(&stand_in).expect("dir");
    let object = work.path().join("self_send.o");
    sh(Command::new("cc")
        .args(["-std=gnu11", "-c", "-O1"])
        .arg("-I")
        .arg(our_include())
        .arg("-I")
        .arg(c_dir())
        .arg(c_dir().join("self_send.c"))
        .arg("-o")
        .arg(&object));
    open_mx_stand_in(&object, &stand_in);
    let program = work.path().join("self_send");
    sh(Command::new("cc")
        .arg(&object)
        .arg("-L")
        .arg(&stand_in)
        .args(["-lopen-mx", "-lpthread", "-o"])
        .arg(&program));
    let needed = sh(Command::new("readelf").args(["-d", "-W"]).arg(&program));
    assert!(needed.contains("[libopen-mx.so.0]"), "{needed}");
    let out = sh(Command::new("timeout")
        .args(["-k", "5", "120"])
        .arg(&program)
        .env("LD_LIBRARY_PATH", &libdir)
        .env("XMX_TRANSPORT", "loopback"));
    assert!(out.contains("PASS"), "{out}");
}

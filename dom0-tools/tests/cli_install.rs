//! `make install` / `make uninstall` at the workspace root, into a scratch DESTDIR.
//!
//! The build products are stand-in files: the test checks where make puts what, with which
//! modes and links, and that uninstall takes all of it away, not the binaries themselves.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every file and symlink under `dir`: relative path -> (mode, link target or contents).
fn tree(dir: &Path) -> BTreeMap<String, (u32, String)> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, (u32, String)>) {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let path = e.path();
            let meta = fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(base).unwrap().display().to_string();
            if meta.file_type().is_symlink() {
                let target = fs::read_link(&path).unwrap().display().to_string();
                out.insert(rel, (0, format!("-> {target}")));
            } else if meta.is_dir() {
                walk(base, &path, out);
            } else {
                let text = String::from_utf8_lossy(&fs::read(&path).unwrap()).into_owned();
                out.insert(rel, (meta.permissions().mode() & 0o7777, text));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn make(target: &str, destdir: &Path, build: &Path) -> std::process::Output {
    Command::new("make")
        .arg("-C")
        .arg(root())
        .arg("-s")
        .arg(target)
        .arg(format!("DESTDIR={}", destdir.display()))
        .arg("PREFIX=/usr")
        .arg(format!("BUILD_DIR={}", build.display()))
        .output()
        .expect("make (GNU make)")
}

fn stage(dir: &Path, with_frontd: bool) {
    let mut bins = vec!["xmx", "xmxd", "xmx-backd", "xmx-simhv", "libmyriexpress.so"];
    if with_frontd {
        bins.push("xmx-frontd");
    }
    for b in bins {
        fs::write(dir.join(b), format!("stand-in for {b}\n")).unwrap();
    }
}

#[test]
fn install_puts_everything_in_place_and_uninstall_takes_it_all_away() {
    let build = tempfile::tempdir().unwrap();
    let dest = tempfile::tempdir().unwrap();
    stage(build.path(), true);
    let out = make("install", dest.path(), build.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let got = tree(dest.path());
    let headers: Vec<String> = {
        let mut h: Vec<String> = fs::read_dir(root().join("libmx/include"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".h"))
            .collect();
        h.sort();
        h
    };
    assert!(headers.contains(&"myriexpress.h".to_string()));
    let mut want: Vec<String> = vec![
        "etc/default/xmx",
        "etc/xen/scripts/vif-xmx",
        "etc/xen/scripts/xmx-hook",
        "usr/bin/xmx",
        "usr/lib/libmyriexpress.so",
        "usr/lib/libmyriexpress.so.0",
        "usr/lib/libmyriexpress.so.0.1.0",
        // The names binaries linked against Open-MX look for, and its pkg-config name.
        "usr/lib/libopen-mx.so",
        "usr/lib/libopen-mx.so.0",
        "usr/lib/pkgconfig/libmyriexpress.pc",
        "usr/lib/pkgconfig/open-mx.pc",
        "usr/lib/systemd/system/xmx-backd.service",
        "usr/lib/systemd/system/xmxd.service",
        "usr/sbin/xmx-backd",
        "usr/sbin/xmx-frontd",
        "usr/sbin/xmx-simhv",
        "usr/sbin/xmxd",
    ]
    .into_iter()
    .map(String::from)
    .chain(headers.iter().map(|h| format!("usr/include/{h}")))
    .collect();
    want.sort();
    assert_eq!(got.keys().cloned().collect::<Vec<_>>(), want);

    // Binaries and scripts are executable copies; links point at the versioned library.
    assert_eq!(got["usr/sbin/xmxd"], (0o755, "stand-in for xmxd\n".into()));
    assert_eq!(
        got["usr/lib/libmyriexpress.so.0.1.0"],
        (0o755, "stand-in for libmyriexpress.so\n".into())
    );
    assert_eq!(
        got["usr/lib/libmyriexpress.so"].1,
        "-> libmyriexpress.so.0.1.0"
    );
    assert_eq!(
        got["usr/lib/libmyriexpress.so.0"].1,
        "-> libmyriexpress.so.0.1.0"
    );
    for open_mx in ["usr/lib/libopen-mx.so", "usr/lib/libopen-mx.so.0"] {
        assert_eq!(got[open_mx].1, "-> libmyriexpress.so.0.1.0", "{open_mx}");
    }
    let hook = fs::read_to_string(root().join("dom0-tools/hooks/xmx-hook")).unwrap();
    assert_eq!(got["etc/xen/scripts/xmx-hook"], (0o755, hook));
    let header = fs::read_to_string(root().join("libmx/include/myriexpress.h")).unwrap();
    assert_eq!(got["usr/include/myriexpress.h"], (0o644, header));
    let pc = &got["usr/lib/pkgconfig/libmyriexpress.pc"].1;
    for line in [
        "libdir=/usr/lib",
        "includedir=/usr/include",
        "Libs: -L${libdir} -lmyriexpress",
        "Version: 0.1.0",
    ] {
        assert!(pc.lines().any(|l| l == line), "{line} missing from:\n{pc}");
    }
    let unit = &got["usr/lib/systemd/system/xmxd.service"].1;
    assert!(
        unit.contains("ExecStart=/usr/sbin/xmxd --iface ${XMX_IFACE}"),
        "{unit}"
    );
    assert!(
        unit.contains("EnvironmentFile=-/etc/default/xmx") && !unit.contains('@'),
        "{unit}"
    );

    let out = make("uninstall", dest.path(), build.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        tree(dest.path()).is_empty(),
        "left behind: {:?}",
        tree(dest.path()).keys()
    );

    // Without a guest daemon built, it is simply not installed.
    let build = tempfile::tempdir().unwrap();
    stage(build.path(), false);
    let out = make("install", dest.path(), build.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = tree(dest.path());
    assert!(!got.contains_key("usr/sbin/xmx-frontd"));
    assert_eq!(got.len(), want.len() - 1);
    assert!(make("uninstall", dest.path(), build.path())
        .status
        .success());
    assert!(tree(dest.path()).is_empty());

    // Nothing built: install refuses, saying what is missing.
    let empty = tempfile::tempdir().unwrap();
    let out = make("install", dest.path(), empty.path());
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("run make first"));
}

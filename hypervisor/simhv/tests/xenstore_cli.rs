//! Xen's own command-line tools (Debian's xenstore-utils, linked to libxenstore)
//! against the simulated xenstored, pointed at a domain socket with XENSTORED_PATH.
//!
//! Skipped when the tools are not installed, unless XMX_REQUIRE_XENSTORE_UTILS or CI is set
//! (.ci/run installs them and CI runs with CI=true), in which case their absence fails the
//! tests.

mod xenstore_common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use xenstore_common::{next_event, Harness};
use xmx_hv::{Error, Xenstore, XsAccess, XsPerm, XBT_NULL};

const TOOL_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the tools are, or `None` (the test returns early) when they are absent and
/// not required.
fn tools() -> Option<PathBuf> {
    let dir = std::env::var_os("XENSTORE_UTILS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin"));
    let all = [
        "xenstore-read",
        "xenstore-write",
        "xenstore-ls",
        "xenstore-list",
        "xenstore-rm",
        "xenstore-chmod",
        "xenstore-watch",
        "xenstore-exists",
    ];
    if all.iter().all(|t| dir.join(t).exists()) {
        return Some(dir);
    }
    if std::env::var_os("XMX_REQUIRE_XENSTORE_UTILS").is_some() || std::env::var_os("CI").is_some()
    {
        panic!(
            "xenstore-utils not found in {} (required under CI or XMX_REQUIRE_XENSTORE_UTILS)",
            dir.display()
        );
    }
    eprintln!("skipping: xenstore-utils not installed (apt-get install xenstore-utils)");
    None
}

struct ToolOutput {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn command(dir: &Path, tool: &str, sock: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(dir.join(tool));
    c.args(args)
        .env("XENSTORED_PATH", sock)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Wait for a child with a bound; a hung tool is killed and fails the test.
fn finish(mut child: Child, what: &str) -> ToolOutput {
    let out = child.stdout.take();
    let err = child.stderr.take();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut o = String::new();
        let mut e = String::new();
        if let Some(mut out) = out {
            let _ = out.read_to_string(&mut o);
        }
        if let Some(mut err) = err {
            let _ = err.read_to_string(&mut e);
        }
        let _ = tx.send(());
        (o, e)
    });
    if rx.recv_timeout(TOOL_TIMEOUT).is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{what} did not finish within {TOOL_TIMEOUT:?}");
    }
    let status = child.wait().unwrap();
    let (stdout, stderr) = reader.join().unwrap();
    ToolOutput {
        ok: status.success(),
        stdout,
        stderr,
    }
}

fn run(dir: &Path, tool: &str, sock: &Path, args: &[&str]) -> ToolOutput {
    let child = command(dir, tool, sock, args).spawn().unwrap();
    finish(child, &format!("{tool} {args:?}"))
}

fn run_ok(dir: &Path, tool: &str, sock: &Path, args: &[&str]) -> String {
    let o = run(dir, tool, sock, args);
    assert!(o.ok, "{tool} {args:?} failed: {}", o.stderr);
    o.stdout
}

#[test]
fn write_read_exists_and_rm() {
    let Some(bin) = tools() else { return };
    let h = Harness::start();
    let dom0 = h.sock(0);
    let c = h.client(0);
    run_ok(
        &bin,
        "xenstore-write",
        &dom0,
        &["/cli/a", "hello", "/cli/b", "two words"],
    );
    assert_eq!(c.read(XBT_NULL, "/cli/a").unwrap(), b"hello");
    assert_eq!(c.read(XBT_NULL, "/cli/b").unwrap(), b"two words");

    c.write(XBT_NULL, "/cli/c", b"from-client").unwrap();
    assert_eq!(
        run_ok(&bin, "xenstore-read", &dom0, &["/cli/c"]),
        "from-client\n"
    );
    assert_eq!(
        run_ok(&bin, "xenstore-read", &dom0, &["/cli/a", "/cli/b"]),
        "hello\ntwo words\n"
    );
    let missing = run(&bin, "xenstore-read", &dom0, &["/cli/nothing"]);
    assert!(!missing.ok);

    assert!(run(&bin, "xenstore-exists", &dom0, &["/cli/a"]).ok);
    assert!(!run(&bin, "xenstore-exists", &dom0, &["/cli/zz"]).ok);

    run_ok(&bin, "xenstore-rm", &dom0, &["/cli/a"]);
    assert!(matches!(
        c.read(XBT_NULL, "/cli/a"),
        Err(Error::NotFound(_))
    ));
    assert_eq!(c.directory(XBT_NULL, "/cli").unwrap(), vec!["b", "c"]);
    // Removing what is already gone succeeds, as with xenstored.
    run_ok(&bin, "xenstore-rm", &dom0, &["/cli/a"]);
}

#[test]
fn list_and_ls() {
    let Some(bin) = tools() else { return };
    let h = Harness::start();
    let dom0 = h.sock(0);
    let c = h.client(0);
    c.write(XBT_NULL, "/ls/one", b"1").unwrap();
    c.write(XBT_NULL, "/ls/two/deep", b"d").unwrap();
    c.mkdir(XBT_NULL, "/ls/three").unwrap();
    assert_eq!(
        run_ok(&bin, "xenstore-list", &dom0, &["/ls"]),
        "one\ntwo\nthree\n"
    );
    let ls = run_ok(&bin, "xenstore-ls", &dom0, &["/ls"]);
    let lines: Vec<&str> = ls.lines().map(str::trim_end).collect();
    assert_eq!(
        lines,
        vec!["one = \"1\"", "two = \"\"", " deep = \"d\"", "three = \"\""]
    );
    let full = run_ok(&bin, "xenstore-ls", &dom0, &["-f", "/ls"]);
    let lines: Vec<&str> = full.lines().map(str::trim_end).collect();
    assert_eq!(
        lines,
        vec![
            "/ls/one = \"1\"",
            "/ls/two = \"\"",
            "/ls/two/deep = \"d\"",
            "/ls/three = \"\""
        ]
    );
    // The whole tree from the root, as dom0 sees it.
    let root = run_ok(&bin, "xenstore-ls", &dom0, &["-f"]);
    for expected in [
        "/local/domain/0",
        "/local/domain/1",
        "/local/domain/2",
        "/tool",
        "/ls/two/deep = \"d\"",
    ] {
        assert!(root.contains(expected), "{expected} missing from:\n{root}");
    }
}

#[test]
fn ls_with_permissions_and_chmod() {
    let Some(bin) = tools() else { return };
    let h = Harness::start();
    let dom0 = h.sock(0);
    let c = h.client(0);
    c.write(XBT_NULL, "/perm/node", b"v").unwrap();
    run_ok(
        &bin,
        "xenstore-chmod",
        &dom0,
        &["/perm/node", "n0", "r1", "b2"],
    );
    assert_eq!(
        c.get_perms(XBT_NULL, "/perm/node").unwrap(),
        vec![
            XsPerm {
                domid: 0,
                access: XsAccess::None
            },
            XsPerm {
                domid: 1,
                access: XsAccess::Read
            },
            XsPerm {
                domid: 2,
                access: XsAccess::Both
            },
        ]
    );
    let ls = run_ok(&bin, "xenstore-ls", &dom0, &["-p", "/perm"]);
    assert!(ls.contains("(n0,r1,b2)"), "permissions missing from:\n{ls}");

    // The permissions now decide what each guest's tools may do.
    assert_eq!(
        run_ok(&bin, "xenstore-read", &h.sock(1), &["/perm/node"]),
        "v\n"
    );
    assert!(!run(&bin, "xenstore-write", &h.sock(1), &["/perm/node", "x"]).ok);
    run_ok(&bin, "xenstore-write", &h.sock(2), &["/perm/node", "by2"]);
    assert_eq!(c.read(XBT_NULL, "/perm/node").unwrap(), b"by2");

    // Recursive chmod (-r) reaches children.
    c.write(XBT_NULL, "/perm/tree/a/b", b"").unwrap();
    run_ok(
        &bin,
        "xenstore-chmod",
        &dom0,
        &["-r", "/perm/tree", "n0", "r2"],
    );
    for p in ["/perm/tree", "/perm/tree/a", "/perm/tree/a/b"] {
        assert_eq!(
            c.get_perms(XBT_NULL, p).unwrap()[1],
            XsPerm {
                domid: 2,
                access: XsAccess::Read
            },
            "{p}"
        );
    }
}

#[test]
fn guest_tools_are_confined() {
    let Some(bin) = tools() else { return };
    let h = Harness::start();
    let c = h.client(0);
    let g1 = h.sock(1);
    // Relative names land in the guest's home.
    run_ok(&bin, "xenstore-write", &g1, &["data/x", "mine"]);
    assert_eq!(c.read(XBT_NULL, "/local/domain/1/data/x").unwrap(), b"mine");
    assert_eq!(run_ok(&bin, "xenstore-read", &g1, &["data/x"]), "mine\n");
    assert_eq!(
        run_ok(&bin, "xenstore-list", &g1, &["/local/domain/1/data"]),
        "x\n"
    );

    c.write(XBT_NULL, "/local/domain/2/secret", b"s").unwrap();
    assert!(!run(&bin, "xenstore-read", &g1, &["/local/domain/2/secret"]).ok);
    assert!(!run(&bin, "xenstore-list", &g1, &["/local/domain/2"]).ok);
    assert!(!run(&bin, "xenstore-list", &g1, &["/local/domain"]).ok);
    assert!(
        !run(
            &bin,
            "xenstore-write",
            &g1,
            &["/local/domain/2/secret", "x"]
        )
        .ok
    );
    assert!(!run(&bin, "xenstore-rm", &g1, &["/local/domain/2/secret"]).ok);
    assert!(
        !run(
            &bin,
            "xenstore-chmod",
            &g1,
            &["/local/domain/2/secret", "b1"]
        )
        .ok
    );
    assert_eq!(c.read(XBT_NULL, "/local/domain/2/secret").unwrap(), b"s");
}

#[test]
fn watch_prints_events() {
    let Some(bin) = tools() else { return };
    let h = Harness::start();
    let dom0 = h.sock(0);
    let c = h.client(0);
    c.mkdir(XBT_NULL, "/w").unwrap();
    let mut child = command(&bin, "xenstore-watch", &dom0, &["-n", "3", "/w"])
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let line = |rx: &mpsc::Receiver<String>| {
        rx.recv_timeout(TOOL_TIMEOUT)
            .expect("xenstore-watch printed nothing")
    };
    // The initial event proves the watch is registered.
    assert_eq!(line(&rx), "/w");
    c.write(XBT_NULL, "/w/a", b"1").unwrap();
    assert_eq!(line(&rx), "/w/a");
    c.rm(XBT_NULL, "/w/a").unwrap();
    assert_eq!(line(&rx), "/w/a");
    let (tx_done, rx_done) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx_done.send(child.wait());
    });
    let status = rx_done
        .recv_timeout(TOOL_TIMEOUT)
        .expect("xenstore-watch did not exit after 3 events")
        .unwrap();
    assert!(status.success());
    // Its watch went away with its connection.
    h.wait_until("the watch tool's connection to close", |x| {
        x.usage(0).watches == 0
    });
}

#[test]
fn watch_from_a_guest_sees_only_its_nodes() {
    let Some(bin) = tools() else { return };
    let h = Harness::start();
    let c = h.client(0);
    let mut child = command(
        &bin,
        "xenstore-watch",
        &h.sock(1),
        &["-n", "2", "/local/domain"],
    )
    .spawn()
    .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    assert_eq!(rx.recv_timeout(TOOL_TIMEOUT).unwrap(), "/local/domain");
    // Guest 2's change must not reach guest 1; guest 1's own change must.
    c.write(XBT_NULL, "/local/domain/2/private", b"x").unwrap();
    c.write(XBT_NULL, "/local/domain/1/visible", b"y").unwrap();
    assert_eq!(
        rx.recv_timeout(TOOL_TIMEOUT).unwrap(),
        "/local/domain/1/visible"
    );
    let out = finish(child, "xenstore-watch");
    assert!(out.ok, "{}", out.stderr);
    // And a dom0 watcher in the same situation sees both.
    let w = h.client(0);
    w.watch("/local/domain", "t").unwrap();
    assert_eq!(next_event(&w).path, "/local/domain");
    c.write(XBT_NULL, "/local/domain/2/private", b"z").unwrap();
    assert_eq!(next_event(&w).path, "/local/domain/2/private");
}

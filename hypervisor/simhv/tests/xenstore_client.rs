//! `XsClient` against the simulated xenstored: every operation, transactions, watches
//! and domain management, over real unix sockets.

mod xenstore_common;

use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout};
use xenstore_common::{assert_quiet, assert_quiet_as, next_event, Harness};
use xmx_hv::xs::XsClient;
use xmx_hv::{Error, WatchEvent, Xenstore, XsAccess, XsPerm, XBT_NULL};

fn perm(domid: u16, access: XsAccess) -> XsPerm {
    XsPerm { domid, access }
}

fn ev(path: &str, token: &str) -> WatchEvent {
    WatchEvent {
        path: path.into(),
        token: token.into(),
    }
}

#[test]
fn read_write_mkdir_rm_directory() {
    let h = Harness::start();
    let c = h.client(0);
    assert_eq!(c.directory(XBT_NULL, "/").unwrap(), vec!["local", "tool"]);
    assert_eq!(
        c.directory(XBT_NULL, "/local/domain").unwrap(),
        vec!["0", "1", "2"]
    );

    c.write(XBT_NULL, "/data/a/b", b"value").unwrap();
    assert_eq!(c.read(XBT_NULL, "/data/a/b").unwrap(), b"value");
    assert_eq!(c.read(XBT_NULL, "/data/a").unwrap(), b"");
    // Values are binary.
    let bin = [0u8, 1, 2, 0xff, 0];
    c.write(XBT_NULL, "/data/bin", &bin).unwrap();
    assert_eq!(c.read(XBT_NULL, "/data/bin").unwrap(), bin);
    c.write(XBT_NULL, "/data/empty", b"").unwrap();
    assert_eq!(c.read(XBT_NULL, "/data/empty").unwrap(), b"");

    c.mkdir(XBT_NULL, "/data/dir/sub").unwrap();
    // mkdir of an existing node leaves its value alone.
    c.mkdir(XBT_NULL, "/data/a/b").unwrap();
    assert_eq!(c.read(XBT_NULL, "/data/a/b").unwrap(), b"value");
    assert_eq!(
        c.directory(XBT_NULL, "/data").unwrap(),
        vec!["a", "bin", "empty", "dir"]
    );

    c.rm(XBT_NULL, "/data/a").unwrap();
    assert!(matches!(
        c.read(XBT_NULL, "/data/a/b"),
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        c.read(XBT_NULL, "/data/a"),
        Err(Error::NotFound(_))
    ));
    assert_eq!(
        c.directory(XBT_NULL, "/data").unwrap(),
        vec!["bin", "empty", "dir"]
    );
    c.rm(XBT_NULL, "/data/a").unwrap();
    assert!(matches!(
        c.rm(XBT_NULL, "/data/a/b"),
        Err(Error::NotFound(_))
    ));
    assert!(matches!(c.rm(XBT_NULL, "/"), Err(Error::Invalid(_))));
    assert!(matches!(
        c.directory(XBT_NULL, "/nothing"),
        Err(Error::NotFound(_))
    ));
}

#[test]
fn malformed_names_are_invalid() {
    let h = Harness::start();
    let c = h.client(0);
    for bad in ["/a/", "/a//b", "/a b", "/a.b", "@x", "/"] {
        if bad == "/" {
            continue;
        }
        assert!(
            matches!(c.write(XBT_NULL, bad, b"x"), Err(Error::Invalid(_))),
            "{bad:?}"
        );
        assert!(
            matches!(c.read(XBT_NULL, bad), Err(Error::Invalid(_))),
            "{bad:?}"
        );
    }
    let long = format!("/{}", "a".repeat(3100));
    assert!(matches!(
        c.write(XBT_NULL, &long, b""),
        Err(Error::Invalid(_))
    ));
}

#[test]
fn long_directories_come_in_parts() {
    let h = Harness::start();
    let c = h.client(0);
    let mut expected = Vec::new();
    for i in 0..300 {
        let name = format!("a-rather-long-child-name-{i:05}");
        c.mkdir(XBT_NULL, &format!("/big/{name}")).unwrap();
        expected.push(name);
    }
    // The list is over 4096 bytes: DIRECTORY answers E2BIG and the client pages.
    assert!(matches!(
        c.request(1, XBT_NULL, b"/big\0".to_vec(), "/big"),
        Err(Error::Quota(_))
    ));
    assert_eq!(c.directory(XBT_NULL, "/big").unwrap(), expected);
    assert_eq!(c.directory_part(XBT_NULL, "/big").unwrap(), expected);
}

#[test]
fn relative_names_and_domain_paths() {
    let h = Harness::start();
    let g1 = h.client(1);
    let dom0 = h.client(0);
    g1.write(XBT_NULL, "device/vif/0/state", b"1").unwrap();
    assert_eq!(
        dom0.read(XBT_NULL, "/local/domain/1/device/vif/0/state")
            .unwrap(),
        b"1"
    );
    assert_eq!(g1.read(XBT_NULL, "device/vif/0/state").unwrap(), b"1");
    assert_eq!(g1.directory(XBT_NULL, "device/vif").unwrap(), vec!["0"]);
    dom0.write(XBT_NULL, "backend", b"b").unwrap();
    assert_eq!(
        dom0.read(XBT_NULL, "/local/domain/0/backend").unwrap(),
        b"b"
    );
    assert_eq!(g1.get_domain_path(1).unwrap(), "/local/domain/1");
    assert_eq!(g1.get_domain_path(7).unwrap(), "/local/domain/7");
}

#[test]
fn permissions_get_and_set() {
    let h = Harness::start();
    let dom0 = h.client(0);
    let g1 = h.client(1);
    let g2 = h.client(2);
    assert_eq!(
        dom0.get_perms(XBT_NULL, "/local/domain/1").unwrap(),
        vec![perm(1, XsAccess::None)]
    );
    g1.write(XBT_NULL, "shared", b"hi").unwrap();
    assert_eq!(
        g1.get_perms(XBT_NULL, "shared").unwrap(),
        vec![perm(1, XsAccess::None)]
    );
    assert!(matches!(
        g2.read(XBT_NULL, "/local/domain/1/shared"),
        Err(Error::Denied(_))
    ));
    // The owner grants guest 2 read access to this one node.
    g1.set_perms(
        XBT_NULL,
        "shared",
        &[perm(1, XsAccess::None), perm(2, XsAccess::Read)],
    )
    .unwrap();
    assert_eq!(g2.read(XBT_NULL, "/local/domain/1/shared").unwrap(), b"hi");
    assert!(matches!(
        g2.write(XBT_NULL, "/local/domain/1/shared", b"x"),
        Err(Error::Denied(_))
    ));
    // ...but not its parent.
    assert!(matches!(
        g2.directory(XBT_NULL, "/local/domain/1"),
        Err(Error::Denied(_))
    ));
    // A guest cannot hand a node to another domain (EPERM) nor touch others' perms.
    assert!(matches!(
        g1.set_perms(XBT_NULL, "shared", &[perm(2, XsAccess::Both)]),
        Err(Error::Denied(_))
    ));
    assert!(matches!(
        g2.set_perms(
            XBT_NULL,
            "/local/domain/1/shared",
            &[perm(2, XsAccess::Both)]
        ),
        Err(Error::Denied(_))
    ));
    // dom0 can.
    dom0.set_perms(
        XBT_NULL,
        "/local/domain/1/shared",
        &[perm(2, XsAccess::None)],
    )
    .unwrap();
    assert_eq!(g2.read(XBT_NULL, "/local/domain/1/shared").unwrap(), b"hi");
    // Special nodes carry permissions too.
    assert_eq!(
        dom0.get_perms(XBT_NULL, "@introduceDomain").unwrap(),
        vec![perm(0, XsAccess::None)]
    );
}

#[test]
fn guests_cannot_touch_each_other_dom0_can() {
    let h = Harness::start();
    let dom0 = h.client(0);
    let g1 = h.client(1);
    let g2 = h.client(2);
    g2.write(XBT_NULL, "secret", b"s2").unwrap();
    let theirs = "/local/domain/2/secret";
    assert!(matches!(g1.read(XBT_NULL, theirs), Err(Error::Denied(_))));
    assert!(matches!(
        g1.write(XBT_NULL, theirs, b"x"),
        Err(Error::Denied(_))
    ));
    assert!(matches!(
        g1.write(XBT_NULL, "/local/domain/2/new", b"x"),
        Err(Error::Denied(_))
    ));
    assert!(matches!(
        g1.mkdir(XBT_NULL, "/local/domain/2/d"),
        Err(Error::Denied(_))
    ));
    assert!(matches!(g1.rm(XBT_NULL, theirs), Err(Error::Denied(_))));
    assert!(matches!(
        g1.directory(XBT_NULL, "/local/domain/2"),
        Err(Error::Denied(_))
    ));
    assert!(matches!(
        g1.get_perms(XBT_NULL, theirs),
        Err(Error::Denied(_))
    ));
    // A missing node under someone else's home is not revealed as missing.
    assert!(matches!(
        g1.read(XBT_NULL, "/local/domain/2/nope"),
        Err(Error::Denied(_))
    ));
    // Nor may a guest list the domains or write outside its home.
    assert!(matches!(
        g1.directory(XBT_NULL, "/local/domain"),
        Err(Error::Denied(_))
    ));
    assert!(matches!(
        g1.write(XBT_NULL, "/tool/x", b"x"),
        Err(Error::Denied(_))
    ));
    // dom0 does all of it.
    assert_eq!(dom0.read(XBT_NULL, theirs).unwrap(), b"s2");
    dom0.write(XBT_NULL, theirs, b"by0").unwrap();
    assert_eq!(g2.read(XBT_NULL, "secret").unwrap(), b"by0");
    assert_eq!(
        dom0.directory(XBT_NULL, "/local/domain/2").unwrap(),
        vec!["secret"]
    );
    dom0.rm(XBT_NULL, theirs).unwrap();
    assert!(matches!(
        g2.read(XBT_NULL, "secret"),
        Err(Error::NotFound(_))
    ));
}

#[test]
fn guests_observe_only_their_own_changes() {
    let h = Harness::start();
    let dom0 = h.client(0);
    let g1 = h.client(1);
    g1.watch("/local/domain/2", "spy").unwrap();
    // The first event only echoes the watched name.
    assert_eq!(next_event(&g1), ev("/local/domain/2", "spy"));
    g1.watch("fence", "fence").unwrap();
    assert_eq!(next_event(&g1), ev("fence", "fence"));
    dom0.write(XBT_NULL, "/local/domain/2/x", b"1").unwrap();
    dom0.rm(XBT_NULL, "/local/domain/2/x").unwrap();
    dom0.set_perms(XBT_NULL, "/local/domain/2", &[perm(2, XsAccess::None)])
        .unwrap();
    let fence_writer = h.client(1);
    assert_quiet_as(&g1, &fence_writer, "/local/domain/1/fence", "fence");
    // Granting read access makes the node's events visible.
    dom0.write(XBT_NULL, "/local/domain/2/pub", b"").unwrap();
    dom0.set_perms(
        XBT_NULL,
        "/local/domain/2/pub",
        &[perm(2, XsAccess::None), perm(1, XsAccess::Read)],
    )
    .unwrap();
    assert_eq!(next_event(&g1), ev("/local/domain/2/pub", "spy"));
    dom0.write(XBT_NULL, "/local/domain/2/pub", b"v").unwrap();
    assert_eq!(next_event(&g1), ev("/local/domain/2/pub", "spy"));
}

#[test]
fn transaction_commit_is_atomic() {
    let h = Harness::start();
    let c = h.client(0);
    let other = h.client(0);
    let watcher = h.client(0);
    // Made beforehand: were /tx missing, the transaction would read "/" to create it,
    // and the fence's creation of /fence (a change to "/") would make it conflict.
    c.mkdir(XBT_NULL, "/tx").unwrap();
    c.mkdir(XBT_NULL, "/fence").unwrap();
    watcher.watch("/tx", "w").unwrap();
    watcher.watch("/fence", "fence").unwrap();
    assert_eq!(next_event(&watcher), ev("/tx", "w"));
    assert_eq!(next_event(&watcher), ev("/fence", "fence"));

    let tx = c.transaction_start().unwrap();
    assert_ne!(tx, XBT_NULL);
    c.write(tx, "/tx/a", b"1").unwrap();
    c.write(tx, "/tx/b", b"2").unwrap();
    c.mkdir(tx, "/tx/c").unwrap();
    // Visible inside the transaction only.
    assert_eq!(c.read(tx, "/tx/a").unwrap(), b"1");
    assert_eq!(c.directory(tx, "/tx").unwrap(), vec!["a", "b", "c"]);
    assert!(matches!(
        other.read(XBT_NULL, "/tx/a"),
        Err(Error::NotFound(_))
    ));
    assert!(matches!(c.read(XBT_NULL, "/tx/a"), Err(Error::NotFound(_))));
    assert_quiet(&watcher, &other, "/fence");

    c.transaction_end(tx, true).unwrap();
    assert_eq!(other.read(XBT_NULL, "/tx/a").unwrap(), b"1");
    assert_eq!(other.read(XBT_NULL, "/tx/b").unwrap(), b"2");
    assert_eq!(
        other.directory(XBT_NULL, "/tx").unwrap(),
        vec!["a", "b", "c"]
    );
    let mut paths: Vec<String> = (0..3).map(|_| next_event(&watcher).path).collect();
    paths.sort();
    assert_eq!(paths, vec!["/tx/a", "/tx/b", "/tx/c"]);
    // The id is gone after the end.
    assert!(matches!(c.read(tx, "/tx/a"), Err(Error::NotFound(_))));
    assert!(matches!(
        c.transaction_end(tx, true),
        Err(Error::NotFound(_))
    ));
}

#[test]
fn transaction_abort_discards() {
    let h = Harness::start();
    let c = h.client(0);
    c.write(XBT_NULL, "/keep", b"old").unwrap();
    let tx = c.transaction_start().unwrap();
    c.write(tx, "/keep", b"new").unwrap();
    c.rm(tx, "/tool").unwrap();
    c.transaction_end(tx, false).unwrap();
    assert_eq!(c.read(XBT_NULL, "/keep").unwrap(), b"old");
    assert_eq!(
        c.directory(XBT_NULL, "/tool").unwrap(),
        Vec::<String>::new()
    );
}

#[test]
fn conflicting_commit_is_again_and_changes_nothing() {
    let h = Harness::start();
    let c = h.client(0);
    let other = h.client(0);
    c.write(XBT_NULL, "/k", b"0").unwrap();
    let tx = c.transaction_start().unwrap();
    assert_eq!(c.read(tx, "/k").unwrap(), b"0");
    c.write(tx, "/derived", b"from 0").unwrap();
    other.write(XBT_NULL, "/k", b"1").unwrap();
    assert!(matches!(c.transaction_end(tx, true), Err(Error::Again)));
    assert!(matches!(
        c.read(XBT_NULL, "/derived"),
        Err(Error::NotFound(_))
    ));
    assert_eq!(c.read(XBT_NULL, "/k").unwrap(), b"1");
    // A transaction whose nodes nobody else touched commits despite other traffic.
    let tx = c.transaction_start().unwrap();
    c.write(tx, "/k/own", b"x").unwrap();
    other.write(XBT_NULL, "/unrelated/node", b"y").unwrap();
    c.transaction_end(tx, true).unwrap();
    assert_eq!(c.read(XBT_NULL, "/k/own").unwrap(), b"x");
}

#[test]
fn transaction_ids_belong_to_their_connection() {
    let h = Harness::start();
    let a = h.client(0);
    let b = h.client(0);
    let tx = a.transaction_start().unwrap();
    assert!(matches!(b.write(tx, "/x", b"1"), Err(Error::NotFound(_))));
    assert!(matches!(
        b.transaction_end(tx, true),
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        a.write(tx + 1000, "/x", b"1"),
        Err(Error::NotFound(_))
    ));
    // No nesting: TRANSACTION_START inside a transaction is EBUSY.
    assert!(matches!(
        a.request(6, tx, vec![0], "nested"),
        Err(Error::Busy(_))
    ));
    a.transaction_end(tx, true).unwrap();
}

#[test]
fn concurrent_transactional_increments_are_serialised() {
    const THREADS: usize = 4;
    const EACH: usize = 25;
    let h = Harness::start();
    h.client(0).write(XBT_NULL, "/counter", b"0").unwrap();
    let sock = h.sock(0);
    let mut retries = 0;
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let sock = sock.clone();
            std::thread::spawn(move || {
                let c = XsClient::connect_unix(sock).unwrap();
                let mut again = 0;
                for _ in 0..EACH {
                    loop {
                        let tx = c.transaction_start().unwrap();
                        let v: usize = String::from_utf8(c.read(tx, "/counter").unwrap())
                            .unwrap()
                            .parse()
                            .unwrap();
                        c.write(tx, "/counter", (v + 1).to_string().as_bytes())
                            .unwrap();
                        match c.transaction_end(tx, true) {
                            Ok(()) => break,
                            Err(Error::Again) => again += 1,
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
                again
            })
        })
        .collect();
    for w in workers {
        retries += w.join().unwrap();
    }
    let c = h.client(0);
    assert_eq!(
        c.read(XBT_NULL, "/counter").unwrap(),
        (THREADS * EACH).to_string().as_bytes()
    );
    eprintln!("{retries} conflicting commits retried");
}

#[test]
fn watches_fire_with_tokens_and_stop_on_unwatch() {
    let h = Harness::start();
    let c = h.client(0);
    let w = h.client(0);
    w.watch("/wt", "tok-a").unwrap();
    w.watch("/fence", "fence").unwrap();
    assert_eq!(next_event(&w), ev("/wt", "tok-a"));
    assert_eq!(next_event(&w), ev("/fence", "fence"));
    c.write(XBT_NULL, "/wt/x/y", b"1").unwrap();
    assert_eq!(next_event(&w), ev("/wt/x/y", "tok-a"));
    c.mkdir(XBT_NULL, "/wt/m").unwrap();
    assert_eq!(next_event(&w), ev("/wt/m", "tok-a"));
    c.set_perms(XBT_NULL, "/wt/m", &[perm(0, XsAccess::Read)])
        .unwrap();
    assert_eq!(next_event(&w), ev("/wt/m", "tok-a"));
    // mkdir of an existing node changes nothing and fires nothing.
    c.mkdir(XBT_NULL, "/wt/m").unwrap();
    assert_quiet(&w, &c, "/fence");
    // A second watch on a descendant with its own token.
    w.watch("/wt/x/y", "tok-b").unwrap();
    assert_eq!(next_event(&w), ev("/wt/x/y", "tok-b"));
    // Removing a subtree: the descendant's watch hears its own path, the ancestor's
    // watch hears only the removed root (descendants come first, as xenstored walks).
    c.rm(XBT_NULL, "/wt/x").unwrap();
    assert_eq!(next_event(&w), ev("/wt/x/y", "tok-b"));
    assert_eq!(next_event(&w), ev("/wt/x", "tok-a"));
    assert_quiet(&w, &c, "/fence");
    assert!(matches!(w.watch("/wt", "tok-a"), Err(Error::Exists(_))));
    w.unwatch("/wt", "tok-a").unwrap();
    assert!(matches!(w.unwatch("/wt", "tok-a"), Err(Error::NotFound(_))));
    c.write(XBT_NULL, "/wt/z", b"").unwrap();
    assert_quiet(&w, &c, "/fence");
    assert_eq!(h.xs.usage(0).watches, 2);
}

#[test]
fn relative_watches_report_relative_paths() {
    let h = Harness::start();
    let g = h.client(1);
    g.watch("device", "dev").unwrap();
    assert_eq!(next_event(&g), ev("device", "dev"));
    h.client(0)
        .write(XBT_NULL, "/local/domain/1/device/vbd/768", b"")
        .unwrap();
    assert_eq!(next_event(&g), ev("device/vbd/768", "dev"));
    g.unwatch("device", "dev").unwrap();
}

#[test]
fn watch_fd_is_readable_while_events_wait() {
    let h = Harness::start();
    let w = h.client(0);
    let readable = |timeout: PollTimeout| {
        // SAFETY: the client's eventfd stays open while `w` lives, which covers this call.
        let fd = unsafe { BorrowedFd::borrow_raw(w.watch_fd()) };
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        nix::poll::poll(&mut fds, timeout).unwrap() > 0
    };
    assert!(!readable(PollTimeout::ZERO));
    w.watch("/fdw", "t").unwrap();
    assert!(readable(PollTimeout::from(20_000u16)));
    assert_eq!(next_event(&w), ev("/fdw", "t"));
    assert!(!readable(PollTimeout::ZERO));
    h.client(0).write(XBT_NULL, "/fdw", b"1").unwrap();
    assert!(readable(PollTimeout::from(20_000u16)));
    assert_eq!(next_event(&w), ev("/fdw", "t"));
    assert!(!readable(PollTimeout::ZERO));
}

#[test]
fn reset_watches_drops_watches_and_transactions() {
    let h = Harness::start();
    let w = h.client(1);
    w.watch("a", "1").unwrap();
    w.watch("b", "2").unwrap();
    let tx = w.transaction_start().unwrap();
    assert_eq!(h.xs.usage(1).watches, 2);
    assert_eq!(h.xs.usage(1).transactions, 1);
    w.reset_watches().unwrap();
    assert_eq!(h.xs.usage(1).watches, 0);
    assert_eq!(h.xs.usage(1).transactions, 0);
    assert!(matches!(
        w.transaction_end(tx, true),
        Err(Error::NotFound(_))
    ));
    let _ = next_event(&w);
    let _ = next_event(&w);
    w.watch("fence", "fence").unwrap();
    assert_eq!(next_event(&w), ev("fence", "fence"));
    h.client(0)
        .write(XBT_NULL, "/local/domain/1/a", b"")
        .unwrap();
    assert_quiet_as(&w, &h.client(1), "/local/domain/1/fence", "fence");
}

#[test]
fn introduce_and_release_fire_special_watches() {
    let h = Harness::start();
    let dom0 = h.client(0);
    let g1 = h.client(1);
    dom0.watch("@introduceDomain", "intro").unwrap();
    dom0.watch("@releaseDomain", "rel").unwrap();
    g1.watch("@introduceDomain", "intro").unwrap();
    g1.watch("@releaseDomain", "rel").unwrap();
    g1.watch("fence", "fence").unwrap();
    for c in [&dom0, &g1] {
        assert_eq!(next_event(c), ev("@introduceDomain", "intro"));
        assert_eq!(next_event(c), ev("@releaseDomain", "rel"));
    }
    assert_eq!(next_event(&g1), ev("fence", "fence"));

    // Through the API, as the simhv toolstack does.
    let acceptor5 = h.add_domain(5);
    assert!(!dom0.is_domain_introduced(5).unwrap());
    h.xs.introduce_domain(5);
    assert_eq!(next_event(&dom0), ev("@introduceDomain", "intro"));
    assert!(dom0.is_domain_introduced(5).unwrap());
    assert_eq!(
        dom0.get_perms(XBT_NULL, "/local/domain/5").unwrap(),
        vec![perm(5, XsAccess::None)]
    );
    // Introducing again changes nothing and fires nothing.
    h.xs.introduce_domain(5);
    // Through the protocol, as xl does.
    dom0.introduce(6, 0x1234, 3).unwrap();
    assert_eq!(next_event(&dom0), ev("@introduceDomain", "intro"));
    assert!(dom0.is_domain_introduced(6).unwrap());
    // Guests do not hear of introductions; @releaseDomain is readable by every domain.
    assert_quiet_as(&g1, &h.client(1), "/local/domain/1/fence", "fence");

    let g5 = h.client(5);
    g5.write(XBT_NULL, "data", b"x").unwrap();
    dom0.watch("/local/domain/5", "home5").unwrap();
    assert_eq!(next_event(&dom0), ev("/local/domain/5", "home5"));
    h.xs.release_domain(5);
    // The removal of its home fires first, then @releaseDomain.
    let mut got = Vec::new();
    loop {
        let e = next_event(&dom0);
        let done = e.token == "rel";
        got.push(e);
        if done {
            break;
        }
    }
    assert!(got.contains(&ev("/local/domain/5", "home5")));
    assert_eq!(got.last(), Some(&ev("@releaseDomain", "rel")));
    assert_eq!(next_event(&g1), ev("@releaseDomain", "rel"));
    assert!(!dom0.is_domain_introduced(5).unwrap());
    assert!(matches!(
        dom0.read(XBT_NULL, "/local/domain/5"),
        Err(Error::NotFound(_))
    ));
    // Its connection is closed.
    assert!(matches!(g5.read(XBT_NULL, "data"), Err(Error::Closed(_))));
    assert_eq!(h.xs.usage(5), Default::default());
    // Its socket is no longer served.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done_tx.send(acceptor5.join().is_ok());
    });
    assert_eq!(done_rx.recv_timeout(Duration::from_secs(20)), Ok(true));
    assert!(XsClient::connect_unix(h.sock(5)).is_err());

    dom0.release(6).unwrap();
    let e = next_event(&dom0);
    assert_eq!(e, ev("@releaseDomain", "rel"));
    assert!(matches!(dom0.release(6), Err(Error::NotFound(_))));
}

#[test]
fn domain_management_is_dom0_only() {
    let h = Harness::start();
    let g1 = h.client(1);
    assert!(matches!(g1.introduce(9, 1, 1), Err(Error::Denied(_))));
    assert!(matches!(g1.release(2), Err(Error::Denied(_))));
    assert!(matches!(g1.is_domain_introduced(2), Err(Error::Denied(_))));
    let dom0 = h.client(0);
    assert!(matches!(dom0.introduce(0, 1, 1), Err(Error::Invalid(_))));
    assert!(matches!(dom0.introduce(9, 1, 0), Err(Error::Invalid(_))));
    assert!(matches!(dom0.release(0), Err(Error::Invalid(_))));
    assert!(dom0.is_domain_introduced(0).unwrap());
    assert!(dom0.is_domain_introduced(2).unwrap());
}

#[test]
fn release_removes_everything_the_domain_owned() {
    let h = Harness::start();
    let dom0 = h.client(0);
    // Guest 1 may write in a dom0 directory; what it creates there is its own.
    dom0.mkdir(XBT_NULL, "/shared").unwrap();
    dom0.set_perms(
        XBT_NULL,
        "/shared",
        &[perm(0, XsAccess::None), perm(1, XsAccess::Both)],
    )
    .unwrap();
    dom0.write(XBT_NULL, "/acl", b"").unwrap();
    dom0.set_perms(
        XBT_NULL,
        "/acl",
        &[perm(0, XsAccess::None), perm(1, XsAccess::Read)],
    )
    .unwrap();
    let g1 = h.client(1);
    g1.write(XBT_NULL, "/shared/from1/deep", b"x").unwrap();
    g1.write(XBT_NULL, "home-node", b"y").unwrap();
    g1.watch("home-node", "w").unwrap();
    let _tx = g1.transaction_start().unwrap();
    let before = h.xs.usage(1);
    assert_eq!(before.nodes, 4);
    assert_eq!(before.watches, 1);
    assert_eq!(before.transactions, 1);
    assert_eq!(before.connections, 1);

    h.xs.release_domain(1);
    assert_eq!(h.xs.usage(1), Default::default());
    assert!(matches!(
        dom0.read(XBT_NULL, "/shared/from1"),
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        dom0.read(XBT_NULL, "/local/domain/1"),
        Err(Error::NotFound(_))
    ));
    assert_eq!(
        dom0.directory(XBT_NULL, "/shared").unwrap(),
        Vec::<String>::new()
    );
    // Its entries left the permission lists it was named in.
    assert_eq!(
        dom0.get_perms(XBT_NULL, "/acl").unwrap(),
        vec![perm(0, XsAccess::None)]
    );
    // Guest 2 is untouched.
    assert_eq!(h.xs.usage(2).nodes, 1);
    assert!(matches!(
        g1.read(XBT_NULL, "home-node"),
        Err(Error::Closed(_))
    ));
}

#[test]
fn many_threads_share_one_client() {
    let h = Harness::start();
    let c = Arc::new(h.client(0));
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let c = Arc::clone(&c);
            std::thread::spawn(move || {
                for j in 0..50 {
                    let p = format!("/mt/{i}/{j}");
                    c.write(XBT_NULL, &p, p.as_bytes()).unwrap();
                    assert_eq!(c.read(XBT_NULL, &p).unwrap(), p.as_bytes());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(c.directory(XBT_NULL, "/mt").unwrap().len(), 8);
    assert!(c.next_watch_event(Some(Duration::ZERO)).unwrap().is_none());
}

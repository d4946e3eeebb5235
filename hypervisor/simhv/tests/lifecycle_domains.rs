//! Domain lifecycle on the simulated host: create, destroy, suspend, resume.

mod hv_util;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use hv_util::SimHost;
use xmx_hv::sim::admin::RunState;
use xmx_hv::sim::{layout, SimAdmin, SimPlatform};
use xmx_hv::{Error, EventChannels, Platform, Xenstore, DOM0, XBT_NULL};
use xmx_simhv::{Daemon, SimhvConfig};

const WAIT: Option<Duration> = Some(Duration::from_secs(20));

fn next_event(xs: &dyn Xenstore) -> xmx_hv::WatchEvent {
    xs.next_watch_event(WAIT)
        .unwrap()
        .expect("no watch event in time")
}

#[test]
fn create_lists_and_lays_out_a_domain() {
    let host = SimHost::start();
    let names: Vec<_> = host
        .admin
        .list()
        .unwrap()
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert_eq!(names, vec!["Domain-0".to_string()]);

    let g = host.create("guest1");
    assert_eq!(g, 1);
    let dir = layout::dom_dir(host.path(), g);
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    for f in [
        layout::hv_sock(host.path(), g),
        layout::xenstore_sock(host.path(), g),
        layout::mem_file(host.path(), g),
        layout::gnttab_file(host.path(), g),
    ] {
        assert!(f.exists(), "{} missing", f.display());
    }
    let list = host.admin.list().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!((list[1].domid, list[1].name.as_str()), (1, "guest1"));
    assert_eq!(list[1].state, RunState::Running);

    let s = host.state(g);
    assert_eq!(s.name, "guest1");
    assert_eq!(
        (
            s.grants_active,
            s.mappings_held,
            s.ports_open,
            s.hv_connections
        ),
        (0, 0, 0, 0)
    );

    // The toolstack's nodes are there, readable by the guest in its home.
    let xs = host.attach(g).xenstore().unwrap();
    assert_eq!(xs.read(XBT_NULL, "name").unwrap(), b"guest1");
    assert_eq!(xs.read(XBT_NULL, "/local/domain/1/domid").unwrap(), b"1");
    // ... but, as libxl leaves them, owned by dom0: the guest cannot rename itself.
    assert!(matches!(
        xs.write(XBT_NULL, "name", b"dom0"),
        Err(Error::Denied(_))
    ));
    assert!(matches!(
        xs.write(XBT_NULL, "domid", b"0"),
        Err(Error::Denied(_))
    ));
    assert!(matches!(xs.rm(XBT_NULL, "name"), Err(Error::Denied(_))));
    assert_eq!(xs.read(XBT_NULL, "name").unwrap(), b"guest1");
    // Its home stays its own.
    xs.write(XBT_NULL, "data/x", b"1").unwrap();

    assert!(matches!(
        host.admin.create("guest1", None),
        Err(Error::Exists(_))
    ));
    assert!(matches!(
        host.admin.create("bad/name", None),
        Err(Error::Invalid(_))
    ));
    assert_eq!(host.admin.create("seven", Some(7)).unwrap(), 7);
    assert!(matches!(
        host.admin.create("again", Some(7)),
        Err(Error::Exists(_))
    ));
    assert_eq!(host.create("next"), 2);
    assert!(matches!(host.admin.destroy(DOM0), Err(Error::Invalid(_))));
    assert!(matches!(host.admin.destroy(99), Err(Error::NotFound(_))));
}

#[test]
fn destroy_releases_everything_the_domain_touched() {
    let host = SimHost::start();
    let g = host.create("doomed");
    let dom0 = host.attach(DOM0);
    let guest = host.attach(g);
    let xs0 = dom0.xenstore().unwrap();
    xs0.watch("@releaseDomain", "rel").unwrap();
    // A watch fires once when registered.
    assert_eq!(next_event(&*xs0).token, "rel");

    // The guest grants to dom0; dom0 maps it.
    let gtg = guest.grant_table().unwrap();
    let granted = gtg.grant_pages(DOM0, 4, true).unwrap();
    // SAFETY: four writable pages of ours.
    unsafe { std::ptr::write_bytes(granted.as_ptr(), 0x77, 4 * 4096) };
    let gt0 = dom0.grant_table().unwrap();
    let mapped = gt0.map(g, granted.refs(), false).unwrap();
    // dom0 grants to the guest; the guest maps it.
    let dom0_grant = gt0.grant_pages(g, 2, true).unwrap();
    let guest_map = gtg.map(DOM0, dom0_grant.refs(), true).unwrap();
    // An event channel between them, and one the guest offered but nobody bound.
    let ev0 = dom0.sim_event_channels().unwrap();
    let evg = guest.event_channels().unwrap();
    let pg = evg.alloc_unbound(DOM0).unwrap();
    let p0 = ev0.bind_interdomain(g, pg).unwrap();
    evg.alloc_unbound(DOM0).unwrap();
    // A xenstore node of the guest's own.
    let xsg = guest.xenstore().unwrap();
    xsg.write(XBT_NULL, "data/x", b"1").unwrap();

    let before = host.state(g);
    assert_eq!(before.grants_active, 4);
    assert_eq!(before.grants_mapped_by_others, 4);
    assert_eq!(before.mappings_held, 2);
    assert_eq!(before.ports_open, 2);
    assert!(before.hv_connections >= 2);
    assert_eq!(host.state(DOM0).grants_mapped_by_others, 2);

    host.admin.destroy(g).unwrap();

    assert!(!layout::dom_dir(host.path(), g).exists());
    assert!(matches!(host.admin.state(g), Err(Error::NotFound(_))));
    assert_eq!(host.admin.list().unwrap().len(), 1);
    let s0 = host.state(DOM0);
    assert_eq!(s0.mappings_held, 0, "dom0's mappings of the guest's grants");
    assert_eq!(
        s0.grants_mapped_by_others, 0,
        "the guest's mappings of dom0's grants"
    );
    assert_eq!(s0.grants_active, 2);
    // dom0's port is woken and sees its peer gone.
    let mut got = Vec::new();
    ev0.wait(&mut got, WAIT).unwrap();
    assert_eq!(got, vec![p0]);
    assert!(matches!(ev0.notify(p0), Err(Error::Closed(_))));
    // @releaseDomain fired, and the guest's nodes are gone.
    assert_eq!(next_event(&*xs0).token, "rel");
    assert!(xs0.read(XBT_NULL, "/local/domain/1/data/x").is_err());
    // dom0 can end its own grant now, and its stale mapping of the guest is still memory.
    // SAFETY: the mapping stays valid until dropped.
    assert_eq!(unsafe { mapped.as_ptr().add(4095).read() }, 0x77);
    dom0_grant.end_access().map_err(|(_, e)| e).unwrap();
    drop(mapped);
    // The guest's processes lost their connection.
    assert!(matches!(
        gtg.grant_pages(DOM0, 1, true),
        Err(Error::Closed(_))
    ));
    drop((guest_map, granted));
    assert_eq!(host.state(DOM0).grants_active, 0);
}

#[test]
fn a_reused_domid_is_a_new_domain() {
    let host = SimHost::start();
    let g = host.create("first");
    let old = host.attach(g);
    let old_gt = old.grant_table().unwrap();
    let instance = host.state(g).instance;
    host.admin.destroy(g).unwrap();
    assert_eq!(host.create("second"), g);
    assert_ne!(host.state(g).instance, instance);
    // The old process's handle does not act as the new domain.
    assert!(old_gt.grant_pages(DOM0, 1, true).is_err());
    let new = host.attach(g);
    let pages = new
        .grant_table()
        .unwrap()
        .grant_pages(DOM0, 1, true)
        .unwrap();
    let s = host.state(g);
    assert_eq!((s.name.as_str(), s.grants_active), ("second", 1));
    drop(pages);
}

#[test]
fn suspend_blocks_hypervisor_operations_until_resume() {
    let host = SimHost::start();
    let g = host.create("sleepy");
    let guest = host.attach(g);
    let dom0 = host.attach(DOM0);
    let gtg = guest.grant_table().unwrap();
    let gt0 = dom0.grant_table().unwrap();
    let granted = gtg.grant_pages(DOM0, 1, true).unwrap();
    let xsg = guest.xenstore().unwrap();
    xsg.watch("control/shutdown", "ctl").unwrap();
    assert_eq!(next_event(&*xsg).token, "ctl");

    host.admin.suspend(g).unwrap();
    assert_eq!(host.state(g).state, RunState::Suspended);
    assert!(matches!(host.admin.suspend(g), Err(Error::Invalid(_))));
    // The toolstack asked the guest to suspend, as xl does.
    let ev = next_event(&*xsg);
    // A relative watch reports the relative path, as xenstored does.
    assert_eq!(ev.path, "control/shutdown");
    assert_eq!(xsg.read(XBT_NULL, "control/shutdown").unwrap(), b"suspend");
    // New hypervisor work by or against the domain is refused, clearly.
    match gtg.grant_pages(DOM0, 1, true) {
        Err(Error::Busy(m)) => assert!(m.contains("suspended"), "{m}"),
        other => panic!("grant while suspended: {:?}", other.err()),
    }
    assert!(matches!(
        gt0.map(g, granted.refs(), false),
        Err(Error::Busy(_))
    ));
    let evg = guest.event_channels().unwrap();
    assert!(matches!(evg.alloc_unbound(DOM0), Err(Error::Busy(_))));

    host.admin.resume(g).unwrap();
    assert_eq!(host.state(g).state, RunState::Running);
    assert!(matches!(host.admin.resume(g), Err(Error::Invalid(_))));
    let m = gt0.map(g, granted.refs(), false).unwrap();
    let more = gtg.grant_pages(DOM0, 1, true).unwrap();
    evg.alloc_unbound(DOM0).unwrap();
    drop((m, more));
    assert!(matches!(host.admin.suspend(DOM0), Err(Error::Invalid(_))));
}

#[test]
fn one_daemon_per_directory_and_leftovers_are_replaced() {
    let dir = tempfile::Builder::new().prefix("simhv").tempdir().unwrap();
    let first = Daemon::start(dir.path(), SimhvConfig::default()).unwrap();
    match Daemon::start(dir.path(), SimhvConfig::default()) {
        Err(Error::Busy(_)) => {}
        Err(e) => panic!("second daemon: {e}"),
        Ok(_) => panic!("two daemons on one directory"),
    }
    assert!(layout::ready_file(dir.path()).exists());
    first.shutdown();
    assert!(!layout::ready_file(dir.path()).exists());
    assert!(!layout::ctl_sock(dir.path()).exists());
    assert!(!layout::dom_dir(dir.path(), DOM0).exists());

    // What a crashed daemon leaves: sockets, a domain directory, a ready file.
    std::fs::create_dir(layout::dom_dir(dir.path(), 5)).unwrap();
    std::fs::write(layout::dom_dir(dir.path(), 5).join("hv.sock"), b"").unwrap();
    std::os::unix::net::UnixListener::bind(layout::ctl_sock(dir.path())).unwrap();
    std::fs::write(layout::ready_file(dir.path()), b"12345\n").unwrap();
    let second = Daemon::start(dir.path(), SimhvConfig::default()).unwrap();
    assert!(!layout::dom_dir(dir.path(), 5).exists());
    let pid = std::fs::read_to_string(layout::ready_file(dir.path())).unwrap();
    assert_eq!(pid.trim(), std::process::id().to_string());
    let admin = SimAdmin::connect(dir.path()).unwrap();
    assert_eq!(admin.list().unwrap().len(), 1);
    assert!(SimPlatform::attach(dir.path(), DOM0).is_ok());
    drop(second);
    assert!(admin.list().is_err());
}

fn pidfd_wait_exit(pid: i32) {
    // SAFETY: plain syscall with integer arguments; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    assert!(fd >= 0, "pidfd_open: {}", std::io::Error::last_os_error());
    // SAFETY: fd was just returned by pidfd_open and is owned here.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let mut fds = [nix::poll::PollFd::new(
        std::os::fd::AsFd::as_fd(&fd),
        nix::poll::PollFlags::POLLIN,
    )];
    let n = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(20_000u16)).unwrap();
    assert_eq!(n, 1, "the daemon did not exit");
}

#[test]
fn the_binary_serves_in_the_foreground_and_background_and_stops_on_sigterm() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let bin = env!("CARGO_BIN_EXE_xmx-simhv");

    let help = Command::new(bin).arg("--help").output().unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--dir"));

    // Foreground: the ready line tells when to connect.
    let dir = tempfile::Builder::new().prefix("simhv").tempdir().unwrap();
    let mut child = Command::new(bin)
        .args(["--dir", dir.path().to_str().unwrap(), "--foreground"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("xmx-simhv ready"), "{line}");
    let admin = SimAdmin::connect(dir.path()).unwrap();
    let g = admin.create("viabinary", None).unwrap();
    let p = SimPlatform::attach(dir.path(), g).unwrap();
    let pages = p.grant_table().unwrap().grant_pages(DOM0, 1, true).unwrap();
    drop(pages);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(child.wait().unwrap().success());
    assert!(!layout::ctl_sock(dir.path()).exists());
    assert!(!layout::ready_file(dir.path()).exists());

    // Background: the command returns once the daemon is ready.
    let out = Command::new(bin)
        .args(["--dir", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("xmx-simhv ready"));
    let pid: i32 = std::fs::read_to_string(layout::ready_file(dir.path()))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        SimAdmin::connect(dir.path()).unwrap().list().unwrap().len(),
        1
    );
    // A second daemon on the same directory is refused.
    let second = Command::new(bin)
        .args(["--dir", dir.path().to_str().unwrap(), "--foreground"])
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert!(!second.status.success());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    pidfd_wait_exit(pid);
    assert!(!layout::ctl_sock(dir.path()).exists());
}

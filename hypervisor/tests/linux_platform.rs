//! The linux platform on a machine without Xen: every entry point fails with an error
//! that names the missing device, and nothing panics.

use std::path::Path;

use xmx_hv::linux::{
    Gntalloc, Gntdev, LinuxConfig, LinuxEventChannels, LinuxGrantTable, LinuxPlatform,
};
use xmx_hv::{Error, EventChannels, GrantTable};

fn on_xen() -> bool {
    Path::new("/dev/xen/evtchn").exists()
}

fn assert_names(err: Error, node: &str) {
    match err {
        Error::Unsupported(m) => assert!(m.contains(node), "{m:?} does not name {node}"),
        other => panic!("want Unsupported naming {node}, got {other:?}"),
    }
}

#[test]
fn opening_without_xen_names_the_event_channel_device() {
    if on_xen() {
        eprintln!("/dev/xen/evtchn exists: this machine runs on Xen, nothing to check");
        return;
    }
    assert_names(LinuxPlatform::open().unwrap_err(), "/dev/xen/evtchn");
}

#[test]
fn each_device_reports_its_own_node() {
    let dir = Path::new("/nonexistent-xmx/xen");
    assert_names(
        Gntalloc::open(&dir.join("gntalloc")).unwrap_err(),
        "/nonexistent-xmx/xen/gntalloc",
    );
    assert_names(
        Gntdev::open(&dir.join("gntdev")).unwrap_err(),
        "/nonexistent-xmx/xen/gntdev",
    );
    assert_names(
        LinuxEventChannels::open(&dir.join("evtchn")).unwrap_err(),
        "/nonexistent-xmx/xen/evtchn",
    );
    assert_names(
        LinuxPlatform::open_with(LinuxConfig {
            dev_dir: dir.to_path_buf(),
        })
        .unwrap_err(),
        "/nonexistent-xmx/xen/evtchn",
    );
    match LinuxGrantTable::open(dir).unwrap_err() {
        Error::Unsupported(m) => {
            assert!(m.contains("/nonexistent-xmx/xen/gntalloc"), "{m}");
            assert!(m.contains("/nonexistent-xmx/xen/gntdev"), "{m}");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_node_that_is_not_the_driver_refuses_every_operation_cleanly() {
    // /dev/null opens like a device but knows none of the ioctls: every operation must
    // turn the kernel's refusal into an error, never a panic or a bogus success.
    let null = || {
        std::fs::File::options()
            .read(true)
            .write(true)
            .open("/dev/null")
            .unwrap()
    };
    let gt = LinuxGrantTable::from_devices(
        Gntalloc::from_fd(null().into()),
        Gntdev::from_fd(null().into()),
    );
    assert!(matches!(
        gt.grant_pages(1, 4, true),
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(
        gt.map(1, &[8, 9], true),
        Err(Error::Unsupported(_))
    ));
    assert!(matches!(gt.map(1, &[], true), Err(Error::Invalid(_))));
    let ev = LinuxEventChannels::from_fd(null().into());
    assert!(matches!(ev.alloc_unbound(1), Err(Error::Unsupported(_))));
    assert!(matches!(
        ev.bind_interdomain(1, 3),
        Err(Error::Unsupported(_))
    ));
    let mut out = Vec::new();
    // Reading /dev/null gives end-of-file: no ports pending.
    ev.pending(&mut out).unwrap();
    assert!(out.is_empty());
}

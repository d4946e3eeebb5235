//! The `xenstore-rs` crate, an independent client found through XENSTORED_PATH,
//! against the simulated xenstored.
//!
//! xenstore-rs 0.8's blocking client implements read, write, directory and rm; it has
//! no transactions (its transaction traits have no implementation for the unix
//! client), so transactions are covered by the other suites.
//!
//! One test function: XENSTORED_PATH is process-wide.

mod xenstore_common;

use std::io::ErrorKind;

use xenstore_common::Harness;
use xenstore_rs::unix::XsUnix;
use xenstore_rs::Xs;
use xmx_hv::{Xenstore, XBT_NULL};

fn open(path: &std::path::Path) -> XsUnix {
    std::env::set_var("XENSTORED_PATH", path);
    XsUnix::new().expect("xenstore-rs connects through XENSTORED_PATH")
}

#[test]
fn xenstore_rs_read_write_directory_rm() {
    let h = Harness::start();
    let ours = h.client(0);

    let xs = open(&h.sock(0));
    xs.write("/rs/a", "alpha").unwrap();
    xs.write("/rs/b/c", "gamma").unwrap();
    assert_eq!(ours.read(XBT_NULL, "/rs/a").unwrap(), b"alpha");
    assert_eq!(&*xs.read("/rs/b/c").unwrap(), "gamma");
    assert_eq!(&*xs.read("/rs/b").unwrap(), "");
    ours.write(XBT_NULL, "/rs/d", b"from xmx").unwrap();
    assert_eq!(&*xs.read("/rs/d").unwrap(), "from xmx");
    let names: Vec<String> = xs
        .directory("/rs")
        .unwrap()
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(names, vec!["a", "b", "d"]);
    assert!(xs.directory("/rs/a").unwrap().is_empty());
    xs.rm("/rs/b").unwrap();
    assert_eq!(ours.directory(XBT_NULL, "/rs").unwrap(), vec!["a", "d"]);
    assert_eq!(xs.read("/rs/b/c").unwrap_err().kind(), ErrorKind::NotFound);
    assert_eq!(
        xs.write("/rs/bad path", "x").unwrap_err().kind(),
        ErrorKind::InvalidInput
    );

    // As a guest: its own home works, another guest's is refused.
    let guest = open(&h.sock(1));
    guest.write("/local/domain/1/rs", "mine").unwrap();
    assert_eq!(&*guest.read("/local/domain/1/rs").unwrap(), "mine");
    ours.write(XBT_NULL, "/local/domain/2/rs", b"theirs")
        .unwrap();
    assert_eq!(
        guest.read("/local/domain/2/rs").unwrap_err().kind(),
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        guest.directory("/local/domain").unwrap_err().kind(),
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        guest.rm("/local/domain/2/rs").unwrap_err().kind(),
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        ours.read(XBT_NULL, "/local/domain/2/rs").unwrap(),
        b"theirs"
    );
}

//! xmx-hv's hand-off on the simulated platform: granted pages and a port, exported by one
//! holder and used by another through descriptors passed over a unix socket.

mod common;

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use common::*;
use xmx_hv::handoff::{recv_message, send_message};
use xmx_hv::{Error, ExportedPages, ExportedPort, Platform, DOM0};

/// Send an export through a socket pair and parse it back, as another process would.
fn through_socket<T>(
    body: &[u8],
    fds: &[std::os::fd::BorrowedFd<'_>],
    parse: impl FnOnce(&mut &[u8], &mut VecDeque<OwnedFd>) -> xmx_hv::Result<T>,
) -> T {
    let (a, b) = UnixStream::pair().unwrap();
    send_message(&a, body, fds).unwrap();
    let (got, fds) = recv_message(&b, 1 << 20).unwrap().unwrap();
    let mut fds: VecDeque<OwnedFd> = fds.into();
    let mut rest = &got[..];
    let v = parse(&mut rest, &mut fds).unwrap();
    assert!(rest.is_empty() && fds.is_empty());
    v
}

#[test]
fn exported_pages_are_the_granted_pages() {
    let host = FrontendTestHost::start();
    let domu = host.admin.create("g", None).unwrap();
    let guest = host.attach(domu);
    let gt = guest.grant_table().unwrap();
    let granted = gt.grant_pages(DOM0, 3, true).unwrap();
    // SAFETY: three writable pages granted and mapped in this process.
    unsafe { granted.as_ptr().add(4096 + 7).write(0x5a) };
    let export = granted.export().unwrap();
    let (mut body, mut fds) = (Vec::new(), Vec::new());
    export.emit(&mut body, &mut fds);
    let imported = through_socket(&body, &fds, ExportedPages::parse)
        .import()
        .unwrap();
    assert_eq!(imported.refs(), granted.refs());
    assert_eq!(imported.len(), 3 * 4096);
    // SAFETY: the import maps the same three pages, readable and writable.
    unsafe {
        assert_eq!(*imported.as_ptr().add(4096 + 7), 0x5a);
        imported.as_ptr().add(2 * 4096 + 1).write(0xa5);
    }
    // What the importer wrote is what the remote domain maps.
    let dom0 = host.attach(DOM0).grant_table().unwrap();
    let remote = Arc::new(dom0.map(domu, granted.refs(), false).unwrap());
    assert_eq!(read_mapped(&remote, 2 * 4096 + 1, 1), [0xa5]);
    assert_eq!(read_mapped(&remote, 4096 + 7, 1), [0x5a]);
    drop(remote);
    drop(imported);
    granted.end_access().map_err(|(_, e)| e).unwrap();
    assert!(host.state(domu).grants_active == 0);
}

#[test]
fn an_exported_port_delivers_to_the_importer_only() {
    let host = FrontendTestHost::start();
    let domu = host.admin.create("g", None).unwrap();
    let guest = host.attach(domu).event_channels().unwrap();
    let dom0 = host.attach(DOM0).event_channels().unwrap();
    let port = guest.alloc_unbound(DOM0).unwrap();
    let remote = dom0.bind_interdomain(domu, port).unwrap();
    let export = guest.export_port(port).unwrap();
    let (mut body, mut fds) = (Vec::new(), Vec::new());
    export.emit(&mut body, &mut fds);
    let imported = through_socket(&body, &fds, ExportedPort::parse)
        .import()
        .unwrap();
    assert_eq!(imported.port(), port);
    assert!(!imported.take_pending().unwrap());

    // Remote to importer; the exporter no longer takes the port's events.
    dom0.notify(remote).unwrap();
    assert!(imported.wait(Some(WAIT)).unwrap());
    assert!(!imported.take_pending().unwrap(), "consumed");
    let mut pending = Vec::new();
    guest.pending(&mut pending).unwrap();
    assert!(pending.is_empty(), "the exporter saw {pending:?}");
    assert!(matches!(guest.unmask(port), Err(Error::Invalid(_))));

    // Importer to remote.
    imported.notify().unwrap();
    let mut got = Vec::new();
    dom0.wait(&mut got, Some(WAIT)).unwrap();
    assert_eq!(got, vec![remote]);

    // The remote closes: the importer can tell, and notifying fails.
    dom0.close(remote).unwrap();
    assert!(imported.is_closed());
    assert!(matches!(imported.notify(), Err(Error::Closed(_))));
    guest.close(port).unwrap();
    assert_eq!(host.state(domu).ports_open, 0);
}

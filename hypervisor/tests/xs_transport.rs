//! `XsClient` transports chosen the way libxenstore chooses them: a unix socket, or a
//! character device speaking the same framing (here a FIFO stands in for
//! /dev/xen/xenbus: opened read-write, it hands every written message back, which is
//! a well-formed reply to itself).
//!
//! One test function: XENSTORED_PATH is process-wide.

use std::io::Write;
use std::os::unix::net::UnixListener;

use xmx_hv::xs::wire::{self, XsFrame};
use xmx_hv::xs::{XsClient, PATH_ENV};
use xmx_hv::{Error, Xenstore, XBT_NULL};

/// A server that answers every READ with the path read, reversed.
fn spawn_socket_server(listener: UnixListener) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut served = 0;
        while let Ok(Some(req)) = wire::read_frame(&mut s) {
            let path = wire::one_string(&req.payload).unwrap();
            let answer: Vec<u8> = path.bytes().rev().collect();
            let reply = XsFrame::with_raw_type(
                req.header.msg_type,
                req.header.req_id,
                req.header.tx_id,
                answer,
            )
            .unwrap();
            s.write_all(&reply.encode()).unwrap();
            served += 1;
        }
        served
    })
}

#[test]
fn socket_and_device_transports_and_env_selection() {
    let dir = tempfile::tempdir().unwrap();

    // A socket, named directly and through XENSTORED_PATH.
    let sock = dir.path().join("xenstored.sock");
    let server = spawn_socket_server(UnixListener::bind(&sock).unwrap());
    std::env::set_var(PATH_ENV, &sock);
    let c = XsClient::from_env().unwrap();
    assert_eq!(c.endpoint(), sock.display().to_string());
    assert_eq!(c.read(XBT_NULL, "/abc").unwrap(), b"cba/");
    drop(c);
    assert_eq!(server.join().unwrap(), 1);

    // A device: whole messages through read(2)/write(2) on one file.
    let fifo = dir.path().join("xenbus");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    std::env::set_var(PATH_ENV, &fifo);
    let dev = XsClient::from_env().unwrap();
    assert_eq!(dev.read(XBT_NULL, "/echo").unwrap(), b"/echo\0");
    for i in 0..50 {
        let p = format!("/k/{i}");
        let mut expected = p.clone().into_bytes();
        expected.push(0);
        assert_eq!(dev.read(XBT_NULL, &p).unwrap(), expected);
    }
    drop(dev);
    let direct = XsClient::open_device(&fifo).unwrap();
    assert_eq!(direct.read(XBT_NULL, "/d").unwrap(), b"/d\0");
    drop(direct);

    // Nothing there: a clean error, no hang.
    std::env::set_var(PATH_ENV, dir.path().join("absent"));
    assert!(matches!(XsClient::from_env(), Err(Error::Io(_))));
    std::env::remove_var(PATH_ENV);
    assert!(XsClient::connect_unix(dir.path().join("absent")).is_err());
}

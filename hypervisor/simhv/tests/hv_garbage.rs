//! Hostile clients on `hv.sock` and `ctl.sock` never disturb well-behaved ones.

mod hv_util;

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hv_util::SimHost;
use xmx_hv::sim::layout;
use xmx_hv::sim::proto::{self, SimRequest, SimResponse, VERSION};
use xmx_hv::sim::transport::{recv_frame, send_frame};
use xmx_hv::{Error, Platform, DOM0};

/// A well-behaved domain doing grant, map and event work in a loop until told to stop.
fn good_citizen(host: &SimHost, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    let a = host.create("good-a");
    let b = host.create("good-b");
    let pa = host.attach(a);
    let pb = host.attach(b);
    std::thread::spawn(move || {
        let gta = pa.grant_table().unwrap();
        let gtb = pb.grant_table().unwrap();
        let eva = pa.event_channels().unwrap();
        let evb = pb.event_channels().unwrap();
        let porta = eva.alloc_unbound(b).unwrap();
        let portb = evb.bind_interdomain(a, porta).unwrap();
        let mut rounds = 0usize;
        while !stop.load(Ordering::Relaxed) || rounds < 20 {
            let g = gta.grant_pages(b, 8, true).unwrap();
            // SAFETY: eight writable pages of ours.
            unsafe { std::ptr::write_bytes(g.as_ptr(), rounds as u8, 8 * 4096) };
            let m = gtb.map(a, g.refs(), false).unwrap();
            // SAFETY: the mapping holds eight readable pages.
            assert_eq!(unsafe { m.as_ptr().add(5 * 4096).read() }, rounds as u8);
            drop(m);
            g.end_access().map_err(|(_, e)| e).unwrap();
            eva.notify(porta).unwrap();
            let mut got = Vec::new();
            evb.wait(&mut got, Some(Duration::from_secs(20))).unwrap();
            assert_eq!(got, vec![portb]);
            evb.unmask(portb).unwrap();
            rounds += 1;
        }
        rounds
    })
}

fn connect_hv(host: &SimHost, domid: u16) -> UnixStream {
    UnixStream::connect(layout::hv_sock(host.path(), domid)).unwrap()
}

/// Send a raw body and read the raw reply (None if the daemon hung up).
fn exchange(s: &UnixStream, body: &[u8]) -> Option<Vec<u8>> {
    send_frame(s, body, &[]).ok()?;
    recv_frame(s, proto::MAX_FRAME)
        .ok()
        .flatten()
        .map(|(b, _)| b)
}

#[test]
fn garbage_on_hv_sock_leaves_other_domains_working() {
    let host = SimHost::start();
    let stop = Arc::new(AtomicBool::new(false));
    let worker = good_citizen(&host, stop.clone());
    let victim = host.create("hostile");

    // Random bytes, including an absurd length prefix: the daemon hangs up.
    let mut s = connect_hv(&host, victim);
    s.write_all(&[0xff, 0xff, 0xff, 0x7f, 1, 2, 3]).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(s.read(&mut buf).unwrap_or(0), 0);

    // A frame too short to hold a header: hang up.
    let s = connect_hv(&host, victim);
    assert!(exchange(&s, &[1, 0, 3]).is_none());

    // Unknown op: a protocol error reply, and the connection goes on.
    let s = connect_hv(&host, victim);
    let mut body = Vec::new();
    SimRequest::Hello.emit(9, &mut body);
    body[2] = 200;
    let reply = exchange(&s, &body).unwrap();
    let h = proto::ResponseHeader::parse(&reply).unwrap();
    assert_eq!(
        (h.seq, h.status),
        (9, proto::error_code(&Error::Protocol(String::new())))
    );
    // A truncated payload: error reply too.
    let mut body = Vec::new();
    SimRequest::Map {
        remote: DOM0,
        writable: true,
        refs: vec![1, 2, 3],
    }
    .emit(10, &mut body);
    body.truncate(body.len() - 3);
    let reply = exchange(&s, &body).unwrap();
    assert_ne!(proto::ResponseHeader::parse(&reply).unwrap().status, 0);
    // Still usable for a real request afterwards.
    let mut body = Vec::new();
    SimRequest::Hello.emit(11, &mut body);
    let (reply, fds) = {
        send_frame(&s, &body, &[]).unwrap();
        recv_frame(&s, proto::MAX_FRAME).unwrap().unwrap()
    };
    let (resp, nfds) = SimResponse::parse(&reply, proto::Op::Hello, 11).unwrap();
    assert!(matches!(resp, SimResponse::Hello { domid, .. } if domid == victim));
    assert_eq!((nfds, fds.len()), (1, 1));
    drop(s);

    // A wrong protocol version: error reply, then hang up.
    let s = connect_hv(&host, victim);
    let mut body = Vec::new();
    SimRequest::Hello.emit(1, &mut body);
    body[0..2].copy_from_slice(&(VERSION + 1).to_le_bytes());
    let reply = exchange(&s, &body).unwrap();
    assert_ne!(proto::ResponseHeader::parse(&reply).unwrap().status, 0);
    assert!(recv_frame(&s, proto::MAX_FRAME).unwrap().is_none());

    // Descriptors pushed at the daemon are dropped, not kept or used.
    let s = connect_hv(&host, victim);
    let (junk, _keep) = UnixStream::pair().unwrap();
    let mut body = Vec::new();
    SimRequest::Hello.emit(2, &mut body);
    send_frame(&s, &body, &[junk.as_fd()]).unwrap();
    assert!(recv_frame(&s, proto::MAX_FRAME).unwrap().is_some());
    drop(s);

    // Grants, ports and mappings made, then an abrupt close mid-frame.
    {
        let s = connect_hv(&host, victim);
        let mut body = Vec::new();
        SimRequest::GrantAlloc {
            remote: DOM0,
            writable: true,
            count: 16,
        }
        .emit(1, &mut body);
        assert!(exchange(&s, &body).is_some());
        let mut body = Vec::new();
        SimRequest::EvtchnOpen.emit(2, &mut body);
        assert!(exchange(&s, &body).is_some());
        let mut body = Vec::new();
        SimRequest::EvtchnAllocUnbound { remote: DOM0 }.emit(3, &mut body);
        assert!(exchange(&s, &body).is_some());
        assert_eq!(host.state(victim).grants_active, 16);
        assert_eq!(host.state(victim).ports_open, 1);
        let mut partial = (1000u32).to_le_bytes().to_vec();
        partial.extend_from_slice(&[1, 0, 2, 0]);
        (&s).write_all(&partial).unwrap();
    }
    // Hammer with many pseudo-random frames on fresh connections.
    let mut x: u64 = 0x2545f4914f6cdd1d;
    for _ in 0..200 {
        let s = connect_hv(&host, victim);
        let len = (x % 64) as usize;
        let mut frame = Vec::with_capacity(len);
        for _ in 0..len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            frame.push(x as u8);
        }
        if frame.len() >= 2 {
            frame[0] = 1;
            frame[1] = 0;
        }
        let _ = exchange(&s, &frame);
    }

    // Everything the hostile connections held is released once they are gone.
    host.settle(victim, |s| {
        s.hv_connections == 0 && s.grants_active == 0 && s.ports_open == 0 && s.mem_pages == 0
    });
    stop.store(true, Ordering::Relaxed);
    let rounds = worker.join().expect("the well-behaved domain failed");
    assert!(rounds >= 20);
}

#[test]
fn garbage_on_ctl_sock_gets_errors_and_does_not_stop_the_daemon() {
    let host = SimHost::start();
    let s = UnixStream::connect(layout::ctl_sock(host.path())).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut ask = |line: &[u8]| -> serde_json::Value {
        (&s).write_all(line).unwrap();
        let mut reply = String::new();
        r.read_line(&mut reply).unwrap();
        serde_json::from_str(&reply).unwrap()
    };
    for bad in [
        &b"not json\n"[..],
        b"{\"op\":\"explode\"}\n",
        b"{\"op\":\"destroy\",\"domid\":\"zero\"}\n",
        b"[1,2,3]\n",
        b"\xff\xfe\n",
    ] {
        let v = ask(bad);
        assert_eq!(v["ok"], false, "{v}");
        assert_eq!(v["error"]["kind"], "invalid", "{v}");
    }
    // The same connection still works.
    let v = ask(b"{\"op\":\"create\",\"name\":\"fine\"}\n");
    assert_eq!(v["ok"], true, "{v}");
    let domid = v["result"]["domid"].as_u64().unwrap() as u16;
    let v = ask(format!("{{\"op\":\"state\",\"domid\":{domid}}}\n").as_bytes());
    assert_eq!(v["result"]["name"], "fine");

    // An endless line ends that connection only.
    let hog = UnixStream::connect(layout::ctl_sock(host.path())).unwrap();
    let chunk = vec![b'x'; 64 * 1024];
    let mut sent = 0usize;
    while sent <= xmx_hv::daemon::control::MAX_LINE + chunk.len() {
        if (&hog).write_all(&chunk).is_err() {
            break;
        }
        sent += chunk.len();
    }
    let mut rest = String::new();
    let _ = BufReader::new(&hog).read_to_string(&mut rest);
    assert!(rest.contains("\"ok\":false"), "{rest}");

    // Abrupt closes mid-line. Each holds a seat until the daemon has seen it close, so a
    // later one may meet a full house and be refused as busy (closed after the refusal):
    // only the first MAX_CONNECTIONS - 2 (beside `s` and `hog`) are sure to be served.
    let sure = xmx_hv::daemon::control::MAX_CONNECTIONS - 2;
    for i in 0..20 {
        let c = UnixStream::connect(layout::ctl_sock(host.path())).unwrap();
        if let Err(e) = (&c).write_all(b"{\"op\":\"cre") {
            assert!(i >= sure, "connection {i} refused: {e}");
            assert!(
                matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset),
                "{e}"
            );
        }
    }
    assert_eq!(host.admin.list().unwrap().len(), 2);
    let p = host.attach(domid);
    let ev = p.event_channels().unwrap();
    assert!(ev.alloc_unbound(DOM0).is_ok());
}

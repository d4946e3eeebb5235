//! `xmx-frontd` as a process of a simulated guest, with the real backend in dom0 and the
//! test (or a child process) as the application.

mod common;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;

use common::*;
use nix::sys::signal::{kill, Signal};
use xmx_frontend::frontd::{FrontdClient, Notice};
use xmx_frontend::{EndpointChannel, Error, RegionCache, Wake};
use xmx_hv::DOM0;
use xmx_wire::msg::{
    DoneStatus, EndpointPages, Event, EventBody, InlineData, InlineMsg, MsgInfo, Pull, RndvSend,
    Route, SendOp, SendRequest,
};
use xmx_wire::xenbus::XenbusState;

const CHILD_ENV: &str = "XMX_TEST_CHILD_SOCKET";

fn geometry() -> EndpointPages {
    EndpointPages {
        send_ring: 1,
        event_ring: 1,
        send_queue: 4,
        recv_queue: 4,
    }
}

fn next_event(ch: &mut EndpointChannel) -> Event {
    match ch.wait_event(Some(WAIT), None).unwrap() {
        Wake::Event(ev) => ev,
        other => panic!("expected an event, got {other:?}"),
    }
}

fn msg_info(seqnum: u16) -> MsgInfo {
    MsgInfo {
        seqnum,
        piggyack: 0,
        match_info: 0x42,
    }
}

/// A TINY from `from` to `to` (endpoints of the same guest, peer 0), received and
/// completed.
fn tiny_between(from: &mut EndpointChannel, to: &mut EndpointChannel, tag: u32, bytes: &[u8]) {
    let route = Route {
        peer_index: 0,
        endpoint: to.endpoint(),
        session_id: to.session_id(),
    };
    from.send(&SendRequest {
        tag,
        route,
        op: SendOp::Tiny(InlineMsg {
            info: msg_info(tag as u16),
            data: InlineData::new(bytes).unwrap(),
        }),
    })
    .unwrap();
    match next_event(to).body {
        EventBody::RecvTiny { msg, .. } => assert_eq!(msg.data.as_slice(), bytes),
        other => panic!("expected a TINY, got {other:?}"),
    }
    to.release_events().unwrap();
    let done = next_event(from);
    assert_eq!(done.tag, tag);
    assert!(matches!(
        done.body,
        EventBody::SendDone {
            status: DoneStatus::Success,
            ..
        }
    ));
    from.release_events().unwrap();
}

#[test]
fn an_application_gets_endpoints_and_cached_regions_through_the_daemon() {
    let host = GuestsTestHost::start();
    let g = host.guest("g1", 1);
    let frontd = host.frontd(g, &[]);
    let mut client = FrontdClient::connect(&frontd.socket).unwrap();
    let info = client.info().unwrap();
    assert!(info.connected);
    assert_eq!(
        (info.domid, info.mac, info.hostname.as_str()),
        (g, guest_mac(1), "g1:0")
    );
    assert_eq!((info.max_endpoints, info.max_regions), (32, 256));

    let mut c0 = client.open_endpoint(None, Some(geometry())).unwrap();
    let mut c1 = client.open_endpoint(None, Some(geometry())).unwrap();
    assert_eq!((c0.endpoint(), c1.endpoint()), (0, 1));
    assert!(matches!(
        client.open_endpoint(Some(1), None),
        Err(Error::Refused { .. })
    ));
    assert_eq!(host.guest_report(g).endpoints, vec![0, 1]);
    tiny_between(&mut c0, &mut c1, 1, b"through the daemon's hand-off");

    // LARGE through windows the registration cache keeps registered.
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    let mut sink = vec![0u8; data.len()];
    let mut cache = RegionCache::new(true, 8);
    let base = host.ctrl_requests(g);
    for round in 0..3u32 {
        let src = cache
            .acquire(&mut client, 0, data.as_ptr() as usize, data.len())
            .unwrap();
        let dst = cache
            .acquire(&mut client, 1, sink.as_mut_ptr() as usize, sink.len())
            .unwrap();
        let (src_id, dst_id) = {
            let w = cache.window(src).unwrap();
            w.write(0, &data).unwrap();
            (w.region_id(), cache.window(dst).unwrap().region_id())
        };
        c0.set_fill_mark(src_id, true);
        c0.send(&SendRequest {
            tag: 100 + round,
            route: Route {
                peer_index: 0,
                endpoint: 1,
                session_id: c1.session_id(),
            },
            op: SendOp::Rndv(RndvSend {
                info: msg_info(2 + round as u16),
                length: data.len() as u32,
                region_id: src_id,
                region_seqnum: round as u8,
                region_offset: 0,
            }),
        })
        .unwrap();
        let EventBody::RecvRndv { from, rndv } = next_event(&mut c1).body else {
            panic!("expected a RNDV");
        };
        c1.release_events().unwrap();
        c1.send(&SendRequest {
            tag: 200 + round,
            route: Route {
                peer_index: from.peer_index,
                endpoint: from.endpoint,
                session_id: c0.session_id(),
            },
            op: SendOp::Pull(Pull {
                length: rndv.length,
                local_region: dst_id,
                local_offset: 0,
                remote_region: rndv.region_id,
                remote_region_seqnum: rndv.region_seqnum,
                remote_offset: 0,
            }),
        })
        .unwrap();
        let done = next_event(&mut c1);
        assert_eq!(
            done.body,
            EventBody::PullDone {
                status: DoneStatus::Success,
                length: data.len() as u32
            }
        );
        c1.release_events().unwrap();
        cache.window(dst).unwrap().read(0, &mut sink).unwrap();
        assert!(
            sink == data,
            "round {round}: the LARGE message arrived intact"
        );
        sink.fill(0);
        cache.release(&mut client, src).unwrap();
        cache.release(&mut client, dst).unwrap();
    }
    // MX_RCACHE=1: two registrations for three messages each way.
    assert_eq!(host.ctrl_requests(g) - base, 2);
    assert_eq!(cache.stats().hits, 4);
    assert_eq!(host.guest_report(g).regions, 2);

    // Invalidation: the source buffer changed, its window is deregistered.
    assert_eq!(
        cache
            .invalidate(&mut client, data.as_ptr() as usize, 1)
            .unwrap(),
        1
    );
    assert_eq!(host.ctrl_requests(g) - base, 3);
    assert_eq!(host.guest_report(g).regions, 1);
    cache.flush(&mut client).unwrap();

    // MX_RCACHE=0: every message registers and deregisters.
    let mut off = RegionCache::new(false, 8);
    let before = host.ctrl_requests(g);
    for _ in 0..3 {
        let l = off
            .acquire(&mut client, 0, data.as_ptr() as usize, data.len())
            .unwrap();
        off.window(l).unwrap().write(0, &data[..1000]).unwrap();
        off.release(&mut client, l).unwrap();
    }
    assert_eq!(host.ctrl_requests(g) - before, 6);
    assert_eq!(host.guest_report(g).regions, 0);

    client.close_endpoint(c0).unwrap();
    client.close_endpoint(c1).unwrap();
    assert!(host.guest_report(g).endpoints.is_empty());
    let s = host.state(g);
    assert_eq!(
        (s.grants_active, s.ports_open),
        (1, 1),
        "the control ring only"
    );
    assert_eq!(host.state(DOM0).mappings_held, 1);
}

/// Run as a child process by `a_killed_application_has_its_endpoints_closed`.
/// A registration that fails for want of grants makes the daemon tell every application,
/// the asking one included (its other endpoints may hold unused windows): each gives back
/// what its registration caches keep unused. The asker reads the notice while it waits
/// for its reply; the client's queued-notice descriptor then says so to whoever watches.
/// Failures in a row are told at most once per 50 ms.
#[test]
fn a_guest_short_of_grants_asks_every_application_for_unused_windows() {
    // Enough grants for the device, two endpoints and one window of 1 MiB (257 pages),
    // not two.
    let host = GuestsTestHost::start_with(SimhvConfig {
        max_grants: 700,
        ..SimhvConfig::default()
    });
    let g = host.guest("g1", 1);
    let frontd = host.frontd(g, &[]);
    let mut asker = FrontdClient::connect(&frontd.socket).unwrap();
    let mut other = FrontdClient::connect(&frontd.socket).unwrap();
    let a = asker.open_endpoint(None, Some(geometry())).unwrap();
    let _b = other.open_endpoint(None, Some(geometry())).unwrap();
    let readable = |fd: std::os::fd::BorrowedFd<'_>| {
        let mut fds = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLIN)];
        nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).unwrap() == 1
    };
    let mut windows = Vec::new();
    let failed = loop {
        match asker.register_region(a.endpoint(), 1 << 20) {
            Ok(w) => windows.push(w),
            Err(e) => break e,
        }
        assert!(windows.len() < 8, "the grant table never ran out");
    };
    // The platform's refusal, named across the socket.
    assert!(failed.to_string().contains("quota exceeded"), "{failed}");
    assert!(!windows.is_empty());
    // The asker's notice came before its reply: queued, and said so.
    assert!(readable(asker.queued_fd()));
    let got = asker.poll_notices().unwrap();
    assert!(matches!(got[..], [Notice::GrantsShort]), "{got:?}");
    assert!(!readable(asker.queued_fd()));
    match other.wait_notice(WAIT).unwrap() {
        Some(Notice::GrantsShort) => {}
        n => panic!("the other application was told {n:?}"),
    }
    // A receive waiting for room asks again every few milliseconds: the applications
    // are not told every time (one that does not read its socket would fill it).
    let start = std::time::Instant::now();
    for _ in 0..20 {
        assert!(asker.register_region(a.endpoint(), 1 << 20).is_err());
    }
    let took = start.elapsed();
    let told = asker.poll_notices().unwrap().len() as u128;
    assert!(
        told <= 1 + took.as_millis() / 50,
        "told {told} times in {took:?}"
    );
    // Room given back serves the next registration.
    asker.deregister_region(windows.pop().unwrap()).unwrap();
    windows.push(asker.register_region(a.endpoint(), 1 << 20).unwrap());
    for w in windows {
        asker.deregister_region(w).unwrap();
    }
}

#[test]
fn child_application() {
    let Ok(socket) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut client = FrontdClient::connect(Path::new(&socket)).unwrap();
    let c0 = client.open_endpoint(None, Some(geometry())).unwrap();
    let c1 = client.open_endpoint(None, Some(geometry())).unwrap();
    let w = client.register_region(c0.endpoint(), 50_000).unwrap();
    w.write(0, b"still here").unwrap();
    println!("\nxmx-child-ready");
    std::io::stdout().flush().unwrap();
    // Stay until killed: the parent keeps our stdin open.
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    drop((c0, c1, w, client));
}

#[test]
fn a_killed_application_has_its_endpoints_closed() {
    let host = GuestsTestHost::start();
    let g = host.guest("g1", 1);
    let frontd = host.frontd(g, &[]);
    let socket = frontd.socket.display().to_string();
    let (mut child, mut out) = spawn_child_test("child_application", &[(CHILD_ENV, socket)]);
    read_until_line(&mut out, "xmx-child-ready");
    let r = host.guest_report(g);
    assert_eq!((r.endpoints.len(), r.regions), (2, 1));
    let pages = 2 * geometry().total() + 50_000usize.div_ceil(4096);
    assert_eq!(host.state(DOM0).mappings_held, 1 + pages);

    kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        Signal::SIGKILL,
    )
    .unwrap();
    child.wait().unwrap();
    eventually("the daemon closes the dead application's endpoints", || {
        let r = host.guest_report(g);
        r.endpoints.is_empty() && r.regions == 0
    });
    eventually("every grant but the control ring's ends", || {
        let s = host.state(g);
        s.grants_active == 1 && s.ports_open == 1 && host.state(DOM0).mappings_held == 1
    });
    // The daemon still serves others.
    let mut client = FrontdClient::connect(&frontd.socket).unwrap();
    let c = client.open_endpoint(Some(0), Some(geometry())).unwrap();
    client.close_endpoint(c).unwrap();
}

#[test]
fn suspend_and_resume_hand_the_application_its_reopened_endpoints() {
    let host = GuestsTestHost::start();
    let g = host.guest("g1", 1);
    let frontd = host.frontd(g, &[]);
    let mut client = FrontdClient::connect(&frontd.socket).unwrap();
    let mut c0 = client.open_endpoint(Some(0), Some(geometry())).unwrap();
    let mut c1 = client.open_endpoint(Some(1), Some(geometry())).unwrap();
    tiny_between(&mut c0, &mut c1, 1, b"before");
    let window = client.register_region(c0.endpoint(), 8192).unwrap();

    host.admin.suspend(g).unwrap();
    let xs = host.xs0();
    wait_front_state(xs.as_ref(), g, XenbusState::Closed);
    assert_eq!(
        host.state(DOM0).mappings_held,
        0,
        "the backend let go of everything"
    );
    // The application's endpoint goes quiet: its port is closed.
    loop {
        match c0.wait_event(Some(WAIT), Some(client.fd())).unwrap() {
            Wake::Disconnected => break,
            Wake::Other => {
                let notices = client.poll_notices().unwrap();
                assert!(
                    notices.iter().all(|n| matches!(n, Notice::Disconnected)),
                    "{notices:?}"
                );
            }
            other => panic!("expected a disconnection, got {other:?}"),
        }
    }

    host.admin.resume(g).unwrap();
    let mut remapped = 0;
    while remapped < 2 {
        match client.wait_notice(WAIT).unwrap() {
            Some(Notice::EndpointReopened(h)) => {
                assert_eq!(h.generation, 1);
                assert!(h.regions_kept, "the region is registered again");
                assert!(!h.regions_moved, "over the same pages");
                let ch = if h.endpoint == 0 { &mut c0 } else { &mut c1 };
                client.remap(ch, h).unwrap();
                remapped += 1;
            }
            Some(Notice::Disconnected) | Some(Notice::Connected) => {}
            other => panic!("unexpected notice {other:?}"),
        }
    }
    // The old pages were released when the application said it remapped; the region's
    // two pages stay.
    let s = host.state(g);
    assert_eq!(s.grants_active, 1 + 2 * geometry().total() + 2);
    tiny_between(&mut c0, &mut c1, 2, b"after resume");
    assert_eq!(c0.generation(), 1);
    // The window is still the application's: it deregisters it like any other.
    client.deregister_region(window).unwrap();
    assert_eq!(host.state(g).grants_active, 1 + 2 * geometry().total());
}

#[test]
fn sigterm_tells_the_applications_and_closes_the_device() {
    let host = GuestsTestHost::start();
    let g = host.guest("g1", 1);
    let mut frontd = host.frontd(g, &["--drain-ms", "10000"]);
    let mut client = FrontdClient::connect(&frontd.socket).unwrap();
    let c0 = client.open_endpoint(None, Some(geometry())).unwrap();
    kill(frontd.pid(), Signal::SIGTERM).unwrap();
    match client.wait_notice(WAIT).unwrap() {
        Some(Notice::Shutdown) => {}
        other => panic!("expected the shutdown notice, got {other:?}"),
    }
    // The application lets go; the daemon then closes the device and exits.
    drop(c0);
    drop(client);
    let status = wait_child(frontd.child.take().unwrap());
    assert!(status.success(), "{status:?}");
    let xs = host.xs0();
    assert_eq!(front_state(xs.as_ref(), g), Some(XenbusState::Closed));
    // The daemon ended its grants and closed its ports itself before exiting.
    let s = host.state(g);
    assert_eq!((s.grants_active, s.ports_open), (0, 0));
    assert_eq!(host.state(DOM0).mappings_held, 0);
    assert!(!frontd.socket.exists(), "the socket is removed");
    // The simulator notices the exited process's connections on its own threads.
    eventually("the daemon's hypervisor connections close", || {
        host.state(g).hv_connections == 0
    });
}

#[test]
fn a_malformed_request_drops_only_that_application() {
    let host = GuestsTestHost::start();
    let g = host.guest("g1", 1);
    let frontd = host.frontd(g, &[]);
    let mut good = FrontdClient::connect(&frontd.socket).unwrap();
    let c = good.open_endpoint(None, Some(geometry())).unwrap();

    let mut bad = UnixStream::connect(&frontd.socket).unwrap();
    bad.write_all(&6u32.to_le_bytes()).unwrap();
    bad.write_all(&[9, 9, 9, 9, 9, 9]).unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(
        std::io::Read::read(&mut bad, &mut buf).unwrap(),
        0,
        "dropped"
    );
    let mut huge = UnixStream::connect(&frontd.socket).unwrap();
    huge.write_all(&u32::MAX.to_le_bytes()).unwrap();
    assert_eq!(
        std::io::Read::read(&mut huge, &mut buf).unwrap(),
        0,
        "dropped"
    );

    assert!(good.info().unwrap().connected);
    good.close_endpoint(c).unwrap();
    // An application cannot use another one's endpoint.
    let mut other = FrontdClient::connect(&frontd.socket).unwrap();
    let theirs = other.open_endpoint(None, Some(geometry())).unwrap();
    let mut mine = FrontdClient::connect(&frontd.socket).unwrap();
    assert!(matches!(
        mine.register_region(theirs.endpoint(), 4096),
        Err(Error::Invalid(_))
    ));
    other.close_endpoint(theirs).unwrap();
}

#[test]
fn the_daemon_has_help() {
    let out = Command::new(env!("CARGO_BIN_EXE_xmx-frontd"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--socket",
        "--devid",
        "--drain-ms",
        "--no-rcache",
        "--endpoint-pages",
    ] {
        assert!(text.contains(flag), "{flag} missing from --help");
    }
}

#[test]
fn the_daemon_follows_a_detach_and_reattach_into_another_cluster() {
    use xmx_backend::admin::{BackdRequest, PeerSpec};
    use xmx_backend::xenbus::toolstack::{self, DeviceSpec};
    let host = GuestsTestHost::start();
    let g = host.guest("g1", 1);
    let frontd = host.frontd(g, &[]);
    let mut client = FrontdClient::connect(&frontd.socket).unwrap();
    assert_eq!(client.info().unwrap().cluster, 1);
    let mut c0 = client.open_endpoint(Some(0), Some(geometry())).unwrap();
    let mut c1 = client.open_endpoint(Some(1), Some(geometry())).unwrap();
    tiny_between(&mut c0, &mut c1, 1, b"before");

    // dom0 moves the guest: the device goes, and comes back with another cluster.
    let xs = host.xs0();
    toolstack::detach(xs.as_ref(), DOM0, g, 0).unwrap();
    eventually("the backend lets go of the guest", || {
        host.state(DOM0).mappings_held == 0
    });
    let peers = vec![PeerSpec {
        index: 0,
        mac: guest_mac(1).to_string(),
        hostname: "g1:0".into(),
        cluster: 2,
    }];
    host.backend()
        .control()
        .call(BackdRequest::SetPeers { peers })
        .into_result()
        .unwrap();
    let spec = DeviceSpec {
        domu: g,
        devid: 0,
        mac: guest_mac(1),
        cluster: 2,
        hostname: "g1:0".into(),
    };
    toolstack::attach(xs.as_ref(), DOM0, &spec).unwrap();
    let mut remapped = 0;
    while remapped < 2 {
        match client.wait_notice(WAIT).unwrap() {
            Some(Notice::EndpointReopened(h)) => {
                let ch = if h.endpoint == 0 { &mut c0 } else { &mut c1 };
                client.remap(ch, h).unwrap();
                remapped += 1;
            }
            Some(Notice::Disconnected) | Some(Notice::Connected) => {}
            other => panic!("unexpected notice {other:?}"),
        }
    }
    // The daemon still runs, with the identity dom0 gave, and the endpoints work.
    let info = client.info().unwrap();
    assert!(info.connected);
    assert_eq!((info.cluster, info.mac), (2, guest_mac(1)));
    tiny_between(&mut c0, &mut c1, 2, b"after the move");
    assert_eq!(c0.generation(), 1);
}

#[test]
fn sigterm_stops_a_daemon_still_waiting_for_its_device() {
    let host = GuestsTestHost::start();
    // A domain without the device: the daemon waits for it, and a SIGTERM ends the wait.
    let g = host.admin.create("bare", None).unwrap();
    let socket = host.path().join("bare.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_xmx-frontd"))
        .arg("--socket")
        .arg(&socket)
        .args(["--device-timeout", "600"])
        .env("XMX_PLATFORM", "sim")
        .env("XMX_SIM_DIR", host.path())
        .env("XMX_DOMID", g.to_string())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut frontd = FrontdProcess {
        child: Some(child),
        socket,
        domid: g,
    };
    // Its watch on the device node shows it is waiting.
    eventually("the daemon watches for its device", || {
        host.state(g).xenstore.watches > 0
    });
    let status = frontd.terminate();
    assert!(status.success(), "{status:?}");
}

#[test]
fn a_migrated_guest_daemon_follows_its_domain_and_hands_the_application_its_reopened_endpoints() {
    use xmx_hv::sim::migrate::{migrate_domain, MigrateOptions};
    let src = GuestsTestHost::start();
    let g = src.guest("g1", 1);
    let frontd = src.frontd(g, &[]);
    let mut client = FrontdClient::connect(&frontd.socket).unwrap();
    let mut c0 = client.open_endpoint(Some(0), Some(geometry())).unwrap();
    let mut c1 = client.open_endpoint(Some(1), Some(geometry())).unwrap();
    tiny_between(&mut c0, &mut c1, 1, b"before");

    let dst = GuestsTestHost::start();
    // So that the guest gets another domid there.
    dst.admin.create("other", None).unwrap();
    let work = tempfile::tempdir().unwrap();
    let options = MigrateOptions {
        work_dir: Some(work.path().to_path_buf()),
        ..MigrateOptions::default()
    };
    let report = migrate_domain(&src.admin, &dst.admin, g, &options).unwrap();
    let d = report.dest_domid;
    assert_ne!(d, g);
    // The daemon acknowledged the suspend after its device was down: the backend had
    // let go before the last round.
    assert_eq!(report.rounds.last().unwrap().grants_still_mapped, 0);
    // The new host's toolstack creates the device; the daemon, having followed its
    // domain, connects to it.
    dst.device(d, "g1", 1);
    wait_front_state(dst.xs0().as_ref(), d, XenbusState::Connected);
    let mut remapped = 0;
    while remapped < 2 {
        match client.wait_notice(WAIT).unwrap() {
            Some(Notice::EndpointReopened(h)) => {
                assert_eq!(h.generation, 1);
                let ch = if h.endpoint == 0 { &mut c0 } else { &mut c1 };
                client.remap(ch, h).unwrap();
                remapped += 1;
            }
            Some(Notice::Disconnected) | Some(Notice::Connected) => {}
            other => panic!("unexpected notice {other:?}"),
        }
    }
    // The pages that moved were adopted on the new host and ended there once remapped.
    eventually("the old pages ended", || {
        dst.state(d).grants_active == 1 + 2 * geometry().total()
    });
    tiny_between(&mut c0, &mut c1, 2, b"after the move");
    assert_eq!(c0.generation(), 1);
    let mut frontd = frontd;
    assert!(
        frontd.child.as_mut().unwrap().try_wait().unwrap().is_none(),
        "the daemon runs on"
    );
    drop((c0, c1, client));
    assert!(frontd.terminate().success());
    let s = dst.state(d);
    assert_eq!((s.grants_active, s.ports_open), (0, 0));
}

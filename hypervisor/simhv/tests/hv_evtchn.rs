//! Event channels on the simulated host: binding, notification, masking, closing.

mod hv_util;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::time::Duration;

use hv_util::SimHost;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use xmx_hv::sim::PortStatus;
use xmx_hv::{Error, EventChannels, Platform, Port, DOM0};

/// Long enough never to expire on a loaded machine; waits end on the event.
const WAIT: Option<Duration> = Some(Duration::from_secs(20));

fn wait_for(ev: &dyn EventChannels, port: Port) {
    let mut got = Vec::new();
    ev.wait(&mut got, WAIT).unwrap();
    assert_eq!(got, vec![port]);
}

fn pending(ev: &dyn EventChannels) -> Vec<Port> {
    let mut got = Vec::new();
    ev.pending(&mut got).unwrap();
    got
}

fn readable(ev: &dyn EventChannels) -> bool {
    // SAFETY: the fd belongs to `ev`, which outlives this call.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(ev.fd()) };
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::ZERO).unwrap() == 1
}

#[test]
fn ports_bind_and_notify_both_ways() {
    let host = SimHost::start();
    let g = host.create("guest");
    let guest = host.attach(g);
    let dom0 = host.attach(DOM0);
    let ev0 = dom0.event_channels().unwrap();
    let evg = guest.event_channels().unwrap();

    let p0 = ev0.alloc_unbound(g).unwrap();
    let pg = evg.bind_interdomain(DOM0, p0).unwrap();
    assert_eq!(host.state(DOM0).ports_open, 1);
    assert_eq!(host.state(g).ports_open, 1);

    ev0.notify(p0).unwrap();
    wait_for(&*evg, pg);
    evg.unmask(pg).unwrap();
    evg.notify(pg).unwrap();
    wait_for(&*ev0, p0);

    // A notifier works from another thread without the handle.
    let n = evg.notifier(pg).unwrap();
    std::thread::spawn(move || n.notify().unwrap())
        .join()
        .unwrap();
    ev0.unmask(p0).unwrap();
    wait_for(&*ev0, p0);

    let sim0 = dom0.sim_event_channels().unwrap();
    let q0 = sim0.alloc_unbound(g).unwrap();
    assert_eq!(sim0.status(q0).unwrap(), PortStatus::Unbound { remote: g });
}

#[test]
fn delivery_masks_the_port_until_unmask() {
    let host = SimHost::start();
    let g = host.create("guest");
    let ev0 = host.attach(DOM0).event_channels().unwrap();
    let evg = host.attach(g).event_channels().unwrap();
    let p0 = ev0.alloc_unbound(g).unwrap();
    let pg = evg.bind_interdomain(DOM0, p0).unwrap();

    assert!(pending(&*evg).is_empty());
    assert!(!readable(&*evg));
    // Two notifications before delivery are one pending event.
    ev0.notify(p0).unwrap();
    ev0.notify(p0).unwrap();
    assert!(readable(&*evg));
    assert_eq!(pending(&*evg), vec![pg]);
    assert!(pending(&*evg).is_empty());
    assert!(!readable(&*evg));
    // Masked: a new notification is not reported...
    ev0.notify(p0).unwrap();
    assert!(pending(&*evg).is_empty());
    assert!(!readable(&*evg));
    // ...until unmask, which reports it at once.
    evg.unmask(pg).unwrap();
    assert!(readable(&*evg));
    assert_eq!(pending(&*evg), vec![pg]);
    // Unmasking with nothing pending reports nothing.
    evg.unmask(pg).unwrap();
    assert!(pending(&*evg).is_empty());
    assert!(matches!(evg.unmask(pg + 100), Err(Error::NotFound(_))));
    // A timed wait with nothing pending returns empty.
    let mut got = Vec::new();
    evg.wait(&mut got, Some(Duration::from_millis(1))).unwrap();
    assert!(got.is_empty());
}

#[test]
fn notifications_before_the_bind_are_dropped() {
    let host = SimHost::start();
    let g = host.create("guest");
    let ev0 = host.attach(DOM0).event_channels().unwrap();
    let evg = host.attach(g).event_channels().unwrap();
    let p0 = ev0.alloc_unbound(g).unwrap();
    ev0.notify(p0).unwrap();
    let pg = evg.bind_interdomain(DOM0, p0).unwrap();
    assert!(pending(&*evg).is_empty());
    ev0.notify(p0).unwrap();
    assert_eq!(pending(&*evg), vec![pg]);
}

#[test]
fn binding_needs_an_unbound_port_offered_to_the_caller() {
    let host = SimHost::start();
    let a = host.create("a");
    let b = host.create("b");
    let c = host.create("c");
    let eva = host.attach(a).event_channels().unwrap();
    let evb = host.attach(b).event_channels().unwrap();
    let evc = host.attach(c).event_channels().unwrap();
    let pa = eva.alloc_unbound(b).unwrap();

    // Offered to b, not c.
    assert!(matches!(
        evc.bind_interdomain(a, pa),
        Err(Error::Invalid(_))
    ));
    // The right port number but the wrong domain.
    assert!(matches!(
        evb.bind_interdomain(c, pa),
        Err(Error::Invalid(_))
    ));
    // No such port.
    assert!(matches!(
        evb.bind_interdomain(a, pa + 50),
        Err(Error::Invalid(_))
    ));
    // No such domain.
    assert!(matches!(
        evb.bind_interdomain(77, 1),
        Err(Error::NotFound(_))
    ));
    let pb = evb.bind_interdomain(a, pa).unwrap();
    // Already bound.
    assert!(matches!(
        evb.bind_interdomain(a, pa),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        evc.bind_interdomain(b, pb),
        Err(Error::Invalid(_))
    ));
    // Closing a port this handle does not hold.
    assert!(matches!(evc.close(pa), Err(Error::NotFound(_))));
    assert_eq!(host.state(c).ports_open, 0);
}

#[test]
fn the_peer_sees_a_close_and_the_port_can_be_bound_again() {
    let host = SimHost::start();
    let g = host.create("guest");
    let dom0 = host.attach(DOM0);
    let guest = host.attach(g);
    let ev0 = dom0.event_channels().unwrap();
    let evg = guest.sim_event_channels().unwrap();
    let p0 = ev0.alloc_unbound(g).unwrap();
    let pg = evg.bind_interdomain(DOM0, p0).unwrap();
    let stale = ev0.notifier(p0).unwrap();

    ev0.close(p0).unwrap();
    // The guest is woken, and the port is no longer connected.
    wait_for(&evg, pg);
    assert!(matches!(evg.notify(pg), Err(Error::Closed(_))));
    assert_eq!(
        evg.status(pg).unwrap(),
        PortStatus::Unbound { remote: DOM0 }
    );
    assert!(matches!(stale.notify(), Err(Error::Closed(_))));
    assert!(matches!(ev0.notify(p0), Err(Error::NotFound(_))));
    assert_eq!(host.state(DOM0).ports_open, 0);

    // As in Xen, the surviving end is unbound for the old peer, which may bind again.
    let p0b = ev0.bind_interdomain(g, pg).unwrap();
    assert_eq!(
        evg.status(pg).unwrap(),
        PortStatus::Interdomain {
            remote: DOM0,
            remote_port: p0b
        }
    );
    evg.unmask(pg).unwrap();
    ev0.notify(p0b).unwrap();
    wait_for(&evg, pg);
    evg.notify(pg).unwrap();
    wait_for(&*ev0, p0b);
}

#[test]
fn dropping_a_handle_closes_its_ports() {
    let host = SimHost::start();
    let g = host.create("guest");
    let evg = host.attach(g).sim_event_channels().unwrap();
    let pg = {
        let ev0 = host.attach(DOM0).event_channels().unwrap();
        let p0 = ev0.alloc_unbound(g).unwrap();
        evg.bind_interdomain(DOM0, p0).unwrap()
    };
    // The daemon notices the handle's end and wakes the peer.
    wait_for(&evg, pg);
    assert!(matches!(evg.notify(pg), Err(Error::Closed(_))));
    host.settle(DOM0, |s| s.ports_open == 0 && s.hv_connections == 0);
}

#[test]
fn port_quota_is_enforced() {
    let host = SimHost::start_with(xmx_simhv::SimhvConfig {
        max_ports: 2,
        ..Default::default()
    });
    let g = host.create("guest");
    let evg = host.attach(g).event_channels().unwrap();
    evg.alloc_unbound(DOM0).unwrap();
    let p = evg.alloc_unbound(DOM0).unwrap();
    assert!(matches!(evg.alloc_unbound(DOM0), Err(Error::Quota(_))));
    evg.close(p).unwrap();
    evg.alloc_unbound(DOM0).unwrap();
}

/// Role process of the next test: bind to the offered port, then ping-pong.
#[test]
fn role_evtchn_peer() {
    if !hv_util::is_role("role_evtchn_peer") {
        return;
    }
    let platform = xmx_hv::platform::from_env().unwrap();
    let remote_port: Port = hv_util::role_env("XMX_TEST_PORT").parse().unwrap();
    let ev = platform.event_channels().unwrap();
    let port = ev.bind_interdomain(DOM0, remote_port).unwrap();
    let mut out = std::io::stdout();
    writeln!(out, "bound {port}").unwrap();
    out.flush().unwrap();
    for _ in 0..100 {
        let mut got = Vec::new();
        while got.is_empty() {
            ev.wait(&mut got, None).unwrap();
        }
        assert_eq!(got, vec![port]);
        ev.unmask(port).unwrap();
        ev.notify(port).unwrap();
    }
}

#[test]
fn notifications_cross_processes() {
    let host = SimHost::start();
    let g = host.create("guest");
    let ev0 = host.attach(DOM0).event_channels().unwrap();
    let p0 = ev0.alloc_unbound(g).unwrap();
    let mut child = hv_util::spawn_role(
        "role_evtchn_peer",
        &host,
        g,
        &[("XMX_TEST_PORT", p0.to_string())],
    );
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let bound = loop {
        let line = lines.next().expect("role process ended early").unwrap();
        // libtest prints "test NAME ... " before the role's own output on the same line.
        if let Some(at) = line.find("bound ") {
            break line[at + 6..].trim().parse::<Port>().unwrap();
        }
    };
    for _ in 0..100 {
        ev0.notify(p0).unwrap();
        wait_for(&*ev0, p0);
        ev0.unmask(p0).unwrap();
    }
    let status = child.wait().unwrap();
    assert!(status.success());
    assert!(bound >= 1);
}

/// Not a check: prints the event round-trip time between two threads through sim event
/// channels and through a bare eventfd pair, for comparison. Run with `--ignored`.
#[test]
#[ignore]
fn measure_event_round_trip() {
    use std::time::Instant;
    const ROUNDS: u32 = 20_000;
    let host = SimHost::start();
    let g = host.create("guest");
    let ev0 = host.attach(DOM0).event_channels().unwrap();
    let evg = host.attach(g).event_channels().unwrap();
    let p0 = ev0.alloc_unbound(g).unwrap();
    let pg = evg.bind_interdomain(DOM0, p0).unwrap();
    let echo = std::thread::spawn(move || {
        let mut got = Vec::new();
        for _ in 0..ROUNDS {
            got.clear();
            while got.is_empty() {
                evg.wait(&mut got, None).unwrap();
            }
            evg.unmask(pg).unwrap();
            evg.notify(pg).unwrap();
        }
    });
    let start = Instant::now();
    let mut got = Vec::new();
    for _ in 0..ROUNDS {
        ev0.notify(p0).unwrap();
        got.clear();
        while got.is_empty() {
            ev0.wait(&mut got, None).unwrap();
        }
        ev0.unmask(p0).unwrap();
    }
    let sim = start.elapsed() / ROUNDS;
    echo.join().unwrap();

    let a = nix::sys::eventfd::EventFd::new().unwrap();
    let b = nix::sys::eventfd::EventFd::new().unwrap();
    let (a2, b2) = (
        a.as_fd().try_clone_to_owned().unwrap(),
        b.as_fd().try_clone_to_owned().unwrap(),
    );
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 8];
        for _ in 0..ROUNDS {
            nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(&a2), &mut buf).unwrap();
            nix::unistd::write(&b2, &1u64.to_ne_bytes()).unwrap();
        }
    });
    let start = Instant::now();
    let mut buf = [0u8; 8];
    for _ in 0..ROUNDS {
        a.write(1).unwrap();
        nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(&b), &mut buf).unwrap();
    }
    let raw = start.elapsed() / ROUNDS;
    echo.join().unwrap();
    println!(
        "event round trip: sim evtchn {sim:?}, bare eventfd {raw:?}, ratio {:.2}",
        sim.as_secs_f64() / raw.as_secs_f64()
    );
}

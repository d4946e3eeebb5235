//! The driver thread: what the frontend's interrupt handler would do.
//!
//! It sleeps in `poll` on every open endpoint's event-channel port, the guest
//! daemon's socket (notices), the xenstore watch on the peer view and a wake
//! descriptor. Before sleeping it takes in what each endpoint's event ring
//! holds and arms the ring (ring.h's final check), so the backend signals
//! the port at the next event; what it takes in rings the endpoint's
//! doorbell. It never spins: on few cores the application's own wait already
//! does, and a second spinner only steals the core the backend needs. While
//! an application thread polls an endpoint, the driver leaves that ring
//! unarmed (the thread arms it before it sleeps) and looks again shortly.

use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::port::EndpointShared;
use super::windows::Daemon;
use super::Shared;

/// What a polled descriptor stands for.
enum Source {
    Wake,
    Daemon,
    PeerView,
    Port(Arc<EndpointShared>),
}

/// How long the driver sleeps, at most, while it left an endpoint's ring
/// unarmed because an application thread polled it: the thread may stop
/// polling without sleeping (it returned to the application), and then the
/// driver arms the ring so arrivals still progress the endpoint.
const UNARMED_RECHECK_MS: libc::c_int = 1;

/// Waits until one of `fds` is ready or `timeout_ms` passes (-1: never);
/// returns their `revents` (all zero when interrupted or timed out).
fn wait(fds: &[RawFd], timeout_ms: libc::c_int) -> Vec<libc::c_short> {
    let mut polled: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `polled` holds `polled.len()` initialised entries for the whole
    // call. A descriptor closed meanwhile (an endpoint closing) is reported as
    // POLLNVAL or wakes us spuriously; the next round rebuilds the set.
    let rc = unsafe {
        libc::poll(
            polled.as_mut_ptr(),
            polled.len() as libc::nfds_t,
            timeout_ms,
        )
    };
    if rc <= 0 {
        return vec![0; fds.len()];
    }
    polled.iter().map(|p| p.revents).collect()
}

/// The driver thread's body; returns when the transport stops.
pub fn run(shared: Arc<Shared>) {
    let ready = libc::POLLIN | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let mut sources = vec![(shared.wake_fd(), Source::Wake)];
        if !shared.daemon_gone.load(Ordering::SeqCst) {
            sources.push((shared.client_fd, Source::Daemon));
        }
        if let Some(xs) = &shared.xs {
            sources.push((xs.watch_fd(), Source::PeerView));
        }
        let endpoints = shared.endpoints();
        let mut timeout_ms = -1;
        for ep in endpoints {
            let (delivered, fd) = {
                let mut link = ep.link.lock().unwrap_or_else(|e| e.into_inner());
                let mut reg = Daemon(&shared.client);
                // A polling application thread takes the events in itself
                // and arms the ring before it sleeps; arming it here would
                // have the backend signal every event.
                let n = if ep.mailbox.polled() {
                    timeout_ms = UNARMED_RECHECK_MS;
                    link.take_in(&ep.mailbox, &mut reg)
                } else {
                    link.take_in_and_arm(&ep.mailbox, &mut reg)
                };
                (n, link.port_fd())
            };
            if delivered > 0 {
                ep.mailbox.ring();
            }
            if let Some(fd) = fd {
                sources.push((fd, Source::Port(ep)));
            }
        }
        let fds: Vec<RawFd> = sources.iter().map(|s| s.0).collect();
        let revents = wait(&fds, timeout_ms);
        for ((_, source), rev) in sources.into_iter().zip(revents) {
            if rev & ready == 0 {
                continue;
            }
            match source {
                Source::Wake => shared.drain_wake(),
                Source::Daemon => shared.handle_notices(),
                Source::PeerView => shared.peer_view_changed(),
                Source::Port(ep) => {
                    let mut link = ep.link.lock().unwrap_or_else(|e| e.into_inner());
                    if rev & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
                        link.set_down();
                    } else {
                        link.take_notification();
                    }
                }
            }
        }
    }
}

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

use super::port::{EndpointShared, LinkRef};
use super::windows::FrontdRegistrar;
use super::XenShared;

/// What a polled descriptor stands for.
enum Source {
    Wake,
    Daemon,
    PeerView,
    DirectStore,
    DirectEvent,
    Port(Arc<EndpointShared>),
}

/// The driver's poll timeout until `until` (runtime nanoseconds), rounded
/// up to whole milliseconds so it never wakes before it.
fn timeout_until(until: u64, now_ns: u64) -> libc::c_int {
    let ms = until.saturating_sub(now_ns).div_ceil(1_000_000);
    ms.clamp(1, libc::c_int::MAX as u64) as libc::c_int
}

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

/// Takes in what an endpoint's direct channels hold and, unless an
/// application thread polls the endpoint, asks the peers to signal the next
/// frame: also while a thread sleeps on the endpoint's port, which wakes it
/// for the backend's arrivals only. Returns how many frames it took.
fn take_in_direct(shared: &XenShared, ep: &EndpointShared, now_ns: u64) -> usize {
    let Some(hub) = shared.hub() else { return 0 };
    let mut d = ep.direct.lock().unwrap_or_else(|e| e.into_inner());
    if !d.any_open() {
        let orphans = d.take_orphans();
        drop(d);
        let n = orphans.len();
        shared.resume_pulls(ep, orphans);
        return n;
    }
    let mut link = LinkRef(&ep.link);
    let mut n = hub.take_in(ep.index, &mut d, &ep.mailbox, &mut link);
    if ep.mailbox.driven_until(now_ns).is_none() && hub.arm(&mut d) {
        n += hub.take_in(ep.index, &mut d, &ep.mailbox, &mut link);
    }
    let orphans = d.take_orphans();
    drop(d);
    n += orphans.len();
    shared.resume_pulls(ep, orphans);
    n
}

/// The driver thread's body; returns when the transport stops.
pub(super) fn run(shared: Arc<XenShared>) {
    let ready = libc::POLLIN | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let mut sources = vec![(shared.wake_fd(), Source::Wake)];
        if !shared.daemon_gone.load(Ordering::SeqCst) {
            sources.push((shared.client_fd, Source::Daemon));
            sources.push((shared.notice_fd, Source::Daemon));
        }
        if let Some(xs) = shared.xs() {
            sources.push((xs.watch_fd(), Source::PeerView));
        }
        if let Some(hub) = shared.hub() {
            sources.push((hub.store_fd(), Source::DirectStore));
            sources.push((hub.event_fd(), Source::DirectEvent));
        }
        let endpoints = shared.endpoints();
        let mut timeout_ms: libc::c_int = -1;
        let now_ns = crate::runtime::now().as_nanos();
        for ep in endpoints {
            let (delivered, fd) = {
                let mut link = ep.link.lock().unwrap_or_else(|e| e.into_inner());
                let mut reg = FrontdRegistrar(&shared.client);
                // An application thread that polls, or will be back within
                // its lease, takes the events in itself and arms the ring
                // before it sleeps; arming it here would have the backend
                // signal every event. The ring is looked at again when the
                // lease ends (the thread may have gone back to computing).
                let driven = ep.mailbox.port_taken_until(now_ns);
                let n = if let Some(until) = driven {
                    let t = timeout_until(until, now_ns);
                    timeout_ms = if timeout_ms < 0 { t } else { timeout_ms.min(t) };
                    link.take_in(&ep.mailbox, &mut reg)
                } else {
                    link.take_in_and_arm(&ep.mailbox, &mut reg)
                };
                // Pulls held back for room in the send ring go out as the backend
                // takes requests, which it does not signal: look again soon.
                if link.has_deferred_pulls() {
                    timeout_ms = if timeout_ms < 0 { 1 } else { timeout_ms.min(1) };
                }
                // Unused windows are given back on time even while the application
                // computes: another process of the guest may wait for their grants.
                if let Some(due) = link.expire_idle_windows(&mut reg) {
                    let left = due.saturating_duration_since(std::time::Instant::now());
                    let t = (left.as_millis() as libc::c_int).saturating_add(1);
                    timeout_ms = if timeout_ms < 0 { t } else { timeout_ms.min(t) };
                }
                // The port is watched only while no application thread is
                // on it: one that polls sees arrivals itself, and one that
                // sleeps sleeps on the port (`Doorbell::sleep_on`); watching
                // it too would wake this thread for every arrival as well.
                (
                    n,
                    if driven.is_none() {
                        link.port_fd()
                    } else {
                        None
                    },
                )
            };
            let delivered = delivered + take_in_direct(&shared, &ep, now_ns);
            if ep
                .direct
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pulling()
            {
                // A stalled direct pull is noticed by looking again.
                let t = (super::direct::PULL_STALL.as_millis() / 4) as libc::c_int;
                timeout_ms = if timeout_ms < 0 { t } else { timeout_ms.min(t) };
            }
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
                Source::DirectStore => shared.direct_changed(),
                Source::DirectEvent => {
                    if let Some(hub) = shared.hub() {
                        hub.drain_events();
                    }
                }
                Source::Port(ep) => {
                    let mut link = ep.link.lock().unwrap_or_else(|e| e.into_inner());
                    if rev & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
                        link.set_down();
                    } else {
                        link.take_notification(false);
                    }
                }
            }
        }
    }
}

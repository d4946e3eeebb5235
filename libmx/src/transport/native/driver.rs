//! The driver thread: what Open-MX's kernel driver does on packet arrival.
//!
//! It sleeps in `ppoll` on the link, on the lanes other processes on the
//! link send to (see `claim`) and on a wake-up descriptor, with the
//! engine's next timer as timeout; when woken it takes in the waiting frames,
//! runs due timers and pumps the engine's outputs (which rings the doorbells
//! of endpoints that got something). It may spin on the link for a while
//! after traffic (`XMX_NIC_SPIN_US`), but by default it does not: on few
//! cores the application's own wait already spins, and a second spinner per
//! process only steals the core the peer needs. While an application thread
//! polls the link in its wait, the driver does not watch the link at all.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::wire::take_socket_error;
use super::NativeShared;

/// An eventfd that wakes the driver.
#[derive(Debug)]
pub(super) struct WakeFd(OwnedFd);

impl WakeFd {
    /// A fresh, non-blocking eventfd.
    pub(super) fn new() -> io::Result<WakeFd> {
        // SAFETY: plain syscall; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        Ok(WakeFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the descriptor readable.
    pub(super) fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of `one` to an open eventfd. A full
        // counter (EAGAIN) still leaves it readable, which is all we need.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Makes it unreadable again.
    fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into `v` from an open non-blocking eventfd.
        unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Waits until the wire or the lanes (`None`: neither watched) or `wake` is
/// readable, or `timeout` passes; returns the `revents` of the wire and
/// whether `wake` fired.
fn wait(
    arrivals: Option<(RawFd, RawFd)>,
    wake: RawFd,
    timeout: Option<Duration>,
) -> (libc::c_short, bool) {
    // A negative descriptor is ignored by ppoll.
    let (wire, lanes) = arrivals.unwrap_or((-1, -1));
    let mut fds = [
        libc::pollfd {
            fd: wire,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: lanes,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: wake,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `fds` holds three initialised pollfd entries, as the count
    // says; `ts_ptr` is null or points to a timespec alive across the call.
    let rc = unsafe { libc::ppoll(fds.as_mut_ptr(), 3, ts_ptr, std::ptr::null()) };
    if rc <= 0 {
        return (0, false);
    }
    (fds[0].revents, fds[2].revents & libc::POLLIN != 0)
}

/// The driver thread's body; returns when the transport stops.
pub(super) fn run(shared: Arc<NativeShared>) {
    let wire_fd = shared.wire_fd;
    let spin = shared.config.nic_spin;
    let mut errors = 0u64;
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        // Cleared before the pollers are counted, so a thread that stops
        // polling either is counted here or sees `watching` false and wakes
        // us (see `NativePort::before_sleep`).
        shared.watching.store(false, Ordering::SeqCst);
        let (got, timer, driven) = shared.run(|b, clock| {
            let got = b.receive(clock) + b.receive_lanes(clock);
            b.timers(clock.now());
            // Recorded under the lock: a thread that arms an earlier timer
            // later sees it and wakes us (see `NativeShared::run`).
            let timer = b.next_timer();
            b.driver_wake = timer;
            let driven = b
                .driven_until(crate::runtime::now().as_nanos())
                .map(|t| crate::runtime::to_std(xmx_mx::Instant::from_nanos(t)));
            (got, timer, driven)
        });
        if got > 0 && !spin.is_zero() && spin_for_more(&shared, spin) {
            continue;
        }
        // An application thread that polls the link, or will be back within
        // its lease, takes the frames in: a wake-up per frame here would
        // only take the core (or the board's lock) from it. Look again when
        // the lease ends (a thread going to sleep wakes us earlier).
        let wake_at = match (timer, driven) {
            (Some(t), Some(d)) => Some(t.min(d)),
            (t, d) => t.or(d),
        };
        let timeout = wake_at.map(|t| t.saturating_duration_since(Instant::now()));
        let wire = if driven.is_some() {
            None
        } else {
            shared.watching.store(true, Ordering::SeqCst);
            Some((wire_fd, shared.lanes_fd))
        };
        let (revents, woken) = wait(wire, shared.wake.fd(), timeout);
        if woken {
            shared.wake.drain();
        }
        if revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
            let e = take_socket_error(wire_fd);
            errors += 1;
            if errors == 1 || errors.is_power_of_two() {
                tracing::warn!(error = ?e, revents, errors, "link error");
            }
            if revents & libc::POLLNVAL != 0 {
                // The descriptor is gone: nothing to wait on any more.
                return;
            }
        }
    }
}

/// Polls the link for up to `spin`; true if frames came (and were taken in).
fn spin_for_more(shared: &NativeShared, spin: Duration) -> bool {
    let until = Instant::now() + spin;
    while Instant::now() < until {
        if shared.stop.load(Ordering::SeqCst) {
            return false;
        }
        if shared
            .try_run(None, |b, clock| b.receive(clock))
            .unwrap_or(0)
            > 0
        {
            return true;
        }
        std::hint::spin_loop();
    }
    false
}

//! A wakeable wait: the thread that blocks in `mx_wait` sleeps here until a
//! frame arrives, `mx_wakeup` rings, or a deadline passes.
//!
//! Waiters read the [generation](Doorbell::generation) before checking their
//! condition and sleep only while it is unchanged, so a ring between the
//! check and the sleep is never lost. Waits spin briefly before sleeping:
//! with two cores, a reply often arrives within microseconds.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::sys::eventfd::{EfdFlags, EventFd};

/// How long a wait polls before it sleeps when `XMX_SPIN_US` does not say.
///
/// A ping-pong partner's reply comes one round trip after our message left:
/// about 7 us natively and 15-20 us between guests on different hosts on a
/// loaded two-core machine (`xmx bench`). With 20 us, guests across hosts
/// often missed it and paid a sleep and a wakeup (half round trips of 25-45
/// us instead of 8-10, in half the cells measured); from 50 us on they
/// caught it in every cell, and 100 us bought no better median. Polling yields the core
/// on each round, so a backend and two applications on two cores keep
/// making progress; waits with nothing coming sleep after 50 us.
pub(crate) const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// How long after an application thread last used an endpoint it is
/// counted on to come back and progress the endpoint itself.
///
/// Within the lease, arrivals are left to that thread: the transport's
/// driver does not watch the link or arm the event ring for it, and the
/// background thread is not woken. Between the calls of a ping-pong (the
/// receive completes, the reply is posted, the next receive waits) the
/// application is outside any wait for a microsecond or two; without the
/// lease every such gap armed a notification, and the arrival then woke a
/// second thread that fought the application for the endpoint's lock (a
/// profile of the native ping-pong had a futex call per message). An
/// application that stops calling the library leaves its arrivals to the
/// driver and the background thread one lease later, which only delays
/// acks and progress by as much.
pub(crate) const LEASE: Duration = Duration::from_millis(1);
const LEASE_NS: u64 = LEASE.as_nanos() as u64;

/// Idle nonblocking calls in a row per `sched_yield` ([`Doorbell::idle_call`]).
const IDLE_CALLS_PER_YIELD: u32 = 4;

/// The longest one sleep on a transport's arrival descriptor lasts
/// ([`Doorbell::sleep_on`]) before the sleeper looks again: the descriptor is
/// read under the endpoint's lock and polled after it is released, so a port
/// re-opened meanwhile (a backend restart, a move) leaves the sleeper on a
/// descriptor that will never signal. The bound makes that a late look,
/// never a hang.
pub(crate) const ARRIVAL_SLEEP_MAX: Duration = Duration::from_millis(50);

/// How long after it saw a thread sleeping on an endpoint's arrival
/// descriptor a driver looks at that endpoint again ([`Doorbell::driven_until`]).
/// Between its looks an application that left its wait to compute has its
/// arrivals taken in that much later (within MX's ack delay, 1/64 s), instead
/// of a lease later.
pub(crate) const ARRIVAL_REWATCH: Duration = Duration::from_millis(10);
const ARRIVAL_REWATCH_NS: u64 = ARRIVAL_REWATCH.as_nanos() as u64;

/// Something to tell when a doorbell rings while no application thread
/// waits on it (the background progression thread).
pub(crate) trait Unattended: Send + Sync {
    /// The doorbell of `token` rang with nobody waiting.
    fn rang(&self, token: u64);

    /// A doorbell rang with nobody waiting, within the lease of the
    /// application's last use that ends at `until` (runtime nanoseconds):
    /// look at its endpoint then, if nobody progressed it meanwhile.
    fn deferred(&self, until: u64);
}

/// A wakeable wait shared by the transport (which rings on arrivals), the
/// waiting threads and `mx_wakeup`.
pub(crate) struct Doorbell {
    generation: AtomicU64,
    sleepers: AtomicUsize,
    /// Application threads inside a blocking call on this endpoint.
    attended: AtomicUsize,
    /// Application threads polling the endpoint themselves (the spin of a wait).
    pollers: AtomicUsize,
    /// End of the lease of the application's last use ([`LEASE`]), in
    /// [`crate::runtime::now`] nanoseconds.
    leased_until: AtomicU64,
    /// A ring came within the lease while no thread waited: the background
    /// thread looks at the endpoint when the lease ends, unless the
    /// application progressed it first.
    deferred: AtomicBool,
    /// Nonblocking calls on the endpoint in a row that found nothing and
    /// moved nothing ([`Doorbell::idle_call`]).
    idle_calls: AtomicU32,
    /// A thread sleeps on its transport's arrival descriptor
    /// ([`Doorbell::sleep_on`]); at most one does, the others on `cond`.
    arrival_sleeper: AtomicBool,
    /// Made readable by a ring while `arrival_sleeper` is set (`None`: no
    /// eventfd could be made; every sleeper then sleeps on `cond`).
    ring_fd: Option<EventFd>,
    lock: Mutex<()>,
    cond: Condvar,
    spin: Duration,
    token: u64,
    unattended: Option<Arc<dyn Unattended>>,
}

impl std::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Doorbell")
            .field("generation", &self.generation)
            .field("token", &self.token)
            .finish()
    }
}

impl Doorbell {
    /// A doorbell that spins up to `spin` before sleeping, and tells
    /// `unattended` (with `token`) about rings nobody waits for.
    pub(crate) fn new(spin: Duration, token: u64, unattended: Option<Arc<dyn Unattended>>) -> Self {
        Doorbell {
            generation: AtomicU64::new(0),
            sleepers: AtomicUsize::new(0),
            attended: AtomicUsize::new(0),
            pollers: AtomicUsize::new(0),
            leased_until: AtomicU64::new(0),
            deferred: AtomicBool::new(false),
            idle_calls: AtomicU32::new(0),
            arrival_sleeper: AtomicBool::new(false),
            ring_fd: EventFd::from_value_and_flags(
                0,
                EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC,
            )
            .map_err(|e| tracing::debug!(%e, "no eventfd: waits sleep on the condition"))
            .ok(),
            lock: Mutex::new(()),
            cond: Condvar::new(),
            spin,
            token,
            unattended,
        }
    }

    /// The current generation; it changes at every ring.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Wakes every waiter; if nobody waits, tells the background thread,
    /// at once or (within the application's lease) when the lease ends.
    pub(crate) fn ring(&self) {
        self.ring_local();
        if self.attended.load(Ordering::SeqCst) == 0 {
            if let Some(u) = &self.unattended {
                let until = self.leased_until.load(Ordering::SeqCst);
                if until > crate::runtime::now().as_nanos() {
                    // Set before the background thread is told, so its scan
                    // sees the deferred ring in `deferred_until`.
                    self.deferred.store(true, Ordering::SeqCst);
                    u.deferred(until);
                } else {
                    u.rang(self.token);
                }
            }
        }
    }

    /// An application thread uses the endpoint now (`now_ns`: a
    /// [`crate::runtime::now`] reading): its lease starts again.
    pub(crate) fn touch(&self, now_ns: u64) {
        self.leased_until
            .store(now_ns.saturating_add(LEASE_NS), Ordering::SeqCst);
    }

    /// The endpoint is being progressed: a deferred ring is served. Called
    /// before the arrivals are taken in, so a ring after it is deferred
    /// (or sent) again and never lost.
    /// Every progress calls this and almost never finds a ring deferred:
    /// a load then, not a store (a ring after the load is deferred again).
    pub(crate) fn clear_deferred(&self) {
        if self.deferred.load(Ordering::SeqCst) {
            self.deferred.store(false, Ordering::SeqCst);
        }
    }

    /// When the background thread must look at the endpoint for a deferred
    /// ring (`None`: none is deferred).
    pub(crate) fn deferred_until(&self) -> Option<u64> {
        self.deferred
            .load(Ordering::SeqCst)
            .then(|| self.leased_until.load(Ordering::SeqCst))
    }

    /// Until when an application thread can be counted on to take the
    /// endpoint's arrivals in itself (`now_ns`: a [`crate::runtime::now`]
    /// reading), so a driver need not watch for them: while a thread polls
    /// (looked at again a lease later), or within the lease of its last use
    /// when no thread sleeps in a wait. `None`: a thread sleeps, or the
    /// application went away; the driver watches.
    pub(crate) fn driven_until(&self, now_ns: u64) -> Option<u64> {
        if self.pollers.load(Ordering::SeqCst) > 0 {
            return Some(now_ns.saturating_add(LEASE_NS));
        }
        if self.attended.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let until = self.leased_until.load(Ordering::SeqCst);
        (until > now_ns).then_some(until)
    }

    /// As [`driven_until`](Self::driven_until), for the transport's arrival
    /// descriptor alone: a thread asleep on it ([`sleep_on`](Self::sleep_on))
    /// is woken by the arrival itself, so a driver need not watch it either.
    /// Everything else the endpoint can hear from (a direct channel's lanes)
    /// is still the driver's to watch while that thread sleeps. Looked at
    /// again a while later, not a lease: the driver would wake a thousand
    /// times a second for each sleeping endpoint (with 80 blocked
    /// applications, more wake-ups than the arrivals it no longer relays).
    pub(crate) fn port_taken_until(&self, now_ns: u64) -> Option<u64> {
        self.driven_until(now_ns).or_else(|| {
            self.arrival_sleeper
                .load(Ordering::SeqCst)
                .then(|| now_ns.saturating_add(ARRIVAL_REWATCH_NS))
        })
    }

    /// Wakes every waiter, but not the background thread: for events the
    /// library itself produced while progressing (a completion another
    /// waiting thread may be interested in).
    pub(crate) fn ring_local(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        if self.arrival_sleeper.load(Ordering::SeqCst) {
            if let Some(fd) = &self.ring_fd {
                // Fails only when the counter would overflow: it is readable then.
                let _ = fd.write(1);
            }
        }
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.cond.notify_all();
        }
    }

    /// Marks an application thread as waiting on this doorbell until the
    /// guard drops.
    pub(crate) fn attend(&self) -> Attendance<'_> {
        self.attended.fetch_add(1, Ordering::SeqCst);
        Attendance(self)
    }

    /// Marks an application thread as polling the endpoint itself until the guard
    /// drops: while one does, a transport need not ask to be told of arrivals (each
    /// such notice is a system call on one side and a thread wake-up on the other).
    pub(crate) fn polling(&self) -> Polling<'_> {
        self.pollers.fetch_add(1, Ordering::SeqCst);
        Polling(self)
    }

    /// Whether an application thread polls the endpoint now.
    #[cfg(test)]
    pub(crate) fn polled(&self) -> bool {
        self.pollers.load(Ordering::SeqCst) > 0
    }

    /// Whether a nonblocking call that found nothing and moved nothing gives
    /// the core away (`sched_yield`) before it returns: the last of each
    /// [`IDLE_CALLS_PER_YIELD`] such calls in a row does. An MPI
    /// progress engine makes several such calls per round (three for
    /// MVAPICH2's MX module); a yield in each cost its messages 0.6 us of a
    /// 4.4 us round trip natively, and one in the first idle call after a
    /// send 0.3 us.
    pub(crate) fn idle_call(&self) -> bool {
        self.idle_calls.fetch_add(1, Ordering::Relaxed) % IDLE_CALLS_PER_YIELD
            == IDLE_CALLS_PER_YIELD - 1
    }

    /// A nonblocking call found something, or its progress moved something.
    pub(crate) fn call_moved(&self) {
        if self.idle_calls.load(Ordering::Relaxed) != 0 {
            self.idle_calls.store(0, Ordering::Relaxed);
        }
    }

    /// How long a waiter polls before it sleeps.
    pub(crate) fn spin(&self) -> Duration {
        self.spin
    }

    /// Blocks while the generation is still `seen`, at most until `deadline`.
    pub(crate) fn wait(&self, seen: u64, deadline: Option<Instant>) {
        let now = Instant::now();
        if deadline.is_some_and(|d| d <= now) {
            return;
        }
        let mut spin_until = now + self.spin;
        if let Some(d) = deadline {
            spin_until = spin_until.min(d);
        }
        while Instant::now() < spin_until {
            if self.generation() != seen {
                return;
            }
            std::hint::spin_loop();
        }
        self.sleep(seen, deadline);
    }

    /// Sleeps at once (no spin) while the generation is still `seen`, at most until
    /// `deadline`: for waiters that polled their endpoint themselves before.
    pub(crate) fn sleep(&self, seen: u64, deadline: Option<Instant>) {
        if deadline.is_some_and(|d| d <= Instant::now()) {
            return;
        }
        let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        loop {
            if self.generation() != seen {
                break;
            }
            match deadline {
                None => {
                    guard = self.cond.wait(guard).unwrap_or_else(|e| e.into_inner());
                }
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        break;
                    }
                    guard = self
                        .cond
                        .wait_timeout(guard, d - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Whether a waiting thread can sleep on a transport's arrival descriptor
    /// ([`Doorbell::sleep_on`]): false when no eventfd could be made.
    pub(crate) fn sleeps_on_arrivals(&self) -> bool {
        self.ring_fd.is_some()
    }

    /// As [`Doorbell::sleep`], on `arrival` as well: a descriptor the
    /// transport makes readable at the endpoint's next arrival (an event
    /// channel's port, armed by [`crate::transport::TransportPort::before_sleep`]).
    /// The arrival wakes this thread itself: without it, a driver thread woke
    /// for the arrival, took it in and rang the doorbell, two wake-ups and a
    /// second thread's pass for each (a third of the machine with 80 blocked
    /// applications on two cores). Sleeps at most [`ARRIVAL_SLEEP_MAX`].
    ///
    /// `None` when another thread already sleeps so, or no eventfd exists
    /// (the caller sleeps on the doorbell); else whether `arrival` turned
    /// readable, whose signal the caller then consumes.
    pub(crate) fn sleep_on(
        &self,
        arrival: crate::transport::ArrivalFds,
        seen: u64,
        deadline: Option<Instant>,
    ) -> Option<bool> {
        let ring_fd = self.ring_fd.as_ref()?;
        if self
            .arrival_sleeper
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return None;
        }
        // A ring from before this sleep is in the generation: drain it, then
        // read the generation (a ring after the drain leaves the eventfd
        // readable, one before it moved the generation).
        let _ = ring_fd.read();
        let mut arrived = false;
        let now = Instant::now();
        let mut left = ARRIVAL_SLEEP_MAX;
        if let Some(d) = deadline {
            left = left.min(d.saturating_duration_since(now));
        }
        if self.generation() == seen && !left.is_zero() {
            let [first, second] = arrival.0;
            let mut fds = [
                libc::pollfd {
                    fd: first,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: second,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: ring_fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // `ppoll` keeps the bound to the microsecond (`poll`'s milliseconds
            // made a 100 us bound a millisecond's sleep).
            let ts = libc::timespec {
                tv_sec: left.as_secs() as libc::time_t,
                tv_nsec: left.subsec_nanos() as libc::c_long,
            };
            // SAFETY: `fds` holds three initialised entries and `ts` a valid
            // time for the whole call; no signal mask is passed. A descriptor
            // closed meanwhile (the port re-opened) is reported as POLLNVAL or
            // never signals; the sleep's bound covers the latter.
            let rc = unsafe {
                libc::ppoll(
                    fds.as_mut_ptr(),
                    fds.len() as libc::nfds_t,
                    &ts,
                    std::ptr::null(),
                )
            };
            arrived = rc > 0 && (fds[0].revents | fds[1].revents) != 0;
        }
        self.arrival_sleeper.store(false, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            // A thread sleeping on the condition would not see the next
            // arrival: let it look, and sleep on the descriptor itself.
            self.ring_local();
        }
        Some(arrived)
    }
}

/// An application thread polling its endpoint (see [`Doorbell::polling`]).
pub(crate) struct Polling<'a>(&'a Doorbell);

impl Drop for Polling<'_> {
    fn drop(&mut self) {
        self.0.pollers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An application thread waiting on a doorbell (see [`Doorbell::attend`]).
pub(crate) struct Attendance<'a>(&'a Doorbell);

impl Drop for Attendance<'_> {
    fn drop(&mut self) {
        self.0.attended.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::ArrivalFds;

    struct Count(AtomicU64, AtomicU64);
    impl Unattended for Count {
        fn rang(&self, token: u64) {
            self.0.fetch_add(token, Ordering::SeqCst);
        }
        fn deferred(&self, until: u64) {
            self.1.store(until, Ordering::SeqCst);
        }
    }

    fn count() -> Arc<Count> {
        Arc::new(Count(AtomicU64::new(0), AtomicU64::new(0)))
    }

    #[test]
    fn ring_before_wait_is_not_lost() {
        let d = Doorbell::new(Duration::ZERO, 0, None);
        let seen = d.generation();
        d.ring();
        // Returns at once: the generation moved since it was read.
        d.wait(seen, None);
        assert_eq!(d.generation(), seen + 1);
    }

    #[test]
    fn ring_from_another_thread_wakes_a_sleeper() {
        let d = Arc::new(Doorbell::new(Duration::ZERO, 0, None));
        let seen = d.generation();
        let d2 = d.clone();
        let t = std::thread::spawn(move || d2.wait(seen, None));
        while d.sleepers.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        d.ring();
        t.join().expect("waiter thread");
    }

    fn arrival() -> EventFd {
        EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .expect("eventfd")
    }

    /// Spawns a thread sleeping on `fd` as its arrival descriptor; returns once it sleeps.
    fn arrival_sleeper(
        d: &Arc<Doorbell>,
        fd: std::os::fd::RawFd,
    ) -> std::thread::JoinHandle<Option<bool>> {
        let seen = d.generation();
        let d2 = d.clone();
        let t = std::thread::spawn(move || {
            d2.sleep_on(
                ArrivalFds::one(fd),
                seen,
                Some(Instant::now() + Duration::from_secs(60)),
            )
        });
        while !d.arrival_sleeper.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        t
    }

    #[test]
    fn an_arrival_wakes_the_thread_sleeping_on_its_descriptor() {
        let d = Arc::new(Doorbell::new(Duration::ZERO, 0, None));
        let port = arrival();
        let t = arrival_sleeper(&d, port.as_raw_fd());
        // While it sleeps there the driver need not watch the port, but it
        // watches everything else (a direct channel's lanes): the thread
        // asleep on the port does not look at them.
        let now = crate::runtime::now().as_nanos();
        assert_eq!(d.port_taken_until(now), Some(now + ARRIVAL_REWATCH_NS));
        assert_eq!(d.driven_until(now), None, "the lanes are the driver's");
        port.write(1).expect("signal");
        assert_eq!(t.join().expect("sleeper"), Some(true));
        assert!(!d.arrival_sleeper.load(Ordering::SeqCst));
        assert_eq!(
            d.driven_until(now),
            None,
            "nobody attends: the driver watches"
        );
    }

    #[test]
    fn a_ring_wakes_the_thread_sleeping_on_an_arrival_descriptor() {
        let d = Arc::new(Doorbell::new(Duration::ZERO, 0, None));
        let port = arrival();
        let t = arrival_sleeper(&d, port.as_raw_fd());
        d.ring_local();
        assert_eq!(t.join().expect("sleeper"), Some(false), "woken by the ring");
        // The ring is drained by the next sleep, which sees the generation moved.
        let seen = d.generation();
        d.ring_local();
        assert_eq!(
            d.sleep_on(ArrivalFds::one(port.as_raw_fd()), seen, None),
            Some(false)
        );
    }

    #[test]
    fn one_thread_sleeps_on_the_arrival_descriptor_the_others_on_the_doorbell() {
        let d = Arc::new(Doorbell::new(Duration::ZERO, 0, None));
        let port = arrival();
        let first = arrival_sleeper(&d, port.as_raw_fd());
        let seen = d.generation();
        assert_eq!(
            d.sleep_on(ArrivalFds::one(port.as_raw_fd()), seen, None),
            None
        );
        // A thread asleep on the doorbell is woken when the first leaves, so it
        // takes the descriptor over.
        let d2 = d.clone();
        let second = std::thread::spawn(move || d2.sleep(seen, None));
        while d.sleepers.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        port.write(1).expect("signal");
        assert_eq!(first.join().expect("first sleeper"), Some(true));
        second.join().expect("second sleeper");
        assert!(d.generation() > seen);
    }

    #[test]
    fn a_sleep_on_an_arrival_descriptor_ends_at_its_deadline() {
        let d = Doorbell::new(Duration::ZERO, 0, None);
        let port = arrival();
        let seen = d.generation();
        let deadline = Instant::now() + Duration::from_millis(5);
        assert_eq!(
            d.sleep_on(ArrivalFds::one(port.as_raw_fd()), seen, Some(deadline)),
            Some(false)
        );
        assert!(Instant::now() >= deadline);
        assert_eq!(d.generation(), seen);
    }

    #[test]
    fn polling_is_counted_until_the_guard_drops() {
        let d = Doorbell::new(Duration::ZERO, 0, None);
        assert!(!d.polled());
        let a = d.polling();
        let b = d.polling();
        assert!(d.polled());
        drop(a);
        assert!(d.polled());
        drop(b);
        assert!(!d.polled());
    }

    #[test]
    fn sleep_returns_at_once_after_a_ring() {
        let d = Doorbell::new(Duration::from_secs(60), 0, None);
        let seen = d.generation();
        d.ring_local();
        d.sleep(seen, None);
        assert_eq!(d.generation(), seen + 1);
    }

    #[test]
    fn deadline_ends_the_wait() {
        let d = Doorbell::new(Duration::ZERO, 0, None);
        let seen = d.generation();
        d.wait(seen, Some(Instant::now()));
        assert_eq!(d.generation(), seen);
    }

    #[test]
    fn unattended_rings_reach_the_background() {
        let c = count();
        let d = Doorbell::new(Duration::ZERO, 5, Some(c.clone()));
        d.ring();
        assert_eq!(c.0.load(Ordering::SeqCst), 5);
        {
            let _a = d.attend();
            d.ring();
            assert_eq!(c.0.load(Ordering::SeqCst), 5, "attended ring stays local");
        }
        d.ring();
        assert_eq!(c.0.load(Ordering::SeqCst), 10);
    }

    #[test]
    fn a_ring_within_the_lease_is_deferred_to_its_end() {
        let c = count();
        let d = Doorbell::new(Duration::ZERO, 5, Some(c.clone()));
        let now = crate::runtime::now().as_nanos();
        d.touch(now);
        let until = now + LEASE.as_nanos() as u64;
        assert_eq!(d.deferred_until(), None);
        d.ring();
        assert_eq!(c.0.load(Ordering::SeqCst), 0, "no wake-up within the lease");
        assert_eq!(c.1.load(Ordering::SeqCst), until, "told when to look");
        assert_eq!(d.deferred_until(), Some(until));
        // The application progressed the endpoint: nothing left to do.
        d.clear_deferred();
        assert_eq!(d.deferred_until(), None);
        // A lease that ended: the ring goes out at once again.
        d.leased_until.store(0, Ordering::SeqCst);
        d.ring();
        assert_eq!(c.0.load(Ordering::SeqCst), 5);
        assert_eq!(d.deferred_until(), None);
    }

    #[test]
    fn idle_calls_yield_once_per_run_of_four_and_start_over_when_something_moves() {
        let d = Doorbell::new(Duration::ZERO, 0, None);
        let yields: Vec<bool> = (0..9).map(|_| d.idle_call()).collect();
        assert_eq!(
            yields,
            [false, false, false, true, false, false, false, true, false]
        );
        d.call_moved();
        let yields: Vec<bool> = (0..4).map(|_| d.idle_call()).collect();
        assert_eq!(yields, [false, false, false, true], "counted from the move");
    }

    #[test]
    fn the_application_drives_while_it_polls_or_holds_its_lease() {
        let d = Doorbell::new(Duration::ZERO, 0, None);
        let now = 10 * LEASE.as_nanos() as u64;
        assert_eq!(d.driven_until(now), None, "never used: the driver watches");
        d.touch(now);
        assert_eq!(d.driven_until(now), Some(now + LEASE.as_nanos() as u64));
        assert_eq!(
            d.driven_until(now + LEASE.as_nanos() as u64),
            None,
            "lease over"
        );
        {
            let _a = d.attend();
            assert_eq!(d.driven_until(now), None, "a thread sleeps in a wait");
            let _p = d.polling();
            let later = now + 5 * LEASE.as_nanos() as u64;
            assert_eq!(
                d.driven_until(later),
                Some(later + LEASE.as_nanos() as u64),
                "a polling thread drives"
            );
        }
    }
}

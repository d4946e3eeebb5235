//! An impairing relay: a thread forwarding frames between two packet sockets and doing to
//! them what `tc qdisc ... netem loss L duplicate D reorder R delay T` does (a reordered
//! frame skips the delay the others wait), with a link that can go down for a while. Tests
//! use it where the kernel has no netem.
//!
//! Every decision comes from a seeded generator: [`relay_seed`] picks a fresh seed per run
//! (printed) unless `XMX_RELAY_SEED` names one, so a failed run can be replayed with the same
//! losses, duplicates and reorderings for the same sequence of frames.

use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::PacketSocket;

/// What the relay does to the frames of one direction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Impairment {
    /// Probability of losing a frame.
    pub loss: f64,
    /// Probability of sending a frame twice.
    pub duplicate: f64,
    /// Probability of sending a frame at once, ahead of delayed ones.
    pub reorder: f64,
    /// Delay of every other frame.
    pub delay: Duration,
    /// `(period, length)`: the link goes down (every frame lost, both ways) for `length`
    /// at the end of every `period` since the relay started.
    pub down: Option<(Duration, Duration)>,
}

impl Impairment {
    /// Frames pass untouched.
    pub const NONE: Impairment = Impairment {
        loss: 0.0,
        duplicate: 0.0,
        reorder: 0.0,
        delay: Duration::ZERO,
        down: None,
    };

    /// `loss 5% duplicate 1% reorder 5% delay 1ms`.
    pub const NETEM: Impairment = Impairment {
        loss: 0.05,
        duplicate: 0.01,
        reorder: 0.05,
        delay: Duration::from_millis(1),
        down: None,
    };

    /// The same as `tc netem` arguments.
    pub fn netem_args(&self) -> Vec<String> {
        let pct = |p: f64| format!("{}%", p * 100.0);
        vec![
            "loss".into(),
            pct(self.loss),
            "duplicate".into(),
            pct(self.duplicate),
            "reorder".into(),
            pct(self.reorder),
            "delay".into(),
            format!("{}us", self.delay.as_micros()),
        ]
    }
}

/// What a relay did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Frames that came from side A.
    pub from_a: u64,
    /// Frames that came from side B.
    pub from_b: u64,
    /// Lost.
    pub lost: u64,
    /// Sent twice.
    pub duplicated: u64,
    /// Sent ahead of the delayed ones.
    pub reordered: u64,
    /// Lost while the link was down.
    pub down_lost: u64,
}

/// The environment variable that replays a run's impairments.
pub const SEED_ENV: &str = "XMX_RELAY_SEED";

/// The seed of this run's relays: `XMX_RELAY_SEED` (decimal or `0x` hex) if set, else a
/// fresh one from the clock and the process id. Printed either way, so that a failure names
/// the seed that replays it.
pub fn relay_seed() -> u64 {
    let seed = seed_from_env().unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        fastrand::Rng::with_seed(nanos ^ u64::from(std::process::id()) << 32).u64(..)
    });
    println!("relay seed {seed:#x} (replay with {SEED_ENV}={seed:#x})");
    seed
}

/// True with probability `p`. A certain outcome draws nothing, so a direction that is not
/// impaired leaves the other's sequence of decisions as it would be alone. (A seeded
/// generator replays a run with the same build: the lock file pins its algorithm.)
fn chance(rng: &mut fastrand::Rng, p: f64) -> bool {
    p > 0.0 && rng.f64() < p
}

/// The seed of a run whose relays should decide the same way every time unless told
/// otherwise: `XMX_RELAY_SEED` if set, else `default`. Printed either way.
pub fn relay_seed_or(default: u64) -> u64 {
    let seed = seed_from_env().unwrap_or(default);
    println!("relay seed {seed:#x} (replay with {SEED_ENV}={seed:#x})");
    seed
}

fn seed_from_env() -> Option<u64> {
    std::env::var(SEED_ENV).ok().and_then(|v| {
        let v = v.trim();
        match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => v.parse().ok(),
        }
    })
}

/// Derives the seed of relay `index` of a run whose seed is `seed` (each relay of a run
/// decides differently, and all replay together).
pub fn relay_seed_of(seed: u64, index: u64) -> u64 {
    fastrand::Rng::with_seed(seed ^ index).u64(..)
}

/// A running relay between sides A and B; stops when dropped.
pub struct Relay {
    stop: Arc<AtomicBool>,
    stats: Arc<Mutex<RelayStats>>,
    thread: Option<JoinHandle<()>>,
}

impl Relay {
    /// Forwards frames between `a` and `b` on a thread named `name`, impairing those from A
    /// with `from_a` and those from B with `from_b` (a link down in either is down both
    /// ways), every decision drawn from `seed`.
    pub fn start(
        name: &str,
        a: PacketSocket,
        b: PacketSocket,
        from_a: Impairment,
        from_b: Impairment,
        seed: u64,
    ) -> std::io::Result<Relay> {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Mutex::new(RelayStats::default()));
        let thread = {
            let (stop, stats) = (stop.clone(), stats.clone());
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || relay([a, b], [from_a, from_b], seed, &stop, &stats))?
        };
        Ok(Relay {
            stop,
            stats,
            thread: Some(thread),
        })
    }

    /// What it did so far.
    pub fn stats(&self) -> RelayStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How long the relay sleeps at most between looks at its stop flag.
const IDLE_WAIT: Duration = Duration::from_millis(20);

fn relay(
    mut ends: [PacketSocket; 2],
    imp: [Impairment; 2],
    seed: u64,
    stop: &AtomicBool,
    stats: &Mutex<RelayStats>,
) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let started = Instant::now();
    let down_cycle = imp[0].down.or(imp[1].down);
    // Per destination: frames waiting out their delay, in the order they go.
    let mut delayed: [VecDeque<(Instant, Vec<u8>)>; 2] = [VecDeque::new(), VecDeque::new()];
    let fds = [ends[0].fd().as_raw_fd(), ends[1].fd().as_raw_fd()];
    while !stop.load(Ordering::SeqCst) {
        let mut s = RelayStats::default();
        let now = Instant::now();
        let down = down_cycle.is_some_and(|(period, len)| {
            let t = now.saturating_duration_since(started).as_nanos();
            let period = period.as_nanos().max(1);
            t % period >= period.saturating_sub(len.as_nanos())
        });
        for (from, to) in [(0usize, 1usize), (1, 0)] {
            let mut got = Vec::new();
            ends[from].recv(|f| got.push(f.to_vec()));
            let imp = &imp[from];
            let mut out = Vec::new();
            for f in got {
                if from == 0 {
                    s.from_a += 1;
                } else {
                    s.from_b += 1;
                }
                if down {
                    s.down_lost += 1;
                    continue;
                }
                if chance(&mut rng, imp.loss) {
                    s.lost += 1;
                    continue;
                }
                let copies = if chance(&mut rng, imp.duplicate) {
                    s.duplicated += 1;
                    2
                } else {
                    1
                };
                for _ in 0..copies {
                    if chance(&mut rng, imp.reorder) {
                        s.reordered += 1;
                        out.push(f.clone());
                    } else if imp.delay.is_zero() {
                        out.push(f.clone());
                    } else {
                        delayed[to].push_back((now + imp.delay, f.clone()));
                    }
                }
            }
            while delayed[to].front().is_some_and(|d| d.0 <= now) {
                if let Some((_, f)) = delayed[to].pop_front() {
                    out.push(f);
                }
            }
            // Counted before they go: whoever sees a frame arrive sees it counted.
            {
                let mut total = stats.lock().unwrap_or_else(|e| e.into_inner());
                total.from_a += std::mem::take(&mut s.from_a);
                total.from_b += std::mem::take(&mut s.from_b);
                total.lost += std::mem::take(&mut s.lost);
                total.duplicated += std::mem::take(&mut s.duplicated);
                total.reordered += std::mem::take(&mut s.reordered);
                total.down_lost += std::mem::take(&mut s.down_lost);
            }
            if !out.is_empty() {
                for f in &out {
                    let _ = ends[to].send(f);
                }
                let _ = ends[to].flush();
            }
        }
        let next_due = delayed.iter().filter_map(|q| q.front().map(|d| d.0)).min();
        let wait = next_due
            .map_or(IDLE_WAIT, |t| t.saturating_duration_since(Instant::now()))
            .min(IDLE_WAIT);
        if !wait.is_zero() {
            wait_readable(fds, wait);
        }
    }
}

/// Sleeps until either socket has a frame or `timeout` passes.
fn wait_readable(fds: [i32; 2], timeout: Duration) {
    let mut p = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    let ms = timeout.as_micros().div_ceil(1000) as libc::c_int;
    // SAFETY: `p` holds two initialised entries, as the count says, for the whole call.
    unsafe { libc::poll(p.as_mut_ptr(), 2, ms) };
}

//! An impaired link for a simulated host, where the kernel has no `netem`.
//!
//! `tc qdisc ... netem loss 5% duplicate 1% reorder 5% delay 1ms` on a host's
//! veth impairs what the host sends. Without the netem qdisc the same is done
//! in the fabric namespace: the host's port leaves the bridge, and a thread of
//! the test relays MXoE frames between it and a new veth whose other end joins
//! the bridge, losing, duplicating, delaying and reordering those coming from
//! the host (netem's way: a reordered frame skips the delay the others wait).
//!
//! The impairment is drawn from a seeded generator: [`relay_seed`] picks a
//! fresh seed per run (printed) unless `XMX_RELAY_SEED` names one, so a run
//! that failed can be replayed with the same losses, duplicates and
//! reorderings (the same decisions for the same sequence of frames).

use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use xmx_nic::{NicConfig, PacketSocket};

/// What the link does to the frames a host sends.
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
    /// `(period, length)`: the link goes down (every frame lost, both ways)
    /// for `length` at the end of every `period` since the relay started.
    pub down: Option<(Duration, Duration)>,
}

impl Impairment {
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
    /// Frames from the host.
    pub from_host: u64,
    /// Frames to the host.
    pub to_host: u64,
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

/// The seed of this run's relays: `XMX_RELAY_SEED` (decimal or `0x` hex)
/// if set, else a fresh one from the clock and the process id. Printed
/// either way, so that a failure names the seed that replays it.
pub fn relay_seed() -> u64 {
    let given = std::env::var(SEED_ENV).ok().and_then(|v| {
        let v = v.trim();
        match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => v.parse().ok(),
        }
    });
    let seed = given.unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Rng(nanos ^ u64::from(std::process::id()) << 32).next()
    });
    println!("relay seed {seed:#x} (replay with {SEED_ENV}={seed:#x})");
    seed
}

/// A deterministic generator (SplitMix64): a run's impairments do not
/// depend on a library's randomness.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let o = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// One host's port relayed through an impairment; restored when dropped.
pub struct ImpairedPort {
    netns: String,
    port: String,
    relay_if: String,
    stop: Arc<AtomicBool>,
    stats: Arc<Mutex<RelayStats>>,
    thread: Option<JoinHandle<()>>,
}

impl ImpairedPort {
    /// Relays port `port` (host `index`'s end in fabric namespace `netns`,
    /// on bridge `br0`) through `imp`, its generator seeded by `seed` and
    /// `index` (see [`relay_seed`]).
    pub fn start(
        netns: &str,
        port: &str,
        index: usize,
        mtu: u32,
        imp: Impairment,
        seed: u64,
    ) -> ImpairedPort {
        let relay_if = format!("xr{index}a");
        let bridge_if = format!("xr{index}b");
        let mtu = mtu.to_string();
        let mut p = ImpairedPort {
            netns: netns.to_owned(),
            port: port.to_owned(),
            relay_if: relay_if.clone(),
            stop: Arc::new(AtomicBool::new(false)),
            stats: Arc::default(),
            thread: None,
        };
        for args in [
            vec!["-n", netns, "link", "set", port, "nomaster"],
            vec![
                "-n", netns, "link", "add", &relay_if, "mtu", &mtu, "type", "veth", "peer", "name",
                &bridge_if, "mtu", &mtu,
            ],
            vec!["-n", netns, "link", "set", &bridge_if, "master", "br0"],
            vec!["-n", netns, "link", "set", &bridge_if, "up"],
            vec!["-n", netns, "link", "set", &relay_if, "up"],
        ] {
            ip(&args).expect("setting up the relay");
        }
        let cfg = NicConfig {
            promiscuous: true,
            ..NicConfig::default()
        };
        let host_end = PacketSocket::open_in_netns(netns, port, cfg.clone())
            .expect("relay socket on the host's port");
        let bridge_end = PacketSocket::open_in_netns(netns, &relay_if, cfg)
            .expect("relay socket towards the bridge");
        let (stop, stats) = (p.stop.clone(), p.stats.clone());
        let seed = Rng(seed ^ index as u64).next();
        p.thread = Some(
            std::thread::Builder::new()
                .name(format!("relay-{port}"))
                .spawn(move || relay(host_end, bridge_end, imp, seed, &stop, &stats))
                .expect("relay thread"),
        );
        p
    }

    /// What it did so far.
    pub fn stats(&self) -> RelayStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for ImpairedPort {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = ip(&["-n", &self.netns, "link", "del", &self.relay_if]);
        let _ = ip(&[
            "-n",
            &self.netns,
            "link",
            "set",
            &self.port,
            "master",
            "br0",
        ]);
    }
}

fn wait_readable(fds: [i32; 2], timeout: Duration) {
    let mut p = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    let ms = timeout.as_micros().div_ceil(1000).min(100) as libc::c_int;
    // SAFETY: `p` holds two initialised entries, as the count says, for the
    // whole call.
    unsafe { libc::poll(p.as_mut_ptr(), 2, ms) };
}

fn relay(
    mut host: PacketSocket,
    mut bridge: PacketSocket,
    imp: Impairment,
    seed: u64,
    stop: &AtomicBool,
    stats: &Mutex<RelayStats>,
) {
    let mut rng = Rng(seed);
    let started = Instant::now();
    let mut delayed: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let fds = [host.fd().as_raw_fd(), bridge.fd().as_raw_fd()];
    while !stop.load(Ordering::SeqCst) {
        let mut s = RelayStats::default();
        let now = Instant::now();
        let mut from_host = Vec::new();
        host.recv(|f| from_host.push(f.to_vec()));
        let mut out = Vec::new();
        let down = imp.down.is_some_and(|(period, len)| {
            let t = now.saturating_duration_since(started).as_nanos();
            let period = period.as_nanos().max(1);
            t % period >= period.saturating_sub(len.as_nanos())
        });
        for f in from_host {
            s.from_host += 1;
            if down {
                s.down_lost += 1;
                continue;
            }
            if rng.chance(imp.loss) {
                s.lost += 1;
                continue;
            }
            let copies = if rng.chance(imp.duplicate) {
                s.duplicated += 1;
                2
            } else {
                1
            };
            for _ in 0..copies {
                if rng.chance(imp.reorder) {
                    s.reordered += 1;
                    out.push(f.clone());
                } else {
                    delayed.push_back((now + imp.delay, f.clone()));
                }
            }
        }
        while delayed.front().is_some_and(|d| d.0 <= now) {
            if let Some((_, f)) = delayed.pop_front() {
                out.push(f);
            }
        }
        for f in &out {
            let _ = bridge.send(f);
        }
        let _ = bridge.flush();
        let mut to_host = 0;
        bridge.recv(|f| {
            // A link that is down loses both ways.
            if down {
                s.down_lost += 1;
            } else {
                to_host += 1;
                let _ = host.send(f);
            }
        });
        if to_host > 0 {
            let _ = host.flush();
        }
        s.to_host = to_host;
        {
            let mut total = stats.lock().unwrap_or_else(|e| e.into_inner());
            total.from_host += s.from_host;
            total.to_host += s.to_host;
            total.lost += s.lost;
            total.duplicated += s.duplicated;
            total.reordered += s.reordered;
            total.down_lost += s.down_lost;
        }
        let wait = delayed.front().map_or(Duration::from_millis(100), |d| {
            d.0.saturating_duration_since(Instant::now())
        });
        if !wait.is_zero() {
            wait_readable(fds, wait);
        }
    }
}

/// Both hosts' links of a two-host simulated cluster impaired alike: by the
/// kernel's netem where it has one (on the fabric side of each veth, since
/// the backends' frames bypass the qdiscs of their own side), else by a
/// relay on each port.
pub struct ImpairedLinks {
    relays: Vec<ImpairedPort>,
}

impl ImpairedLinks {
    /// Impairs the links of hosts 0 and 1 of `c` with `imp`.
    pub fn on(c: &crate::cluster::SimCluster, imp: Impairment) -> ImpairedLinks {
        let fabric = c.fabric_netns();
        let netem = |h: usize, add: bool| {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", &fabric, "tc", "qdisc"])
                .arg(if add { "add" } else { "del" })
                .args(["dev", &c.host(h).port, "root", "netem"]);
            if add {
                cmd.args(imp.netem_args());
            }
            cmd.output().is_ok_and(|o| o.status.success())
        };
        if netem(0, true) && netem(1, true) {
            println!("links impaired by tc netem {}", imp.netem_args().join(" "));
            return ImpairedLinks { relays: Vec::new() };
        }
        netem(0, false);
        println!(
            "no netem in this kernel: links impaired by a relay ({})",
            imp.netem_args().join(" ")
        );
        let seed = relay_seed();
        let relays = (0..2)
            .map(|h| ImpairedPort::start(&fabric, &c.host(h).port, h, 9000, imp, seed))
            .collect();
        ImpairedLinks { relays }
    }

    /// Asserts that each relay lost, duplicated and reordered frames (the
    /// run was impaired, not lucky); prints what they did. Nothing to check
    /// under netem, which keeps no counts.
    pub fn assert_impaired(&self) {
        for (h, r) in self.relays.iter().enumerate() {
            let s = r.stats();
            println!("relay of h{h}: {s:?}");
            assert!(
                s.lost > 0 && s.duplicated > 0 && s.reordered > 0,
                "h{h}'s link was impaired: {s:?}"
            );
        }
    }
}

//! Costs of the platform primitives on the simulated hypervisor:
//! - `map_batch/N`: map N granted pages in one call and unmap them again,
//! - `evtchn_round_trip`: notify a port whose other end is in another process, which
//!   notifies back (ping-pong over one interdomain channel),
//! - `xenstore/read`, `xenstore/write`: one request each on a domain's connection.
//!
//! Run: `cargo bench -p xmx-simhv --bench hv -- --warm-up-time 1 --measurement-time 3`.

use std::process::{Child, Command};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use xmx_hv::sim::{SimAdmin, SimPlatform};
use xmx_hv::{DomId, EventChannels, Platform, Port, XBT_NULL};
use xmx_simhv::{Daemon, DaemonHandle, SimhvConfig};

/// Set in the child process of the round-trip benchmark: "DIR,DOMID,PEER,PING,STOP".
const PONG_ENV: &str = "XMX_HV_BENCH_PONG";
/// How long either side waits for the other before giving up.
const PATIENCE: Duration = Duration::from_secs(60);

struct BenchHost {
    _dir: tempfile::TempDir,
    daemon: Option<DaemonHandle>,
    path: std::path::PathBuf,
    granter: DomId,
    mapper: DomId,
}

impl BenchHost {
    fn start() -> BenchHost {
        let dir = tempfile::Builder::new()
            .prefix("simhv-bench")
            .tempdir()
            .unwrap();
        let daemon = Daemon::start(dir.path(), SimhvConfig::default()).unwrap();
        let admin = SimAdmin::connect(dir.path()).unwrap();
        let granter = admin.create("granter", None).unwrap();
        let mapper = admin.create("mapper", None).unwrap();
        BenchHost {
            path: dir.path().to_path_buf(),
            _dir: dir,
            daemon: Some(daemon),
            granter,
            mapper,
        }
    }

    fn attach(&self, domid: DomId) -> SimPlatform {
        SimPlatform::attach(&self.path, domid).unwrap()
    }
}

impl Drop for BenchHost {
    fn drop(&mut self) {
        if let Some(d) = self.daemon.take() {
            d.shutdown();
        }
    }
}

fn map_batch(c: &mut Criterion, host: &BenchHost) {
    let granter = host.attach(host.granter);
    let mapper = host.attach(host.mapper);
    let ggt = granter.grant_table().unwrap();
    let mgt = mapper.grant_table().unwrap();
    let mut group = c.benchmark_group("map_batch");
    for n in [1usize, 16, 256, 2048] {
        let pages = ggt.grant_pages(host.mapper, n, true).unwrap();
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), pages.refs(), |b, refs| {
            b.iter(|| {
                let mapped = mgt.map(host.granter, refs, true).unwrap();
                drop(mapped);
            })
        });
        pages.end_access().map_err(|(_, e)| e).unwrap();
    }
    group.finish();
}

/// Wait for `port` on `ev`; false if it did not come within [`PATIENCE`].
fn await_port(ev: &dyn EventChannels, port: Port, seen: &mut Vec<Port>) -> bool {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        seen.clear();
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || ev.wait(seen, Some(left)).is_err() {
            return false;
        }
        if seen.contains(&port) {
            return true;
        }
    }
}

/// The child's side of the round trip: answer every ping until told to stop.
fn pong(spec: &str) {
    let f: Vec<&str> = spec.split(',').collect();
    let [dir, domid, peer, ping, stop] = f[..] else {
        panic!("bad {PONG_ENV}={spec}");
    };
    let p = SimPlatform::attach(dir, domid.parse().unwrap()).unwrap();
    let peer: DomId = peer.parse().unwrap();
    let ev = p.event_channels().unwrap();
    let ping = ev.bind_interdomain(peer, ping.parse().unwrap()).unwrap();
    let stop = ev.bind_interdomain(peer, stop.parse().unwrap()).unwrap();
    // Tell the parent we are bound.
    ev.notify(ping).unwrap();
    let mut seen = Vec::new();
    loop {
        seen.clear();
        ev.wait(&mut seen, Some(PATIENCE)).unwrap();
        if seen.is_empty() || seen.contains(&stop) {
            return;
        }
        if seen.contains(&ping) {
            ev.unmask(ping).unwrap();
            ev.notify(ping).unwrap();
        }
    }
}

struct Ponger {
    child: Child,
    stop: Port,
}

fn evtchn_round_trip(c: &mut Criterion, host: &BenchHost) {
    let me = host.attach(host.granter);
    let ev = me.event_channels().unwrap();
    let ping = ev.alloc_unbound(host.mapper).unwrap();
    let stop = ev.alloc_unbound(host.mapper).unwrap();
    let spec = format!(
        "{},{},{},{ping},{stop}",
        host.path.display(),
        host.mapper,
        host.granter
    );
    let child = Command::new(std::env::current_exe().unwrap())
        .env(PONG_ENV, spec)
        .spawn()
        .unwrap();
    let mut ponger = Ponger { child, stop };
    let mut seen = Vec::new();
    assert!(
        await_port(ev.as_ref(), ping, &mut seen),
        "the child never bound"
    );
    ev.unmask(ping).unwrap();

    c.bench_function("evtchn_round_trip", |b| {
        b.iter(|| {
            ev.notify(ping).unwrap();
            assert!(await_port(ev.as_ref(), ping, &mut seen), "no pong");
            ev.unmask(ping).unwrap();
        })
    });

    ev.notify(ponger.stop).unwrap();
    let status = ponger.child.wait().unwrap();
    assert!(status.success(), "the pong process failed: {status}");
}

fn xenstore(c: &mut Criterion, host: &BenchHost) {
    let p = host.attach(host.mapper);
    let xs = p.xenstore().unwrap();
    let path = format!("/local/domain/{}/data/bench", host.mapper);
    let value = [0x5au8; 16];
    xs.write(XBT_NULL, &path, &value).unwrap();
    let mut group = c.benchmark_group("xenstore");
    group.bench_function("read", |b| {
        b.iter(|| {
            let v = xs.read(XBT_NULL, &path).unwrap();
            assert_eq!(v.len(), value.len());
        })
    });
    group.bench_function("write", |b| {
        b.iter(|| xs.write(XBT_NULL, &path, &value).unwrap())
    });
    group.finish();
}

fn main() {
    if let Ok(spec) = std::env::var(PONG_ENV) {
        pong(&spec);
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    let host = BenchHost::start();
    map_batch(&mut c, &host);
    evtchn_round_trip(&mut c, &host);
    xenstore(&mut c, &host);
    drop(host);
    c.final_summary();
}

//! Shared pieces of the frontend tests: a simulated host in a temporary directory, the
//! toolstack's device creation, and a minimal dom0 backend written here (it maps what
//! the guest shares and keeps the mappings for the test to inspect).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use xmx_backend::xenbus::toolstack::{self, DeviceSpec};
use xmx_frontend::{EndpointChannel, EndpointHandoff, Frontend, FrontendConfig};
use xmx_hv::sim::SimPlatform;
use xmx_hv::{DomId, EventChannels, GrantTable, MappedPages, Platform, Port, DOM0, XBT_NULL};
use xmx_wire::msg::{
    unpack_info_page, unpack_info_pages, CtrlBack, CtrlKind, CtrlOp, CtrlReply, CtrlResponse,
    CtrlStatus, EndpointPages,
};
use xmx_wire::ring::SharedMem;
use xmx_wire::xenbus::{self, keys, XenbusState};

#[allow(unused_imports)] // each test binary uses its part
pub use xmx_simkit::{eventually, guest_mac, wait_front_state, SimHost, WAIT};

/// A simulated host in a temporary directory, with the guests and frontends the tests
/// create on it.
pub struct FrontendTestHost(SimHost);

impl std::ops::Deref for FrontendTestHost {
    type Target = SimHost;
    fn deref(&self) -> &SimHost {
        &self.0
    }
}

impl FrontendTestHost {
    pub fn start() -> FrontendTestHost {
        FrontendTestHost(SimHost::start())
    }

    pub fn start_with(config: xmx_simhv::SimhvConfig) -> FrontendTestHost {
        FrontendTestHost(SimHost::start_with(config))
    }

    /// Create a guest and its xmx device 0, as the toolstack does.
    pub fn guest(&self, name: &str, mac_last: u8) -> DomId {
        let domid = self.create(name);
        let xs0 = self.xs0();
        let spec = DeviceSpec {
            domu: domid,
            devid: 0,
            mac: guest_mac(mac_last),
            cluster: 1,
            hostname: format!("{name}:0"),
        };
        toolstack::attach(xs0.as_ref(), DOM0, &spec).unwrap();
        domid
    }

    /// A frontend of `domid`'s device 0.
    pub fn frontend(&self, domid: DomId, cfg: FrontendConfig) -> Frontend {
        Frontend::new(Arc::new(self.attach(domid)), cfg).unwrap()
    }
}

/// Pump `fe` until `cond` holds. An error of the pump in which `cond` came to hold ends the
/// wait as well: a frontend that suspended for a migration may see its domain leave the host
/// (its xenstore connection closes) before that pump returns.
pub fn pump_until(fe: &mut Frontend, what: &str, mut cond: impl FnMut(&Frontend) -> bool) {
    let deadline = Instant::now() + WAIT;
    fe.advance().unwrap();
    while !cond(fe) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "never happened: {what} (frontend at {:?})",
            fe.state()
        );
        if let Err(e) = fe.pump(Some(left)) {
            assert!(cond(fe), "{what}: {e}");
        }
    }
}

/// Small endpoint pages for tests.
pub fn small_geometry() -> EndpointPages {
    EndpointPages {
        send_ring: 1,
        event_ring: 1,
        send_queue: 4,
        recv_queue: 4,
    }
}

/// `len` bytes at `offset` of a mapping, copied out.
pub fn read_mapped(m: &Arc<MappedPages>, offset: usize, len: usize) -> Vec<u8> {
    let mem = mapped_mem(m);
    let mut out = vec![0u8; len];
    assert!(mem.read_bytes(offset, &mut out), "read past the mapping");
    out
}

/// Write `bytes` at `offset` of a mapping.
pub fn write_mapped(m: &Arc<MappedPages>, offset: usize, bytes: &[u8]) {
    assert!(
        mapped_mem(m).write_bytes(offset, bytes),
        "write past the mapping"
    );
}

pub fn mapped_mem(m: &Arc<MappedPages>) -> SharedMem {
    mapped_window(m, 0, m.len())
}

/// `len` bytes at `offset` of a mapping as ring memory.
pub fn mapped_window(m: &Arc<MappedPages>, offset: usize, len: usize) -> SharedMem {
    assert!(offset + len <= m.len());
    let owner: Arc<dyn Send + Sync> = m.clone();
    // SAFETY: the range lies inside the mapping (checked), which `owner` keeps alive;
    // only accessed through SharedMem.
    unsafe { SharedMem::from_raw_with_owner(m.as_ptr().add(offset), len, owner) }.unwrap()
}

/// An endpoint as the fake backend holds it.
pub struct FakeBackendEndpoint {
    /// The refs it read from the info page.
    pub refs: Vec<u32>,
    pub pages: EndpointPages,
    pub mapping: Arc<MappedPages>,
    pub port: Port,
    /// As the open asked (`EndpointOpen::quiet_send_done`).
    pub quiet_send_done: bool,
}

/// A region as the fake backend holds it.
pub struct FakeBackendRegion {
    pub info_refs: Vec<u32>,
    pub refs: Vec<u32>,
    pub length: u32,
    pub mapping: Arc<MappedPages>,
}

/// What the fake backend did and holds.
#[derive(Default)]
pub struct FakeState {
    /// Every control request, in order.
    pub requests: Vec<CtrlKind>,
    pub endpoints: BTreeMap<u8, FakeBackendEndpoint>,
    pub regions: BTreeMap<(u8, u8), FakeBackendRegion>,
    /// Leave requests unanswered while set.
    pub hold: bool,
    /// A request waits unanswered in the ring because of `hold`.
    pub held_pending: bool,
    /// Times a guest notification woke the service loop.
    pub wakeups: u64,
}

impl FakeState {
    pub fn count(&self, kind: CtrlKind) -> usize {
        self.requests.iter().filter(|k| **k == kind).count()
    }
}

/// A minimal dom0 backend for one guest's device 0, on a thread.
pub struct FakeBackend {
    pub state: Arc<Mutex<FakeState>>,
    stop: Arc<AtomicBool>,
    close: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeBackend {
    /// Offer the device (InitWait) and serve the guest once it publishes its ring.
    pub fn start(host: &FrontendTestHost, domu: DomId) -> FakeBackend {
        let state = Arc::new(Mutex::new(FakeState::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let close = Arc::new(AtomicBool::new(false));
        let platform = host.attach(DOM0);
        let (s, st, cl) = (state.clone(), stop.clone(), close.clone());
        let thread = std::thread::spawn(move || run_fake(platform, domu, s, st, cl));
        FakeBackend {
            state,
            stop,
            close,
            thread: Some(thread),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap()
    }

    /// Close the device from the backend's side (Closing, release, Closed) and stop.
    pub fn close(mut self) {
        self.close.store(true, Ordering::Release);
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for FakeBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run_fake(
    platform: SimPlatform,
    domu: DomId,
    state: Arc<Mutex<FakeState>>,
    stop: Arc<AtomicBool>,
    close: Arc<AtomicBool>,
) {
    let xs = platform.xenstore().unwrap();
    let gnttab = platform.grant_table().unwrap();
    let evtchn = platform.event_channels().unwrap();
    let bdir = xenbus::backend_dir(DOM0, domu, 0);
    let fdir = xenbus::frontend_dir(domu, 0);
    let put = |key: &str, v: &str| {
        xs.write(XBT_NULL, &xenbus::key_path(&bdir, key), v.as_bytes())
            .unwrap()
    };
    put(keys::MAX_ENDPOINTS, "8");
    put(keys::MAX_REGIONS, "16");
    put(keys::PROTOCOL_VERSION, "1");
    put(keys::STATE, &XenbusState::InitWait.to_string());
    let front_state = || -> Option<XenbusState> {
        let v = xs
            .read(XBT_NULL, &xenbus::key_path(&fdir, keys::STATE))
            .ok()?;
        String::from_utf8(v).ok()?.parse().ok()
    };
    let front_key = |key: &str| -> u32 {
        let v = xs.read(XBT_NULL, &xenbus::key_path(&fdir, key)).unwrap();
        String::from_utf8(v).unwrap().trim().parse().unwrap()
    };
    xs.watch(&xenbus::key_path(&fdir, keys::STATE), "fake")
        .unwrap();
    let deadline = Instant::now() + WAIT;
    while front_state() != Some(XenbusState::Initialised) {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "the frontend never said Initialised");
        let _ = xs.next_watch_event(Some(left.min(Duration::from_millis(50))));
    }
    let ring_ref = front_key(keys::RING_REF);
    let remote_port = front_key(keys::EVENT_CHANNEL);
    assert_eq!(front_key(keys::PROTOCOL_VERSION), 1);
    let ring_map = Arc::new(gnttab.map(domu, &[ring_ref], true).unwrap());
    let mut ring = CtrlBack::new(mapped_mem(&ring_map)).unwrap();
    let port = evtchn.bind_interdomain(domu, remote_port).unwrap();
    put(keys::STATE, &XenbusState::Connected.to_string());

    let mut ports = Vec::new();
    while !stop.load(Ordering::Acquire) {
        let held = {
            let mut st = state.lock().unwrap();
            st.held_pending = st.hold && ring.unconsumed_requests().unwrap() > 0;
            st.hold
        };
        let mut answered = false;
        if !held {
            while let Some(req) = ring.next_request().unwrap() {
                let rsp = serve(&*gnttab, &*evtchn, domu, &state, &req);
                ring.push_response(&rsp).unwrap();
                answered = true;
            }
        }
        if answered && ring.push_responses_and_check_notify() {
            evtchn.notify(port).unwrap();
        }
        if !held && ring.final_check_for_requests().unwrap() {
            continue;
        }
        let mut front_closing = false;
        while let Ok(Some(_)) = xs.next_watch_event(Some(Duration::ZERO)) {
            front_closing |= matches!(
                front_state(),
                None | Some(XenbusState::Closing) | Some(XenbusState::Closed)
            );
        }
        if front_closing {
            close.store(true, Ordering::Release);
            break;
        }
        ports.clear();
        evtchn
            .wait(&mut ports, Some(Duration::from_millis(20)))
            .unwrap();
        for p in ports.drain(..) {
            state.lock().unwrap().wakeups += 1;
            evtchn.unmask(p).unwrap();
        }
    }
    if close.load(Ordering::Acquire) {
        put(keys::STATE, &XenbusState::Closing.to_string());
        let mut st = state.lock().unwrap();
        for (_, ep) in std::mem::take(&mut st.endpoints) {
            let _ = evtchn.close(ep.port);
        }
        st.regions.clear();
        drop(st);
        drop(ring);
        drop(ring_map);
        evtchn.close(port).unwrap();
        put(keys::STATE, &XenbusState::Closed.to_string());
    }
}

fn serve(
    gnttab: &dyn GrantTable,
    evtchn: &dyn EventChannels,
    domu: DomId,
    state: &Mutex<FakeState>,
    req: &xmx_wire::msg::CtrlRequest,
) -> CtrlResponse {
    let mut st = state.lock().unwrap();
    st.requests.push(req.op.kind());
    let status = match &req.op {
        CtrlOp::EndpointOpen(open) => (|| {
            let info = Arc::new(
                gnttab
                    .map(domu, &[open.info_ref], false)
                    .map_err(|_| CtrlStatus::BadGrant)?,
            );
            let page = read_mapped(&info, 0, 4096);
            drop(info);
            let refs =
                unpack_info_page(&page, open.pages.total()).map_err(|_| CtrlStatus::Malformed)?;
            let mapping = Arc::new(
                gnttab
                    .map(domu, &refs, true)
                    .map_err(|_| CtrlStatus::BadGrant)?,
            );
            let port = evtchn
                .bind_interdomain(domu, open.event_channel)
                .map_err(|_| CtrlStatus::Malformed)?;
            st.endpoints.insert(
                open.endpoint,
                FakeBackendEndpoint {
                    refs,
                    pages: open.pages,
                    mapping,
                    port,
                    quiet_send_done: open.quiet_send_done,
                },
            );
            Ok(())
        })()
        .err()
        .unwrap_or(CtrlStatus::Ok),
        CtrlOp::EndpointClose { endpoint } => match st.endpoints.remove(endpoint) {
            Some(ep) => {
                evtchn.close(ep.port).unwrap();
                st.regions.retain(|(e, _), _| e != endpoint);
                CtrlStatus::Ok
            }
            None => CtrlStatus::EndpointNotOpen,
        },
        CtrlOp::RegionRegister(reg) => (|| {
            let info = Arc::new(
                gnttab
                    .map(domu, &reg.info_refs, false)
                    .map_err(|_| CtrlStatus::BadGrant)?,
            );
            let pages: Vec<Vec<u8>> = (0..reg.info_refs.len())
                .map(|i| read_mapped(&info, i * 4096, 4096))
                .collect();
            drop(info);
            let refs = unpack_info_pages(&pages, reg.nr_pages() as usize)
                .map_err(|_| CtrlStatus::Malformed)?;
            let mapping = Arc::new(
                gnttab
                    .map(domu, &refs, true)
                    .map_err(|_| CtrlStatus::BadGrant)?,
            );
            st.regions.insert(
                (reg.endpoint, reg.region_id),
                FakeBackendRegion {
                    info_refs: reg.info_refs.clone(),
                    refs,
                    length: reg.length,
                    mapping,
                },
            );
            Ok(())
        })()
        .err()
        .unwrap_or(CtrlStatus::Ok),
        CtrlOp::RegionDeregister {
            endpoint,
            region_id,
        } => match st.regions.remove(&(*endpoint, *region_id)) {
            Some(_) => CtrlStatus::Ok,
            None => CtrlStatus::BadRegion,
        },
    };
    let mut rsp = CtrlResponse::answering(req, status);
    if let CtrlReply::EndpointOpen { endpoint, .. } = rsp.reply {
        rsp.reply = CtrlReply::EndpointOpen {
            endpoint,
            session_id: 0x5e55_0000 | u32::from(endpoint),
        };
    }
    rsp
}

/// Map an endpoint handed over, as the application would.
pub fn channel(h: EndpointHandoff) -> EndpointChannel {
    EndpointChannel::from_handoff(h).unwrap()
}

//! Shared pieces of the backend daemon tests: a simulated host in a temporary directory, a
//! backend serving it on a thread, and a minimal frontend that plays a guest (grants its
//! pages, writes its xenstore keys, pushes control and send requests, waits on its event
//! channel).
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use xmx_backend::admin::{BackdRequest, CountersReport, GuestReport, PeerSpec};
use xmx_backend::service::{Backend, BackendConfig, BackendThread, FrameLink, GuestQuotas};
use xmx_backend::xenbus::toolstack::{self, DeviceSpec};
use xmx_hv::sim::SimPlatform;
use xmx_hv::{
    DomId, EventChannels, GrantTable, GrantedPages, Platform, Port, Xenstore, DOM0, PAGE_SIZE,
    XBT_NULL,
};
use xmx_nic::{NicConfig, PacketSocket};
use xmx_wire::msg::{
    pack_info_page, pack_info_pages, CtrlFront, CtrlOp, CtrlRequest, CtrlResponse, EndpointOpen,
    EndpointPages, Event, EventBack, RegionRegister, SendFront, SendRequest, PROTOCOL_VERSION,
};
use xmx_wire::ring::{init_shared, SharedMem};
use xmx_wire::xenbus::{self, keys, XenbusState};

#[allow(unused_imports)] // each test binary uses its part
pub use xmx_simkit::{eventually, guest_mac, wait_removed, SimHost, WAIT};

/// A simulated host in a temporary directory, with what the backend tests start on it.
pub struct BackdTestHost(SimHost);

impl std::ops::Deref for BackdTestHost {
    type Target = SimHost;
    fn deref(&self) -> &SimHost {
        &self.0
    }
}

impl BackdTestHost {
    pub fn start() -> BackdTestHost {
        BackdTestHost(SimHost::start())
    }

    /// A backend in dom0 of this host, on its own thread, without a NIC.
    pub fn start_backend(&self, quotas: GuestQuotas) -> BackendThread {
        let dom0 = self.attach(DOM0);
        let cfg = BackendConfig {
            host_name: "testhost".into(),
            quotas,
            ..BackendConfig::default()
        };
        Backend::new(&dom0, None, cfg).unwrap().spawn().unwrap()
    }

    /// A backend in dom0 of this host on its own thread, on interface `ifname` of network
    /// namespace `netns` (promiscuous, as the daemon opens it), whose peer table holds the
    /// guests of MAC ending 1 and 2 in cluster 1: the two-host wire tests' set-up.
    pub fn start_wire_backend(&self, netns: &str, ifname: &str) -> BackendThread {
        let cfg = NicConfig {
            promiscuous: true,
            ..NicConfig::default()
        };
        let sock = PacketSocket::open_in_netns(netns, ifname, cfg).expect("packet socket");
        let link: Box<dyn FrameLink> = Box::new(sock);
        let cfg = BackendConfig {
            host_name: netns.into(),
            ..BackendConfig::default()
        };
        let backend = Backend::new(&self.attach(DOM0), Some(link), cfg)
            .unwrap()
            .spawn()
            .unwrap();
        set_two_guest_peers(&backend);
        backend
    }

    /// Create a guest domain and its xmx device 0 as the toolstack does.
    pub fn guest(&self, name: &str, mac_last: u8, cluster: u32) -> FakeGuest {
        let domid = self.create(name);
        let xs0 = self.attach(DOM0).xenstore().unwrap();
        let spec = DeviceSpec {
            domu: domid,
            devid: 0,
            mac: guest_mac(mac_last),
            cluster,
            hostname: format!("{name}:0"),
        };
        toolstack::attach(xs0.as_ref(), DOM0, &spec).unwrap();
        FakeGuest::new(self, domid, 0)
    }
}

/// Gives `backend` the peer table the tests use: the guests of MAC ending 1 and 2 (peer
/// indices 0 and 1, hostnames `g1:0` and `g2:0`), both in cluster 1.
pub fn set_two_guest_peers(backend: &BackendThread) {
    let peers = [(0u16, 1u8), (1, 2)]
        .iter()
        .map(|&(index, last)| PeerSpec {
            index,
            mac: guest_mac(last).to_string(),
            hostname: format!("g{last}:0"),
            cluster: 1,
        })
        .collect();
    backend
        .control()
        .call(BackdRequest::SetPeers { peers })
        .into_result()
        .unwrap();
}

/// What `backend` counts so far.
pub fn counters(backend: &BackendThread) -> CountersReport {
    serde_json::from_value(
        backend
            .control()
            .call(BackdRequest::Counters)
            .into_result()
            .unwrap(),
    )
    .unwrap()
}

/// What `backend` reports of its guests.
pub fn guest_reports(backend: &BackendThread) -> Vec<GuestReport> {
    serde_json::from_value(
        backend
            .control()
            .call(BackdRequest::Guests)
            .into_result()
            .unwrap(),
    )
    .unwrap()
}

/// What `backend` reports of guest `domid`.
pub fn guest_report(backend: &BackendThread, domid: DomId) -> GuestReport {
    guest_reports(backend)
        .into_iter()
        .find(|g| g.domid == domid)
        .unwrap()
}

/// Ring memory over pages this guest granted.
fn granted_mem(pages: &Arc<GrantedPages>, offset: usize, len: usize) -> SharedMem {
    assert!(offset + len <= pages.len());
    let owner: Arc<dyn Send + Sync> = pages.clone();
    // SAFETY: the range lies inside the granted, writable mapping that `owner` keeps
    // alive; the test touches it only through SharedMem.
    unsafe { SharedMem::from_raw_with_owner(pages.as_ptr().add(offset), len, owner) }.unwrap()
}

/// The guest's side of the control ring.
pub struct Ctrl {
    pub ring: CtrlFront,
    pub port: Port,
    pub pages: Arc<GrantedPages>,
}

/// The application's side of an open endpoint.
pub struct FakeGuestEndpoint {
    pub index: u8,
    pub port: Port,
    pub session: u32,
    pub send: SendFront,
    pub events: EventBack,
    pub sendq: SharedMem,
    pub recvq: SharedMem,
    pub pages: Arc<GrantedPages>,
    pub info: GrantedPages,
}

/// A registered region's pages, kept granted by the guest.
pub struct FakeGuestRegion {
    pub pages: Arc<GrantedPages>,
    pub info: GrantedPages,
    pub mem: SharedMem,
}

/// A minimal frontend playing one guest's device.
pub struct FakeGuest {
    pub domid: DomId,
    pub devid: u32,
    pub platform: SimPlatform,
    pub xs: Box<dyn Xenstore>,
    pub gnttab: Arc<dyn GrantTable>,
    pub evtchn: Box<dyn EventChannels>,
    pub ctrl: Option<Ctrl>,
    /// Open endpoints asking for quiet send completions (off: this guest sleeps until
    /// its own sends are done, as any `io/ring.h` consumer may).
    pub quiet_send_done: bool,
    next_tag: u32,
    next_watch: u32,
}

impl FakeGuest {
    pub fn new(host: &BackdTestHost, domid: DomId, devid: u32) -> FakeGuest {
        let platform = host.attach(domid);
        let xs = platform.xenstore().unwrap();
        let gnttab = platform.grant_table().unwrap();
        let evtchn = platform.event_channels().unwrap();
        FakeGuest {
            domid,
            devid,
            platform,
            xs,
            gnttab,
            evtchn,
            ctrl: None,
            quiet_send_done: false,
            next_tag: 1,
            next_watch: 0,
        }
    }

    pub fn frontend_dir(&self) -> String {
        xenbus::frontend_dir(self.domid, self.devid)
    }

    pub fn backend_dir(&self) -> String {
        xenbus::backend_dir(DOM0, self.domid, self.devid)
    }

    pub fn write_front(&self, key: &str, value: &str) {
        self.xs
            .write(
                XBT_NULL,
                &xenbus::key_path(&self.frontend_dir(), key),
                value.as_bytes(),
            )
            .unwrap();
    }

    pub fn set_state(&self, state: XenbusState) {
        self.write_front(keys::STATE, &state.to_string());
    }

    pub fn read_backend(&self, key: &str) -> Option<String> {
        self.xs
            .read(XBT_NULL, &xenbus::key_path(&self.backend_dir(), key))
            .ok()
            .map(|v| String::from_utf8(v).unwrap())
    }

    pub fn backend_state(&self) -> Option<XenbusState> {
        self.read_backend(keys::STATE).and_then(|s| s.parse().ok())
    }

    /// Wait, on a xenstore watch, until the backend's state is `want`.
    pub fn wait_backend_state(&mut self, want: XenbusState) {
        let path = xenbus::key_path(&self.backend_dir(), keys::STATE);
        self.next_watch += 1;
        let token = format!("test-{}", self.next_watch);
        self.xs.watch(&path, &token).unwrap();
        let deadline = Instant::now() + WAIT;
        loop {
            if self.backend_state() == Some(want) {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "backend of dom{} never reached {want:?} (at {:?})",
                self.domid,
                self.backend_state()
            );
            let _ = self.xs.next_watch_event(Some(left)).unwrap();
        }
        self.xs.unwatch(&path, &token).unwrap();
        // Events of the removed watch may still be queued; they are harmless but drained.
        while let Ok(Some(_)) = self.xs.next_watch_event(Some(Duration::ZERO)) {}
    }

    /// Publish a control ring and event channel, say Initialised, wait for Connected.
    pub fn connect(&mut self) {
        self.wait_backend_state(XenbusState::InitWait);
        let pages = Arc::new(self.gnttab.grant_pages(DOM0, 1, true).unwrap());
        let ring = CtrlFront::new(granted_mem(&pages, 0, PAGE_SIZE)).unwrap();
        let port = self.evtchn.alloc_unbound(DOM0).unwrap();
        self.write_front(keys::RING_REF, &pages.refs()[0].to_string());
        self.write_front(keys::EVENT_CHANNEL, &port.to_string());
        self.write_front(keys::PROTOCOL_VERSION, &PROTOCOL_VERSION.to_string());
        self.ctrl = Some(Ctrl { ring, port, pages });
        self.set_state(XenbusState::Initialised);
        self.wait_backend_state(XenbusState::Connected);
        self.set_state(XenbusState::Connected);
    }

    /// Close the device from the guest's side and wait for the backend to be Closed.
    pub fn close(&mut self) {
        self.set_state(XenbusState::Closing);
        self.wait_backend_state(XenbusState::Closed);
        self.set_state(XenbusState::Closed);
        self.ctrl = None;
    }

    fn tag(&mut self) -> u32 {
        self.next_tag += 1;
        self.next_tag
    }

    /// Wait on the event channel (any port) and re-enable what fired.
    pub fn wait_evtchn(&self, deadline: Instant) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "dom{}: nothing came", self.domid);
        let mut ports = Vec::new();
        self.evtchn.wait(&mut ports, Some(left)).unwrap();
        for p in ports {
            self.evtchn.unmask(p).unwrap();
        }
    }

    /// Push a control request and wait for its response.
    pub fn call(&mut self, op: CtrlOp) -> CtrlResponse {
        let tag = self.tag();
        let ctrl = self.ctrl.as_mut().expect("connected");
        ctrl.ring.push_request(&CtrlRequest { tag, op }).unwrap();
        if ctrl.ring.push_requests_and_check_notify() {
            self.evtchn.notify(ctrl.port).unwrap();
        }
        self.wait_response(tag)
    }

    /// Wait for the response tagged `tag` on the control ring.
    pub fn wait_response(&mut self, tag: u32) -> CtrlResponse {
        let deadline = Instant::now() + WAIT;
        loop {
            let ctrl = self.ctrl.as_mut().expect("connected");
            if let Some(rsp) = ctrl.ring.next_response().unwrap() {
                assert_eq!(rsp.tag, tag, "responses come in order");
                return rsp;
            }
            if !ctrl.ring.final_check_for_responses().unwrap() {
                self.wait_evtchn(deadline);
            }
        }
    }

    /// Write raw bytes as the next control request (a hostile guest) and publish it.
    pub fn push_raw_ctrl(&mut self, slot: &[u8]) {
        let ctrl = self.ctrl.as_mut().expect("connected");
        let mem = ctrl.ring.mem().clone();
        let idx = ctrl.ring.req_prod_pvt();
        let size = ctrl.ring.size();
        let off = 64 + (idx & (size - 1)) as usize * xmx_wire::msg::CTRL_SLOT_SIZE;
        assert!(mem.write_bytes(off, slot));
        mem.store_u32(0, idx + 1, std::sync::atomic::Ordering::Release);
        self.evtchn.notify(ctrl.port).unwrap();
    }

    /// Grant an endpoint's pages and info page and ask the backend to open it.
    pub fn open_endpoint(
        &mut self,
        index: u8,
        pages: EndpointPages,
    ) -> (CtrlResponse, Option<FakeGuestEndpoint>) {
        self.open_endpoint_resuming(index, pages, 0)
    }

    /// [`FakeGuest::open_endpoint`], asking to keep session `resume_session`.
    pub fn open_endpoint_resuming(
        &mut self,
        index: u8,
        pages: EndpointPages,
        resume_session: u32,
    ) -> (CtrlResponse, Option<FakeGuestEndpoint>) {
        let total = pages.total();
        let granted = Arc::new(self.gnttab.grant_pages(DOM0, total, true).unwrap());
        let info = self.gnttab.grant_pages(DOM0, 1, false).unwrap();
        let mut page = vec![0u8; PAGE_SIZE];
        pack_info_page(granted.refs(), &mut page).unwrap();
        let info_mem = granted_mem_plain(&info);
        assert!(info_mem.write_bytes(0, &page));
        let at = |r: std::ops::Range<usize>| (r.start * PAGE_SIZE, r.len() * PAGE_SIZE);
        let (so, sl) = at(pages.send_ring_refs());
        let (eo, el) = at(pages.event_ring_refs());
        let (qo, ql) = at(pages.send_queue_refs());
        let (ro, rl) = at(pages.recv_queue_refs());
        let send = SendFront::new(granted_mem(&granted, so, sl)).unwrap();
        let event_mem = granted_mem(&granted, eo, el);
        init_shared(&event_mem, 0).unwrap();
        let events = EventBack::new(event_mem).unwrap();
        let port = self.evtchn.alloc_unbound(DOM0).unwrap();
        let rsp = self.call(CtrlOp::EndpointOpen(EndpointOpen {
            endpoint: index,
            event_channel: port,
            info_ref: info.refs()[0],
            pages,
            resume_session,
            quiet_send_done: self.quiet_send_done,
        }));
        if rsp.status != xmx_wire::msg::CtrlStatus::Ok {
            self.evtchn.close(port).unwrap();
            return (rsp, None);
        }
        let session = match rsp.reply {
            xmx_wire::msg::CtrlReply::EndpointOpen { session_id, .. } => session_id,
            other => panic!("answer to an open: {other:?}"),
        };
        let ep = FakeGuestEndpoint {
            index,
            port,
            session,
            send,
            events,
            sendq: granted_mem(&granted, qo, ql),
            recvq: granted_mem(&granted, ro, rl),
            pages: granted,
            info,
        };
        (rsp, Some(ep))
    }

    /// Grant a region of `len` bytes starting `offset` bytes into its first page, fill it
    /// with `fill`, and ask the backend to register it.
    pub fn register_region(
        &mut self,
        endpoint: u8,
        region_id: u8,
        offset: u16,
        len: u32,
    ) -> (CtrlResponse, FakeGuestRegion) {
        let nr = (usize::from(offset) + len as usize).div_ceil(PAGE_SIZE);
        let pages = Arc::new(self.gnttab.grant_pages(DOM0, nr, true).unwrap());
        let packed = pack_info_pages(pages.refs());
        let info = self.gnttab.grant_pages(DOM0, packed.len(), false).unwrap();
        let info_mem = granted_mem_plain(&info);
        for (i, p) in packed.iter().enumerate() {
            assert!(info_mem.write_bytes(i * PAGE_SIZE, p));
        }
        let rsp = self.call(CtrlOp::RegionRegister(RegionRegister {
            endpoint,
            region_id,
            first_page_offset: offset,
            length: len,
            info_refs: info.refs().to_vec(),
        }));
        let mem = granted_mem(&pages, 0, pages.len());
        (rsp, FakeGuestRegion { pages, info, mem })
    }

    /// Put a request on an endpoint's send ring and notify if the backend asked.
    pub fn send(&self, ep: &mut FakeGuestEndpoint, req: SendRequest) {
        let deadline = Instant::now() + WAIT;
        loop {
            ep.send.reclaim().unwrap();
            if !ep.send.is_full() {
                break;
            }
            if !ep.send.final_check_for_responses().unwrap() {
                self.wait_evtchn(deadline);
            }
        }
        ep.send.push_request(&req).unwrap();
        if ep.send.push_requests_and_check_notify() {
            self.evtchn.notify(ep.port).unwrap();
        }
    }

    /// The next event of an endpoint, waiting on the event channel; its slot stays taken
    /// until [`FakeGuest::retire_events`].
    pub fn next_event(&self, ep: &mut FakeGuestEndpoint) -> Event {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(ev) = ep.events.next_request().unwrap() {
                return ev;
            }
            if !ep.events.final_check_for_requests().unwrap() {
                self.wait_evtchn(deadline);
            }
        }
    }

    /// Hand consumed event slots back to the backend.
    pub fn retire_events(&self, ep: &mut FakeGuestEndpoint) {
        ep.events.retire_consumed();
        if ep.events.push_responses_and_check_notify() {
            self.evtchn.notify(ep.port).unwrap();
        }
    }
}

/// Ring memory over the whole of a granted mapping, without an owner (the caller keeps the
/// grant alive while the memory is used).
fn granted_mem_plain(pages: &GrantedPages) -> SharedMem {
    // SAFETY: the mapping is writable, `pages.len()` long, and outlives every use the
    // helpers above make of the returned handle (within the same call).
    unsafe { SharedMem::from_raw(pages.as_ptr(), pages.len()) }.unwrap()
}

/// A one-page-ring endpoint with `queue` pages in each queue.
pub fn small_endpoint(queue: u16) -> EndpointPages {
    EndpointPages {
        send_ring: 1,
        event_ring: 1,
        send_queue: queue,
        recv_queue: queue,
    }
}

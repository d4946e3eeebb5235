//! Rough figures for the guest side on the simulator, printed, never asserted (timing
//! depends on the machine): TINY round trips through handed-over rings and the real
//! backend, and what the registration cache saves per LARGE message.
//!
//! `cargo test -p xmx-frontend --test measure -- --ignored --nocapture`

mod common;

use std::time::Instant;

use common::*;
use xmx_backend::admin::{BackdRequest, PeerSpec};
use xmx_backend::service::{Backend, BackendConfig};
use xmx_frontend::{
    EndpointChannel, Frontend, FrontendConfig, RegionCache, RegionWindow, Registrar, Wake,
};
use xmx_wire::msg::{
    EndpointPages, EventBody, InlineData, InlineMsg, MsgInfo, Route, SendOp, SendRequest,
};

struct MeasureRegistrar<'a>(&'a mut Frontend);

impl Registrar for MeasureRegistrar<'_> {
    fn register(&mut self, endpoint: u8, length: u32) -> xmx_frontend::Result<RegionWindow> {
        RegionWindow::from_handoff(self.0.register_region(endpoint, length)?)
    }
    fn deregister(&mut self, w: RegionWindow) -> xmx_frontend::Result<()> {
        let (e, id) = (w.endpoint(), w.region_id());
        drop(w);
        self.0.deregister_region(e, id)
    }
}

/// Wait for a message event on `ch`, handing completions back on the way.
fn receive(ch: &mut EndpointChannel) {
    loop {
        match ch.wait_event(Some(WAIT), None).unwrap() {
            Wake::Event(ev) => {
                if matches!(ev.body, EventBody::RecvTiny { .. }) {
                    ch.release_events().unwrap();
                    return;
                }
            }
            other => panic!("{other:?}"),
        }
    }
}

fn tiny(to: &EndpointChannel, seq: u16) -> SendRequest {
    SendRequest {
        tag: u32::from(seq),
        route: Route {
            peer_index: 0,
            endpoint: to.endpoint(),
            session_id: to.session_id(),
        },
        op: SendOp::Tiny(InlineMsg {
            info: MsgInfo {
                seqnum: seq,
                piggyack: 0,
                match_info: 1,
            },
            data: InlineData::new(b"ping").unwrap(),
        }),
    }
}

#[test]
#[ignore = "prints figures; run explicitly"]
fn figures() {
    let host = FrontendTestHost::start();
    let dom0 = host.attach(xmx_hv::DOM0);
    let backend = Backend::new(&dom0, None, BackendConfig::default())
        .unwrap()
        .spawn()
        .unwrap();
    let peers = vec![PeerSpec {
        index: 0,
        mac: guest_mac(1).to_string(),
        hostname: "g1:0".into(),
        cluster: 1,
    }];
    backend
        .control()
        .call(BackdRequest::SetPeers { peers })
        .into_result()
        .unwrap();
    let g = host.guest("g1", 1);
    let mut fe = host.frontend(g, FrontendConfig::default());
    fe.wait_connected(WAIT).unwrap();
    let geometry = EndpointPages {
        send_ring: 2,
        event_ring: 4,
        send_queue: 4,
        recv_queue: 4,
    };
    let mut a = channel(fe.open_endpoint(Some(0), Some(geometry)).unwrap());
    let mut b = channel(fe.open_endpoint(Some(1), Some(geometry)).unwrap());

    let rounds = 2000u16;
    let start = Instant::now();
    for i in 0..rounds {
        let req = tiny(&b, i);
        a.send(&req).unwrap();
        receive(&mut b);
        let req = tiny(&a, i);
        b.send(&req).unwrap();
        receive(&mut a);
    }
    let rtt = start.elapsed() / u32::from(rounds);
    eprintln!(
        "TINY round trip, two endpoints of one guest through the backend: {rtt:?} \
         (blocks: a {}, b {})",
        a.stats().blocks,
        b.stats().blocks
    );

    let buffer = vec![7u8; 256 * 1024];
    let addr = buffer.as_ptr() as usize;
    let n = 200u32;
    for enabled in [false, true] {
        let mut cache = RegionCache::new(enabled, 8);
        let mut reg = MeasureRegistrar(&mut fe);
        let start = Instant::now();
        for _ in 0..n {
            let l = cache.acquire(&mut reg, 0, addr, buffer.len()).unwrap();
            cache.window(l).unwrap().write(0, &buffer).unwrap();
            cache.release(&mut reg, l).unwrap();
        }
        let per = start.elapsed() / n;
        eprintln!(
            "256 KiB window per LARGE message, MX_RCACHE={}: {per:?} (registrations {})",
            u8::from(enabled),
            cache.stats().registrations
        );
        cache.flush(&mut reg).unwrap();
    }
    drop((a, b));
    drop(fe);
    drop(backend);
}

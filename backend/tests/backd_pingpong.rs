//! TINY ping-pong between two co-located guests through the backend's rings, for figures:
//! `cargo test -p xmx-backend --release --test backd_pingpong -- --ignored --nocapture`.
//! Each guest runs on its own thread and sleeps on its event channel between messages, so
//! a round trip costs two backend wake-ups and two guest wake-ups. Nothing is asserted about
//! time; the bytes of every message are checked.

mod backd_util;

use std::time::{Duration, Instant};

use backd_util::{
    set_two_guest_peers, small_endpoint, BackdTestHost, FakeGuest, FakeGuestEndpoint,
};
use xmx_backend::service::{Backend, BackendConfig};
use xmx_hv::DOM0;
use xmx_wire::msg::{EventBody, InlineData, InlineMsg, MsgInfo, Route, SendOp, SendRequest};

const ROUNDS: u32 = 2000;

fn tiny(tag: u32, to: Route, payload: &[u8]) -> SendRequest {
    SendRequest {
        tag,
        route: to,
        op: SendOp::Tiny(InlineMsg {
            info: MsgInfo {
                seqnum: tag as u16,
                piggyack: 0,
                match_info: u64::from(tag),
            },
            data: InlineData::new(payload).unwrap(),
        }),
    }
}

/// The next received TINY's payload; completions on the way are handed back.
fn receive(g: &FakeGuest, ep: &mut FakeGuestEndpoint) -> Vec<u8> {
    loop {
        let ev = g.next_event(ep);
        g.retire_events(ep);
        if let EventBody::RecvTiny { msg, .. } = ev.body {
            return msg.data.as_slice().to_vec();
        }
    }
}

fn run(spin: Duration) -> Vec<Duration> {
    let host = BackdTestHost::start();
    let dom0 = host.attach(DOM0);
    let cfg = BackendConfig {
        spin,
        ..BackendConfig::default()
    };
    let backend = Backend::new(&dom0, None, cfg).unwrap().spawn().unwrap();
    set_two_guest_peers(&backend);
    let mut a = host.guest("a", 1, 1);
    let mut b = host.guest("b", 2, 1);
    a.connect();
    b.connect();
    let mut ea = a.open_endpoint(0, small_endpoint(1)).1.unwrap();
    let mut eb = b.open_endpoint(0, small_endpoint(1)).1.unwrap();
    let to_b = Route {
        peer_index: 1,
        endpoint: 0,
        session_id: eb.session,
    };
    let to_a = Route {
        peer_index: 0,
        endpoint: 0,
        session_id: ea.session,
    };
    let echo = std::thread::spawn(move || {
        for i in 0..ROUNDS {
            let got = receive(&b, &mut eb);
            b.send(&mut eb, tiny(i, to_a, &got));
        }
        (b, eb)
    });
    let mut samples = Vec::with_capacity(ROUNDS as usize);
    for i in 0..ROUNDS {
        let payload = i.to_le_bytes();
        let t0 = Instant::now();
        a.send(&mut ea, tiny(i, to_b, &payload));
        let back = receive(&a, &mut ea);
        samples.push(t0.elapsed());
        assert_eq!(back, payload);
    }
    let _ = echo.join().unwrap();
    drop(backend);
    samples.sort();
    samples
}

fn pct(s: &[Duration], p: usize) -> Duration {
    s[(s.len() * p / 100).min(s.len() - 1)]
}

#[test]
#[ignore = "measurement; run explicitly"]
fn tiny_round_trip_between_colocated_guests() {
    for spin_us in [0u64, 50] {
        let s = run(Duration::from_micros(spin_us));
        println!(
            "backend spin {spin_us:>2} us: TINY round trip over {ROUNDS}: median {:?}, p90 {:?}, p99 {:?}",
            pct(&s, 50),
            pct(&s, 90),
            pct(&s, 99)
        );
    }
}

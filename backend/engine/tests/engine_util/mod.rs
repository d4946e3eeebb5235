//! Two hosts wired back to back: each an [`Engine`] with guests of two virtual clusters.
//! Frames cross the "wire" through vectors in the test, every one of them re-parsed.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use xmx_engine::{
    ClusterId, EndpointConfig, Engine, EngineConfig, GuestConfig, GuestEvent, GuestId,
    InMemoryGuest, MemoryArea, PeerEntry, RegionHandle,
};
use xmx_wire::msg::{
    DoneStatus, Event, EventBody, InlineData, InlineMsg, MsgInfo, Route, SendOp, SendRequest,
};
use xmx_wire::mxoe::units_mark;
use xmx_wire::mxoe::{FrameRepr, Mac, PacketRepr, PacketType, ETH_FRAME_LEN_MIN, HEAD_LEN};

/// Send-queue slots of every test endpoint.
pub const SENDQ_SLOTS: u16 = 8;
/// Receive-queue slots of every test endpoint.
pub const RECVQ_SLOTS: u16 = 16;
/// The endpoint every test guest opens.
pub const EP: u8 = 0;

/// A test guest: where it lives and how others name it.
#[derive(Clone)]
pub struct TestGuest {
    pub id: GuestId,
    pub host: usize,
    pub mac: Mac,
    pub cluster: ClusterId,
    pub peer_index: u16,
    pub session: u32,
    pub mem: InMemoryGuest,
}

/// One frame that crossed the wire, as the receiver saw it.
#[derive(Debug, Clone)]
pub struct WireFrame {
    /// Index of the sending host.
    pub from_host: usize,
    pub bytes: Vec<u8>,
}

impl WireFrame {
    pub fn parse(&self) -> FrameRepr<'_> {
        FrameRepr::parse(&self.bytes).expect("every emitted frame re-parses")
    }
    pub fn ptype(&self) -> PacketType {
        self.parse().packet.packet_type()
    }
}

pub struct Testbed {
    pub engines: [Engine; 2],
    pub guests: Vec<TestGuest>,
    pub now: Instant,
    /// Every frame delivered across the wire, in order.
    pub wire: Vec<WireFrame>,
    /// Frames the loss filter dropped.
    pub lost: Vec<WireFrame>,
    /// Every event polled, in order.
    pub events: Vec<GuestEvent>,
}

fn mac_of(n: u8) -> Mac {
    Mac([0x02, 0x16, 0x3e, 0, 0, n])
}

impl Testbed {
    /// Host 0: guests 1, 2 (cluster 1) and 5 (cluster 2). Host 1: guests 3, 4 (cluster 1)
    /// and 6 (cluster 2). One peer table on both hosts, index = guest number - 1.
    pub fn new() -> Self {
        Self::with_config(EngineConfig::default())
    }

    pub fn with_config(config: EngineConfig) -> Self {
        Self::with_configs(config.clone(), config)
    }

    /// Host 0's engine with `host0`, host 1's with `host1`.
    pub fn with_configs(host0: EngineConfig, host1: EngineConfig) -> Self {
        let mut engines = [Engine::new(host0), Engine::new(host1)];
        let layout = [
            (1u8, 0usize, 1u32),
            (2, 0, 1),
            (3, 1, 1),
            (4, 1, 1),
            (5, 0, 2),
            (6, 1, 2),
        ];
        let mut guests = vec![];
        for (n, host, cluster) in layout {
            let mem = InMemoryGuest::new();
            mem.add_area(
                MemoryArea::SendQueue { endpoint: EP },
                usize::from(SENDQ_SLOTS) * 4096,
            );
            mem.add_area(
                MemoryArea::RecvQueue { endpoint: EP },
                usize::from(RECVQ_SLOTS) * 4096,
            );
            let g = TestGuest {
                id: GuestId(u32::from(n)),
                host,
                mac: mac_of(n),
                cluster: ClusterId(cluster),
                peer_index: u16::from(n) - 1,
                session: 0x5e55_0000 + u32::from(n),
                mem: mem.clone(),
            };
            engines[host]
                .add_guest(GuestConfig {
                    id: g.id,
                    mac: g.mac,
                    cluster: g.cluster,
                    hostname: format!("guest{n}:0"),
                    memory: Box::new(mem),
                })
                .unwrap();
            engines[host]
                .open_endpoint(
                    g.id,
                    EP,
                    EndpointConfig {
                        session_id: g.session,
                        send_queue_slots: SENDQ_SLOTS,
                        recv_queue_slots: RECVQ_SLOTS,
                    },
                )
                .unwrap();
            guests.push(g);
        }
        let table: Vec<PeerEntry> = guests
            .iter()
            .map(|g| PeerEntry {
                index: g.peer_index,
                mac: g.mac,
                hostname: format!("guest{}:0", g.id.0),
                cluster: g.cluster,
            })
            .collect();
        for e in &mut engines {
            e.set_peers(table.clone()).unwrap();
        }
        Testbed {
            engines,
            guests,
            now: Instant::now(),
            wire: vec![],
            lost: vec![],
            events: vec![],
        }
    }

    pub fn guest(&self, n: u32) -> TestGuest {
        self.guests
            .iter()
            .find(|g| g.id.0 == n)
            .cloned()
            .expect("test guest")
    }

    pub fn engine(&mut self, n: u32) -> &mut Engine {
        let host = self.guest(n).host;
        &mut self.engines[host]
    }

    /// Route from guest `from`'s point of view to guest `to`'s endpoint.
    pub fn route(&self, to: u32) -> Route {
        let g = self.guest(to);
        Route {
            peer_index: g.peer_index,
            endpoint: EP,
            session_id: g.session,
        }
    }

    /// Hand a send request of guest `n` to its engine.
    pub fn send(&mut self, n: u32, request: SendRequest) -> Result<(), xmx_engine::Violation> {
        let now = self.now;
        let id = GuestId(n);
        self.engine(n).handle_send(now, id, EP, &request)
    }

    /// Move frames across the wire until both hosts are quiet, dropping those `lose`
    /// selects; returns the number delivered.
    pub fn pump_with(&mut self, mut lose: impl FnMut(&WireFrame) -> bool) -> usize {
        let mut delivered = 0;
        loop {
            let mut moved = false;
            for from in 0..2 {
                while let Some(t) = self.engines[from].poll_transmit() {
                    moved = true;
                    let frame = WireFrame {
                        from_host: from,
                        bytes: t.bytes.clone(),
                    };
                    self.engines[from].recycle(t);
                    check_frame(self, &frame);
                    if lose(&frame) {
                        self.lost.push(frame);
                        continue;
                    }
                    let now = self.now;
                    self.engines[1 - from].handle_frame(now, &frame.bytes);
                    self.wire.push(frame);
                    delivered += 1;
                }
            }
            self.collect_events();
            if !moved {
                return delivered;
            }
        }
    }

    pub fn pump(&mut self) -> usize {
        self.pump_with(|_| false)
    }

    pub fn collect_events(&mut self) {
        for e in &mut self.engines {
            while let Some(ev) = e.poll_event() {
                self.events.push(ev);
            }
        }
    }

    /// Events of guest `n`, removed from the log.
    /// Guest `n`'s events as the engine gave them (with whether each wakes the guest).
    pub fn take_guest_events(&mut self, n: u32) -> Vec<GuestEvent> {
        self.collect_events();
        let (mine, rest): (Vec<GuestEvent>, Vec<GuestEvent>) =
            self.events.drain(..).partition(|e| e.guest == GuestId(n));
        self.events = rest;
        mine
    }

    pub fn take_events(&mut self, n: u32) -> Vec<Event> {
        self.collect_events();
        let (mine, rest): (Vec<GuestEvent>, Vec<GuestEvent>) =
            self.events.drain(..).partition(|e| e.guest == GuestId(n));
        self.events = rest;
        mine.into_iter()
            .map(|e| {
                assert_eq!(e.endpoint, EP);
                e.event
            })
            .collect()
    }

    /// Advance time to the next deadline and run the timers; false if nothing waits.
    pub fn fire_timers(&mut self) -> bool {
        let next = [0, 1]
            .iter()
            .filter_map(|&h| self.engines[h].poll_timeout())
            .min();
        let Some(at) = next else {
            return false;
        };
        self.now = self.now.max(at);
        let now = self.now;
        for e in &mut self.engines {
            e.handle_timeout(now);
        }
        true
    }

    pub fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    /// Register a region of guest `n` holding `bytes`.
    pub fn region(&mut self, n: u32, id: u8, handle: u64, bytes: Vec<u8>) {
        let g = self.guest(n);
        let len = bytes.len() as u64;
        g.mem
            .add_area_with(MemoryArea::Region(RegionHandle(handle)), bytes);
        self.engine(n)
            .register_region(g.id, EP, id, RegionHandle(handle), len)
            .unwrap();
    }

    pub fn region_bytes(&self, n: u32, handle: u64) -> Vec<u8> {
        self.guest(n)
            .mem
            .area(MemoryArea::Region(RegionHandle(handle)))
            .unwrap()
    }
}

/// What every frame on the wire must satisfy.
fn check_frame(tb: &Testbed, frame: &WireFrame) {
    let repr = frame.parse();
    assert!(frame.bytes.len() >= ETH_FRAME_LEN_MIN, "padded to 60 bytes");
    assert_eq!(
        frame.bytes.len(),
        repr.wire_len(),
        "frame is exactly its packet, padded"
    );
    let sender = tb
        .guests
        .iter()
        .find(|g| g.mac == repr.head.src)
        .expect("source MAC is a guest's");
    assert_eq!(
        sender.host, frame.from_host,
        "source MAC is the sending host's guest"
    );
    assert!(
        tb.guests
            .iter()
            .all(|g| g.mac != repr.head.dst || g.host != frame.from_host),
        "co-located traffic never reaches the wire"
    );
    assert!(frame.bytes.len() >= HEAD_LEN);
    // Frame buffers are pooled across guests: what pads a short frame must be zeros,
    // never an earlier frame's bytes; a PULL or a CONNECT may start it with xmx's mark.
    let mut padding = &frame.bytes[repr.buffer_len()..];
    let marked = matches!(
        repr.packet.packet_type(),
        PacketType::Pull | PacketType::Connect
    );
    if marked && padding.starts_with(&units_mark::TAG) {
        padding = &padding[units_mark::LEN..];
    }
    assert!(padding.iter().all(|&b| b == 0), "Ethernet padding is zeros");
}

/// `len` bytes of a pattern that differs per seed and per position.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2_654_435_761)
                .rotate_left(u32::from(seed) % 31) as u8
                ^ seed
        })
        .collect()
}

pub fn info(seqnum: u16) -> MsgInfo {
    MsgInfo {
        seqnum,
        piggyack: seqnum.wrapping_sub(1),
        match_info: 0xfeed_0000_0000_0000 | u64::from(seqnum),
    }
}

pub fn tiny(tag: u32, route: Route, seqnum: u16, data: &[u8]) -> SendRequest {
    SendRequest {
        tag,
        route,
        op: SendOp::Tiny(InlineMsg {
            info: info(seqnum),
            data: InlineData::new(data).unwrap(),
        }),
    }
}

pub fn small(tag: u32, route: Route, seqnum: u16, data: &[u8]) -> SendRequest {
    SendRequest {
        tag,
        route,
        op: SendOp::Small(InlineMsg {
            info: info(seqnum),
            data: InlineData::new(data).unwrap(),
        }),
    }
}

pub fn send_done(tag: u32, length: u32) -> Event {
    Event {
        tag,
        body: EventBody::SendDone {
            status: DoneStatus::Success,
            length,
        },
    }
}

/// The wire frames of one packet type.
pub fn frames_of(tb: &Testbed, ptype: PacketType) -> Vec<WireFrame> {
    tb.wire
        .iter()
        .filter(|f| f.ptype() == ptype)
        .cloned()
        .collect()
}

/// Check a packet of a frame matches.
pub fn packet(frame: &WireFrame) -> PacketRepr<'_> {
    frame.parse().packet
}

/// Endpoints 5 and 6 are held by another board on the link (native processes on one
/// interface).
pub struct HeldElsewhere;

impl xmx_engine::EndpointsElsewhere for HeldElsewhere {
    fn held_elsewhere(&mut self, endpoint: u8) -> bool {
        matches!(endpoint, 5 | 6)
    }
}

/// A frame from `src` to `dst` whose packet is `ptype` followed by `body`, whatever they
/// hold.
pub fn raw_frame(src: Mac, dst: Mac, ptype: u8, body: &[u8]) -> Vec<u8> {
    let head = xmx_wire::mxoe::HeadRepr {
        dst,
        src,
        dst_src_peer_index: 0,
    };
    let mut frame = FrameRepr {
        head,
        packet: PacketRepr::Tiny(xmx_wire::mxoe::TinyRepr {
            header: Default::default(),
            data: b"",
        }),
    }
    .to_vec()
    .unwrap();
    frame.truncate(HEAD_LEN);
    frame.push(ptype);
    frame.extend_from_slice(body);
    frame
}

/// Whether guest 1 still reaches guest 3, whatever came before.
pub fn guest_3_still_receives(tb: &mut Testbed) -> Result<(), String> {
    tb.collect_events();
    tb.events.clear();
    let to3 = tb.route(3);
    tb.send(1, tiny(7, to3, 1, b"ok")).unwrap();
    tb.pump();
    let ev = tb.take_events(3);
    if ev
        .iter()
        .any(|e| matches!(e.body, EventBody::RecvTiny { .. }))
    {
        Ok(())
    } else {
        Err(format!("{ev:?}"))
    }
}

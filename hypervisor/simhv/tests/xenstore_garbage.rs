//! Clients that speak the protocol wrongly get error replies or are disconnected; the
//! daemon never panics and other clients do not notice.

mod xenstore_common;

use std::io::Write;
use std::net::Shutdown;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};

use xenstore_common::{next_event, raw_request, Harness};
use xmx_hv::xs::wire::{self, MsgType, XsFrame, HEADER_LEN};
use xmx_hv::{Error, WatchEvent, Xenstore, XBT_NULL};

static PANICS: AtomicUsize = AtomicUsize::new(0);

/// Count panics on the daemon's threads (named `xenstored-*`): one that panicked would
/// otherwise go unnoticed by the test that provoked it.
fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let daemon = std::thread::current()
                .name()
                .is_some_and(|n| n.starts_with("xenstored-"));
            if daemon {
                PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info);
        }));
    });
}

/// Seeded garbage: the same seed writes the same bytes.
struct Garbage(fastrand::Rng);

impl Garbage {
    fn new(seed: u64) -> Self {
        Garbage(fastrand::Rng::with_seed(seed))
    }

    fn next(&mut self) -> u64 {
        self.0.u64(..)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0.u64(0..n)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        std::iter::repeat_with(|| self.0.u8(..)).take(n).collect()
    }

    /// A payload that often parses: NUL-separated names, numbers, perms, junk.
    fn payload(&mut self) -> Vec<u8> {
        const WORDS: &[&str] = &[
            "/",
            "/local",
            "/local/domain/1",
            "/local/domain/2/x",
            "a/b",
            "@releaseDomain",
            "@introduceDomain",
            "T",
            "F",
            "0",
            "1",
            "2",
            "65535",
            "99999",
            "n0",
            "r1",
            "b2",
            "w7",
            "x9",
            "",
            "//",
            "/a/",
            "tok",
            "/tool",
        ];
        let mut out = Vec::new();
        for _ in 0..self.below(5) {
            if self.below(8) == 0 {
                let n = self.below(16) as usize;
                out.extend(self.bytes(n));
            } else {
                let i = self.below(WORDS.len() as u64) as usize;
                out.extend_from_slice(WORDS.get(i).copied().unwrap_or("").as_bytes());
            }
            if self.below(6) != 0 {
                out.push(0);
            }
        }
        out
    }
}

/// The daemon closes the connection without a reply (seen as a reset when it left
/// some of our bytes unread).
fn expect_hangup(s: &mut std::os::unix::net::UnixStream) {
    match wire::read_frame(s) {
        Ok(None) => {}
        Err(wire::ReadError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("expected a hang-up, got {other:?}"),
    }
}

#[test]
fn unknown_types_get_enosys_and_the_connection_stays() {
    count_panics();
    let h = Harness::start();
    let mut s = h.raw(1);
    for (i, ty) in [99u32, 20, 27, 0xffff, u32::MAX, 15, 16, 23]
        .into_iter()
        .enumerate()
    {
        let r = raw_request(&mut s, ty, i as u32 + 1, 0, b"/x\0");
        assert_eq!(r.kind(), Some(MsgType::Error), "type {ty}");
        assert_eq!(r.payload, b"ENOSYS\0", "type {ty}");
        assert_eq!(r.header.req_id, i as u32 + 1);
    }
    // Privileged-only requests are refused to a guest before anything else.
    for ty in [MsgType::Control, MsgType::SetTarget, MsgType::Introduce] {
        let r = raw_request(&mut s, ty.as_u32(), 50, 0, b"/x\0");
        assert_eq!(r.payload, b"EACCES\0", "{ty:?}");
    }
    // dom0 gets ENOSYS for the ones this xenstored does not implement.
    let mut s0 = h.raw(0);
    for ty in [MsgType::Control, MsgType::SetTarget, MsgType::GetQuota] {
        let r = raw_request(&mut s0, ty.as_u32(), 60, 0, b"x\0");
        assert_eq!(r.payload, b"ENOSYS\0", "{ty:?}");
    }
    let r = raw_request(&mut s, MsgType::GetDomainPath.as_u32(), 100, 0, b"1\0");
    assert_eq!(r.payload, b"/local/domain/1\0");
    assert_eq!(PANICS.load(Ordering::SeqCst), 0);
}

#[test]
fn malformed_payloads_get_einval() {
    count_panics();
    let h = Harness::start();
    let mut s = h.raw(0);
    let cases: &[(MsgType, &[u8])] = &[
        (MsgType::Read, b"/no-nul"),
        (MsgType::Read, b""),
        (MsgType::Read, b"/a\0/b\0"),
        (MsgType::Read, b"/\xff\xfe\0"),
        (MsgType::Write, b"/no-nul-at-all"),
        (MsgType::Write, b"/bad path\0v"),
        (MsgType::Mkdir, b"relative/\0"),
        (MsgType::Rm, b"\0"),
        (MsgType::Directory, b"/a//b\0"),
        (MsgType::DirectoryPart, b"/\0"),
        (MsgType::DirectoryPart, b"/\0-1\0"),
        (MsgType::GetPerms, b"/\0x\0"),
        (MsgType::SetPerms, b"/tool\0"),
        (MsgType::SetPerms, b"/tool\0x1\0"),
        (MsgType::SetPerms, b"/tool\0r99999\0"),
        (MsgType::Watch, b"/only-path\0"),
        (MsgType::Watch, b"/a\0t\0extra\0"),
        (MsgType::Unwatch, b"\0"),
        (MsgType::TransactionEnd, b"X\0"),
        (MsgType::GetDomainPath, b"abc\0"),
        (MsgType::GetDomainPath, b"70000\0"),
        (MsgType::Introduce, b"5\0"),
        (MsgType::Introduce, b"5\0x\0notaport\0"),
        (MsgType::Release, b"-1\0"),
        (MsgType::IsDomainIntroduced, b"\0"),
    ];
    for (i, (ty, payload)) in cases.iter().enumerate() {
        let r = raw_request(&mut s, ty.as_u32(), i as u32 + 1, 0, payload);
        assert_eq!(r.kind(), Some(MsgType::Error), "{ty:?} {payload:?}");
        assert_eq!(r.payload, b"EINVAL\0", "{ty:?} {payload:?}");
    }
    // Still serving.
    let r = raw_request(&mut s, MsgType::Read.as_u32(), 999, 0, b"/tool\0");
    assert_eq!(r.kind(), Some(MsgType::Read));
    assert_eq!(PANICS.load(Ordering::SeqCst), 0);
}

#[test]
fn oversized_header_disconnects_that_client_only() {
    count_panics();
    let h = Harness::start();
    let other = h.client(1);
    let mut s = h.raw(1);
    let mut hdr = XsFrame::new(MsgType::Read, 1, 0, Vec::new())
        .unwrap()
        .encode();
    hdr[12..16].copy_from_slice(&5000u32.to_ne_bytes());
    s.write_all(&hdr).unwrap();
    // The daemon may have hung up already.
    let _ = s.write_all(&[b'a'; 64]);
    expect_hangup(&mut s);
    h.wait_until("the bad connection to go", |x| x.usage(1).connections == 1);
    other.write(XBT_NULL, "ok", b"1").unwrap();
    assert_eq!(other.read(XBT_NULL, "ok").unwrap(), b"1");
    assert_eq!(PANICS.load(Ordering::SeqCst), 0);
}

#[test]
fn truncated_messages_and_abrupt_disconnects_leave_nothing() {
    count_panics();
    let h = Harness::start();
    let nodes_before = h.xs.usage(2).nodes;
    // Half a header.
    let mut s = h.raw(2);
    s.write_all(&[1, 0, 0]).unwrap();
    drop(s);
    // A header and part of its payload.
    let mut s = h.raw(2);
    let f = XsFrame::new(
        MsgType::Write,
        1,
        0,
        wire::write_payload("/local/domain/2/t", b"value"),
    )
    .unwrap();
    let bytes = f.encode();
    s.write_all(&bytes[..HEADER_LEN + 4]).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    expect_hangup(&mut s);
    drop(s);
    // In the middle of a transaction with changes staged.
    let g = h.client(2);
    let tx = g.transaction_start().unwrap();
    g.write(tx, "staged/a", b"1").unwrap();
    g.watch("w", "t").unwrap();
    assert_eq!(h.xs.usage(2).transactions, 1);
    drop(g);
    h.wait_until("guest 2's connections to go", |x| {
        x.usage(2).connections == 0
    });
    let u = h.xs.usage(2);
    assert_eq!((u.transactions, u.watches, u.nodes), (0, 0, nodes_before));
    let dom0 = h.client(0);
    assert!(matches!(
        dom0.read(XBT_NULL, "/local/domain/2/staged"),
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        dom0.read(XBT_NULL, "/local/domain/2/t"),
        Err(Error::NotFound(_))
    ));
    assert_eq!(PANICS.load(Ordering::SeqCst), 0);
}

#[test]
fn a_reply_is_still_delivered_after_the_client_stops_sending() {
    let h = Harness::start();
    let mut s = h.raw(0);
    let f = XsFrame::new(MsgType::Read, 7, 0, b"/tool\0".to_vec()).unwrap();
    s.write_all(&f.encode()).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let r = wire::read_frame(&mut s).unwrap().unwrap();
    assert_eq!((r.kind(), r.header.req_id), (Some(MsgType::Read), 7));
    assert!(wire::read_frame(&mut s).unwrap().is_none());
}

#[test]
fn fuzzing_guests_do_not_disturb_a_well_behaved_client() {
    count_panics();
    let h = Arc::new(Harness::start());
    let fuzzers: Vec<_> = (0..4u64)
        .map(|seed| {
            let h = Arc::clone(&h);
            std::thread::spawn(move || {
                let mut rng =
                    Garbage::new(0x2545_f491_4f6c_dd1d ^ (seed + 1).wrapping_mul(0x9e37_79b9));
                for round in 0..40 {
                    let mut s = h.raw(2);
                    for _ in 0..rng.below(30) {
                        let bytes = match rng.below(4) {
                            // Pure noise.
                            0 => {
                                let n = rng.below(64) as usize;
                                rng.bytes(n)
                            }
                            // A well-formed frame of any type with a plausible payload.
                            _ => {
                                let ty = rng.below(30) as u32;
                                let tx = if rng.below(4) == 0 {
                                    rng.below(4) as u32
                                } else {
                                    0
                                };
                                XsFrame::with_raw_type(ty, rng.next() as u32, tx, rng.payload())
                                    .unwrap()
                                    .encode()
                            }
                        };
                        if s.write_all(&bytes).is_err() {
                            break;
                        }
                    }
                    if round % 2 == 0 {
                        // Sometimes stop mid-frame.
                        let _ = s.write_all(&rng.bytes(7));
                    }
                }
            })
        })
        .collect();

    let g = h.client(1);
    g.watch("mine", "m").unwrap();
    assert_eq!(
        next_event(&g),
        WatchEvent {
            path: "mine".into(),
            token: "m".into()
        }
    );
    for i in 0..200 {
        let p = format!("mine/{i}");
        g.write(XBT_NULL, &p, p.as_bytes()).unwrap();
        assert_eq!(g.read(XBT_NULL, &p).unwrap(), p.as_bytes());
        assert_eq!(
            next_event(&g),
            WatchEvent {
                path: p,
                token: "m".into()
            }
        );
    }
    for f in fuzzers {
        f.join().unwrap();
    }
    h.wait_until("the fuzzers' connections to go", |x| {
        x.usage(2).connections == 0
    });
    assert_eq!(h.xs.usage(2).transactions, 0);
    assert_eq!(g.directory(XBT_NULL, "mine").unwrap().len(), 200);
    // Guest 1's nodes are untouched by guest 2's garbage.
    assert_eq!(
        h.client(0)
            .read(XBT_NULL, "/local/domain/1/mine/199")
            .unwrap(),
        b"mine/199"
    );
    assert_eq!(PANICS.load(Ordering::SeqCst), 0);
}

#[test]
fn fuzzing_dom0_never_panics_the_daemon() {
    count_panics();
    let h = Harness::start();
    let mut rng = Garbage::new(0xdead_beef_cafe_f00d);
    for _ in 0..60 {
        let mut s = h.raw(0);
        for _ in 0..rng.below(40) {
            let ty = rng.below(30) as u32;
            let tx = if rng.below(4) == 0 {
                rng.below(3) as u32
            } else {
                0
            };
            let f = XsFrame::with_raw_type(ty, rng.next() as u32, tx, rng.payload()).unwrap();
            if s.write_all(&f.encode()).is_err() {
                break;
            }
        }
    }
    h.wait_until("dom0's fuzzing connections to go", |x| {
        x.usage(0).connections == 0
    });
    let c = h.client(0);
    c.write(XBT_NULL, "/after", b"fine").unwrap();
    assert_eq!(c.read(XBT_NULL, "/after").unwrap(), b"fine");
    assert_eq!(PANICS.load(Ordering::SeqCst), 0);
}

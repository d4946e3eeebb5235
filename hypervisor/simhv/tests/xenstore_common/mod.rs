//! A xenstored served in-process on temp-dir sockets: dom0 and guests 1 and 2.

#![allow(dead_code)]

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use xmx_hv::xs::wire::{self, XsFrame};
use xmx_hv::xs::XsClient;
use xmx_hv::DomId;
use xmx_simhv::xenstored::{XenstoreQuotas, Xenstored};

/// The guests every harness introduces.
pub const GUESTS: [DomId; 2] = [1, 2];

pub struct Harness {
    pub xs: Arc<Xenstored>,
    pub dir: tempfile::TempDir,
    accept_threads: Vec<JoinHandle<()>>,
}

impl Harness {
    pub fn start() -> Harness {
        Harness::with_quotas(XenstoreQuotas::default())
    }

    pub fn with_quotas(quotas: XenstoreQuotas) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let xs = Xenstored::new(quotas);
        let mut accept_threads = Vec::new();
        for domid in [0].into_iter().chain(GUESTS) {
            let listener = UnixListener::bind(dir.path().join(format!("dom{domid}.sock"))).unwrap();
            accept_threads.push(xs.serve(domid, listener).unwrap());
            if domid != 0 {
                xs.introduce_domain(domid);
            }
        }
        Harness {
            xs,
            dir,
            accept_threads,
        }
    }

    /// Listen for one more domain (not introduced); returns its accept thread.
    pub fn add_domain(&self, domid: DomId) -> JoinHandle<()> {
        let listener = UnixListener::bind(self.sock(domid)).unwrap();
        self.xs.serve(domid, listener).unwrap()
    }

    pub fn sock(&self, domid: DomId) -> PathBuf {
        self.dir.path().join(format!("dom{domid}.sock"))
    }

    pub fn client(&self, domid: DomId) -> XsClient {
        XsClient::connect_unix(self.sock(domid)).unwrap()
    }

    pub fn raw(&self, domid: DomId) -> UnixStream {
        let s = UnixStream::connect(self.sock(domid)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    }

    /// Wait (bounded) until `cond` holds on the daemon's state.
    pub fn wait_until(&self, what: &str, mut cond: impl FnMut(&Xenstored) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cond(&self.xs) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::yield_now();
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.xs.shutdown();
        for h in self.accept_threads.drain(..) {
            let _ = h.join();
        }
    }
}

/// Send one raw request and read frames until the reply to `req_id` (events skipped).
pub fn raw_request(s: &mut UnixStream, ty: u32, req_id: u32, tx: u32, payload: &[u8]) -> XsFrame {
    use std::io::Write;
    let f = XsFrame::with_raw_type(ty, req_id, tx, payload.to_vec()).unwrap();
    s.write_all(&f.encode()).unwrap();
    loop {
        let r = wire::read_frame(s)
            .unwrap()
            .expect("connection closed before reply");
        if r.header.req_id == req_id && r.header.msg_type != 15 {
            return r;
        }
    }
}

/// The next watch event on `c`, failing after a bound.
pub fn next_event(c: &XsClient) -> xmx_hv::WatchEvent {
    use xmx_hv::Xenstore;
    c.next_watch_event(Some(Duration::from_secs(20)))
        .unwrap()
        .expect("no watch event within 20 s")
}

/// Assert no event is queued on `c` right now.
pub fn no_event(c: &XsClient) {
    use xmx_hv::Xenstore;
    assert_eq!(c.next_watch_event(Some(Duration::ZERO)).unwrap(), None);
}

/// Make sure `watcher` has no event queued from earlier actions: `writer` changes
/// `fence` (which `watcher` watches with token `"fence"`, seeing it as `reported`), and
/// that must be the next event. Requests run one at a time and each connection's
/// events leave in order, so anything caused before the fence would come first.
pub fn assert_quiet_as(watcher: &XsClient, writer: &XsClient, fence: &str, reported: &str) {
    use xmx_hv::{Xenstore, XBT_NULL};
    writer.write(XBT_NULL, fence, b"x").unwrap();
    let e = next_event(watcher);
    assert_eq!(
        (e.path.as_str(), e.token.as_str()),
        (reported, "fence"),
        "unexpected event before the fence"
    );
}

/// [`assert_quiet_as`] for a fence watched by its absolute name.
pub fn assert_quiet(watcher: &XsClient, writer: &XsClient, fence: &str) {
    assert_quiet_as(watcher, writer, fence, fence);
}

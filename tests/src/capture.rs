//! A tap on a host's veth, from the fabric namespace: every MXoE frame the
//! host sends, decoded with the wire crate.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use xmx_wire::mxoe::{FrameRepr, Mac, PacketRepr};

/// What one captured frame was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// Source board.
    pub src: Mac,
    /// Destination board.
    pub dst: Mac,
    /// Packet type name (`TINY`, `PULL_REPLY`, ...).
    pub kind: &'static str,
    /// Bytes of data the packet carries (MEDIUM and PULL_REPLY fragments,
    /// TINY and SMALL messages); 0 for the others.
    pub data_len: usize,
}

/// The name of a packet type, as MXoE names it.
pub fn kind_of(p: &PacketRepr<'_>) -> &'static str {
    match p {
        PacketRepr::Raw(_) => "RAW",
        PacketRepr::HostQuery(_) => "HOST_QUERY",
        PacketRepr::HostReply(_) => "HOST_REPLY",
        PacketRepr::Truc(_) => "TRUC",
        PacketRepr::Connect(_) => "CONNECT",
        PacketRepr::Tiny(_) => "TINY",
        PacketRepr::Small(_) => "SMALL",
        PacketRepr::Medium(_) => "MEDIUM",
        PacketRepr::Rndv(_) => "RNDV",
        PacketRepr::Pull(_) => "PULL",
        PacketRepr::PullReply(_) => "PULL_REPLY",
        PacketRepr::Notify(_) => "NOTIFY",
        PacketRepr::NackLib(_) => "NACK_LIB",
        PacketRepr::NackMcp(_) => "NACK_MCP",
    }
}

/// Decodes one frame.
pub fn decode(frame: &[u8]) -> Result<Seen, String> {
    let f = FrameRepr::parse(frame).map_err(|e| e.to_string())?;
    let data_len = match &f.packet {
        PacketRepr::Tiny(m) => m.data.len(),
        PacketRepr::Small(m) => m.data.len(),
        PacketRepr::Medium(m) => m.data.len(),
        PacketRepr::PullReply(r) => r.data.len(),
        _ => 0,
    };
    Ok(Seen {
        src: f.head.src,
        dst: f.head.dst,
        kind: kind_of(&f.packet),
        data_len,
    })
}

/// What a tap saw.
#[derive(Clone, Debug, Default)]
pub struct Captured {
    /// Frames that decoded.
    pub frames: Vec<Seen>,
    /// Frames that did not, with the reason.
    pub undecodable: Vec<String>,
}

impl Captured {
    /// Frames per packet type.
    pub fn counts(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for f in &self.frames {
            *m.entry(f.kind).or_insert(0) += 1;
        }
        m
    }

    /// The largest data carried by a packet type.
    pub fn max_data(&self, kind: &str) -> usize {
        self.frames
            .iter()
            .filter(|f| f.kind == kind)
            .map(|f| f.data_len)
            .max()
            .unwrap_or(0)
    }
}

/// A capture running in a thread of the test.
///
/// A bridge port hands its frames to the bridge before any socket bound to
/// one ethertype sees them, so the tap is a raw `ETH_P_ALL` socket, which
/// sees every frame first; it keeps the MXoE frames the host sent (those
/// arriving on its port), not those the bridge sends the host.
pub struct Tap {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Captured>>,
    thread: Option<JoinHandle<()>>,
}

/// A raw socket on `ifname` of the calling thread's namespace, with a
/// receive timeout so its reader can notice it should stop.
fn raw_socket(ifname: &str) -> std::io::Result<OwnedFd> {
    let all = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain syscall; the result is checked before use.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            i32::from(all),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let name = std::ffi::CString::new(ifname).map_err(std::io::Error::other)?;
    // SAFETY: `name` is a NUL-terminated string alive across the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: an all-zero sockaddr_ll is a valid value of this plain C struct.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = all;
    addr.sll_ifindex = index as i32;
    // SAFETY: `addr` is a sockaddr_ll of the size given, alive across the call.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let set = |opt: libc::c_int, value: *const libc::c_void, len: usize| {
        // SAFETY: `value` points to `len` readable bytes alive across the call.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                value,
                len as libc::socklen_t,
            )
        }
    };
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: 50_000,
    };
    let buf: libc::c_int = 16 << 20;
    set(
        libc::SO_RCVTIMEO,
        (&timeout as *const libc::timeval).cast(),
        std::mem::size_of::<libc::timeval>(),
    );
    set(
        libc::SO_RCVBUFFORCE,
        (&buf as *const libc::c_int).cast(),
        std::mem::size_of::<libc::c_int>(),
    );
    Ok(fd)
}

impl Tap {
    /// Starts capturing what the host sends through `ifname` (its port in
    /// namespace `netns`).
    pub fn start(netns: &str, ifname: &str) -> Tap {
        let fd = xmx_nic::netns::run_in(netns, || raw_socket(ifname))
            .expect("entering the fabric namespace")
            .expect("capture socket");
        let stop = Arc::new(AtomicBool::new(false));
        let seen: Arc<Mutex<Captured>> = Arc::default();
        let (s2, seen2) = (stop.clone(), seen.clone());
        let thread = std::thread::Builder::new()
            .name(format!("tap-{ifname}"))
            .spawn(move || {
                let mut buf = vec![0u8; 1 << 16];
                while !s2.load(Ordering::SeqCst) {
                    // SAFETY: an all-zero sockaddr_ll is a valid value.
                    let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
                    let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
                    // SAFETY: `buf` is writable for its length and `from` for
                    // `len` bytes, both alive across the call.
                    let n = unsafe {
                        libc::recvfrom(
                            fd.as_raw_fd(),
                            buf.as_mut_ptr().cast(),
                            buf.len(),
                            0,
                            (&mut from as *mut libc::sockaddr_ll).cast(),
                            &mut len,
                        )
                    };
                    let Ok(n) = usize::try_from(n) else { continue };
                    let frame = &buf[..n.min(buf.len())];
                    let mxoe = frame.get(12..14) == Some(&[0x86, 0xdf][..]);
                    if !mxoe || from.sll_pkttype == libc::PACKET_OUTGOING {
                        continue;
                    }
                    let mut all = seen2.lock().unwrap_or_else(|e| e.into_inner());
                    match decode(frame) {
                        Ok(s) => all.frames.push(s),
                        Err(e) => all.undecodable.push(format!("{e} ({n} bytes)")),
                    }
                }
            })
            .expect("capture thread");
        Tap {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    /// Stops and returns what was seen.
    pub fn finish(mut self) -> Captured {
        self.stop_thread();
        std::mem::take(&mut *self.seen.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

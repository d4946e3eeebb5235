//! xmxd's own door to the fabric: an AF_PACKET socket on the MXoE interface that sees only
//! discovery frames.
//!
//! The backend's socket on the same interface carries the data path; this one is small and
//! separate so discovery never competes with it for ring slots. A classic BPF filter in the
//! kernel passes only RAW packets that start with the discovery magic, so the data traffic
//! is not copied to xmxd at all; the filter is attached before the socket is bound, so no
//! other frame is ever queued.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use libc::{c_int, c_void, socklen_t};
use xmx_wire::mxoe::{Mac, PacketType, ETHERTYPE, HEAD_LEN};

use super::announce::MAGIC;

/// `SO_ATTACH_FILTER` (asm-generic/socket.h; the value of every architecture xmx targets).
const SO_ATTACH_FILTER: c_int = 26;
/// `PACKET_IGNORE_OUTGOING` (linux/if_packet.h, Linux 4.20).
const PACKET_IGNORE_OUTGOING: c_int = 23;

/// Largest frame read: a RAW frame is at most 1024 bytes; more room lets an oversized
/// frame be seen as such (and refused) rather than silently cut.
const RECV_BUF: usize = 2048;

/// A socket sending and receiving discovery frames on one interface.
#[derive(Debug)]
pub struct PacketFabric {
    fd: OwnedFd,
    mac: Mac,
    ifname: String,
    /// The interface the socket is bound to: a name that later resolves to another index
    /// names a re-created interface, which this socket no longer sees.
    ifindex: u32,
    /// The network namespace the socket was opened in, to open it again there.
    netns: Option<String>,
}

fn last_os(op: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{op}: {e}"))
}

/// The filter program: accept RAW packets carrying the discovery magic, drop the rest.
fn filter_program() -> [libc::sock_filter; 6] {
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let raw = PacketType::Raw as u32;
    [
        // A = frame[16] (the packet type)
        op(
            libc::BPF_LD | libc::BPF_B | libc::BPF_ABS,
            0,
            0,
            HEAD_LEN as u32,
        ),
        op(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, 0, 3, raw),
        // A = frame[17..21] (the magic, big-endian as BPF loads words)
        op(
            libc::BPF_LD | libc::BPF_W | libc::BPF_ABS,
            0,
            0,
            HEAD_LEN as u32 + 1,
        ),
        op(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, 0, 1, MAGIC),
        op(libc::BPF_RET | libc::BPF_K, 0, 0, RECV_BUF as u32),
        op(libc::BPF_RET | libc::BPF_K, 0, 0, 0),
    ]
}

impl PacketFabric {
    /// Open interface `ifname` of the calling thread's network namespace.
    pub fn open(ifname: &str) -> io::Result<PacketFabric> {
        let cname = std::ffi::CString::new(ifname)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name has a NUL"))?;
        // SAFETY: a NUL-terminated string that outlives the call; no other memory is passed.
        let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if index == 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no interface {ifname}"),
            ));
        }
        // SAFETY: plain syscall with constant arguments. Protocol 0: nothing is queued to
        // the socket until it is bound below, after the filter is in place.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        };
        if raw < 0 {
            return Err(last_os("socket(AF_PACKET)"));
        }
        // SAFETY: `raw` was just returned by socket() and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        let mut program = filter_program();
        let fprog = libc::sock_fprog {
            len: program.len() as u16,
            filter: program.as_mut_ptr(),
        };
        set_option(
            &fd,
            libc::SOL_SOCKET,
            SO_ATTACH_FILTER,
            &fprog,
            "SO_ATTACH_FILTER",
        )?;
        // Frames this host sends (the backend's data, our own announcements) are not for us;
        // older kernels lack the option and the discovery code drops its own frames anyway.
        let _ = set_option(
            &fd,
            libc::SOL_PACKET,
            PACKET_IGNORE_OUTGOING,
            &1 as &c_int,
            "",
        );

        // SAFETY: an all-zero sockaddr_ll is a valid value of this plain C struct.
        let mut addr: libc::sockaddr_ll = unsafe { zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = ETHERTYPE.to_be();
        addr.sll_ifindex = index as c_int;
        // SAFETY: `addr` is a complete sockaddr_ll and the length says so.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast::<libc::sockaddr>(),
                size_of::<libc::sockaddr_ll>() as socklen_t,
            )
        };
        if rc < 0 {
            return Err(last_os("bind(AF_PACKET)"));
        }

        // The bound address names the interface's hardware address.
        // SAFETY: as above, all-zero is a valid sockaddr_ll.
        let mut bound: libc::sockaddr_ll = unsafe { zeroed() };
        let mut len = size_of::<libc::sockaddr_ll>() as socklen_t;
        // SAFETY: `bound` has room for `len` bytes, and the kernel writes at most that.
        let rc = unsafe {
            libc::getsockname(
                fd.as_raw_fd(),
                (&mut bound as *mut libc::sockaddr_ll).cast::<libc::sockaddr>(),
                &mut len,
            )
        };
        if rc < 0 {
            return Err(last_os("getsockname(AF_PACKET)"));
        }
        if bound.sll_halen != 6 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{ifname} is not an Ethernet interface"),
            ));
        }
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&bound.sll_addr[..6]);
        tracing::debug!(ifname, mac = %Mac(mac), "discovery socket open");
        Ok(PacketFabric {
            fd,
            mac: Mac(mac),
            ifname: ifname.to_owned(),
            ifindex: index,
            netns: None,
        })
    }

    /// Open interface `ifname` of network namespace `netns` (a name under /run/netns or a
    /// path); the socket stays in that namespace whichever thread uses it.
    pub fn open_in_netns(netns: &str, ifname: &str) -> io::Result<PacketFabric> {
        let mut fabric = xmx_nic::netns::run_in(netns, || PacketFabric::open(ifname))
            .map_err(|e| io::Error::other(e.to_string()))??;
        fabric.netns = Some(netns.to_owned());
        Ok(fabric)
    }

    /// The index the interface's name resolves to now (0: no such interface).
    fn current_index(&self) -> io::Result<u32> {
        let cname = std::ffi::CString::new(self.ifname.as_str())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name has a NUL"))?;
        // SAFETY: a NUL-terminated string that outlives the call; no other memory is passed.
        let lookup = || unsafe { libc::if_nametoindex(cname.as_ptr()) };
        match &self.netns {
            None => Ok(lookup()),
            Some(ns) => {
                xmx_nic::netns::run_in(ns, lookup).map_err(|e| io::Error::other(e.to_string()))
            }
        }
    }

    /// A socket on the interface that now bears this one's name, if that is another
    /// interface than the one this socket is bound to (deleted and created again). A
    /// renamed or merely downed interface keeps its index: this socket stays valid and
    /// hears it again once the link is up, so `None` is the answer then, as it is while
    /// no interface bears the name.
    pub(crate) fn reopen_if_replaced(&self) -> io::Result<Option<PacketFabric>> {
        let index = self.current_index()?;
        if index == 0 || index == self.ifindex {
            return Ok(None);
        }
        let fresh = match &self.netns {
            None => PacketFabric::open(&self.ifname)?,
            Some(ns) => PacketFabric::open_in_netns(ns, &self.ifname)?,
        };
        Ok(Some(fresh))
    }

    /// The interface's MAC: this host's identity on the fabric.
    pub fn mac(&self) -> Mac {
        self.mac
    }

    /// The interface's name.
    pub(crate) fn ifname(&self) -> &str {
        &self.ifname
    }

    /// A descriptor that polls readable while a frame waits.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Send one whole frame (Ethernet header included).
    pub(crate) fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: `frame` is valid for `frame.len()` bytes for the duration of the call.
        let n = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast::<c_void>(),
                frame.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            return Err(last_os("send(AF_PACKET)"));
        }
        Ok(())
    }

    /// Hand every waiting frame to `f`, without blocking; returns how many there were.
    /// Frames longer than the receive buffer are dropped.
    pub(crate) fn recv_all(&self, mut f: impl FnMut(&[u8])) -> io::Result<usize> {
        let mut buf = [0u8; RECV_BUF];
        let mut count = 0;
        loop {
            // SAFETY: `buf` is writable for its whole length for the duration of the call.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast::<c_void>(),
                    buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(count),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(e),
                };
            }
            count += 1;
            // MSG_TRUNC reports the frame's real length: a longer one was cut.
            if let Some(frame) = buf.get(..n as usize) {
                f(frame);
            }
        }
    }
}

fn set_option<T>(fd: &OwnedFd, level: c_int, name: c_int, value: &T, what: &str) -> io::Result<()> {
    // SAFETY: `value` points to a live T of the size passed; the kernel copies it in.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast::<c_void>(),
            size_of::<T>() as socklen_t,
        )
    };
    if rc < 0 {
        return Err(last_os(what));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_checks_the_type_then_the_magic() {
        let p = filter_program();
        assert_eq!(p[0].k, 16);
        assert_eq!(p[1].k, 1);
        // The jumps land on the final "drop" instruction.
        assert_eq!(1 + 1 + usize::from(p[1].jf), p.len() - 1);
        assert_eq!(3 + 1 + usize::from(p[3].jf), p.len() - 1);
        assert_eq!(p[2].k, 17);
        assert_eq!(p[3].k, MAGIC);
        assert_eq!(p[5].k, 0);
    }

    #[test]
    fn a_missing_interface_is_not_found() {
        let e = PacketFabric::open("xmx-nonexistent").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}

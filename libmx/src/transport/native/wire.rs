//! The link under the native engine: whole Ethernet frames in and out, and
//! a descriptor that polls readable when frames wait.
//!
//! The interface is an AF_PACKET socket ([`PacketSocket`]); tests of the
//! transport itself join two engines with a `SeqpacketWire` pair instead,
//! which needs no privilege (built for unit tests only).

use std::io;
use std::os::fd::{AsRawFd, RawFd};
#[cfg(test)]
use std::os::fd::{FromRawFd, OwnedFd};

use xmx_nic::PacketSocket;
use xmx_wire::mxoe::Mac;

/// A link carrying MXoE frames.
pub(crate) trait Wire: Send {
    /// The board address frames from this link carry.
    fn mac(&self) -> Mac;
    /// Polls readable (`POLLIN`) while frames wait to be received.
    fn fd(&self) -> RawFd;
    /// Lends every waiting frame to `f` without blocking; returns how many.
    fn recv(&mut self, f: &mut dyn FnMut(&[u8])) -> usize;
    /// Queues the frame `fill` writes straight into the link's transmit buffer (it
    /// returns the frame's length, 0 for none); returns that length.
    fn send_with(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> usize) -> Result<usize, String>;
    /// Sends what is queued.
    fn flush(&mut self) -> Result<(), String>;
    /// The longest frame the link carries (MTU plus Ethernet header).
    fn max_frame_len(&self) -> usize;
    /// What the boards of every process on this link have in common, under
    /// which endpoint indices are claimed ([`super::claim`]): the interface's
    /// address (abstract socket names are per network namespace, as
    /// interfaces are).
    fn claim_scope(&self) -> String {
        self.mac().to_string()
    }
    /// From now on the kernel hands this link only the frames `program` (a
    /// classic BPF socket filter) takes; it replaces any earlier one.
    fn take_only(&mut self, program: &[libc::sock_filter]) -> io::Result<()> {
        attach_filter(self.fd(), program)
    }
}

/// Attaches `program` to the socket `fd` (`SO_ATTACH_FILTER`), replacing the
/// filter it had.
pub(super) fn attach_filter(fd: RawFd, program: &[libc::sock_filter]) -> io::Result<()> {
    let len = u16::try_from(program.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "socket filter too long"))?;
    let prog = libc::sock_fprog {
        len,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: `prog` points at `len` initialised instructions that outlive the
    // call; the kernel copies the program and never writes through the
    // pointer. An invalid descriptor or program only makes the call fail.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&prog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl Wire for PacketSocket {
    fn mac(&self) -> Mac {
        PacketSocket::mac(self)
    }

    fn fd(&self) -> RawFd {
        PacketSocket::fd(self).as_raw_fd()
    }

    fn recv(&mut self, f: &mut dyn FnMut(&[u8])) -> usize {
        PacketSocket::recv(self, f)
    }

    fn send_with(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> usize) -> Result<usize, String> {
        PacketSocket::send_with(self, fill).map_err(|e| e.to_string())
    }

    fn flush(&mut self) -> Result<(), String> {
        PacketSocket::flush(self).map_err(|e| e.to_string())
    }

    fn max_frame_len(&self) -> usize {
        PacketSocket::max_frame_len(self)
    }
}

/// The pending error of a socket (`SO_ERROR`), which clears it; a socket
/// that polls `POLLERR` keeps doing so until its error is read.
pub(super) fn take_socket_error(fd: RawFd) -> Option<io::Error> {
    let mut errno: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `errno` and `len` are writable locals of the sizes getsockopt
    // is told; an invalid descriptor only makes the call fail.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&mut errno as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Some(io::Error::last_os_error());
    }
    (errno != 0).then(|| io::Error::from_raw_os_error(errno))
}

/// One end of a pair of connected datagram sockets standing in for a cable:
/// each datagram is a frame, delivered whole and in order. A full peer drops
/// frames, as a congested link would.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct SeqpacketWire {
    fd: OwnedFd,
    mac: Mac,
    buf: Vec<u8>,
    /// Claims of this end's board: its own unless a test makes two boards
    /// share an interface ([`SeqpacketWire::sharing_claims_with`]).
    scope: String,
}

/// A claim scope no other [`SeqpacketWire`] of this process had: a
/// descriptor number would do only while its wire lives, and a board's
/// claims may outlive its wire's descriptor for a moment while it drops.
#[cfg(test)]
fn next_scope() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Largest frame a [`SeqpacketWire`] carries (a 9000-byte MTU).
#[cfg(test)]
const SEQPACKET_FRAME_MAX: usize = 9000 + 14;

#[cfg(test)]
impl SeqpacketWire {
    /// Sends one frame (a full peer drops it, as a congested cable would).
    pub(super) fn send(&mut self, frame: &[u8]) -> Result<(), String> {
        // SAFETY: `frame` is readable for its length; the descriptor is open.
        let sent = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if sent < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                // A congested cable loses the frame; MX sends it again.
                return Ok(());
            }
            return Err(e.to_string());
        }
        Ok(())
    }

    /// Two ends joined to each other, with board addresses `a` and `b`.
    pub(crate) fn pair(a: Mac, b: Mac) -> io::Result<(SeqpacketWire, SeqpacketWire)> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors socketpair writes.
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let end = |fd, mac| SeqpacketWire {
            // SAFETY: socketpair succeeded, so `fd` is an open descriptor
            // owned by nothing else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            mac,
            buf: vec![0; SEQPACKET_FRAME_MAX],
            scope: format!("test/{}/{}", std::process::id(), next_scope()),
        };
        Ok((end(fds[0], a), end(fds[1], b)))
    }

    /// This end, claiming endpoints as `other`'s board does: two processes'
    /// boards on one interface.
    pub(crate) fn sharing_claims_with(mut self, other: &SeqpacketWire) -> SeqpacketWire {
        self.scope = other.scope.clone();
        self
    }
}

#[cfg(test)]
impl Wire for SeqpacketWire {
    fn mac(&self) -> Mac {
        self.mac
    }

    fn claim_scope(&self) -> String {
        self.scope.clone()
    }

    fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn recv(&mut self, f: &mut dyn FnMut(&[u8])) -> usize {
        let mut n = 0;
        loop {
            // SAFETY: `buf` is writable for its whole length, which recv is
            // told; the descriptor is open while `self` lives.
            let got = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            let Ok(len) = usize::try_from(got) else {
                return n;
            };
            if len == 0 {
                return n;
            }
            f(self.buf.get(..len).unwrap_or(&[]));
            n += 1;
        }
    }

    fn flush(&mut self) -> Result<(), String> {
        Ok(())
    }

    fn send_with(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> usize) -> Result<usize, String> {
        let mut frame = vec![0u8; SEQPACKET_FRAME_MAX];
        let len = fill(&mut frame);
        if len > 0 {
            self.send(frame.get(..len).ok_or("frame longer than the link's")?)?;
        }
        Ok(len)
    }

    fn max_frame_len(&self) -> usize {
        SEQPACKET_FRAME_MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seqpacket_pair_carries_whole_frames_in_order() {
        let (mut a, mut b) = SeqpacketWire::pair(Mac([2, 0, 0, 0, 0, 1]), Mac([2, 0, 0, 0, 0, 2]))
            .expect("socketpair");
        assert_eq!(b.mac(), Mac([2, 0, 0, 0, 0, 2]));
        a.send(&[1; 60]).unwrap();
        a.send(&vec![2; 9014]).unwrap();
        let mut got = Vec::new();
        assert_eq!(b.recv(&mut |f| got.push(f.to_vec())), 2);
        assert_eq!(got, vec![vec![1; 60], vec![2; 9014]]);
        assert_eq!(b.recv(&mut |_| panic!("nothing waits")), 0);
        assert!(take_socket_error(b.fd()).is_none());
    }

    /// The kernel runs the link filter as `filter::takes` does: a frame it
    /// refuses never reaches the socket, the others arrive whole.
    #[test]
    fn the_kernel_keeps_frames_the_link_filter_refuses_out() {
        use xmx_wire::mxoe::{HeadRepr, PacketType};
        let (mut a, mut b) = SeqpacketWire::pair(Mac([2, 0, 0, 0, 0, 1]), Mac([2, 0, 0, 0, 0, 2]))
            .expect("socketpair");
        let data = vec![7u8; 8192];
        let head = HeadRepr {
            dst: Mac([2, 0, 0, 0, 0, 2]),
            src: Mac([2, 0, 0, 0, 0, 1]),
            dst_src_peer_index: 0,
        };
        let reply = |endpoint: u8| super::super::filter::pull_reply_frame(head, endpoint, &data);
        let program = super::super::filter::pull_replies_only_for(&[3]).unwrap();
        b.take_only(&program).expect("filter attached");
        let other_type = {
            let mut f = reply(5);
            f[xmx_wire::mxoe::HEAD_LEN] = u8::from(PacketType::Tiny);
            f
        };
        let sent = [
            reply(5),
            reply(3),
            other_type.clone(),
            vec![0u8; 20],
            reply(5),
        ];
        for f in &sent {
            assert_eq!(super::super::filter::takes(&program, f), f != &sent[0]);
            a.send(f).unwrap();
        }
        let mut got = Vec::new();
        b.recv(&mut |f| got.push(f.to_vec()));
        assert_eq!(got, vec![reply(3), other_type, vec![0u8; 20]]);
        // Everything again once the filter takes everything.
        b.take_only(&super::super::filter::everything()).unwrap();
        a.send(&reply(5)).unwrap();
        assert_eq!(b.recv(&mut |f| assert_eq!(f, reply(5).as_slice())), 1);
    }
}

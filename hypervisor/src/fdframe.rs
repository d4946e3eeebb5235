//! Length-prefixed messages over a unix stream socket, with descriptors passed as
//! `SCM_RIGHTS` on the first byte of a message: the one framing under the simulator's
//! hypercall socket ([`crate::sim::transport`]) and the hand-off of grants and ports
//! ([`crate::handoff`]), each with its own descriptor limit.
//!
//! Sends use `MSG_NOSIGNAL`: a peer that went away must surface as an error, never as a
//! SIGPIPE that kills the process (the library may live inside a C application).

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::errno::Errno;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

/// The most descriptors any user of this framing passes in one message; the receive
/// buffer is sized for it, and each user's own (lower or equal) limit is checked on top.
pub(crate) const FDS_CAPACITY: usize = 16;

/// Send one message (`body` prefixed by its little-endian `u32` length) with `fds`
/// attached to its first byte; more than `max_fds` descriptors is refused.
pub(crate) fn send(
    sock: &UnixStream,
    body: &[u8],
    fds: &[BorrowedFd<'_>],
    max_fds: usize,
) -> io::Result<()> {
    if fds.len() > max_fds.min(FDS_CAPACITY) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many descriptors",
        ));
    }
    let len = u32::try_from(body.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "message too large"))?;
    let prefix = len.to_le_bytes();
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let total = prefix.len() + body.len();
    let mut sent = 0usize;
    while sent < total {
        let (p, b) = if sent < prefix.len() {
            (&prefix[sent..], body)
        } else {
            (&prefix[..0], &body[sent - prefix.len()..])
        };
        let iov = [IoSlice::new(p), IoSlice::new(b)];
        let rights = [ControlMessage::ScmRights(&raw)];
        let cmsgs: &[ControlMessage<'_>] = if sent == 0 && !raw.is_empty() {
            &rights
        } else {
            &[]
        };
        match sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Receive one message of at most `max` body bytes and at most `max_fds` descriptors.
/// `Ok(None)` is an orderly close between messages.
pub(crate) fn recv(
    sock: &UnixStream,
    max: usize,
    max_fds: usize,
) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut fds = Vec::new();
    let mut prefix = [0u8; 4];
    if !recv_exact(sock, &mut prefix, &mut fds, max_fds)? {
        return Ok(None);
    }
    let len = u32::from_le_bytes(prefix) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("message of {len} bytes exceeds {max}"),
        ));
    }
    let mut body = vec![0u8; len];
    if len > 0 && !recv_exact(sock, &mut body, &mut fds, max_fds)? {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(Some((body, fds)))
}

/// Fill `buf`; false if the stream ended before the first byte, an error if it ended
/// after it or brought more than `max_fds` descriptors.
fn recv_exact(
    sock: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    max_fds: usize,
) -> io::Result<bool> {
    let mut got = 0usize;
    while got < buf.len() {
        let mut cmsg = nix::cmsg_space!([RawFd; FDS_CAPACITY]);
        let mut iov = [IoSliceMut::new(&mut buf[got..])];
        let (n, truncated) = match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => {
                for c in msg.cmsgs()? {
                    if let ControlMessageOwned::ScmRights(received) = c {
                        for fd in received {
                            // SAFETY: the kernel just installed `fd` in this process for
                            // this message; nothing else owns it, so it is ours to close.
                            fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                        }
                    }
                }
                (msg.bytes, msg.flags.contains(MsgFlags::MSG_CTRUNC))
            }
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        if truncated || fds.len() > max_fds {
            // The descriptors already received are closed when `fds` drops.
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "more descriptors than a message may carry",
            ));
        }
        if n == 0 {
            if got == 0 {
                return Ok(false);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got += n;
    }
    Ok(true)
}

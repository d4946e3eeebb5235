//! Length-prefixed frames over a unix stream socket, with descriptors passed as
//! `SCM_RIGHTS` on the first byte of a frame.
//!
//! Sends use `MSG_NOSIGNAL`: a peer that went away must surface as an error, never as a
//! SIGPIPE that kills the process (the library may live inside a C application).

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::errno::Errno;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use super::proto::MAX_FDS;

/// Send one frame (`body` prefixed by its length) with `fds` attached.
pub fn send_frame(sock: &UnixStream, body: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let len = u32::try_from(body.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
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

/// Receive one frame of at most `max` body bytes and every descriptor sent with it.
/// `Ok(None)` is an orderly close between frames.
pub fn recv_frame(sock: &UnixStream, max: usize) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut fds = Vec::new();
    let mut prefix = [0u8; 4];
    if !recv_exact(sock, &mut prefix, &mut fds)? {
        return Ok(None);
    }
    let len = u32::from_le_bytes(prefix) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds {max}"),
        ));
    }
    let mut body = vec![0u8; len];
    if !recv_exact(sock, &mut body, &mut fds)? && len > 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(Some((body, fds)))
}

/// Fill `buf`; false if the stream ended before the first byte, an error if it ended
/// after it.
fn recv_exact(sock: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<bool> {
    let mut got = 0usize;
    while got < buf.len() {
        let mut cmsg = nix::cmsg_space!([RawFd; MAX_FDS]);
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
        if truncated {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "more descriptors than a frame may carry",
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    #[test]
    fn frames_and_descriptors_cross_a_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let (pr, mut pw) = UnixStream::pair().unwrap();
        send_frame(&a, b"hello", &[pr.as_fd()]).unwrap();
        send_frame(&a, b"", &[]).unwrap();
        let (body, fds) = recv_frame(&b, 100).unwrap().unwrap();
        assert_eq!(body, b"hello");
        assert_eq!(fds.len(), 1);
        // The received descriptor is the same socket: bytes written on the peer arrive.
        let mut got = UnixStream::from(fds.into_iter().next().unwrap());
        pw.write_all(b"x").unwrap();
        let mut one = [0u8; 1];
        got.read_exact(&mut one).unwrap();
        assert_eq!(&one, b"x");
        let (body, fds) = recv_frame(&b, 100).unwrap().unwrap();
        assert!(body.is_empty() && fds.is_empty());
        drop(a);
        assert!(recv_frame(&b, 100).unwrap().is_none());
    }

    #[test]
    fn oversized_and_truncated_frames_are_errors() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&1000u32.to_le_bytes()).unwrap();
        assert!(recv_frame(&b, 999).is_err());

        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&10u32.to_le_bytes()).unwrap();
        a.write_all(b"abc").unwrap();
        drop(a);
        assert!(recv_frame(&b, 100).is_err());

        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&[1, 0]).unwrap();
        drop(a);
        assert!(recv_frame(&b, 100).is_err());
    }

    #[test]
    fn sending_to_a_closed_peer_is_an_error_not_a_signal() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        assert!(send_frame(&a, &[0u8; 100], &[]).is_err());
    }
}

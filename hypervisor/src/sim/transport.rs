//! Length-prefixed frames over a unix stream socket, with descriptors passed as
//! `SCM_RIGHTS` on the first byte of a frame: the hypercall socket's framing, at most
//! [`MAX_FDS`] descriptors a frame (the framing itself is the crate's private `fdframe` module).

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use super::proto::MAX_FDS;

/// Send one frame (`body` prefixed by its length) with `fds` attached.
pub fn send_frame(sock: &UnixStream, body: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    crate::fdframe::send(sock, body, fds, MAX_FDS)
}

/// Receive one frame of at most `max` body bytes and every descriptor sent with it.
/// `Ok(None)` is an orderly close between frames.
pub fn recv_frame(sock: &UnixStream, max: usize) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    crate::fdframe::recv(sock, max, MAX_FDS)
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

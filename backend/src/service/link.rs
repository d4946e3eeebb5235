//! The backend's way to the wire: frames in and out of the physical interface.
//!
//! The service loop needs a pollable descriptor, a non-blocking batched receive and a
//! queued transmit with an explicit flush: [`xmx_nic::PacketSocket`] offers exactly that,
//! and tests can put any other frame carrier behind the same trait.

use std::os::fd::{AsRawFd, RawFd};

use xmx_nic::{NicError, PacketSocket};

/// A carrier of MXoE frames for the service loop.
pub trait FrameLink: Send {
    /// A descriptor that polls readable while frames wait.
    fn raw_fd(&self) -> RawFd;
    /// Hand every waiting frame to `f` without blocking; returns how many.
    fn recv(&mut self, f: &mut dyn FnMut(&[u8])) -> usize;
    /// Queue a frame for transmission.
    fn send(&mut self, frame: &[u8]) -> Result<(), NicError>;
    /// Transmit everything queued.
    fn flush(&mut self) -> Result<(), NicError>;
}

impl FrameLink for PacketSocket {
    fn raw_fd(&self) -> RawFd {
        self.as_raw_fd()
    }

    fn recv(&mut self, f: &mut dyn FnMut(&[u8])) -> usize {
        PacketSocket::recv(self, f)
    }

    fn send(&mut self, frame: &[u8]) -> Result<(), NicError> {
        PacketSocket::send(self, frame)
    }

    fn flush(&mut self) -> Result<(), NicError> {
        PacketSocket::flush(self)
    }
}

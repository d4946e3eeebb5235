//! The backend's way to the wire: frames in and out of the physical interface.
//!
//! The service loop needs a pollable descriptor, a non-blocking batched receive and a
//! queued transmit with an explicit flush: [`xmx_nic::PacketSocket`] offers exactly that,
//! and tests can put any other frame carrier behind the same trait.
//!
//! # Link faults
//!
//! A link that goes down, an interface deleted and created again, a kernel short of
//! buffers: none of it ends the daemon. The socket reports the error once (it polls as
//! failed until the error is taken); the loop notes a [`LinkFault`], keeps serving
//! co-located guests, and looks at the interface again after a backoff that doubles up
//! to [`LinkFault::RETRY_MAX`]. A link that was only down resumes by itself when it is up
//! (the kernel re-attaches the socket); a re-created interface needs a new socket. The
//! fault ends with the first frame the link carries. MX retransmission covers what was
//! lost meanwhile.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use xmx_nic::{NicError, PacketSocket};

/// A carrier of MXoE frames for the service loop.
pub trait FrameLink: Send {
    /// A descriptor that polls readable while frames wait.
    fn raw_fd(&self) -> RawFd;
    /// Hand every waiting frame to `f` without blocking; returns how many.
    fn recv(&mut self, f: &mut dyn FnMut(&[u8])) -> usize;
    /// Queue a frame for transmission.
    fn send(&mut self, frame: &[u8]) -> Result<(), NicError>;
    /// Queue the frame `fill` writes into the link's own transmit buffer (it returns the
    /// frame's length, 0 for none); returns that length.
    fn send_with(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> usize) -> Result<usize, NicError>;
    /// Transmit everything queued.
    fn flush(&mut self) -> Result<(), NicError>;
    /// Take the error the link reports (its descriptor polled as failed), if any.
    fn take_error(&mut self) -> Option<io::Error> {
        None
    }
    /// Open the link again if its interface was replaced by another of the same name;
    /// true if [`FrameLink::raw_fd`] changed.
    fn reopen_if_replaced(&mut self) -> Result<bool, NicError> {
        Ok(false)
    }
    /// Frames the kernel dropped on the way in since the link was opened because its
    /// receive ring was full: the loss no counter of the engine can see.
    fn rx_ring_drops(&mut self) -> u64 {
        0
    }
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

    fn send_with(&mut self, fill: &mut dyn FnMut(&mut [u8]) -> usize) -> Result<usize, NicError> {
        PacketSocket::send_with(self, fill)
    }

    fn flush(&mut self) -> Result<(), NicError> {
        PacketSocket::flush(self)
    }

    fn take_error(&mut self) -> Option<io::Error> {
        match PacketSocket::take_error(self) {
            Ok(e) => e,
            Err(e) => Some(io::Error::other(e.to_string())),
        }
    }

    fn rx_ring_drops(&mut self) -> u64 {
        match self.stats() {
            Ok(s) => s.rx_drops,
            Err(e) => {
                tracing::debug!(error = %e, "reading the socket's drop count");
                0
            }
        }
    }

    fn reopen_if_replaced(&mut self) -> Result<bool, NicError> {
        match PacketSocket::reopen_if_replaced(self)? {
            Some(fresh) => {
                *self = fresh;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// A link (or a daemon's socket on it) that is failing: since when, how often, and when
/// to look at its interface again. Shared by the daemons of dom0 so they back off alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkFault {
    /// When the first error came.
    pub since: Instant,
    /// When to look at the interface next.
    pub check_at: Instant,
    retry: Duration,
    /// Errors seen since.
    pub errors: u64,
}

impl LinkFault {
    /// First wait before looking at a failed interface.
    pub const RETRY_MIN: Duration = Duration::from_millis(100);
    /// Longest wait between two looks.
    pub const RETRY_MAX: Duration = Duration::from_secs(5);

    /// A fault that began at `now`.
    pub fn new(now: Instant) -> LinkFault {
        LinkFault {
            since: now,
            check_at: now + Self::RETRY_MIN,
            retry: Self::RETRY_MIN,
            errors: 1,
        }
    }

    /// Whether the interface should be looked at now; if so, the next look is scheduled
    /// a doubled (bounded) backoff later.
    pub fn due(&mut self, now: Instant) -> bool {
        if now < self.check_at {
            return false;
        }
        self.retry = (self.retry * 2).min(Self::RETRY_MAX);
        self.check_at = now + self.retry;
        true
    }

    /// How long the link has been failing.
    pub fn lasted(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_bound() {
        let t0 = Instant::now();
        let mut f = LinkFault::new(t0);
        assert!(!f.due(t0));
        let mut t = t0 + LinkFault::RETRY_MIN;
        let mut gaps = Vec::new();
        for _ in 0..8 {
            assert!(f.due(t));
            gaps.push(f.check_at - t);
            assert!(!f.due(f.check_at - Duration::from_millis(1)));
            t = f.check_at;
        }
        assert_eq!(gaps[0], Duration::from_millis(200));
        assert_eq!(gaps[1], Duration::from_millis(400));
        assert_eq!(*gaps.last().unwrap(), LinkFault::RETRY_MAX);
    }
}

//! The two measurements every setup runs, written once over a message [`Channel`]:
//! ping-pong (half round trips) and a one-way stream (bandwidth).
//!
//! Roles: the *client* starts ping-pongs and sends streams; the *server* answers
//! ping-pongs and receives streams. A stream begins after its warm-up with a barrier (the
//! receiver acknowledges the warm-up messages) and ends when the receiver has every
//! measured message; the receiver's clock times it, so no two clocks are compared.

use std::io;
use std::time::{Duration, Instant};

use super::stats::{process_cpu_ns, AgentReport};

/// A reliable, ordered message pipe between the two processes of a setup.
pub trait Channel {
    /// Send one message (it may wait in a batch until [`flush`](Self::flush)).
    fn send(&mut self, msg: &[u8]) -> io::Result<()>;
    /// Push out everything sent so far.
    fn flush(&mut self) -> io::Result<()>;
    /// Receive the next message into `buf`; returns its length. A message longer than
    /// `buf` is an error.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize>;
}

/// Reports iteration progress on stderr at most once a second (`progress K/N` lines, which
/// the bench driver turns into its own progress display).
pub struct Progress {
    total: u64,
    last: Instant,
}

impl Progress {
    /// Progress over `total` iterations.
    pub fn new(total: u64) -> Self {
        Self {
            total,
            last: Instant::now(),
        }
    }

    /// Iteration `done` is finished.
    pub fn tick(&mut self, done: u64) {
        // Checking the clock every 64 iterations keeps this off the small-message path.
        if done.is_multiple_of(64) && self.last.elapsed() >= Duration::from_secs(1) {
            self.last = Instant::now();
            eprintln!("progress {done}/{}", self.total);
        }
    }
}

/// A message of `size` bytes with a recognisable pattern.
pub fn message(size: usize) -> Vec<u8> {
    (0..size).map(|i| (i % 251) as u8).collect()
}

fn expect_len(got: usize, want: usize, what: &str) -> io::Result<()> {
    if got != want {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{what}: received {got} bytes, expected {want}"),
        ));
    }
    Ok(())
}

/// Client of a ping-pong: send, wait for the same-size answer, `warmup + iters` times;
/// reports the measured round trips.
pub fn pingpong_client<C: Channel>(
    ch: &mut C,
    size: usize,
    warmup: u64,
    iters: u64,
) -> io::Result<AgentReport> {
    let msg = message(size);
    let mut buf = vec![0u8; size];
    let mut round_trips_ns = Vec::with_capacity(iters as usize);
    let mut progress = Progress::new(warmup + iters);
    let mut cpu0 = process_cpu_ns();
    for i in 0..warmup + iters {
        if i == warmup {
            cpu0 = process_cpu_ns();
        }
        let t0 = Instant::now();
        ch.send(&msg)?;
        ch.flush()?;
        let n = ch.recv(&mut buf)?;
        let rt = t0.elapsed();
        expect_len(n, size, "pong")?;
        if i >= warmup {
            round_trips_ns.push(u64::try_from(rt.as_nanos()).unwrap_or(u64::MAX));
        }
        progress.tick(i + 1);
    }
    Ok(AgentReport {
        round_trips_ns,
        messages: iters,
        bytes: iters * size as u64,
        cpu_ns: process_cpu_ns().saturating_sub(cpu0),
        ..AgentReport::default()
    })
}

/// Server of a ping-pong: answer each message with one of the same size.
pub fn pingpong_server<C: Channel>(
    ch: &mut C,
    size: usize,
    warmup: u64,
    iters: u64,
) -> io::Result<AgentReport> {
    let msg = message(size);
    let mut buf = vec![0u8; size];
    let mut cpu0 = process_cpu_ns();
    for i in 0..warmup + iters {
        if i == warmup {
            cpu0 = process_cpu_ns();
        }
        let n = ch.recv(&mut buf)?;
        expect_len(n, size, "ping")?;
        ch.send(&msg)?;
        ch.flush()?;
    }
    Ok(AgentReport {
        messages: iters,
        bytes: iters * size as u64,
        cpu_ns: process_cpu_ns().saturating_sub(cpu0),
        ..AgentReport::default()
    })
}

/// Sender of a stream: warm-up messages, barrier, measured messages, final acknowledgement.
pub fn stream_sender<C: Channel>(
    ch: &mut C,
    size: usize,
    warmup: u64,
    iters: u64,
) -> io::Result<AgentReport> {
    let msg = message(size);
    let mut ack = [0u8; 0];
    for _ in 0..warmup {
        ch.send(&msg)?;
    }
    ch.flush()?;
    expect_len(ch.recv(&mut ack)?, 0, "warm-up acknowledgement")?;
    let cpu0 = process_cpu_ns();
    let mut progress = Progress::new(iters);
    for i in 0..iters {
        ch.send(&msg)?;
        progress.tick(i + 1);
    }
    ch.flush()?;
    expect_len(ch.recv(&mut ack)?, 0, "final acknowledgement")?;
    Ok(AgentReport {
        messages: iters,
        bytes: iters * size as u64,
        cpu_ns: process_cpu_ns().saturating_sub(cpu0),
        ..AgentReport::default()
    })
}

/// Receiver of a stream: times the measured messages from the moment it released the
/// sender (after the warm-up) to the arrival of the last one.
pub fn stream_receiver<C: Channel>(
    ch: &mut C,
    size: usize,
    warmup: u64,
    iters: u64,
) -> io::Result<AgentReport> {
    let mut buf = vec![0u8; size];
    for _ in 0..warmup {
        expect_len(ch.recv(&mut buf)?, size, "warm-up message")?;
    }
    let cpu0 = process_cpu_ns();
    let t0 = Instant::now();
    ch.send(&[])?;
    ch.flush()?;
    let mut bytes = 0u64;
    for _ in 0..iters {
        let n = ch.recv(&mut buf)?;
        expect_len(n, size, "stream message")?;
        bytes += n as u64;
    }
    let elapsed = t0.elapsed();
    ch.send(&[])?;
    ch.flush()?;
    Ok(AgentReport {
        messages: iters,
        bytes,
        elapsed_ns: u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
        cpu_ns: process_cpu_ns().saturating_sub(cpu0),
        ..AgentReport::default()
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::mpsc::{channel, Receiver, Sender};

    /// Messages between two threads, for testing the loops without any transport.
    pub(crate) struct ThreadChannel {
        tx: Sender<Vec<u8>>,
        rx: Receiver<Vec<u8>>,
    }

    pub(crate) fn pair() -> (ThreadChannel, ThreadChannel) {
        let (t1, r1) = channel();
        let (t2, r2) = channel();
        (
            ThreadChannel { tx: t1, rx: r2 },
            ThreadChannel { tx: t2, rx: r1 },
        )
    }

    impl Channel for ThreadChannel {
        fn send(&mut self, msg: &[u8]) -> io::Result<()> {
            self.tx
                .send(msg.to_vec())
                .map_err(|_| io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
        fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let m = self
                .rx
                .recv()
                .map_err(|_| io::Error::from(io::ErrorKind::UnexpectedEof))?;
            buf.get_mut(..m.len())
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "message too long"))?
                .copy_from_slice(&m);
            Ok(m.len())
        }
    }

    #[test]
    fn pingpong_counts_round_trips() {
        let (mut c, mut s) = pair();
        let server = std::thread::spawn(move || pingpong_server(&mut s, 100, 3, 7).unwrap());
        let r = pingpong_client(&mut c, 100, 3, 7).unwrap();
        let sr = server.join().unwrap();
        assert_eq!(r.round_trips_ns.len(), 7);
        assert!(r.round_trips_ns.iter().all(|&t| t > 0));
        assert_eq!((r.messages, r.bytes), (7, 700));
        assert_eq!((sr.messages, sr.bytes), (7, 700));
    }

    #[test]
    fn stream_counts_bytes() {
        let (mut c, mut s) = pair();
        let server = std::thread::spawn(move || stream_receiver(&mut s, 1000, 5, 50).unwrap());
        let sent = stream_sender(&mut c, 1000, 5, 50).unwrap();
        let got = server.join().unwrap();
        assert_eq!((sent.messages, sent.bytes), (50, 50_000));
        assert_eq!((got.messages, got.bytes), (50, 50_000));
        assert!(got.elapsed_ns > 0);
        assert!(got.round_trips_ns.is_empty());
    }

    #[test]
    fn wrong_lengths_are_errors() {
        let (mut c, mut s) = pair();
        s.send(&[1, 2, 3]).unwrap();
        let err = pingpong_client(&mut c, 4, 0, 1).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(
            err.to_string().contains("received 3 bytes, expected 4"),
            "{err}"
        );
        let mut long = [0u8; 2];
        s.send(&[1, 2, 3]).unwrap();
        assert!(c.recv(&mut long).is_err());
    }

    #[test]
    fn pattern_is_deterministic() {
        let m = message(300);
        assert_eq!(m.len(), 300);
        assert_eq!(m[250], 250);
        assert_eq!(m[251], 0);
        assert!(message(0).is_empty());
    }
}

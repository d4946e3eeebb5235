//! Raw AF_PACKET baselines: latency and bandwidth of bare MXoE-ethertype frames between
//! two packet sockets, the floor under every xmx figure measured on the same link.
//!
//! Both functions open their own [`PacketSocket`]s on the two ends, run one thread per
//! end, and poll spin-then-block so that two pollers on a two-core machine do not starve
//! each other.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::config::NicConfig;
use super::error::{NicError, Result};
use super::socket::PacketSocket;
use super::{ETHERTYPE, ETH_HEADER_LEN};

/// One end of the link: an interface, in a named network namespace or in the caller's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaselineEnd {
    /// Namespace to open the interface in; `None`: the caller's.
    pub netns: Option<String>,
    /// Interface name.
    pub ifname: String,
}

impl BaselineEnd {
    /// Interface `ifname` of namespace `netns`.
    pub fn in_netns(netns: &str, ifname: &str) -> Self {
        Self {
            netns: Some(netns.to_owned()),
            ifname: ifname.to_owned(),
        }
    }

    /// Interface `ifname` of the caller's namespace.
    pub fn local(ifname: &str) -> Self {
        Self {
            netns: None,
            ifname: ifname.to_owned(),
        }
    }

    /// Open a socket on this end.
    pub fn open(&self, cfg: NicConfig) -> Result<PacketSocket> {
        match &self.netns {
            Some(ns) => PacketSocket::open_in_netns(ns, &self.ifname, cfg),
            None => PacketSocket::open(&self.ifname, cfg),
        }
    }
}

/// How the measuring threads wait for frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollPolicy {
    /// Busy-poll this long before sleeping in the kernel.
    pub spin: Duration,
    /// Give up when no frame arrives for this long.
    pub timeout: Duration,
}

impl Default for PollPolicy {
    fn default() -> Self {
        Self {
            spin: Duration::from_micros(50),
            timeout: Duration::from_secs(2),
        }
    }
}

/// Result of [`raw_pingpong`]. Latencies are half round trips.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PingPongStats {
    /// Bytes per frame, Ethernet header included.
    pub frame_len: usize,
    /// Round trips measured (warm-up excluded).
    pub iters: u32,
    /// Time of the measured round trips together.
    pub elapsed: Duration,
    /// Mean half round trip.
    pub half_rtt_mean: Duration,
    /// Median half round trip.
    pub half_rtt_median: Duration,
    /// 99th percentile half round trip.
    pub half_rtt_p99: Duration,
    /// Fastest half round trip.
    pub half_rtt_min: Duration,
}

/// Result of [`raw_stream`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StreamStats {
    /// Bytes per frame, Ethernet header included.
    pub frame_len: usize,
    /// Frames the sender queued.
    pub frames_sent: u64,
    /// Frames the receiver got.
    pub frames_received: u64,
    /// Bytes the receiver got.
    pub bytes_received: u64,
    /// From the first send to the last frame received.
    pub elapsed: Duration,
    /// Frames the kernel dropped at the receiver (ring full).
    pub rx_drops: u64,
}

impl StreamStats {
    /// Received bandwidth in Gbit/s (Ethernet frames without preamble or FCS).
    pub fn gbit_per_s(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs == 0.0 {
            return 0.0;
        }
        self.bytes_received as f64 * 8.0 / secs / 1e9
    }

    /// Received frames per second.
    pub fn frames_per_s(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs == 0.0 {
            return 0.0;
        }
        self.frames_received as f64 / secs
    }
}

/// Bytes of sequence number after the Ethernet header.
const SEQ_LEN: usize = 8;
/// Round trips run before measuring, to fault in rings and warm caches.
const WARMUP_MAX: u32 = 1000;

/// A test frame from `src` to `dst` carrying `seq`, `len` bytes long.
fn build_frame(dst: [u8; 6], src: [u8; 6], seq: u64, len: usize) -> Vec<u8> {
    let mut frame = vec![0u8; len];
    frame[0..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&src);
    frame[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
    frame[14..22].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in frame.iter_mut().enumerate().skip(ETH_HEADER_LEN + SEQ_LEN) {
        *b = (i as u8).wrapping_mul(7);
    }
    frame
}

/// The sequence number of a test frame, if it is one.
fn frame_seq(frame: &[u8]) -> Option<u64> {
    let bytes = frame.get(ETH_HEADER_LEN..ETH_HEADER_LEN + SEQ_LEN)?;
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

fn check_frame_len(frame_len: usize) -> Result<()> {
    if frame_len < ETH_HEADER_LEN + SEQ_LEN {
        return Err(NicError::FrameTooShort { len: frame_len });
    }
    Ok(())
}

/// Sockets sized for a baseline: small rings, any MTU that carries `frame_len`.
fn baseline_config(frame_len: usize, rx_frames: u32, tx_frames: u32) -> NicConfig {
    NicConfig {
        min_mtu: (frame_len - ETH_HEADER_LEN) as u32,
        rx_frames,
        tx_frames,
        ..NicConfig::default()
    }
}

/// Ping-pong `iters` frames of `frame_len` bytes between a socket on `a` and one on `b`:
/// `a` sends, `b` echoes, `a` waits for the echo before sending the next. A warm-up of
/// up to 1000 round trips runs first and is not counted.
pub fn raw_pingpong(
    a: &BaselineEnd,
    b: &BaselineEnd,
    frame_len: usize,
    iters: u32,
    policy: PollPolicy,
) -> Result<PingPongStats> {
    check_frame_len(frame_len)?;
    if iters == 0 {
        return Err(NicError::InvalidConfig(
            "ping-pong needs at least one iteration",
        ));
    }
    let cfg = baseline_config(frame_len, 64, 16);
    let mut sock_a = a.open(cfg.clone())?;
    let mut sock_b = b.open(cfg)?;
    let warmup = (iters / 10).clamp(1, WARMUP_MAX);
    let total = warmup + iters;
    let mut frame = build_frame(sock_b.mac().0, sock_a.mac().0, 0, frame_len);

    let (samples, echo) = std::thread::scope(|scope| {
        let echo = scope.spawn(move || echo_loop(&mut sock_b, total, policy));
        let mut samples = Vec::with_capacity(iters as usize);
        let mut run = || -> Result<()> {
            for seq in 0..u64::from(total) {
                frame[ETH_HEADER_LEN..ETH_HEADER_LEN + SEQ_LEN].copy_from_slice(&seq.to_le_bytes());
                let t0 = Instant::now();
                sock_a.send(&frame)?;
                sock_a.flush()?;
                let mut reply: Option<(usize, Option<u64>)> = None;
                let n = sock_a.poll_spin_then_block(policy.spin, Some(policy.timeout), |f| {
                    reply = Some((f.len(), frame_seq(f)));
                })?;
                let t1 = Instant::now();
                match reply {
                    None => {
                        return Err(NicError::Measurement(format!(
                            "no echo of frame {seq} within {:?}",
                            policy.timeout
                        )))
                    }
                    Some((len, got)) if n != 1 || len != frame_len || got != Some(seq) => {
                        return Err(NicError::Measurement(format!(
                            "echo of frame {seq}: {n} frame(s), {len} bytes, sequence {got:?}"
                        )))
                    }
                    Some(_) => {}
                }
                if seq >= u64::from(warmup) {
                    samples.push(t1 - t0);
                }
            }
            Ok(())
        };
        let result = run().map(|()| samples);
        let echo = echo.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        (result, echo)
    });
    let mut samples = samples?;
    echo?;

    samples.sort_unstable();
    let elapsed: Duration = samples.iter().sum();
    let pick = |q: f64| {
        let i = ((samples.len() - 1) as f64 * q).round() as usize;
        samples[i.min(samples.len() - 1)] / 2
    };
    Ok(PingPongStats {
        frame_len,
        iters,
        elapsed,
        half_rtt_mean: elapsed / iters / 2,
        half_rtt_median: pick(0.5),
        half_rtt_p99: pick(0.99),
        half_rtt_min: samples[0] / 2,
    })
}

/// Send back each of `total` frames with the MACs swapped.
fn echo_loop(sock: &mut PacketSocket, total: u32, policy: PollPolicy) -> Result<()> {
    let mut echoed = 0u32;
    let mut pending: Vec<Vec<u8>> = Vec::new();
    while echoed < total {
        let n = sock.poll_spin_then_block(policy.spin, Some(policy.timeout), |f| {
            let mut copy = f.to_vec();
            let (dst, src) = copy.split_at_mut(6);
            dst.swap_with_slice(&mut src[..6]);
            pending.push(copy);
        })?;
        if n == 0 {
            return Err(NicError::Measurement(format!(
                "echo side: frame {echoed} did not arrive within {:?}",
                policy.timeout
            )));
        }
        for frame in pending.drain(..) {
            sock.send(&frame)?;
            echoed += 1;
        }
        sock.flush()?;
    }
    Ok(())
}

/// Stream `frames` frames of `frame_len` bytes from `a` to `b`, `batch` frames per
/// flush, and measure what arrives. Frames the receiver's ring cannot hold are dropped by
/// the kernel and reported in [`StreamStats::rx_drops`].
pub fn raw_stream(
    a: &BaselineEnd,
    b: &BaselineEnd,
    frame_len: usize,
    frames: u64,
    batch: usize,
    policy: PollPolicy,
) -> Result<StreamStats> {
    check_frame_len(frame_len)?;
    if frames == 0 || batch == 0 {
        return Err(NicError::InvalidConfig(
            "streaming needs at least one frame per batch",
        ));
    }
    let tx_frames = u32::try_from(batch.max(64)).unwrap_or(u32::MAX).min(4096);
    let mut sock_a = a.open(baseline_config(frame_len, 64, tx_frames))?;
    let mut sock_b = b.open(baseline_config(frame_len, 1024, 64))?;
    let frame = build_frame(sock_b.mac().0, sock_a.mac().0, 0, frame_len);
    let done = AtomicBool::new(false);

    let (sent, received) = std::thread::scope(|scope| {
        let done = &done;
        let receiver = scope.spawn(move || -> Result<(u64, u64, Option<Instant>, u64)> {
            let (mut count, mut bytes, mut last) = (0u64, 0u64, None);
            let mut idle_since = Instant::now();
            while count < frames {
                let n = sock_b.poll_spin_then_block(
                    policy.spin,
                    Some(Duration::from_millis(10)),
                    |f| {
                        bytes += f.len() as u64;
                    },
                )?;
                if n > 0 {
                    count += n as u64;
                    let now = Instant::now();
                    last = Some(now);
                    idle_since = now;
                } else if done.load(Ordering::Acquire) {
                    // Everything sent is in our ring by now (or was dropped): take the rest.
                    count += sock_b.recv(|f| bytes += f.len() as u64) as u64;
                    break;
                } else if idle_since.elapsed() > policy.timeout {
                    return Err(NicError::Measurement(format!(
                        "stream: nothing received for {:?}",
                        policy.timeout
                    )));
                }
            }
            let drops = sock_b.stats()?.rx_drops;
            Ok((count, bytes, last, drops))
        });
        let mut send_all = || -> Result<Instant> {
            let start = Instant::now();
            let mut left = frames;
            while left > 0 {
                let n = left.min(batch as u64);
                for _ in 0..n {
                    sock_a.send(&frame)?;
                }
                sock_a.flush()?;
                left -= n;
            }
            Ok(start)
        };
        let sent = send_all();
        done.store(true, Ordering::Release);
        let received = receiver
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        (sent, received)
    });
    let start = sent?;
    let (frames_received, bytes_received, last, rx_drops) = received?;
    let elapsed = last.map_or(Duration::ZERO, |l| l.saturating_duration_since(start));
    Ok(StreamStats {
        frame_len,
        frames_sent: frames,
        frames_received,
        bytes_received,
        elapsed,
        rx_drops,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_layout() {
        let f = build_frame([1; 6], [2; 6], 0x0102_0304, 64);
        assert_eq!(f.len(), 64);
        assert_eq!(&f[0..6], &[1; 6]);
        assert_eq!(&f[6..12], &[2; 6]);
        assert_eq!(&f[12..14], &[0x86, 0xDF]);
        assert_eq!(frame_seq(&f), Some(0x0102_0304));
        assert_eq!(frame_seq(&f[..21]), None);
    }

    #[test]
    fn stream_rates() {
        let s = StreamStats {
            frame_len: 1000,
            frames_sent: 10,
            frames_received: 10,
            bytes_received: 125_000_000,
            elapsed: Duration::from_secs(1),
            rx_drops: 0,
        };
        assert!((s.gbit_per_s() - 1.0).abs() < 1e-9);
        assert!((s.frames_per_s() - 10.0).abs() < 1e-9);
        let z = StreamStats {
            elapsed: Duration::ZERO,
            ..s
        };
        assert_eq!(z.gbit_per_s(), 0.0);
    }

    #[test]
    fn short_frames_are_refused() {
        let e = BaselineEnd::local("lo");
        let err = raw_pingpong(&e, &e, 21, 1, PollPolicy::default()).unwrap_err();
        assert!(matches!(err, NicError::FrameTooShort { len: 21 }));
    }
}

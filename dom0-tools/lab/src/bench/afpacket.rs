//! Setup `afpacket`: bare Ethernet frames through the backend's AF_PACKET socket
//! ([`PacketSocket`], mmap'd TPACKET_V2 rings, spin-then-block polling), the floor under
//! every xmx figure on the same link.
//!
//! A message becomes a *frame train*: as many frames of at most [`FRAME_MAX`] bytes
//! (Ethernet header included) as its payload needs, one frame for an empty message.
//! Raw frames have no flow control of their own and the receive ring is finite, so the
//! channel adds the least that keeps a long train from overrunning it: the sender keeps at
//! most [`WINDOW`] data frames unconsumed and the receiver returns a credit frame every
//! `WINDOW / 4` frames it consumed. Frames carry the MXoE ethertype and a bench header:
//!
//! | offset | field                                                   |
//! |--------|---------------------------------------------------------|
//! | 14     | magic 0x5842 (big-endian)                               |
//! | 16     | kind: 1 data, 2 credit                                  |
//! | 18     | data: message sequence number (u32 LE)                  |
//! | 22     | data: fragment index (u32 LE)                           |
//! | 26     | data: message length; credit: data frames consumed (u32 LE) |
//! | 30     | payload                                                 |
//!
//! A lost or reordered frame is reported as an error, never repaired: on a veth with the
//! window respected it does not happen.

use std::collections::VecDeque;
use std::io;
use std::time::{Duration, Instant};

use xmx_nic::baseline::PollPolicy;
use xmx_nic::{NicConfig, PacketSocket, ETHERTYPE};

use super::exchange::Channel;

/// Longest frame of a train, Ethernet header included.
pub const FRAME_MAX: usize = 9000;
/// Data frames a sender may have unconsumed at the receiver.
pub const WINDOW: u32 = 256;
const HEADER: usize = 30;
const MAGIC: u16 = 0x5842;
const KIND_DATA: u8 = 1;
const KIND_CREDIT: u8 = 2;
/// Frames queued before the transmit ring is pushed to the kernel.
const TX_BATCH: usize = 32;
/// A receiver that hears nothing for this long repeats its credit.
const RECREDIT_AFTER: Duration = Duration::from_millis(20);
/// A peer silent for this long is gone.
const PEER_TIMEOUT: Duration = Duration::from_secs(5);

/// A decoded bench header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BenchHeader {
    Data { msg: u32, frag: u32, len: u32 },
    Credit { consumed: u32 },
}

fn le32(f: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(f.get(at..at + 4)?.try_into().ok()?))
}

/// The header of `frame`, `None` when it is not a bench frame.
fn parse_header(frame: &[u8]) -> Option<BenchHeader> {
    if frame.get(12..14)? != ETHERTYPE.to_be_bytes() || frame.get(14..16)? != MAGIC.to_be_bytes() {
        return None;
    }
    match *frame.get(16)? {
        KIND_DATA => Some(BenchHeader::Data {
            msg: le32(frame, 18)?,
            frag: le32(frame, 22)?,
            len: le32(frame, 26)?,
        }),
        KIND_CREDIT => Some(BenchHeader::Credit {
            consumed: le32(frame, 26)?,
        }),
        _ => None,
    }
}

/// Write the Ethernet and bench headers into the first [`HEADER`] bytes of `frame`.
fn write_header(frame: &mut [u8], dst: [u8; 6], src: [u8; 6], header: BenchHeader) {
    frame[0..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&src);
    frame[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
    frame[14..16].copy_from_slice(&MAGIC.to_be_bytes());
    frame[17] = 0;
    let (kind, a, b, c) = match header {
        BenchHeader::Data { msg, frag, len } => (KIND_DATA, msg, frag, len),
        BenchHeader::Credit { consumed } => (KIND_CREDIT, 0, 0, consumed),
    };
    frame[16] = kind;
    frame[18..22].copy_from_slice(&a.to_le_bytes());
    frame[22..26].copy_from_slice(&b.to_le_bytes());
    frame[26..30].copy_from_slice(&c.to_le_bytes());
}

/// Frames of a train carrying `len` payload bytes, `payload_max` per frame.
pub fn train_frames(len: usize, payload_max: usize) -> usize {
    len.div_ceil(payload_max.max(1)).max(1)
}

fn protocol(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Reassembly of incoming trains, independent of the socket.
#[derive(Debug, Default)]
struct TrainReassembly {
    /// Next message and fragment expected.
    msg: u32,
    frag: u32,
    filled: usize,
    /// Data frames consumed so far, and how many of them were credited back.
    consumed: u32,
    credited: u32,
    /// Data frames that arrived after the message being received was complete.
    stash: VecDeque<Vec<u8>>,
    spare: Vec<Vec<u8>>,
}

impl TrainReassembly {
    /// Take data frame `frame` (header `msg`/`frag`/`len`) into `buf`; returns the message
    /// length once its last frame is in.
    fn accept(
        &mut self,
        frame: &[u8],
        msg: u32,
        frag: u32,
        len: u32,
        buf: &mut [u8],
    ) -> io::Result<Option<usize>> {
        if msg != self.msg || frag != self.frag {
            return Err(protocol(format!(
                "afpacket: frame {msg}/{frag} arrived while expecting {}/{} (lost or reordered)",
                self.msg, self.frag
            )));
        }
        let len = len as usize;
        if len > buf.len() {
            return Err(protocol(format!(
                "afpacket: message of {len} bytes does not fit {}",
                buf.len()
            )));
        }
        // Short frames may come padded from real NICs: take no more than the message needs.
        let payload = frame.get(HEADER..).unwrap_or(&[]);
        let take = payload.len().min(len - self.filled);
        buf[self.filled..self.filled + take].copy_from_slice(&payload[..take]);
        self.filled += take;
        self.frag += 1;
        self.consumed = self.consumed.wrapping_add(1);
        if self.filled < len {
            return Ok(None);
        }
        self.msg = self.msg.wrapping_add(1);
        self.frag = 0;
        self.filled = 0;
        Ok(Some(len))
    }

    /// Takes the frames that came in behind an earlier message into `buf`, up to the end of
    /// the message they start: its length once complete.
    fn take_stash(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        while let Some(f) = self.stash.pop_front() {
            let done = match parse_header(&f) {
                Some(BenchHeader::Data { msg, frag, len }) => self.accept(&f, msg, frag, len, buf),
                _ => Ok(None),
            };
            self.spare.push(f);
            if let Some(len) = done? {
                return Ok(Some(len));
            }
        }
        Ok(None)
    }

    /// Whether enough frames were consumed since the last credit that the sender may be
    /// waiting for one.
    fn credit_due(&self) -> bool {
        self.consumed.wrapping_sub(self.credited) >= WINDOW / 4
    }

    fn stash(&mut self, frame: &[u8]) {
        let mut copy = self.spare.pop().unwrap_or_default();
        copy.clear();
        copy.extend_from_slice(frame);
        self.stash.push_back(copy);
    }
}

/// One end of the raw-frame channel.
pub struct AfPacketChannel {
    sock: PacketSocket,
    me: [u8; 6],
    peer: Option<[u8; 6]>,
    payload_max: usize,
    tx_msg: u32,
    /// Data frames sent so far, and how many of them the peer said it consumed.
    tx_frames: u32,
    peer_consumed: u32,
    unflushed: usize,
    frame: Vec<u8>,
    rx: TrainReassembly,
    policy: PollPolicy,
}

impl AfPacketChannel {
    /// Open `ifname` of the calling thread's namespace. The peer's MAC is given (client)
    /// or learnt from the first data frame (server). Waits poll for `spin`, then block.
    /// Frames carry up to `payload_max` bytes (default: as many as fit 9000 bytes).
    pub fn open(
        ifname: &str,
        peer: Option<[u8; 6]>,
        spin: Duration,
        payload_max: Option<usize>,
    ) -> io::Result<Self> {
        let cfg = NicConfig {
            min_mtu: 256,
            rx_frames: 1024,
            tx_frames: 256,
            ..NicConfig::default()
        };
        let sock = PacketSocket::open(ifname, cfg).map_err(io::Error::other)?;
        let frame_max = FRAME_MAX.min(sock.max_frame_len());
        let frame_max = payload_max.map_or(frame_max, |p| frame_max.min(HEADER + p.max(1)));
        Ok(Self {
            me: sock.mac().0,
            peer,
            payload_max: frame_max - HEADER,
            tx_msg: 0,
            tx_frames: 0,
            peer_consumed: 0,
            unflushed: 0,
            frame: vec![0; frame_max],
            rx: TrainReassembly::default(),
            policy: PollPolicy {
                spin,
                timeout: PEER_TIMEOUT,
            },
            sock,
        })
    }

    /// This end's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.me
    }

    fn peer(&self) -> io::Result<[u8; 6]> {
        self.peer.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotConnected,
                "afpacket: peer MAC not known yet",
            )
        })
    }

    fn push(&mut self, len: usize) -> io::Result<()> {
        self.sock
            .send(&self.frame[..len])
            .map_err(io::Error::other)?;
        self.unflushed += 1;
        if self.unflushed >= TX_BATCH {
            self.flush()?;
            // Take credits as they come, so the window rarely closes and the receive
            // ring never fills up behind a busy sender.
            let (rx, peer_consumed) = (&mut self.rx, &mut self.peer_consumed);
            self.sock.recv(|f| match parse_header(f) {
                Some(BenchHeader::Credit { consumed }) => *peer_consumed = consumed,
                Some(BenchHeader::Data { .. }) => rx.stash(f),
                None => {}
            });
        }
        Ok(())
    }

    /// Repeat the last credit with the current count: a credit frame that was lost must
    /// not leave the sender waiting for ever while this end waits for data.
    fn recredit(&mut self) -> io::Result<()> {
        let Some(peer) = self.peer else { return Ok(()) };
        if self.rx.consumed == self.rx.credited && self.rx.consumed == 0 {
            return Ok(());
        }
        write_header(
            &mut self.frame,
            peer,
            self.me,
            BenchHeader::Credit {
                consumed: self.rx.consumed,
            },
        );
        self.rx.credited = self.rx.consumed;
        self.push(HEADER)?;
        self.flush()
    }

    /// Wait for frames: credits update the window, data frames are stashed for `recv`.
    fn poll_credits(&mut self) -> io::Result<()> {
        let (rx, peer_consumed, peer) = (&mut self.rx, &mut self.peer_consumed, &mut self.peer);
        let n = self
            .sock
            .poll_spin_then_block(self.policy.spin, Some(self.policy.timeout), |f| {
                match parse_header(f) {
                    Some(BenchHeader::Credit { consumed }) => *peer_consumed = consumed,
                    Some(BenchHeader::Data { .. }) => {
                        peer.get_or_insert_with(|| f[6..12].try_into().unwrap_or_default());
                        rx.stash(f);
                    }
                    None => {}
                }
            })
            .map_err(io::Error::other)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "afpacket: no credit from the peer",
            ));
        }
        Ok(())
    }

    fn maybe_credit(&mut self) -> io::Result<()> {
        if !self.rx.credit_due() {
            return Ok(());
        }
        let peer = self.peer()?;
        write_header(
            &mut self.frame,
            peer,
            self.me,
            BenchHeader::Credit {
                consumed: self.rx.consumed,
            },
        );
        self.rx.credited = self.rx.consumed;
        self.push(HEADER)?;
        self.flush()
    }
}

impl Channel for AfPacketChannel {
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        let len =
            u32::try_from(msg.len()).map_err(|_| protocol("afpacket: message too long".into()))?;
        let peer = self.peer()?;
        let frames = train_frames(msg.len(), self.payload_max);
        for frag in 0..frames {
            while self.tx_frames.wrapping_sub(self.peer_consumed) >= WINDOW {
                self.flush()?;
                self.poll_credits()?;
            }
            let start = frag * self.payload_max;
            let chunk = &msg[start.min(msg.len())..(start + self.payload_max).min(msg.len())];
            write_header(
                &mut self.frame,
                peer,
                self.me,
                BenchHeader::Data {
                    msg: self.tx_msg,
                    frag: frag as u32,
                    len,
                },
            );
            self.frame[HEADER..HEADER + chunk.len()].copy_from_slice(chunk);
            self.tx_frames = self.tx_frames.wrapping_add(1);
            self.push(HEADER + chunk.len())?;
        }
        self.tx_msg = self.tx_msg.wrapping_add(1);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.unflushed = 0;
        self.sock.flush().map_err(io::Error::other)
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // Frames that came in behind an earlier message first. They count for credit even
        // when they do not complete a message: a sender whose window they filled waits for
        // it, and without it both ends would wait for the re-credit timeout.
        let done = self.rx.take_stash(buf)?;
        self.maybe_credit()?;
        if let Some(len) = done {
            return Ok(len);
        }
        let deadline = Instant::now() + self.policy.timeout;
        loop {
            let mut done: Option<usize> = None;
            let mut error: Option<io::Error> = None;
            let (rx, peer_consumed, peer) = (&mut self.rx, &mut self.peer_consumed, &mut self.peer);
            let n = self
                .sock
                .poll_spin_then_block(self.policy.spin, Some(RECREDIT_AFTER), |f| {
                    if error.is_some() {
                        return;
                    }
                    match parse_header(f) {
                        Some(BenchHeader::Credit { consumed }) => *peer_consumed = consumed,
                        Some(BenchHeader::Data { msg, frag, len }) => {
                            peer.get_or_insert_with(|| f[6..12].try_into().unwrap_or_default());
                            if done.is_some() {
                                rx.stash(f);
                                return;
                            }
                            match rx.accept(f, msg, frag, len, buf) {
                                Ok(d) => done = d,
                                Err(e) => error = Some(e),
                            }
                        }
                        None => {}
                    }
                })
                .map_err(io::Error::other)?;
            if let Some(e) = error {
                return Err(e);
            }
            if n == 0 && Instant::now() < deadline {
                self.recredit()?;
                continue;
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "afpacket: message {} fragment {} not received within {:?}",
                        self.rx.msg, self.rx.frag, self.policy.timeout
                    ),
                ));
            }
            // Credit as we go: a train longer than the window completes only if the
            // sender hears about the frames consumed so far.
            self.maybe_credit()?;
            if let Some(len) = done {
                return Ok(len);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_frame(msg: u32, frag: u32, len: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; HEADER + payload.len()];
        write_header(&mut f, [1; 6], [2; 6], BenchHeader::Data { msg, frag, len });
        f[HEADER..].copy_from_slice(payload);
        f
    }

    #[test]
    fn header_round_trip() {
        let f = data_frame(7, 3, 100_000, b"xy");
        assert_eq!(&f[12..14], &[0x86, 0xdf]);
        assert_eq!(
            parse_header(&f),
            Some(BenchHeader::Data {
                msg: 7,
                frag: 3,
                len: 100_000
            })
        );
        let mut c = vec![0u8; HEADER];
        write_header(
            &mut c,
            [1; 6],
            [2; 6],
            BenchHeader::Credit {
                consumed: 0xdead_beef,
            },
        );
        assert_eq!(
            parse_header(&c),
            Some(BenchHeader::Credit {
                consumed: 0xdead_beef
            })
        );
        // Truncated, foreign or unknown frames are not bench frames.
        assert_eq!(parse_header(&f[..29]), None);
        let mut other = f.clone();
        other[15] ^= 1;
        assert_eq!(parse_header(&other), None);
        other = f.clone();
        other[16] = 9;
        assert_eq!(parse_header(&other), None);
    }

    #[test]
    fn trains() {
        assert_eq!(train_frames(0, 8970), 1);
        assert_eq!(train_frames(8970, 8970), 1);
        assert_eq!(train_frames(8971, 8970), 2);
        assert_eq!(train_frames(16 << 20, 8970), 1871);
    }

    #[test]
    fn reassembly_in_order_and_padded() {
        let mut r = TrainReassembly::default();
        let mut buf = [0u8; 10];
        assert_eq!(
            r.accept(&data_frame(0, 0, 6, b"abcd"), 0, 0, 6, &mut buf)
                .unwrap(),
            None
        );
        assert_eq!(
            r.accept(&data_frame(0, 1, 6, b"ef"), 0, 1, 6, &mut buf)
                .unwrap(),
            Some(6)
        );
        assert_eq!(&buf[..6], b"abcdef");
        // An empty message padded to a minimum frame by a NIC.
        assert_eq!(
            r.accept(&data_frame(1, 0, 0, &[0; 30]), 1, 0, 0, &mut buf)
                .unwrap(),
            Some(0)
        );
        assert_eq!(r.consumed, 3);
        // A gap is an error, as is a message longer than the buffer.
        assert!(r
            .accept(&data_frame(2, 1, 6, b"x"), 2, 1, 6, &mut buf)
            .is_err());
        assert!(r
            .accept(&data_frame(2, 0, 11, b"x"), 2, 0, 11, &mut buf)
            .is_err());
    }

    /// A long train stashed behind a message (a receiver that was descheduled takes many
    /// frames in one batch) is taken in by the next receive without completing its message:
    /// a credit is due before that receive waits, since the sender's window may be full.
    #[test]
    fn a_stash_that_completes_no_message_still_makes_a_credit_due() {
        let mut r = TrainReassembly::default();
        let mut buf = vec![0u8; 4096 * WINDOW as usize];
        let len = buf.len() as u32;
        for frag in 0..WINDOW / 4 {
            r.stash(&data_frame(0, frag, len, &[7u8; 4096]));
        }
        assert!(!r.credit_due());
        assert_eq!(r.take_stash(&mut buf).unwrap(), None);
        assert!(r.stash.is_empty());
        assert_eq!(r.consumed, WINDOW / 4);
        assert!(r.credit_due());
        assert!(buf[..4096 * (WINDOW / 4) as usize].iter().all(|&b| b == 7));
    }
}

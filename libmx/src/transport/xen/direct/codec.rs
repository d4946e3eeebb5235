//! Frames on a direct channel: the core's frames, field by field, in little
//! endian (both ends are guests of one host). Decoding takes bytes copied out
//! of the peer's memory and refuses anything malformed: it never panics.

use xmx_mx::frame::{
    ConnectReply, ConnectRequest, Liback, MediumFrag, Message, MessageKind, Nack, Notify, Rndv,
};
use xmx_mx::{Body, Frame, RdmaWindow, Seqnum};

/// The longest payload a record carries (a MEDIUM fragment is at most a page).
pub(crate) const MAX_PAYLOAD: usize = 4096;
/// The longest encoded frame.
pub(crate) const MAX_FRAME: usize = MAX_PAYLOAD + 64;
/// The most LARGE data one record carries.
pub(crate) const MAX_DATA: usize = 32 << 10;
/// The head of the pull records.
pub(crate) const PULL_HEAD: usize = 16;
/// The longest record of any kind.
pub(crate) const MAX_RECORD: usize = PULL_HEAD + MAX_DATA;

/// A LARGE receiver asks for the data of a window (`tag` names the pull).
pub(crate) const PULL: u8 = 20;
/// LARGE data answering a pull: `len` bytes at `offset` of the message.
pub(crate) const DATA: u8 = 21;
/// The window of a pull is not (or no longer) lent.
pub(crate) const PULL_ERR: u8 = 22;

/// The head of a pull record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PullHead {
    /// PULL, DATA or PULL_ERR.
    pub(crate) kind: u8,
    /// The endpoint it is for.
    pub(crate) dst_endpoint: u8,
    /// The endpoint it is from.
    pub(crate) src_endpoint: u8,
    /// The puller's name for the pull.
    pub(crate) tag: u32,
    /// PULL: the window (id, seqnum, offset in its first page as
    /// [`RdmaWindow`]); DATA: unused.
    pub(crate) window: RdmaWindow,
    /// PULL: bytes asked; DATA: offset of the bytes in the message.
    pub(crate) a: u32,
    /// DATA: bytes that follow the head.
    pub(crate) b: u32,
}

impl PullHead {
    /// Its 16 bytes.
    pub(crate) fn encode(&self) -> [u8; PULL_HEAD] {
        let mut h = [0u8; PULL_HEAD];
        h[..4].copy_from_slice(&[self.kind, self.dst_endpoint, self.src_endpoint, 0]);
        h[4..8].copy_from_slice(&self.tag.to_le_bytes());
        match self.kind {
            PULL => {
                h[8] = self.window.id;
                h[9] = self.window.seqnum;
                h[10..12].copy_from_slice(&self.window.offset.to_le_bytes());
                h[12..16].copy_from_slice(&self.a.to_le_bytes());
            }
            _ => {
                h[8..12].copy_from_slice(&self.a.to_le_bytes());
                h[12..16].copy_from_slice(&self.b.to_le_bytes());
            }
        }
        h
    }

    /// The head at the start of `bytes` (a record of `len` bytes in all), if
    /// it is one and its lengths agree with `len`.
    pub(crate) fn decode(bytes: &[u8], len: usize) -> Option<PullHead> {
        let h: &[u8; PULL_HEAD] = bytes.first_chunk()?;
        let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let kind = h[0];
        let (window, a, b) = match kind {
            PULL | PULL_ERR => (
                RdmaWindow {
                    id: h[8],
                    seqnum: h[9],
                    offset: u16::from_le_bytes([h[10], h[11]]),
                },
                word(12),
                0,
            ),
            DATA => (
                RdmaWindow {
                    id: 0,
                    seqnum: 0,
                    offset: 0,
                },
                word(8),
                word(12),
            ),
            _ => return None,
        };
        let body = if kind == DATA { b as usize } else { 0 };
        if body > MAX_DATA || len != PULL_HEAD + body {
            return None;
        }
        Some(PullHead {
            kind,
            dst_endpoint: h[1],
            src_endpoint: h[2],
            tag: word(4),
            window,
            a,
            b,
        })
    }
}

const TINY: u8 = 1;
const SMALL: u8 = 2;
const MEDIUM: u8 = 3;
const RNDV: u8 = 4;
const LIBACK: u8 = 5;
const CONNECT_REQUEST: u8 = 6;
const CONNECT_REPLY: u8 = 7;
const NACK: u8 = 8;
const NOTIFY: u8 = 9;

/// What a message frame (TINY to RNDV) encodes before its payload.
const MESSAGE_HEAD: usize = 32;

/// The encoded length of a message frame carrying `payload` bytes.
pub(crate) const fn message_len(payload: usize) -> usize {
    MESSAGE_HEAD + payload
}

/// Appends `frame` to `out`; false (and nothing appended) if its payload is
/// too long for a record.
pub(crate) fn encode(frame: &Frame<Vec<u8>>, out: &mut Vec<u8>) -> bool {
    let start = out.len();
    let head = |out: &mut Vec<u8>, tag: u8| {
        out.extend_from_slice(&[tag, frame.dst_endpoint, frame.src_endpoint, 0]);
    };
    match &frame.body {
        Body::Message(m) => {
            if m.payload.len() > MAX_PAYLOAD {
                return false;
            }
            let tag = match m.kind {
                MessageKind::Tiny => TINY,
                MessageKind::Small => SMALL,
                MessageKind::Medium(_) => MEDIUM,
                MessageKind::Rndv(_) => RNDV,
            };
            head(out, tag);
            out.extend_from_slice(&m.session.to_le_bytes());
            out.extend_from_slice(&m.seqnum.raw().to_le_bytes());
            out.extend_from_slice(&m.piggyack.raw().to_le_bytes());
            out.extend_from_slice(&m.match_info.to_le_bytes());
            match m.kind {
                MessageKind::Tiny | MessageKind::Small => out.extend_from_slice(&[0; 8]),
                MessageKind::Medium(f) => {
                    out.extend_from_slice(&f.msg_length.to_le_bytes());
                    out.extend_from_slice(&[f.frag_seqnum, f.frag_pipeline, 0, 0]);
                }
                MessageKind::Rndv(r) => {
                    out.extend_from_slice(&r.msg_length.to_le_bytes());
                    out.extend_from_slice(&[r.window.id, r.window.seqnum]);
                    out.extend_from_slice(&r.window.offset.to_le_bytes());
                }
            }
            out.extend_from_slice(&(m.payload.len() as u32).to_le_bytes());
            out.extend_from_slice(&m.payload);
        }
        Body::Liback(a) => {
            head(out, LIBACK);
            for v in [a.session, a.ack_session, a.acknum] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&a.lib_seqnum.raw().to_le_bytes());
            out.extend_from_slice(&a.send_seq.raw().to_le_bytes());
            out.push(a.resent);
        }
        Body::ConnectRequest(c) => {
            head(out, CONNECT_REQUEST);
            out.extend_from_slice(&c.lib_seqnum.to_le_bytes());
            out.extend_from_slice(&c.src_session.to_le_bytes());
            out.extend_from_slice(&c.app_key.to_le_bytes());
            out.extend_from_slice(&c.target_recv_seqnum_start.raw().to_le_bytes());
            out.push(c.connect_seqnum);
        }
        Body::ConnectReply(c) => {
            head(out, CONNECT_REPLY);
            out.extend_from_slice(&c.lib_seqnum.to_le_bytes());
            out.extend_from_slice(&c.src_session.to_le_bytes());
            out.extend_from_slice(&c.target_session.to_le_bytes());
            out.extend_from_slice(&c.target_recv_seqnum_start.raw().to_le_bytes());
            out.extend_from_slice(&[c.connect_seqnum, c.status]);
        }
        Body::Nack(n) => {
            head(out, NACK);
            out.push(n.nack_type);
            out.extend_from_slice(&n.lib_seqnum.raw().to_le_bytes());
        }
        Body::Notify(n) => {
            head(out, NOTIFY);
            out.extend_from_slice(&n.session.to_le_bytes());
            out.extend_from_slice(&n.total_length.to_le_bytes());
            out.extend_from_slice(&[n.rdma_id, n.rdma_seqnum]);
            out.extend_from_slice(&n.seqnum.raw().to_le_bytes());
            out.extend_from_slice(&n.piggyack.raw().to_le_bytes());
        }
    }
    debug_assert!(out.len() - start <= MAX_FRAME);
    true
}

/// Reads fields off a byte slice; every read is bounded.
struct DirectCodecReader<'a>(&'a [u8]);

impl DirectCodecReader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }
    fn seq(&mut self) -> Option<Seqnum> {
        self.u16().map(Seqnum::from_raw)
    }
}

/// The frame `bytes` encode, with `peer_index` as its source; `None` if the
/// bytes are not one well-formed frame.
pub(crate) fn decode(bytes: &[u8], peer_index: u16) -> Option<Frame<Vec<u8>>> {
    let mut r = DirectCodecReader(bytes);
    let [tag, dst_endpoint, src_endpoint, _] = r.take::<4>()?;
    let body = match tag {
        TINY | SMALL | MEDIUM | RNDV => {
            let session = r.u32()?;
            let seqnum = r.seq()?;
            let piggyack = r.seq()?;
            let match_info = r.u64()?;
            let a = r.u32()?;
            let [b0, b1, b2, b3] = r.take::<4>()?;
            let kind = match tag {
                TINY => MessageKind::Tiny,
                SMALL => MessageKind::Small,
                MEDIUM => MessageKind::Medium(MediumFrag {
                    msg_length: a,
                    frag_seqnum: b0,
                    frag_pipeline: b1,
                }),
                _ => MessageKind::Rndv(Rndv {
                    msg_length: a,
                    window: RdmaWindow {
                        id: b0,
                        seqnum: b1,
                        offset: u16::from_le_bytes([b2, b3]),
                    },
                }),
            };
            let len = r.u32()? as usize;
            if len > MAX_PAYLOAD || len != r.0.len() {
                return None;
            }
            let payload = std::mem::take(&mut r.0).to_vec();
            Body::Message(Message {
                session,
                seqnum,
                piggyack,
                match_info,
                kind,
                payload,
            })
        }
        LIBACK => Body::Liback(Liback {
            session: r.u32()?,
            ack_session: r.u32()?,
            acknum: r.u32()?,
            lib_seqnum: r.seq()?,
            send_seq: r.seq()?,
            resent: r.u8()?,
        }),
        CONNECT_REQUEST => Body::ConnectRequest(ConnectRequest {
            lib_seqnum: r.u16()?,
            src_session: r.u32()?,
            app_key: r.u32()?,
            target_recv_seqnum_start: r.seq()?,
            connect_seqnum: r.u8()?,
        }),
        CONNECT_REPLY => Body::ConnectReply(ConnectReply {
            lib_seqnum: r.u16()?,
            src_session: r.u32()?,
            target_session: r.u32()?,
            target_recv_seqnum_start: r.seq()?,
            connect_seqnum: r.u8()?,
            status: r.u8()?,
        }),
        NACK => Body::Nack(Nack {
            nack_type: r.u8()?,
            lib_seqnum: r.seq()?,
        }),
        NOTIFY => Body::Notify(Notify {
            session: r.u32()?,
            total_length: r.u32()?,
            rdma_id: r.u8()?,
            rdma_seqnum: r.u8()?,
            seqnum: r.seq()?,
            piggyack: r.seq()?,
        }),
        _ => return None,
    };
    if !r.0.is_empty() {
        return None;
    }
    Some(Frame {
        peer_index,
        dst_endpoint,
        src_endpoint,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames() -> Vec<Frame<Vec<u8>>> {
        let s = Seqnum::from_raw;
        let msg = |kind, payload: Vec<u8>| {
            Body::Message(Message {
                session: 0xdead_beef,
                seqnum: s(7),
                piggyack: s(3),
                match_info: 0x0102_0304_0506_0708,
                kind,
                payload,
            })
        };
        let bodies = vec![
            msg(MessageKind::Tiny, vec![]),
            msg(MessageKind::Small, vec![9; 128]),
            msg(
                MessageKind::Medium(MediumFrag {
                    msg_length: 30000,
                    frag_seqnum: 3,
                    frag_pipeline: 12,
                }),
                vec![1; 4096],
            ),
            msg(
                MessageKind::Rndv(Rndv {
                    msg_length: 1 << 20,
                    window: RdmaWindow {
                        id: 4,
                        seqnum: 9,
                        offset: 100,
                    },
                }),
                vec![],
            ),
            Body::Liback(Liback {
                session: 1,
                ack_session: 1,
                acknum: 5,
                lib_seqnum: s(4),
                send_seq: s(3),
                resent: 1,
            }),
            Body::ConnectRequest(ConnectRequest {
                lib_seqnum: 0,
                src_session: 77,
                app_key: 0x1234,
                target_recv_seqnum_start: s(2),
                connect_seqnum: 3,
            }),
            Body::ConnectReply(ConnectReply {
                lib_seqnum: 0,
                src_session: 77,
                target_session: 78,
                target_recv_seqnum_start: s(1),
                connect_seqnum: 3,
                status: 11,
            }),
            Body::Nack(Nack {
                nack_type: 2,
                lib_seqnum: s(9),
            }),
            Body::Notify(Notify {
                session: 5,
                total_length: 1 << 20,
                rdma_id: 4,
                rdma_seqnum: 9,
                seqnum: s(10),
                piggyack: s(2),
            }),
        ];
        bodies
            .into_iter()
            .map(|body| Frame {
                peer_index: 6,
                dst_endpoint: 2,
                src_endpoint: 3,
                body,
            })
            .collect()
    }

    #[test]
    fn every_body_round_trips() {
        for f in frames() {
            let mut b = Vec::new();
            assert!(encode(&f, &mut b));
            assert!(b.len() <= MAX_FRAME);
            assert_eq!(decode(&b, 6).as_ref(), Some(&f));
            if let Body::Message(m) = &f.body {
                assert_eq!(b.len(), message_len(m.payload.len()), "{f:?}");
            }
        }
    }

    #[test]
    fn pull_heads_round_trip_and_lengths_must_agree() {
        let pull = PullHead {
            kind: PULL,
            dst_endpoint: 1,
            src_endpoint: 2,
            tag: 77,
            window: RdmaWindow {
                id: 3,
                seqnum: 4,
                offset: 5,
            },
            a: 1 << 20,
            b: 0,
        };
        assert_eq!(PullHead::decode(&pull.encode(), PULL_HEAD), Some(pull));
        assert_eq!(PullHead::decode(&pull.encode(), PULL_HEAD + 1), None);
        let data = PullHead {
            kind: DATA,
            window: RdmaWindow {
                id: 0,
                seqnum: 0,
                offset: 0,
            },
            a: 4096,
            b: 100,
            ..pull
        };
        assert_eq!(
            PullHead::decode(&data.encode(), PULL_HEAD + 100),
            Some(data)
        );
        assert_eq!(PullHead::decode(&data.encode(), PULL_HEAD + 99), None);
        let huge = PullHead {
            b: MAX_DATA as u32 + 1,
            ..data
        };
        assert_eq!(
            PullHead::decode(&huge.encode(), PULL_HEAD + MAX_DATA + 1),
            None
        );
        assert_eq!(PullHead::decode(&[DATA; 8], PULL_HEAD), None);
        assert_eq!(PullHead::decode(&[TINY; 16], PULL_HEAD), None);
    }

    #[test]
    fn garbage_is_refused_without_panic() {
        for f in frames() {
            let mut b = Vec::new();
            encode(&f, &mut b);
            for cut in 0..b.len() {
                assert_eq!(decode(&b[..cut], 6), None, "{:?} cut at {cut}", f.body);
            }
            let mut longer = b.clone();
            longer.push(0);
            assert_eq!(decode(&longer, 6), None);
        }
        // A payload length that lies.
        let mut b = Vec::new();
        encode(&frames()[1], &mut b);
        b[28] = 0xff;
        assert_eq!(decode(&b, 6), None);
        assert_eq!(decode(&[200, 0, 0, 0], 6), None);
        let too_long = Frame {
            peer_index: 0,
            dst_endpoint: 0,
            src_endpoint: 0,
            body: Body::Message(Message {
                session: 0,
                seqnum: Seqnum::from_raw(0),
                piggyack: Seqnum::from_raw(0),
                match_info: 0,
                kind: MessageKind::Small,
                payload: vec![0; MAX_PAYLOAD + 1],
            }),
        };
        let mut b = Vec::new();
        assert!(!encode(&too_long, &mut b));
        assert!(b.is_empty());
    }
}

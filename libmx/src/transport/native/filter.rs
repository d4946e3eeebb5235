//! Which of the link's frames the kernel hands this process: a socket filter
//! that keeps the PULL_REPLY frames of other processes' endpoints out.
//!
//! Every native process on an interface has a socket of its own, and the
//! kernel copies every MXoE frame into each of them: with several processes
//! (MPI ranks) on one interface, each took in, and threw away, the others'
//! bulk data. Open-MX's driver demultiplexes by endpoint in the kernel; here
//! a classic BPF program does, for PULL_REPLY frames only (the bytes of
//! every LARGE message): a reply names its endpoint by the magic its PULL
//! carried (`xmx_engine::pull_magic`), and a reply for an endpoint nobody
//! holds is dropped by the engine anyway, so no refusal is lost. Frames that
//! may need a refusal from whichever process sees them (a message or a PULL
//! for an endpoint nobody holds, see `ClaimsElsewhere`) still reach every
//! process, as do frames too short to hold the fields the program reads
//! (the engine counts those as malformed).

use xmx_engine::pull_magic;
use xmx_wire::mxoe::pull::reply_field;
use xmx_wire::mxoe::{head, PacketType, ETHERTYPE};

/// The most endpoints a filter names; a process holding more takes every
/// reply (a jump of the program spans at most 255 instructions).
pub(super) const NAMED_ENDPOINTS_MAX: usize = 200;

// Classic BPF opcodes (linux/filter.h).
const LD_W_LEN: u16 = 0x80; // BPF_LD | BPF_W | BPF_LEN
const LD_H_ABS: u16 = 0x28; // BPF_LD | BPF_H | BPF_ABS
const LD_B_ABS: u16 = 0x30; // BPF_LD | BPF_B | BPF_ABS
const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const RET_K: u16 = 0x06; // BPF_RET | BPF_K

/// Offset of the packet type in a frame.
const PTYPE_AT: u32 = head::field::LEN as u32;
/// Offset of a PULL_REPLY's `dst_magic` in a frame.
const DST_MAGIC_AT: u32 = (head::field::LEN + reply_field::DST_MAGIC) as u32;
/// Frames shorter than this reach the process whatever they are.
const READ_LEN: u32 = DST_MAGIC_AT + 4;

fn op(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The program that takes every frame but PULL_REPLY frames for endpoints
/// not in `held`; `None` when `held` names too many to filter.
pub(super) fn pull_replies_only_for(held: &[u8]) -> Option<Vec<libc::sock_filter>> {
    if held.len() > NAMED_ENDPOINTS_MAX {
        return None;
    }
    let n = held.len();
    // Instruction indices: 0 len, 1 short?, 2 ethertype, 3 MXoE?, 4 type,
    // 5 reply?, 6 magic, 7.. one test per endpoint, then drop, then take.
    let take = 7 + n + 1;
    let to_take = |at: usize| (take - (at + 1)) as u8;
    let mut p = vec![
        op(LD_W_LEN, 0, 0, 0),
        op(JGE_K, 0, to_take(1), READ_LEN),
        op(LD_H_ABS, 0, 0, head::field::ETHERTYPE as u32),
        op(JEQ_K, 0, to_take(3), u32::from(ETHERTYPE)),
        op(LD_B_ABS, 0, 0, PTYPE_AT),
        op(
            JEQ_K,
            0,
            to_take(5),
            u32::from(u8::from(PacketType::PullReply)),
        ),
        op(LD_W_ABS, 0, 0, DST_MAGIC_AT),
    ];
    for (i, &endpoint) in held.iter().enumerate() {
        p.push(op(JEQ_K, to_take(7 + i), 0, pull_magic(endpoint)));
    }
    p.push(op(RET_K, 0, 0, 0));
    p.push(op(RET_K, 0, 0, u32::MAX));
    Some(p)
}

/// The program that takes every frame (for a process holding more endpoints
/// than a filter names).
pub(super) fn everything() -> Vec<libc::sock_filter> {
    vec![op(RET_K, 0, 0, u32::MAX)]
}

/// A PULL_REPLY frame with `head`, carrying `data` for endpoint `endpoint`
/// of the puller (a stale pull's handle: only the filter cares what it is).
#[cfg(test)]
pub(super) fn pull_reply_frame(
    head: xmx_wire::mxoe::HeadRepr,
    endpoint: u8,
    data: &[u8],
) -> Vec<u8> {
    use xmx_wire::mxoe::{FrameRepr, PacketRepr, PullReplyRepr};
    let repr = FrameRepr {
        head,
        packet: PacketRepr::PullReply(PullReplyRepr {
            frame_seqnum: 0,
            msg_offset: 0,
            dst_pull_handle: 1,
            dst_magic: pull_magic(endpoint),
            data,
        }),
    };
    let mut f = vec![0u8; repr.buffer_len()];
    repr.emit(&mut f).expect("a PULL_REPLY fits its own length");
    f
}

/// Runs `program` over `frame` as the kernel does (the subset of classic
/// BPF [`pull_replies_only_for`] uses): whether the frame is taken.
#[cfg(test)]
pub(super) fn takes(program: &[libc::sock_filter], frame: &[u8]) -> bool {
    let mut a: u32 = 0;
    let mut pc = 0usize;
    let load = |at: u32, width: usize| -> Option<u32> {
        let at = at as usize;
        let bytes = frame.get(at..at + width)?;
        Some(bytes.iter().fold(0u32, |v, &b| (v << 8) | u32::from(b)))
    };
    while let Some(i) = program.get(pc) {
        pc += 1;
        match i.code {
            LD_W_LEN => a = frame.len() as u32,
            LD_H_ABS | LD_B_ABS | LD_W_ABS => {
                let width = match i.code {
                    LD_H_ABS => 2,
                    LD_B_ABS => 1,
                    _ => 4,
                };
                // The kernel ends the program, dropping the frame, on a load
                // beyond it.
                let Some(v) = load(i.k, width) else {
                    return false;
                };
                a = v;
            }
            JEQ_K => pc += usize::from(if a == i.k { i.jt } else { i.jf }),
            JGE_K => pc += usize::from(if a >= i.k { i.jt } else { i.jf }),
            RET_K => return i.k != 0,
            other => panic!("opcode {other:#x} not used by the link filter"),
        }
    }
    panic!("the program ran off its end")
}

#[cfg(test)]
mod tests {
    use super::*;
    use xmx_wire::mxoe::pull::PullReplyPacket;
    use xmx_wire::mxoe::HEAD_LEN;

    fn frame(ptype: u8, magic: u32, len: usize) -> Vec<u8> {
        let mut f = vec![0u8; len];
        f[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
        f[HEAD_LEN] = ptype;
        if len >= READ_LEN as usize {
            PullReplyPacket::new_unchecked(&mut f[HEAD_LEN..]).set_dst_magic(magic);
        }
        f
    }

    #[test]
    fn pull_replies_reach_only_the_process_holding_their_endpoint() {
        let reply = u8::from(PacketType::PullReply);
        let p = pull_replies_only_for(&[2, 7]).unwrap();
        assert!(takes(&p, &frame(reply, pull_magic(2), 8224)));
        assert!(takes(&p, &frame(reply, pull_magic(7), 100)));
        assert!(!takes(&p, &frame(reply, pull_magic(3), 8224)));
        assert!(!takes(&p, &frame(reply, 0, 8224)));
        // Other packet types, other protocols and short frames all pass.
        for ptype in [PacketType::Tiny, PacketType::Pull, PacketType::Connect] {
            assert!(takes(&p, &frame(u8::from(ptype), pull_magic(3), 100)));
        }
        let mut ip = frame(reply, pull_magic(3), 100);
        ip[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        assert!(takes(&p, &ip));
        assert!(takes(
            &p,
            &frame(reply, pull_magic(3), READ_LEN as usize - 1)
        ));
        assert!(takes(&p, &[0u8; 6]));
        // Nothing held: no reply is ours.
        let none = pull_replies_only_for(&[]).unwrap();
        assert!(!takes(&none, &frame(reply, pull_magic(0), 100)));
        assert!(takes(&none, &frame(u8::from(PacketType::Tiny), 0, 100)));
    }

    #[test]
    fn the_jumps_of_the_largest_filter_fit() {
        let held: Vec<u8> = (0..NAMED_ENDPOINTS_MAX).map(|i| i as u8).collect();
        let p = pull_replies_only_for(&held).unwrap();
        let reply = u8::from(PacketType::PullReply);
        for &e in &held {
            assert!(takes(&p, &frame(reply, pull_magic(e), 100)));
        }
        assert!(!takes(&p, &frame(reply, pull_magic(250), 100)));
        assert!(pull_replies_only_for(&(0..=255).collect::<Vec<u8>>()).is_none());
    }
}

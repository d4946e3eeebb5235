//! xmx's extension of MXoE for links that carry frames longer than MX's: a board says
//! how many 4 KiB units of data one frame toward it may carry, in the Ethernet padding
//! right after a packet. MX and Open-MX never read the padding and never write the mark,
//! so toward them every frame stays MX's (one unit); between xmx boards,
//!
//! - a PULL carrying the mark asks for PULL_REPLY frames of up to that many consecutive
//!   frames' data, each still numbered and placed as MX's would be;
//! - a CONNECT (request or reply) carrying it tells the peer that MEDIUM fragments toward
//!   its sender may be that long (a stride of `12 + log2` units, see
//!   [`MediumRepr`](super::MediumRepr)); one without it says they may not.

use super::PULL_REPLIES_PER_BLOCK;

/// The mark's tag; the count follows it.
pub const TAG: [u8; 3] = *b"xmx";
/// Bytes of the mark.
pub const LEN: usize = TAG.len() + 1;
/// The most units a mark can name: a pulled block, which is also the longest MEDIUM
/// message (32 KiB).
pub const UNITS_MAX: u8 = PULL_REPLIES_PER_BLOCK as u8;

/// Writes the mark for `units` at the start of `after_packet` (the bytes right after the
/// packet); false (nothing written) if it has no room.
pub fn write(after_packet: &mut [u8], units: u8) -> bool {
    let Some(mark) = after_packet.get_mut(..LEN) else {
        return false;
    };
    mark[..TAG.len()].copy_from_slice(&TAG);
    mark[TAG.len()] = units;
    true
}

/// The units the mark names: 1 without a mark (MX, Open-MX), and at most [`UNITS_MAX`].
pub fn read(after_packet: &[u8]) -> u8 {
    match after_packet.get(..LEN) {
        Some(mark) if mark[..TAG.len()] == TAG => mark[TAG.len()].clamp(1, UNITS_MAX),
        _ => 1,
    }
}

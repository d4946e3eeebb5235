//! Layout of TPACKET_V2 rings: slot sizes, block sizes, where each slot lives.
//!
//! The kernel allocates a ring as `block_nr` blocks of `block_size` bytes (a whole number
//! of pages each) and cuts every block into `block_size / frame_size` slots; a slot never
//! straddles two blocks. The mmap'd area shows the blocks back to back.

use std::mem::size_of;

use super::error::{NicError, Result};

/// Alignment of slots and of the offsets inside them (TPACKET_ALIGNMENT).
pub(crate) const SLOT_ALIGN: usize = 16;

/// `x` rounded up to [`SLOT_ALIGN`].
pub(crate) const fn slot_align(x: usize) -> usize {
    (x + SLOT_ALIGN - 1) & !(SLOT_ALIGN - 1)
}

/// Offset of the link-layer address (`sockaddr_ll`) in a receive slot.
pub(crate) const SLOT_ADDR_OFFSET: usize = slot_align(size_of::<libc::tpacket2_hdr>());
/// Slot header and link-layer address together (TPACKET2_HDRLEN): no frame byte may
/// start before this offset.
pub(crate) const SLOT_HDR_LEN: usize = SLOT_ADDR_OFFSET + size_of::<libc::sockaddr_ll>();
/// Where the kernel reads a frame in a transmit slot (no PACKET_TX_HAS_OFF).
pub(crate) const TX_DATA_OFFSET: usize = SLOT_HDR_LEN - size_of::<libc::sockaddr_ll>();
/// Where the kernel puts the network header of a received frame: the header area plus at
/// least 16 bytes of room for the link header, aligned.
pub(crate) const RX_NET_OFFSET: usize = slot_align(SLOT_HDR_LEN + 16);
/// Room for one 802.1Q tag, in case the NIC leaves one in the frame.
const VLAN_TAG_LEN: usize = 4;
/// Largest block considered when choosing a block size, in pages.
const BLOCK_PAGES_MAX: usize = 64;

/// Receive slot size for an interface of MTU `mtu`: a whole frame plus headers fits.
pub(crate) fn rx_frame_size(mtu: usize) -> Option<usize> {
    RX_NET_OFFSET
        .checked_add(mtu)?
        .checked_add(VLAN_TAG_LEN + SLOT_ALIGN - 1)
        .map(|x| x & !(SLOT_ALIGN - 1))
}

/// Transmit slot size for frames of up to `frame_len` bytes.
pub(crate) fn tx_frame_size(frame_len: usize) -> Option<usize> {
    TX_DATA_OFFSET
        .checked_add(frame_len)?
        .checked_add(SLOT_ALIGN - 1)
        .map(|x| x & !(SLOT_ALIGN - 1))
}

/// The shape of one ring, as handed to PACKET_RX_RING / PACKET_TX_RING.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingGeometry {
    block_size: usize,
    block_nr: usize,
    frame_size: usize,
    frame_nr: usize,
}

impl RingGeometry {
    /// A ring of at least `frames_wanted` slots of `frame_size` bytes on a machine with
    /// `page_size`-byte pages. The block size is the multiple of the page size, up to
    /// 64 pages, that wastes the smallest share of each block.
    pub(crate) fn new(frame_size: usize, frames_wanted: usize, page_size: usize) -> Result<Self> {
        if !page_size.is_power_of_two() {
            return Err(NicError::InvalidConfig("page size is not a power of two"));
        }
        if frame_size < SLOT_HDR_LEN || frame_size & (SLOT_ALIGN - 1) != 0 {
            return Err(NicError::InvalidConfig(
                "ring slot size is not a valid TPACKET_V2 slot",
            ));
        }
        if frames_wanted == 0 {
            return Err(NicError::InvalidConfig("a ring needs at least one slot"));
        }
        let min_pages = frame_size.div_ceil(page_size);
        let mut best: Option<(usize, usize)> = None; // (block size, waste)
        for pages in min_pages..=min_pages.max(BLOCK_PAGES_MAX) {
            let block = pages
                .checked_mul(page_size)
                .ok_or(NicError::InvalidConfig("ring slot too large"))?;
            let waste = block % frame_size;
            // Compare waste / block exactly; ties keep the smaller block.
            let better = match best {
                None => true,
                Some((b, w)) => (waste as u128) * (b as u128) < (w as u128) * (block as u128),
            };
            if better {
                best = Some((block, waste));
            }
        }
        let (block_size, _) = best.ok_or(NicError::InvalidConfig("ring slot too large"))?;
        let per_block = block_size / frame_size;
        let block_nr = frames_wanted.div_ceil(per_block);
        let too_large = NicError::InvalidConfig("ring too large");
        let frame_nr = block_nr.checked_mul(per_block).ok_or(too_large)?;
        let geometry = Self {
            block_size,
            block_nr,
            frame_size,
            frame_nr,
        };
        let fits_u32 = [block_size, block_nr, frame_size, frame_nr]
            .iter()
            .all(|&v| u32::try_from(v).is_ok());
        match block_size.checked_mul(block_nr) {
            Some(_) if fits_u32 => Ok(geometry),
            _ => Err(NicError::InvalidConfig("ring too large")),
        }
    }

    /// Bytes of one slot.
    pub(crate) fn frame_size(&self) -> usize {
        self.frame_size
    }

    /// Number of slots.
    pub(crate) fn frame_nr(&self) -> usize {
        self.frame_nr
    }

    /// Bytes of one block.
    pub(crate) fn block_size(&self) -> usize {
        self.block_size
    }

    /// Bytes of the whole ring in the mapping.
    pub(crate) fn size(&self) -> usize {
        // Checked in `new`.
        self.block_size * self.block_nr
    }

    /// Slots in one block.
    pub(crate) fn frames_per_block(&self) -> usize {
        self.block_size / self.frame_size
    }

    /// Offset of slot `index` from the start of the ring, or `None` past the last slot.
    pub(crate) fn slot_offset(&self, index: usize) -> Option<usize> {
        if index >= self.frame_nr {
            return None;
        }
        let per_block = self.frames_per_block();
        Some((index / per_block) * self.block_size + (index % per_block) * self.frame_size)
    }

    /// The request that asks the kernel for this ring.
    pub(crate) fn to_req(self) -> libc::tpacket_req {
        // All four values fit in u32: checked in `new`.
        libc::tpacket_req {
            tp_block_size: self.block_size as u32,
            tp_block_nr: self.block_nr as u32,
            tp_frame_size: self.frame_size as u32,
            tp_frame_nr: self.frame_nr as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_offsets_match_the_v2_abi() {
        assert_eq!(size_of::<libc::tpacket2_hdr>(), 32);
        assert_eq!(SLOT_ADDR_OFFSET, 32);
        assert_eq!(SLOT_HDR_LEN, 52);
        assert_eq!(TX_DATA_OFFSET, 32);
        assert_eq!(RX_NET_OFFSET, 80);
    }

    #[test]
    fn slot_sizes_hold_a_full_frame() {
        // MTU 9000: network part 9000 at offset 80, plus a VLAN tag, aligned.
        assert_eq!(rx_frame_size(9000), Some(9088));
        assert_eq!(tx_frame_size(9014), Some(9056));
        assert_eq!(rx_frame_size(4130).unwrap() % SLOT_ALIGN, 0);
        assert_eq!(rx_frame_size(usize::MAX), None);
        assert_eq!(tx_frame_size(usize::MAX - 8), None);
    }

    #[test]
    fn block_size_wastes_little() {
        let g = RingGeometry::new(9088, 1024, 4096).unwrap();
        assert_eq!(g.block_size() % 4096, 0);
        assert!(g.frame_nr() >= 1024);
        let waste = g.block_size() % g.frame_size();
        assert!(
            waste * 100 < g.block_size(),
            "waste {waste} of {}",
            g.block_size()
        );
        assert_eq!(g.frame_nr() % g.frames_per_block(), 0);
        assert_eq!(
            g.size(),
            g.block_size() * (g.frame_nr() / g.frames_per_block())
        );
    }

    #[test]
    fn exact_fit_keeps_one_page_blocks() {
        let g = RingGeometry::new(2048, 10, 4096).unwrap();
        assert_eq!(g.block_size(), 4096);
        assert_eq!(g.frames_per_block(), 2);
        assert_eq!(g.frame_nr(), 10);
        assert_eq!(g.size(), 5 * 4096);
    }

    #[test]
    fn slot_larger_than_max_block_gets_its_own_block() {
        let frame = 64 * 4096 + 16;
        let g = RingGeometry::new(frame, 3, 4096).unwrap();
        assert_eq!(g.frames_per_block(), 1);
        assert_eq!(g.block_size(), 65 * 4096);
        assert_eq!(g.frame_nr(), 3);
    }

    #[test]
    fn slot_offsets_never_straddle_blocks() {
        let g = RingGeometry::new(9088, 100, 4096).unwrap();
        let per_block = g.frames_per_block();
        for i in 0..g.frame_nr() {
            let off = g.slot_offset(i).unwrap();
            assert_eq!(off % SLOT_ALIGN, 0);
            assert_eq!(off / g.block_size(), i / per_block);
            assert!(off % g.block_size() + g.frame_size() <= g.block_size());
            assert!(off + g.frame_size() <= g.size());
        }
        assert_eq!(g.slot_offset(g.frame_nr()), None);
    }

    #[test]
    fn request_carries_the_geometry() {
        let g = RingGeometry::new(9056, 512, 4096).unwrap();
        let req = g.to_req();
        assert_eq!(req.tp_frame_size as usize, g.frame_size());
        assert_eq!(req.tp_frame_nr as usize, g.frame_nr());
        assert_eq!(req.tp_block_size as usize, g.block_size());
        assert_eq!(
            req.tp_block_nr as usize * req.tp_block_size as usize,
            g.size()
        );
    }

    #[test]
    fn bad_inputs_are_refused() {
        for (frame, n, page) in [
            (9088, 0, 4096),
            (40, 1, 4096),
            (9090, 1, 4096),
            (9088, 1, 3000),
            (9088, usize::MAX, 4096),
        ] {
            assert!(
                matches!(
                    RingGeometry::new(frame, n, page),
                    Err(NicError::InvalidConfig(_))
                ),
                "{frame} {n} {page}"
            );
        }
    }
}

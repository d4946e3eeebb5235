//! What our `mx_endpoint_addr_t` holds.
//!
//! MX leaves the 16 bytes opaque. Ours carry the remote NIC id, the remote
//! endpoint id and session (what `mx_decompose_endpoint_addr2` reports), and
//! the handle of the local endpoint that connected, which keys the
//! per-address context of `mx_set_endpoint_addr_context`:
//!
//! - `stuff[0]`: NIC id (48-bit MAC) in bits 0..48, a tag in bits 48..64
//!   that marks the 16 bytes as made by this library
//! - `stuff[1]`: session in bits 0..32, remote endpoint id in bits 32..40,
//!   local endpoint handle in bits 40..64.
//!
//! Any 16 bytes decode; [`Addr::is_ours`] tells the library's addresses
//! from garbage (MX reports `MX_BAD_ENDPOINT` for those), and whether an
//! address names a reachable endpoint is checked where it is used.

use crate::abi::MxEndpointAddr;

/// Bits of the local endpoint handle stored in an address.
pub(crate) const LOCAL_HANDLE_BITS: u32 = 24;
/// Bits of a NIC id (a MAC address).
const NIC_ID_BITS: u32 = 48;
const NIC_ID_MASK: u64 = (1 << NIC_ID_BITS) - 1;
/// The tag above the NIC id of every address the library makes.
const TAG: u64 = 0x786d;

/// A decoded endpoint address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Addr {
    /// The remote board.
    pub(crate) nic_id: u64,
    /// The remote endpoint id.
    pub(crate) endpoint: u8,
    /// The remote endpoint's session id.
    pub(crate) session: u32,
    /// Handle of the local endpoint the address belongs to (0: none).
    pub(crate) local: u32,
}

impl Addr {
    /// The C form.
    pub(crate) fn encode(&self) -> MxEndpointAddr {
        let local = (self.local as u64) & ((1 << LOCAL_HANDLE_BITS) - 1);
        MxEndpointAddr {
            stuff: [
                (self.nic_id & NIC_ID_MASK) | TAG << NIC_ID_BITS,
                self.session as u64 | (self.endpoint as u64) << 32 | local << 40,
            ],
        }
    }

    /// Reads the C form.
    pub(crate) fn decode(a: MxEndpointAddr) -> Self {
        Addr {
            nic_id: a.stuff[0] & NIC_ID_MASK,
            session: a.stuff[1] as u32,
            endpoint: (a.stuff[1] >> 32) as u8,
            local: (a.stuff[1] >> 40) as u32,
        }
    }

    /// Whether `a` was made by this library (by [`Addr::encode`]).
    pub(crate) fn is_ours(a: MxEndpointAddr) -> bool {
        a.stuff[0] >> NIC_ID_BITS == TAG
    }

    /// The key of the per-address context: the remote endpoint, whatever
    /// its session.
    pub(crate) fn remote(&self) -> (u64, u8) {
        (self.nic_id, self.endpoint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let a = Addr {
            nic_id: 0x0002_c9ff_0a0b_0c0d,
            endpoint: 255,
            session: 0xdead_beef,
            local: 0xab_cdef,
        };
        let e = a.encode();
        assert!(Addr::is_ours(e));
        assert_eq!(
            Addr::decode(e),
            Addr {
                nic_id: 0xc9ff_0a0b_0c0d,
                ..a
            }
        );
        assert_eq!(e.stuff[0], 0x786d_c9ff_0a0b_0c0d);
        assert_eq!(e.stuff[1], 0xabcd_efff_dead_beef);
    }

    #[test]
    fn any_bytes_decode() {
        let a = Addr::decode(MxEndpointAddr {
            stuff: [u64::MAX, u64::MAX],
        });
        assert_eq!((a.endpoint, a.session, a.local), (255, u32::MAX, 0xff_ffff));
    }

    #[test]
    fn garbage_is_not_ours() {
        for stuff in [[0, 0], [u64::MAX, u64::MAX], [0x0002_c9ff_0a0b_0c0d, 7]] {
            assert!(!Addr::is_ours(MxEndpointAddr { stuff }), "{stuff:x?}");
        }
    }
}

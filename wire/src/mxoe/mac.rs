//! Ethernet MAC addresses, which MX also uses as board addresses.

use core::fmt;
use core::str::FromStr;

use crate::Error;

/// A 48-bit Ethernet address. MX names a NIC by it (its "board address").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    /// ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: Mac = Mac([0xff; 6]);

    /// The six octets, in wire order.
    pub const fn octets(&self) -> [u8; 6] {
        self.0
    }

    /// True for ff:ff:ff:ff:ff:ff.
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// True when the group bit (lowest bit of the first octet) is set; broadcast included.
    pub const fn is_multicast(&self) -> bool {
        self.0[0] & 0x01 != 0
    }

    /// True for an individual (non-group) address.
    pub const fn is_unicast(&self) -> bool {
        !self.is_multicast()
    }

    /// The board address as MX tools print it: the octets as a big-endian 48-bit number.
    pub const fn to_board_addr(&self) -> u64 {
        let o = self.0;
        u64::from_be_bytes([0, 0, o[0], o[1], o[2], o[3], o[4], o[5]])
    }

    /// The address of a board, refusing values wider than 48 bits.
    pub fn from_board_addr(addr: u64) -> crate::Result<Self> {
        let [hi0, hi1, a, b, c, d, e, f] = addr.to_be_bytes();
        if hi0 != 0 || hi1 != 0 {
            return Err(Error::Invalid {
                field: "board address",
                reason: "wider than 48 bits",
            });
        }
        Ok(Mac([a, b, c, d, e, f]))
    }
}

impl From<[u8; 6]> for Mac {
    fn from(octets: [u8; 6]) -> Self {
        Mac(octets)
    }
}

impl From<Mac> for [u8; 6] {
    fn from(mac: Mac) -> Self {
        mac.0
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl FromStr for Mac {
    type Err = Error;

    /// Parses six colon-separated groups of one or two hex digits.
    fn from_str(s: &str) -> Result<Self, Error> {
        let invalid = |reason| Error::Invalid {
            field: "mac address",
            reason,
        };
        let mut octets = [0u8; 6];
        let mut groups = s.split(':');
        for octet in octets.iter_mut() {
            let group = groups.next().ok_or(invalid("fewer than six groups"))?;
            if group.is_empty() || group.len() > 2 || !group.bytes().all(|b| b.is_ascii_hexdigit())
            {
                return Err(invalid("a group is not one or two hex digits"));
            }
            *octet = u8::from_str_radix(group, 16)
                .map_err(|_| invalid("a group is not one or two hex digits"))?;
        }
        if groups.next().is_some() {
            return Err(invalid("more than six groups"));
        }
        Ok(Mac(octets))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_lowercase_colon_separated() {
        let mac = Mac([0x00, 0x1b, 0x21, 0xab, 0xcd, 0xef]);
        assert_eq!(mac.to_string(), "00:1b:21:ab:cd:ef");
        assert_eq!(Mac::BROADCAST.to_string(), "ff:ff:ff:ff:ff:ff");
    }

    #[test]
    fn parse_accepts_both_cases_and_short_groups() {
        assert_eq!(
            "00:1B:21:ab:CD:ef".parse::<Mac>(),
            Ok(Mac([0x00, 0x1b, 0x21, 0xab, 0xcd, 0xef]))
        );
        assert_eq!("0:1:2:3:4:5".parse::<Mac>(), Ok(Mac([0, 1, 2, 3, 4, 5])));
    }

    #[test]
    fn parse_refuses_malformed_text() {
        for bad in [
            "",
            "00:11:22:33:44",
            "00:11:22:33:44:55:66",
            "00:11:22:33:44:",
            "000:11:22:33:44:55",
            "0g:11:22:33:44:55",
            "+1:11:22:33:44:55",
            "00-11-22-33-44-55",
            "00:11:22:33:44:55 ",
        ] {
            assert!(
                matches!(
                    bad.parse::<Mac>(),
                    Err(Error::Invalid {
                        field: "mac address",
                        ..
                    })
                ),
                "{bad:?} was accepted"
            );
        }
    }

    #[test]
    fn display_parse_round_trip() {
        let mac = Mac([0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54]);
        assert_eq!(mac.to_string().parse::<Mac>(), Ok(mac));
    }

    #[test]
    fn group_bits() {
        assert!(Mac::BROADCAST.is_broadcast());
        assert!(Mac::BROADCAST.is_multicast());
        let multicast = Mac([0x01, 0x00, 0x5e, 0, 0, 1]);
        assert!(multicast.is_multicast() && !multicast.is_broadcast());
        let unicast = Mac([0x02, 0, 0, 0, 0, 1]);
        assert!(unicast.is_unicast() && !unicast.is_multicast());
    }

    #[test]
    fn board_addr_round_trip() {
        let mac = Mac([0x00, 0x60, 0xdd, 0x47, 0x11, 0x02]);
        assert_eq!(mac.to_board_addr(), 0x0060_dd47_1102);
        assert_eq!(Mac::from_board_addr(0x0060_dd47_1102), Ok(mac));
        assert!(Mac::from_board_addr(1 << 48).is_err());
    }
}

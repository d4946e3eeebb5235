//! Discriminants carried in MXoE packets, and the MX message classes.

use super::{MEDIUM_MSG_LEN_MAX, SMALL_MSG_LEN_MAX, TINY_MSG_LEN_MAX};
use crate::Error;

/// Declares a `u8` enum whose `TryFrom<u8>` refuses unknown values.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $name:ident ($what:literal) {
            $( $(#[$vmeta:meta])* $variant:ident = $value:literal ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum $name {
            $( $(#[$vmeta])* $variant = $value ),*
        }

        impl $name {
            /// Every value, in wire order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];
        }

        impl TryFrom<u8> for $name {
            type Error = Error;

            fn try_from(value: u8) -> Result<Self, Error> {
                match value {
                    $( $value => Ok($name::$variant), )*
                    other => Err(Error::Unknown { what: $what, value: u32::from(other) }),
                }
            }
        }

        impl From<$name> for u8 {
            fn from(value: $name) -> u8 {
                value as u8
            }
        }
    };
}

wire_enum! {
    /// The type byte that opens every packet after the 16-byte head.
    PacketType ("packet type") {
        /// Never sent.
        None = 0,
        /// Raw frames for mapper-style tools; opaque after the type byte.
        Raw = 1,
        /// Reserved by MX (NIC reply to the fabric manager); not carried by Open-MX.
        MfmNicReply = 2,
        /// Ask a peer for its hostname.
        HostQuery = 3,
        /// A peer's hostname.
        HostReply = 4,
        /// Reserved by MX; not carried by Open-MX.
        EtherUnicast = 32,
        /// Reserved by MX; not carried by Open-MX.
        EtherMulticast = 33,
        /// Reserved by MX; not carried by Open-MX.
        EtherNative = 34,
        /// Library control data (explicit acks).
        Truc = 35,
        /// Connection request or reply.
        Connect = 36,
        /// Message of at most 32 bytes, inline.
        Tiny = 37,
        /// Message of at most 128 bytes, inline.
        Small = 38,
        /// One fragment of a message of at most 32 KiB.
        Medium = 39,
        /// Rendezvous announcing a large message.
        Rndv = 40,
        /// Request for one block of a large message.
        Pull = 41,
        /// One frame of a pulled block.
        PullReply = 42,
        /// End of a large transfer.
        Notify = 43,
        /// Negative ack from the receiving library (TINY/SMALL/MEDIUM/RNDV/NOTIFY/CONNECT).
        NackLib = 44,
        /// Negative ack from the receiving NIC (PULL).
        NackMcp = 45,
    }
}

impl PacketType {
    /// The refusal reason used when a packet of another type is handed to a parser.
    pub(crate) const fn mismatch_reason(self) -> &'static str {
        match self {
            PacketType::None => "not a NONE packet",
            PacketType::Raw => "not a RAW packet",
            PacketType::MfmNicReply => "not an MFM_NIC_REPLY packet",
            PacketType::HostQuery => "not a HOST_QUERY packet",
            PacketType::HostReply => "not a HOST_REPLY packet",
            PacketType::EtherUnicast => "not an ETHER_UNICAST packet",
            PacketType::EtherMulticast => "not an ETHER_MULTICAST packet",
            PacketType::EtherNative => "not an ETHER_NATIVE packet",
            PacketType::Truc => "not a TRUC packet",
            PacketType::Connect => "not a CONNECT packet",
            PacketType::Tiny => "not a TINY packet",
            PacketType::Small => "not a SMALL packet",
            PacketType::Medium => "not a MEDIUM packet",
            PacketType::Rndv => "not a RNDV packet",
            PacketType::Pull => "not a PULL packet",
            PacketType::PullReply => "not a PULL_REPLY packet",
            PacketType::Notify => "not a NOTIFY packet",
            PacketType::NackLib => "not a NACK_LIB packet",
            PacketType::NackMcp => "not a NACK_MCP packet",
        }
    }
}

wire_enum! {
    /// Why a NACK was sent.
    NackType ("nack type") {
        /// No error.
        None = 0,
        /// No such endpoint.
        BadEndpoint = 1,
        /// The endpoint exists but is closed.
        EndpointClosed = 2,
        /// The session id does not match the endpoint's.
        BadSession = 3,
        /// The pulled RDMA window does not exist.
        BadRdmaWindow = 4,
    }
}

wire_enum! {
    /// Status carried by a CONNECT reply.
    ConnectStatus ("connect status") {
        /// The connection was accepted.
        Success = 0,
        /// The application key did not match (value fixed by MX).
        BadKey = 11,
    }
}

wire_enum! {
    /// The data kind carried by a TRUC packet.
    TrucDataType ("truc data type") {
        /// A library ack.
        LibAck = 0x55,
    }
}

/// How MX carries a message of a given length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageClass {
    /// At most [`TINY_MSG_LEN_MAX`] bytes, inside one TINY packet.
    Tiny,
    /// At most [`SMALL_MSG_LEN_MAX`] bytes, inside one SMALL packet.
    Small,
    /// At most [`MEDIUM_MSG_LEN_MAX`] bytes, in MEDIUM fragments.
    Medium,
    /// Anything longer: RNDV, then PULL / PULL_REPLY, then NOTIFY.
    Large,
}

impl MessageClass {
    /// The class of a message of `len` bytes held in memory ([`MessageClass::for_length`]).
    pub const fn of(len: usize) -> Self {
        Self::for_length(len as u64)
    }

    /// The class MX uses for a message of `len` bytes.
    pub const fn for_length(len: u64) -> Self {
        if len <= TINY_MSG_LEN_MAX as u64 {
            MessageClass::Tiny
        } else if len <= SMALL_MSG_LEN_MAX as u64 {
            MessageClass::Small
        } else if len <= MEDIUM_MSG_LEN_MAX as u64 {
            MessageClass::Medium
        } else {
            MessageClass::Large
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packet_type_values_match_mx() {
        let expected: [(PacketType, u8); 19] = [
            (PacketType::None, 0),
            (PacketType::Raw, 1),
            (PacketType::MfmNicReply, 2),
            (PacketType::HostQuery, 3),
            (PacketType::HostReply, 4),
            (PacketType::EtherUnicast, 32),
            (PacketType::EtherMulticast, 33),
            (PacketType::EtherNative, 34),
            (PacketType::Truc, 35),
            (PacketType::Connect, 36),
            (PacketType::Tiny, 37),
            (PacketType::Small, 38),
            (PacketType::Medium, 39),
            (PacketType::Rndv, 40),
            (PacketType::Pull, 41),
            (PacketType::PullReply, 42),
            (PacketType::Notify, 43),
            (PacketType::NackLib, 44),
            (PacketType::NackMcp, 45),
        ];
        assert_eq!(PacketType::ALL.len(), expected.len());
        for (ty, value) in expected {
            assert_eq!(u8::from(ty), value);
            assert_eq!(PacketType::try_from(value), Ok(ty));
        }
    }

    #[test]
    fn unknown_values_are_refused() {
        for value in 0..=255u8 {
            let known = PacketType::ALL.iter().any(|t| *t as u8 == value);
            match PacketType::try_from(value) {
                Ok(t) => assert!(known && t as u8 == value),
                Err(e) => {
                    assert!(!known);
                    assert_eq!(
                        e,
                        Error::Unknown {
                            what: "packet type",
                            value: u32::from(value)
                        }
                    );
                }
            }
        }
        assert_eq!(
            NackType::try_from(5),
            Err(Error::Unknown {
                what: "nack type",
                value: 5
            })
        );
        assert_eq!(
            ConnectStatus::try_from(1),
            Err(Error::Unknown {
                what: "connect status",
                value: 1
            })
        );
        assert_eq!(
            TrucDataType::try_from(0x54),
            Err(Error::Unknown {
                what: "truc data type",
                value: 0x54
            })
        );
    }

    #[test]
    fn nack_and_status_values_match_mx() {
        assert_eq!(NackType::None as u8, 0);
        assert_eq!(NackType::BadEndpoint as u8, 1);
        assert_eq!(NackType::EndpointClosed as u8, 2);
        assert_eq!(NackType::BadSession as u8, 3);
        assert_eq!(NackType::BadRdmaWindow as u8, 4);
        assert_eq!(ConnectStatus::Success as u8, 0);
        assert_eq!(ConnectStatus::BadKey as u8, 11);
        assert_eq!(TrucDataType::LibAck as u8, 0x55);
        for &n in NackType::ALL {
            assert_eq!(NackType::try_from(n as u8), Ok(n));
        }
    }

    #[test]
    fn message_class_thresholds() {
        assert_eq!(MessageClass::for_length(0), MessageClass::Tiny);
        assert_eq!(MessageClass::for_length(32), MessageClass::Tiny);
        assert_eq!(MessageClass::for_length(33), MessageClass::Small);
        assert_eq!(MessageClass::for_length(128), MessageClass::Small);
        assert_eq!(MessageClass::for_length(129), MessageClass::Medium);
        assert_eq!(MessageClass::for_length(32768), MessageClass::Medium);
        assert_eq!(MessageClass::for_length(32769), MessageClass::Large);
        assert_eq!(MessageClass::for_length(u64::MAX), MessageClass::Large);
    }
}

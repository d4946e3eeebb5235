//! Completion status codes (MX's `mx_status_code_t`) and the wire codes that map to them.

use core::fmt;

/// How a request ended; the numeric values are MX's `MX_STATUS_*` codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Status {
    /// `MX_STATUS_SUCCESS`
    Success = 0,
    /// `MX_STATUS_PENDING`
    Pending = 1,
    /// `MX_STATUS_BUFFERED`
    Buffered = 2,
    /// `MX_STATUS_REJECTED`
    Rejected = 3,
    /// `MX_STATUS_TIMEOUT`: the peer never acknowledged within the retry budget.
    Timeout = 4,
    /// `MX_STATUS_TRUNCATED`: the receive buffer was shorter than the message.
    Truncated = 5,
    /// `MX_STATUS_CANCELLED`
    Cancelled = 6,
    /// `MX_STATUS_ENDPOINT_UNKNOWN`
    EndpointUnknown = 7,
    /// `MX_STATUS_ENDPOINT_CLOSED`: the remote endpoint is not open (NACK).
    EndpointClosed = 8,
    /// `MX_STATUS_ENDPOINT_UNREACHABLE`: the partner was reset or dropped.
    EndpointUnreachable = 9,
    /// `MX_STATUS_BAD_SESSION`: the remote endpoint was reopened since we connected (NACK).
    BadSession = 10,
    /// `MX_STATUS_BAD_KEY`: the remote endpoint refused our application key.
    BadKey = 11,
    /// `MX_STATUS_BAD_ENDPOINT`: no such remote endpoint (NACK).
    BadEndpoint = 12,
    /// `MX_STATUS_BAD_RDMAWIN`
    BadRdmawin = 13,
    /// `MX_STATUS_ABORTED`
    Aborted = 14,
    /// `MX_STATUS_EVENTQ_FULL`
    EventqFull = 15,
    /// `MX_STATUS_NO_RESOURCES`
    NoResources = 16,
}

impl Status {
    /// The MX numeric code.
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// The status with MX code `code`, if there is one.
    pub const fn from_code(code: u32) -> Option<Status> {
        use Status::*;
        Some(match code {
            0 => Success,
            1 => Pending,
            2 => Buffered,
            3 => Rejected,
            4 => Timeout,
            5 => Truncated,
            6 => Cancelled,
            7 => EndpointUnknown,
            8 => EndpointClosed,
            9 => EndpointUnreachable,
            10 => BadSession,
            11 => BadKey,
            12 => BadEndpoint,
            13 => BadRdmawin,
            14 => Aborted,
            15 => EventqFull,
            16 => NoResources,
            _ => return None,
        })
    }

    /// Whether this is `Success`.
    pub const fn is_success(self) -> bool {
        matches!(self, Status::Success)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} ({})", self, self.code())
    }
}

/// Why a remote side refused a message (`NACK_LIB` types on the wire).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NackType {
    /// No endpoint with that index exists (wire 1).
    BadEndpoint,
    /// The endpoint exists but is closed (wire 2).
    EndpointClosed,
    /// The endpoint's session differs from the one in the frame (wire 3).
    BadSession,
    /// The RDMA window named by a pull does not exist (wire 4).
    BadRdmawin,
}

impl NackType {
    /// The wire value.
    pub const fn to_wire(self) -> u8 {
        match self {
            NackType::BadEndpoint => 1,
            NackType::EndpointClosed => 2,
            NackType::BadSession => 3,
            NackType::BadRdmawin => 4,
        }
    }

    /// Decodes a wire value; `None` for NONE (0) and unknown values.
    pub const fn from_wire(v: u8) -> Option<NackType> {
        match v {
            1 => Some(NackType::BadEndpoint),
            2 => Some(NackType::EndpointClosed),
            3 => Some(NackType::BadSession),
            4 => Some(NackType::BadRdmawin),
            _ => None,
        }
    }

    /// The status a request refused this way completes with.
    pub const fn status(self) -> Status {
        match self {
            NackType::BadEndpoint => Status::BadEndpoint,
            NackType::EndpointClosed => Status::EndpointClosed,
            NackType::BadSession => Status::BadSession,
            NackType::BadRdmawin => Status::BadRdmawin,
        }
    }
}

/// The status byte of a CONNECT reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConnectStatus {
    /// The key matched (wire 0).
    Success,
    /// The application key differs (wire 11, MX's `MX_STATUS_BAD_KEY`).
    BadKey,
}

impl ConnectStatus {
    /// The wire value.
    pub const fn to_wire(self) -> u8 {
        match self {
            ConnectStatus::Success => 0,
            ConnectStatus::BadKey => 11,
        }
    }

    /// Decodes a wire value; unknown values yield `None` and the reply is ignored.
    pub const fn from_wire(v: u8) -> Option<ConnectStatus> {
        match v {
            0 => Some(ConnectStatus::Success),
            11 => Some(ConnectStatus::BadKey),
            _ => None,
        }
    }

    /// The status the connect request completes with.
    pub const fn status(self) -> Status {
        match self {
            ConnectStatus::Success => Status::Success,
            ConnectStatus::BadKey => Status::BadKey,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_mx_values() {
        assert_eq!(Status::Success.code(), 0);
        assert_eq!(Status::Timeout.code(), 4);
        assert_eq!(Status::Truncated.code(), 5);
        assert_eq!(Status::BadSession.code(), 10);
        assert_eq!(Status::BadKey.code(), 11);
        assert_eq!(Status::NoResources.code(), 16);
        for code in 0..=16 {
            assert_eq!(Status::from_code(code).map(Status::code), Some(code));
        }
        assert_eq!(Status::from_code(17), None);
    }

    #[test]
    fn nack_types_round_trip_and_map() {
        for v in 0..=255u8 {
            match NackType::from_wire(v) {
                Some(t) => assert_eq!(t.to_wire(), v),
                None => assert!(v == 0 || v > 4),
            }
        }
        assert_eq!(
            NackType::from_wire(1).map(NackType::status),
            Some(Status::BadEndpoint)
        );
        assert_eq!(
            NackType::from_wire(2).map(NackType::status),
            Some(Status::EndpointClosed)
        );
        assert_eq!(
            NackType::from_wire(3).map(NackType::status),
            Some(Status::BadSession)
        );
    }

    #[test]
    fn connect_status_wire_values() {
        assert_eq!(ConnectStatus::BadKey.to_wire(), 11);
        assert_eq!(ConnectStatus::from_wire(0), Some(ConnectStatus::Success));
        assert_eq!(
            ConnectStatus::from_wire(11).map(ConnectStatus::status),
            Some(Status::BadKey)
        );
        assert_eq!(ConnectStatus::from_wire(3), None);
    }
}

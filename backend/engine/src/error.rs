//! Why the engine refuses something.

use xmx_wire::mxoe::Mac;

use super::GuestId;

/// A send request that no correct library would issue. The daemon disconnects the guest;
/// the engine has changed no state when it returns one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// The request names a guest the engine does not serve.
    #[error("unknown guest {0:?}")]
    UnknownGuest(GuestId),
    /// The request came from an endpoint that is not open.
    #[error("endpoint {0} is not open")]
    EndpointNotOpen(u8),
    /// A message longer than its class allows, or a MEDIUM whose fragments do not match
    /// its length.
    #[error("bad {class} length {length}")]
    BadLength {
        /// The message class (TINY, SMALL, MEDIUM).
        class: &'static str,
        /// The length asked for.
        length: u32,
    },
    /// A send-queue slot beyond the endpoint's send queue.
    #[error("send-queue slot {slot} beyond the queue ({slots} slots)")]
    BadSendQueueSlot {
        /// The slot named.
        slot: u16,
        /// Slots in the queue.
        slots: u16,
    },
    /// A receive-queue slot handed back that is beyond the queue or not in use.
    #[error("receive-queue slot {slot} is not in use")]
    BadRecvQueueSlot {
        /// The slot handed back.
        slot: u16,
    },
    /// A CONNECT reply status MX does not define.
    #[error("connect status {0} is not an MX status")]
    BadConnectStatus(u8),
    /// A region id not registered on the endpoint.
    #[error("region {0} is not registered")]
    BadRegion(u8),
    /// An offset and length that leave the region.
    #[error("offset {offset} + length {length} leave region {region} ({region_len} bytes)")]
    RegionRange {
        /// The region id.
        region: u8,
        /// Where the access starts in the region.
        offset: u64,
        /// Bytes accessed.
        length: u64,
        /// Bytes in the region.
        region_len: u64,
    },
}

/// Why a control-path operation (guests, endpoints, regions, peers) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// No such guest.
    #[error("unknown guest {0:?}")]
    UnknownGuest(GuestId),
    /// The guest id is already served.
    #[error("guest {0:?} already exists")]
    GuestExists(GuestId),
    /// The MAC is already a guest's, or is not a unicast address.
    #[error("MAC {0} is taken or not unicast")]
    BadMac(Mac),
    /// The hostname is empty or longer than HOST_REPLY carries.
    #[error("hostname must be 1 to 79 bytes without NUL")]
    BadHostname,
    /// The endpoint index is at or beyond the per-guest limit.
    #[error("endpoint {0} beyond the per-guest limit")]
    BadEndpoint(u8),
    /// The endpoint is already open.
    #[error("endpoint {0} already open")]
    EndpointBusy(u8),
    /// The endpoint is not open.
    #[error("endpoint {0} not open")]
    EndpointNotOpen(u8),
    /// The region id is already registered (register) or not registered (deregister).
    #[error("region {0} already registered or unknown")]
    BadRegion(u8),
    /// A region of zero bytes.
    #[error("empty region")]
    EmptyRegion,
    /// A per-guest limit was reached.
    #[error("per-guest quota reached: {0}")]
    Quota(&'static str),
}

/// Why a peer table was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerTableError {
    /// Two entries share an index.
    #[error("peer index {0} listed twice")]
    DuplicateIndex(u16),
    /// Two entries share a MAC.
    #[error("MAC {0} listed twice")]
    DuplicateMac(Mac),
    /// A broadcast or multicast MAC.
    #[error("MAC {0} is not unicast")]
    NotUnicast(Mac),
}

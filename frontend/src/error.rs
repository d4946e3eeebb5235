//! The error type of the guest side.

use xmx_wire::msg::{CtrlKind, CtrlStatus};
use xmx_wire::ring::RingError;

/// Why a frontend operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A hypervisor primitive failed (grant, event channel, xenstore).
    #[error("platform: {0}")]
    Platform(#[from] xmx_hv::Error),
    /// Bytes that do not form a valid message.
    #[error("message format: {0}")]
    Wire(#[from] xmx_wire::Error),
    /// A shared ring refused an operation or holds impossible indices.
    #[error("ring: {0}")]
    Ring(#[from] RingError),
    /// The backend answered a control request with an error status.
    #[error("the backend refused {op:?}: {status:?}")]
    Refused {
        /// The request the backend refused.
        op: CtrlKind,
        /// The status it answered with.
        status: CtrlStatus,
    },
    /// Something did not happen in time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The device is not connected to its backend (yet, or any more).
    #[error("not connected: {0}")]
    NotConnected(String),
    /// A caller's argument is out of range.
    #[error("invalid: {0}")]
    Invalid(String),
    /// A peer (backend, daemon or application) broke its protocol.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The other side went away.
    #[error("closed: {0}")]
    Closed(String),
    /// Every endpoint index or region id is taken (what ran out: the guest daemon's
    /// own words when it is the one that refused).
    #[error("no free {0}")]
    Exhausted(std::borrow::Cow<'static, str>),
    /// A system call failed (sockets, descriptors, waiting).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Result of the guest side.
pub type Result<T> = std::result::Result<T, Error>;

/// A grant refused because this domain is suspended ([`xmx_hv::Error::Busy`] from the
/// granter's side) is the device going away under a suspend or a migration: said as
/// `NotConnected`, so that the library waits for the reconnection to register the
/// region again rather than failing the receive that needed it ("Out of resources").
pub(crate) fn suspended_is_not_connected(e: xmx_hv::Error) -> Error {
    match e {
        xmx_hv::Error::Busy(why) => Error::NotConnected(format!("granting a region: {why}")),
        e => e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_suspended_granter_is_not_connected_and_other_failures_stay_what_they_are() {
        let busy = xmx_hv::Error::Busy("domain 3 is suspended".into());
        assert!(matches!(
            suspended_is_not_connected(busy),
            Error::NotConnected(m) if m.contains("domain 3 is suspended")
        ));
        let other = xmx_hv::Error::NotFound("grant 7".into());
        assert!(matches!(
            suspended_is_not_connected(other),
            Error::Platform(xmx_hv::Error::NotFound(_))
        ));
    }
}

//! The one error type of the platform layer, close to the errno values Xen reports.

/// Why a platform operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// ENOENT: no such node, port, grant or domain.
    #[error("not found: {0}")]
    NotFound(String),
    /// EACCES / EPERM: the caller's domain may not do this.
    #[error("permission denied: {0}")]
    Denied(String),
    /// EBUSY: still in use (a grant that is mapped, a port that is bound).
    #[error("busy: {0}")]
    Busy(String),
    /// EAGAIN: a transaction conflicted; retry it.
    #[error("conflict, try again")]
    Again,
    /// EEXIST.
    #[error("already exists: {0}")]
    Exists(String),
    /// EINVAL: a malformed argument.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// E2BIG / ENOSPC / EQUOTA: a size limit or per-domain quota was hit.
    #[error("quota exceeded: {0}")]
    Quota(String),
    /// ENOSYS: this platform cannot do that.
    #[error("not supported: {0}")]
    Unsupported(String),
    /// The other side of a connection went away.
    #[error("closed: {0}")]
    Closed(String),
    /// The peer spoke the protocol wrongly.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Any other errno name xenstored replied with.
    #[error("xenstore error {0}")]
    Xs(String),
    /// Any other I/O failure of a device, socket or file.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The result of a platform operation.
pub type Result<T> = std::result::Result<T, Error>;

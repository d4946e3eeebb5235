//! The error type of xmxd and its reply kinds.

use xmx_hv::daemon::control::ReplyError;

/// Why an xmxd operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A malformed name, argument or state file.
    #[error("invalid: {0}")]
    Invalid(String),
    /// No such cluster, guest or domain.
    #[error("not found: {0}")]
    NotFound(String),
    /// The cluster or device exists already.
    #[error("exists: {0}")]
    Exists(String),
    /// Refused while something depends on it (a cluster with members).
    #[error("busy: {0}")]
    Busy(String),
    /// The hypervisor platform (xenstore) failed.
    #[error("platform: {0}")]
    Platform(#[from] xmx_hv::Error),
    /// The backend's control socket refused or failed.
    #[error("backend: {0}")]
    Backend(ReplyError),
    /// A file or socket of xmxd itself.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Results of xmxd.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The `kind` of a control-socket reply (the same vocabulary as `xmx-backd`'s).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Error::Invalid(_) => "invalid",
            Error::NotFound(_) => "not_found",
            Error::Exists(_) => "exists",
            Error::Busy(_) => "busy",
            Error::Platform(xmx_hv::Error::Denied(_)) => "denied",
            Error::Platform(_) | Error::Backend(_) => "protocol",
            Error::Io(_) => "io",
        }
    }

    /// This error as a reply error.
    pub(crate) fn to_reply(&self) -> ReplyError {
        ReplyError::new(self.kind(), self.to_string())
    }
}

//! Why a NIC operation failed.

use std::io;
use std::time::Duration;

/// Errors of the NIC layer.
#[derive(Debug, thiserror::Error)]
pub enum NicError {
    /// The interface name cannot name a Linux interface.
    #[error("invalid interface name {name:?}: {reason}")]
    InvalidInterfaceName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// No interface of that name exists in the caller's network namespace.
    #[error("no network interface named {name:?}")]
    NoSuchInterface {
        /// The name given.
        name: String,
    },
    /// The interface MTU cannot carry the longest MXoE frame.
    #[error("interface {name} has MTU {mtu}, below the minimum of {min} that MXoE frames need")]
    MtuTooSmall {
        /// The interface.
        name: String,
        /// Its MTU.
        mtu: u32,
        /// The MTU MXoE needs.
        min: u32,
    },
    /// The interface does not carry Ethernet frames.
    #[error("interface {name} is not an Ethernet interface (hardware type {hw_type})")]
    NotEthernet {
        /// The interface.
        name: String,
        /// Its ARPHRD hardware type.
        hw_type: u16,
    },
    /// A configuration value is out of range.
    #[error("invalid NIC configuration: {0}")]
    InvalidConfig(&'static str),
    /// A frame shorter than an Ethernet header.
    #[error("frame of {len} bytes is shorter than an Ethernet header")]
    FrameTooShort {
        /// The frame's length.
        len: usize,
    },
    /// A frame longer than the interface carries.
    #[error("frame of {len} bytes is longer than the {max} bytes the interface carries")]
    FrameTooLong {
        /// The frame's length.
        len: usize,
        /// The longest frame the interface carries.
        max: usize,
    },
    /// The kernel freed no transmit slot in time (link down, NIC stuck).
    #[error("transmit ring stalled: no slot freed within {timeout:?}")]
    TxStalled {
        /// How long the ring was waited for.
        timeout: Duration,
    },
    /// A system call failed.
    #[error("{op}: {source}")]
    Sys {
        /// The call, with what it was for.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Entering a network namespace failed.
    #[error("network namespace {name}: {source}")]
    Netns {
        /// The namespace.
        name: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// An external command (iproute2) failed.
    #[error("`{command}` failed: {detail}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status and error output.
        detail: String,
    },
    /// A measurement did not complete: a frame went missing or came back wrong.
    #[error("measurement failed: {0}")]
    Measurement(String),
}

impl NicError {
    /// The error of system call `op` from `errno`.
    pub(crate) fn last_os(op: &'static str) -> Self {
        Self::Sys {
            op,
            source: io::Error::last_os_error(),
        }
    }
}

/// Result of the NIC layer.
pub type Result<T> = std::result::Result<T, NicError>;

//! xmx-wire: the byte formats xmx speaks, as pure data.
//!
//! - [`mxoe`]: MXoE frames (Open-MX in MX wire-compatible mode), one zero-copy
//!   view and one owned representation per packet type, in the style of smoltcp's
//!   `wire` module.
//! - [`ring`]: the split-driver shared-ring page, laid out as Xen's `io/ring.h`,
//!   with its producer/consumer halves.
//! - [`msg`]: the versioned xmx request/response messages that travel in the rings.
//! - [`xenbus`]: xenbus states and the xenstore key names of the `xmx` device.
//! - [`peer_view`]: the xenstore format of a guest's peer view (written by xmxd, read by
//!   libmyriexpress).
//!
//! No I/O happens here. Every parser takes untrusted bytes and returns a value or
//! an [`Error`]; none panics or reads past its buffer.
#![forbid(unsafe_op_in_unsafe_fn)]

pub mod direct;
pub mod msg;
pub mod mxoe;
pub mod peer_view;
pub mod ring;
pub mod xenbus;

/// Why a byte sequence was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The buffer ends before the structure it should hold.
    #[error("truncated: need {needed} bytes, have {have}")]
    Truncated {
        /// Bytes the structure needs.
        needed: usize,
        /// Bytes the buffer holds.
        have: usize,
    },
    /// A type or kind discriminant that this version does not know.
    #[error("unknown {what} {value:#x}")]
    Unknown {
        /// What the discriminant names (packet type, message kind...).
        what: &'static str,
        /// The discriminant as read.
        value: u32,
    },
    /// A field holds a value outside its legal range.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The field at fault.
        field: &'static str,
        /// What is wrong with its value.
        reason: &'static str,
    },
    /// The structure does not fit in the destination buffer.
    #[error("buffer too small: need {needed} bytes, have {have}")]
    BufferTooSmall {
        /// Bytes the structure needs.
        needed: usize,
        /// Bytes the destination holds.
        have: usize,
    },
}

/// The result of parsing or emitting a wire structure.
pub type Result<T> = core::result::Result<T, Error>;

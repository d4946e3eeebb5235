//! Xenstore over its wire protocol (Xen's docs/misc/xenstore.txt).
//!
//! - [`wire`]: the `xsd_sockmsg` codec, message types, errno names and permission
//!   strings, shared with the simulated xenstored of `xmx-simhv`.
//! - [`XsClient`]: a thread-safe client implementing [`crate::Xenstore`] over a unix
//!   socket (xenstored's or a simhv domain's) or the /dev/xen/xenbus device.

mod client;
pub mod wire;

pub use client::{XsClient, DEFAULT_SOCKET, PATH_ENV, XENBUS_DEVICE};

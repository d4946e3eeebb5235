//! libmyriexpress: the MX ABI (MX_API 0x301) for unmodified MX applications.
//!
//! `libmyriexpress.so` exports MX's C interface ([`ffi`]) with MX's types,
//! values and layouts ([`abi`], `include/myriexpress.h`) and MX's symbol
//! versions. Underneath, each endpoint drives the sans-IO protocol core
//! (`xmx-mx`) over a [`transport`]: the loopback between the endpoints of one
//! process, the MX engine (`xmx-engine`) on an AF_PACKET interface (`xmx-nic`)
//! in native mode, or a guest's shared rings to the dom0 backend under Xen.
//!
//! - [`runtime`]: `mx_init` to `mx_finalize`, open endpoints, the background
//!   progression thread.
//! - [`endpoint`]: one endpoint: requests, progression, blocking waits,
//!   unexpected handlers.
//! - [`segments`], [`addr`], [`doorbell`]: buffers, addresses, waiting.
//! - [`errors`], [`strings`], [`settings`], [`counters`]: error handlers,
//!   texts, environment knobs, statistics.

#[cfg(not(target_pointer_width = "64"))]
compile_error!("libmyriexpress encodes request handles in 64-bit pointers");

pub mod abi;
pub mod addr;
pub mod counters;
pub mod doorbell;
pub mod endpoint;
pub mod errors;
pub mod ffi;
pub mod raw;
pub mod runtime;
pub mod segments;
pub mod settings;
pub mod strings;
pub mod transport;

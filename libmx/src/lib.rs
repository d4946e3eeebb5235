//! libmyriexpress: the MX ABI (MX_API 0x301) for unmodified MX applications.
//!
//! The library's interface is its C ABI: `libmyriexpress.so` exports MX's C
//! functions (`ffi`) with MX's types, values and layouts ([`abi`],
//! `include/myriexpress.h`) and MX's symbol versions. The Rust modules are the
//! library's inside and are crate-private; the rlib exposes only
//! [`abi::constants`] and [`abi::layouts`], which the layout test compares
//! with what a C compiler sees. Underneath, each endpoint drives the sans-IO
//! protocol core (`xmx-mx`) over a `transport`: the loopback between the
//! endpoints of one process, the MX engine (`xmx-engine`) on an AF_PACKET
//! interface (`xmx-nic`) in native mode, or a guest's shared rings to the dom0
//! backend under Xen.
//!
//! The inside:
//! - `runtime`: `mx_init` to `mx_finalize`, open endpoints, the background
//!   progression thread.
//! - `endpoint`: one endpoint: requests, progression, blocking waits,
//!   unexpected handlers.
//! - `segments`, `addr`, `doorbell`: buffers, addresses, waiting.
//! - `errors`, `strings`, `settings`, `counters`: error handlers, texts,
//!   environment knobs, statistics.
//! - `raw`: raw endpoints (`mx_raw_*`), whole frames between the mapper
//!   tools of a fabric.

#[cfg(not(target_pointer_width = "64"))]
compile_error!("libmyriexpress encodes request handles in 64-bit pointers");

pub mod abi;
mod addr;
mod counters;
mod doorbell;
mod endpoint;
mod errors;
mod ffi;
mod raw;
mod runtime;
mod segments;
mod settings;
mod strings;
mod transport;

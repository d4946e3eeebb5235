//! xmx guest side: the xenbus frontend of device `xmx`, the endpoints and regions it
//! shares with the dom0 backend, and the application's access to them.
//!
//! # Who does what
//!
//! - The guest daemon (`xmx-frontd`) owns a [`Frontend`]: the xenbus handshake
//!   ([`xenbus`]), the control ring ([`ctrl`]), and every grant and event channel of the
//!   device. It opens endpoints and registers regions on behalf of applications and hands
//!   them over ([`handoff`]) as file descriptors (see `xmx_hv::handoff`). It is not on the
//!   data path.
//! - An application connects to the daemon ([`frontd::FrontdClient`]), gets an
//!   [`EndpointChannel`] and talks to the backend directly through the shared rings and
//!   queues: no system call of the daemon, no hypercall per message in steady state.
//! - LARGE messages go through registered regions ([`RegionWindow`]), which the
//!   registration cache ([`RegionCache`], `MX_RCACHE`) keeps registered across messages.
//!
//! # LARGE data is copied into granted windows
//!
//! Xen2MX grants the pages of the application's own buffer. A userspace frontend cannot:
//! `gntalloc` only grants pages it allocates itself, and the simulated platform grants
//! frames of the domain's memory file, never arbitrary process memory. So a region is a
//! *window* of pages granted by the daemon and mapped by the application, and LARGE data
//! is copied between the application's buffer and the window (one memcpy on each side of
//! the wire). What the registration cache saves is the expensive part, the grant and map
//! operations of registering; it keys windows by the application buffer they serve.
//!
//! # Suspend, resume and reconnection
//!
//! When the toolstack writes `control/shutdown = suspend` (or the owner calls
//! [`Frontend::suspend`]), the frontend closes its endpoints in the backend, goes
//! Closing, waits for the backend to let go and goes Closed. On resume (and whenever the
//! backend comes back after closing) it connects again and re-opens every endpoint over
//! new grants and a new port. The application sees its [`EndpointChannel::wait_event`]
//! return [`channel::Wake::Disconnected`], then a [`frontd::Notice::EndpointReopened`]
//! from the daemon; [`frontd::FrontdClient::remap`] swaps the mapping. The rings start
//! empty: requests in flight at the disconnection get no completion (the MX layer
//! retransmits), and regions must be registered again (drop them from the cache with
//! [`RegionCache::forget_endpoint`]).

pub mod channel;
pub mod ctrl;
pub mod device;
pub mod error;
pub mod frontd;
pub mod handoff;
pub mod own_grants;
pub mod rcache;
mod shared;
pub mod xenbus;

pub use channel::{ChannelStats, EndpointChannel, RegionWindow, Wake};
pub use ctrl::{CtrlClient, CtrlStats};
pub use device::{BackendInfo, Frontend, FrontendConfig, FrontendEvent, Mode};
pub use error::{Error, Result};
pub use handoff::{EndpointHandoff, RegionHandoff};
pub use rcache::{Lease, RcacheStats, RegionCache, Registrar};

//! Guest-side services: the `xmx-frontd` daemon ([`server`]), run by the binary of the
//! same name inside each guest.

pub mod server;

pub use server::{Server, ServerConfig};

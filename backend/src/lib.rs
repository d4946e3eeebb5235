//! xmx dom0 side: the backend daemon of device `xmx`: xenbus backend, ring service and admin
//! socket, driving the MX engine (`xmx-engine`) over one NIC (`xmx-nic`).
// The workspace warns of undocumented public items; this crate's fields and variants
// are not all documented yet.
#![allow(missing_docs)]

pub mod admin;
pub mod service;
pub mod xenbus;

//! xmx dom0 side: the backend daemon of device `xmx`: xenbus backend, ring service and admin
//! socket, driving the MX engine (`xmx-engine`) over one NIC (`xmx-nic`).

pub mod admin;
pub mod service;
pub mod xenbus;

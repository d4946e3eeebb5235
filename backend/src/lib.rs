//! xmx dom0 side: xenbus backend of device `xmx`, ring service, MX engine and NIC I/O.

pub mod engine;
pub mod nic;
pub mod admin;
pub mod service;
pub mod xenbus;

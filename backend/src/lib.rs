//! xmx dom0 side: xenbus backend of device `xmx`, ring service, MX engine and NIC I/O.

pub mod admin;
pub mod engine;
pub mod nic;
pub mod service;
pub mod xenbus;

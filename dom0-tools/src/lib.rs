//! The dom0 tools of xmx: the `xmx` CLI and the xmxd service.
pub mod bench;
pub mod cli;
pub mod demo;
pub mod interrupt;
pub mod sim;
pub mod xmxd;

//! The dom0 tools of xmx: the `xmx` CLI and the xmxd service.
pub mod sim;

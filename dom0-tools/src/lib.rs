//! The dom0 tools of xmx: the xmxd service and the administration subcommands of the `xmx`
//! CLI. The lab (simulated clusters, demo, bench) is the `xmx-lab` crate in `lab/`, whose
//! `xmx` binary is the one entry point over both.
pub mod cli;
pub mod simstate;
pub mod xmxd;

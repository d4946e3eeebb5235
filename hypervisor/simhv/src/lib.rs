//! xmx-simhv: one simulated Xen host's hypervisor services in one daemon.
pub mod xenstored;

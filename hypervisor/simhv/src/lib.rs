//! xmx-simhv: one simulated Xen host's hypervisor services in one daemon.
//!
//! - [`xenstored`]: a xenstored speaking Xen's wire protocol, one socket per domain.
//! - `hv`: grant tables (Xen v1 entries over per-domain memory files) and event channels
//!   (eventfd pairs brokered between domains), served on each domain's `hv.sock`.
//! - `domains`: create, destroy, suspend, resume; `admin`: the `ctl.sock` service.
//! - [`Daemon`]: starts all of it on a directory (layout in [`xmx_hv::sim`]), in-process
//!   for tests or as the `xmx-simhv` binary.

mod admin;
pub mod config;
mod daemon;
mod domains;
mod hv;
mod procs;
pub mod xenstored;

pub use config::SimhvConfig;
pub use daemon::{Daemon, DaemonHandle};
pub use domains::{DOM0_NAME, DOMID_FIRST_RESERVED, MAX_NAME_LEN};

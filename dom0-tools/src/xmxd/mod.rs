//! xmxd: the dom0 service that gives guests their xmx device and keeps the fabric's peer
//! table.
//!
//! # Lifecycle
//!
//! xmxd watches `@introduceDomain` and `@releaseDomain` (and each new domain's `name`
//! node, which the toolstack may write after introducing it). A domain is configured for
//! xmx when
//!
//! - it has a wish node `/local/domain/0/xmx/guests/<domid>` (written by the xl hook or
//!   `xmx attach`; its value names a cluster, or is empty), or
//! - its name is recorded in xmxd's state with auto-attach (`xmx cluster add [--new]`, an earlier
//!   wish), or
//! - another host announces a guest of that name (it is migrating here: see below).
//!
//! A wish node removed while its domain runs (`xmx detach`, `xmx-hook detach`) withdraws
//! the wish: the device goes and the name's auto-attach is cleared.
//!
//! Such a domain gets device 0 of type `xmx` through
//! [`toolstack::attach`](xmx_backend::xenbus::toolstack::attach), which writes both
//! xenstore halves as xl writes its own devices; the backend finds the device by its watch
//! on its backend directory and serves it. Identity is decided here and only here: the MAC
//! ([`names::guest_mac`], from the guest's name), the cluster and the MX hostname are keys
//! of the dom0-owned backend directory, which the guest may read but not write. When the
//! domain goes, xmxd removes the device (the backend has then unmapped everything the guest
//! shared, closed its endpoints and channels) and the wish node.
//!
//! `xl migrate`: the receiving host sees a domain `NAME--incoming` whose base name another
//! host announces; it takes that guest's cluster, MAC and peer index from the announcement
//! and attaches. The sending host detaches when its copy is destroyed. The guest keeps its
//! MX address (the MAC) and its peer index throughout.
//!
//! # Discovery: why MXoE RAW frames
//!
//! The hosts exchange their guest lists as MXoE RAW packets (type 1, the channel MX's
//! mapper uses to map a fabric), broadcast on the interface the backend serves; see
//! `announce` for the layout. The alternatives were weighed:
//!
//! - HOST_QUERY / HOST_REPLY through the engine map a *known* MAC to a hostname; the
//!   engine answers them only for peers already in the table. They cannot find guests no
//!   one knows yet, which is what discovery is for.
//! - A UDP protocol needs IP addresses on the MXoE interface (or a list of peers), which an
//!   MX fabric does not have to have; its reach is the IP subnet, not the Ethernet segment.
//!
//! RAW frames need no configuration and reach exactly the hosts that can exchange MXoE
//! traffic with us: those on the same Ethernet segment. They work the same between the
//! namespaces of `xmx sim` and on physical NICs. xmxd opens its own AF_PACKET socket with a
//! BPF filter (`fabric`), so discovery never touches the backend's rings, and the backend
//! ignores RAW frames (it counts broadcast ones as frames for no local guest).
//!
//! # The peer table
//!
//! One index space for the whole fabric, without a leader: each host claims indices for
//! its own guests, announces the claims, and every host computes the same table from the
//! same announcements ([`table`]: on a contested index the older claim wins). Indices are
//! recorded in the state, so they survive restarts of xmxd, and follow migrated guests. A
//! starting xmxd listens for one announcement interval before it claims new indices or
//! pushes a table, so it neither steals indices nor pushes a table without the fabric.
//! The table is pushed to the local backend with `set-peers`; the backend's engine filters
//! by cluster, so a guest reaches only its own cluster's peers. Each attached guest also
//! finds the peers it may reach, and only those, under `/local/domain/0/xmx/peers/<domid>`
//! in xenstore, which it alone may read.
//!
//! # Virtual clusters
//!
//! Clusters are named in dom0 (`xmx cluster create NAME`); a cluster's id is a hash of its
//! name ([`names::cluster_id`]), so hosts agree on ids without talking. Every guest is in
//! exactly one cluster, `default` unless put elsewhere. Clusters and members are kept in
//! the state file and mirrored under `/local/domain/0/xmx/clusters` ([`xsnodes`]).
//! Moving a running guest re-attaches its device with the new cluster (the backend reads a
//! device's identity when it connects, so the guest's frontend reconnects).

pub(crate) mod announce;
pub(crate) mod backend;
pub mod control;
pub(crate) mod direct;
pub mod discovery;
pub(crate) mod error;
pub(crate) mod fabric;
pub mod names;
pub(crate) mod service;
pub mod state;
pub mod table;
pub mod xsnodes;

pub use control::{ControlClient, XmxdRequest};
pub use error::{Error, Result};
pub use fabric::PacketFabric;
pub use service::{Core, Xmxd, XmxdConfig, XmxdStopper};

/// The control socket's default path: `$XMX_SIM_DIR/xmxd.sock` on the simulator,
/// `/run/xmx/xmxd.sock` on Xen.
pub fn default_control_socket() -> std::path::PathBuf {
    sim_or_run("xmxd.sock")
}

/// The backend's default control socket, as `xmx-backd` chooses it.
pub fn default_backend_socket() -> std::path::PathBuf {
    sim_or_run("backd.sock")
}

fn sim_or_run(file: &str) -> std::path::PathBuf {
    let sim = std::env::var("XMX_PLATFORM").map_or(true, |p| p == "sim" || p.is_empty());
    match std::env::var_os("XMX_SIM_DIR") {
        Some(dir) if sim => std::path::PathBuf::from(dir).join(file),
        _ => std::path::Path::new("/run/xmx").join(file),
    }
}

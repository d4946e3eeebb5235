//! A xenstored speaking Xen's wire protocol, one unix socket per domain.
//!
//! API used by the daemon (signatures are the contract; bodies to be written):
//!
//! ```ignore
//! pub struct Quotas { pub nodes: usize, pub watches: usize, pub transactions: usize,
//!                     pub value_size: usize, pub outstanding: usize }
//! impl Default for Quotas { ... }
//! pub struct Usage { pub nodes: usize, pub watches: usize, pub transactions: usize,
//!                    pub connections: usize }
//! impl Xenstored {
//!     pub fn new(quotas: Quotas) -> std::sync::Arc<Self>;
//!     /// Serve every connection accepted on `listener` as domain `domid`.
//!     pub fn serve(self: &Arc<Self>, domid: DomId, listener: UnixListener)
//!         -> std::io::Result<std::thread::JoinHandle<()>>;
//!     /// A domain came to life: /local/domain/<domid> exists, owned by it; fires @introduceDomain.
//!     pub fn introduce_domain(&self, domid: DomId);
//!     /// A domain died: its connections, watches and transactions are dropped, its nodes
//!     /// removed; fires @releaseDomain.
//!     pub fn release_domain(&self, domid: DomId);
//!     pub fn usage(&self, domid: DomId) -> Usage;
//!     /// Stop accepting and close every connection.
//!     pub fn shutdown(&self);
//! }
//! ```

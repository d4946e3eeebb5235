//! Platform `sim`: a domain attached to an `xmx-simhv` daemon.
//!
//! Directory layout of a simhv (`--dir DIR`):
//! - `DIR/ctl.sock`: the admin socket (create, destroy, suspend, resume, list, state dump).
//! - `DIR/dom<N>/xenstore.sock`: xenstore wire protocol, connections are domain N.
//! - `DIR/dom<N>/hv.sock`: grant-table and event-channel operations of domain N.
//! - `DIR/dom<N>/...`: shared-memory files of domain N (its pages, its grant table).

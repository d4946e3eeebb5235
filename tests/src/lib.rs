//! Cross-crate integration tests: the scenarios live under tests/tests/; the
//! helpers they share are here.
//!
//! The split-driver scenarios (`split_*.rs`) run on simulated clusters
//! ([`cluster`]) of real daemons in network namespaces, with C programs
//! ([`cprog`]) as the guests' applications ([`app`]), a tap on the hosts'
//! links ([`capture`]) and, where the kernel has no `netem`, an impairing
//! relay ([`relay`]).
// The workspace warns of undocumented public items; this crate's fields and variants
// are not all documented yet.
#![allow(missing_docs)]

pub mod app;
pub mod bins;
pub mod capture;
pub mod cluster;
pub mod cprog;
pub mod matrix;
pub mod relay;

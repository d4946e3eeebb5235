//! `xmx sim`: simulated clusters on one machine (network namespaces + xmx-simhv per host).
pub mod cluster;
pub mod migrate;
pub mod netns;
pub mod settle;
pub mod wait;

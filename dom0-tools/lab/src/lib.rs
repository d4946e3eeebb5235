//! The xmx lab: simulated clusters on one machine (`xmx sim`), the guided tour (`xmx demo`)
//! and the measurements of docs/performance.md (`xmx bench`, with plots). It drives the
//! production daemons (xmxd, xmx-backd, xmx-simhv) as processes and talks to them through
//! their control sockets; production code never depends on it.
pub mod bench;
pub mod demo;
pub mod interrupt;
pub mod sim;

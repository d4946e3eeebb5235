//! Choosing a platform at run time.
//!
//! `XMX_PLATFORM=linux` selects real Xen; `XMX_PLATFORM=sim` (the default) attaches to
//! the `xmx-simhv` whose directory is `XMX_SIM_DIR`, as domain `XMX_DOMID`.

use std::sync::Arc;

use crate::{DomId, EventChannels, GrantTable, Result, Xenstore};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlatformKind {
    Linux,
    Sim,
}

/// One domain's view of its hypervisor: the factory of the primitives.
pub trait Platform: Send + Sync {
    fn kind(&self) -> PlatformKind;
    /// The calling domain's id.
    fn domid(&self) -> DomId;
    /// The grant table (one per process is enough; it is shared).
    fn grant_table(&self) -> Result<Arc<dyn GrantTable>>;
    /// A new event-channel handle (like opening /dev/xen/evtchn).
    fn event_channels(&self) -> Result<Box<dyn EventChannels>>;
    /// A new xenstore connection.
    fn xenstore(&self) -> Result<Box<dyn Xenstore>>;
}

//! Limits of a simulated host, per domain.

use crate::xenstored::XenstoreQuotas;

/// Xen's default grant-table size: 64 frames of 512 v1 entries.
pub const DEFAULT_GNTTAB_ENTRIES: u32 = 32768;
/// Default memory limit of one domain.
pub const DEFAULT_MEM_LIMIT: u64 = 1 << 30;
/// Default event-channel ports of one domain (Xen's default `max_event_channels`).
pub const DEFAULT_MAX_PORTS: usize = 1023;
/// Default foreign pages one domain may map at once.
pub const DEFAULT_MAX_MAPPINGS: usize = 1 << 18;

/// Configuration of a daemon; every limit applies to each domain.
#[derive(Debug, Clone)]
pub struct SimhvConfig {
    /// Entries of each grant table.
    pub gnttab_entries: u32,
    /// Bytes of memory a domain may grant from.
    pub mem_limit: u64,
    /// Grant entries a domain may have in use (deferred ones included).
    pub max_grants: usize,
    /// Foreign grant pages a domain may have mapped at once.
    pub max_mappings: usize,
    /// Event-channel ports a domain may have open.
    pub max_ports: usize,
    /// xenstored's per-domain quotas.
    pub xenstore: XenstoreQuotas,
}

impl Default for SimhvConfig {
    fn default() -> Self {
        SimhvConfig {
            gnttab_entries: DEFAULT_GNTTAB_ENTRIES,
            mem_limit: DEFAULT_MEM_LIMIT,
            max_grants: DEFAULT_GNTTAB_ENTRIES as usize,
            max_mappings: DEFAULT_MAX_MAPPINGS,
            max_ports: DEFAULT_MAX_PORTS,
            xenstore: XenstoreQuotas::default(),
        }
    }
}

//! Choosing a platform at run time.
//!
//! `XMX_PLATFORM=linux` selects real Xen; `XMX_PLATFORM=sim` (the default) attaches to
//! the `xmx-simhv` whose directory is `XMX_SIM_DIR`, as domain `XMX_DOMID`.

use std::sync::Arc;

use crate::{DomId, Error, EventChannels, GrantTable, Result, Xenstore};

/// Which implementation a [`Platform`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlatformKind {
    /// Real Xen, through the Linux devices (see [`crate::linux`]).
    Linux,
    /// The `xmx-simhv` simulator (see [`crate::sim`]).
    Sim,
}

/// One domain's view of its hypervisor: the factory of the primitives.
pub trait Platform: Send + Sync {
    /// Which implementation this is.
    fn kind(&self) -> PlatformKind;
    /// The calling domain's id.
    fn domid(&self) -> DomId;
    /// The grant table (one per process is enough; it is shared).
    fn grant_table(&self) -> Result<Arc<dyn GrantTable>>;
    /// A new event-channel handle (like opening /dev/xen/evtchn).
    fn event_channels(&self) -> Result<Box<dyn EventChannels>>;
    /// A new xenstore connection.
    fn xenstore(&self) -> Result<Box<dyn Xenstore>>;
    /// Whether the domain was migrated to another host since the last call (each move is
    /// reported once). The simulator asks after losing the hypervisor (connections
    /// closed, operations refused) and then attaches to the domain's new host, its grant
    /// table following with its grants; real Xen says nothing, so a process asks when
    /// its watches fire (see [`Platform::handles_follow_move`]). Other handles must be
    /// opened anew either way.
    fn follow_move(&self) -> Result<bool> {
        Ok(false)
    }
    /// Whether the grants and event channels a domain made before a move still hold
    /// after it (the simulator carries them along; real Xen does not: pages are granted
    /// and ports bound anew, and the stale ones must not be touched, see
    /// [`crate::linux`]).
    fn handles_follow_move(&self) -> bool {
        true
    }
}

/// The platform the environment selects: `XMX_PLATFORM` = `sim` (the default) or `linux`.
///
/// For `sim`, `XMX_SIM_DIR` names the simhv directory and `XMX_DOMID` the domain to attach
/// as (both required). `linux` opens the real Xen devices of the running domain.
pub fn from_env() -> Result<Arc<dyn Platform>> {
    from_env_as(None)
}

/// As [`from_env`], with `domid` (a daemon's `--domid`) as the simulated domain when
/// `XMX_DOMID` is not set, so that a daemon need not write its own environment.
pub fn from_env_as(domid: Option<DomId>) -> Result<Arc<dyn Platform>> {
    let kind = std::env::var("XMX_PLATFORM").unwrap_or_else(|_| "sim".to_string());
    match kind.as_str() {
        "sim" | "" => {
            let dir = std::env::var_os("XMX_SIM_DIR").ok_or_else(|| {
                Error::Invalid("XMX_PLATFORM=sim needs XMX_SIM_DIR (the simhv directory)".into())
            })?;
            let domid: DomId = match (std::env::var("XMX_DOMID"), domid) {
                (Ok(text), _) => text
                    .trim()
                    .parse()
                    .map_err(|_| Error::Invalid(format!("XMX_DOMID={text:?} is not a domid")))?,
                (Err(_), Some(domid)) => domid,
                (Err(_), None) => {
                    return Err(Error::Invalid("XMX_PLATFORM=sim needs XMX_DOMID".into()))
                }
            };
            Ok(Arc::new(crate::sim::SimPlatform::attach(dir, domid)?))
        }
        "linux" => Ok(Arc::new(crate::linux::LinuxPlatform::open()?)),
        other => Err(Error::Invalid(format!(
            "XMX_PLATFORM={other:?} (expected sim or linux)"
        ))),
    }
}

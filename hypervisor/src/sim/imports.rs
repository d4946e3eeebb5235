//! The frames of its own domain's memory this process mapped from another process's
//! hand-off ([`crate::handoff`]): an application maps its endpoints and windows this
//! way, without a grant table of its own. When the domain moves to another host they are
//! mapped again, at the same addresses, from the destination's memory
//! ([`super::SimPlatform::follow_move`]), so every pointer into them stays valid.

use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex, Weak};

use super::mmap::Region;
use crate::Result;

/// Every live import: the mapping and the frames it shows, in page order.
static IMPORTS: Mutex<Vec<(Weak<Region>, Vec<u32>)>> = Mutex::new(Vec::new());

/// Keep track of `region`, a mapping of `frames` of this domain's memory.
pub(crate) fn register(region: Region, frames: Vec<u32>) -> Arc<Region> {
    let region = Arc::new(region);
    let mut all = IMPORTS.lock().unwrap_or_else(|p| p.into_inner());
    all.retain(|(r, _)| r.strong_count() > 0);
    all.push((Arc::downgrade(&region), frames));
    region
}

/// Map every live import again from `mem`, the domain's memory on its new host, at the
/// same addresses. Returns how many were remapped.
pub(crate) fn remap_all(mem: BorrowedFd<'_>) -> Result<usize> {
    let live: Vec<(Arc<Region>, Vec<u32>)> = {
        let mut all = IMPORTS.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|(r, _)| r.strong_count() > 0);
        all.iter()
            .filter_map(|(r, f)| Some((r.upgrade()?, f.clone())))
            .collect()
    };
    for (region, frames) in &live {
        region.remap_frames(mem, frames, true)?;
    }
    Ok(live.len())
}

//! Registering a region without the guest daemon, Xen2MX's way.
//!
//! Through the daemon a registration costs a hop to `xmx-frontd`, its grant calls, the
//! control ring and the way back, then the pages are handed over and mapped again. Here
//! the application grants the region's pages itself, in one grant call that also grants the
//! info pages listing them, and asks its endpoint's backend on the endpoint's own send ring
//! ([`SendOp::Register`](xmx_wire::msg::SendOp::Register)); the backend copies the info
//! pages out in one grant copy and maps the whole batch in one call.
//!
//! The info pages are granted writable with the data pages (one call, not two): they only
//! carry the application's own list of refs, which the backend copies before it reads.
//!
//! The grants of a deregistered window are kept in a [`GrantPool`] and serve the next
//! window that fits, as blkfront's persistent grants do: a grant call, fresh frames (the
//! kernel's allocation and zeroing on real Xen's gntalloc as on the simulator) and the
//! application's map and unmap of them were the cost of every registration without the
//! cache. The backend keeps its mapping of them as blkback keeps persistent grants, so a
//! window over pooled grants costs it neither a map nor an unmap (xmx-backend's
//! `service::kept`). What neither keeps is the registration: a DEREGISTER retires the id,
//! which the backend refuses afterwards. Pooled pages stay granted to the one backend
//! domain they were granted to (which saw their contents already) and are never handed to
//! another domain or process; dropping the pool ends their grants, and a page the backend
//! still maps is freed when it lets go (at the endpoint's close at the latest).
//!
//! A pooled window's new data is written only after its REGISTER completed: the send ring
//! is in order, so the backend has then handled the DEREGISTER of its previous use and
//! cannot serve a late pull of the old window from the new bytes.

use std::sync::Arc;

use xmx_hv::{DomId, GrantTable, GrantedPages, PAGE_SIZE};
use xmx_wire::msg::{info_pages_for, pack_info_pages, DirectRegister, REGION_PAGES_MAX};

use crate::channel::RegionWindow;
use crate::error::{Error, Result};
use crate::shared::granted_mem;

/// The grants behind one window: room for `capacity` data pages, then the info pages that
/// can list them all.
pub struct RegionGrants {
    pages: Arc<GrantedPages>,
    capacity: usize,
}

impl RegionGrants {
    /// Data pages the grants can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Pages granted, info pages included.
    pub fn granted(&self) -> usize {
        self.pages.refs().len()
    }

    /// Grant refs of the data pages, in order.
    pub fn data_refs(&self) -> &[u32] {
        &self.pages.refs()[..self.capacity]
    }
}

/// Grants of deregistered windows, kept for the next window that fits (see the module
/// documentation). Bounded by pages; the oldest go first.
pub struct GrantPool {
    idle: Vec<RegionGrants>,
    pages: usize,
    max_pages: usize,
    reused: u64,
}

impl GrantPool {
    /// A pool keeping at most `max_pages` granted pages (0: none, every window is granted
    /// afresh and its grants end with it).
    pub fn new(max_pages: usize) -> GrantPool {
        GrantPool {
            idle: Vec::new(),
            pages: 0,
            max_pages,
            reused: 0,
        }
    }

    /// Granted pages kept.
    pub fn idle_pages(&self) -> usize {
        self.pages
    }

    /// Windows served from the pool so far.
    pub fn reused(&self) -> u64 {
        self.reused
    }

    /// The smallest kept grants for `nr_pages` data pages that waste at most as much as
    /// they use.
    fn take(&mut self, nr_pages: usize) -> Option<RegionGrants> {
        let best = self
            .idle
            .iter()
            .enumerate()
            .filter(|(_, g)| g.capacity >= nr_pages && g.capacity <= nr_pages.saturating_mul(2))
            .min_by_key(|(_, g)| g.capacity)
            .map(|(i, _)| i)?;
        let g = self.idle.remove(best);
        self.pages -= g.granted();
        self.reused += 1;
        Some(g)
    }

    /// Keep the grants of a window whose DEREGISTER was posted. Kept only if nothing else
    /// holds their pages (a clone of the window's memory still alive could write into the
    /// next window); otherwise, or beyond the bound, their grants end.
    pub fn put(&mut self, grants: RegionGrants) {
        if Arc::strong_count(&grants.pages) != 1 || grants.granted() > self.max_pages {
            return;
        }
        self.pages += grants.granted();
        self.idle.push(grants);
        while self.pages > self.max_pages {
            let oldest = self.idle.remove(0);
            self.pages -= oldest.granted();
        }
    }

    /// End every kept grant.
    pub fn clear(&mut self) {
        self.idle.clear();
        self.pages = 0;
    }
}

/// A region of `length` bytes (and its info pages) granted to `backend`, as region
/// `region_id` of `endpoint`: over grants kept in `pool` if some fit (their pages hold
/// what the application last put there, not zeroes), else freshly granted zeroed pages.
/// Returns the application's window over it, the request that registers it, and the
/// grants, to give back to the pool once the region is deregistered.
pub fn grant_region(
    gnttab: &dyn GrantTable,
    pool: &mut GrantPool,
    backend: DomId,
    endpoint: u8,
    region_id: u8,
    length: u32,
) -> Result<(RegionWindow, DirectRegister, RegionGrants)> {
    let nr_pages = (length as usize).div_ceil(PAGE_SIZE);
    if length == 0 || nr_pages > REGION_PAGES_MAX {
        return Err(Error::Invalid(format!(
            "region of {length} bytes (1 to {REGION_PAGES_MAX} pages)"
        )));
    }
    let grants = match pool.take(nr_pages) {
        Some(g) => g,
        None => {
            let total = nr_pages + info_pages_for(nr_pages);
            let granted = match gnttab.grant_pages(backend, total, true) {
                Err(xmx_hv::Error::Quota(_)) if pool.idle_pages() > 0 => {
                    // The kept grants count against the domain's grants: give them up
                    // before failing.
                    tracing::debug!(kept = pool.idle_pages(), "grant quota: pool emptied");
                    pool.clear();
                    gnttab
                        .grant_pages(backend, total, true)
                        .map_err(crate::error::suspended_is_not_connected)?
                }
                other => other.map_err(crate::error::suspended_is_not_connected)?,
            };
            RegionGrants {
                pages: Arc::new(granted),
                capacity: nr_pages,
            }
        }
    };
    let nr_info = info_pages_for(nr_pages);
    let info_refs = grants.pages.refs()[grants.capacity..][..nr_info].to_vec();
    let listed: Vec<u8> = pack_info_pages(&grants.data_refs()[..nr_pages])
        .iter()
        .flat_map(|p| p.iter().copied())
        .collect();
    let info = granted_mem(
        &grants.pages,
        grants.capacity * PAGE_SIZE,
        nr_info * PAGE_SIZE,
    )?;
    if !info.write_bytes(0, &listed) {
        return Err(Error::Protocol("info pages shorter than their list".into()));
    }
    drop(info);
    let request = DirectRegister::new(region_id, length, &info_refs)
        .map_err(|e| Error::Invalid(format!("register request: {e}")))?;
    let mem = granted_mem(&grants.pages, 0, length as usize)?;
    Ok((
        RegionWindow::over(endpoint, region_id, length, mem),
        request,
        grants,
    ))
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversized_and_empty_regions_are_refused_before_granting() {
        struct NoGrants;
        impl GrantTable for NoGrants {
            fn grant_pages(
                &self,
                _: DomId,
                _: usize,
                _: bool,
            ) -> xmx_hv::Result<xmx_hv::GrantedPages> {
                panic!("granted");
            }
            fn map(&self, _: DomId, _: &[u32], _: bool) -> xmx_hv::Result<xmx_hv::MappedPages> {
                unreachable!()
            }
            fn copy(&self, _: &[xmx_hv::CopySegment]) -> xmx_hv::Result<Vec<xmx_hv::Result<()>>> {
                unreachable!()
            }
            fn table_size(&self) -> usize {
                0
            }
        }
        let mut pool = GrantPool::new(xmx_wire::msg::KEPT_WINDOW_PAGES);
        assert!(grant_region(&NoGrants, &mut pool, 0, 0, 0, 0).is_err());
        let too_big = ((REGION_PAGES_MAX + 1) * PAGE_SIZE) as u32;
        assert!(grant_region(&NoGrants, &mut pool, 0, 0, 0, too_big).is_err());
    }
}

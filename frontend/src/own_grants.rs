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
//! Dropping the window ends every grant; pages the backend still maps are freed when it
//! unmaps them (after the DEREGISTER the application posts first).

use std::sync::Arc;

use xmx_hv::{DomId, GrantTable, PAGE_SIZE};
use xmx_wire::msg::{info_pages_for, pack_info_pages, DirectRegister, REGION_PAGES_MAX};

use crate::channel::RegionWindow;
use crate::error::{Error, Result};
use crate::shared::granted_mem;

/// Grant a zeroed region of `length` bytes (and its info pages) to `backend`, as region
/// `region_id` of `endpoint`. Returns the application's window over it and the request
/// that registers it.
pub fn grant_region(
    gnttab: &dyn GrantTable,
    backend: DomId,
    endpoint: u8,
    region_id: u8,
    length: u32,
) -> Result<(RegionWindow, DirectRegister)> {
    let nr_pages = (length as usize).div_ceil(PAGE_SIZE);
    if length == 0 || nr_pages > REGION_PAGES_MAX {
        return Err(Error::Invalid(format!(
            "region of {length} bytes (1 to {REGION_PAGES_MAX} pages)"
        )));
    }
    let nr_info = info_pages_for(nr_pages);
    let pages = Arc::new(
        gnttab
            .grant_pages(backend, nr_pages + nr_info, true)
            .map_err(crate::error::suspended_is_not_connected)?,
    );
    let (data_refs, info_refs) = pages.refs().split_at(nr_pages);
    let info_refs = info_refs.to_vec();
    let listed: Vec<u8> = pack_info_pages(data_refs)
        .iter()
        .flat_map(|p| p.iter().copied())
        .collect();
    let info = granted_mem(&pages, nr_pages * PAGE_SIZE, nr_info * PAGE_SIZE)?;
    if !info.write_bytes(0, &listed) {
        return Err(Error::Protocol("info pages shorter than their list".into()));
    }
    let request = DirectRegister::new(region_id, length, &info_refs)
        .map_err(|e| Error::Invalid(format!("register request: {e}")))?;
    let mem = granted_mem(&pages, 0, length as usize)?;
    Ok((
        RegionWindow::over(endpoint, region_id, length, mem),
        request,
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
        assert!(grant_region(&NoGrants, 0, 0, 0, 0).is_err());
        let too_big = ((REGION_PAGES_MAX + 1) * PAGE_SIZE) as u32;
        assert!(grant_region(&NoGrants, 0, 0, 0, too_big).is_err());
    }
}

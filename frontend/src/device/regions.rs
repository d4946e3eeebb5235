//! Registered regions: pages granted to the backend for LARGE transfers, registered and
//! deregistered, registered again after a reconnect, and retired windows released.

use std::collections::BTreeMap;

use xmx_hv::{GrantedPages, PAGE_SIZE};
use xmx_wire::msg::{pack_info_pages, CtrlOp, CtrlStatus, RegionRegister, REGION_PAGES_MAX};

use super::{write_pages, EndpointShare, Frontend, Quarantined, RegionShare};
use crate::error::{suspended_is_not_connected, Error, Result};
use crate::handoff::RegionHandoff;
use crate::shared::end_grants;

impl Frontend {
    /// Register a region of `length` bytes on `endpoint`: grant its pages, list them in
    /// info pages, one REGION_REGISTER. The window starts zeroed.
    pub fn register_region(&mut self, endpoint: u8, length: u32) -> Result<RegionHandoff> {
        let nr_pages = (length as usize).div_ceil(PAGE_SIZE);
        if length == 0 || nr_pages > REGION_PAGES_MAX {
            return Err(Error::Invalid(format!(
                "region of {length} bytes (1 to {} pages)",
                REGION_PAGES_MAX
            )));
        }
        let max = self
            .info
            .as_ref()
            .ok_or_else(|| Error::NotConnected("device not connected".into()))?
            .max_regions
            .min(256);
        let share = self
            .endpoints
            .get(&endpoint)
            .filter(|e| e.open_in_backend)
            .ok_or_else(|| Error::Invalid(format!("endpoint {endpoint} is not open")))?;
        let region_id = (0..max)
            .map(|i| i as u8)
            .find(|i| !share.regions.contains_key(i))
            .ok_or(Error::Exhausted("region id".into()))?;
        let backend = self.backend_id;
        let pages = self
            .gnttab
            .grant_pages(backend, nr_pages, true)
            .map_err(suspended_is_not_connected)?;
        let packed = pack_info_pages(pages.refs());
        let mut info = match self.gnttab.grant_pages(backend, packed.len(), false) {
            Ok(i) => i,
            Err(e) => {
                end_grants(pages, "region");
                return Err(suspended_is_not_connected(e));
            }
        };
        let flat: Vec<u8> = packed.iter().flat_map(|p| p.iter().copied()).collect();
        write_pages(&mut info, &flat);
        let op = CtrlOp::RegionRegister(RegionRegister {
            endpoint,
            region_id,
            first_page_offset: 0,
            length,
            info_refs: info.refs().to_vec(),
        });
        let result = self.call(op);
        self.dispose(Quarantined::Pages(info));
        if let Err(e) = result {
            self.dispose(Quarantined::Pages(pages));
            self.fail_if_broken();
            return Err(e);
        }
        let exported = match pages.export() {
            Ok(x) => x,
            Err(e) => {
                let _ = self.call(CtrlOp::RegionDeregister {
                    endpoint,
                    region_id,
                });
                end_grants(pages, "region");
                return Err(e.into());
            }
        };
        tracing::debug!(endpoint, region_id, pages = nr_pages, "region registered");
        if let Some(share) = self.endpoints.get_mut(&endpoint) {
            share.regions.insert(
                region_id,
                RegionShare {
                    pages,
                    length,
                    backend_id: backend,
                },
            );
        }
        Ok(RegionHandoff {
            endpoint,
            region_id,
            length,
            pages: exported,
        })
    }

    /// Deregister a region and end its grants. Only call this once the application
    /// unmapped its window (or is gone).
    pub fn deregister_region(&mut self, endpoint: u8, region_id: u8) -> Result<()> {
        let region = self
            .endpoints
            .get_mut(&endpoint)
            .and_then(|e| e.regions.remove(&region_id))
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "region {region_id} of endpoint {endpoint} is not registered"
                ))
            })?;
        let mut result = Ok(());
        if self.is_connected() {
            match self.call(CtrlOp::RegionDeregister {
                endpoint,
                region_id,
            }) {
                Ok(_) => {}
                Err(Error::Refused {
                    status: CtrlStatus::BadRegion | CtrlStatus::EndpointNotOpen,
                    ..
                }) => {}
                Err(e) => result = Err(e),
            }
        }
        self.dispose(Quarantined::Pages(region.pages));
        self.fail_if_broken();
        result
    }

    /// Register `regions` of re-opened endpoint `index` again, under their ids and over
    /// the same grants, into `share`. True if every one is back; otherwise none is (the
    /// application then drops its windows and registers new ones).
    pub(super) fn register_again(
        &mut self,
        index: u8,
        regions: BTreeMap<u8, RegionShare>,
        share: &mut EndpointShare,
    ) -> bool {
        let mut failed = false;
        for (region_id, r) in regions {
            if failed || (r.backend_id != self.backend_id && !self.grants_lost) {
                failed = true;
                end_grants(r.pages, "region");
                continue;
            }
            // Granted before a move that did not carry the grants along (real Xen):
            // those refs name nothing now. The window goes on over new pages holding
            // what the old ones held, which the application adopts
            // (`EndpointHandoff::regions_moved`).
            let r = if self.grants_lost {
                match self.grant_again(r) {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(endpoint = index, region_id, error = %e, "granting a region again");
                        failed = true;
                        continue;
                    }
                }
            } else {
                r
            };
            match self.register_pages(index, region_id, r.length, &r.pages) {
                Ok(()) => {
                    share.regions.insert(region_id, r);
                }
                Err(e) => {
                    tracing::warn!(endpoint = index, region_id, error = %e, "registering a region again");
                    failed = true;
                    self.dispose(Quarantined::Pages(r.pages));
                }
            }
        }
        if failed {
            for (region_id, r) in std::mem::take(&mut share.regions) {
                let _ = self.call(CtrlOp::RegionDeregister {
                    endpoint: index,
                    region_id,
                });
                self.dispose(Quarantined::Pages(r.pages));
            }
            return false;
        }
        if !share.regions.is_empty() {
            tracing::info!(
                endpoint = index,
                regions = share.regions.len(),
                "regions registered again"
            );
        }
        true
    }

    /// New pages for a region whose grants were lost, holding what its pages hold now;
    /// the old pages are let go (the application still maps them until it adopts the
    /// new ones).
    fn grant_again(&mut self, r: RegionShare) -> Result<RegionShare> {
        let count = r.pages.len() / PAGE_SIZE;
        let pages = match self.gnttab.grant_pages(self.backend_id, count, true) {
            Ok(p) => p,
            Err(e) => {
                end_grants(r.pages, "region");
                return Err(e.into());
            }
        };
        let n = r.pages.len().min(pages.len());
        // SAFETY: both are mappings of this process, each at least `n` bytes long; the
        // new pages were just granted and nobody else knows their refs yet. The old ones
        // may be written by the application meanwhile: a torn copy is repaired by its own
        // copy when it adopts the new pages, before it posts anything naming them.
        unsafe { std::ptr::copy_nonoverlapping(r.pages.as_ptr(), pages.as_ptr(), n) };
        end_grants(r.pages, "region granted before the move");
        Ok(RegionShare {
            pages,
            length: r.length,
            backend_id: self.backend_id,
        })
    }

    /// The pages of region `region_id` of `endpoint` as they are now, for the
    /// application to map (after a move that granted them anew).
    pub fn export_region(&self, endpoint: u8, region_id: u8) -> Result<RegionHandoff> {
        let r = self
            .endpoints
            .get(&endpoint)
            .and_then(|e| e.regions.get(&region_id))
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "region {region_id} of endpoint {endpoint} is not registered"
                ))
            })?;
        Ok(RegionHandoff {
            endpoint,
            region_id,
            length: r.length,
            pages: r.pages.export()?,
        })
    }

    /// One REGION_REGISTER of `pages` (granted already) as `region_id` of `endpoint`.
    pub(super) fn register_pages(
        &mut self,
        endpoint: u8,
        region_id: u8,
        length: u32,
        pages: &GrantedPages,
    ) -> Result<()> {
        let packed = pack_info_pages(pages.refs());
        let mut info = self
            .gnttab
            .grant_pages(self.backend_id, packed.len(), false)?;
        let flat: Vec<u8> = packed.iter().flat_map(|p| p.iter().copied()).collect();
        write_pages(&mut info, &flat);
        let result = self.call(CtrlOp::RegionRegister(RegionRegister {
            endpoint,
            region_id,
            first_page_offset: 0,
            length,
            info_refs: info.refs().to_vec(),
        }));
        self.dispose(Quarantined::Pages(info));
        result.map(drop)
    }

    /// Release the shares of `endpoint` older than `generation` (its application
    /// remapped, or is gone).
    pub fn release_retired(&mut self, endpoint: u8, generation: u32) {
        let mut keep = Vec::new();
        for (i, g, share) in self.retired.drain(..) {
            if i == endpoint && g < generation {
                share.release("retired endpoint");
            } else {
                keep.push((i, g, share));
            }
        }
        self.retired = keep;
    }

    /// Release every retired share of `endpoint`.
    pub fn release_all_retired(&mut self, endpoint: u8) {
        self.release_retired(endpoint, u32::MAX);
    }

    /// Shares kept for applications that have not remapped yet.
    pub fn retired_count(&self) -> usize {
        self.retired.len()
    }
}

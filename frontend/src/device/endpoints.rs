//! Endpoints: opened and shared with the backend (their rings and event channels), handed
//! to the applications, closed, and re-opened in their sessions after a reconnect.

use std::collections::BTreeMap;
use std::sync::Arc;

use xmx_hv::{DomId, PAGE_SIZE, XBT_NULL};
use xmx_wire::direct;
use xmx_wire::msg::{pack_info_page, CtrlOp, CtrlReply, CtrlStatus, EndpointOpen, EndpointPages};
use xmx_wire::ring::init_shared;

use super::{write_pages, EndpointShare, Frontend, FrontendEvent, Quarantined};
use crate::error::{Error, Result};
use crate::handoff::{check_geometry, EndpointHandoff};
use crate::shared::{end_grants, granted_mem, OwnedPort};

impl Frontend {
    /// Open endpoint `endpoint` (the lowest free index if None) with `geometry` (the
    /// configured one if None) and return what its application needs. Every event of
    /// its ring is notified as `io/ring.h` has it; see [`Frontend::open_endpoint_with`].
    pub fn open_endpoint(
        &mut self,
        endpoint: Option<u8>,
        geometry: Option<EndpointPages>,
    ) -> Result<EndpointHandoff> {
        self.open_endpoint_with(endpoint, geometry, false)
    }

    /// As [`Frontend::open_endpoint`], for an application that waits for no send's
    /// completion but a MEDIUM's if `quiet_send_done` ([`EndpointOpen::quiet_send_done`]):
    /// the backend then leaves the others unnotified. Kept across re-opens.
    pub fn open_endpoint_with(
        &mut self,
        endpoint: Option<u8>,
        geometry: Option<EndpointPages>,
        quiet_send_done: bool,
    ) -> Result<EndpointHandoff> {
        let geometry = geometry.unwrap_or(self.cfg.endpoint_pages);
        check_geometry(&geometry)?;
        let max = self
            .info
            .as_ref()
            .ok_or_else(|| Error::NotConnected("device not connected".into()))?
            .max_endpoints
            .min(256);
        let index = match endpoint {
            Some(i) if u32::from(i) >= max => {
                return Err(Error::Invalid(format!(
                    "endpoint {i} (the backend allows {max})"
                )))
            }
            Some(i) if self.endpoints.contains_key(&i) => {
                return Err(Error::Refused {
                    op: xmx_wire::msg::CtrlKind::EndpointOpen,
                    status: CtrlStatus::EndpointBusy,
                })
            }
            Some(i) => i,
            None => (0..max)
                .map(|i| i as u8)
                .find(|i| !self.endpoints.contains_key(i))
                .ok_or(Error::Exhausted("endpoint".into()))?,
        };
        let share = self.share_endpoint(index, geometry, 0, 0, quiet_send_done)?;
        self.endpoints.insert(index, share);
        match self.export_endpoint(index) {
            Ok(h) => Ok(h),
            Err(e) => {
                let _ = self.close_endpoint(index);
                Err(e)
            }
        }
    }

    /// Grant an endpoint's pages and port and have the backend open it.
    pub(super) fn share_endpoint(
        &mut self,
        index: u8,
        geometry: EndpointPages,
        generation: u32,
        resume_session: u32,
        quiet_send_done: bool,
    ) -> Result<EndpointShare> {
        let backend = self.backend_id;
        let pages = Arc::new(self.gnttab.grant_pages(backend, geometry.total(), true)?);
        // Both ring headers are initialised here, before the backend or the application
        // takes its half: the backend attaches to the event ring as it finds it.
        for range in [geometry.send_ring_refs(), geometry.event_ring_refs()] {
            let mem = granted_mem(&pages, range.start * PAGE_SIZE, range.len() * PAGE_SIZE)?;
            init_shared(&mem, 0)?;
        }
        let port = OwnedPort::alloc_unbound(self.platform.event_channels()?, backend)?;
        let mut info = self.gnttab.grant_pages(backend, 1, false)?;
        let mut page = vec![0u8; PAGE_SIZE];
        pack_info_page(pages.refs(), &mut page)?;
        write_pages(&mut info, &page);
        let op = CtrlOp::EndpointOpen(EndpointOpen {
            endpoint: index,
            event_channel: port.port(),
            info_ref: info.refs()[0],
            pages: geometry,
            resume_session,
            quiet_send_done,
        });
        let result = self.call(op);
        // The backend copied the info page out and unmapped it before answering.
        self.dispose(Quarantined::Pages(info));
        let share = EndpointShare {
            geometry,
            pages,
            port,
            session_id: 0,
            generation,
            open_in_backend: false,
            quiet_send_done,
            regions: BTreeMap::new(),
        };
        match result {
            Ok(CtrlReply::EndpointOpen { session_id, .. }) => {
                tracing::info!(
                    endpoint = index,
                    session_id,
                    pages = geometry.total(),
                    "endpoint open"
                );
                Ok(EndpointShare {
                    session_id,
                    open_in_backend: true,
                    ..share
                })
            }
            Ok(other) => {
                share.release("endpoint");
                Err(Error::Protocol(format!("open answered with {other:?}")))
            }
            Err(e) => {
                self.dispose(Quarantined::Endpoint(share));
                self.fail_if_broken();
                Err(e)
            }
        }
    }

    pub(super) fn export_endpoint(&self, index: u8) -> Result<EndpointHandoff> {
        let share = self
            .endpoints
            .get(&index)
            .ok_or_else(|| Error::Invalid(format!("endpoint {index} is not open")))?;
        Ok(EndpointHandoff {
            endpoint: index,
            session_id: share.session_id,
            geometry: share.geometry,
            generation: share.generation,
            regions_kept: false,
            regions_moved: false,
            pages: share.pages.export()?,
            port: share.port.handle().export_port(share.port.port())?,
        })
    }

    /// Close endpoint `endpoint`: the backend's side first, then its regions' and its
    /// own grants and its port. Only call this once its application unmapped the pages
    /// (or is gone).
    pub fn close_endpoint(&mut self, endpoint: u8) -> Result<()> {
        let share = self
            .endpoints
            .remove(&endpoint)
            .ok_or_else(|| Error::Invalid(format!("endpoint {endpoint} is not open")))?;
        let mut result = Ok(());
        if share.open_in_backend && self.is_connected() {
            match self.call(CtrlOp::EndpointClose { endpoint }) {
                Ok(_) => {}
                Err(Error::Refused {
                    status: CtrlStatus::EndpointNotOpen,
                    ..
                }) => {}
                Err(e) => result = Err(e),
            }
        }
        self.dispose(Quarantined::Endpoint(share));
        self.fail_if_broken();
        tracing::info!(endpoint, "endpoint closed");
        result
    }

    /// The application holding `endpoint` died with it open: the direct channels its
    /// library made or accepted for that endpoint end as the library would have ended
    /// them on a close (the creator's directory removed, the acceptor's state `closed`;
    /// see [`xmx_wire::direct`]), so that peers fall back to the backend at once and learn
    /// there that the endpoint is closed, instead of writing into a ring nobody reads.
    /// Only this guest's side of each pair is touched; `toolstack` is the domain whose
    /// xmxd brokers the channels.
    pub fn end_direct_channels(&self, toolstack: DomId, endpoint: u8) {
        let me = self.domid;
        let offers = direct::offers_dir(toolstack, me);
        // No offers, no channels (a revoked pair's directory is gone already).
        let Ok(peers) = self.xs.directory(XBT_NULL, &offers) else {
            return;
        };
        for peer in peers.iter().filter_map(|p| p.parse::<DomId>().ok()) {
            let pair = direct::pair_dir(toolstack, me, peer);
            let Ok(names) = self.xs.directory(XBT_NULL, &pair) else {
                continue;
            };
            for name in names {
                let Some((creator_ep, acceptor_ep)) = direct::parse_channel_name(&name) else {
                    continue;
                };
                let dir = format!("{pair}/{name}");
                let state = format!("{dir}/state");
                let ended = if me < peer && creator_ep == endpoint {
                    self.xs.rm(XBT_NULL, &dir)
                } else if me > peer && acceptor_ep == endpoint {
                    // Written only where the nodes still are.
                    self.xs
                        .read(XBT_NULL, &state)
                        .and_then(|_| self.xs.write(XBT_NULL, &state, b"closed"))
                } else {
                    continue;
                };
                match ended {
                    Ok(()) => {
                        tracing::info!(endpoint, dir, "direct channel of a dead application ended")
                    }
                    Err(e) => {
                        tracing::debug!(endpoint, dir, error = %e, "direct channel already gone")
                    }
                }
            }
        }
    }

    /// After a reconnection: open every endpoint again over new grants.
    pub(super) fn reopen_endpoints(&mut self) {
        let lost: Vec<u8> = self
            .endpoints
            .iter()
            .filter(|(_, e)| !e.open_in_backend)
            .map(|(i, _)| *i)
            .collect();
        for index in lost {
            let Some(mut old) = self.endpoints.remove(&index) else {
                continue;
            };
            let generation = old.generation.wrapping_add(1);
            let regions = std::mem::take(&mut old.regions);
            let moved = self.grants_lost && !regions.is_empty();
            match self.share_endpoint(
                index,
                old.geometry,
                generation,
                old.session_id,
                old.quiet_send_done,
            ) {
                Ok(mut new) => {
                    let kept = self.register_again(index, regions, &mut new);
                    self.endpoints.insert(index, new);
                    match self.export_endpoint(index) {
                        Ok(mut h) => {
                            h.regions_kept = kept;
                            h.regions_moved = kept && moved;
                            self.reopened.push(h);
                            self.events
                                .push_back(FrontendEvent::EndpointReopened { endpoint: index });
                        }
                        Err(e) => self.events.push_back(FrontendEvent::EndpointLost {
                            endpoint: index,
                            reason: e.to_string(),
                        }),
                    }
                }
                Err(e) => {
                    for (_, r) in regions {
                        end_grants(r.pages, "region");
                    }
                    tracing::warn!(endpoint = index, error = %e, "re-opening an endpoint");
                    self.events.push_back(FrontendEvent::EndpointLost {
                        endpoint: index,
                        reason: e.to_string(),
                    });
                }
            }
            // The application still maps the old pages until it remaps.
            self.retired.push((index, old.generation, old));
        }
        self.grants_lost = false;
    }
}

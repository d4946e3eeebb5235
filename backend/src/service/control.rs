//! Serving the control ring: opening and closing endpoints, registering and deregistering
//! regions.
//!
//! Grant references arrive in info pages. An info page is mapped read-only, copied out whole
//! and unmapped before any reference in it is looked at; the pages it lists are then mapped in
//! one batch call. Every request is checked against the guest's quotas before anything is
//! mapped, and whatever a failing request mapped or bound is released before it is answered.

use std::collections::hash_map::RandomState;
use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::Arc;

use xmx_hv::{CopyPtr, CopySegment, EventChannels, GrantTable, MappedPages, PAGE_SIZE};
use xmx_wire::msg::{
    fill_marks, unpack_info_page, unpack_info_pages, CtrlOp, CtrlRequest, CtrlResponse, CtrlStatus,
    EndpointOpen, EventFront, RegionRegister, SendBack, INFO_PAGE_SIZE,
};
use xmx_wire::ring::SharedMem;

use super::guest::{Connection, EndpointConn, EndpointCounters, RegionConn};
use super::kept::KeptMapping;
use super::quota::{GuestQuotas, GuestUsage};
use xmx_engine::{EndpointConfig, Engine, EngineError, MemoryArea, RegionHandle};

/// Session ids for new endpoints: unpredictable, never 0.
pub(crate) struct SessionIds {
    state: RandomState,
    counter: u64,
}

impl SessionIds {
    pub fn new() -> Self {
        SessionIds {
            state: RandomState::new(),
            counter: 0,
        }
    }

    pub fn next(&mut self) -> u32 {
        loop {
            self.counter = self.counter.wrapping_add(1);
            let id = self.state.hash_one(self.counter) as u32;
            if id != 0 {
                return id;
            }
        }
    }
}

/// What serving a control request needs besides the connection.
pub(crate) struct ControlCtx<'a> {
    pub engine: &'a mut Engine,
    pub gnttab: &'a dyn GrantTable,
    pub evtchn: &'a dyn EventChannels,
    pub quotas: &'a GuestQuotas,
    pub sessions: &'a mut SessionIds,
    pub next_region: &'a mut u64,
}

/// Serve one control request and build its response.
pub(crate) fn serve(
    ctx: &mut ControlCtx<'_>,
    conn: &mut Connection,
    req: &CtrlRequest,
) -> CtrlResponse {
    let mut session_id = 0;
    let result = match &req.op {
        CtrlOp::EndpointOpen(open) => open_endpoint(ctx, conn, open).map(|s| session_id = s),
        CtrlOp::EndpointClose { endpoint } => close_endpoint(ctx, conn, *endpoint),
        CtrlOp::RegionRegister(reg) => register_region(ctx, conn, reg, RegionMapping::Once),
        CtrlOp::RegionDeregister {
            endpoint,
            region_id,
        } => deregister_region(ctx, conn, *endpoint, *region_id),
    };
    let status = match result {
        Ok(()) => CtrlStatus::Ok,
        Err(status) => {
            tracing::debug!(domu = conn.domu, ?status, op = ?req.op.kind(), "control request refused");
            status
        }
    };
    let mut rsp = CtrlResponse::answering(req, status);
    if let xmx_wire::msg::CtrlReply::EndpointOpen {
        session_id: ref mut s,
        ..
    } = rsp.reply
    {
        *s = session_id;
    }
    rsp
}

fn grant_status(e: &xmx_hv::Error) -> CtrlStatus {
    match e {
        xmx_hv::Error::Quota(_) => CtrlStatus::Quota,
        _ => CtrlStatus::BadGrant,
    }
}

fn engine_status(e: &EngineError) -> CtrlStatus {
    match e {
        EngineError::BadEndpoint(_) => CtrlStatus::BadEndpoint,
        EngineError::EndpointBusy(_) => CtrlStatus::EndpointBusy,
        EngineError::EndpointNotOpen(_) => CtrlStatus::EndpointNotOpen,
        EngineError::BadRegion(_) => CtrlStatus::BadRegion,
        EngineError::Quota(_) => CtrlStatus::Quota,
        EngineError::EmptyRegion
        | EngineError::UnknownGuest(_)
        | EngineError::GuestExists(_)
        | EngineError::BadMac(_)
        | EngineError::BadHostname => CtrlStatus::Malformed,
    }
}

/// Copy the info pages `refs` into private memory.
fn read_info_pages(
    ctx: &ControlCtx<'_>,
    conn: &Connection,
    refs: &[u32],
) -> Result<Vec<[u8; INFO_PAGE_SIZE]>, CtrlStatus> {
    // One grant copy of every info page into private memory: a single hypervisor call
    // (mapping, copying and unmapping took two), and the guest can change nothing we read
    // after the copy.
    let mut pages = vec![[0u8; INFO_PAGE_SIZE]; refs.len()];
    let segments: Vec<CopySegment> = refs
        .iter()
        .zip(pages.iter_mut())
        .map(|(&gref, page)| CopySegment {
            source: CopyPtr::Foreign {
                domid: conn.domu,
                gref,
                offset: 0,
            },
            dest: CopyPtr::Local(page.as_mut_ptr()),
            len: INFO_PAGE_SIZE as u16,
        })
        .collect();
    let results = ctx.gnttab.copy(&segments).map_err(|e| grant_status(&e))?;
    if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
        return Err(grant_status(e));
    }
    Ok(pages)
}

/// The info pages `refs` of a window the application granted itself, read from a mapping
/// of them kept since the first window over these grants (the library's pool lists each
/// next window in the same info pages): later registrations read them with no hypervisor
/// call. Copied into private memory as [`read_info_pages`] does, so the guest changes
/// nothing read; a kept mapping whose refs begin with `refs` maps exactly those grants,
/// whatever it was kept for. Without room in the guest's quota, a grant copy reads them.
fn read_kept_info_pages(
    ctx: &ControlCtx<'_>,
    conn: &mut Connection,
    endpoint: u8,
    refs: &[u32],
) -> Result<Vec<[u8; INFO_PAGE_SIZE]>, CtrlStatus> {
    let kept = match conn.kept.take(endpoint, refs) {
        Ok(kept) => kept,
        Err(unmapped) => {
            conn.usage.unmapped(unmapped);
            if !conn.usage.may_map(ctx.quotas, refs.len()) {
                return read_info_pages(ctx, conn, refs);
            }
            let mapping = Arc::new(
                ctx.gnttab
                    .map(conn.domu, refs, true)
                    .map_err(|e| grant_status(&e))?,
            );
            conn.usage.mapped_pages += refs.len();
            KeptMapping::new(endpoint, refs.to_vec(), mapping)
        }
    };
    let mut pages = vec![[0u8; INFO_PAGE_SIZE]; refs.len()];
    let read = window(kept.mapping(), 0, refs.len() * INFO_PAGE_SIZE).map(|mem| {
        pages
            .iter_mut()
            .enumerate()
            .all(|(i, page)| mem.read_bytes(i * INFO_PAGE_SIZE, page))
    });
    // The view is gone: the mapping has no other holder and can be kept.
    let unmapped = conn.kept.put(kept);
    conn.usage.unmapped(unmapped);
    match read {
        Ok(true) => Ok(pages),
        Ok(false) | Err(_) => Err(CtrlStatus::Malformed),
    }
}

/// `len` bytes at `offset` of a mapping, as ring memory that keeps the mapping alive.
fn window(mapping: &Arc<MappedPages>, offset: usize, len: usize) -> Result<SharedMem, CtrlStatus> {
    let fits = offset
        .checked_add(len)
        .is_some_and(|end| end <= mapping.len());
    if !fits || !mapping.writable() {
        return Err(CtrlStatus::Malformed);
    }
    let owner: Arc<dyn Send + Sync> = mapping.clone();
    // SAFETY: offset..offset+len lies inside the writable mapping (checked above), which
    // `owner` keeps mapped for as long as the returned memory or a clone of it lives; this
    // process touches the memory only through SharedMem (atomic accesses).
    unsafe { SharedMem::from_raw_with_owner(mapping.as_ptr().add(offset), len, owner) }
        .map_err(|_| CtrlStatus::Malformed)
}

fn open_endpoint(
    ctx: &mut ControlCtx<'_>,
    conn: &mut Connection,
    open: &EndpointOpen,
) -> Result<u32, CtrlStatus> {
    let ep = open.endpoint;
    if conn.endpoints.contains_key(&ep) {
        return Err(CtrlStatus::EndpointBusy);
    }
    if u16::from(ep) >= ctx.engine.config().endpoints_per_guest {
        return Err(CtrlStatus::BadEndpoint);
    }
    let pages = open.pages;
    let total = pages.total();
    if conn.endpoints.len() >= ctx.quotas.max_endpoints
        || !conn.usage.may_map(ctx.quotas, total + 1)
    {
        return Err(CtrlStatus::Quota);
    }
    let info = read_info_pages(ctx, conn, &[open.info_ref])?;
    let page = info.first().ok_or(CtrlStatus::Malformed)?;
    let refs = unpack_info_page(page, total).map_err(|_| CtrlStatus::Malformed)?;
    let mapping = Arc::new(
        ctx.gnttab
            .map(conn.domu, &refs, true)
            .map_err(|e| grant_status(&e))?,
    );
    let at = |range: std::ops::Range<usize>| (range.start * PAGE_SIZE, range.len() * PAGE_SIZE);
    let (send_off, send_len) = at(pages.send_ring_refs());
    let (event_off, event_len) = at(pages.event_ring_refs());
    let (sendq_off, sendq_len) = at(pages.send_queue_refs());
    let (recvq_off, recvq_len) = at(pages.recv_queue_refs());
    let send_mem = window(&mapping, send_off, send_len)?;
    let send = SendBack::new(send_mem.clone()).map_err(|_| CtrlStatus::Malformed)?;
    // The application initialised the event ring; we take its producing half as it stands.
    let events = EventFront::attach(window(&mapping, event_off, event_len)?)
        .map_err(|_| CtrlStatus::Malformed)?;
    let sendq = window(&mapping, sendq_off, sendq_len)?;
    let recvq = window(&mapping, recvq_off, recvq_len)?;

    let port = ctx
        .evtchn
        .bind_interdomain(conn.domu, open.event_channel)
        .map_err(|_| CtrlStatus::Malformed)?;
    let undo_port = |ctx: &ControlCtx<'_>| {
        if let Err(e) = ctx.evtchn.close(port) {
            tracing::warn!(port, error = %e, "closing an endpoint port");
        }
    };
    let notify = match ctx.evtchn.notifier(port) {
        Ok(n) => n,
        Err(_) => {
            undo_port(ctx);
            return Err(CtrlStatus::Malformed);
        }
    };
    let session = match conn.resumable.get(&ep) {
        Some(&kept) if open.resume_session != 0 && kept == open.resume_session => {
            tracing::info!(
                domu = conn.domu,
                endpoint = ep,
                session = kept,
                "endpoint keeps its session"
            );
            kept
        }
        _ => ctx.sessions.next(),
    };
    let config = EndpointConfig {
        session_id: session,
        send_queue_slots: pages.send_queue,
        recv_queue_slots: pages.recv_queue,
    };
    if let Err(e) = ctx.engine.open_endpoint(conn.guest, ep, config) {
        undo_port(ctx);
        return Err(engine_status(&e));
    }
    conn.memory
        .add(MemoryArea::SendQueue { endpoint: ep }, sendq, 0, sendq_len);
    conn.memory
        .add(MemoryArea::RecvQueue { endpoint: ep }, recvq, 0, recvq_len);
    conn.memory.add(
        MemoryArea::FillMarks { endpoint: ep },
        send_mem,
        fill_marks::OFFSET,
        fill_marks::LEN,
    );
    conn.endpoints.insert(
        ep,
        EndpointConn {
            port,
            notify,
            send,
            events,
            backlog: VecDeque::new(),
            unsignalled: None,
            quiet_send_done: open.quiet_send_done,
            in_ring: VecDeque::new(),
            pages: total,
            counters: EndpointCounters::default(),
        },
    );
    conn.resumable.remove(&ep);
    conn.usage.mapped_pages += total;
    conn.usage.endpoints += 1;
    tracing::info!(
        domu = conn.domu,
        endpoint = ep,
        pages = total,
        port,
        "endpoint opened"
    );
    Ok(session)
}

/// Forget a region on our side (the engine's side is the caller's business).
fn drop_region(conn: &mut Connection, key: (u8, u8)) -> Option<RegionHandle> {
    let region = conn.regions.remove(&key)?;
    // The engine's view goes first: a kept mapping must have no other holder.
    conn.memory.remove(MemoryArea::Region(region.handle));
    let unmapped = match region.keep {
        Some(kept) => conn.kept.put(kept),
        None => region.pages,
    };
    conn.usage.unmapped(unmapped);
    conn.usage.regions = conn.usage.regions.saturating_sub(1);
    Some(region.handle)
}

/// Release an endpoint and everything registered on it.
pub(crate) fn teardown_endpoint(
    engine: &mut Engine,
    evtchn: &dyn EventChannels,
    conn: &mut Connection,
    ep: u8,
) -> bool {
    let Some(endpoint) = conn.endpoints.remove(&ep) else {
        return false;
    };
    if let Err(e) = engine.close_endpoint(conn.guest, ep) {
        tracing::warn!(domu = conn.domu, endpoint = ep, error = %e, "engine had no such endpoint");
    }
    let keys: Vec<(u8, u8)> = conn
        .regions
        .range((ep, 0)..=(ep, u8::MAX))
        .map(|(k, _)| *k)
        .collect();
    for key in keys {
        drop_region(conn, key);
    }
    let kept = conn.kept.drop_endpoint(ep);
    conn.usage.unmapped(kept);
    conn.memory.remove(MemoryArea::SendQueue { endpoint: ep });
    conn.memory.remove(MemoryArea::RecvQueue { endpoint: ep });
    conn.memory.remove(MemoryArea::FillMarks { endpoint: ep });
    if let Err(e) = evtchn.close(endpoint.port) {
        tracing::debug!(port = endpoint.port, error = %e, "closing an endpoint port");
    }
    conn.usage.unmapped(endpoint.pages);
    conn.usage.endpoints = conn.usage.endpoints.saturating_sub(1);
    // The rings' memory is unmapped here, when the last handle on the mapping goes.
    drop(endpoint);
    tracing::info!(domu = conn.domu, endpoint = ep, "endpoint closed");
    true
}

fn close_endpoint(
    ctx: &mut ControlCtx<'_>,
    conn: &mut Connection,
    ep: u8,
) -> Result<(), CtrlStatus> {
    if teardown_endpoint(ctx.engine, ctx.evtchn, conn, ep) {
        Ok(())
    } else {
        Err(CtrlStatus::EndpointNotOpen)
    }
}

/// How a region's pages are mapped.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RegionMapping {
    /// Mapped at registration, unmapped at deregistration (pages the guest daemon granted,
    /// whose grants it ends once the region is gone).
    Once,
    /// From a mapping kept since an earlier window over the same grants if there is one,
    /// kept for the next when deregistered (pages the application granted itself and
    /// pools; see [`super::kept`]).
    Kept,
}

fn register_region(
    ctx: &mut ControlCtx<'_>,
    conn: &mut Connection,
    reg: &RegionRegister,
    how: RegionMapping,
) -> Result<(), CtrlStatus> {
    let key = (reg.endpoint, reg.region_id);
    if !conn.endpoints.contains_key(&reg.endpoint) {
        return Err(CtrlStatus::EndpointNotOpen);
    }
    if conn.regions.contains_key(&key) {
        return Err(CtrlStatus::BadRegion);
    }
    // Parsing bounded the page count by REGION_PAGES_MAX, so this fits a usize.
    let nr_pages = usize::try_from(reg.nr_pages()).map_err(|_| CtrlStatus::Malformed)?;
    let nr_info = reg.info_refs.len();
    // Kept mappings give way to a registration that needs their pages.
    let without_kept = GuestUsage {
        mapped_pages: conn.usage.mapped_pages.saturating_sub(conn.kept.pages()),
        ..conn.usage
    };
    if conn.regions_of(reg.endpoint) >= ctx.quotas.max_regions_per_endpoint
        || !without_kept.may_map(ctx.quotas, nr_pages + nr_info)
    {
        return Err(CtrlStatus::Quota);
    }
    let info = match how {
        RegionMapping::Once => read_info_pages(ctx, conn, &reg.info_refs)?,
        RegionMapping::Kept => read_kept_info_pages(ctx, conn, reg.endpoint, &reg.info_refs)?,
    };
    let refs = unpack_info_pages(&info, nr_pages).map_err(|_| CtrlStatus::Malformed)?;
    drop(info);
    // Pages of a kept mapping taken out count again once the region is registered.
    let reused = match how {
        RegionMapping::Once => None,
        RegionMapping::Kept => match conn.kept.take(reg.endpoint, &refs) {
            Ok(kept) => Some(kept),
            Err(unmapped) => {
                conn.usage.unmapped(unmapped);
                None
            }
        },
    };
    let keep = match reused {
        Some(kept) => {
            conn.usage.unmapped(kept.pages());
            kept
        }
        None => {
            while !conn.usage.may_map(ctx.quotas, nr_pages + nr_info) {
                match conn.kept.drop_oldest() {
                    0 => return Err(CtrlStatus::Quota),
                    unmapped => conn.usage.unmapped(unmapped),
                }
            }
            let mapping = Arc::new(
                ctx.gnttab
                    .map(conn.domu, &refs, true)
                    .map_err(|e| grant_status(&e))?,
            );
            if how == RegionMapping::Once {
                let mem = window(&mapping, 0, nr_pages * PAGE_SIZE)?;
                return add_region(ctx, conn, reg, mem, nr_pages, None);
            }
            KeptMapping::new(reg.endpoint, refs, mapping)
        }
    };
    let mem = window(keep.mapping(), 0, nr_pages * PAGE_SIZE)?;
    let pages = keep.pages();
    add_region(ctx, conn, reg, mem, pages, Some(keep))
}

/// Registers `mem` as region `reg` with the engine and the connection, counting `pages`.
fn add_region(
    ctx: &mut ControlCtx<'_>,
    conn: &mut Connection,
    reg: &RegionRegister,
    mem: SharedMem,
    pages: usize,
    keep: Option<KeptMapping>,
) -> Result<(), CtrlStatus> {
    let key = (reg.endpoint, reg.region_id);
    let handle = RegionHandle(*ctx.next_region);
    *ctx.next_region += 1;
    let area = MemoryArea::Region(handle);
    let length = reg.length as usize;
    if !conn
        .memory
        .add(area, mem, usize::from(reg.first_page_offset), length)
    {
        return Err(CtrlStatus::Malformed);
    }
    if let Err(e) = ctx.engine.register_region(
        conn.guest,
        reg.endpoint,
        reg.region_id,
        handle,
        u64::from(reg.length),
    ) {
        conn.memory.remove(area);
        return Err(engine_status(&e));
    }
    let kept = keep.is_some();
    conn.regions.insert(
        key,
        RegionConn {
            handle,
            pages,
            keep,
        },
    );
    conn.usage.mapped_pages += pages;
    conn.usage.regions += 1;
    tracing::debug!(
        domu = conn.domu,
        endpoint = reg.endpoint,
        region = reg.region_id,
        pages,
        kept,
        "region registered"
    );
    Ok(())
}

/// Serve a REGISTER or DEREGISTER an application posted on endpoint `ep`'s send ring (a
/// region of pages it granted itself, Xen2MX's way: no guest daemon on the path) exactly as
/// the control ring's REGION_REGISTER / REGION_DEREGISTER, with the same checks and quotas.
/// Returns its completion (SEND_DONE, or ERROR with the reason), or None if `req` is not a
/// region request (the engine serves it).
pub(crate) fn region_request(
    ctx: &mut ControlCtx<'_>,
    conn: &mut Connection,
    ep: u8,
    req: &xmx_wire::msg::SendRequest,
) -> Option<xmx_wire::msg::Event> {
    use xmx_wire::msg::{DoneStatus, ErrorCode, Event, EventBody, SendOp};
    let result = match &req.op {
        SendOp::Register(r) => {
            let reg = RegionRegister {
                endpoint: ep,
                region_id: r.region_id,
                first_page_offset: 0,
                length: r.length,
                info_refs: r.info_refs().to_vec(),
            };
            register_region(ctx, conn, &reg, RegionMapping::Kept).map(|()| r.length)
        }
        SendOp::Deregister { region_id } => {
            deregister_region(ctx, conn, ep, *region_id).map(|()| 0)
        }
        _ => return None,
    };
    let body = match result {
        Ok(length) => EventBody::SendDone {
            status: DoneStatus::Success,
            length,
        },
        Err(status) => {
            tracing::debug!(
                domu = conn.domu,
                endpoint = ep,
                ?status,
                "region request refused"
            );
            EventBody::Error {
                code: match status {
                    CtrlStatus::Quota => ErrorCode::NoResources,
                    CtrlStatus::BadRegion | CtrlStatus::EndpointNotOpen => ErrorCode::BadRegion,
                    _ => ErrorCode::Malformed,
                },
            }
        }
    };
    Some(Event { tag: req.tag, body })
}

fn deregister_region(
    ctx: &mut ControlCtx<'_>,
    conn: &mut Connection,
    ep: u8,
    region_id: u8,
) -> Result<(), CtrlStatus> {
    if !conn.endpoints.contains_key(&ep) {
        return Err(CtrlStatus::EndpointNotOpen);
    }
    if !conn.regions.contains_key(&(ep, region_id)) {
        return Err(CtrlStatus::BadRegion);
    }
    // The engine first (it aborts pulls into the region), then the memory goes.
    if let Err(e) = ctx.engine.deregister_region(conn.guest, ep, region_id) {
        tracing::warn!(domu = conn.domu, endpoint = ep, region = region_id, error = %e, "engine had no such region");
    }
    drop_region(conn, (ep, region_id));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_are_nonzero_and_distinct() {
        let mut s = SessionIds::new();
        let ids: std::collections::HashSet<u32> = (0..1000).map(|_| s.next()).collect();
        assert!(!ids.contains(&0));
        assert!(ids.len() > 990);
    }
}

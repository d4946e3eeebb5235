//! Role granter: grants pages, allocates event channels, owns xenstore nodes with
//! permissions, and checks what the mapper wrote back.

use std::sync::Arc;

use super::bytes::{check_pages, fill_pages, pattern, seed, SharedBytes};
use super::coord::{reset_area, Coord, SyncResult};
use super::{run_id, verdict, wait_port, xs_checks, RoleCtx, GRANT_SIZES};
use crate::{
    DomId, Error, EventChannels, GrantTable, GrantedPages, XsAccess, XsPerm, PAGE_SIZE, XBT_NULL,
};

/// Pattern tags: which scenario and which writer.
pub(crate) const TAG_GRANTER: u32 = 0x4701;
pub(crate) const TAG_MAPPER: u32 = 0x4d01;
pub(crate) const TAG_READONLY: u32 = 0x4702;
pub(crate) const TAG_COPY_SOURCE: u32 = 0x4703;
pub(crate) const TAG_COPY_DEST: u32 = 0x4d03;

/// Where in each page the granter writes (first half) and the mapper answers (second).
pub(crate) const HALF: usize = PAGE_SIZE / 2;
/// Where and how much the mapper grant-copies into the granter's destination page.
pub(crate) const COPY_DEST_OFFSET: u16 = 100;
pub(crate) const COPY_DEST_LEN: u16 = 1000;

pub(crate) fn run(ctx: &mut RoleCtx) -> SyncResult<()> {
    let me = ctx.me;
    let mapper = ctx.setup.peer;
    let third = ctx.setup.third;
    let other = ctx.setup.other_domain();
    let timeout = ctx.setup.timeout;

    let probe = ctx
        .platform
        .xenstore()
        .map_err(|e| super::SyncError(format!("xenstore connection: {e}")))?;
    let g_area = ctx.area(probe.as_ref(), me)?;
    let m_area = ctx.area(probe.as_ref(), mapper)?;
    let o_area = match third {
        Some(t) => Some(ctx.area(probe.as_ref(), t)?),
        None => None,
    };
    drop(probe);
    let mut watched = vec![m_area.clone()];
    watched.extend(o_area.clone());
    let coord = Coord::new(ctx.platform, &watched, timeout)?;
    let readers: Vec<DomId> = std::iter::once(mapper).chain(third).collect();
    reset_area(coord.xs(), me, &g_area, &readers)?;

    xs_checks::run(
        ctx.platform,
        &format!("{g_area}/local"),
        mapper,
        timeout,
        &mut ctx.report,
    );

    let id = run_id();
    let g = format!("{g_area}/{id}");
    let m = format!("{m_area}/{id}");
    let o = o_area.as_ref().map(|a| format!("{a}/{id}"));

    publish_perm_nodes(ctx, &coord, &g, mapper);

    let gt = ctx.platform.grant_table().map_err(|e| e.to_string());
    coord.put(&format!("{g}/info/mapper"), mapper.to_string())?;
    coord.put(
        &format!("{g}/info/third"),
        third.map_or("none".to_string(), |t| t.to_string()),
    )?;
    coord.put(&format!("{g}/info/other"), other.to_string())?;
    let table_size = gt.as_ref().map_or(0, |gt| gt.table_size());
    coord.put(&format!("{g}/info/table-size"), table_size.to_string())?;
    coord.put(
        &format!("{g}/info/table-size-exact"),
        if ctx.caps.table_size_exact { "1" } else { "0" },
    )?;
    coord.put(&format!("{g_area}/run"), &id)?;

    for n in GRANT_SIZES {
        batch(ctx, &coord, &gt, &g, &m, mapper, n)?;
    }

    // Pages the mapper maps read-only, must not map, holds while we end access, and
    // grant-copies to and from; and one the outsider must not map.
    let readonly = offer(
        &coord,
        &gt,
        &format!("{g}/readonly"),
        mapper,
        1,
        false,
        Some(TAG_READONLY),
    )?;
    let foreign = offer(&coord, &gt, &format!("{g}/foreign"), other, 1, false, None)?;
    let busy = offer(&coord, &gt, &format!("{g}/busy"), mapper, 1, true, None)?;
    let copy = offer_copy(&coord, &gt, &format!("{g}/copy"), mapper)?;
    let outsider = match &o {
        Some(_) => offer(&coord, &gt, &format!("{g}/outsider"), mapper, 1, true, None)?,
        None => None,
    };
    let mut aux_errors = Vec::new();
    for (name, granted) in [
        ("read-only", readonly.is_some()),
        ("other-domain", foreign.is_some()),
        ("busy", busy.is_some()),
        ("copy", copy.is_ok()),
    ] {
        if !granted {
            aux_errors.push(name);
        }
    }
    if o.is_some() && outsider.is_none() {
        aux_errors.push("outsider");
    }
    if aux_errors.is_empty() {
        ctx.report.pass("grant.aux", "");
    } else {
        ctx.report.fail(
            "grant.aux",
            format!("could not grant: {}", aux_errors.join(", ")),
        );
    }

    end_access_while_mapped(ctx, &coord, &g, &m, busy)?;
    let copy_pages = check_copy(ctx, &coord, &m, copy)?;

    event_channels(ctx, &coord, &g, &m, mapper, other)?;

    // Done: wait for the others, release the rest, leave nothing behind.
    coord.wait_text(&format!("{m}/done"))?;
    if let Some(o) = &o {
        coord.wait_text(&format!("{o}/done"))?;
    }
    let mut release_errors = Vec::new();
    for pages in [readonly, foreign, outsider]
        .into_iter()
        .flatten()
        .chain(copy_pages)
    {
        if let Err((_, e)) = pages.end_access() {
            release_errors.push(e.to_string());
        }
    }
    if release_errors.is_empty() {
        ctx.report.pass("grant.aux-end-access", "");
    } else {
        ctx.report
            .fail("grant.aux-end-access", release_errors.join("; "));
    }
    coord.put(&format!("{g}/done"), "ok")?;
    if let Err(e) = coord.xs().rm(XBT_NULL, &g_area) {
        ctx.report.fail("xs.cleanup", format!("rm {g_area}: {e}"));
    }
    Ok(())
}

/// Two nodes the mapper may read (`shared`) and may not (`private`).
fn publish_perm_nodes(ctx: &mut RoleCtx, coord: &Coord, g: &str, mapper: DomId) {
    let me = ctx.me;
    let result = (|| -> crate::Result<()> {
        let xs = coord.xs();
        let shared = format!("{g}/perm/shared");
        let private = format!("{g}/perm/private");
        xs.write(XBT_NULL, &shared, b"shared")?;
        xs.write(XBT_NULL, &private, b"private")?;
        let owner_only = XsPerm {
            domid: me,
            access: XsAccess::None,
        };
        xs.set_perms(
            XBT_NULL,
            &shared,
            &[
                owner_only,
                XsPerm {
                    domid: mapper,
                    access: XsAccess::Read,
                },
            ],
        )?;
        xs.set_perms(XBT_NULL, &private, &[owner_only])?;
        Ok(())
    })();
    ctx.report.record(
        "xs.perm-publish",
        result.map(|_| String::new()).map_err(|e| e.to_string()),
    );
}

/// Grant `count` pages to `remote` and publish their refs under `dir` (or the error).
/// With `tag`, every page is filled with that pattern first.
fn offer(
    coord: &Coord,
    gt: &Result<Arc<dyn GrantTable>, String>,
    dir: &str,
    remote: DomId,
    count: usize,
    writable: bool,
    tag: Option<u32>,
) -> SyncResult<Option<GrantedPages>> {
    let granted = gt.clone().and_then(|gt| {
        let pages = gt
            .grant_pages(remote, count, writable)
            .map_err(|e| format!("grant {count} page(s) to {remote}: {e}"))?;
        if let Some(tag) = tag {
            // SAFETY: the pages stay mapped while `pages` lives, which outlasts `mem`.
            let mem = unsafe { SharedBytes::new(pages.as_ptr(), pages.len()) };
            fill_pages(&mem, count, tag, 0..PAGE_SIZE)?;
        }
        Ok(pages)
    });
    match granted {
        Ok(pages) => {
            coord.put_refs(dir, pages.refs())?;
            Ok(Some(pages))
        }
        Err(e) => {
            tracing::warn!(dir, error = %e, "conformance: cannot offer grant");
            coord.put_error(dir, &e)?;
            Ok(None)
        }
    }
}

/// One batch scenario: grant `n` pages, the mapper maps them in one call, each side
/// sees what the other wrote.
fn batch(
    ctx: &mut RoleCtx,
    coord: &Coord,
    gt: &Result<Arc<dyn GrantTable>, String>,
    g: &str,
    m: &str,
    mapper: DomId,
    n: usize,
) -> SyncResult<()> {
    let dir = format!("{g}/grant/{n}");
    let granted = gt.clone().and_then(|gt| {
        let pages = gt.grant_pages(mapper, n, true).map_err(|e| e.to_string())?;
        // SAFETY: the pages stay mapped while `pages` lives, which outlasts `mem`.
        let mem = unsafe { SharedBytes::new(pages.as_ptr(), pages.len()) };
        if pages.refs().len() != n || pages.len() != n * PAGE_SIZE {
            return Err(format!(
                "{} refs, {} bytes for {n} pages",
                pages.refs().len(),
                pages.len()
            ));
        }
        fill_pages(&mem, n, TAG_GRANTER, 0..HALF)?;
        Ok(pages)
    });
    let pages = match granted {
        Ok(p) => p,
        Err(e) => {
            ctx.report.fail(&format!("grant.{n}.grant"), e.clone());
            ctx.report
                .skip(&format!("grant.{n}.mapper-to-granter"), "not granted");
            ctx.report
                .skip(&format!("grant.{n}.end-access"), "not granted");
            return coord.put_error(&dir, &e);
        }
    };
    ctx.report.pass(&format!("grant.{n}.grant"), "");
    coord.put_refs(&dir, pages.refs())?;
    let answer = coord.wait_text(&format!("{m}/grant/{n}/done"))?;
    if answer == "ok" {
        // SAFETY: as above; the mapper has unmapped before answering.
        let mem = unsafe { SharedBytes::new(pages.as_ptr(), pages.len()) };
        ctx.report.record(
            &format!("grant.{n}.mapper-to-granter"),
            check_pages(&mem, n, TAG_MAPPER, HALF..PAGE_SIZE).map(|_| String::new()),
        );
    } else {
        ctx.report.skip(
            &format!("grant.{n}.mapper-to-granter"),
            format!("mapper: {answer}"),
        );
    }
    ctx.report.record(
        &format!("grant.{n}.end-access"),
        pages
            .end_access()
            .map(|_| String::new())
            .map_err(|(_, e)| e.to_string()),
    );
    Ok(())
}

/// Ending access is refused while the mapper holds the page, then allowed.
fn end_access_while_mapped(
    ctx: &mut RoleCtx,
    coord: &Coord,
    g: &str,
    m: &str,
    busy: Option<GrantedPages>,
) -> SyncResult<()> {
    const BUSY: &str = "grant.end-access-busy-while-mapped";
    const AFTER: &str = "grant.end-access-after-unmap";
    let Some(pages) = busy else {
        ctx.report.skip(BUSY, "not granted");
        ctx.report.skip(AFTER, "not granted");
        return Ok(());
    };
    let mapped = coord.wait_text(&format!("{m}/busy/mapped"))?;
    let mut pages = Some(pages);
    if mapped != "ok" {
        ctx.report.skip(BUSY, format!("mapper: {mapped}"));
    } else if !ctx.caps.end_access_reports_busy {
        ctx.report.skip(
            BUSY,
            "this platform cannot report it (Linux gntalloc releases lazily)",
        );
    } else if let Some(p) = pages.take() {
        match p.end_access() {
            Ok(()) => ctx
                .report
                .fail(BUSY, "access ended while the mapper maps the page"),
            Err((p, Error::Busy(m))) => {
                ctx.report.pass(BUSY, format!("refused: {m}"));
                pages = Some(p);
            }
            Err((p, e)) => {
                ctx.report.fail(BUSY, format!("want Busy, got {e}"));
                pages = Some(p);
            }
        }
    }
    coord.put(&format!("{g}/busy/tried"), "1")?;
    if mapped == "ok" {
        coord.wait_text(&format!("{m}/busy/unmapped"))?;
    }
    match pages {
        Some(p) => ctx.report.record(
            AFTER,
            p.end_access()
                .map(|_| String::new())
                .map_err(|(_, e)| e.to_string()),
        ),
        None => ctx.report.skip(AFTER, "access already ended"),
    }
    Ok(())
}

/// Pages of the grant-copy scenario: a writable source and destination, and a
/// read-only page the mapper must not be able to copy into.
struct CopyPages {
    rw: GrantedPages,
    ro: GrantedPages,
}

fn offer_copy(
    coord: &Coord,
    gt: &Result<Arc<dyn GrantTable>, String>,
    dir: &str,
    mapper: DomId,
) -> SyncResult<Result<CopyPages, String>> {
    let granted = gt.clone().and_then(|gt| {
        let rw = gt.grant_pages(mapper, 2, true).map_err(|e| e.to_string())?;
        let ro = gt
            .grant_pages(mapper, 1, false)
            .map_err(|e| e.to_string())?;
        // SAFETY: the pages stay mapped while `rw` lives, which outlasts `mem`.
        let mem = unsafe { SharedBytes::new(rw.as_ptr(), rw.len()) };
        mem.write(0, &pattern(seed(TAG_COPY_SOURCE, 1, 0), PAGE_SIZE))?;
        Ok(CopyPages { rw, ro })
    });
    match &granted {
        Ok(c) => {
            let refs: Vec<u32> = c.rw.refs().iter().chain(c.ro.refs()).copied().collect();
            coord.put_refs(dir, &refs)?;
        }
        Err(e) => coord.put_error(dir, e)?,
    }
    Ok(granted)
}

/// After the mapper's grant copies: its bytes are in the destination page at the
/// agreed place and nowhere else, and the read-only page is untouched.
fn check_copy(
    ctx: &mut RoleCtx,
    coord: &Coord,
    m: &str,
    copy: Result<CopyPages, String>,
) -> SyncResult<Vec<GrantedPages>> {
    const NAME: &str = "grant.copy-to-foreign-seen";
    let pages = match copy {
        Ok(p) => p,
        Err(e) => {
            ctx.report.skip(NAME, format!("not granted: {e}"));
            return Ok(Vec::new());
        }
    };
    let answer = coord.wait_text(&format!("{m}/copy/done"))?;
    if answer != "ok" {
        ctx.report.skip(NAME, format!("mapper: {answer}"));
    } else {
        // SAFETY: both grants stay mapped while `pages` lives, which outlasts these.
        let rw = unsafe { SharedBytes::new(pages.rw.as_ptr(), pages.rw.len()) };
        // SAFETY: as above.
        let ro = unsafe { SharedBytes::new(pages.ro.as_ptr(), pages.ro.len()) };
        let result = (|| -> Result<String, String> {
            let dest = rw.read(PAGE_SIZE, PAGE_SIZE)?;
            let (at, len) = (usize::from(COPY_DEST_OFFSET), usize::from(COPY_DEST_LEN));
            let want = pattern(seed(TAG_COPY_DEST, 1, 0), len);
            if dest.get(at..at + len) != Some(&want[..]) {
                return Err("the copied bytes are not in the destination page".into());
            }
            if dest
                .iter()
                .enumerate()
                .any(|(i, &b)| (i < at || i >= at + len) && b != 0)
            {
                return Err("the copy wrote outside its range".into());
            }
            if ro.read(0, PAGE_SIZE)?.iter().any(|&b| b != 0) {
                return Err("the read-only page was written".into());
            }
            Ok(String::new())
        })();
        ctx.report.record(NAME, result);
    }
    Ok(vec![pages.rw, pages.ro])
}

/// Event channels: the mapper binds our port, notifies both ways, masking holds
/// events until unmask, then both ends close.
fn event_channels(
    ctx: &mut RoleCtx,
    coord: &Coord,
    g: &str,
    m: &str,
    mapper: DomId,
    other: DomId,
) -> SyncResult<()> {
    let timeout = ctx.setup.timeout;
    let opened = ctx.platform.event_channels().map_err(|e| e.to_string());
    let ports = opened.as_ref().map_err(Clone::clone).and_then(|ev| {
        let p = ev
            .alloc_unbound(mapper)
            .map_err(|e| format!("for {mapper}: {e}"))?;
        let q = ev
            .alloc_unbound(other)
            .map_err(|e| format!("for {other}: {e}"))?;
        Ok((p, q))
    });
    ctx.report.record(
        "evtchn.alloc-unbound",
        ports
            .as_ref()
            .map(|(p, q)| format!("ports {p}, {q}"))
            .map_err(Clone::clone),
    );
    let (ev, (p, q)) = match (opened, ports) {
        (Ok(ev), Ok(pq)) => (ev, pq),
        (_, Err(e)) | (Err(e), _) => {
            coord.put(&format!("{g}/evtchn/error"), &e)?;
            for name in [
                "evtchn.notify-from-mapper",
                "evtchn.masked-until-unmask",
                "evtchn.notify-to-mapper",
                "evtchn.close",
            ] {
                ctx.report.skip(name, "no ports");
            }
            return Ok(());
        }
    };
    let ev: &dyn EventChannels = ev.as_ref();
    coord.put(&format!("{g}/evtchn/other-port"), q.to_string())?;
    coord.put(&format!("{g}/evtchn/port"), p.to_string())?;

    let first = coord.wait_text(&format!("{m}/evtchn/notified1"))?;
    let got_first = if first == "ok" {
        let r = wait_port(ev, p, timeout);
        ctx.report.record(
            "evtchn.notify-from-mapper",
            r.clone().map(|_| String::new()),
        );
        r.is_ok()
    } else {
        ctx.report
            .skip("evtchn.notify-from-mapper", format!("mapper: {first}"));
        false
    };
    // The port stays masked: the mapper's second event must wait for our unmask.
    coord.put(&format!("{g}/evtchn/masked"), "1")?;
    let second = coord.wait_text(&format!("{m}/evtchn/notified2"))?;
    if got_first && second == "ok" {
        let r = (|| -> Result<String, String> {
            let mut now = Vec::new();
            ev.pending(&mut now).map_err(|e| format!("pending: {e}"))?;
            if now.contains(&p) {
                return Err("reported again while masked".into());
            }
            ev.unmask(p).map_err(|e| format!("unmask: {e}"))?;
            wait_port(ev, p, timeout).map_err(|e| format!("after unmask: {e}"))?;
            Ok(String::new())
        })();
        ctx.report.record("evtchn.masked-until-unmask", r);
    } else {
        ctx.report
            .skip("evtchn.masked-until-unmask", format!("mapper: {second}"));
    }
    let _ = ev.unmask(p);

    let sent = ev.notify(p).map_err(|e| e.to_string());
    ctx.report.record(
        "evtchn.notify-to-mapper",
        sent.clone().map(|_| String::new()),
    );
    coord.put(&format!("{g}/evtchn/notified"), verdict(&sent))?;

    coord.wait_text(&format!("{m}/evtchn/closed"))?;
    let closed = ev
        .close(p)
        .and_then(|_| ev.close(q))
        .map(|_| String::new())
        .map_err(|e| e.to_string());
    ctx.report.record("evtchn.close", closed);
    Ok(())
}

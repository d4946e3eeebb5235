//! Role mapper: maps, copies and binds what the granter offers, and checks that what
//! it must not use is refused.

use std::sync::Arc;

use super::bytes::{check_pages, fill_pages, pattern, seed, SharedBytes};
use super::coord::{reset_area, Coord, SyncResult};
use super::granter::{
    COPY_DEST_LEN, COPY_DEST_OFFSET, HALF, TAG_COPY_DEST, TAG_COPY_SOURCE, TAG_GRANTER, TAG_MAPPER,
    TAG_READONLY,
};
use super::{
    expect_refused, parse_domid, parse_run_id, verdict, wait_port, xs_checks, RoleCtx, SyncError,
    GRANT_SIZES, OUT_OF_RANGE_REF,
};
use crate::{
    CopyPtr, CopySegment, DomId, Error, GrantRef, GrantTable, Port, DOM0, PAGE_SIZE, XBT_NULL,
};

/// What the granter published about itself.
struct Info {
    third: Option<DomId>,
    table_size: usize,
    table_size_exact: bool,
}

pub(crate) fn run(ctx: &mut RoleCtx) -> SyncResult<()> {
    let me = ctx.me;
    let granter = ctx.setup.peer;
    let timeout = ctx.setup.timeout;

    let probe = ctx
        .platform
        .xenstore()
        .map_err(|e| SyncError(format!("xenstore connection: {e}")))?;
    let g_area = ctx.area(probe.as_ref(), granter)?;
    let m_area = ctx.area(probe.as_ref(), me)?;
    let mut coord = Coord::new(ctx.platform, std::slice::from_ref(&g_area), timeout)?;
    reset_area(coord.xs(), me, &m_area, &[granter])?;

    xs_checks::run(
        ctx.platform,
        &format!("{m_area}/local"),
        granter,
        timeout,
        &mut ctx.report,
    );

    let id = parse_run_id(&coord.wait_text(&format!("{g_area}/run"))?)?;
    let g = format!("{g_area}/{id}");
    let m = format!("{m_area}/{id}");
    let info = read_info(&coord, &g)?;
    let o = match info.third {
        Some(t) => {
            let o_area = ctx.area(coord.xs(), t)?;
            coord.watch(&o_area)?;
            Some(format!("{o_area}/{id}"))
        }
        None => None,
    };

    read_granter_nodes(ctx, &coord, &g);

    let gt = ctx.platform.grant_table().map_err(|e| e.to_string());
    for n in GRANT_SIZES {
        batch(ctx, &coord, &gt, &g, &m, granter, n)?;
    }
    readonly(ctx, &coord, &gt, &g, granter)?;
    not_granted(ctx, &coord, &gt, &g, granter)?;
    out_of_range(ctx, &gt, granter, &info);
    hold_while_granter_ends(ctx, &coord, &gt, &g, &m, granter)?;
    copy(ctx, &coord, &gt, &g, &m, granter)?;
    event_channels(ctx, &coord, &g, &m, o.as_deref(), granter)?;

    coord.put(&format!("{m}/done"), "ok")?;
    // The granter removes its area after its `done`: either means it has finished
    // reading ours.
    let run_path = format!("{g_area}/run");
    let done_path = format!("{g}/done");
    coord.wait("the granter to finish", |xs| {
        let finished = xs.read(XBT_NULL, &done_path).is_ok()
            || xs
                .read(XBT_NULL, &run_path)
                .map_or(true, |r| r != id.as_bytes());
        finished.then_some(())
    })?;
    if let Err(e) = coord.xs().rm(XBT_NULL, &m_area) {
        ctx.report.fail("xs.cleanup", format!("rm {m_area}: {e}"));
    }
    Ok(())
}

fn read_info(coord: &Coord, g: &str) -> SyncResult<Info> {
    let third = coord.wait_text(&format!("{g}/info/third"))?;
    let third = match third.trim() {
        "none" => None,
        t => Some(parse_domid(t)?),
    };
    let table_size: usize = coord.wait_number(&format!("{g}/info/table-size"))?;
    let exact = coord.wait_text(&format!("{g}/info/table-size-exact"))?;
    Ok(Info {
        third,
        table_size,
        table_size_exact: exact.trim() == "1",
    })
}

/// The granter's `shared` node is readable, its `private` one is not, and neither
/// is writable. dom0 is privileged in xenstore and sees everything.
fn read_granter_nodes(ctx: &mut RoleCtx, coord: &Coord, g: &str) {
    let xs = coord.xs();
    let shared = format!("{g}/perm/shared");
    let private = format!("{g}/perm/private");
    let got = coord.wait_value(&shared);
    ctx.report.record(
        "xs.perm-read-allowed",
        match got {
            Ok(v) if v == b"shared" => Ok(String::new()),
            Ok(v) => Err(format!("read {v:?}")),
            Err(SyncError(e)) => Err(e),
        },
    );
    if ctx.me == DOM0 {
        ctx.report.skip("xs.perm-read-denied", "dom0 is privileged");
        ctx.report
            .skip("xs.perm-write-denied", "dom0 is privileged");
        return;
    }
    ctx.report.record(
        "xs.perm-read-denied",
        match xs.read(XBT_NULL, &private) {
            Err(Error::Denied(m)) => Ok(format!("refused: {m}")),
            other => Err(format!("want Denied, got {other:?}")),
        },
    );
    ctx.report.record(
        "xs.perm-write-denied",
        match xs.write(XBT_NULL, &shared, b"mapper") {
            Err(Error::Denied(m)) => Ok(format!("refused: {m}")),
            other => Err(format!("want Denied, got {other:?}")),
        },
    );
}

type Table = Result<Arc<dyn GrantTable>, String>;

fn batch(
    ctx: &mut RoleCtx,
    coord: &Coord,
    gt: &Table,
    g: &str,
    m: &str,
    granter: DomId,
    n: usize,
) -> SyncResult<()> {
    let map_name = format!("grant.{n}.map");
    let seen_name = format!("grant.{n}.granter-to-mapper");
    let answer = format!("{m}/grant/{n}/done");
    let refs = match coord.wait_refs(&format!("{g}/grant/{n}"))? {
        Ok(r) => r,
        Err(e) => {
            ctx.report.skip(&map_name, e.clone());
            ctx.report.skip(&seen_name, e.clone());
            return coord.put(&answer, format!("error: {e}"));
        }
    };
    if refs.len() != n {
        let e = format!("granter published {} refs for {n} pages", refs.len());
        ctx.report.fail(&map_name, e.clone());
        ctx.report.skip(&seen_name, "not mapped");
        return coord.put(&answer, format!("error: {e}"));
    }
    let mapped = gt
        .clone()
        .and_then(|gt| gt.map(granter, &refs, true).map_err(|e| e.to_string()))
        .and_then(|pages| {
            if pages.len() == n * PAGE_SIZE {
                Ok(pages)
            } else {
                Err(format!("mapped {} bytes for {n} pages", pages.len()))
            }
        });
    let pages = match mapped {
        Ok(p) => p,
        Err(e) => {
            ctx.report.fail(&map_name, e.clone());
            ctx.report.skip(&seen_name, "not mapped");
            return coord.put(&answer, format!("error: {e}"));
        }
    };
    ctx.report.pass(&map_name, "one batch");
    // SAFETY: the mapping lives as long as `pages`, which outlasts `mem`.
    let mem = unsafe { SharedBytes::new(pages.as_ptr(), pages.len()) };
    ctx.report.record(
        &seen_name,
        check_pages(&mem, n, TAG_GRANTER, 0..HALF).map(|_| String::new()),
    );
    let wrote = fill_pages(&mem, n, TAG_MAPPER, HALF..PAGE_SIZE);
    drop(pages);
    coord.put(&answer, verdict(&wrote))
}

fn readonly(
    ctx: &mut RoleCtx,
    coord: &Coord,
    gt: &Table,
    g: &str,
    granter: DomId,
) -> SyncResult<()> {
    const REFUSES: &str = "grant.readonly-refuses-writable";
    const MAPS: &str = "grant.readonly-maps-readonly";
    let refs = match coord.wait_refs(&format!("{g}/readonly"))? {
        Ok(r) => r,
        Err(e) => {
            ctx.report.skip(REFUSES, e.clone());
            ctx.report.skip(MAPS, e);
            return Ok(());
        }
    };
    let Ok(table) = gt.clone() else {
        let e = gt.as_ref().err().cloned().unwrap_or_default();
        ctx.report.fail(REFUSES, e.clone());
        ctx.report.fail(MAPS, e);
        return Ok(());
    };
    ctx.report.record(
        REFUSES,
        expect_refused(
            "writable map of a read-only grant",
            table.map(granter, &refs, true),
        ),
    );
    let result = table
        .map(granter, &refs, false)
        .map_err(|e| e.to_string())
        .and_then(|pages| {
            // SAFETY: the mapping lives as long as `pages`, which outlasts `mem`.
            let mem = unsafe { SharedBytes::new(pages.as_ptr(), pages.len()) };
            check_pages(&mem, refs.len(), TAG_READONLY, 0..PAGE_SIZE).map(|_| String::new())
        });
    ctx.report.record(MAPS, result);
    Ok(())
}

fn not_granted(
    ctx: &mut RoleCtx,
    coord: &Coord,
    gt: &Table,
    g: &str,
    granter: DomId,
) -> SyncResult<()> {
    const NAME: &str = "grant.not-granted-refused";
    match (coord.wait_refs(&format!("{g}/foreign"))?, gt) {
        (Err(e), _) => ctx.report.skip(NAME, e),
        (_, Err(e)) => ctx.report.fail(NAME, e.clone()),
        (Ok(refs), Ok(table)) => ctx.report.record(
            NAME,
            expect_refused(
                "map of a page granted to another domain",
                table.map(granter, &refs, false),
            ),
        ),
    }
    Ok(())
}

fn out_of_range(ctx: &mut RoleCtx, gt: &Table, granter: DomId, info: &Info) {
    const NAME: &str = "grant.out-of-range-refused";
    let table = match gt {
        Ok(t) => t,
        Err(e) => return ctx.report.fail(NAME, e.clone()),
    };
    let mut refs: Vec<GrantRef> = vec![OUT_OF_RANGE_REF];
    if info.table_size_exact {
        if let Ok(first_past) = GrantRef::try_from(info.table_size) {
            refs.insert(0, first_past);
        }
    }
    let mut details = Vec::new();
    for r in refs {
        match expect_refused(&format!("map of ref {r}"), table.map(granter, &[r], false)) {
            Ok(d) => details.push(format!("{r}: {d}")),
            Err(e) => return ctx.report.fail(NAME, e),
        }
    }
    ctx.report.pass(NAME, details.join("; "));
}

/// Map a page and hold it while the granter tries to end access.
fn hold_while_granter_ends(
    ctx: &mut RoleCtx,
    coord: &Coord,
    gt: &Table,
    g: &str,
    m: &str,
    granter: DomId,
) -> SyncResult<()> {
    const NAME: &str = "grant.busy-map";
    let refs = match coord.wait_refs(&format!("{g}/busy"))? {
        Ok(r) => r,
        Err(e) => {
            ctx.report.skip(NAME, e);
            return Ok(());
        }
    };
    let mapped = gt
        .clone()
        .and_then(|t| t.map(granter, &refs, true).map_err(|e| e.to_string()));
    ctx.report.record(
        NAME,
        mapped.as_ref().map(|_| String::new()).map_err(Clone::clone),
    );
    coord.put(&format!("{m}/busy/mapped"), verdict(&mapped))?;
    if let Ok(pages) = mapped {
        coord.wait_text(&format!("{g}/busy/tried"))?;
        drop(pages);
        coord.put(&format!("{m}/busy/unmapped"), "ok")?;
    }
    Ok(())
}

/// One grant-copy call of four segments: foreign to local, local to foreign, a bad
/// ref (must fail alone) and a write into a read-only grant (must be refused).
fn copy(
    ctx: &mut RoleCtx,
    coord: &Coord,
    gt: &Table,
    g: &str,
    m: &str,
    granter: DomId,
) -> SyncResult<()> {
    const FROM: &str = "grant.copy-from-foreign";
    const TO: &str = "grant.copy-to-foreign";
    const BAD: &str = "grant.copy-bad-ref-fails-alone";
    const RO: &str = "grant.copy-to-readonly-refused";
    let answer = format!("{m}/copy/done");
    let refs = match coord.wait_refs(&format!("{g}/copy"))? {
        Ok(r) => r,
        Err(e) => {
            for name in [FROM, TO, BAD, RO] {
                ctx.report.skip(name, e.clone());
            }
            return coord.put(&answer, format!("error: {e}"));
        }
    };
    let (source, dest, readonly) = match refs[..] {
        [s, d, r] => (s, d, r),
        _ => {
            let e = format!("granter published {} refs, want 3", refs.len());
            for name in [FROM, TO, BAD, RO] {
                ctx.report.fail(name, e.clone());
            }
            return coord.put(&answer, format!("error: {e}"));
        }
    };
    let mut from_granter = vec![0u8; PAGE_SIZE];
    let mut scratch = vec![0u8; 16];
    let mine = pattern(seed(TAG_COPY_DEST, 1, 0), usize::from(COPY_DEST_LEN));
    let foreign = |gref, offset| CopyPtr::Foreign {
        domid: granter,
        gref,
        offset,
    };
    let segments = [
        CopySegment {
            source: foreign(source, 0),
            dest: CopyPtr::Local(from_granter.as_mut_ptr()),
            len: PAGE_SIZE as u16,
        },
        CopySegment {
            // The platform only reads through a source pointer.
            source: CopyPtr::Local(mine.as_ptr().cast_mut()),
            dest: foreign(dest, COPY_DEST_OFFSET),
            len: COPY_DEST_LEN,
        },
        CopySegment {
            source: foreign(OUT_OF_RANGE_REF, 0),
            dest: CopyPtr::Local(scratch.as_mut_ptr()),
            len: 16,
        },
        CopySegment {
            source: CopyPtr::Local(mine.as_ptr().cast_mut()),
            dest: foreign(readonly, 0),
            len: 16,
        },
    ];
    let results = gt
        .clone()
        .and_then(|t| t.copy(&segments).map_err(|e| e.to_string()))
        .and_then(|r| {
            if r.len() == segments.len() {
                Ok(r)
            } else {
                Err(format!(
                    "{} results for {} segments",
                    r.len(),
                    segments.len()
                ))
            }
        });
    let results = match results {
        Ok(r) => r,
        Err(e) => {
            for name in [FROM, TO, BAD, RO] {
                ctx.report.fail(name, e.clone());
            }
            return coord.put(&answer, format!("error: {e}"));
        }
    };
    let ok = |i: usize| results[i].as_ref().map_err(|e| e.to_string());
    let from = ok(0).and_then(|_| {
        if from_granter == pattern(seed(TAG_COPY_SOURCE, 1, 0), PAGE_SIZE) {
            Ok(String::new())
        } else {
            Err("copied bytes differ from the granter's page".into())
        }
    });
    ctx.report.record(FROM, from);
    let to = ok(1).map(|_| String::new());
    ctx.report.record(TO, to.clone());
    let bad = match (&results[2], ok(0).is_ok() && ok(1).is_ok()) {
        (Err(e), true) => Ok(format!("refused: {e}")),
        (Err(_), false) => Err("the good segments failed with the bad one".into()),
        (Ok(()), _) => Err("a copy from an out-of-range ref succeeded".into()),
    };
    ctx.report.record(BAD, bad);
    ctx.report.record(
        RO,
        match &results[3] {
            Err(e) => Ok(format!("refused: {e}")),
            Ok(()) => Err("a copy into a read-only grant succeeded".into()),
        },
    );
    coord.put(&answer, verdict(&to))
}

fn event_channels(
    ctx: &mut RoleCtx,
    coord: &Coord,
    g: &str,
    m: &str,
    o: Option<&str>,
    granter: DomId,
) -> SyncResult<()> {
    const OTHER: &str = "evtchn.bind-other-refused";
    const BIND: &str = "evtchn.bind";
    const TO: &str = "evtchn.notify-to-granter";
    const FROM: &str = "evtchn.notify-from-granter";
    const CLOSE: &str = "evtchn.close";
    let timeout = ctx.setup.timeout;
    let port_path = format!("{g}/evtchn/port");
    let error_path = format!("{g}/evtchn/error");
    let published = coord.wait("the granter's ports", |xs| {
        if let Ok(p) = xs.read(XBT_NULL, &port_path) {
            return Some(Ok(p));
        }
        xs.read(XBT_NULL, &error_path).ok().map(Err)
    })?;
    if let Err(e) = published {
        for name in [OTHER, BIND, TO, FROM, CLOSE] {
            ctx.report
                .skip(name, format!("granter: {}", String::from_utf8_lossy(&e)));
        }
        return Ok(());
    }
    let port: Port = coord.wait_number(&port_path)?;
    let other_port: Port = coord.wait_number(&format!("{g}/evtchn/other-port"))?;
    if let Some(o) = o {
        // The outsider tries our port while it is still unbound.
        coord.wait_text(&format!("{o}/evtchn/tried"))?;
    }
    let ev = ctx.platform.event_channels().map_err(|e| e.to_string());
    let bound = match &ev {
        Ok(ev) => {
            ctx.report.record(
                OTHER,
                expect_refused(
                    "bind to a port allocated for another domain",
                    ev.bind_interdomain(granter, other_port),
                ),
            );
            ev.bind_interdomain(granter, port)
                .map_err(|e| e.to_string())
        }
        Err(e) => {
            ctx.report.fail(OTHER, e.clone());
            Err(e.clone())
        }
    };
    ctx.report.record(
        BIND,
        bound
            .as_ref()
            .map(|p| format!("local port {p}"))
            .map_err(Clone::clone),
    );
    let (ev, local) = match (ev, bound) {
        (Ok(ev), Ok(local)) => (ev, local),
        (_, Err(e)) | (Err(e), _) => {
            // Keep the granter's steps moving: it waits for these answers.
            let answer = format!("error: {e}");
            coord.put(&format!("{m}/evtchn/notified1"), &answer)?;
            coord.wait_text(&format!("{g}/evtchn/masked"))?;
            coord.put(&format!("{m}/evtchn/notified2"), &answer)?;
            coord.wait_text(&format!("{g}/evtchn/notified"))?;
            coord.put(&format!("{m}/evtchn/closed"), "1")?;
            for name in [TO, FROM, CLOSE] {
                ctx.report.skip(name, "not bound");
            }
            return Ok(());
        }
    };
    let first = ev.notify(local).map_err(|e| e.to_string());
    coord.put(&format!("{m}/evtchn/notified1"), verdict(&first))?;
    coord.wait_text(&format!("{g}/evtchn/masked"))?;
    let second = ev.notify(local).map_err(|e| e.to_string());
    ctx.report
        .record(TO, first.and(second.clone()).map(|_| String::new()));
    coord.put(&format!("{m}/evtchn/notified2"), verdict(&second))?;

    let sent = coord.wait_text(&format!("{g}/evtchn/notified"))?;
    if sent == "ok" {
        let r = wait_port(ev.as_ref(), local, timeout);
        let _ = ev.unmask(local);
        ctx.report.record(FROM, r.map(|_| String::new()));
    } else {
        ctx.report.skip(FROM, format!("granter: {sent}"));
    }

    let closed = (|| -> Result<String, String> {
        ev.close(local).map_err(|e| format!("close: {e}"))?;
        if ev.close(local).is_ok() {
            return Err("closing twice succeeded".into());
        }
        if ev.notify(local).is_ok() {
            return Err("notify after close succeeded".into());
        }
        Ok(String::new())
    })();
    ctx.report.record(CLOSE, closed);
    coord.put(&format!("{m}/evtchn/closed"), "1")
}

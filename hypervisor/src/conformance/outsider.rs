//! Role outsider: a third domain that must not map, copy or bind what the granter
//! meant for the mapper, nor read the granter's nodes.

use super::coord::{reset_area, Coord, SyncResult};
use super::{expect_refused, parse_domid, parse_run_id, xs_checks, RoleCtx, SyncError};
use crate::{CopyPtr, CopySegment, Error, Port, DOM0, XBT_NULL};

pub(crate) fn run(ctx: &mut RoleCtx) -> SyncResult<()> {
    let me = ctx.me;
    let granter = ctx.setup.peer;
    let timeout = ctx.setup.timeout;

    let probe = ctx
        .platform
        .xenstore()
        .map_err(|e| SyncError(format!("xenstore connection: {e}")))?;
    let g_area = ctx.area(probe.as_ref(), granter)?;
    let o_area = ctx.area(probe.as_ref(), me)?;
    drop(probe);
    let coord = Coord::new(ctx.platform, std::slice::from_ref(&g_area), timeout)?;
    reset_area(coord.xs(), me, &o_area, &[granter])?;

    xs_checks::run(
        ctx.platform,
        &format!("{o_area}/local"),
        granter,
        timeout,
        &mut ctx.report,
    );

    let id = parse_run_id(&coord.wait_text(&format!("{g_area}/run"))?)?;
    let g = format!("{g_area}/{id}");
    let o = format!("{o_area}/{id}");
    let mapper = parse_domid(&coord.wait_text(&format!("{g}/info/mapper"))?)?;
    // The mapper waits on our answers: let it read them.
    reset_area(coord.xs(), me, &o_area, &[granter, mapper])?;

    const READ: &str = "xs.outsider-read-denied";
    if me == DOM0 {
        ctx.report.skip(READ, "dom0 is privileged");
    } else {
        // The granter set the node's permissions before it published its info, which
        // we have read.
        let denied = coord.xs().read(XBT_NULL, &format!("{g}/perm/shared"));
        ctx.report.record(
            READ,
            match denied {
                Err(Error::Denied(m)) => Ok(format!("refused: {m}")),
                other => Err(format!("want Denied, got {other:?}")),
            },
        );
    }

    const MAP: &str = "grant.outsider-map-refused";
    const COPY: &str = "grant.outsider-copy-refused";
    match coord.wait_refs(&format!("{g}/outsider"))? {
        Err(e) => {
            ctx.report.skip(MAP, e.clone());
            ctx.report.skip(COPY, e);
        }
        Ok(refs) => match ctx.platform.grant_table() {
            Err(e) => {
                ctx.report.fail(MAP, e.to_string());
                ctx.report.fail(COPY, e.to_string());
            }
            Ok(gt) => {
                ctx.report.record(
                    MAP,
                    expect_refused("map of the mapper's grant", gt.map(granter, &refs, false)),
                );
                let mut buf = vec![0u8; 64];
                let seg = CopySegment {
                    source: CopyPtr::Foreign {
                        domid: granter,
                        gref: refs.first().copied().unwrap_or(0),
                        offset: 0,
                    },
                    dest: CopyPtr::Local(buf.as_mut_ptr()),
                    len: 64,
                };
                let copied = gt.copy(&[seg]).and_then(|mut r| match r.pop() {
                    Some(one) => one,
                    None => Err(Error::Protocol("no result for the segment".into())),
                });
                ctx.report
                    .record(COPY, expect_refused("copy from the mapper's grant", copied));
            }
        },
    }
    coord.put(&format!("{o}/grant/tried"), "1")?;

    const BIND: &str = "evtchn.outsider-bind-refused";
    let port_path = format!("{g}/evtchn/port");
    let error_path = format!("{g}/evtchn/error");
    let published = coord.wait("the granter's ports", |xs| {
        if xs.read(XBT_NULL, &port_path).is_ok() {
            return Some(true);
        }
        xs.read(XBT_NULL, &error_path).ok().map(|_| false)
    })?;
    if published {
        let port: Port = coord.wait_number(&port_path)?;
        match ctx.platform.event_channels() {
            Ok(ev) => ctx.report.record(
                BIND,
                expect_refused(
                    "bind to the mapper's port",
                    ev.bind_interdomain(granter, port),
                ),
            ),
            Err(e) => ctx.report.fail(BIND, e.to_string()),
        }
    } else {
        ctx.report.skip(BIND, "the granter has no ports");
    }
    coord.put(&format!("{o}/evtchn/tried"), "1")?;

    coord.put(&format!("{o}/done"), "ok")?;
    let run_path = format!("{g_area}/run");
    let done_path = format!("{g}/done");
    coord.wait("the granter to finish", |xs| {
        let finished = xs.read(XBT_NULL, &done_path).is_ok()
            || xs
                .read(XBT_NULL, &run_path)
                .map_or(true, |r| r != id.as_bytes());
        finished.then_some(())
    })?;
    if let Err(e) = coord.xs().rm(XBT_NULL, &o_area) {
        ctx.report.fail("xs.cleanup", format!("rm {o_area}: {e}"));
    }
    Ok(())
}

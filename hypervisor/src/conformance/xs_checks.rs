//! Xenstore checks one domain can make alone, in its own area.

use std::time::{Duration, Instant};

use super::report::ConformanceReport;
use crate::{DomId, Error, Platform, Xenstore, XsAccess, XsPerm, XBT_NULL};

/// Run every local xenstore check under `dir` (which the caller owns), on a fresh
/// connection so that no other watch interferes.
pub(crate) fn run(
    platform: &dyn Platform,
    dir: &str,
    peer: DomId,
    timeout: Duration,
    report: &mut ConformanceReport,
) {
    let xs = match platform.xenstore() {
        Ok(xs) => xs,
        Err(e) => {
            report.fail("xs.connect", e.to_string());
            return;
        }
    };
    let xs = xs.as_ref();
    let me = platform.domid();
    report.record("xs.domain-path", domain_path(xs, me));
    report.record("xs.write-read", write_read(xs, dir));
    report.record("xs.directory", directory(xs, dir));
    report.record("xs.rm", rm(xs, dir));
    report.record("xs.perms", perms(xs, dir, me, peer));
    report.record("xs.transaction-commit", transaction_commit(xs, dir));
    report.record("xs.transaction-abort", transaction_abort(xs, dir));
    report.record("xs.transaction-conflict", transaction_conflict(xs, dir));
    report.record("xs.watch-token", watch_token(xs, dir, timeout));
    report.record("xs.watch-special", watch_special(xs));
}

fn e(what: &str) -> impl Fn(Error) -> String + '_ {
    move |err| format!("{what}: {err}")
}

fn domain_path(xs: &dyn Xenstore, me: DomId) -> Result<String, String> {
    let p = xs.get_domain_path(me).map_err(e("get_domain_path"))?;
    let want = format!("/local/domain/{me}");
    if p != want {
        return Err(format!("got {p:?}, want {want:?}"));
    }
    Ok(String::new())
}

fn write_read(xs: &dyn Xenstore, dir: &str) -> Result<String, String> {
    let path = format!("{dir}/value");
    // Values are bytes, not strings: include a NUL and a non-UTF-8 byte.
    let value = b"xmx\0\xff value";
    xs.write(XBT_NULL, &path, value).map_err(e("write"))?;
    let got = xs.read(XBT_NULL, &path).map_err(e("read"))?;
    if got != value {
        return Err(format!("read back {got:?}"));
    }
    match xs.read(XBT_NULL, &format!("{dir}/absent")) {
        Err(Error::NotFound(_)) => Ok(String::new()),
        other => Err(format!("reading a missing node gave {other:?}")),
    }
}

fn directory(xs: &dyn Xenstore, dir: &str) -> Result<String, String> {
    let list = format!("{dir}/list");
    xs.write(XBT_NULL, &format!("{list}/b"), b"2")
        .map_err(e("write"))?;
    xs.write(XBT_NULL, &format!("{list}/a"), b"1")
        .map_err(e("write"))?;
    xs.mkdir(XBT_NULL, &format!("{list}/c"))
        .map_err(e("mkdir"))?;
    let mut names = xs.directory(XBT_NULL, &list).map_err(e("directory"))?;
    names.sort();
    if names != ["a", "b", "c"] {
        return Err(format!("directory gave {names:?}"));
    }
    // A node made by mkdir exists with an empty value.
    let c = xs.read(XBT_NULL, &format!("{list}/c")).map_err(e("read"))?;
    if !c.is_empty() {
        return Err(format!("mkdir'd node holds {c:?}"));
    }
    Ok(String::new())
}

fn rm(xs: &dyn Xenstore, dir: &str) -> Result<String, String> {
    let list = format!("{dir}/list");
    xs.rm(XBT_NULL, &list).map_err(e("rm"))?;
    for path in [format!("{list}/a"), list.clone()] {
        match xs.read(XBT_NULL, &path) {
            Err(Error::NotFound(_)) => {}
            other => return Err(format!("{path} after rm: {other:?}")),
        }
    }
    match xs.directory(XBT_NULL, &list) {
        Err(Error::NotFound(_)) => Ok(String::new()),
        other => Err(format!("directory after rm: {other:?}")),
    }
}

fn perms(xs: &dyn Xenstore, dir: &str, me: DomId, peer: DomId) -> Result<String, String> {
    let path = format!("{dir}/perm");
    xs.write(XBT_NULL, &path, b"p").map_err(e("write"))?;
    let want = vec![
        XsPerm {
            domid: me,
            access: XsAccess::None,
        },
        XsPerm {
            domid: peer,
            access: XsAccess::Both,
        },
    ];
    xs.set_perms(XBT_NULL, &path, &want)
        .map_err(e("set_perms"))?;
    let got = xs.get_perms(XBT_NULL, &path).map_err(e("get_perms"))?;
    if got != want {
        return Err(format!("get_perms gave {got:?}, set {want:?}"));
    }
    Ok(String::new())
}

fn transaction_commit(xs: &dyn Xenstore, dir: &str) -> Result<String, String> {
    let path = format!("{dir}/tx-commit");
    let tx = xs.transaction_start().map_err(e("transaction_start"))?;
    xs.write(tx, &path, b"in-tx")
        .map_err(e("write in transaction"))?;
    // Isolation: outside the transaction the write is not there yet.
    let outside = xs.read(XBT_NULL, &path);
    if !matches!(outside, Err(Error::NotFound(_))) {
        let _ = xs.transaction_end(tx, false);
        return Err(format!("uncommitted write visible outside: {outside:?}"));
    }
    xs.transaction_end(tx, true).map_err(e("commit"))?;
    let got = xs.read(XBT_NULL, &path).map_err(e("read after commit"))?;
    if got != b"in-tx" {
        return Err(format!("after commit read {got:?}"));
    }
    Ok(String::new())
}

fn transaction_abort(xs: &dyn Xenstore, dir: &str) -> Result<String, String> {
    let path = format!("{dir}/tx-abort");
    let tx = xs.transaction_start().map_err(e("transaction_start"))?;
    xs.write(tx, &path, b"dropped")
        .map_err(e("write in transaction"))?;
    xs.transaction_end(tx, false).map_err(e("abort"))?;
    match xs.read(XBT_NULL, &path) {
        Err(Error::NotFound(_)) => Ok(String::new()),
        other => Err(format!("aborted write left {other:?}")),
    }
}

fn transaction_conflict(xs: &dyn Xenstore, dir: &str) -> Result<String, String> {
    let path = format!("{dir}/tx-conflict");
    xs.write(XBT_NULL, &path, b"0").map_err(e("write"))?;
    let tx = xs.transaction_start().map_err(e("transaction_start"))?;
    let seen = xs.read(tx, &path).map_err(e("read in transaction"))?;
    if seen != b"0" {
        let _ = xs.transaction_end(tx, false);
        return Err(format!("transaction read {seen:?}"));
    }
    xs.write(XBT_NULL, &path, b"outside")
        .map_err(e("write outside"))?;
    xs.write(tx, &path, b"inside")
        .map_err(e("write in transaction"))?;
    match xs.transaction_end(tx, true) {
        Err(Error::Again) => {}
        other => return Err(format!("conflicting commit gave {other:?}, want Again")),
    }
    let got = xs.read(XBT_NULL, &path).map_err(e("read"))?;
    if got != b"outside" {
        return Err(format!("after the failed commit the node holds {got:?}"));
    }
    Ok("commit refused with EAGAIN".into())
}

fn watch_token(xs: &dyn Xenstore, dir: &str, timeout: Duration) -> Result<String, String> {
    let path = format!("{dir}/watched");
    let token = "xmx-conformance-token";
    xs.watch(&path, token).map_err(e("watch"))?;
    let result = (|| {
        // xenstored fires every new watch once at once, for the watched path.
        expect_event(xs, &path, token, timeout)?;
        let child = format!("{path}/child");
        xs.write(XBT_NULL, &child, b"1").map_err(e("write"))?;
        expect_event(xs, &child, token, timeout)?;
        Ok(String::new())
    })();
    xs.unwatch(&path, token).map_err(e("unwatch"))?;
    result
}

/// Wait for the event (`path`, `token`), ignoring other events for the same token
/// (a write may also fire for the watched path itself on some xenstoreds).
fn expect_event(
    xs: &dyn Xenstore,
    path: &str,
    token: &str,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("no watch event for {path} within {timeout:?}"));
        }
        match xs
            .next_watch_event(Some(left))
            .map_err(e("next_watch_event"))?
        {
            Some(ev) if ev.path == path && ev.token == token => return Ok(()),
            Some(ev) if ev.token != token => {
                return Err(format!("event {ev:?} carries the wrong token"));
            }
            Some(_) | None => {}
        }
    }
}

fn watch_special(xs: &dyn Xenstore) -> Result<String, String> {
    let specials = [
        ("@introduceDomain", "xmx-conformance-intro"),
        ("@releaseDomain", "xmx-conformance-release"),
    ];
    for (path, token) in specials {
        xs.watch(path, token).map_err(e(path))?;
    }
    for (path, token) in specials {
        xs.unwatch(path, token).map_err(e(path))?;
    }
    Ok(String::new())
}

//! How the roles talk: each role writes only under its own xenstore area and reads the
//! others', waiting on watches (never polling on a timer).
//!
//! Values published by another domain are untrusted input: they are parsed strictly
//! and bounded.

use std::time::{Duration, Instant};

use crate::{DomId, Error, GrantRef, Platform, Xenstore, XsAccess, XsPerm, XBT_NULL};

/// Most refs one scenario publishes (the largest batch is 2048).
pub(crate) const MAX_PUBLISHED_REFS: usize = 4096;
/// Refs per xenstore value: well under the 4 KiB payload limit.
const REFS_PER_NODE: usize = 128;

/// Coordination failed: the peer did not answer in time or xenstore failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SyncError(pub String);

pub(crate) type SyncResult<T> = std::result::Result<T, SyncError>;

/// One xenstore connection for coordination, watching the peers' areas.
pub(crate) struct Coord {
    xs: Box<dyn Xenstore>,
    timeout: Duration,
    token: String,
    watched: Vec<String>,
}

impl Coord {
    /// Connect and watch each of `peer_areas`.
    pub(crate) fn new(
        platform: &dyn Platform,
        peer_areas: &[String],
        timeout: Duration,
    ) -> SyncResult<Self> {
        let xs = platform
            .xenstore()
            .map_err(|e| SyncError(format!("xenstore connection: {e}")))?;
        let token = format!("xmx-conformance-{}", platform.domid());
        for area in peer_areas {
            xs.watch(area, &token)
                .map_err(|e| SyncError(format!("watch {area}: {e}")))?;
        }
        Ok(Coord {
            xs,
            timeout,
            token,
            watched: peer_areas.to_vec(),
        })
    }

    /// Also watch `area`.
    pub(crate) fn watch(&mut self, area: &str) -> SyncResult<()> {
        self.xs
            .watch(area, &self.token)
            .map_err(|e| SyncError(format!("watch {area}: {e}")))?;
        self.watched.push(area.to_string());
        Ok(())
    }

    /// The connection, for plain reads and writes.
    pub(crate) fn xs(&self) -> &dyn Xenstore {
        self.xs.as_ref()
    }

    /// Wait until `probe` returns a value, re-probing whenever a watched area changes.
    pub(crate) fn wait<T>(
        &self,
        what: &str,
        mut probe: impl FnMut(&dyn Xenstore) -> Option<T>,
    ) -> SyncResult<T> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(v) = probe(self.xs.as_ref()) {
                return Ok(v);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(SyncError(format!(
                    "timed out after {:?} waiting for {what}",
                    self.timeout
                )));
            }
            match self.xs.next_watch_event(Some(left)) {
                Ok(_) => {}
                Err(e) => return Err(SyncError(format!("waiting for {what}: {e}"))),
            }
        }
    }

    /// Wait until `path` exists and return its value.
    pub(crate) fn wait_value(&self, path: &str) -> SyncResult<Vec<u8>> {
        self.wait(path, |xs| xs.read(XBT_NULL, path).ok())
    }

    /// Wait until `path` exists and return its value as text.
    pub(crate) fn wait_text(&self, path: &str) -> SyncResult<String> {
        let v = self.wait_value(path)?;
        Ok(String::from_utf8_lossy(&v).into_owned())
    }

    /// Write `value` at `path`.
    pub(crate) fn put(&self, path: &str, value: impl AsRef<[u8]>) -> SyncResult<()> {
        self.xs
            .write(XBT_NULL, path, value.as_ref())
            .map_err(|e| SyncError(format!("write {path}: {e}")))
    }

    /// Publish `refs` under `dir`: chunks first, then `count`, which readers wait for.
    pub(crate) fn put_refs(&self, dir: &str, refs: &[GrantRef]) -> SyncResult<()> {
        for (i, chunk) in refs.chunks(REFS_PER_NODE).enumerate() {
            let text: Vec<String> = chunk.iter().map(|r| r.to_string()).collect();
            self.put(&format!("{dir}/refs/{i}"), text.join(" "))?;
        }
        self.put(&format!("{dir}/count"), refs.len().to_string())
    }

    /// Publish that the scenario under `dir` could not be set up.
    pub(crate) fn put_error(&self, dir: &str, error: &str) -> SyncResult<()> {
        self.put(&format!("{dir}/error"), error)
    }

    /// Wait for refs published by [`Coord::put_refs`] (or an error from
    /// [`Coord::put_error`], returned as `Ok(Err(..))`).
    pub(crate) fn wait_refs(&self, dir: &str) -> SyncResult<Result<Vec<GrantRef>, String>> {
        let count_path = format!("{dir}/count");
        let error_path = format!("{dir}/error");
        let found = self.wait(dir, |xs| {
            if let Ok(c) = xs.read(XBT_NULL, &count_path) {
                return Some(Ok(c));
            }
            xs.read(XBT_NULL, &error_path).ok().map(Err)
        })?;
        let count = match found {
            Ok(c) => c,
            Err(e) => {
                return Ok(Err(format!(
                    "peer could not set up: {}",
                    String::from_utf8_lossy(&e)
                )))
            }
        };
        let count = parse_count(&count).map_err(SyncError)?;
        let mut refs = Vec::with_capacity(count);
        for i in 0..count.div_ceil(REFS_PER_NODE) {
            let path = format!("{dir}/refs/{i}");
            let v = self
                .xs
                .read(XBT_NULL, &path)
                .map_err(|e| SyncError(format!("read {path}: {e}")))?;
            parse_refs(&v, &mut refs).map_err(|e| SyncError(format!("{path}: {e}")))?;
        }
        if refs.len() != count {
            return Err(SyncError(format!(
                "{dir}: {} refs published, {count} announced",
                refs.len()
            )));
        }
        Ok(Ok(refs))
    }

    /// A decimal value the peer published at `path`, waited for.
    pub(crate) fn wait_number<T: std::str::FromStr>(&self, path: &str) -> SyncResult<T> {
        let v = self.wait_text(path)?;
        v.trim()
            .parse()
            .map_err(|_| SyncError(format!("{path}: {v:?} is not a number")))
    }
}

impl Drop for Coord {
    fn drop(&mut self) {
        for area in &self.watched {
            let _ = self.xs.unwatch(area, &self.token);
        }
    }
}

fn parse_count(v: &[u8]) -> Result<usize, String> {
    let s = std::str::from_utf8(v).map_err(|_| "count is not text".to_string())?;
    let n: usize = s.trim().parse().map_err(|_| format!("count {s:?}"))?;
    if n > MAX_PUBLISHED_REFS {
        return Err(format!("count {n} exceeds {MAX_PUBLISHED_REFS}"));
    }
    Ok(n)
}

fn parse_refs(v: &[u8], out: &mut Vec<GrantRef>) -> Result<(), String> {
    let s = std::str::from_utf8(v).map_err(|_| "refs are not text".to_string())?;
    for word in s.split_ascii_whitespace() {
        if out.len() >= MAX_PUBLISHED_REFS {
            return Err(format!("more than {MAX_PUBLISHED_REFS} refs"));
        }
        out.push(word.parse().map_err(|_| format!("ref {word:?}"))?);
    }
    Ok(())
}

/// Start `area` afresh: remove what a previous run left, recreate it, and let `readers`
/// read it (the owner keeps write access; everyone else gets none).
pub(crate) fn reset_area(
    xs: &dyn Xenstore,
    me: DomId,
    area: &str,
    readers: &[DomId],
) -> SyncResult<()> {
    match xs.rm(XBT_NULL, area) {
        Ok(()) | Err(Error::NotFound(_)) => {}
        Err(e) => return Err(SyncError(format!("rm {area}: {e}"))),
    }
    xs.mkdir(XBT_NULL, area)
        .map_err(|e| SyncError(format!("mkdir {area}: {e}")))?;
    let mut perms = vec![XsPerm {
        domid: me,
        access: XsAccess::None,
    }];
    for &d in readers {
        if d != me && !perms.iter().any(|p| p.domid == d) {
            perms.push(XsPerm {
                domid: d,
                access: XsAccess::Read,
            });
        }
    }
    xs.set_perms(XBT_NULL, area, &perms)
        .map_err(|e| SyncError(format!("set perms of {area}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_refs_parse_strictly() {
        let mut out = Vec::new();
        parse_refs(b"8 9 10", &mut out).unwrap();
        parse_refs(b"4294967295", &mut out).unwrap();
        assert_eq!(out, [8, 9, 10, u32::MAX]);
        assert!(parse_refs(b"8 x", &mut Vec::new()).is_err());
        assert!(parse_refs(b"-1", &mut Vec::new()).is_err());
        assert!(parse_refs(b"4294967296", &mut Vec::new()).is_err());
        assert!(parse_refs(&[0xff], &mut Vec::new()).is_err());
        let mut full = vec![0; MAX_PUBLISHED_REFS];
        assert!(parse_refs(b"1", &mut full).is_err());
    }

    #[test]
    fn counts_are_bounded() {
        assert_eq!(parse_count(b"2048").unwrap(), 2048);
        assert_eq!(parse_count(b" 0 ").unwrap(), 0);
        assert!(parse_count(b"4097").is_err());
        assert!(parse_count(b"lots").is_err());
    }
}

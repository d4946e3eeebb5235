//! LARGE data between the application's buffers and granted windows.
//!
//! A guest application cannot grant its own pages (see the frontend crate's
//! documentation), so a LARGE send is copied into a window the backend pulls
//! from, and a LARGE receive lands in a window it is then copied out of.
//! Windows are registered through the guest daemon on a cache miss only
//! ([`FrontdRegistrar`] is the cache's registrar).

use std::sync::Mutex;

use xmx_frontend::frontd::FrontdClient;
use xmx_frontend::{RegionWindow, Registrar};

use crate::segments::Segments;

/// Copies the whole of `data` into the start of `window`; false if it does
/// not fit or the window refuses.
pub(crate) fn fill(window: &RegionWindow, data: &Segments) -> bool {
    if data.len() > window.len() {
        return false;
    }
    let mut at = 0;
    for &(addr, len) in data.parts() {
        // SAFETY: the segments were validated when the send was posted and MX
        // requires the application to keep a send buffer valid and unchanged
        // until the send completes, which is after this copy.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
        if window.write(at, bytes).is_err() {
            return false;
        }
        at += len;
    }
    true
}

/// Copies bytes `from..to` of `window` to the same place of `dest` (a message's
/// bytes sit at the same offset in both); false if they do not fit or the window
/// refuses. A pull's landed part is copied out while the rest is on the way, the
/// remainder once it is done.
pub(crate) fn drain(window: &RegionWindow, dest: &Segments, from: usize, to: usize) -> bool {
    if from > to || to > dest.len() || to > window.len() {
        return false;
    }
    let mut at = 0;
    for &(addr, len) in dest.parts() {
        if at >= to {
            break;
        }
        let (start, end) = (at.max(from), (at + len).min(to));
        if start < end {
            // SAFETY: the segments were validated when the receive was posted and
            // MX requires the application to keep a receive buffer valid and
            // untouched until the receive completes, which is after this copy;
            // `start - at .. end - at` lies inside this segment, and the window is
            // shared memory, never part of the application's buffer.
            let bytes = unsafe {
                std::slice::from_raw_parts_mut((addr + (start - at)) as *mut u8, end - start)
            };
            if window.read(start, bytes).is_err() {
                return false;
            }
        }
        at += len;
    }
    true
}

/// The key a buffer is cached under: its first byte and its length.
pub(crate) fn key(data: &Segments) -> (usize, usize) {
    (data.parts().first().map_or(0, |p| p.0), data.len())
}

/// The guest daemon as the registration cache's registrar.
pub(crate) struct FrontdRegistrar<'a>(pub(crate) &'a Mutex<FrontdClient>);

impl Registrar for FrontdRegistrar<'_> {
    fn register(&mut self, endpoint: u8, length: u32) -> xmx_frontend::Result<RegionWindow> {
        let started = std::time::Instant::now();
        let w = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .register_region(endpoint, length);
        tracing::trace!(endpoint, length, took = ?started.elapsed(), ok = w.is_ok(), "window registered");
        w
    }

    fn deregister(&mut self, window: RegionWindow) -> xmx_frontend::Result<()> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .deregister_region(window)
    }
}

/// `XMX_OWN_GRANTS`: `0` sends every registration through the guest daemon, as
/// before registration without it existed (for comparisons); anything else, or unset, lets
/// links with the cache off register their windows themselves.
pub(crate) const OWN_GRANTS_ENV: &str = "XMX_OWN_GRANTS";

/// `XMX_GRANT_POOL_PAGES`: granted pages an endpoint registering its own windows keeps
/// from deregistered windows for the next ones (`0`: none, every window is granted afresh;
/// unset or not a number: [`xmx_wire::msg::KEPT_WINDOW_PAGES`]).
pub(crate) const GRANT_POOL_ENV: &str = "XMX_GRANT_POOL_PAGES";

/// The bound of an endpoint's grant pool (see [`GRANT_POOL_ENV`]).
pub(crate) fn pool_pages() -> usize {
    std::env::var(GRANT_POOL_ENV)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(xmx_wire::msg::KEPT_WINDOW_PAGES)
}

/// What registering without the daemon needs: this process's grant table and the domain
/// of the device's backend (the frontend's `backend-id` in xenstore). None (registration
/// goes through the daemon) if either is missing or `XMX_OWN_GRANTS=0`.
pub(crate) fn own_grants_platform(
    platform: Option<&dyn xmx_hv::Platform>,
    xs: Option<&dyn xmx_hv::Xenstore>,
    domid: u16,
) -> Option<(std::sync::Arc<dyn xmx_hv::GrantTable>, xmx_hv::DomId)> {
    if std::env::var(OWN_GRANTS_ENV).is_ok_and(|v| v.trim() == "0") {
        return None;
    }
    let path = format!("/local/domain/{domid}/device/xmx/0/backend-id");
    let backend = xs?
        .read(xmx_hv::XBT_NULL, &path)
        .ok()
        .and_then(|v| String::from_utf8(v).ok())
        .and_then(|v| v.trim().parse::<xmx_hv::DomId>().ok());
    let Some(backend) = backend else {
        tracing::debug!(%path, "backend domain unknown: windows are registered through the daemon");
        return None;
    };
    match platform?.grant_table() {
        Ok(gt) => Some((gt, backend)),
        Err(e) => {
            tracing::debug!(%e, "no grant table: windows are registered through the daemon");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs(parts: &mut [&mut [u8]]) -> Segments {
        let list = parts
            .iter_mut()
            .map(|p| (p.as_mut_ptr() as usize, p.len()))
            .collect();
        // SAFETY: the buffers outlive every copy in the tests below.
        unsafe { Segments::from_parts(list) }
    }

    #[test]
    fn data_goes_into_a_window_and_back_out_across_segments() {
        let w = RegionWindow::in_memory(0, 1, 10_000);
        let (mut a, mut b) = (
            (0..3000u32).map(|i| i as u8).collect::<Vec<_>>(),
            vec![0xabu8; 5000],
        );
        let src = segs(&mut [&mut a[..], &mut b[..]]);
        assert!(fill(&w, &src));
        let (mut x, mut y, mut z) = (vec![0u8; 10], vec![0u8; 7000], vec![0u8; 100]);
        let dst = segs(&mut [&mut x[..], &mut y[..], &mut z[..]]);
        assert!(drain(&w, &dst, 0, 7010));
        let got: Vec<u8> = x.iter().chain(&y).copied().collect();
        let sent: Vec<u8> = a.iter().chain(&b).copied().collect();
        assert_eq!(&got[..7010], &sent[..7010]);
        // Only `length` bytes land: the third segment is untouched.
        assert_eq!(z, vec![0u8; 100]);
    }

    /// A pull's data copied out in the parts the backend tells of (some inside a
    /// segment, some across two), then the rest: every byte in its place once, the
    /// bytes past the message untouched.
    #[test]
    fn a_window_drained_in_parts_lands_as_drained_whole() {
        let len = 9000;
        let w = RegionWindow::in_memory(0, 1, 10_000);
        let mut src = (0..len as u32).map(|i| (i * 7) as u8).collect::<Vec<_>>();
        assert!(fill(&w, &segs(&mut [&mut src[..]])));
        let (mut x, mut y, mut z) = (vec![0u8; 4096], vec![0u8; 10], vec![0u8; 5000]);
        let dst = segs(&mut [&mut x[..], &mut y[..], &mut z[..]]);
        for (from, to) in [
            (0, 1000),
            (1000, 4100),
            (4100, 4101),
            (4101, 8000),
            (8000, len),
        ] {
            assert!(drain(&w, &dst, from, to), "{from}..{to}");
        }
        let got: Vec<u8> = x.iter().chain(&y).chain(&z).copied().collect();
        assert_eq!(&got[..len], &src[..]);
        assert!(
            got[len..].iter().all(|&b| b == 0),
            "nothing past the message"
        );
    }

    #[test]
    fn oversized_copies_are_refused() {
        let w = RegionWindow::in_memory(0, 1, 100);
        let mut big = [1u8; 101];
        assert!(!fill(&w, &segs(&mut [&mut big[..]])));
        let mut small = [0u8; 50];
        let dst = segs(&mut [&mut small[..]]);
        assert!(!drain(&w, &dst, 0, 51), "more than the destination holds");
        assert!(
            !drain(&w, &dst, 20, 10),
            "a range that ends before it starts"
        );
        let mut room = vec![0u8; 500];
        assert!(
            !drain(&w, &segs(&mut [&mut room[..]]), 0, 101),
            "more than the window holds"
        );
        assert_eq!(key(&dst), (small.as_ptr() as usize, 50));
        assert_eq!(key(&Segments::default()), (0, 0));
    }
}

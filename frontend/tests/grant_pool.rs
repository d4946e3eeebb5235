//! The pool of grants behind windows registered without the guest daemon
//! (`xmx_frontend::own_grants`): what a deregistered window leaves for the next one, on the
//! simulated hypervisor, checked from the granting guest and from dom0.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use xmx_frontend::own_grants::{grant_region, GrantPool};
use xmx_hv::{DomId, GrantTable, Platform, DOM0};
use xmx_wire::msg::unpack_info_pages;

/// A guest's grant table that counts its grant calls.
struct Counting {
    inner: Arc<dyn GrantTable>,
    grants: AtomicUsize,
}

impl GrantTable for Counting {
    fn grant_pages(
        &self,
        remote: DomId,
        count: usize,
        writable: bool,
    ) -> xmx_hv::Result<xmx_hv::GrantedPages> {
        self.grants.fetch_add(1, Ordering::SeqCst);
        self.inner.grant_pages(remote, count, writable)
    }
    fn map(
        &self,
        remote: DomId,
        refs: &[u32],
        writable: bool,
    ) -> xmx_hv::Result<xmx_hv::MappedPages> {
        self.inner.map(remote, refs, writable)
    }
    fn copy(&self, segs: &[xmx_hv::CopySegment]) -> xmx_hv::Result<Vec<xmx_hv::Result<()>>> {
        self.inner.copy(segs)
    }
    fn table_size(&self) -> usize {
        self.inner.table_size()
    }
}

fn counting(host: &FrontendTestHost, domu: DomId) -> Counting {
    Counting {
        inner: host.attach(domu).grant_table().unwrap(),
        grants: AtomicUsize::new(0),
    }
}

const MIB: u32 = 1 << 20;

#[test]
fn a_deregistered_windows_grants_serve_the_next_window_that_fits_listing_only_its_pages() {
    let host = FrontendTestHost::start();
    let domu = host.create("g");
    let gt = counting(&host, domu);
    let mut pool = GrantPool::new(1000);

    let (w1, r1, g1) = grant_region(&gt, &mut pool, DOM0, 0, 1, MIB).unwrap();
    assert_eq!(gt.grants.load(Ordering::SeqCst), 1);
    assert_eq!(
        (g1.capacity(), g1.granted(), r1.info_refs().len()),
        (256, 257, 1)
    );
    let refs1 = g1.data_refs().to_vec();
    drop(w1);
    pool.put(g1);
    // Kept: still granted to the backend domain, nothing freed.
    assert_eq!(pool.idle_pages(), 257);
    assert_eq!(host.state(domu).grants_active, 257);

    // 150 pages fit the 256 kept: no grant call, the same pages, one info page listing
    // only the 150 the new window spans (the backend maps exactly those).
    let len2 = 150 * 4096 - 100;
    let (w2, r2, g2) = grant_region(&gt, &mut pool, DOM0, 0, 2, len2).unwrap();
    assert_eq!(gt.grants.load(Ordering::SeqCst), 1);
    assert_eq!((pool.reused(), pool.idle_pages()), (1, 0));
    assert_eq!(g2.data_refs(), &refs1[..]);
    assert_eq!(
        (r2.region_id, r2.length, r2.info_refs().len()),
        (2, len2, 1)
    );
    let dom0 = host.attach(DOM0).grant_table().unwrap();
    let info = Arc::new(dom0.map(domu, r2.info_refs(), false).unwrap());
    let page = read_mapped(&info, 0, 4096);
    assert_eq!(unpack_info_pages(&[&page[..]], 150).unwrap(), &refs1[..150]);
    assert!(page[150 * 4..].iter().all(|&b| b == 0), "stale refs listed");
    drop(info);

    // What the application writes into the reused window is what the backend maps.
    w2.write(len2 as usize - 5, b"fresh").unwrap();
    let data = Arc::new(dom0.map(domu, &refs1[149..150], false).unwrap());
    assert_eq!(read_mapped(&data, 4096 - 105, 5), b"fresh");
    drop(data);

    // Pages the kept grants would waste more than half of are not used: granted afresh.
    let (_w3, _r3, g3) = grant_region(&gt, &mut pool, DOM0, 0, 3, 100 * 4096).unwrap();
    drop(_w3);
    pool.put(g3);
    let (_w4, _r4, g4) = grant_region(&gt, &mut pool, DOM0, 0, 4, 40 * 4096).unwrap();
    assert_eq!(gt.grants.load(Ordering::SeqCst), 3);
    assert_eq!(g4.capacity(), 40);
    assert_eq!(pool.idle_pages(), 101);
}

#[test]
fn kept_grants_are_bounded_and_end_when_evicted_or_dropped() {
    let host = FrontendTestHost::start();
    let domu = host.create("g");
    let gt = counting(&host, domu);
    let mut pool = GrantPool::new(300);
    let (w1, _, g1) = grant_region(&gt, &mut pool, DOM0, 0, 1, MIB).unwrap();
    let (w2, _, g2) = grant_region(&gt, &mut pool, DOM0, 0, 2, MIB).unwrap();
    let (w3, _, g3) = grant_region(&gt, &mut pool, DOM0, 0, 3, 2 * MIB).unwrap();
    let old = g1.data_refs().to_vec();
    let newer = g2.data_refs().to_vec();
    drop((w1, w2, w3));
    assert_eq!(host.state(domu).grants_active, 2 * 257 + 513);
    pool.put(g1);
    pool.put(g2);
    // Over the bound: the oldest went, and one larger than the bound is never kept.
    pool.put(g3);
    assert_eq!(pool.idle_pages(), 257);
    assert_eq!(host.state(domu).grants_active, 257);
    let dom0 = host.attach(DOM0).grant_table().unwrap();
    assert!(
        dom0.map(domu, &old[..1], false).is_err(),
        "evicted grant still mappable"
    );
    drop(dom0.map(domu, &newer[..1], false).unwrap());
    // Dropping the pool (the endpoint closing) ends the rest, and frees their frames.
    drop(pool);
    assert_eq!(host.state(domu).grants_active, 0);
    assert_eq!(host.state(domu).mem_pages, 0);
    assert!(dom0.map(domu, &newer[..1], false).is_err());

    // A pool of no pages keeps nothing.
    let mut none = GrantPool::new(0);
    let (w, _, g) = grant_region(&gt, &mut none, DOM0, 0, 1, MIB).unwrap();
    drop(w);
    none.put(g);
    assert_eq!((none.idle_pages(), host.state(domu).grants_active), (0, 0));
}

#[test]
fn grants_a_window_still_holds_are_not_kept() {
    let host = FrontendTestHost::start();
    let domu = host.create("g");
    let gt = counting(&host, domu);
    let mut pool = GrantPool::new(1000);
    let (w, _, g) = grant_region(&gt, &mut pool, DOM0, 0, 1, MIB).unwrap();
    // The window is alive (its memory could still be written): the grants end instead.
    pool.put(g);
    assert_eq!(pool.idle_pages(), 0);
    drop(w);
    assert_eq!(host.state(domu).grants_active, 0);
}

#[test]
fn a_grant_quota_empties_the_pool_before_a_registration_fails() {
    let host = FrontendTestHost::start_with(xmx_simhv::SimhvConfig {
        max_grants: 600,
        ..Default::default()
    });
    let domu = host.create("g");
    let gt = counting(&host, domu);
    let mut pool = GrantPool::new(1000);
    let (w1, _, g1) = grant_region(&gt, &mut pool, DOM0, 0, 1, MIB).unwrap();
    let (w2, _, g2) = grant_region(&gt, &mut pool, DOM0, 0, 2, MIB).unwrap();
    drop((w1, w2));
    pool.put(g1);
    pool.put(g2);
    assert_eq!(host.state(domu).grants_active, 514);
    // 101 more exceed the 600 allowed while the pool holds 514, and 100 pages do not fit
    // the kept 256-page windows without wasting more than half.
    let (_w, _, g) = grant_region(&gt, &mut pool, DOM0, 0, 3, 100 * 4096).unwrap();
    assert_eq!(g.capacity(), 100);
    assert_eq!(pool.idle_pages(), 0);
    assert_eq!(host.state(domu).grants_active, 101);
}

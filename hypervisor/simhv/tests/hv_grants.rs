//! Grant tables on the simulated host: granting, mapping, access checks, copy.

mod hv_util;

use hv_util::{page_fill, SimHost};
use xmx_hv::sim::layout;
use xmx_hv::{CopyPtr, CopySegment, Error, Platform, DOM0, PAGE_SIZE};

fn write_pages(ptr: *mut u8, pages: usize, seed: u8) {
    for i in 0..pages {
        // SAFETY: the caller passes a writable mapping of `pages` pages.
        unsafe { std::ptr::write_bytes(ptr.add(i * PAGE_SIZE), page_fill(seed, i), PAGE_SIZE) };
    }
}

fn check_pages(ptr: *const u8, pages: usize, seed: u8) {
    for i in 0..pages {
        // SAFETY: the caller passes a readable mapping of `pages` pages.
        let page = unsafe { hv_util::bytes(ptr.add(i * PAGE_SIZE), PAGE_SIZE) };
        let want = page_fill(seed, i);
        assert!(
            page.iter().all(|b| *b == want),
            "page {i}: expected {want:#x}, first byte {:#x}",
            page[0]
        );
    }
}

#[test]
fn one_page_is_shared_both_ways_with_dom0() {
    let host = SimHost::start();
    let g = host.create("guest");
    let guest = host.attach(g);
    let dom0 = host.attach(DOM0);

    let granted = guest
        .grant_table()
        .unwrap()
        .grant_pages(DOM0, 1, true)
        .unwrap();
    assert_eq!(granted.len(), PAGE_SIZE);
    assert_eq!(granted.refs().len(), 1);
    // Fresh grants are zeroed.
    check_pages(granted.as_ptr(), 1, 0);

    let mapped = dom0
        .grant_table()
        .unwrap()
        .map(g, granted.refs(), true)
        .unwrap();
    write_pages(granted.as_ptr(), 1, 7);
    check_pages(mapped.as_ptr(), 1, 7);
    write_pages(mapped.as_ptr(), 1, 99);
    check_pages(granted.as_ptr(), 1, 99);

    let s = host.state(g);
    assert_eq!((s.grants_active, s.grants_mapped_by_others), (1, 1));
    assert_eq!(host.state(DOM0).mappings_held, 1);
    drop(mapped);
    granted.end_access().map_err(|(_, e)| e).unwrap();
    let s = host.state(g);
    assert_eq!((s.grants_active, s.mem_pages), (0, 0));
    assert_eq!(host.state(DOM0).mappings_held, 0);
}

#[test]
fn two_thousand_pages_map_in_one_batch() {
    const N: usize = 2048;
    let host = SimHost::start();
    let a = host.create("a");
    let b = host.create("b");
    let pa = host.attach(a);
    let pb = host.attach(b);

    let granted = pa.grant_table().unwrap().grant_pages(b, N, true).unwrap();
    assert_eq!(granted.refs().len(), N);
    assert_eq!(granted.len(), N * PAGE_SIZE);
    write_pages(granted.as_ptr(), N, 3);

    let mapped = pb
        .grant_table()
        .unwrap()
        .map(a, granted.refs(), true)
        .unwrap();
    assert_eq!(mapped.len(), N * PAGE_SIZE);
    assert_eq!(mapped.refs(), granted.refs());
    check_pages(mapped.as_ptr(), N, 3);
    write_pages(mapped.as_ptr(), N, 200);
    check_pages(granted.as_ptr(), N, 200);

    assert_eq!(host.state(b).mappings_held, N);
    assert_eq!(host.state(a).grants_mapped_by_others, N);
    drop(mapped);
    assert_eq!(host.state(a).grants_mapped_by_others, 0);
    granted.end_access().map_err(|(_, e)| e).unwrap();
    assert_eq!(host.state(a).mem_pages, 0);
}

#[test]
fn a_read_only_grant_refuses_a_writable_map() {
    let host = SimHost::start();
    let g = host.create("guest");
    let guest = host.attach(g);
    let dom0 = host.attach(DOM0);
    let granted = guest
        .grant_table()
        .unwrap()
        .grant_pages(DOM0, 2, false)
        .unwrap();
    write_pages(granted.as_ptr(), 2, 11);
    let gt0 = dom0.grant_table().unwrap();
    match gt0.map(g, granted.refs(), true) {
        Err(Error::Denied(_)) => {}
        other => panic!("writable map of a read-only grant: {:?}", other.err()),
    }
    assert_eq!(host.state(DOM0).mappings_held, 0);
    let ro = gt0.map(g, granted.refs(), false).unwrap();
    assert!(!ro.writable());
    check_pages(ro.as_ptr(), 2, 11);
}

#[test]
fn a_guest_cannot_map_what_was_not_granted_to_it() {
    let host = SimHost::start();
    let a = host.create("a");
    let b = host.create("b");
    let c = host.create("c");
    let (pa, pb, pc) = (host.attach(a), host.attach(b), host.attach(c));
    let gta = pa.grant_table().unwrap();
    let to_b = gta.grant_pages(b, 1, true).unwrap();
    let to_dom0 = gta.grant_pages(DOM0, 1, true).unwrap();
    let ended = gta.grant_pages(b, 1, true).unwrap();
    let ended_ref = ended.refs()[0];
    ended.end_access().map_err(|(_, e)| e).unwrap();

    let gtb = pb.grant_table().unwrap();
    let gtc = pc.grant_table().unwrap();
    let denied = |r: Result<xmx_hv::MappedPages, Error>, what: &str| match r {
        Err(Error::Denied(_)) => {}
        Err(e) => panic!("{what}: unexpected error {e}"),
        Ok(_) => panic!("{what}: mapped"),
    };
    denied(gtc.map(a, to_b.refs(), false), "another guest's ref");
    denied(gtb.map(a, to_dom0.refs(), false), "a dom0-targeted ref");
    denied(
        gtb.map(a, &[gtb.table_size() as u32 + 5], false),
        "an out-of-range ref",
    );
    denied(gtb.map(a, &[ended_ref], false), "an ended ref");
    denied(
        gtb.map(c, to_b.refs(), false),
        "the right ref of the wrong domain",
    );
    // All or nothing: one bad ref in a batch maps nothing.
    denied(
        gtb.map(a, &[to_b.refs()[0], to_dom0.refs()[0]], false),
        "a batch with one bad ref",
    );
    assert_eq!(host.state(b).mappings_held, 0);
    assert_eq!(host.state(a).grants_mapped_by_others, 0);
    // The legitimate mapping still works.
    let ok = gtb.map(a, to_b.refs(), true).unwrap();
    assert_eq!(ok.len(), PAGE_SIZE);
}

#[test]
fn end_access_is_busy_while_mapped_and_succeeds_after_unmap() {
    let host = SimHost::start();
    let g = host.create("guest");
    let guest = host.attach(g);
    let dom0 = host.attach(DOM0);
    let granted = guest
        .grant_table()
        .unwrap()
        .grant_pages(DOM0, 3, true)
        .unwrap();
    write_pages(granted.as_ptr(), 3, 5);
    let mapped = dom0
        .grant_table()
        .unwrap()
        .map(g, &granted.refs()[1..2], false)
        .unwrap();
    let granted = match granted.end_access() {
        Err((pages, Error::Busy(_))) => pages,
        Err((_, e)) => panic!("expected Busy, got {e}"),
        Ok(()) => panic!("ended access to a mapped grant"),
    };
    // Handed back unchanged: still granted, still mapped here, contents intact.
    assert_eq!(granted.refs().len(), 3);
    check_pages(granted.as_ptr(), 3, 5);
    assert_eq!(host.state(g).grants_active, 3);
    drop(mapped);
    granted.end_access().map_err(|(_, e)| e).unwrap();
    let s = host.state(g);
    assert_eq!(
        (s.grants_active, s.grants_mapped_by_others, s.mem_pages),
        (0, 0, 0)
    );
}

#[test]
fn dropping_mapped_grants_defers_the_free_until_unmap() {
    let host = SimHost::start();
    let g = host.create("guest");
    let guest = host.attach(g);
    let dom0 = host.attach(DOM0);
    let granted = guest
        .grant_table()
        .unwrap()
        .grant_pages(DOM0, 2, true)
        .unwrap();
    write_pages(granted.as_ptr(), 2, 42);
    let mapped = dom0
        .grant_table()
        .unwrap()
        .map(g, granted.refs(), false)
        .unwrap();
    drop(granted);
    let s = host.state(g);
    assert_eq!((s.grants_active, s.grants_deferred), (2, 2));
    // The remote still sees the data.
    check_pages(mapped.as_ptr(), 2, 42);
    drop(mapped);
    let s = host.state(g);
    assert_eq!((s.grants_active, s.grants_deferred, s.mem_pages), (0, 0, 0));
}

fn entry(table: &[u8], r: u32) -> (u16, u16, u32) {
    let at = r as usize * 8;
    let e = &table[at..at + 8];
    (
        u16::from_le_bytes([e[0], e[1]]),
        u16::from_le_bytes([e[2], e[3]]),
        u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
    )
}

#[test]
fn grant_table_entries_have_xen_v1_bytes() {
    const GTF_PERMIT_ACCESS: u16 = 1;
    const GTF_READONLY: u16 = 1 << 2;
    const GTF_READING: u16 = 1 << 3;
    const GTF_WRITING: u16 = 1 << 4;
    let host = SimHost::start();
    let g = host.create("guest");
    let guest = host.attach(g);
    let dom0 = host.attach(DOM0);
    let gt = guest.grant_table().unwrap();
    let rw = gt.grant_pages(DOM0, 1, true).unwrap();
    let ro = gt.grant_pages(DOM0, 1, false).unwrap();
    // SAFETY: one writable page each.
    unsafe {
        rw.as_ptr().add(123).write(0xab);
        ro.as_ptr().add(7).write(0xcd);
    }
    let table_path = layout::gnttab_file(host.path(), g);
    let mem_path = layout::mem_file(host.path(), g);
    let table = std::fs::read(&table_path).unwrap();
    assert_eq!(table.len(), gt.table_size() * 8);
    assert_eq!(gt.table_size(), 32768);

    let (flags, domid, frame_rw) = entry(&table, rw.refs()[0]);
    assert_eq!((flags, domid), (GTF_PERMIT_ACCESS, DOM0));
    let (flags, domid, frame_ro) = entry(&table, ro.refs()[0]);
    assert_eq!((flags, domid), (GTF_PERMIT_ACCESS | GTF_READONLY, DOM0));
    assert_ne!(frame_rw, frame_ro);
    // The frame field names the page of the domain's memory file that was granted.
    let mem = std::fs::read(&mem_path).unwrap();
    assert_eq!(mem[frame_rw as usize * PAGE_SIZE + 123], 0xab);
    assert_eq!(mem[frame_ro as usize * PAGE_SIZE + 7], 0xcd);

    let gt0 = dom0.grant_table().unwrap();
    let m_rw = gt0.map(g, rw.refs(), true).unwrap();
    let m_ro = gt0.map(g, ro.refs(), false).unwrap();
    let table = std::fs::read(&table_path).unwrap();
    assert_eq!(
        entry(&table, rw.refs()[0]).0,
        GTF_PERMIT_ACCESS | GTF_READING | GTF_WRITING
    );
    assert_eq!(
        entry(&table, ro.refs()[0]).0,
        GTF_PERMIT_ACCESS | GTF_READONLY | GTF_READING
    );
    drop((m_rw, m_ro));
    let table = std::fs::read(&table_path).unwrap();
    assert_eq!(entry(&table, rw.refs()[0]).0, GTF_PERMIT_ACCESS);
    let r = rw.refs()[0];
    rw.end_access().map_err(|(_, e)| e).unwrap();
    let table = std::fs::read(&table_path).unwrap();
    assert_eq!(entry(&table, r), (0, 0, 0));
}

#[test]
fn grant_copy_moves_bytes_both_ways_and_checks_each_side() {
    let host = SimHost::start();
    let g = host.create("guest");
    let other = host.create("other");
    let guest = host.attach(g);
    let dom0 = host.attach(DOM0);
    let gtg = guest.grant_table().unwrap();
    let rw = gtg.grant_pages(DOM0, 1, true).unwrap();
    let ro = gtg.grant_pages(DOM0, 1, false).unwrap();
    let to_other = gtg.grant_pages(other, 1, true).unwrap();
    // SAFETY: writable pages of ours.
    unsafe { std::ptr::copy_nonoverlapping(b"from the guest".as_ptr(), ro.as_ptr().add(100), 14) };

    let gt0 = dom0.grant_table().unwrap();
    let mut out = *b"dom0 writes this";
    let mut back = [0u8; 14];
    let mut scratch = [0u8; 8];
    let segs = [
        // dom0 -> guest page, at an offset.
        CopySegment {
            source: CopyPtr::Local(out.as_mut_ptr()),
            dest: CopyPtr::Foreign {
                domid: g,
                gref: rw.refs()[0],
                offset: 4000,
            },
            len: 16,
        },
        // guest page -> dom0 (read-only grants can be a source).
        CopySegment {
            source: CopyPtr::Foreign {
                domid: g,
                gref: ro.refs()[0],
                offset: 100,
            },
            dest: CopyPtr::Local(back.as_mut_ptr()),
            len: 14,
        },
        // A read-only grant is not a destination.
        CopySegment {
            source: CopyPtr::Local(out.as_mut_ptr()),
            dest: CopyPtr::Foreign {
                domid: g,
                gref: ro.refs()[0],
                offset: 0,
            },
            len: 4,
        },
        // A ref granted to another domain is refused.
        CopySegment {
            source: CopyPtr::Foreign {
                domid: g,
                gref: to_other.refs()[0],
                offset: 0,
            },
            dest: CopyPtr::Local(scratch.as_mut_ptr()),
            len: 8,
        },
        // Crossing the end of the page is refused.
        CopySegment {
            source: CopyPtr::Local(out.as_mut_ptr()),
            dest: CopyPtr::Foreign {
                domid: g,
                gref: rw.refs()[0],
                offset: 4090,
            },
            len: 16,
        },
    ];
    let results = gt0.copy(&segs).unwrap();
    assert!(results[0].is_ok(), "{:?}", results[0]);
    assert!(results[1].is_ok(), "{:?}", results[1]);
    assert!(
        matches!(results[2], Err(Error::Denied(_))),
        "{:?}",
        results[2]
    );
    assert!(
        matches!(results[3], Err(Error::Denied(_))),
        "{:?}",
        results[3]
    );
    assert!(
        matches!(results[4], Err(Error::Invalid(_))),
        "{:?}",
        results[4]
    );
    assert_eq!(&back, b"from the guest");
    assert_eq!(scratch, [0u8; 8]);
    // SAFETY: our own granted page.
    let page = unsafe { hv_util::bytes(rw.as_ptr(), PAGE_SIZE) };
    assert_eq!(&page[4000..4016], b"dom0 writes this");
    assert!(page[..4000].iter().all(|b| *b == 0));
    // SAFETY: our own granted page.
    let page = unsafe { hv_util::bytes(ro.as_ptr(), PAGE_SIZE) };
    assert_eq!(&page[..4], &[0, 0, 0, 0]);
}

#[test]
fn grant_quotas_are_enforced() {
    let host = SimHost::start_with(xmx_simhv::SimhvConfig {
        mem_limit: 4 * PAGE_SIZE as u64,
        max_mappings: 2,
        ..Default::default()
    });
    let g = host.create("guest");
    let guest = host.attach(g);
    let gt = guest.grant_table().unwrap();
    assert!(matches!(
        gt.grant_pages(DOM0, 5, true),
        Err(Error::Quota(_))
    ));
    let three = gt.grant_pages(DOM0, 3, true).unwrap();
    assert!(matches!(
        gt.grant_pages(DOM0, 2, true),
        Err(Error::Quota(_))
    ));
    let dom0 = host.attach(DOM0);
    let gt0 = dom0.grant_table().unwrap();
    assert!(matches!(
        gt0.map(g, three.refs(), false),
        Err(Error::Quota(_))
    ));
    let two = gt0.map(g, &three.refs()[..2], false).unwrap();
    assert_eq!(two.len(), 2 * PAGE_SIZE);
    assert!(matches!(
        gt.grant_pages(DOM0, 0, true),
        Err(Error::Invalid(_))
    ));
}

/// Role process of the next test: map the grants, mark the first page, and die.
#[test]
fn role_map_then_crash() {
    if !hv_util::is_role("role_map_then_crash") {
        return;
    }
    let platform = xmx_hv::platform::from_env().unwrap();
    let remote: u16 = hv_util::role_env("XMX_TEST_REMOTE").parse().unwrap();
    let refs: Vec<u32> = hv_util::role_env("XMX_TEST_REFS")
        .split(',')
        .map(|r| r.parse().unwrap())
        .collect();
    let m = platform
        .grant_table()
        .unwrap()
        .map(remote, &refs, true)
        .unwrap();
    // SAFETY: a writable mapping of at least one page.
    unsafe { m.as_ptr().write_volatile(0x5a) };
    // Die without unmapping or closing anything: the kernel closes the socket.
    std::process::abort();
}

#[test]
fn a_mapper_that_crashes_releases_its_mappings() {
    let host = SimHost::start();
    let a = host.create("a");
    let b = host.create("b");
    let pa = host.attach(a);
    let granted = pa.grant_table().unwrap().grant_pages(b, 4, true).unwrap();
    let refs: Vec<String> = granted.refs().iter().map(|r| r.to_string()).collect();
    let status = hv_util::spawn_role(
        "role_map_then_crash",
        &host,
        b,
        &[
            ("XMX_TEST_REMOTE", a.to_string()),
            ("XMX_TEST_REFS", refs.join(",")),
        ],
    )
    .wait()
    .unwrap();
    assert!(!status.success(), "the role process must have aborted");
    // SAFETY: our own granted page.
    assert_eq!(unsafe { granted.as_ptr().read_volatile() }, 0x5a);
    host.settle(a, |s| s.grants_mapped_by_others == 0);
    assert_eq!(host.state(b).mappings_held, 0);
    assert_eq!(host.state(b).hv_connections, 0);
    granted.end_access().map_err(|(_, e)| e).unwrap();
}

/// Not a check: prints what granting and mapping 2048 pages in one batch costs.
/// Run with `--ignored`.
#[test]
#[ignore]
fn measure_grant_and_map_2048_pages() {
    use std::time::Instant;
    let host = SimHost::start();
    let a = host.create("a");
    let b = host.create("b");
    let gta = host.attach(a).grant_table().unwrap();
    let gtb = host.attach(b).grant_table().unwrap();
    for round in 0..3 {
        let t = Instant::now();
        let g = gta.grant_pages(b, 2048, true).unwrap();
        let granted = t.elapsed();
        let t = Instant::now();
        let m = gtb.map(a, g.refs(), true).unwrap();
        let mapped = t.elapsed();
        let t = Instant::now();
        drop(m);
        g.end_access().map_err(|(_, e)| e).unwrap();
        let released = t.elapsed();
        println!(
            "round {round}: grant 2048 pages {granted:?}, map {mapped:?}, unmap+end {released:?}"
        );
    }
}

fn check_zero(ptr: *const u8, pages: usize) {
    // SAFETY: the caller passes a readable mapping of `pages` pages.
    let bytes = unsafe { hv_util::bytes(ptr, pages * PAGE_SIZE) };
    assert!(
        bytes.iter().all(|b| *b == 0),
        "stale bytes in a fresh grant"
    );
}

/// Freed frames are zeroed in place and handed out again (lowest first): what one domain was
/// shown of a guest's memory never reaches the next domain the guest grants the same frames
/// to, whether the first ended its access at once or kept the pages mapped past the end.
#[test]
fn frames_freed_by_one_grantee_read_zero_when_granted_to_another_domain() {
    let host = SimHost::start();
    let g = host.create("guest");
    let b = host.create("b");
    let c = host.create("c");
    let gt = host.attach(g).grant_table().unwrap();
    let frames_of = |refs: &[u32]| -> Vec<u32> {
        let table = std::fs::read(layout::gnttab_file(host.path(), g)).unwrap();
        refs.iter().map(|&r| entry(&table, r).2).collect()
    };

    // To b, unmapped before the grants end.
    let to_b = gt.grant_pages(b, 3, true).unwrap();
    let frames = frames_of(to_b.refs());
    write_pages(to_b.as_ptr(), 3, 11);
    let in_b = host.attach(b).grant_table().unwrap();
    let seen = in_b.map(g, to_b.refs(), false).unwrap();
    check_pages(seen.as_ptr(), 3, 11);
    drop(seen);
    to_b.end_access().map_err(|(_, e)| e).unwrap();
    assert_eq!(host.state(g).mem_pages, 0);

    // The same frames to c: zero.
    let to_c = gt.grant_pages(c, 3, true).unwrap();
    assert_eq!(frames_of(to_c.refs()), frames);
    let in_c = host.attach(c).grant_table().unwrap();
    let seen = in_c.map(g, to_c.refs(), true).unwrap();
    check_zero(seen.as_ptr(), 3);
    // c writes while it maps, and keeps the mapping past the end of the grants: the frames
    // are freed only when it unmaps, and zeroed before b is granted them.
    write_pages(seen.as_ptr(), 3, 23);
    drop(to_c);
    assert_eq!(host.state(g).grants_deferred, 3);
    drop(seen);
    let to_b = gt.grant_pages(b, 3, true).unwrap();
    assert_eq!(frames_of(to_b.refs()), frames);
    let seen = in_b.map(g, to_b.refs(), false).unwrap();
    check_zero(seen.as_ptr(), 3);
    check_zero(to_b.as_ptr(), 3);
}

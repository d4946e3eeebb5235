//! Migrating a domain between two simulated hosts: its memory and grant table move, the
//! source domain goes, failures roll back.

mod hv_util;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hv_util::{page_fill, SimHost};
use xmx_hv::sim::admin::RunState;
use xmx_hv::sim::layout;
use xmx_hv::sim::migrate::{migrate_domain, MigrateOptions, Migration};
use xmx_hv::sim::SimPlatform;
use xmx_hv::{DomId, Error, GrantRef, GrantedPages, Platform, DOM0, PAGE_SIZE, XBT_NULL};
use xmx_simhv::SimhvConfig;

const GTF_PERMIT_ACCESS: u16 = 1;
const GTF_READONLY: u16 = 1 << 2;

fn fill(g: &GrantedPages, page: usize, seed: u8) {
    assert!(page < g.len() / PAGE_SIZE);
    // SAFETY: `page` lies inside the writable mapping of `g`.
    unsafe {
        std::ptr::write_bytes(
            g.as_ptr().add(page * PAGE_SIZE),
            page_fill(seed, page),
            PAGE_SIZE,
        )
    };
}

fn fill_all(g: &GrantedPages, seed: u8) {
    for p in 0..g.len() / PAGE_SIZE {
        fill(g, p, seed);
    }
}

/// Grant entries of a domain as its `gnttab` file holds them: ref -> (flags, domid, frame).
fn entries(dir: &Path, domid: DomId) -> BTreeMap<GrantRef, (u16, u16, u32)> {
    let bytes = std::fs::read(layout::gnttab_file(dir, domid)).unwrap();
    bytes
        .chunks_exact(8)
        .enumerate()
        .filter_map(|(r, e)| {
            let flags = u16::from_le_bytes([e[0], e[1]]);
            let domid = u16::from_le_bytes([e[2], e[3]]);
            let frame = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
            (flags != 0).then_some((r as GrantRef, (flags, domid, frame)))
        })
        .collect()
}

/// One frame of a domain's memory file.
fn frame(dir: &Path, domid: DomId, f: u32) -> Vec<u8> {
    let mem = std::fs::read(layout::mem_file(dir, domid)).unwrap();
    let at = f as usize * PAGE_SIZE;
    if at >= mem.len() {
        return vec![0; PAGE_SIZE];
    }
    mem[at..at + PAGE_SIZE].to_vec()
}

fn is_pattern(page: &[u8], seed: u8, i: usize) -> bool {
    page.iter().all(|b| *b == page_fill(seed, i))
}

fn names(host: &SimHost) -> Vec<(DomId, String, RunState)> {
    host.admin
        .list()
        .unwrap()
        .into_iter()
        .map(|d| (d.domid, d.name, d.state))
        .collect()
}

#[test]
fn a_domain_moves_with_its_memory_and_grants_and_leaves_nothing_behind() {
    const LIMIT: u64 = 64 << 20;
    let src = SimHost::start_with(SimhvConfig {
        mem_limit: LIMIT,
        ..SimhvConfig::default()
    });
    let dst = SimHost::start();
    // So that the domain gets another domid at the destination.
    dst.create("other");
    let work = tempfile::tempdir().unwrap();

    let g = src.create("guest");
    let guest = src.attach(g);
    let gt = guest.grant_table().unwrap();
    let a = gt.grant_pages(DOM0, 2, true).unwrap();
    let b = gt.grant_pages(DOM0, 8, true).unwrap();
    let c = gt.grant_pages(DOM0, 2, false).unwrap();
    let d = gt.grant_pages(DOM0, 1, true).unwrap();
    fill_all(&a, 1);
    fill_all(&b, 2);
    fill_all(&c, 3);
    fill_all(&d, 4);
    // `d` is ended while dom0 maps it: a deferred grant, which dies with the source.
    let src_dom0 = src.attach(DOM0);
    let d_mapped = src_dom0
        .grant_table()
        .unwrap()
        .map(g, d.refs(), true)
        .unwrap();
    let d_ref = d.refs()[0];
    drop(d);
    // `a` is ended: its frames and refs become free, a gap below the others.
    let a_refs = a.refs().to_vec();
    a.end_access().map_err(|(_, e)| e).unwrap();
    let before = entries(src.path(), g);
    assert_eq!(before.len(), 11);
    let d_frame = before[&d_ref].2;
    let s = src.state(g);
    assert_eq!((s.grants_active, s.grants_deferred), (11, 1));

    let mut m = Migration::begin(&src.admin, &dst.admin, g, Some(work.path())).unwrap();
    let incoming = m.incoming_domid();
    assert_ne!(incoming, g);
    assert!(names(&dst).contains(&(incoming, "guest--incoming".into(), RunState::Suspended)));
    // An incoming domain cannot run before its last round.
    assert!(matches!(dst.admin.resume(incoming), Err(Error::Invalid(_))));

    let r1 = m.live_round().unwrap();
    // Every non-zero frame: b's 8, c's 2 and the deferred grant's 1 (a's were zeroed).
    assert_eq!((r1.round, r1.live, r1.frames_sent), (1, true, 11));
    assert_eq!(r1.bytes as usize, 8 + 16 + 11 * (8 + 4 + PAGE_SIZE) + 8);

    // Written while the domain runs, after the first round.
    fill(&b, 3, 7);
    let r2 = m.live_round().unwrap();
    assert_eq!((r2.round, r2.live, r2.frames_sent), (2, true, 1));
    // Written after the last live round: only the last round can carry it.
    fill(&b, 5, 8);
    let report = m.finish().unwrap();
    let last = report.rounds.last().unwrap();
    assert_eq!(
        (last.round, last.live, last.frames_sent, last.grants),
        (3, false, 1, 10)
    );
    assert_eq!(report.rounds.len(), 3);
    assert_eq!((report.source_domid, report.dest_domid), (g, incoming));
    assert!(report.downtime <= report.total);
    assert_eq!(
        report.bytes(),
        report.rounds.iter().map(|r| r.bytes).sum::<u64>()
    );

    // The destination: the domain under its name, running, no incoming domain left.
    let dst_names = names(&dst);
    assert!(dst_names.contains(&(incoming, "guest".into(), RunState::Running)));
    assert!(!dst_names.iter().any(|(_, n, _)| n.ends_with("--incoming")));
    let s = dst.state(incoming);
    assert_eq!(
        (s.grants_active, s.grants_deferred, s.mem_pages, s.mem_limit),
        (10, 0, 10, LIMIT)
    );
    // Same refs, same frames, same granted-to domid; read-only stays read-only.
    let after = entries(dst.path(), incoming);
    let mut expected = before.clone();
    expected.remove(&d_ref);
    for (flags, _, _) in expected.values_mut() {
        *flags &= GTF_PERMIT_ACCESS | GTF_READONLY;
    }
    assert_eq!(after, expected);
    for r in c.refs() {
        assert_eq!(after[r].0, GTF_PERMIT_ACCESS | GTF_READONLY);
    }
    // The bytes, at the same frames.
    for (i, r) in b.refs().iter().enumerate() {
        let seed = match i {
            3 => 7,
            5 => 8,
            _ => 2,
        };
        let f = frame(dst.path(), incoming, before[r].2);
        assert!(
            is_pattern(&f, seed, i),
            "b page {i} (frame {})",
            before[r].2
        );
    }
    for (i, r) in c.refs().iter().enumerate() {
        assert!(is_pattern(&frame(dst.path(), incoming, before[r].2), 3, i));
    }
    // The deferred grant's frame was copied by the live rounds but is free here: zeroed.
    assert!(frame(dst.path(), incoming, d_frame).iter().all(|x| *x == 0));

    // dom0 of the destination maps the same refs and sees the same data.
    let dst_dom0 = dst.attach(DOM0);
    let gt0 = dst_dom0.grant_table().unwrap();
    let mb = gt0.map(incoming, b.refs(), true).unwrap();
    for i in 0..8 {
        let seed = match i {
            3 => 7,
            5 => 8,
            _ => 2,
        };
        // SAFETY: page i lies inside the mapping of 8 pages.
        let page = unsafe { hv_util::bytes(mb.as_ptr().add(i * PAGE_SIZE), PAGE_SIZE) };
        assert!(is_pattern(page, seed, i), "mapped page {i}");
    }
    assert!(matches!(
        gt0.map(incoming, c.refs(), true),
        Err(Error::Denied(_))
    ));
    let mc = gt0.map(incoming, c.refs(), false).unwrap();
    // SAFETY: the mapping holds 2 pages.
    let page = unsafe { hv_util::bytes(mc.as_ptr().add(PAGE_SIZE), PAGE_SIZE) };
    assert!(is_pattern(page, 3, 1));
    assert_eq!(dst.state(incoming).grants_mapped_by_others, 10);

    // The restored allocators: new grants take the free refs and frames, zeroed.
    let moved = dst.attach(incoming);
    let fresh = moved
        .grant_table()
        .unwrap()
        .grant_pages(DOM0, 3, true)
        .unwrap();
    let mut want_refs = a_refs.clone();
    want_refs.push(d_ref);
    assert_eq!(fresh.refs(), &want_refs[..]);
    let now = entries(dst.path(), incoming);
    let fresh_frames: Vec<u32> = fresh.refs().iter().map(|r| now[r].2).collect();
    assert_eq!(fresh_frames, vec![0, 1, d_frame]);
    // SAFETY: the grant holds 3 pages.
    let all = unsafe { hv_util::bytes(fresh.as_ptr(), 3 * PAGE_SIZE) };
    assert!(all.iter().all(|x| *x == 0));

    // The source: the domain is gone, nothing of it left.
    assert_eq!(
        names(&src),
        vec![(DOM0, "Domain-0".into(), RunState::Running)]
    );
    assert!(matches!(src.admin.state(g), Err(Error::NotFound(_))));
    assert!(!layout::dom_dir(src.path(), g).exists());
    assert_eq!(src.state(DOM0).mappings_held, 0);
    drop(d_mapped);
    assert_eq!(std::fs::read_dir(work.path()).unwrap().count(), 0);
}

#[test]
fn migrate_domain_runs_the_rounds_and_cleans_up() {
    let src = SimHost::start();
    let dst = SimHost::start();
    let work = tempfile::tempdir().unwrap();
    let g = src.create("small");
    let guest = src.attach(g);
    let pages = guest
        .grant_table()
        .unwrap()
        .grant_pages(DOM0, 4, true)
        .unwrap();
    fill_all(&pages, 5);
    let refs = pages.refs().to_vec();
    let options = MigrateOptions {
        work_dir: Some(work.path().to_path_buf()),
        ..MigrateOptions::default()
    };
    let report = migrate_domain(&src.admin, &dst.admin, g, &options).unwrap();
    // Four frames converge at once: one live round, then the last.
    let sent: Vec<(bool, u32)> = report
        .rounds
        .iter()
        .map(|r| (r.live, r.frames_sent))
        .collect();
    assert_eq!(sent, vec![(true, 4), (false, 0)]);
    assert_eq!(report.name, "small");
    let d = report.dest_domid;
    assert_eq!(
        names(&dst),
        vec![
            (DOM0, "Domain-0".into(), RunState::Running),
            (d, "small".into(), RunState::Running)
        ]
    );
    let mapped = dst
        .attach(DOM0)
        .grant_table()
        .unwrap()
        .map(d, &refs, false)
        .unwrap();
    // SAFETY: the mapping holds 4 pages.
    let all = unsafe { hv_util::bytes(mapped.as_ptr(), 4 * PAGE_SIZE) };
    for i in 0..4 {
        assert!(is_pattern(&all[i * PAGE_SIZE..][..PAGE_SIZE], 5, i));
    }
    // The destination's xenstore knows the domain by its name.
    let xs = dst.attach(DOM0).xenstore().unwrap();
    assert_eq!(
        xs.read(xmx_hv::XBT_NULL, &format!("/local/domain/{d}/name"))
            .unwrap(),
        b"small"
    );
    assert_eq!(names(&src).len(), 1);
    assert_eq!(std::fs::read_dir(work.path()).unwrap().count(), 0);
}

#[test]
fn migrations_that_cannot_happen_are_refused_and_change_nothing() {
    let src = SimHost::start();
    let dst = SimHost::start();
    let work = tempfile::tempdir().unwrap();
    let options = MigrateOptions {
        work_dir: Some(work.path().to_path_buf()),
        ..MigrateOptions::default()
    };
    match migrate_domain(&src.admin, &dst.admin, 42, &options) {
        Err(Error::NotFound(_)) => {}
        other => panic!("migrating a missing domain: {other:?}"),
    }
    match migrate_domain(&src.admin, &dst.admin, DOM0, &options) {
        Err(Error::Invalid(_)) => {}
        other => panic!("migrating dom0: {other:?}"),
    }
    let g = src.create("guest");
    for clash in ["guest", "guest--incoming"] {
        let other = dst.create(clash);
        match migrate_domain(&src.admin, &dst.admin, g, &options) {
            Err(Error::Exists(m)) => assert!(m.contains(clash), "{m}"),
            other => panic!("name clash with {clash}: {other:?}"),
        }
        assert_eq!(names(&dst).len(), 2);
        dst.admin.destroy(other).unwrap();
    }
    // The source domain runs on, and can still be sent.
    assert_eq!(src.state(g).state, RunState::Running);
    src.admin.save_begin(g).unwrap();
    assert!(matches!(src.admin.save_begin(g), Err(Error::Busy(_))));
    src.admin.save_end(g).unwrap();
    assert_eq!(std::fs::read_dir(work.path()).unwrap().count(), 0);
}

#[test]
fn a_failed_last_round_rolls_back_to_the_running_source() {
    let src = SimHost::start();
    // Its grant table is too small for the guest's refs.
    let dst = SimHost::start_with(SimhvConfig {
        gnttab_entries: 10,
        ..SimhvConfig::default()
    });
    let g = src.create("guest");
    let guest = src.attach(g);
    let pages = guest
        .grant_table()
        .unwrap()
        .grant_pages(DOM0, 4, true)
        .unwrap();
    fill_all(&pages, 6);
    let work = tempfile::tempdir().unwrap();
    let options = MigrateOptions {
        work_dir: Some(work.path().to_path_buf()),
        ..MigrateOptions::default()
    };
    match migrate_domain(&src.admin, &dst.admin, g, &options) {
        Err(Error::Invalid(m)) => assert!(m.contains("outside the table"), "{m}"),
        other => panic!("restoring refs beyond the table: {other:?}"),
    }
    assert_eq!(names(&dst).len(), 1);
    let s = src.state(g);
    assert_eq!((s.state, s.grants_active), (RunState::Running, 4));
    // Resumed: it grants again, and its pages are untouched.
    let more = guest
        .grant_table()
        .unwrap()
        .grant_pages(DOM0, 1, true)
        .unwrap();
    assert_eq!(more.refs().len(), 1);
    // SAFETY: the grant holds 4 pages.
    let all = unsafe { hv_util::bytes(pages.as_ptr(), 4 * PAGE_SIZE) };
    assert!(is_pattern(&all[3 * PAGE_SIZE..], 6, 3));
    assert_eq!(std::fs::read_dir(work.path()).unwrap().count(), 0);
}

#[test]
fn the_admin_operations_refuse_what_makes_no_sense() {
    let src = SimHost::start();
    let work = tempfile::tempdir().unwrap();
    let g = src.create("guest");
    let stream = work.path().join("s");
    let invalid = |r: xmx_hv::Result<_>, what: &str| match r {
        Err(Error::Invalid(_)) => {}
        other => panic!("{what}: {:?}", other.map(|_: ()| ())),
    };
    invalid(
        src.admin.save(g, &stream, false).map(|_| ()),
        "save before save_begin",
    );
    invalid(src.admin.save_end(g), "save_end before save_begin");
    src.admin.save_begin(g).unwrap();
    invalid(
        src.admin.save(g, &stream, true).map(|_| ()),
        "a last round of a running domain",
    );
    invalid(
        src.admin.save(g, Path::new("relative"), false).map(|_| ()),
        "a relative stream path",
    );
    src.admin.save(g, &stream, false).unwrap();
    // An existing file is never overwritten.
    assert!(matches!(
        src.admin.save(g, &stream, false),
        Err(Error::Exists(_))
    ));
    // A failed round ended the sending.
    invalid(
        src.admin.save(g, &work.path().join("t"), false).map(|_| ()),
        "save after a failed round",
    );

    // Restoring: only into an incoming domain, only whole streams.
    invalid(
        src.admin.restore(g, &stream).map(|_| ()),
        "restore into a running domain",
    );
    let inc = src.admin.create_incoming("in", 1 << 20).unwrap();
    assert_eq!(src.state(inc).state, RunState::Suspended);
    let bytes = std::fs::read(&stream).unwrap();
    let cut = work.path().join("cut");
    std::fs::write(&cut, &bytes[..bytes.len() - 1]).unwrap();
    invalid(
        src.admin.restore(inc, &cut).map(|_| ()),
        "a stream cut short",
    );
    let garbage = work.path().join("garbage");
    std::fs::write(&garbage, b"not a stream at all").unwrap();
    invalid(src.admin.restore(inc, &garbage).map(|_| ()), "garbage");
    assert!(matches!(
        src.admin.restore(inc, &work.path().join("missing")),
        Err(Error::Io(_))
    ));
    let r = src.admin.restore(inc, &stream).unwrap();
    assert!(!r.complete);
    invalid(src.admin.resume(inc), "resuming before the last round");
    // Renames keep names unique; dom0 keeps its name.
    assert!(matches!(
        src.admin.rename(inc, "guest"),
        Err(Error::Exists(_))
    ));
    invalid(src.admin.rename(DOM0, "x"), "renaming dom0");
    invalid(src.admin.rename(inc, "a b"), "a bad name");
    src.admin.rename(inc, "in2").unwrap();
    assert_eq!(src.state(inc).name, "in2");
    src.admin.destroy(inc).unwrap();
    assert!(matches!(
        src.admin.restore(inc, &stream),
        Err(Error::NotFound(_))
    ));
}

#[test]
fn a_process_of_the_moved_domain_adopts_its_restored_grants() {
    let src = SimHost::start();
    let dst = SimHost::start();
    let work = tempfile::tempdir().unwrap();
    let g = src.create("guest");
    let gt = src.attach(g).grant_table().unwrap();
    let rw = gt.grant_pages(DOM0, 3, true).unwrap();
    let ro = gt.grant_pages(DOM0, 1, false).unwrap();
    fill_all(&rw, 9);
    fill_all(&ro, 10);
    let options = MigrateOptions {
        work_dir: Some(work.path().to_path_buf()),
        ..MigrateOptions::default()
    };
    let d = migrate_domain(&src.admin, &dst.admin, g, &options)
        .unwrap()
        .dest_domid;

    let moved = dst.attach(d).sim_grant_table().unwrap();
    let other = dst.attach(d).sim_grant_table().unwrap();
    // The claim must match the grants: grantee and access.
    assert!(matches!(
        moved.adopt(1, rw.refs(), true),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        moved.adopt(DOM0, ro.refs(), true),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        moved.adopt(DOM0, &[8, 8], true),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        moved.adopt(DOM0, &[500], true),
        Err(Error::NotFound(_))
    ));
    let mine = moved.adopt(DOM0, rw.refs(), true).unwrap();
    assert_eq!(mine.refs(), rw.refs());
    // SAFETY: the adopted grants hold 3 pages.
    let all = unsafe { hv_util::bytes(mine.as_ptr(), 3 * PAGE_SIZE) };
    for i in 0..3 {
        assert!(is_pattern(&all[i * PAGE_SIZE..][..PAGE_SIZE], 9, i));
    }
    // Once only, all or nothing.
    assert!(matches!(
        other.adopt(DOM0, rw.refs(), true),
        Err(Error::NotFound(_))
    ));
    let mut both = ro.refs().to_vec();
    both.push(rw.refs()[0]);
    assert!(matches!(
        other.adopt(DOM0, &both, false),
        Err(Error::NotFound(_))
    ));
    let theirs = other.adopt(DOM0, ro.refs(), false).unwrap();
    assert!(!theirs.writable());

    // Adopted grants are the adopter's: mapped ones refuse to end, then end.
    let dom0 = dst.attach(DOM0);
    let mapped = dom0
        .grant_table()
        .unwrap()
        .map(d, mine.refs(), true)
        .unwrap();
    let mine = match mine.end_access() {
        Err((back, Error::Busy(_))) => back,
        other => panic!("ending mapped grants: {:?}", other.err().map(|(_, e)| e)),
    };
    drop(mapped);
    mine.end_access().map_err(|(_, e)| e).unwrap();
    assert_eq!((dst.state(d).grants_active, dst.state(d).mem_pages), (1, 1));
    // Dropped, as any grant of the handle.
    drop(theirs);
    let s = dst.state(d);
    assert_eq!((s.grants_active, s.mem_pages), (0, 0));
}

/// How long the writer role runs at most (it is killed long before).
const WRITER_LIFETIME: Duration = Duration::from_secs(60);

/// Role: a process of the domain that grants one page to dom0, prints its ref and
/// address, and then writes an ever-increasing counter into it as fast as it can. With
/// `XMX_TEST_FOLLOW=1` it also checks about every millisecond whether the domain moved,
/// follows it, and prints the page's address again.
#[test]
fn role_memory_writer() {
    if !hv_util::is_role("role_memory_writer") {
        return;
    }
    let follow = std::env::var("XMX_TEST_FOLLOW").is_ok_and(|v| v == "1");
    let platform = xmx_hv::platform::from_env().unwrap();
    let page = platform
        .grant_table()
        .unwrap()
        .grant_pages(DOM0, 1, true)
        .unwrap();
    // A following writer writes through a second mapping of the page, imported as an
    // application imports what its guest daemon hands it: both must follow the domain.
    let imported = follow.then(|| page.export().unwrap().import().unwrap());
    let at = imported.as_ref().map_or(page.as_ptr(), |i| i.as_ptr());
    println!("ref {} at {:p}", page.refs()[0], at);
    // SAFETY: the page is mapped writable and 8-byte aligned (page aligned) for as long
    // as `page` and `imported` live; AtomicU64 has u64's layout.
    let counter = unsafe { &*(at as *const AtomicU64) };
    let started = Instant::now();
    let mut checked = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < WRITER_LIFETIME {
        for _ in 0..4096 {
            n += 1;
            counter.store(n, Ordering::Release);
        }
        if follow && checked.elapsed() >= Duration::from_millis(1) {
            checked = Instant::now();
            if platform.follow_move().unwrap() {
                println!("moved to domain {} at {:p}", platform.domid(), at);
            }
        }
    }
}

/// The writer's counter as seen through a mapping of its page.
fn counter(mapped: &xmx_hv::MappedPages) -> u64 {
    // SAFETY: the mapping holds one page, page aligned.
    let c = unsafe { &*(mapped.as_ptr() as *const AtomicU64) };
    c.load(Ordering::Acquire)
}

/// Wait (bounded) until the writer's counter moves past `from`.
fn counter_moves(mapped: &xmx_hv::MappedPages, from: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = counter(mapped);
        if now != from {
            return now;
        }
        assert!(Instant::now() < deadline, "the writer does not write");
        std::thread::yield_now();
    }
}

struct Writer {
    child: std::process::Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    gref: GrantRef,
    addr: String,
}

impl Writer {
    fn start(host: &SimHost, domid: DomId) -> Writer {
        Self::start_with(host, domid, false)
    }

    fn start_with(host: &SimHost, domid: DomId, follow: bool) -> Writer {
        let follow = [("XMX_TEST_FOLLOW", u8::from(follow).to_string())];
        let mut child = hv_util::spawn_role("role_memory_writer", host, domid, &follow);
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let said = Self::next_said(&mut lines, "ref ");
        let (gref, addr) = said.split_once(" at ").unwrap();
        Writer {
            child,
            lines,
            gref: gref.parse().unwrap(),
            addr: addr.to_string(),
        }
    }

    /// What the writer said after `prefix` on its next line saying it.
    fn next_said(
        lines: &mut std::io::Lines<BufReader<std::process::ChildStdout>>,
        prefix: &str,
    ) -> String {
        loop {
            let line = lines.next().expect("the writer ended early").unwrap();
            // libtest prints "test NAME ... " before the role's own output on the line.
            if let Some(at) = line.find(prefix) {
                return line[at + prefix.len()..].trim().to_string();
            }
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_last_round_has_every_write_because_the_processes_are_frozen() {
    let src = SimHost::start();
    let dst = SimHost::start();
    let work = tempfile::tempdir().unwrap();
    let g = src.create("guest");
    let writer = Writer::start(&src, g);
    let on_src = src
        .attach(DOM0)
        .grant_table()
        .unwrap()
        .map(g, &[writer.gref], false)
        .unwrap();
    counter_moves(&on_src, 0);
    // The writer is the domain's process; dom0's (this one, mapping the page) is not.
    assert_eq!(src.admin.processes(g).unwrap(), vec![writer.pid()]);
    assert!(matches!(src.admin.processes(DOM0), Err(Error::Invalid(_))));
    assert!(matches!(src.admin.processes(77), Err(Error::NotFound(_))));

    let mut m = Migration::begin(&src.admin, &dst.admin, g, Some(work.path())).unwrap();
    m.live_round().unwrap();
    let (report, frozen) = m.finish_frozen().unwrap();
    assert_eq!(frozen.pids(), &[writer.pid()]);
    assert!(xmx_hv::sim::freeze::is_stopped(writer.pid()));
    // What the writer wrote last (into the source's memory, which the mapping keeps) is
    // what the destination got.
    let on_dst = dst
        .attach(DOM0)
        .grant_table()
        .unwrap()
        .map(report.dest_domid, &[writer.gref], false)
        .unwrap();
    let last = counter(&on_src);
    assert_ne!(last, 0);
    assert_eq!(counter(&on_dst), last);
    frozen.thaw();
    // Thawed, it writes on (into the memory it still maps: it has not followed the move).
    counter_moves(&on_src, last);
}

#[test]
fn a_rolled_back_migration_thaws_the_processes() {
    let src = SimHost::start();
    let dst = SimHost::start_with(SimhvConfig {
        gnttab_entries: 8,
        ..SimhvConfig::default()
    });
    let work = tempfile::tempdir().unwrap();
    let g = src.create("guest");
    let writer = Writer::start(&src, g);
    let on_src = src
        .attach(DOM0)
        .grant_table()
        .unwrap()
        .map(g, &[writer.gref], false)
        .unwrap();
    let options = MigrateOptions {
        work_dir: Some(work.path().to_path_buf()),
        ..MigrateOptions::default()
    };
    match migrate_domain(&src.admin, &dst.admin, g, &options) {
        Err(Error::Invalid(m)) => assert!(m.contains("outside the table"), "{m}"),
        other => panic!("restoring refs beyond the table: {other:?}"),
    }
    assert_eq!(src.state(g).state, RunState::Running);
    assert!(!xmx_hv::sim::freeze::is_stopped(writer.pid()));
    let now = counter(&on_src);
    counter_moves(&on_src, now);
}

#[test]
fn a_process_follows_its_domain_and_writes_on_at_the_same_address() {
    let src = SimHost::start();
    let dst = SimHost::start();
    dst.create("other");
    let work = tempfile::tempdir().unwrap();
    let g = src.create("guest");
    let mut writer = Writer::start_with(&src, g, true);
    let on_src = src
        .attach(DOM0)
        .grant_table()
        .unwrap()
        .map(g, &[writer.gref], false)
        .unwrap();
    counter_moves(&on_src, 0);
    let options = MigrateOptions {
        work_dir: Some(work.path().to_path_buf()),
        ..MigrateOptions::default()
    };
    let report = migrate_domain(&src.admin, &dst.admin, g, &options).unwrap();
    let d = report.dest_domid;
    assert_ne!(d, g);
    let moved = Writer::next_said(&mut writer.lines, "moved to domain ");
    assert_eq!(moved, format!("{d} at {}", writer.addr));
    // It writes into the destination's memory now, through the same pointer.
    let on_dst = dst
        .attach(DOM0)
        .grant_table()
        .unwrap()
        .map(d, &[writer.gref], false)
        .unwrap();
    let then = counter(&on_dst);
    assert_ne!(then, 0);
    counter_moves(&on_dst, then);
    // The grant is the writer's own again: it ends when the writer goes.
    drop(on_dst);
    let s = dst.state(d);
    assert_eq!((s.grants_active, s.hv_connections), (1, 1));
    drop(writer);
    dst.settle(d, |s| s.grants_active == 0 && s.mem_pages == 0);
}

#[test]
fn a_new_domain_with_a_moved_domains_id_does_not_inherit_its_forwarding_record() {
    let src = SimHost::start();
    let dst = SimHost::start();
    let work = tempfile::tempdir().unwrap();
    let g = src.create("guest");
    let options = MigrateOptions {
        work_dir: Some(work.path().to_path_buf()),
        ..MigrateOptions::default()
    };
    let report = migrate_domain(&src.admin, &dst.admin, g, &options).unwrap();
    let record = xmx_hv::sim::migrate::Forwarding::read(src.path(), g)
        .unwrap()
        .expect("the forwarding record");
    assert_eq!(record.domid, report.dest_domid);
    assert_eq!(record.dir, std::path::absolute(dst.path()).unwrap());
    // A process of the new domain with the same id stays where it is.
    let again = src.admin.create("newcomer", Some(g)).unwrap();
    assert_eq!(again, g);
    assert_eq!(
        xmx_hv::sim::migrate::Forwarding::read(src.path(), g).unwrap(),
        None
    );
    let p = src.attach(g);
    assert!(!p.follow_move().unwrap());
    assert_eq!(p.domid(), g);
}

#[test]
fn a_process_started_after_its_domain_moved_attaches_where_it_went() {
    let a = SimHost::start();
    let b = SimHost::start();
    let work = tempfile::tempdir().unwrap();
    let options = MigrateOptions {
        work_dir: Some(work.path().to_path_buf()),
        ..MigrateOptions::default()
    };
    let g = a.create("guest");
    let there = migrate_domain(&a.admin, &b.admin, g, &options)
        .unwrap()
        .dest_domid;
    // As a guest daemon restarted from its old environment would.
    let p = SimPlatform::attach(a.path(), g).unwrap();
    assert_eq!(p.domid(), there);
    assert_eq!(p.dir(), std::path::absolute(b.path()).unwrap());
    // Its xenstore is the destination's: the domain's own home there is readable.
    let xs = p.xenstore().unwrap();
    assert_eq!(
        xs.read(XBT_NULL, &format!("/local/domain/{there}/name"))
            .unwrap(),
        b"guest"
    );
    drop(p);
    // Back again: two records in a row lead to the domain's third incarnation.
    let back = migrate_domain(&b.admin, &a.admin, there, &options)
        .unwrap()
        .dest_domid;
    let p = SimPlatform::attach(a.path(), g).unwrap();
    assert_eq!(
        (p.dir(), p.domid()),
        (std::path::absolute(a.path()).unwrap(), back)
    );
    drop(p);
    // Destroyed where it is now: nothing to attach to, said as such.
    a.admin.destroy(back).unwrap();
    match SimPlatform::attach(a.path(), g) {
        Err(Error::NotFound(m)) => assert!(m.contains(&format!("domain {back}")), "{m}"),
        Ok(p) => panic!("attached to domain {} of a destroyed chain", p.domid()),
        Err(e) => panic!("{e}"),
    }
}

//! The isolation matrix on a simulated 2-host cluster of 2 guests per host:
//! every guest sends to every other through libmyriexpress over the xen
//! transport. Inside a virtual cluster every message arrives, every byte
//! checked; across clusters MX refuses the connection (not a hang) and
//! nothing arrives. The matrix runs
//!
//! 1. once dom0 has put h0/g0, h0/g1 and h1/g0 in `blue` and h1/g1 in `red`
//!    (live moves: the guests' devices are re-attached under them);
//! 2. after h1/g0 was destroyed (nothing of it left in its host's simulated
//!    hypervisor) and created again, with the same MAC;
//! 3. after h0/g1 moved to `red`: the matrix flips for it.
//!
//! Needs root (namespaces, veths, AF_PACKET); skipped with the reason
//! otherwise.

use std::time::{Duration, Instant};

use xmx_hv::{Xenstore, DOM0, XBT_NULL};
use xmx_tests::cluster::{exclusive, skipped, SimCluster};
use xmx_tests::cprog;
use xmx_tests::matrix::{self, Assignment};

/// How long the backend may take to let go of a destroyed guest.
const RELEASE: Duration = Duration::from_secs(30);

fn exists(xs: &dyn Xenstore, path: &str) -> bool {
    xs.read(XBT_NULL, path).is_ok()
}

#[test]
fn isolation_matrix_across_destroy_and_cluster_moves() {
    if skipped("isolation_matrix_across_destroy_and_cluster_moves") {
        return;
    }
    let _one = exclusive();
    let c = SimCluster::up("siso", &[]);
    let dir = tempfile::tempdir().unwrap();
    let agent = cprog::build("matrix_agent", dir.path());

    // 1. At start.
    let mut assignment: Assignment = [(0, "blue"), (1, "blue"), (2, "blue"), (3, "red")].into();
    matrix::assign(&c, &assignment);
    matrix::run(&c, &agent, &assignment, "at start");

    // 2. h1/g0 destroyed, then created again.
    let (host, guest) = matrix::place(2);
    let domid = c.host(host).guests[guest].domid;
    let name = c.hostname(host, guest);
    let mac_before = c.guest_macs(host)[&format!("{name}:0")].clone();
    let dom0_before = c.domain_state(host, DOM0);
    // The wish `xmx sim up` wrote when it attached the guest goes with the
    // domain; the domain created again is attached by its recorded name.
    let wish = format!("/local/domain/0/xmx/guests/{domid}");
    let wished_before = exists(&matrix::dom0_xs(&c, host), &wish);
    let old_frontd = matrix::frontd_pid(&c, host, &c.host(host).guests[guest].name)
        .expect("the guest's xmx-frontd");
    c.sim_admin(host).destroy(domid).expect("destroying h1/g0");
    // Its daemon notices and exits on its own.
    let deadline = Instant::now() + RELEASE;
    while !matrix::exited(old_frontd) {
        assert!(
            Instant::now() < deadline,
            "xmx-frontd of the destroyed guest still runs"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Nothing of the old domain is left: no device, view, wish or domain
    // nodes in xenstore, the backend forgot it, dom0 maps none of its pages
    // and holds none of its channels.
    let bdir = format!("/local/domain/0/backend/xmx/{domid}");
    let nodes = [
        bdir.clone(),
        format!("/local/domain/0/xmx/peers/{domid}"),
        format!("/local/domain/0/xmx/guests/{domid}"),
        format!("/local/domain/{domid}"),
    ];
    matrix::wait_xs(
        &c,
        host,
        "/local/domain",
        "the old domain's nodes are removed",
        |xs| nodes.iter().all(|n| !exists(xs, n)),
    );
    assert!(
        c.sim_admin(host)
            .list()
            .unwrap()
            .iter()
            .all(|d| d.domid != domid),
        "the simulator still lists domain {domid}"
    );
    let mut backd = c.backd(host);
    let deadline = Instant::now() + RELEASE;
    loop {
        let guests = backd
            .call(&xmx_backend::admin::BackdRequest::Guests)
            .unwrap();
        let present = guests
            .as_array()
            .into_iter()
            .flatten()
            .any(|g| g["domid"].as_u64() == Some(u64::from(domid)));
        if !present {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the backend still serves the destroyed guest: {guests}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let released = c.wait_domain(host, DOM0, RELEASE, |s| {
        s.mappings_held < dom0_before.mappings_held && s.ports_open < dom0_before.ports_open
    });
    let released = released
        .unwrap_or_else(|s| panic!("dom0 still holds the guest's pages or channels: {s:?}"));
    println!(
        "h1/g0 destroyed: dom0 maps {} pages (was {}), holds {} ports (was {})",
        released.mappings_held,
        dom0_before.mappings_held,
        released.ports_open,
        dom0_before.ports_open
    );

    let _frontd = matrix::create_again(&c, host, guest);
    matrix::wait_assigned(&c, &assignment);
    assert_eq!(
        c.guest_macs(host)[&format!("{name}:0")],
        mac_before,
        "the re-created guest keeps its MAC"
    );
    // Back to the same number of mappings, channels, xenstore nodes (but for
    // the wish) and watches as before the destruction: nothing of the old
    // domain leaked.
    let wished_now = exists(&matrix::dom0_xs(&c, host), &wish);
    let nodes = dom0_before.xenstore.nodes + usize::from(wished_now) - usize::from(wished_before);
    let same = c.wait_domain(host, DOM0, RELEASE, |s| {
        (
            s.mappings_held,
            s.ports_open,
            s.xenstore.nodes,
            s.xenstore.watches,
        ) == (
            dom0_before.mappings_held,
            dom0_before.ports_open,
            nodes,
            dom0_before.xenstore.watches,
        )
    });
    assert!(
        same.is_ok(),
        "dom0 after re-creation differs from before: {same:?} vs {dom0_before:?}"
    );
    matrix::run(
        &c,
        &agent,
        &assignment,
        "after h1/g0 was destroyed and created again",
    );

    // 3. h0/g1 moves to red.
    assignment.insert(1, "red");
    matrix::assign(&c, &assignment);
    matrix::run(&c, &agent, &assignment, "after h0/g1 moved to red");
}

//! The isolation matrix on a [`SimCluster`]: guests placed in virtual clusters
//! by dom0 (`xmx cluster add`, a live move), one `matrix_agent` per guest, and
//! every guest sending to every other. Inside a cluster each message arrives
//! with every byte checked; across clusters the connection is refused by MX
//! (neither accepted nor left to time out) and nothing arrives.
//!
//! Guests are numbered `2 * host + guest` (h0/g0 = 0, h0/g1 = 1, h1/g0 = 2,
//! h1/g1 = 3); a guest's domain, and guest name for xmxd, is `hI-gJ`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use xmx_hv::xs::XsClient;
use xmx_hv::{DomId, Xenstore, XBT_NULL};
use xmx_wire::xenbus::{self, keys, XenbusState};

use crate::app::App;
use crate::bins::program;
use crate::cluster::SimCluster;

/// Sizes the agent sends, one message each (it has them built in).
pub const SIZES: [u32; 3] = [16, 4000, 100_000];
/// `MX_SUCCESS`, `MX_TIMEOUT`, `MX_NIC_NOT_FOUND` (`mx_return_t`).
pub const MX_SUCCESS: i32 = 0;
pub const MX_TIMEOUT: i32 = 30;
pub const MX_NIC_NOT_FOUND: i32 = 36;
/// How long any step of the matrix may take.
pub const STEP: Duration = Duration::from_secs(60);

/// (host, guest) of guest `id`.
pub fn place(id: usize) -> (usize, usize) {
    (id / 2, id % 2)
}

/// Every guest's virtual cluster, by guest id.
pub type Assignment = BTreeMap<usize, &'static str>;

/// One sender's attempt at one target, as the agent reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub to: usize,
    pub lookup: i32,
    pub connect: i32,
    pub sends: [i32; 3],
}

/// Parses `result TO LOOKUP CONNECT S0 S1 S2`.
pub fn parse_result(line: &str) -> Option<Attempt> {
    let mut f = line.strip_prefix("result ")?.split_whitespace();
    let mut num = || f.next()?.parse::<i64>().ok();
    let to = usize::try_from(num()?).ok()?;
    let lookup = i32::try_from(num()?).ok()?;
    let connect = i32::try_from(num()?).ok()?;
    let sends = [
        i32::try_from(num()?).ok()?,
        i32::try_from(num()?).ok()?,
        i32::try_from(num()?).ok()?,
    ];
    Some(Attempt {
        to,
        lookup,
        connect,
        sends,
    })
}

/// Parses `got FROM K LEN ok|bad`: (from, size index, length, bytes ok).
pub fn parse_got(line: &str) -> Option<(usize, usize, u32, bool)> {
    let mut f = line.strip_prefix("got ")?.split_whitespace();
    let from = f.next()?.parse().ok()?;
    let k = f.next()?.parse().ok()?;
    let len = f.next()?.parse().ok()?;
    let ok = match f.next()? {
        "ok" => true,
        "bad" => false,
        _ => return None,
    };
    Some((from, k, len, ok))
}

fn xmx_ok(args: &[&str]) -> Result<String, String> {
    let o = Command::new(program("xmx", "xmx-lab"))
        .args(args)
        .env_remove("XMX_XMXD_SOCKET")
        .output()
        .map_err(|e| format!("running xmx: {e}"))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(format!(
            "xmx {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr)
        ))
    }
}

/// A dom0 xenstore connection of host `i`.
pub fn dom0_xs(c: &SimCluster, i: usize) -> XsClient {
    XsClient::connect_unix(xmx_hv::sim::layout::xenstore_sock(&c.host(i).simhv_dir, 0))
        .expect("dom0's xenstore connection")
}

/// Waits, on a xenstore watch of `path`, until `check` holds on host `i`.
pub fn wait_xs(
    c: &SimCluster,
    i: usize,
    path: &str,
    what: &str,
    check: impl Fn(&XsClient) -> bool,
) {
    let xs = dom0_xs(c, i);
    xs.watch(path, "matrix").expect("watching");
    let deadline = Instant::now() + STEP;
    while !check(&xs) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "h{i}: never happened: {what}");
        let _ = xs.next_watch_event(Some(left)).expect("xenstore watch");
    }
    let _ = xs.unwatch(path, "matrix");
}

fn front_state(xs: &dyn Xenstore, domid: DomId) -> Option<XenbusState> {
    let path = xenbus::key_path(&xenbus::frontend_dir(domid, 0), keys::STATE);
    let v = xs.read(XBT_NULL, &path).ok()?;
    String::from_utf8(v).ok()?.trim().parse().ok()
}

/// The MX hostnames guest `domid` of host `i` finds in its peer view.
pub fn view(xs: &dyn Xenstore, domid: DomId) -> BTreeSet<String> {
    let dir = format!("/local/domain/0/xmx/peers/{domid}");
    xs.directory(XBT_NULL, &dir)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|n| xs.read(XBT_NULL, &format!("{dir}/{n}")).ok())
        .filter_map(|v| {
            let v = String::from_utf8_lossy(&v).into_owned();
            v.split_once(' ').map(|(_, h)| h.trim().to_owned())
        })
        .collect()
}

/// The MX hostname of guest `id` (`hI-gJ:0`).
pub fn hostname(c: &SimCluster, id: usize) -> String {
    let (h, g) = place(id);
    format!("{}:0", c.hostname(h, g))
}

/// Waits until every guest's device is connected and its peer view holds
/// exactly the guests of its cluster.
pub fn wait_assigned(c: &SimCluster, assignment: &Assignment) {
    for (&id, &cluster) in assignment {
        let (h, g) = place(id);
        let domid = c.host(h).guests[g].domid;
        let want: BTreeSet<String> = assignment
            .iter()
            .filter(|(_, &cl)| cl == cluster)
            .map(|(&o, _)| hostname(c, o))
            .collect();
        wait_xs(
            c,
            h,
            "/local/domain/0/xmx/peers",
            &format!("{} sees {want:?}", hostname(c, id)),
            |xs| view(xs, domid) == want,
        );
        let front = xenbus::frontend_dir(domid, 0);
        wait_xs(
            c,
            h,
            &front,
            &format!("{} connected", hostname(c, id)),
            |xs| front_state(xs, domid) == Some(XenbusState::Connected),
        );
    }
}

/// Puts every guest in its cluster (a live move for those elsewhere), as dom0
/// does: `xmx cluster create` on each host, `xmx cluster add` on the guest's.
pub fn assign(c: &SimCluster, assignment: &Assignment) {
    let clusters: BTreeSet<&str> = assignment.values().copied().collect();
    for i in 0..2 {
        for cl in &clusters {
            // Already there after an earlier call: that refusal is fine.
            let _ = xmx_ok(&[
                "cluster",
                "create",
                "--sim-name",
                c.name(),
                "--sim-host",
                &c.host(i).name,
                cl,
            ]);
        }
    }
    for (&id, &cl) in assignment {
        let (h, g) = place(id);
        let guest = c.hostname(h, g);
        xmx_ok(&[
            "cluster",
            "add",
            "--sim-name",
            c.name(),
            "--sim-host",
            &c.host(h).name,
            cl,
            &guest,
        ])
        .unwrap_or_else(|e| panic!("{e}"));
    }
    wait_assigned(c, assignment);
}

/// Board address of every guest (hex, no colons), by id, from dom0's table.
fn nic_ids(c: &SimCluster) -> BTreeMap<usize, String> {
    let macs = c.guest_macs(0);
    (0..4)
        .map(|id| {
            let name = hostname(c, id);
            let mac = macs
                .get(&name)
                .unwrap_or_else(|| panic!("{name} is not in dom0's table: {macs:?}"));
            (id, mac.replace(':', ""))
        })
        .collect()
}

/// Runs the whole matrix once; `label` names the round in failures.
pub fn run(c: &SimCluster, agent: &Path, assignment: &Assignment, label: &str) {
    let nics = nic_ids(c);
    let mut agents: BTreeMap<usize, App> = BTreeMap::new();
    for &id in assignment.keys() {
        let (h, g) = place(id);
        let mut a = App::spawn(
            &format!("matrix agent in {} ({label})", hostname(c, id)),
            c.app(h, g, agent, &["-i", &id.to_string()], &[]),
        );
        a.wait_line(STEP, |l| l == "ready");
        agents.insert(id, a);
    }
    let mut received: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let mut expected: BTreeMap<usize, BTreeSet<(usize, usize)>> = BTreeMap::new();
    for (&from, &from_cluster) in assignment {
        for (&to, &to_cluster) in assignment {
            if to == from {
                continue;
            }
            let a = agents.get_mut(&from).expect("agent");
            a.send_line(&format!("send {to} {} {}", hostname(c, to), nics[&to]));
            // Lines of the receiving thread may come first: keep them.
            let line = a.wait_line(STEP, |l| l.starts_with("result ") || l.starts_with("got "));
            let mut line = line;
            while line.starts_with("got ") {
                received.entry(from).or_default().push(line);
                line = a.wait_line(STEP, |l| l.starts_with("result ") || l.starts_with("got "));
            }
            let r = parse_result(&line).unwrap_or_else(|| panic!("agent said {line:?}"));
            let what = format!("{label}: {} -> {}", hostname(c, from), hostname(c, to));
            assert_eq!(r.to, to, "{what}: {line}");
            if from_cluster == to_cluster {
                assert_eq!(
                    (r.lookup, r.connect),
                    (MX_SUCCESS, MX_SUCCESS),
                    "{what} in {from_cluster}: {line}"
                );
                assert_eq!(r.sends, [0, 0, 0], "{what}: every send succeeds: {line}");
                let e = expected.entry(to).or_default();
                for k in 0..SIZES.len() {
                    e.insert((from, k));
                }
            } else {
                assert_ne!(
                    r.lookup, MX_SUCCESS,
                    "{what}: the hostname of another cluster is found: {line}"
                );
                assert!(
                    r.connect != MX_SUCCESS && r.connect != MX_TIMEOUT,
                    "{what}: across clusters the connection must be refused, not accepted or left to time out: {line}"
                );
                assert_eq!(r.sends, [-1, -1, -1], "{what}: {line}");
                println!(
                    "{what} ({from_cluster} -> {to_cluster}): refused with code {}",
                    r.connect
                );
            }
        }
    }
    // Every expected message arrives, checked byte by byte; then nothing else
    // has arrived anywhere.
    for (&id, a) in agents.iter_mut() {
        let want = expected.remove(&id).unwrap_or_default();
        let mut got: BTreeSet<(usize, usize)> = BTreeSet::new();
        let mut lines = received.remove(&id).unwrap_or_default();
        loop {
            for l in lines.drain(..) {
                let (from, k, len, ok) =
                    parse_got(&l).unwrap_or_else(|| panic!("agent said {l:?}"));
                let what = format!("{label}: {} got {l:?}", hostname(c, id));
                assert!(ok, "{what}: bytes differ");
                assert_eq!(len, SIZES[k], "{what}");
                assert!(
                    want.contains(&(from, k)),
                    "{what}: not expected (from another cluster?)"
                );
                assert!(got.insert((from, k)), "{what}: twice");
            }
            if got.len() == want.len() {
                break;
            }
            lines.push(a.wait_line(STEP, |l| l.starts_with("got ")));
        }
        a.send_line("count");
        let count = a.wait_line(STEP, |l| l.starts_with("count ") || l.starts_with("got "));
        assert_eq!(
            count,
            format!("count {}", want.len()),
            "{label}: {} received more than its cluster sent",
            hostname(c, id)
        );
        println!(
            "{label}: {} received {} messages, all checked",
            hostname(c, id),
            got.len()
        );
    }
    for (id, mut a) in agents {
        a.send_line("quit");
        let f = a.finish();
        f.passed();
        let _ = id;
    }
}

/// An `xmx-frontd` started for a re-created guest; killed on drop if still
/// running (`xmx sim down` ends it otherwise).
pub struct RecreatedFrontd {
    child: Option<Child>,
}

impl Drop for RecreatedFrontd {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The pid of the `xmx-frontd` of guest `gJ` of host `i`, as `xmx sim status` lists it.
pub fn frontd_pid(c: &SimCluster, i: usize, guest: &str) -> Option<i32> {
    let out = xmx_ok(&["sim", "status", "--name", c.name(), "--json"]).ok()?;
    let v: serde_json::Value = serde_json::from_str(&out).ok()?;
    v["hosts"][i]["daemons"]
        .as_array()?
        .iter()
        .find(|d| d["name"].as_str() == Some(&format!("xmx-frontd-{guest}")))
        .and_then(|d| d["pid"].as_i64())
        .map(|p| p as i32)
}

/// Whether process `pid` has exited (gone, or a zombie nobody reaped yet).
pub fn exited(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|s| s == "Z" || s == "X"),
        Err(_) => true,
    }
}

/// Creates guest `gJ` of host `i` again (same name, same domid: dom0 gives it
/// its recorded identity) and starts its `xmx-frontd` on the socket the
/// cluster's tools know; returns once its device is connected.
pub fn create_again(c: &SimCluster, i: usize, j: usize) -> RecreatedFrontd {
    let h = c.host(i);
    let g = &h.guests[j];
    let domid = c
        .sim_admin(i)
        .create(&c.hostname(i, j), Some(g.domid))
        .expect("creating the guest again");
    assert_eq!(domid, g.domid);
    let root = h.simhv_dir.parent().expect("host directory");
    let socket = root.join(format!("frontd-{}.sock", g.name));
    let log = std::fs::File::create(
        root.join("logs")
            .join(format!("xmx-frontd-{}.again.log", g.name)),
    )
    .expect("frontd log");
    let child = Command::new("ip")
        .args(["netns", "exec", &h.netns])
        .arg(program("xmx-frontd", "xmx-guests"))
        .arg("--socket")
        .arg(&socket)
        .env("XMX_PLATFORM", "sim")
        .env("XMX_SIM_DIR", &h.simhv_dir)
        .env("XMX_DOMID", domid.to_string())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("starting xmx-frontd");
    let frontd = RecreatedFrontd { child: Some(child) };
    let front = xenbus::frontend_dir(domid, 0);
    wait_xs(
        c,
        i,
        &front,
        &format!("{} connected again", c.hostname(i, j)),
        |xs| front_state(xs, domid) == Some(XenbusState::Connected),
    );
    frontd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_lines_parse() {
        assert_eq!(
            parse_result("result 3 28 36 -1 -1 -1"),
            Some(Attempt {
                to: 3,
                lookup: 28,
                connect: 36,
                sends: [-1, -1, -1]
            })
        );
        assert_eq!(parse_result("result 3 0 0 0"), None);
        assert_eq!(parse_result("got 1 2 100000 ok"), None);
        assert_eq!(parse_got("got 1 2 100000 ok"), Some((1, 2, 100_000, true)));
        assert_eq!(parse_got("got 1 0 16 bad"), Some((1, 0, 16, false)));
        assert_eq!(parse_got("got 1 0 16 maybe"), None);
        assert_eq!(place(3), (1, 1));
    }
}

//! `xmx sim up/run/status/down` on real network namespaces (the tests run as root).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn xmx() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_xmx"))
}

/// The daemons `xmx sim` starts live next to `xmx`; `cargo test --workspace` builds them.
fn ensure_sibling(bin: &str, package: &str) {
    let path = xmx().parent().unwrap().join(bin);
    assert!(
        path.exists(),
        "{} is missing: run the workspace tests (`cargo test --workspace`) or `cargo build -p {package}` first",
        path.display()
    );
}

fn run(args: &[&str]) -> Output {
    let out = Command::new(xmx())
        .args(args)
        .output()
        .expect("running xmx");
    out
}

fn ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "xmx {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn namespaces(prefix: &str) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

fn link(ns: &str, dev: &str) -> Value {
    let out = Command::new("ip")
        .args(["-n", ns, "-j", "link", "show", dev])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v[0].clone()
}

fn alive(pid: i64) -> bool {
    xmx_lab::sim::wait::alive(pid as i32)
}

/// The command name and nice level of process `pid` (from /proc/PID/stat: the name in
/// parentheses, then the fields, nice the 19th).
fn comm_and_nice(pid: i64) -> (String, i64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let open = stat.find('(').unwrap();
    let close = stat.rfind(')').unwrap();
    let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    (
        stat[open + 1..close].to_owned(),
        fields[16].parse().unwrap(),
    )
}

#[test]
fn cluster_up_run_status_down_and_crash_cleanup() {
    ensure_sibling("xmx-simhv", "xmx-simhv");
    let name = format!("t{}", std::process::id() % 100000);
    let prefix = format!("xmx-{name}-");
    let _ = run(&["sim", "down", "--name", &name]);

    let state: Value = serde_json::from_str(&ok(&[
        "sim", "up", "--name", &name, "--hosts", "2", "--guests", "2", "--json",
    ]))
    .unwrap();
    let hosts = state["hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), 2);
    for (i, h) in hosts.iter().enumerate() {
        assert_eq!(h["name"], format!("h{i}"));
        let domids: Vec<_> = h["guests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["domid"].as_u64().unwrap())
            .collect();
        assert_eq!(domids, vec![1, 2]);
        let ns = h["netns"].as_str().unwrap();
        let eth = link(ns, "eth0");
        assert_eq!(eth["mtu"], 9000);
        assert_eq!(eth["address"], h["mac"]);
        assert!(eth["flags"].as_array().unwrap().iter().any(|f| f == "UP"));
        let port = link(&format!("{prefix}fabric"), &format!("ph{i}"));
        assert_eq!(port["master"], "br0");
    }
    let mut expected_ns = vec![
        format!("{prefix}fabric"),
        format!("{prefix}h0"),
        format!("{prefix}h1"),
    ];
    expected_ns.sort();
    let mut got_ns = namespaces(&prefix);
    got_ns.sort();
    assert_eq!(got_ns, expected_ns);

    // An application in guest g1 of h1 sees its domain's environment.
    let out = ok(&[
        "sim",
        "run",
        "--name",
        &name,
        "h1",
        "g1",
        "--",
        "sh",
        "-c",
        "echo $XMX_PLATFORM $XMX_DOMID $XMX_GUEST; ip -j link show eth0",
    ]);
    let mut lines = out.lines();
    assert_eq!(lines.next().unwrap(), "sim 2 g1");
    let eth: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(
        eth[0]["address"], hosts[1]["mac"],
        "the command ran inside host h1's namespace"
    );
    // Its exit status is passed through.
    assert_eq!(
        run(&["sim", "run", "--name", &name, "0", "0", "--", "sh", "-c", "exit 7"])
            .status
            .code(),
        Some(7)
    );
    assert!(
        !run(&["sim", "run", "--name", &name, "h9", "g0", "--", "true"])
            .status
            .success()
    );
    // The command runs in place of `xmx sim run`: a signal to it (an MPI
    // launcher's interrupt, a Ctrl-C) reaches the program, which no parent
    // outlives.
    let mut child = Command::new(xmx())
        .args(["sim", "run", "--name", &name, "h0", "g0", "--"])
        .args(["sh", "-c", "echo $$; exec sleep 60"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("running xmx sim run");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(
        line.trim().parse::<u32>().ok(),
        Some(child.id()),
        "the program is the process `xmx sim run` started as"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGINT)
    );

    let status: Value =
        serde_json::from_str(&ok(&["sim", "status", "--name", &name, "--json"])).unwrap();
    let mut pids = Vec::new();
    for h in status["hosts"].as_array().unwrap() {
        for d in h["daemons"].as_array().unwrap() {
            assert_eq!(d["alive"], true, "{d}");
            pids.push(d["pid"].as_i64().unwrap());
        }
        let domains: Vec<_> = h["domains"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["domid"].as_u64().unwrap())
            .collect();
        assert!(domains.contains(&1) && domains.contains(&2), "{domains:?}");
    }
    // dom0's data path (the backend, the hypervisor) runs with dom0's weight, also under
    // its supervisor; dom0's service and the guests' daemons keep the default.
    let mut weighted = Vec::new();
    for h in status["hosts"].as_array().unwrap() {
        for d in h["daemons"].as_array().unwrap() {
            let (comm, nice) = comm_and_nice(d["daemon_pid"].as_i64().unwrap());
            let want = if xmx_lab::sim::cluster::DOM0_DAEMONS.contains(&comm.as_str()) {
                weighted.push(comm.clone());
                i64::from(xmx_lab::sim::cluster::DOM0_NICE)
            } else {
                0
            };
            assert_eq!(nice, want, "{} runs as {comm} at nice {nice}", d["name"]);
        }
    }
    weighted.sort();
    assert_eq!(
        weighted,
        ["xmx-backd", "xmx-backd", "xmx-simhv", "xmx-simhv"]
    );
    let guest_nice = ok(&[
        "sim",
        "run",
        "--name",
        &name,
        "h0",
        "g0",
        "--",
        "sh",
        "-c",
        "cut -d' ' -f19 /proc/self/stat",
    ]);
    assert_eq!(
        guest_nice.trim(),
        "0",
        "a guest's program runs at the default weight"
    );

    // A second cluster of the same name is refused.
    assert!(!run(&["sim", "up", "--name", &name]).status.success());

    ok(&["sim", "down", "--name", &name]);
    assert!(namespaces(&prefix).is_empty());
    assert!(!Path::new(&format!("/run/xmx/{name}")).exists());
    for pid in &pids {
        assert!(!alive(*pid), "daemon {pid} outlived `down`");
    }

    // After a crash that lost the state file, `down` still sweeps the namespaces.
    let state: Value = serde_json::from_str(&ok(&[
        "sim", "up", "--name", &name, "--hosts", "1", "--guests", "1", "--json",
    ]))
    .unwrap();
    std::fs::remove_file(format!("/run/xmx/{name}/cluster.json")).unwrap();
    ok(&["sim", "down", "--name", &name]);
    assert!(namespaces(&prefix).is_empty());
    let pid = state["hosts"][0]["daemons"][0]["pid"].as_i64().unwrap();
    assert!(!alive(pid), "daemon in a swept namespace was stopped");
}

#[test]
fn two_hosts_back_to_back_have_no_fabric_and_see_each_others_guests() {
    ensure_sibling("xmx-simhv", "xmx-simhv");
    let name = format!("b2b{}", std::process::id() % 100000);
    let prefix = format!("xmx-{name}-");
    let _ = run(&["sim", "down", "--name", &name]);
    // Only two hosts can be joined by one cable.
    let out = run(&[
        "sim",
        "up",
        "--name",
        &name,
        "--hosts",
        "3",
        "--back-to-back",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("exactly two hosts"), "{err}");
    assert!(
        namespaces(&prefix).is_empty(),
        "a refused cluster leaves nothing"
    );

    let state: Value = serde_json::from_str(&ok(&[
        "sim",
        "up",
        "--name",
        &name,
        "--hosts",
        "2",
        "--guests",
        "1",
        "--back-to-back",
        "--json",
    ]))
    .unwrap();
    let mut got_ns = namespaces(&prefix);
    got_ns.sort();
    assert_eq!(got_ns, [format!("{prefix}h0"), format!("{prefix}h1")]);
    let hosts = state["hosts"].as_array().unwrap();
    for h in hosts {
        let eth = link(h["netns"].as_str().unwrap(), "eth0");
        assert_eq!(eth["address"], h["mac"]);
        assert_eq!(eth["mtu"], 9000);
        assert!(eth.get("master").is_none(), "no bridge: {eth}");
    }
    // The dom0 services find each other over the cable: each guest's peer view lists
    // both guests.
    let loaded = xmx_lab::sim::cluster::ClusterState::load(&xmx_lab::sim::cluster::root_of(&name))
        .unwrap()
        .unwrap();
    xmx_lab::bench::guests::wait_settled(&loaded, std::time::Duration::from_secs(30))
        .expect("both guests see each other across the back-to-back link");
    ok(&["sim", "down", "--name", &name]);
    assert!(namespaces(&prefix).is_empty());
}

#[test]
fn without_root_it_explains() {
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(xmx())
        .args(["sim", "up", "--name", "nroot"])
        .output()
        .expect("setpriv (util-linux)");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs root"), "{err}");
}

#[test]
fn every_subcommand_has_help() {
    for args in [
        vec!["--help"],
        vec!["sim", "--help"],
        vec!["sim", "up", "--help"],
        vec!["sim", "run", "--help"],
        vec!["sim", "status", "--help"],
        vec!["sim", "down", "--help"],
    ] {
        let out = ok(&args);
        assert!(out.contains("Usage"), "{args:?}: {out}");
    }
}

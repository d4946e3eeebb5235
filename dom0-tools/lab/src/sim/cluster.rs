//! A simulated cluster: N hosts (network namespaces on one bridge), each with its own
//! xmx-simhv, xmx-backd and xmxd on its NIC, and M guest domains with their xmx device
//! attached (and their xmx-frontd, when the workspace has built it).
//!
//! The state file `ROOT/cluster.json` records what was built so `status`, `run` and `down`
//! work from any later invocation; `down` also sweeps namespaces by prefix so it cleans up
//! after a crash that lost the state file.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tracing::{info, warn};
use xmx_hv::sim::admin::SimAdmin;
use xmx_hv::DomId;

use super::{netns, wait};
pub use xmx_tools::simstate::{
    guest_name, host_name, root_of, ClusterState, DaemonState, GuestState, HostState, DEFAULT_NAME,
    RUN_DIR, STATE_FILE,
};
use xmx_tools::xmxd::{ControlClient, XmxdRequest};

/// Interface name of each host's NIC inside its namespace.
pub const HOST_IFACE: &str = "eth0";
/// The first domid handed to guests (dom0 is 0).
pub const FIRST_GUEST_DOMID: DomId = 1;
const DAEMON_START_TIMEOUT: Duration = Duration::from_secs(20);
const DAEMON_STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the simulated hosts' xmxd announce their guests: often, so a cluster settles
/// within a second.
const XMXD_ANNOUNCE_MS: u64 = 200;
/// How long a simulated host keeps the others' guests without news: four announcements
/// (800 ms) were too short on a loaded machine or an impaired link, where a starved
/// xmxd or a few lost announcements made a host forget its peers in the middle of a
/// transfer ("NIC not in the peer table").
const XMXD_TTL_MS: u64 = 10_000;

/// What `xmx sim up` builds.
#[derive(Debug, Clone)]
pub struct UpOptions {
    /// The cluster's name (directory and namespace prefix).
    pub name: String,
    /// Number of hosts.
    pub hosts: usize,
    /// Number of guests per host.
    pub guests: usize,
    /// MTU of every link.
    pub mtu: u32,
    /// Directory holding the xmx binaries (xmx-simhv, ...).
    pub bin_dir: PathBuf,
    /// `guest_clusters[i][j]`: the virtual cluster guest `j` of host `i` is attached in
    /// (xmxd creates it if needed); guests without an entry are in the default cluster.
    /// Attaching in the right cluster at once spares a re-attach, which would end the
    /// guest's xmx-frontd.
    pub guest_clusters: Vec<Vec<String>>,
    /// Join the two hosts of a two-host cluster by one veth pair instead of the fabric's
    /// bridge: no simulated switch on the path (whose forwarding costs these cores what
    /// a real switch does not), as a back-to-back cable. Without the bridge there is no
    /// port to relay through an impairment.
    pub back_to_back: bool,
}

/// Locally administered MACs, "XM" in the second and third byte: 02:58:4d:00:00:<host+1>.
pub fn host_mac(i: usize) -> String {
    format!("02:58:4d:00:{:02x}:{:02x}", (i + 1) >> 8, (i + 1) & 0xff)
}

/// The IPv4 address (with prefix) of host `i`'s NIC, in the RFC 2544 benchmarking range.
pub fn host_addr(i: usize) -> String {
    format!("198.18.{}.{}/15", (i + 1) >> 8, (i + 1) & 0xff)
}

/// Cluster names become namespace and directory names: keep them short and plain.
pub fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > 16 || !name.bytes().all(|b| b.is_ascii_alphanumeric()) {
        bail!("cluster name {name:?} must be 1 to 16 letters or digits");
    }
    Ok(())
}

/// Fails with an explanation unless running as root (namespaces need it).
pub fn require_root() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "a simulated cluster needs root: it creates network namespaces and veth links. \
             Run it as root (e.g. `sudo xmx sim up ...`), or use the in-process simulator that \
             the tests use (`cargo test`), which needs no namespaces"
        );
    }
    Ok(())
}

/// Daemons that stand for dom0 and the hypervisor, and the nice level they run at.
///
/// On real Xen, dom0's vCPUs carry a scheduler weight above the guests': the backend
/// that moves every guest's messages runs as soon as a guest hands it work, however many
/// guests poll. On one Linux host all processes compete in one scheduler, so the
/// simulated cluster gives these daemons a higher CFS weight (nice -5: about three times
/// a nice-0 guest program's share). The guests' own programs and frontends keep nice 0.
pub const DOM0_DAEMONS: &[&str] = &["xmx-backd", "xmx-simhv"];
/// The nice level of [`DOM0_DAEMONS`].
pub const DOM0_NICE: libc::c_int = -5;

fn is_dom0_daemon(program: &Path) -> bool {
    program
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| DOM0_DAEMONS.contains(&n))
}

/// Start `bin args` inside namespace `ns` with `env` added, detached in its own process
/// group, output to `log`. `program` is the daemon it runs (`bin` itself, or the program
/// a supervisor shell starts), which decides its scheduler weight.
fn spawn_in_ns(
    ns: &str,
    bin: &Path,
    program: &Path,
    args: &[String],
    env: &[(String, String)],
    log: &Path,
) -> Result<i32> {
    if !bin.exists() {
        bail!(
            "{} not found (build the workspace first: cargo build --release)",
            bin.display()
        );
    }
    let out = fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = Command::new("ip");
    if is_dom0_daemon(program) {
        // SAFETY: setpriority is async-signal-safe and touches only the forked child (before
        // exec); every thread and child process it starts (a supervisor's daemon) inherits
        // the level. Failing (no privilege)
        // leaves the default weight, which only costs latency.
        unsafe {
            cmd.pre_exec(|| {
                libc::setpriority(libc::PRIO_PROCESS, 0, DOM0_NICE);
                Ok(())
            });
        }
    }
    let child = cmd
        .args(["netns", "exec", ns])
        .arg(bin)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {} in {ns}", bin.display()))?;
    // `ip netns exec` execs the program, so this pid is the daemon's own.
    Ok(child.id() as i32)
}

/// Build the cluster. On any failure, what was built so far is torn down again.
pub fn up(opts: &UpOptions, progress: &mut dyn FnMut(&str)) -> Result<ClusterState> {
    require_root()?;
    check_name(&opts.name)?;
    if opts.hosts == 0 || opts.hosts > 250 {
        bail!("--hosts must be between 1 and 250");
    }
    if opts.back_to_back && opts.hosts != 2 {
        bail!("a back-to-back link joins exactly two hosts (--hosts 2)");
    }
    let root = root_of(&opts.name);
    if ClusterState::load(&root)?.is_some() || !netns::list_ours(&opts.name)?.is_empty() {
        bail!(
            "simulated cluster {:?} already exists (see `xmx sim status`); remove it with `xmx sim down`",
            opts.name
        );
    }
    fs::create_dir_all(&root)?;
    let mut state = ClusterState {
        name: opts.name.clone(),
        root,
        mtu: opts.mtu,
        hosts: Vec::new(),
    };
    match build(opts, &mut state, progress) {
        Ok(()) => Ok(state),
        Err(e) => {
            warn!("cluster start failed, tearing down: {e:#}");
            let _ = down(&opts.name, &mut |_| {});
            Err(e)
        }
    }
}

fn build(opts: &UpOptions, state: &mut ClusterState, progress: &mut dyn FnMut(&str)) -> Result<()> {
    let host_ns = |i: usize| format!("{}{}", netns::prefix(&opts.name), host_name(i));
    let fabric = netns::fabric_ns(&opts.name);
    if opts.back_to_back {
        progress(&format!(
            "h0, h1: namespaces, one veth between them, MTU {}",
            opts.mtu
        ));
        let (ns0, ns1) = (host_ns(0), host_ns(1));
        let (mac0, mac1) = (host_mac(0), host_mac(1));
        let (addr0, addr1) = (host_addr(0), host_addr(1));
        netns::join_back_to_back(
            [(&ns0, &mac0, &addr0), (&ns1, &mac1, &addr1)],
            HOST_IFACE,
            opts.mtu,
        )?;
    } else {
        progress("fabric: bridge namespace");
        netns::create_fabric(&fabric, opts.mtu)?;
    }
    state.save()?;
    for i in 0..opts.hosts {
        let name = host_name(i);
        let ns = host_ns(i);
        if !opts.back_to_back {
            progress(&format!("{name}: namespace, veth, MTU {}", opts.mtu));
            netns::attach_host(
                &fabric,
                &ns,
                HOST_IFACE,
                &format!("p{name}"),
                &host_mac(i),
                &host_addr(i),
                opts.mtu,
            )?;
        }
        let host_dir = state.root.join(&name);
        let simhv_dir = host_dir.join("simhv");
        fs::create_dir_all(host_dir.join("logs"))?;
        let mut host = HostState {
            name: name.clone(),
            netns: ns.clone(),
            iface: HOST_IFACE.into(),
            mac: host_mac(i),
            addr: host_addr(i),
            simhv_dir: simhv_dir.clone(),
            daemons: Vec::new(),
            guests: Vec::new(),
        };
        progress(&format!("{name}: xmx-simhv"));
        fs::create_dir_all(&simhv_dir)?;
        let log = host_dir.join("logs/simhv.log");
        let simhv = opts.bin_dir.join("xmx-simhv");
        let pid = spawn_in_ns(
            &ns,
            &simhv,
            &simhv,
            &[
                "--foreground".into(),
                "--dir".into(),
                simhv_dir.display().to_string(),
            ],
            &[],
            &log,
        )?;
        host.daemons.push(DaemonState {
            name: "xmx-simhv".into(),
            pid,
            log: log.clone(),
        });
        state.hosts.push(host);
        state.save()?;
        wait::file_appears(
            &xmx_hv::sim::layout::ready_file(&simhv_dir),
            DAEMON_START_TIMEOUT,
        )
        .with_context(|| format!("xmx-simhv of {name} did not start; see {}", log.display()))?;
        let xmxd_socket = start_dom0_daemons(opts, state, i, progress)?;
        let admin = SimAdmin::connect(&simhv_dir)?;
        let mut xmxd = ControlClient::connect(&xmxd_socket)
            .with_context(|| format!("connecting to xmxd of {name}"))?;
        for j in 0..opts.guests {
            let gname = guest_name(j);
            let domid = admin.create(
                &format!("{name}-{gname}"),
                Some(FIRST_GUEST_DOMID + j as DomId),
            )?;
            progress(&format!("{name}: guest {gname} is domain {domid}"));
            let cluster = opts.guest_clusters.get(i).and_then(|h| h.get(j)).cloned();
            xmxd.call(&XmxdRequest::Attach { domid, cluster })
                .with_context(|| format!("attaching the xmx device of {name}-{gname}"))?;
            state.hosts[i].guests.push(GuestState {
                name: gname.clone(),
                domid,
                frontd_socket: None,
            });
            state.save()?;
            start_frontd(opts, state, i, j, progress)?;
        }
        state.save()?;
    }
    info!(
        hosts = opts.hosts,
        guests = opts.guests,
        "simulated cluster up"
    );
    Ok(())
}

/// The environment of a process of domain `domid` of `host`.
fn domain_env(host: &HostState, domid: DomId) -> Vec<(String, String)> {
    vec![
        ("XMX_PLATFORM".into(), "sim".into()),
        ("XMX_SIM_DIR".into(), host.simhv_dir.display().to_string()),
        ("XMX_DOMID".into(), domid.to_string()),
    ]
}

/// The supervisor of a simulated daemon, a POSIX shell running `"$@"` as systemd runs a
/// unit with `Restart=on-failure`, `RestartSec=1`, `StartLimitIntervalSec=60` and
/// `StartLimitBurst=5` (dom0-tools/systemd): a daemon that fails (non-zero exit, killed
/// by a signal) is started again a second later, unless it failed five times within a
/// minute; one that exits with 0 stays stopped. SIGTERM or SIGINT to the supervisor stops
/// the daemon and then the supervisor.
const SUPERVISOR: &str = r#"
child=
trap 'test -n "$child" && kill -TERM "$child" 2>/dev/null; wait "$child"; exit 0' TERM INT
starts=
while :; do
  "$@" &
  child=$!
  wait "$child"
  rc=$?
  test "$rc" -eq 0 && exit 0
  now=$(date +%s)
  recent=
  n=0
  for t in $starts; do
    if [ $((now - t)) -lt 60 ]; then recent="$recent $t"; n=$((n + 1)); fi
  done
  starts="$recent $now"
  if [ "$n" -ge 4 ]; then
    echo "supervisor: $1 failed 5 times within 60 s (status $rc); left stopped" >&2
    exit "$rc"
  fi
  echo "supervisor: $1 failed (status $rc); starting it again in 1 s" >&2
  sleep 1
done
"#;

/// Start `bin` as a daemon of host `i` under [`SUPERVISOR`], record it (the
/// supervisor's pid), and wait for `ready` (its socket) to appear.
fn start_daemon(
    state: &mut ClusterState,
    i: usize,
    daemon: &str,
    bin: &Path,
    args: &[String],
    env: &[(String, String)],
    ready: &Path,
) -> Result<()> {
    let host = &state.hosts[i];
    let log = state
        .root
        .join(&host.name)
        .join("logs")
        .join(format!("{daemon}.log"));
    if !bin.exists() {
        bail!(
            "{} not found (build the workspace first: cargo build --release)",
            bin.display()
        );
    }
    let mut supervised = vec![
        "-c".to_string(),
        SUPERVISOR.to_string(),
        "xmx-supervise".to_string(),
        bin.display().to_string(),
    ];
    supervised.extend_from_slice(args);
    // The supervisor shell gets the daemon's weight, which the daemon inherits (the shell
    // itself only sleeps).
    let pid = spawn_in_ns(
        &host.netns,
        Path::new("/bin/sh"),
        bin,
        &supervised,
        env,
        &log,
    )?;
    state.hosts[i].daemons.push(DaemonState {
        name: daemon.into(),
        pid,
        log: log.clone(),
    });
    state.save()?;
    wait::file_appears(ready, DAEMON_START_TIMEOUT).with_context(|| {
        format!(
            "{daemon} of {} did not start; see {}",
            state.hosts[i].name,
            log.display()
        )
    })
}

/// The backend and xmxd of host `i`, on its NIC; returns xmxd's control socket.
fn start_dom0_daemons(
    opts: &UpOptions,
    state: &mut ClusterState,
    i: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf> {
    let host = state.hosts[i].clone();
    let env = domain_env(&host, xmx_hv::DOM0);
    let backd_socket = host.simhv_dir.join("backd.sock");
    progress(&format!("{}: xmx-backd on {}", host.name, host.iface));
    start_daemon(
        state,
        i,
        "xmx-backd",
        &opts.bin_dir.join("xmx-backd"),
        &[
            "--iface".into(),
            host.iface.clone(),
            "--hostname".into(),
            host.name.clone(),
            "--control".into(),
            backd_socket.display().to_string(),
        ],
        &env,
        &backd_socket,
    )?;
    let xmxd_socket = host.simhv_dir.join("xmxd.sock");
    progress(&format!("{}: xmxd", host.name));
    start_daemon(
        state,
        i,
        "xmxd",
        &opts.bin_dir.join("xmxd"),
        &[
            "--iface".into(),
            host.iface.clone(),
            "--hostname".into(),
            host.name.clone(),
            "--state-dir".into(),
            state
                .root
                .join(&host.name)
                .join("xmxd")
                .display()
                .to_string(),
            "--control".into(),
            xmxd_socket.display().to_string(),
            "--backend-socket".into(),
            backd_socket.display().to_string(),
            "--announce-ms".into(),
            XMXD_ANNOUNCE_MS.to_string(),
            "--ttl-ms".into(),
            XMXD_TTL_MS.to_string(),
        ],
        &env,
        &xmxd_socket,
    )?;
    Ok(xmxd_socket)
}

/// The guest daemon of guest `j` of host `i`, if the workspace has built one.
fn start_frontd(
    opts: &UpOptions,
    state: &mut ClusterState,
    i: usize,
    j: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    let bin = opts.bin_dir.join("xmx-frontd");
    if !bin.exists() {
        return Ok(());
    }
    let host = state.hosts[i].clone();
    let guest = &host.guests[j];
    let socket = state
        .root
        .join(&host.name)
        .join(format!("frontd-{}.sock", guest.name));
    progress(&format!("{}: xmx-frontd of {}", host.name, guest.name));
    start_daemon(
        state,
        i,
        &format!("xmx-frontd-{}", guest.name),
        &bin,
        &["--socket".into(), socket.display().to_string()],
        &domain_env(&host, guest.domid),
        &socket,
    )?;
    state.hosts[i].guests[j].frontd_socket = Some(socket);
    state.save()
}

/// Tear everything down: daemons (SIGTERM, then SIGKILL), namespaces, the state directory.
/// Works from a state file, and without one by sweeping the simulator's namespaces.
pub fn down(name: &str, progress: &mut dyn FnMut(&str)) -> Result<()> {
    require_root()?;
    check_name(name)?;
    let root = root_of(name);
    if let Some(state) = ClusterState::load(&root)? {
        for host in &state.hosts {
            for d in host.daemons.iter().rev() {
                progress(&format!(
                    "{}: stopping {} (pid {})",
                    host.name, d.name, d.pid
                ));
                stop_daemon(d.pid);
            }
        }
    }
    for ns in netns::list_ours(name)? {
        // A process left in a namespace keeps it alive after `ip netns del`; end them first.
        kill_namespace_processes(&ns);
        progress(&format!("removing namespace {ns}"));
        netns::delete(&ns)?;
    }
    if root.exists() {
        fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()))?;
    }
    Ok(())
}

fn stop_daemon(pid: i32) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    if !wait::alive(pid) {
        return;
    }
    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    if !wait::process_exits(pid, DAEMON_STOP_TIMEOUT) {
        warn!(pid, "daemon ignored SIGTERM; killing it");
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        wait::process_exits(pid, DAEMON_STOP_TIMEOUT);
    }
}

fn kill_namespace_processes(ns: &str) {
    let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() else {
        return;
    };
    for pid in String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
    {
        stop_daemon(pid);
    }
}

/// The environment a program needs to run as an application of guest `guest` on `host`.
pub fn guest_env(host: &HostState, guest: &GuestState, bin_dir: &Path) -> Vec<(String, String)> {
    let mut env = domain_env(host, guest.domid);
    env.extend([
        ("XMX_HOST".into(), host.name.clone()),
        ("XMX_GUEST".into(), guest.name.clone()),
        ("LD_LIBRARY_PATH".into(), bin_dir.display().to_string()),
    ]);
    if let Some(socket) = &guest.frontd_socket {
        env.push(("XMX_FRONTD_SOCKET".into(), socket.display().to_string()));
    }
    env
}

/// Runs `cmd` as an application of `guest` on `host`, in place of this
/// process (`ip netns exec` then executes `cmd` in place of itself): the
/// program gets the signals sent to `xmx sim run` (an MPI launcher's
/// interrupt, a terminal's Ctrl-C) and its exit status is the command's. A
/// parent that outlived a killed child left the program running unseen,
/// holding the launcher's output open. Returns only if it cannot be started.
pub fn run(
    state: &ClusterState,
    host: &str,
    guest: &str,
    cmd: &[String],
    bin_dir: &Path,
) -> Result<i32> {
    use std::os::unix::process::CommandExt;
    require_root()?;
    let h = state.host(host)?;
    let g = h.guest(guest)?;
    let Some((prog, args)) = cmd.split_first() else {
        bail!("no command given after `--`")
    };
    let err = Command::new("ip")
        .args(["netns", "exec", &h.netns])
        .arg(prog)
        .args(args)
        .envs(guest_env(h, g, bin_dir))
        .exec();
    Err(err).with_context(|| format!("running {prog} in {}/{}", h.name, g.name))
}

/// One line per host and guest, with whether each daemon is alive.
pub fn status(state: &ClusterState) -> serde_json::Value {
    let hosts: Vec<_> = state
        .hosts
        .iter()
        .map(|h| {
            let daemons: Vec<_> = h
                .daemons
                .iter()
                .map(|d| serde_json::json!({"name": d.name, "pid": d.pid, "daemon_pid": d.daemon_pid(), "alive": wait::alive(d.pid), "log": d.log}))
                .collect();
            let live = SimAdmin::connect(&h.simhv_dir).and_then(|a| a.list()).ok();
            serde_json::json!({
                "name": h.name, "netns": h.netns, "iface": h.iface, "mac": h.mac, "addr": h.addr,
                "daemons": daemons,
                "guests": h.guests,
                "domains": live,
            })
        })
        .collect();
    serde_json::json!({"name": state.name, "root": state.root, "mtu": state.mtu, "hosts": hosts})
}

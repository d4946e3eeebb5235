//! The xl hook scripts against a simulated host: they write the wish with the standard
//! xenstore tools (xenstore-utils, pointed at the simulator by XENSTORED_PATH) and xmxd
//! acts on it.

mod xmxd_util;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use xmx_hv::sim::layout;
use xmx_hv::DOM0;
use xmx_tools::xmxd::{names, xsnodes};
use xmx_wire::xenbus::{self, keys};
use xmxd_util::{read, xmx_bin, XmxdHost};

fn hook(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("hooks")
        .join(name)
}

fn run(host: &XmxdHost, script: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let out = Command::new(hook(script))
        .args(args)
        .envs(env.iter().copied())
        .env(
            "XENSTORED_PATH",
            layout::xenstore_sock(&host.hv_dir(), DOM0),
        )
        .output()
        .expect("running the hook");
    out
}

fn ok(host: &XmxdHost, script: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let out = run(host, script, args, env);
    assert!(
        out.status.success(),
        "{script} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn cluster_key(host: &XmxdHost, domid: u16) -> Option<String> {
    let bdir = xenbus::backend_dir(DOM0, domid, 0);
    read(
        host.dom0_xs().as_ref(),
        &xenbus::key_path(&bdir, keys::CLUSTER),
    )
}

fn tools_present() -> bool {
    Command::new("xenstore-write")
        .arg("--help")
        .output()
        .is_ok()
}

#[test]
fn xmx_hook_attaches_detaches_and_wraps_xl_create() {
    assert!(
        tools_present(),
        "xenstore-utils is missing (.ci/run installs it)"
    );
    let mut host = XmxdHost::start("h0");
    host.start_xmxd(None, Duration::from_millis(100));
    let xs = host.dom0_xs();

    // By name, with a cluster.
    let vm1 = host.create("vm1");
    ok(&host, "xmx-hook", &["attach", "vm1", "blue"], &[]);
    host.wait("vm1 attached", |c| c.is_attached(vm1));
    assert_eq!(
        cluster_key(&host, vm1),
        Some(names::cluster_id("blue").to_string())
    );
    // xmxd took the cluster and emptied the node, which still says "wants xmx".
    xmxd_util::wait_node(xs.as_ref(), &xsnodes::wish_path(DOM0, vm1), |v| {
        v.as_deref() == Some("")
    });

    // Withdrawn: the device goes.
    ok(&host, "xmx-hook", &["detach", &vm1.to_string()], &[]);
    host.wait("vm1 detached", |c| !c.is_attached(vm1));
    assert_eq!(cluster_key(&host, vm1), None);

    // Refusals: an unknown domain, a bad cluster name, no arguments.
    let out = run(&host, "xmx-hook", &["attach", "nosuch"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no running domain named nosuch"));
    let out = run(&host, "xmx-hook", &["attach", "vm1", "bad name"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(run(&host, "xmx-hook", &[], &[]).status.code(), Some(2));
    assert!(ok(&host, "xmx-hook", &["--help"], &[]).contains("xmx-hook create CONFIG"));

    // `create` runs xl (a stand-in that records its arguments) and attaches the domain its
    // configuration names, in the cluster the configuration asks for.
    let dir = tempfile::tempdir().unwrap();
    let xl = dir.path().join("xl");
    let log = dir.path().join("xl.args");
    std::fs::write(&xl, format!("#!/bin/sh\necho \"$@\" > {}\n", log.display())).unwrap();
    std::fs::set_permissions(&xl, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let cfg = dir.path().join("web.cfg");
    std::fs::write(&cfg, "name = \"web\"\nmemory = 256\n#xmx: cluster=red\n").unwrap();
    let plain = dir.path().join("plain.cfg");
    std::fs::write(&plain, "name = \"plain\"\n").unwrap();
    assert_eq!(
        ok(
            &host,
            "xmx-hook",
            &["cluster-of", cfg.to_str().unwrap()],
            &[]
        ),
        "red\n"
    );
    assert_eq!(
        run(
            &host,
            "xmx-hook",
            &["cluster-of", plain.to_str().unwrap()],
            &[]
        )
        .status
        .code(),
        Some(1)
    );

    let web = host.create("web");
    let xl_env = [("XMX_XL", xl.to_str().unwrap())];
    ok(
        &host,
        "xmx-hook",
        &["create", cfg.to_str().unwrap(), "-q"],
        &xl_env,
    );
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        format!("create {} -q\n", cfg.display())
    );
    host.wait("web attached", |c| c.is_attached(web));
    assert_eq!(
        cluster_key(&host, web),
        Some(names::cluster_id("red").to_string())
    );

    // A configuration without the line: xl runs, nothing is attached.
    let other = host.create("plain");
    ok(
        &host,
        "xmx-hook",
        &["create", plain.to_str().unwrap()],
        &xl_env,
    );
    assert_eq!(read(xs.as_ref(), &xsnodes::wish_path(DOM0, other)), None);
    assert!(host.xmxd().inspect(|c| !c.is_attached(other)));
}

#[test]
fn vif_xmx_records_the_wish_and_chains_to_the_vif_script() {
    assert!(
        tools_present(),
        "xenstore-utils is missing (.ci/run installs it)"
    );
    let mut host = XmxdHost::start("h0");
    host.start_xmxd(None, Duration::from_millis(100));
    let xs = host.dom0_xs();
    let dir = tempfile::tempdir().unwrap();
    let chain = dir.path().join("vif-bridge");
    let log = dir.path().join("chain.args");
    std::fs::write(
        &chain,
        format!("#!/bin/sh\necho \"$@ $XENBUS_PATH\" > {}\n", log.display()),
    )
    .unwrap();
    std::fs::set_permissions(&chain, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    let d = host.create("net1");
    let xenbus_path = format!("backend/vif/{d}/0");
    let env = [
        ("XENBUS_PATH", xenbus_path.as_str()),
        ("XMX_VIF_CHAIN", chain.to_str().unwrap()),
    ];
    ok(&host, "vif-xmx", &["online", "type_if=vif"], &env);
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        format!("online type_if=vif {xenbus_path}\n")
    );
    host.wait("net1 attached", |c| c.is_attached(d));
    assert_eq!(cluster_key(&host, d).as_deref(), Some("0"));

    // offline only chains; an existing wish (with a cluster) is left alone by online.
    ok(&host, "vif-xmx", &["offline"], &env);
    assert!(host.xmxd().inspect(|c| c.is_attached(d)));
    let d2 = host.create("net2");
    xs.write(xmx_hv::XBT_NULL, &xsnodes::wish_path(DOM0, d2), b"green")
        .unwrap();
    let xenbus_path = format!("backend/vif/{d2}/0");
    let env = [
        ("XENBUS_PATH", xenbus_path.as_str()),
        ("XMX_VIF_CHAIN", chain.to_str().unwrap()),
    ];
    ok(&host, "vif-xmx", &["online"], &env);
    host.wait("net2 attached", |c| c.is_attached(d2));
    assert_eq!(
        cluster_key(&host, d2),
        Some(names::cluster_id("green").to_string())
    );
}

/// The pairs of domains xmxd offers a direct channel now.
fn offered_pairs(host: &XmxdHost) -> Vec<(u16, u16)> {
    let report = host.call(xmx_tools::xmxd::control::XmxdRequest::Direct { enabled: None });
    serde_json::from_value(report["pairs"].clone()).unwrap()
}

#[test]
fn xmx_hook_migrate_revokes_direct_channels_first_and_offers_them_again_when_xl_fails() {
    assert!(
        tools_present(),
        "xenstore-utils is missing (.ci/run installs it)"
    );
    let mut host = XmxdHost::start("h0");
    host.start_xmxd(None, Duration::from_millis(100));
    let (a, b) = (host.create("mig1"), host.create("mig2"));
    for name in ["mig1", "mig2"] {
        ok(&host, "xmx-hook", &["attach", name], &[]);
    }
    host.wait("both attached", |c| c.is_attached(a) && c.is_attached(b));
    xmxd_util::eventually("the pair offered", || offered_pairs(&host) == vec![(a, b)]);

    // A stand-in for xl that records, while it runs, what xmxd offers, and ends as told.
    let dir = tempfile::tempdir().unwrap();
    let xl = dir.path().join("xl");
    let during = dir.path().join("during.json");
    let args = dir.path().join("xl.args");
    let holds = dir.path().join("holds");
    std::fs::write(
        &xl,
        format!(
            "#!/bin/sh\n\"$XMX_CLI\" direct --json > {}\necho \"$@\" > {}\n\
             for d in {a} {b}; do\n\
               echo \"$d $(xenstore-read /local/domain/0/backend/xmx/$d/0/hold 2>/dev/null || echo -) \
             $(xenstore-read /local/domain/0/backend/xmx/$d/0/state)\"\n\
             done > {}\nexit \"$XL_RC\"\n",
            during.display(),
            args.display(),
            holds.display(),
        ),
    )
    .unwrap();
    let holds_during = || std::fs::read_to_string(&holds).unwrap();
    let bdir = |d: u16| format!("/local/domain/0/backend/xmx/{d}/0");
    let xs0 = host.dom0_xs();
    let backend_state = |d: u16| xmxd_util::read(xs0.as_ref(), &format!("{}/state", bdir(d)));
    std::fs::set_permissions(&xl, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let xmx = xmx_bin();
    let socket = host.xmxd_socket();
    let env = |rc: &'static str| {
        [
            ("XMX_XL", xl.to_str().unwrap().to_owned()),
            ("XMX_CLI", xmx.to_str().unwrap().to_owned()),
            ("XMX_XMXD_SOCKET", socket.to_str().unwrap().to_owned()),
            ("XL_RC", rc.to_owned()),
        ]
    };
    let pairs_during = || -> Vec<(u16, u16)> {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&during).unwrap()).unwrap();
        serde_json::from_value(v["pairs"].clone()).unwrap()
    };

    // xl fails: the channel was revoked while it ran, and is offered again after.
    let e = env("1");
    let e: Vec<(&str, &str)> = e.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = run(
        &host,
        "xmx-hook",
        &["migrate", "mig1", "host2", "-C", "x.cfg"],
        &e,
    );
    assert_eq!(out.status.code(), Some(1), "xl's status is the hook's");
    assert_eq!(pairs_during(), vec![], "revoked before xl ran");
    // Its device was held closed (backend Closed) while xl ran, the other's untouched.
    assert_eq!(holds_during(), format!("{a} 1 6\n{b} - 2\n"));
    assert_eq!(
        std::fs::read_to_string(&args).unwrap(),
        "migrate -C x.cfg mig1 host2\n"
    );
    assert_eq!(offered_pairs(&host), vec![(a, b)], "offered again");
    assert!(
        xmxd_util::read(xs0.as_ref(), &format!("{}/hold", bdir(a))).is_none(),
        "released"
    );
    xmxd_util::eventually("the device served again", || {
        backend_state(a).as_deref() == Some("2")
    });

    // xl succeeds: the channel stays revoked (the domain goes with the migration).
    let e = env("0");
    let e: Vec<(&str, &str)> = e.iter().map(|(k, v)| (*k, v.as_str())).collect();
    ok(&host, "xmx-hook", &["migrate", &a.to_string(), "host2"], &e);
    assert_eq!(pairs_during(), vec![]);
    assert_eq!(offered_pairs(&host), vec![]);

    // Without xmxd the migration still runs, with a warning.
    let mut e = env("0");
    e[2].1 = dir.path().join("no.sock").to_str().unwrap().to_owned();
    let e: Vec<(&str, &str)> = e.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = run(&host, "xmx-hook", &["migrate", "mig2", "host2"], &e);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("could not mark domain"));
    assert_eq!(
        std::fs::read_to_string(&args).unwrap(),
        "migrate mig2 host2\n"
    );
}

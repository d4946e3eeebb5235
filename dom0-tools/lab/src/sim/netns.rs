//! Network namespaces, veth pairs and a bridge: the fabric of a simulated cluster.
//!
//! Everything goes through iproute2's `ip`, the tool administrators already read, so a
//! half-built fabric can be inspected and removed by hand with the same commands.

use std::process::Command;

use anyhow::{bail, Context, Result};

/// Namespaces of cluster NAME are all called `xmx-NAME-*`, so `down` finds them after a
/// crash even when the state file is gone, and clusters of different names coexist.
pub fn prefix(cluster: &str) -> String {
    format!("xmx-{cluster}-")
}

/// The namespace that holds the bridge joining every host of `cluster`.
pub fn fabric_ns(cluster: &str) -> String {
    format!("{}fabric", prefix(cluster))
}

/// The bridge joining the hosts, in the bridge namespace.
pub const BRIDGE: &str = "br0";

/// Run `ip ARGS`, failing with its stderr.
pub fn ip(args: &[&str]) -> Result<String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running `ip` (install iproute2)")?;
    if !out.status.success() {
        bail!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip -n NS ARGS`.
pub fn ip_in(ns: &str, args: &[&str]) -> Result<String> {
    let mut v = vec!["-n", ns];
    v.extend_from_slice(args);
    ip(&v)
}

/// Names of existing namespaces that belong to `cluster`.
pub fn list_ours(cluster: &str) -> Result<Vec<String>> {
    let out = ip(&["netns", "list"])?;
    let prefix = prefix(cluster);
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&prefix))
        .map(str::to_owned)
        .collect())
}

/// Creates namespace `ns` with its loopback up.
pub fn add(ns: &str) -> Result<()> {
    ip(&["netns", "add", ns])?;
    ip_in(ns, &["link", "set", "lo", "up"])?;
    Ok(())
}

/// Deletes namespace `ns`.
pub fn delete(ns: &str) -> Result<()> {
    ip(&["netns", "del", ns]).map(|_| ())
}

/// The fabric: a namespace with one bridge, every port at `mtu`.
pub fn create_fabric(fabric: &str, mtu: u32) -> Result<()> {
    add(fabric)?;
    let mtu = mtu.to_string();
    ip_in(
        fabric,
        &["link", "add", BRIDGE, "mtu", &mtu, "type", "bridge"],
    )?;
    // No STP and no forward delay: frames flow as soon as a port is up.
    ip_in(
        fabric,
        &[
            "link",
            "set",
            BRIDGE,
            "type",
            "bridge",
            "forward_delay",
            "0",
            "stp_state",
            "0",
        ],
    )?;
    ip_in(fabric, &["link", "set", BRIDGE, "up"])?;
    Ok(())
}

/// Two host namespaces joined by one veth pair, with no fabric between them: each end is
/// called `iface` in its namespace and gets the MAC and address given for it.
pub fn join_back_to_back(ends: [(&str, &str, &str); 2], iface: &str, mtu: u32) -> Result<()> {
    let mtu = mtu.to_string();
    let [(ns_a, mac_a, addr_a), (ns_b, mac_b, addr_b)] = ends;
    add(ns_a)?;
    add(ns_b)?;
    // Made in the first namespace under a temporary name (the second end's name is taken
    // there), then moved and renamed.
    let moving = "xmx-b2b";
    ip_in(
        ns_a,
        &[
            "link", "add", iface, "mtu", &mtu, "type", "veth", "peer", "name", moving, "mtu", &mtu,
            "netns", ns_b,
        ],
    )?;
    ip_in(ns_b, &["link", "set", moving, "name", iface])?;
    for (ns, mac, addr) in [(ns_a, mac_a, addr_a), (ns_b, mac_b, addr_b)] {
        ip_in(ns, &["link", "set", iface, "address", mac, "up"])?;
        ip_in(ns, &["addr", "add", addr, "dev", iface])?;
    }
    Ok(())
}

/// A host namespace with interface `iface` (MAC `mac`, address `addr`) whose veth peer
/// `port` is a port of the fabric bridge.
pub fn attach_host(
    fabric: &str,
    ns: &str,
    iface: &str,
    port: &str,
    mac: &str,
    addr: &str,
    mtu: u32,
) -> Result<()> {
    let mtu = mtu.to_string();
    add(ns)?;
    ip_in(
        fabric,
        &[
            "link", "add", port, "mtu", &mtu, "type", "veth", "peer", "name", iface, "mtu", &mtu,
            "netns", ns,
        ],
    )?;
    ip_in(fabric, &["link", "set", port, "master", BRIDGE, "up"])?;
    ip_in(ns, &["link", "set", iface, "address", mac, "up"])?;
    ip_in(ns, &["addr", "add", addr, "dev", iface])?;
    Ok(())
}

//! The link the network setups measure: a veth pair made for the run, or two hosts of an
//! existing simulated cluster.

use std::net::Ipv4Addr;
use std::process::Command;

use serde::Serialize;
use xmx_nic::testbed::VethPair;

use super::tcp::{ADDR_A, ADDR_B, PREFIX_LEN};
use crate::sim::cluster::{self, ClusterState};

/// MTU of a bench-made veth pair: jumbo frames, as MX over Ethernet wants.
pub const MTU: u32 = 9000;

/// One end of the link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Side {
    /// Network namespace.
    pub netns: String,
    /// Interface in it.
    pub iface: String,
    /// IPv4 address on the interface.
    pub addr: Ipv4Addr,
}

/// Two namespaces joined by Ethernet. End A runs clients, end B servers.
#[derive(Debug, Serialize)]
pub struct BenchLink {
    /// `veth` (made for this run) or `sim:NAME` (an existing simulated cluster).
    pub kind: String,
    /// MTU of both ends.
    pub mtu: u32,
    /// Client end.
    pub a: Side,
    /// Server end.
    pub b: Side,
    #[serde(skip)]
    _pair: Option<VethPair>,
}

impl BenchLink {
    /// A fresh veth pair across two namespaces with addresses in 198.18.0.0/15; removed
    /// when the link is dropped. Needs root.
    pub fn veth() -> Result<BenchLink, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err("needs root (network namespaces and a veth pair)".into());
        }
        let pair = VethPair::create("bench", MTU).map_err(|e| e.to_string())?;
        for (ns, iface, addr) in [
            (&pair.ns_a, &pair.if_a, ADDR_A),
            (&pair.ns_b, &pair.if_b, ADDR_B),
        ] {
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{addr}/{PREFIX_LEN}"),
                "dev",
                iface,
            ])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(BenchLink {
            kind: "veth".into(),
            mtu: MTU,
            a: Side {
                netns: pair.ns_a.clone(),
                iface: pair.if_a.clone(),
                addr: ADDR_A,
            },
            b: Side {
                netns: pair.ns_b.clone(),
                iface: pair.if_b.clone(),
                addr: ADDR_B,
            },
            _pair: Some(pair),
        })
    }

    /// Hosts h0 (client end) and h1 (server end) of the simulated cluster `name`.
    pub fn sim_cluster(name: &str) -> Result<BenchLink, String> {
        let state = ClusterState::load(&cluster::root_of(name))
            .map_err(|e| format!("{e:#}"))?
            .ok_or_else(|| {
                format!("no simulated cluster {name:?} (start one with `xmx sim up`)")
            })?;
        let side = |host: &str| -> Result<Side, String> {
            let h = state.host(host).map_err(|e| format!("{e:#}"))?;
            let addr = h.addr.split('/').next().unwrap_or_default();
            let addr = addr
                .parse()
                .map_err(|_| format!("host {host} has no IPv4 address ({})", h.addr))?;
            Ok(Side {
                netns: h.netns.clone(),
                iface: h.iface.clone(),
                addr,
            })
        };
        Ok(BenchLink {
            kind: format!("sim:{name}"),
            mtu: state.mtu,
            a: side("h0")?,
            b: side("h1")?,
            _pair: None,
        })
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("running ip: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

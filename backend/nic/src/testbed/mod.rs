//! Test beds of the NIC layer: a veth pair across two fresh network namespaces (two
//! "hosts" joined by a cable, [`VethPair`]), and a relay that impairs a link the way
//! `tc netem` does ([`relay`]), for kernels without netem. Needs root and iproute2's `ip`.

pub mod relay;

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{NicError, Result};

/// Interface name of end A inside its namespace.
pub const IFACE_A: &str = "xmx-a";
/// Interface name of end B inside its namespace.
pub const IFACE_B: &str = "xmx-b";

/// Two namespaces, each holding one end of a veth pair, both ends up. Dropping it
/// deletes both namespaces, which destroys the pair.
#[derive(Debug)]
pub struct VethPair {
    /// Namespace of end A.
    pub ns_a: String,
    /// Namespace of end B.
    pub ns_b: String,
    /// Interface of end A ([`IFACE_A`]).
    pub if_a: String,
    /// Interface of end B ([`IFACE_B`]).
    pub if_b: String,
    created: Vec<String>,
}

/// Distinguishes pairs made by one process.
static NEXT_PAIR: AtomicU32 = AtomicU32::new(0);

impl VethPair {
    /// Create the namespaces `xmx-TAG-PID-N-a` / `-b` and the pair, both ends at `mtu`.
    /// Names include the process id and a counter so concurrent tests never collide.
    pub fn create(tag: &str, mtu: u32) -> Result<Self> {
        let n = NEXT_PAIR.fetch_add(1, Ordering::Relaxed);
        let base = format!("xmx-{tag}-{}-{n}", std::process::id());
        let mut pair = Self {
            ns_a: format!("{base}-a"),
            ns_b: format!("{base}-b"),
            if_a: IFACE_A.to_owned(),
            if_b: IFACE_B.to_owned(),
            created: Vec::new(),
        };
        // On any failure below, dropping `pair` removes what was already made.
        for ns in [pair.ns_a.clone(), pair.ns_b.clone()] {
            ip(&["netns", "add", &ns])?;
            pair.created.push(ns);
        }
        let mtu = mtu.to_string();
        ip(&[
            "-n", &pair.ns_a, "link", "add", IFACE_A, "mtu", &mtu, "type", "veth", "peer", "name",
            IFACE_B, "mtu", &mtu, "netns", &pair.ns_b,
        ])?;
        ip(&["-n", &pair.ns_a, "link", "set", IFACE_A, "up"])?;
        ip(&["-n", &pair.ns_b, "link", "set", IFACE_B, "up"])?;
        tracing::debug!(ns_a = %pair.ns_a, ns_b = %pair.ns_b, %mtu, "veth pair created");
        Ok(pair)
    }

    /// Change the MTU of end A.
    pub fn set_mtu_a(&self, mtu: u32) -> Result<()> {
        link_set(&self.ns_a, IFACE_A, &["mtu", &mtu.to_string()])
    }

    /// Change the MTU of end B.
    pub fn set_mtu_b(&self, mtu: u32) -> Result<()> {
        link_set(&self.ns_b, IFACE_B, &["mtu", &mtu.to_string()])
    }

    /// Bring end B down or up.
    pub fn set_up_b(&self, up: bool) -> Result<()> {
        link_set(&self.ns_b, IFACE_B, &[if up { "up" } else { "down" }])
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        for ns in self.created.drain(..) {
            if let Err(error) = ip(&["netns", "del", &ns]) {
                tracing::warn!(%error, "could not remove test namespace");
            }
        }
    }
}

/// `ip -n NS link set IFACE ARGS`.
fn link_set(ns: &str, iface: &str, args: &[&str]) -> Result<()> {
    let mut all = vec!["-n", ns, "link", "set", iface];
    all.extend_from_slice(args);
    ip(&all)
}

/// Run `ip ARGS`, failing with its stderr.
fn ip(args: &[&str]) -> Result<()> {
    let command = format!("ip {}", args.join(" "));
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| NicError::Command {
            command: command.clone(),
            detail: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(NicError::Command {
            command,
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

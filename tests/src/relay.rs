//! An impaired link for a simulated host, where the kernel has no `netem`.
//!
//! `tc qdisc ... netem loss 5% duplicate 1% reorder 5% delay 1ms` on a host's
//! veth impairs what the host sends. Without the netem qdisc the same is done
//! in the fabric namespace: the host's port leaves the bridge, and a thread of
//! the test relays MXoE frames between it and a new veth whose other end joins
//! the bridge, losing, duplicating, delaying and reordering those coming from
//! the host (netem's way: a reordered frame skips the delay the others wait).
//!
//! The relay itself is the NIC layer's test bed ([`xmx_nic::testbed::relay`]),
//! its impairment drawn from a seeded generator: [`relay_seed`] picks a fresh
//! seed per run (printed) unless `XMX_RELAY_SEED` names one, so a run that
//! failed can be replayed with the same losses, duplicates and reorderings.

use std::process::Command;

use xmx_nic::testbed::relay::{relay_seed_of, Relay};
use xmx_nic::{NicConfig, PacketSocket};

pub use xmx_nic::testbed::relay::{relay_seed, Impairment, RelayStats, SEED_ENV};

fn ip(args: &[&str]) -> Result<(), String> {
    let o = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// One host's port relayed through an impairment; restored when dropped.
pub struct ImpairedPort {
    netns: String,
    port: String,
    relay_if: String,
    relay: Option<Relay>,
}

impl ImpairedPort {
    /// Relays port `port` (host `index`'s end in fabric namespace `netns`, on bridge
    /// `br0`) through `imp` for the frames the host sends (what comes back passes, but for
    /// the link's down periods), its generator seeded by `seed` and `index` (see
    /// [`relay_seed`]).
    pub fn start(
        netns: &str,
        port: &str,
        index: usize,
        mtu: u32,
        imp: Impairment,
        seed: u64,
    ) -> ImpairedPort {
        let relay_if = format!("xr{index}a");
        let bridge_if = format!("xr{index}b");
        let mtu = mtu.to_string();
        let mut p = ImpairedPort {
            netns: netns.to_owned(),
            port: port.to_owned(),
            relay_if: relay_if.clone(),
            relay: None,
        };
        for args in [
            vec!["-n", netns, "link", "set", port, "nomaster"],
            vec![
                "-n", netns, "link", "add", &relay_if, "mtu", &mtu, "type", "veth", "peer", "name",
                &bridge_if, "mtu", &mtu,
            ],
            vec!["-n", netns, "link", "set", &bridge_if, "master", "br0"],
            vec!["-n", netns, "link", "set", &bridge_if, "up"],
            vec!["-n", netns, "link", "set", &relay_if, "up"],
        ] {
            ip(&args).expect("setting up the relay");
        }
        let cfg = NicConfig {
            promiscuous: true,
            ..NicConfig::default()
        };
        let host_end = PacketSocket::open_in_netns(netns, port, cfg.clone())
            .expect("relay socket on the host's port");
        let bridge_end = PacketSocket::open_in_netns(netns, &relay_if, cfg)
            .expect("relay socket towards the bridge");
        // What comes back from the bridge is not impaired, but a link that is down loses
        // both ways.
        let back = Impairment {
            down: imp.down,
            ..Impairment::NONE
        };
        let seed = relay_seed_of(seed, index as u64);
        p.relay = Some(
            Relay::start(
                &format!("relay-{port}"),
                host_end,
                bridge_end,
                imp,
                back,
                seed,
            )
            .expect("relay thread"),
        );
        p
    }

    /// What it did so far (side A is the host).
    pub fn stats(&self) -> RelayStats {
        self.relay.as_ref().map(Relay::stats).unwrap_or_default()
    }
}

impl Drop for ImpairedPort {
    fn drop(&mut self) {
        self.relay = None;
        let _ = ip(&["-n", &self.netns, "link", "del", &self.relay_if]);
        let _ = ip(&[
            "-n",
            &self.netns,
            "link",
            "set",
            &self.port,
            "master",
            "br0",
        ]);
    }
}

/// Both hosts' links of a two-host simulated cluster impaired alike: by the
/// kernel's netem where it has one (on the fabric side of each veth, since
/// the backends' frames bypass the qdiscs of their own side), else by a
/// relay on each port.
pub struct ImpairedLinks {
    relays: Vec<ImpairedPort>,
}

impl ImpairedLinks {
    /// Impairs the links of hosts 0 and 1 of `c` with `imp`.
    pub fn on(c: &crate::cluster::SimCluster, imp: Impairment) -> ImpairedLinks {
        let fabric = c.fabric_netns();
        let netem = |h: usize, add: bool| {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", &fabric, "tc", "qdisc"])
                .arg(if add { "add" } else { "del" })
                .args(["dev", &c.host(h).port, "root", "netem"]);
            if add {
                cmd.args(imp.netem_args());
            }
            cmd.output().is_ok_and(|o| o.status.success())
        };
        if netem(0, true) && netem(1, true) {
            println!("links impaired by tc netem {}", imp.netem_args().join(" "));
            return ImpairedLinks { relays: Vec::new() };
        }
        netem(0, false);
        println!(
            "no netem in this kernel: links impaired by a relay ({})",
            imp.netem_args().join(" ")
        );
        let seed = relay_seed();
        let relays = (0..2)
            .map(|h| ImpairedPort::start(&fabric, &c.host(h).port, h, 9000, imp, seed))
            .collect();
        ImpairedLinks { relays }
    }

    /// Asserts that each relay lost, duplicated and reordered frames (the
    /// run was impaired, not lucky); prints what they did. Nothing to check
    /// under netem, which keeps no counts.
    pub fn assert_impaired(&self) {
        for (h, r) in self.relays.iter().enumerate() {
            let s = r.stats();
            println!("relay of h{h}: {s:?}");
            assert!(
                s.lost > 0 && s.duplicated > 0 && s.reordered > 0,
                "h{h}'s link was impaired: {s:?}"
            );
        }
    }
}

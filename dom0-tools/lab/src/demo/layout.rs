//! Who is where in the demo: hosts, guests, virtual clusters and the pairs that exchange
//! messages.
//!
//! Two hosts, and on each guest g0 in cluster `blue` and g1 in cluster `red`. Traffic
//! between co-located guests has to stay inside one cluster, and g0 and g1 of a host are
//! in different ones, so each host gets a third guest: h0/g2 joins `blue` (h0/g0's
//! co-located partner) and h1/g2 joins `red` (so red has a co-located pair as well, and
//! both hosts look alike). The measured pairs are both blue, one across hosts and one on
//! h0; the isolation step aims from blue h0/g0 at the red guests on both hosts.

use std::fmt;

/// Name of the simulated cluster (`xmx sim ... --name demo`).
pub const SIM_NAME: &str = "demo";
/// Hosts.
pub const HOSTS: usize = 2;
/// Guests per host.
pub const GUESTS_PER_HOST: usize = 3;
/// MTU of the links.
pub const MTU: u32 = 9000;
/// The two virtual clusters.
pub const BLUE: &str = "blue";
/// See [`BLUE`].
pub const RED: &str = "red";
/// Every virtual cluster the demo makes, in display order.
pub const VCLUSTERS: [&str; 2] = [BLUE, RED];
/// Message sizes of the figures: 0 B, 4 KiB, 64 KiB, 1 MiB.
pub const SIZES: [u64; 4] = [0, 4 << 10, 64 << 10, 1 << 20];

/// Guest `guest` of host `host` (indices, as in `h<host>/g<guest>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Place {
    /// Host index.
    pub host: usize,
    /// Guest index on that host.
    pub guest: usize,
}

impl Place {
    /// `h<host>/g<guest>`.
    pub const fn new(host: usize, guest: usize) -> Place {
        Place { host, guest }
    }

    /// The host's name (`h0`).
    pub fn host_name(self) -> String {
        crate::sim::cluster::host_name(self.host)
    }

    /// The guest's name on its host (`g0`).
    pub fn guest_name(self) -> String {
        crate::sim::cluster::guest_name(self.guest)
    }

    /// The domain's name, which is also its guest name for xmxd (`h0-g0`).
    pub fn domain_name(self) -> String {
        format!("{}-{}", self.host_name(), self.guest_name())
    }

    /// The guest's virtual cluster.
    pub fn vcluster(self) -> &'static str {
        match self.guest {
            0 => BLUE,
            1 => RED,
            // The third guest: blue on even hosts, red on odd ones.
            _ => VCLUSTERS[self.host % 2],
        }
    }
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "h{}/g{}", self.host, self.guest)
    }
}

/// Every guest of the demo, host by host.
pub fn places() -> Vec<Place> {
    (0..HOSTS)
        .flat_map(|h| (0..GUESTS_PER_HOST).map(move |g| Place::new(h, g)))
        .collect()
}

/// The members of virtual cluster `name`.
pub fn members(name: &str) -> Vec<Place> {
    places()
        .into_iter()
        .filter(|p| p.vcluster() == name)
        .collect()
}

/// Two guests that exchange messages: the server (passive side) and the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pair {
    /// Name of the figures' column, as `xmx bench` names the same setup.
    pub name: &'static str,
    /// One line for readers.
    pub description: &'static str,
    /// The passive side (`mx_bench -l`).
    pub server: Place,
    /// The active side (`mx_bench -d`).
    pub client: Place,
}

/// The measured pairs: across hosts, then co-located.
pub const PAIRS: [Pair; 2] = [
    Pair {
        name: "guest-remote",
        description: "MX between blue guests on different hosts: h0/g0 -> h1/g0 (frontend, rings, backend, wire)",
        server: Place::new(1, 0),
        client: Place::new(0, 0),
    },
    Pair {
        name: "guest-local",
        description: "MX between co-located blue guests: h0/g0 -> h0/g2 (the backend copies between them)",
        server: Place::new(0, 2),
        client: Place::new(0, 0),
    },
];

/// The guest the isolation step runs in.
pub const PROBE_FROM: Place = Place::new(0, 0);

/// The guests the isolation step aims at: every guest of another cluster than
/// [`PROBE_FROM`]'s.
pub fn probe_targets() -> Vec<Place> {
    places()
        .into_iter()
        .filter(|p| p.vcluster() != PROBE_FROM.vcluster())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_brief_layout_holds() {
        assert_eq!(Place::new(0, 0).vcluster(), BLUE);
        assert_eq!(Place::new(1, 0).vcluster(), BLUE);
        assert_eq!(Place::new(0, 1).vcluster(), RED);
        assert_eq!(Place::new(1, 1).vcluster(), RED);
        assert_eq!(
            members(BLUE),
            [Place::new(0, 0), Place::new(0, 2), Place::new(1, 0)]
        );
        assert_eq!(
            members(RED),
            [Place::new(0, 1), Place::new(1, 1), Place::new(1, 2)]
        );
        assert_eq!(places().len(), HOSTS * GUESTS_PER_HOST);
        assert_eq!(Place::new(1, 2).domain_name(), "h1-g2");
        assert_eq!(Place::new(1, 2).to_string(), "h1/g2");
    }

    #[test]
    fn pairs_stay_in_one_cluster_and_cover_both_placements() {
        for p in PAIRS {
            assert_eq!(p.server.vcluster(), p.client.vcluster(), "{}", p.name);
            assert_ne!(p.server, p.client);
        }
        assert_ne!(PAIRS[0].server.host, PAIRS[0].client.host);
        assert_eq!(PAIRS[1].server.host, PAIRS[1].client.host);
    }

    #[test]
    fn isolation_aims_only_at_other_clusters_on_both_hosts() {
        let t = probe_targets();
        assert!(t.iter().all(|p| p.vcluster() != PROBE_FROM.vcluster()));
        assert!(t.iter().any(|p| p.host == PROBE_FROM.host));
        assert!(t.iter().any(|p| p.host != PROBE_FROM.host));
        assert_eq!(
            t.len() + members(PROBE_FROM.vcluster()).len(),
            places().len()
        );
    }
}

//! Names and the identities derived from them: cluster ids, guest MACs, MX hostnames.
//!
//! Everything here is a pure function of a name, so every host of the fabric derives the
//! same value without asking anyone:
//!
//! - a cluster's id (what the engine and the backend's `cluster` key carry) is a hash of its
//!   name, except the default cluster, which is 0 as in the backend;
//! - a guest's board MAC is a hash of its base name (see `base_name`), in the locally
//!   administered range `06:xx:xx:xx:xx:xx`, so re-creating or migrating a guest of the
//!   same name gives it the same MX address;
//! - its MX hostname is `<name>:0` (board 0 of the "host" that is the guest).

use xmx_wire::mxoe::Mac;

use super::error::{Error, Result};

/// The cluster every guest is in unless put elsewhere.
pub(crate) const DEFAULT_CLUSTER: &str = "default";
/// Id of [`DEFAULT_CLUSTER`]: the backend's and the engine's default.
pub(crate) const DEFAULT_CLUSTER_ID: u32 = 0;
/// Longest cluster name.
pub(crate) const CLUSTER_NAME_MAX: usize = 32;
/// Longest guest (domain) name.
pub(crate) const GUEST_NAME_MAX: usize = 64;
/// Longest host name announced on the fabric.
pub(crate) const HOST_NAME_MAX: usize = 63;
/// First octet of every guest MAC: unicast, locally administered, and distinct from the
/// `02:...` addresses the simulator gives host NICs.
pub(crate) const GUEST_MAC_PREFIX: u8 = 0x06;

/// Suffixes xl puts on a domain's name while it migrates (`libxl` renames the receiving
/// copy when the migration succeeds and the sending copy before destroying it).
const MIGRATION_SUFFIXES: [&str; 2] = ["--incoming", "--migratedaway"];

/// A cluster name: 1 to 32 of `[A-Za-z0-9_.-]`, not starting with `-`.
pub(crate) fn check_cluster_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= CLUSTER_NAME_MAX
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "cluster name {name:?}: 1 to {CLUSTER_NAME_MAX} letters, digits, '_', '.' or '-'"
        )))
    }
}

/// A guest name as Xen allows domain names, and safe in a xenstore path: 1 to 64 bytes,
/// no `/`, no whitespace or control characters.
pub(crate) fn check_guest_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= GUEST_NAME_MAX
        && !name
            .chars()
            .any(|c| c == '/' || c.is_whitespace() || c.is_control());
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "guest name {name:?}: 1 to {GUEST_NAME_MAX} bytes without '/', spaces or controls"
        )))
    }
}

/// A host name for announcements: 1 to 63 bytes, printable, no whitespace.
pub(crate) fn check_host_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= HOST_NAME_MAX
        && name
            .chars()
            .all(|c| c.is_ascii_graphic() || (!c.is_ascii() && !c.is_control()));
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "host name {name:?}: 1 to {HOST_NAME_MAX} printable bytes"
        )))
    }
}

/// The name a guest is known by across migrations: the domain name without xl's
/// migration suffix.
pub(crate) fn base_name(domain_name: &str) -> &str {
    MIGRATION_SUFFIXES
        .iter()
        .find_map(|s| domain_name.strip_suffix(s))
        .filter(|b| !b.is_empty())
        .unwrap_or(domain_name)
}

/// FNV-1a, 64 bits: stable across releases and platforms, unlike std's hasher.
fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// SplitMix64's finaliser: FNV alone leaves names that differ in their last byte with
/// hashes that differ only in low bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The id of cluster `name`: 0 for the default cluster, else a nonzero 32-bit hash.
pub fn cluster_id(name: &str) -> u32 {
    if name == DEFAULT_CLUSTER {
        return DEFAULT_CLUSTER_ID;
    }
    let h = mix(fnv1a64(&[b"xmx-cluster:", name.as_bytes()]));
    match (h >> 32) as u32 {
        DEFAULT_CLUSTER_ID => 1,
        id => id,
    }
}

/// The board MAC of guest `name` (its base name is used: see `base_name`).
pub fn guest_mac(name: &str) -> Mac {
    let h = mix(fnv1a64(&[b"xmx-guest:", base_name(name).as_bytes()]));
    let b = h.to_be_bytes();
    Mac([GUEST_MAC_PREFIX, b[0], b[1], b[2], b[3], b[4]])
}

/// The MX hostname of guest `name`.
pub(crate) fn guest_hostname(name: &str) -> String {
    format!("{}:0", base_name(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_names() {
        for good in ["default", "blue", "a", "x.y_z-1", &"c".repeat(32)] {
            check_cluster_name(good).unwrap();
        }
        for bad in ["", "-x", "a b", "a/b", "é", &"c".repeat(33)] {
            assert!(
                matches!(check_cluster_name(bad), Err(Error::Invalid(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn guest_names() {
        for good in ["vm1", "h0-g0", "a.b", &"g".repeat(64)] {
            check_guest_name(good).unwrap();
        }
        for bad in ["", "a/b", "a b", "a\tb", "a\u{7}", &"g".repeat(65)] {
            assert!(
                matches!(check_guest_name(bad), Err(Error::Invalid(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn host_names() {
        check_host_name("h0").unwrap();
        check_host_name(&"h".repeat(63)).unwrap();
        for bad in ["", "a b", &"h".repeat(64), "a\nb"] {
            assert!(check_host_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn migration_suffixes_are_stripped() {
        assert_eq!(base_name("vm1"), "vm1");
        assert_eq!(base_name("vm1--incoming"), "vm1");
        assert_eq!(base_name("vm1--migratedaway"), "vm1");
        assert_eq!(base_name("--incoming"), "--incoming");
        assert_eq!(base_name("vm--incoming-x"), "vm--incoming-x");
    }

    #[test]
    fn cluster_ids_are_stable_and_nonzero() {
        assert_eq!(cluster_id(DEFAULT_CLUSTER), 0);
        // Pinned: hosts built from different releases must agree.
        assert_eq!(cluster_id("blue"), cluster_id("blue"));
        assert_ne!(cluster_id("blue"), cluster_id("red"));
        let ids: std::collections::HashSet<u32> =
            (0..1000).map(|i| cluster_id(&format!("c{i}"))).collect();
        assert_eq!(ids.len(), 1000);
        assert!(!ids.contains(&0));
    }

    #[test]
    fn guest_macs_are_stable_local_unicast_and_follow_the_base_name() {
        let m = guest_mac("vm1");
        assert_eq!(m.0[0], GUEST_MAC_PREFIX);
        assert!(m.is_unicast());
        assert_eq!(m.0[0] & 0x02, 0x02, "locally administered");
        assert_eq!(guest_mac("vm1"), m);
        assert_eq!(guest_mac("vm1--incoming"), m);
        assert_ne!(guest_mac("vm2"), m);
        let macs: std::collections::HashSet<Mac> =
            (0..5000).map(|i| guest_mac(&format!("g{i}"))).collect();
        assert_eq!(macs.len(), 5000);
    }

    #[test]
    fn pinned_values() {
        // The derivations are part of the fabric's contract: a change here renames every
        // guest and splits every cluster of a mixed-version fabric.
        assert_eq!(fnv1a64(&[b"a"]), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(guest_hostname("vm1--incoming"), "vm1:0");
    }
}

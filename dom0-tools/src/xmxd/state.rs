//! What xmxd remembers across restarts: the virtual clusters of this host and, per guest
//! name, its cluster, its MAC, whether it wants xmx, and the peer index it holds.
//!
//! Kept as one JSON file, `STATE_DIR/state.json`, replaced atomically (write, fsync,
//! rename). Only xmxd writes it; `xmx` goes through xmxd's control socket.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use xmx_wire::mxoe::Mac;

use super::error::{Error, Result};
use super::names::{self, DEFAULT_CLUSTER};

/// Name of the state file inside the state directory.
pub(crate) const STATE_FILE: &str = "state.json";
/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/xmx";

/// A virtual cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ClusterRecord {
    /// Its id, derived from its name ([`names::cluster_id`]); kept for people reading the
    /// file, recomputed on load.
    pub(crate) id: u32,
}

/// What this host knows of one guest, by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct GuestRecord {
    /// Its cluster (exactly one).
    pub(crate) cluster: String,
    /// Its board MAC, recorded when first derived.
    #[serde(with = "mac_text")]
    pub(crate) mac: Mac,
    /// Attach the xmx device whenever a domain of this name runs here.
    pub(crate) auto_attach: bool,
    /// The peer index this guest holds, once placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) index: Option<u16>,
    /// When the index was first claimed (seconds since the epoch): the older claim keeps
    /// an index both claim.
    #[serde(default)]
    pub(crate) since: u32,
}

/// The whole state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct XmxdState {
    /// Clusters by name; the default cluster is always there.
    pub(crate) clusters: BTreeMap<String, ClusterRecord>,
    /// Guests by (base) name.
    pub(crate) guests: BTreeMap<String, GuestRecord>,
}

impl Default for XmxdState {
    fn default() -> Self {
        let mut clusters = BTreeMap::new();
        clusters.insert(
            DEFAULT_CLUSTER.to_string(),
            ClusterRecord {
                id: names::DEFAULT_CLUSTER_ID,
            },
        );
        XmxdState {
            clusters,
            guests: BTreeMap::new(),
        }
    }
}

impl XmxdState {
    /// Repair what a hand-edited or older file may hold: ids recomputed, the default
    /// cluster present, invalid names refused, guests of unknown clusters moved to the
    /// default one.
    fn normalise(&mut self) -> Result<()> {
        for (name, rec) in self.clusters.iter_mut() {
            names::check_cluster_name(name)?;
            rec.id = names::cluster_id(name);
        }
        self.clusters
            .entry(DEFAULT_CLUSTER.to_string())
            .or_insert(ClusterRecord {
                id: names::DEFAULT_CLUSTER_ID,
            });
        for (name, g) in self.guests.iter_mut() {
            names::check_guest_name(name)?;
            if !self.clusters.contains_key(&g.cluster) {
                tracing::warn!(guest = %name, cluster = %g.cluster, "unknown cluster; guest moved to the default cluster");
                g.cluster = DEFAULT_CLUSTER.to_string();
            }
            if !g.mac.is_unicast() {
                return Err(Error::Invalid(format!(
                    "guest {name}: MAC {} is not unicast",
                    g.mac
                )));
            }
        }
        Ok(())
    }

    /// The id of cluster `name`, if it exists here.
    pub(crate) fn cluster_id(&self, name: &str) -> Option<u32> {
        self.clusters.get(name).map(|c| c.id)
    }

    /// Create cluster `name`; returns its id.
    pub(crate) fn create_cluster(&mut self, name: &str) -> Result<u32> {
        names::check_cluster_name(name)?;
        if self.clusters.contains_key(name) {
            return Err(Error::Exists(format!("cluster {name}")));
        }
        let id = names::cluster_id(name);
        if let Some((other, _)) = self.clusters.iter().find(|(_, c)| c.id == id) {
            return Err(Error::Exists(format!(
                "cluster {name} would have id {id}, which {other} has; choose another name"
            )));
        }
        self.clusters.insert(name.to_string(), ClusterRecord { id });
        Ok(id)
    }

    /// Delete cluster `name`. Its members go back to the default cluster if `force`, else
    /// a cluster with members is refused. Returns the guests moved.
    pub(crate) fn delete_cluster(&mut self, name: &str, force: bool) -> Result<Vec<String>> {
        if name == DEFAULT_CLUSTER {
            return Err(Error::Invalid(
                "the default cluster cannot be deleted".into(),
            ));
        }
        if !self.clusters.contains_key(name) {
            return Err(Error::NotFound(format!("cluster {name}")));
        }
        let members = self.members(name);
        if !members.is_empty() && !force {
            return Err(Error::Busy(format!(
                "cluster {name} has members ({}); move them or delete with --force",
                members.join(", ")
            )));
        }
        for m in &members {
            if let Some(g) = self.guests.get_mut(m) {
                g.cluster = DEFAULT_CLUSTER.to_string();
            }
        }
        self.clusters.remove(name);
        Ok(members)
    }

    /// Guests recorded in cluster `name`.
    pub(crate) fn members(&self, name: &str) -> Vec<String> {
        self.guests
            .iter()
            .filter(|(_, g)| g.cluster == name)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The record of guest `name`, made (default cluster, derived MAC, no auto-attach) if
    /// there is none.
    pub(crate) fn guest_entry(&mut self, name: &str) -> Result<&mut GuestRecord> {
        names::check_guest_name(name)?;
        Ok(self
            .guests
            .entry(name.to_string())
            .or_insert_with(|| GuestRecord {
                cluster: DEFAULT_CLUSTER.to_string(),
                mac: names::guest_mac(name),
                auto_attach: false,
                index: None,
                since: 0,
            }))
    }

    /// Put guest `guest` in cluster `cluster` (which must exist). True if it moved.
    pub(crate) fn set_guest_cluster(&mut self, guest: &str, cluster: &str) -> Result<bool> {
        if !self.clusters.contains_key(cluster) {
            return Err(Error::NotFound(format!("cluster {cluster}")));
        }
        let g = self.guest_entry(guest)?;
        if g.cluster == cluster {
            return Ok(false);
        }
        g.cluster = cluster.to_string();
        Ok(true)
    }
}

/// The state and the file it lives in.
#[derive(Debug)]
pub(crate) struct StateStore {
    path: PathBuf,
    /// The current state; call [`StateStore::save`] after changing it.
    pub(crate) state: XmxdState,
}

impl StateStore {
    /// Load `dir/state.json`, or start empty if there is none. The directory is created.
    pub(crate) fn open(dir: &Path) -> Result<StateStore> {
        fs::create_dir_all(dir)?;
        let path = dir.join(STATE_FILE);
        let mut state = match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => XmxdState::default(),
            Err(e) => return Err(e.into()),
        };
        state.normalise()?;
        Ok(StateStore { path, state })
    }

    /// Where the state is kept.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Write the state: a temporary file, fsync'd, renamed over the old one.
    pub(crate) fn save(&self) -> Result<()> {
        let tmp = self.path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(&self.state)
            .map_err(|e| Error::Invalid(format!("encoding the state: {e}")))?;
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        fs::rename(&tmp, &self.path)?;
        Ok(())
    }
}

/// MACs as `aa:bb:cc:dd:ee:ff` in JSON.
pub(crate) mod mac_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use xmx_wire::mxoe::Mac;

    pub(crate) fn serialize<S: Serializer>(mac: &Mac, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(mac)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Mac, D::Error> {
        let text = String::deserialize(d)?;
        text.parse()
            .map_err(|e| serde::de::Error::custom(format!("MAC {text:?}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clusters_are_created_once_and_deleted_with_their_members_moved() {
        let mut s = XmxdState::default();
        assert_eq!(s.cluster_id(DEFAULT_CLUSTER), Some(0));
        let id = s.create_cluster("blue").unwrap();
        assert_eq!(id, names::cluster_id("blue"));
        assert!(matches!(s.create_cluster("blue"), Err(Error::Exists(_))));
        assert!(matches!(s.create_cluster("a b"), Err(Error::Invalid(_))));
        assert!(s.set_guest_cluster("vm1", "blue").unwrap());
        assert!(!s.set_guest_cluster("vm1", "blue").unwrap());
        assert!(matches!(
            s.set_guest_cluster("vm1", "red"),
            Err(Error::NotFound(_))
        ));
        assert_eq!(s.members("blue"), ["vm1"]);
        assert!(matches!(
            s.delete_cluster("blue", false),
            Err(Error::Busy(_))
        ));
        assert_eq!(s.delete_cluster("blue", true).unwrap(), ["vm1"]);
        assert_eq!(s.guests["vm1"].cluster, DEFAULT_CLUSTER);
        assert!(matches!(
            s.delete_cluster("blue", true),
            Err(Error::NotFound(_))
        ));
        assert!(matches!(
            s.delete_cluster(DEFAULT_CLUSTER, true),
            Err(Error::Invalid(_))
        ));
    }

    #[test]
    fn a_new_guest_gets_the_default_cluster_and_its_derived_mac() {
        let mut s = XmxdState::default();
        let g = s.guest_entry("vm7").unwrap().clone();
        assert_eq!(g.cluster, DEFAULT_CLUSTER);
        assert_eq!(g.mac, names::guest_mac("vm7"));
        assert!(!g.auto_attach);
        assert!(s.guest_entry("bad/name").is_err());
    }

    #[test]
    fn the_file_round_trips_and_is_repaired_on_load() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = StateStore::open(dir.path()).unwrap();
        assert_eq!(store.state, XmxdState::default());
        store.state.create_cluster("blue").unwrap();
        let g = store.state.guest_entry("vm1").unwrap();
        g.cluster = "blue".into();
        g.index = Some(4);
        g.since = 1234;
        store.save().unwrap();
        let again = StateStore::open(dir.path()).unwrap();
        assert_eq!(again.state, store.state);

        // A hand-edited file: a wrong id, no default cluster, a guest of a missing cluster.
        let text = r#"{"clusters":{"blue":{"id":99}},
            "guests":{"vm2":{"cluster":"red","mac":"06:00:00:00:00:02","auto_attach":true}}}"#;
        fs::write(dir.path().join(STATE_FILE), text).unwrap();
        let repaired = StateStore::open(dir.path()).unwrap().state;
        assert_eq!(repaired.clusters["blue"].id, names::cluster_id("blue"));
        assert_eq!(repaired.cluster_id(DEFAULT_CLUSTER), Some(0));
        assert_eq!(repaired.guests["vm2"].cluster, DEFAULT_CLUSTER);
        assert_eq!(repaired.guests["vm2"].index, None);

        for bad in [
            "not json",
            r#"{"clusters":{"a b":{"id":1}},"guests":{}}"#,
            r#"{"clusters":{},"guests":{"vm":{"cluster":"default","mac":"ff:ff:ff:ff:ff:ff","auto_attach":true}}}"#,
            r#"{"clusters":{},"guests":{"vm":{"cluster":"default","mac":"nope","auto_attach":true}}}"#,
        ] {
            fs::write(dir.path().join(STATE_FILE), bad).unwrap();
            assert!(
                matches!(StateStore::open(dir.path()), Err(Error::Invalid(_))),
                "{bad}"
            );
        }
    }
}

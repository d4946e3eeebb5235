//! The peer table this host takes part in: its guests' claims on indices, the state saved
//! across restarts, and the views published to the backend, the guests and the direct
//! channels.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use xmx_hv::DomId;
use xmx_wire::mxoe::Mac;
use xmx_wire::peer_view;

use super::{unix_now, Core};
use crate::xmxd::announce::EntryRepr;
use crate::xmxd::error::Result;
use crate::xmxd::table::{self, Claim, FabricTable};
use crate::xmxd::{direct, xsnodes};

impl Core {
    pub(super) fn save(&mut self) -> Result<()> {
        self.store.save()?;
        xsnodes::mirror_clusters(self.xs.as_ref(), self.cfg.toolstack, &self.store.state)?;
        Ok(())
    }

    /// This host's attached guests, as announced.
    pub(super) fn local_entries(&self) -> Vec<EntryRepr> {
        let mut out: Vec<EntryRepr> = self
            .domains
            .values()
            .filter_map(|d| d.attached.as_ref())
            .filter_map(|a| {
                let g = self.store.state.guests.get(&a.guest)?;
                Some(EntryRepr {
                    index: g.index,
                    since: g.since,
                    mac: a.mac,
                    cluster: a.cluster,
                    cluster_name: g.cluster.clone(),
                    guest: a.guest.clone(),
                })
            })
            .collect();
        out.sort_by(|a, b| a.guest.cmp(&b.guest));
        out
    }

    pub(super) fn claims(&self) -> Vec<Claim> {
        let me = self.discovery.me();
        let mut claims: Vec<Claim> = self
            .local_entries()
            .into_iter()
            .map(|entry| Claim {
                host: me,
                host_name: self.cfg.host_name.clone(),
                local: true,
                entry,
            })
            .collect();
        for (mac, h) in self.discovery.hosts() {
            claims.extend(h.entries.iter().map(|e| Claim {
                host: mac,
                host_name: h.name.clone(),
                local: false,
                entry: e.clone(),
            }));
        }
        claims
    }

    /// Recompute the table from the local guests and the fabric, claim indices for local
    /// guests that have none, announce, and push to the backend.
    pub(super) fn refresh(&mut self) {
        let now = Instant::now();
        let settled = self.settle_at.is_none();
        let mut claims = self.claims();
        let mut table = table::compute(&claims);
        if settled && self.claim_indices(&table, &mut claims) {
            if let Err(e) = self.save() {
                tracing::warn!(error = %e, "saving claimed indices");
            }
            table = table::compute(&claims);
        }
        self.discovery.set_local(self.local_entries(), now);
        for p in &table.peers {
            let since = claims
                .iter()
                .find(|c| c.entry.mac == p.mac)
                .map_or(0, |c| c.entry.since);
            self.remembered.insert(p.mac, (p.index, since));
        }
        // Bounded by what the fabric announces; a flood of made-up MACs is forgotten.
        if self.remembered.len() > 2 * usize::from(table::INDEX_LIMIT) {
            self.remembered.retain(|m, _| table.by_mac(*m).is_some());
        }
        if table != self.table {
            for c in &table.conflicts {
                if !self.table.conflicts.contains(c) {
                    tracing::warn!(guest = %c.guest, host = %c.host, reason = %c.reason, "peer left out");
                }
            }
            self.table = table;
            self.generation += 1;
            tracing::info!(
                peers = self.table.peers.len(),
                generation = self.generation,
                "peer table changed"
            );
        }
        if settled {
            self.backend.push(self.table.to_specs());
        }
        self.publish_views();
        self.sync_direct();
    }

    /// Offer a direct channel to every pair of attached guests of this host in one
    /// cluster, and revoke the others.
    pub(super) fn sync_direct(&mut self) {
        let members: Vec<direct::Member> = self
            .domains
            .iter()
            .filter(|(_, d)| !d.front_closed)
            .filter_map(|(&domid, d)| {
                let a = d.attached.as_ref()?;
                self.table.by_mac(a.mac)?;
                Some(direct::Member {
                    domid,
                    mac: a.mac,
                    cluster: a.cluster,
                })
            })
            .collect();
        let domains = &self.domains;
        self.direct.forget_gone(|d| domains.contains_key(&d));
        self.direct
            .sync(self.xs.as_ref(), &members, std::time::Instant::now());
    }

    /// Show every attached guest the peers it may reach (its cluster's) in xenstore.
    pub(super) fn publish_views(&mut self) {
        let ts = self.cfg.toolstack;
        let mut wanted: BTreeMap<DomId, BTreeMap<u16, String>> = BTreeMap::new();
        for (id, d) in &self.domains {
            let Some(a) = &d.attached else { continue };
            let view = match self.table.by_mac(a.mac) {
                Some(me) => self
                    .table
                    .visible_to(me.cluster_id)
                    .map(|p| (p.index, peer_view::entry_value(p.mac, &p.hostname)))
                    .collect(),
                None => BTreeMap::new(),
            };
            wanted.insert(*id, view);
        }
        let gone: Vec<DomId> = self
            .published
            .keys()
            .filter(|id| !wanted.contains_key(id))
            .copied()
            .collect();
        for id in gone {
            self.published.remove(&id);
            if let Err(e) = xsnodes::remove_node(self.xs.as_ref(), &xsnodes::peers_dir(ts, id)) {
                tracing::warn!(domid = id, error = %e, "removing a guest's peer view");
            }
        }
        for (id, view) in wanted {
            let before = self.published.get(&id);
            if before == Some(&view) {
                continue;
            }
            match xsnodes::publish_peers(self.xs.as_ref(), ts, id, before, &view) {
                Ok(()) => {
                    self.published.insert(id, view);
                }
                Err(e) => {
                    tracing::warn!(domid = id, error = %e, "publishing a guest's peer view");
                    self.published.remove(&id);
                }
            }
        }
    }

    /// Claim an index for every local guest `table` left unplaced, recording it in the
    /// state and in `claims`. True if any was claimed.
    pub(super) fn claim_indices(&mut self, table: &FabricTable, claims: &mut [Claim]) -> bool {
        let held: HashMap<Mac, u16> = self.remembered.iter().map(|(m, (i, _))| (*m, *i)).collect();
        let mut claimed = false;
        for c in table.unplaced.iter().filter(|c| c.local) {
            let Some(index) = table::pick_index(c.entry.mac, claims, &held) else {
                tracing::error!(guest = %c.entry.guest, "no peer index left");
                continue;
            };
            // A guest that held this index before (it migrated here) keeps its age.
            let since = match self.remembered.get(&c.entry.mac) {
                Some(&(i, since)) if i == index => since,
                _ => unix_now(),
            };
            let Some(g) = self.store.state.guests.get_mut(&c.entry.guest) else {
                continue;
            };
            tracing::info!(guest = %c.entry.guest, index, "peer index claimed");
            g.index = Some(index);
            g.since = since;
            claimed = true;
            for mine in claims
                .iter_mut()
                .filter(|x| x.local && x.entry.mac == c.entry.mac)
            {
                mine.entry.index = Some(index);
                mine.entry.since = since;
            }
        }
        claimed
    }
}

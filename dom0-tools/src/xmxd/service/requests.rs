//! The answers to `xmx` on the control socket, and the reports they carry.

use std::path::Path;

use serde_json::json;
use xmx_backend::xenbus::toolstack;
use xmx_hv::DomId;

use super::{Core, DEVID};
use crate::xmxd::control::{
    ClusterReport, DirectReport, GuestStatus, PeersReport, QosReport, StatusReport, XmxdRequest,
};
use crate::xmxd::error::{Error, Result};
use crate::xmxd::names::{self, DEFAULT_CLUSTER};
use crate::xmxd::xsnodes;

impl Core {
    pub(super) fn answer(&mut self, request: XmxdRequest) -> Result<serde_json::Value> {
        let value = match request {
            XmxdRequest::Status => json!(self.status()),
            XmxdRequest::Peers { guest, .. } => json!(self.peers(guest.as_deref())?),
            XmxdRequest::Guests => json!(self.guests()),
            XmxdRequest::Clusters => json!(self.clusters()),
            XmxdRequest::ClusterCreate { name } => {
                let id = self.store.state.create_cluster(&name)?;
                self.save()?;
                tracing::info!(cluster = %name, id, "cluster created");
                json!({ "id": id })
            }
            XmxdRequest::ClusterDelete { name, force } => {
                let moved = self.store.state.delete_cluster(&name, force)?;
                self.save()?;
                self.evaluate_guests(&moved);
                tracing::info!(cluster = %name, ?moved, "cluster deleted");
                json!({ "moved": moved })
            }
            XmxdRequest::ClusterAdd { name, guest, new } => {
                let guest = self.resolve_guest(&guest)?;
                let running = self.runs_here(&guest);
                // A name nobody knows is far more often a typo than a guest prepared
                // ahead of its first start: recording it silently would look like a move.
                if !new && !running && !self.knows_guest(&guest) {
                    return Err(Error::NotFound(format!(
                        "guest {guest}: no domain of that name runs on this host and no host \
                         knows it (to record it before it starts, ask again with --new)"
                    )));
                }
                let moved = self.store.state.set_guest_cluster(&guest, &name)?;
                // A guest put in a cluster wants xmx.
                let g = self.store.state.guest_entry(&guest)?;
                let wanted = !std::mem::replace(&mut g.auto_attach, true);
                if moved || wanted {
                    self.save()?;
                    tracing::info!(%guest, cluster = %name, "guest moved");
                    self.evaluate_guests(&[guest]);
                }
                json!({ "running": running })
            }
            XmxdRequest::ClusterRemove { name, guest } => {
                let guest = self.resolve_guest(&guest)?;
                let in_it = self
                    .store
                    .state
                    .guests
                    .get(&guest)
                    .is_some_and(|g| g.cluster == name);
                if !in_it {
                    return Err(Error::NotFound(format!("guest {guest} in cluster {name}")));
                }
                self.store
                    .state
                    .set_guest_cluster(&guest, DEFAULT_CLUSTER)?;
                self.save()?;
                self.evaluate_guests(&[guest]);
                serde_json::Value::Null
            }
            XmxdRequest::Attach { domid, cluster } => {
                // It may have been created a moment ago, perhaps under the id of a domain
                // whose destroy is not yet seen: look again before acting.
                self.scan_domains()?;
                if !self.domains.contains_key(&domid) {
                    return Err(Error::NotFound(format!("domain {domid}")));
                }
                let cluster = cluster.unwrap_or_default();
                if !cluster.is_empty() {
                    names::check_cluster_name(&cluster)?;
                }
                xsnodes::write_wish(self.xs.as_ref(), self.cfg.toolstack, domid, &cluster)?;
                self.evaluate(domid);
                self.refresh();
                let name = self.domains.get(&domid).and_then(|d| d.name.clone());
                let status = name
                    .map(|n| names::base_name(&n).to_owned())
                    .and_then(|n| self.guest_status(&n));
                json!(status)
            }
            XmxdRequest::Qos { guest, weight } => {
                let guest = self.resolve_guest(&guest)?;
                let ts = self.cfg.toolstack;
                if let Some(w) = weight {
                    xsnodes::write_qos(self.xs.as_ref(), ts, &guest, w)?;
                    tracing::info!(%guest, weight = w, "QoS weight recorded");
                }
                let weight = xsnodes::read_qos(self.xs.as_ref(), ts, &guest)?;
                let domains: Vec<DomId> = self
                    .domains
                    .iter()
                    .filter(|(_, d)| d.attached.as_ref().is_some_and(|a| a.guest == guest))
                    .map(|(&id, _)| id)
                    .collect();
                for &id in &domains {
                    toolstack::write_qos_weight(self.xs.as_ref(), ts, id, DEVID, weight)?;
                }
                json!(QosReport {
                    guest,
                    weight,
                    domains
                })
            }
            XmxdRequest::Direct { enabled } => {
                if let Some(on) = enabled {
                    self.direct.set_enabled(on);
                    tracing::info!(enabled = on, "direct channels switched");
                    self.sync_direct();
                }
                json!(DirectReport {
                    enabled: self.direct.enabled(),
                    pairs: self.direct.offered(),
                })
            }
            XmxdRequest::DirectLeaving { domid, leaving } => {
                if !self.domains.contains_key(&domid) {
                    return Err(Error::NotFound(format!("domain {domid}")));
                }
                self.direct.set_leaving(domid, leaving);
                tracing::info!(domid, leaving, "direct channels of a domain about to leave");
                self.sync_direct();
                json!(DirectReport {
                    enabled: self.direct.enabled(),
                    pairs: self.direct.offered(),
                })
            }
            XmxdRequest::Detach { domid } => {
                let Some(d) = self.domains.get(&domid) else {
                    return Err(Error::NotFound(format!("domain {domid}")));
                };
                xsnodes::remove_wish(self.xs.as_ref(), self.cfg.toolstack, domid)?;
                if let Some(name) = d.name.clone() {
                    if let Some(g) = self.store.state.guests.get_mut(names::base_name(&name)) {
                        g.auto_attach = false;
                    }
                    self.save()?;
                }
                self.evaluate(domid);
                serde_json::Value::Null
            }
        };
        self.refresh();
        self.transmit();
        Ok(value)
    }

    /// A guest named directly, or by the domid of its running domain.
    pub(super) fn resolve_guest(&self, guest: &str) -> Result<String> {
        if let Ok(domid) = guest.parse::<DomId>() {
            let name = self
                .domains
                .get(&domid)
                .and_then(|d| d.name.clone())
                .ok_or_else(|| Error::NotFound(format!("domain {domid}")))?;
            return Ok(names::base_name(&name).to_owned());
        }
        names::check_guest_name(guest)?;
        Ok(guest.to_owned())
    }

    /// Whether a domain of guest `guest` runs on this host.
    pub(super) fn runs_here(&self, guest: &str) -> bool {
        self.domains.values().any(|d| {
            d.name
                .as_deref()
                .is_some_and(|n| names::base_name(n) == guest)
        })
    }

    /// Whether guest `guest` is recorded here or announced by another host.
    pub(super) fn knows_guest(&self, guest: &str) -> bool {
        self.store.state.guests.contains_key(guest)
            || self
                .discovery
                .hosts()
                .any(|(_, h)| h.entries.iter().any(|e| e.guest == guest))
    }

    /// Re-evaluate the running domains of these guests.
    pub(super) fn evaluate_guests(&mut self, guests: &[String]) {
        let ids: Vec<DomId> = self
            .domains
            .iter()
            .filter(|(_, d)| {
                d.name
                    .as_deref()
                    .is_some_and(|n| guests.iter().any(|g| g == names::base_name(n)))
            })
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.evaluate(id);
        }
    }

    /// Reply of `status`.
    pub(crate) fn status(&self) -> StatusReport {
        StatusReport {
            host: self.cfg.host_name.clone(),
            host_mac: self.discovery.me(),
            iface: self.fabric.as_ref().map(|f| f.ifname().to_owned()),
            remote_hosts: self.remote_hosts(),
            table_generation: self.generation,
            peers: self.table.peers.len(),
            backend_synced: self.backend.synced(),
            backend_socket: self.backend.path().map(Path::to_path_buf),
            state_file: self.store.path().to_path_buf(),
        }
    }

    /// The whole table as `peers` reports it.
    pub(crate) fn table_report(&self) -> PeersReport {
        PeersReport {
            host: self.cfg.host_name.clone(),
            host_mac: self.discovery.me(),
            generation: self.generation,
            cluster: None,
            peers: self.table.peers.clone(),
            conflicts: self.table.conflicts.clone(),
        }
    }

    /// Reply of `peers`: the whole table, or what guest `guest` (a name or a domid of this
    /// host) may see.
    pub(crate) fn peers(&self, guest: Option<&str>) -> Result<PeersReport> {
        let mut report = self.table_report();
        if let Some(guest) = guest {
            let name = self.resolve_guest(guest)?;
            let peer = self
                .table
                .peers
                .iter()
                .find(|p| p.guest == name)
                .ok_or_else(|| Error::NotFound(format!("guest {name} in the peer table")))?;
            report.cluster = Some(peer.cluster.clone());
            report.peers = self.table.visible_to(peer.cluster_id).cloned().collect();
            report.conflicts.clear();
        }
        Ok(report)
    }

    pub(super) fn guest_status(&self, name: &str) -> Option<GuestStatus> {
        let g = self.store.state.guests.get(name)?;
        let domain = self
            .domains
            .iter()
            .find(|(_, d)| d.name.as_deref().map(names::base_name) == Some(name));
        Some(GuestStatus {
            name: name.to_owned(),
            domid: domain.map(|(id, _)| *id),
            cluster: g.cluster.clone(),
            cluster_id: self.store.state.cluster_id(&g.cluster).unwrap_or(0),
            mac: g.mac,
            index: self.table.by_mac(g.mac).map(|p| p.index),
            attached: domain.is_some_and(|(_, d)| d.attached.is_some()),
            auto_attach: g.auto_attach,
        })
    }

    /// Reply of `guests`: every guest recorded here.
    pub(crate) fn guests(&self) -> Vec<GuestStatus> {
        self.store
            .state
            .guests
            .keys()
            .filter_map(|n| self.guest_status(n))
            .collect()
    }

    /// Reply of `clusters`.
    pub(crate) fn clusters(&self) -> Vec<ClusterReport> {
        self.store
            .state
            .clusters
            .iter()
            .map(|(name, c)| ClusterReport {
                name: name.clone(),
                id: c.id,
                members: self.store.state.members(name),
            })
            .collect()
    }
}

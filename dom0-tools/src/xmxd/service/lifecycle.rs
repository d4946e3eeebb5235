//! How xmxd follows the guests: xenstore watches and scans find domains, their wishes
//! (cluster, name) are evaluated, and their xmx devices attached, moved or released.

use std::time::Duration;

use xmx_backend::xenbus::toolstack::{self, DeviceSpec};
use xmx_hv::DomId;
use xmx_wire::xenbus;

use super::{
    Core, DeviceAttachment, RunningDomain, DEVID, WATCH_FRONT_PREFIX, WATCH_INTRODUCE,
    WATCH_NAME_PREFIX, WATCH_RELEASE, WATCH_WISHES,
};
use crate::xmxd::error::Result;
use crate::xmxd::{names, xsnodes};

impl Core {
    /// Drain the xenstore watch queue and react.
    pub(super) fn handle_watches(&mut self) -> Result<()> {
        let mut scan = false;
        let mut wishes = false;
        let mut renamed = Vec::new();
        let mut fronts = Vec::new();
        let mut any = false;
        while let Some(ev) = self.xs.next_watch_event(Some(Duration::ZERO))? {
            any = true;
            match ev.token.as_str() {
                WATCH_INTRODUCE | WATCH_RELEASE => scan = true,
                WATCH_WISHES => wishes = true,
                t => {
                    let id_after = |prefix: &str| t.strip_prefix(prefix)?.parse::<DomId>().ok();
                    if let Some(id) = id_after(WATCH_NAME_PREFIX) {
                        renamed.push(id);
                    } else if let Some(id) = id_after(WATCH_FRONT_PREFIX) {
                        fronts.push(id);
                    }
                }
            }
        }
        if !any {
            return Ok(());
        }
        // Any event may be the first sign of a domid reused after a destroy not yet seen.
        self.scan_domains()?;
        for id in renamed {
            let Some(d) = self.domains.get_mut(&id) else {
                continue;
            };
            let Some(name) = xsnodes::domain_name(self.xs.as_ref(), id)? else {
                continue;
            };
            let renamed = match &d.name {
                Some(old) => names::base_name(old) != names::base_name(&name),
                None => false,
            };
            // The identity follows the name. libxl makes the name node dom0's, but where
            // the guest may write it, a new base name would let the guest pick another
            // guest's identity: such a domain keeps the name it was first seen with.
            if renamed && xsnodes::writable_by(self.xs.as_ref(), &xsnodes::name_path(id), id)? {
                tracing::warn!(domid = id, old = ?d.name, new = %name, "domain renamed itself; its xmx identity stays with the old name");
                continue;
            }
            if d.name.as_deref() != Some(name.as_str()) {
                d.name = Some(name);
                self.evaluate(id);
            }
        }
        fronts.dedup();
        for id in fronts {
            self.look_at_frontend(id)?;
        }
        if wishes || scan {
            let ids: Vec<DomId> = self.domains.keys().copied().collect();
            for id in ids {
                self.evaluate(id);
            }
        }
        self.refresh();
        Ok(())
    }

    /// Compare the running domains with the ones known: new ones are looked at, gone ones
    /// released.
    pub(super) fn scan_domains(&mut self) -> Result<()> {
        let known: Vec<DomId> = self.domains.keys().copied().collect();
        for id in known {
            if !self.xs.is_domain_introduced(id)? {
                self.release(id);
            } else if self.recycled(id)? {
                tracing::info!(domid = id, "domain id reused by a new domain");
                self.release_recycled(id);
            } else {
                self.learn_identity(id)?;
            }
        }
        for id in xsnodes::listed_domains(self.xs.as_ref())? {
            if id == self.cfg.toolstack || self.domains.contains_key(&id) {
                continue;
            }
            if !self.xs.is_domain_introduced(id)? {
                continue;
            }
            let token = format!("{WATCH_NAME_PREFIX}{id}");
            // A domain's name may be written after it is introduced: watch for it.
            self.xs.watch(&xsnodes::name_path(id), &token)?;
            // Its frontend closing (a suspend) ends its direct channels.
            self.xs.watch(
                &xsnodes::front_state_path(id, DEVID),
                &format!("{WATCH_FRONT_PREFIX}{id}"),
            )?;
            let name = xsnodes::domain_name(self.xs.as_ref(), id)?;
            let instance = xsnodes::domain_instance(self.xs.as_ref(), id)?;
            let front_closed = xsnodes::front_closed(self.xs.as_ref(), id, DEVID)?;
            tracing::debug!(domid = id, ?name, ?instance, "domain seen");
            self.domains.insert(
                id,
                RunningDomain {
                    name,
                    instance,
                    front_closed,
                    ..RunningDomain::default()
                },
            );
        }
        // Wishes of domains that no longer run (left by a crash of xmxd) are dropped.
        for id in xsnodes::wished_domains(self.xs.as_ref(), self.cfg.toolstack)? {
            if !self.domains.contains_key(&id) && !self.xs.is_domain_introduced(id)? {
                xsnodes::remove_wish(self.xs.as_ref(), self.cfg.toolstack, id)?;
            }
        }
        Ok(())
    }

    /// Read the name and instance of a domain first seen before the toolstack wrote them
    /// (it introduces a domain, then names it). The name watch tells of the write too, but
    /// a control request can be answered before that event is handled: `attach` right
    /// after a create must already know whose domain it is.
    fn learn_identity(&mut self, domid: DomId) -> Result<()> {
        let Some(d) = self.domains.get(&domid) else {
            return Ok(());
        };
        let (need_name, need_instance) = (d.name.is_none(), d.instance.is_none());
        if !need_name && !need_instance {
            return Ok(());
        }
        let name = if need_name {
            xsnodes::domain_name(self.xs.as_ref(), domid)?
        } else {
            None
        };
        let instance = if need_instance {
            xsnodes::domain_instance(self.xs.as_ref(), domid)?
        } else {
            None
        };
        let Some(d) = self.domains.get_mut(&domid) else {
            return Ok(());
        };
        if instance.is_some() {
            d.instance = instance;
        }
        if let Some(name) = name {
            tracing::debug!(domid, %name, "domain named after it was first seen");
            d.name = Some(name);
            self.evaluate(domid);
        }
        Ok(())
    }

    /// Read the state of domain `domid`'s frontend: one that closes its device (a suspend,
    /// a shutdown) loses its direct channels at once, so its peers go back to the backend
    /// path instead of writing into a channel nobody reads; they are offered again once it
    /// connects (a resume on this host). The node is the guest's: a guest that writes it
    /// can only end its own channels.
    fn look_at_frontend(&mut self, domid: DomId) -> Result<()> {
        if !self.domains.contains_key(&domid) {
            return Ok(());
        }
        let closed = xsnodes::front_closed(self.xs.as_ref(), domid, DEVID)?;
        let Some(d) = self.domains.get_mut(&domid) else {
            return Ok(());
        };
        if d.front_closed != closed {
            d.front_closed = closed;
            if !closed {
                self.direct.reopened(domid, std::time::Instant::now());
            }
            tracing::info!(
                domid,
                closed,
                "frontend {}: direct channels follow",
                if closed { "closed" } else { "open again" }
            );
            self.sync_direct();
        }
        Ok(())
    }

    /// Whether the domain known as `domid` was destroyed and the id given to a new one.
    fn recycled(&self, domid: DomId) -> Result<bool> {
        let Some(known) = self.domains.get(&domid).and_then(|d| d.instance.as_ref()) else {
            return Ok(false);
        };
        let now = xsnodes::domain_instance(self.xs.as_ref(), domid)?;
        Ok(now.as_ref() != Some(known))
    }

    /// Forget the old holder of a reused domid as [`Self::release`] does, but keep the wish
    /// node: it is keyed by domid and may already be the new domain's (the create hook writes
    /// it as soon as the domain exists).
    fn release_recycled(&mut self, domid: DomId) {
        let wish = xsnodes::read_wish(self.xs.as_ref(), self.cfg.toolstack, domid);
        self.release(domid);
        if let Ok(Some(cluster)) = wish {
            if let Err(e) =
                xsnodes::write_wish(self.xs.as_ref(), self.cfg.toolstack, domid, &cluster)
            {
                tracing::warn!(domid, error = %e, "keeping the wish node");
            }
        }
    }

    /// A domain went away: its device goes (the backend unmaps what the guest shared and
    /// closes its endpoints on seeing it), and its wish with it.
    pub(super) fn release(&mut self, domid: DomId) {
        let Some(d) = self.domains.remove(&domid) else {
            return;
        };
        if d.attached.is_some() {
            self.detach_device(domid);
        }
        // As xl does for its device classes: the domain's directory under the backend
        // root goes too (detaching removes only the device's own directory); so does the
        // guest's view of the peers.
        self.published.remove(&domid);
        for dir in [
            format!("{}/{domid}", xenbus::backend_root(self.cfg.toolstack)),
            xsnodes::peers_dir(self.cfg.toolstack, domid),
        ] {
            if let Err(e) = xsnodes::remove_node(self.xs.as_ref(), &dir) {
                tracing::warn!(domid, error = %e, "removing {dir}");
            }
        }
        if let Err(e) = xsnodes::remove_wish(self.xs.as_ref(), self.cfg.toolstack, domid) {
            tracing::warn!(domid, error = %e, "removing the wish node");
        }
        let _ = self.xs.unwatch(
            &xsnodes::name_path(domid),
            &format!("{WATCH_NAME_PREFIX}{domid}"),
        );
        let _ = self.xs.unwatch(
            &xsnodes::front_state_path(domid, DEVID),
            &format!("{WATCH_FRONT_PREFIX}{domid}"),
        );
        tracing::info!(domid, name = ?d.name, "domain gone");
    }

    /// Decide whether domain `domid` should have its device, with which identity, and make
    /// it so.
    pub(super) fn evaluate(&mut self, domid: DomId) {
        if let Err(e) = self.try_evaluate(domid) {
            tracing::warn!(domid, error = %e, "guest not set up");
        }
    }

    pub(super) fn try_evaluate(&mut self, domid: DomId) -> Result<()> {
        let Some(name) = self.domains.get(&domid).and_then(|d| d.name.clone()) else {
            return Ok(());
        };
        let base = names::base_name(&name).to_owned();
        if names::check_guest_name(&base).is_err() {
            return Ok(());
        }
        let wish = xsnodes::read_wish(self.xs.as_ref(), self.cfg.toolstack, domid)?;
        let withdrawn = wish.is_none() && self.domains.get(&domid).is_some_and(|d| d.wished);
        if let Some(d) = self.domains.get_mut(&domid) {
            d.wished = wish.is_some();
        }
        let mut dirty = false;
        if withdrawn {
            // `xmx-hook detach` (or `xmx detach`) took the wish back: so does the record.
            if let Some(g) = self.store.state.guests.get_mut(&base) {
                dirty |= std::mem::replace(&mut g.auto_attach, false);
            }
        }
        if let Some(cluster) = wish {
            dirty |= self.take_wish(&base, &cluster)?;
            if !cluster.is_empty() {
                // Recorded: later moves (`xmx cluster`) must not be undone by an old wish.
                // The emptied node still says the domain wants xmx.
                xsnodes::write_wish(self.xs.as_ref(), self.cfg.toolstack, domid, "")?;
            }
        } else if !self.store.state.guests.contains_key(&base) {
            dirty |= self.adopt_from_fabric(&base)?;
        }
        if dirty {
            self.save()?;
        }
        let wanted = self
            .store
            .state
            .guests
            .get(&base)
            .filter(|g| g.auto_attach)
            .map(|g| DeviceAttachment {
                guest: base.clone(),
                mac: g.mac,
                cluster: self.store.state.cluster_id(&g.cluster).unwrap_or(0),
            });
        let current = self.domains.get(&domid).and_then(|d| d.attached.clone());
        match (wanted, current) {
            (Some(w), None) => self.attach_device(domid, w),
            (Some(w), Some(c)) if w != c => {
                tracing::info!(domid, guest = %base, "identity changed; re-attaching the device");
                self.detach_device(domid);
                if !self.backend.wait_released(domid, self.cfg.release_timeout) {
                    tracing::warn!(domid, "the backend still serves the old device");
                }
                self.attach_device(domid, w);
            }
            (None, Some(_)) => self.detach_device(domid),
            _ => {}
        }
        Ok(())
    }

    /// Record what a wish node asks for `guest`. True if the state changed.
    pub(super) fn take_wish(&mut self, guest: &str, cluster: &str) -> Result<bool> {
        let state = &mut self.store.state;
        let mut changed = false;
        if !cluster.is_empty() && !state.clusters.contains_key(cluster) {
            match state.create_cluster(cluster) {
                Ok(_) => {
                    tracing::info!(%cluster, "cluster created for a domain that asked for it");
                    changed = true;
                }
                Err(e) => tracing::warn!(%guest, error = %e, "wished cluster refused"),
            }
        }
        let exists = state.guests.contains_key(guest);
        let g = state.guest_entry(guest)?;
        if !exists || !g.auto_attach {
            g.auto_attach = true;
            changed = true;
        }
        if !cluster.is_empty() && state.clusters.contains_key(cluster) {
            changed |= state.set_guest_cluster(guest, cluster)?;
        }
        Ok(changed)
    }

    /// A guest this host has no record of, announced by another host: it is migrating
    /// here. Take its identity (cluster, MAC, index) from the fabric. True if adopted.
    pub(super) fn adopt_from_fabric(&mut self, guest: &str) -> Result<bool> {
        let found = self
            .discovery
            .hosts()
            .flat_map(|(_, h)| h.entries.iter())
            .find(|e| e.guest == guest)
            .cloned();
        let Some(e) = found else {
            return Ok(false);
        };
        let state = &mut self.store.state;
        if !state.clusters.contains_key(&e.cluster_name) {
            state.create_cluster(&e.cluster_name)?;
        }
        let g = state.guest_entry(guest)?;
        g.auto_attach = true;
        g.cluster = e.cluster_name.clone();
        g.mac = e.mac;
        g.index = e.index;
        g.since = e.since;
        tracing::info!(%guest, cluster = %e.cluster_name, mac = %e.mac, "guest arrived from another host; identity kept");
        Ok(true)
    }

    pub(super) fn attach_device(&mut self, domid: DomId, want: DeviceAttachment) {
        let spec = DeviceSpec {
            domu: domid,
            devid: DEVID,
            mac: want.mac,
            cluster: want.cluster,
            hostname: names::guest_hostname(&want.guest),
        };
        let xs = self.xs.as_ref();
        let ts = self.cfg.toolstack;
        let result = match toolstack::attach(xs, ts, &spec) {
            Err(xmx_hv::Error::Exists(_)) => {
                // Left by an earlier run of xmxd: keep it if it is the device we want.
                let bdir = xenbus::backend_dir(ts, domid, DEVID);
                let front = xs.read(xmx_hv::XBT_NULL, &xenbus::frontend_dir(domid, DEVID));
                match DeviceSpec::read(xs, &bdir, domid, DEVID, "") {
                    Ok(found) if found == spec && front.is_ok() => Ok(()),
                    _ => {
                        let _ = toolstack::detach(xs, ts, domid, DEVID);
                        self.backend.wait_released(domid, self.cfg.release_timeout);
                        toolstack::attach(self.xs.as_ref(), ts, &spec)
                    }
                }
            }
            other => other,
        };
        match result {
            Ok(()) => {
                tracing::info!(domid, guest = %want.guest, mac = %want.mac, cluster = want.cluster, "xmx device attached");
                // The weight follows the guest's name onto whichever domain runs it.
                let weight = xsnodes::read_qos(self.xs.as_ref(), ts, &want.guest).and_then(|w| {
                    toolstack::write_qos_weight(self.xs.as_ref(), ts, domid, DEVID, w)
                });
                if let Err(e) = weight {
                    tracing::warn!(domid, error = %e, "copying the QoS weight");
                }
                if let Some(d) = self.domains.get_mut(&domid) {
                    d.attached = Some(want);
                }
            }
            Err(e) => tracing::warn!(domid, error = %e, "attaching the xmx device"),
        }
    }

    pub(super) fn detach_device(&mut self, domid: DomId) {
        match toolstack::detach(self.xs.as_ref(), self.cfg.toolstack, domid, DEVID) {
            Ok(()) | Err(xmx_hv::Error::NotFound(_)) => {
                tracing::info!(domid, "xmx device detached");
            }
            Err(e) => tracing::warn!(domid, error = %e, "detaching the xmx device"),
        }
        if let Some(d) = self.domains.get_mut(&domid) {
            d.attached = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use xmx_hv::{DOM0, XBT_NULL};
    use xmx_simkit::SimHost;

    use super::*;
    use crate::xmxd::control::{GuestStatus, XmxdRequest};
    use crate::xmxd::XmxdConfig;

    /// The toolstack introduces a domain before it names it; a scan between the two knows
    /// the domain without a name, and the name watch's event may still be queued when
    /// `attach` is answered.
    #[test]
    fn attach_knows_the_name_of_a_domain_first_seen_before_it_was_named() {
        let host = SimHost::start_with_hv_subdir("hv");
        let state = tempfile::tempdir().unwrap();
        let d = host.create("vm1");
        let xs = host.xs0();
        let name_path = xsnodes::name_path(d);
        xs.rm(XBT_NULL, &name_path).unwrap();
        let dom0 = host.attach(DOM0);
        let mut core = Core::new(&dom0, None, XmxdConfig::new("h0", state.path())).unwrap();
        core.scan_domains().unwrap();
        assert_eq!(core.domains.get(&d).map(|r| r.name.clone()), Some(None));

        // Named now; no watch event is handled before the request.
        xs.write(XBT_NULL, &name_path, b"vm1").unwrap();
        let reply = core
            .answer(XmxdRequest::Attach {
                domid: d,
                cluster: Some("blue".into()),
            })
            .unwrap();
        let g: Option<GuestStatus> = serde_json::from_value(reply).unwrap();
        let g = g.expect("the guest's status, not null");
        assert_eq!((g.name.as_str(), g.cluster.as_str()), ("vm1", "blue"));
        assert_eq!(g.domid, Some(d));
        assert!(g.attached);
    }
}

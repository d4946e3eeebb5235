//! The xmxd service: lifecycle of guests' xmx devices, the fabric's peer table, and the
//! answers to `xmx`.
//!
//! [`Core`] holds everything and reacts to one thing at a time (a xenstore watch, a
//! discovery frame, a timer, a control request). [`Xmxd`] runs it: one loop thread sleeping
//! in `poll` on the xenstore watch queue, the discovery socket and a wake-up eventfd, and
//! the control socket's threads, which take the same lock.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use serde_json::json;
use xmx_backend::service::LinkFault;
use xmx_backend::xenbus::toolstack::{self, DeviceSpec};
use xmx_hv::daemon::control::{LineServer, LineService, Refusal, Reply};
use xmx_hv::xs::wire::{INTRODUCE_DOMAIN, RELEASE_DOMAIN};
use xmx_hv::{DomId, Platform, Xenstore};
use xmx_wire::mxoe::Mac;
use xmx_wire::{peer_view, xenbus};

use super::announce::EntryRepr;
use super::backend::BackendLink;
use super::control::{
    refusal_reply, ClusterReport, DirectReport, GuestStatus, PeersReport, QosReport, Request,
    StatusReport, MAX_WAIT,
};
use super::direct;
use super::discovery::{Discovery, DiscoveryConfig};
use super::error::{Error, Result};
use super::fabric::PacketFabric;
use super::names::{self, DEFAULT_CLUSTER};
use super::state::StateStore;
use super::table::{self, Claim, FabricTable};
use super::xsnodes;

/// How xmxd runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// This host's name, announced with its guests.
    pub(crate) host_name: String,
    /// The domain xmxd and the backend run in (0: dom0).
    pub toolstack: DomId,
    /// Where the state file lives.
    pub(crate) state_dir: PathBuf,
    /// Where to serve the control socket, if anywhere.
    pub control_socket: Option<PathBuf>,
    /// The local backend's control socket, if there is a backend to feed.
    pub backend_socket: Option<PathBuf>,
    /// Discovery timers.
    pub discovery: DiscoveryConfig,
    /// How long a starting xmxd listens to the fabric before it claims new peer indices
    /// and pushes its first table (so it does not push a table without the other hosts).
    pub settle: Duration,
    /// How long a re-attach waits for the backend to let go of the old device.
    pub(crate) release_timeout: Duration,
}

impl Config {
    /// Defaults for a host named `host_name` keeping its state in `state_dir`.
    pub fn new(host_name: &str, state_dir: &Path) -> Config {
        let discovery = DiscoveryConfig::default();
        Config {
            host_name: host_name.to_owned(),
            toolstack: xmx_hv::DOM0,
            state_dir: state_dir.to_path_buf(),
            control_socket: None,
            backend_socket: None,
            discovery,
            settle: discovery.interval,
            release_timeout: Duration::from_secs(5),
        }
    }
}

/// Watch tokens.
const WATCH_INTRODUCE: &str = "xmxd:introduce";
const WATCH_RELEASE: &str = "xmxd:release";
const WATCH_WISHES: &str = "xmxd:wishes";
const WATCH_NAME_PREFIX: &str = "xmxd:name:";

/// Device index of the xmx device xmxd manages in each guest.
const DEVID: u32 = 0;

/// What the device of a domain was attached with.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Attached {
    guest: String,
    mac: Mac,
    cluster: u32,
}

/// A running domain of this host.
#[derive(Debug, Clone, Default)]
struct Domain {
    name: Option<String>,
    attached: Option<Attached>,
    /// It had a wish node when last looked at: a wish that vanishes is withdrawn.
    wished: bool,
}

fn unix_now() -> u32 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX))
        .unwrap_or(0)
}

/// Everything xmxd knows and does; see the module documentation.
pub struct Core {
    cfg: Config,
    xs: Box<dyn Xenstore>,
    store: StateStore,
    domains: BTreeMap<DomId, Domain>,
    discovery: Discovery,
    fabric: Option<PacketFabric>,
    backend: BackendLink,
    table: FabricTable,
    generation: u64,
    /// The index (and claim age) each MAC last held in the table.
    remembered: HashMap<Mac, (u16, u32)>,
    /// What each attached guest was last shown of the table, in xenstore.
    published: HashMap<DomId, BTreeMap<u16, String>>,
    settle_at: Option<Instant>,
    /// Set while the fabric socket reports errors (link down, interface gone): xmxd keeps
    /// serving its own host, looks at the interface again with a bounded backoff, and is
    /// back on the first frame the link carries again.
    fabric_fault: Option<LinkFault>,
    /// The direct channels offered between this host's guests.
    direct: direct::Broker,
}

impl Core {
    fn new(platform: &dyn Platform, fabric: Option<PacketFabric>, cfg: Config) -> Result<Core> {
        names::check_host_name(&cfg.host_name)?;
        let xs = platform.xenstore()?;
        xsnodes::ensure_root(xs.as_ref(), cfg.toolstack)?;
        let store = StateStore::open(&cfg.state_dir)?;
        xsnodes::mirror_clusters(xs.as_ref(), cfg.toolstack, &store.state)?;
        let direct = direct::Broker::new(xs.as_ref(), cfg.toolstack)?;
        let now = Instant::now();
        // Without a NIC this host is the whole fabric; its identity only has to be unicast.
        let me = fabric
            .as_ref()
            .map_or(Mac([0x02, 0, 0, 0, 0, 0]), PacketFabric::mac);
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
            ^ std::process::id().rotate_left(16);
        let discovery = Discovery::new(me, &cfg.host_name, cfg.discovery, seed, now);
        let backend = BackendLink::new(cfg.backend_socket.clone(), cfg.discovery.interval, now);
        let settle_at = fabric.as_ref().map(|_| now + cfg.settle);
        xs.watch(INTRODUCE_DOMAIN, WATCH_INTRODUCE)?;
        xs.watch(RELEASE_DOMAIN, WATCH_RELEASE)?;
        xs.watch(&xsnodes::wishes_dir(cfg.toolstack), WATCH_WISHES)?;
        tracing::info!(host = %cfg.host_name, %me, fabric = fabric.is_some(), "xmxd ready");
        Ok(Core {
            cfg,
            xs,
            store,
            domains: BTreeMap::new(),
            discovery,
            fabric,
            backend,
            table: FabricTable::default(),
            generation: 0,
            remembered: HashMap::new(),
            published: HashMap::new(),
            settle_at,
            fabric_fault: None,
            direct,
        })
    }

    // ----- read access -----

    /// The current peer table.
    pub fn table(&self) -> &FabricTable {
        &self.table
    }

    /// Bumped whenever the table changes.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether the backend holds the current table.
    pub fn backend_synced(&self) -> bool {
        self.backend.synced()
    }

    /// Whether domain `domid`'s xmx device is attached.
    pub fn is_attached(&self, domid: DomId) -> bool {
        self.domains
            .get(&domid)
            .is_some_and(|d| d.attached.is_some())
    }

    /// Whether the fabric socket is failing (link down, interface gone) right now.
    pub fn fabric_failing(&self) -> bool {
        self.fabric_fault.is_some()
    }

    /// Names of the remote hosts heard from.
    pub fn remote_hosts(&self) -> Vec<String> {
        self.discovery
            .hosts()
            .map(|(_, h)| h.name.clone())
            .collect()
    }

    // ----- events -----

    /// Drain the xenstore watch queue and react.
    fn handle_watches(&mut self) -> Result<()> {
        let mut scan = false;
        let mut wishes = false;
        let mut renamed = Vec::new();
        let mut any = false;
        while let Some(ev) = self.xs.next_watch_event(Some(Duration::ZERO))? {
            any = true;
            match ev.token.as_str() {
                WATCH_INTRODUCE | WATCH_RELEASE => scan = true,
                WATCH_WISHES => wishes = true,
                t => {
                    if let Some(id) = t
                        .strip_prefix(WATCH_NAME_PREFIX)
                        .and_then(|d| d.parse::<DomId>().ok())
                    {
                        renamed.push(id);
                    }
                }
            }
        }
        if !any {
            return Ok(());
        }
        if scan {
            self.scan_domains()?;
        }
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
    fn scan_domains(&mut self) -> Result<()> {
        let known: Vec<DomId> = self.domains.keys().copied().collect();
        for id in known {
            if !self.xs.is_domain_introduced(id)? {
                self.release(id);
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
            let name = xsnodes::domain_name(self.xs.as_ref(), id)?;
            tracing::debug!(domid = id, ?name, "domain seen");
            self.domains.insert(
                id,
                Domain {
                    name,
                    ..Domain::default()
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

    /// A domain went away: its device goes (the backend unmaps what the guest shared and
    /// closes its endpoints on seeing it), and its wish with it.
    fn release(&mut self, domid: DomId) {
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
        tracing::info!(domid, name = ?d.name, "domain gone");
    }

    /// Decide whether domain `domid` should have its device, with which identity, and make
    /// it so.
    fn evaluate(&mut self, domid: DomId) {
        if let Err(e) = self.try_evaluate(domid) {
            tracing::warn!(domid, error = %e, "guest not set up");
        }
    }

    fn try_evaluate(&mut self, domid: DomId) -> Result<()> {
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
            .map(|g| Attached {
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
    fn take_wish(&mut self, guest: &str, cluster: &str) -> Result<bool> {
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
    fn adopt_from_fabric(&mut self, guest: &str) -> Result<bool> {
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

    fn attach_device(&mut self, domid: DomId, want: Attached) {
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

    fn detach_device(&mut self, domid: DomId) {
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

    fn save(&mut self) -> Result<()> {
        self.store.save()?;
        xsnodes::mirror_clusters(self.xs.as_ref(), self.cfg.toolstack, &self.store.state)?;
        Ok(())
    }

    /// This host's attached guests, as announced.
    fn local_entries(&self) -> Vec<EntryRepr> {
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

    fn claims(&self) -> Vec<Claim> {
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
    fn refresh(&mut self) {
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
    fn sync_direct(&mut self) {
        let members: Vec<direct::Member> = self
            .domains
            .iter()
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
        self.direct.sync(self.xs.as_ref(), &members);
    }

    /// Show every attached guest the peers it may reach (its cluster's) in xenstore.
    fn publish_views(&mut self) {
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
    fn claim_indices(&mut self, table: &FabricTable, claims: &mut [Claim]) -> bool {
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

    fn handle_frames(&mut self) -> Result<()> {
        let Some(fabric) = &self.fabric else {
            return Ok(());
        };
        let now = Instant::now();
        let mut changed = false;
        let discovery = &mut self.discovery;
        match fabric.recv_all(|frame| changed |= discovery.handle_frame(now, frame)) {
            Ok(0) => {}
            Ok(_) => self.fabric_works(now),
            // The link went down, the interface vanished, the kernel ran short of
            // buffers: none of it is this host's fault, and its guests still need xmxd.
            Err(e) => self.fabric_failed(now, &e),
        }
        if changed {
            // A domain here without a record may be a guest the fabric just told us about
            // (migrating in).
            let guests = &self.store.state.guests;
            let strangers: Vec<DomId> = self
                .domains
                .iter()
                .filter(|(_, d)| {
                    d.attached.is_none()
                        && d.name
                            .as_deref()
                            .is_some_and(|n| !guests.contains_key(names::base_name(n)))
                })
                .map(|(id, _)| *id)
                .collect();
            for id in strangers {
                self.evaluate(id);
            }
            self.refresh();
        }
        Ok(())
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.check_fabric(now);
        let mut changed = self.discovery.handle_timeout(now);
        if self.settle_at.is_some_and(|at| now >= at) {
            self.settle_at = None;
            tracing::info!(hosts = self.discovery.known_hosts(), "fabric settled");
            changed = true;
        }
        if changed {
            self.refresh();
        }
        self.backend.handle_timeout(now);
    }

    fn transmit(&mut self) {
        let mut sent = false;
        while let Some(frame) = self.discovery.poll_transmit() {
            if let Some(f) = &self.fabric {
                match f.send(&frame) {
                    Ok(()) => sent = true,
                    Err(e) => tracing::debug!(error = %e, "discovery frame not sent"),
                }
            }
        }
        if sent {
            self.fabric_works(Instant::now());
        }
    }

    /// The fabric socket reported `error`: note it, and look at the interface soon.
    fn fabric_failed(&mut self, now: Instant, error: &std::io::Error) {
        match &mut self.fabric_fault {
            Some(f) => {
                f.errors += 1;
                tracing::debug!(%error, "fabric still failing");
            }
            None => {
                tracing::warn!(%error, "fabric link failed; serving this host's guests and retrying");
                self.fabric_fault = Some(LinkFault::new(now));
            }
        }
    }

    /// A frame went out or came in: a failed link is back.
    fn fabric_works(&mut self, now: Instant) {
        if let Some(f) = self.fabric_fault.take() {
            tracing::info!(
                down_ms = f.lasted(now).as_millis() as u64,
                errors = f.errors,
                "fabric link back"
            );
            // The others may have missed our news while the link was down, and we theirs.
            self.discovery.reannounce(now);
        }
    }

    /// While the link fails: is the interface a new one (deleted and created again)? Then
    /// open a socket on it; otherwise the socket resumes by itself when the link is up.
    fn check_fabric(&mut self, now: Instant) {
        let (Some(fault), Some(fabric)) = (&mut self.fabric_fault, &self.fabric) else {
            return;
        };
        if !fault.due(now) {
            return;
        }
        match fabric.reopen_if_replaced() {
            Ok(None) => {}
            Ok(Some(fresh)) => {
                if fresh.mac() != self.discovery.me() {
                    // Our identity on the fabric stays what the others know.
                    tracing::warn!(old = %self.discovery.me(), new = %fresh.mac(),
                        "the re-created interface has another MAC; announcing with the old one");
                }
                tracing::info!(
                    iface = fresh.ifname(),
                    "fabric interface re-created; socket reopened"
                );
                self.fabric = Some(fresh);
                self.discovery.reannounce(now);
            }
            Err(e) => tracing::debug!(error = %e, "fabric interface not reopened"),
        }
    }

    fn poll_timeout(&self) -> Instant {
        [
            Some(self.discovery.poll_timeout()),
            self.settle_at,
            self.backend.poll_timeout(),
            self.fabric_fault.map(|f| f.check_at),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(1))
    }

    /// One pass over every source.
    fn step(&mut self) -> Result<()> {
        self.handle_watches()?;
        self.handle_frames()?;
        self.handle_timeout(Instant::now());
        self.transmit();
        Ok(())
    }

    // ----- control requests -----

    fn answer(&mut self, request: Request) -> Result<serde_json::Value> {
        let value = match request {
            Request::Status => json!(self.status()),
            Request::Peers { guest, .. } => json!(self.peers(guest.as_deref())?),
            Request::Guests => json!(self.guests()),
            Request::Clusters => json!(self.clusters()),
            Request::ClusterCreate { name } => {
                let id = self.store.state.create_cluster(&name)?;
                self.save()?;
                tracing::info!(cluster = %name, id, "cluster created");
                json!({ "id": id })
            }
            Request::ClusterDelete { name, force } => {
                let moved = self.store.state.delete_cluster(&name, force)?;
                self.save()?;
                self.evaluate_guests(&moved);
                tracing::info!(cluster = %name, ?moved, "cluster deleted");
                json!({ "moved": moved })
            }
            Request::ClusterAdd { name, guest, new } => {
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
            Request::ClusterRemove { name, guest } => {
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
            Request::Attach { domid, cluster } => {
                if !self.domains.contains_key(&domid) {
                    // It may have been created a moment ago: look again before refusing.
                    self.scan_domains()?;
                }
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
            Request::Qos { guest, weight } => {
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
            Request::Direct { enabled } => {
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
            Request::Detach { domid } => {
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
    fn resolve_guest(&self, guest: &str) -> Result<String> {
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
    fn runs_here(&self, guest: &str) -> bool {
        self.domains.values().any(|d| {
            d.name
                .as_deref()
                .is_some_and(|n| names::base_name(n) == guest)
        })
    }

    /// Whether guest `guest` is recorded here or announced by another host.
    fn knows_guest(&self, guest: &str) -> bool {
        self.store.state.guests.contains_key(guest)
            || self
                .discovery
                .hosts()
                .any(|(_, h)| h.entries.iter().any(|e| e.guest == guest))
    }

    /// Re-evaluate the running domains of these guests.
    fn evaluate_guests(&mut self, guests: &[String]) {
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

    fn guest_status(&self, name: &str) -> Option<GuestStatus> {
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

/// The core and the condition variable its changes are announced on.
struct Shared {
    core: Mutex<Core>,
    changed: Condvar,
    /// Set when xmxd stops: stopping the control socket waits for the requests being
    /// answered, so a `peers` request waiting for a change must not wait any longer.
    closing: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Run `f` on the core, then wake whoever waits for a change (they re-check).
    fn with<T>(&self, f: impl FnOnce(&mut Core) -> T) -> T {
        let out = f(&mut self.lock());
        self.changed.notify_all();
        out
    }

    fn dispatch(&self, request: Request) -> Reply {
        if let Request::Peers {
            after: Some(after),
            timeout_ms,
            ..
        } = &request
        {
            let wait = Duration::from_millis(timeout_ms.unwrap_or(0)).min(MAX_WAIT);
            let deadline = Instant::now() + wait;
            let mut core = self.lock();
            while core.generation <= *after && !self.closing.load(Ordering::Acquire) {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                core = self
                    .changed
                    .wait_timeout(core, left)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
        }
        match self.with(|core| core.answer(request)) {
            Ok(v) => Reply::ok(v),
            Err(e) => Reply::err(e.to_reply()),
        }
    }

    /// [`Shared::dispatch`], then a wake-up of the loop: timers may have moved, and the
    /// loop recomputes its sleep.
    fn answer(&self, request: Request, wake: &EventFd) -> Reply {
        let reply = self.dispatch(request);
        let _ = wake.write(1);
        reply
    }

    /// Ends the waits of requests being answered, for good.
    fn close(&self) {
        // Under the lock: a waiter between its check and its wait would miss the notice.
        let _core = self.lock();
        self.closing.store(true, Ordering::Release);
        self.changed.notify_all();
    }
}

/// A running xmxd: the loop thread and the control socket. Dropping it stops both.
pub struct Xmxd {
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    wake: Arc<EventFd>,
    thread: Option<JoinHandle<Result<()>>>,
    control: Option<LineServer>,
}

/// What the control socket asks of a running xmxd.
struct ControlSide {
    shared: Arc<Shared>,
    wake: Arc<EventFd>,
}

impl LineService for ControlSide {
    type Request = Request;
    type Reply = Reply;

    fn answer(&self, request: Request) -> Reply {
        self.shared.answer(request, &self.wake)
    }

    fn refuse(&self, refusal: Refusal) -> Reply {
        refusal_reply(refusal)
    }
}

fn borrow(fd: RawFd) -> BorrowedFd<'static> {
    // SAFETY: the descriptors polled belong to the xenstore connection and the discovery
    // socket, which the core owns for as long as the loop thread runs; the loop never
    // outlives the core (it holds an Arc to it).
    unsafe { BorrowedFd::borrow_raw(fd) }
}

impl Xmxd {
    /// Start xmxd for `platform`'s domain, with `fabric` to the other hosts (None: this
    /// host alone).
    pub fn start(
        platform: &dyn Platform,
        fabric: Option<PacketFabric>,
        cfg: Config,
    ) -> Result<Xmxd> {
        let control_path = cfg.control_socket.clone();
        let core = Core::new(platform, fabric, cfg)?;
        let shared = Arc::new(Shared {
            core: Mutex::new(core),
            changed: Condvar::new(),
            closing: AtomicBool::new(false),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(
            EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
                .map_err(std::io::Error::from)?,
        );
        let thread = {
            let (shared, stop, wake) = (shared.clone(), stop.clone(), wake.clone());
            std::thread::Builder::new()
                .name("xmxd".into())
                .spawn(move || run_loop(&shared, &stop, &wake))?
        };
        let mut xmxd = Xmxd {
            shared,
            stop,
            wake,
            thread: Some(thread),
            control: None,
        };
        if let Some(path) = control_path {
            let side = ControlSide {
                shared: xmxd.shared.clone(),
                wake: xmxd.wake.clone(),
            };
            xmxd.control = Some(LineServer::start(&path, Some(0o600), "xmxd-control", side)?);
        }
        Ok(xmxd)
    }

    /// Answer a request as the control socket does.
    pub fn call(&self, request: Request) -> Reply {
        self.shared.answer(request, &self.wake)
    }

    /// The current peer table report.
    pub fn peers(&self) -> PeersReport {
        self.shared.lock().table_report()
    }

    /// Read the core.
    pub fn inspect<T>(&self, f: impl FnOnce(&Core) -> T) -> T {
        f(&self.shared.lock())
    }

    /// Wait until `cond` holds, re-checking after every event xmxd handles; up to
    /// `timeout`. Returns whether it held.
    pub fn wait_until(&self, timeout: Duration, mut cond: impl FnMut(&Core) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut core = self.shared.lock();
        loop {
            if cond(&core) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            core = self
                .shared
                .changed
                .wait_timeout(core, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// Wait until the loop ends by itself (a fatal error) or a [`Stopper`] stops it from
    /// elsewhere.
    pub fn join(mut self) -> Result<()> {
        let result = match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(Error::Io(std::io::Error::other("xmxd loop panicked")))),
            None => Ok(()),
        };
        self.shared.close();
        self.control = None;
        result
    }

    /// A handle that stops the loop from another thread (a signal handler thread).
    pub fn stopper(&self) -> Stopper {
        Stopper {
            stop: self.stop.clone(),
            wake: self.wake.clone(),
        }
    }

    fn halt(&mut self) -> Result<()> {
        self.shared.close();
        self.control = None;
        self.stop.store(true, Ordering::Release);
        let _ = self.wake.write(1);
        match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(Error::Io(std::io::Error::other("xmxd loop panicked")))),
            None => Ok(()),
        }
    }
}

impl Drop for Xmxd {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

/// Stops a running [`Xmxd`] from another thread; cheap to clone.
#[derive(Clone)]
pub struct Stopper {
    stop: Arc<AtomicBool>,
    wake: Arc<EventFd>,
}

impl Stopper {
    /// Ask the loop to end.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.wake.write(1);
    }
}

fn run_loop(shared: &Shared, stop: &AtomicBool, wake: &EventFd) -> Result<()> {
    let xs_fd = shared.lock().xs.watch_fd();
    while !stop.load(Ordering::Acquire) {
        // The fabric socket may have been opened again (a re-created interface).
        let (next, fabric_fd) = shared.with(|core| -> Result<(Instant, Option<RawFd>)> {
            core.step()?;
            Ok((
                core.poll_timeout(),
                core.fabric.as_ref().map(PacketFabric::raw_fd),
            ))
        })?;
        let left = next.saturating_duration_since(Instant::now());
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        let mut fds = vec![
            PollFd::new(borrow(xs_fd), PollFlags::POLLIN),
            PollFd::new(wake.as_fd(), PollFlags::POLLIN),
        ];
        if let Some(fd) = fabric_fd {
            fds.push(PollFd::new(borrow(fd), PollFlags::POLLIN));
        }
        match poll(
            &mut fds,
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(Error::Io(e.into())),
        }
        let _ = wake.read();
    }
    tracing::info!("xmxd stopping");
    Ok(())
}

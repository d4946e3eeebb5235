//! Everything behind the daemon's one lock: the database, the connections with their
//! watches and transactions, and which domains are introduced.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use nix::sys::eventfd::EventFd;
use xmx_hv::xs::wire::{INTRODUCE_DOMAIN, RELEASE_DOMAIN};
use xmx_hv::{DomId, XsAccess, XsPerm, DOM0};

use super::conn::{ConnIo, Outstanding, XsConnId};
use super::ops;
use super::path;
use super::store::{Store, Transaction, Tree};
use super::watch::{NodeChange, Watch};

/// A connection as the database sees it.
pub(crate) struct ConnEntry {
    pub io: Arc<ConnIo>,
    pub watches: Vec<Watch>,
    pub transactions: BTreeMap<u32, Transaction>,
    pub next_tx: u32,
}

impl ConnEntry {
    pub fn new(io: Arc<ConnIo>) -> ConnEntry {
        ConnEntry {
            io,
            watches: Vec::new(),
            transactions: BTreeMap::new(),
            next_tx: 1,
        }
    }

    pub fn domid(&self) -> DomId {
        self.io.domid
    }

    /// A transaction id not in use on this connection (never 0, which means none).
    pub fn alloc_tx_id(&mut self) -> u32 {
        loop {
            let id = self.next_tx;
            self.next_tx = self.next_tx.wrapping_add(1);
            if id != 0 && !self.transactions.contains_key(&id) {
                return id;
            }
        }
    }
}

/// A listener serving one domain, and how to stop its accept loop.
pub(crate) struct ListenerEntry {
    pub domid: DomId,
    pub stop: Arc<EventFd>,
}

pub(crate) struct XenstoredState {
    pub store: Store,
    pub conns: HashMap<XsConnId, ConnEntry>,
    pub introduced: BTreeSet<DomId>,
    pub listeners: Vec<ListenerEntry>,
    pub shut_down: bool,
}

impl XenstoredState {
    pub fn new() -> XenstoredState {
        XenstoredState {
            store: Store::new(),
            conns: HashMap::new(),
            introduced: BTreeSet::from([DOM0]),
            listeners: Vec::new(),
            shut_down: false,
        }
    }

    /// Deliver `events` to every watch that matches and whose connection's domain may
    /// see them.
    pub fn fire(&self, events: &[NodeChange]) {
        for event in events {
            let special = event.path.starts_with('@');
            for conn in self.conns.values() {
                if conn.watches.is_empty() || !event.visible_to(conn.domid(), &self.store) {
                    continue;
                }
                for w in conn.watches.iter().filter(|w| w.matches(event)) {
                    if let Some(frame) = w.event_frame(&event.path) {
                        conn.io.push_event(frame, special);
                    }
                }
            }
        }
    }

    /// Watches registered by connections of `domid`.
    pub fn watches_of(&self, domid: DomId) -> usize {
        self.conns
            .values()
            .filter(|c| c.domid() == domid)
            .map(|c| c.watches.len())
            .sum()
    }

    /// Open transactions of connections of `domid`.
    pub fn transactions_of(&self, domid: DomId) -> usize {
        self.conns
            .values()
            .filter(|c| c.domid() == domid)
            .map(|c| c.transactions.len())
            .sum()
    }

    /// Mark `domid` introduced; make its home (owned by it, private to it) if the
    /// toolstack has not; fire @introduceDomain the first time.
    pub fn introduce(&mut self, domid: DomId) {
        let home = path::home(domid);
        if self.store.get_ref(&home).is_none() {
            let unlimited = ops::Limits {
                nodes: usize::MAX,
                value_size: usize::MAX,
            };
            let events = ops::mkdir(&mut self.store, DOM0, &unlimited, &home).unwrap_or_default();
            if let Some(mut node) = self.store.get_ref(&home).cloned() {
                node.perms = vec![XsPerm {
                    domid,
                    access: XsAccess::None,
                }];
                self.store.put(&home, node);
            }
            self.fire(&events);
        }
        if domid != DOM0 && self.introduced.insert(domid) {
            tracing::info!(domid, "domain introduced");
            self.fire(&[NodeChange::special(INTRODUCE_DOMAIN)]);
        }
    }

    /// Forget `domid`: close its connections (dropping their watches and transactions),
    /// stop its listeners, remove its home and every node it owns, strip it from other
    /// nodes' permission lists, then fire @releaseDomain.
    pub fn release(&mut self, domid: DomId, outstanding: &Outstanding) {
        let was_introduced = self.introduced.remove(&domid);
        let gone: Vec<XsConnId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.domid() == domid)
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            if let Some(c) = self.conns.remove(&id) {
                c.io.close(outstanding);
            }
        }
        self.listeners.retain(|l| {
            if l.domid == domid {
                let _ = l.stop.write(1);
                false
            } else {
                true
            }
        });
        let mut events = Vec::new();
        let home = path::home(domid);
        if domid != DOM0 && self.store.get_ref(&home).is_some() {
            events.extend(ops::remove_subtree(&mut self.store, &home).unwrap_or_default());
        }
        if domid != DOM0 {
            events.extend(self.remove_owned(domid));
            self.strip_perms(domid);
        }
        self.fire(&events);
        tracing::info!(
            domid,
            was_introduced,
            removed = events.len(),
            "domain released"
        );
        self.fire(&[NodeChange::special(RELEASE_DOMAIN)]);
    }

    /// Remove every subtree whose top node `domid` owns.
    fn remove_owned(&mut self, domid: DomId) -> Vec<NodeChange> {
        let mut events = Vec::new();
        let mut stack = vec!["/".to_string()];
        let mut doomed = Vec::new();
        while let Some(name) = stack.pop() {
            let Some(node) = self.store.get_ref(&name) else {
                continue;
            };
            if name != "/" && node.owner() == domid {
                doomed.push(name);
                continue;
            }
            stack.extend(node.children.iter().map(|c| path::child(&name, c)));
        }
        for name in doomed {
            events.extend(ops::remove_subtree(&mut self.store, &name).unwrap_or_default());
        }
        events
    }

    /// Drop entries naming `domid` from every permission list (a later domain with the
    /// same id must not inherit them).
    fn strip_perms(&mut self, domid: DomId) {
        let affected: Vec<String> = self
            .store
            .paths()
            .filter(|p| {
                self.store
                    .get_ref(p)
                    .is_some_and(|n| n.perms.iter().skip(1).any(|e| e.domid == domid))
            })
            .cloned()
            .collect();
        for name in affected {
            let Some(mut node) = self.store.get_ref(&name).cloned() else {
                continue;
            };
            if let Some((owner, rest)) = node.perms.split_first() {
                let kept: Vec<XsPerm> = std::iter::once(*owner)
                    .chain(rest.iter().filter(|e| e.domid != domid).copied())
                    .collect();
                node.perms = kept;
                self.store.put(&name, node);
            }
        }
    }
}

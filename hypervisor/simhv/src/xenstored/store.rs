//! The node database and transactions over it.
//!
//! Nodes are kept by full name. Every change gives the changed node a fresh generation
//! number. A transaction never touches the database until it commits: it stages its
//! changes and remembers the generation of every node it looked at or changed (or that
//! the node was absent). Commit succeeds only if all those nodes are still as it saw
//! them; otherwise another writer got in between and the commit is refused (EAGAIN).

use std::collections::HashMap;

use xmx_hv::xs::wire::{XsErrno, DOMID_ANY, INTRODUCE_DOMAIN, RELEASE_DOMAIN};
use xmx_hv::{DomId, XsAccess, XsPerm, DOM0};

use super::watch::NodeChange;

/// One node: a value, an ordered child list, and a permission list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Node {
    pub value: Vec<u8>,
    /// Names (last components) of the children, in creation order.
    pub children: Vec<String>,
    /// Never empty: the first entry is the owner.
    pub perms: Vec<XsPerm>,
    /// Bumped on every change; what transactions compare.
    pub generation: u64,
}

impl Node {
    /// An empty node with `perms`.
    pub fn new(perms: Vec<XsPerm>) -> Node {
        Node {
            value: Vec::new(),
            children: Vec::new(),
            perms,
            generation: 0,
        }
    }

    pub fn owner(&self) -> DomId {
        self.perms.first().map_or(DOM0, |p| p.domid)
    }
}

/// Read and change access to nodes: the database itself or a transaction's view of it.
pub(crate) trait Tree {
    /// The node called `path`, if it exists (in this view).
    fn get(&mut self, path: &str) -> Option<&Node>;
    /// Create or replace `path`.
    fn put(&mut self, path: &str, node: Node);
    /// Delete `path` alone (callers delete children first and fix the parent's list).
    fn remove(&mut self, path: &str);
    /// How many nodes `domid` owns in this view.
    fn owned(&self, domid: DomId) -> usize;
}

/// The committed database.
#[derive(Debug)]
pub(crate) struct Store {
    nodes: HashMap<String, Node>,
    next_generation: u64,
    owned: HashMap<DomId, usize>,
}

fn dom0_only() -> Vec<XsPerm> {
    vec![XsPerm {
        domid: DOM0,
        access: XsAccess::None,
    }]
}

impl Store {
    /// The tree a fresh xenstored has once dom0's toolstack started: `/`, `/local`,
    /// `/local/domain`, `/local/domain/0`, `/tool`, all dom0's and private, and the two
    /// special nodes whose permissions decide who sees their watch events.
    pub fn new() -> Store {
        let mut s = Store {
            nodes: HashMap::new(),
            next_generation: 1,
            owned: HashMap::new(),
        };
        let dir = |children: &[&str]| Node {
            children: children.iter().map(|c| c.to_string()).collect(),
            ..Node::new(dom0_only())
        };
        s.put("/", dir(&["local", "tool"]));
        s.put("/local", dir(&["domain"]));
        s.put("/local/domain", dir(&["0"]));
        s.put("/local/domain/0", dir(&[]));
        s.put("/tool", dir(&[]));
        // Every domain may see @releaseDomain events (it learns that a peer died);
        // @introduceDomain stays dom0's.
        s.put(
            RELEASE_DOMAIN,
            Node::new(vec![
                XsPerm {
                    domid: DOM0,
                    access: XsAccess::None,
                },
                XsPerm {
                    domid: DOMID_ANY,
                    access: XsAccess::Read,
                },
            ]),
        );
        s.put(INTRODUCE_DOMAIN, Node::new(dom0_only()));
        s
    }

    pub fn get_ref(&self, path: &str) -> Option<&Node> {
        self.nodes.get(path)
    }

    pub fn generation_of(&self, path: &str) -> Option<u64> {
        self.nodes.get(path).map(|n| n.generation)
    }

    fn count(&mut self, domid: DomId, delta: isize) {
        let c = self.owned.entry(domid).or_insert(0);
        *c = c.saturating_add_signed(delta);
        if *c == 0 {
            self.owned.remove(&domid);
        }
    }

    /// Every node name, for whole-tree walks.
    pub fn paths(&self) -> impl Iterator<Item = &String> {
        self.nodes.keys()
    }
}

impl Tree for Store {
    fn get(&mut self, path: &str) -> Option<&Node> {
        self.nodes.get(path)
    }

    fn put(&mut self, path: &str, mut node: Node) {
        node.generation = self.next_generation;
        self.next_generation += 1;
        let new_owner = node.owner();
        if let Some(old) = self.nodes.insert(path.to_string(), node) {
            self.count(old.owner(), -1);
        }
        self.count(new_owner, 1);
    }

    fn remove(&mut self, path: &str) {
        if let Some(old) = self.nodes.remove(path) {
            self.count(old.owner(), -1);
        }
    }

    fn owned(&self, domid: DomId) -> usize {
        self.owned.get(&domid).copied().unwrap_or(0)
    }
}

/// An open transaction: staged changes and what they were based on.
#[derive(Debug, Default)]
pub(crate) struct Transaction {
    /// Generation of each node touched, as the database had it at first touch
    /// (`None`: it did not exist).
    seen: HashMap<String, Option<u64>>,
    /// Staged state of changed nodes (`None`: deleted).
    staged: HashMap<String, Option<Node>>,
    owned_delta: HashMap<DomId, isize>,
    /// Watch events to fire if the transaction commits.
    pub events: Vec<NodeChange>,
}

impl Transaction {
    /// This transaction's view over `store`.
    pub fn view<'a>(&'a mut self, store: &'a Store) -> TxView<'a> {
        TxView { store, tx: self }
    }

    /// Apply the staged changes if nothing they depend on changed since; returns the
    /// watch events to fire. `Err(EAGAIN)` leaves the database untouched.
    pub fn commit(self, store: &mut Store) -> Result<Vec<NodeChange>, XsErrno> {
        if let Some((path, _)) = self
            .seen
            .iter()
            .find(|(path, gen)| store.generation_of(path) != **gen)
        {
            tracing::debug!(path = %path, "transaction conflict");
            return Err(XsErrno::Eagain);
        }
        for (path, node) in self.staged {
            match node {
                Some(n) => store.put(&path, n),
                None => store.remove(&path),
            }
        }
        Ok(self.events)
    }
}

/// A transaction's view: staged nodes over the committed ones.
pub(crate) struct TxView<'a> {
    store: &'a Store,
    tx: &'a mut Transaction,
}

impl TxView<'_> {
    fn note(&mut self, path: &str) {
        if !self.tx.seen.contains_key(path) {
            self.tx
                .seen
                .insert(path.to_string(), self.store.generation_of(path));
        }
    }

    fn visible_owner(&self, path: &str) -> Option<DomId> {
        match self.tx.staged.get(path) {
            Some(staged) => staged.as_ref().map(Node::owner),
            None => self.store.get_ref(path).map(Node::owner),
        }
    }

    fn adjust(&mut self, domid: DomId, delta: isize) {
        *self.tx.owned_delta.entry(domid).or_insert(0) += delta;
    }
}

impl Tree for TxView<'_> {
    fn get(&mut self, path: &str) -> Option<&Node> {
        self.note(path);
        match self.tx.staged.get(path) {
            Some(staged) => staged.as_ref(),
            None => self.store.get_ref(path),
        }
    }

    fn put(&mut self, path: &str, mut node: Node) {
        self.note(path);
        if let Some(old) = self.visible_owner(path) {
            self.adjust(old, -1);
        }
        self.adjust(node.owner(), 1);
        // Keep the committed generation until commit assigns a new one, so
        // DIRECTORY_PART inside the transaction stays stable.
        node.generation = self.store.generation_of(path).unwrap_or(0);
        self.tx.staged.insert(path.to_string(), Some(node));
    }

    fn remove(&mut self, path: &str) {
        self.note(path);
        if let Some(old) = self.visible_owner(path) {
            self.adjust(old, -1);
        }
        self.tx.staged.insert(path.to_string(), None);
    }

    fn owned(&self, domid: DomId) -> usize {
        let base = self.store.owned(domid) as isize;
        let delta = self.tx.owned_delta.get(&domid).copied().unwrap_or(0);
        (base + delta).max(0) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perms(owner: DomId) -> Vec<XsPerm> {
        vec![XsPerm {
            domid: owner,
            access: XsAccess::None,
        }]
    }

    #[test]
    fn initial_tree() {
        let mut s = Store::new();
        for p in ["/", "/local", "/local/domain", "/local/domain/0", "/tool"] {
            let n = s.get(p).unwrap();
            assert_eq!(n.perms, dom0_only(), "{p}");
            assert!(n.value.is_empty());
        }
        assert_eq!(s.get("/").unwrap().children, vec!["local", "tool"]);
        assert_eq!(s.get("/local/domain").unwrap().children, vec!["0"]);
        assert!(s.get(RELEASE_DOMAIN).is_some());
        assert!(s.get(INTRODUCE_DOMAIN).is_some());
        assert_eq!(s.owned(DOM0), 7);
    }

    #[test]
    fn put_bumps_generation_and_counts_owners() {
        let mut s = Store::new();
        s.put("/a", Node::new(perms(3)));
        let g1 = s.generation_of("/a").unwrap();
        assert_eq!(s.owned(3), 1);
        s.put("/a", Node::new(perms(4)));
        assert!(s.generation_of("/a").unwrap() > g1);
        assert_eq!(s.owned(3), 0);
        assert_eq!(s.owned(4), 1);
        s.remove("/a");
        assert_eq!(s.owned(4), 0);
        assert_eq!(s.generation_of("/a"), None);
    }

    #[test]
    fn transaction_stages_until_commit() {
        let mut s = Store::new();
        let mut tx = Transaction::default();
        {
            let mut v = tx.view(&s);
            v.put("/x", Node::new(perms(2)));
            assert!(v.get("/x").is_some());
            assert_eq!(v.owned(2), 1);
            v.remove("/tool");
            assert!(v.get("/tool").is_none());
        }
        assert!(s.get("/x").is_none());
        assert!(s.get("/tool").is_some());
        tx.commit(&mut s).unwrap();
        assert!(s.get("/x").is_some());
        assert!(s.get("/tool").is_none());
        assert_eq!(s.owned(2), 1);
    }

    #[test]
    fn transaction_conflicts_on_changed_reads() {
        let mut s = Store::new();
        let mut tx = Transaction::default();
        assert!(tx.view(&s).get("/tool").is_some());
        s.put("/tool", Node::new(dom0_only()));
        assert_eq!(tx.commit(&mut s).unwrap_err(), XsErrno::Eagain);
    }

    #[test]
    fn transaction_conflicts_when_absent_node_appears() {
        let mut s = Store::new();
        let mut tx = Transaction::default();
        assert!(tx.view(&s).get("/new").is_none());
        s.put("/new", Node::new(dom0_only()));
        assert_eq!(tx.commit(&mut s).unwrap_err(), XsErrno::Eagain);
    }

    #[test]
    fn unrelated_changes_do_not_conflict() {
        let mut s = Store::new();
        let mut tx = Transaction::default();
        tx.view(&s).put("/tool", Node::new(perms(0)));
        s.put("/other", Node::new(dom0_only()));
        tx.commit(&mut s).unwrap();
    }
}

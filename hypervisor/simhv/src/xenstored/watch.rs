//! Watches and the events that fire them.

use xmx_hv::xs::wire::{self, MsgType, XsFrame};
use xmx_hv::{DomId, XsPerm};

use super::path;
use super::perms::{self, Rights};
use super::store::Store;

/// A registered watch of one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Watch {
    /// Canonical name watched (absolute or `@special`).
    pub path: String,
    pub token: String,
    /// Bytes to strip from event paths: non-zero when registered with a relative name.
    pub relative_prefix: usize,
}

/// Which watches an event reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// Watches on the path itself or on any ancestor.
    Subtree,
    /// Only watches on exactly this path (descendants of a removed node, specials).
    Exact,
}

/// Something changed at `path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeChange {
    pub path: String,
    pub reach: Reach,
    /// Permission lists captured when the change happened (a removed node and its
    /// parent, or a node's permissions before a change): a domain that could read any
    /// of them is told.
    pub captured: Vec<Vec<XsPerm>>,
    /// Also consult the node and its parent as they are when the event fires.
    pub check_current: bool,
}

impl NodeChange {
    /// A node was created or changed; permissions are looked up at firing time.
    pub fn changed(path: &str) -> NodeChange {
        NodeChange {
            path: path.to_string(),
            reach: Reach::Subtree,
            captured: Vec::new(),
            check_current: true,
        }
    }

    /// A node was removed; `root` is true for the node the removal was asked for.
    pub fn removed(
        path: &str,
        root: bool,
        node_perms: Vec<XsPerm>,
        parent_perms: Option<Vec<XsPerm>>,
    ) -> NodeChange {
        let mut captured = vec![node_perms];
        captured.extend(parent_perms);
        NodeChange {
            path: path.to_string(),
            reach: if root { Reach::Subtree } else { Reach::Exact },
            captured,
            check_current: false,
        }
    }

    /// One of the `@special` events.
    pub fn special(name: &str) -> NodeChange {
        NodeChange {
            path: name.to_string(),
            reach: Reach::Exact,
            captured: Vec::new(),
            check_current: true,
        }
    }

    /// Whether `domid` may learn of this event: it could read the node (before or
    /// after the change) or the node's parent, as xenstored decides.
    pub fn visible_to(&self, domid: DomId, store: &Store) -> bool {
        if perms::privileged(domid) {
            return true;
        }
        let readable = |acl: &[XsPerm]| perms::rights(domid, acl).allows(Rights::READ);
        if self.captured.iter().any(|acl| readable(acl)) {
            return true;
        }
        if !self.check_current {
            return false;
        }
        match store.get_ref(&self.path) {
            Some(node) if readable(&node.perms) => true,
            Some(_) if self.path.starts_with('@') => false,
            Some(_) => store
                .get_ref(path::parent(&self.path))
                .is_some_and(|p| readable(&p.perms)),
            None => false,
        }
    }
}

impl Watch {
    /// Whether this watch fires for `event`.
    pub fn matches(&self, event: &NodeChange) -> bool {
        match event.reach {
            Reach::Exact => event.path == self.path,
            Reach::Subtree => path::is_child(&event.path, &self.path),
        }
    }

    /// The path to report: relative if the watch was registered relatively.
    pub fn reported<'a>(&self, event_path: &'a str) -> &'a str {
        if self.relative_prefix == 0 {
            return event_path;
        }
        event_path.get(self.relative_prefix..).unwrap_or(event_path)
    }

    /// The encoded `XS_WATCH_EVENT` for `event_path`, or `None` if it cannot fit.
    pub fn event_frame(&self, event_path: &str) -> Option<Vec<u8>> {
        let payload = wire::join_strings(&[self.reported(event_path), &self.token]);
        XsFrame::new(MsgType::WatchEvent, 0, 0, payload)
            .ok()
            .map(|f| f.encode())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xenstored::store::{Node, Tree};
    use xmx_hv::XsAccess;

    fn w(path: &str, prefix: usize) -> Watch {
        Watch {
            path: path.into(),
            token: "tok".into(),
            relative_prefix: prefix,
        }
    }

    #[test]
    fn subtree_events_reach_ancestor_watches() {
        let e = NodeChange::changed("/a/b/c");
        assert!(w("/a", 0).matches(&e));
        assert!(w("/a/b/c", 0).matches(&e));
        assert!(w("/", 0).matches(&e));
        assert!(!w("/a/b/c/d", 0).matches(&e));
        assert!(!w("/a/bb", 0).matches(&e));
    }

    #[test]
    fn exact_events_reach_only_their_path() {
        let e = NodeChange::removed("/a/b", false, vec![], None);
        assert!(w("/a/b", 0).matches(&e));
        assert!(!w("/a", 0).matches(&e));
        let s = NodeChange::special("@releaseDomain");
        assert!(w("@releaseDomain", 0).matches(&s));
        assert!(!w("/", 0).matches(&s));
    }

    #[test]
    fn relative_watches_report_relative_paths() {
        let watch = w("/local/domain/5/dev", "/local/domain/5/".len());
        assert_eq!(watch.reported("/local/domain/5/dev/x"), "dev/x");
        let frame = watch.event_frame("/local/domain/5/dev/x").unwrap();
        let parsed = XsFrame::parse(&frame).unwrap();
        assert_eq!(parsed.kind(), Some(MsgType::WatchEvent));
        assert_eq!(parsed.header.req_id, 0);
        assert_eq!(parsed.payload, b"dev/x\0tok\0");
    }

    #[test]
    fn visibility_follows_read_rights() {
        let mut store = Store::new();
        let guest_only = vec![XsPerm {
            domid: 5,
            access: XsAccess::None,
        }];
        store.put("/local/domain/5", Node::new(guest_only.clone()));
        store.put("/local/domain/5/x", Node::new(guest_only.clone()));
        let e = NodeChange::changed("/local/domain/5/x");
        assert!(e.visible_to(0, &store));
        assert!(e.visible_to(5, &store));
        assert!(!e.visible_to(6, &store));
        let gone = NodeChange::removed(
            "/local/domain/5/x",
            true,
            guest_only.clone(),
            Some(guest_only),
        );
        assert!(gone.visible_to(5, &store));
        assert!(!gone.visible_to(6, &store));
        let rel = NodeChange::special("@releaseDomain");
        assert!(rel.visible_to(6, &store));
        let intro = NodeChange::special("@introduceDomain");
        assert!(!intro.visible_to(6, &store));
        assert!(intro.visible_to(0, &store));
    }
}

//! The database operations, on committed data or inside a transaction alike.
//!
//! Names here are already canonical. Each changing operation returns the watch events
//! it causes; the caller fires them now or when the transaction commits.

use xmx_hv::xs::wire::{self, XsErrno, PAYLOAD_MAX};
use xmx_hv::{DomId, XsPerm};

use super::path;
use super::perms::{self, Rights};
use super::store::{Node, Tree};
use super::watch::NodeChange;

/// Most permission entries an unprivileged domain may put on one node (xenstored's
/// default per-node permission quota).
pub(crate) const MAX_PERMS_PER_NODE: usize = 5;

/// Per-domain limits that apply to unprivileged callers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub nodes: usize,
    pub value_size: usize,
}

/// The node at `path` if `caller` has `wanted` on it. A missing node is `ENOENT` only
/// if the caller has `wanted` on its nearest existing ancestor, else `EACCES`, so a
/// domain learns nothing about names it may not see.
fn lookup<T: Tree + ?Sized>(
    t: &mut T,
    caller: DomId,
    name: &str,
    wanted: Rights,
) -> Result<Node, XsErrno> {
    if let Some(node) = t.get(name) {
        return if perms::rights(caller, &node.perms).allows(wanted) {
            Ok(node.clone())
        } else {
            Err(XsErrno::Eacces)
        };
    }
    let mut ancestor = name;
    loop {
        ancestor = path::parent(ancestor);
        if let Some(node) = t.get(ancestor) {
            return if perms::rights(caller, &node.perms).allows(wanted) {
                Err(XsErrno::Enoent)
            } else {
                Err(XsErrno::Eacces)
            };
        }
        if ancestor == "/" {
            // The root always exists; reaching here means a damaged tree.
            return Err(XsErrno::Eio);
        }
    }
}

pub(crate) fn read<T: Tree + ?Sized>(
    t: &mut T,
    caller: DomId,
    name: &str,
) -> Result<Vec<u8>, XsErrno> {
    Ok(lookup(t, caller, name, Rights::READ)?.value)
}

pub(crate) fn write<T: Tree + ?Sized>(
    t: &mut T,
    caller: DomId,
    limits: &Limits,
    name: &str,
    value: &[u8],
) -> Result<Vec<NodeChange>, XsErrno> {
    if !perms::privileged(caller) && value.len() > limits.value_size {
        return Err(XsErrno::Enospc);
    }
    match lookup(t, caller, name, Rights::WRITE) {
        Ok(mut node) => {
            node.value = value.to_vec();
            t.put(name, node);
        }
        Err(XsErrno::Enoent) => create(t, caller, limits, name, value)?,
        Err(e) => return Err(e),
    }
    Ok(vec![NodeChange::changed(name)])
}

pub(crate) fn mkdir<T: Tree + ?Sized>(
    t: &mut T,
    caller: DomId,
    limits: &Limits,
    name: &str,
) -> Result<Vec<NodeChange>, XsErrno> {
    match lookup(t, caller, name, Rights::WRITE) {
        Ok(_) => Ok(Vec::new()),
        Err(XsErrno::Enoent) => {
            create(t, caller, limits, name, &[])?;
            Ok(vec![NodeChange::changed(name)])
        }
        Err(e) => Err(e),
    }
}

/// Create `name` and any missing ancestors. Each new node copies its parent's
/// permissions; an unprivileged creator becomes the owner of what it creates.
fn create<T: Tree + ?Sized>(
    t: &mut T,
    caller: DomId,
    limits: &Limits,
    name: &str,
    value: &[u8],
) -> Result<(), XsErrno> {
    let mut missing = vec![name.to_string()];
    let mut existing = path::parent(name).to_string();
    while t.get(&existing).is_none() {
        if existing == "/" {
            return Err(XsErrno::Eio);
        }
        missing.push(existing.clone());
        existing = path::parent(&existing).to_string();
    }
    if !perms::privileged(caller) && t.owned(caller) + missing.len() > limits.nodes {
        return Err(XsErrno::Enospc);
    }
    let mut parent_name = existing;
    let mut parent = t.get(&parent_name).cloned().ok_or(XsErrno::Eio)?;
    for new_name in missing.iter().rev() {
        parent.children.push(path::basename(new_name).to_string());
        let mut acl = parent.perms.clone();
        if !perms::privileged(caller) {
            if let Some(owner) = acl.first_mut() {
                owner.domid = caller;
            }
        }
        t.put(&parent_name, parent);
        parent = Node::new(acl);
        parent_name = new_name.clone();
    }
    parent.value = value.to_vec();
    t.put(&parent_name, parent);
    Ok(())
}

pub(crate) fn rm<T: Tree + ?Sized>(
    t: &mut T,
    caller: DomId,
    name: &str,
) -> Result<Vec<NodeChange>, XsErrno> {
    match lookup(t, caller, name, Rights::WRITE) {
        Ok(_) if name == "/" => Err(XsErrno::Einval),
        Ok(_) => remove_subtree(t, name),
        // Already gone is fine, as long as the parent is there.
        Err(XsErrno::Enoent) => match t.get(path::parent(name)) {
            Some(_) => Ok(Vec::new()),
            None => Err(XsErrno::Enoent),
        },
        Err(e) => Err(e),
    }
}

/// Delete `name` and everything below it, and unlink it from its parent. Events:
/// one per removed descendant for watches on exactly that node, then one for the
/// removed root that reaches watches on it and its ancestors.
pub(crate) fn remove_subtree<T: Tree + ?Sized>(
    t: &mut T,
    name: &str,
) -> Result<Vec<NodeChange>, XsErrno> {
    let parent_name = path::parent(name).to_string();
    let parent_perms = t.get(&parent_name).map(|p| p.perms.clone());
    let mut events = Vec::new();
    // Depth-first, children before their parent, without recursion.
    let mut stack: Vec<(String, Option<Vec<XsPerm>>, bool)> =
        vec![(name.to_string(), parent_perms, false)];
    while let Some((node_name, above, expanded)) = stack.pop() {
        let Some(node) = t.get(&node_name).cloned() else {
            continue;
        };
        if !expanded && !node.children.is_empty() {
            stack.push((node_name.clone(), above, true));
            for c in node.children.iter().rev() {
                stack.push((path::child(&node_name, c), Some(node.perms.clone()), false));
            }
            continue;
        }
        t.remove(&node_name);
        events.push(NodeChange::removed(
            &node_name,
            node_name == name,
            node.perms,
            above,
        ));
    }
    if let Some(mut parent) = t.get(&parent_name).cloned() {
        let base = path::basename(name);
        parent.children.retain(|c| c != base);
        t.put(&parent_name, parent);
    }
    Ok(events)
}

pub(crate) fn directory<T: Tree + ?Sized>(
    t: &mut T,
    caller: DomId,
    name: &str,
) -> Result<Vec<String>, XsErrno> {
    Ok(lookup(t, caller, name, Rights::READ)?.children)
}

/// The DIRECTORY_PART reply: the node's generation, then as many whole child names
/// from byte `offset` of the child list as fit, then an empty name once the list ends.
pub(crate) fn directory_part<T: Tree + ?Sized>(
    t: &mut T,
    caller: DomId,
    name: &str,
    offset: usize,
) -> Result<Vec<u8>, XsErrno> {
    let node = lookup(t, caller, name, Rights::READ)?;
    let list = wire::join_strings(&node.children);
    let mut reply = wire::join_strings(&[node.generation.to_string()]);
    let Some(rest) = list.get(offset..).filter(|r| !r.is_empty()) else {
        reply.push(0);
        return Ok(reply);
    };
    let room = PAYLOAD_MAX - reply.len() - 1;
    let mut taken = 0;
    for piece in rest.split_inclusive(|&b| b == 0) {
        if taken + piece.len() > room {
            break;
        }
        taken += piece.len();
    }
    reply.extend_from_slice(&rest[..taken]);
    if taken == rest.len() {
        reply.push(0);
    }
    Ok(reply)
}

pub(crate) fn get_perms<T: Tree + ?Sized>(
    t: &mut T,
    caller: DomId,
    name: &str,
) -> Result<Vec<XsPerm>, XsErrno> {
    Ok(lookup(t, caller, name, Rights::READ)?.perms)
}

pub(crate) fn set_perms<T: Tree + ?Sized>(
    t: &mut T,
    caller: DomId,
    name: &str,
    acl: &[XsPerm],
) -> Result<Vec<NodeChange>, XsErrno> {
    if acl.is_empty() {
        return Err(XsErrno::Einval);
    }
    let unprivileged = !perms::privileged(caller);
    if unprivileged && acl.len() > MAX_PERMS_PER_NODE {
        return Err(XsErrno::Enospc);
    }
    let mut node = lookup(t, caller, name, Rights::WRITE_OWNER)?;
    if unprivileged && acl[0].domid != node.owner() {
        return Err(XsErrno::Eperm);
    }
    let before = std::mem::replace(&mut node.perms, acl.to_vec());
    t.put(name, node);
    let mut event = NodeChange::changed(name);
    event.captured.push(before);
    Ok(vec![event])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xenstored::store::{Store, Transaction};
    use xmx_hv::XsAccess;

    const LIMITS: Limits = Limits {
        nodes: 10,
        value_size: 64,
    };

    fn p(domid: DomId, access: XsAccess) -> XsPerm {
        XsPerm { domid, access }
    }

    /// A store with a guest home for domains 1 and 2, as introduce creates them.
    fn store() -> Store {
        let mut s = Store::new();
        for d in [1, 2] {
            mkdir(&mut s, 0, &LIMITS, &format!("/local/domain/{d}")).unwrap();
            set_perms(
                &mut s,
                0,
                &format!("/local/domain/{d}"),
                &[p(d, XsAccess::None)],
            )
            .unwrap();
        }
        s
    }

    #[test]
    fn write_creates_parents_and_reads_back() {
        let mut s = store();
        let ev = write(&mut s, 0, &LIMITS, "/a/b/c", b"v").unwrap();
        assert_eq!(ev, vec![NodeChange::changed("/a/b/c")]);
        assert_eq!(read(&mut s, 0, "/a/b/c").unwrap(), b"v");
        assert_eq!(read(&mut s, 0, "/a/b").unwrap(), b"");
        assert_eq!(
            directory(&mut s, 0, "/").unwrap(),
            vec!["local", "tool", "a"]
        );
        assert_eq!(directory(&mut s, 0, "/a").unwrap(), vec!["b"]);
        write(&mut s, 0, &LIMITS, "/a/b/c", b"w").unwrap();
        assert_eq!(read(&mut s, 0, "/a/b/c").unwrap(), b"w");
        assert_eq!(directory(&mut s, 0, "/a/b").unwrap(), vec!["c"]);
    }

    #[test]
    fn new_nodes_inherit_perms_and_guest_owns_what_it_creates() {
        let mut s = store();
        set_perms(
            &mut s,
            0,
            "/tool",
            &[p(0, XsAccess::None), p(1, XsAccess::Write)],
        )
        .unwrap();
        write(&mut s, 1, &LIMITS, "/tool/x", b"1").unwrap();
        assert_eq!(
            get_perms(&mut s, 0, "/tool/x").unwrap(),
            vec![p(1, XsAccess::None), p(1, XsAccess::Write)]
        );
        // dom0 writing in a guest's home creates nodes the guest owns.
        write(&mut s, 0, &LIMITS, "/local/domain/1/dev/vif", b"x").unwrap();
        assert_eq!(
            get_perms(&mut s, 0, "/local/domain/1/dev").unwrap(),
            vec![p(1, XsAccess::None)]
        );
        assert_eq!(read(&mut s, 1, "/local/domain/1/dev/vif").unwrap(), b"x");
    }

    #[test]
    fn guests_are_fenced_from_each_other() {
        let mut s = store();
        write(&mut s, 2, &LIMITS, "/local/domain/2/secret", b"s").unwrap();
        assert_eq!(
            read(&mut s, 1, "/local/domain/2/secret"),
            Err(XsErrno::Eacces)
        );
        assert_eq!(
            read(&mut s, 1, "/local/domain/2/none"),
            Err(XsErrno::Eacces)
        );
        assert_eq!(
            write(&mut s, 1, &LIMITS, "/local/domain/2/secret", b"x"),
            Err(XsErrno::Eacces)
        );
        assert_eq!(
            write(&mut s, 1, &LIMITS, "/local/domain/2/new", b"x"),
            Err(XsErrno::Eacces)
        );
        assert_eq!(
            directory(&mut s, 1, "/local/domain/2"),
            Err(XsErrno::Eacces)
        );
        assert_eq!(directory(&mut s, 1, "/local/domain"), Err(XsErrno::Eacces));
        assert_eq!(
            rm(&mut s, 1, "/local/domain/2/secret"),
            Err(XsErrno::Eacces)
        );
        assert_eq!(
            mkdir(&mut s, 1, &LIMITS, "/local/domain/2/d"),
            Err(XsErrno::Eacces)
        );
        assert_eq!(
            get_perms(&mut s, 1, "/local/domain/2"),
            Err(XsErrno::Eacces)
        );
        assert_eq!(
            read(&mut s, 1, "/local/domain/1/none"),
            Err(XsErrno::Enoent)
        );
        assert_eq!(read(&mut s, 0, "/local/domain/2/secret").unwrap(), b"s");
    }

    #[test]
    fn set_perms_rules() {
        let mut s = store();
        write(&mut s, 1, &LIMITS, "/local/domain/1/shared", b"").unwrap();
        set_perms(
            &mut s,
            1,
            "/local/domain/1/shared",
            &[p(1, XsAccess::None), p(2, XsAccess::Read)],
        )
        .unwrap();
        assert_eq!(read(&mut s, 2, "/local/domain/1/shared").unwrap(), b"");
        assert_eq!(
            write(&mut s, 2, &LIMITS, "/local/domain/1/shared", b"x"),
            Err(XsErrno::Eacces)
        );
        // A guest may not give its node away, nor change a node it does not own.
        assert_eq!(
            set_perms(&mut s, 1, "/local/domain/1/shared", &[p(2, XsAccess::None)]),
            Err(XsErrno::Eperm)
        );
        assert_eq!(
            set_perms(&mut s, 2, "/local/domain/1/shared", &[p(1, XsAccess::Both)]),
            Err(XsErrno::Eacces)
        );
        let six: Vec<XsPerm> = (0..6)
            .map(|i| p(if i == 0 { 1 } else { i }, XsAccess::Read))
            .collect();
        assert_eq!(
            set_perms(&mut s, 1, "/local/domain/1/shared", &six),
            Err(XsErrno::Enospc)
        );
        assert_eq!(
            set_perms(&mut s, 0, "/local/domain/1/shared", &[]),
            Err(XsErrno::Einval)
        );
        // dom0 may move ownership; node counts follow.
        let before = s.owned(2);
        set_perms(&mut s, 0, "/local/domain/1/shared", &[p(2, XsAccess::None)]).unwrap();
        assert_eq!(s.owned(2), before + 1);
    }

    #[test]
    fn rm_removes_subtree_with_events() {
        let mut s = store();
        write(&mut s, 0, &LIMITS, "/a/b/c", b"").unwrap();
        write(&mut s, 0, &LIMITS, "/a/d", b"").unwrap();
        let ev = rm(&mut s, 0, "/a").unwrap();
        let paths: Vec<(&str, bool)> = ev
            .iter()
            .map(|e| {
                (
                    e.path.as_str(),
                    e.reach == crate::xenstored::watch::Reach::Subtree,
                )
            })
            .collect();
        assert_eq!(
            paths,
            vec![
                ("/a/b/c", false),
                ("/a/b", false),
                ("/a/d", false),
                ("/a", true)
            ]
        );
        assert_eq!(read(&mut s, 0, "/a"), Err(XsErrno::Enoent));
        assert_eq!(directory(&mut s, 0, "/").unwrap(), vec!["local", "tool"]);
        // Removing what is already gone is fine while the parent exists.
        assert_eq!(rm(&mut s, 0, "/a").unwrap(), vec![]);
        assert_eq!(rm(&mut s, 0, "/a/b"), Err(XsErrno::Enoent));
        assert_eq!(rm(&mut s, 0, "/"), Err(XsErrno::Einval));
    }

    #[test]
    fn node_quota_counts_every_created_node() {
        let mut s = store();
        // Domain 1 owns its home already: 9 more fit under a quota of 10.
        write(&mut s, 1, &LIMITS, "/local/domain/1/a/b/c/d/e/f/g/h", b"").unwrap();
        assert_eq!(s.owned(1), 9);
        assert_eq!(
            write(&mut s, 1, &LIMITS, "/local/domain/1/x/y", b""),
            Err(XsErrno::Enospc)
        );
        write(&mut s, 1, &LIMITS, "/local/domain/1/x", b"").unwrap();
        assert_eq!(
            mkdir(&mut s, 1, &LIMITS, "/local/domain/1/z"),
            Err(XsErrno::Enospc)
        );
        // Nothing half-created by the refused write.
        assert_eq!(read(&mut s, 1, "/local/domain/1/x/y"), Err(XsErrno::Enoent));
        assert_eq!(s.owned(1), 10);
        // dom0 is not limited.
        for i in 0..20 {
            write(&mut s, 0, &LIMITS, &format!("/n{i}"), b"").unwrap();
        }
    }

    #[test]
    fn value_size_quota() {
        let mut s = store();
        let big = vec![b'x'; LIMITS.value_size + 1];
        assert_eq!(
            write(&mut s, 1, &LIMITS, "/local/domain/1/v", &big),
            Err(XsErrno::Enospc)
        );
        write(&mut s, 1, &LIMITS, "/local/domain/1/v", &big[1..]).unwrap();
        write(&mut s, 0, &LIMITS, "/v", &big).unwrap();
    }

    #[test]
    fn directory_part_pages_through_long_lists() {
        let mut s = store();
        let mut expected = Vec::new();
        for i in 0..400 {
            let name = format!("child-with-a-long-name-{i:04}");
            mkdir(&mut s, 0, &LIMITS, &format!("/big/{name}")).unwrap();
            expected.push(name);
        }
        let mut offset = 0;
        let mut got: Vec<String> = Vec::new();
        let mut parts = 0;
        loop {
            let reply = directory_part(&mut s, 0, "/big", offset).unwrap();
            assert!(reply.len() <= PAYLOAD_MAX);
            parts += 1;
            let fields = wire::split_strings(&reply).unwrap();
            let done = fields.last() == Some(&"");
            let names = &fields[1..fields.len() - usize::from(done)];
            for n in names {
                offset += n.len() + 1;
                got.push(n.to_string());
            }
            if done {
                break;
            }
        }
        assert!(parts > 1);
        assert_eq!(got, expected);
        let past = directory_part(&mut s, 0, "/big", 1_000_000).unwrap();
        assert_eq!(past.last(), Some(&0));
        assert_eq!(wire::split_strings(&past).unwrap().len(), 2);
    }

    #[test]
    fn operations_inside_a_transaction_stay_private_until_commit() {
        let mut s = store();
        let mut tx = Transaction::default();
        {
            let mut v = tx.view(&s);
            write(&mut v, 1, &LIMITS, "/local/domain/1/t/a", b"1").unwrap();
            assert_eq!(read(&mut v, 1, "/local/domain/1/t/a").unwrap(), b"1");
            assert_eq!(v.owned(1), 3);
        }
        assert_eq!(read(&mut s, 1, "/local/domain/1/t/a"), Err(XsErrno::Enoent));
        tx.commit(&mut s).unwrap();
        assert_eq!(read(&mut s, 1, "/local/domain/1/t/a").unwrap(), b"1");
        assert_eq!(s.owned(1), 3);
    }

    #[test]
    fn concurrent_writers_to_the_same_parent_conflict() {
        let mut s = store();
        let mut tx = Transaction::default();
        write(&mut tx.view(&s), 0, &LIMITS, "/p/a", b"").unwrap();
        write(&mut s, 0, &LIMITS, "/p/b", b"").unwrap();
        assert_eq!(tx.commit(&mut s).unwrap_err(), XsErrno::Eagain);
        assert_eq!(directory(&mut s, 0, "/p").unwrap(), vec!["b"]);
    }
}

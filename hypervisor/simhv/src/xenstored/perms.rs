//! What a domain may do to a node, from the node's permission list.
//!
//! The list's first entry names the owner and gives the access of every domain not
//! listed after it. dom0 and the owner may do anything (including change the
//! permissions); another domain gets the access of its own entry, else the default.

use xmx_hv::xs::wire::DOMID_ANY;
use xmx_hv::{DomId, XsAccess, XsPerm, DOM0};

/// A set of rights over one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Rights {
    pub read: bool,
    pub write: bool,
    /// May change the permissions.
    pub owner: bool,
}

impl Rights {
    pub const READ: Rights = Rights {
        read: true,
        write: false,
        owner: false,
    };
    pub const WRITE: Rights = Rights {
        read: false,
        write: true,
        owner: false,
    };
    pub const WRITE_OWNER: Rights = Rights {
        read: false,
        write: true,
        owner: true,
    };
    const ALL: Rights = Rights {
        read: true,
        write: true,
        owner: true,
    };

    /// Whether every right in `wanted` is in `self`.
    pub fn allows(self, wanted: Rights) -> bool {
        (self.read || !wanted.read)
            && (self.write || !wanted.write)
            && (self.owner || !wanted.owner)
    }

    fn from_access(a: XsAccess) -> Rights {
        match a {
            XsAccess::None => Rights::default(),
            XsAccess::Read => Rights::READ,
            XsAccess::Write => Rights::WRITE,
            XsAccess::Both => Rights {
                read: true,
                write: true,
                owner: false,
            },
        }
    }
}

/// Whether `domid` is privileged (sees and may change everything).
pub(crate) fn privileged(domid: DomId) -> bool {
    domid == DOM0
}

fn names(entry: &XsPerm, domid: DomId) -> bool {
    entry.domid == domid || entry.domid == DOMID_ANY
}

/// The rights of `domid` over a node with permission list `acl`.
pub(crate) fn rights(domid: DomId, acl: &[XsPerm]) -> Rights {
    let Some((first, rest)) = acl.split_first() else {
        return if privileged(domid) {
            Rights::ALL
        } else {
            Rights::default()
        };
    };
    if privileged(domid) || names(first, domid) {
        return Rights::ALL;
    }
    match rest.iter().find(|p| names(p, domid)) {
        Some(entry) => Rights::from_access(entry.access),
        None => Rights::from_access(first.access),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(domid: DomId, access: XsAccess) -> XsPerm {
        XsPerm { domid, access }
    }

    #[test]
    fn dom0_and_owner_have_everything() {
        let acl = [p(5, XsAccess::None)];
        assert_eq!(rights(0, &acl), Rights::ALL);
        assert_eq!(rights(5, &acl), Rights::ALL);
        assert_eq!(rights(6, &acl), Rights::default());
    }

    #[test]
    fn listed_entry_wins_over_default() {
        let acl = [
            p(0, XsAccess::Read),
            p(7, XsAccess::None),
            p(8, XsAccess::Both),
        ];
        assert_eq!(rights(6, &acl), Rights::READ);
        assert_eq!(rights(7, &acl), Rights::default());
        let r8 = rights(8, &acl);
        assert!(r8.read && r8.write && !r8.owner);
    }

    #[test]
    fn first_matching_entry_counts() {
        let acl = [
            p(0, XsAccess::None),
            p(4, XsAccess::Write),
            p(4, XsAccess::Read),
        ];
        assert_eq!(rights(4, &acl), Rights::WRITE);
    }

    #[test]
    fn any_domain_entry() {
        let acl = [p(0, XsAccess::None), p(DOMID_ANY, XsAccess::Read)];
        assert_eq!(rights(9, &acl), Rights::READ);
    }

    #[test]
    fn allows_checks_each_right() {
        assert!(Rights::ALL.allows(Rights::WRITE_OWNER));
        assert!(!Rights::WRITE.allows(Rights::WRITE_OWNER));
        assert!(!Rights::READ.allows(Rights::WRITE));
        assert!(Rights::default().allows(Rights::default()));
    }

    #[test]
    fn empty_list_is_nothing_for_guests() {
        assert_eq!(rights(3, &[]), Rights::default());
        assert_eq!(rights(0, &[]), Rights::ALL);
    }
}

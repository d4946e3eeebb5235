//! Where things live under a simhv directory (see the module docs of [`crate::sim`]).

use std::path::{Path, PathBuf};

use crate::DomId;

/// The admin socket.
pub const CTL_SOCK: &str = "ctl.sock";
/// Written (atomically, containing the daemon's pid) once the daemon serves requests.
pub const READY_FILE: &str = "ready";
/// Held with `flock` by the live daemon; a second daemon on the same directory refuses to start.
pub const LOCK_FILE: &str = "simhv.lock";
/// Per-domain xenstore socket.
pub const XENSTORE_SOCK: &str = "xenstore.sock";
/// Per-domain grant-table and event-channel socket.
pub const HV_SOCK: &str = "hv.sock";
/// Per-domain memory (a link to the daemon's memfd): byte offset = frame * PAGE_SIZE.
pub const MEM_FILE: &str = "mem";
/// Per-domain grant table: an array of Xen v1 entries.
pub const GNTTAB_FILE: &str = "gnttab";

/// Prefix of a migrated domain's forwarding record, `DIR/moved-dom<N>` (see
/// [`super::migrate::Forwarding`]).
pub const MOVED_PREFIX: &str = "moved-";

/// `DIR/moved-dom<N>`: where domain N of this host went.
pub fn moved_file(dir: &Path, domid: DomId) -> PathBuf {
    dir.join(format!("{MOVED_PREFIX}dom{domid}"))
}

/// `DIR/ctl.sock`.
pub fn ctl_sock(dir: &Path) -> PathBuf {
    dir.join(CTL_SOCK)
}

/// `DIR/ready`.
pub fn ready_file(dir: &Path) -> PathBuf {
    dir.join(READY_FILE)
}

/// `DIR/dom<N>`.
pub fn dom_dir(dir: &Path, domid: DomId) -> PathBuf {
    dir.join(format!("dom{domid}"))
}

/// `DIR/dom<N>/xenstore.sock`.
pub fn xenstore_sock(dir: &Path, domid: DomId) -> PathBuf {
    dom_dir(dir, domid).join(XENSTORE_SOCK)
}

/// `DIR/dom<N>/hv.sock`.
pub fn hv_sock(dir: &Path, domid: DomId) -> PathBuf {
    dom_dir(dir, domid).join(HV_SOCK)
}

/// `DIR/dom<N>/mem`.
pub fn mem_file(dir: &Path, domid: DomId) -> PathBuf {
    dom_dir(dir, domid).join(MEM_FILE)
}

/// `DIR/dom<N>/gnttab`.
pub fn gnttab_file(dir: &Path, domid: DomId) -> PathBuf {
    dom_dir(dir, domid).join(GNTTAB_FILE)
}

/// The domid named by a `dom<N>` directory entry, if it is one.
pub fn parse_dom_dir_name(name: &str) -> Option<DomId> {
    let digits = name.strip_prefix("dom")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if digits.len() > 1 && digits.starts_with('0') {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_the_layout() {
        let d = Path::new("/run/sim");
        assert_eq!(hv_sock(d, 7), Path::new("/run/sim/dom7/hv.sock"));
        assert_eq!(
            xenstore_sock(d, 0),
            Path::new("/run/sim/dom0/xenstore.sock")
        );
        assert_eq!(mem_file(d, 12), Path::new("/run/sim/dom12/mem"));
        assert_eq!(gnttab_file(d, 3), Path::new("/run/sim/dom3/gnttab"));
        assert_eq!(ctl_sock(d), Path::new("/run/sim/ctl.sock"));
    }

    #[test]
    fn dom_dir_names_parse_strictly() {
        assert_eq!(parse_dom_dir_name("dom0"), Some(0));
        assert_eq!(parse_dom_dir_name("dom42"), Some(42));
        assert_eq!(parse_dom_dir_name("dom"), None);
        assert_eq!(parse_dom_dir_name("dom01"), None);
        assert_eq!(parse_dom_dir_name("dom-1"), None);
        assert_eq!(parse_dom_dir_name("dom99999"), None);
        assert_eq!(parse_dom_dir_name("ctl.sock"), None);
    }
}

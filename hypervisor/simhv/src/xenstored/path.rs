//! Node names: validation, relative-to-home resolution, parents and subtree tests.

use xmx_hv::xs::wire::XsErrno;
use xmx_hv::xs::wire::{ABS_PATH_MAX, REL_PATH_MAX};
use xmx_hv::DomId;

/// A checked absolute (or `@special`) name, and how to report it back to the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Canonical {
    pub path: String,
    /// Bytes to strip from event paths when the caller named the node relatively
    /// (its home plus the `/`); 0 for absolute names.
    pub relative_prefix: usize,
}

/// The home directory of a domain, the base of its relative names.
pub(crate) fn home(domid: DomId) -> String {
    format!("/local/domain/{domid}")
}

fn valid_chars(name: &str) -> bool {
    name.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'/' | b'_' | b'@'))
}

/// Resolve a name sent by `caller` as xenstored does: only `[A-Za-z0-9-/_@]`, `@names`
/// only where special watches are allowed, relative names below the caller's home, no
/// `//`, no trailing `/` (except the root), bounded length.
pub(crate) fn canonicalize(
    caller: DomId,
    raw: &str,
    allow_special: bool,
) -> Result<Canonical, XsErrno> {
    if !valid_chars(raw) || (raw.starts_with('@') && !allow_special) {
        return Err(XsErrno::Einval);
    }
    let relative = !raw.starts_with('/') && !raw.starts_with('@');
    let (path, relative_prefix) = if relative {
        let base = home(caller);
        let prefix = base.len() + 1;
        (format!("{base}/{raw}"), prefix)
    } else {
        (raw.to_string(), 0)
    };
    if (path.ends_with('/') && path != "/") || path.contains("//") {
        return Err(XsErrno::Einval);
    }
    if path.len() > ABS_PATH_MAX {
        return Err(XsErrno::Einval);
    }
    if caller != xmx_hv::DOM0 && local_part_len(&path) > REL_PATH_MAX {
        return Err(XsErrno::Einval);
    }
    Ok(Canonical {
        path,
        relative_prefix,
    })
}

/// Length of the name below `/local/domain/<n>/`, or of the whole name elsewhere.
fn local_part_len(path: &str) -> usize {
    if let Some(rest) = path.strip_prefix("/local/domain/") {
        let digits = rest.bytes().take_while(|b| b.is_ascii_digit()).count();
        if (1..=5).contains(&digits) && rest.as_bytes().get(digits) == Some(&b'/') {
            return rest.len() - digits - 1;
        }
    }
    path.len()
}

/// The parent of a name: `/` for top-level nodes and for `@special` names.
pub(crate) fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

/// The last component of a name (the name itself for `@special`).
pub(crate) fn basename(path: &str) -> &str {
    match path.rfind('/') {
        Some(i) => &path[i + 1..],
        None => path,
    }
}

/// The full name of `name` below `parent`.
pub(crate) fn child(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

/// Whether `child` is `parent` or below it.
pub(crate) fn is_child(child: &str, parent: &str) -> bool {
    if parent == "/" {
        return child.starts_with('/');
    }
    match child.strip_prefix(parent) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_names_pass_unchanged() {
        let c = canonicalize(3, "/local/domain/3/x", false).unwrap();
        assert_eq!(c.path, "/local/domain/3/x");
        assert_eq!(c.relative_prefix, 0);
        assert_eq!(canonicalize(3, "/", false).unwrap().path, "/");
    }

    #[test]
    fn relative_names_resolve_below_home() {
        let c = canonicalize(7, "device/vif", false).unwrap();
        assert_eq!(c.path, "/local/domain/7/device/vif");
        assert_eq!(&c.path[c.relative_prefix..], "device/vif");
        let c0 = canonicalize(0, "backend", false).unwrap();
        assert_eq!(c0.path, "/local/domain/0/backend");
    }

    #[test]
    fn malformed_names_are_einval() {
        for bad in [
            "", "/a/", "//", "/a//b", "/a b", "/a.b", "/ä", "a/", "/a\0", "/a*",
        ] {
            assert_eq!(canonicalize(0, bad, false), Err(XsErrno::Einval), "{bad:?}");
        }
    }

    #[test]
    fn special_names_only_where_allowed() {
        assert_eq!(
            canonicalize(0, "@releaseDomain", false),
            Err(XsErrno::Einval)
        );
        let c = canonicalize(0, "@releaseDomain", true).unwrap();
        assert_eq!(c.path, "@releaseDomain");
        assert_eq!(c.relative_prefix, 0);
    }

    #[test]
    fn length_limits() {
        let long = format!("/{}", "a".repeat(ABS_PATH_MAX - 1));
        assert!(canonicalize(0, &long, false).is_ok());
        let too_long = format!("/{}", "a".repeat(ABS_PATH_MAX));
        assert_eq!(canonicalize(0, &too_long, false), Err(XsErrno::Einval));
        let rel_ok = "a".repeat(REL_PATH_MAX);
        assert!(canonicalize(5, &rel_ok, false).is_ok());
        let rel_long = "a".repeat(REL_PATH_MAX + 1);
        assert_eq!(canonicalize(5, &rel_long, false), Err(XsErrno::Einval));
        // dom0 is only bound by the absolute limit.
        assert!(canonicalize(0, &rel_long, false).is_ok());
    }

    #[test]
    fn parents_and_basenames() {
        assert_eq!(parent("/a/b/c"), "/a/b");
        assert_eq!(parent("/a"), "/");
        assert_eq!(parent("/"), "/");
        assert_eq!(parent("@releaseDomain"), "/");
        assert_eq!(basename("/a/b/c"), "c");
        assert_eq!(basename("/a"), "a");
        assert_eq!(child("/", "a"), "/a");
        assert_eq!(child("/a", "b"), "/a/b");
    }

    #[test]
    fn subtree_test() {
        assert!(is_child("/a/b", "/a"));
        assert!(is_child("/a", "/a"));
        assert!(!is_child("/ab", "/a"));
        assert!(is_child("/anything", "/"));
        assert!(!is_child("@releaseDomain", "/"));
        assert!(is_child("@releaseDomain", "@releaseDomain"));
        assert!(!is_child("/a", "/a/b"));
    }
}

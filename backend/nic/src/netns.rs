//! Network namespaces: a simulated host is one, and a socket opened inside one stays
//! there whichever thread uses it later.

use std::fs::File;
use std::path::PathBuf;

use nix::sched::{setns, CloneFlags};

use super::error::{NicError, Result};

/// The file that names namespace `netns`: `/run/netns/NAME` (as `ip netns` creates), or
/// `netns` itself when it is a path.
pub fn path_of(netns: &str) -> PathBuf {
    if netns.contains('/') {
        PathBuf::from(netns)
    } else {
        PathBuf::from("/run/netns").join(netns)
    }
}

/// Move the calling thread into network namespace `netns`. Only this thread moves; it
/// stays there until it ends or enters another.
pub fn enter(netns: &str) -> Result<()> {
    let error = |source| NicError::Netns {
        name: netns.to_owned(),
        source,
    };
    let file = File::open(path_of(netns)).map_err(error)?;
    setns(&file, CloneFlags::CLONE_NEWNET).map_err(|errno| error(errno.into()))?;
    Ok(())
}

/// Run `f` on a short-lived thread inside network namespace `netns` and return its
/// result; the calling thread's namespace does not change.
pub fn run_in<T, F>(netns: &str, f: F) -> Result<T>
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                enter(netns)?;
                Ok(f())
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_paths() {
        assert_eq!(path_of("host1"), PathBuf::from("/run/netns/host1"));
        assert_eq!(path_of("/proc/1/ns/net"), PathBuf::from("/proc/1/ns/net"));
    }

    #[test]
    fn missing_namespace_is_a_clear_error() {
        let err = run_in("xmx-no-such-namespace", || ()).unwrap_err();
        assert!(
            matches!(&err, NicError::Netns { name, source }
                if name == "xmx-no-such-namespace" && source.kind() == std::io::ErrorKind::NotFound),
            "{err}"
        );
    }
}

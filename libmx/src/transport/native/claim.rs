//! Endpoints of one board claimed across processes.
//!
//! Every process on an interface opens its own socket and sees every frame, so
//! two processes must never open the same endpoint index: both would answer
//! its peers. (Open-MX's kernel driver keeps that table; here nothing is shared
//! but the kernel.) A claim is an abstract Unix socket named after the link
//! (`Wire::claim_scope`, the interface's MAC) and the index: the name is scoped to the network namespace, as the
//! interface is, and the kernel releases it when its holder exits, however it
//! exits, so a crashed process leaves nothing to clean up.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use xmx_engine::EndpointsElsewhere;

/// An endpoint index of a link, held by this process until dropped (the
/// bound socket is the claim: nothing is ever sent on it).
#[derive(Debug)]
pub(super) struct EndpointClaim {
    _socket: OwnedFd,
}

impl EndpointClaim {
    /// Claims endpoint `index` of the link `scope` names; `None` if another
    /// claim (another process's, or one this process already holds) has it.
    pub(super) fn take(scope: &str, index: u8) -> io::Result<Option<EndpointClaim>> {
        let socket = unix_datagram()?;
        let (addr, len) = claim_address(scope, index)?;
        // SAFETY: `addr` is a sockaddr_un whose first `len` bytes are set, and
        // `len` is within its size.
        let rc = unsafe {
            libc::bind(
                socket.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                len,
            )
        };
        if rc == 0 {
            return Ok(Some(EndpointClaim { _socket: socket }));
        }
        match io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::EADDRINUSE) => Ok(None),
            e => Err(e),
        }
    }

    /// Whether some process holds endpoint `index` of the link `scope` names.
    /// Connecting to the claim takes no name, so a look never makes a
    /// claimant fail.
    pub(super) fn is_held(scope: &str, index: u8) -> io::Result<bool> {
        let socket = unix_datagram()?;
        let (addr, len) = claim_address(scope, index)?;
        // SAFETY: as in `take`.
        let rc = unsafe {
            libc::connect(
                socket.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                len,
            )
        };
        if rc == 0 {
            return Ok(true);
        }
        match io::Error::last_os_error() {
            e if matches!(e.raw_os_error(), Some(libc::ECONNREFUSED | libc::ENOENT)) => Ok(false),
            e => Err(e),
        }
    }
}

/// How long an answer of [`ClaimsElsewhere`] is believed: a process that
/// opens or closes an endpoint is seen that much later at most, and a stream
/// for another process's endpoint costs a look per index that often, not per
/// frame.
const ANSWER_FOR: Duration = Duration::from_millis(100);

/// The engine's view of the indices other processes on the link hold
/// ([`xmx_engine::EndpointsElsewhere`]): their frames are left to them instead
/// of being refused as for a closed endpoint (which costs the sender a resend:
/// its core confirms a refusal before it believes it).
pub(super) struct ClaimsElsewhere {
    scope: String,
    answers: FxHashMap<u8, (bool, Instant)>,
}

impl ClaimsElsewhere {
    pub(super) fn new(scope: String) -> ClaimsElsewhere {
        ClaimsElsewhere {
            scope,
            answers: FxHashMap::default(),
        }
    }
}

impl EndpointsElsewhere for ClaimsElsewhere {
    fn held_elsewhere(&mut self, endpoint: u8) -> bool {
        let now = Instant::now();
        if let Some(&(held, at)) = self.answers.get(&endpoint) {
            if now.duration_since(at) < ANSWER_FOR {
                return held;
            }
        }
        let held = match EndpointClaim::is_held(&self.scope, endpoint) {
            Ok(held) => held,
            Err(e) => {
                tracing::debug!(%e, endpoint, "looking up an endpoint claim");
                false
            }
        };
        self.answers.insert(endpoint, (held, now));
        held
    }
}

/// A fresh Unix datagram socket.
fn unix_datagram() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The abstract address of a claim: a leading NUL, then the name (no
/// terminator), and the length that covers them.
fn claim_address(scope: &str, index: u8) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    let name = format!("xmx-native/{scope}/{index}");
    let room = std::mem::size_of::<libc::sockaddr_un>() - std::mem::size_of::<libc::sa_family_t>();
    if 1 + name.len() > room {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "claim name too long",
        ));
    }
    // SAFETY: an all-zero sockaddr_un is a valid value of the type.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, &src) in addr.sun_path[1..].iter_mut().zip(name.as_bytes()) {
        *dst = src as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    Ok((addr, len as libc::socklen_t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_is_claimed_once_until_released() {
        // A scope of its own, so that no other test's board shares the names.
        let link = format!("claim-test/{}", std::process::id());
        let first = EndpointClaim::take(&link, 4).unwrap().expect("free");
        assert!(EndpointClaim::take(&link, 4).unwrap().is_none(), "held");
        let other = EndpointClaim::take(&link, 5)
            .unwrap()
            .expect("another index");
        let elsewhere = format!("{link}-other");
        assert!(EndpointClaim::take(&elsewhere, 4).unwrap().is_some());
        assert!(EndpointClaim::is_held(&link, 4).unwrap());
        assert!(!EndpointClaim::is_held(&link, 6).unwrap());
        let mut elsewhere_view = ClaimsElsewhere::new(link.clone());
        assert!(elsewhere_view.held_elsewhere(5));
        assert!(!elsewhere_view.held_elsewhere(6));
        drop(first);
        assert!(!EndpointClaim::is_held(&link, 4).unwrap());
        assert!(EndpointClaim::take(&link, 4).unwrap().is_some(), "released");
        drop(other);
        let long = "x".repeat(200);
        assert!(
            EndpointClaim::take(&long, 0).is_err(),
            "a name that does not fit"
        );
    }
}

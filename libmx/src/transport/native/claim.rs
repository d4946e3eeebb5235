//! Endpoints of one board claimed across processes.
//!
//! Every process on an interface opens its own socket and sees every frame, so
//! two processes must never open the same endpoint index: both would answer
//! its peers. (Open-MX's kernel driver keeps that table; here nothing is shared
//! but the kernel.) A claim is an abstract Unix socket named after the link
//! (`Wire::claim_scope`, the interface's MAC) and the index: the name is
//! scoped to the network namespace, as the interface is, and the kernel
//! releases it when its holder exits, however it exits, so a crashed process
//! leaves nothing to clean up.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
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
        let (socket, addr) = claim_socket(scope, index)?;
        match bind(socket.as_raw_fd(), &addr) {
            Ok(()) => Ok(Some(EndpointClaim { _socket: socket })),
            Err(Errno::EADDRINUSE) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether some process holds endpoint `index` of the link `scope` names.
    /// Connecting to the claim takes no name, so a look never makes a
    /// claimant fail.
    pub(super) fn is_held(scope: &str, index: u8) -> io::Result<bool> {
        let (socket, addr) = claim_socket(scope, index)?;
        match connect(socket.as_raw_fd(), &addr) {
            Ok(()) => Ok(true),
            Err(Errno::ECONNREFUSED | Errno::ENOENT) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// A fresh Unix datagram socket and the abstract address of the claim.
fn claim_socket(scope: &str, index: u8) -> io::Result<(OwnedFd, UnixAddr)> {
    let name = format!("xmx-native/{scope}/{index}");
    let addr = UnixAddr::new_abstract(name.as_bytes())?;
    let socket = socket(
        AddressFamily::Unix,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    Ok((socket, addr))
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

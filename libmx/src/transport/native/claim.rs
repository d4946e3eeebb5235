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
        // SAFETY: plain syscall; the result is checked before use.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let name = format!("xmx-native/{scope}/{index}");
        let room =
            std::mem::size_of::<libc::sockaddr_un>() - std::mem::size_of::<libc::sa_family_t>();
        if 1 + name.len() > room {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "claim name too long",
            ));
        }
        // SAFETY: an all-zero sockaddr_un is a valid value of the type.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        // Abstract name: a leading NUL, then the name (no terminator).
        for (dst, &src) in addr.sun_path[1..].iter_mut().zip(name.as_bytes()) {
            *dst = src as libc::c_char;
        }
        let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
        // SAFETY: `addr` is a sockaddr_un whose first `len` bytes are set, and
        // `len` is within its size (the name is far shorter than sun_path).
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                len as libc::socklen_t,
            )
        };
        if rc == 0 {
            return Ok(Some(EndpointClaim { _socket: fd }));
        }
        match io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::EADDRINUSE) => Ok(None),
            e => Err(e),
        }
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
        drop(first);
        assert!(EndpointClaim::take(&link, 4).unwrap().is_some(), "released");
        drop(other);
        let long = "x".repeat(200);
        assert!(
            EndpointClaim::take(&long, 0).is_err(),
            "a name that does not fit"
        );
    }
}

//! The backend half of the xenbus handshake of device `xmx`.
//!
//! The discipline is Linux netback's. The toolstack creates the device (both directories, see
//! [`toolstack::attach`]); the backend then
//!
//! 1. publishes what it offers in its directory (`max-endpoints`, `max-regions`,
//!    `feature-rcache`, `feature-local-delivery`, `protocol-version`) and moves to InitWait;
//! 2. when the frontend says Initialised, reads
//!    `ring-ref`, `event-channel` and `protocol-version` from the frontend directory, maps the
//!    control ring, binds the channel and moves to Connected;
//! 3. when the frontend says Closing or Closed, or its directory vanishes, or the domain dies,
//!    releases everything the guest shares and moves to Closing, then Closed;
//! 4. when the frontend says Connected to a backend in InitWait (this backend restarted
//!    under it), closes the device, so that the frontend starts over and opens its
//!    endpoints again, keeping their sessions (see `EndpointOpen::resume_session`);
//! 5. when a closed frontend starts again (Initialising or InitWait, as after a resume or a
//!    migration), goes back to InitWait; its endpoints keep their sessions as in 4.
//!
//! [`step`] is that decision as a pure function; the daemon does the I/O around it.

pub mod toolstack;

use xmx_wire::xenbus::XenbusState;

/// What the backend does next for one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendStep {
    /// Nothing.
    Stay,
    /// Publish the features and move to InitWait: the frontend (re)starts.
    InitWait,
    /// Map the control ring, bind its channel, move to Connected.
    Connect,
    /// Release everything the guest shares, move to Closing and then Closed.
    Close,
    /// Release everything and move straight back to InitWait: the frontend restarted while
    /// connected (it lost its state, as a resumed guest does).
    Restart,
}

/// The next step of a backend in state `backend` whose frontend is in state `frontend`
/// (`None`: the frontend directory or its `state` key is gone).
pub fn step(backend: XenbusState, frontend: Option<XenbusState>) -> BackendStep {
    use XenbusState as S;
    match frontend {
        None | Some(S::Closing) | Some(S::Closed) => {
            if backend == S::Closed {
                BackendStep::Stay
            } else {
                BackendStep::Close
            }
        }
        Some(S::Initialising) | Some(S::InitWait) => match backend {
            S::InitWait => BackendStep::Stay,
            S::Connected => BackendStep::Restart,
            _ => BackendStep::InitWait,
        },
        Some(S::Initialised) => {
            if backend == S::InitWait {
                BackendStep::Connect
            } else {
                BackendStep::Stay
            }
        }
        Some(S::Connected) => {
            if backend == S::InitWait {
                // Connected to a backend that is gone (this one restarted): its endpoints
                // died with that backend, so the frontend goes through Closed and opens
                // them again; adopting its old ring would leave them unserved.
                BackendStep::Close
            } else {
                // Connected already, or closed under a frontend that has not noticed yet:
                // it has to go through Closed/Initialising before we serve it again.
                BackendStep::Stay
            }
        }
        Some(S::Unknown) | Some(S::Reconfiguring) | Some(S::Reconfigured) => BackendStep::Stay,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use XenbusState as S;

    #[test]
    fn handshake_path() {
        assert_eq!(step(S::InitWait, Some(S::Initialising)), BackendStep::Stay);
        assert_eq!(
            step(S::InitWait, Some(S::Initialised)),
            BackendStep::Connect
        );
        assert_eq!(step(S::Connected, Some(S::Connected)), BackendStep::Stay);
        assert_eq!(step(S::Connected, Some(S::Closing)), BackendStep::Close);
        assert_eq!(step(S::Closed, Some(S::Closed)), BackendStep::Stay);
        assert_eq!(
            step(S::Closed, Some(S::Initialising)),
            BackendStep::InitWait
        );
    }

    #[test]
    fn a_backend_restart_makes_a_connected_frontend_start_over() {
        assert_eq!(step(S::InitWait, Some(S::Connected)), BackendStep::Close);
        assert_eq!(step(S::Closed, Some(S::Connected)), BackendStep::Stay);
        assert_eq!(
            step(S::Closed, Some(S::Initialising)),
            BackendStep::InitWait
        );
    }

    #[test]
    fn a_vanished_frontend_closes_the_backend() {
        for b in [S::InitWait, S::Connected, S::Closing] {
            assert_eq!(step(b, None), BackendStep::Close, "{b:?}");
        }
        assert_eq!(step(S::Closed, None), BackendStep::Stay);
    }

    #[test]
    fn a_stale_frontend_is_not_served_after_a_disconnect() {
        // The backend closed the device (protocol violation); the frontend still says
        // Connected and must restart before it is served again.
        assert_eq!(step(S::Closed, Some(S::Connected)), BackendStep::Stay);
        assert_eq!(step(S::Closed, Some(S::Initialised)), BackendStep::Stay);
        assert_eq!(step(S::Closing, Some(S::Connected)), BackendStep::Stay);
    }

    #[test]
    fn a_frontend_restarting_under_a_connected_backend_restarts_it() {
        assert_eq!(
            step(S::Connected, Some(S::Initialising)),
            BackendStep::Restart
        );
        assert_eq!(step(S::Connected, Some(S::InitWait)), BackendStep::Restart);
    }

    #[test]
    fn every_pair_has_a_step() {
        for b in XenbusState::ALL {
            for f in XenbusState::ALL.iter().copied().map(Some).chain([None]) {
                let s = step(b, f);
                if s == BackendStep::Connect {
                    assert_eq!(b, S::InitWait);
                }
                if b == S::Closed {
                    assert_ne!(s, BackendStep::Close);
                }
            }
        }
    }
}

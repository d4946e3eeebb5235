//! The frontend half of the xenbus handshake of device `xmx`, as a pure decision.
//!
//! The backend (see `xmx_backend::xenbus`) publishes its offer and waits in InitWait; the
//! frontend then grants the control ring, allocates its event channel, publishes
//! `ring-ref`, `event-channel`, `protocol-version` and `feature-rcache` and says
//! Initialised; the backend maps the ring and says Connected; the frontend reads what the
//! backend published and says Connected too.
//!
//! Either side closing makes the other tear down. A backend in Closing is releasing what
//! it mapped (or died doing so), so the frontend tears down then: grants the backend still
//! maps are kept by the platform until it unmaps them. The frontend says Closed and, when
//! it still wants the device, starts again from Initialising once the backend is Closed
//! (or back in InitWait). A backend that restarts under a connected frontend (it
//! shows InitWait again) has lost the guest's endpoints, so the frontend goes through
//! Closed as well rather than let a fresh backend adopt a half-known ring.

use xmx_wire::xenbus::XenbusState;

/// What the frontend does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontendStep {
    /// Nothing until the backend moves.
    Stay,
    /// Grant the control ring, publish it, say Initialised.
    Publish,
    /// Read the backend's offer and say Connected.
    Connect,
    /// Release the control ring (the backend let go or is gone), say Closed.
    Teardown,
    /// Say Initialising: ask a closed backend to start over.
    Restart,
}

/// The next step of a frontend that last wrote `front`, whose backend shows `back`
/// (`None`: the backend directory or its state is gone). `want` is false while the
/// frontend must stay disconnected (suspended, shutting down).
pub fn step(front: XenbusState, back: Option<XenbusState>, want: bool) -> FrontendStep {
    use XenbusState as S;
    let published = matches!(front, S::Initialised | S::Connected);
    let Some(back) = back else {
        return if published {
            FrontendStep::Teardown
        } else {
            FrontendStep::Stay
        };
    };
    if published {
        return match back {
            S::Closing | S::Closed => FrontendStep::Teardown,
            S::InitWait if front == S::Connected => FrontendStep::Teardown,
            S::Connected if front == S::Initialised => FrontendStep::Connect,
            _ if !want => FrontendStep::Teardown,
            _ => FrontendStep::Stay,
        };
    }
    if !want {
        return FrontendStep::Stay;
    }
    match front {
        S::Initialising => match back {
            S::InitWait => FrontendStep::Publish,
            _ => FrontendStep::Stay,
        },
        // Closing, Closed, or a state we never write: start over once the backend has
        // let go (Closed) or is ready again (InitWait, Initialising).
        _ => match back {
            S::Closed | S::InitWait | S::Initialising | S::Unknown => FrontendStep::Restart,
            _ => FrontendStep::Stay,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use XenbusState as S;

    #[test]
    fn the_handshake_path() {
        assert_eq!(
            step(S::Initialising, Some(S::Initialising), true),
            FrontendStep::Stay
        );
        assert_eq!(
            step(S::Initialising, Some(S::InitWait), true),
            FrontendStep::Publish
        );
        assert_eq!(
            step(S::Initialised, Some(S::InitWait), true),
            FrontendStep::Stay
        );
        assert_eq!(
            step(S::Initialised, Some(S::Connected), true),
            FrontendStep::Connect
        );
        assert_eq!(
            step(S::Connected, Some(S::Connected), true),
            FrontendStep::Stay
        );
    }

    #[test]
    fn a_closing_backend_is_followed_and_rejoined() {
        assert_eq!(
            step(S::Connected, Some(S::Closing), true),
            FrontendStep::Teardown
        );
        assert_eq!(
            step(S::Connected, Some(S::Closed), true),
            FrontendStep::Teardown
        );
        assert_eq!(
            step(S::Initialised, Some(S::Closed), true),
            FrontendStep::Teardown
        );
        assert_eq!(step(S::Closed, Some(S::Closing), true), FrontendStep::Stay);
        assert_eq!(
            step(S::Closed, Some(S::Closed), true),
            FrontendStep::Restart
        );
        assert_eq!(
            step(S::Initialising, Some(S::Closed), true),
            FrontendStep::Stay
        );
    }

    #[test]
    fn a_vanished_backend_tears_down() {
        assert_eq!(step(S::Connected, None, true), FrontendStep::Teardown);
        assert_eq!(step(S::Initialised, None, true), FrontendStep::Teardown);
        assert_eq!(step(S::Initialising, None, true), FrontendStep::Stay);
        assert_eq!(step(S::Closed, None, true), FrontendStep::Stay);
    }

    #[test]
    fn a_restarted_backend_is_not_trusted_with_the_old_ring() {
        assert_eq!(
            step(S::Connected, Some(S::InitWait), true),
            FrontendStep::Teardown
        );
        assert_eq!(
            step(S::Closed, Some(S::InitWait), true),
            FrontendStep::Restart
        );
    }

    #[test]
    fn a_frontend_that_must_stay_down_only_tears_down() {
        for b in XenbusState::ALL.iter().copied().map(Some).chain([None]) {
            for f in [S::Initialising, S::Closing, S::Closed] {
                assert_eq!(step(f, b, false), FrontendStep::Stay, "{f:?} {b:?}");
            }
            assert_ne!(step(S::Connected, b, false), FrontendStep::Stay, "{b:?}");
            assert_ne!(step(S::Connected, b, false), FrontendStep::Publish);
        }
    }

    #[test]
    fn every_pair_has_a_sane_step() {
        for f in XenbusState::ALL {
            for b in XenbusState::ALL.iter().copied().map(Some).chain([None]) {
                for want in [true, false] {
                    match step(f, b, want) {
                        FrontendStep::Publish => {
                            assert_eq!((f, b), (S::Initialising, Some(S::InitWait)))
                        }
                        FrontendStep::Connect => {
                            assert_eq!((f, b), (S::Initialised, Some(S::Connected)))
                        }
                        FrontendStep::Teardown => {
                            assert!(matches!(f, S::Initialised | S::Connected))
                        }
                        FrontendStep::Restart => {
                            assert!(
                                want && !matches!(
                                    f,
                                    S::Initialising | S::Initialised | S::Connected
                                )
                            )
                        }
                        FrontendStep::Stay => {}
                    }
                }
            }
        }
    }
}

//! xenbus states and the xenstore layout of the `xmx` device.
//!
//! ```text
//! /local/domain/<domU>/device/xmx/<n>/            frontend directory (written by the guest)
//!     backend, backend-id, state,
//!     ring-ref, event-channel, protocol-version, feature-rcache
//! /local/domain/<dom0>/backend/xmx/<domU>/<n>/    backend directory (written by dom0)
//!     frontend, frontend-id, state,
//!     protocol-version, mac, cluster, hostname, max-endpoints, max-regions,
//!     feature-local-delivery
//! ```
//!
//! Values are decimal strings except `backend`/`frontend` (paths), `mac`
//! (`aa:bb:cc:dd:ee:ff`) and `hostname`. The toolstack writes `backend`, `backend-id`,
//! `frontend` and `frontend-id` when it creates the device.

use std::fmt;
use std::str::FromStr;

use crate::{Error, Result};

/// The xenbus device type of xmx.
pub const DEVICE_TYPE: &str = "xmx";

/// A xenbus device state, as written under `state` (`io/xenbus.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum XenbusState {
    /// No state known: nothing written yet, or the key could not be read.
    Unknown = 0,
    /// The device is being set up; its side has published nothing yet.
    Initialising = 1,
    /// The backend waits for the frontend's details (ring, event channel).
    InitWait = 2,
    /// The frontend published its details.
    Initialised = 3,
    /// Both sides are attached: the rings are live.
    Connected = 4,
    /// The device is being closed, by either side.
    Closing = 5,
    /// The device is closed; its side has released the ring and event channel.
    Closed = 6,
    /// A reconfiguration is in progress (part of `io/xenbus.h`, not used by xmx).
    Reconfiguring = 7,
    /// A reconfiguration finished (part of `io/xenbus.h`, not used by xmx).
    Reconfigured = 8,
}

impl XenbusState {
    /// Every state, in numeric order.
    pub const ALL: [XenbusState; 9] = [
        XenbusState::Unknown,
        XenbusState::Initialising,
        XenbusState::InitWait,
        XenbusState::Initialised,
        XenbusState::Connected,
        XenbusState::Closing,
        XenbusState::Closed,
        XenbusState::Reconfiguring,
        XenbusState::Reconfigured,
    ];

    /// The state with number `value`.
    pub fn from_u32(value: u32) -> Result<Self> {
        Self::ALL
            .get(value as usize)
            .copied()
            .ok_or(Error::Unknown {
                what: "xenbus state",
                value,
            })
    }

    /// The state's name as `io/xenbus.h` spells it, without the `XenbusState` prefix.
    pub fn name(self) -> &'static str {
        match self {
            XenbusState::Unknown => "Unknown",
            XenbusState::Initialising => "Initialising",
            XenbusState::InitWait => "InitWait",
            XenbusState::Initialised => "Initialised",
            XenbusState::Connected => "Connected",
            XenbusState::Closing => "Closing",
            XenbusState::Closed => "Closed",
            XenbusState::Reconfiguring => "Reconfiguring",
            XenbusState::Reconfigured => "Reconfigured",
        }
    }

    /// True for Closing and Closed: the other side should tear down.
    pub fn is_closing(self) -> bool {
        matches!(self, XenbusState::Closing | XenbusState::Closed)
    }
}

impl From<XenbusState> for u32 {
    fn from(state: XenbusState) -> u32 {
        state as u32
    }
}

/// The xenstore form: the decimal number.
impl fmt::Display for XenbusState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", *self as u32)
    }
}

/// Parse the xenstore form: a decimal number, with surrounding whitespace or a trailing NUL
/// tolerated.
impl FromStr for XenbusState {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::from_u32(parse_u32(s)?)
    }
}

/// Parse a decimal xenstore value (whitespace and trailing NULs tolerated).
pub fn parse_u32(s: &str) -> Result<u32> {
    let t = s.trim_end_matches('\0').trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Error::Invalid {
            field: "xenstore value",
            reason: "not a decimal number",
        });
    }
    t.parse().map_err(|_| Error::Invalid {
        field: "xenstore value",
        reason: "number out of range",
    })
}

/// Key names under the device directories.
pub mod keys {
    /// xenbus state (both directories).
    pub const STATE: &str = "state";
    /// Frontend dir: path of the backend directory.
    pub const BACKEND: &str = "backend";
    /// Frontend dir: domain id of the backend.
    pub const BACKEND_ID: &str = "backend-id";
    /// Backend dir: path of the frontend directory.
    pub const FRONTEND: &str = "frontend";
    /// Backend dir: domain id of the frontend.
    pub const FRONTEND_ID: &str = "frontend-id";

    /// Frontend: grant ref of the control ring page.
    pub const RING_REF: &str = "ring-ref";
    /// Frontend: event-channel port of the control ring (allocated for the backend).
    pub const EVENT_CHANNEL: &str = "event-channel";
    /// Both: the message protocol version the side speaks (`msg::PROTOCOL_VERSION`).
    pub const PROTOCOL_VERSION: &str = "protocol-version";
    /// Frontend: "1" if the guest keeps regions registered across messages (MX_RCACHE).
    pub const FEATURE_RCACHE: &str = "feature-rcache";

    /// Backend: the guest's board MAC address, `aa:bb:cc:dd:ee:ff`.
    pub const MAC: &str = "mac";
    /// Backend: the guest's virtual cluster id.
    pub const CLUSTER: &str = "cluster";
    /// Backend: the guest's MX hostname.
    pub const HOSTNAME: &str = "hostname";
    /// Backend: the guest's quality-of-service weight (1 if absent), set by dom0.
    pub const QOS_WEIGHT: &str = "qos-weight";
    /// Backend: endpoints the guest may open.
    pub const MAX_ENDPOINTS: &str = "max-endpoints";
    /// Backend: regions each endpoint may register.
    pub const MAX_REGIONS: &str = "max-regions";
    /// Backend: "1" if co-located guests are served without the wire.
    pub const FEATURE_LOCAL_DELIVERY: &str = "feature-local-delivery";
    /// Backend: "1" while dom0 holds the device closed (a guest about to migrate on real
    /// Xen must have let go of its event channels before its kernel suspends: see
    /// `xmx-hook migrate`). The backend closes the device and serves it again only once
    /// the key is gone; the frontend keeps its endpoints meanwhile.
    pub const HOLD: &str = "hold";
    /// Backend: `endpoint-sessions/<endpoint>` holds the session the backend gave each
    /// open endpoint, so that the endpoint keeps it when its device reconnects (a
    /// restarted backend, a resumed guest, a frontend that started over).
    pub const ENDPOINT_SESSIONS: &str = "endpoint-sessions";
}

/// `/local/domain/<domu>/device/xmx`: where a guest's xmx frontends live.
pub fn frontend_root(domu: u16) -> String {
    format!("/local/domain/{domu}/device/{DEVICE_TYPE}")
}

/// `/local/domain/<domu>/device/xmx/<devid>`: one frontend's directory.
pub fn frontend_dir(domu: u16, devid: u32) -> String {
    format!("{}/{devid}", frontend_root(domu))
}

/// `/local/domain/<backend_dom>/backend/xmx`: the directory a backend watches.
pub fn backend_root(backend_dom: u16) -> String {
    format!("/local/domain/{backend_dom}/backend/{DEVICE_TYPE}")
}

/// `/local/domain/<backend_dom>/backend/xmx/<domu>/<devid>`: one backend's directory.
pub fn backend_dir(backend_dom: u16, domu: u16, devid: u32) -> String {
    format!("{}/{domu}/{devid}", backend_root(backend_dom))
}

/// `<dir>/<key>`.
pub fn key_path(dir: &str, key: &str) -> String {
    format!("{}/{key}", dir.trim_end_matches('/'))
}

/// A path below a backend root, taken apart (for watch events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendNode<'a> {
    /// Domain the backend runs in.
    pub backend_dom: u16,
    /// The frontend's domain.
    pub domu: u16,
    /// Device id.
    pub devid: u32,
    /// What follows the device directory (`"state"`, ...); empty for the directory itself.
    pub rest: &'a str,
}

/// Take apart `/local/domain/<b>/backend/xmx/<domu>/<devid>[/<rest>]`; `None` for any path
/// not of that shape.
pub fn parse_backend_path(path: &str) -> Option<BackendNode<'_>> {
    let tail = path.strip_prefix("/local/domain/")?;
    let (b, tail) = tail.split_once('/')?;
    let tail = tail
        .strip_prefix("backend/")?
        .strip_prefix(DEVICE_TYPE)?
        .strip_prefix('/')?;
    let (domu, tail) = tail.split_once('/')?;
    let (devid, rest) = tail.split_once('/').unwrap_or((tail, ""));
    Some(BackendNode {
        backend_dom: parse_id(b)?.try_into().ok()?,
        domu: parse_id(domu)?.try_into().ok()?,
        devid: parse_id(devid)?,
        rest,
    })
}

/// A path below a frontend root, taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontendNode<'a> {
    /// The frontend's domain.
    pub domu: u16,
    /// Device id.
    pub devid: u32,
    /// What follows the device directory; empty for the directory itself.
    pub rest: &'a str,
}

/// Take apart `/local/domain/<domu>/device/xmx/<devid>[/<rest>]`.
pub fn parse_frontend_path(path: &str) -> Option<FrontendNode<'_>> {
    let tail = path.strip_prefix("/local/domain/")?;
    let (domu, tail) = tail.split_once('/')?;
    let tail = tail
        .strip_prefix("device/")?
        .strip_prefix(DEVICE_TYPE)?
        .strip_prefix('/')?;
    let (devid, rest) = tail.split_once('/').unwrap_or((tail, ""));
    Some(FrontendNode {
        domu: parse_id(domu)?.try_into().ok()?,
        devid: parse_id(devid)?,
        rest,
    })
}

fn parse_id(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_have_xenbus_h_numbers() {
        let expected = [
            ("0", XenbusState::Unknown),
            ("1", XenbusState::Initialising),
            ("2", XenbusState::InitWait),
            ("3", XenbusState::Initialised),
            ("4", XenbusState::Connected),
            ("5", XenbusState::Closing),
            ("6", XenbusState::Closed),
            ("7", XenbusState::Reconfiguring),
            ("8", XenbusState::Reconfigured),
        ];
        for (text, state) in expected {
            assert_eq!(text.parse::<XenbusState>().unwrap(), state);
            assert_eq!(state.to_string(), text);
            assert_eq!(XenbusState::from_u32(u32::from(state)).unwrap(), state);
        }
        assert_eq!(XenbusState::Connected.name(), "Connected");
        assert!(XenbusState::Closing.is_closing() && XenbusState::Closed.is_closing());
        assert!(!XenbusState::Connected.is_closing());
    }

    #[test]
    fn state_strings_are_parsed_strictly() {
        assert_eq!(
            " 4\n".parse::<XenbusState>().unwrap(),
            XenbusState::Connected
        );
        assert_eq!("6\0".parse::<XenbusState>().unwrap(), XenbusState::Closed);
        assert_eq!(
            "9".parse::<XenbusState>(),
            Err(Error::Unknown {
                what: "xenbus state",
                value: 9
            })
        );
        for bad in ["", "x", "-1", "+4", "4 4", "0x4", "99999999999"] {
            assert!(
                matches!(bad.parse::<XenbusState>(), Err(Error::Invalid { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn device_paths() {
        assert_eq!(frontend_dir(7, 0), "/local/domain/7/device/xmx/0");
        assert_eq!(backend_dir(0, 7, 3), "/local/domain/0/backend/xmx/7/3");
        assert_eq!(backend_root(0), "/local/domain/0/backend/xmx");
        assert_eq!(
            key_path(&frontend_dir(7, 0), keys::RING_REF),
            "/local/domain/7/device/xmx/0/ring-ref"
        );
        assert_eq!(key_path("/a/b/", keys::STATE), "/a/b/state");
    }

    #[test]
    fn watch_paths_are_taken_apart() {
        let node = parse_backend_path("/local/domain/0/backend/xmx/7/3/state").unwrap();
        assert_eq!(
            node,
            BackendNode {
                backend_dom: 0,
                domu: 7,
                devid: 3,
                rest: "state"
            }
        );
        let node = parse_backend_path("/local/domain/0/backend/xmx/7/3").unwrap();
        assert_eq!(node.rest, "");
        assert_eq!(parse_backend_path("/local/domain/0/backend/xmx/7"), None);
        assert_eq!(parse_backend_path("/local/domain/0/backend/vif/7/0"), None);
        assert_eq!(
            parse_backend_path("/local/domain/0/backend/xmx/70000/0"),
            None
        );
        assert_eq!(parse_backend_path("/local/domain/0/backend/xmxx/7/0"), None);
        let node = parse_frontend_path("/local/domain/7/device/xmx/0/backend-id").unwrap();
        assert_eq!(
            node,
            FrontendNode {
                domu: 7,
                devid: 0,
                rest: "backend-id"
            }
        );
        assert_eq!(parse_frontend_path("/local/domain/x/device/xmx/0"), None);
        assert_eq!(parse_frontend_path("/local/domain/7/device/xmx/"), None);
    }
}

//! The status and control socket of `xmx-backd`.
//!
//! A unix stream socket (`--control PATH`, mode 0600); one JSON object per line each way,
//! requests served in order per connection, by the daemons' shared control server
//! ([`xmx_hv::daemon::control`]).
//!
//! # Requests
//!
//! ```text
//! {"op":"counters"}
//! {"op":"guests"}
//! {"op":"set-peers","peers":[{"index":0,"mac":"02:00:00:00:00:01","hostname":"h:0","cluster":1}, ...]}
//! {"op":"attach","domid":5,"devid":0,"mac":"02:00:00:00:05:00","cluster":1,"hostname":"g5:0"}
//! {"op":"detach","domid":5,"devid":0}
//! ```
//!
//! `devid` defaults to 0, `cluster` to 0; `hostname` may be left out for `attach` (the
//! daemon then names the guest `<host>-<domid>:<devid>`). Unknown fields are refused
//! (`counters` and `guests`, which take none, ignore them).
//!
//! # Replies
//!
//! `{"ok":true,"result":R}` or `{"ok":false,"error":{"kind":K,"message":M}}` with `K` one of
//! `invalid`, `not_found`, `exists`, `busy`, `denied`, `quota`, `closed`, `io`, `protocol`.
//!
//! - `counters`: R = [`CountersReport`]:
//!   `{"engine":{"rx_frames","rx_malformed","rx_unknown_destination","rx_spoofed_source"},
//!     "backend":{"rounds","nic_rx_frames","nic_tx_frames","nic_tx_errors","nic_link_errors",
//!                "nic_link_reopens","nic_rx_ring_drops","tx_without_link","disconnects"},
//!     "guests":[{"domid","devid","connected","ctrl_requests","quota_refusals",
//!                "nic":{"tx_frames","tx_bytes","local_frames","local_bytes","rx_frames",
//!                       "rx_bytes","nacks_sent","send_errors","pulls_done","pulls_failed",
//!                       "retransmits","quota_refusals","total_drops","drops":{REASON:N},
//!                       "weight","pull_frames_granted","wide_frags_sent",
//!                       "wide_frags_received","wide_downgrades"},
//!                "endpoints":[{"endpoint","send_requests","events","event_drops",
//!                              "notifications","quiet_send_done","quiet_events",
//!                              "backlog"}]}]}`
//!   (`nic` is null while the guest is not connected; `retransmits` counts PULL blocks
//!   requested again; `drops` keys are snake_case drop reasons such as `cross_cluster`).
//! - `guests`: R = list of [`GuestReport`]:
//!   `[{"domid","devid","state","state_name","mac","cluster","hostname","connected",
//!      "endpoints":[N...],"regions","mapped_pages","kept_pages","kept_reuses",
//!      "last_error"}]`.
//! - `set-peers`: R = `{"peers":N}` (entries in the new table).
//! - `attach`, `detach`: R = `null`.

pub mod client;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use client::AdminClient;
pub use xmx_hv::daemon::control::{Reply, ReplyError};

/// A request on the control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum BackdRequest {
    /// Counters per guest and endpoint.
    Counters,
    /// Every device the backend knows.
    Guests,
    /// Replace the peer table.
    SetPeers {
        /// The new table, every entry of it.
        peers: Vec<PeerSpec>,
    },
    /// Create a device in xenstore (both halves).
    Attach {
        /// The guest domain.
        domid: u16,
        /// Device index within the guest (default 0).
        #[serde(default)]
        devid: u32,
        /// MAC of the guest's virtual NIC, `aa:bb:cc:dd:ee:ff`.
        mac: String,
        /// Virtual cluster of the guest (default 0).
        #[serde(default)]
        cluster: u32,
        /// MX hostname of the guest; by default `<host>-<domid>:<devid>`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hostname: Option<String>,
    },
    /// Remove a device from xenstore.
    Detach {
        /// The guest domain.
        domid: u16,
        /// Device index within the guest (default 0).
        #[serde(default)]
        devid: u32,
    },
}

/// One peer-table entry as the peer service pushes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerSpec {
    /// Index guests name the peer by.
    pub index: u16,
    /// Board MAC, `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
    /// MX hostname (`host:board`).
    pub hostname: String,
    /// Virtual cluster of the peer.
    pub cluster: u32,
}

/// The reply error for a platform error, in this socket's kinds.
pub(crate) fn hv_reply_error(e: &xmx_hv::Error) -> ReplyError {
    use xmx_hv::Error as E;
    let kind = match e {
        E::NotFound(_) => "not_found",
        E::Denied(_) => "denied",
        E::Busy(_) | E::Again => "busy",
        E::Exists(_) => "exists",
        E::Invalid(_) => "invalid",
        E::Quota(_) => "quota",
        E::Closed(_) => "closed",
        E::Io(_) => "io",
        E::Unsupported(_) | E::Protocol(_) | E::Xs(_) => "protocol",
    };
    ReplyError::new(kind, e.to_string())
}

/// Engine-wide receive counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineCountersReport {
    /// Frames handed to the engine.
    pub rx_frames: u64,
    /// Frames whose head did not parse.
    pub rx_malformed: u64,
    /// Frames for a MAC that belongs to none of the guests.
    pub rx_unknown_destination: u64,
    /// Frames from the wire whose source MAC is a guest's of this host.
    pub rx_spoofed_source: u64,
}

/// Counters of the service loop itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendCounters {
    /// Service rounds run.
    pub rounds: u64,
    /// Frames received from the NIC.
    pub nic_rx_frames: u64,
    /// Frames handed to the NIC.
    pub nic_tx_frames: u64,
    /// Frames the NIC refused.
    pub nic_tx_errors: u64,
    /// Errors the link reported (down, interface gone, flush refused).
    #[serde(default)]
    pub nic_link_errors: u64,
    /// Sockets opened again on a re-created interface.
    #[serde(default)]
    pub nic_link_reopens: u64,
    /// Frames the kernel dropped before the backend saw them, its receive ring full (on
    /// the sockets opened since the last reopen, plus those before).
    #[serde(default)]
    pub nic_rx_ring_drops: u64,
    /// Frames for the wire dropped because the backend runs without a NIC.
    pub tx_without_link: u64,
    /// Guests disconnected for breaking the protocol.
    pub disconnects: u64,
}

/// A guest's virtual NIC counters, from the engine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicCountersReport {
    /// Frames the guest put on the wire.
    pub tx_frames: u64,
    /// Their bytes.
    pub tx_bytes: u64,
    /// Frames the guest sent to co-located guests without touching the wire.
    pub local_frames: u64,
    /// Their bytes.
    pub local_bytes: u64,
    /// Frames received for the guest from a known peer of its cluster.
    pub rx_frames: u64,
    /// Their bytes.
    pub rx_bytes: u64,
    /// NACK frames sent on the guest's behalf.
    pub nacks_sent: u64,
    /// Send requests completed with an ERROR event.
    pub send_errors: u64,
    /// Pulls that completed successfully.
    pub pulls_done: u64,
    /// Pulls that failed (nack, timeout, abort).
    pub pulls_failed: u64,
    /// PULL blocks requested again.
    pub retransmits: u64,
    /// Send requests refused because a per-guest quota was reached.
    pub quota_refusals: u64,
    /// Frames and packets dropped, all reasons together.
    pub total_drops: u64,
    /// Drops per reason (snake_case name), reasons with none left out.
    pub drops: BTreeMap<String, u64>,
    /// The guest's QoS weight (its share of the pull budget and of transmit).
    #[serde(default = "default_qos_weight")]
    pub weight: u32,
    /// PULL_REPLY frames of the host's budget granted to the guest's pulls.
    #[serde(default)]
    pub pull_frames_granted: u64,
    /// MEDIUM fragments sent wider than MX's 4 KiB, to xmx peers that allow them.
    #[serde(default)]
    pub wide_frags_sent: u64,
    /// Wide MEDIUM fragments received (split into MX's for the guest).
    #[serde(default)]
    pub wide_frags_received: u64,
    /// Wide messages sent again in MX's fragments (a peer stopped taking them).
    #[serde(default)]
    pub wide_downgrades: u64,
}

fn default_qos_weight() -> u32 {
    1
}

/// Counters of one open endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointCountersReport {
    /// Endpoint index.
    pub endpoint: u8,
    /// Send requests taken from the send ring.
    pub send_requests: u64,
    /// Events written to the event ring.
    pub events: u64,
    /// Received-message events dropped because the event backlog was full.
    pub event_drops: u64,
    /// Event-channel notifications sent to the guest.
    pub notifications: u64,
    /// The application opened the endpoint asking for quiet send completions
    /// (`xmx_wire::msg::EndpointOpen::quiet_send_done`).
    #[serde(default)]
    pub quiet_send_done: bool,
    /// Events written without a notification of their own (quiet send completions; the
    /// next notified event covers them).
    #[serde(default)]
    pub quiet_events: u64,
    /// Events waiting for room in the event ring now.
    pub backlog: u64,
}

/// Counters of one device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestCountersReport {
    /// The guest domain.
    pub domid: u16,
    /// Device index within the guest.
    pub devid: u32,
    /// Whether the device is connected (its rings served).
    pub connected: bool,
    /// Control requests served since the device was first seen.
    pub ctrl_requests: u64,
    /// Control requests refused for a quota since the device was first seen.
    pub quota_refusals: u64,
    /// The guest's virtual NIC counters; `None` while the device is not connected.
    pub nic: Option<NicCountersReport>,
    /// Every open endpoint (none while the device is not connected).
    pub endpoints: Vec<EndpointCountersReport>,
}

/// Reply of `counters`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountersReport {
    /// Engine-wide receive counters.
    pub engine: EngineCountersReport,
    /// Counters of the service loop.
    pub backend: BackendCounters,
    /// Every device the backend knows.
    pub guests: Vec<GuestCountersReport>,
}

/// One entry of the reply of `guests`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestReport {
    /// The guest domain.
    pub domid: u16,
    /// Device index within the guest.
    pub devid: u32,
    /// The backend's xenbus state, as its number.
    pub state: u32,
    /// The same, by name.
    pub state_name: String,
    /// MAC of the guest's virtual NIC (empty while the backend refuses the values in xenstore).
    pub mac: String,
    /// Virtual cluster of the guest (0 while the backend refuses the values in xenstore).
    pub cluster: u32,
    /// MX hostname of the guest (empty while the backend refuses the values in xenstore).
    pub hostname: String,
    /// Whether the device is connected (its rings served).
    pub connected: bool,
    /// Indices of the open endpoints.
    pub endpoints: Vec<u8>,
    /// Regions registered, all endpoints together.
    pub regions: usize,
    /// Guest pages the backend has mapped for the device's endpoints and regions.
    pub mapped_pages: usize,
    /// Of those, pages of deregistered windows kept mapped for the next windows over the
    /// same grants.
    #[serde(default)]
    pub kept_pages: usize,
    /// Registrations served from a kept mapping (no map, no unmap).
    #[serde(default)]
    pub kept_reuses: u64,
    /// Why the device was last closed by the backend, if it was.
    pub last_error: Option<String>,
}

/// `CamelCase` to `snake_case`, for counter names taken from enum variants.
pub(crate) fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_the_documented_json_form() {
        let r: BackdRequest = serde_json::from_str(r#"{"op":"counters"}"#).unwrap();
        assert_eq!(r, BackdRequest::Counters);
        let r: BackdRequest = serde_json::from_str(
            r#"{"op":"set-peers","peers":[{"index":3,"mac":"02:00:00:00:00:01","hostname":"h:0","cluster":1}]}"#,
        )
        .unwrap();
        assert_eq!(
            r,
            BackdRequest::SetPeers {
                peers: vec![PeerSpec {
                    index: 3,
                    mac: "02:00:00:00:00:01".into(),
                    hostname: "h:0".into(),
                    cluster: 1
                }]
            }
        );
        let r: BackdRequest =
            serde_json::from_str(r#"{"op":"attach","domid":5,"mac":"02:00:00:00:05:00"}"#).unwrap();
        assert_eq!(
            r,
            BackdRequest::Attach {
                domid: 5,
                devid: 0,
                mac: "02:00:00:00:05:00".into(),
                cluster: 0,
                hostname: None
            }
        );
        assert_eq!(
            serde_json::to_string(&BackdRequest::Detach { domid: 5, devid: 1 }).unwrap(),
            r#"{"op":"detach","domid":5,"devid":1}"#
        );
        for bad in [
            r#"{"op":"reboot"}"#,
            r#"{"op":"detach"}"#,
            r#"{"op":"detach","domid":1,"extra":1}"#,
            r#"{"op":"detach","domid":70000}"#,
            "[]",
        ] {
            assert!(serde_json::from_str::<BackdRequest>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn counter_names_are_snake_case() {
        assert_eq!(snake_case("CrossCluster"), "cross_cluster");
        assert_eq!(snake_case("TxQuota"), "tx_quota");
        assert_eq!(snake_case("Malformed"), "malformed");
    }
}

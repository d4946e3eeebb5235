//! xmxd's control socket: what `xmx` asks of it.
//!
//! A unix stream socket (`--control PATH`, mode 0600), one JSON object per line each way,
//! answered in order by the daemons' shared control server ([`xmx_hv::daemon::control`]);
//! unknown fields are refused (requests that take none ignore them). Replies have the
//! shape of every daemon's ([`Reply`]): `{"ok":true,"result":R}` or
//! `{"ok":false,"error":{"kind":K,"message":M}}`.
//!
//! ```text
//! {"op":"status"}                                  -> StatusReport
//! {"op":"peers"}                                   -> PeersReport (the whole table)
//! {"op":"peers","guest":"vm1"}                     -> what guest vm1 may see (its cluster)
//! {"op":"peers","after":7,"timeout_ms":2000}       -> waits until the table's generation
//!                                                     passes 7 (or the timeout)
//! {"op":"guests"}                                  -> [GuestStatus]
//! {"op":"clusters"}                                -> [ClusterReport]
//! {"op":"cluster-create","name":"blue"}            -> {"id":N}
//! {"op":"cluster-delete","name":"blue","force":false} -> {"moved":[guest...]}
//! {"op":"cluster-add","name":"blue","guest":"vm1"} -> {"running":B} (guest: a name or a
//!                                                     domid; a guest neither running here,
//!                                                     nor recorded, nor announced by another
//!                                                     host needs "new":true)
//! {"op":"cluster-remove","name":"blue","guest":"vm1"} -> null (back to the default cluster)
//! {"op":"attach","domid":5,"cluster":"blue"}       -> GuestStatus (cluster optional)
//! {"op":"detach","domid":5}                        -> null
//! {"op":"qos","guest":"vm1","weight":4}            -> QosReport (weight optional: read)
//! {"op":"direct","enabled":false}                  -> DirectReport (enabled optional: read;
//!                                                     false revokes every direct channel)
//! {"op":"direct-leaving","domid":5,"leaving":true} -> DirectReport (domain 5 is about to
//!                                                     migrate away: its channels are revoked
//!                                                     now and not offered again while it is
//!                                                     here; false undoes it)
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use xmx_hv::daemon::control::{LineClient, Refusal, Reply, ReplyError};
use xmx_hv::DomId;

use super::state::mac_text;
use super::table::{Conflict, Peer};
use xmx_wire::mxoe::Mac;

/// Longest wait a `peers` request may ask for.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(60);

/// A request on the control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum XmxdRequest {
    /// This host, its fabric and its backend.
    Status,
    /// The peer table, or one guest's view of it.
    Peers {
        /// Only what this guest (a name or a domid of this host) may see: its cluster.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        guest: Option<String>,
        /// Answer once the table's generation is above this.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<u64>,
        /// How long to wait for that, in milliseconds (none: do not wait; at most
        /// `MAX_WAIT`, 60 s).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// Guests this host knows.
    Guests,
    /// Clusters and their members.
    Clusters,
    /// Create a cluster.
    ClusterCreate {
        /// The new cluster's name.
        name: String,
    },
    /// Delete a cluster (its members go back to the default one if `force`).
    ClusterDelete {
        /// The cluster.
        name: String,
        /// Delete it even if it has members (they are moved to the default cluster).
        #[serde(default)]
        force: bool,
    },
    /// Put a guest (name or domid) in a cluster.
    ClusterAdd {
        /// The cluster.
        name: String,
        /// The guest, by name or by the domid of its domain here.
        guest: String,
        /// Record a guest no one knows yet (it joins the cluster when it starts); without
        /// it, such a name is refused as most likely a typo.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        new: bool,
    },
    /// Take a guest out of a cluster, back to the default one.
    ClusterRemove {
        /// The cluster the guest is in now.
        name: String,
        /// The guest, by name or by the domid of its domain here.
        guest: String,
    },
    /// Give a running domain the xmx device.
    Attach {
        /// The domain.
        domid: DomId,
        /// The cluster to put it in; without it, the one recorded for the guest, or the
        /// default cluster.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cluster: Option<String>,
    },
    /// Take the xmx device away from a running domain.
    Detach {
        /// The domain.
        domid: DomId,
    },
    /// Set (or read) a guest's QoS weight (guest: a name or a domid).
    Qos {
        /// The guest, by name or by the domid of its domain here.
        guest: String,
        /// The new weight; without it, the weight is only read.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        weight: Option<u32>,
    },
    /// Turn the direct channels between co-located guests on or off (or just report).
    Direct {
        /// Offer channels (true) or revoke them all (false); without it, only report.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        enabled: Option<bool>,
    },
    /// A domain of this host is about to leave it (a migration): its direct channels are
    /// revoked now, while it still runs, so that its peers go back to the backend path
    /// before it stops and nothing is written into a channel of a frozen guest; none is
    /// offered to it again while it is here. The mark ends with the domain, or with
    /// `leaving: false` (a migration that rolled back).
    DirectLeaving {
        /// The domain, on this host.
        domid: DomId,
        /// Leaving (true) or staying after all (false).
        leaving: bool,
    },
}

/// Reply of `direct`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DirectReport {
    /// Whether channels are offered.
    pub(crate) enabled: bool,
    /// The pairs of domains offered a channel now (lower domid first).
    pub(crate) pairs: Vec<(DomId, DomId)>,
}

/// Reply of `qos`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosReport {
    /// The guest's name (its weight follows the name across restarts and migrations).
    pub guest: String,
    /// Its weight now (1 unless set).
    pub weight: u32,
    /// Domains of this host running the guest now, whose backend applies the weight.
    pub domains: Vec<DomId>,
}

/// Reply of `status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StatusReport {
    /// This host's name.
    pub(crate) host: String,
    /// This host's NIC address on the fabric, as the other hosts know it.
    #[serde(with = "mac_text")]
    pub(crate) host_mac: Mac,
    /// The discovery interface, if any.
    pub(crate) iface: Option<String>,
    /// Other hosts heard from.
    pub(crate) remote_hosts: Vec<String>,
    /// Generation of the peer table (bumped on every change).
    pub(crate) table_generation: u64,
    /// Entries in the peer table.
    pub(crate) peers: usize,
    /// Whether the last peer table reached the backend.
    pub(crate) backend_synced: bool,
    /// The backend's control socket, if xmxd talks to one.
    pub(crate) backend_socket: Option<PathBuf>,
    /// Where xmxd keeps its guests and clusters.
    pub(crate) state_file: PathBuf,
}

/// Reply of `peers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeersReport {
    /// This host's name.
    pub(crate) host: String,
    /// This host's NIC address on the fabric.
    #[serde(with = "mac_text")]
    pub(crate) host_mac: Mac,
    /// Generation of the peer table (bumped on every change).
    pub generation: u64,
    /// Only this cluster's peers are listed, when a guest's view was asked.
    pub cluster: Option<String>,
    /// The peers, in index order.
    pub peers: Vec<Peer>,
    /// Announced guests left out of the table, and why (empty in a guest's view).
    pub(crate) conflicts: Vec<Conflict>,
}

/// One guest this host knows (entry of `guests`, reply of `attach`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestStatus {
    /// The guest's (base) name.
    pub name: String,
    /// Its domain, if it runs here.
    pub domid: Option<DomId>,
    /// Its cluster's name.
    pub cluster: String,
    /// Its cluster's id.
    pub(crate) cluster_id: u32,
    /// Its board MAC.
    #[serde(with = "mac_text")]
    pub mac: Mac,
    /// Its peer index, if the table holds it.
    pub(crate) index: Option<u16>,
    /// The xmx device is attached.
    pub attached: bool,
    /// Attached whenever a domain of this name runs here.
    pub(crate) auto_attach: bool,
}

/// One entry of `clusters`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterReport {
    /// The cluster's name.
    pub name: String,
    /// Its id, as the peer table and the backend carry it.
    pub id: u32,
    /// Guests recorded in it.
    pub members: Vec<String>,
}

/// How xmxd words the control server's refusals.
pub(crate) fn refusal_reply(refusal: Refusal) -> Reply {
    Reply::err(match refusal {
        Refusal::NotRequest(e) => ReplyError::new("invalid", format!("request: {e}")),
        Refusal::TooLong => ReplyError::new(
            "invalid",
            format!(
                "line longer than {} bytes",
                xmx_hv::daemon::control::MAX_LINE
            ),
        ),
        Refusal::Busy => ReplyError::new("busy", "too many connections"),
    })
}

/// A client of xmxd's control socket.
pub struct ControlClient {
    conn: LineClient,
}

impl ControlClient {
    /// Connect to the socket at `path`.
    pub fn connect(path: &Path) -> std::io::Result<ControlClient> {
        Ok(ControlClient {
            conn: LineClient::connect(path, Some(MAX_WAIT + Duration::from_secs(30)))?,
        })
    }

    /// Send one request and wait for its reply.
    pub fn call(&mut self, request: &XmxdRequest) -> Result<serde_json::Value, ReplyError> {
        let reply: Reply = self
            .conn
            .call(request)
            .map_err(|e| e.into_reply_error("xmxd"))?;
        reply.into_result()
    }

    /// [`ControlClient::call`] with the result decoded as `T`.
    pub fn call_as<T: for<'de> Deserialize<'de>>(
        &mut self,
        request: &XmxdRequest,
    ) -> Result<T, ReplyError> {
        let v = self.call(request)?;
        serde_json::from_value(v).map_err(|e| ReplyError::new("protocol", format!("result: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;
    use xmx_hv::daemon::control::{LineServer, LineService};

    #[test]
    fn requests_have_the_documented_json_form() {
        let cases: Vec<(&str, XmxdRequest)> = vec![
            (r#"{"op":"status"}"#, XmxdRequest::Status),
            (
                r#"{"op":"peers","guest":"vm1"}"#,
                XmxdRequest::Peers {
                    guest: Some("vm1".into()),
                    after: None,
                    timeout_ms: None,
                },
            ),
            (
                r#"{"op":"cluster-add","name":"blue","guest":"5"}"#,
                XmxdRequest::ClusterAdd {
                    name: "blue".into(),
                    guest: "5".into(),
                    new: false,
                },
            ),
            (
                r#"{"op":"cluster-delete","name":"blue"}"#,
                XmxdRequest::ClusterDelete {
                    name: "blue".into(),
                    force: false,
                },
            ),
            (
                r#"{"op":"attach","domid":5}"#,
                XmxdRequest::Attach {
                    domid: 5,
                    cluster: None,
                },
            ),
            (
                r#"{"op":"qos","guest":"vm1","weight":4}"#,
                XmxdRequest::Qos {
                    guest: "vm1".into(),
                    weight: Some(4),
                },
            ),
        ];
        for (text, want) in cases {
            let got: XmxdRequest = serde_json::from_str(text).unwrap();
            assert_eq!(got, want, "{text}");
        }
        assert_eq!(
            serde_json::to_string(&XmxdRequest::Detach { domid: 3 }).unwrap(),
            r#"{"op":"detach","domid":3}"#
        );
        for bad in [
            r#"{"op":"reboot"}"#,
            r#"{"op":"attach"}"#,
            r#"{"op":"attach","domid":70000}"#,
            r#"{"op":"detach","domid":1,"x":1}"#,
        ] {
            assert!(serde_json::from_str::<XmxdRequest>(bad).is_err(), "{bad}");
        }
    }

    /// Answers `status` only, refusing as xmxd does.
    struct StatusOnly;

    impl LineService for StatusOnly {
        type RequestLine = XmxdRequest;
        type ReplyLine = Reply;

        fn answer(&self, request: XmxdRequest) -> Reply {
            match request {
                XmxdRequest::Status => Reply::ok(serde_json::json!("fine")),
                _ => Reply::err(ReplyError::new("not_found", "nope")),
            }
        }

        fn refuse(&self, refusal: Refusal) -> Reply {
            refusal_reply(refusal)
        }
    }

    #[test]
    fn the_client_calls_and_garbage_is_refused_in_xmxds_words() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.sock");
        let server = LineServer::start(&path, Some(0o600), "xmxd-test", StatusOnly).unwrap();
        let mut c = ControlClient::connect(&path).unwrap();
        assert_eq!(
            c.call(&XmxdRequest::Status).unwrap(),
            serde_json::json!("fine")
        );
        let e = c.call(&XmxdRequest::Detach { domid: 1 }).unwrap_err();
        assert_eq!(e.kind, "not_found");
        let mut raw = UnixStream::connect(&path).unwrap();
        raw.write_all(b"{\"op\":\n").unwrap();
        let mut line = String::new();
        BufReader::new(&raw).read_line(&mut line).unwrap();
        let reply: Reply = serde_json::from_str(&line).unwrap();
        let e = reply.into_result().unwrap_err();
        assert_eq!(e.kind, "invalid");
        assert!(e.message.starts_with("request: "), "{e}");
        drop(server);
        assert!(!path.exists());
    }
}

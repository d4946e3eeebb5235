//! xmxd's control socket: what `xmx` asks of it.
//!
//! A unix stream socket (`--control PATH`, mode 0600), one JSON object per line each way,
//! answered in order; unknown fields are refused (requests that take none ignore them).
//! Replies have `xmx-backd`'s shape: `{"ok":true,"result":R}` or
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
//! ```

use std::io::BufReader;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use xmx_backend::admin::{Reply, ReplyError};
use xmx_hv::sim::admin::{read_line_bounded, send_all};
use xmx_hv::DomId;

use super::state::mac_text;
use super::table::{Conflict, Peer};
use xmx_wire::mxoe::Mac;

/// Longest request or reply line.
pub(crate) const MAX_LINE: usize = 1 << 20;
/// Connections served at once; more are refused.
const MAX_CONNECTIONS: usize = 16;
/// Longest wait a `peers` request may ask for.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(60);

/// A request on the control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
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

/// Answers requests; given to [`ControlServer::start`].
pub(crate) type Dispatch = Arc<dyn Fn(Request) -> Reply + Send + Sync>;

/// The listening control socket. Dropping it stops accepting and removes the socket file;
/// connections being served finish their current request.
pub(crate) struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Listen at `path` (a stale socket there is replaced).
    pub(crate) fn start(path: &Path, dispatch: Dispatch) -> std::io::Result<ControlServer> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        // Bound and listening under a temporary name, then renamed into place: whoever
        // waits for `path` to appear can connect at once (binding at `path` itself would
        // show the file before the socket listens, and refuse connections meanwhile).
        let file = path
            .file_name()
            .ok_or_else(|| std::io::Error::other("control socket path has no file name"))?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(file);
        tmp_name.push(format!(".{}.tmp", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let _ = std::fs::remove_file(&tmp);
        let listener = UnixListener::bind(&tmp)?;
        let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("xmxd-control".into())
                .spawn(move || accept_loop(listener, stop, dispatch))?
        };
        Ok(ControlServer {
            path: path.to_path_buf(),
            stop,
            acceptor: Some(acceptor),
        })
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the acceptor with a connection of our own.
        let _ = UnixStream::connect(&self.path);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn accept_loop(listener: UnixListener, stop: Arc<AtomicBool>, dispatch: Dispatch) {
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let Ok(conn) = conn else { continue };
        if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::AcqRel);
            let reply = Reply::err(ReplyError::new("busy", "too many connections"));
            let _ = write_reply(&conn, &reply);
            continue;
        }
        let dispatch = dispatch.clone();
        let active = active.clone();
        let spawned = std::thread::Builder::new()
            .name("xmxd-conn".into())
            .spawn(move || {
                serve(conn, &dispatch);
                active.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            tracing::warn!("no thread for a control connection");
        }
    }
}

fn write_reply(conn: &UnixStream, reply: &Reply) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(reply).map_err(std::io::Error::other)?;
    line.push(b'\n');
    send_all(conn, &line)
}

fn serve(conn: UnixStream, dispatch: &Dispatch) {
    let Ok(write_half) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(conn);
    loop {
        let line = match read_line_bounded(&mut reader, MAX_LINE) {
            Ok(Some(line)) => line,
            Ok(None) => return,
            Err(e) => {
                let _ = write_reply(
                    &write_half,
                    &Reply::err(ReplyError::new("invalid", e.to_string())),
                );
                return;
            }
        };
        let reply = match serde_json::from_slice::<Request>(&line) {
            Ok(request) => dispatch(request),
            Err(e) => Reply::err(ReplyError::new("invalid", format!("request: {e}"))),
        };
        if write_reply(&write_half, &reply).is_err() {
            return;
        }
    }
}

/// A client of xmxd's control socket.
pub struct ControlClient {
    conn: BufReader<UnixStream>,
}

impl ControlClient {
    /// Connect to the socket at `path`.
    pub fn connect(path: &Path) -> std::io::Result<ControlClient> {
        let sock = UnixStream::connect(path)?;
        sock.set_read_timeout(Some(MAX_WAIT + Duration::from_secs(30)))?;
        Ok(ControlClient {
            conn: BufReader::new(sock),
        })
    }

    /// Send one request and wait for its reply.
    pub fn call(&mut self, request: &Request) -> Result<serde_json::Value, ReplyError> {
        let io = |e: std::io::Error| ReplyError::new("io", e.to_string());
        let mut line =
            serde_json::to_vec(request).map_err(|e| ReplyError::new("invalid", e.to_string()))?;
        line.push(b'\n');
        send_all(self.conn.get_ref(), &line).map_err(io)?;
        let reply = read_line_bounded(&mut self.conn, MAX_LINE)
            .map_err(io)?
            .ok_or_else(|| ReplyError::new("closed", "xmxd closed the connection"))?;
        let reply: Reply = serde_json::from_slice(&reply)
            .map_err(|e| ReplyError::new("protocol", format!("reply: {e}")))?;
        reply.into_result()
    }

    /// [`ControlClient::call`] with the result decoded as `T`.
    pub fn call_as<T: for<'de> Deserialize<'de>>(
        &mut self,
        request: &Request,
    ) -> Result<T, ReplyError> {
        let v = self.call(request)?;
        serde_json::from_value(v).map_err(|e| ReplyError::new("protocol", format!("result: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_the_documented_json_form() {
        let cases: Vec<(&str, Request)> = vec![
            (r#"{"op":"status"}"#, Request::Status),
            (
                r#"{"op":"peers","guest":"vm1"}"#,
                Request::Peers {
                    guest: Some("vm1".into()),
                    after: None,
                    timeout_ms: None,
                },
            ),
            (
                r#"{"op":"cluster-add","name":"blue","guest":"5"}"#,
                Request::ClusterAdd {
                    name: "blue".into(),
                    guest: "5".into(),
                    new: false,
                },
            ),
            (
                r#"{"op":"cluster-delete","name":"blue"}"#,
                Request::ClusterDelete {
                    name: "blue".into(),
                    force: false,
                },
            ),
            (
                r#"{"op":"attach","domid":5}"#,
                Request::Attach {
                    domid: 5,
                    cluster: None,
                },
            ),
            (
                r#"{"op":"qos","guest":"vm1","weight":4}"#,
                Request::Qos {
                    guest: "vm1".into(),
                    weight: Some(4),
                },
            ),
        ];
        for (text, want) in cases {
            let got: Request = serde_json::from_str(text).unwrap();
            assert_eq!(got, want, "{text}");
        }
        assert_eq!(
            serde_json::to_string(&Request::Detach { domid: 3 }).unwrap(),
            r#"{"op":"detach","domid":3}"#
        );
        for bad in [
            r#"{"op":"reboot"}"#,
            r#"{"op":"attach"}"#,
            r#"{"op":"attach","domid":70000}"#,
            r#"{"op":"detach","domid":1,"x":1}"#,
        ] {
            assert!(serde_json::from_str::<Request>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_server_answers_in_order_and_refuses_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.sock");
        let dispatch: Dispatch = Arc::new(|req| match req {
            Request::Status => Reply::ok(serde_json::json!("fine")),
            _ => Reply::err(ReplyError::new("not_found", "nope")),
        });
        let server = ControlServer::start(&path, dispatch).unwrap();
        let mut c = ControlClient::connect(&path).unwrap();
        assert_eq!(c.call(&Request::Status).unwrap(), serde_json::json!("fine"));
        let e = c.call(&Request::Detach { domid: 1 }).unwrap_err();
        assert_eq!(e.kind, "not_found");
        send_all(c.conn.get_ref(), b"{\"op\":\n").unwrap();
        let line = read_line_bounded(&mut c.conn, MAX_LINE).unwrap().unwrap();
        let reply: Reply = serde_json::from_slice(&line).unwrap();
        assert_eq!(reply.into_result().unwrap_err().kind, "invalid");
        drop(server);
        assert!(!path.exists());
    }
}

//! The admin protocol of `DIR/ctl.sock` and its client, [`SimAdmin`].
//!
//! One JSON object per line each way. A request is tagged by `op`:
//! `{"op":"create","name":"guest1"}` (optionally `"domid":N`), `{"op":"destroy","domid":N}`,
//! `{"op":"suspend","domid":N}`, `{"op":"resume","domid":N}`, `{"op":"list"}`,
//! `{"op":"state","domid":N}`, `{"op":"processes","domid":N}`; for migrating a domain between hosts (see
//! [`super::migrate`]): `{"op":"create","name":"g--incoming","incoming":true,
//! "mem_limit":BYTES}`, `{"op":"rename","domid":N,"name":"g"}`, and on the source
//! `{"op":"save_begin","domid":N}`, `{"op":"save","domid":N,"path":"/dir/round-1",
//! "last":false}`, `{"op":"save_end","domid":N}`, on the destination
//! `{"op":"restore","domid":N,"path":"/dir/round-1"}`. A reply is a [`Reply`]: `{"ok":true,"result":...}` or
//! `{"ok":false,"error":{"kind":"not_found","message":"..."}}`, the kind named by
//! [`error_kind`].

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::layout;
use crate::daemon::control::{CallError, LineClient, Reply, ReplyError};
use crate::{DomId, Error, Result};

/// An admin request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum AdminRequest {
    /// Create a domain; the daemon picks the lowest free domid unless one is given.
    Create {
        /// A name for the domain.
        name: String,
        /// The domid to create it as.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        domid: Option<DomId>,
        /// Its memory limit in bytes instead of the host's default (a migrated domain
        /// keeps the limit it had on its source host).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mem_limit: Option<u64>,
        /// Create it paused to receive a migration stream (`restore`): it stays suspended,
        /// without the `control/shutdown` request a suspend writes, and cannot be resumed
        /// before its last stream is restored.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        incoming: bool,
    },
    /// Rename a domain (not dom0); names stay unique on a host.
    Rename {
        /// The domain to rename.
        domid: DomId,
        /// Its new name.
        name: String,
    },
    /// Start sending a domain to another host: the daemon starts remembering what each
    /// `save` round sent, so that the next round sends only the frames that changed.
    SaveBegin {
        /// The domain to send.
        domid: DomId,
    },
    /// One round of a migration stream: write the domain's frames that changed since the
    /// last round (all non-zero frames in the first) to a new file at `path`; the last
    /// round (the domain must be suspended) adds its grant table.
    Save {
        /// The domain being sent.
        domid: DomId,
        /// Where to write the stream: a file that must not exist yet.
        path: PathBuf,
        /// Whether this is the last round.
        #[serde(default)]
        last: bool,
    },
    /// Stop sending a domain (after a migration, completed or not): forget what was sent.
    SaveEnd {
        /// The domain that was being sent.
        domid: DomId,
    },
    /// Apply one migration stream (a file written by `save` on the source host) to an
    /// incoming domain.
    Restore {
        /// The incoming domain.
        domid: DomId,
        /// The stream file.
        path: PathBuf,
    },
    /// Destroy a domain and everything it holds.
    Destroy {
        /// The domain to destroy.
        domid: DomId,
    },
    /// Pause a domain's hypervisor operations and ask it to suspend.
    Suspend {
        /// The domain to suspend.
        domid: DomId,
    },
    /// Let a suspended domain run again.
    Resume {
        /// The domain to resume.
        domid: DomId,
    },
    /// The pids of a domain's processes: those attached to its `hv.sock` and those
    /// mapping its memory, less those attached as another domain (dom0's daemons).
    Processes {
        /// The domain whose processes to list.
        domid: DomId,
    },
    /// Every domain.
    List,
    /// Counters of one domain.
    State {
        /// The domain whose counters to report.
        domid: DomId,
    },
}

/// Whether a domain runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// The domain runs normally.
    Running,
    /// Suspended: its hypervisor operations are paused until it is resumed.
    Suspended,
}

/// One entry of `list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainInfo {
    /// The domain's id.
    pub domid: DomId,
    /// The name it was created with.
    pub name: String,
    /// Whether it runs or is suspended.
    pub state: RunState,
}

/// What xenstored holds for a domain.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct XenstoreUsage {
    /// Nodes the domain owns.
    pub nodes: usize,
    /// Watches the domain registered.
    pub watches: usize,
    /// Transactions the domain has open.
    pub transactions: usize,
    /// Connections of the domain to xenstored.
    pub connections: usize,
}

/// Counters of one domain, for checking that nothing is left behind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainState {
    /// The domain's id.
    pub domid: DomId,
    /// The name it was created with.
    pub name: String,
    /// Whether it runs or is suspended.
    pub state: RunState,
    /// The daemon's id for this incarnation of the domid.
    pub instance: u64,
    /// Grant entries in use in this domain's table (deferred ones included).
    pub grants_active: usize,
    /// Grants whose granting handle closed while a remote still mapped them.
    pub grants_deferred: usize,
    /// Grant entries of this domain that another domain currently maps.
    pub grants_mapped_by_others: usize,
    /// Foreign grant pages this domain currently maps.
    pub mappings_held: usize,
    /// Event-channel ports of this domain.
    pub ports_open: usize,
    /// Open `hv.sock` connections of this domain.
    pub hv_connections: usize,
    /// Pages of this domain's memory file in use.
    pub mem_pages: usize,
    /// The domain's memory limit in bytes.
    #[serde(default)]
    pub mem_limit: u64,
    /// What xenstored holds for the domain.
    pub xenstore: XenstoreUsage,
}

/// The failed reply for `e`.
pub fn error_reply(e: &Error) -> Reply {
    Reply::err(ReplyError::new(error_kind(e), e.to_string()))
}

/// The `kind` string of an error.
pub fn error_kind(e: &Error) -> &'static str {
    match e {
        Error::NotFound(_) => "not_found",
        Error::Denied(_) => "denied",
        Error::Busy(_) => "busy",
        Error::Again => "again",
        Error::Exists(_) => "exists",
        Error::Invalid(_) => "invalid",
        Error::Quota(_) => "quota",
        Error::Unsupported(_) => "unsupported",
        Error::Closed(_) => "closed",
        Error::Protocol(_) => "protocol",
        Error::Xs(_) => "xenstore",
        Error::Io(_) => "io",
    }
}

/// The error a `kind` string and message stand for.
pub fn error_from_kind(kind: &str, message: String) -> Error {
    match kind {
        "not_found" => Error::NotFound(message),
        "denied" => Error::Denied(message),
        "busy" => Error::Busy(message),
        "again" => Error::Again,
        "exists" => Error::Exists(message),
        "invalid" => Error::Invalid(message),
        "quota" => Error::Quota(message),
        "unsupported" => Error::Unsupported(message),
        "closed" => Error::Closed(message),
        "xenstore" => Error::Xs(message),
        "io" => Error::Io(io::Error::other(message)),
        _ => Error::Protocol(format!("{kind}: {message}")),
    }
}

/// What `save_begin` reports of the domain being sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SaveInfo {
    /// The domain's name.
    pub name: String,
    /// Its memory limit in bytes, for the incoming domain.
    pub mem_limit: u64,
    /// Frames ever handed out (the extent of its memory that a stream covers).
    pub frames: u32,
    /// Grant entries in use.
    pub grants: usize,
}

/// What one `save` round wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SaveRound {
    /// Frames read and compared with what earlier rounds sent.
    pub frames_scanned: u32,
    /// Frames written to the stream (changed since the last round).
    pub frames_sent: u32,
    /// Grant entries written (the last round only).
    pub grants_sent: usize,
    /// Grants another domain still mapped at the last round (sent ones, and ones their
    /// owner ended, which are not sent): those mappings stay behind on the source host;
    /// the backend should have let go of the guest's pages before the suspend completed.
    pub grants_still_mapped: usize,
    /// Bytes of the stream file.
    pub bytes: u64,
}

/// What one `restore` applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restored {
    /// Frames written into the domain's memory.
    pub frames: u32,
    /// Grant entries installed (a last stream only).
    pub grants: usize,
    /// Whether the stream was a last one: the domain is complete and may be resumed.
    pub complete: bool,
}

/// What `processes` reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainProcesses {
    /// Pids, in increasing order.
    pub pids: Vec<i32>,
}

/// A client of a simhv's admin socket.
pub struct SimAdmin {
    dir: PathBuf,
    inner: Mutex<LineClient>,
}

impl SimAdmin {
    /// Connect to `DIR/ctl.sock`.
    pub fn connect(dir: &Path) -> Result<SimAdmin> {
        let path = layout::ctl_sock(dir);
        let client = LineClient::connect(&path, None).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
                Error::NotFound(format!("no xmx-simhv at {} ({e})", dir.display()))
            }
            _ => Error::Io(e),
        })?;
        Ok(SimAdmin {
            dir: dir.to_path_buf(),
            inner: Mutex::new(client),
        })
    }

    /// The simhv directory this client talks to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Send one request and return its result value.
    pub fn call(&self, req: &AdminRequest) -> Result<serde_json::Value> {
        let mut inner = self
            .inner
            .lock()
            .map_err(|_| Error::Closed("admin connection poisoned".into()))?;
        let reply: Reply = inner.call(req).map_err(|e| match e {
            CallError::Invalid(m) => Error::Invalid(format!("encoding: {m}")),
            CallError::Io(e) => closed(e),
            CallError::Closed => Error::Closed("xmx-simhv closed the admin connection".into()),
            CallError::Protocol(m) => Error::Protocol(format!("admin reply: {m}")),
        })?;
        reply
            .into_result()
            .map_err(|e| error_from_kind(&e.kind, e.message))
    }

    fn call_as<T: for<'de> Deserialize<'de>>(&self, req: &AdminRequest) -> Result<T> {
        let v = self.call(req)?;
        serde_json::from_value(v).map_err(|e| Error::Protocol(format!("admin result: {e}")))
    }

    /// Create a domain named `name` (with `domid` if given); returns its domid.
    pub fn create(&self, name: &str, domid: Option<DomId>) -> Result<DomId> {
        self.create_with(AdminRequest::Create {
            name: name.to_string(),
            domid,
            mem_limit: None,
            incoming: false,
        })
    }

    /// Create a paused domain to receive a migration stream, with a memory limit of
    /// `mem_limit` bytes; returns its domid.
    pub fn create_incoming(&self, name: &str, mem_limit: u64) -> Result<DomId> {
        self.create_with(AdminRequest::Create {
            name: name.to_string(),
            domid: None,
            mem_limit: Some(mem_limit),
            incoming: true,
        })
    }

    fn create_with(&self, req: AdminRequest) -> Result<DomId> {
        #[derive(Deserialize)]
        struct Created {
            domid: DomId,
        }
        let c: Created = self.call_as(&req)?;
        Ok(c.domid)
    }

    /// Rename a domain.
    pub fn rename(&self, domid: DomId, name: &str) -> Result<()> {
        self.call(&AdminRequest::Rename {
            domid,
            name: name.to_string(),
        })
        .map(|_| ())
    }

    /// Start sending a domain to another host.
    pub fn save_begin(&self, domid: DomId) -> Result<SaveInfo> {
        self.call_as(&AdminRequest::SaveBegin { domid })
    }

    /// Write one round of a domain's migration stream to a new file at `path`.
    pub fn save(&self, domid: DomId, path: &Path, last: bool) -> Result<SaveRound> {
        self.call_as(&AdminRequest::Save {
            domid,
            path: path.to_path_buf(),
            last,
        })
    }

    /// Stop sending a domain.
    pub fn save_end(&self, domid: DomId) -> Result<()> {
        self.call(&AdminRequest::SaveEnd { domid }).map(|_| ())
    }

    /// Apply the migration stream at `path` to an incoming domain.
    pub fn restore(&self, domid: DomId, path: &Path) -> Result<Restored> {
        self.call_as(&AdminRequest::Restore {
            domid,
            path: path.to_path_buf(),
        })
    }

    /// Destroy a domain.
    pub fn destroy(&self, domid: DomId) -> Result<()> {
        self.call(&AdminRequest::Destroy { domid }).map(|_| ())
    }

    /// Suspend a domain.
    pub fn suspend(&self, domid: DomId) -> Result<()> {
        self.call(&AdminRequest::Suspend { domid }).map(|_| ())
    }

    /// Resume a suspended domain.
    pub fn resume(&self, domid: DomId) -> Result<()> {
        self.call(&AdminRequest::Resume { domid }).map(|_| ())
    }

    /// The pids of a domain's processes (see [`AdminRequest::Processes`]).
    pub fn processes(&self, domid: DomId) -> Result<Vec<i32>> {
        let p: DomainProcesses = self.call_as(&AdminRequest::Processes { domid })?;
        Ok(p.pids)
    }

    /// Every domain.
    pub fn list(&self) -> Result<Vec<DomainInfo>> {
        self.call_as(&AdminRequest::List)
    }

    /// Counters of one domain.
    pub fn state(&self, domid: DomId) -> Result<DomainState> {
        self.call_as(&AdminRequest::State { domid })
    }
}

fn closed(e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
            Error::Closed(format!("admin connection lost: {e}"))
        }
        _ => Error::Io(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_the_documented_json_form() {
        let r = AdminRequest::Create {
            name: "g1".into(),
            domid: None,
            mem_limit: None,
            incoming: false,
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"op":"create","name":"g1"}"#
        );
        let back: AdminRequest =
            serde_json::from_str(r#"{"op":"create","name":"g1","domid":5}"#).unwrap();
        assert_eq!(
            back,
            AdminRequest::Create {
                name: "g1".into(),
                domid: Some(5),
                mem_limit: None,
                incoming: false,
            }
        );
        let r = AdminRequest::Save {
            domid: 3,
            path: "/m/round-1".into(),
            last: true,
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"op":"save","domid":3,"path":"/m/round-1","last":true}"#
        );
        let back: AdminRequest = serde_json::from_str(
            r#"{"op":"create","name":"g--incoming","mem_limit":4096,"incoming":true}"#,
        )
        .unwrap();
        assert_eq!(
            back,
            AdminRequest::Create {
                name: "g--incoming".into(),
                domid: None,
                mem_limit: Some(4096),
                incoming: true,
            }
        );
        assert!(serde_json::from_str::<AdminRequest>(r#"{"op":"restore","domid":1}"#).is_err());
        let back: AdminRequest = serde_json::from_str(r#"{"op":"list"}"#).unwrap();
        assert_eq!(back, AdminRequest::List);
        assert!(serde_json::from_str::<AdminRequest>(r#"{"op":"destroy"}"#).is_err());
        assert!(serde_json::from_str::<AdminRequest>(r#"{"op":"reboot","domid":1}"#).is_err());
        assert!(serde_json::from_str::<AdminRequest>(r#"{"op":"destroy","domid":70000}"#).is_err());
    }

    #[test]
    fn error_kinds_round_trip() {
        for e in [
            Error::NotFound("x".into()),
            Error::Busy("x".into()),
            Error::Quota("x".into()),
            Error::Invalid("x".into()),
            Error::Exists("x".into()),
        ] {
            let reply = error_reply(&e);
            let err = reply.error.unwrap();
            let back = error_from_kind(&err.kind, "x".into());
            assert_eq!(error_kind(&back), error_kind(&e));
        }
    }
}

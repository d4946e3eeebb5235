//! The admin socket `DIR/ctl.sock`: JSON lines (see [`xmx_hv::sim::admin`]), served by the
//! daemons' shared control server ([`xmx_hv::daemon::control`]).
//!
//! A line that is not a valid request gets an `invalid` error reply and the connection
//! goes on; a line longer than [`xmx_hv::daemon::control::MAX_LINE`] ends the connection.

use std::path::Path;
use std::sync::Arc;

use serde_json::json;
use xmx_hv::daemon::control::{LineServer, LineService, Refusal, Reply};
use xmx_hv::sim::admin::{error_reply, AdminRequest};
use xmx_hv::Error;

use crate::domains::{HostDomains, Spec};

/// The admin protocol of one host.
struct HostAdmin(Arc<HostDomains>);

impl LineService for HostAdmin {
    type RequestLine = AdminRequest;
    type ReplyLine = Reply;

    fn answer(&self, request: AdminRequest) -> Reply {
        tracing::debug!(?request, "admin request");
        match execute(&self.0, request) {
            Ok(v) => Reply::ok(v),
            Err(e) => error_reply(&e),
        }
    }

    fn refuse(&self, refusal: Refusal) -> Reply {
        error_reply(&match refusal {
            Refusal::NotRequest(e) => Error::Invalid(format!("bad request: {e}")),
            Refusal::TooLong => Error::Invalid(format!(
                "request line: line longer than {} bytes",
                xmx_hv::daemon::control::MAX_LINE
            )),
            Refusal::Busy => Error::Busy("too many admin connections".into()),
        })
    }
}

/// Serve `path` (the directory's `ctl.sock`) for `host`.
pub(crate) fn serve_admin(host: Arc<HostDomains>, path: &Path) -> xmx_hv::Result<LineServer> {
    LineServer::start(path, None, "admin", HostAdmin(host)).map_err(|e| {
        if e.kind() == std::io::ErrorKind::InvalidInput {
            Error::Invalid(format!(
                "socket path {} is too long for a unix socket; use a shorter --dir",
                path.display()
            ))
        } else {
            Error::Io(e)
        }
    })
}

fn execute(host: &HostDomains, req: AdminRequest) -> xmx_hv::Result<serde_json::Value> {
    let encoding = |e: serde_json::Error| Error::Protocol(format!("encoding: {e}"));
    match req {
        AdminRequest::Create {
            name,
            domid,
            mem_limit,
            incoming,
        } => {
            let spec = Spec {
                mem_limit,
                incoming,
            };
            let domid = host.create(&name, domid, &spec)?;
            Ok(json!({ "domid": domid }))
        }
        AdminRequest::Rename { domid, name } => host.rename(domid, &name).map(|_| json!(null)),
        AdminRequest::SaveBegin { domid } => {
            serde_json::to_value(host.save_begin(domid)?).map_err(encoding)
        }
        AdminRequest::Save { domid, path, last } => {
            serde_json::to_value(host.save(domid, &path, last)?).map_err(encoding)
        }
        AdminRequest::SaveEnd { domid } => host.save_end(domid).map(|_| json!(null)),
        AdminRequest::Restore { domid, path } => {
            serde_json::to_value(host.restore(domid, &path)?).map_err(encoding)
        }
        AdminRequest::Destroy { domid } => host.destroy(domid).map(|_| json!(null)),
        AdminRequest::Suspend { domid } => host.suspend(domid).map(|_| json!(null)),
        AdminRequest::Resume { domid } => host.resume(domid).map(|_| json!(null)),
        AdminRequest::Processes { domid } => {
            serde_json::to_value(host.processes(domid)?).map_err(encoding)
        }
        AdminRequest::List => serde_json::to_value(host.list()).map_err(encoding),
        AdminRequest::State { domid } => serde_json::to_value(host.state(domid)?).map_err(encoding),
    }
}

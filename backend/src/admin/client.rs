//! A client of the control socket, for tools and tests.

use std::path::Path;
use std::time::Duration;

use xmx_hv::daemon::control::{LineClient, Reply};

use super::{BackdRequest, ReplyError};

/// One connection to `xmx-backd`'s control socket.
pub struct AdminClient {
    conn: LineClient,
}

impl AdminClient {
    /// Connect to the socket at `path`.
    pub fn connect(path: &Path) -> std::io::Result<AdminClient> {
        Ok(AdminClient {
            conn: LineClient::connect(path, Some(Duration::from_secs(30)))?,
        })
    }

    /// Send one request and wait for its reply.
    pub fn call(&mut self, request: &BackdRequest) -> Result<serde_json::Value, ReplyError> {
        let reply: Reply = self
            .conn
            .call(request)
            .map_err(|e| e.into_reply_error("xmx-backd"))?;
        reply.into_result()
    }
}

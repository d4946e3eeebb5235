//! A client of the control socket, for tools and tests.

use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use xmx_hv::sim::admin::{read_line_bounded, send_all};

use super::{Reply, ReplyError, Request, MAX_LINE};

/// One connection to `xmx-backd`'s control socket.
pub struct AdminClient {
    conn: BufReader<UnixStream>,
}

impl AdminClient {
    /// Connect to the socket at `path`.
    pub fn connect(path: &Path) -> std::io::Result<AdminClient> {
        let sock = UnixStream::connect(path)?;
        sock.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(AdminClient {
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
            .ok_or_else(|| ReplyError::new("closed", "xmx-backd closed the connection"))?;
        let reply: Reply = serde_json::from_slice(&reply)
            .map_err(|e| ReplyError::new("protocol", format!("reply: {e}")))?;
        reply.into_result()
    }
}

//! The application's connection to `xmx-frontd`.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use xmx_hv::handoff::{recv_message, send_message};
use xmx_wire::msg::EndpointPages;

use super::proto::{
    FrontdBoardInfo, FrontdMessage, FrontdReply, FrontdRequest, Notice, MAX_MESSAGE,
};
use crate::channel::{EndpointChannel, RegionWindow};
use crate::error::{Error, Result};
use crate::handoff::EndpointHandoff;
use crate::rcache::Registrar;

/// How long a request waits for its reply by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection to the guest daemon. Dropping it (or the process ending) makes the
/// daemon close every endpoint and region the connection opened.
pub struct FrontdClient {
    sock: UnixStream,
    seq: u32,
    notices: VecDeque<Notice>,
    /// Readable while `notices` holds notices a request's wait read off the socket:
    /// whoever watches [`fd`](Self::fd) for notices watches this too, or a notice
    /// that came just before a reply would wait for the next one.
    queued: EventFd,
    timeout: Duration,
}

impl FrontdClient {
    /// Connect to the daemon listening at `path`.
    pub fn connect(path: &Path) -> Result<FrontdClient> {
        let sock = UnixStream::connect(path).map_err(|e| {
            Error::Closed(format!(
                "cannot reach xmx-frontd at {}: {e}",
                path.display()
            ))
        })?;
        let queued =
            EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .map_err(|e| Error::Io(e.into()))?;
        Ok(FrontdClient {
            sock,
            seq: 0,
            notices: VecDeque::new(),
            queued,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Connect to the daemon at `XMX_FRONTD_SOCKET` or the default path.
    pub fn connect_default() -> Result<FrontdClient> {
        Self::connect(&super::proto::default_socket_path())
    }

    /// How long requests wait for their reply.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// A descriptor that polls readable when the daemon sent something (a notice).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Readable while notices wait in the client (read off the socket by a request's
    /// wait for its reply); [`poll_notices`](Self::poll_notices) takes them.
    pub fn queued_fd(&self) -> BorrowedFd<'_> {
        self.queued.as_fd()
    }

    fn recv(&mut self, timeout: Option<Duration>) -> Result<Option<FrontdMessage>> {
        if let Some(t) = timeout {
            let ms = t.as_millis().min(i32::MAX as u128) as i32;
            let mut fds = [PollFd::new(self.sock.as_fd(), PollFlags::POLLIN)];
            let ready = nix::poll::poll(
                &mut fds,
                PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
            )
            .map_err(|e| Error::Io(e.into()))?;
            if ready == 0 {
                return Ok(None);
            }
        }
        match recv_message(&self.sock, MAX_MESSAGE) {
            Ok(Some((body, fds))) => Ok(Some(FrontdMessage::parse(&body, fds)?)),
            Ok(None) => Err(Error::Closed("xmx-frontd closed the connection".into())),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                Err(Error::Closed("xmx-frontd closed the connection".into()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Send `request` and wait for its reply, queueing notices met meanwhile.
    fn call(&mut self, request: FrontdRequest) -> Result<FrontdReply> {
        self.seq = self.seq.wrapping_add(1).max(1);
        let seq = self.seq;
        let msg = FrontdMessage::Request { seq, request };
        let (body, fds) = msg.emit();
        send_message(&self.sock, &body, &fds)
            .map_err(|e| Error::Closed(format!("sending to xmx-frontd: {e}")))?;
        loop {
            let Some(msg) = self.recv(Some(self.timeout))? else {
                return Err(Error::Timeout("xmx-frontd did not answer".into()));
            };
            match msg {
                FrontdMessage::Reply { seq: s, reply } if s == seq => {
                    return match reply {
                        FrontdReply::Error(e) => Err(e.into_error()),
                        other => Ok(other),
                    }
                }
                FrontdMessage::Reply { seq: s, .. } => {
                    return Err(Error::Protocol(format!("reply {s} to request {seq}")))
                }
                FrontdMessage::Notice(n) => {
                    self.notices.push_back(n);
                    // The counter cannot overflow: it is reset at every poll.
                    let _ = self.queued.write(1);
                }
                FrontdMessage::Request { .. } => {
                    return Err(Error::Protocol("the daemon sent a request".into()))
                }
            }
        }
    }

    fn expect_ok(&mut self, request: FrontdRequest) -> Result<()> {
        match self.call(request)? {
            FrontdReply::Ok => Ok(()),
            other => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// The board.
    pub fn info(&mut self) -> Result<FrontdBoardInfo> {
        match self.call(FrontdRequest::Info)? {
            FrontdReply::Info(i) => Ok(i),
            other => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Open endpoint `endpoint` (any free one if None) and map it; every event of its
    /// ring is notified.
    pub fn open_endpoint(
        &mut self,
        endpoint: Option<u8>,
        geometry: Option<EndpointPages>,
    ) -> Result<EndpointChannel> {
        self.open_endpoint_with(endpoint, geometry, false)
    }

    /// As [`FrontdClient::open_endpoint`], for an application that waits for no send's
    /// completion but a MEDIUM's if `quiet_send_done`
    /// ([`xmx_wire::msg::EndpointOpen::quiet_send_done`]).
    pub fn open_endpoint_with(
        &mut self,
        endpoint: Option<u8>,
        geometry: Option<EndpointPages>,
        quiet_send_done: bool,
    ) -> Result<EndpointChannel> {
        let h = self.open_endpoint_handoff(endpoint, geometry, quiet_send_done)?;
        let index = h.endpoint;
        match EndpointChannel::from_handoff(h) {
            Ok(c) => Ok(c),
            Err(e) => {
                let _ = self.expect_ok(FrontdRequest::CloseEndpoint { endpoint: index });
                Err(e)
            }
        }
    }

    /// Open an endpoint and return what the daemon handed over, unmapped.
    pub fn open_endpoint_handoff(
        &mut self,
        endpoint: Option<u8>,
        geometry: Option<EndpointPages>,
        quiet_send_done: bool,
    ) -> Result<EndpointHandoff> {
        match self.call(FrontdRequest::OpenEndpoint {
            endpoint,
            geometry,
            quiet_send_done,
        })? {
            FrontdReply::Endpoint(h) => Ok(h),
            other => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Unmap and close an endpoint.
    pub fn close_endpoint(&mut self, channel: EndpointChannel) -> Result<()> {
        let endpoint = channel.endpoint();
        drop(channel);
        self.expect_ok(FrontdRequest::CloseEndpoint { endpoint })
    }

    /// Register a window of `length` bytes on `endpoint` and map it.
    pub fn register_region(&mut self, endpoint: u8, length: u32) -> Result<RegionWindow> {
        let h = match self.call(FrontdRequest::RegisterRegion { endpoint, length })? {
            FrontdReply::Region(h) => h,
            other => return Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        };
        let (endpoint, region_id) = (h.endpoint, h.region_id);
        match RegionWindow::from_handoff(h) {
            Ok(w) => Ok(w),
            Err(e) => {
                let _ = self.expect_ok(FrontdRequest::DeregisterRegion {
                    endpoint,
                    region_id,
                });
                Err(e)
            }
        }
    }

    /// Move `window` onto the pages its region has now (granted anew after the domain
    /// moved, see [`crate::EndpointHandoff::regions_moved`]), keeping what it holds.
    pub fn refresh_window(&mut self, window: &mut RegionWindow) -> Result<()> {
        let h = match self.call(FrontdRequest::RegionPages {
            endpoint: window.endpoint(),
            region_id: window.region_id(),
        })? {
            FrontdReply::Region(h) => h,
            other => return Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        };
        window.rebase(h)
    }

    /// Unmap and deregister a window.
    pub fn deregister_region(&mut self, window: RegionWindow) -> Result<()> {
        let (endpoint, region_id) = (window.endpoint(), window.region_id());
        drop(window);
        self.expect_ok(FrontdRequest::DeregisterRegion {
            endpoint,
            region_id,
        })
    }

    /// Notices received so far and any waiting on the socket, without blocking.
    pub fn poll_notices(&mut self) -> Result<Vec<Notice>> {
        // Nonblocking: fails with EAGAIN when nothing was queued.
        let _ = self.queued.read();
        while let Some(msg) = self.recv(Some(Duration::ZERO))? {
            match msg {
                FrontdMessage::Notice(n) => self.notices.push_back(n),
                other => return Err(Error::Protocol(format!("unsolicited {other:?}"))),
            }
        }
        Ok(self.notices.drain(..).collect())
    }

    /// Wait up to `timeout` for a notice.
    pub fn wait_notice(&mut self, timeout: Duration) -> Result<Option<Notice>> {
        if let Some(n) = self.notices.pop_front() {
            return Ok(Some(n));
        }
        match self.recv(Some(timeout))? {
            None => Ok(None),
            Some(FrontdMessage::Notice(n)) => Ok(Some(n)),
            Some(other) => Err(Error::Protocol(format!("unsolicited {other:?}"))),
        }
    }

    /// Take a re-opened endpoint: remap `channel` onto it (the old pages are unmapped)
    /// and tell the daemon, which then releases the old pages.
    pub fn remap(&mut self, channel: &mut EndpointChannel, h: EndpointHandoff) -> Result<()> {
        let (endpoint, generation) = (h.endpoint, h.generation);
        channel.remap(h)?;
        self.expect_ok(FrontdRequest::Remapped {
            endpoint,
            generation,
        })
    }
}

impl Registrar for FrontdClient {
    fn register(&mut self, endpoint: u8, length: u32) -> Result<RegionWindow> {
        self.register_region(endpoint, length)
    }

    fn deregister(&mut self, window: RegionWindow) -> Result<()> {
        self.deregister_region(window)
    }
}

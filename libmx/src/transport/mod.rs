//! Transports: how an endpoint's frames reach other endpoints.
//!
//! A [`Transport`] is one process's view of its boards (NICs) and their peer
//! table; [`Transport::open`] gives an endpoint its [`TransportPort`], through which
//! frames go out and come in, and its [`Regions`], through which LARGE data
//! is registered and pulled. Arrivals ring the endpoint's
//! [`Doorbell`], which is what blocked calls wait on.
//!
//! - [`loopback`]: the endpoints of this process, delivered in memory.
//! - [`native`]: the backend's engine in this process on an AF_PACKET
//!   interface ([`engine_msgs`] converts between the core's frames and the
//!   engine's messages).
//! - [`xen`]: a guest's shared rings to the dom0 backend; its driver thread
//!   rings the doorbell from the event channel, and LARGE data goes through
//!   granted windows kept by the frontend's registration cache.
//!
//! `XMX_TRANSPORT=loopback|native|xen` selects one (see [`select`]); without
//! it, `XMX_FRONTD_SOCKET` (a guest daemon to talk to) selects xen, else
//! `XMX_IFACE` selects native unless a Xen frontend is present.

use std::sync::{Arc, Mutex, Weak};

use xmx_mx::frame::Nack;
use xmx_mx::{Body, Config, Frame, NackType, PeerAddr, RdmaWindow, RequestId, Status};

use crate::abi::MxReturn;
use crate::doorbell::Doorbell;
use crate::errors::{Failure, MxResult};
use crate::segments::Segments;
use crate::settings::{Settings, TransportKind};

pub(crate) mod engine_msgs;
pub(crate) mod loopback;
pub(crate) mod mailbox;
pub(crate) mod native;
pub(crate) mod peers;
pub(crate) mod rcache;
pub(crate) mod xen;

/// The descriptors a thread sleeps on for an endpoint's arrivals: one, or two
/// (the native link and the lanes from other processes on it, kept apart so
/// that frames on the link wake nothing while nobody sleeps on it). A
/// negative descriptor is none, as `poll` takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ArrivalFds(pub(crate) [std::os::fd::RawFd; 2]);

impl ArrivalFds {
    /// `fd` alone.
    pub(crate) fn one(fd: std::os::fd::RawFd) -> ArrivalFds {
        ArrivalFds([fd, -1])
    }
}

/// What a board reports about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BoardInfo {
    /// Its NIC id (the 48-bit MAC address).
    pub(crate) nic_id: u64,
    /// Its MX hostname (`host:board`).
    pub(crate) hostname: String,
    /// Most endpoints it can open.
    pub(crate) max_endpoints: u32,
    /// NUMA node of the device, `u32::MAX` when unknown.
    pub(crate) numa_node: u32,
}

/// Why a transport refused to open an endpoint.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum OpenError {
    /// No such board.
    #[error("no board {0}")]
    BoardUnknown(u32),
    /// The endpoint id is beyond the board's range.
    #[error("endpoint id {0} out of range")]
    BadEndpointId(u32),
    /// That endpoint id is open already.
    #[error("endpoint {0} is busy")]
    Busy(u8),
    /// Every endpoint id is taken.
    #[error("no free endpoint")]
    NoResources,
    /// The guest's device is not connected to a backend (not yet, or not any more).
    #[error("the device is not connected: {0}")]
    NoDevice(String),
    /// The guest daemon that opens endpoints could not be reached or failed.
    #[error("the guest daemon: {0}")]
    NoDriver(String),
}

impl From<OpenError> for Failure {
    fn from(e: OpenError) -> Failure {
        let code = match e {
            OpenError::BoardUnknown(_) => MxReturn::BoardUnknown,
            OpenError::BadEndpointId(_) => MxReturn::BadEndpointId,
            OpenError::Busy(_) => MxReturn::Busy,
            OpenError::NoResources => MxReturn::NoResources,
            OpenError::NoDevice(_) => MxReturn::NoDev,
            OpenError::NoDriver(_) => MxReturn::NoDriver,
        };
        Failure::new(code, format!("opening endpoint: {e}"))
    }
}

/// One process's access to its boards.
pub(crate) trait Transport: Send + Sync {
    /// Short name for logs.
    fn name(&self) -> &'static str;
    /// The boards, indexed by board number.
    fn boards(&self) -> Vec<BoardInfo>;
    /// Adjusts protocol tunables to the medium (e.g. acks cost nothing in
    /// memory, so a loopback acks at once).
    fn tune(&self, config: Config) -> Config {
        config
    }
    /// How long a closed endpoint keeps its port to answer what partners
    /// resend (see [`crate::endpoint::AppEndpoint::close`]); zero for a
    /// transport that loses nothing or lingers by itself.
    fn close_linger(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
    /// Opens endpoint `endpoint` (or the first free one) of board `board`;
    /// arrivals for it ring `doorbell`.
    fn open(
        &self,
        board: u32,
        endpoint: Option<u8>,
        doorbell: Arc<Doorbell>,
        rcache: bool,
    ) -> Result<Box<dyn TransportPort>, OpenError>;
    /// Peer-table index of a NIC.
    fn peer_index(&self, nic_id: u64) -> Option<u16>;
    /// NIC id at a peer-table index.
    fn peer_nic_id(&self, peer_index: u16) -> Option<u64>;
    /// Hostname of a NIC, if known.
    fn peer_hostname(&self, nic_id: u64) -> Option<String>;
    /// NIC id of a hostname.
    fn peer_by_hostname(&self, hostname: &str) -> Option<u64>;
    /// Adds (or renames) a peer, as a mapper does.
    fn add_peer(&self, nic_id: u64, hostname: Option<&str>) -> MxResult<()>;
    /// Removes a peer; returns whether it was known.
    fn remove_peer(&self, nic_id: u64) -> bool;
    /// Renames a board.
    fn set_hostname(&self, board: u32, hostname: &str) -> MxResult<()>;
    /// Opens a raw endpoint of board `board`; arrivals ring `doorbell`.
    fn open_raw(&self, board: u32, doorbell: Arc<Doorbell>) -> MxResult<Box<dyn RawPort>>;
}

/// An open endpoint's access to the network. Dropping it closes the
/// endpoint: frames addressed to it are refused from then on.
pub(crate) trait TransportPort: Send {
    /// The endpoint id.
    fn index(&self) -> u8;
    /// The session id chosen at open (random: a reopened endpoint differs).
    fn session(&self) -> u32;
    /// Sends a frame the core emitted (`peer_index` is the destination).
    /// Best effort, as on a wire: the core retransmits what is lost.
    fn transmit(&mut self, frame: Frame<Vec<u8>>);
    /// The next frame that arrived (`peer_index` is the source).
    fn receive(&mut self) -> Option<Frame<Vec<u8>>>;
    /// Whether the port holds input its own work put there (a transmit or
    /// a pull that finished at once), which the next [`receive`](Self::receive)
    /// or [`Regions::completed_pull`] returns without looking at the network.
    /// A progress pass that drained the port looks at it again only then:
    /// what arrives meanwhile is the next look's. True when the port cannot
    /// tell (every pass that moved something is followed by another).
    fn queued(&self) -> bool {
        true
    }
    /// This endpoint's LARGE regions.
    fn regions(&self) -> Arc<dyn Regions>;
    /// A waiting thread stopped polling and is about to sleep on the
    /// endpoint's doorbell: make sure the next arrival rings it. True if
    /// something arrived meanwhile (poll again instead of sleeping).
    fn before_sleep(&mut self) -> bool {
        false
    }
    /// Descriptors one of which turns readable when the next arrival is
    /// signalled (after [`before_sleep`](Self::before_sleep) asked for the
    /// signal), for the waiting thread to sleep on itself; `None`: arrivals
    /// ring the doorbell.
    fn arrival_fds(&self) -> Option<ArrivalFds> {
        None
    }
    /// Consumes the signal a sleeping thread saw on
    /// [`arrival_fds`](Self::arrival_fds).
    fn take_arrival_signal(&mut self) {}
    /// Where the port stands (pulls in progress, rings), as lines of text
    /// for a stall report; empty when it has nothing to say.
    fn describe(&self) -> String {
        String::new()
    }
    /// Why the endpoint can never reach the network again (its backend or
    /// guest daemon is gone, and nothing re-opened it), if so: pending
    /// requests then fail at once rather than after the retry budget.
    fn gone(&self) -> Option<&'static str> {
        None
    }
    /// True once after the endpoint's way to the network came back from an
    /// outage that may have lost frames (re-opened after a reconnection or a
    /// move): the core then resends what is unacked at once
    /// ([`xmx_mx::Endpoint::path_restored`]) instead of after its resend delay.
    fn take_path_restored(&mut self) -> bool {
        false
    }
}

/// How a pull started by [`Regions::pull`] goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PullProgress {
    /// Finished at once.
    Done(Result<(), Status>),
    /// Runs in the background; [`Regions::completed_pull`] reports it.
    Started,
}

/// LARGE data: the sender registers its buffer as a window the receiver
/// pulls from.
///
/// The data is referenced, never copied at registration: MX requires the
/// application to keep a send buffer unchanged until the send completes, so
/// a pull always reads what the application sent. A transport that caches
/// registrations (`MX_RCACHE=1`) keys them by `(address, length)` and drops
/// a cached one when it is invalidated, so a freed or reused buffer is never
/// read through a stale registration.
pub(crate) trait Regions: Send + Sync {
    /// Registers a send's buffer; `None` when every window id is in use
    /// (the send waits for one to be released).
    fn register(&self, data: &Segments) -> Option<RdmaWindow>;
    /// The send is over: the window may not be pulled from any more.
    fn release(&self, window: RdmaWindow);
    /// The application's memory in `[addr, addr + len)` is going away:
    /// forget cached registrations overlapping it.
    fn invalidate(&self, addr: usize, len: usize);
    /// Pulls `length` bytes of `source`'s `window` into `dest`, for receive
    /// `id`.
    fn pull(
        &self,
        id: RequestId,
        source: PeerAddr,
        window: RdmaWindow,
        dest: &Segments,
        length: u32,
    ) -> PullProgress;
    /// The session of the endpoint at `peer` is `session`, known without a
    /// connect having carried it (an endpoint's own, connected to itself at
    /// open): pulls from that endpoint's windows name it.
    fn learn_session(&self, _peer: PeerAddr, _session: u32) {}
    /// A pull that [`PullProgress::Started`] and has finished since.
    fn completed_pull(&self) -> Option<(RequestId, Result<(), Status>)> {
        None
    }
    /// The longest LARGE message one window (a send's, a pull's destination) can
    /// hold, if the transport bounds it (`None`: MX's own 4 GiB - 1).
    fn window_len_max(&self) -> Option<usize> {
        None
    }
}

/// A raw endpoint (mapper traffic): whole frames, no protocol.
pub(crate) trait RawPort: Send {
    /// Sends `data` to the other raw endpoints of the fabric.
    fn send(&mut self, data: &[u8]) -> MxResult<()>;
    /// The next frame received.
    fn receive(&mut self) -> Option<Vec<u8>>;
}

/// The frame a NIC answers when a frame arrives for an endpoint that is not
/// open: a NACK naming the refused message (or the connect), sent back to
/// its sender as if from the closed endpoint. Acks and NACKs get nothing.
pub(crate) fn refusal(frame: &Frame<Vec<u8>>, nack: NackType) -> Option<Frame<Vec<u8>>> {
    let lib_seqnum = match &frame.body {
        Body::Message(m) => m.seqnum,
        Body::Notify(n) => n.seqnum,
        Body::ConnectRequest(_) => xmx_mx::Seqnum::from_raw(0),
        Body::ConnectReply(_) | Body::Liback(_) | Body::Nack(_) => return None,
    };
    Some(Frame {
        peer_index: frame.peer_index,
        dst_endpoint: frame.src_endpoint,
        src_endpoint: frame.dst_endpoint,
        body: Body::Nack(Nack {
            nack_type: nack.to_wire(),
            lib_seqnum,
        }),
    })
}

/// The board `current` holds while any `mx_init` uses it, else a new one
/// from `open` (its error prefixed with `XMX_TRANSPORT=name`): one board per
/// process and transport, since two boards would both claim its endpoints.
fn process_wide<T: Transport + 'static>(
    current: &Mutex<Weak<T>>,
    name: &str,
    open: impl FnOnce() -> Result<Arc<T>, String>,
) -> MxResult<Arc<dyn Transport>> {
    let mut current = current.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(board) = current.upgrade() {
        return Ok(board);
    }
    let board = open()
        .map_err(|e| Failure::new(MxReturn::NoDriver, format!("XMX_TRANSPORT={name}: {e}")))?;
    *current = Arc::downgrade(&board);
    Ok(board)
}

/// The transport `XMX_TRANSPORT` names.
pub(crate) fn select(settings: &Settings) -> MxResult<Arc<dyn Transport>> {
    match settings.transport {
        TransportKind::Loopback if xen::is_default(|k| std::env::var(k).ok()) => {
            xen::process_wide()
        }
        TransportKind::Loopback if native::is_default(|k| std::env::var(k).ok()) => {
            native::process_wide()
        }
        TransportKind::Loopback => Ok(loopback::Loopback::process_wide()),
        TransportKind::Native => native::process_wide(),
        TransportKind::Xen => xen::process_wide(),
    }
}

/// The linger of a closed endpoint when `XMX_LINGER_MS` does not set one: one
/// and a half first resend delays after the last frame heard, so the
/// partner's first resend of a message whose ack was lost still finds the
/// port and is acked, not refused as if the message had never arrived (TCP's
/// TIME_WAIT, for the same reason). A close waits that long only after
/// recent traffic.
pub(crate) fn default_close_linger(
    resend_delay: Option<std::time::Duration>,
) -> std::time::Duration {
    resend_delay.unwrap_or(xmx_mx::DEFAULT_RESEND_DELAY) * 3 / 2
}

#[cfg(test)]
mod tests {
    use super::*;
    use xmx_mx::frame::{ConnectRequest, Liback};
    use xmx_mx::Seqnum;

    #[test]
    fn refusal_answers_requests_only() {
        let connect = Frame {
            peer_index: 3,
            dst_endpoint: 7,
            src_endpoint: 1,
            body: Body::ConnectRequest(ConnectRequest {
                lib_seqnum: 0,
                src_session: 9,
                app_key: 1,
                target_recv_seqnum_start: Seqnum::from_raw(0),
                connect_seqnum: 0,
            }),
        };
        let r = refusal(&connect, NackType::EndpointClosed).expect("a nack");
        assert_eq!((r.peer_index, r.dst_endpoint, r.src_endpoint), (3, 1, 7));
        assert_eq!(
            r.body,
            Body::Nack(Nack {
                nack_type: 2,
                lib_seqnum: Seqnum::from_raw(0)
            })
        );
        let ack = Frame {
            body: Body::Liback(Liback {
                session: 1,
                ack_session: 1,
                acknum: 1,
                lib_seqnum: Seqnum::from_raw(0),
                send_seq: Seqnum::from_raw(0),
                resent: 0,
            }),
            ..connect
        };
        assert_eq!(refusal(&ack, NackType::BadEndpoint), None);
    }
}

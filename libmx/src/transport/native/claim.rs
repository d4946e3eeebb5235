//! Endpoints of one board claimed across processes.
//!
//! Every process on an interface opens its own socket and sees every frame, so
//! two processes must never open the same endpoint index: both would answer
//! its peers. (Open-MX's kernel driver keeps that table; here nothing is shared
//! but the kernel.) A claim is an abstract Unix socket named after the link
//! (`Wire::claim_scope`, the interface's MAC) and the index: the name is
//! scoped to the network namespace, as the interface is, and the kernel
//! releases it when its holder exits, however it exits, so a crashed process
//! leaves nothing to clean up.
//!
//! The claim is also the endpoint's lane: a frame another process on the
//! link has for the endpoint cannot go through the interface (a frame sent
//! to one's own address never comes back in), so that process sends it to
//! the claim's name ([`BoardLanes`]) and the holder takes it in from the
//! claim ([`EndpointClaim::take_frames`]), as Open-MX's driver delivers
//! between processes of one host without the wire. The frames of one pass
//! for one endpoint go as one datagram ([`LANE_DATAGRAM_MAX`]), each behind
//! its length (4 bytes, little-endian): a datagram socket queues only
//! `net.unix.max_dgram_qlen` datagrams (10 by default), fewer than a pull's
//! replies in flight. Only frames from
//! processes of the holder's user (or root) are taken: an abstract name is
//! open to every process of the namespace, the interface only to those
//! allowed raw packets.

use std::collections::VecDeque;
use std::io::{self, IoSliceMut};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{
    bind, connect, recvmsg, sendto, setsockopt, socket, sockopt, AddressFamily,
    ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
};
use rustc_hash::FxHashMap;
use xmx_engine::EndpointsElsewhere;

/// Bytes of frames one datagram on a lane carries at most (one frame longer
/// than that goes alone).
pub(super) const LANE_DATAGRAM_MAX: usize = 128 << 10;

/// Bytes a lane queues for its endpoint: a pull's worth of 4 KiB replies in
/// flight and more (the kernel also bounds a queue at `net.unix.max_dgram_qlen`
/// datagrams; a frame beyond either is lost, as on a congested link, and MX
/// sends it again).
const LANE_BUFFER: usize = 8 << 20;

/// An endpoint index of a link, held by this process until dropped (the
/// bound socket is the claim, and the endpoint's lane).
#[derive(Debug)]
pub(super) struct EndpointClaim {
    socket: OwnedFd,
    /// This process's user, whose frames (and root's) the lane takes.
    owner: libc::uid_t,
}

/// Datagrams one look at a lane takes at most: a sender as fast as the
/// taker cannot keep it in one look for ever (what is left keeps the lane
/// readable for the next).
const LANE_TAKE_MAX: usize = 64;

/// What one look at a lane found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct LaneTake {
    /// Frames lent to the caller.
    pub(super) taken: usize,
    /// Datagrams dropped: from another user's process, without credentials,
    /// or cut short.
    pub(super) refused: usize,
}

impl EndpointClaim {
    /// Claims endpoint `index` of the link `scope` names; `None` if another
    /// claim (another process's, or one this process already holds) has it.
    pub(super) fn take(scope: &str, index: u8) -> io::Result<Option<EndpointClaim>> {
        let (socket, addr) = claim_socket(scope, index)?;
        match bind(socket.as_raw_fd(), &addr) {
            Ok(()) => {}
            Err(Errno::EADDRINUSE) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        setsockopt(&socket, sockopt::PassCred, &true)?;
        // Root may go past `net.core.rmem_max`; others get what it allows.
        if setsockopt(&socket, sockopt::RcvBufForce, &LANE_BUFFER).is_err() {
            let _ = setsockopt(&socket, sockopt::RcvBuf, &LANE_BUFFER);
        }
        // SAFETY: getuid cannot fail and touches no memory.
        let owner = unsafe { libc::getuid() };
        Ok(Some(EndpointClaim { socket, owner }))
    }

    /// The lane's descriptor: readable while frames wait on it.
    pub(super) fn fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }

    /// Lends every frame waiting on the lane to `f`, through `buf` (at least
    /// [`LANE_DATAGRAM_MAX`] and a frame long: a longer datagram is cut short
    /// and refused), without blocking.
    pub(super) fn take_frames(&self, buf: &mut [u8], f: &mut dyn FnMut(&[u8])) -> LaneTake {
        let ours = self.owner;
        let mut seen = LaneTake::default();
        for _ in 0..LANE_TAKE_MAX {
            let mut space = nix::cmsg_space!(nix::sys::socket::UnixCredentials);
            let (len, from, cut) = {
                let mut iov = [IoSliceMut::new(buf)];
                let msg = match recvmsg::<()>(
                    self.socket.as_raw_fd(),
                    &mut iov,
                    Some(&mut space),
                    MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
                ) {
                    Ok(msg) => msg,
                    Err(Errno::EINTR) => continue,
                    Err(_) => return seen,
                };
                let from = msg.cmsgs().ok().and_then(|mut c| {
                    c.find_map(|m| match m {
                        ControlMessageOwned::ScmCredentials(cred) => Some(cred.uid()),
                        _ => None,
                    })
                });
                (msg.bytes, from, msg.flags.contains(MsgFlags::MSG_TRUNC))
            };
            if !matches!(from, Some(uid) if uid == ours || uid == 0) {
                seen.refused += 1;
                tracing::debug!(
                    ?from,
                    "datagram on an endpoint's lane from another user: dropped"
                );
                continue;
            }
            if cut {
                seen.refused += 1;
                tracing::debug!(len, "datagram on an endpoint's lane too long: dropped");
                continue;
            }
            let mut rest = buf.get(..len).unwrap_or(&[]);
            while !rest.is_empty() {
                let frame = rest
                    .get(..4)
                    .and_then(|l| <[u8; 4]>::try_from(l).ok())
                    .map(|l| u32::from_le_bytes(l) as usize)
                    .and_then(|l| rest.get(4..4 + l));
                let Some(frame) = frame else {
                    seen.refused += 1;
                    tracing::debug!(
                        len,
                        "datagram on an endpoint's lane cut short: rest dropped"
                    );
                    break;
                };
                f(frame);
                seen.taken += 1;
                rest = rest.get(4 + frame.len()..).unwrap_or(&[]);
            }
        }
        seen
    }

    /// Whether some process holds endpoint `index` of the link `scope` names.
    /// Connecting to the claim takes no name, so a look never makes a
    /// claimant fail.
    pub(super) fn is_held(scope: &str, index: u8) -> io::Result<bool> {
        let (socket, addr) = claim_socket(scope, index)?;
        match connect(socket.as_raw_fd(), &addr) {
            Ok(()) => Ok(true),
            Err(Errno::ECONNREFUSED | Errno::ENOENT) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// The abstract address of the claim of endpoint `index` of link `scope`.
fn claim_name(scope: &str, index: u8) -> io::Result<UnixAddr> {
    let name = format!("xmx-native/{scope}/{index}");
    Ok(UnixAddr::new_abstract(name.as_bytes())?)
}

/// A fresh, non-blocking Unix datagram socket and the abstract address of
/// the claim.
fn claim_socket(scope: &str, index: u8) -> io::Result<(OwnedFd, UnixAddr)> {
    Ok((datagram_socket()?, claim_name(scope, index)?))
}

/// A fresh, non-blocking Unix datagram socket.
fn datagram_socket() -> io::Result<OwnedFd> {
    Ok(socket(
        AddressFamily::Unix,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?)
}

/// Where a board sends frames for endpoints other processes on its link
/// hold: to their claims, by name.
#[derive(Debug)]
pub(super) struct BoardLanes {
    socket: OwnedFd,
    scope: String,
    names: FxHashMap<u8, UnixAddr>,
    /// The datagram being filled: its endpoint, bytes and frames.
    filling: Option<LaneDatagram>,
    /// A sent datagram's buffer, for the next one to fill.
    spare: Vec<u8>,
    /// Datagrams the holder's queue had no room for yet, oldest first.
    backlog: VecDeque<LaneDatagram>,
    backlog_bytes: usize,
    /// When the backlog is offered again if nothing else flushes first, and
    /// the gap that time was set with (doubled while holders take nothing).
    retry_at: Option<Instant>,
    retry_gap: Duration,
}

/// A datagram for the lane of one endpoint.
#[derive(Debug)]
struct LaneDatagram {
    endpoint: u8,
    bytes: Vec<u8>,
    frames: usize,
    /// When a full queue first refused it.
    refused_at: Option<Instant>,
}

/// Bytes of datagrams kept for holders whose queue is full: a receiver's
/// queue holds only `net.unix.max_dgram_qlen` datagrams (10 by default),
/// fewer than a pull has in flight, and one it drains late must not cost the
/// frames a pull timeout each. Beyond this they are lost as on a congested
/// link.
const LANE_BACKLOG_MAX: usize = 8 << 20;

/// What the lanes did with frames, in frames.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct LaneSend {
    pub(super) sent: usize,
    /// Lost because nobody holds the endpoint any more, or the backlog was
    /// full: MX sends them again, and learns of a closed endpoint from a
    /// later try.
    pub(super) lost: usize,
}

/// What became of one datagram offered to a lane.
enum LaneOutcome {
    Sent,
    /// The holder's queue is full: try again later.
    Full,
    Lost,
}

impl BoardLanes {
    /// Lanes to the claims of link `scope`.
    pub(super) fn new(scope: String) -> io::Result<BoardLanes> {
        let socket = datagram_socket()?;
        // A datagram queued at a receiver counts against its sender's buffer
        // until it is read: room for a pull's replies to several endpoints.
        if setsockopt(&socket, sockopt::SndBufForce, &LANE_BUFFER).is_err() {
            let _ = setsockopt(&socket, sockopt::SndBuf, &LANE_BUFFER);
        }
        Ok(BoardLanes {
            socket,
            scope,
            names: FxHashMap::default(),
            filling: None,
            spare: Vec::new(),
            backlog: VecDeque::new(),
            backlog_bytes: 0,
            retry_at: None,
            retry_gap: Duration::ZERO,
        })
    }

    /// Queues `frame` for whichever process holds `endpoint`; it leaves with
    /// the other frames for that endpoint at the next [`BoardLanes::flush`],
    /// or before if the datagram is full or the next frame is for another
    /// endpoint.
    pub(super) fn queue(&mut self, endpoint: u8, frame: &[u8], done: &mut LaneSend) {
        let fits = self.filling.as_ref().is_some_and(|d| {
            d.endpoint == endpoint && d.bytes.len() + 4 + frame.len() <= LANE_DATAGRAM_MAX
        });
        if !fits {
            self.flush(done);
        }
        let spare = &mut self.spare;
        let d = self.filling.get_or_insert_with(|| LaneDatagram {
            endpoint,
            bytes: std::mem::take(spare),
            frames: 0,
            refused_at: None,
        });
        d.bytes
            .extend_from_slice(&(frame.len() as u32).to_le_bytes());
        d.bytes.extend_from_slice(frame);
        d.frames += 1;
    }

    /// Sends the datagram being filled, and what waits in the backlog before
    /// it, without blocking; what a full queue refuses waits for the next
    /// flush ([`BoardLanes::backlogged`]).
    pub(super) fn flush(&mut self, done: &mut LaneSend) {
        if let Some(d) = self.filling.take() {
            if self.backlog_bytes + d.bytes.len() > LANE_BACKLOG_MAX {
                done.lost += d.frames;
            } else {
                self.backlog_bytes += d.bytes.len();
                // Behind a datagram for the same endpoint that waits already,
                // it joins that one if there is room: a burst of small
                // messages to a holder that drains late then takes a few
                // datagrams of its queue, not one each.
                match self.backlog.back_mut() {
                    Some(last)
                        if last.endpoint == d.endpoint
                            && last.bytes.len() + d.bytes.len() <= LANE_DATAGRAM_MAX =>
                    {
                        last.bytes.extend_from_slice(&d.bytes);
                        last.frames += d.frames;
                        self.spare = d.bytes;
                        self.spare.clear();
                    }
                    _ => self.backlog.push_back(d),
                }
            }
        }
        // In order: a later datagram for the same endpoint must not pass one
        // the holder's queue refused.
        let BoardLanes {
            socket,
            scope,
            names,
            backlog,
            backlog_bytes,
            spare,
            ..
        } = self;
        let mut moved = false;
        while let Some(d) = backlog.front() {
            let outcome = if d.refused_at.is_some_and(|t| t.elapsed() > LANE_BACKLOG_AGE) {
                // Its holder took nothing for that long: MX has sent the
                // frames again already, or its peer is gone.
                LaneOutcome::Lost
            } else {
                send_datagram(socket, scope, names, d)
            };
            match outcome {
                LaneOutcome::Full => break,
                LaneOutcome::Sent => done.sent += d.frames,
                LaneOutcome::Lost => done.lost += d.frames,
            }
            moved = true;
            if let Some(mut d) = backlog.pop_front() {
                *backlog_bytes -= d.bytes.len();
                d.bytes.clear();
                *spare = d.bytes;
            }
        }
        if backlog.is_empty() {
            self.retry_at = None;
            self.retry_gap = Duration::ZERO;
            return;
        }
        let now = Instant::now();
        for d in backlog.iter_mut() {
            d.refused_at.get_or_insert(now);
        }
        self.retry_gap = if moved || self.retry_gap.is_zero() {
            LANE_RETRY
        } else {
            (self.retry_gap * 2).min(LANE_RETRY_MAX)
        };
        self.retry_at = Some(now + self.retry_gap);
    }

    /// Whether datagrams wait for room in a holder's queue.
    pub(super) fn backlogged(&self) -> bool {
        !self.backlog.is_empty()
    }

    /// When the board must flush again for the backlog if nothing else makes
    /// it (`None`: nothing waits).
    pub(super) fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }
}

/// Offers datagram `d` to the claim of its endpoint, without blocking.
fn send_datagram(
    socket: &OwnedFd,
    scope: &str,
    names: &mut FxHashMap<u8, UnixAddr>,
    d: &LaneDatagram,
) -> LaneOutcome {
    let name = match names.get(&d.endpoint) {
        Some(name) => name,
        None => match claim_name(scope, d.endpoint) {
            Ok(name) => names.entry(d.endpoint).or_insert(name),
            Err(e) => {
                tracing::debug!(%e, endpoint = d.endpoint, "no lane name");
                return LaneOutcome::Lost;
            }
        },
    };
    loop {
        match sendto(
            socket.as_raw_fd(),
            &d.bytes,
            name,
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
        ) {
            Ok(_) => return LaneOutcome::Sent,
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN | Errno::ENOBUFS) => return LaneOutcome::Full,
            Err(e) => {
                // ECONNREFUSED, ENOENT: the endpoint closed meanwhile.
                tracing::debug!(%e, endpoint = d.endpoint, frames = d.frames, "frames for another process lost");
                return LaneOutcome::Lost;
            }
        }
    }
}

/// How soon a board with a backlog on its lanes offers it again when nothing
/// else moves it; doubled, up to [`LANE_RETRY_MAX`], while the holders take
/// nothing (a stopped process costs its senders few wake-ups).
const LANE_RETRY: Duration = Duration::from_micros(200);
const LANE_RETRY_MAX: Duration = Duration::from_millis(50);
/// A datagram refused this long is dropped (see [`LaneSend::lost`]).
const LANE_BACKLOG_AGE: Duration = Duration::from_millis(500);

/// How long an answer of [`ClaimsElsewhere`] is believed: a process that
/// opens or closes an endpoint is seen that much later at most, and a stream
/// for another process's endpoint costs a look per index that often, not per
/// frame.
const ANSWER_FOR: Duration = Duration::from_millis(100);

/// The engine's view of the indices other processes on the link hold
/// ([`xmx_engine::EndpointsElsewhere`]): their frames are left to them instead
/// of being refused as for a closed endpoint (which costs the sender a resend:
/// its core confirms a refusal before it believes it).
pub(super) struct ClaimsElsewhere {
    scope: String,
    answers: FxHashMap<u8, (bool, Instant)>,
}

impl ClaimsElsewhere {
    pub(super) fn new(scope: String) -> ClaimsElsewhere {
        ClaimsElsewhere {
            scope,
            answers: FxHashMap::default(),
        }
    }
}

impl EndpointsElsewhere for ClaimsElsewhere {
    fn held_elsewhere(&mut self, endpoint: u8) -> bool {
        let now = Instant::now();
        if let Some(&(held, at)) = self.answers.get(&endpoint) {
            if now.duration_since(at) < ANSWER_FOR {
                return held;
            }
        }
        let held = match EndpointClaim::is_held(&self.scope, endpoint) {
            Ok(held) => held,
            Err(e) => {
                tracing::debug!(%e, endpoint, "looking up an endpoint claim");
                false
            }
        };
        self.answers.insert(endpoint, (held, now));
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_is_claimed_once_until_released() {
        // A scope of its own, so that no other test's board shares the names.
        let link = format!("claim-test/{}", std::process::id());
        let first = EndpointClaim::take(&link, 4).unwrap().expect("free");
        assert!(EndpointClaim::take(&link, 4).unwrap().is_none(), "held");
        let other = EndpointClaim::take(&link, 5)
            .unwrap()
            .expect("another index");
        let elsewhere = format!("{link}-other");
        assert!(EndpointClaim::take(&elsewhere, 4).unwrap().is_some());
        assert!(EndpointClaim::is_held(&link, 4).unwrap());
        assert!(!EndpointClaim::is_held(&link, 6).unwrap());
        let mut elsewhere_view = ClaimsElsewhere::new(link.clone());
        assert!(elsewhere_view.held_elsewhere(5));
        assert!(!elsewhere_view.held_elsewhere(6));
        drop(first);
        assert!(!EndpointClaim::is_held(&link, 4).unwrap());
        assert!(EndpointClaim::take(&link, 4).unwrap().is_some(), "released");
        drop(other);
        let long = "x".repeat(200);
        assert!(
            EndpointClaim::take(&long, 0).is_err(),
            "a name that does not fit"
        );
    }

    fn take_all(claim: &EndpointClaim) -> (Vec<Vec<u8>>, LaneTake) {
        let mut buf = vec![0u8; LANE_DATAGRAM_MAX + 9018];
        let mut got = Vec::new();
        let seen = claim.take_frames(&mut buf, &mut |f| got.push(f.to_vec()));
        (got, seen)
    }

    /// Frames queued for an endpoint reach its holder whole and in order;
    /// datagrams its queue has no room for wait in the sender and leave at a
    /// later flush, none lost or repeated; frames for an endpoint nobody holds
    /// are lost, as to a closed port.
    #[test]
    fn lanes_carry_every_frame_once_in_order_through_a_full_queue() {
        let scope = format!("lane-test/{}", std::process::id());
        let claim = EndpointClaim::take(&scope, 3).unwrap().expect("free");
        let mut lanes = BoardLanes::new(scope.clone()).unwrap();
        let frame = |i: u32| -> Vec<u8> {
            let mut f = vec![(i % 251) as u8; 60 + (i as usize * 97) % 9000];
            f[..4].copy_from_slice(&i.to_le_bytes());
            f
        };
        let mut done = LaneSend::default();
        // One flush per frame: many more datagrams than the holder's queue
        // takes (`net.unix.max_dgram_qlen`, 10 by default) while it reads
        // nothing.
        for i in 0..200 {
            lanes.queue(3, &frame(i), &mut done);
            lanes.flush(&mut done);
        }
        assert_eq!(done.lost, 0);
        assert!(lanes.backlogged(), "the queue filled up");
        // While the holder takes nothing, the board looks again ever later.
        assert_eq!(lanes.retry_gap, LANE_RETRY_MAX);
        assert!(lanes.retry_at().is_some());
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.len() < 200 {
            let (frames, seen) = take_all(&claim);
            assert_eq!(seen.refused, 0);
            got.extend(frames);
            lanes.flush(&mut done);
            assert!(
                Instant::now() < deadline,
                "frames never came: {}",
                got.len()
            );
        }
        assert_eq!(got, (0..200).map(frame).collect::<Vec<_>>());
        assert_eq!((done.sent, done.lost), (200, 0));
        assert!(!lanes.backlogged());
        assert_eq!(lanes.retry_at(), None);
        // Nobody holds endpoint 4.
        lanes.queue(4, &frame(0), &mut done);
        lanes.flush(&mut done);
        assert_eq!((done.sent, done.lost), (200, 1));
        assert!(!lanes.backlogged());
    }

    /// A datagram whose records run past its end gives what it held whole
    /// and drops the rest; one from a process of another user is dropped
    /// whole (that part needs root, to send as another user).
    #[test]
    fn a_lane_refuses_cut_datagrams_and_other_users() {
        let scope = format!("lane-hostile/{}", std::process::id());
        let claim = EndpointClaim::take(&scope, 5).unwrap().expect("free");
        let to = claim_name(&scope, 5).unwrap();
        let sender = datagram_socket().unwrap();
        let mut cut = Vec::new();
        cut.extend_from_slice(&3u32.to_le_bytes());
        cut.extend_from_slice(b"abc");
        cut.extend_from_slice(&100u32.to_le_bytes());
        cut.extend_from_slice(b"short");
        sendto(sender.as_raw_fd(), &cut, &to, MsgFlags::empty()).unwrap();
        sendto(sender.as_raw_fd(), &[1, 2], &to, MsgFlags::empty()).unwrap();
        let (got, seen) = take_all(&claim);
        assert_eq!(got, vec![b"abc".to_vec()]);
        assert_eq!(
            seen,
            LaneTake {
                taken: 1,
                refused: 2
            }
        );

        // SAFETY: geteuid touches no memory.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let mut record = 3u32.to_le_bytes().to_vec();
        record.extend_from_slice(b"xyz");
        // A thread of its own takes another user's identity: the raw system
        // call changes the calling thread's credentials alone (a forked
        // child would hold copies of every socket of the tests running
        // beside this one, claims included, until it exits).
        let sent = std::thread::spawn(move || {
            // SAFETY: a plain system call on integers; it changes only this
            // thread's credentials, which end with it.
            let rc = unsafe { libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534) };
            assert_eq!(rc, 0, "setresuid");
            let sender = datagram_socket().unwrap();
            sendto(sender.as_raw_fd(), &record, &to, MsgFlags::empty()).unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(sent, 7);
        let (got, seen) = take_all(&claim);
        assert!(got.is_empty(), "another user's frame taken: {got:?}");
        assert_eq!(
            seen,
            LaneTake {
                taken: 0,
                refused: 1
            }
        );
    }
}

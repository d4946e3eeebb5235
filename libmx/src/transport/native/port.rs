//! An endpoint's port and regions on the native board.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use xmx_mx::{Frame, PeerAddr, RdmaWindow, RequestId, Status};

use super::{Inbox, NativeShared};
use crate::doorbell::Doorbell;
use crate::segments::Segments;
use crate::transport::engine_msgs::Outgoing;
use crate::transport::mailbox::Mailbox;
use crate::transport::{PullProgress, Regions, TransportPort};

/// An open endpoint of the native board.
///
/// The thread that polls it (the application's, or the background
/// thread's, whichever holds the endpoint) takes the link's frames in itself
/// and gets the endpoint's own straight into `inbox`; only what the driver
/// thread or another endpoint's pass took in for it waits in the mailbox.
pub(super) struct NativePort {
    shared: Arc<NativeShared>,
    index: u8,
    session: u32,
    mailbox: Arc<Mailbox>,
    regions: Arc<NativeRegions>,
    outgoing: Outgoing,
    inbox: VecDeque<Frame<Vec<u8>>>,
    /// The inbox holds what the last look at the link found, and the link held
    /// no more then: when the inbox runs empty, the caller's round ends without
    /// another look (which cost as much as handling the frame the first found;
    /// the caller's next round looks again).
    looked: bool,
    doorbell: Arc<Doorbell>,
    /// Looks at the link since the lanes were last looked at.
    since_lanes: u32,
    /// Looks left in which the lanes are looked at every time: traffic went
    /// through them lately.
    lanes_busy: u32,
    /// The board's lane traffic at the last look ([`Board::lane_traffic`]).
    lane_traffic: u64,
}

/// While no frame went through the lanes lately, a polling thread looks at
/// them once per this many looks at the link: each look is a system call per
/// endpoint, which every poll of a wire-only exchange would pay (a look in
/// sixteen cost a wire ping-pong 3-5% of its round trip).
const LANE_LOOK_EVERY: u32 = 64;
/// After frames went through the lanes, either way, this many looks at the
/// link look at the lanes too (an exchange between processes on one
/// interface polls them every time).
const LANES_BUSY_FOR: u32 = 1 << 14;

impl NativePort {
    pub(super) fn new(
        shared: Arc<NativeShared>,
        index: u8,
        session: u32,
        mailbox: Arc<Mailbox>,
        doorbell: Arc<Doorbell>,
    ) -> Self {
        let regions = Arc::new(NativeRegions {
            shared: shared.clone(),
            index,
            mailbox: mailbox.clone(),
        });
        NativePort {
            shared,
            index,
            session,
            mailbox,
            regions,
            outgoing: Outgoing::default(),
            inbox: VecDeque::new(),
            looked: false,
            doorbell,
            since_lanes: 0,
            lanes_busy: 0,
            lane_traffic: 0,
        }
    }

    /// Takes in what the link holds, this endpoint's frames into the inbox;
    /// `None` if another thread holds the board (it leaves them in the
    /// mailbox).
    ///
    /// A poll that got frames moves the doorbell's generation once (not
    /// the background thread: the polling thread takes them itself), as a
    /// mailbox's ring did per frame: a wait whose last round took frames in
    /// goes on polling instead of sleeping while traffic flows, and other
    /// threads waiting on the endpoint look again.
    ///
    /// The lanes from other processes on the link are looked at too when
    /// `lanes` is set, or when they are due (see [`LANE_LOOK_EVERY`]).
    fn poll_link(&mut self, lanes: bool) -> Option<usize> {
        let before = self.inbox.len();
        self.since_lanes += 1;
        let lanes = lanes || self.lanes_busy > 0 || self.since_lanes >= LANE_LOOK_EVERY;
        if lanes {
            self.since_lanes = 0;
            self.lanes_busy = self.lanes_busy.saturating_sub(1);
        }
        let inbox = Inbox {
            index: self.index,
            frames: &mut self.inbox,
        };
        let got = self.shared.try_run(Some(inbox), |b, clock| {
            let from_lanes = if lanes { b.receive_lanes(clock) } else { 0 };
            (b.receive(clock) + from_lanes, b.lane_traffic())
        });
        let got = got.map(|(got, traffic)| {
            if traffic != std::mem::replace(&mut self.lane_traffic, traffic) {
                self.lanes_busy = LANES_BUSY_FOR;
            }
            got
        });
        if self.inbox.len() > before {
            self.doorbell.ring_local();
        }
        got
    }
}

impl TransportPort for NativePort {
    fn index(&self) -> u8 {
        self.index
    }

    fn session(&self) -> u32 {
        self.session
    }

    fn transmit(&mut self, frame: Frame<Vec<u8>>) {
        match self.outgoing.convert(frame) {
            Ok(None) => {}
            // Events this makes for the endpoint itself (a send to itself)
            // go to the mailbox and ring: a caller that transmits last, then
            // waits, must not sleep on frames in the inbox.
            Ok(Some(out)) => self
                .shared
                .run(|b, clock| b.post(clock.now(), self.index, out)),
            Err(e) => self.shared.run(|b, _| b.unsendable(&e)),
        }
    }

    fn receive(&mut self) -> Option<Frame<Vec<u8>>> {
        if let Some(f) = self.inbox.pop_front() {
            return Some(f);
        }
        if std::mem::take(&mut self.looked) {
            return None;
        }
        // The polling thread moves the link itself (the mailbox's older
        // frames come first, see `Board::pump`), unless another thread
        // holds the board: then they wait in the mailbox.
        match self.poll_link(false) {
            Some(_) => {
                let f = self.inbox.pop_front();
                self.looked = f.is_some();
                f
            }
            None => self.mailbox.next_frame(),
        }
    }

    fn regions(&self) -> Arc<dyn Regions> {
        self.regions.clone()
    }

    fn before_sleep(&mut self) -> bool {
        // A thread that can sleep on the link itself (`arrival_fd`) is woken
        // by the next frame and takes it in: the driver keeps leaving the link
        // alone (`Doorbell::port_taken_until`), or two threads would wake for
        // each frame. Otherwise the driver left the link alone while this
        // thread polled it: have it watch the link again before this thread
        // sleeps. (The polling mark is gone already; the driver reads it after
        // it clears `watching`, so one of the two sees the other.)
        if !self.doorbell.sleeps_on_arrivals() && !self.shared.watching.load(Ordering::SeqCst) {
            self.shared.wake.notify();
        }
        // Frames in the inbox ring nobody: the caller must take them first.
        self.poll_link(true);
        !self.inbox.is_empty()
    }

    fn arrival_fds(&self) -> Option<crate::transport::ArrivalFds> {
        // The link and our lanes: readable at the next frame for any
        // endpoint of the process, which the woken thread's progress takes in
        // and hands out.
        Some(crate::transport::ArrivalFds([
            self.shared.wire_fd,
            self.shared.lanes_fd,
        ]))
    }
}

impl Drop for NativePort {
    fn drop(&mut self) {
        let linger = self.shared.config.linger;
        self.shared
            .run(|b, clock| b.close(clock.now(), self.index, linger));
    }
}

/// An endpoint's LARGE buffers: registered as regions of the engine, whose
/// memory is the application's own (see `memory`).
pub(super) struct NativeRegions {
    shared: Arc<NativeShared>,
    index: u8,
    mailbox: Arc<Mailbox>,
}

impl Regions for NativeRegions {
    fn register(&self, data: &Segments) -> Option<RdmaWindow> {
        self.shared.run(|b, _| b.register_window(self.index, data))
    }

    fn release(&self, window: RdmaWindow) {
        self.shared.run(|b, _| b.release_window(self.index, window));
    }

    fn invalidate(&self, addr: usize, len: usize) {
        self.shared.run(|b, _| b.invalidate(self.index, addr, len));
    }

    fn pull(
        &self,
        id: RequestId,
        source: PeerAddr,
        window: RdmaWindow,
        dest: &Segments,
        length: u32,
    ) -> PullProgress {
        self.shared
            .run(|b, clock| b.start_pull(clock.now(), self.index, id, source, window, dest, length))
    }

    fn learn_session(&self, peer: PeerAddr, session: u32) {
        self.shared
            .run(|b, _| b.learn_session(self.index, peer, session));
    }

    fn completed_pull(&self) -> Option<(RequestId, Result<(), Status>)> {
        self.mailbox.next_pull()
    }
}

//! Raw endpoints (`mx_raw_*`): whole frames between the mapper tools of a
//! fabric, with send completions reported as events.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::doorbell::Doorbell;
use crate::errors::MxResult;
use crate::transport::RawPort;

/// What `mx_raw_next_event` reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RawEvent {
    /// A send finished; its context.
    SendComplete(usize),
    /// A frame arrived.
    Received(Vec<u8>),
}

/// An open raw endpoint.
pub(crate) struct RawEndpoint {
    handle: u32,
    board: u32,
    port: Mutex<Box<dyn RawPort>>,
    doorbell: Arc<Doorbell>,
    sent: Mutex<VecDeque<usize>>,
}

impl RawEndpoint {
    /// Wraps an opened raw port.
    pub(crate) fn new(
        handle: u32,
        board: u32,
        port: Box<dyn RawPort>,
        doorbell: Arc<Doorbell>,
    ) -> Self {
        RawEndpoint {
            handle,
            board,
            port: Mutex::new(port),
            doorbell,
            sent: Mutex::new(VecDeque::new()),
        }
    }

    /// Its handle.
    pub(crate) fn handle(&self) -> u32 {
        self.handle
    }

    /// Its board number.
    pub(crate) fn board(&self) -> u32 {
        self.board
    }

    /// Sends a frame; its completion is reported with `context`.
    pub(crate) fn send(&self, data: &[u8], context: usize) -> MxResult<()> {
        self.port
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(data)?;
        self.sent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(context);
        Ok(())
    }

    /// The next event, waiting up to `timeout` for one.
    pub(crate) fn next_event(&self, timeout: Duration) -> Option<RawEvent> {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = self.doorbell.generation();
            if let Some(c) = self
                .sent
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front()
            {
                return Some(RawEvent::SendComplete(c));
            }
            if let Some(f) = self
                .port
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .receive()
            {
                return Some(RawEvent::Received(f));
            }
            if Instant::now() >= deadline {
                return None;
            }
            self.doorbell.wait(seen, Some(deadline));
        }
    }
}

//! Per-board activity counters, as `mx_get_info(MX_COUNTERS_*)` reports them.

use std::sync::atomic::{AtomicU64, Ordering};

/// One counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Counter {
    /// Frames handed to the transport.
    FramesSent,
    /// Frames taken from the transport.
    FramesReceived,
    /// Sends posted.
    Sends,
    /// Receives posted.
    Recvs,
    /// Bytes of completed sends.
    BytesSent,
    /// Bytes of completed receives.
    BytesReceived,
    /// LARGE pulls done.
    Pulls,
    /// Connects posted.
    Connects,
    /// Messages given to the unexpected handler.
    UnexpHandlerCalls,
    /// Frames sent on a direct channel to a co-located guest.
    DirectFramesSent,
    /// Frames taken off a direct channel.
    DirectFramesReceived,
    /// Direct channels that came up.
    DirectChannelsOpened,
    /// Direct channels that ended (revoked, closed by either side, broken).
    DirectChannelsClosed,
    /// Direct channels the peer broke (ring rules violated).
    DirectChannelsBroken,
    /// LARGE pulls served over a direct channel.
    DirectPulls,
    /// Direct pulls the peer stopped serving, finished through the backend.
    DirectPullsStalled,
    /// Frames the transport gave up posting because the backend made no room
    /// in time (the protocol core resends them).
    SendsDroppedForRoom,
}

/// Every counter, in `mx_get_info` order, with its label.
pub(crate) const ALL: [(Counter, &str); 17] = [
    (Counter::FramesSent, "Frames sent"),
    (Counter::FramesReceived, "Frames received"),
    (Counter::Sends, "Sends posted"),
    (Counter::Recvs, "Receives posted"),
    (Counter::BytesSent, "Bytes sent"),
    (Counter::BytesReceived, "Bytes received"),
    (Counter::Pulls, "LARGE pulls"),
    (Counter::Connects, "Connects posted"),
    (Counter::UnexpHandlerCalls, "Unexpected handler calls"),
    (Counter::DirectFramesSent, "Direct frames sent"),
    (Counter::DirectFramesReceived, "Direct frames received"),
    (Counter::DirectChannelsOpened, "Direct channels opened"),
    (Counter::DirectChannelsClosed, "Direct channels closed"),
    (
        Counter::DirectChannelsBroken,
        "Direct channels broken by the peer",
    ),
    (Counter::DirectPulls, "Direct LARGE pulls"),
    (Counter::DirectPullsStalled, "Direct LARGE pulls stalled"),
    (
        Counter::SendsDroppedForRoom,
        "Sends dropped for lack of room",
    ),
];

static VALUES: [AtomicU64; 17] = [const { AtomicU64::new(0) }; 17];

/// Adds `n` to a counter.
pub(crate) fn add(c: Counter, n: u64) {
    VALUES[c as usize].fetch_add(n, Ordering::Relaxed);
}

/// A counter's value (MX reports 32 bits; it wraps).
pub(crate) fn get(c: Counter) -> u32 {
    VALUES[c as usize].load(Ordering::Relaxed) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_follow_indexes() {
        for (i, (c, _)) in ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
        let before = get(Counter::Pulls);
        add(Counter::Pulls, 2);
        assert!(get(Counter::Pulls).wrapping_sub(before) >= 2);
    }
}

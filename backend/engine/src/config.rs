//! Limits and timers of the engine.

use std::time::Duration;

/// Tunables of an [`Engine`](super::Engine). The defaults suit one dom0 serving a few dozen
/// guests on a jumbo-frame LAN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// Endpoint indices a guest may open (at most 256). A frame for an index at or beyond
    /// it is refused with `BAD_ENDPT`, one for a closed index below it with `ENDPT_CLOSED`.
    pub endpoints_per_guest: u16,
    /// Most PULL blocks one pull keeps requested at once (at most 32; Open-MX keeps 4):
    /// what a lone pull gets when the budget has room.
    pub pull_blocks_in_flight: usize,
    /// Frames' worth of data (4 KiB each) one frame may carry between xmx hosts: asked
    /// for in this engine's PULLs (one PULL_REPLY carrying that many frames' data) and
    /// CONNECTs (MEDIUM fragments toward it that long), and given to peers that ask
    /// (1: MX's frames, asked of nobody). Set it from the NIC's MTU, and only where the
    /// fabric carries frames that long: 2 fits a 9000-byte MTU. MX and Open-MX peers
    /// are never asked (they ignore the mark) and never sent more than MX's frames.
    pub pull_reply_frames: u8,
    /// PULL_REPLY frames all pulls of all guests may have requested and not yet retired
    /// (at least one block of 8). Keep it below the NIC's receive ring so a burst of
    /// replies cannot overflow it.
    pub pull_frame_budget: u32,
    /// How long a pull waits without any new reply before requesting its blocks again.
    pub pull_retransmit_timeout: Duration,
    /// Consecutive retransmissions without progress after which a pull fails.
    pub pull_retries_max: u32,
    /// Pulls one guest may have outstanding.
    pub max_pulls_per_guest: usize,
    /// Sum of the lengths of one guest's outstanding pulls; a pull alone is taken
    /// whatever its length.
    pub max_pull_bytes_per_guest: u64,
    /// Regions one guest may have registered, over all its endpoints.
    pub max_regions_per_guest: usize,
    /// Bytes of frames built for one guest and not yet taken by [`Engine::poll_transmit`](super::Engine::poll_transmit).
    pub max_tx_bytes_per_guest: usize,
    /// Frames waiting for the NIC, all guests together; beyond it frames are dropped.
    pub max_tx_frames: usize,
    /// Unsolicited events (receives, nacks) waiting for one endpoint; beyond it received
    /// packets are dropped and the sending library retransmits. Completions always pass.
    pub max_pending_events_per_endpoint: usize,
    /// HOST_REPLY results kept for the peer service.
    pub max_host_replies: usize,
    /// Frame buffers kept for reuse.
    pub buffer_pool_size: usize,
    /// How long an endpoint marked re-opening ([`Engine::expect_reopen`](super::Engine::expect_reopen))
    /// may take to open. Until then frames for it are dropped without a NACK so that
    /// peers resend; past it the mark goes and they are NACKed as for any closed
    /// endpoint, so the peers of an application that died during a move learn that
    /// its endpoint is closed instead of resending into it until their retry budget
    /// runs out.
    pub reopen_grace: Duration,
    /// Bytes of a pull landed in order after which the guest is told so
    /// (`EventBody::PullProgress`), so that it copies them out of its window while the
    /// rest arrives; 0 tells nothing. Only a guest that copies out of a window after the
    /// pull needs it (not an in-process engine whose sink is the application's buffer).
    pub pull_progress_step: u32,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            endpoints_per_guest: 256,
            pull_blocks_in_flight: 32,
            pull_reply_frames: 1,
            pull_frame_budget: 512,
            pull_retransmit_timeout: Duration::from_millis(500),
            // Backing off to 2 s, about two minutes of silence before a pull fails: a
            // source guest migrating by real Xen is away for the whole of its toolstack's
            // copy (tens of seconds on a slow host), and the sender's messages are
            // patient for longer still (the library's retry budget); a source that is
            // gone for good NACKs the pull (its endpoint closed) long before.
            pull_retries_max: 60,
            max_pulls_per_guest: 256,
            max_pull_bytes_per_guest: 1 << 30,
            max_regions_per_guest: 1024,
            max_tx_bytes_per_guest: 4 << 20,
            max_tx_frames: 16384,
            max_pending_events_per_endpoint: 4096,
            max_host_replies: 1024,
            buffer_pool_size: 512,
            // The guest's daemon re-opens its endpoints as soon as its device is
            // connected, in milliseconds; its own control requests give up after 10 s.
            reopen_grace: Duration::from_secs(20),
            // A quarter of a MiB: a 1 MiB message is told three times, so the
            // guest's last copy is a quarter of it; each telling is one event.
            pull_progress_step: 256 << 10,
        }
    }
}

/// The most frames' worth of data (4 KiB each) one PULL_REPLY can carry on a link whose
/// longest frame (MTU plus Ethernet header) is `max_frame_len`: 1 at MX's MTU, 2 at 9000.
/// What [`EngineConfig::pull_reply_frames`] is set to where the fabric carries frames
/// that long.
pub fn pull_reply_frames_for(max_frame_len: usize) -> u8 {
    use xmx_wire::mxoe::{HEAD_LEN, PULL_REPLIES_PER_BLOCK, PULL_REPLY_LEN, PULL_REPLY_LEN_MAX};
    let data = max_frame_len.saturating_sub(HEAD_LEN + PULL_REPLY_LEN);
    (data / PULL_REPLY_LEN_MAX).clamp(1, PULL_REPLIES_PER_BLOCK) as u8
}

#[cfg(test)]
mod tests {
    use super::pull_reply_frames_for;

    #[test]
    fn reply_frames_follow_the_mtu() {
        let eth = 14;
        assert_eq!(pull_reply_frames_for(0), 1);
        assert_eq!(pull_reply_frames_for(xmx_wire::mxoe::FRAME_LEN_MAX), 1);
        assert_eq!(pull_reply_frames_for(1500 + eth), 1);
        assert_eq!(pull_reply_frames_for(9000 + eth), 2);
        assert_eq!(pull_reply_frames_for(16384 + eth), 3);
        assert_eq!(pull_reply_frames_for(65535 + eth), 8);
    }
}

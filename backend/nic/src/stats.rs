//! Counters of one packet socket.

/// What a [`PacketSocket`](super::PacketSocket) has done since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NicStats {
    /// Frames queued into the transmit ring.
    pub tx_frames: u64,
    /// Bytes of those frames.
    pub tx_bytes: u64,
    /// `send()` system calls made to push the transmit ring.
    pub tx_syscalls: u64,
    /// Times a frame found no free transmit slot and had to wait for the kernel.
    pub tx_ring_full: u64,
    /// Flushes the kernel cut short for lack of buffer space (EAGAIN / ENOBUFS).
    pub tx_backpressure: u64,
    /// Transmit slots the kernel handed back as malformed (TP_STATUS_WRONG_FORMAT). The
    /// socket asks the kernel to drop such frames instead, so this stays 0 on kernels that
    /// honour PACKET_LOSS.
    pub tx_rejected: u64,
    /// Frames delivered to a receive closure.
    pub rx_frames: u64,
    /// Bytes of those frames.
    pub rx_bytes: u64,
    /// Frames the kernel dropped because the receive ring was full (PACKET_STATISTICS).
    pub rx_drops: u64,
    /// Frames the kernel cut to fit a slot (the interface MTU grew after open).
    pub rx_truncated: u64,
    /// Slots whose status, offset or length did not make sense; skipped.
    pub rx_bad_slots: u64,
    /// Our own transmissions looped back to us; skipped.
    pub rx_outgoing: u64,
}

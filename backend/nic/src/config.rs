//! How a [`PacketSocket`](super::PacketSocket) is set up.

use std::time::Duration;

use super::error::{NicError, Result};
use super::MXOE_MTU_MIN;

/// Options of [`PacketSocket::open`](super::PacketSocket::open).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicConfig {
    /// Refuse interfaces whose MTU is below this. The default is the MTU the longest MXoE
    /// frame needs, so no frame the engine builds can be refused by the NIC.
    pub min_mtu: u32,
    /// Receive ring slots wanted (rounded up to whole ring blocks).
    pub rx_frames: u32,
    /// Transmit ring slots wanted (rounded up to whole ring blocks). A batch larger than
    /// this is still sent, in several syscalls.
    pub tx_frames: u32,
    /// Hand frames straight to the driver, skipping the qdisc layer (PACKET_QDISC_BYPASS).
    /// Ignored on kernels without it. Bypassed frames are not seen by capture tools on the
    /// sending host.
    pub qdisc_bypass: bool,
    /// Put the interface in promiscuous mode while the socket is open, so frames addressed
    /// to guests' virtual MACs reach dom0 on NICs that filter unicast in hardware.
    pub promiscuous: bool,
    /// Longest time a send or flush waits for the kernel to free transmit slots before it
    /// fails with [`NicError::TxStalled`].
    pub tx_timeout: Duration,
}

impl Default for NicConfig {
    fn default() -> Self {
        Self {
            min_mtu: MXOE_MTU_MIN,
            rx_frames: 1024,
            tx_frames: 512,
            qdisc_bypass: true,
            promiscuous: false,
            tx_timeout: Duration::from_secs(1),
        }
    }
}

/// Most slots one ring may ask for; bounds the memory a configuration can pin.
pub(crate) const RING_FRAMES_MAX: u32 = 1 << 16;

impl NicConfig {
    /// Check the values that do not depend on the interface.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.rx_frames == 0 || self.rx_frames > RING_FRAMES_MAX {
            return Err(NicError::InvalidConfig(
                "rx_frames must be within 1..=65536",
            ));
        }
        if self.tx_frames == 0 || self.tx_frames > RING_FRAMES_MAX {
            return Err(NicError::InvalidConfig(
                "tx_frames must be within 1..=65536",
            ));
        }
        if self.tx_timeout.is_zero() {
            return Err(NicError::InvalidConfig("tx_timeout must be positive"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_needs_mxoe_mtu() {
        let cfg = NicConfig::default();
        cfg.validate().unwrap();
        assert_eq!(cfg.min_mtu, 4130);
    }

    #[test]
    fn zero_or_huge_rings_are_refused() {
        for (rx, tx) in [
            (0, 1),
            (1, 0),
            (RING_FRAMES_MAX + 1, 1),
            (1, RING_FRAMES_MAX + 1),
        ] {
            let cfg = NicConfig {
                rx_frames: rx,
                tx_frames: tx,
                ..NicConfig::default()
            };
            assert!(
                matches!(cfg.validate(), Err(NicError::InvalidConfig(_))),
                "{rx} {tx}"
            );
        }
    }

    #[test]
    fn zero_timeout_is_refused() {
        let cfg = NicConfig {
            tx_timeout: Duration::ZERO,
            ..NicConfig::default()
        };
        assert!(matches!(cfg.validate(), Err(NicError::InvalidConfig(_))));
    }
}

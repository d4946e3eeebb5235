//! NIC I/O of the backend: MXoE frames in and out of one Ethernet interface through an
//! AF_PACKET socket with memory-mapped receive and transmit rings.
//!
//! [`PacketSocket`] is bound to one interface and to ethertype 0x86DF, so the kernel hands
//! it MXoE frames only. Both directions go through rings shared with the kernel:
//!
//! - receive: the kernel copies each frame into a ring slot and flips the slot's status
//!   word to "user"; [`PacketSocket::recv`] walks the ready slots, lends each frame to a
//!   closure (no copy) and hands the slot back. Draining costs no syscall.
//! - transmit: [`PacketSocket::send`] copies a frame into the next free slot and marks it
//!   "send request"; [`PacketSocket::flush`] makes one `send()` call for everything queued.
//!
//! # Why TPACKET_V2 (frame slots) and not TPACKET_V3 (blocks)
//!
//! V3 packs many frames into a block and gives the block to user space only when it is
//! full or when a retire timer (millisecond granularity) fires. That is ideal for capture,
//! but a lone small frame (an MX TINY message, an ack) would wait up to the timer: the
//! latency floor becomes a millisecond instead of microseconds. V2 hands over every slot
//! as soon as the frame is in it, and a reader that finds several ready slots drains them
//! all in one pass, so bursts of large frames (MEDIUM fragments, PULL replies) are still
//! batched without syscalls. V2 costs memory instead: every slot is sized for the largest
//! frame (MTU + headers). With a 9000-byte MTU, 1024 slots take about 9 MiB, which dom0
//! can afford for one NIC. The kernel also implements the transmit ring with fixed slots,
//! and one socket has one ring version, so V2 serves both directions.
//!
//! # Polling on few cores
//!
//! Busy-polling gives the best latency only while every poller owns a core: with more
//! spinning threads than cores they preempt each other and the latency collapses to the
//! scheduler's time slice. [`PacketSocket::poll_spin_then_block`] therefore spins for a
//! bounded budget and then sleeps in `ppoll` until the kernel signals a frame.
//!
//! # Trust
//!
//! The ring memory is shared with the kernel, which is trusted, but its status words and
//! lengths are still checked before use: a slot whose length or offset does not fit inside
//! the slot is skipped and counted, never used to index out of the ring.
//!
//! The other modules are tools around the socket: [`netns`] runs code in a network
//! namespace, [`testbed`] builds a veth pair across two namespaces, and [`baseline`]
//! measures raw AF_PACKET ping-pong latency and streaming bandwidth on such a pair.

mod config;
mod error;
mod geometry;
mod ring;
mod socket;
mod stats;
mod sys;

pub mod baseline;
pub mod netns;
pub mod testbed;

pub use config::NicConfig;
pub use error::{NicError, Result};
pub use socket::PacketSocket;
pub use stats::NicStats;

/// Ethertype the socket is bound to: MXoE.
pub const ETHERTYPE: u16 = xmx_wire::mxoe::ETHERTYPE;
/// Length of an Ethernet header without VLAN tag: the shortest frame [`PacketSocket::send`]
/// accepts.
pub const ETH_HEADER_LEN: usize = xmx_wire::mxoe::ETH_HEADER_LEN;
/// Smallest MTU that carries every MXoE frame: the default of [`NicConfig::min_mtu`].
pub const MXOE_MTU_MIN: u32 = xmx_wire::mxoe::MTU_MIN as u32;

//! xmx-mx: the MX protocol core, sans-IO.
//!
//! The reliability and matching logic of the MX library as pure state
//! machines, in the style of quinn-proto: they take decoded frames, the
//! application's requests and the current time as inputs, and return frames to
//! send, completions and timer deadlines. Nothing here touches a socket, a
//! thread or a clock, so every rule is testable deterministically.
//!
//! - [`Endpoint`]: one MX endpoint: connect handshake and sessions, library
//!   sequence numbers, piggybacked and explicit acks, retransmission with
//!   backoff and a retry limit, NACKs, MEDIUM reassembly, matching, LARGE
//!   rendezvous bookkeeping.
//! - [`matching`]: the receive-side matching engine on its own.
//! - [`medium`]: MEDIUM fragmentation and reassembly.
//! - [`frame`]: the frames, field for field as the MXoE wire carries them.
//! - [`seqnum`], [`status`], [`class`], [`config`], [`time`]: the vocabulary.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod class;
pub mod config;
mod endpoint;
pub mod frame;
pub mod matching;
pub mod medium;
mod partner;
pub mod seqnum;
pub mod status;
pub mod time;

pub use class::{MessageClass, MEDIUM_MAX, SMALL_MAX, TINY_MAX};
pub use config::{Config, DEFAULT_RESEND_DELAY};
pub use endpoint::{
    Endpoint, EndpointAddr, EndpointEvent, Error, InboundId, ProbeInfo, PullNeeded, RecvDone,
    RequestId, UnexpectedArrival, CLOSE_SETTLE_MAX,
};
pub use frame::{Body, Frame, PeerAddr, RdmaWindow};
pub use seqnum::Seqnum;
pub use status::{ConnectStatus, NackType, Status};
pub use time::Instant;

//! Talking to the guest daemon `xmx-frontd`: its request protocol ([`proto`]) and the
//! application's client ([`client`]).

pub mod client;
pub mod proto;

pub use client::FrontdClient;
pub use proto::{ErrorReply, FrontdBoardInfo, FrontdMessage, FrontdReply, FrontdRequest, Notice};

//! Protocol tunables, with Open-MX's defaults and the MX environment knobs that set them.

use std::time::Duration;

/// Open-MX acks at most 64 times a second per partner when no traffic flows back.
pub const DEFAULT_ACK_DELAY: Duration = Duration::from_micros(15_625);
/// Open-MX resends twice a second.
pub const DEFAULT_RESEND_DELAY: Duration = Duration::from_millis(500);
/// Open-MX's default resend budget (`OMX_RESENDS_MAX`, MX's `MX_MAX_RETRIES`).
pub const DEFAULT_MAX_RETRIES: u32 = 1000;
/// Longest wait between two retransmissions by default: Open-MX's constant resend
/// delay, so the default budget is Open-MX's too. 1000 resends at 2 per second fail a
/// request to a silent partner after about 500 s (8 minutes and 20 s), which is the
/// default bound of every send and connect; `mx_set_request_timeout` (or
/// [`Config::request_timeout`]) sets a shorter one. A backoff to seconds would stretch the
/// same budget to half an hour.
pub const DEFAULT_RESEND_DELAY_MAX: Duration = DEFAULT_RESEND_DELAY;
/// Open-MX acks immediately once this many messages wait for an ack
/// (`OMX_NOTACKED_MAX`, MX's `MX_IMM_ACK`).
pub const DEFAULT_IMM_ACK_THRESHOLD: u16 = 4;
/// Messages in flight per partner by default. A receiving endpoint queues at
/// most 128 MEDIUM fragments (the slots of a guest's event ring) for all its
/// partners together, and a MEDIUM is at most 8 fragments: 16 messages of
/// the largest MEDIUM fill that queue and no more, so one streaming partner
/// never overflows it, while 16 stays twice the 8 that the default
/// immediate-ack threshold needs to keep acks flowing without the ack delay.
/// MX counts this window in messages, as here; a wire-compatible peer only
/// ever sees fewer frames in flight than the protocol allows.
pub const DEFAULT_SEND_WINDOW: u16 = 16;
/// Unexpected LARGE messages up to this size are pulled before their receive by
/// default: where the pull's round trip is a large share of the message's time
/// (at 1 MiB it is a few percent, and the copy out costs more than it saves).
pub const DEFAULT_EARLY_PULL_MAX: u32 = 256 << 10;

/// Tunables of an [`Endpoint`](crate::Endpoint).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// How long received messages may wait for an ack when no message flows
    /// back to piggyback it on.
    pub ack_delay: Duration,
    /// Messages received but not yet acked that force an explicit ack at once.
    /// 1 acks every message immediately.
    pub imm_ack_threshold: u16,
    /// Wait before the first retransmission of an unacked message or connect.
    pub resend_delay: Duration,
    /// Growth factor of the wait between successive retransmissions.
    pub resend_backoff: u32,
    /// Upper bound of the wait between retransmissions.
    pub resend_delay_max: Duration,
    /// Retransmissions after the first transmission; one more unanswered
    /// timeout fails every pending request to that partner with `Timeout`.
    pub max_retries: u32,
    /// Optional deadline for every send and connect, counted from submission;
    /// `None` leaves only the retry budget.
    pub request_timeout: Option<Duration>,
    /// How long an acknowledged LARGE send waits for the receiver to pull it
    /// and notify; `None` means the [retry budget](Self::retry_budget). A
    /// receiver that does not post a matching receive in time fails the send
    /// with `Timeout`, as does one that died after acking the RNDV.
    pub rendezvous_timeout: Option<Duration>,
    /// Bytes of unexpected (not yet matched) message data kept; a message that
    /// would exceed it is refused and recovered by the sender's retransmission.
    pub unexpected_bytes_max: usize,
    /// Out-of-order frames kept per partner while an earlier one is missing.
    pub early_frames_max: usize,
    /// LARGE messages of at most this many bytes that arrive before their receive is
    /// posted are pulled at once into the library's memory (while the unexpected
    /// messages hold at most half of [`unexpected_bytes_max`](Self::unexpected_bytes_max),
    /// so eager messages keep the other half) and copied out when a
    /// receive takes them: the pull's round trip overlaps the application's work
    /// instead of following the post. The sender still completes only once a receive
    /// took the message (its NOTIFY waits for the match), as MX's `mx_issend` needs.
    /// 0 pulls only for a posted receive, as MX does.
    pub early_pull_max: u32,
    /// Sequenced messages per partner in flight (sent, not yet acked) before
    /// further sends wait; at most the protocol's throttle window. A receiver
    /// whose queue of MEDIUM fragments is smaller than what a sender has in
    /// flight drops fragments, and each drop costs a resend delay: transports
    /// size this to the receive queue. Never below twice
    /// [`imm_ack_threshold`](Self::imm_ack_threshold), so acks always flow.
    pub send_window: u16,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            ack_delay: DEFAULT_ACK_DELAY,
            imm_ack_threshold: DEFAULT_IMM_ACK_THRESHOLD,
            resend_delay: DEFAULT_RESEND_DELAY,
            resend_backoff: 2,
            resend_delay_max: DEFAULT_RESEND_DELAY_MAX,
            max_retries: DEFAULT_MAX_RETRIES,
            request_timeout: None,
            rendezvous_timeout: None,
            unexpected_bytes_max: 64 << 20,
            early_frames_max: 1024,
            early_pull_max: DEFAULT_EARLY_PULL_MAX,
            send_window: DEFAULT_SEND_WINDOW,
        }
    }
}

impl Config {
    /// Applies the environment knobs MX and Open-MX users know, read through
    /// `lookup` (e.g. `|k| std::env::var(k).ok()`): `OMX_RESENDS_MAX` or else
    /// `MX_MAX_RETRIES` set [`max_retries`](Self::max_retries);
    /// `OMX_NOTACKED_MAX` or else `MX_IMM_ACK` set
    /// [`imm_ack_threshold`](Self::imm_ack_threshold); `XMX_SEND_WINDOW` sets
    /// [`send_window`](Self::send_window); `XMX_EARLY_PULL_KIB` sets
    /// [`early_pull_max`](Self::early_pull_max) in KiB (0: never). Unparsable
    /// values are ignored with a warning.
    pub fn with_env(mut self, lookup: impl Fn(&str) -> Option<String>) -> Self {
        let pick = |a: &str, b: &str| {
            lookup(a)
                .map(|v| (a.to_owned(), v))
                .or_else(|| lookup(b).map(|v| (b.to_owned(), v)))
        };
        if let Some((name, v)) = pick("OMX_RESENDS_MAX", "MX_MAX_RETRIES") {
            match v.trim().parse::<u32>() {
                Ok(n) => self.max_retries = n,
                Err(_) => tracing::warn!(%name, value = %v, "ignoring unparsable retry count"),
            }
        }
        if let Some((name, v)) = pick("OMX_NOTACKED_MAX", "MX_IMM_ACK") {
            match v.trim().parse::<u16>() {
                Ok(n) => self.imm_ack_threshold = n,
                Err(_) => tracing::warn!(%name, value = %v, "ignoring unparsable ack threshold"),
            }
        }
        if let Some(v) = lookup("XMX_SEND_WINDOW") {
            match v.trim().parse::<u16>() {
                Ok(n) => self.send_window = n,
                Err(_) => tracing::warn!(value = %v, "ignoring unparsable XMX_SEND_WINDOW"),
            }
        }
        if let Some(v) = lookup("XMX_EARLY_PULL_KIB") {
            match v.trim().parse::<u32>() {
                Ok(kib) => self.early_pull_max = kib.saturating_mul(1024),
                Err(_) => tracing::warn!(value = %v, "ignoring unparsable XMX_EARLY_PULL_KIB"),
            }
        }
        self
    }

    /// The send window in force: [`send_window`](Self::send_window) raised to
    /// twice the immediate-ack threshold and capped by the protocol's window.
    pub fn effective_send_window(&self) -> u16 {
        self.send_window
            .max(self.imm_ack_threshold.saturating_mul(2))
            .clamp(1, crate::seqnum::THROTTLE_WINDOW)
    }

    /// Wait after the `transmissions`-th transmission before the next one:
    /// `resend_delay * resend_backoff^(transmissions-1)`, capped at
    /// `resend_delay_max` (and never below `resend_delay`).
    pub fn resend_wait(&self, transmissions: u32) -> Duration {
        let cap = self.resend_delay_max.max(self.resend_delay);
        let mut wait = self.resend_delay;
        let factor = self.resend_backoff.max(1);
        for _ in 1..transmissions {
            if wait >= cap || factor == 1 {
                break;
            }
            wait = wait.saturating_mul(factor);
        }
        wait.min(cap)
    }

    /// The longest a request can stay unacknowledged before it fails: the sum
    /// of every wait of the retry budget (or the request timeout if shorter).
    pub fn retry_budget(&self) -> Duration {
        let mut total = Duration::ZERO;
        for n in 1..=self.max_retries.saturating_add(1) {
            let w = self.resend_wait(n);
            total = total.saturating_add(w);
            if w >= self.resend_delay_max.max(self.resend_delay) {
                // The rest of the waits are all the cap.
                let left = self.max_retries.saturating_add(1) - n;
                total = total.saturating_add(w.saturating_mul(left));
                break;
            }
        }
        match self.request_timeout {
            Some(t) => total.min(t),
            None => total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn defaults_are_open_mx() {
        let c = Config::default();
        assert_eq!(c.resend_delay, Duration::from_millis(500));
        assert_eq!(c.max_retries, 1000);
        assert_eq!(c.imm_ack_threshold, 4);
        assert_eq!(c.ack_delay, Duration::from_secs(1) / 64);
        assert_eq!(c.effective_send_window(), DEFAULT_SEND_WINDOW);
        // A silent partner is given up after 1001 waits of 500 ms, as in Open-MX.
        assert_eq!(c.retry_budget(), Duration::from_millis(500_500));
    }

    #[test]
    fn backoff_doubles_then_caps() {
        let c = Config {
            resend_delay: Duration::from_millis(100),
            resend_delay_max: Duration::from_millis(700),
            ..Config::default()
        };
        let waits: Vec<u64> = (1..=6)
            .map(|n| c.resend_wait(n).as_millis() as u64)
            .collect();
        assert_eq!(waits, vec![100, 200, 400, 700, 700, 700]);
        assert_eq!(c.resend_wait(0), Duration::from_millis(100));
        assert_eq!(c.resend_wait(u32::MAX), Duration::from_millis(700));
    }

    #[test]
    fn budget_sums_all_waits() {
        let c = Config {
            resend_delay: Duration::from_millis(100),
            resend_delay_max: Duration::from_millis(700),
            max_retries: 5,
            ..Config::default()
        };
        // Six transmissions, six waits: 100 + 200 + 400 + 700 + 700 + 700.
        assert_eq!(c.retry_budget(), Duration::from_millis(2800));
        let capped = Config {
            request_timeout: Some(Duration::from_millis(300)),
            ..c
        };
        assert_eq!(capped.retry_budget(), Duration::from_millis(300));
    }

    #[test]
    fn environment_knobs() {
        let env: HashMap<&str, &str> = [("MX_MAX_RETRIES", "7"), ("MX_IMM_ACK", "1")].into();
        let c = Config::default().with_env(|k| env.get(k).map(|v| v.to_string()));
        assert_eq!((c.max_retries, c.imm_ack_threshold), (7, 1));

        let env: HashMap<&str, &str> = [
            ("MX_MAX_RETRIES", "7"),
            ("OMX_RESENDS_MAX", "9"),
            ("MX_IMM_ACK", "x"),
        ]
        .into();
        let c = Config::default().with_env(|k| env.get(k).map(|v| v.to_string()));
        assert_eq!((c.max_retries, c.imm_ack_threshold), (9, 4));

        let env: HashMap<&str, &str> = [("XMX_SEND_WINDOW", " 64 ")].into();
        let c = Config::default().with_env(|k| env.get(k).map(|v| v.to_string()));
        assert_eq!(c.send_window, 64);
        let env: HashMap<&str, &str> = [("XMX_SEND_WINDOW", "-1")].into();
        let c = Config::default().with_env(|k| env.get(k).map(|v| v.to_string()));
        assert_eq!(c.send_window, DEFAULT_SEND_WINDOW);

        let env: HashMap<&str, &str> = [("XMX_EARLY_PULL_KIB", "0")].into();
        let c = Config::default().with_env(|k| env.get(k).map(|v| v.to_string()));
        assert_eq!(c.early_pull_max, 0);
        let env: HashMap<&str, &str> = [("XMX_EARLY_PULL_KIB", "64")].into();
        let c = Config::default().with_env(|k| env.get(k).map(|v| v.to_string()));
        assert_eq!(c.early_pull_max, 64 << 10);
    }
}

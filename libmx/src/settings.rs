//! The environment knobs MX users know, read once at `mx_init`.

use std::time::Duration;

use xmx_mx::Config;

/// Which transport carries the frames (`XMX_TRANSPORT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TransportKind {
    /// In-process delivery between the endpoints of this process.
    Loopback,
    /// The backend's engine in this process over an AF_PACKET interface.
    Native,
    /// A Xen guest's shared rings to the dom0 backend.
    Xen,
}

impl TransportKind {
    /// Parses the `XMX_TRANSPORT` value.
    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "loopback" | "self" => Some(TransportKind::Loopback),
            "native" => Some(TransportKind::Native),
            "xen" => Some(TransportKind::Xen),
            _ => None,
        }
    }
}

/// Library-wide settings.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// `MX_ERRORS_ARE_FATAL` (default 1): 0 makes `MX_ERRORS_RETURN` the
    /// default handler.
    pub(crate) errors_are_fatal: bool,
    /// `MX_VERBOSE`: log level (0 none; 1 info; 2 debug; 3 trace).
    pub(crate) verbose: Option<u32>,
    /// `MX_RCACHE` (default 1 here): keep LARGE regions registered across
    /// messages. MX and Open-MX default to 0 because their cache pins the
    /// application's own pages, which a later free can invalidate; ours caches
    /// granted windows the data is copied through, so it is never stale and
    /// is on unless `MX_RCACHE=0`.
    pub(crate) rcache: bool,
    /// `MX_ZOMBIE_SEND`: eager sends that may complete before their ack
    /// (0: every send waits for its ack).
    pub(crate) zombie_max: usize,
    /// Protocol tunables (`MX_MAX_RETRIES`, `MX_IMM_ACK`).
    pub(crate) config: Config,
    /// `XMX_TRANSPORT` (default loopback).
    pub(crate) transport: TransportKind,
    /// `XMX_SPIN_US`: how long a wait spins before it sleeps.
    pub(crate) spin: Duration,
    /// `XMX_STALL_REPORT_MS`: an endpoint with requests pending and none
    /// completed for this long has its state logged (a warning), once per
    /// stall. Off unless set: a diagnosis aid, not a timeout.
    pub(crate) stall_report: Option<Duration>,
}

/// Default number of sends allowed to complete before their ack.
pub(crate) const DEFAULT_ZOMBIE_MAX: usize = 512;

impl Settings {
    /// Reads the settings through `lookup` (e.g. `|k| std::env::var(k).ok()`).
    /// An unusable `XMX_TRANSPORT` is an error; other unusable values keep
    /// their default with a warning.
    pub(crate) fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        fn int(name: &str, v: Option<String>) -> Option<i64> {
            let v = v?;
            match v.trim().parse::<i64>() {
                Ok(n) => Some(n),
                Err(_) => {
                    tracing::warn!(%name, value = %v, "ignoring unparsable value");
                    None
                }
            }
        }
        let transport = match lookup("XMX_TRANSPORT") {
            None => TransportKind::Loopback,
            Some(v) => TransportKind::parse(&v)
                .ok_or_else(|| format!("XMX_TRANSPORT={v}: expected loopback, native or xen"))?,
        };
        let verbose = lookup("MX_VERBOSE").map(|v| v.trim().parse::<u32>().unwrap_or(1));
        Ok(Settings {
            errors_are_fatal: !matches!(
                int("MX_ERRORS_ARE_FATAL", lookup("MX_ERRORS_ARE_FATAL")),
                Some(0)
            ),
            verbose,
            rcache: int("MX_RCACHE", lookup("MX_RCACHE")).is_none_or(|n| n != 0),
            zombie_max: int("MX_ZOMBIE_SEND", lookup("MX_ZOMBIE_SEND"))
                .map_or(DEFAULT_ZOMBIE_MAX, |n| n.max(0) as usize),
            config: Config::default().with_env(&lookup),
            transport,
            spin: Duration::from_micros(
                int("XMX_SPIN_US", lookup("XMX_SPIN_US"))
                    .map_or(crate::doorbell::DEFAULT_SPIN.as_micros() as i64, |n| {
                        n.clamp(0, 1_000_000)
                    }) as u64,
            ),
            stall_report: int("XMX_STALL_REPORT_MS", lookup("XMX_STALL_REPORT_MS"))
                .filter(|&n| n > 0)
                .map(|n| Duration::from_millis(n as u64)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(pairs: &[(&str, &str)]) -> Result<Settings, String> {
        let env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_lookup(|k| env.get(k).cloned())
    }

    #[test]
    fn defaults() {
        let s = with(&[]).unwrap();
        assert!(s.errors_are_fatal);
        assert!(s.rcache);
        assert_eq!(s.stall_report, None);
        assert_eq!(s.zombie_max, DEFAULT_ZOMBIE_MAX);
        assert_eq!(s.transport, TransportKind::Loopback);
        assert_eq!(s.verbose, None);
    }

    #[test]
    fn knobs() {
        let s = with(&[
            ("MX_ERRORS_ARE_FATAL", "0"),
            ("MX_RCACHE", "0"),
            ("XMX_STALL_REPORT_MS", "1500"),
            ("MX_ZOMBIE_SEND", "0"),
            ("MX_MAX_RETRIES", "3"),
            ("MX_IMM_ACK", "1"),
            ("MX_VERBOSE", ""),
            ("XMX_TRANSPORT", "Xen"),
        ])
        .unwrap();
        assert!(!s.errors_are_fatal);
        assert!(!s.rcache);
        assert_eq!(s.stall_report, Some(Duration::from_millis(1500)));
        assert_eq!(s.zombie_max, 0);
        assert_eq!(s.config.max_retries, 3);
        assert_eq!(s.config.imm_ack_threshold, 1);
        assert_eq!(s.verbose, Some(1));
        assert_eq!(s.transport, TransportKind::Xen);
        assert!(with(&[("XMX_TRANSPORT", "carrier-pigeon")]).is_err());
        assert!(
            with(&[("MX_ERRORS_ARE_FATAL", "yes")])
                .unwrap()
                .errors_are_fatal
        );
    }
}

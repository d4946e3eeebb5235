//! CPU seconds per gigabyte moved, counting every process a setup needs: the measuring
//! programs (the bench's children, from `getrusage(RUSAGE_CHILDREN)` once reaped) and the
//! daemons that carry their messages (backends and guest frontends, from
//! `/proc/PID/stat`). Sampled around a whole stream cell, so start-up and warm-up are in
//! it, and divided by every byte the cell moved, warm-up included.

use serde::{Deserialize, Serialize};

/// What a daemon is, for the breakdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DaemonRole {
    /// xmx-backd: the backend in dom0.
    Backend,
    /// xmx-frontd: a guest's daemon.
    Frontend,
    /// xmx-simhv and xmxd: the simulated hypervisor and the control plane; reported, not
    /// counted in the total (real Xen does this work in the hypervisor and the toolstack).
    Other,
}

impl DaemonRole {
    /// The role of a simulated cluster's daemon by its recorded name.
    pub fn of(name: &str) -> DaemonRole {
        if name == "xmx-backd" {
            DaemonRole::Backend
        } else if name.starts_with("xmx-frontd") {
            DaemonRole::Frontend
        } else {
            DaemonRole::Other
        }
    }
}

/// CPU time of every process of a measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuCost {
    /// Bytes moved while sampled (warm-up included).
    pub bytes: u64,
    /// CPU seconds of the measuring programs (the applications).
    pub apps_s: f64,
    /// CPU seconds of the backends.
    pub backends_s: f64,
    /// CPU seconds of the guests' frontends.
    pub frontends_s: f64,
    /// CPU seconds of the simulated hypervisor and xmxd (not in the total).
    pub other_s: f64,
    /// (apps + backends + frontends) per 10^9 bytes; `null` when no byte moved.
    pub cpu_s_per_gb: Option<f64>,
}

/// CPU counters at one moment, nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Reaped children of this process.
    pub children: u64,
    /// Backends.
    pub backends: u64,
    /// Frontends.
    pub frontends: u64,
    /// Others.
    pub other: u64,
}

/// User + system time of process `pid` so far, from `/proc/PID/stat`; `None` when it is
/// gone or the file is unreadable.
pub fn proc_cpu_ns(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_cpu_ns(&stat, clock_ticks())
}

/// utime + stime of a `/proc/PID/stat` line, in nanoseconds, `ticks` clock ticks a second.
pub fn stat_cpu_ns(stat: &str, ticks: u64) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses: fields are counted from
    // the last ')'. utime and stime are fields 14 and 15, so the 12th and 13th after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let ticks = ticks.max(1);
    Some((utime + stime).saturating_mul(1_000_000_000) / ticks)
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf only reads a configuration value; no memory is passed.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(t).ok().filter(|&t| t > 0).unwrap_or(100)
}

/// User + system time of this process's reaped children so far, nanoseconds.
pub fn children_cpu_ns() -> u64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one `struct rusage` to the pointer, which points to a
    // properly sized and aligned (zeroed) value we own; RUSAGE_CHILDREN is always valid.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, usage.as_mut_ptr()) };
    if rc != 0 {
        return 0;
    }
    // SAFETY: getrusage succeeded, so the value is initialised (it was zeroed anyway).
    let usage = unsafe { usage.assume_init() };
    let ns = |tv: libc::timeval| tv.tv_sec as u64 * 1_000_000_000 + tv.tv_usec as u64 * 1000;
    ns(usage.ru_utime) + ns(usage.ru_stime)
}

/// Take a snapshot: this process's children and `daemons`.
pub fn snapshot(daemons: &[(DaemonRole, i32)]) -> Snapshot {
    let mut s = Snapshot {
        children: children_cpu_ns(),
        ..Snapshot::default()
    };
    for &(role, pid) in daemons {
        let ns = proc_cpu_ns(pid).unwrap_or(0);
        match role {
            DaemonRole::Backend => s.backends += ns,
            DaemonRole::Frontend => s.frontends += ns,
            DaemonRole::Other => s.other += ns,
        }
    }
    s
}

impl CpuCost {
    /// The cost between two snapshots for `bytes` moved.
    pub fn between(before: Snapshot, after: Snapshot, bytes: u64) -> CpuCost {
        let s = |a: u64, b: u64| a.saturating_sub(b) as f64 / 1e9;
        let apps_s = s(after.children, before.children);
        let backends_s = s(after.backends, before.backends);
        let frontends_s = s(after.frontends, before.frontends);
        CpuCost {
            bytes,
            apps_s,
            backends_s,
            frontends_s,
            other_s: s(after.other, before.other),
            cpu_s_per_gb: (bytes > 0)
                .then(|| (apps_s + backends_s + frontends_s) / (bytes as f64 / 1e9)),
        }
    }

    /// apps + backends + frontends.
    pub fn total_s(&self) -> f64 {
        self.apps_s + self.backends_s + self.frontends_s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_the_command_name() {
        // A command name with a space and a parenthesis, as a process may name itself.
        let line =
            "4242 (xmx (front) d) S 1 4242 4242 0 -1 4194560 1093 0 0 0 250 130 0 0 20 0 3 0 1 2 3";
        assert_eq!(stat_cpu_ns(line, 100), Some(3_800_000_000));
        assert_eq!(stat_cpu_ns(line, 1000), Some(380_000_000));
        assert_eq!(stat_cpu_ns("4242 (x) S 1 2", 100), None);
        assert_eq!(stat_cpu_ns("garbage", 100), None);
        assert_eq!(stat_cpu_ns("", 100), None);
    }

    #[test]
    fn this_process_has_a_stat() {
        let me = std::process::id() as i32;
        let mut x = 0u64;
        let t0 = std::time::Instant::now();
        while t0.elapsed() < std::time::Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(proc_cpu_ns(me).is_some());
        assert_eq!(proc_cpu_ns(-1), None);
    }

    #[test]
    fn roles_and_costs() {
        assert_eq!(DaemonRole::of("xmx-backd"), DaemonRole::Backend);
        assert_eq!(DaemonRole::of("xmx-frontd-g3"), DaemonRole::Frontend);
        assert_eq!(DaemonRole::of("xmxd"), DaemonRole::Other);
        assert_eq!(DaemonRole::of("xmx-simhv"), DaemonRole::Other);
        let before = Snapshot {
            children: 1_000_000_000,
            backends: 0,
            frontends: 500_000_000,
            other: 0,
        };
        let after = Snapshot {
            children: 1_500_000_000,
            backends: 250_000_000,
            frontends: 750_000_000,
            other: 100_000_000,
        };
        let c = CpuCost::between(before, after, 2_000_000_000);
        assert_eq!(
            (c.apps_s, c.backends_s, c.frontends_s, c.other_s),
            (0.5, 0.25, 0.25, 0.1)
        );
        assert_eq!(c.total_s(), 1.0);
        assert_eq!(c.cpu_s_per_gb, Some(0.5));
        assert_eq!(CpuCost::between(after, before, 0).cpu_s_per_gb, None);
        assert_eq!(CpuCost::between(after, before, 1).apps_s, 0.0);
    }
}

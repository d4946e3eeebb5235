//! The results of a run ([`Report`], serialised as the `--json` document), the ratios
//! between setups, and the machine they were measured on.

use serde::{Deserialize, Serialize};

use super::stats::{Bandwidth, Latency};

/// Version of the JSON document; bumped on any incompatible change.
pub const SCHEMA: &str = "xmx-bench/1";

/// Everything one `xmx bench` run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`SCHEMA`].
    pub schema: String,
    /// When the run started, UTC, RFC 3339.
    pub date: String,
    /// The command line.
    pub command: String,
    /// Whether this was a `--quick` run.
    pub quick: bool,
    /// The machine.
    pub machine: Machine,
    /// The link of the network setups (`null` when none could be made).
    pub link: Option<LinkInfo>,
    /// Message sizes, bytes, ascending.
    pub sizes: Vec<u64>,
    /// One entry per requested setup, in registry order.
    pub setups: Vec<SetupResult>,
    /// Ratios between requested setups.
    pub ratios: Vec<Ratio>,
}

/// What `xmx bench` reports: the per-size figures ([`Report`], whose fields it carries at
/// the top level), the guests' cluster and the `guest-scaling` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// The per-size figures.
    #[serde(flatten)]
    pub report: Report,
    /// The simulated cluster of the guest setups (`null` when none ran).
    pub guests: Option<GuestsInfo>,
    /// N guests per host (`null` when not requested).
    pub scaling: Option<super::scaling::ScalingReport>,
}

/// The simulated cluster the guest setups ran on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuestsInfo {
    /// `sim:NAME`.
    pub kind: String,
    /// Guests on each of its hosts.
    pub guests_per_host: usize,
    /// Made (and removed) by this run, rather than named with `--cluster`.
    pub made_for_run: bool,
}

/// Where the figures come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// Online CPUs.
    pub nproc: usize,
    /// `model name` from /proc/cpuinfo.
    pub cpu_model: String,
    /// Kernel release.
    pub kernel: String,
}

/// The link the network setups used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkInfo {
    /// `veth` or `sim:NAME`.
    pub kind: String,
    /// MTU.
    pub mtu: u32,
}

/// Whether a setup ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetupStatus {
    /// It ran (cells may still carry errors).
    #[serde(rename = "ok")]
    Ok,
    /// It cannot run here; `reason` says why.
    #[serde(rename = "n/a")]
    NotAvailable,
}

/// The results of one setup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetupResult {
    /// Registry name.
    pub name: String,
    /// What it is.
    pub description: String,
    /// Whether it ran.
    pub status: SetupStatus,
    /// Why it did not (`null` when it ran).
    pub reason: Option<String>,
    /// One per size when it ran, none otherwise.
    pub cells: Vec<Cell>,
}

impl SetupResult {
    /// The cell of `size`, if measured.
    pub fn cell(&self, size: u64) -> Option<&Cell> {
        self.cells.iter().find(|c| c.size == size)
    }
}

/// The figures of one setup at one size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// Message size, bytes.
    pub size: u64,
    /// Ping-pong figures (`null` if it failed).
    pub pingpong: Option<Latency>,
    /// Stream figures (`null` if it failed).
    pub stream: Option<Bandwidth>,
    /// What failed, if anything.
    pub error: Option<String>,
}

/// `numerator / denominator` of two setups, per size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ratio {
    /// `numerator/denominator`.
    pub name: String,
    /// Setup on top.
    pub numerator: String,
    /// Setup below.
    pub denominator: String,
    /// One per size.
    pub cells: Vec<RatioCell>,
}

/// A ratio at one size; `null` where either side has no figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RatioCell {
    /// Message size, bytes.
    pub size: u64,
    /// Median latency of the numerator over that of the denominator (above 1: slower).
    pub latency: Option<f64>,
    /// Bandwidth of the numerator over that of the denominator (below 1: slower).
    pub bandwidth: Option<f64>,
}

fn divide(num: Option<f64>, den: Option<f64>) -> Option<f64> {
    match (num, den) {
        (Some(n), Some(d)) if d > 0.0 && n.is_finite() && d.is_finite() => Some(n / d),
        _ => None,
    }
}

/// The ratio `numerator/denominator` at every size of `sizes`.
pub fn ratio(sizes: &[u64], numerator: &SetupResult, denominator: &SetupResult) -> Ratio {
    let cells = sizes
        .iter()
        .map(|&size| {
            let (n, d) = (numerator.cell(size), denominator.cell(size));
            let lat = |c: Option<&Cell>| c.and_then(|c| c.pingpong.as_ref()).map(|l| l.median_us);
            let bw = |c: Option<&Cell>| {
                c.and_then(|c| c.stream.as_ref())
                    .map(|b| b.mb_per_s)
                    .filter(|&v| v > 0.0)
            };
            RatioCell {
                size,
                latency: divide(lat(n), lat(d)),
                bandwidth: divide(bw(n), bw(d)),
            }
        })
        .collect();
    Ratio {
        name: format!("{}/{}", numerator.name, denominator.name),
        numerator: numerator.name.clone(),
        denominator: denominator.name.clone(),
        cells,
    }
}

/// Every ratio `(numerator, denominator)` of `pairs` whose two setups are in `setups`.
pub fn ratios(sizes: &[u64], setups: &[SetupResult], pairs: &[(String, String)]) -> Vec<Ratio> {
    let find = |name: &str| setups.iter().find(|s| s.name == name);
    pairs
        .iter()
        .filter_map(|(n, d)| Some(ratio(sizes, find(n)?, find(d)?)))
        .collect()
}

impl Machine {
    /// This machine.
    pub fn this() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "model name").then(|| v.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "unknown".into());
        Machine {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            kernel,
        }
    }
}

/// `secs` since the Unix epoch as an RFC 3339 UTC time.
pub fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (proleptic Gregorian calendar).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(name: &str, figures: &[(u64, f64, f64)]) -> SetupResult {
        SetupResult {
            name: name.into(),
            description: String::new(),
            status: SetupStatus::Ok,
            reason: None,
            cells: figures
                .iter()
                .map(|&(size, lat, bw)| Cell {
                    size,
                    pingpong: Some(Latency {
                        iters: 1,
                        warmup: 0,
                        median_us: lat,
                        p99_us: lat,
                        min_us: lat,
                        mean_us: lat,
                    }),
                    stream: Some(Bandwidth {
                        messages: 1,
                        bytes: size,
                        seconds: 1.0,
                        mb_per_s: bw,
                        msgs_per_s: 1.0,
                        cpu_s: 0.0,
                        cpu_s_per_gb: None,
                        cost: None,
                    }),
                    error: None,
                })
                .collect(),
        }
    }

    #[test]
    fn ratios_on_synthetic_figures() {
        let native = setup("native", &[(0, 12.0, 0.0), (4096, 20.0, 800.0)]);
        let afp = setup("afpacket", &[(0, 8.0, 0.0), (4096, 10.0, 1000.0)]);
        let r = ratio(&[0, 4096], &native, &afp);
        assert_eq!(r.name, "native/afpacket");
        assert_eq!(
            r.cells[0],
            RatioCell {
                size: 0,
                latency: Some(1.5),
                bandwidth: None
            }
        );
        assert_eq!(
            r.cells[1],
            RatioCell {
                size: 4096,
                latency: Some(2.0),
                bandwidth: Some(0.8)
            }
        );
    }

    #[test]
    fn missing_figures_give_no_ratio() {
        let mut tcp = setup("tcp", &[(64, 30.0, 100.0)]);
        let na = SetupResult {
            status: SetupStatus::NotAvailable,
            reason: Some("x".into()),
            cells: vec![],
            ..setup("native", &[])
        };
        let r = ratio(&[64, 128], &tcp, &na);
        assert!(r
            .cells
            .iter()
            .all(|c| c.latency.is_none() && c.bandwidth.is_none()));
        // A failed cell on one side, and a zero denominator.
        tcp.cells[0].stream = None;
        let zero = setup("afpacket", &[(64, 0.0, 50.0)]);
        let r = ratio(&[64], &tcp, &zero);
        assert_eq!(
            r.cells[0],
            RatioCell {
                size: 64,
                latency: None,
                bandwidth: None
            }
        );
    }

    #[test]
    fn only_pairs_of_present_setups() {
        let a = setup("a", &[(1, 2.0, 2.0)]);
        let b = setup("b", &[(1, 1.0, 4.0)]);
        let pairs = vec![
            ("a".to_owned(), "b".to_owned()),
            ("a".to_owned(), "c".to_owned()),
            ("b".to_owned(), "a".to_owned()),
        ];
        let rs = ratios(&[1], &[a, b], &pairs);
        let names: Vec<_> = rs.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["a/b", "b/a"]);
        assert_eq!(rs[0].cells[0].latency, Some(2.0));
        assert_eq!(rs[0].cells[0].bandwidth, Some(0.5));
        assert_eq!(rs[1].cells[0].latency, Some(0.5));
    }

    #[test]
    fn dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn status_spelling() {
        assert_eq!(
            serde_json::to_string(&SetupStatus::NotAvailable).unwrap(),
            "\"n/a\""
        );
        assert_eq!(serde_json::to_string(&SetupStatus::Ok).unwrap(), "\"ok\"");
    }
}

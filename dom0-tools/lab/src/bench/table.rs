//! The aligned text tables of a report: latency, then bandwidth with CPU cost; one row per
//! size, one column group per setup, then the ratio columns.

use std::fmt::Write;

use super::report::{BenchReport, Cell, Report, SetupStatus};
use super::scaling::{self, ScalingReport};

/// `4096` as `4 KiB`, `16777216` as `16 MiB`.
pub fn size_label(size: u64) -> String {
    match size {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{} MiB", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

fn figure(v: f64) -> String {
    match v {
        v if v >= 1000.0 => format!("{v:.0}"),
        v if v >= 100.0 => format!("{v:.1}"),
        v => format!("{v:.2}"),
    }
}

fn ratio_text(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

/// Rows of cells into aligned text: first column left-aligned, the others right-aligned.
fn align(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let width: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            let pad = width[c].saturating_sub(cell.chars().count());
            if c == 0 {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            } else {
                line.push_str(" | ");
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn table(
    report: &Report,
    title: &str,
    unit: &str,
    text: impl Fn(&Cell) -> Option<String>,
    ratio: impl Fn(&super::report::RatioCell) -> Option<f64>,
) -> String {
    // Ratios with an n/a side would be columns of dashes: the JSON keeps them, the table not.
    let ran = |name: &str| {
        report
            .setups
            .iter()
            .any(|s| s.name == name && s.status == SetupStatus::Ok)
    };
    let ratios: Vec<_> = report
        .ratios
        .iter()
        .filter(|r| ran(&r.numerator) && ran(&r.denominator))
        .collect();
    let mut rows = vec![];
    let mut header = vec!["size".to_owned()];
    header.extend(report.setups.iter().map(|s| s.name.clone()));
    header.extend(ratios.iter().map(|r| r.name.clone()));
    rows.push(header);
    let mut units = vec![String::new()];
    units.extend(report.setups.iter().map(|_| unit.to_owned()));
    units.extend(ratios.iter().map(|_| "ratio".to_owned()));
    rows.push(units);
    for (i, &size) in report.sizes.iter().enumerate() {
        let mut row = vec![size_label(size)];
        for s in &report.setups {
            row.push(match (s.status, s.cell(size)) {
                (SetupStatus::NotAvailable, _) => "n/a".into(),
                (SetupStatus::Ok, Some(c)) => text(c).unwrap_or_else(|| "error".into()),
                (SetupStatus::Ok, None) => "-".into(),
            });
        }
        row.extend(
            ratios
                .iter()
                .map(|r| ratio_text(r.cells.get(i).and_then(&ratio))),
        );
        rows.push(row);
    }
    format!("{title}\n{}", align(&rows))
}

/// The tables, then why setups were n/a and which cells failed; nothing when no size-by-size
/// setup was asked for (`--setups guest-scaling` alone), rather than tables of sizes with no
/// column.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    if report.setups.is_empty() {
        return out;
    }
    out.push_str(&table(
        report,
        "Half round-trip latency (ping-pong), microseconds",
        "median / p99",
        |c| {
            c.pingpong
                .as_ref()
                .map(|l| format!("{} / {}", figure(l.median_us), figure(l.p99_us)))
        },
        |r| r.latency,
    ));
    out.push('\n');
    out.push_str(&table(
        report,
        "Streaming bandwidth, MB/s (10^6 B/s), and CPU seconds per GB moved (sender + receiver)",
        "MB/s (CPU s/GB)",
        |c| {
            c.stream.as_ref().map(|b| match b.cpu_s_per_gb {
                Some(cpu) => format!("{} ({})", figure(b.mb_per_s), figure(cpu)),
                None => format!("{:.0} msg/s", b.msgs_per_s),
            })
        },
        |r| r.bandwidth,
    ));
    if report
        .setups
        .iter()
        .flat_map(|s| &s.cells)
        .any(|c| c.stream.as_ref().is_some_and(|b| b.cost.is_some()))
    {
        out.push('\n');
        out.push_str(&cpu_table(report));
    }
    out.push_str("\nRatios: latency is numerator/denominator of the medians (above 1: the numerator is slower);\n");
    out.push_str(
        "bandwidth is numerator/denominator of MB/s (below 1: the numerator is slower).\n",
    );
    for s in &report.setups {
        if let Some(reason) = &s.reason {
            let _ = writeln!(out, "{}: n/a ({reason})", s.name);
        }
        for c in &s.cells {
            if let Some(e) = &c.error {
                let _ = writeln!(out, "{} at {}: error: {e}", s.name, size_label(c.size));
            }
        }
    }
    out
}

/// CPU seconds per GB of every process of each setup over its whole stream cells.
fn cpu_table(report: &Report) -> String {
    let with_cost: Vec<_> = report
        .setups
        .iter()
        .filter(|s| s.status == SetupStatus::Ok)
        .collect();
    let mut rows = vec![];
    let mut header = vec!["size".to_owned()];
    header.extend(with_cost.iter().map(|s| s.name.clone()));
    rows.push(header);
    let mut units = vec![String::new()];
    units.extend(
        with_cost
            .iter()
            .map(|_| "s/GB (apps+back+front)".to_owned()),
    );
    rows.push(units);
    for &size in report.sizes.iter().filter(|&&s| s > 0) {
        let mut row = vec![size_label(size)];
        for s in &with_cost {
            let cost = s
                .cell(size)
                .and_then(|c| c.stream.as_ref())
                .and_then(|b| b.cost.as_ref());
            row.push(match cost {
                Some(c) => match c.cpu_s_per_gb {
                    Some(per_gb) => format!(
                        "{} ({}+{}+{})",
                        figure(per_gb),
                        figure(c.apps_s * 1e9 / c.bytes as f64),
                        figure(c.backends_s * 1e9 / c.bytes as f64),
                        figure(c.frontends_s * 1e9 / c.bytes as f64)
                    ),
                    None => "-".into(),
                },
                None => "-".into(),
            });
        }
        rows.push(row);
    }
    format!(
        "CPU seconds per GB moved, every process of the setup over the whole stream cell (warm-up and start-up included)\n{}",
        align(&rows)
    )
}

/// The `guest-scaling` table.
pub fn render_scaling(s: &ScalingReport) -> String {
    let mut out = format!(
        "Aggregate throughput, {} guest(s) per host each streaming {} x {} to a partner on the other host\n",
        "N",
        s.messages,
        size_label(s.message_size)
    );
    if let Some(reason) = &s.reason {
        let _ = writeln!(out, "{}: n/a ({reason})", scaling::NAME);
        return out;
    }
    let mut rows = vec![vec![
        "guests/host".to_owned(),
        "aggregate MB/s".to_owned(),
        "Jain".to_owned(),
        "min..max MB/s per guest".to_owned(),
        "CPU s/GB".to_owned(),
    ]];
    for p in &s.points {
        let lo = p
            .per_guest_mb_per_s
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min);
        let hi = p.per_guest_mb_per_s.iter().copied().fold(0.0, f64::max);
        rows.push(vec![
            p.guests_per_host.to_string(),
            p.aggregate_mb_per_s.map_or("error".into(), figure),
            p.jain.map_or("-".into(), |j| format!("{j:.3}")),
            if p.per_guest_mb_per_s.is_empty() {
                "-".into()
            } else {
                format!("{}..{}", figure(lo), figure(hi))
            },
            p.cost
                .as_ref()
                .and_then(|c| c.cpu_s_per_gb)
                .map_or("-".into(), figure),
        ]);
    }
    out.push_str(&align(&rows));
    let _ = writeln!(
        out,
        "ratio {} vs {} guests per host: {}",
        scaling::RATIO_NUMERATOR,
        scaling::RATIO_DENOMINATOR,
        ratio_text(s.ratio_40_vs_8)
    );
    for p in &s.points {
        if let Some(e) = &p.error {
            let _ = writeln!(
                out,
                "{} at {} guest(s) per host: error: {e}",
                scaling::NAME,
                p.guests_per_host
            );
        }
    }
    out
}

/// Everything of an `xmx bench` run: [`render`], then the scaling section.
pub fn render_all(report: &BenchReport) -> String {
    let mut out = render(&report.report);
    if let Some(g) = &report.guests {
        let _ = writeln!(
            out,
            "guests: {} ({} guests per host{})",
            g.kind,
            g.guests_per_host,
            if g.made_for_run {
                ", made for this run"
            } else {
                ""
            }
        );
    }
    if let Some(s) = &report.scaling {
        out.push('\n');
        out.push_str(&render_scaling(s));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::{Machine, SetupResult};
    use crate::bench::stats::{Bandwidth, Latency};

    #[test]
    fn labels() {
        assert_eq!(size_label(0), "0 B");
        assert_eq!(size_label(1000), "1000 B");
        assert_eq!(size_label(4096), "4 KiB");
        assert_eq!(size_label(16 << 20), "16 MiB");
        assert_eq!(figure(1234.56), "1235");
        assert_eq!(figure(123.456), "123.5");
        assert_eq!(figure(1.2345), "1.23");
    }

    #[test]
    fn aligned_rows_with_na_and_errors() {
        let cell = |size| Cell {
            size,
            pingpong: Some(Latency {
                iters: 1,
                warmup: 0,
                median_us: 1.5,
                p99_us: 12.25,
                min_us: 1.0,
                mean_us: 2.0,
            }),
            stream: Bandwidth::from_counts(10, size * 10, 1_000_000, 1_000_000),
            error: None,
        };
        let ok = SetupResult {
            name: "shm".into(),
            description: String::new(),
            status: SetupStatus::Ok,
            reason: None,
            cells: vec![
                cell(0),
                Cell {
                    pingpong: None,
                    stream: None,
                    error: Some("boom".into()),
                    size: 4096,
                },
            ],
        };
        let na = SetupResult {
            name: "native".into(),
            description: String::new(),
            status: SetupStatus::NotAvailable,
            reason: Some("not built".into()),
            cells: vec![],
        };
        let report = Report {
            schema: "x".into(),
            date: String::new(),
            command: String::new(),
            quick: true,
            machine: Machine {
                nproc: 1,
                cpu_model: String::new(),
                kernel: String::new(),
            },
            link: None,
            sizes: vec![0, 4096],
            setups: vec![ok.clone(), na.clone()],
            ratios: vec![crate::bench::report::ratio(&[0, 4096], &na, &ok)],
        };
        let text = render(&report);
        assert!(
            text.contains("\n0 B   | 1.50 / 12.25 |          n/a\n"),
            "{text}"
        );
        assert!(
            text.contains("\n4 KiB |        error |          n/a\n"),
            "{text}"
        );
        assert!(text.contains("10000 msg/s"), "{text}");
        assert!(text.contains("native: n/a (not built)"), "{text}");
        assert!(text.contains("shm at 4 KiB: error: boom"), "{text}");
        // Every row of a table has the same column positions.
        let lines: Vec<&str> = text.lines().skip(1).take(4).collect();
        let bars = |l: &str| l.match_indices('|').map(|(i, _)| i).collect::<Vec<_>>();
        assert!(lines.windows(2).all(|w| bars(w[0]) == bars(w[1])), "{text}");
        // With no size-by-size setup (the scaling setup alone) there is no table at all.
        let empty = Report {
            setups: vec![],
            ratios: vec![],
            ..report
        };
        assert_eq!(render(&empty), "");
    }
}

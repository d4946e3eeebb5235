//! Log-log plots of latency and bandwidth against message size, one line per setup, as
//! PNG and SVG. The 0-byte size has no place on a log axis and is left out.
//!
//! Text needs a TrueType font: `XMX_BENCH_FONT` if set, else DejaVu Sans or Liberation
//! Sans from the usual system directories, else whatever `fc-match sans` names.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::report::{Report, SetupStatus};
use super::table::size_label;

/// Files written by [`write_plots`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlotFiles {
    /// latency.png, latency.svg, bandwidth.png, bandwidth.svg.
    pub files: Vec<PathBuf>,
}

const WIDTH: u32 = 1000;
const HEIGHT: u32 = 640;
const FONT: &str = "sans-serif";
/// Line colours, distinct on white and in grey print.
const COLORS: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0x00, 0x00, 0x00),
];
const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

fn font_file() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("XMX_BENCH_FONT") {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = FONT_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
    {
        return Some(p);
    }
    let out = Command::new("fc-match")
        .args(["-f", "%{file}", "sans"])
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    p.is_file().then_some(p)
}

/// Load and register the font once per process.
fn register_font() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let path =
            font_file().ok_or("no TrueType font found for the plots (set XMX_BENCH_FONT)")?;
        let bytes = std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        // The font must live as long as the process: plotters keeps a 'static reference.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font(FONT, FontStyle::Normal, bytes)
            .map_err(|_| format!("{} is not a usable TrueType font", path.display()))
    })
    .clone()
}

/// One line of a plot: a setup's (size, value) points.
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

fn series(report: &Report, value: impl Fn(&super::report::Cell) -> Option<f64>) -> Vec<Series> {
    report
        .setups
        .iter()
        .filter(|s| s.status == SetupStatus::Ok)
        .map(|s| Series {
            name: s.name.clone(),
            points: s
                .cells
                .iter()
                .filter(|c| c.size > 0)
                .filter_map(|c| Some((c.size as f64, value(c).filter(|v| *v > 0.0)?)))
                .collect(),
        })
        .filter(|s| !s.points.is_empty())
        .collect()
}

fn draw<DB: DrawingBackend>(
    area: DrawingArea<DB, Shift>,
    title: &str,
    y_desc: &str,
    lines: &[Series],
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    area.fill(&WHITE).map_err(err)?;
    let all = lines.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (1.0, 2.0, 1.0, 2.0);
    }
    let mut chart = ChartBuilder::on(&area)
        .caption(title, (FONT, 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (x0 / 2.0..x1 * 2.0).log_scale(),
            (y0 / 2.0..y1 * 2.0).log_scale(),
        )
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("message size")
        .y_desc(y_desc)
        .x_label_formatter(&|x| size_label(x.round() as u64))
        .label_style((FONT, 14))
        .draw()
        .map_err(err)?;
    for (i, s) in lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()].to_rgba();
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(s.name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 16))
        .draw()
        .map_err(err)?;
    area.present().map_err(err)
}

fn both_formats(
    dir: &Path,
    stem: &str,
    title: &str,
    y_desc: &str,
    lines: &[Series],
    files: &mut Vec<PathBuf>,
) -> Result<(), String> {
    let png = dir.join(format!("{stem}.png"));
    draw(
        BitMapBackend::new(&png, (WIDTH, HEIGHT)).into_drawing_area(),
        title,
        y_desc,
        lines,
    )?;
    files.push(png);
    let svg = dir.join(format!("{stem}.svg"));
    draw(
        SVGBackend::new(&svg, (WIDTH, HEIGHT)).into_drawing_area(),
        title,
        y_desc,
        lines,
    )?;
    files.push(svg);
    Ok(())
}

/// The `guest-scaling` plot: aggregate MB/s against guests per host, linear axes.
fn draw_scaling<DB: DrawingBackend>(
    area: DrawingArea<DB, Shift>,
    points: &[(f64, f64)],
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    area.fill(&WHITE).map_err(err)?;
    let x1 = points.iter().map(|p| p.0).fold(1.0, f64::max);
    let y1 = points.iter().map(|p| p.1).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&area)
        .caption(
            "Aggregate throughput, guests per host streaming 256 KiB messages",
            (FONT, 24),
        )
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..x1 * 1.05, 0.0..y1 * 1.2)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("guests per host")
        .y_desc("MB/s")
        .label_style((FONT, 14))
        .draw()
        .map_err(err)?;
    let color = COLORS[0].to_rgba();
    chart
        .draw_series(LineSeries::new(
            points.iter().copied(),
            color.stroke_width(2),
        ))
        .map_err(err)?;
    chart
        .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))
        .map_err(err)?;
    area.present().map_err(err)
}

/// Write scaling.{png,svg} into `dir` from the measured points of `scaling`.
pub fn write_scaling_plot(
    scaling: &super::scaling::ScalingReport,
    dir: &Path,
) -> Result<PlotFiles, String> {
    register_font()?;
    let points: Vec<(f64, f64)> = scaling
        .points
        .iter()
        .filter_map(|p| Some((p.guests_per_host as f64, p.aggregate_mb_per_s?)))
        .collect();
    let mut files = Vec::new();
    let png = dir.join("scaling.png");
    draw_scaling(
        BitMapBackend::new(&png, (WIDTH, HEIGHT)).into_drawing_area(),
        &points,
    )?;
    files.push(png);
    let svg = dir.join("scaling.svg");
    draw_scaling(
        SVGBackend::new(&svg, (WIDTH, HEIGHT)).into_drawing_area(),
        &points,
    )?;
    files.push(svg);
    Ok(PlotFiles { files })
}

/// Write latency.{png,svg} and bandwidth.{png,svg} into `dir`.
pub fn write_plots(report: &Report, dir: &Path) -> Result<PlotFiles, String> {
    register_font()?;
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let mut files = Vec::new();
    let latency = series(report, |c| c.pingpong.as_ref().map(|l| l.median_us));
    both_formats(
        dir,
        "latency",
        "Half round-trip latency (median)",
        "microseconds",
        &latency,
        &mut files,
    )?;
    let bandwidth = series(report, |c| c.stream.as_ref().map(|b| b.mb_per_s));
    both_formats(
        dir,
        "bandwidth",
        "Streaming bandwidth",
        "MB/s",
        &bandwidth,
        &mut files,
    )?;
    Ok(PlotFiles { files })
}

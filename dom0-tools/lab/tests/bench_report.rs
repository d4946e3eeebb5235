//! Ratios and plots of `xmx bench` on synthetic figures (no measurement, no root).

use xmx_lab::bench::plot::write_plots;
use xmx_lab::bench::report::{ratio, ratios, Cell, Machine, Report, SetupResult, SetupStatus};
use xmx_lab::bench::stats::{Bandwidth, Latency};

fn setup(name: &str, figures: &[(u64, f64, f64)]) -> SetupResult {
    SetupResult {
        name: name.into(),
        description: format!("synthetic {name}"),
        status: SetupStatus::Ok,
        reason: None,
        cells: figures
            .iter()
            .map(|&(size, median_us, mb_per_s)| Cell {
                size,
                pingpong: Some(Latency {
                    iters: 10,
                    warmup: 1,
                    median_us,
                    p99_us: 2.0 * median_us,
                    min_us: median_us,
                    mean_us: median_us,
                }),
                stream: Some(Bandwidth {
                    messages: 10,
                    bytes: 10 * size,
                    seconds: 1.0,
                    mb_per_s,
                    msgs_per_s: 10.0,
                    cpu_s: 0.1,
                    cpu_s_per_gb: (size > 0).then_some(1.0),
                    cost: None,
                }),
                error: None,
            })
            .collect(),
    }
}

fn na(name: &str) -> SetupResult {
    SetupResult {
        name: name.into(),
        description: String::new(),
        status: SetupStatus::NotAvailable,
        reason: Some("not here".into()),
        cells: vec![],
    }
}

#[test]
fn native_over_afpacket_and_tcp_over_native() {
    let sizes = [0, 4096, 1 << 20];
    let afpacket = setup(
        "afpacket",
        &[(0, 4.0, 0.0), (4096, 8.0, 1000.0), (1 << 20, 400.0, 2500.0)],
    );
    let native = setup(
        "native",
        &[(0, 6.0, 0.0), (4096, 10.0, 900.0), (1 << 20, 500.0, 2000.0)],
    );
    let tcp = setup(
        "tcp",
        &[
            (0, 12.0, 0.0),
            (4096, 15.0, 450.0),
            (1 << 20, 1000.0, 1000.0),
        ],
    );
    let r = ratio(&sizes, &native, &afpacket);
    assert_eq!(r.name, "native/afpacket");
    let lat: Vec<_> = r.cells.iter().map(|c| c.latency).collect();
    let bw: Vec<_> = r.cells.iter().map(|c| c.bandwidth).collect();
    assert_eq!(lat, [Some(1.5), Some(1.25), Some(1.25)]);
    assert_eq!(bw, [None, Some(0.9), Some(0.8)]);
    let r = ratio(&sizes, &tcp, &native);
    let lat: Vec<_> = r.cells.iter().map(|c| c.latency).collect();
    let bw: Vec<_> = r.cells.iter().map(|c| c.bandwidth).collect();
    assert_eq!(lat, [Some(2.0), Some(1.5), Some(2.0)]);
    assert_eq!(bw, [None, Some(0.5), Some(0.5)]);
}

#[test]
fn ratios_against_a_missing_setup_are_null() {
    let sizes = [64];
    let setups = vec![setup("tcp", &[(64, 10.0, 5.0)]), na("native")];
    let pairs = vec![
        ("tcp".to_owned(), "native".to_owned()),
        ("tcp".to_owned(), "afpacket".to_owned()),
    ];
    let rs = ratios(&sizes, &setups, &pairs);
    assert_eq!(rs.len(), 1, "afpacket was not in the run");
    assert_eq!(rs[0].name, "tcp/native");
    assert_eq!(rs[0].cells[0].latency, None);
    assert_eq!(rs[0].cells[0].bandwidth, None);
}

#[test]
fn plots_are_png_and_svg() {
    let report = Report {
        schema: "xmx-bench/1".into(),
        date: "2026-01-01T00:00:00Z".into(),
        command: "test".into(),
        quick: true,
        machine: Machine::this(),
        link: None,
        sizes: vec![0, 1, 1024, 1 << 20],
        setups: vec![
            setup(
                "shm",
                &[
                    (0, 0.5, 0.0),
                    (1, 0.5, 2.0),
                    (1024, 0.7, 1500.0),
                    (1 << 20, 60.0, 9000.0),
                ],
            ),
            setup(
                "tcp",
                &[
                    (0, 5.0, 0.0),
                    (1, 5.0, 0.2),
                    (1024, 6.0, 150.0),
                    (1 << 20, 700.0, 1500.0),
                ],
            ),
            na("native"),
        ],
        ratios: vec![],
    };
    let dir = tempfile::tempdir().unwrap();
    let files = write_plots(&report, dir.path()).expect("plots");
    let names: Vec<String> = files
        .files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "latency.png",
            "latency.svg",
            "bandwidth.png",
            "bandwidth.svg"
        ]
    );
    for f in &files.files {
        let bytes = std::fs::read(f).unwrap();
        if f.extension().unwrap() == "png" {
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
            // A 1000x640 image.
            assert_eq!(&bytes[16..24], &[0, 0, 0x03, 0xe8, 0, 0, 0x02, 0x80]);
        } else {
            let text = String::from_utf8(bytes).unwrap();
            assert!(text.starts_with("<svg"));
            // One legend entry per setup that ran, none for the n/a one.
            assert!(
                text.contains("\nshm\n")
                    && text.contains("\ntcp\n")
                    && !text.contains("\nnative\n"),
                "{}",
                f.display()
            );
        }
    }
}

//! The C test programs, compiled against our `myriexpress.h` and linked with
//! the built library.

use std::path::{Path, PathBuf};

use crate::bins::workspace;
pub use xmx_cprog::shared_dir;

/// The programs only these tests use (`tests/src/c`).
pub fn own_dir() -> PathBuf {
    workspace().join("tests").join("src").join("c")
}

/// Compiles `<name>.c` from `tests/src/c` if it is there, else from
/// `tests/c`, into `out_dir`; returns the binary.
pub fn build(name: &str, out_dir: &Path) -> PathBuf {
    let own = own_dir().join(format!("{name}.c"));
    let src = if own.exists() {
        own
    } else {
        shared_dir().join(format!("{name}.c"))
    };
    xmx_cprog::compile(&src, &xmx_cprog::include_dir(), out_dir)
}

/// One line of a ping-pong table: size, one-way latency, bandwidth.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PingpongLine {
    /// Message size in bytes.
    pub bytes: u64,
    /// Half a round trip, microseconds.
    pub latency_us: f64,
    /// Bytes per microsecond (MB/s).
    pub mb_s: f64,
}

/// The table `pingpong`'s active side prints.
pub fn parse_pingpong(stdout: &str) -> Vec<PingpongLine> {
    stdout
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let bytes = f.next()?.parse().ok()?;
            let latency_us = f.next()?.parse().ok()?;
            let mb_s = f.next()?.parse().ok()?;
            Some(PingpongLine {
                bytes,
                latency_us,
                mb_s,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pingpong_tables_are_read_line_by_line() {
        let t = parse_pingpong("     bytes   latency_us         MB/s\n         0      2219.10          0.0\n  16777216    451477.00         37.2\nPASS ./pingpong\n");
        assert_eq!(
            t,
            vec![
                PingpongLine {
                    bytes: 0,
                    latency_us: 2219.10,
                    mb_s: 0.0
                },
                PingpongLine {
                    bytes: 16 << 20,
                    latency_us: 451477.0,
                    mb_s: 37.2
                }
            ]
        );
    }
}

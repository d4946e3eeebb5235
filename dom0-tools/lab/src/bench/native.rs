//! Setup `native`: xmx without virtualisation. libmyriexpress with
//! `XMX_TRANSPORT=native` runs the backend's MX engine inside the application process,
//! on the AF_PACKET interface of its namespace; the measuring program is `mx_bench.c`
//! (next to this file), built with the system C compiler against our MX header and the
//! built library, and run through `xmx bench-agent --transport exec` in each namespace.
//!
//! The setup is available only when the compiler, the library and a working native
//! transport are all there; a probe run (`mx_bench -i`) decides, and its error becomes
//! the "n/a" reason.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::agent::Test;
use super::link::{BenchLink, Side};
use super::plan::Counts;
use super::runner::{AgentSpec, CellAgents};

/// Source of the measuring program.
pub const MX_BENCH_C: &str = include_str!("mx_bench.c");
/// MX hostnames of the two ends, as the peer table names them.
const HOST_A: &str = "bench-a:0";
const HOST_B: &str = "bench-b:0";
const SERVER_EID: &str = "2";

/// Where the built `libmyriexpress.so` is: `XMX_LIB_DIR`, else next to the `xmx` binary
/// (or in its `deps/`, where cargo's test builds put it).
pub fn find_library(xmx: &Path) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("XMX_LIB_DIR")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    if let Some(dir) = xmx.parent() {
        dirs.push(dir.to_path_buf());
        dirs.push(dir.join("deps"));
    }
    dirs.into_iter()
        .find(|d| d.join("libmyriexpress.so").is_file())
}

/// Our MX headers: `XMX_MX_INCLUDE`, else the source tree this binary was built from.
pub fn include_dir() -> PathBuf {
    std::env::var_os("XMX_MX_INCLUDE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../libmx/include"))
}

/// Compile `mx_bench.c` into `out_dir`; returns the program.
pub fn build_program(out_dir: &Path, include: &Path, lib_dir: &Path) -> Result<PathBuf, String> {
    let src = out_dir.join("mx_bench.c");
    std::fs::write(&src, MX_BENCH_C).map_err(|e| format!("writing {}: {e}", src.display()))?;
    let prog = out_dir.join("mx_bench");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=gnu11", "-O2", "-Wall", "-Wextra"])
        .arg("-I")
        .arg(include)
        .arg(&src)
        .arg("-o")
        .arg(&prog)
        .arg("-L")
        .arg(lib_dir)
        .args(["-lmyriexpress", "-lpthread"])
        .output()
        .map_err(|e| format!("C compiler {cc} not usable: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "mx_bench.c does not build: {}",
            err.lines().next().unwrap_or("")
        ));
    }
    Ok(prog)
}

fn mac_of(side: &Side) -> Result<String, String> {
    let out = Command::new("ip")
        .args(["-n", &side.netns, "-o", "link", "show", "dev", &side.iface])
        .output()
        .map_err(|e| format!("running ip: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    words
        .find(|w| *w == "link/ether")
        .and_then(|_| words.next())
        .map(str::to_owned)
        .ok_or_else(|| format!("no MAC address on {} in {}", side.iface, side.netns))
}

/// A prepared native setup: the program, the library and the environment of each end.
#[derive(Debug, Clone)]
pub struct PreparedNative {
    prog: PathBuf,
    env_a: Vec<(String, String)>,
    env_b: Vec<(String, String)>,
}

impl PreparedNative {
    /// Build the program, write the peer table and probe the transport on end B.
    /// `spin_us` becomes `XMX_SPIN_US`, so the library polls as long as the baselines do.
    pub fn prepare(
        xmx: &Path,
        link: &BenchLink,
        scratch: &Path,
        spin_us: u64,
    ) -> Result<PreparedNative, String> {
        let lib = find_library(xmx)
            .ok_or("libmyriexpress.so not found (build xmx-libmx, or set XMX_LIB_DIR)")?;
        let prog = build_program(scratch, &include_dir(), &lib)?;
        let peers = serde_json::json!([
            {"index": 0, "mac": mac_of(&link.a)?, "hostname": HOST_A},
            {"index": 1, "mac": mac_of(&link.b)?, "hostname": HOST_B},
        ]);
        let peers_file = scratch.join("peers.json");
        std::fs::write(&peers_file, peers.to_string()).map_err(|e| e.to_string())?;
        let env = |side: &Side, host: &str| -> Vec<(String, String)> {
            [
                ("XMX_TRANSPORT", "native".to_owned()),
                ("XMX_IFACE", side.iface.clone()),
                ("XMX_PEERS", peers_file.display().to_string()),
                ("XMX_HOSTNAME", host.to_owned()),
                ("XMX_SPIN_US", spin_us.to_string()),
                ("LD_LIBRARY_PATH", lib.display().to_string()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect()
        };
        let native = PreparedNative {
            prog,
            env_a: env(&link.a, HOST_A),
            env_b: env(&link.b, HOST_B),
        };
        native.probe(xmx, &link.b)?;
        Ok(native)
    }

    fn exec_args(&self, side: &Side, program_args: &[String]) -> Vec<String> {
        let mut args: Vec<String> = [
            "bench-agent",
            "--transport",
            "exec",
            "--netns",
            &side.netns,
            "--",
        ]
        .map(str::to_owned)
        .to_vec();
        args.push(self.prog.display().to_string());
        args.extend_from_slice(program_args);
        args
    }

    fn probe(&self, xmx: &Path, side: &Side) -> Result<(), String> {
        let out = Command::new(xmx)
            .args(self.exec_args(side, &["-i".to_owned()]))
            .envs(self.env_b.iter().map(|(k, v)| (k, v)))
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            return Ok(());
        }
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("probe failed")
            .trim();
        Err(format!("XMX_TRANSPORT=native: {last}"))
    }

    /// The two processes of one cell.
    pub fn cell(&self, link: &BenchLink, test: Test, size: u64, counts: Counts) -> CellAgents {
        let common: Vec<String> = vec![
            "-t".into(),
            test.as_str().into(),
            "-s".into(),
            size.to_string(),
            "-w".into(),
            counts.warmup.to_string(),
            "-n".into(),
            counts.iters.to_string(),
        ];
        let mut server_args = vec!["-l".to_owned(), SERVER_EID.to_owned()];
        server_args.extend(common.iter().cloned());
        let mut client_args = vec![
            "-d".to_owned(),
            HOST_B.to_owned(),
            "-e".to_owned(),
            SERVER_EID.to_owned(),
        ];
        client_args.extend(common);
        let server = AgentSpec {
            args: self.exec_args(&link.b, &server_args),
            env: self.env_b.clone(),
        };
        let client = AgentSpec {
            args: self.exec_args(&link.a, &client_args),
            env: self.env_a.clone(),
        };
        CellAgents {
            server,
            client: Box::new(move |_| client),
            cleanup: vec![],
        }
    }
}

//! Helpers shared by the simhv integration tests: a host in a temporary directory.
#![allow(dead_code)]

use xmx_hv::DomId;

/// A simulated host in a temporary directory.
pub use xmx_simkit::SimHost;

/// Bytes of `slice` as a slice (for mapped memory).
///
/// # Safety
/// `ptr` must be valid for reads of `len` bytes for the returned lifetime.
pub unsafe fn bytes<'a>(ptr: *const u8, len: usize) -> &'a [u8] {
    // SAFETY: forwarded to the caller.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

/// The byte page `i` is filled with, different per seed.
pub fn page_fill(seed: u8, i: usize) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(seed)
}

/// Whether this process was started by [`spawn_role`] to play `role`.
pub fn is_role(role: &str) -> bool {
    std::env::var("XMX_TEST_ROLE").as_deref() == Ok(role)
}

/// Re-run this test binary as a separate process that runs only the test named `role`,
/// attached (through `xmx_hv::platform::from_env`) as `domid` of `host`.
pub fn spawn_role(
    role: &str,
    host: &SimHost,
    domid: DomId,
    extra: &[(&str, String)],
) -> std::process::Child {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([role, "--exact", "--nocapture", "--test-threads=1"])
        .env("XMX_PLATFORM", "sim")
        .env("XMX_SIM_DIR", host.path())
        .env("XMX_DOMID", domid.to_string())
        .env("XMX_TEST_ROLE", role)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// An environment variable the parent passed to a role process.
pub fn role_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"))
}

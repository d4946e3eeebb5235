//! Links libmyriexpress.so with MX's symbol version nodes and soname.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let script = format!("{dir}/libmyriexpress.version");
    println!("cargo:rerun-if-changed=libmyriexpress.version");
    println!("cargo:rerun-if-changed=build.rs");
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "linux" {
        // Binaries linked against MX reference versioned symbols
        // (mx_open_endpoint@MX_0.9, ...): the nodes must exist here too.
        println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={script}");
        // Applications link with -lmyriexpress and record this name.
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmyriexpress.so");
    }
}

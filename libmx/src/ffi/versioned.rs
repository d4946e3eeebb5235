//! The symbols MX binds to version nodes (see libmyriexpress.version).
//!
//! Binaries linked against Myricom's library reference `mx_open_endpoint@MX_0.9`
//! and the like, so those names are defined with their version here: each is
//! a jump to the Rust function, renamed with `.symver` to `name@@NODE` (the
//! default version, which new links bind to as well). The Rust functions
//! themselves keep Rust symbols and are not exported.

macro_rules! versioned {
    ($($name:ident @ $node:literal => $target:path;)*) => {
        #[cfg(target_arch = "x86_64")]
        std::arch::global_asm!(
            $(
                concat!(".globl xmx_versioned_", stringify!($name)),
                concat!(".type xmx_versioned_", stringify!($name), ",@function"),
                concat!("xmx_versioned_", stringify!($name), ":"),
                concat!("jmp {", stringify!($name), "}"),
                concat!(".size xmx_versioned_", stringify!($name), ", . - xmx_versioned_", stringify!($name)),
                concat!(".symver xmx_versioned_", stringify!($name), ", ", stringify!($name), "@@", $node),
            )*
            $($name = sym $target,)*
        );
        #[cfg(target_arch = "aarch64")]
        std::arch::global_asm!(
            $(
                concat!(".globl xmx_versioned_", stringify!($name)),
                concat!(".type xmx_versioned_", stringify!($name), ",%function"),
                concat!("xmx_versioned_", stringify!($name), ":"),
                concat!("b {", stringify!($name), "}"),
                concat!(".size xmx_versioned_", stringify!($name), ", . - xmx_versioned_", stringify!($name)),
                concat!(".symver xmx_versioned_", stringify!($name), ", ", stringify!($name), "@@", $node),
            )*
            $($name = sym $target,)*
        );
    };
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("versioned MX symbols are provided for x86_64 and aarch64 only");

versioned! {
    mx_open_endpoint @ "MX_0.9" => super::endpoint::mx_open_endpoint;
    mx_decompose_endpoint_addr @ "MX_0.9" => super::endpoint::mx_decompose_endpoint_addr;
    mx_get_info @ "MX_0.91" => super::info::mx_get_info;
    mx_test @ "MX_0.91" => super::messaging::mx_test;
    mx_wait @ "MX_0.91" => super::messaging::mx_wait;
    mx_iprobe @ "MX_0.91" => super::messaging::mx_iprobe;
    mx__init_api @ "MX_0.92" => super::init::mx__init_api;
}

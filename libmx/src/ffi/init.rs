//! Library setup, error handlers and the texts of codes.

use std::ffi::{c_char, c_int};

use crate::abi::MxErrorHandler;
use crate::errors;
use crate::strings;

use super::run;

/// `mx__init_api` (what `mx_init()` expands to).
#[allow(non_snake_case)]
#[cfg_attr(any(test, not(target_os = "linux")), no_mangle)]
pub extern "C" fn mx__init_api(api: c_int) -> c_int {
    run("mx_init", |_| crate::runtime::init(api))
}

/// `mx_finalize`.
#[no_mangle]
pub extern "C" fn mx_finalize() -> c_int {
    run("mx_finalize", |_| crate::runtime::finalize())
}

/// `MX_ERRORS_ARE_FATAL`.
#[no_mangle]
pub static MX_ERRORS_ARE_FATAL: MxErrorHandler = errors::errors_are_fatal;

/// `MX_ERRORS_RETURN`.
#[no_mangle]
pub static MX_ERRORS_RETURN: MxErrorHandler = errors::errors_return;

/// `mx_set_error_handler`: installs a process-wide handler, returns the
/// previous one. A NULL handler restores `MX_ERRORS_ARE_FATAL`.
#[no_mangle]
pub extern "C" fn mx_set_error_handler(handler: Option<MxErrorHandler>) -> Option<MxErrorHandler> {
    std::panic::catch_unwind(|| {
        Some(errors::set_handler(
            handler.unwrap_or(errors::errors_are_fatal),
        ))
    })
    .unwrap_or(None)
}

/// `mx_strerror`.
#[no_mangle]
pub extern "C" fn mx_strerror(code: c_int) -> *const c_char {
    strings::strerror(code as u32).as_ptr()
}

/// `mx_strstatus`.
#[no_mangle]
pub extern "C" fn mx_strstatus(code: c_int) -> *const c_char {
    strings::strstatus(code as u32).as_ptr()
}

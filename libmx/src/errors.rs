//! Failures and MX's error handlers.
//!
//! Every failing call goes through an error handler, which decides what the
//! call returns: `MX_ERRORS_ARE_FATAL` prints the failure and ends the
//! process (MX's default), `MX_ERRORS_RETURN` returns the code. An endpoint
//! opened with an `MX_PARAM_ERROR_HANDLER` parameter uses its own handler.

use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::Mutex;

use crate::abi::{MxErrorHandler, MxReturn};

/// A call that failed: its code and what went wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Failure {
    /// The MX return code.
    pub(crate) code: MxReturn,
    /// A description for the error handler.
    pub(crate) message: String,
}

impl Failure {
    /// A failure with code `code`.
    pub(crate) fn new(code: MxReturn, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }
}

/// The result of a library operation.
pub(crate) type MxResult<T> = Result<T, Failure>;

/// `MX_ERRORS_ARE_FATAL`: prints the failure to stderr and exits with
/// status 255, as Open-MX's library does.
///
/// # Safety
/// `message` is NULL or a NUL-terminated string.
pub(crate) unsafe extern "C" fn errors_are_fatal(message: *mut c_char, code: c_int) -> c_int {
    let text = if message.is_null() {
        String::new()
    } else {
        // SAFETY: the library passes a NUL-terminated string; a C caller
        // of this handler must do the same (the MX contract).
        unsafe { CStr::from_ptr(message) }
            .to_string_lossy()
            .into_owned()
    };
    let what = crate::strings::strerror(code as u32).to_string_lossy();
    eprintln!("MX: {text}: {what}");
    std::process::exit(255)
}

/// `MX_ERRORS_RETURN`: returns the code unchanged.
///
/// # Safety
/// Always safe; `unsafe` only to have the handler type.
pub(crate) unsafe extern "C" fn errors_return(_message: *mut c_char, code: c_int) -> c_int {
    code
}

struct HandlerState {
    current: MxErrorHandler,
    /// The application chose the handler (the environment default must
    /// not override it at init).
    chosen: bool,
}

static HANDLER: Mutex<HandlerState> = Mutex::new(HandlerState {
    current: errors_are_fatal,
    chosen: false,
});

fn state() -> std::sync::MutexGuard<'static, HandlerState> {
    HANDLER.lock().unwrap_or_else(|e| e.into_inner())
}

/// Installs `handler` as the process-wide handler; returns the previous one.
pub(crate) fn set_handler(handler: MxErrorHandler) -> MxErrorHandler {
    let mut s = state();
    s.chosen = true;
    std::mem::replace(&mut s.current, handler)
}

/// At init: the default handler per `MX_ERRORS_ARE_FATAL`, unless the
/// application already chose one.
pub(crate) fn set_default(fatal: bool) {
    let mut s = state();
    if !s.chosen {
        s.current = if fatal {
            errors_are_fatal
        } else {
            errors_return
        };
    }
}

/// The process-wide handler.
pub(crate) fn handler() -> MxErrorHandler {
    state().current
}

/// Hands `failure` to `endpoint_handler` (or the process-wide handler) and
/// returns what the handler returns.
pub(crate) fn raise(endpoint_handler: Option<MxErrorHandler>, failure: Failure) -> c_int {
    tracing::debug!(code = ?failure.code, message = %failure.message, "MX call failed");
    let h = endpoint_handler.unwrap_or_else(handler);
    let text = CString::new(failure.message.replace('\0', " ")).unwrap_or_default();
    let mut bytes = text.into_bytes_with_nul();
    // SAFETY: `h` is one of our handlers or one the application installed
    // with the MX handler signature; the string is NUL-terminated and lives
    // across the call.
    unsafe { h(bytes.as_mut_ptr() as *mut c_char, failure.code as c_int) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_handler_returns_the_code() {
        let f = Failure::new(MxReturn::BadEndpoint, "x\0y");
        assert_eq!(
            raise(Some(errors_return), f),
            MxReturn::BadEndpoint as c_int
        );
    }
}

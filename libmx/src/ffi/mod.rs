//! The exported C functions of `libmyriexpress.so`.
//!
//! Every entry point catches panics (none may cross into C), decodes and
//! checks its arguments (handles are looked up, never dereferenced; output
//! pointers are checked for NULL), and turns a failure into the error
//! handler's verdict.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use crate::abi::{MxErrorHandler, MxReturn};
use crate::endpoint::AppEndpoint;
use crate::errors::{self, Failure, MxResult};

mod endpoint;
mod info;
mod init;
mod internals;
mod messaging;
mod raw;
#[cfg(all(target_os = "linux", not(test)))]
mod versioned;

/// Runs the body of an MX call: success is `MX_SUCCESS`; a failure goes to
/// the error handler (the endpoint's if the body found one); a panic is
/// `MX_BAD_BAD_BAD`.
pub(crate) fn run(
    name: &str,
    body: impl FnOnce(&mut Option<MxErrorHandler>) -> MxResult<()>,
) -> c_int {
    let mut handler = None;
    let outcome = catch_unwind(AssertUnwindSafe(|| body(&mut handler)));
    match outcome {
        Ok(Ok(())) => MxReturn::Success as c_int,
        Ok(Err(f)) => errors::raise(
            handler,
            Failure {
                message: format!("{name}: {}", f.message),
                ..f
            },
        ),
        Err(_) => {
            tracing::error!(call = name, "internal error (panic) caught");
            MxReturn::BadBadBad as c_int
        }
    }
}

/// The endpoint behind an `mx_endpoint_t`; remembers its error handler.
pub(crate) fn endpoint_of<T>(
    handle: *mut T,
    handler: &mut Option<MxErrorHandler>,
) -> MxResult<Arc<AppEndpoint>> {
    let ep = crate::runtime::endpoint(handle as usize)?;
    *handler = ep.error_handler();
    Ok(ep)
}

/// Writes an output argument.
///
/// # Safety
/// `p` is NULL or points to memory the caller lets us write a `T` to.
pub(crate) unsafe fn put<T>(p: *mut T, v: T, what: &str) -> MxResult<()> {
    if p.is_null() {
        return Err(Failure::new(
            MxReturn::BadInfoVal,
            format!("NULL {what} pointer"),
        ));
    }
    // SAFETY: non-NULL, and the MX contract makes it writable; unaligned
    // writes tolerate any placement the application chose.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Writes an optional output argument (skipped when NULL).
///
/// # Safety
/// As [`put`].
pub(crate) unsafe fn put_opt<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: as in `put`.
        unsafe { p.write_unaligned(v) };
    }
}

/// Reads a request handle through an `mx_request_t *`.
///
/// # Safety
/// `p` is NULL or points to a readable `mx_request_t`.
pub(crate) unsafe fn request_at(p: *mut *mut std::ffi::c_void) -> MxResult<usize> {
    if p.is_null() {
        return Err(Failure::new(MxReturn::BadRequest, "NULL request pointer"));
    }
    // SAFETY: non-NULL and readable per the MX contract.
    let v = unsafe { p.read_unaligned() } as usize;
    if v == 0 {
        return Err(Failure::new(MxReturn::BadRequest, "NULL request"));
    }
    Ok(v)
}

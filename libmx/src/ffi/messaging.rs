//! Sends, receives and their completion.

use std::ffi::{c_int, c_void};

use crate::abi::{MxEndpointAddr, MxReturn, MxSegment, MxStatus};
use crate::errors::{Failure, MxResult};
use crate::segments::Segments;

use super::{endpoint_of, put, put_opt, request_at, run};

type MxRequest = *mut c_void;

/// Common part of `mx_isend` and `mx_issend`.
///
/// # Safety
/// As `mx_isend`.
#[allow(clippy::too_many_arguments)] // mx_isend's arguments, plus the variant
unsafe fn send(
    name: &str,
    endpoint: *mut c_void,
    segments: *mut MxSegment,
    count: u32,
    dest: MxEndpointAddr,
    match_info: u64,
    context: *mut c_void,
    request: *mut MxRequest,
    sync: bool,
) -> c_int {
    run(name, |h| {
        let ep = endpoint_of(endpoint, h)?;
        // SAFETY: per the MX contract on the segment list and buffers.
        let segs = unsafe { Segments::from_c(segments, count) }?;
        // MX has no fire-and-forget send (mx_forget exists for that): a
        // NULL request is refused before anything is sent.
        if request.is_null() {
            return Err(Failure::new(MxReturn::BadRequest, "NULL request pointer"));
        }
        let t = ep.isend(segs, dest, match_info, context as usize, sync)?;
        // SAFETY: checked non-NULL; writable per the contract.
        unsafe { put(request, t as MxRequest, "request") }
    })
}

/// `mx_isend`.
///
/// # Safety
/// The segments name memory valid until the send completes; `request` is
/// writable.
#[no_mangle]
pub unsafe extern "C" fn mx_isend(
    endpoint: *mut c_void,
    segments_list: *mut MxSegment,
    segments_count: u32,
    dest_endpoint: MxEndpointAddr,
    match_info: u64,
    context: *mut c_void,
    request: *mut MxRequest,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        send(
            "mx_isend",
            endpoint,
            segments_list,
            segments_count,
            dest_endpoint,
            match_info,
            context,
            request,
            false,
        )
    }
}

/// `mx_issend`: completes once the receiver has matched (and taken) the data.
///
/// # Safety
/// As `mx_isend`.
#[no_mangle]
pub unsafe extern "C" fn mx_issend(
    endpoint: *mut c_void,
    segments_list: *mut MxSegment,
    segments_count: u32,
    dest_endpoint: MxEndpointAddr,
    match_info: u64,
    context: *mut c_void,
    request: *mut MxRequest,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        send(
            "mx_issend",
            endpoint,
            segments_list,
            segments_count,
            dest_endpoint,
            match_info,
            context,
            request,
            true,
        )
    }
}

/// `mx_irecv`.
///
/// # Safety
/// The segments name memory writable until the receive completes;
/// `request` is writable.
#[no_mangle]
pub unsafe extern "C" fn mx_irecv(
    endpoint: *mut c_void,
    segments_list: *mut MxSegment,
    segments_count: u32,
    match_info: u64,
    match_mask: u64,
    context: *mut c_void,
    request: *mut MxRequest,
) -> c_int {
    run("mx_irecv", |h| {
        let ep = endpoint_of(endpoint, h)?;
        // SAFETY: per the MX contract on the segment list and buffers.
        let segs = unsafe { Segments::from_c(segments_list, segments_count) }?;
        if request.is_null() {
            return Err(Failure::new(MxReturn::BadRequest, "NULL request pointer"));
        }
        let t = ep.irecv(segs, match_info, match_mask, context as usize)?;
        // SAFETY: checked non-NULL; writable per the contract.
        unsafe { put(request, t as MxRequest, "request") }
    })
}

/// MX writes a completion's status and the result flag where the caller
/// says: a NULL pointer for either is `MX_BAD_INFO_VAL` ("the pointer where
/// the info is to be returned is invalid"), checked before the call looks
/// at (and possibly takes) a completion.
fn outputs<S, R>(status: *mut S, result: *mut R) -> MxResult<()> {
    if status.is_null() {
        return Err(Failure::new(MxReturn::BadInfoVal, "NULL status pointer"));
    }
    if result.is_null() {
        return Err(Failure::new(MxReturn::BadInfoVal, "NULL result pointer"));
    }
    Ok(())
}

/// Reports a completion: status, result flag, and the request cleared.
///
/// # Safety
/// Pointers writable or NULL.
unsafe fn report(
    found: Option<MxStatus>,
    request: *mut MxRequest,
    status: *mut MxStatus,
    result: *mut u32,
) {
    // SAFETY: per the callers' contracts.
    unsafe {
        if let Some(s) = found {
            put_opt(status, s);
            put_opt(request, std::ptr::null_mut());
        }
        put_opt(result, found.is_some() as u32);
    }
}

/// `mx_cancel`.
///
/// # Safety
/// `request` readable and writable, `result` writable.
#[no_mangle]
pub unsafe extern "C" fn mx_cancel(
    endpoint: *mut c_void,
    request: *mut MxRequest,
    result: *mut u32,
) -> c_int {
    run("mx_cancel", |h| {
        let ep = endpoint_of(endpoint, h)?;
        // SAFETY: per the contract.
        let t = unsafe { request_at(request) }?;
        let cancelled = ep.cancel(t)?;
        // SAFETY: per the contract.
        unsafe {
            if cancelled {
                put_opt(request, std::ptr::null_mut());
            }
            put_opt(result, cancelled as u32);
        }
        Ok(())
    })
}

/// `mx_test`: `*result` is 1 and `*status` filled once the request is
/// complete (the request is then freed and `*request` cleared).
///
/// # Safety
/// `request` readable and writable; `status` and `result` writable.
#[cfg_attr(any(test, not(target_os = "linux")), no_mangle)]
pub unsafe extern "C" fn mx_test(
    endpoint: *mut c_void,
    request: *mut MxRequest,
    status: *mut MxStatus,
    result: *mut u32,
) -> c_int {
    run("mx_test", |h| {
        let ep = endpoint_of(endpoint, h)?;
        outputs(status, result)?;
        // SAFETY: per the contract.
        let t = unsafe { request_at(request) }?;
        let found = ep.test(t)?;
        // SAFETY: per the contract.
        unsafe { report(found, request, status, result) };
        Ok(())
    })
}

/// `mx_wait`: as `mx_test`, blocking up to `timeout` ms (`MX_INFINITE`: no
/// limit); `*result` 0 after a timeout or `mx_wakeup`.
///
/// # Safety
/// As `mx_test`.
#[cfg_attr(any(test, not(target_os = "linux")), no_mangle)]
pub unsafe extern "C" fn mx_wait(
    endpoint: *mut c_void,
    request: *mut MxRequest,
    timeout: u32,
    status: *mut MxStatus,
    result: *mut u32,
) -> c_int {
    run("mx_wait", |h| {
        let ep = endpoint_of(endpoint, h)?;
        outputs(status, result)?;
        // SAFETY: per the contract.
        let t = unsafe { request_at(request) }?;
        let found = ep.wait(t, timeout)?;
        // SAFETY: per the contract.
        unsafe { report(found, request, status, result) };
        Ok(())
    })
}

/// `mx_test_any`.
///
/// # Safety
/// `status` and `result` writable.
#[no_mangle]
pub unsafe extern "C" fn mx_test_any(
    endpoint: *mut c_void,
    match_info: u64,
    match_mask: u64,
    status: *mut MxStatus,
    result: *mut u32,
) -> c_int {
    run("mx_test_any", |h| {
        let ep = endpoint_of(endpoint, h)?;
        outputs(status, result)?;
        let found = ep.test_any(match_info, match_mask)?;
        // SAFETY: per the contract.
        unsafe { report(found, std::ptr::null_mut(), status, result) };
        Ok(())
    })
}

/// `mx_wait_any`.
///
/// # Safety
/// `status` and `result` writable.
#[no_mangle]
pub unsafe extern "C" fn mx_wait_any(
    endpoint: *mut c_void,
    timeout: u32,
    match_info: u64,
    match_mask: u64,
    status: *mut MxStatus,
    result: *mut u32,
) -> c_int {
    run("mx_wait_any", |h| {
        let ep = endpoint_of(endpoint, h)?;
        outputs(status, result)?;
        let found = ep.wait_any(timeout, match_info, match_mask)?;
        // SAFETY: per the contract.
        unsafe { report(found, std::ptr::null_mut(), status, result) };
        Ok(())
    })
}

/// Reports a peeked request.
///
/// # Safety
/// Pointers writable or NULL.
unsafe fn report_peek(
    found: Option<usize>,
    request: *mut MxRequest,
    result: *mut u32,
) -> MxResult<()> {
    // SAFETY: per the callers' contracts.
    unsafe {
        if let Some(t) = found {
            put(request, t as MxRequest, "request")?;
        }
        put_opt(result, found.is_some() as u32);
    }
    Ok(())
}

/// `mx_ipeek`: the first completed request, not freed.
///
/// # Safety
/// `request` and `result` writable.
#[no_mangle]
pub unsafe extern "C" fn mx_ipeek(
    endpoint: *mut c_void,
    request: *mut MxRequest,
    result: *mut u32,
) -> c_int {
    run("mx_ipeek", |h| {
        let found = endpoint_of(endpoint, h)?.ipeek()?;
        // SAFETY: per the contract.
        unsafe { report_peek(found, request, result) }
    })
}

/// `mx_peek`.
///
/// # Safety
/// `request` and `result` writable.
#[no_mangle]
pub unsafe extern "C" fn mx_peek(
    endpoint: *mut c_void,
    timeout: u32,
    request: *mut MxRequest,
    result: *mut u32,
) -> c_int {
    run("mx_peek", |h| {
        let found = endpoint_of(endpoint, h)?.peek(timeout)?;
        // SAFETY: per the contract.
        unsafe { report_peek(found, request, result) }
    })
}

/// `mx_iprobe`: the first unexpected message satisfying the pair.
///
/// # Safety
/// `status` and `result` writable.
#[cfg_attr(any(test, not(target_os = "linux")), no_mangle)]
pub unsafe extern "C" fn mx_iprobe(
    endpoint: *mut c_void,
    match_info: u64,
    match_mask: u64,
    status: *mut MxStatus,
    result: *mut u32,
) -> c_int {
    run("mx_iprobe", |h| {
        let ep = endpoint_of(endpoint, h)?;
        outputs(status, result)?;
        let found = ep.iprobe(match_info, match_mask)?;
        // SAFETY: per the contract.
        unsafe { report(found, std::ptr::null_mut(), status, result) };
        Ok(())
    })
}

/// `mx_probe`.
///
/// # Safety
/// `status` and `result` writable.
#[no_mangle]
pub unsafe extern "C" fn mx_probe(
    endpoint: *mut c_void,
    timeout: u32,
    match_info: u64,
    match_mask: u64,
    status: *mut MxStatus,
    result: *mut u32,
) -> c_int {
    run("mx_probe", |h| {
        let ep = endpoint_of(endpoint, h)?;
        outputs(status, result)?;
        let found = ep.probe(timeout, match_info, match_mask)?;
        // SAFETY: per the contract.
        unsafe { report(found, std::ptr::null_mut(), status, result) };
        Ok(())
    })
}

/// `mx_ibuffered`: whether a send's buffer may be reused.
///
/// # Safety
/// `request` readable, `result` writable.
#[no_mangle]
pub unsafe extern "C" fn mx_ibuffered(
    endpoint: *mut c_void,
    request: *mut MxRequest,
    result: *mut u32,
) -> c_int {
    run("mx_ibuffered", |h| {
        let ep = endpoint_of(endpoint, h)?;
        // SAFETY: per the contract.
        let t = unsafe { request_at(request) }?;
        let b = ep.ibuffered(t)?;
        // SAFETY: per the contract.
        unsafe { put_opt(result, b as u32) };
        Ok(())
    })
}

/// `mx_buffered`: as `mx_ibuffered`, waiting up to `timeout` ms.
///
/// # Safety
/// As `mx_ibuffered`.
#[no_mangle]
pub unsafe extern "C" fn mx_buffered(
    endpoint: *mut c_void,
    request: *mut MxRequest,
    timeout: u32,
    result: *mut u32,
) -> c_int {
    run("mx_buffered", |h| {
        let ep = endpoint_of(endpoint, h)?;
        // SAFETY: per the contract.
        let t = unsafe { request_at(request) }?;
        let b = ep.buffered(t, timeout)?;
        // SAFETY: per the contract.
        unsafe { put_opt(result, b as u32) };
        Ok(())
    })
}

/// `mx_context`: the context a request was posted with.
///
/// # Safety
/// `request` readable, `context` writable.
#[no_mangle]
pub unsafe extern "C" fn mx_context(request: *mut MxRequest, context: *mut *mut c_void) -> c_int {
    run("mx_context", |h| {
        // SAFETY: per the contract.
        let t = unsafe { request_at(request) }?;
        let (handle, _) = crate::endpoint::split_token(t);
        let ep = endpoint_of(handle as usize as *mut c_void, h)?;
        let c = ep.context_of(t)?;
        // SAFETY: per the contract.
        unsafe { put(context, c as *mut c_void, "context") }
    })
}

/// `mx_forget`: no completion will be tested for this request.
///
/// # Safety
/// `request` readable and writable.
#[no_mangle]
pub unsafe extern "C" fn mx_forget(endpoint: *mut c_void, request: *mut MxRequest) -> c_int {
    run("mx_forget", |h| {
        let ep = endpoint_of(endpoint, h)?;
        // SAFETY: per the contract.
        let t = unsafe { request_at(request) }?;
        ep.forget(t)?;
        // SAFETY: per the contract.
        unsafe { put_opt(request, std::ptr::null_mut()) };
        Ok(())
    })
}

/// `mx_set_request_timeout`.
#[no_mangle]
pub extern "C" fn mx_set_request_timeout(
    endpoint: *mut c_void,
    request: MxRequest,
    milli_seconds: u32,
) -> c_int {
    run("mx_set_request_timeout", |h| {
        let ep = endpoint_of(endpoint, h)?;
        if request.is_null() {
            return Err(Failure::new(MxReturn::BadRequest, "NULL request"));
        }
        ep.set_request_timeout(request as usize, milli_seconds)
    })
}

fn one_sided(name: &str, endpoint: *mut c_void) -> c_int {
    run(name, |h| {
        endpoint_of(endpoint, h)?;
        // MX's one-sided calls have no MXoE wire support (Open-MX has none
        // either), and the MX enum has no "not implemented" code: the
        // failure goes to the error handler as an internal error.
        Err(Failure::new(
            MxReturn::BadBadBad,
            "one-sided transfers are not implemented",
        ))
    })
}

/// `mx_iput`: not implemented (see the error handler's message).
#[no_mangle]
pub extern "C" fn mx_iput(
    endpoint: *mut c_void,
    _local_addr: *mut c_void,
    _length: u32,
    _dest_endpoint: MxEndpointAddr,
    _remote_addr: u64,
    _context: *mut c_void,
    _request: *mut MxRequest,
) -> c_int {
    one_sided("mx_iput", endpoint)
}

/// `mx_iget`: not implemented (see the error handler's message).
#[no_mangle]
pub extern "C" fn mx_iget(
    endpoint: *mut c_void,
    _local_addr: *mut c_void,
    _length: u32,
    _dest_endpoint: MxEndpointAddr,
    _remote_addr: u64,
    _context: *mut c_void,
    _request: *mut MxRequest,
) -> c_int {
    one_sided("mx_iget", endpoint)
}

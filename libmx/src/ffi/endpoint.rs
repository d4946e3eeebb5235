//! Endpoints, addresses, connections, handlers and progression.

use std::ffi::{c_int, c_void};

use crate::abi::{
    MxEndpointAddr, MxErrorHandler, MxMatchingCallback, MxParam, MxReturn, MxUnexpHandler,
    ParamKey, MX_ANY_ENDPOINT, MX_ANY_NIC,
};
use crate::addr::Addr;
use crate::endpoint::{AppEndpoint, OpenParams, UnexpHandler};
use crate::errors::{Failure, MxResult};

use super::{endpoint_of, put, put_opt, run};

/// Reads the `mx_param_t` array of `mx_open_endpoint`.
///
/// # Safety
/// `list` is NULL or points to `count` readable `mx_param_t`.
unsafe fn read_params(list: *const MxParam, count: u32) -> MxResult<OpenParams> {
    let mut p = OpenParams::default();
    if count == 0 {
        return Ok(p);
    }
    if list.is_null() {
        return Err(Failure::new(
            MxReturn::BadParamList,
            format!("NULL parameter list with {count} entries"),
        ));
    }
    if count > 64 {
        return Err(Failure::new(
            MxReturn::BadParamList,
            format!("{count} parameters"),
        ));
    }
    // SAFETY: the caller guarantees `count` readable entries; copied once.
    let params = unsafe { std::slice::from_raw_parts(list, count as usize) }.to_vec();
    for param in params {
        match ParamKey::from_raw(param.key) {
            // SAFETY: the key says which union member the application set.
            Some(ParamKey::ErrorHandler) => p.error_handler = unsafe { param.val.error_handler },
            Some(ParamKey::UnexpQueueMax) => {
                // The core bounds unexpected data by bytes; nothing to set.
            }
            Some(ParamKey::ContextId) => {
                // SAFETY: as above.
                let c = unsafe { param.val.context_id };
                p.context_id = Some((c.bits, c.shift));
            }
            None => {
                return Err(Failure::new(
                    MxReturn::BadParamName,
                    format!("unknown parameter key {}", param.key),
                ))
            }
        }
    }
    Ok(p)
}

/// `mx_open_endpoint`.
///
/// # Safety
/// Pointers as MX documents them: `params_array` holds `params_count`
/// entries, `endpoint` is writable.
#[cfg_attr(any(test, not(target_os = "linux")), no_mangle)]
pub unsafe extern "C" fn mx_open_endpoint(
    board_number: u32,
    endpoint_id: u32,
    endpoint_key: u32,
    params_array: *mut MxParam,
    params_count: u32,
    endpoint: *mut *mut c_void,
) -> c_int {
    run("mx_open_endpoint", |_| {
        let lib = crate::runtime::library()?;
        // SAFETY: per this function's contract.
        let params = unsafe { read_params(params_array, params_count) }?;
        if endpoint.is_null() {
            return Err(Failure::new(MxReturn::BadInfoVal, "NULL endpoint pointer"));
        }
        let board = if board_number == MX_ANY_NIC {
            0
        } else {
            board_number
        };
        let id = match endpoint_id {
            MX_ANY_ENDPOINT => None,
            n => Some(u8::try_from(n).map_err(|_| {
                Failure::new(
                    MxReturn::BadEndpointId,
                    format!("endpoint id {n} out of range"),
                )
            })?),
        };
        let ep = AppEndpoint::open(&lib, board, id, endpoint_key, params)?;
        // SAFETY: checked non-NULL; writable per the contract.
        unsafe { put(endpoint, ep.handle() as usize as *mut c_void, "endpoint") }
    })
}

/// `mx_close_endpoint`.
#[no_mangle]
pub extern "C" fn mx_close_endpoint(endpoint: *mut c_void) -> c_int {
    run("mx_close_endpoint", |h| {
        let ep = endpoint_of(endpoint, h)?;
        if AppEndpoint::in_handler() {
            return Err(Failure::new(
                MxReturn::CloseInHandler,
                "closing an endpoint from its handler",
            ));
        }
        if let Ok(lib) = crate::runtime::library() {
            lib.remove_endpoint(ep.handle());
        }
        ep.close();
        Ok(())
    })
}

/// `mx_wakeup`.
#[no_mangle]
pub extern "C" fn mx_wakeup(endpoint: *mut c_void) -> c_int {
    run("mx_wakeup", |h| {
        endpoint_of(endpoint, h)?.wakeup();
        Ok(())
    })
}

/// `mx_disable_progression`.
#[no_mangle]
pub extern "C" fn mx_disable_progression(endpoint: *mut c_void) -> c_int {
    run("mx_disable_progression", |h| {
        endpoint_of(endpoint, h)?.set_progression(false);
        Ok(())
    })
}

/// `mx_reenable_progression`.
#[no_mangle]
pub extern "C" fn mx_reenable_progression(endpoint: *mut c_void) -> c_int {
    run("mx_reenable_progression", |h| {
        endpoint_of(endpoint, h)?.set_progression(true);
        Ok(())
    })
}

/// `mx_progress`.
#[no_mangle]
pub extern "C" fn mx_progress(endpoint: *mut c_void) -> c_int {
    run("mx_progress", |h| {
        endpoint_of(endpoint, h)?.with_state(|_, _| Ok(()))
    })
}

/// `mx_get_endpoint_addr`.
///
/// # Safety
/// `endpoint_addr` is writable.
#[no_mangle]
pub unsafe extern "C" fn mx_get_endpoint_addr(
    endpoint: *mut c_void,
    endpoint_addr: *mut MxEndpointAddr,
) -> c_int {
    run("mx_get_endpoint_addr", |h| {
        let ep = endpoint_of(endpoint, h)?;
        // SAFETY: per the contract.
        unsafe { put(endpoint_addr, ep.addr(), "address") }
    })
}

/// `mx_decompose_endpoint_addr`.
///
/// # Safety
/// Output pointers are writable (or NULL).
#[cfg_attr(any(test, not(target_os = "linux")), no_mangle)]
pub unsafe extern "C" fn mx_decompose_endpoint_addr(
    endpoint_addr: MxEndpointAddr,
    nic_id: *mut u64,
    endpoint_id: *mut u32,
) -> c_int {
    run("mx_decompose_endpoint_addr", |_| {
        let a = ours(endpoint_addr)?;
        // SAFETY: per the contract.
        unsafe {
            put_opt(nic_id, a.nic_id);
            put_opt(endpoint_id, a.endpoint as u32);
        }
        Ok(())
    })
}

/// `mx_decompose_endpoint_addr2`.
///
/// # Safety
/// Output pointers are writable (or NULL).
#[no_mangle]
pub unsafe extern "C" fn mx_decompose_endpoint_addr2(
    endpoint_addr: MxEndpointAddr,
    nic_id: *mut u64,
    endpoint_id: *mut u32,
    session_id: *mut u32,
) -> c_int {
    run("mx_decompose_endpoint_addr2", |_| {
        let a = ours(endpoint_addr)?;
        // SAFETY: per the contract.
        unsafe {
            put_opt(nic_id, a.nic_id);
            put_opt(endpoint_id, a.endpoint as u32);
            put_opt(session_id, a.session);
        }
        Ok(())
    })
}

/// Decodes an address the library made; garbage is `MX_BAD_ENDPOINT`.
fn ours(a: MxEndpointAddr) -> MxResult<Addr> {
    if !Addr::is_ours(a) {
        return Err(Failure::new(
            MxReturn::BadEndpoint,
            format!(
                "{:016x}{:016x} is not an endpoint address",
                a.stuff[0], a.stuff[1]
            ),
        ));
    }
    Ok(Addr::decode(a))
}

fn owner_of(addr: &Addr, h: &mut Option<MxErrorHandler>) -> MxResult<std::sync::Arc<AppEndpoint>> {
    endpoint_of(addr.local as usize as *mut c_void, h)
}

/// `mx_set_endpoint_addr_context`.
#[no_mangle]
pub extern "C" fn mx_set_endpoint_addr_context(
    endpoint_addr: MxEndpointAddr,
    context: *mut c_void,
) -> c_int {
    run("mx_set_endpoint_addr_context", |h| {
        let a = Addr::decode(endpoint_addr);
        owner_of(&a, h)?.set_addr_context(&a, context as usize)
    })
}

/// `mx_get_endpoint_addr_context`.
///
/// # Safety
/// `context` is writable.
#[no_mangle]
pub unsafe extern "C" fn mx_get_endpoint_addr_context(
    endpoint_addr: MxEndpointAddr,
    context: *mut *mut c_void,
) -> c_int {
    run("mx_get_endpoint_addr_context", |h| {
        let a = Addr::decode(endpoint_addr);
        let c = owner_of(&a, h)?.addr_context(&a)?;
        // SAFETY: per the contract.
        unsafe { put(context, c as *mut c_void, "context") }
    })
}

/// `mx_register_unexp_handler` (NULL removes it).
#[no_mangle]
pub extern "C" fn mx_register_unexp_handler(
    endpoint: *mut c_void,
    handler: Option<MxUnexpHandler>,
    context: *mut c_void,
) -> c_int {
    run("mx_register_unexp_handler", |h| {
        endpoint_of(endpoint, h)?
            .register_unexp_handler(handler.map(UnexpHandler::Handler), context as usize)
    })
}

/// `mx_register_unexp_callback`: the older form; the callback sees each
/// unexpected message and matching goes on.
#[no_mangle]
pub extern "C" fn mx_register_unexp_callback(
    endpoint: *mut c_void,
    callback: Option<MxMatchingCallback>,
    context: *mut c_void,
) -> c_int {
    run("mx_register_unexp_callback", |h| {
        endpoint_of(endpoint, h)?
            .register_unexp_handler(callback.map(UnexpHandler::Callback), context as usize)
    })
}

/// `mx_connect`.
///
/// # Safety
/// `addr` is writable.
#[no_mangle]
pub unsafe extern "C" fn mx_connect(
    endpoint: *mut c_void,
    nic_id: u64,
    endpoint_id: u32,
    key: u32,
    timeout: u32,
    addr: *mut MxEndpointAddr,
) -> c_int {
    run("mx_connect", |h| {
        let ep = endpoint_of(endpoint, h)?;
        if addr.is_null() {
            return Err(Failure::new(MxReturn::BadInfoVal, "NULL address pointer"));
        }
        let a = ep.connect(nic_id, endpoint_id, key, timeout)?;
        // SAFETY: checked non-NULL; writable per the contract.
        unsafe { put(addr, a, "address") }
    })
}

/// `mx_iconnect`.
///
/// # Safety
/// `request` is writable.
#[no_mangle]
pub unsafe extern "C" fn mx_iconnect(
    endpoint: *mut c_void,
    nic_id: u64,
    endpoint_id: u32,
    key: u32,
    match_info: u64,
    context: *mut c_void,
    request: *mut *mut c_void,
) -> c_int {
    run("mx_iconnect", |h| {
        let ep = endpoint_of(endpoint, h)?;
        if request.is_null() {
            return Err(Failure::new(MxReturn::BadRequest, "NULL request pointer"));
        }
        let t = ep.iconnect(nic_id, endpoint_id, key, match_info, context as usize)?;
        // SAFETY: checked non-NULL; writable per the contract.
        unsafe { put(request, t as *mut c_void, "request") }
    })
}

/// `mx_disconnect`.
#[no_mangle]
pub extern "C" fn mx_disconnect(endpoint: *mut c_void, addr: MxEndpointAddr) -> c_int {
    run("mx_disconnect", |h| {
        endpoint_of(endpoint, h)?.disconnect(addr)
    })
}

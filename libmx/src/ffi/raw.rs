//! The raw interface of mapper tools (`mx_raw.h`), over the transport's
//! raw ports and peer table.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Arc;
use std::time::Duration;

use crate::abi::{
    MxParam, MxReturn, MX_INVALID_HANDLE, MX_RAW_NO_EVENT, MX_RAW_RECV_COMPLETE,
    MX_RAW_SEND_COMPLETE, MX_SPEED_10G,
};
use crate::doorbell::Doorbell;
use crate::errors::{Failure, MxResult};
use crate::raw::{RawEndpoint, RawEvent};

use super::{put, put_opt, run};

fn raw_of(endpoint: *mut c_void) -> MxResult<Arc<RawEndpoint>> {
    crate::runtime::library()?.raw(endpoint as usize)
}

/// Reads a hostname argument.
///
/// # Safety
/// `s` NULL or NUL-terminated.
unsafe fn name(s: *const c_char) -> MxResult<Option<String>> {
    if s.is_null() {
        return Ok(None);
    }
    // SAFETY: NUL-terminated per the contract.
    Ok(Some(
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned(),
    ))
}

/// `mx_raw_open_endpoint`.
///
/// # Safety
/// `endpoint` writable; `params_array` holds `params_count` entries.
#[no_mangle]
pub unsafe extern "C" fn mx_raw_open_endpoint(
    board_number: u32,
    params_array: *mut MxParam,
    params_count: u32,
    endpoint: *mut *mut c_void,
) -> c_int {
    run("mx_raw_open_endpoint", |_| {
        let lib = crate::runtime::library()?;
        if params_count > 0 && params_array.is_null() {
            return Err(Failure::new(MxReturn::BadParamList, "NULL parameter list"));
        }
        if endpoint.is_null() {
            return Err(Failure::new(MxReturn::BadInfoVal, "NULL endpoint pointer"));
        }
        let handle = lib.new_handle();
        let doorbell = Arc::new(Doorbell::new(lib.settings.spin, handle as u64, None));
        let port = lib.transport.open_raw(board_number, doorbell.clone())?;
        lib.add_raw(Arc::new(RawEndpoint::new(
            handle,
            board_number,
            port,
            doorbell,
        )));
        // SAFETY: checked non-NULL; writable per the contract.
        unsafe { put(endpoint, handle as usize as *mut c_void, "endpoint") }
    })
}

/// `mx_raw_close_endpoint`.
#[no_mangle]
pub extern "C" fn mx_raw_close_endpoint(endpoint: *mut c_void) -> c_int {
    run("mx_raw_close_endpoint", |_| {
        crate::runtime::library()?
            .remove_raw(endpoint as usize)
            .map(|_| ())
            .ok_or_else(|| Failure::new(MxReturn::BadEndpoint, "not an open raw endpoint"))
    })
}

/// `mx_raw_handle`: no file descriptor stands behind a raw endpoint here.
#[no_mangle]
pub extern "C" fn mx_raw_handle(_endpoint: *mut c_void) -> c_int {
    MX_INVALID_HANDLE
}

/// `mx_raw_send`: the route is meaningless on Ethernet and ignored.
///
/// # Safety
/// `send_buffer` readable for `buffer_length` bytes.
#[no_mangle]
pub unsafe extern "C" fn mx_raw_send(
    endpoint: *mut c_void,
    _physical_port: u32,
    _route_pointer: *mut c_void,
    _route_length: u32,
    send_buffer: *mut c_void,
    buffer_length: u32,
    context: *mut c_void,
) -> c_int {
    run("mx_raw_send", |_| {
        let raw = raw_of(endpoint)?;
        if send_buffer.is_null() && buffer_length > 0 {
            return Err(Failure::new(MxReturn::BadSegMem, "NULL send buffer"));
        }
        let data = if buffer_length == 0 {
            Vec::new()
        } else {
            // SAFETY: readable for `buffer_length` bytes per the contract;
            // copied before the call returns.
            unsafe { std::slice::from_raw_parts(send_buffer as *const u8, buffer_length as usize) }
                .to_vec()
        };
        raw.send(&data, context as usize)
    })
}

/// `mx_raw_next_event`: a send completion, a received frame, or
/// `MX_RAW_NO_EVENT` after `timeout_ms`.
///
/// # Safety
/// `recv_buffer` writable for `*recv_bytes` bytes; other pointers writable
/// or NULL.
#[no_mangle]
pub unsafe extern "C" fn mx_raw_next_event(
    endpoint: *mut c_void,
    incoming_port: *mut u32,
    context: *mut *mut c_void,
    recv_buffer: *mut c_void,
    recv_bytes: *mut u32,
    timeout_ms: u32,
    status: *mut c_int,
) -> c_int {
    run("mx_raw_next_event", |_| {
        let raw = raw_of(endpoint)?;
        let ev = raw.next_event(Duration::from_millis(timeout_ms as u64));
        // SAFETY: output pointers per the contract.
        unsafe {
            match ev {
                None => put_opt(status, MX_RAW_NO_EVENT),
                Some(RawEvent::SendComplete(c)) => {
                    put_opt(context, c as *mut c_void);
                    put_opt(status, MX_RAW_SEND_COMPLETE);
                }
                Some(RawEvent::Received(frame)) => {
                    let room = if recv_bytes.is_null() {
                        0
                    } else {
                        recv_bytes.read_unaligned() as usize
                    };
                    let n = frame.len().min(room);
                    if n > 0 && !recv_buffer.is_null() {
                        std::ptr::copy_nonoverlapping(frame.as_ptr(), recv_buffer as *mut u8, n);
                    }
                    put_opt(recv_bytes, n as u32);
                    put_opt(incoming_port, 0);
                    put_opt(status, MX_RAW_RECV_COMPLETE);
                }
            }
        }
        Ok(())
    })
}

/// `mx_raw_set_route_begin`: nothing to prepare (no source routes on Ethernet).
#[no_mangle]
pub extern "C" fn mx_raw_set_route_begin(endpoint: *mut c_void) -> c_int {
    run("mx_raw_set_route_begin", |_| raw_of(endpoint).map(|_| ()))
}

/// `mx_raw_set_route_end`: nothing to commit.
#[no_mangle]
pub extern "C" fn mx_raw_set_route_end(endpoint: *mut c_void) -> c_int {
    run("mx_raw_set_route_end", |_| raw_of(endpoint).map(|_| ()))
}

/// `mx_raw_set_route_mag`: a route names a reachable peer; it joins the
/// peer table.
#[no_mangle]
pub extern "C" fn mx_raw_set_route_mag(
    endpoint: *mut c_void,
    destination_id: u64,
    _route: *mut c_void,
    _route_length: u32,
    _input_port: u32,
    _output_port: u32,
    _host_type: c_int,
    _mag_id: u32,
) -> c_int {
    run("mx_raw_set_route_mag", |_| {
        raw_of(endpoint)?;
        crate::runtime::library()?
            .transport
            .add_peer(destination_id, None)
    })
}

/// `mx_raw_set_route`: as `mx_raw_set_route_mag`.
#[no_mangle]
pub extern "C" fn mx_raw_set_route(
    endpoint: *mut c_void,
    destination_id: u64,
    _route: *mut c_void,
    _route_length: u32,
    _input_port: u32,
    _output_port: u32,
    _host_type: c_int,
) -> c_int {
    run("mx_raw_set_route", |_| {
        raw_of(endpoint)?;
        crate::runtime::library()?
            .transport
            .add_peer(destination_id, None)
    })
}

/// `mx_raw_clear_routes`: routes are not kept, nothing to clear.
#[no_mangle]
pub extern "C" fn mx_raw_clear_routes(
    endpoint: *mut c_void,
    _destination_id: u64,
    _port: u32,
) -> c_int {
    run("mx_raw_clear_routes", |_| raw_of(endpoint).map(|_| ()))
}

/// `mx_raw_remove_peer`.
#[no_mangle]
pub extern "C" fn mx_raw_remove_peer(endpoint: *mut c_void, destination_id: u64) -> c_int {
    run("mx_raw_remove_peer", |_| {
        raw_of(endpoint)?;
        if crate::runtime::library()?
            .transport
            .remove_peer(destination_id)
        {
            Ok(())
        } else {
            Err(Failure::new(
                MxReturn::NicNotFound,
                format!("NIC {destination_id:012x} is not a removable peer"),
            ))
        }
    })
}

/// `mx_raw_set_map_version`: map bookkeeping has no use without a mapper
/// driver; accepted.
#[no_mangle]
pub extern "C" fn mx_raw_set_map_version(
    endpoint: *mut c_void,
    _physical_port: u32,
    _mapper_id: u64,
    _map_version: u32,
    _num_nodes: u32,
    _mapping_complete: u32,
) -> c_int {
    run("mx_raw_set_map_version", |_| raw_of(endpoint).map(|_| ()))
}

/// `mx_raw_num_ports`: one port per board.
///
/// # Safety
/// `num_ports` writable.
#[no_mangle]
pub unsafe extern "C" fn mx_raw_num_ports(endpoint: *mut c_void, num_ports: *mut u32) -> c_int {
    run("mx_raw_num_ports", |_| {
        raw_of(endpoint)?;
        // SAFETY: per the contract.
        unsafe { put(num_ports, 1, "num_ports") }
    })
}

/// `mx_raw_line_speed`.
///
/// # Safety
/// `speed` writable.
#[no_mangle]
pub unsafe extern "C" fn mx_raw_line_speed(endpoint: *mut c_void, speed: *mut u32) -> c_int {
    run("mx_raw_line_speed", |_| {
        raw_of(endpoint)?;
        // SAFETY: per the contract.
        unsafe { put(speed, MX_SPEED_10G, "speed") }
    })
}

/// `mx_raw_set_hostname`: renames the endpoint's board.
///
/// # Safety
/// `hostname` NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn mx_raw_set_hostname(
    endpoint: *mut c_void,
    hostname: *mut c_char,
) -> c_int {
    run("mx_raw_set_hostname", |_| {
        let raw = raw_of(endpoint)?;
        // SAFETY: per the contract.
        let n = unsafe { name(hostname) }?
            .ok_or_else(|| Failure::new(MxReturn::BadHostnameArgs, "NULL hostname"))?;
        crate::runtime::library()?
            .transport
            .set_hostname(raw.board(), &n)
    })
}

/// `mx_raw_set_peer_name`: adds or renames a peer.
///
/// # Safety
/// `hostname` NUL-terminated or NULL.
#[no_mangle]
pub unsafe extern "C" fn mx_raw_set_peer_name(
    endpoint: *mut c_void,
    nic_id: u64,
    hostname: *mut c_char,
) -> c_int {
    run("mx_raw_set_peer_name", |_| {
        raw_of(endpoint)?;
        // SAFETY: per the contract.
        let n = unsafe { name(hostname) }?;
        crate::runtime::library()?
            .transport
            .add_peer(nic_id, n.as_deref())
    })
}

/// `mx_raw_set_nic_reply_info`: the NIC reply blob serves MX's firmware
/// mapper only; accepted.
#[no_mangle]
pub extern "C" fn mx_raw_set_nic_reply_info(
    endpoint: *mut c_void,
    _blob: *mut c_void,
    _size: u32,
) -> c_int {
    run("mx_raw_set_nic_reply_info", |_| {
        raw_of(endpoint).map(|_| ())
    })
}

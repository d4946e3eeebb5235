//! `mx_get_info` and the NIC id / hostname / board number lookups.

use std::ffi::{c_char, c_int, c_void, CStr};

use crate::abi::{
    InfoKey, MxReturn, MX_MAX_HOSTNAME_LEN, MX_MAX_STR_LEN, MX_NET_ETHER, MX_SPEED_10G,
};
use crate::counters;
use crate::errors::{Failure, MxResult};

use super::{endpoint_of, put, run};

/// Copies `bytes` to `out` (room `len`), NUL-terminated, truncating.
///
/// # Safety
/// `out` is writable for `len` bytes.
unsafe fn put_str(out: *mut c_char, len: usize, s: &str) {
    if len == 0 {
        return;
    }
    let n = s.len().min(len - 1);
    // SAFETY: `out` has room for `len >= n + 1` bytes per the contract.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), out as *mut u8, n);
        *out.add(n) = 0;
    }
}

fn need(out_len: u32, n: usize, what: &str) -> MxResult<()> {
    if (out_len as usize) < n {
        return Err(Failure::new(
            MxReturn::BadInfoLength,
            format!("{what} needs {n} bytes, {out_len} given"),
        ));
    }
    Ok(())
}

/// `mx_get_info`.
///
/// # Safety
/// `out_val` is writable for `out_len` bytes.
#[cfg_attr(any(test, not(target_os = "linux")), no_mangle)]
pub unsafe extern "C" fn mx_get_info(
    endpoint: *mut c_void,
    key: c_int,
    _in_val: *mut c_void,
    _in_len: u32,
    out_val: *mut c_void,
    out_len: u32,
) -> c_int {
    run("mx_get_info", |h| {
        let lib = crate::runtime::library()?;
        if !endpoint.is_null() {
            endpoint_of(endpoint, h)?;
        }
        let key = InfoKey::from_raw(key as u32)
            .ok_or_else(|| Failure::new(MxReturn::BadInfoKey, format!("info key {key}")))?;
        if out_val.is_null() {
            return Err(Failure::new(MxReturn::BadInfoVal, "NULL output pointer"));
        }
        let boards = lib.transport.boards();
        let u32_out = |v: u32| -> MxResult<()> {
            need(out_len, 4, key.c_name())?;
            // SAFETY: at least 4 writable bytes per the check and contract.
            unsafe { put(out_val as *mut u32, v, "info") }
        };
        match key {
            InfoKey::NicCount => u32_out(boards.len() as u32),
            InfoKey::NicIds => {
                let n = (boards.len() + 1) * 8;
                need(out_len, n, "MX_NIC_IDS")?;
                let out = out_val as *mut u64;
                for (i, b) in boards
                    .iter()
                    .chain(std::iter::once(&crate::transport::BoardInfo {
                        nic_id: 0,
                        hostname: String::new(),
                        max_endpoints: 0,
                        numa_node: 0,
                    }))
                    .enumerate()
                {
                    // SAFETY: `n` writable bytes per the check and contract.
                    unsafe { out.add(i).write_unaligned(b.nic_id) };
                }
                Ok(())
            }
            InfoKey::MaxNativeEndpoints => u32_out(boards.first().map_or(0, |b| b.max_endpoints)),
            InfoKey::NativeRequests => u32_out(u32::MAX),
            InfoKey::CountersCount => u32_out(counters::ALL.len() as u32),
            InfoKey::CountersLabels => {
                need(
                    out_len,
                    counters::ALL.len() * MX_MAX_STR_LEN,
                    "MX_COUNTERS_LABELS",
                )?;
                for (i, (_, label)) in counters::ALL.iter().enumerate() {
                    // SAFETY: room for every label slot per the check.
                    unsafe {
                        put_str(
                            (out_val as *mut c_char).add(i * MX_MAX_STR_LEN),
                            MX_MAX_STR_LEN,
                            label,
                        )
                    };
                }
                Ok(())
            }
            InfoKey::CountersValues => {
                need(out_len, counters::ALL.len() * 4, "MX_COUNTERS_VALUES")?;
                for (i, (c, _)) in counters::ALL.iter().enumerate() {
                    // SAFETY: room for every value per the check.
                    unsafe {
                        (out_val as *mut u32)
                            .add(i)
                            .write_unaligned(counters::get(*c))
                    };
                }
                Ok(())
            }
            InfoKey::ProductCode | InfoKey::PartNumber | InfoKey::SerialNumber => {
                need(out_len, 1, key.c_name())?;
                let text = format!("N/A (xmx {})", lib.transport.name());
                // SAFETY: `out_len` writable bytes per the contract.
                unsafe { put_str(out_val as *mut c_char, out_len as usize, &text) };
                Ok(())
            }
            InfoKey::PortCount => u32_out(1),
            InfoKey::PioSendMax => u32_out(xmx_mx::SMALL_MAX as u32),
            InfoKey::CopySendMax => u32_out(xmx_mx::MEDIUM_MAX as u32),
            InfoKey::NumaNode => u32_out(boards.first().map_or(u32::MAX, |b| b.numa_node)),
            InfoKey::NetType => u32_out(MX_NET_ETHER),
            InfoKey::LineSpeed => u32_out(MX_SPEED_10G),
        }
    })
}

/// Reads a C string argument.
///
/// # Safety
/// `s` is NULL or NUL-terminated.
unsafe fn c_str(s: *const c_char) -> MxResult<String> {
    if s.is_null() {
        return Err(Failure::new(MxReturn::BadHostnameArgs, "NULL hostname"));
    }
    // SAFETY: NUL-terminated per the contract.
    Ok(unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
}

/// `mx_hostname_to_nic_id` (`host:board`, or `host` for board 0).
///
/// # Safety
/// `hostname` NUL-terminated, `nic_id` writable.
#[no_mangle]
pub unsafe extern "C" fn mx_hostname_to_nic_id(hostname: *mut c_char, nic_id: *mut u64) -> c_int {
    run("mx_hostname_to_nic_id", |_| {
        let lib = crate::runtime::library()?;
        // SAFETY: per the contract.
        let name = unsafe { c_str(hostname) }?;
        if nic_id.is_null() {
            return Err(Failure::new(
                MxReturn::BadHostnameArgs,
                "NULL nic_id pointer",
            ));
        }
        let t = &lib.transport;
        let found = t
            .peer_by_hostname(&name)
            .or_else(|| (!name.contains(':')).then(|| t.peer_by_hostname(&format!("{name}:0")))?)
            .ok_or_else(|| Failure::new(MxReturn::HostNotFound, format!("host {name}")))?;
        // SAFETY: checked non-NULL; writable per the contract.
        unsafe { put(nic_id, found, "nic_id") }
    })
}

/// `mx_board_number_to_nic_id`.
///
/// # Safety
/// `nic_id` writable.
#[no_mangle]
pub unsafe extern "C" fn mx_board_number_to_nic_id(board_number: u32, nic_id: *mut u64) -> c_int {
    run("mx_board_number_to_nic_id", |_| {
        let lib = crate::runtime::library()?;
        let b = lib
            .transport
            .boards()
            .get(board_number as usize)
            .map(|b| b.nic_id)
            .ok_or_else(|| Failure::new(MxReturn::BoardUnknown, format!("board {board_number}")))?;
        // SAFETY: per the contract.
        unsafe { put(nic_id, b, "nic_id") }
    })
}

/// `mx_nic_id_to_board_number`.
///
/// # Safety
/// `board_number` writable.
#[no_mangle]
pub unsafe extern "C" fn mx_nic_id_to_board_number(nic_id: u64, board_number: *mut u32) -> c_int {
    run("mx_nic_id_to_board_number", |_| {
        let lib = crate::runtime::library()?;
        let i = lib
            .transport
            .boards()
            .iter()
            .position(|b| b.nic_id == nic_id)
            .ok_or_else(|| {
                Failure::new(
                    MxReturn::BoardUnknown,
                    format!("NIC {nic_id:012x} is not a local board"),
                )
            })?;
        // SAFETY: per the contract.
        unsafe { put(board_number, i as u32, "board_number") }
    })
}

/// `mx_nic_id_to_hostname` (into `MX_MAX_HOSTNAME_LEN` bytes).
///
/// # Safety
/// `hostname` writable for `MX_MAX_HOSTNAME_LEN` bytes.
#[no_mangle]
pub unsafe extern "C" fn mx_nic_id_to_hostname(nic_id: u64, hostname: *mut c_char) -> c_int {
    run("mx_nic_id_to_hostname", |_| {
        let lib = crate::runtime::library()?;
        if hostname.is_null() {
            return Err(Failure::new(
                MxReturn::BadHostnameArgs,
                "NULL hostname buffer",
            ));
        }
        let name = lib.transport.peer_hostname(nic_id).ok_or_else(|| {
            Failure::new(
                MxReturn::HostNotFound,
                format!("no hostname for NIC {nic_id:012x}"),
            )
        })?;
        // SAFETY: MX_MAX_HOSTNAME_LEN writable bytes per the contract.
        unsafe { put_str(hostname, MX_MAX_HOSTNAME_LEN, &name) };
        Ok(())
    })
}

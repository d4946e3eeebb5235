//! MX's internal symbols that MPI implementations reference: Open MPI's MX
//! support links against them (its configure probes for them), so a library
//! without them cannot even be loaded by such a build.

use std::ffi::{c_int, c_void};

use crate::abi::{MxMapperState, MxReturn};
use crate::errors::Failure;

use super::{put, run};

/// `mx_endpt_handle_t`: MX's handle of an open board device.
type BoardHandle = c_int;

/// `mx_open_board`: a handle on board `board` for the calls below. The
/// handle is the board number; no device stays open.
///
/// # Safety
/// `handle` writable.
#[no_mangle]
pub unsafe extern "C" fn mx_open_board(board: c_int, handle: *mut BoardHandle) -> c_int {
    run("mx_open_board", |_| {
        let lib = crate::runtime::library()?;
        let known = usize::try_from(board).is_ok_and(|b| b < lib.transport.boards().len());
        if !known {
            return Err(Failure::new(
                MxReturn::BoardUnknown,
                format!("no board {board}"),
            ));
        }
        // SAFETY: per the contract.
        unsafe { put(handle, board, "handle") }
    })
}

/// `mx__get_mapper_state`: the state of the fabric's map as board `handle`
/// sees it. xmx has no mapper: the peer table is the map, configured and
/// routed once the board is up, and the fabric is named by the lowest NIC
/// id in the table, the same on every host sharing the table (MPI compares
/// mapper MACs to tell fabrics apart).
///
/// # Safety
/// `state` writable.
#[allow(non_snake_case)]
#[no_mangle]
pub unsafe extern "C" fn mx__get_mapper_state(
    handle: BoardHandle,
    state: *mut MxMapperState,
) -> c_int {
    run("mx__get_mapper_state", |_| {
        let lib = crate::runtime::library()?;
        let boards = lib.transport.boards();
        let Some(board) = usize::try_from(handle).ok().and_then(|b| boards.get(b)) else {
            return Err(Failure::new(
                MxReturn::BadEndpoint,
                format!("{handle} is not a board handle"),
            ));
        };
        let peers: Vec<u64> = (0..=u16::MAX)
            .filter_map(|i| lib.transport.peer_nic_id(i))
            .collect();
        let name = peers.iter().copied().min().unwrap_or(board.nic_id);
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&name.to_be_bytes()[2..]);
        let s = MxMapperState {
            board_number: handle as u32,
            mapper_mac: mac,
            iport: 0,
            map_version: 1,
            num_hosts: peers.len().max(1) as u32,
            network_configured: 1,
            routes_valid: 1,
            level: 0,
            flags: 0,
        };
        // SAFETY: per the contract.
        unsafe { put(state, s, "mapper state") }
    })
}

/// `mx__regcache_clean`: the application (an MPI's memory hooks) is about
/// to free or remap `[ptr, ptr + len)`: every endpoint drops the cached
/// registrations overlapping it. Returns 0, as MX. Without a registration
/// cache (`MX_RCACHE` unset) there is nothing to drop and no lock is taken,
/// so hooks that fire inside allocations cost nothing.
#[allow(non_snake_case)]
#[no_mangle]
pub extern "C" fn mx__regcache_clean(ptr: *mut c_void, len: usize) -> c_int {
    let _ = std::panic::catch_unwind(|| {
        let Ok(lib) = crate::runtime::library() else {
            return;
        };
        if !lib.settings.rcache || len == 0 {
            return;
        }
        for ep in lib.endpoints() {
            ep.invalidate_registrations(ptr as usize, len);
        }
    });
    0
}

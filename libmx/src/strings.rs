//! Human-readable texts of return codes and status codes (`mx_strerror`,
//! `mx_strstatus`), as NUL-terminated static strings the C caller may keep.

use std::ffi::CStr;

use crate::abi::MxReturn;

/// The text of a return code; unknown codes get a generic text rather than
/// an error, since callers print whatever they were given.
pub(crate) fn strerror(code: u32) -> &'static CStr {
    use MxReturn::*;
    let Some(r) = MxReturn::from_raw(code) else {
        return c"Unknown return code";
    };
    match r {
        Success => c"Success",
        BadBadBad => c"Internal error",
        Failure => c"Operation failed",
        AlreadyInitialized => c"Library already initialized",
        NotInitialized => c"Library not initialized",
        NoDev => c"No MX device",
        NoDriver => c"MX driver not available",
        NoPerm => c"Permission denied",
        BoardUnknown => c"No such board",
        BadEndpoint => c"Invalid or closed endpoint",
        BadSegList => c"Segment list is NULL but the count is not 0",
        BadSegMem => c"Invalid segment memory",
        BadSegCnt => c"Too many segments",
        BadRequest => c"Invalid request for this operation",
        BadMatchMask => c"Match info has bits outside the match mask",
        NoResources => c"Out of resources",
        BadAddrList => c"Invalid address list",
        BadAddrCount => c"Invalid address count",
        BadRoot => c"Invalid root index",
        NotCompleted => c"Operations are still pending",
        Busy => c"Resource busy",
        BadInfoKey => c"Unknown info key",
        BadInfoVal => c"Invalid info value pointer",
        BadNic => c"Invalid NIC id",
        BadParamList => c"Parameter list is NULL but the count is not 0",
        BadParamName => c"Unknown endpoint parameter",
        BadParamVal => c"Invalid endpoint parameter value",
        BadHostnameArgs => c"Invalid hostname lookup arguments",
        HostNotFound => c"Host not found",
        RequestPending => c"Request data not buffered yet",
        Timeout => c"Timed out",
        NoMatch => c"No message matches",
        BadEndpointId => c"Endpoint id out of range",
        ConnectionFailed => c"Connection refused: no endpoint at this address",
        BadConnectionKey => c"Connection refused: wrong key",
        BadInfoLength => c"Info buffer too short",
        NicNotFound => c"NIC not in the peer table",
        BadKernelVersion => c"Library and driver versions differ",
        BadLibVersion => c"Application built for another MX API version",
        NicDead => c"NIC is dead",
        CancelNotSupported => c"This request cannot be cancelled",
        CloseInHandler => c"Operation not allowed in a handler",
        BadMatchingForContextIdMask => c"Match mask leaves context-id bits unmatched",
        NotSupportedWithContextId => c"Not supported with context ids",
    }
}

/// The text of a status code.
pub(crate) fn strstatus(code: u32) -> &'static CStr {
    match code {
        0 => c"Success",
        1 => c"Pending",
        2 => c"Buffered",
        3 => c"Rejected",
        4 => c"Timed out",
        5 => c"Message truncated",
        6 => c"Cancelled",
        7 => c"Remote endpoint unknown",
        8 => c"Remote endpoint closed",
        9 => c"Remote endpoint unreachable",
        10 => c"Bad session (remote endpoint reopened?)",
        11 => c"Connection key refused",
        12 => c"No such remote endpoint",
        13 => c"Invalid RDMA window",
        14 => c"Aborted",
        15 => c"Event queue full",
        16 => c"Out of resources",
        _ => c"Unknown status code",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_its_own_text() {
        let texts: std::collections::HashSet<&CStr> = (0..44).map(strerror).collect();
        assert_eq!(texts.len(), 44);
        assert_eq!(strerror(44), c"Unknown return code");
        assert_eq!(strerror(u32::MAX), c"Unknown return code");
        let statuses: std::collections::HashSet<&CStr> = (0..17).map(strstatus).collect();
        assert_eq!(statuses.len(), 17);
        assert_eq!(strstatus(5), c"Message truncated");
        assert_eq!(strstatus(17), c"Unknown status code");
    }
}

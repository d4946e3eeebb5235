//! The C types and values of the MX interface, laid out as `myriexpress.h`
//! declares them (and as Myricom's MX and Open-MX do).
//!
//! Values that cross the boundary from C into the library (return codes
//! given to `mx_strerror`, parameter keys, `mx_get_info` keys) arrive as raw
//! integers and are decoded with the `from_raw` functions here: an unknown
//! value is an error, never a transmuted enum.

use std::ffi::{c_char, c_int, c_void};

/// `MX_API`: the interface version `mx_init()` passes to `mx__init_api`.
pub(crate) const MX_API: c_int = 0x301;
/// `MX_MAX_STR_LEN`: size of each counter label slot of `mx_get_info`.
pub(crate) const MX_MAX_STR_LEN: usize = 128;
/// `MX_SIZEOF_ADDR`: size of `mx_endpoint_addr_t`.
pub(crate) const MX_SIZEOF_ADDR: usize = 16;
/// `MX_ANY_NIC`: any board.
pub(crate) const MX_ANY_NIC: u32 = 0xffff_ffff;
/// `MX_ANY_ENDPOINT`: the first free endpoint id.
pub(crate) const MX_ANY_ENDPOINT: u32 = 0xffff_ffff;
/// `MX_MAX_SEGMENTS`: most segments of one send or receive.
pub(crate) const MX_MAX_SEGMENTS: u32 = 256;
/// `MX_INFINITE`: a timeout of zero means no timeout.
pub(crate) const MX_INFINITE: u32 = 0;
/// `MX_MATCH_MASK_NONE`: compare every match bit.
pub(crate) const MX_MATCH_MASK_NONE: u64 = !0;
/// `MX_CONTEXT_ID_BITS_MAX`: most bits of a context id.
pub(crate) const MX_CONTEXT_ID_BITS_MAX: u8 = 16;
/// `MX_MAX_HOSTNAME_LEN`: room `mx_nic_id_to_hostname` writes into.
pub(crate) const MX_MAX_HOSTNAME_LEN: usize = 80;

/// `mx_endpoint_addr_t`: 16 opaque bytes (see [`crate::addr`] for ours).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct MxEndpointAddr {
    /// `stuff[2]`.
    pub(crate) stuff: [u64; 2],
}

/// `mx_segment_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct MxSegment {
    /// `segment_ptr`.
    pub(crate) segment_ptr: *mut c_void,
    /// `segment_length`.
    pub(crate) segment_length: u32,
}

/// `mx_mapper_state_t` (mx_io.h): what `mx__get_mapper_state` reports.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MxMapperState {
    /// `board_number`.
    pub(crate) board_number: u32,
    /// `mapper_mac`: the MAC naming the fabric's map.
    pub(crate) mapper_mac: [u8; 6],
    /// `iport`.
    pub(crate) iport: u16,
    /// `map_version`.
    pub(crate) map_version: u32,
    /// `num_hosts`.
    pub(crate) num_hosts: u32,
    /// `network_configured`.
    pub(crate) network_configured: u32,
    /// `routes_valid`.
    pub(crate) routes_valid: u32,
    /// `level`.
    pub(crate) level: u32,
    /// `flags`.
    pub(crate) flags: u32,
}

/// `mx_status_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct MxStatus {
    /// `code` (`mx_status_code_t`).
    pub(crate) code: u32,
    /// `source`.
    pub(crate) source: MxEndpointAddr,
    /// `match_info`.
    pub(crate) match_info: u64,
    /// `msg_length`.
    pub(crate) msg_length: u32,
    /// `xfer_length`.
    pub(crate) xfer_length: u32,
    /// `context`.
    pub(crate) context: *mut c_void,
}

impl Default for MxStatus {
    fn default() -> Self {
        MxStatus {
            code: 0,
            source: MxEndpointAddr::default(),
            match_info: 0,
            msg_length: 0,
            xfer_length: 0,
            context: std::ptr::null_mut(),
        }
    }
}

/// `mx_error_handler_t`.
pub(crate) type MxErrorHandler = unsafe extern "C" fn(*mut c_char, c_int) -> c_int;

/// `mx_matching_callback_t`.
pub(crate) type MxMatchingCallback = unsafe extern "C" fn(*mut c_void, u64, c_int);

/// `mx_unexp_handler_t`.
pub(crate) type MxUnexpHandler =
    unsafe extern "C" fn(*mut c_void, MxEndpointAddr, u64, u32, *mut c_void) -> c_int;

/// The context-id member of `mx_param_t.val`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct MxContextId {
    /// `bits`.
    pub(crate) bits: u8,
    /// `shift`.
    pub(crate) shift: u8,
}

/// `mx_param_t.val`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union MxParamVal {
    /// `error_handler`.
    pub(crate) error_handler: Option<MxErrorHandler>,
    /// `unexp_queue_max`.
    pub(crate) unexp_queue_max: u32,
    /// `context_id`.
    pub(crate) context_id: MxContextId,
}

/// `mx_param_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct MxParam {
    /// `key` (`mx_param_key_t`), decoded with [`ParamKey::from_raw`].
    pub(crate) key: u32,
    /// `val`.
    pub(crate) val: MxParamVal,
}

/// `mx_param_key_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ParamKey {
    /// `MX_PARAM_ERROR_HANDLER`
    ErrorHandler = 0,
    /// `MX_PARAM_UNEXP_QUEUE_MAX`
    UnexpQueueMax = 1,
    /// `MX_PARAM_CONTEXT_ID`
    ContextId = 2,
}

impl ParamKey {
    /// Decodes a key given by the application.
    pub(crate) fn from_raw(v: u32) -> Option<Self> {
        match v {
            0 => Some(ParamKey::ErrorHandler),
            1 => Some(ParamKey::UnexpQueueMax),
            2 => Some(ParamKey::ContextId),
            _ => None,
        }
    }
}

macro_rules! c_enum {
    ($(#[$m:meta])* $name:ident, $table:ident { $($(#[$vm:meta])* $var:ident = $val:literal => $cname:literal,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub(crate) enum $name { $($(#[$vm])* $var = $val,)* }

        /// Every value with its C name, in numeric order.
        pub(crate) const $table: &[(&str, $name)] = &[$(($cname, $name::$var),)*];

        impl $name {
            /// Decodes a raw value coming from C.
            pub(crate) fn from_raw(v: u32) -> Option<Self> {
                match v { $($val => Some($name::$var),)* _ => None }
            }
            /// The C name of the value.
            // `InfoKey`'s is used by `mx_get_info`; `MxReturn`'s only by the tests.
            #[cfg_attr(not(test), allow(dead_code))]
            pub(crate) fn c_name(self) -> &'static str {
                match self { $($name::$var => $cname,)* }
            }
        }
    };
}

c_enum!(
    /// `mx_return_t`: what every MX call returns.
    MxReturn, RETURN_CODES {
    /// `MX_SUCCESS`
    Success = 0 => "MX_SUCCESS",
    /// `MX_BAD_BAD_BAD`
    BadBadBad = 1 => "MX_BAD_BAD_BAD",
    /// `MX_FAILURE`
    Failure = 2 => "MX_FAILURE",
    /// `MX_ALREADY_INITIALIZED`
    AlreadyInitialized = 3 => "MX_ALREADY_INITIALIZED",
    /// `MX_NOT_INITIALIZED`
    NotInitialized = 4 => "MX_NOT_INITIALIZED",
    /// `MX_NO_DEV`
    NoDev = 5 => "MX_NO_DEV",
    /// `MX_NO_DRIVER`
    NoDriver = 6 => "MX_NO_DRIVER",
    /// `MX_NO_PERM`
    NoPerm = 7 => "MX_NO_PERM",
    /// `MX_BOARD_UNKNOWN`
    BoardUnknown = 8 => "MX_BOARD_UNKNOWN",
    /// `MX_BAD_ENDPOINT`
    BadEndpoint = 9 => "MX_BAD_ENDPOINT",
    /// `MX_BAD_SEG_LIST`
    BadSegList = 10 => "MX_BAD_SEG_LIST",
    /// `MX_BAD_SEG_MEM`
    BadSegMem = 11 => "MX_BAD_SEG_MEM",
    /// `MX_BAD_SEG_CNT`
    BadSegCnt = 12 => "MX_BAD_SEG_CNT",
    /// `MX_BAD_REQUEST`
    BadRequest = 13 => "MX_BAD_REQUEST",
    /// `MX_BAD_MATCH_MASK`
    BadMatchMask = 14 => "MX_BAD_MATCH_MASK",
    /// `MX_NO_RESOURCES`
    NoResources = 15 => "MX_NO_RESOURCES",
    /// `MX_BAD_ADDR_LIST`
    BadAddrList = 16 => "MX_BAD_ADDR_LIST",
    /// `MX_BAD_ADDR_COUNT`
    BadAddrCount = 17 => "MX_BAD_ADDR_COUNT",
    /// `MX_BAD_ROOT`
    BadRoot = 18 => "MX_BAD_ROOT",
    /// `MX_NOT_COMPLETED`
    NotCompleted = 19 => "MX_NOT_COMPLETED",
    /// `MX_BUSY`
    Busy = 20 => "MX_BUSY",
    /// `MX_BAD_INFO_KEY`
    BadInfoKey = 21 => "MX_BAD_INFO_KEY",
    /// `MX_BAD_INFO_VAL`
    BadInfoVal = 22 => "MX_BAD_INFO_VAL",
    /// `MX_BAD_NIC`
    BadNic = 23 => "MX_BAD_NIC",
    /// `MX_BAD_PARAM_LIST`
    BadParamList = 24 => "MX_BAD_PARAM_LIST",
    /// `MX_BAD_PARAM_NAME`
    BadParamName = 25 => "MX_BAD_PARAM_NAME",
    /// `MX_BAD_PARAM_VAL`
    BadParamVal = 26 => "MX_BAD_PARAM_VAL",
    /// `MX_BAD_HOSTNAME_ARGS`
    BadHostnameArgs = 27 => "MX_BAD_HOSTNAME_ARGS",
    /// `MX_HOST_NOT_FOUND`
    HostNotFound = 28 => "MX_HOST_NOT_FOUND",
    /// `MX_REQUEST_PENDING`
    RequestPending = 29 => "MX_REQUEST_PENDING",
    /// `MX_TIMEOUT`
    Timeout = 30 => "MX_TIMEOUT",
    /// `MX_NO_MATCH`
    NoMatch = 31 => "MX_NO_MATCH",
    /// `MX_BAD_ENDPOINT_ID`
    BadEndpointId = 32 => "MX_BAD_ENDPOINT_ID",
    /// `MX_CONNECTION_FAILED`
    ConnectionFailed = 33 => "MX_CONNECTION_FAILED",
    /// `MX_BAD_CONNECTION_KEY`
    BadConnectionKey = 34 => "MX_BAD_CONNECTION_KEY",
    /// `MX_BAD_INFO_LENGTH`
    BadInfoLength = 35 => "MX_BAD_INFO_LENGTH",
    /// `MX_NIC_NOT_FOUND`
    NicNotFound = 36 => "MX_NIC_NOT_FOUND",
    /// `MX_BAD_KERNEL_VERSION`
    BadKernelVersion = 37 => "MX_BAD_KERNEL_VERSION",
    /// `MX_BAD_LIB_VERSION`
    BadLibVersion = 38 => "MX_BAD_LIB_VERSION",
    /// `MX_NIC_DEAD`
    NicDead = 39 => "MX_NIC_DEAD",
    /// `MX_CANCEL_NOT_SUPPORTED`
    CancelNotSupported = 40 => "MX_CANCEL_NOT_SUPPORTED",
    /// `MX_CLOSE_IN_HANDLER`
    CloseInHandler = 41 => "MX_CLOSE_IN_HANDLER",
    /// `MX_BAD_MATCHING_FOR_CONTEXT_ID_MASK`
    BadMatchingForContextIdMask = 42 => "MX_BAD_MATCHING_FOR_CONTEXT_ID_MASK",
    /// `MX_NOT_SUPPORTED_WITH_CONTEXT_ID`
    NotSupportedWithContextId = 43 => "MX_NOT_SUPPORTED_WITH_CONTEXT_ID",
});

c_enum!(
    /// `mx_get_info_key_t`.
    InfoKey, INFO_KEYS {
    /// `MX_NIC_COUNT`
    NicCount = 1 => "MX_NIC_COUNT",
    /// `MX_NIC_IDS`
    NicIds = 2 => "MX_NIC_IDS",
    /// `MX_MAX_NATIVE_ENDPOINTS`
    MaxNativeEndpoints = 3 => "MX_MAX_NATIVE_ENDPOINTS",
    /// `MX_NATIVE_REQUESTS`
    NativeRequests = 4 => "MX_NATIVE_REQUESTS",
    /// `MX_COUNTERS_COUNT`
    CountersCount = 5 => "MX_COUNTERS_COUNT",
    /// `MX_COUNTERS_LABELS`
    CountersLabels = 6 => "MX_COUNTERS_LABELS",
    /// `MX_COUNTERS_VALUES`
    CountersValues = 7 => "MX_COUNTERS_VALUES",
    /// `MX_PRODUCT_CODE`
    ProductCode = 8 => "MX_PRODUCT_CODE",
    /// `MX_PART_NUMBER`
    PartNumber = 9 => "MX_PART_NUMBER",
    /// `MX_SERIAL_NUMBER`
    SerialNumber = 10 => "MX_SERIAL_NUMBER",
    /// `MX_PORT_COUNT`
    PortCount = 11 => "MX_PORT_COUNT",
    /// `MX_PIO_SEND_MAX`
    PioSendMax = 12 => "MX_PIO_SEND_MAX",
    /// `MX_COPY_SEND_MAX`
    CopySendMax = 13 => "MX_COPY_SEND_MAX",
    /// `MX_NUMA_NODE`
    NumaNode = 14 => "MX_NUMA_NODE",
    /// `MX_NET_TYPE`
    NetType = 15 => "MX_NET_TYPE",
    /// `MX_LINE_SPEED`
    LineSpeed = 16 => "MX_LINE_SPEED",
});

/// `mx_status_code_t` names, by value (the values are [`xmx_mx::Status`]'s).
pub(crate) const STATUS_CODES: &[(&str, u32)] = &[
    ("MX_STATUS_SUCCESS", 0),
    ("MX_STATUS_PENDING", 1),
    ("MX_STATUS_BUFFERED", 2),
    ("MX_STATUS_REJECTED", 3),
    ("MX_STATUS_TIMEOUT", 4),
    ("MX_STATUS_TRUNCATED", 5),
    ("MX_STATUS_CANCELLED", 6),
    ("MX_STATUS_ENDPOINT_UNKNOWN", 7),
    ("MX_STATUS_ENDPOINT_CLOSED", 8),
    ("MX_STATUS_ENDPOINT_UNREACHABLE", 9),
    ("MX_STATUS_BAD_SESSION", 10),
    ("MX_STATUS_BAD_KEY", 11),
    ("MX_STATUS_BAD_ENDPOINT", 12),
    ("MX_STATUS_BAD_RDMAWIN", 13),
    ("MX_STATUS_ABORTED", 14),
    ("MX_STATUS_EVENTQ_FULL", 15),
    ("MX_STATUS_NO_RESOURCES", 16),
];

/// `MX_SPEED_10G` (`mx_line_speed_t`): what an MXoE port in MX
/// wire-compatible mode reports.
pub(crate) const MX_SPEED_10G: u32 = 1;
/// `MX_NET_ETHER` (`enum mx_net_type`).
pub(crate) const MX_NET_ETHER: u32 = 1;
/// `MX_RECV_CONTINUE` (`mx_unexp_handler_action_t`).
pub(crate) const MX_RECV_CONTINUE: c_int = 0;
/// `MX_RECV_FINISHED` (`mx_unexp_handler_action_t`).
pub(crate) const MX_RECV_FINISHED: c_int = 1;
/// `MX_RAW_NO_EVENT`.
pub(crate) const MX_RAW_NO_EVENT: c_int = 0;
/// `MX_RAW_SEND_COMPLETE`.
pub(crate) const MX_RAW_SEND_COMPLETE: c_int = 1;
/// `MX_RAW_RECV_COMPLETE`.
pub(crate) const MX_RAW_RECV_COMPLETE: c_int = 2;
/// `MX__INVALID_HANDLE` (`mx_endpt_handle_t`).
pub(crate) const MX_INVALID_HANDLE: c_int = -1;

/// Every `#define` and enum value of the headers with its value, for the
/// layout test that compares them with what a C compiler sees.
pub fn constants() -> Vec<(String, i128)> {
    let mut v: Vec<(String, i128)> = vec![
        ("MX_API".into(), MX_API as i128),
        ("MX_MAX_STR_LEN".into(), MX_MAX_STR_LEN as i128),
        ("MX_SIZEOF_ADDR".into(), MX_SIZEOF_ADDR as i128),
        ("MX_ANY_NIC".into(), MX_ANY_NIC as i128),
        ("MX_ANY_ENDPOINT".into(), MX_ANY_ENDPOINT as i128),
        ("MX_MAX_SEGMENTS".into(), MX_MAX_SEGMENTS as i128),
        ("MX_INFINITE".into(), MX_INFINITE as i128),
        ("MX_MATCH_MASK_NONE".into(), MX_MATCH_MASK_NONE as i128),
        (
            "MX_CONTEXT_ID_BITS_MAX".into(),
            MX_CONTEXT_ID_BITS_MAX as i128,
        ),
        ("MX_MAX_HOSTNAME_LEN".into(), MX_MAX_HOSTNAME_LEN as i128),
        (
            "MX_PARAM_ERROR_HANDLER".into(),
            ParamKey::ErrorHandler as i128,
        ),
        (
            "MX_PARAM_UNEXP_QUEUE_MAX".into(),
            ParamKey::UnexpQueueMax as i128,
        ),
        ("MX_PARAM_CONTEXT_ID".into(), ParamKey::ContextId as i128),
        ("MX_SPEED_10G".into(), MX_SPEED_10G as i128),
        ("MX_NET_ETHER".into(), MX_NET_ETHER as i128),
        ("MX_RECV_CONTINUE".into(), MX_RECV_CONTINUE as i128),
        ("MX_RECV_FINISHED".into(), MX_RECV_FINISHED as i128),
        ("MX_RAW_NO_EVENT".into(), MX_RAW_NO_EVENT as i128),
        ("MX_RAW_SEND_COMPLETE".into(), MX_RAW_SEND_COMPLETE as i128),
        ("MX_RAW_RECV_COMPLETE".into(), MX_RAW_RECV_COMPLETE as i128),
        ("MX__INVALID_HANDLE".into(), MX_INVALID_HANDLE as i128),
    ];
    v.extend(
        RETURN_CODES
            .iter()
            .map(|(n, c)| (n.to_string(), *c as i128)),
    );
    v.extend(INFO_KEYS.iter().map(|(n, c)| (n.to_string(), *c as i128)));
    v.extend(
        STATUS_CODES
            .iter()
            .map(|(n, c)| (n.to_string(), *c as i128)),
    );
    v
}

/// Size, alignment and field offsets of every public struct, named
/// `sizeof(T)`, `alignof(T)`, `offsetof(T, f)`, for the layout test.
pub fn layouts() -> Vec<(String, i128)> {
    use std::mem::{align_of, offset_of, size_of};
    macro_rules! ty {
        ($v:ident, $c:literal, $t:ty) => {
            $v.push((format!("sizeof({})", $c), size_of::<$t>() as i128));
            $v.push((format!("alignof({})", $c), align_of::<$t>() as i128));
        };
    }
    macro_rules! field {
        ($v:ident, $c:literal, $t:ty, $f:ident) => {
            $v.push((
                format!("offsetof({}, {})", $c, stringify!($f)),
                offset_of!($t, $f) as i128,
            ));
        };
    }
    let mut v = Vec::new();
    ty!(v, "mx_endpoint_addr_t", MxEndpointAddr);
    ty!(v, "mx_segment_t", MxSegment);
    field!(v, "mx_segment_t", MxSegment, segment_ptr);
    field!(v, "mx_segment_t", MxSegment, segment_length);
    ty!(v, "mx_status_t", MxStatus);
    field!(v, "mx_status_t", MxStatus, code);
    field!(v, "mx_status_t", MxStatus, source);
    field!(v, "mx_status_t", MxStatus, match_info);
    field!(v, "mx_status_t", MxStatus, msg_length);
    field!(v, "mx_status_t", MxStatus, xfer_length);
    field!(v, "mx_status_t", MxStatus, context);
    ty!(v, "mx_param_t", MxParam);
    field!(v, "mx_param_t", MxParam, key);
    field!(v, "mx_param_t", MxParam, val);
    v.push((
        "sizeof(mx_param_t.val)".into(),
        size_of::<MxParamVal>() as i128,
    ));
    v.push((
        "offsetof(mx_param_t.val.context_id, shift)".into(),
        offset_of!(MxContextId, shift) as i128,
    ));
    ty!(v, "mx_return_t", MxReturn);
    ty!(v, "mx_status_code_t", u32);
    ty!(v, "mx_error_handler_t", MxErrorHandler);
    ty!(v, "mx_endpoint_t", *mut c_void);
    ty!(v, "mx_request_t", *mut c_void);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_tables_are_dense_and_round_trip() {
        for (i, (name, code)) in RETURN_CODES.iter().enumerate() {
            assert_eq!(*code as usize, i, "{name}");
            assert_eq!(MxReturn::from_raw(i as u32), Some(*code));
            assert_eq!(code.c_name(), *name);
        }
        assert_eq!(RETURN_CODES.len(), 44);
        assert_eq!(MxReturn::from_raw(44), None);
        for (name, code) in STATUS_CODES {
            let s = xmx_mx::Status::from_code(*code).expect("status in range");
            assert_eq!(s.code(), *code, "{name}");
        }
        assert_eq!(STATUS_CODES[15], ("MX_STATUS_EVENTQ_FULL", 15));
        assert_eq!(InfoKey::from_raw(0), None);
        assert_eq!(InfoKey::from_raw(16), Some(InfoKey::LineSpeed));
        assert_eq!(ParamKey::from_raw(3), None);
    }

    #[test]
    fn layouts_match_the_64_bit_abi() {
        let l: std::collections::HashMap<String, i128> = layouts().into_iter().collect();
        assert_eq!(l["sizeof(mx_status_t)"], 48);
        assert_eq!(l["offsetof(mx_status_t, source)"], 8);
        assert_eq!(l["offsetof(mx_status_t, context)"], 40);
        assert_eq!(l["sizeof(mx_segment_t)"], 16);
        assert_eq!(l["sizeof(mx_param_t)"], 16);
        assert_eq!(l["offsetof(mx_param_t, val)"], 8);
        assert_eq!(l["sizeof(mx_endpoint_addr_t)"], 16);
    }
}

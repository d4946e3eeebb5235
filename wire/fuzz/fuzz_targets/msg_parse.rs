//! Every ring message parser over arbitrary bytes: no panic, and whatever parses emits back
//! to bytes that parse to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xmx_wire::msg::{
    CtrlRequest, CtrlResponse, Event, SendRequest, CTRL_SLOT_SIZE, EVENT_SLOT_SIZE, SEND_SLOT_SIZE,
};

fn canonical<T: PartialEq + std::fmt::Debug>(
    data: &[u8],
    size: usize,
    parse: fn(&[u8]) -> xmx_wire::Result<T>,
    emit: fn(&T, &mut [u8]) -> xmx_wire::Result<()>,
) {
    if let Ok(value) = parse(data) {
        let mut out = vec![0u8; size];
        emit(&value, &mut out).expect("a parsed message emits");
        assert_eq!(parse(&out).expect("an emitted message parses"), value);
    }
}

fuzz_target!(|data: &[u8]| {
    canonical(data, CTRL_SLOT_SIZE, CtrlRequest::parse, CtrlRequest::emit);
    canonical(
        data,
        CTRL_SLOT_SIZE,
        CtrlResponse::parse,
        CtrlResponse::emit,
    );
    canonical(data, SEND_SLOT_SIZE, SendRequest::parse, SendRequest::emit);
    canonical(data, EVENT_SLOT_SIZE, Event::parse, Event::emit);
    if data.len() >= 2 {
        let count = usize::from(u16::from_le_bytes([data[0], data[1]]));
        let _ = xmx_wire::msg::unpack_info_page(&data[2..], count);
    }
});

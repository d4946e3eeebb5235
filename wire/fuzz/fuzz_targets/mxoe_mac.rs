//! MAC address text: parsing arbitrary strings never panics, and an accepted
//! address prints in the canonical form that parses back to it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xmx_wire::mxoe::Mac;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(mac) = text.parse::<Mac>() else {
        return;
    };
    let printed = mac.to_string();
    assert_eq!(printed.len(), 17);
    assert_eq!(printed.parse::<Mac>(), Ok(mac));
    assert_eq!(Mac::from_board_addr(mac.to_board_addr()), Ok(mac));
});

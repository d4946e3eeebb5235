//! Whole MXoE frames: parsing arbitrary bytes never panics, and whatever is
//! accepted emits to a frame that parses back to the same value and re-emits
//! to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xmx_wire::mxoe::FrameRepr;

fuzz_target!(|data: &[u8]| {
    let Ok(frame) = FrameRepr::parse(data) else {
        return;
    };
    let emitted = frame.to_vec().expect("an accepted frame emits");
    assert_eq!(emitted.len(), frame.buffer_len());
    assert!(emitted.len() <= data.len());
    let reparsed = FrameRepr::parse(&emitted).expect("an emitted frame parses");
    assert_eq!(reparsed, frame);
    assert_eq!(reparsed.to_vec().expect("re-emit"), emitted);
});

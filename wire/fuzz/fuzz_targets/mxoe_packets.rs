//! Each MXoE packet parser on its own: the first input byte picks the packet
//! type, the rest is the packet buffer (the type byte included). Checked and
//! unchecked views must both be safe; accepted values must round-trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xmx_wire::mxoe::*;

macro_rules! exercise {
    ($buf:expr, $view:ident, $repr:ident) => {{
        let buf: &[u8] = $buf;
        let unchecked = $view::new_unchecked(buf);
        let from_unchecked = $repr::parse(&unchecked);
        if let Ok(view) = $view::new_checked(buf) {
            if let Ok(repr) = $repr::parse(&view) {
                assert_eq!(from_unchecked, Ok(repr));
                let mut out = vec![0u8; repr.buffer_len()];
                repr.emit(&mut $view::new_unchecked(&mut out[..]))
                    .expect("an accepted packet emits");
                let again = $repr::parse(&$view::new_checked(&out[..]).expect("emitted view"))
                    .expect("an emitted packet parses");
                assert_eq!(again, repr);
            }
        }
    }};
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, buf)) = data.split_first() else {
        return;
    };
    match selector % 15 {
        0 => exercise!(buf, HeadPacket, HeadRepr),
        1 => exercise!(buf, RawPacket, RawRepr),
        2 => exercise!(buf, HostQueryPacket, HostQueryRepr),
        3 => exercise!(buf, HostReplyPacket, HostReplyRepr),
        4 => exercise!(buf, TrucPacket, TrucRepr),
        5 => exercise!(buf, ConnectPacket, ConnectRepr),
        6 => exercise!(buf, TinyPacket, TinyRepr),
        7 => exercise!(buf, SmallPacket, SmallRepr),
        8 => exercise!(buf, MediumPacket, MediumRepr),
        9 => exercise!(buf, RndvPacket, RndvRepr),
        10 => exercise!(buf, PullPacket, PullRepr),
        11 => exercise!(buf, PullReplyPacket, PullReplyRepr),
        12 => exercise!(buf, NotifyPacket, NotifyRepr),
        13 => exercise!(buf, NackLibPacket, NackLibRepr),
        _ => exercise!(buf, NackMcpPacket, NackMcpRepr),
    }
    let _ = PacketRepr::parse(buf);
});

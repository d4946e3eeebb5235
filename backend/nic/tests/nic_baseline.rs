//! The raw AF_PACKET baselines run end to end on a veth pair.

mod nic_util;

use nic_util::privileged;
use xmx_nic::baseline::{raw_pingpong, raw_stream, BaselineEnd, PollPolicy};
use xmx_nic::testbed::VethPair;

#[test]
fn pingpong_measures_every_round_trip() {
    if !privileged("pingpong_measures_every_round_trip") {
        return;
    }
    let pair = VethPair::create("pingpong", 9000).unwrap();
    let a = BaselineEnd::in_netns(&pair.ns_a, &pair.if_a);
    let b = BaselineEnd::in_netns(&pair.ns_b, &pair.if_b);
    for size in [64, 4096, 9014] {
        let s = raw_pingpong(&a, &b, size, 200, PollPolicy::default()).unwrap();
        assert_eq!((s.frame_len, s.iters), (size, 200));
        assert!(
            s.half_rtt_min <= s.half_rtt_median && s.half_rtt_median <= s.half_rtt_p99,
            "{s:?}"
        );
        assert!(s.half_rtt_min > std::time::Duration::ZERO);
        assert_eq!(s.half_rtt_mean, s.elapsed / 200 / 2);
    }
}

#[test]
fn stream_accounts_for_every_frame() {
    if !privileged("stream_accounts_for_every_frame") {
        return;
    }
    let pair = VethPair::create("stream", 9000).unwrap();
    let a = BaselineEnd::in_netns(&pair.ns_a, &pair.if_a);
    let b = BaselineEnd::in_netns(&pair.ns_b, &pair.if_b);
    let s = raw_stream(&a, &b, 4096, 5000, 64, PollPolicy::default()).unwrap();
    assert_eq!(s.frames_sent, 5000);
    // veth loses nothing on the way; only a full receive ring drops, and that is counted.
    assert_eq!(s.frames_received + s.rx_drops, 5000, "{s:?}");
    assert_eq!(s.bytes_received, s.frames_received * 4096);
    assert!(s.frames_received > 0 && s.elapsed > std::time::Duration::ZERO);
}

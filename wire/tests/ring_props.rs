//! Property tests of the shared ring: a random schedule of operations matches a queue model
//! at any starting index, and arbitrary page contents never make either half panic, loop or
//! hand out more entries than the ring holds.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use proptest::prelude::*;
use xmx_wire::msg::{Event, SendRequest};
use xmx_wire::ring::{layout, BackRing, FrontRing, RingError, SharedMem, Slot};

/// A 24-byte request whose decode refuses a bad check word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PairRequest(u64, u64);

impl Slot for PairRequest {
    const SIZE: usize = 24;
    fn encode(&self, slot: &mut [u8]) -> xmx_wire::Result<()> {
        slot[..8].copy_from_slice(&self.0.to_le_bytes());
        slot[8..16].copy_from_slice(&self.1.to_le_bytes());
        slot[16..24].copy_from_slice(&(self.0 ^ self.1 ^ 0x5555).to_le_bytes());
        Ok(())
    }
    fn decode(slot: &[u8]) -> xmx_wire::Result<Self> {
        let word = |i: usize| u64::from_le_bytes(slot[i..i + 8].try_into().unwrap());
        if word(16) != word(0) ^ word(8) ^ 0x5555 {
            return Err(xmx_wire::Error::Invalid {
                field: "check",
                reason: "mismatch",
            });
        }
        Ok(PairRequest(word(0), word(8)))
    }
}

/// A 40-byte response, larger than the request: slots are sized by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WideResponse(u64);

impl Slot for WideResponse {
    const SIZE: usize = 40;
    fn encode(&self, slot: &mut [u8]) -> xmx_wire::Result<()> {
        for chunk in slot.chunks_exact_mut(8) {
            chunk.copy_from_slice(&self.0.to_le_bytes());
        }
        Ok(())
    }
    fn decode(slot: &[u8]) -> xmx_wire::Result<Self> {
        Ok(WideResponse(u64::from_le_bytes(
            slot[..8].try_into().unwrap(),
        )))
    }
}

#[derive(Debug, Clone, Copy)]
enum RingOp {
    Push(u8),
    PublishRequests,
    Consume(u8),
    Respond(u8),
    PublishResponses,
    TakeResponses(u8),
    FinalCheckBack,
    FinalCheckFront,
}

fn op() -> impl Strategy<Value = RingOp> {
    prop_oneof![
        (1u8..40).prop_map(RingOp::Push),
        Just(RingOp::PublishRequests),
        (1u8..40).prop_map(RingOp::Consume),
        (1u8..40).prop_map(RingOp::Respond),
        Just(RingOp::PublishResponses),
        (1u8..40).prop_map(RingOp::TakeResponses),
        Just(RingOp::FinalCheckBack),
        Just(RingOp::FinalCheckFront),
    ]
}

fn start_index() -> impl Strategy<Value = u32> {
    prop_oneof![any::<u32>(), (u32::MAX - 200)..=u32::MAX, 0u32..200]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn ring_matches_a_queue_model(start in start_index(), ops in proptest::collection::vec(op(), 1..200)) {
        let mem = SharedMem::new_owned(1);
        let mut front = FrontRing::<PairRequest, WideResponse>::new_at(mem.clone(), start).unwrap();
        let mut back = BackRing::<PairRequest, WideResponse>::new_at(mem, start).unwrap();
        let size = front.size() as usize;
        prop_assert_eq!(size, 64); // (4096 - 64) / 40 = 100 -> 64
        // Model: requests pushed (unpublished, published), consumed, answered, published answers.
        let mut next = 0u64;
        let mut unpublished: VecDeque<u64> = VecDeque::new();
        let mut published: VecDeque<u64> = VecDeque::new();
        let mut consumed: VecDeque<u64> = VecDeque::new();
        let mut answered: VecDeque<u64> = VecDeque::new();
        let mut visible: VecDeque<u64> = VecDeque::new();
        for op in ops {
            let in_flight = unpublished.len() + published.len() + consumed.len() + answered.len() + visible.len();
            match op {
                RingOp::Push(n) => for _ in 0..n {
                    let r = front.push_request(&PairRequest(next, !next));
                    if unpublished.len() + published.len() + consumed.len() + answered.len() + visible.len() == size {
                        prop_assert_eq!(r, Err(RingError::Full));
                    } else {
                        prop_assert_eq!(r, Ok(()));
                        unpublished.push_back(next);
                        next += 1;
                    }
                },
                RingOp::PublishRequests => {
                    let notify = front.push_requests_and_check_notify();
                    if unpublished.is_empty() {
                        prop_assert!(!notify);
                    }
                    published.extend(unpublished.drain(..));
                }
                RingOp::Consume(n) => for _ in 0..n {
                    let got = back.next_request().unwrap();
                    prop_assert_eq!(got.map(|r| r.0), published.pop_front());
                    if let Some(PairRequest(a, b)) = got {
                        prop_assert_eq!(b, !a);
                        consumed.push_back(a);
                    }
                },
                RingOp::Respond(n) => for _ in 0..n {
                    let r = back.push_response(&WideResponse(consumed.front().map_or(0, |v| v + 1_000_000)));
                    match consumed.pop_front() {
                        Some(v) => { prop_assert_eq!(r, Ok(())); answered.push_back(v); }
                        None => prop_assert_eq!(r, Err(RingError::Full)),
                    }
                },
                RingOp::PublishResponses => {
                    back.push_responses_and_check_notify();
                    visible.extend(answered.drain(..));
                }
                RingOp::TakeResponses(n) => for _ in 0..n {
                    let got = front.next_response().unwrap();
                    prop_assert_eq!(got.map(|r| r.0 - 1_000_000), visible.pop_front());
                },
                RingOp::FinalCheckBack => {
                    prop_assert_eq!(back.final_check_for_requests().unwrap(), !published.is_empty());
                }
                RingOp::FinalCheckFront => {
                    prop_assert_eq!(front.final_check_for_responses().unwrap(), !visible.is_empty());
                }
            }
            prop_assert!(in_flight <= size);
            prop_assert_eq!(front.free_requests() as usize, size - (unpublished.len() + published.len() + consumed.len() + answered.len() + visible.len()));
            prop_assert_eq!(back.unconsumed_requests().unwrap() as usize, published.len());
            prop_assert_eq!(front.unconsumed_responses().unwrap() as usize, visible.len());
        }
    }

    #[test]
    fn arbitrary_pages_never_stall_the_back(
        header in proptest::array::uniform4(any::<u32>()),
        near in any::<bool>(),
        start in any::<u32>(),
        slots in proptest::collection::vec(any::<u8>(), 0..4032),
    ) {
        let mem = SharedMem::new_owned(1);
        let mut back = BackRing::<SendRequest, ()>::new_at(mem.clone(), start).unwrap();
        // Half the cases put req_prod within reach of the consumer.
        let req_prod = if near { start.wrapping_add(header[0] % 40) } else { header[0] };
        for (off, v) in [(layout::REQ_PROD, req_prod), (layout::REQ_EVENT, header[1]),
                         (layout::RSP_PROD, header[2]), (layout::RSP_EVENT, header[3])] {
            mem.store_u32(off, v, Ordering::Relaxed);
        }
        mem.write_bytes(layout::SLOTS, &slots);
        let size = back.size();
        let mut taken = 0u32;
        // Each call consumes at most one slot, so size + 1 calls must reach the end.
        let mut ended = false;
        for _ in 0..=size {
            match back.next_request() {
                Ok(Some(_)) | Err(RingError::Message(_)) => taken += 1,
                Ok(None) | Err(RingError::Overflow { .. }) => { ended = true; break; }
                Err(e) => prop_assert!(false, "unexpected {e:?}"),
            }
        }
        prop_assert!(ended, "the back ring kept handing out entries");
        prop_assert!(taken <= size);
        let _ = back.final_check_for_requests();
        back.retire_consumed();
        back.push_responses_and_check_notify();
        prop_assert!(back.unanswered() == 0);
    }

    #[test]
    fn arbitrary_pages_never_stall_the_front(
        rsp_prod in any::<u32>(),
        near in any::<bool>(),
        start in any::<u32>(),
        pushed in 0u32..20,
        slots in proptest::collection::vec(any::<u8>(), 0..4032),
    ) {
        let mem = SharedMem::new_owned(1);
        let mut front = FrontRing::<PairRequest, Event>::new_at(mem.clone(), start).unwrap();
        for i in 0..pushed.min(front.size()) {
            front.push_request(&PairRequest(i.into(), 0)).unwrap();
        }
        front.push_requests();
        let rsp_prod = if near { start.wrapping_add(rsp_prod % 24) } else { rsp_prod };
        mem.store_u32(layout::RSP_PROD, rsp_prod, Ordering::Relaxed);
        mem.write_bytes(layout::SLOTS, &slots);
        let mut taken = 0u32;
        let mut ended = false;
        for _ in 0..=front.size() {
            match front.next_response() {
                Ok(Some(_)) | Err(RingError::Message(_)) => taken += 1,
                Ok(None) | Err(RingError::Overflow { .. }) => { ended = true; break; }
                Err(e) => prop_assert!(false, "unexpected {e:?}"),
            }
        }
        prop_assert!(ended);
        prop_assert!(taken <= pushed);
        prop_assert!(front.free_requests() <= front.size());
    }
}

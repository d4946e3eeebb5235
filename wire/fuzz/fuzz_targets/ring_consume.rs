//! A ring page filled from fuzz input, consumed by a back half (and, for responses, by a
//! front half): every call returns, no more entries come out than the ring holds, and
//! nothing panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xmx_wire::msg::{CtrlBack, CtrlFront, CtrlOp, CtrlRequest, EventBack, SendBack};
use xmx_wire::ring::{BackRing, RingError, SharedMem, Slot, PAGE_SIZE};

fn drain_back<Req: Slot, Rsp: Slot>(ring: &mut BackRing<Req, Rsp>, answer: &Rsp) {
    let mut taken = 0u32;
    let mut ended = false;
    for _ in 0..=ring.size() {
        match ring.next_request() {
            Ok(Some(_)) | Err(RingError::Message(_)) => {
                taken += 1;
                ring.push_response(answer)
                    .expect("a consumed request can be answered");
            }
            Ok(None) | Err(RingError::Overflow { .. }) => {
                ended = true;
                break;
            }
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert!(ended && taken <= ring.size());
    let _ = ring.push_responses_and_check_notify();
    let _ = ring.final_check_for_requests();
    assert_eq!(ring.unanswered(), 0);
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    let mode = data[0];
    let pushed = u32::from(data[1]);
    let start = u32::from_le_bytes([data[2], data[3], data[4], data[5]]);
    let page = &data[6..];
    let mem = SharedMem::new_owned(1);
    let fill = |mem: &SharedMem| {
        mem.write_bytes(0, &page[..page.len().min(PAGE_SIZE)]);
    };
    match mode % 4 {
        0 => {
            let mut ring = SendBack::new_at(mem.clone(), start).unwrap();
            fill(&mem);
            drain_back(&mut ring, &());
        }
        1 => {
            let mut ring = EventBack::new_at(mem.clone(), start).unwrap();
            fill(&mem);
            drain_back(&mut ring, &());
        }
        2 => {
            let mut ring = CtrlBack::new_at(mem.clone(), start).unwrap();
            fill(&mem);
            let req = CtrlRequest {
                tag: 0,
                op: CtrlOp::EndpointClose { endpoint: 0 },
            };
            drain_back(
                &mut ring,
                &xmx_wire::msg::CtrlResponse::answering(&req, xmx_wire::msg::CtrlStatus::Ok),
            );
        }
        _ => {
            // The front half consuming responses a hostile back half wrote.
            let mut ring = CtrlFront::new_at(mem.clone(), start).unwrap();
            let req = CtrlRequest {
                tag: 1,
                op: CtrlOp::EndpointClose { endpoint: 1 },
            };
            let n = pushed.min(ring.size());
            for _ in 0..n {
                ring.push_request(&req).unwrap();
            }
            ring.push_requests();
            // Keep the front's own req_prod; let the input write everything else.
            let mut copy = page[..page.len().min(PAGE_SIZE)].to_vec();
            if copy.len() >= 4 {
                copy[..4].copy_from_slice(&start.wrapping_add(n).to_le_bytes());
            }
            mem.write_bytes(0, &copy);
            let mut taken = 0;
            let mut ended = false;
            for _ in 0..=ring.size() {
                match ring.next_response() {
                    Ok(Some(_)) | Err(RingError::Message(_)) => taken += 1,
                    Ok(None) | Err(RingError::Overflow { .. }) => {
                        ended = true;
                        break;
                    }
                    Err(e) => panic!("unexpected {e:?}"),
                }
            }
            assert!(ended && taken <= n);
            let _ = ring.final_check_for_responses();
            assert!(ring.free_requests() <= ring.size());
        }
    }
});

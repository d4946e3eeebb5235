//! Shared ring behaviour over an owned page: geometry, fill and drain, index wrap, notify
//! suppression and hostile indices.

use std::sync::atomic::Ordering;

use xmx_wire::ring::{
    init_shared, layout, needs_notify, ring_size, BackRing, FrontRing, RingError, SharedMem, Slot,
    PAGE_SIZE,
};
use xmx_wire::Error;

/// A 16-byte request: a sequence number and a check word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SeqRequest(u64);

impl Slot for SeqRequest {
    const SIZE: usize = 16;
    fn encode(&self, slot: &mut [u8]) -> xmx_wire::Result<()> {
        slot[..8].copy_from_slice(&self.0.to_le_bytes());
        slot[8..16].copy_from_slice(&(!self.0).to_le_bytes());
        Ok(())
    }
    fn decode(slot: &[u8]) -> xmx_wire::Result<Self> {
        let v = u64::from_le_bytes(slot[..8].try_into().unwrap());
        let check = u64::from_le_bytes(slot[8..16].try_into().unwrap());
        if check != !v {
            return Err(Error::Invalid {
                field: "check",
                reason: "mismatch",
            });
        }
        Ok(SeqRequest(v))
    }
}

/// An 8-byte response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WordResponse(u64);

impl Slot for WordResponse {
    const SIZE: usize = 8;
    fn encode(&self, slot: &mut [u8]) -> xmx_wire::Result<()> {
        slot.copy_from_slice(&self.0.to_le_bytes());
        Ok(())
    }
    fn decode(slot: &[u8]) -> xmx_wire::Result<Self> {
        Ok(WordResponse(u64::from_le_bytes(slot.try_into().unwrap())))
    }
}

/// A slot type of a size the ring refuses.
struct Odd;
impl Slot for Odd {
    const SIZE: usize = 12;
    fn encode(&self, _: &mut [u8]) -> xmx_wire::Result<()> {
        Ok(())
    }
    fn decode(_: &[u8]) -> xmx_wire::Result<Self> {
        Ok(Odd)
    }
}

/// A slot as large as a page.
struct Huge;
impl Slot for Huge {
    const SIZE: usize = 4096;
    fn encode(&self, _: &mut [u8]) -> xmx_wire::Result<()> {
        Ok(())
    }
    fn decode(_: &[u8]) -> xmx_wire::Result<Self> {
        Ok(Huge)
    }
}

fn pair(
    start: u32,
) -> (
    FrontRing<SeqRequest, WordResponse>,
    BackRing<SeqRequest, WordResponse>,
    SharedMem,
) {
    let mem = SharedMem::new_owned(1);
    let front = FrontRing::new_at(mem.clone(), start).unwrap();
    let back = BackRing::new_at(mem.clone(), start).unwrap();
    (front, back, mem)
}

fn header(mem: &SharedMem) -> [u32; 4] {
    [
        layout::REQ_PROD,
        layout::REQ_EVENT,
        layout::RSP_PROD,
        layout::RSP_EVENT,
    ]
    .map(|off| mem.load_u32(off, Ordering::Relaxed).unwrap())
}

#[test]
fn header_layout_and_init_match_ring_h() {
    assert_eq!(
        (
            layout::REQ_PROD,
            layout::REQ_EVENT,
            layout::RSP_PROD,
            layout::RSP_EVENT
        ),
        (0, 4, 8, 12)
    );
    assert_eq!((layout::PAD, layout::SLOTS), (16, 64));
    let mem = SharedMem::new_owned(1);
    let mut junk = [0xa5u8; 64];
    junk[..4].copy_from_slice(&77u32.to_le_bytes());
    assert!(mem.write_bytes(0, &junk));
    let front = FrontRing::<SeqRequest, WordResponse>::new(mem.clone()).unwrap();
    // SHARED_RING_INIT: producers 0, events 1, padding zero.
    assert_eq!(header(&mem), [0, 1, 0, 1]);
    let mut pad = [0xffu8; 48];
    assert!(mem.read_bytes(16, &mut pad));
    assert_eq!(pad, [0u8; 48]);
    // 16-byte slots: (4096 - 64) / 16 = 252, rounded down to 128.
    assert_eq!(front.size(), 128);
    assert_eq!(front.size(), ring_size(16, PAGE_SIZE));
    assert_eq!(front.free_requests(), 128);
}

#[test]
fn geometry_errors() {
    let mem = SharedMem::new_owned(1);
    assert_eq!(
        FrontRing::<Odd, ()>::new(mem.clone()).unwrap_err(),
        RingError::BadSlotSize(12)
    );
    assert_eq!(
        BackRing::<SeqRequest, Odd>::new(mem.clone()).unwrap_err(),
        RingError::BadSlotSize(12)
    );
    assert_eq!(
        FrontRing::<Huge, ()>::new(mem.clone()).unwrap_err(),
        RingError::TooSmall {
            len: 4096,
            slot: 4096
        }
    );
    // SAFETY: the owned page outlives `small`, which covers its first 72 bytes.
    let small = unsafe { SharedMem::from_raw(mem.as_ptr(), 72) }.unwrap();
    let front = FrontRing::<WordResponse, ()>::new(small.clone()).unwrap();
    assert_eq!(front.size(), 1);
    // SAFETY: as above, 64 bytes.
    let tiny = unsafe { SharedMem::from_raw(mem.as_ptr(), 64) }.unwrap();
    assert_eq!(
        FrontRing::<WordResponse, ()>::new(tiny).unwrap_err(),
        RingError::TooSmall { len: 64, slot: 8 }
    );
}

#[test]
fn slots_land_at_ring_h_offsets() {
    let (mut front, _back, mem) = pair(0);
    for i in 0..3 {
        front.push_request(&SeqRequest(0x1111 * (i + 1))).unwrap();
    }
    // Nothing is visible before the publish.
    assert_eq!(header(&mem)[0], 0);
    front.push_requests();
    assert_eq!(header(&mem)[0], 3);
    for i in 0..3u64 {
        let mut slot = [0u8; 16];
        assert!(mem.read_bytes(64 + 16 * i as usize, &mut slot));
        assert_eq!(&slot[..8], &(0x1111 * (i + 1)).to_le_bytes());
    }
}

#[test]
fn fill_and_drain() {
    let (mut front, mut back, mem) = pair(0);
    let n = front.size() as u64;
    for i in 0..n {
        front.push_request(&SeqRequest(i)).unwrap();
    }
    assert!(front.is_full());
    assert_eq!(front.push_request(&SeqRequest(999)), Err(RingError::Full));
    assert_eq!(front.unpublished(), n as u32);
    front.push_requests();
    assert_eq!(back.unconsumed_requests(), Ok(n as u32));
    // A back ring cannot answer what it has not consumed.
    assert_eq!(back.push_response(&WordResponse(0)), Err(RingError::Full));
    for i in 0..n {
        assert_eq!(back.next_request(), Ok(Some(SeqRequest(i))));
        back.push_response(&WordResponse(i * 10)).unwrap();
    }
    assert_eq!(back.next_request(), Ok(None));
    assert_eq!(back.push_response(&WordResponse(0)), Err(RingError::Full));
    back.push_responses();
    assert_eq!(header(&mem)[2], n as u32);
    assert_eq!(front.unconsumed_responses(), Ok(n as u32));
    for i in 0..n {
        assert_eq!(front.next_response(), Ok(Some(WordResponse(i * 10))));
    }
    assert_eq!(front.next_response(), Ok(None));
    assert_eq!(front.free_requests(), n as u32);
    assert_eq!(front.outstanding(), 0);
}

#[test]
fn indices_wrap_past_u32_max() {
    let start = u32::MAX - 37;
    let (mut front, mut back, mem) = pair(start);
    assert_eq!(
        header(&mem),
        [start, start.wrapping_add(1), start, start.wrapping_add(1)]
    );
    let size = front.size() as u64;
    let total = 3 * size + 5;
    let (mut sent, mut received, mut answered) = (0u64, 0u64, 0u64);
    while answered < total {
        // Uneven batches so that every slot position meets the wrap.
        for _ in 0..7 {
            if sent < total && !front.is_full() {
                front.push_request(&SeqRequest(sent)).unwrap();
                sent += 1;
            }
        }
        front.push_requests();
        while let Some(req) = back.next_request().unwrap() {
            assert_eq!(req, SeqRequest(received));
            back.push_response(&WordResponse(received + 1000)).unwrap();
            received += 1;
        }
        back.push_responses();
        while let Some(rsp) = front.next_response().unwrap() {
            assert_eq!(rsp, WordResponse(answered + 1000));
            answered += 1;
        }
    }
    let end = start.wrapping_add(total as u32);
    assert!(end < start, "the test must cross the u32 wrap");
    assert_eq!(header(&mem)[0], end);
    assert_eq!(header(&mem)[2], end);
    assert_eq!(
        (
            front.req_prod_pvt(),
            front.rsp_cons(),
            back.req_cons(),
            back.rsp_prod_pvt()
        ),
        (end, end, end, end)
    );
}

#[test]
fn notify_truth_table() {
    // (old req_prod, new req_prod, req_event) -> notify
    let table = [
        (0u32, 1u32, 1u32, true), // fresh ring: the first request crosses req_event = 1
        (1, 2, 1, false),         // consumer has not asked again: suppressed
        (2, 3, 3, true),          // consumer asked for index 3
        (2, 4, 3, true),          // a batch that passes it
        (4, 6, 10, false),        // consumer asked to be woken later
        (6, 10, 10, true),        // reaching the event index exactly
        (10, 10, 10, false),      // publishing nothing
        (u32::MAX - 1, 1, u32::MAX, true), // crossing the wrap
        (u32::MAX - 1, 1, 5, false),
        (u32::MAX, 0, 0, true),
    ];
    for &(old, new, event, want) in &table {
        assert_eq!(
            needs_notify(old, new, event),
            want,
            "old {old} new {new} event {event}"
        );
        // The same decision through a ring.
        let (mut front, _back, mem) = pair(old);
        for i in 0..new.wrapping_sub(old) {
            front.push_request(&SeqRequest(i as u64)).unwrap();
        }
        assert!(mem.store_u32(layout::REQ_EVENT, event, Ordering::Relaxed));
        assert_eq!(
            front.push_requests_and_check_notify(),
            want,
            "ring: old {old} new {new} event {event}"
        );
    }
}

#[test]
fn final_checks_arm_the_event_and_pair_with_notify() {
    let (mut front, mut back, mem) = pair(0);
    // Back goes idle: asks for an event at req_cons + 1.
    assert_eq!(back.final_check_for_requests(), Ok(false));
    assert_eq!(header(&mem)[1], 1);
    front.push_request(&SeqRequest(1)).unwrap();
    assert!(front.push_requests_and_check_notify());
    // Without a new final check, further pushes are not notified.
    assert_eq!(back.next_request(), Ok(Some(SeqRequest(1))));
    front.push_request(&SeqRequest(2)).unwrap();
    assert!(!front.push_requests_and_check_notify());
    // A final check that finds work returns true and leaves req_event alone.
    assert_eq!(back.final_check_for_requests(), Ok(true));
    assert_eq!(header(&mem)[1], 1);
    assert_eq!(back.next_request(), Ok(Some(SeqRequest(2))));
    assert_eq!(back.final_check_for_requests(), Ok(false));
    assert_eq!(header(&mem)[1], 3);
    front.push_request(&SeqRequest(3)).unwrap();
    assert!(front.push_requests_and_check_notify());

    // The response direction, symmetric.
    assert_eq!(front.final_check_for_responses(), Ok(false));
    assert_eq!(header(&mem)[3], 1);
    back.push_response(&WordResponse(1)).unwrap();
    assert!(back.push_responses_and_check_notify());
    back.push_response(&WordResponse(2)).unwrap();
    assert!(!back.push_responses_and_check_notify());
    assert_eq!(front.final_check_for_responses(), Ok(true));
}

#[test]
fn back_refuses_req_prod_beyond_the_ring() {
    let (mut front, mut back, mem) = pair(100);
    let size = front.size();
    for i in 0..4 {
        front.push_request(&SeqRequest(i)).unwrap();
    }
    front.push_requests();
    assert_eq!(back.next_request(), Ok(Some(SeqRequest(0))));
    // A front that claims more than a ring's worth of requests.
    for bad in [
        100 + size + 1,
        100 + size + 1000,
        100u32.wrapping_add(u32::MAX / 2),
        99,
    ] {
        assert!(mem.store_u32(layout::REQ_PROD, bad, Ordering::Release));
        let err = back.next_request().unwrap_err();
        assert!(
            matches!(err, RingError::Overflow { index: "req_prod", value, cons: 101, .. } if value == bad),
            "{err:?}"
        );
        assert!(matches!(
            back.unconsumed_requests(),
            Err(RingError::Overflow { .. })
        ));
        assert!(matches!(
            back.final_check_for_requests(),
            Err(RingError::Overflow { .. })
        ));
        assert_eq!(back.req_cons(), 101, "nothing consumed on overflow");
    }
    // Exactly a ring's worth ahead of the responses is legal.
    assert!(mem.store_u32(layout::REQ_PROD, 100 + size, Ordering::Release));
    assert_eq!(back.unconsumed_requests(), Ok(size - 1));
    // Going back below what was consumed is not.
    assert!(mem.store_u32(layout::REQ_PROD, 100, Ordering::Release));
    assert!(matches!(
        back.next_request(),
        Err(RingError::Overflow { .. })
    ));
}

#[test]
fn front_refuses_rsp_prod_beyond_its_requests() {
    let (mut front, mut back, mem) = pair(u32::MAX - 1);
    for i in 0..3 {
        front.push_request(&SeqRequest(i)).unwrap();
    }
    front.push_requests();
    // Requests pushed but unpublished cannot have responses either.
    front.push_request(&SeqRequest(3)).unwrap();
    let base = u32::MAX - 1;
    for bad in [base.wrapping_add(4), base.wrapping_add(200), base - 1] {
        assert!(mem.store_u32(layout::RSP_PROD, bad, Ordering::Release));
        assert!(matches!(
            front.next_response(),
            Err(RingError::Overflow {
                index: "rsp_prod",
                ..
            })
        ));
        assert!(matches!(
            front.final_check_for_responses(),
            Err(RingError::Overflow { .. })
        ));
        assert_eq!(front.rsp_cons(), base);
    }
    assert!(mem.store_u32(layout::RSP_PROD, base, Ordering::Release));
    while back.next_request().unwrap().is_some() {
        back.push_response(&WordResponse(5)).unwrap();
    }
    back.push_responses();
    assert_eq!(front.unconsumed_responses(), Ok(3));
}

#[test]
fn bad_slot_is_consumed_and_reported() {
    let (mut front, mut back, mem) = pair(0);
    front.push_request(&SeqRequest(1)).unwrap();
    front.push_request(&SeqRequest(2)).unwrap();
    front.push_requests();
    // The peer scribbles over the first slot's check word.
    assert!(mem.write_bytes(64 + 8, &[0u8; 8]));
    assert_eq!(
        back.next_request(),
        Err(RingError::Message(Error::Invalid {
            field: "check",
            reason: "mismatch"
        }))
    );
    assert_eq!(back.req_cons(), 1);
    assert_eq!(back.next_request(), Ok(Some(SeqRequest(2))));
    assert_eq!(back.unanswered(), 2);
}

#[test]
fn one_way_ring_retires_and_reclaims_without_slot_writes() {
    let mem = SharedMem::new_owned(1);
    let mut front = FrontRing::<SeqRequest, ()>::new(mem.clone()).unwrap();
    let mut back = BackRing::<SeqRequest, ()>::new(mem.clone()).unwrap();
    for i in 0..5 {
        front.push_request(&SeqRequest(i)).unwrap();
    }
    front.push_requests();
    for i in 0..5 {
        assert_eq!(back.next_request(), Ok(Some(SeqRequest(i))));
    }
    assert_eq!(back.retire_consumed(), 5);
    assert_eq!(back.retire_consumed(), 0);
    back.push_responses();
    // The request bytes are still in their slots: empty responses write nothing.
    let mut slot = [0u8; 8];
    assert!(mem.read_bytes(64 + 16 * 4, &mut slot));
    assert_eq!(slot, 4u64.to_le_bytes());
    assert_eq!(front.free_requests(), front.size() - 5);
    assert_eq!(front.reclaim(), Ok(5));
    assert_eq!(front.free_requests(), front.size());
    assert!(mem.store_u32(layout::RSP_PROD, 6, Ordering::Release));
    assert!(matches!(front.reclaim(), Err(RingError::Overflow { .. })));
}

#[test]
fn attach_resumes_from_shared_indices() {
    let (mut front, mut back, mem) = pair(40);
    for i in 0..6 {
        front.push_request(&SeqRequest(i)).unwrap();
    }
    front.push_requests();
    for _ in 0..2 {
        back.next_request().unwrap();
        back.push_response(&WordResponse(0)).unwrap();
    }
    back.push_responses();
    let front2 = FrontRing::<SeqRequest, WordResponse>::attach(mem.clone()).unwrap();
    assert_eq!((front2.req_prod_pvt(), front2.rsp_cons()), (46, 42));
    let back2 = BackRing::<SeqRequest, WordResponse>::attach(mem.clone()).unwrap();
    assert_eq!((back2.req_cons(), back2.rsp_prod_pvt()), (46, 42));
    // Indices no ring could have reached are refused.
    assert!(mem.store_u32(layout::REQ_PROD, 42 + front.size() + 1, Ordering::Relaxed));
    assert!(matches!(
        FrontRing::<SeqRequest, WordResponse>::attach(mem.clone()),
        Err(RingError::Overflow { .. })
    ));
    assert!(matches!(
        BackRing::<SeqRequest, WordResponse>::attach(mem),
        Err(RingError::Overflow { .. })
    ));
}

#[test]
fn a_scribbling_peer_never_stalls_or_crashes_the_back() {
    // One thread rewrites the whole header and slot area with arbitrary values while the
    // back half keeps consuming: every call returns, with a message or an error.
    let mem = SharedMem::new_owned(1);
    let _front = FrontRing::<SeqRequest, WordResponse>::new(mem.clone()).unwrap();
    let mut back = BackRing::<SeqRequest, WordResponse>::new(mem.clone()).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scribbler = {
        let (mem, stop) = (mem.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut x: u64 = 0x2545_f491_4f6c_dd1d;
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let off = (x as usize % (PAGE_SIZE / 4)) * 4;
                let value = if x & 0x100 != 0 {
                    (x >> 32) as u32
                } else {
                    (x >> 40) as u32 & 0xff
                };
                mem.store_u32(off, value, Ordering::Relaxed);
            }
        })
    };
    let mut outcomes = [0usize; 3];
    for _ in 0..200_000 {
        match back.next_request() {
            Ok(Some(_)) => {
                outcomes[0] += 1;
                let _ = back.push_response(&WordResponse(0));
                back.push_responses();
            }
            Ok(None) => outcomes[1] += 1,
            Err(_) => {
                outcomes[2] += 1;
                let _ = back.push_response(&WordResponse(0));
            }
        }
        assert!(back.unanswered() <= back.size());
    }
    stop.store(true, Ordering::Relaxed);
    scribbler.join().unwrap();
    assert_eq!(outcomes.iter().sum::<usize>(), 200_000);
}

#[test]
fn consumer_initialised_ring_attached_by_the_producer() {
    // The page owner consumes (an event ring): it initialises the header, the producer
    // attaches, and the very first request is notified.
    let mem = SharedMem::new_owned(1);
    assert!(mem.write_bytes(0, &[0xffu8; 64]));
    init_shared(&mem, 0).unwrap();
    assert_eq!(header(&mem), [0, 1, 0, 1]);
    let mut back = BackRing::<SeqRequest, ()>::new(mem.clone()).unwrap();
    let mut front = FrontRing::<SeqRequest, ()>::attach(mem.clone()).unwrap();
    front.push_request(&SeqRequest(7)).unwrap();
    assert!(front.push_requests_and_check_notify());
    assert_eq!(back.next_request(), Ok(Some(SeqRequest(7))));
    // SAFETY: the owned page outlives `short`, which covers its first 63 bytes.
    let short = unsafe { SharedMem::from_raw(mem.as_ptr(), 63) }.unwrap();
    assert!(matches!(
        init_shared(&short, 0),
        Err(RingError::TooSmall { .. })
    ));
}

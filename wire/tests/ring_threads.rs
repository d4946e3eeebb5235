//! A producer and a consumer thread share one ring page and exchange 1,000,000 sequenced
//! send requests, sleeping only on event-channel stand-ins and waking only when the ring's
//! notify rule says so. A lost wakeup would hang the test; the waits carry a generous bound
//! so that such a bug fails instead of hanging forever.

use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use xmx_wire::msg::{
    InlineData, InlineMsg, MsgInfo, RndvSend, Route, SendBack, SendFront, SendOp, SendRequest,
    SEND_SLOT_SIZE,
};
use xmx_wire::ring::{ring_size, SharedMem, PAGE_SIZE};

const MESSAGES: u32 = 1_000_000;
/// Only a broken notify protocol makes a wait last this long.
const LOST_WAKEUP: Duration = Duration::from_secs(120);

/// An event channel: `notify` sets a pending bit and wakes the waiter, `wait` blocks until
/// the bit is set and clears it.
#[derive(Default)]
struct EventChannel {
    pending: Mutex<bool>,
    cv: Condvar,
    notifications: Mutex<u64>,
}

impl EventChannel {
    fn notify(&self) {
        *self.notifications.lock().unwrap() += 1;
        *self.pending.lock().unwrap() = true;
        self.cv.notify_one();
    }

    fn wait(&self) {
        let pending = self.pending.lock().unwrap();
        let (mut pending, timeout) = self
            .cv
            .wait_timeout_while(pending, LOST_WAKEUP, |p| !*p)
            .unwrap();
        assert!(
            !timeout.timed_out(),
            "lost wakeup: no event although the ring needed one"
        );
        *pending = false;
    }

    fn count(&self) -> u64 {
        *self.notifications.lock().unwrap()
    }
}

/// The i-th message: varied kinds, lengths and field values derived from `i`.
fn message(i: u32) -> SendRequest {
    let route = Route {
        peer_index: i as u16,
        endpoint: (i % 256) as u8,
        session_id: i ^ 0xdead_beef,
    };
    let info = MsgInfo {
        seqnum: i as u16,
        piggyack: !(i as u16),
        match_info: u64::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15),
    };
    let data: Vec<u8> = (0..(i % 129))
        .map(|k| (k as u8).wrapping_mul(31) ^ i as u8)
        .collect();
    let op = match i % 3 {
        0 => SendOp::Small(InlineMsg {
            info,
            data: InlineData::new(&data).unwrap(),
        }),
        1 => SendOp::Tiny(InlineMsg {
            info,
            data: InlineData::new(&data[..data.len().min(32)]).unwrap(),
        }),
        _ => SendOp::Rndv(RndvSend {
            info,
            length: i.wrapping_mul(7919),
            region_id: (i % 256) as u8,
            region_seqnum: (i / 256) as u8,
            region_offset: i,
        }),
    };
    SendRequest { tag: i, route, op }
}

#[test]
fn a_million_messages_over_one_page() {
    let mem = SharedMem::new_owned(1);
    let mut front = SendFront::new(mem.clone()).unwrap();
    let mut back = SendBack::new(mem).unwrap();
    assert_eq!(front.size(), ring_size(SEND_SLOT_SIZE, PAGE_SIZE));
    assert_eq!(front.size(), 16);

    let to_back = Arc::new(EventChannel::default());
    let to_front = Arc::new(EventChannel::default());

    let producer = {
        let (to_back, to_front) = (to_back.clone(), to_front.clone());
        thread::spawn(move || {
            let mut next = 0u32;
            let mut waits = 0u64;
            while next < MESSAGES {
                front.reclaim().unwrap();
                let mut pushed = false;
                while next < MESSAGES && !front.is_full() {
                    front.push_request(&message(next)).unwrap();
                    next += 1;
                    pushed = true;
                }
                if pushed {
                    if front.push_requests_and_check_notify() {
                        to_back.notify();
                    }
                    continue;
                }
                // Ring full: sleep until the consumer returns slots.
                if front.final_check_for_responses().unwrap() {
                    continue;
                }
                waits += 1;
                to_front.wait();
            }
            waits
        })
    };

    let consumer = {
        let (to_back, to_front) = (to_back.clone(), to_front.clone());
        thread::spawn(move || {
            let mut expected = 0u32;
            let mut waits = 0u64;
            while expected < MESSAGES {
                let mut got = false;
                while let Some(req) = back.next_request().unwrap() {
                    assert_eq!(
                        req,
                        message(expected),
                        "message {expected} out of order or corrupted"
                    );
                    expected += 1;
                    got = true;
                }
                if got {
                    back.retire_consumed();
                    if back.push_responses_and_check_notify() {
                        to_front.notify();
                    }
                    continue;
                }
                if back.final_check_for_requests().unwrap() {
                    continue;
                }
                waits += 1;
                to_back.wait();
            }
            waits
        })
    };

    let producer_waits = producer.join().unwrap();
    let consumer_waits = consumer.join().unwrap();
    eprintln!(
        "{MESSAGES} messages: producer slept {producer_waits} times, consumer {consumer_waits}; \
         events sent: {} to the consumer, {} to the producer",
        to_back.count(),
        to_front.count()
    );
}

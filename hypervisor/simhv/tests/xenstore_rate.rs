//! Throughput figures of the client and daemon together (ignored by default; prints,
//! asserts nothing about time): `cargo test -p xmx-simhv --test xenstore_rate -- --ignored --nocapture`.

mod xenstore_common;

use std::time::Instant;

use xenstore_common::{next_event, Harness};
use xmx_hv::{Xenstore, XBT_NULL};

#[test]
#[ignore]
fn request_and_event_rates() {
    const N: usize = 5000;
    let h = Harness::start();
    let c = h.client(1);
    let t = Instant::now();
    for i in 0..N {
        c.write(XBT_NULL, "rate", i.to_string().as_bytes()).unwrap();
    }
    let writes = t.elapsed();
    let t = Instant::now();
    for _ in 0..N {
        c.read(XBT_NULL, "rate").unwrap();
    }
    let reads = t.elapsed();
    let w = h.client(0);
    w.watch("/local/domain/1/ev", "t").unwrap();
    next_event(&w);
    let t = Instant::now();
    for i in 0..N {
        c.write(XBT_NULL, &format!("ev/{}", i % 64), b"x").unwrap();
        next_event(&w);
    }
    let events = t.elapsed();
    let t = Instant::now();
    for _ in 0..N / 10 {
        let tx = c.transaction_start().unwrap();
        c.read(tx, "rate").unwrap();
        c.write(tx, "rate", b"t").unwrap();
        c.transaction_end(tx, true).unwrap();
    }
    let txs = t.elapsed();
    let per = |d: std::time::Duration, n: usize| d.as_secs_f64() * 1e6 / n as f64;
    println!("write round trip:          {:.1} us", per(writes, N));
    println!("read round trip:           {:.1} us", per(reads, N));
    println!("write + watch event:       {:.1} us", per(events, N));
    println!("4-request transaction:     {:.1} us", per(txs, N / 10));
}

//! Per-domain quotas: unprivileged domains hit them with xenstored's errors (ENOSPC,
//! seen as `Error::Quota`); dom0 is unlimited.

mod xenstore_common;

use std::io::Write;

use xenstore_common::Harness;
use xmx_hv::xs::wire::{self, MsgType, XsFrame};
use xmx_hv::{Error, Xenstore, XBT_NULL};
use xmx_simhv::xenstored::XenstoreQuotas;

const QUOTAS: XenstoreQuotas = XenstoreQuotas {
    nodes: 8,
    watches: 3,
    transactions: 2,
    value_size: 100,
    outstanding: 4,
};

#[test]
fn node_quota() {
    let h = Harness::with_quotas(QUOTAS);
    let g = h.client(1);
    // The home counts: seven more nodes fit.
    assert_eq!(h.xs.usage(1).nodes, 1);
    g.write(XBT_NULL, "a/b/c/d/e/f/g", b"").unwrap();
    assert_eq!(h.xs.usage(1).nodes, 8);
    assert!(matches!(g.write(XBT_NULL, "x", b""), Err(Error::Quota(_))));
    assert!(matches!(g.mkdir(XBT_NULL, "y"), Err(Error::Quota(_))));
    // Changing an existing node needs no new node.
    g.write(XBT_NULL, "a/b", b"still fine").unwrap();
    // Inside a transaction the count includes what the transaction created.
    g.rm(XBT_NULL, "a/b/c/d/e/f/g").unwrap();
    let tx = g.transaction_start().unwrap();
    g.write(tx, "t1", b"").unwrap();
    assert!(matches!(g.write(tx, "t2", b""), Err(Error::Quota(_))));
    g.transaction_end(tx, true).unwrap();
    assert_eq!(h.xs.usage(1).nodes, 8);
    // Other domains are not affected, dom0 is unlimited.
    h.client(2).write(XBT_NULL, "free", b"").unwrap();
    let dom0 = h.client(0);
    for i in 0..50 {
        dom0.write(XBT_NULL, &format!("/many/{i}"), b"").unwrap();
    }
}

#[test]
fn watch_quota_is_per_domain() {
    let h = Harness::with_quotas(QUOTAS);
    let a = h.client(1);
    let b = h.client(1);
    a.watch("w1", "t").unwrap();
    a.watch("w2", "t").unwrap();
    b.watch("w3", "t").unwrap();
    assert!(matches!(b.watch("w4", "t"), Err(Error::Quota(_))));
    assert!(matches!(a.watch("w4", "t"), Err(Error::Quota(_))));
    a.unwatch("w1", "t").unwrap();
    b.watch("w4", "t").unwrap();
    assert_eq!(h.xs.usage(1).watches, 3);
    let dom0 = h.client(0);
    for i in 0..20 {
        dom0.watch(&format!("/w{i}"), "t").unwrap();
    }
}

#[test]
fn transaction_quota_is_per_domain() {
    let h = Harness::with_quotas(QUOTAS);
    let a = h.client(1);
    let b = h.client(1);
    let t1 = a.transaction_start().unwrap();
    let _t2 = b.transaction_start().unwrap();
    assert!(matches!(a.transaction_start(), Err(Error::Quota(_))));
    assert!(matches!(b.transaction_start(), Err(Error::Quota(_))));
    a.transaction_end(t1, false).unwrap();
    let _t3 = a.transaction_start().unwrap();
    assert_eq!(h.xs.usage(1).transactions, 2);
    let dom0 = h.client(0);
    let open: Vec<u32> = (0..10).map(|_| dom0.transaction_start().unwrap()).collect();
    assert_eq!(open.len(), 10);
}

#[test]
fn value_size_quota() {
    let h = Harness::with_quotas(QUOTAS);
    let g = h.client(1);
    let big = vec![b'v'; QUOTAS.value_size + 1];
    assert!(matches!(g.write(XBT_NULL, "v", &big), Err(Error::Quota(_))));
    g.write(XBT_NULL, "v", &big[1..]).unwrap();
    h.client(0)
        .write(XBT_NULL, "/local/domain/1/big", &vec![b'x'; 4000])
        .unwrap();
    assert_eq!(g.read(XBT_NULL, "big").unwrap().len(), 4000);
}

#[test]
fn outstanding_replies_throttle_the_domain_only() {
    const REQUESTS: u32 = 300;
    let h = Harness::with_quotas(QUOTAS);
    let value = vec![b'r'; 4000];
    h.client(0)
        .write(XBT_NULL, "/local/domain/1/big", &value)
        .unwrap();
    // Guest 1 pipelines requests whose replies it does not read: far more reply bytes
    // than a socket buffer holds.
    let mut raw = h.raw(1);
    let mut batch = Vec::new();
    for id in 1..=REQUESTS {
        batch.extend(
            XsFrame::new(MsgType::Read, id, 0, b"big\0".to_vec())
                .unwrap()
                .encode(),
        );
    }
    raw.write_all(&batch).unwrap();
    h.wait_until("guest 1 to reach its outstanding quota", |x| {
        x.usage(1).outstanding == QUOTAS.outstanding
    });
    // Meanwhile dom0 and the other guest are served.
    let dom0 = h.client(0);
    assert_eq!(dom0.read(XBT_NULL, "/local/domain/1/big").unwrap(), value);
    h.client(2).write(XBT_NULL, "alive", b"yes").unwrap();
    assert!(h.xs.usage(1).outstanding <= QUOTAS.outstanding);
    // With the socket full, one reply waits in the blocked write and the quota's
    // worth in the queue: the domain stays at its quota, not one below (which
    // would leave the request reader asleep although there is room).
    h.wait_until("guest 1 to be held at its quota", |x| {
        x.usage(1).outstanding == QUOTAS.outstanding
    });
    // Reading lets every request through, in order, intact.
    for id in 1..=REQUESTS {
        let r = wire::read_frame(&mut raw).unwrap().unwrap();
        assert_eq!(r.kind(), Some(MsgType::Read));
        assert_eq!(r.header.req_id, id);
        assert_eq!(r.payload, value);
    }
    h.wait_until("every reply to be delivered", |x| {
        x.usage(1).outstanding == 0
    });
}

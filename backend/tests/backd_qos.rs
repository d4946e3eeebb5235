//! A guest's QoS weight: dom0 writes it in the device's backend directory, the backend
//! gives it to the engine and shows it in its counters; the guest cannot change it.

mod backd_util;

use backd_util::{eventually, BackdTestHost};
use xmx_backend::admin::{BackdRequest, CountersReport};
use xmx_backend::service::{BackendThread, GuestQuotas};
use xmx_backend::xenbus::toolstack;
use xmx_hv::{Error, Platform, DOM0, XBT_NULL};
use xmx_wire::xenbus::{self, keys};

fn weight(backend: &BackendThread) -> Option<u32> {
    let report: CountersReport = serde_json::from_value(
        backend
            .control()
            .call(BackdRequest::Counters)
            .into_result()
            .unwrap(),
    )
    .unwrap();
    report.guests.first()?.nic.as_ref().map(|n| n.weight)
}

#[test]
fn dom0_sets_the_weight_and_the_guest_cannot() {
    let host = BackdTestHost::start();
    let backend = host.start_backend(GuestQuotas::default());
    let mut g = host.guest("g1", 1, 1);
    g.connect();
    assert_eq!(
        weight(&backend),
        Some(1),
        "weight 1 unless dom0 says otherwise"
    );

    let xs0 = host.attach(DOM0).xenstore().unwrap();
    toolstack::write_qos_weight(xs0.as_ref(), DOM0, g.domid, 0, 4).unwrap();
    eventually("the weight reaches the engine", || {
        weight(&backend) == Some(4)
    });

    // The guest may read its backend directory but not write it.
    let node = xenbus::key_path(&g.backend_dir(), keys::QOS_WEIGHT);
    assert_eq!(g.read_backend(keys::QOS_WEIGHT).as_deref(), Some("4"));
    assert!(matches!(
        g.xs.write(XBT_NULL, &node, b"1000"),
        Err(Error::Denied(_))
    ));
    assert_eq!(g.read_backend(keys::QOS_WEIGHT).as_deref(), Some("4"));

    // Out-of-range weights are refused before they reach xenstore.
    for bad in [0, toolstack::QOS_WEIGHT_MAX + 1] {
        assert!(matches!(
            toolstack::write_qos_weight(xs0.as_ref(), DOM0, g.domid, 0, bad),
            Err(Error::Invalid(_))
        ));
    }
    // A device that does not exist has no weight to set.
    assert!(matches!(
        toolstack::write_qos_weight(xs0.as_ref(), DOM0, 999, 0, 2),
        Err(Error::NotFound(_))
    ));

    // A reconnecting guest keeps it: it is read again at every connection.
    g.close();
    g.set_state(xmx_wire::xenbus::XenbusState::Initialising);
    g.connect();
    assert_eq!(weight(&backend), Some(4));
}

#[test]
fn weights_read_back_as_written_or_refused() {
    assert_eq!(toolstack::parse_qos_weight(" 7\n").unwrap(), 7);
    assert_eq!(toolstack::parse_qos_weight("1000").unwrap(), 1000);
    for bad in ["0", "1001", "-1", "", "four", "4x"] {
        assert!(toolstack::parse_qos_weight(bad).is_err(), "{bad:?}");
    }
}

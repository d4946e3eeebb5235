//! Ctrl-C during `xmx demo`'s traffic step (as root): the demo stops, removes everything it
//! built (namespaces, daemons, /run/xmx/demo, its programs) and exits non-zero, saying so in
//! its JSON document.

mod demo_util;

use std::time::Duration;

use demo_util::{ensure_built, leftovers, unavailable, DemoRun};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

#[test]
fn sigint_in_the_traffic_step_tears_everything_down() {
    if let Some(why) = unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    ensure_built();
    assert_eq!(
        leftovers(),
        Vec::<String>::new(),
        "a demo cluster exists before the test"
    );
    let mut run = DemoRun::start(&["--json"]);
    run.wait_line("== [3/7]", Duration::from_secs(120));
    // The step's first measurement has begun: its agents are running in the guests.
    run.wait_line(
        "guest-remote pingpong 0 B: iteration",
        Duration::from_secs(30),
    );
    assert!(
        !leftovers().is_empty(),
        "the cluster is up while traffic runs"
    );
    kill(Pid::from_raw(run.child.id() as i32), Signal::SIGINT).unwrap();
    let end = run.finish(Duration::from_secs(120));

    assert_eq!(end.status.code(), Some(130), "{}", end.stderr);
    assert!(
        end.stderr.contains("xmx: SIGINT: stopping and cleaning up"),
        "{}",
        end.stderr
    );
    let doc: Value =
        serde_json::from_str(&end.stdout).unwrap_or_else(|e| panic!("{e}: {}", end.stdout));
    assert_eq!(doc["ok"], false);
    assert_eq!(doc["interrupted"], "SIGINT");
    let status = |name: &str| {
        doc["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .map(|s| s["status"].as_str().unwrap().to_owned())
            .unwrap()
    };
    assert_eq!(status("cluster"), "ok");
    assert_eq!(status("traffic"), "interrupted");
    assert_eq!(status("isolation"), "skipped");
    assert_eq!(status("teardown"), "ok");
    assert_eq!(
        leftovers(),
        Vec::<String>::new(),
        "left behind after SIGINT"
    );
}

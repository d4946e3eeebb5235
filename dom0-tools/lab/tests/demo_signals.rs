//! The interrupt handling `xmx demo` and `xmx bench` share, in a process of its own (it
//! takes over this process's SIGINT and SIGTERM): a signal is recorded, ends the helpers
//! (children in this process group) at once, spares daemons (their own group) and, under a
//! shield, every child.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command};
use std::time::Duration;

use nix::sys::signal::{kill, raise, Signal};
use nix::unistd::Pid;
use xmx_lab::interrupt;

fn sleeper(own_group: bool) -> Child {
    let mut cmd = Command::new("sleep");
    cmd.arg("600");
    if own_group {
        cmd.process_group(0);
    }
    cmd.spawn().expect("starting sleep")
}

/// End `child` with SIGTERM; the signal that ended it (SIGKILL if someone else got there
/// first).
fn terminate(mut child: Child) -> Option<i32> {
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    child.wait().expect("waiting for sleep").signal()
}

#[test]
fn signals_end_helpers_spare_daemons_and_respect_shields() {
    interrupt::install().unwrap();
    assert_eq!(interrupt::received(), None);
    assert!(interrupt::check().is_ok());
    let mut helper = sleeper(false);
    let daemon = sleeper(true);

    // The handler runs before raise returns; the helpers are ended by the watcher thread.
    raise(Signal::SIGTERM).unwrap();
    assert_eq!(interrupt::received(), Some(Signal::SIGTERM));
    let err = interrupt::check().unwrap_err();
    assert_eq!((err.signal, err.exit_code()), (Signal::SIGTERM, 143));
    assert!(interrupt::wait_handled(1, Duration::from_secs(30)));
    assert_eq!(helper.wait().unwrap().signal(), Some(libc::SIGKILL));

    // While a teardown runs, its commands are not ended.
    let teardown_command = sleeper(false);
    {
        let _shield = interrupt::shield();
        raise(Signal::SIGINT).unwrap();
        assert!(interrupt::wait_handled(2, Duration::from_secs(30)));
    }
    assert_eq!(interrupt::handled(), 2);
    // The first signal stays the one reported.
    assert_eq!(interrupt::received(), Some(Signal::SIGTERM));

    // Neither the daemon nor the shielded command was killed: they end by our SIGTERM.
    assert_eq!(terminate(daemon), Some(libc::SIGTERM));
    assert_eq!(terminate(teardown_command), Some(libc::SIGTERM));
}

//! The C programs of tests/c, built against our header and the built
//! libmyriexpress.so, run on the loopback transport (two endpoints of one
//! process).

mod common;

use common::{build, our_include, run, run_ok, scratch};

fn program(name: &str) -> String {
    let dir = scratch();
    let bin = build(name, &our_include(), dir.path());
    let out = run_ok(&bin, &[]);
    print!("{out}");
    out
}

#[test]
fn pingpong_every_size_up_to_16_mib() {
    let out = program("pingpong");
    // One line per size, the largest last.
    assert!(out.lines().any(|l| l.trim_start().starts_with("16777216 ")));
}

/// The passive side's first receive is a LARGE message; it then connects
/// back and answers on that connection.
#[test]
fn first_message_large_then_connect_back() {
    assert!(program("first_large")
        .contains("first message of 65536 bytes, 6 rounds answered on the connection back"));
}

#[test]
fn stream_keeps_order() {
    assert!(program("stream").contains("received 1500 messages in order"));
}

#[test]
fn wait_any_over_many_requests() {
    program("waitany");
}

#[test]
fn wakeup_from_another_thread() {
    assert_eq!(
        program("wakeup").matches("returned on mx_wakeup").count(),
        4
    );
}

#[test]
fn many_outstanding_requests() {
    program("outstanding");
}

#[test]
fn connect_refusals() {
    program("badkey");
}

#[test]
fn truncation_and_synchronous_send() {
    program("truncate");
}

#[test]
fn cancel_forget_peek() {
    program("cancel");
}

#[test]
fn probe_unexpected_messages() {
    program("probe");
}

#[test]
fn unexpected_handler() {
    program("unexp");
}

/// A receive the unexpected handler posts completes in the call whose
/// progress met the message, before a later message's completion is seen.
#[test]
fn handler_receives_complete_in_the_call_that_met_them() {
    assert!(program("handler_first")
        .contains("the first poll took the first control packet, then the message"));
}

#[test]
fn info_names_raw_and_init_checks() {
    program("info");
}

#[test]
fn errors_are_fatal_by_default_and_return_with_the_knob() {
    let dir = scratch();
    let bin = build("badkey", &our_include(), dir.path());
    let o = run(&bin, &["-f"], &[]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(255), "stderr: {stderr}");
    assert!(
        stderr.contains("mx_connect") && stderr.contains("wrong key"),
        "message printed: {stderr}"
    );
    // MX_ERRORS_ARE_FATAL=0: the default handler returns the code.
    let o = run(&bin, &["-f"], &[("MX_ERRORS_ARE_FATAL", "0")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("the default error handler returned"));
}

#[test]
fn transports_not_built_yet_are_refused_clearly() {
    let dir = scratch();
    let bin = build("info", &our_include(), dir.path());
    for t in ["xen", "native"] {
        let o = run(&bin, &[], &[("XMX_TRANSPORT", t)]);
        assert_eq!(o.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            stderr.contains("mx_init") && stderr.contains("MX driver not available"),
            "{t}: {stderr}"
        );
    }
}

#[test]
fn split_mode_names_its_peer_by_hostname() {
    // Run as two processes (-l EID on one side, -d HOST -e EID on the
    // other), the programs need a transport between processes, which the
    // loopback is not: here the active side alone looks its peer up by
    // name, and an unknown name is a (fatal by default) MX error.
    let dir = scratch();
    let bin = build("pingpong", &our_include(), dir.path());
    let o = run(&bin, &["-d", "no-such-host:0", "-e", "2"], &[]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(255), "{stderr}");
    assert!(stderr.contains("mx_hostname_to_nic_id") && stderr.contains("Host not found"));
}

#[test]
fn background_progression_and_its_switch() {
    program("progression");
}

/// The unexpected handler never runs while the application has progression
/// disabled: the progression thread, which looked before the section began,
/// ran it inside the section (an MPI transport's free list of requests,
/// refilled in such sections, came apart).
#[test]
fn no_handler_inside_a_disabled_section() {
    for _ in 0..3 {
        assert!(program("disabled_section").contains("the handler never inside a disabled section"));
    }
}

#[test]
fn threads_share_an_endpoint() {
    assert!(program("threads").contains("4 threads x 300 round trips"));
}

/// A LARGE reply to `status.source` from a side that never connected back: the
/// receiver identifies the sender by the session it connected with.
#[test]
fn large_reply_without_connecting_back() {
    program("reply_large");
}

/// An endpoint sends to its own address without mx_connect, at every size.
#[test]
fn sends_to_oneself_without_connecting() {
    let out = program("self_send");
    assert_eq!(out.matches("75 messages to itself checked").count(), 2);
}

/// A 0-byte mx_issend completes, and the sends behind it go.
#[test]
fn zero_byte_synchronous_send() {
    assert!(program("zero_issend").contains("20 rounds of 0 B issends"));
}

/// NULL requests, NULL status/result, garbage addresses and a second
/// mx_finalize get MX's error codes through the error handler.
#[test]
fn bad_arguments_get_mx_error_codes() {
    assert!(program("bad_args").contains("bad arguments refused with MX's codes (15 failures"));
}

/// mx_open_board, mx__get_mapper_state and mx__regcache_clean (Open MPI).
#[test]
fn mx_internals_for_open_mpi() {
    assert!(program("mx_internals").contains("mx__regcache_clean checked"));
}

/// An MPI transport's use of MX: a context id, an unexpected handler that
/// posts receives for control packets, LARGE and small messages of one
/// match info received in arrival order, exchanges in both directions.
#[test]
fn mpi_transport_pattern() {
    assert!(program("mpi_pattern").contains("received 4 rounds in arrival order"));
}

/// An application polling with nothing to find is never put to sleep by the
/// nonblocking calls, and finds the message that then arrives.
#[test]
fn idle_polling_never_sleeps_and_finds_what_arrives() {
    assert!(program("poll_idle").contains("then found the message"));
}

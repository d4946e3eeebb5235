# Scenario mx: the xmx stack on one real-Xen host. dom0 runs xmx-backd and xmxd (no NIC:
# the guests are co-located), creates guests g1 and g2 with `xmx-hook create` from
# configurations that ask for xmx, and each guest's xmx-frontd connects through xenbus.
# Then:
#   1. mxcheck between the guests: g1 passive, g2 active (8-byte ping-pong latency, 16 MiB
#      each way, every byte checked by its receiver);
#   2. `xl destroy g2`: nothing of it may stay in dom0 (xenstore nodes, the backend's
#      device, its grant mappings and file descriptors, which must come back to what they
#      were with g1 alone);
#   3. g2 created again (a new domain id): mxcheck once more between g1 and the new g2
#      (20 round trips, 1 MiB each way: the guest works, the LARGE path included);
#   4. both guests end and power off: the backend then holds what it held before any guest.
# Every step prints an `xmx-result` line; the test reads them.
#
# Kernel arguments: xmx.log= RUST_LOG of every daemon and program (default warn),
# xmx.iters= ping-pong round trips (default 100), xmx.bytes= LARGE message size
# (default 16777216), xmx.jobtimeout= (default 180).

. /etc/xmx/scenarios/mx/lib.sh

# xmx_mx_pair PASSIVE_DOMID ACTIVE_DOMID ACTIVE_PEER_NAME ID ITERS BYTES: mxcheck between
# two guests of this host; fails unless both sides pass.
xmx_mx_pair() {
    local p=$1 a=$2 peer=$3 id=$4 iters=$5 bytes=$6 jt sp sa
    jt=$(xmx_arg jobtimeout 180)
    xmx_job_start "$p" "$id" mxcheck -l 2 -n "$iters" -s "$bytes" || return 1
    xmx_job_start "$a" "$id" mxcheck -d "$peer" -e 2 -n "$iters" -s "$bytes" -w 60 || return 1
    sa=$(xmx_job_wait "$a" "$id" $((jt + 10)))
    sp=$(xmx_job_wait "$p" "$id" 30)
    xmx_log "job $id: passive (domain $p) status $sp, active (domain $a) status $sa"
    [ "$sp" = 0 ] && [ "$sa" = 0 ]
}

scenario_dom0() {
    local g1 g2 g2old alone empty final s1 s2 e1 e2 rc=$XMX_PASS
    ip link set lo up
    xmx_stack_up none hostA || return $XMX_SETUP
    empty=$(xmx_backd_holdings)
    xmx_log "xmx-backd with no guest: $empty"

    g1=$(xmx_guest_create g1 "xmx.log=$(xmx_arg log warn)") || return $XMX_SETUP
    xmx_guest_ready "$g1" 60 || { xmx_dump_guest_console g1; xmx_dump_stack_logs; return $XMX_SETUP; }
    alone=$(xmx_backd_holdings)
    xmx_log "g1 is domain $g1; xmx-backd with g1: $alone"
    g2=$(xmx_guest_create g2 "xmx.log=$(xmx_arg log warn)") || return $XMX_SETUP
    xmx_guest_ready "$g2" 60 || { xmx_dump_guest_console g2; xmx_dump_stack_logs; return $XMX_SETUP; }
    xmx_log "g2 is domain $g2; xmx-backd: $(xmx_backd_holdings)"
    xenstore-ls -f /local/domain/0/backend/xmx

    if xmx_mx_pair "$g1" "$g2" g1 1 "$(xmx_arg iters 100)" "$(xmx_arg bytes 16777216)"; then
        xmx_summary "pair-1 pass g1=$g1 g2=$g2"
    else
        xmx_summary "pair-1 fail"
        # What the guests said, now: the end of the scenario may not come before its
        # deadline once a job has used up its time.
        xmx_dump_guest_console g1
        xmx_dump_guest_console g2
        rc=$XMX_FAIL
    fi

    xmx_dump_guest_console g2
    g2old=$g2
    xl destroy g2 || { xmx_log "xl destroy g2 failed"; return $XMX_FAIL; }
    if xmx_gone_from_dom0 "$g2old" && xmx_holdings_settle "$alone" 20; then
        xmx_summary "destroy pass domain=$g2old holdings=[$alone]"
    else
        xmx_summary "destroy fail domain=$g2old holdings=[$(xmx_backd_holdings)] expected=[$alone]"
        rc=$XMX_FAIL
    fi

    if g2=$(xmx_guest_create g2 "xmx.log=$(xmx_arg log warn)") && xmx_guest_ready "$g2" 60; then
        xmx_log "g2 is now domain $g2"
        if xmx_mx_pair "$g1" "$g2" g1 2 20 1048576; then
            xmx_summary "pair-2 pass g1=$g1 g2=$g2 was=$g2old"
        else
            xmx_summary "pair-2 fail"
            xmx_dump_guest_console g1
            xmx_dump_guest_console g2
            xmx_dump_stack_logs
            rc=$XMX_FAIL
        fi
    else
        xmx_summary "recreate fail"
        rc=$XMX_FAIL
    fi

    e1=$(xmx_guest_end "$g1") || e1=none
    e2=$(xmx_guest_end "$g2") || e2=none
    xmx_dump_guest_console g1
    xmx_dump_guest_console g2
    xmx_log "guests ended: g1 status $e1, g2 status $e2"
    [ "$e1" = 0 ] && [ "$e2" = 0 ] || rc=$XMX_FAIL
    s1=0
    xmx_gone_from_dom0 "$g1" || s1=1
    s2=0
    xmx_gone_from_dom0 "$g2" || s2=1
    if [ $s1 = 0 ] && [ $s2 = 0 ] && xmx_holdings_settle "$empty" 20; then
        final=pass
    else
        final=fail
        rc=$XMX_FAIL
    fi
    xmx_summary "empty $final holdings=[$(xmx_backd_holdings)] expected=[$empty]"
    xmx_stack_alive || rc=$XMX_FAIL
    [ $rc = $XMX_PASS ] || xmx_dump_stack_logs
    return $rc
}

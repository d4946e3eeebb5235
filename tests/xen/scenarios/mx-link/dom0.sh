# Scenario mx-link: the xmx stack on two real-Xen hosts whose dom0 NICs share one emulated
# Ethernet segment. Each dom0 runs xmx-backd and xmxd on its NIC (the xmxds discover each
# other over MXoE and share one peer table) and creates one guest through the xl
# integration: a1 on host A (xmx.side=a), b1 on host B (xmx.side=b). a1 runs mxcheck's
# passive side, b1 the active side against a1, across the link: the backends exchange MXoE
# frames. Then the pair runs again with the registration cache off (MX_RCACHE=0): each LARGE
# buffer is registered for its message with the application's own grants, the backend
# keeping its mappings of them between messages; eight rounds of 1 MiB each way, each with
# its own contents, every byte checked. Then the guest ends, and its host's backend must
# hold what it held before (kept mappings included).
# Each host prints `xmx-result` lines and ends with its own verdict.
#
# Kernel arguments: xmx.side= a or b, xmx.nic= (default eth0), xmx.mtu= (default 9000),
# xmx.iters= (default 30), and those of the mx scenario (log, bytes, jobtimeout).

. /etc/xmx/scenarios/mx/lib.sh

scenario_dom0() {
    local side nic mtu name job domid empty status end final iters bytes jt rc=$XMX_PASS
    side=$(xmx_arg side none)
    nic=$(xmx_arg nic eth0)
    mtu=$(xmx_arg mtu 9000)
    # Fewer round trips than on one host: each crosses two emulated machines.
    iters=$(xmx_arg iters 30)
    bytes=$(xmx_arg bytes 16777216)
    jt=$(xmx_arg jobtimeout 180)
    case $side in
        a) name=a1; job="mxcheck -l 2 -n $iters -s $bytes" ;;
        b) name=b1; job="mxcheck -d a1 -e 2 -n $iters -s $bytes -w 120" ;;
        *) xmx_log "xmx.side must be a or b, not '$side'"; return $XMX_SETUP ;;
    esac
    ip link set lo up
    ip link set "$nic" mtu "$mtu" || { xmx_log "$nic refuses MTU $mtu"; return $XMX_SETUP; }
    ip link set "$nic" up || return $XMX_SETUP
    # With a NIC, xmx-backd opens packet sockets when its first guest comes (seen here: two
    # sockets created after the guest's creation, kept after it ended), so its descriptor
    # count with no guest yet is no baseline: mappings and devices are compared, the
    # descriptors only by the mx scenario (no NIC).
    XMX_HOLDINGS_FDS=0
    xmx_stack_up "$nic" "host-$side" || return $XMX_SETUP
    empty=$(xmx_backd_holdings)
    xmx_log "xmx-backd with no guest: $empty"

    domid=$(xmx_guest_create "$name" "xmx.log=$(xmx_arg log warn)") || return $XMX_SETUP
    xmx_guest_ready "$domid" 60 || { xmx_dump_guest_console "$name"; xmx_dump_stack_logs; return $XMX_SETUP; }
    xmx_log "$name is domain $domid; xmx-backd: $(xmx_backd_holdings)"
    xmx_job_start "$domid" 1 "$job" || return $XMX_SETUP
    status=$(xmx_job_wait "$domid" 1 $((jt + 10)))
    xmx_log "mxcheck in $name: status $status"
    xmx peers --xmxd-socket "$XMX_XMXD_SOCK" 2>&1 || true
    xmx counters --backd-socket "$XMX_BACKD_SOCK" 2>&1 || true
    if [ "$status" = 0 ]; then
        xmx_summary "link-pair-$side pass $name=$domid"
    else
        xmx_summary "link-pair-$side fail"
        rc=$XMX_FAIL
    fi

    # Another endpoint id: the first pair's passive side may still be closing its own.
    case $side in
        a) job="env MX_RCACHE=0 mxcheck -l 3 -n 10 -s 1048576 -r 8" ;;
        b) job="env MX_RCACHE=0 mxcheck -d a1 -e 3 -n 10 -s 1048576 -r 8 -w 120" ;;
    esac
    xmx_job_start "$domid" 2 "$job" || return $XMX_SETUP
    status=$(xmx_job_wait "$domid" 2 $((jt + 10)))
    xmx_log "mxcheck without the registration cache in $name: status $status"
    if [ "$status" = 0 ]; then
        xmx_summary "nocache-pair-$side pass $name=$domid"
    else
        xmx_summary "nocache-pair-$side fail"
        rc=$XMX_FAIL
    fi

    end=$(xmx_guest_end "$domid") || end=none
    xmx_dump_guest_console "$name"
    [ "$end" = 0 ] || rc=$XMX_FAIL
    if xmx_gone_from_dom0 "$domid" && xmx_holdings_settle "$empty" 20; then
        final=pass
    else
        final=fail
        rc=$XMX_FAIL
    fi
    xmx_summary "empty-$side $final holdings=[$(xmx_backd_holdings)] expected=[$empty]"
    xmx_stack_alive || rc=$XMX_FAIL
    [ $rc = $XMX_PASS ] || xmx_dump_stack_logs
    return $rc
}

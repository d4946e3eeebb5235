# Scenario mx-migrate: the xmx stack on two linked hosts as in mx-link, and a guest moved
# by real Xen in the middle of its MX traffic. a1 on host A runs mxcheck's passive side,
# b1 on host B the active side against a1: a short ping-pong, then rounds of LARGE
# messages each way. Once a1's backend has pulled LARGE data (so the stream is under way,
# a LARGE message in flight in one direction or the other), A migrates a1 to B with
# `xmx-hook migrate` (the stream over the link as in the migrate scenario): the hook
# holds a1's xmx device closed, so a1's daemon lets go of its event channels before its
# kernel suspends; on B, a1's daemon notices the new domid, takes up the device B's xmxd
# attached to the incoming domain, re-opens its endpoints in their sessions over new
# grants, and its regions are granted again with what they held. Both mxchecks must end
# with every byte of every round checked (the slowest round is what the move cost), both
# guests must end cleanly, and neither host may keep anything of a guest that left.
#
# Order, over the link (no sleeps): B creates b1 and starts its job, then listens; A
# creates a1, starts its job, waits for B's listener and migrates. B learns the end of the
# migration from its receiver's exit; A stays up until B releases it at the end.
#
# Each host prints `xmx-result` lines and, always, its daemons' logs, the guests' consoles
# (a1's on B is guest-a1--incoming.log), xl's logs and, on B, a digest of xenstored's trace
# of a1's arrival.
#
# Then (xmx.back=1, the default) B moves a1 back to A, once a1 and b1 talk over a direct
# channel (the hook revokes it first), and a1's stream ends on A. A gives the returning
# a1 the domid B had given it: only the mark in its xenstore home tells that it moved.
#
# Kernel arguments: xmx.side= a or b, xmx.back= 0 or 1 (default 1), xmx.iters= round trips
# (default 20), xmx.bytes= of each LARGE message (default 1048576), xmx.seconds= the
# rounds go on (default 90, 170 with back=1: the stream must span the moves),
# xmx.jobtimeout= (default seconds + 110), xmx.wait= seconds B listens and A waits
# (default 240), xmx.xltimeout= (default 240), xmx.log=, xmx.nic=, xmx.mtu=.

. /etc/xmx/scenarios/mx/lib.sh
. /etc/xmx/scenarios/migrate/lib.sh

scenario_dom0() {
    local side
    side=$(xmx_arg side none)
    migrate_net_up "$side" || return $XMX_SETUP
    # See mx-link: with a NIC, the descriptor count is no baseline.
    XMX_HOLDINGS_FDS=0
    xmx_stack_up "$(xmx_arg nic eth0)" "host-$side" || return $XMX_SETUP
    MXM_EMPTY=$(xmx_backd_holdings)
    xmx_log "xmx-backd with no guest: $MXM_EMPTY"
    MXM_ITERS=$(xmx_arg iters 20)
    MXM_BYTES=$(xmx_arg bytes 1048576)
    MXM_BACK=$(xmx_arg back 1)
    # The stream runs for a time, not a number of rounds: it must span the move (and the
    # move back), however long xl takes.
    if [ "$MXM_BACK" = 1 ]; then
        MXM_SECONDS=$(xmx_arg seconds 170)
    else
        MXM_SECONDS=$(xmx_arg seconds 90)
    fi
    MXM_JT=$(xmx_arg jobtimeout $((MXM_SECONDS + 110)))
    case $side in
        a) mxm_side_a ;;
        b) mxm_side_b ;;
    esac
}

# mxm_guest NAME JOB: create NAME through the xl integration, wait until its xmx device is
# Connected, hand it JOB as job 1; prints its domain id.
mxm_guest() {
    local domid
    domid=$(xmx_guest_create "$1" "xmx.log=$(xmx_arg log warn)" "xmx.jobtimeout=$MXM_JT") || return 1
    xmx_guest_ready "$domid" 60 || { xmx_dump_guest_console "$1"; return 1; }
    xmx_log "$1 is domain $domid; xmx-backd: $(xmx_backd_holdings)"
    xmx_job_start "$domid" 1 "$2" || return 1
    echo "$domid"
}

# mxm_wait_pulls SECONDS: wait until this host's backend has completed a pull (LARGE
# data for its guest). No event to wait on from a shell: the counters are read every 0.2 s.
mxm_wait_pulls() {
    local i=0 n=$(($1 * 5))
    until xmx counters --backd-socket "$XMX_BACKD_SOCK" --json 2>/dev/null |
        grep -q '"pulls_done": *[1-9]'; do
        i=$((i + 1))
        [ $i -le $n ] || return 1
        usleep 200000
    done
}

mxm_dump_all() {
    echo "----- xmx peers -----"
    xmx peers --xmxd-socket "$XMX_XMXD_SOCK" 2>&1
    echo "----- xmx counters -----"
    xmx counters --backd-socket "$XMX_BACKD_SOCK" 2>&1
    echo "----- xenstore /local/domain/0/backend/xmx, /local/domain/0/xmx -----"
    xenstore-ls -f /local/domain/0/backend/xmx 2>&1
    xenstore-ls -f /local/domain/0/xmx 2>&1
    xmx_dump_stack_logs
    migrate_dump_xl_logs
}

mxm_side_a() {
    local domid rc=$XMX_PASS
    domid=$(mxm_guest a1 "mxcheck -l 2 -n $MXM_ITERS -s $MXM_BYTES -t $MXM_SECONDS") || { mxm_dump_all; return $XMX_SETUP; }
    # Migrate in the middle of the LARGE stream: once a1's backend has pulled for it.
    if mxm_wait_pulls 120; then
        xmx_summary "stream-a pass"
    else
        xmx_summary "stream-a fail (no LARGE data pulled for a1 in 120 s)"
        rc=$XMX_FAIL
    fi
    if MIGRATE_HOOK=/etc/xen/scripts/xmx-hook XMX_XL=xl XMX_XMXD_SOCKET=$XMX_XMXD_SOCK \
        migrate_send a1 "$(xmx_arg xltimeout 240)"; then
        xmx_summary "migrate-a pass seconds=$(migrate_secs "$MIGRATE_MS") domid=$domid"
    else
        xmx_summary "migrate-a fail seconds=$(migrate_secs "$MIGRATE_MS")"
        rc=$XMX_FAIL
    fi
    xl list
    # Nothing of a1 left on A: no domain, no xenstore nodes, no device in the backend, and
    # the backend holds what it held before any guest.
    if ! xl domid a1 >/dev/null 2>&1 && xmx_gone_from_dom0 "$domid" && xmx_holdings_settle "$MXM_EMPTY" 20; then
        xmx_summary "gone-a pass domid=$domid"
    else
        xmx_summary "gone-a fail holdings=[$(xmx_backd_holdings)] expected=[$MXM_EMPTY]"
        rc=$XMX_FAIL
    fi
    if [ "$MXM_BACK" = 1 ]; then
        mxm_back_a || rc=$XMX_FAIL
    fi
    # B may still need A's xmxd (its announcements) until it is done.
    if migrate_barrier_wait $(($(xmx_arg deadline 300) - $(xmx_uptime) - 30)); then
        xmx_log "host B is done"
    else
        xmx_log "host B never said it was done"
    fi
    xmx_stack_alive || rc=$XMX_FAIL
    xmx_dump_guest_console a1
    mxm_dump_all
    return $rc
}

# mxm_back_a: A receives a1 back from B (xmx.back=1) in the middle of its stream, which
# then ends on A: a1's device is Connected again, its mxcheck passes, it ends, and A's
# backend holds what it held before any guest.
mxm_back_a() {
    local a1 st end rc=0
    if migrate_receive "$(xmx_arg wait 240)"; then
        xmx_summary "back-receive-a pass"
    else
        xmx_summary "back-receive-a fail"
        return 1
    fi
    a1=$(xl domid a1 2>/dev/null) || { xmx_summary "back-arrived-a fail"; return 1; }
    xmx_summary "back-arrived-a pass domid=$a1"
    if xmx_watch_until "/local/domain/0/backend/xmx/$a1/0/state" 60 \
        xmx_xs_has_prefix "/local/domain/0/backend/xmx/$a1/0/state" 4; then
        xmx_summary "back-device-a pass"
    else
        xmx_summary "back-device-a fail backend-state=$(xenstore-read "/local/domain/0/backend/xmx/$a1/0/state" 2>&1)"
        rc=1
    fi
    st=$(mxm_job_status "$a1" $((MXM_JT + 10)))
    if [ "$st" = 0 ]; then xmx_summary "a1-moved-a pass a1=$a1"; else xmx_summary "a1-moved-a fail a1-mxcheck=$st"; rc=1; fi
    end=$(mxm_end a1 "$a1")
    if [ "$end" = 0 ]; then xmx_summary "end-a pass"; else xmx_summary "end-a fail a1=$end"; rc=1; fi
    if xmx_gone_from_dom0 "$a1" && xmx_holdings_settle "$MXM_EMPTY" 20; then
        xmx_summary "empty-a pass"
    else
        xmx_summary "empty-a fail holdings=[$(xmx_backd_holdings)] expected=[$MXM_EMPTY]"
        rc=1
    fi
    migrate_dump_consoles a1
    return $rc
}

# mxm_back_b A1: B moves a1 back to A (xmx.back=1) once it talks to b1 over a direct
# channel: the move revokes the channel first, then holds a1's device closed.
mxm_back_b() {
    local a1=$1 i=0
    until xmx direct --xmxd-socket "$XMX_XMXD_SOCK" --json 2>/dev/null | grep -q "$a1"; do
        i=$((i + 1))
        [ $i -le 150 ] || { xmx_summary "direct-b fail (no pair offered to a1 in 30 s)"; return 1; }
        usleep 200000
    done
    xmx_summary "direct-b pass"
    if MIGRATE_HOOK=/etc/xen/scripts/xmx-hook XMX_XL=xl XMX_XMXD_SOCKET=$XMX_XMXD_SOCK \
        migrate_send a1 "$(xmx_arg xltimeout 240)" "$MIGRATE_IP_A"; then
        xmx_summary "back-b pass seconds=$(migrate_secs "$MIGRATE_MS") domid=$a1"
    else
        xmx_summary "back-b fail seconds=$(migrate_secs "$MIGRATE_MS")"
        return 1
    fi
    if ! xl domid a1 >/dev/null 2>&1 && xmx_gone_from_dom0 "$a1"; then
        xmx_summary "gone-b pass domid=$a1"
    else
        xmx_summary "gone-b fail"
        return 1
    fi
}

# mxm_job_status DOMID SECONDS: job 1's status in DOMID, or "none" after SECONDS.
mxm_job_status() {
    xmx_job_wait "$1" 1 "$2"
}

# mxm_end NAME DOMID: end the guest (its job loop, else xl destroy); prints its status.
mxm_end() {
    local end
    if end=$(xmx_guest_end "$2"); then
        echo "$end"
    else
        xmx_log "$1 (domain $2) did not end: xl destroy"
        xl destroy "$2" >&2
        echo destroyed
    fi
}

mxm_side_b() {
    local b1 a1 st_b st_a end_a end_b t0 left rc=$XMX_PASS
    b1=$(mxm_guest b1 "mxcheck -d a1 -e 2 -n $MXM_ITERS -s $MXM_BYTES -t $MXM_SECONDS -w 120") || { mxm_dump_all; return $XMX_SETUP; }
    migrate_trace_on /var/log/xenstored-trace.log
    if migrate_receive "$(xmx_arg wait 240)"; then
        xmx_summary "receive-b pass"
    else
        xmx_summary "receive-b fail"
        rc=$XMX_FAIL
    fi
    xl list
    if a1=$(xl domid a1 2>/dev/null); then
        xmx_summary "arrived-b pass domid=$a1 b1=$b1"
        # Its device: B's xmxd attaches it to the incoming domain; the guest's frontend must
        # bring it to Connected again.
        if xmx_watch_until "/local/domain/0/backend/xmx/$a1/0/state" 60 \
            xmx_xs_has_prefix "/local/domain/0/backend/xmx/$a1/0/state" 4; then
            xmx_summary "a1-device-b pass"
        else
            xmx_summary "a1-device-b fail backend-state=$(xenstore-read "/local/domain/0/backend/xmx/$a1/0/state" 2>&1) frontend-state=$(xenstore-read "/local/domain/$a1/device/xmx/0/state" 2>&1)"
            rc=$XMX_FAIL
        fi
        xmx_log "a1's xenstore nodes on B:"
        xenstore-ls -f "/local/domain/$a1" >&2
        xenstore-ls -f "/local/domain/0/backend/xmx/$a1" >&2
    else
        xmx_summary "arrived-b fail"
        rc=$XMX_FAIL
        a1=
    fi
    migrate_trace_off
    if [ "$MXM_BACK" = 1 ] && [ -n "$a1" ]; then
        # a1 goes back to A in the middle of its stream, and ends there.
        if mxm_back_b "$a1"; then a1=; else rc=$XMX_FAIL; fi
    fi
    # Both mxchecks, bounded together by the job timeout.
    t0=$(xmx_uptime)
    st_b=$(mxm_job_status "$b1" $((MXM_JT + 10)))
    if [ "$st_b" = 0 ]; then xmx_summary "pair-b pass b1=$b1"; else xmx_summary "pair-b fail b1-mxcheck=$st_b"; rc=$XMX_FAIL; fi
    if [ -n "$a1" ]; then
        left=$((MXM_JT + 10 - ($(xmx_uptime) - t0)))
        [ $left -gt 5 ] || left=5
        st_a=$(mxm_job_status "$a1" $left)
        if [ "$st_a" = 0 ]; then xmx_summary "a1-moved-b pass a1=$a1"; else xmx_summary "a1-moved-b fail a1-mxcheck=$st_a"; rc=$XMX_FAIL; fi
    fi
    xmx peers --xmxd-socket "$XMX_XMXD_SOCK" 2>&1
    # Both guests end; then B's backend holds what it held before any guest.
    end_b=$(mxm_end b1 "$b1")
    end_a=none
    [ -z "$a1" ] || end_a=$(mxm_end a1 "$a1")
    # Back on A, a1 ends there (A checks it).
    [ "$MXM_BACK" = 1 ] && end_a=0
    if [ "$end_b" = 0 ] && [ "$end_a" = 0 ]; then xmx_summary "end-b pass"; else xmx_summary "end-b fail b1=$end_b a1=$end_a"; rc=$XMX_FAIL; fi
    if xmx_gone_from_dom0 "$b1" && { [ -z "$a1" ] || xmx_gone_from_dom0 "$a1"; } && xmx_holdings_settle "$MXM_EMPTY" 20; then
        xmx_summary "empty-b pass"
    else
        xmx_summary "empty-b fail holdings=[$(xmx_backd_holdings)] expected=[$MXM_EMPTY]"
        rc=$XMX_FAIL
    fi
    migrate_barrier_release 10 || xmx_log "could not release host A"
    xmx_stack_alive || rc=$XMX_FAIL
    xmx_dump_guest_console b1
    migrate_dump_consoles a1
    [ -z "$a1" ] || migrate_trace_digest "$a1"
    mxm_dump_all
    [ $rc = $XMX_PASS ] && xmx_summary "mx-migrate-b pass" || xmx_summary "mx-migrate-b fail (see the steps above)"
    return $rc
}

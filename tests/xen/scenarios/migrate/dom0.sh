# Scenario migrate: `xl migrate` of a running PV guest from host A to host B, the stream
# over the dom0s' link (see lib.sh for the transport).
#
# Host A (xmx.side=a) creates the guest `mig` (a plain PV domU, no xmx), waits for its
# heartbeat (domu.sh: a counter at data/heartbeat every 100 ms), waits until B listens and
# migrates the guest to B while it runs. It checks that xl succeeded and that nothing of
# the guest is left on A, and reports the migration's time.
# Host B (xmx.side=b) first creates and destroys a placeholder domain (the incoming guest
# then gets another domain id than it had on A), listens, and once its xl migrate-receive
# has ended checks that the guest runs there under its own name: listed by `xl list`, its
# heartbeat going on, a job handed to it through xenstore answered, the job's output on its
# console; then ends the guest and checks it is gone. xenstored's trace of the arrival is
# kept and a digest of it printed.
#
# Each host prints `xmx-result STEP pass|fail ...` lines and ends with its own verdict.
# Kernel arguments: xmx.side= a or b, xmx.mem= the guest's MiB (default 128),
# xmx.nic=, xmx.mtu= (default eth0, 9000), xmx.wait= seconds B listens and A waits for B
# (default 240), xmx.xltimeout= the bound on xl migrate (default 240).

. /etc/xmx/scenarios/mx/lib.sh
. /etc/xmx/scenarios/migrate/lib.sh

MIGRATE_GUEST=mig

scenario_dom0() {
    local side
    side=$(xmx_arg side none)
    migrate_net_up "$side" || return $XMX_SETUP
    case $side in
        a) migrate_side_a ;;
        b) migrate_side_b ;;
    esac
}

migrate_side_a() {
    local mem domid beat rc=$XMX_PASS
    mem=$(xmx_arg mem 128)
    xl create /etc/xen/domu.cfg "name=\"$MIGRATE_GUEST\"" "memory=$mem" \
        "extra=\"console=hvc0 quiet xmx.scenario=migrate\"" >/tmp/xl-create.log 2>&1 ||
        { cat /tmp/xl-create.log >&2; return $XMX_SETUP; }
    domid=$(xl domid "$MIGRATE_GUEST") || return $XMX_SETUP
    xmx_log "$MIGRATE_GUEST is domain $domid ($mem MiB)"
    migrate_heartbeats "$domid" 20 90 || { xmx_log "no heartbeat from $MIGRATE_GUEST"; migrate_dump_consoles "$MIGRATE_GUEST"; return $XMX_SETUP; }
    beat=$(xenstore-read "/local/domain/$domid/data/heartbeat")
    # A node dom0 writes in the guest's home: does it travel with the guest? (No: the
    # stream carries memory and CPU state; B's xl writes the home afresh.)
    xenstore-write "/local/domain/$domid/data/from-a" "written by host A's dom0"
    xmx_log "$MIGRATE_GUEST beats ($beat); xl list:"
    xl list
    if migrate_send "$MIGRATE_GUEST" "$(xmx_arg xltimeout 240)"; then
        xmx_summary "migrate-a pass seconds=$(migrate_secs "$MIGRATE_MS") memory=${mem}MiB domid=$domid"
    else
        xmx_summary "migrate-a fail seconds=$(migrate_secs "$MIGRATE_MS") memory=${mem}MiB"
        rc=$XMX_FAIL
    fi
    # Gone from A: no domain by that name (nor renamed away), its home removed.
    xl list
    if ! xl domid "$MIGRATE_GUEST" >/dev/null 2>&1 && ! xl domid "$MIGRATE_GUEST--migratedaway" >/dev/null 2>&1 &&
        [ "$(xl list | wc -l)" = 2 ] && migrate_home_gone "$domid" 20; then
        xmx_summary "gone-a pass domid=$domid"
    else
        xmx_summary "gone-a fail"
        rc=$XMX_FAIL
    fi
    migrate_dump_consoles "$MIGRATE_GUEST"
    [ $rc = $XMX_PASS ] || migrate_dump_xl_logs
    return $rc
}

# migrate_console_has NAME TEXT SECONDS: a console log of the guest (xenconsoled names it
# after the name the domain had when it first saw it) holds TEXT; looked for every 0.1 s.
migrate_console_has() {
    local i=0 n=$(($3 * 10))
    until cat /var/log/xen/console/guest-"$1"*.log 2>/dev/null | grep -q "$2"; do
        i=$((i + 1))
        [ $i -le $n ] || return 1
        usleep 100000
    done
}

migrate_side_b() {
    local domid beat0 beat gap move status end rc=$XMX_PASS
    migrate_bump_domids || return $XMX_SETUP
    migrate_trace_on /var/log/xenstored-trace.log
    if migrate_receive "$(xmx_arg wait 240)"; then
        xmx_summary "receive-b pass"
    else
        xmx_summary "receive-b fail"
        migrate_trace_off
        xl list
        migrate_dump_xl_logs
        return $XMX_FAIL
    fi
    xl list
    # The guest runs here, under its own name (xl renamed NAME--incoming when A said go).
    if domid=$(xl domid "$MIGRATE_GUEST" 2>/dev/null) && ! xl domid "$MIGRATE_GUEST--incoming" >/dev/null 2>&1; then
        xmx_summary "arrived-b pass domid=$domid name=$(xenstore-read "/local/domain/$domid/name") data-from-a=$(xenstore-exists "/local/domain/$domid/data/from-a" 2>/dev/null && echo carried || echo absent)"
    else
        xmx_summary "arrived-b fail"
        migrate_trace_off
        migrate_dump_xl_logs
        return $XMX_FAIL
    fi
    xmx_log "the incoming domain's xenstore home:"
    xenstore-ls -f "/local/domain/$domid" | grep -v '^/local/domain/[0-9]*/data/heartbeat' >&2
    # Its heartbeat goes on here: 20 more beats (2 s of them).
    beat0=$(xenstore-read "/local/domain/$domid/data/heartbeat" 2>/dev/null) || beat0=0
    if migrate_heartbeats "$domid" $((beat0 + 20)) 60; then
        beat=$(xenstore-read "/local/domain/$domid/data/heartbeat")
        # The gap the move cost by the guest's realtime, monotonic and boottime clocks
        # (heartbeat.c), and the longest gap of its whole life.
        move=$(xenstore-read "/local/domain/$domid/data/heartbeat-move" 2>/dev/null) || move="? ? ? ? ? ?"
        gap=$(xenstore-read "/local/domain/$domid/data/heartbeat-gap")
        set -- $move $gap
        # The guest itself saw its domain id change to the one it has here.
        [ "$2" = "$domid" ] || rc=$XMX_FAIL
        xmx_summary "heartbeat-b $([ "$2" = "$domid" ] && echo pass || echo fail) beats=$beat first-seen=$beat0 moved=domain-$1-to-$2 move-gap-ms=$3 move-gap-monotonic-ms=$4 move-gap-boottime-ms=$5 max-gap-ms=$7 max-gap-beat=${10}"
    else
        xmx_summary "heartbeat-b fail first-seen=$beat0 now=$(xenstore-read "/local/domain/$domid/data/heartbeat" 2>/dev/null)"
        rc=$XMX_FAIL
    fi
    # A job through xenstore (the guest's watch, registered on A, fires here), its output on
    # the console xenconsoled logs here.
    xmx_job_start "$domid" 1 "echo migrate-job: domain \$(xenstore-read domid) named \$(xenstore-read name)"
    status=$(xmx_job_wait "$domid" 1 60)
    if [ "$status" = 0 ] && migrate_console_has "$MIGRATE_GUEST" "migrate-job: domain $domid named $MIGRATE_GUEST" 10; then
        xmx_summary "job-b pass"
    else
        xmx_summary "job-b fail status=$status"
        ls -l /var/log/xen/console >&2
        rc=$XMX_FAIL
    fi
    migrate_trace_off
    end=$(xmx_guest_end "$domid") || end=none
    if [ "$end" = 0 ] && migrate_home_gone "$domid" 20; then
        xmx_summary "end-b pass"
    else
        xmx_summary "end-b fail status=$end"
        rc=$XMX_FAIL
    fi
    ls -l /var/log/xen/console
    migrate_dump_consoles "$MIGRATE_GUEST"
    migrate_trace_digest "$domid"
    [ $rc = $XMX_PASS ] || migrate_dump_xl_logs
    return $rc
}

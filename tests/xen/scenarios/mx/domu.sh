# The guest half of the scenarios that run the xmx stack (mx, mx-link): start xmx-frontd on
# the linux platform (it finds the xmx device xmxd attached and connects to xmx-backd
# through the real xenbus), say so at data/xmx-ready, then run the jobs dom0 hands over
# (see lib.sh) until "end". The status is 0 iff every job passed.
#
# Kernel arguments: xmx.log= RUST_LOG of xmx-frontd and the MX programs (default warn),
# xmx.jobtimeout= seconds a job may run (default 180).
#
# Every xenstore path is relative (device/..., data/...): xenstored resolves it against
# the home of the domain the guest is at the time, so the job loop follows the guest when
# it is migrated to another host, where it is another domain (scenario mx-migrate).

# xmx_children_of PID: the process ids whose parent is PID (the guest's busybox has no pgrep).
xmx_children_of() {
    local s
    for s in /proc/[0-9]*/stat; do
        [ "$(sed 's/.*) //' "$s" 2>/dev/null | cut -d' ' -f2)" = "$1" ] || continue
        s=${s#/proc/}
        echo "${s%/stat}"
    done
}

# xmx_dump_job PID: where each thread of PID's child processes waits (state, wait channel,
# kernel stack); shown when a job nears its deadline, so a hang says where it hangs.
xmx_dump_job() {
    local p t
    for p in $(xmx_children_of "$1"); do
        for t in /proc/"$p"/task/*; do
            echo "job thread $p/${t##*/} $(cat "$t/comm" 2>/dev/null):" \
                "state $(sed 's/.*) //' "$t/stat" 2>/dev/null | cut -d' ' -f1)," \
                "waits in $(cat "$t/wchan" 2>/dev/null)"
            sed 's/^/    /' "$t/stack" 2>/dev/null
        done
    done
}

# xmx_job_new PATH LAST: the job at PATH is not job LAST.
xmx_job_new() {
    local v
    v=$(xenstore-read "$1" 2>/dev/null) || return 1
    [ "${v%% *}" != "$2" ]
}

scenario_domu() {
    local job id cmd status last=none failed=0 rust_log jobtimeout frontd jobpid watch
    xenstore-read domid >/dev/null || return 2
    rust_log=$(xmx_arg log warn)
    jobtimeout=$(xmx_arg jobtimeout 180)
    export XMX_PLATFORM=linux XMX_FRONTD_SOCKET=/run/xmx/frontd.sock RUST_LOG="$rust_log"
    # An endpoint whose requests stop completing for 20 s logs what it waits for.
    export XMX_STALL_REPORT_MS=20000
    mkdir -p /run/xmx
    xmx-frontd --socket "$XMX_FRONTD_SOCKET" &
    frontd=$!
    i=0
    until [ -S "$XMX_FRONTD_SOCKET" ]; do
        kill -0 $frontd 2>/dev/null || { xmx_log "xmx-frontd died"; return 2; }
        i=$((i + 1))
        [ $i -le 600 ] || { xmx_log "xmx-frontd did not open its socket in 60 s"; return 2; }
        usleep 100000
    done
    xmx_watch_until device/xmx/0/state 60 xmx_xs_has_prefix device/xmx/0/state 4 ||
        { xmx_log "the xmx device never reached Connected"; return 2; }
    xmx_log "xmx-frontd (pid $frontd) serves $XMX_FRONTD_SOCKET, device connected"
    xenstore-write data/xmx-ready 1 || return 2

    while :; do
        xmx_watch_until data/xmx-job 600 xmx_job_new data/xmx-job "$last" ||
            { xmx_log "no job from dom0"; return 2; }
        job=$(xenstore-read data/xmx-job)
        id=${job%% *}
        cmd=${job#* }
        last=$id
        [ "$cmd" = end ] && break
        xmx_log "job $id: $cmd"
        # shellcheck disable=SC2086 # the job is a command line
        timeout "$jobtimeout" $cmd &
        jobpid=$!
        # Five seconds before the deadline, a job still running shows where it waits.
        (
            sleep $((jobtimeout > 10 ? jobtimeout - 5 : jobtimeout))
            xmx_log "job $id: still running 5 s before its deadline; its threads:"
            xmx_dump_job "$jobpid"
        ) &
        watch=$!
        wait "$jobpid"
        status=$?
        # shellcheck disable=SC2046 # a list of pids
        kill $(xmx_children_of "$watch") "$watch" 2>/dev/null
        wait "$watch" 2>/dev/null
        xmx_log "job $id: status $status"
        [ "$status" = 0 ] || failed=$((failed + 1))
        xenstore-write data/xmx-job-done "$id $status"
    done
    kill $frontd 2>/dev/null
    wait $frontd 2>/dev/null
    [ "$failed" = 0 ]
}

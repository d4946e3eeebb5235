# Scenario migrate, the guest half: a heartbeat and a job loop, both of which must go on
# when the guest is moved to another host mid-run.
#
# The heartbeat (heartbeat.c, in the background) writes its counter at data/heartbeat
# every 100 ms, the longest gaps between two beats at data/heartbeat-gap and, when it finds
# itself in another domain, the gap of that move at data/heartbeat-move.
#
# The jobs are those of the mx scenarios (see ../mx/lib.sh): dom0 writes "ID COMMAND" at
# data/xmx-job, the guest runs COMMAND with sh and answers "ID STATUS" at data/xmx-job-done;
# "ID end" ends the guest. Every path is relative (data/...): xenstored resolves it against
# the home of the domain the guest is now, so it follows the guest to another host and
# another domain id, where /local/domain/<the id read at boot>/... would not.

# migrate_job_new LAST: data/xmx-job holds a job other than LAST.
migrate_job_new() {
    local v
    v=$(xenstore-read data/xmx-job 2>/dev/null) || return 1
    [ "${v%% *}" != "$1" ]
}

scenario_domu() {
    local beat job id cmd status last=none failed=0
    xmx_log "domain $(xenstore-read domid), $(grep MemTotal /proc/meminfo)"
    heartbeat 100 &
    beat=$!
    while :; do
        xmx_watch_until data/xmx-job 600 migrate_job_new "$last" ||
            { xmx_log "no job from dom0"; failed=1; break; }
        job=$(xenstore-read data/xmx-job)
        id=${job%% *}
        cmd=${job#* }
        last=$id
        [ "$cmd" = end ] && break
        xmx_log "job $id: $cmd"
        timeout 60 sh -c "$cmd"
        status=$?
        xmx_log "job $id: status $status"
        [ "$status" = 0 ] || failed=$((failed + 1))
        xenstore-write data/xmx-job-done "$id $status"
    done
    kill $beat 2>/dev/null
    wait $beat 2>/dev/null
    [ "$failed" = 0 ]
}

# Scenario conformance, the domU's half: the granter role against dom0, once per round
# dom0 starts (see dom0.sh); the status is 0 iff every round passed.

# xmx_round_ready PATH R: dom0 started round R or ended the rounds.
xmx_round_ready() {
    local v
    v=$(xenstore-read "$1" 2>/dev/null) || return 1
    [ "$v" = "$2" ] || [ "$v" = end ]
}

scenario_domu() {
    local home r=1 status failed=0
    home=/local/domain/$(xenstore-read domid) || return 2
    while :; do
        xmx_watch_until "$home/data/xmx-round" 120 xmx_round_ready "$home/data/xmx-round" "$r" ||
            { xmx_log "no round $r from dom0"; return 2; }
        [ "$(xenstore-read "$home/data/xmx-round")" = "$r" ] || break
        echo "xmx-report-begin granter"
        RUST_LOG=$(xmx_arg log warn) xmx-hv-conformance --role granter --peer 0 \
            --base "$(xmx_arg base /xmx-conformance)" --timeout "$(xmx_arg timeout 60)"
        status=$?
        echo "xmx-report-end granter status=$status"
        [ "$status" = 0 ] || failed=$((failed + 1))
        xenstore-write "$home/data/xmx-round-done" "$r $status"
        r=$((r + 1))
    done
    [ "$failed" = 0 ]
}

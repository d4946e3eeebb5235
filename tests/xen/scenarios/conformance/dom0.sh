# Scenario conformance, dom0's half: the platform conformance suite (xmx-hv-conformance)
# on real Xen, the domU granting and dom0 mapping.
#
# Kernel arguments: xmx.base= the suite's xenstore base (default /xmx-conformance),
# xmx.timeout= its longest wait in seconds (default 60), xmx.log= RUST_LOG of both roles,
# xmx.rounds= how many times to run the pair in this boot (default 1; more hunts
# intermittent failures at a few seconds a round).
#
# An absolute base is one node both roles share, each writing its own <base>/<domid>.
# A guest cannot create nodes outside its home, so dom0 creates the base before the
# domU runs and gives the domU read and write access to it (xenstore-chmod "n0 b<domU>":
# owned by dom0, no access for other domains). A relative base needs none of this:
# each role's area is then under its own /local/domain/<domid>.
#
# Rounds: dom0 starts round R by writing R at the domU's data/xmx-round; the domU runs
# the granter and answers "R STATUS" at data/xmx-round-done. Before each round dom0
# removes the granter's area, so that the mapper never follows the previous round's run.

scenario_dom0() {
    local base timeout rust_log rounds domid home r status gstatus granter_area failed=0
    base=$(xmx_arg base /xmx-conformance)
    timeout=$(xmx_arg timeout 60)
    rust_log=$(xmx_arg log warn)
    rounds=$(xmx_arg rounds 1)
    domid=$(xmx_create_domu conformance "xmx.base=$base" "xmx.timeout=$timeout" "xmx.log=$rust_log") ||
        return $XMX_SETUP
    home=/local/domain/$domid
    xmx_log "domU is domain $domid, base $base, $rounds round(s)"
    case $base in
        /*)
            { xenstore-write "$base" "" && xenstore-chmod "$base" n0 "b$domid"; } || return $XMX_SETUP
            granter_area=$base/$domid
            ;;
        *) granter_area=$home/$base ;;
    esac
    xl unpause "$domid" || return $XMX_SETUP

    r=1
    while [ "$r" -le "$rounds" ]; do
        xenstore-rm "$granter_area" 2>/dev/null
        xenstore-write "$home/data/xmx-round" "$r" || return $XMX_SETUP
        echo "xmx-report-begin mapper"
        RUST_LOG=$rust_log xmx-hv-conformance --role mapper --peer "$domid" --base "$base" --timeout "$timeout"
        status=$?
        echo "xmx-report-end mapper status=$status"
        if xmx_watch_until "$home/data/xmx-round-done" $((timeout + 30)) xmx_xs_has_prefix "$home/data/xmx-round-done" "$r "; then
            gstatus=$(xenstore-read "$home/data/xmx-round-done" | cut -d' ' -f2)
        else
            gstatus=none
        fi
        xmx_log "round $r: mapper status $status, granter status $gstatus;" \
            "domain $domid quota use: $(xenstore-control quota "$domid" 2>&1 | tr -s ' \n' ' ')"
        [ "$status" = 0 ] && [ "$gstatus" = 0 ] || failed=$((failed + 1))
        [ "$gstatus" = none ] && break
        r=$((r + 1))
    done
    xenstore-write "$home/data/xmx-round" end

    gstatus=$(xmx_wait_domu_status "$domid" 30) || gstatus=none
    xmx_dump_domu_console
    xmx_log "conformance: $failed of $rounds round(s) failed, domU status $gstatus"
    [ "$failed" = 0 ] && [ "$gstatus" = 0 ] && return $XMX_PASS
    return $XMX_FAIL
}

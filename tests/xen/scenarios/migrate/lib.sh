# dom0 helpers of the scenarios that move a guest between the two linked hosts with
# `xl migrate` (migrate, mx-migrate).
#
# The migration stream travels over the dom0s' link NIC as TCP: each dom0 gives its NIC an
# address (A 10.77.0.1, B 10.77.0.2, /24) besides its MTU of 9000, which leaves the NIC's
# MXoE use as it was. The image has no ssh: xl's `-s` command is `tcppipe ssh` (tcppipe.c),
# which connects to B's `tcppipe serve`, hands it the command line xl wants run there
# (`xl migrate-receive`) and relays xl's stream both ways. B's serve runs that command with
# its stdin and stdout on the connection, and exits with its status: B knows the migration
# has ended, and how, when its serve returns. A knows B listens when `tcppipe ping` gets
# "ready" from it. Every wait is bounded.

MIGRATE_PORT=7700
MIGRATE_IP_A=10.77.0.1
MIGRATE_IP_B=10.77.0.2

# migrate_ms: milliseconds since this domain booted (10 ms steps).
migrate_ms() {
    local u
    u=$(cut -d' ' -f1 /proc/uptime)
    echo $((${u%.*} * 1000 + 1${u#*.}0 - 1000))
}

# migrate_secs MS: MS milliseconds as seconds with three decimals.
migrate_secs() {
    printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000))
}

# migrate_net_up SIDE: bring the link NIC up with its MTU and SIDE's address (a or b).
migrate_net_up() {
    local nic mtu ip
    nic=$(xmx_arg nic eth0)
    mtu=$(xmx_arg mtu 9000)
    case $1 in
        a) ip=$MIGRATE_IP_A ;;
        b) ip=$MIGRATE_IP_B ;;
        *) xmx_log "xmx.side must be a or b, not '$1'"; return 1 ;;
    esac
    ip link set lo up
    ip link set "$nic" mtu "$mtu" || { xmx_log "$nic refuses MTU $mtu"; return 1; }
    ip link set "$nic" up || return 1
    ip addr add "$ip/24" dev "$nic" || return 1
    xmx_log "$nic up: $ip/24, MTU $mtu"
}

# migrate_bump_domids: create a domain paused and destroy it, so that the next domain this
# host creates (the incoming one) does not get the domain id its source had on the other
# host: a moved guest must not rely on keeping its id, and here it cannot.
migrate_bump_domids() {
    xl create -p /etc/xen/domu.cfg 'name="placeholder"' 'memory=128' >/tmp/xl-placeholder.log 2>&1 ||
        { cat /tmp/xl-placeholder.log >&2; return 1; }
    xmx_log "placeholder domain $(xl domid placeholder) created and destroyed"
    xl destroy placeholder
}

# migrate_trace_on FILE / migrate_trace_off: xenstored's request trace (every request and
# watch event, with the connection and a time stamp) into FILE, while a guest arrives.
migrate_trace_on() {
    xenstore-control logfile "$1" >/dev/null 2>&1 && xenstore-control log on >/dev/null 2>&1 ||
        xmx_log "xenstored's trace is not available"
}
migrate_trace_off() {
    xenstore-control log off >/dev/null 2>&1
}

# migrate_receive SECONDS: B's half: answer A's readiness pings and run the xl
# migrate-receive A's xl asks for, within SECONDS; its exit status is xl's. Its messages
# (and those of xl migrate-receive) go to /tmp/migrate-receive.log and to the console.
migrate_receive() {
    local rc
    tcppipe serve -p "$MIGRATE_PORT" -t "$1" -i 60 >/tmp/migrate-receive.log 2>&1
    rc=$?
    sed 's/^/migrate-receive| /' /tmp/migrate-receive.log
    return $rc
}

# migrate_send DOMAIN SECONDS [IP]: the sender's half (A's, or B's for a move back to A at
# IP): wait (up to SECONDS) until the other host listens, then `xl migrate` DOMAIN to it
# over tcppipe, bounded by SECONDS. Sets MIGRATE_MS to the time
# xl took (from its start to its end) and prints xl's messages. With MIGRATE_HOOK set (the
# path of dom0-tools/hooks/xmx-hook), it runs `xmx-hook migrate DOMAIN HOST -s ...`
# instead, which revokes the domain's direct channels first.
migrate_send() {
    local dom=$1 secs=$2 to=${3:-$MIGRATE_IP_B} t0 rc via="tcppipe ssh -p $MIGRATE_PORT -t 30 -i 60"
    tcppipe ping -p "$MIGRATE_PORT" -t "$secs" "$to" ||
        { xmx_log "host $to never listened"; return 1; }
    xmx_log "host $to listens; migrating $dom${MIGRATE_HOOK:+ with $MIGRATE_HOOK}"
    t0=$(migrate_ms)
    if [ -n "${MIGRATE_HOOK:-}" ]; then
        timeout "$secs" "$MIGRATE_HOOK" migrate "$dom" "$to" -s "$via" >/tmp/xl-migrate.log 2>&1
    else
        timeout "$secs" xl migrate -s "$via" "$dom" "$to" >/tmp/xl-migrate.log 2>&1
    fi
    rc=$?
    MIGRATE_MS=$(($(migrate_ms) - t0))
    tr -d '\r' </tmp/xl-migrate.log | sed 's/^/xl-migrate| /'
    xmx_log "xl migrate $dom: status $rc after $(migrate_secs "$MIGRATE_MS") s"
    return $rc
}

# migrate_barrier_wait SECONDS / migrate_barrier_release SECONDS: host A waits (bounded)
# until host B releases it, over the link (port 7701): A stays up while B still needs it.
migrate_barrier_wait() {
    tcppipe serve -p $((MIGRATE_PORT + 1)) -t "$1" -o
}
migrate_barrier_release() {
    tcppipe ping -p $((MIGRATE_PORT + 1)) -t "$1" "$MIGRATE_IP_A"
}

# migrate_home_gone DOMID SECONDS: the domain's xenstore home is gone (waits for it).
migrate_home_gone() {
    xmx_wait_xs_gone "/local/domain/$1" "$2"
}

# migrate_xs_at_least PATH N: PATH holds a number >= N.
migrate_xs_at_least() {
    local v
    v=$(xenstore-read "$1" 2>/dev/null) || return 1
    [ "${v%% *}" -ge "$2" ] 2>/dev/null
}

# migrate_heartbeats DOMID N SECONDS: wait until the guest's heartbeat counter reaches N.
migrate_heartbeats() {
    local p=/local/domain/$1/data/heartbeat
    xmx_watch_until "$p" "$3" migrate_xs_at_least "$p" "$2"
}

# migrate_trace_digest DOMID: from xenstored's trace, what happened to the incoming
# domain DOMID: its name changes, its introduction, and the first requests of its own
# connection once it runs (the watches its kernel registers again on resume).
migrate_trace_digest() {
    local f=/var/log/xenstored-trace.log conn
    [ -s "$f" ] || return 0
    echo "----- xenstored trace: $(wc -l <"$f") lines; of the incoming domain $1: -----"
    grep -E "WRITE \(/local/domain/$1/name |INTRODUCE|RELEASE|@introduceDomain|@releaseDomain" "$f" | head -n 40
    # What dom0 wrote for it, when: its home and the backends of its devices.
    echo "dom0's writes for domain $1 (time, request, path):"
    grep -E "^IN [^ ]+ [0-9]+ [0-9:]+ (WRITE|MKDIR|RM) \((/local/domain/$1/|/local/domain/0/backend/[a-z]+/$1/)" "$f" |
        cut -d' ' -f4- | cut -c1-120 | head -n 80
    # The guest's connection: the first to watch control/shutdown (relative) once the
    # domain is introduced: its kernel registering its watches again on resume.
    conn=$(awk -v intro="INTRODUCE ($1 " 'index($0, intro) { seen = 1 }
        seen && $1 == "IN" && index($0, "WATCH (control/shutdown ") { print $2; exit }' "$f")
    if [ -n "$conn" ]; then
        echo "the guest's connection $conn, its first requests:"
        grep " $conn " "$f" | head -n 40
    fi
    echo "----- end of the xenstored trace -----"
}

# migrate_dump_consoles NAME: the guest's console logs, as xenconsoled wrote them, each
# line prefixed "NAME| ". xenconsoled names a log after the name the domain had when it
# first saw it: the incoming guest's is guest-NAME--incoming.log.
migrate_dump_consoles() {
    local f
    for f in /var/log/xen/console/guest-"$1".log /var/log/xen/console/guest-"$1"--incoming.log; do
        [ -f "$f" ] || continue
        echo "----- console of $1 (${f##*/}) -----"
        tr -d '\r' <"$f" | sed "s/^/$1| /"
        echo "----- end of the console of $1 -----"
    done
}

# migrate_dump_xl_logs: what xl and its helpers logged in /var/log/xen (daemons of incoming
# domains, hotplug), then Xen's own log.
migrate_dump_xl_logs() {
    local f
    for f in /var/log/xen/*.log; do
        [ -s "$f" ] || continue
        echo "----- $f -----"
        tail -n 60 "$f"
    done
    echo "----- xl dmesg (tail) -----"
    xl dmesg | tail -n 40
}

# dom0 helpers of the scenarios that run the xmx stack (mx, mx-link): the daemons on the
# real toolstack, guests created through the xl integration, jobs run in the guests, and
# what the backend holds (to prove that a guest leaves nothing behind).
#
# A guest runs jobs for dom0 (see domu.sh): dom0 writes "ID COMMAND..." at the guest's
# data/xmx-job; the guest runs it and answers "ID STATUS" at data/xmx-job-done. "ID end"
# ends the guest: it publishes its status and powers off.

XMX_RUN=/run/xmx
XMX_BACKD_SOCK=$XMX_RUN/backd.sock
XMX_XMXD_SOCK=$XMX_RUN/xmxd.sock
XMX_LOGS=/var/log/xmx

# xmx_uptime: whole seconds since this domain booted.
xmx_uptime() {
    cut -d. -f1 /proc/uptime
}

# xmx_wait_file PATH SECONDS: wait for PATH to exist (a daemon's socket: no event to
# wait on from a shell, so it is looked for every 0.1 s).
xmx_wait_file() {
    local i=0 n=$(($2 * 10))
    until [ -e "$1" ]; do
        i=$((i + 1))
        [ $i -le $n ] || return 1
        usleep 100000
    done
}

# xmx_stack_up IFACE HOSTNAME: start xmx-backd and xmxd on the linux platform, serving
# IFACE (`none`: co-located guests only) as host HOSTNAME; sets XMX_BACKD_PID, XMX_XMXD_PID.
xmx_stack_up() {
    local iface=$1 host=$2 rust_log
    rust_log=$(xmx_arg log warn)
    mkdir -p "$XMX_RUN" "$XMX_LOGS" /var/lib/xmx
    XMX_PLATFORM=linux RUST_LOG=$rust_log xmx-backd --iface "$iface" --hostname "$host" \
        --control "$XMX_BACKD_SOCK" >"$XMX_LOGS/backd.log" 2>&1 &
    XMX_BACKD_PID=$!
    xmx_wait_file "$XMX_BACKD_SOCK" 30 || { xmx_log "xmx-backd did not start"; cat "$XMX_LOGS/backd.log"; return 1; }
    XMX_PLATFORM=linux RUST_LOG=$rust_log xmxd --iface "$iface" --hostname "$host" \
        --state-dir /var/lib/xmx --control "$XMX_XMXD_SOCK" --backend-socket "$XMX_BACKD_SOCK" \
        >"$XMX_LOGS/xmxd.log" 2>&1 &
    XMX_XMXD_PID=$!
    xmx_wait_file "$XMX_XMXD_SOCK" 30 || { xmx_log "xmxd did not start"; cat "$XMX_LOGS/xmxd.log"; return 1; }
    xmx_log "xmx-backd (pid $XMX_BACKD_PID) and xmxd (pid $XMX_XMXD_PID) up on $iface as $host"
}

# xmx_stack_alive: both daemons still run (a crash shows in their logs).
xmx_stack_alive() {
    kill -0 "$XMX_BACKD_PID" 2>/dev/null || { xmx_log "xmx-backd died"; return 1; }
    kill -0 "$XMX_XMXD_PID" 2>/dev/null || { xmx_log "xmxd died"; return 1; }
}

xmx_dump_stack_logs() {
    local f
    for f in "$XMX_LOGS"/*.log; do
        [ -s "$f" ] || continue
        echo "----- $f -----"
        cat "$f"
    done
}

# xmx_guest_create NAME [KERNEL-ARG...]: write NAME's configuration from the template and
# create the domain with `xmx-hook create` (xl create, then the xmx wish the
# configuration's `#xmx:` line asks for); prints the new domain's id.
xmx_guest_create() {
    local name=$1
    shift
    sed -e "s|@NAME@|$name|" -e "s|@EXTRA@|xmx.scenario=$(xmx_arg scenario) $*|" \
        /etc/xen/guest.cfg.in >"/etc/xen/$name.cfg"
    XMX_XL=xl /etc/xen/scripts/xmx-hook create "/etc/xen/$name.cfg" >"/tmp/xl-$name.log" 2>&1 ||
        { xmx_log "creating $name failed"; cat "/tmp/xl-$name.log" >&2; return 1; }
    xl domid "$name"
}

# xmx_guest_ready DOMID SECONDS: wait until the backend end of the guest's device is
# Connected (4) and the guest says its xmx-frontd serves applications.
xmx_guest_ready() {
    xmx_watch_until "/local/domain/0/backend/xmx/$1/0/state" "$2" \
        xmx_xs_has_prefix "/local/domain/0/backend/xmx/$1/0/state" 4 ||
        { xmx_log "domain $1: the backend never reached Connected"; return 1; }
    xmx_wait_xs "/local/domain/$1/data/xmx-ready" "$2" >/dev/null ||
        { xmx_log "domain $1: xmx-frontd never became ready"; return 1; }
}

# xmx_job_start DOMID ID COMMAND...: hand a job to the guest.
xmx_job_start() {
    local domid=$1 id=$2
    shift 2
    xmx_xs_bounded xenstore-write "/local/domain/$domid/data/xmx-job" "$id $*"
}

# xmx_job_wait DOMID ID SECONDS: print the job's exit status once the guest reports it.
xmx_job_wait() {
    local path=/local/domain/$1/data/xmx-job-done
    xmx_watch_until "$path" "$3" xmx_xs_has_prefix "$path" "$2 " || { echo none; return 1; }
    xmx_xs_bounded xenstore-read "$path" | cut -d' ' -f2
}

# xmx_guest_end DOMID: end the guest's job loop; prints its final status once it powered off.
xmx_guest_end() {
    xmx_job_start "$1" end end
    xmx_wait_domu_status "$1" 60
}

# xmx_dump_guest_console NAME: the guest's console, as xenconsoled logged it, each line
# prefixed "NAME| ". The log is set aside once shown: xenconsoled names it after the
# guest, so a guest created again under the same name would repeat its predecessor's
# lines in the next dump.
xmx_dump_guest_console() {
    local f=/var/log/xen/console/guest-$1.log
    [ -f "$f" ] || return 0
    echo "----- console of $1 -----"
    XMX_DUMPS=$((${XMX_DUMPS:-0} + 1))
    local shown="$f.shown.$XMX_DUMPS"
    mv "$f" "$shown"
    tr -d '\r' <"$shown" | sed "s/^/$1| /"
    echo "----- end of the console of $1 -----"
}

# xmx_backd_guests: the backend's device list (JSON, one line).
xmx_backd_guests() {
    unixcall "$XMX_BACKD_SOCK" '{"op":"guests"}' 5
}

# xmx_backd_holdings: what xmx-backd holds in dom0, one line: grant mappings (its
# gntdev mappings), open file descriptors (event channels, gntdev, sockets), and the
# devices it serves. XMX_HOLDINGS_FDS=0 leaves the descriptors out.
xmx_backd_holdings() {
    local maps fds devices
    maps=$(grep -c /dev/xen/gntdev "/proc/$XMX_BACKD_PID/maps")
    fds=$(ls "/proc/$XMX_BACKD_PID/fd" | wc -l)
    devices=$(xmx_backd_guests | grep -o '"domid":[0-9]*' | tr '\n' ' ')
    if [ "${XMX_HOLDINGS_FDS:-1}" = 1 ]; then
        echo "gntdev-mappings=$maps fds=$fds devices=[${devices% }]"
    else
        echo "gntdev-mappings=$maps devices=[${devices% }]"
    fi
}

# xmx_gone_from_dom0 DOMID: nothing of the domain is left in dom0's xenstore or in the
# backend's device list (the devices are looked for until they are, up to 20 s: the
# backend follows the toolstack's removal).
xmx_gone_from_dom0() {
    local domid=$1 p end devices bad=0
    xmx_wait_xs_gone "/local/domain/0/backend/xmx/$domid" 20 || true
    for p in "/local/domain/0/backend/xmx/$domid" "/local/domain/0/xmx/guests/$domid" \
        "/local/domain/$domid"; do
        if xenstore-exists "$p" 2>/dev/null; then
            xmx_log "left behind: xenstore $p"
            xenstore-ls -f "$p" >&2
            bad=1
        fi
    done
    # Bounded by time: a backend that stops answering makes each call last its timeout.
    end=$(($(xmx_uptime) + 20))
    while :; do
        devices=$(unixcall "$XMX_BACKD_SOCK" '{"op":"guests"}' 5) ||
            { xmx_log "xmx-backd does not answer: $devices"; bad=1; break; }
        echo "$devices" | grep -q "\"domid\":$domid[,}]" || break
        [ "$(xmx_uptime)" -lt $end ] || { xmx_log "left behind: xmx-backd still serves domain $domid: $devices"; bad=1; break; }
        usleep 100000
    done
    return $bad
}

# xmx_holdings_settle EXPECTED SECONDS: wait until xmx-backd's holdings are EXPECTED
# (unmapping follows the device's removal); fails showing the last ones seen.
xmx_holdings_settle() {
    local now end=$(($(xmx_uptime) + $2))
    while :; do
        now=$(xmx_backd_holdings)
        [ "$now" = "$1" ] && return 0
        if [ "$(xmx_uptime)" -ge $end ]; then
            xmx_log "xmx-backd holds $now, expected $1; its descriptors:"
            ls -l "/proc/$XMX_BACKD_PID/fd" >&2
            return 1
        fi
        usleep 100000
    done
}

# xmx_summary LINE: a result line the test reads from dom0's console.
xmx_summary() {
    echo "xmx-result $*"
}

# Shell helpers shared by the /init of dom0 and of the domU (busybox sh).

export PATH=/usr/local/bin:/bin:/sbin:/usr/bin:/usr/lib/xen-4.17/bin
export LD_LIBRARY_PATH=/usr/local/lib:/usr/lib/x86_64-linux-gnu
# The console is a serial log: no colour escapes from tracing.
export NO_COLOR=1

# Result codes dom0 writes to QEMU's isa-debug-exit port; QEMU exits with 2*code+1.
XMX_PASS=16     # QEMU status 33
XMX_FAIL=17     # 35: the scenario ran and failed
XMX_SETUP=18    # 37: the machine could not be set up (drivers, xenstored, xl create)
XMX_EXPIRED=19  # 39: the scenario's deadline passed

# xmx_log MESSAGE: one line on the console (stderr, so that functions whose output is
# their result can log), stamped with the domain's uptime.
xmx_log() {
    echo "xmx[$(cut -d' ' -f1 /proc/uptime)] $*" >&2
}

# xmx_arg KEY [DEFAULT]: the value of xmx.KEY= on the kernel command line.
xmx_arg() {
    local word
    for word in $(cat /proc/cmdline); do
        case $word in "xmx.$1="*) echo "${word#*=}"; return 0 ;; esac
    done
    [ $# -ge 2 ] && echo "$2"
}

xmx_mount_base() {
    mount -t proc proc /proc
    mount -t sysfs sysfs /sys
    mount -t devtmpfs devtmpfs /dev
    mkdir -p /dev/pts /dev/shm
    mount -t devpts devpts /dev/pts
    mount -t tmpfs tmpfs /dev/shm
    mount -t tmpfs tmpfs /tmp
}

# Load the modules of /lib/modules/load-order (dependencies come first there), then
# mount xenfs. Fails if any module does not load.
xmx_load_drivers() {
    local m
    while read -r m; do
        insmod "/lib/modules/$m.ko" || { xmx_log "insmod $m failed"; return 1; }
    done </lib/modules/load-order
    # gntalloc lets a domain grant 1024 pages by default; the conformance suite grants
    # 2048 in one batch and an endpoint's queues and windows need thousands.
    echo 16384 >/sys/module/xen_gntalloc/parameters/limit || { xmx_log "cannot raise the gntalloc limit"; return 1; }
    mkdir -p /proc/xen
    mount -t xenfs xenfs /proc/xen || { xmx_log "mount xenfs failed"; return 1; }
}

# xmx_watch_until PATH SECONDS COMMAND...: run COMMAND now and after every xenstore
# event on PATH (or below it) until it succeeds; fails after SECONDS. The watch is in
# place before the second try, and xenstored fires each new watch once, so a change
# between the first try and the registration is not missed.
xmx_watch_until() {
    local path=$1 secs=$2 fifo pid ok=1
    shift 2
    "$@" && return 0
    fifo=$(mktemp -u /tmp/xmx-watch.XXXXXX)
    mkfifo "$fifo" || return 1
    timeout "$secs" xenstore-watch "$path" >"$fifo" 2>"$fifo.err" &
    pid=$!
    # Opening the FIFO blocks until the watch opens it too, and a child's SIGCHLD in the
    # meantime fails the open (EINTR, which the shell does not retry): open it again.
    local opened=0 tries=0
    while [ $opened = 0 ] && [ $tries -lt 20 ]; do
        tries=$((tries + 1))
        {
            opened=1
            while read -r _; do
                "$@" && { ok=0; break; }
            done
        } <"$fifo"
    done
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    # A watch that could not be set up says why (the caller only sees a timeout).
    [ $ok = 0 ] || [ ! -s "$fifo.err" ] || xmx_log "xenstore-watch $path: $(cat "$fifo.err")"
    rm -f "$fifo" "$fifo.err"
    return $ok
}

# xmx_xs_bounded COMMAND...: a xenstore tool bounded in time. xenstored has been seen to
# stall for minutes under TCG load; an unbounded call then hangs the scenario silently
# until its deadline, where a bounded one is logged and tried again (three tries of 20 s).
xmx_xs_bounded() {
    local try
    for try in 1 2 3; do
        timeout 20 "$@" && return 0
        # Timed out: 143 from busybox (its child ended by SIGTERM), 124 from coreutils.
        case $? in 124 | 143) ;; *) return 1 ;; esac
        xmx_log "$1 ${2:-} took over 20 s (try $try of 3)"
    done
    return 1
}

# xmx_xs_has_prefix PATH PREFIX: PATH exists and its value starts with PREFIX.
xmx_xs_has_prefix() {
    local v
    v=$(xmx_xs_bounded xenstore-read "$1" 2>/dev/null) || return 1
    case $v in "$2"*) return 0 ;; esac
    return 1
}

xmx_xs_absent() {
    ! xenstore-exists "$1" 2>/dev/null
}

# xmx_wait_xs PATH SECONDS: print PATH's value once it exists; fails after SECONDS.
xmx_wait_xs() {
    xmx_watch_until "$1" "$2" xenstore-read "$1" 2>/dev/null
}

# xmx_wait_xs_gone PATH SECONDS: wait until PATH no longer exists; fails after SECONDS.
xmx_wait_xs_gone() {
    xmx_watch_until "$1" "$2" xmx_xs_absent "$1"
}

#!/bin/bash
# Boot Xen 4.17 + dom0 (+ a PV domU) under QEMU and run one scenario on real Xen.
#
# usage: run.sh [options] SCENARIO
#   SCENARIO     conformance  the platform conformance suite, domU granter, dom0 mapper
#                link         two hosts whose dom0 NICs share a link: MXoE frames echoed
#                mx           the xmx stack on one host: MX traffic between two guests,
#                             a guest destroyed and re-created, nothing left in dom0
#                mx-link      the xmx stack on two linked hosts: MX traffic between
#                             a guest of each
#                migrate      two linked hosts: `xl migrate` of a running PV guest
#                             from A to B, the stream over the link
#                mx-migrate   the xmx stack on two linked hosts, a guest migrated from
#                             A to B while it exchanges MX traffic with a guest of B
#                             (a skeleton: fails until the frontend follows a move)
# options:
#   --bin FILE   put FILE in both domains' /usr/local/bin (*.so: /usr/local/lib); repeat.
#                Without any, xmx-hv-conformance is built with cargo and used.
#   --stack DIR  mx, mx-link, mx-migrate: take the xmx stack from DIR (a cargo profile
#                directory; or $XMX_XEN_STACK).
#                Default: cargo builds it (debug) and target/debug is used.
#   --arg K=V    add xmx.K=V to dom0's kernel command line (see the scenarios); repeat
#   --nic MODEL  link: the dom0 NIC, virtio-net-pci (default) or e1000
#   --timeout S  bound on each QEMU run (default 180; migrate 360, mx-migrate 540)
#   --run-dir D  where the serial logs go (default OUT/run/SCENARIO)
#   --no-build   reuse the images of the last build
#
# OUT is $XMX_XEN_OUT (default <workspace>/target/xen). Memory per QEMU: $XMX_XEN_MEM MiB
# (default 1024, 1280 for mx, mx-link and mx-migrate; dom0 gets 512), vCPUs: $XMX_XEN_SMP
# (default 2), CPU model: $XMX_XEN_CPU
# (default qemu64; with max,-smap, grant traffic intermittently corrupts guest memory
# under this QEMU's TCG, see README.md; plain max kills dom0 at once).
#
# Exit status: 0 pass, 1 the scenario failed, 2 the machine could not be set up,
# 3 no verdict (deadline, timeout, crash). The serial logs, each line stamped with the
# seconds since QEMU started, are kept under OUT/logs/ when a run does not pass.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
workspace=$(cd "$here/../.." && pwd)
export XMX_XEN_OUT=${XMX_XEN_OUT:-$workspace/target/xen}
out=$XMX_XEN_OUT
mem=${XMX_XEN_MEM:-}
smp=${XMX_XEN_SMP:-2}
cpu=${XMX_XEN_CPU:-qemu64}

log() { echo "xen-run: $*" >&2; }
die() { log "error: $*"; exit 2; }
usage() { sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; }

bins=()
args=()
nic=virtio-net-pci
tmo=
run_dir=
stack=${XMX_XEN_STACK:-}
build=1
scenario=
while [ $# -gt 0 ]; do
    case $1 in
        --bin) [ $# -ge 2 ] || die "--bin needs a file"; bins+=("$2"); shift 2 ;;
        --arg) [ $# -ge 2 ] || die "--arg needs K=V"; args+=("xmx.$2"); shift 2 ;;
        --stack) [ $# -ge 2 ] || die "--stack needs a directory"; stack=$2; shift 2 ;;
        --nic) [ $# -ge 2 ] || die "--nic needs a model"; nic=$2; shift 2 ;;
        --timeout) [ $# -ge 2 ] || die "--timeout needs seconds"; tmo=$2; shift 2 ;;
        --run-dir) [ $# -ge 2 ] || die "--run-dir needs a directory"; run_dir=$2; shift 2 ;;
        --no-build) build=0; shift ;;
        -h | --help) usage; exit 0 ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) [ -z "$scenario" ] || die "one scenario at a time"; scenario=$1; shift ;;
    esac
done
case $scenario in
    conformance | link) mem=${mem:-1024} ;;
    # dom0's 512 MiB and two guests of 192 MiB.
    mx | mx-link) mem=${mem:-1280} ;;
    # dom0's 512 MiB and the guest (128 MiB); a migration takes a minute or more here.
    migrate) mem=${mem:-1024} tmo=${tmo:-360} ;;
    # Host B holds b1 and, once moved, a1 (192 MiB each); a failing run waits out its jobs.
    mx-migrate) mem=${mem:-1280} tmo=${tmo:-540} ;;
    '') usage >&2; exit 2 ;;
    *) die "unknown scenario '$scenario' (conformance, link, mx, mx-link, migrate or mx-migrate)" ;;
esac
tmo=${tmo:-180}
case $nic in virtio-net-pci | e1000) ;; *) die "--nic: virtio-net-pci or e1000" ;; esac
for a in "${args[@]}"; do
    case $a in *,* | *' '*) die "kernel arguments cannot hold commas or spaces: $a" ;; esac
done
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing (apt-get install qemu-system-x86 cpio)"

if [ $build = 1 ]; then
    case $scenario in
        mx | mx-link | mx-migrate)
            if [ -z "$stack" ]; then
                log "building the xmx stack (debug)"
                (cd "$workspace" && "${CARGO:-cargo}" build -q -p xmx-backend -p xmx-tools -p xmx-lab -p xmx-guests -p xmx-libmx) ||
                    die "cargo build of the xmx stack failed"
                stack=$workspace/target/debug
            fi
            ;;
    esac
    if [ ${#bins[@]} = 0 ] && [ -z "${XMX_XEN_BINS:-}" ] && [ -z "$stack" ]; then
        log "building xmx-hv-conformance"
        (cd "$workspace" && "${CARGO:-cargo}" build -q -p xmx-hv --features runner --bin xmx-hv-conformance) ||
            die "cargo build of xmx-hv-conformance failed"
        bins=("$workspace/target/debug/xmx-hv-conformance")
    fi
    "$here/fetch.sh" || die "fetch failed"
    build_args=()
    for b in "${bins[@]}"; do build_args+=(--bin "$b"); done
    [ -z "$stack" ] || build_args+=(--stack "$stack")
    "$here/build.sh" "${build_args[@]}" || die "image build failed"
fi
img=$out/img
for f in xen.elf vmlinuz dom0.cpio; do [ -f "$img/$f" ] || die "no $img/$f: build first"; done

run_dir=${run_dir:-$out/run/$scenario}
rm -rf "$run_dir"
mkdir -p "$run_dir"

# boot NAME CMDLINE [QEMU ARG...]: one machine, its serial console in RUN_DIR/NAME.log
# with every line stamped; its QEMU status in RUN_DIR/NAME.status. dom0's kernel runs
# `quiet` (the serial console is slow under emulation; Xen's own log stays complete) and
# without speculation mitigations (a test machine; they cost seconds under TCG).
#
# A boot that has not reached dom0's init after $boot_limit seconds is stopped and marked
# NAME.stalled: the emulated machine hung in Xen's or Linux's own boot (seen once in about
# 40 runs, under load, after PCI enumeration), before any of the stack ran.
boot_limit=${XMX_XEN_BOOT_LIMIT:-90}
boot() {
    local name=$1 cmdline=$2 t0 measure=() watchdog
    shift 2
    rm -f "$run_dir/$name.pid" "$run_dir/$name.stalled"
    # The watchdog's own output goes nowhere: a sleep left holding run.sh's stdout would
    # keep its reader waiting.
    (
        trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
        sleep "$boot_limit" &
        sleeper=$!
        wait "$sleeper"
        if ! grep -q "dom0 init: scenario" "$run_dir/$name.log" 2>/dev/null && [ -s "$run_dir/$name.pid" ]; then
            touch "$run_dir/$name.stalled"
            # Every machine of the scenario stops: a linked host alone proves nothing.
            for p in "$run_dir"/*.pid; do kill "$(cat "$p")" 2>/dev/null; done
        fi
    ) >/dev/null 2>&1 &
    watchdog=$!
    # QEMU's peak memory, when the host has GNU time (its last line; the first may say
    # "Command exited with non-zero status", which for QEMU here is the norm).
    [ -x /usr/bin/time ] && measure=(/usr/bin/time -f %M -o "$run_dir/$name.maxrss-kib")
    t0=$(date +%s.%N)
    set +e
    timeout --kill-after=10 "$tmo" "${measure[@]}" qemu-system-x86_64 \
        -accel tcg -cpu "$cpu" -m "$mem" -smp "$smp" \
        -nodefaults -display none -monitor none -serial stdio -no-reboot -pidfile "$run_dir/$name.pid" \
        -device isa-debug-exit,iobase=0xf4,iosize=0x04 \
        -kernel "$img/xen.elf" \
        -append "console=com1 com1=115200 dom0_mem=512M,max:512M bootscrub=false loglvl=all guest_loglvl=all" \
        -initrd "$img/vmlinuz console=hvc0 earlyprintk=xen quiet mitigations=off $cmdline,$img/dom0.cpio" \
        "$@" </dev/null 2>&1 |
        T0=$t0 perl -MTime::HiRes=time -ne 'BEGIN { $| = 1 } s/\r//g; printf "[%7.2f] %s", time - $ENV{T0}, $_' \
            >"$run_dir/$name.log"
    echo "${PIPESTATUS[0]}" >"$run_dir/$name.status"
    rm -f "$run_dir/$name.pid"
    kill "$watchdog" 2>/dev/null
    wait "$watchdog" 2>/dev/null
    set -e
    printf '[%7.2f] xen-run: QEMU status %s, peak RSS %s KiB\n' "$(echo "$(date +%s.%N) - $t0" | bc)" \
        "$(cat "$run_dir/$name.status")" "$(tail -n1 "$run_dir/$name.maxrss-kib" 2>/dev/null || echo ?)" \
        >>"$run_dir/$name.log"
}

# verdict NAME: this machine's result as run.sh's exit status.
verdict() {
    local s
    s=$(cat "$run_dir/$1.status")
    if [ -f "$run_dir/$1.stalled" ]; then
        log "$1: boot stalled before dom0's init (stopped after ${boot_limit}s)"
        return 3
    elif compgen -G "$run_dir/*.stalled" >/dev/null; then
        log "$1: stopped with the scenario's stalled machine"
        return 3
    fi
    case $s in
        33) log "$1: pass"; return 0 ;;
        35) log "$1: scenario failed"; return 1 ;;
        37) log "$1: setup failed"; return 2 ;;
        39) log "$1: the scenario's deadline passed"; return 3 ;;
        124 | 137) log "$1: no verdict within ${tmo}s"; return 3 ;;
        *) log "$1: QEMU ended with status $s (crash or reboot?)"; return 3 ;;
    esac
}

# xmx_arg takes the first match: --arg values come first, so they override the defaults.
base_args="${args[*]} xmx.scenario=$scenario xmx.deadline=$((tmo - 40))"
start=$(date +%s.%N)
rc=0
# Two hosts are joined by a pair of unix datagram sockets: what one NIC sends, the other
# receives. MACs are fixed so that A can address B.
mac_a=52:54:00:78:6d:0a
mac_b=52:54:00:78:6d:0b
# net SELF PEER MAC: the QEMU options of host SELF's NIC, linked to host PEER's.
net() {
    echo "-netdev dgram,id=link,local.type=unix,local.path=$run_dir/$1.sock,remote.type=unix,remote.path=$run_dir/$2.sock"
    echo "-device $nic,netdev=link,mac=$3"
}
# two_hosts NAME ARGS_A ARGS_B: boot hosts NAME-a and NAME-b at once, linked; the worse
# verdict of the two.
two_hosts() {
    local pid_a pid_b r
    # shellcheck disable=SC2046 # word splitting of the option lines is meant
    boot "$1-b" "$base_args $3" $(net b a $mac_b) &
    pid_b=$!
    # shellcheck disable=SC2046
    boot "$1-a" "$base_args $2" $(net a b $mac_a) &
    pid_a=$!
    wait $pid_a || true
    wait $pid_b || true
    verdict "$1-a" || rc=$?
    verdict "$1-b" || { r=$?; [ $rc -ge $r ] || rc=$r; }
}

run_scenario() {
    case $scenario in
        conformance | mx)
            boot "$scenario" "$base_args"
            verdict "$scenario" || rc=$?
            ;;
        link) two_hosts link "xmx.link=ping xmx.peer=$mac_b" "xmx.link=echo" ;;
        mx-link | migrate | mx-migrate) two_hosts "$scenario" "xmx.side=a" "xmx.side=b" ;;
    esac
}
run_scenario
# A stalled boot says nothing of the stack: the scenario runs once more, all its machines
# afresh (two linked hosts start together). The stalled run's logs stay as *.stalled-log.
if compgen -G "$run_dir/*.stalled" >/dev/null; then
    for f in "$run_dir"/*.stalled; do
        log "$(basename "$f" .stalled): boot stalled before dom0's init; running the scenario again"
    done
    for f in "$run_dir"/*.log; do mv "$f" "${f%.log}.stalled-log"; done
    rm -f "$run_dir"/*.stalled "$run_dir"/*.sock
    rc=0
    run_scenario
fi
log "$scenario: $(echo "$(date +%s.%N) - $start" | bc | cut -c1-6) s, logs in $run_dir"
if [ $rc != 0 ]; then
    keep=$out/logs/$scenario-$(date +%Y%m%d-%H%M%S)
    mkdir -p "$keep"
    cp "$run_dir"/*.log "$run_dir"/*.status "$keep"/
    cp "$run_dir"/*.stalled-log "$keep"/ 2>/dev/null || true
    log "kept the logs in $keep"
fi
exit $rc

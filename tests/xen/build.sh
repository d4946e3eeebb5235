#!/bin/bash
# Build the boot images of the real-Xen test machine from OUT/sysroot (see fetch.sh):
#   OUT/img/xen.elf        the hypervisor, as QEMU's -kernel loads it (multiboot ELF)
#   OUT/img/vmlinuz        the Linux kernel of dom0 and of the domU
#   OUT/img/dom0.cpio      dom0's initramfs; it carries the domU's kernel and initramfs
#
# Both initramfs images hold busybox, the Xen drivers, the init scripts and scenarios of
# tests/xen, the test programs rawlink, unixcall, tcppipe and heartbeat, and the extra
# binaries given with --bin (or in $XMX_XEN_BINS, space separated), without debug info,
# with the shared libraries they need. An extra file named *.so goes to /usr/local/lib,
# anything else to /usr/local/bin.
#
# --stack DIR (or $XMX_XEN_STACK) takes the xmx stack from DIR, a cargo profile
# directory (target/debug or target/release): dom0 gets xmx-backd, xmxd, the xmx CLI and
# the xl hooks (/etc/xen/scripts), the domU xmx-frontd, libmyriexpress.so and the C MX
# programs mxcheck (tests/xen) and pingpong (tests/c), compiled here against that library.
#
# usage: build.sh [--bin FILE]... [--stack DIR]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${XMX_XEN_OUT:-$(cd "$here/../.." && pwd)/target/xen}
sysroot=$out/sysroot
img=$out/img
work=$out/build

log() { echo "xen-build: $*" >&2; }
die() { log "error: $*"; exit 1; }

extra=()
read -r -a extra <<<"${XMX_XEN_BINS:-}"
stack=${XMX_XEN_STACK:-}
while [ $# -gt 0 ]; do
    case $1 in
        --bin) [ $# -ge 2 ] || die "--bin needs a file"; extra+=("$2"); shift 2 ;;
        --stack) [ $# -ge 2 ] || die "--stack needs a directory"; stack=$2; shift 2 ;;
        -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
for f in "${extra[@]}"; do [ -f "$f" ] || die "extra binary $f does not exist"; done
stack_dom0=(xmx-backd xmxd xmx)
stack_domu=(xmx-frontd libmyriexpress.so)
if [ -n "$stack" ]; then
    for f in "${stack_dom0[@]}" "${stack_domu[@]}"; do
        [ -f "$stack/$f" ] || die "$stack/$f does not exist (cargo build -p xmx-backend -p xmx-tools -p xmx-lab -p xmx-guests -p xmx-libmx)"
    done
fi

[ -f "$sysroot/.lock-sha256" ] || die "no sysroot in $sysroot: run fetch.sh first"
kver=$(ls "$sysroot/lib/modules")
[ "$(echo "$kver" | wc -l)" = 1 ] || die "expected one kernel in $sysroot/lib/modules, found: $kver"
kmods=$sysroot/lib/modules/$kver/kernel
xenlib=$sysroot/usr/lib/x86_64-linux-gnu
xenbin=$sysroot/usr/lib/xen-4.17/bin

# copy_elf SRC DEST ROOT: copy an executable or library to ROOT/DEST with every shared
# library it loads (Xen's from the sysroot, the rest from this host, same paths).
copy_elf() {
    local src=$1 dst=$2 root=$3 lib
    mkdir -p "$root/$(dirname "$dst")"
    cp -L "$src" "$root/$dst"
    # ldd fails on a static executable, which needs nothing more.
    { LD_LIBRARY_PATH=$xenlib ldd "$src" 2>/dev/null || true; } | awk '/=> \// {print $3} /^\t\/[^ ]*ld-linux/ {print $1}' |
        while read -r lib; do
            case $lib in
                "$sysroot"/*) dst=${lib#"$sysroot"} ;;
                *) dst=$lib ;;
            esac
            [ -e "$root/$dst" ] || { mkdir -p "$root/$(dirname "$dst")"; cp -L "$lib" "$root/$dst"; }
        done
}

# module_deps NAME: NAME's dependencies, from the module's own .modinfo section.
module_deps() {
    local ko
    ko=$(find "$kmods" -name "$1.ko" | head -n1)
    [ -n "$ko" ] || die "kernel module $1 not found under $kmods"
    objcopy -O binary -j .modinfo "$ko" /dev/stdout | tr '\0' '\n' | sed -n 's/^depends=//p' | tr ',' ' '
}

# add_modules ROOT NAME...: copy the modules and their dependencies into ROOT and append
# them, dependencies first, to ROOT/lib/modules/load-order (insmod reads no modules.dep).
add_modules() {
    local root=$1 name dep
    shift
    mkdir -p "$root/lib/modules"
    touch "$root/lib/modules/load-order"
    for name in "$@"; do
        grep -qx "$name" "$root/lib/modules/load-order" && continue
        for dep in $(module_deps "$name"); do add_modules "$root" "$dep"; done
        cp "$(find "$kmods" -name "$name.ko" | head -n1)" "$root/lib/modules/$name.ko"
        echo "$name" >>"$root/lib/modules/load-order"
    done
}

# add_extra ROOT FILE: FILE in ROOT's /usr/local/lib (*.so) or /usr/local/bin, without
# debug info (it only weighs on the boot; symbols stay, for backtraces).
add_extra() {
    local root=$1 f=$2 a
    case $f in
        *.so | *.so.*) a=/usr/local/lib/$(basename "$f") ;;
        *) a=/usr/local/bin/$(basename "$f") ;;
    esac
    copy_elf "$f" "$a" "$root"
    strip --strip-debug "$root$a"
}

# base_root ROOT ROLE: what both domains hold.
base_root() {
    local root=$1 role=$2 a f
    rm -rf "$root"
    mkdir -p "$root"/{bin,sbin,proc,sys,dev,tmp,etc,run,var/log,var/lib,root,usr/local/bin,usr/local/lib}
    ln -s ../run "$root/var/run"
    cp "$sysroot/bin/busybox" "$root/bin/busybox"
    for a in $("$root/bin/busybox" --list); do
        [ -e "$root/bin/$a" ] || ln -s busybox "$root/bin/$a"
    done
    add_modules "$root" xen-privcmd xenfs xen-evtchn xen-gntdev xen-gntalloc
    copy_elf "$sysroot/usr/bin/xenstore" /usr/bin/xenstore "$root"
    for a in read write ls list exists rm chmod watch; do ln -s xenstore "$root/usr/bin/xenstore-$a"; done
    # Without libgcc_s, glibc aborts in pthread_cancel (xl) and Rust cannot unwind.
    copy_elf /lib/x86_64-linux-gnu/libgcc_s.so.1 /lib/x86_64-linux-gnu/libgcc_s.so.1 "$root"
    copy_elf "$work/rawlink" /usr/local/bin/rawlink "$root"
    copy_elf "$work/unixcall" /usr/local/bin/unixcall "$root"
    copy_elf "$work/tcppipe" /usr/local/bin/tcppipe "$root"
    copy_elf "$work/heartbeat" /usr/local/bin/heartbeat "$root"
    for f in "${extra[@]}"; do add_extra "$root" "$f"; done
    if [ -n "$stack" ]; then
        if [ "$role" = dom0 ]; then
            for f in "${stack_dom0[@]}"; do add_extra "$root" "$stack/$f"; done
        else
            for f in "${stack_domu[@]}"; do add_extra "$root" "$stack/$f"; done
            for f in mxcheck pingpong; do add_extra "$root" "$work/$f"; done
        fi
    fi
    mkdir -p "$root/etc/xmx"
    cp "$here/init/common.sh" "$root/etc/xmx/common.sh"
    cp -r "$here/scenarios" "$root/etc/xmx/scenarios"
    cp "$here/init/$role" "$root/init"
    chmod 755 "$root/init"
    echo "$role" >"$root/etc/xmx/role"
}

# domu_kernel BZIMAGE OUT: the domU's kernel as a gzip'd ELF. xl decompresses the
# kernel in dom0, under emulation here: gunzip is seconds faster than the bzImage's xz.
domu_kernel() {
    python3 - "$1" "$work/vmlinux" <<'PY'
import lzma, sys
blob = open(sys.argv[1], "rb").read()
start = blob.find(b"\xfd7zXZ\x00")
if start < 0:
    sys.exit("no xz payload in " + sys.argv[1])
elf = lzma.LZMADecompressor().decompress(blob[start:])
if elf[:4] != b"\x7fELF":
    sys.exit("the xz payload of " + sys.argv[1] + " is not an ELF image")
open(sys.argv[2], "wb").write(elf)
PY
    gzip -1 -c "$work/vmlinux" >"$2"
    rm -f "$work/vmlinux"
}

# pack ROOT FILE: a newc cpio, uncompressed: under emulation, copying the bytes costs
# less than decompressing them.
pack() {
    (cd "$1" && find . | LC_ALL=C sort | cpio -o -H newc --quiet >"$2.tmp")
    mv "$2.tmp" "$2"
}

mkdir -p "$img" "$work"
gcc -static -O2 -Wall -Wextra -Werror -o "$work/rawlink" "$here/rawlink.c"
gcc -static -O2 -Wall -Wextra -Werror -o "$work/unixcall" "$here/unixcall.c"
gcc -static -O2 -Wall -Wextra -Werror -o "$work/tcppipe" "$here/tcppipe.c"
gcc -static -O2 -Wall -Wextra -Werror -o "$work/heartbeat" "$here/heartbeat.c"
if [ -n "$stack" ]; then
    for f in "$here/mxcheck.c" "$here/../c/pingpong.c"; do
        gcc -std=gnu11 -O2 -Wall -Wextra -Werror -I "$here/../../libmx/include" -I "$here/../c" \
            -o "$work/$(basename "$f" .c)" "$f" -L "$stack" -lmyriexpress -lpthread ||
            die "compiling $f against $stack/libmyriexpress.so failed"
    done
fi

rootu=$work/root-domu
base_root "$rootu" domu
pack "$rootu" "$work/domu.cpio"

root0=$work/root-dom0
base_root "$root0" dom0
add_modules "$root0" virtio_pci virtio_net e1000
for b in xl xenstored xenconsoled xen-init-dom0 xenconsole xenstore-control libxl-save-helper; do
    copy_elf "$xenbin/$b" "/usr/lib/xen-4.17/bin/$b" "$root0"
done
mkdir -p "$root0/etc/xen" "$root0/boot"
cp "$sysroot/etc/xen/xl.conf" "$root0/etc/xen/xl.conf"
cp -r "$sysroot/etc/xen/scripts" "$root0/etc/xen/scripts"
cp "$here/domu.cfg" "$root0/etc/xen/domu.cfg"
cp "$here/guest.cfg" "$root0/etc/xen/guest.cfg.in"
if [ -n "$stack" ]; then
    for f in xmx-hook vif-xmx; do
        install -m 755 "$here/../../dom0-tools/hooks/$f" "$root0/etc/xen/scripts/$f"
    done
fi
domu_kernel "$sysroot/boot/vmlinuz-$kver" "$root0/boot/vmlinux.gz"
cp "$work/domu.cpio" "$root0/boot/domu.cpio"
pack "$root0" "$img/dom0.cpio"

gunzip -c "$sysroot/boot/xen-4.17-amd64.gz" >"$img/xen.elf.tmp"
mv "$img/xen.elf.tmp" "$img/xen.elf"
cp "$sysroot/boot/vmlinuz-$kver" "$img/vmlinuz"
log "ok: $img (dom0 $(du -h "$img/dom0.cpio" | cut -f1), domU $(du -h "$work/domu.cpio" | cut -f1), ${#extra[@]} extra files${stack:+, stack from $stack})"

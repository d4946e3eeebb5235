#!/bin/bash
# Fetch the pinned Debian packages of the real-Xen test machine (packages.lock) into
# OUT/cache and unpack them into OUT/sysroot.
#
# A package already in the cache with the pinned size and sha256 is reused, so a second
# run needs no network. A download is checked the same way before it is kept.
#
# usage: fetch.sh            (OUT is $XMX_XEN_OUT, default <workspace>/target/xen)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${XMX_XEN_OUT:-$(cd "$here/../.." && pwd)/target/xen}
cache=$out/cache
sysroot=$out/sysroot
lock=$here/packages.lock

log() { echo "xen-fetch: $*" >&2; }
die() { log "error: $*"; exit 1; }

# deb_ok FILE SIZE SHA256: the file exists with exactly that size and digest.
deb_ok() {
    [ -f "$1" ] || return 1
    [ "$(stat -c %s "$1")" = "$2" ] || return 1
    [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$3" ]
}

mkdir -p "$cache"
debs=()
fetched=0
while read -r name version size sha; do
    case $name in '' | '#'*) continue ;; esac
    # apt-get download names files NAME_VERSION_ARCH.deb with the epoch colon escaped.
    file=$cache/${name}_${version//:/%3a}_amd64.deb
    if ! deb_ok "$file" "$size" "$sha"; then
        rm -f "$file"
        log "downloading $name=$version"
        (cd "$cache" && apt-get download -q -o APT::Sandbox::User=root "$name=$version" >&2) ||
            die "apt-get download $name=$version failed (not in the apt lists any more? see tests/xen/README.md)"
        deb_ok "$file" "$size" "$sha" || {
            rm -f "$file"
            die "$name=$version: size or sha256 differs from packages.lock"
        }
        fetched=$((fetched + 1))
    fi
    debs+=("$file")
done <"$lock"
[ ${#debs[@]} -gt 0 ] || die "no packages in $lock"

# Unpack again only when the pinned set changed.
stamp=$(sha256sum "$lock" | cut -d' ' -f1)
if [ "$(cat "$sysroot/.lock-sha256" 2>/dev/null)" != "$stamp" ]; then
    log "unpacking ${#debs[@]} packages into $sysroot"
    rm -rf "$sysroot"
    mkdir -p "$sysroot"
    for deb in "${debs[@]}"; do dpkg-deb -x "$deb" "$sysroot"; done
    echo "$stamp" >"$sysroot/.lock-sha256"
fi
log "ok: ${#debs[@]} packages ($fetched downloaded), sysroot $sysroot"

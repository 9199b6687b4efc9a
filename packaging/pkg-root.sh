#!/bin/sh
# SPDX-License-Identifier: GPL-2.0-only
# pkg-root.sh: prints the path of a copy of the guests' trixie tree ($PCIFAB_CACHE/trixie is
# never modified) with dkms, systemd, udev and lintian installed in it, for check-packages.sh
# and check-systemd.sh. The copy is made once and kept; later runs reuse it, adding what a
# newer version of this script installs.
set -eu
cache=${PCIFAB_CACHE:-/var/cache/pcifab}
base=$cache/trixie
root=$cache/trixie-pkg
[ -x "$base/usr/bin/dpkg" ] || { echo "pkg-root.sh: no trixie tree at $base (make deps)" >&2; exit 1; }
# /proc inside the tree for apt, mounted at most once and unmounted at exit (both steps
# below run on a fresh cache; a second mount over the first outlived the script).
mounted=
with_proc() {
    [ -n "$mounted" ] && return 0
    mount -t proc proc "$root/proc"
    mounted=1
    trap 'umount "$root/proc"' EXIT
}
if [ ! -f "$root/.pcifab-pkg-ready" ]; then
    # A /proc an interrupted run left mounted would stop the removal half-way.
    if mountpoint -q "$root/proc" 2>/dev/null; then umount "$root/proc"; fi
    rm -rf "$root"
    echo "pkg-root.sh: copying $base to $root (once)" >&2
    cp -a "$base" "$root"
    cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
    with_proc
    chroot "$root" sh -c 'export DEBIAN_FRONTEND=noninteractive; apt-get update -q >/dev/null &&
        apt-get install -y -q --no-install-recommends dkms systemd udev >/dev/null' >&2
    touch "$root/.pcifab-pkg-ready"
fi
if [ ! -x "$root/usr/bin/lintian" ]; then
    echo "pkg-root.sh: installing lintian into $root (once)" >&2
    with_proc
    chroot "$root" sh -c 'export DEBIAN_FRONTEND=noninteractive; apt-get update -q >/dev/null &&
        apt-get install -y -q --no-install-recommends lintian >/dev/null' >&2
fi
echo "$root"

#!/bin/sh
# SPDX-License-Identifier: GPL-2.0-only
# check-systemd.sh: systemd-analyze verify of pcifab-manager.service and udevadm verify of
# 60-pcifab.rules, inside a copy of the trixie tree (pkg-root.sh) with systemd installed
# there, not on this machine.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$("$here/pkg-root.sh")
d=$root/tmp/pcifab-systemd
rm -rf "$d"
mkdir -p "$d"
sed 's|@BINDIR@|/usr/bin|' "$here/systemd/pcifab-manager.service" >"$d/pcifab-manager.service"
cp "$here/udev/60-pcifab.rules" "$d/"
# verify wants the ExecStart binary to exist: a stand-in in the copy, removed after.
touch "$root/usr/bin/pcifab-manager" && chmod 0755 "$root/usr/bin/pcifab-manager"
rc=0
out=$(chroot "$root" systemd-analyze verify --man=no /tmp/pcifab-systemd/pcifab-manager.service 2>&1) || rc=1
[ -z "$out" ] || { echo "$out"; rc=1; }
chroot "$root" udevadm verify --resolve-names=never /tmp/pcifab-systemd/60-pcifab.rules || rc=1
rm -f "$root/usr/bin/pcifab-manager"
rm -rf "$d"
[ $rc = 0 ] && echo "check-systemd: pcifab-manager.service and 60-pcifab.rules verify clean"
exit $rc

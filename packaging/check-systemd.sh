#!/bin/sh
# SPDX-License-Identifier: GPL-2.0-only
# check-systemd.sh: systemd-analyze verify of pcifab-manager.service and udevadm verify of
# 60-pcifab.rules, inside a copy of the trixie tree (pkg-root.sh) with systemd installed
# there, not on this machine; the same with the socket-only drop-in; and that the unit lets
# the daemon serve the HTTPS API (its own network, IPv4 and IPv6 sockets, bind(2) allowed)
# and passes --state a directory, as Documentation/manager.rst says.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$("$here/pkg-root.sh")
d=$root/tmp/pcifab-systemd
rm -rf "$d"
mkdir -p "$d"
sed 's|@BINDIR@|/usr/bin|' "$here/systemd/pcifab-manager.service" >"$d/pcifab-manager.service"
cp "$here/udev/60-pcifab.rules" "$d/"
unit=$d/pcifab-manager.service
# verify wants the ExecStart binary to exist: a stand-in in the copy, removed after.
touch "$root/usr/bin/pcifab-manager" && chmod 0755 "$root/usr/bin/pcifab-manager"
rc=0
out=$(chroot "$root" systemd-analyze verify --man=no /tmp/pcifab-systemd/pcifab-manager.service 2>&1) || rc=1
[ -z "$out" ] || { echo "$out"; rc=1; }
# The drop-in of socket-only sites, read from the unit's directory as systemd reads it.
mkdir -p "$d/pcifab-manager.service.d"
cp "$here/systemd/socket-only.conf" "$d/pcifab-manager.service.d/"
out=$(chroot "$root" systemd-analyze verify --man=no /tmp/pcifab-systemd/pcifab-manager.service 2>&1) || rc=1
[ -z "$out" ] || { echo "with socket-only.conf: $out"; rc=1; }
rm -rf "$d/pcifab-manager.service.d"
# The API needs a TCP socket it may bind: nothing in the unit may take the network away.
fail() { echo "check-systemd: pcifab-manager.service: $*"; rc=1; }
last() { grep "^$1=" "$unit" | tail -n 1 | cut -d= -f2-; }
[ "$(last PrivateNetwork)" != yes ] || fail "PrivateNetwork=yes: the HTTPS API cannot listen"
fams=$(last RestrictAddressFamilies)
if [ -n "$fams" ]; then
    case " $fams " in "~"*) fail "RestrictAddressFamilies is a deny list; list what it may use" ;; esac
    for f in AF_UNIX AF_INET AF_INET6; do
        case " $fams " in *" $f "*) ;; *) fail "RestrictAddressFamilies lacks $f" ;; esac
    done
fi
for key in IPAddressDeny SocketBindDeny; do
    [ -z "$(last $key)" ] || fail "$key= would keep the API from listening"
done
grep '^SystemCallFilter=~' "$unit" | grep -qE '@network-io|[ ~]bind( |$)' &&
    fail "SystemCallFilter denies bind(2) or @network-io"
# --state is the directory that holds manager.redb.
state=$(sed -n 's/^ExecStart=.* --state \([^ ]*\).*/\1/p' "$unit")
[ "$state" = /var/lib/pcifab-manager ] || fail "--state is '$state', not the StateDirectory /var/lib/pcifab-manager"
# The @system-service set the filter starts from must hold bind and listen.
set_calls=$(chroot "$root" systemd-analyze syscall-filter @network-io 2>/dev/null) || true
for call in bind listen accept4; do
    echo "$set_calls" | grep -qw "$call" || fail "systemd-analyze syscall-filter @network-io lacks $call"
done
chroot "$root" systemd-analyze syscall-filter @system-service 2>/dev/null | grep -qw '@network-io' ||
    fail "@system-service does not include @network-io"
chroot "$root" udevadm verify --resolve-names=never /tmp/pcifab-systemd/60-pcifab.rules || rc=1
rm -f "$root/usr/bin/pcifab-manager"
rm -rf "$d"
[ $rc = 0 ] && echo "check-systemd: pcifab-manager.service (with and without socket-only.conf) and 60-pcifab.rules verify clean; the unit may serve the API"
exit $rc

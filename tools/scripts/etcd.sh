#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only
#
# etcd.sh: Debian's etcd (the etcd-server package) for the manager's HA tests
# (`make check-ha`), taken from Debian's archive into the cache; nothing is installed on
# this machine. `apt-get download` fetches the .deb of the release this machine's apt
# sources name (bookworm: etcd 3.4, trixie: 3.5), `dpkg-deb -x` unpacks it into
# $CACHE/etcd-VERSION, and $CACHE/etcd links to it (Debian builds it against the C library:
# the harness copies its loader and libraries into the guests). Idempotent; prints the path of the etcd binary.
set -euo pipefail

CACHE=${PCIFAB_CACHE:-/var/cache/pcifab}

say() { printf 'etcd: %s\n' "$*" >&2; }
die() { printf 'etcd: error: %s\n' "$*" >&2; exit 1; }

command -v apt-get >/dev/null || die "apt-get not found: this script takes etcd from Debian's archive"
mkdir -p "$CACHE"
exec 9>"$CACHE/.etcd.lock"; flock 9

version=$(apt-cache policy etcd-server 2>/dev/null | sed -n 's/^ *Candidate: *//p')
[ -n "$version" ] && [ "$version" != "(none)" ] \
	|| die "apt knows no etcd-server package: run apt-get update (Debian bookworm or trixie sources)"
dir=$CACHE/etcd-$version
if [ ! -x "$dir/usr/bin/etcd" ]; then
	say "fetching etcd-server $version from Debian's archive into $dir"
	tmp=$(mktemp -d "$CACHE/.etcd-dl.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	(cd "$tmp" && apt-get download "etcd-server=$version" >/dev/null) \
		|| die "apt-get download etcd-server=$version failed"
	rm -rf "$dir.tmp"
	dpkg-deb -x "$tmp"/etcd-server_*.deb "$dir.tmp" || die "cannot unpack the etcd-server package"
	[ -x "$dir.tmp/usr/bin/etcd" ] || die "the etcd-server package has no usr/bin/etcd"
	echo "$version" >"$dir.tmp/VERSION"
	rm -rf "$dir"
	mv "$dir.tmp" "$dir"
fi
ln -sfn "etcd-$version" "$CACHE/etcd"
echo "$CACHE/etcd/usr/bin/etcd"

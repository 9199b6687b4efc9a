#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only
#
# Build the public Switchtec PAX client, switchtec-user's `switchtec` CLI, as one static
# binary for the guests: $PCIFAB_CACHE/switchtec-user/switchtec (pcifab-harness
# --switchtec-user). The source is a pinned release tarball from GitHub, checked against
# its sha256 before it is unpacked; the build runs inside a Debian trixie tree with a
# compiler ($PCIFAB_CACHE/trixie-kbuild, made by tools/scripts/kernel.sh) through chroot,
# so nothing is installed on the host. Without curses and OpenSSL: the scenarios need
# neither the GUI nor firmware signing. Idempotent: a binary built from the same tarball
# is kept.
#
# Environment:
#   PCIFAB_CACHE            the cache (default /var/cache/pcifab)
#   SWITCHTEC_USER_ROOT     the chroot tree with gcc and make (default $PCIFAB_CACHE/trixie-kbuild,
#                           else $PCIFAB_CACHE/trixie if that has gcc)
#   SWITCHTEC_USER_SRC      build from this source directory instead of the tarball (offline
#                           development; the result is marked as such)
set -euo pipefail

CACHE=${PCIFAB_CACHE:-/var/cache/pcifab}
VERSION=4.5
URL=https://github.com/Microsemi/switchtec-user/archive/refs/tags/v$VERSION.tar.gz
# sha256 of the tarball at $URL (4.5: the switchtec-user the emulator was checked against).
# Must be filled in (and reviewed) before the first download and when VERSION changes:
#   curl -fsSL "$URL" | sha256sum
SHA256=${SWITCHTEC_USER_SHA256:-}
OUT=$CACHE/switchtec-user

say() { printf 'switchtec-user: %s\n' "$*" >&2; }
die() { printf 'switchtec-user: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (chroot needs it)"
ROOT=${SWITCHTEC_USER_ROOT:-}
if [ -z "$ROOT" ]; then
	for r in "$CACHE/trixie-kbuild" "$CACHE/trixie"; do
		if [ -x "$r/usr/bin/gcc" ] && [ -x "$r/usr/bin/make" ]; then ROOT=$r; break; fi
	done
fi
[ -n "$ROOT" ] && [ -x "$ROOT/usr/bin/gcc" ] || die "no tree with gcc and make under $CACHE \
(trixie-kbuild comes from tools/scripts/kernel.sh); set SWITCHTEC_USER_ROOT"
[ -e "$ROOT/usr/lib/x86_64-linux-gnu/libc.a" ] || die "$ROOT has no libc.a (libc6-dev) for a static link"

mkdir -p "$OUT"
exec 9>"$OUT/.lock"; flock 9

if [ -n "${SWITCHTEC_USER_SRC:-}" ]; then
	[ -f "$SWITCHTEC_USER_SRC/configure" ] || die "$SWITCHTEC_USER_SRC is not a switchtec-user source tree"
	key="local:$(cd "$SWITCHTEC_USER_SRC" && find . -type f ! -path './.git/*' -print0 | sort -z \
		| xargs -0 sha256sum | sha256sum | cut -c1-16)"
	src=$SWITCHTEC_USER_SRC
else
	[ -n "$SHA256" ] || die "no sha256 pinned for $URL: fetch it once, review it, and set SHA256 in $0"
	key="v$VERSION:$SHA256"
	src=
fi
if [ -x "$OUT/switchtec" ] && [ "$(cat "$OUT/switchtec.source" 2>/dev/null)" = "$key" ]; then
	say "up to date: $OUT/switchtec ($key)"
	exit 0
fi

BUILD=$ROOT/tmp/switchtec-user-build
rm -rf "$BUILD"
mkdir -p "$BUILD"
trap 'rm -rf "$BUILD"; mountpoint -q "$ROOT/proc" && umount "$ROOT/proc" || true' EXIT
if [ -z "$src" ]; then
	tarball=$OUT/switchtec-user-$VERSION.tar.gz
	if ! echo "$SHA256  $tarball" | sha256sum -c --status 2>/dev/null; then
		say "downloading $URL"
		curl -fsSL --proto '=https' --tlsv1.2 -o "$tarball.part" "$URL" || die "download of $URL failed"
		echo "$SHA256  $tarball.part" | sha256sum -c --status \
			|| die "$URL: sha256 $(sha256sum "$tarball.part" | cut -d' ' -f1), expected $SHA256"
		mv "$tarball.part" "$tarball"
	fi
	tar -xzf "$tarball" -C "$BUILD" --strip-components=1 || die "cannot unpack $tarball"
else
	cp -a "$src/." "$BUILD/"
	rm -rf "$BUILD/.git"
fi

say "building in $ROOT (static, no curses, no OpenSSL)"
mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
chroot "$ROOT" sh -c 'cd /tmp/switchtec-user-build &&
	./configure --without-curses --without-openssl LDFLAGS=-static >configure.log 2>&1 &&
	make -j2 switchtec >make.log 2>&1' \
	|| { tail -n 30 "$BUILD"/configure.log "$BUILD"/make.log 2>/dev/null >&2; die "build failed"; }
bin=$BUILD/switchtec
[ -x "$bin" ] || die "the build made no $bin"
if readelf -l "$bin" 2>/dev/null | grep -q 'Requesting program interpreter'; then
	die "$bin is not static"
fi
install -m 0755 "$bin" "$OUT/switchtec.new"
mv "$OUT/switchtec.new" "$OUT/switchtec"
echo "$key" >"$OUT/switchtec.source"
say "built $OUT/switchtec ($key)"

#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only
#
# Build the public Switchtec PAX client, switchtec-user's `switchtec` CLI, as one static
# binary for the guests: $PCIFAB_CACHE/switchtec-user/switchtec (pcifab-harness
# --switchtec-user). The source is switchtec-user 4.0 as the crates.io package
# switchtec-user-sys 0.1.11 carries it (its switchtec-user/ folder; crates.io is reachable
# where GitHub may not be), pinned by sha256 and checked before it is unpacked. It is built
# with the host's C compiler (the same one that builds the static samples) into the cache,
# after undoing the crate's two changes to upstream (it renames the device class and frames
# commands for another kernel driver);
# nothing is installed. Without curses and OpenSSL: the scenarios need neither the GUI nor
# firmware signing. Idempotent: a binary built from the same source is kept.
#
# Environment:
#   PCIFAB_CACHE            the cache (default /var/cache/pcifab)
#   SWITCHTEC_USER_SRC      build from this switchtec-user source directory instead
#                           (offline development; the result is marked as such)
set -euo pipefail

CACHE=${PCIFAB_CACHE:-/var/cache/pcifab}
CRATE=switchtec-user-sys-0.1.11
URL=https://static.crates.io/crates/switchtec-user-sys/$CRATE.crate
SHA256=8601fd3d52d530bb6fe92fad928251bc809b6e05c9f6b21592010d52dd032bb9
OUT=$CACHE/switchtec-user

say() { printf 'switchtec-user: %s\n' "$*" >&2; }
die() { printf 'switchtec-user: error: %s\n' "$*" >&2; exit 1; }

command -v "${CC:-cc}" >/dev/null || die "no C compiler (${CC:-cc}); make deps installs gcc"
mkdir -p "$OUT"
exec 9>"$OUT/.lock"; flock 9

if [ -n "${SWITCHTEC_USER_SRC:-}" ]; then
	[ -f "$SWITCHTEC_USER_SRC/configure" ] || die "$SWITCHTEC_USER_SRC is not a switchtec-user source tree"
	key="local:$(cd "$SWITCHTEC_USER_SRC" && find . -type f ! -path './.git/*' -print0 | sort -z \
		| xargs -0 sha256sum | sha256sum | cut -c1-16)"
	src=$SWITCHTEC_USER_SRC
else
	key="$CRATE:$SHA256:switchtec-names:switchtec-framing"
	src=
fi
if [ -x "$OUT/switchtec" ] && [ "$(cat "$OUT/switchtec.source" 2>/dev/null)" = "$key" ]; then
	say "up to date: $OUT/switchtec ($key)"
	exit 0
fi

BUILD=$OUT/build
rm -rf "$BUILD"
mkdir -p "$BUILD"
trap 'rm -rf "$BUILD"' EXIT
if [ -z "$src" ]; then
	crate=$OUT/$CRATE.crate
	if ! echo "$SHA256  $crate" | sha256sum -c --status 2>/dev/null; then
		say "downloading $URL"
		curl -fsSL --proto '=https' --tlsv1.2 -o "$crate.part" "$URL" || die "download of $URL failed"
		echo "$SHA256  $crate.part" | sha256sum -c --status \
			|| die "$URL: sha256 $(sha256sum "$crate.part" | cut -d' ' -f1), expected $SHA256"
		mv "$crate.part" "$crate"
	fi
	tar -xzf "$crate" -C "$BUILD" --strip-components=2 "$CRATE/switchtec-user" \
		|| die "cannot unpack switchtec-user from $crate"
else
	cp -a "$src/." "$BUILD/"
	rm -rf "$BUILD/.git"
fi

# The crate's copy names the device class and nodes "pciswitch" (/sys/class/pciswitch,
# /dev/pciswitch0); upstream switchtec-user and Linux's switchtec.ko say "switchtec".
# Restore upstream's names in the three files that carry them.
if [ -z "$src" ]; then
	sed -i 's/pciswitch/switchtec/g' "$BUILD/lib/platform/linux.c" "$BUILD/lib/switchtec.c" \
		"$BUILD/cli/common.h"
	! grep -rq pciswitch "$BUILD/lib" "$BUILD/cli" || die "unexpected pciswitch names left in $CRATE"
	# The crate's copy also frames commands for another kernel driver ("PCIe Switch
	# Framework", inc/linux/pcisw.h: a 12-byte header on every write, a 10-byte one on every
	# read). Linux's switchtec.ko, which the scenarios use, takes what its documentation
	# (Documentation/driver-api/switchtec.rst) gives: write the 32-bit command id followed
	# by the input; read the 32-bit return value followed by the output. Replace the two
	# framing functions of lib/platform/linux.c with that.
	python3 - "$BUILD/lib/platform/linux.c" <<'PY' || die "cannot restore switchtec.ko's framing in $CRATE"
import sys
path = sys.argv[1]
src = open(path).read()
start = src.index("static int submit_cmd(")
end = src.index("static int linux_cmd(")
framing = r"""/* Linux switchtec.ko framing: u32 command id + input; u32 return value + output. */
static int submit_cmd(struct switchtec_linux *ldev, uint32_t cmd,
		      const void *payload, size_t payload_len)
{
	size_t len = sizeof(cmd) + payload_len;
	char buf[len];
	uint32_t id = htole32(cmd);
	ssize_t n;

	memcpy(buf, &id, sizeof(id));
	if (payload_len)
		memcpy(buf + sizeof(id), payload, payload_len);
	n = write(ldev->fd, buf, len);
	if (n < 0)
		return -1;
	if ((size_t)n != len) {
		errno = EIO;
		return -errno;
	}
	return 0;
}

static int read_resp(struct switchtec_linux *ldev, void *resp,
		     size_t resp_len)
{
	size_t len = sizeof(uint32_t) + resp_len;
	char buf[len];
	uint32_t rv;
	ssize_t n;

	n = read(ldev->fd, buf, len);
	if (n < 0)
		return -1;
	if ((size_t)n != len) {
		errno = EIO;
		return -errno;
	}
	memcpy(&rv, buf, sizeof(rv));
	rv = le32toh(rv);
	if (rv)
		errno = rv;
	if (resp && resp_len)
		memcpy(resp, buf + sizeof(rv), resp_len);
	return rv;
}

"""
src = src[:start] + framing + src[end:]
open(path, "w").write(src)
PY
	! grep -q 'swdev_\|PCISW_' "$BUILD/lib/platform/linux.c" \
		|| die "pcisw framing left in $BUILD/lib/platform/linux.c"
fi

say "building with ${CC:-cc} (static, no curses, no OpenSSL)"
(cd "$BUILD" && ./configure --without-curses --without-openssl LDFLAGS=-static \
	>configure.log 2>&1 && make -j2 switchtec >make.log 2>&1) \
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

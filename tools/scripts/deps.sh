#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only
#
# Prepare a fresh Debian 12 machine (as root) for building and testing pcifab.
# Idempotent: every step checks what is already there and only does what is missing.
# Everything built or downloaded lives in $PCIFAB_CACHE (default /var/cache/pcifab),
# outside the checkout, keyed by what produced it. The host's apt sources are not changed
# and nothing on the host is upgraded.
set -euo pipefail

CACHE=${PCIFAB_CACHE:-/var/cache/pcifab}
KVER=${PCIFAB_KVER:-7.3}
MIRROR=${PCIFAB_MIRROR:-http://deb.debian.org/debian}
BINDGEN_VER=0.72.1
REDFISH_VER=3.4.2
TRIXIE=$CACHE/trixie
APT_PKGS="build-essential bc bison flex libelf-dev libssl-dev cpio kmod xz-utils
  patch debootstrap socat busybox-static linux-libc-dev libclang-19-dev clang-19 lld-19 llvm-19
  python3 python3-venv ca-certificates e2fsprogs musl-tools"

say() { printf 'deps: %s\n' "$*" >&2; }
die() { printf 'deps: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (apt-get, debootstrap and chroot need it)"
mkdir -p "$CACHE"
exec 9>"$CACHE/.deps.lock"; flock 9

# 1. Debian 12 packages.
missing=""
for p in $APT_PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
	say "installing Debian packages:$missing"
	apt-get update -qq || die "apt-get update failed: check the network and /etc/apt/sources.list"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null \
		|| die "apt-get install$missing failed"
fi
[ -e /usr/lib/llvm-19/lib/libclang.so ] || [ -e /usr/lib/llvm-19/lib/libclang-19.so.1 ] \
	|| die "libclang 19 not found under /usr/lib/llvm-19/lib (package libclang-19-dev)"

# 2. Rust: rust-src for the kernel's core build, the musl target for static guest binaries,
#    bindgen-cli for the kernel's bindings.
command -v rustup >/dev/null || die "rustup not found: install Rust with rustup (https://rustup.rs)"
rustup component list --installed | grep -q '^rust-src' || { say "adding rust-src"; rustup component add rust-src; }
rustup target list --installed | grep -q '^x86_64-unknown-linux-musl$' \
	|| { say "adding x86_64-unknown-linux-musl target"; rustup target add x86_64-unknown-linux-musl; }
for c in rustfmt clippy; do
	rustup component list --installed | grep -q "^$c" || rustup component add "$c"
done
BG=$CACHE/bindgen-$BINDGEN_VER
if ! "$BG/bin/bindgen" --version 2>/dev/null | grep -q "bindgen $BINDGEN_VER"; then
	say "building bindgen-cli $BINDGEN_VER (about 75 s)"
	LIBCLANG_PATH=/usr/lib/llvm-19/lib cargo install -q --locked bindgen-cli --version "$BINDGEN_VER" --root "$BG" \
		|| die "cargo install bindgen-cli $BINDGEN_VER failed"
fi

# 3. A private Debian trixie tree: QEMU with vfio-user from trixie-backports, run through the
#    tree's own loader, and the source of the test kernel. The host stays on bookworm.
if [ ! -e "$TRIXIE/.debootstrap-done" ]; then
	say "debootstrap trixie into $TRIXIE (about 45 s)"
	rm -rf "$TRIXIE"
	debootstrap --variant=minbase trixie "$TRIXIE" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
		|| die "debootstrap trixie failed, see $CACHE/debootstrap.log"
	echo "deb $MIRROR trixie-backports main" >"$TRIXIE/etc/apt/sources.list.d/backports.list"
	touch "$TRIXIE/.debootstrap-done"
fi
in_trixie() {
	mountpoint -q "$TRIXIE/proc" || mount -t proc proc "$TRIXIE/proc"
	cp /etc/resolv.conf "$TRIXIE/etc/resolv.conf" 2>/dev/null || true
	local rc=0
	chroot "$TRIXIE" env DEBIAN_FRONTEND=noninteractive "$@" || rc=$?
	umount "$TRIXIE/proc" || true
	return $rc
}
QEMU="$TRIXIE/usr/bin/qemu-system-x86_64"
if [ ! -x "$QEMU" ]; then
	say "installing qemu-system-x86 from trixie-backports into $TRIXIE"
	in_trixie apt-get update -qq || die "apt-get update in $TRIXIE failed"
	in_trixie apt-get install -y -qq --no-install-recommends -t trixie-backports qemu-system-x86 >/dev/null \
		|| die "qemu-system-x86 from trixie-backports failed to install in $TRIXIE"
fi
qemu_run() {
	"$TRIXIE/usr/lib64/ld-linux-x86-64.so.2" --library-path "$TRIXIE/usr/lib/x86_64-linux-gnu" "$QEMU" "$@"
}
qv=$(qemu_run --version | sed -n 's/^QEMU emulator version \([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
set -- $qv
{ [ "${1:-0}" -gt 11 ] || { [ "${1:-0}" -eq 11 ] && [ "${2:-0}" -ge 1 ]; }; } \
	|| die "QEMU in $TRIXIE is '${1:-?}.${2:-?}', need >= 11.1 (trixie-backports qemu-system-x86)"
qemu_run -device help 2>/dev/null | grep -q '"vfio-user-pci"' \
	|| die "QEMU in $TRIXIE lacks the vfio-user-pci device"

# 4. Linux $KVER source from trixie-backports, unpacked (not installed).
SRCDEB=$(ls "$CACHE"/debs/linux-source-"$KVER"_*.deb 2>/dev/null | tail -n1 || true)
if [ -z "$SRCDEB" ]; then
	say "downloading linux-source-$KVER from trixie-backports (167 MB)"
	mountpoint -q "$TRIXIE/proc" || true
	in_trixie apt-get update -qq || die "apt-get update in $TRIXIE failed"
	in_trixie sh -c "mkdir -p /tmp/debs && cd /tmp/debs && apt-get download -t trixie-backports linux-source-$KVER" \
		|| die "linux-source-$KVER is not in trixie-backports (set PCIFAB_KVER?)"
	mkdir -p "$CACHE/debs"
	mv "$TRIXIE"/tmp/debs/linux-source-"$KVER"_*.deb "$CACHE/debs/"
	SRCDEB=$(ls "$CACHE"/debs/linux-source-"$KVER"_*.deb | tail -n1)
fi
SRCVER=$(dpkg-deb -f "$SRCDEB" Version)
SRC=$CACHE/linux-$SRCVER
if [ ! -e "$SRC/.unpacked" ]; then
	say "unpacking linux-source $SRCVER into $SRC (about 30 s)"
	rm -rf "$SRC" "$CACHE/srcdeb"
	dpkg-deb -x "$SRCDEB" "$CACHE/srcdeb"
	mkdir -p "$SRC"
	tar -xJf "$CACHE"/srcdeb/usr/src/linux-source-"$KVER".tar.xz -C "$SRC" --strip-components=1
	rm -rf "$CACHE/srcdeb"
	touch "$SRC/.unpacked"
fi
ln -sfn "$SRC" "$CACHE/linux-src"

# 5. promtool (checks the manager's /metrics): taken out of Debian's prometheus package into
#    the cache, not installed (installing it would start a Prometheus server on this host).
PROMTOOL=$CACHE/prometheus/usr/bin/promtool
if [ ! -x "$PROMTOOL" ]; then
	say "unpacking promtool from Debian's prometheus package into $CACHE/prometheus"
	rm -rf "$CACHE/prometheus" "$CACHE/prometheus-deb"
	mkdir -p "$CACHE/prometheus-deb"
	(cd "$CACHE/prometheus-deb" && apt-get download prometheus >/dev/null) \
		|| { apt-get update -qq && (cd "$CACHE/prometheus-deb" && apt-get download prometheus >/dev/null); } \
		|| die "cannot download Debian's prometheus package (for promtool)"
	dpkg-deb -x "$CACHE"/prometheus-deb/prometheus_*.deb "$CACHE/prometheus"
	rm -rf "$CACHE/prometheus-deb"
	[ -x "$PROMTOOL" ] || die "the prometheus package has no usr/bin/promtool"
fi

# 6. DMTF's redfish client library (the Redfish view's test drives the manager with it), in a
#    virtual environment in the cache, pinned.
VENV=$CACHE/redfish-venv
if ! "$VENV/bin/python3" -c "import redfish, sys; sys.exit(redfish.__version__ != '$REDFISH_VER')" 2>/dev/null; then
	say "installing the redfish $REDFISH_VER Python library into $VENV"
	rm -rf "$VENV"
	python3 -m venv "$VENV" || die "python3 -m venv failed (package python3-venv)"
	"$VENV/bin/pip" install -q --disable-pip-version-check "redfish==$REDFISH_VER" \
		|| die "pip cannot install redfish==$REDFISH_VER from PyPI: check the network"
fi

# 7. Report what the rest of the build uses.
# Atomically: make test builds two things at once, each of which runs this script.
cat >"$CACHE/env.mk.$$" <<MK
# Written by tools/scripts/deps.sh; read by the Makefile.
PCIFAB_CACHE := $CACHE
LINUX_SRC := $SRC
TRIXIE := $TRIXIE
BINDGEN := $BG/bin/bindgen
LIBCLANG_PATH := /usr/lib/llvm-19/lib
PROMTOOL := $PROMTOOL
REDFISH_PYTHON := $VENV/bin/python3
MK
mv -f "$CACHE/env.mk.$$" "$CACHE/env.mk"
say "ok: qemu ${1}.${2} with vfio-user-pci, linux $SRCVER, bindgen $BINDGEN_VER, $(rustc --version)"

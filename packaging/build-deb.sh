#!/bin/sh
# SPDX-License-Identifier: GPL-2.0-only
# build-deb.sh OUTDIR: pcifab-tools_<v>_amd64.deb (the static tools, man pages, completions,
# udev rule, modprobe.d and sysusers.d files, systemd unit) and pcifab-dkms_<v>_all.deb (the
# module's source for DKMS, built by dkms against each installed kernel; it needs the
# top-level dkms.conf) with dpkg-deb. MUSL_BIN and GEN_DIR come from `make deb`.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: build-deb.sh OUTDIR}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$top/tools/Cargo.toml" | head -n1)
[ -n "$version" ] || { echo "build-deb.sh: no version in tools/Cargo.toml" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"

# pcifab-tools
t=$work/pcifab-tools
DESTDIR=$t PREFIX=/usr BINDIR=/usr/bin MANDIR=/usr/share/man DOCDIR=/usr/share/doc/pcifab-tools \
UDEVRULESDIR=/usr/lib/udev/rules.d MODPROBEDIR=/usr/lib/modprobe.d \
SYSUSERSDIR=/usr/lib/sysusers.d UNITDIR=/usr/lib/systemd/system \
    "$top/packaging/install-files.sh" install
gzip -9n "$t"/usr/share/man/man1/*.1
mkdir -p "$t/DEBIAN"
size=$(du -sk "$t" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@SIZE@/$size/" \
    "$top/packaging/debian/pcifab-tools/control" >"$t/DEBIAN/control"
for s in postinst postrm; do
    install -m 0755 "$top/packaging/debian/pcifab-tools/$s" "$t/DEBIAN/$s"
done
dpkg-deb --root-owner-group -Zxz --build "$t" "$out/pcifab-tools_${version}_amd64.deb" >/dev/null

# pcifab-dkms
k=$work/pcifab-dkms
src=$k/usr/src/pcifab-$version
conf=${DKMS_CONF:-$top/dkms.conf}
[ -f "$conf" ] || {
    echo "build-deb.sh: no dkms.conf at the top of the tree: pcifab-dkms needs it" >&2
    exit 1
}
mkdir -p "$src" "$k/DEBIAN"
cp -r "$top/src" "$top/include" "$src/"
cp "$top/Kbuild" "$top/Makefile" "$src/"
cp "$conf" "$src/dkms.conf"
# What dkms.conf uses: the version's one home and the build command for Debian's kernels.
mkdir -p "$src/tools/scripts"
cp "$top/tools/Cargo.toml" "$src/tools/"
cp "$top/tools/scripts/debian-kernel.sh" "$src/tools/scripts/"
find "$src" \( -name '*.o' -o -name '*.ko' -o -name '*.mod*' -o -name '.*.cmd' \) -delete
sed -e "s/@VERSION@/$version/" "$top/packaging/debian/pcifab-dkms/control" >"$k/DEBIAN/control"
for s in postinst prerm; do
    sed -e "s/@VERSION@/$version/" "$top/packaging/debian/pcifab-dkms/$s" >"$k/DEBIAN/$s"
    chmod 0755 "$k/DEBIAN/$s"
done
dpkg-deb --root-owner-group -Zxz --build "$k" "$out/pcifab-dkms_${version}_all.deb" >/dev/null
ls -l "$out/pcifab-tools_${version}_amd64.deb" "$out/pcifab-dkms_${version}_all.deb"

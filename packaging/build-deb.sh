#!/bin/sh
# SPDX-License-Identifier: GPL-2.0-only
# build-deb.sh OUTDIR: three packages, with dpkg-deb:
#   pcifab-tools_<v>_amd64.deb    the static pcifab command, its man pages and completions, the
#                                 udev rule, the modprobe.d and sysusers.d files; no dependency
#                                 on the module (a host that only talks to a manager needs none);
#   pcifab-manager_<v>_amd64.deb  the static daemon, its systemd unit and man page;
#   pcifab-dkms_<v>_all.deb       the module's source for DKMS, built by dkms against each
#                                 installed kernel (it needs the top-level dkms.conf).
# Each carries /usr/share/doc/<package>/copyright and changelog.gz. MUSL_BIN and GEN_DIR come
# from `make deb`.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: build-deb.sh OUTDIR}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$top/tools/Cargo.toml" | head -n1)
[ -n "$version" ] || { echo "build-deb.sh: no version in tools/Cargo.toml" >&2; exit 1; }
clver=$(sed -n '1s/^pcifab (\([^)]*\)).*/\1/p' "$top/packaging/debian/changelog")
[ "$clver" = "$version" ] || {
    echo "build-deb.sh: packaging/debian/changelog starts at $clver, tools/Cargo.toml says $version: add an entry" >&2
    exit 1
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"

# The control file (with the installed size), maintainer scripts, copyright, changelog and
# md5sums of package $1 staged in $2, then the .deb.
finish() {
    pkg=$1 t=$2 arch=$3
    doc=$t/usr/share/doc/$pkg
    mkdir -p "$doc" "$t/DEBIAN"
    install -m 0644 "$top/packaging/debian/copyright" "$doc/copyright"
    gzip -9n <"$top/packaging/debian/changelog" >"$doc/changelog.gz"
    chmod 0644 "$doc/changelog.gz"
    size=$(du -sk "$t" | cut -f1)
    sed -e "s/@VERSION@/$version/" -e "s/@SIZE@/$size/" \
        "$top/packaging/debian/$pkg/control" >"$t/DEBIAN/control"
    for s in postinst postrm prerm; do
        [ -f "$top/packaging/debian/$pkg/$s" ] || continue
        sed -e "s/@VERSION@/$version/" "$top/packaging/debian/$pkg/$s" >"$t/DEBIAN/$s"
        chmod 0755 "$t/DEBIAN/$s"
    done
    (cd "$t" && find usr -type f -print0 | sort -z | xargs -0 md5sum) >"$t/DEBIAN/md5sums"
    chmod 0644 "$t/DEBIAN/md5sums"
    dpkg-deb --root-owner-group -Zxz --build "$t" "$out/${pkg}_${version}_${arch}.deb" >/dev/null
}

# The tools' files of one part (install-files.sh cli|manager) into $2.
stage() {
    DESTDIR=$2 PREFIX=/usr BINDIR=/usr/bin MANDIR=/usr/share/man \
    DOCDIR=/usr/share/doc/pcifab-tools MANAGER_DOCDIR=/usr/share/doc/pcifab-manager \
    UDEVRULESDIR=/usr/lib/udev/rules.d MODPROBEDIR=/usr/lib/modprobe.d \
    SYSUSERSDIR=/usr/lib/sysusers.d UNITDIR=/usr/lib/systemd/system \
        "$top/packaging/install-files.sh" install "$1"
    for d in "$2"/usr/share/man/man*; do
        [ -d "$d" ] && gzip -9n "$d"/*
    done
    return 0
}

stage cli "$work/pcifab-tools"
finish pcifab-tools "$work/pcifab-tools" amd64
stage manager "$work/pcifab-manager"
finish pcifab-manager "$work/pcifab-manager" amd64

# pcifab-dkms
k=$work/pcifab-dkms
src=$k/usr/src/pcifab-$version
conf=${DKMS_CONF:-$top/dkms.conf}
[ -f "$conf" ] || {
    echo "build-deb.sh: no dkms.conf at the top of the tree: pcifab-dkms needs it" >&2
    exit 1
}
mkdir -p "$src"
cp -r "$top/src" "$top/include" "$src/"
cp "$top/Kbuild" "$top/Makefile" "$src/"
cp "$conf" "$src/dkms.conf"
# What dkms.conf uses: the version's one home and the build command for Debian's kernels.
mkdir -p "$src/tools/scripts"
cp "$top/tools/Cargo.toml" "$src/tools/"
cp "$top/tools/scripts/debian-kernel.sh" "$src/tools/scripts/"
find "$src" \( -name '*.o' -o -name '*.ko' -o -name '*.mod*' -o -name '.*.cmd' \) -delete
finish pcifab-dkms "$k" all
ls -l "$out/pcifab-tools_${version}_amd64.deb" "$out/pcifab-manager_${version}_amd64.deb" \
    "$out/pcifab-dkms_${version}_all.deb"

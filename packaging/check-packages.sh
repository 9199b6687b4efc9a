#!/bin/sh
# SPDX-License-Identifier: GPL-2.0-only
# check-packages.sh PKGDIR: lintian on the three packages (any error or warning not overridden
# with a reason in packaging/debian/lintian-overrides fails); then, in a copy of the trixie
# tree (pkg-root.sh): pcifab-tools installs alone and small, with no dependency on the module,
# then pcifab-manager, then pcifab-dkms, each without an error or warning from dpkg or its
# scripts; every file landed and the group pcifab exists; all three purge, leaving no file
# and the tree's file list as before.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
pkgs=$(cd "${1:?usage: check-packages.sh PKGDIR}" && pwd)
start=$(date +%s)
root=$("$here/pkg-root.sh")
fail=0
check() { # description, shell test run in the tree
    if chroot "$root" sh -c "$2"; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi
}
tools=$(ls "$pkgs"/pcifab-tools_*_amd64.deb | tail -n1)
manager=$(ls "$pkgs"/pcifab-manager_*_amd64.deb | tail -n1)
dkms=$(ls "$pkgs"/pcifab-dkms_*_all.deb | tail -n1)
mkdir -p "$root/tmp/pkgs"
cp "$tools" "$manager" "$dkms" "$root/tmp/pkgs/"
T=/tmp/pkgs/$(basename "$tools") M=/tmp/pkgs/$(basename "$manager") K=/tmp/pkgs/$(basename "$dkms")

# lintian, with the project's overrides (each with its reason) given on the command line: the
# packages are built with dpkg-deb, not from a Debian source package.
cp "$here/debian/lintian-overrides" "$root/tmp/pkgs/overrides"
if chroot "$root" lintian --tag-display-limit 0 --fail-on error,warning \
    --suppress-tags-from-file /tmp/pkgs/overrides "$T" "$M" "$K" >"$root/tmp/pkgs/lintian.out" 2>&1; then
    echo "ok: lintian finds no error or warning in the three packages"
else
    echo "FAIL: lintian:"; cat "$root/tmp/pkgs/lintian.out"; fail=1
fi
sed -n 's/^[IP]: /lintian (not failing): /p' "$root/tmp/pkgs/lintian.out" | sort -u

for deb in "$T" "$M" "$K"; do
    deps=$(chroot "$root" dpkg-deb -f "$deb" Depends | tr -d '\n')
    echo "package $(basename "$deb"): $(chroot "$root" dpkg-deb -f "$deb" Installed-Size) KiB installed," \
        "depends: ${deps:-nothing}"
done
check "pcifab-tools depends on nothing (a CLI-only host pulls no module, dkms or compiler)" \
    "[ -z \"\$(dpkg-deb -f $T Depends Pre-Depends Recommends)\" ]"
check "pcifab-tools installs in under 10 MiB" "[ \$(dpkg-deb -f $T Installed-Size) -lt 10240 ]"

listing() { (cd "$root" && find . -xdev \( -path ./proc -o -path ./tmp -o -path ./var/log \
    -o -path ./var/cache -o -path ./var/lib/dpkg -o -path ./var/lib/dkms -o -path ./run \) \
    -prune -o -print | sort); }
listing >"$root/tmp/before.list"
# dpkg -i of $1 must print no error or warning (its own or its scripts').
install() {
    if chroot "$root" dpkg -i "$1" >"$root/tmp/pkgs/dpkg.out" 2>&1 &&
        ! grep -i -E 'error|warning' "$root/tmp/pkgs/dpkg.out"; then
        echo "ok: $(basename "$1") installs cleanly"
    else
        echo "FAIL: dpkg -i $(basename "$1"):"; cat "$root/tmp/pkgs/dpkg.out"; fail=1
    fi
}
install "$T"
check "pcifab-tools installed alone" 'dpkg -s pcifab-tools | grep -q "Status: install ok installed"'
check "pcifab --version runs" 'pcifab --version | grep -q "^pcifab "'
check "group pcifab created" 'getent group pcifab >/dev/null'
for f in /usr/bin/pcifab /usr/share/man/man1/pcifab.1.gz \
    /usr/share/man/man1/pcifab-bind.1.gz /usr/share/bash-completion/completions/pcifab \
    /usr/share/zsh/vendor-completions/_pcifab /usr/share/fish/vendor_completions.d/pcifab.fish \
    /usr/lib/udev/rules.d/60-pcifab.rules /usr/lib/modprobe.d/pcifab.conf \
    /usr/lib/sysusers.d/pcifab.conf /usr/share/doc/pcifab-tools/cli.rst \
    /usr/share/doc/pcifab-tools/copyright /usr/share/doc/pcifab-tools/changelog.gz; do
    check "$f installed" "[ -s $f ]"
done
check "pcifab-tools brings no daemon" '[ ! -e /usr/bin/pcifab-manager ]'
install "$M"
for f in /usr/bin/pcifab-manager /usr/lib/systemd/system/pcifab-manager.service \
    /usr/share/man/man8/pcifab-manager.8.gz /usr/share/doc/pcifab-manager/manager.rst \
    /usr/share/doc/pcifab-manager/copyright /usr/share/doc/pcifab-manager/changelog.gz; do
    check "$f installed" "[ -s $f ]"
done
check "pcifab-manager --version runs" 'pcifab-manager --version | grep -q "pcifab-manager"'
check "the unit names the installed binary" 'grep -q "^ExecStart=/usr/bin/pcifab-manager " /usr/lib/systemd/system/pcifab-manager.service'
check "man pcifab-manager renders" 'man -l /usr/share/man/man8/pcifab-manager.8.gz >/dev/null 2>&1 || zcat /usr/share/man/man8/pcifab-manager.8.gz | grep -q "^.SH NAME"'
install "$K"
check "dkms.conf and the module source in /usr/src" 'ls /usr/src/pcifab-*/dkms.conf /usr/src/pcifab-*/src/pcifab.rs >/dev/null'
check "dkms knows pcifab" 'dkms status pcifab | grep -q pcifab'
check "all three installed" \
    'dpkg -s pcifab-tools pcifab-manager pcifab-dkms | grep -c "Status: install ok installed" | grep -qx 3'
if chroot "$root" dpkg --purge pcifab-tools pcifab-manager pcifab-dkms >"$root/tmp/pkgs/dpkg.out" 2>&1 &&
    ! grep -i -E 'error|warning' "$root/tmp/pkgs/dpkg.out"; then
    echo "ok: the three packages purge cleanly"
else
    echo "FAIL: dpkg --purge:"; cat "$root/tmp/pkgs/dpkg.out"; fail=1
fi
check "the packages gone" '! dpkg -s pcifab-tools pcifab-manager pcifab-dkms 2>/dev/null | grep -q "ok installed"'
check "group pcifab removed on purge" '! getent group pcifab >/dev/null'
check "no pcifab file left" '[ -z "$(find /usr /etc -name "*pcifab*" 2>/dev/null)" ]'
listing >"$root/tmp/after.list"
if diff "$root/tmp/before.list" "$root/tmp/after.list" >"$root/tmp/list.diff"; then
    echo "ok: the tree's files are as before the install"
else
    echo "FAIL: the tree's files differ after the purge:"; head -20 "$root/tmp/list.diff"; fail=1
fi
rm -rf "$root/tmp/pkgs" "$root/tmp/before.list" "$root/tmp/after.list" "$root/tmp/list.diff"
echo "check-packages: $(( $(date +%s) - start )) s"
exit $fail

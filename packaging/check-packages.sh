#!/bin/sh
# SPDX-License-Identifier: GPL-2.0-only
# check-packages.sh PKGDIR: installs pcifab-dkms and pcifab-tools in a copy of the trixie
# tree (pkg-root.sh), checks that their files landed and the group pcifab exists, purges
# both, and checks that every file is gone and the tree's file list is as before.
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
dkms=$(ls "$pkgs"/pcifab-dkms_*_all.deb | tail -n1)
listing() { (cd "$root" && find . -xdev \( -path ./proc -o -path ./tmp -o -path ./var/log \
    -o -path ./var/cache -o -path ./var/lib/dpkg -o -path ./var/lib/dkms -o -path ./run \) \
    -prune -o -print | sort); }
listing >"$root/tmp/before.list"
mkdir -p "$root/tmp/pkgs"
cp "$tools" "$dkms" "$root/tmp/pkgs/"
chroot "$root" dpkg -i /tmp/pkgs/"$(basename "$dkms")" /tmp/pkgs/"$(basename "$tools")"
check "pcifab-tools and pcifab-dkms installed" \
    'dpkg -s pcifab-tools pcifab-dkms | grep -c "Status: install ok installed" | grep -qx 2'
for f in /usr/bin/pcifab /usr/bin/pcifab-manager /usr/share/man/man1/pcifab.1.gz \
    /usr/share/man/man1/pcifab-bind.1.gz /usr/share/bash-completion/completions/pcifab \
    /usr/share/zsh/vendor-completions/_pcifab /usr/share/fish/vendor_completions.d/pcifab.fish \
    /usr/lib/udev/rules.d/60-pcifab.rules /usr/lib/modprobe.d/pcifab.conf \
    /usr/lib/sysusers.d/pcifab.conf /usr/lib/systemd/system/pcifab-manager.service \
    /usr/share/doc/pcifab-tools/cli.rst; do
    check "$f installed" "[ -s $f ]"
done
check "dkms.conf and the module source in /usr/src" 'ls /usr/src/pcifab-*/dkms.conf /usr/src/pcifab-*/src/pcifab.rs >/dev/null'
check "dkms knows pcifab" 'dkms status pcifab | grep -q pcifab'
check "group pcifab created" 'getent group pcifab >/dev/null'
check "pcifab --version runs" 'pcifab --version | grep -q "^pcifab "'
check "the unit names the installed binary" 'grep -q "^ExecStart=/usr/bin/pcifab-manager " /usr/lib/systemd/system/pcifab-manager.service'
chroot "$root" dpkg --purge pcifab-tools pcifab-dkms
check "both packages gone" '! dpkg -s pcifab-tools 2>/dev/null | grep -q installed && ! dpkg -s pcifab-dkms 2>/dev/null | grep -q installed'
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

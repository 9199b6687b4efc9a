#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only
#
# slurm.sh: Debian's Slurm (slurmctld, slurmd, the client commands) and MUNGE for the test
# guests, taken from Debian's archive into the cache; nothing is installed on this machine.
#
# 1. $CACHE/slurm-trixie: a private trixie tree (debootstrap --include) with the packages
#    installed by Debian's own tools, so dependencies resolve as Debian resolves them.
# 2. $CACHE/slurm-guest: only what the guests run out of that tree: the daemons, the
#    commands, Slurm's plugins, MUNGE, every shared library they need (the tree's loader
#    lists them) and the loader itself, at their paths. The harness adds it to the guests'
#    initramfs (--slurm DIR) only when a `slurm:` scenario is selected.
# Idempotent; keyed by the package versions, which are written to slurm-guest/VERSIONS.
set -euo pipefail

CACHE=${PCIFAB_CACHE:-/var/cache/pcifab}
MIRROR=${PCIFAB_MIRROR:-http://deb.debian.org/debian}
TREE=$CACHE/slurm-trixie
OUT=$CACHE/slurm-guest
PKGS=slurmd,slurmctld,slurm-client,munge

say() { printf 'slurm: %s\n' "$*" >&2; }
die() { printf 'slurm: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (debootstrap needs it)"
command -v debootstrap >/dev/null || die "debootstrap not found: run tools/scripts/deps.sh"
mkdir -p "$CACHE"
exec 9>"$CACHE/.slurm.lock"; flock 9

if [ ! -e "$TREE/.debootstrap-done" ]; then
	say "debootstrap trixie with $PKGS into $TREE (about 2 min)"
	rm -rf "$TREE" "$TREE.tmp"
	debootstrap --variant=minbase --include="$PKGS" trixie "$TREE.tmp" "$MIRROR" \
		>"$CACHE/debootstrap-slurm.log" 2>&1 \
		|| die "debootstrap trixie with $PKGS failed, see $CACHE/debootstrap-slurm.log"
	mv "$TREE.tmp" "$TREE"
	touch "$TREE/.debootstrap-done"
fi

versions=$(chroot "$TREE" dpkg-query -W -f='${Package} ${Version}\n' slurmd slurmctld slurm-client munge) \
	|| die "the packages are not installed in $TREE; remove it and run again"
if [ -e "$OUT/.done" ] && [ "$(cat "$OUT/VERSIONS" 2>/dev/null)" = "$versions" ]; then
	exit 0
fi
say "collecting the guests' Slurm files into $OUT"
rm -rf "$OUT.tmp"
mkdir -p "$OUT.tmp"
LD=$TREE/usr/lib64/ld-linux-x86-64.so.2
LIBDIR=$TREE/usr/lib/x86_64-linux-gnu
PLUGINS=usr/lib/x86_64-linux-gnu/slurm-wlm
ELFS="usr/sbin/slurmd usr/sbin/slurmctld usr/sbin/slurmstepd usr/sbin/munged
  usr/bin/munge usr/bin/unmunge usr/bin/sbatch usr/bin/srun usr/bin/scontrol usr/bin/squeue
  usr/bin/sinfo usr/bin/scancel usr/bin/sacct"
# The tree's own symlinks (alternatives, usr-merge) point at absolute paths inside it.
real() { chroot "$TREE" readlink -f "/$1" | sed 's|^/||'; }
copy() { # copy PATH (relative to the tree) as a regular file with its target's contents
	local rel=$1 r
	[ -e "$OUT.tmp/$rel" ] && return 0
	r=$(real "$rel")
	[ -f "$TREE/$r" ] || die "$TREE has no /$rel"
	mkdir -p "$OUT.tmp/$(dirname "$rel")"
	cp -p "$TREE/$r" "$OUT.tmp/$rel"
}
needs() { # the libraries FILE (a path in the tree) links to, relative to the tree; fails if
	# one is missing from the tree
	local list
	list=$("$LD" --library-path "$LIBDIR:$TREE/$PLUGINS" --list "$TREE/$1" 2>&1) || return 1
	if echo "$list" | grep -q 'not found'; then return 1; fi
	if echo "$list" | grep '=> /' | grep -v "=> $TREE/" | grep -q .; then return 1; fi
	echo "$list" | sed -n "s|.* => $TREE/\([^ ]*\) .*|\1|p"
}
for f in $ELFS; do
	f=$(real "$f")
	libs=$(needs "$f") || die "$f needs a library $TREE lacks: $("$LD" --library-path "$LIBDIR" --list "$TREE/$f" 2>&1 | tr '\n' ' ')"
	echo "- $libs"
done >"$CACHE/slurm-guest.list"
skipped=""
for p in "$TREE/$PLUGINS"/*.so; do
	f=${p#"$TREE"/}
	# A plugin whose libraries the tree lacks (Debian did not pull them in) cannot load.
	if libs=$(needs "$f"); then echo "$f $libs"; else skipped="$skipped ${f##*/}"; fi
done >>"$CACHE/slurm-guest.list"
for f in $ELFS; do copy "$f"; done
while read -r f libs; do
	[ "$f" = - ] || copy "$f"
	for l in $libs; do copy "$l"; done
done <"$CACHE/slurm-guest.list"
copy usr/lib64/ld-linux-x86-64.so.2
# The interpreter path in every binary is /lib64/...; the guest's /lib is its own directory.
ln -s usr/lib64 "$OUT.tmp/lib64"
printf '%s\n' "$versions" >"$OUT.tmp/VERSIONS"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
touch "$OUT/.done"
[ -z "$skipped" ] || say "plugins left out (libraries not installed):$skipped"
say "ok: $(echo "$versions" | tr '\n' ' ')($(du -sh "$OUT" | cut -f1))"

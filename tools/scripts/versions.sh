#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only
#
# versions.sh [KERNEL_TREE...]: what a make test or make bench run used, as "# version: "
# lines at the head of its output, so a figure or a failure can be tied to its machine and
# toolchain: the tree's commit, each kernel's release, rustc, QEMU, the CPU and its cores.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${PCIFAB_CACHE:-/var/cache/pcifab}
v() { printf '# version: %-16s %s\n' "$1" "$2"; }
commit=$(git -C "$here" rev-parse --short=12 HEAD 2>/dev/null || echo "not a git checkout")
git -C "$here" diff --quiet HEAD 2>/dev/null || commit="$commit (with uncommitted changes)"
v "pcifab commit" "$commit"
for tree in "$@"; do
	rel=$(cat "$tree/include/config/kernel.release" 2>/dev/null \
		|| sed -n 's/^KERNELRELEASE=//p' "$tree/pcifab-kmake-args" 2>/dev/null)
	v "kernel" "${rel:-unknown} ($(readlink -f "$tree"))"
done
v "rustc" "$(rustc --version 2>/dev/null || echo missing)"
trixie=$CACHE/trixie
qemu=$trixie/usr/bin/qemu-system-x86_64
if [ -x "$qemu" ]; then
	qv=$("$trixie/usr/lib64/ld-linux-x86-64.so.2" --library-path "$trixie/usr/lib/x86_64-linux-gnu" \
		"$qemu" --version 2>/dev/null | head -n1)
fi
v "qemu" "${qv:-missing} (TCG)"
v "cpu" "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
v "cores" "$(nproc), $(awk '/^MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
v "date" "$(date -u '+%Y-%m-%d %H:%M UTC')"

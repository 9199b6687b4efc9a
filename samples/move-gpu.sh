#!/bin/sh
# SPDX-License-Identifier: GPL-2.0-only
#
# Move a function (a GPU's PF, or one VF) to another host using only pcifab's sysfs files.
# Usage: move-gpu.sh PDFID HOST [PORT]      e.g. move-gpu.sh 0x0300 1
# Run on any host whose fabric-manager policy allows it (as root). Prints where the function
# was and where it is now; exits non-zero with the kernel's error otherwise.
set -eu
[ $# -ge 2 ] || { echo "usage: $0 PDFID HOST [PORT]" >&2; exit 2; }
pdfid=$1 host=$2 port=${3:-}
dev=/sys/class/misc/pcifab0
[ -w "$dev/bind" ] || { echo "$0: $dev/bind not writable: is pcifab loaded, are you root?" >&2; exit 1; }

bound_before=$(cat "$dev/nr_bound")
# Unbinding a function that is not bound fails with ENOENT: that is fine for a move.
if echo "$pdfid" > "$dev/unbind" 2>/dev/null; then
	echo "unbound $pdfid (functions bound before: $bound_before)"
fi
if ! echo "$pdfid $host $port" > "$dev/bind"; then
	echo "$0: binding $pdfid to host $host failed (see dmesg)" >&2
	exit 1
fi
echo "bound $pdfid to host $host; fabric generation $(cat "$dev/generation")"

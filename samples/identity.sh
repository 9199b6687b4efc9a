#!/bin/sh
# SPDX-License-Identifier: GPL-2.0-only
#
# Print the identity of every pcifab management endpoint using only sysfs.
# Usage: identity.sh            (prints "pcifab0 fw_version=04070041 ..." per device)
set -eu
found=0
for d in /sys/class/misc/pcifab*; do
	[ -e "$d/fw_version" ] || continue
	found=1
	line=$(basename "$d")
	for f in device_id device_version fw_version vendor_id product_id product_revision \
		partition partition_count; do
		line="$line $f=$(tr ' ' '_' <"$d/$f")"
	done
	echo "$line"
done
[ "$found" = 1 ] || { echo "identity.sh: no pcifab device; is pcifab.ko loaded?" >&2; exit 1; }

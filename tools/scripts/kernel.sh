#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only
#
# Build the test kernel (bzImage and the in-tree switchtec.ko) from the cached Linux source
# and tools/kconfig/pcifab-test.config. The build directory is keyed by the source version
# and the fragment's hash, so a rerun with nothing changed returns at once.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${PCIFAB_CACHE:-/var/cache/pcifab}
[ -e "$CACHE/env.mk" ] || { echo "kernel: run 'make deps' first" >&2; exit 1; }
LINUX_SRC=$(sed -n 's/^LINUX_SRC := //p' "$CACHE/env.mk")
BINDGEN=$(sed -n 's/^BINDGEN := //p' "$CACHE/env.mk")
export LIBCLANG_PATH=/usr/lib/llvm-19/lib
FRAG=$here/tools/kconfig/pcifab-test.config
key=$( (cat "$FRAG"; basename "$LINUX_SRC"; rustc --version) | sha256sum | cut -c1-12)
OUT=$CACHE/kbuild-$key
KMAKE=(make -C "$LINUX_SRC" O="$OUT" BINDGEN="$BINDGEN" -j"$(($(nproc) + 1))")

if [ ! -e "$OUT/.built" ]; then
	echo "kernel: building $(basename "$LINUX_SRC") into $OUT (about 5 minutes on 2 cores)" >&2
	mkdir -p "$OUT"
	"${KMAKE[@]}" -s rustavailable >/dev/null || {
		echo "kernel: the Rust toolchain is not usable for this kernel; run 'make deps'" >&2; exit 1; }
	"${KMAKE[@]}" -s tinyconfig >/dev/null
	"$LINUX_SRC/scripts/kconfig/merge_config.sh" -m -O "$OUT" "$OUT/.config" "$FRAG" >/dev/null
	"${KMAKE[@]}" -s olddefconfig >/dev/null
	bad=""
	while IFS= read -r line; do
		case "$line" in CONFIG_*=[ym]) grep -qx "$line" "$OUT/.config" || bad="$bad ${line}";; esac
	done <"$FRAG"
	[ -z "$bad" ] || { echo "kernel: Kconfig dropped:$bad (see $OUT/.config)" >&2; exit 1; }
	"${KMAKE[@]}" -s bzImage modules >"$OUT/build.log" 2>&1 || {
		tail -30 "$OUT/build.log" >&2; echo "kernel: build failed, see $OUT/build.log" >&2; exit 1; }
	touch "$OUT/.built"
fi
ln -sfn "$OUT" "$CACHE/kbuild"
echo "kernel: $OUT/arch/x86/boot/bzImage" >&2

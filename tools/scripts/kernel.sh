#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only
#
# Build a test kernel (bzImage and the in-tree switchtec.ko) from the cached Linux source.
#
#   kernel.sh [test]   tinyconfig + tools/kconfig/pcifab-{test,io}.config, GCC: the fast kernel of
#                      `make demo` and `make bench`; linked as $PCIFAB_CACHE/kbuild.
#   kernel.sh debug    the same + tools/kconfig/pcifab-debug.config, built with LLVM=-19 (KASAN
#                      with Rust needs clang): the sanitizer kernel every QEMU scenario of
#                      `make test` runs on; linked as $PCIFAB_CACHE/kbuild-debug.
#
# The build directory is keyed by the source version, the fragments, the compilers and the
# variant, so a rerun with nothing changed returns at once.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${PCIFAB_CACHE:-/var/cache/pcifab}
VARIANT=${1:-test}
[ -e "$CACHE/env.mk" ] || { echo "kernel: run 'make deps' first" >&2; exit 1; }
LINUX_SRC=$(sed -n 's/^LINUX_SRC := //p' "$CACHE/env.mk")
BINDGEN=$(sed -n 's/^BINDGEN := //p' "$CACHE/env.mk")
export LIBCLANG_PATH=/usr/lib/llvm-19/lib

FRAGS=("$here/tools/kconfig/pcifab-test.config" "$here/tools/kconfig/pcifab-io.config")
LLVM_ARGS=()
case "$VARIANT" in
test) LINK=$CACHE/kbuild; MINUTES="about 5" ;;
debug)
	FRAGS+=("$here/tools/kconfig/pcifab-debug.config")
	LLVM_ARGS=(LLVM=-19)
	LINK=$CACHE/kbuild-debug; MINUTES="about 12" ;;
*) echo "kernel: unknown variant '$VARIANT' (test or debug)" >&2; exit 2 ;;
esac

. "$here/tools/scripts/kernel-patches.sh"
exec 8>"$CACHE/.kernel.lock"; flock 8
apply_patches

key=$( (cat "${FRAGS[@]}" "$PATCHES"/*.patch; echo "$VARIANT"; basename "$LINUX_SRC"; rustc --version;
	[ ${#LLVM_ARGS[@]} -eq 0 ] || clang-19 --version | head -1) | sha256sum | cut -c1-12)
OUT=$CACHE/kbuild-$VARIANT-$key
KMAKE=(make -C "$LINUX_SRC" O="$OUT" BINDGEN="$BINDGEN" "${LLVM_ARGS[@]}" -j"$(($(nproc) + 1))")

if [ ! -e "$OUT/.built" ]; then
	echo "kernel: building the $VARIANT kernel of $(basename "$LINUX_SRC") into $OUT ($MINUTES minutes on 2 cores)" >&2
	start=$(date +%s)
	mkdir -p "$OUT"
	"${KMAKE[@]}" -s rustavailable >/dev/null || {
		echo "kernel: the Rust toolchain is not usable for this kernel; run 'make deps'" >&2; exit 1; }
	"${KMAKE[@]}" -s tinyconfig >/dev/null
	"$LINUX_SRC/scripts/kconfig/merge_config.sh" -m -O "$OUT" "$OUT/.config" "${FRAGS[@]}" >/dev/null
	"${KMAKE[@]}" -s olddefconfig >/dev/null
	bad=""
	for frag in "${FRAGS[@]}"; do
		while IFS= read -r line; do
			case "$line" in
			CONFIG_*=*) grep -qx "$line" "$OUT/.config" || bad="$bad ${line}" ;;
			"# CONFIG_"*" is not set")
				opt=${line#\# }; opt=${opt%% *}
				grep -q "^$opt=" "$OUT/.config" && bad="$bad $opt=(should be off)" ;;
			esac
		done <"$frag"
	done
	[ -z "$bad" ] || { echo "kernel: Kconfig did not take:$bad (see $OUT/.config)" >&2; exit 1; }
	"${KMAKE[@]}" -s bzImage modules >"$OUT/build.log" 2>&1 || {
		tail -30 "$OUT/build.log" >&2; echo "kernel: build failed, see $OUT/build.log" >&2; exit 1; }
	# What an out-of-tree module build against this tree must pass besides M=.
	printf '%s\n' "${LLVM_ARGS[@]}" >"$OUT/pcifab-kmake-args"
	touch "$OUT/.built"
	echo "kernel: $VARIANT kernel built in $(($(date +%s) - start)) s" >&2
fi
ln -sfn "$OUT" "$LINK"
echo "kernel: $OUT/arch/x86/boot/bzImage" >&2

#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only
#
# The module on the oldest rustc the kernel accepts (scripts/min-tool-version.sh: 1.85.0
# for Linux 7.3 on x86), warning-free with clippy.
#
# A module must be compiled by the rustc that built its kernel's Rust metadata (rust/*.rmeta:
# rustc refuses metadata of another version). So this builds a kernel of its own with that
# rustc: the fast test kernel's configuration (tinyconfig + tools/kconfig/pcifab-test.config),
# vmlinux and its modules included so modpost checks every symbol, in $PCIFAB_CACHE/kbuild-msrv-KEY; the
# toolchain comes from rustup into $PCIFAB_CACHE/rustup. Then the module is built against it
# into $PCIFAB_CACHE/module-msrv. Current stable is covered by `make check-module` (the
# machine's rustup default), 1.85.1 by `make module-debian` (Debian's rustc).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${PCIFAB_CACHE:-/var/cache/pcifab}
say() { printf 'msrv: %s\n' "$*" >&2; }
die() { printf 'msrv: error: %s\n' "$*" >&2; exit 1; }
[ -e "$CACHE/env.mk" ] || die "run 'make deps' first"
LINUX_SRC=$(sed -n 's/^LINUX_SRC := //p' "$CACHE/env.mk")
BINDGEN=$(sed -n 's/^BINDGEN := //p' "$CACHE/env.mk")
export LIBCLANG_PATH=/usr/lib/llvm-19/lib
MSRV=${PCIFAB_MSRV:-$(ARCH=x86 SRCARCH=x86 "$LINUX_SRC/scripts/min-tool-version.sh" rustc)}
[ -n "$MSRV" ] || die "no minimum rustc from $LINUX_SRC/scripts/min-tool-version.sh"

exec 9>"$CACHE/.msrv.lock"
flock 9
# The same patched source as the test kernels (make test runs this beside kernel.sh).
. "$here/tools/scripts/kernel-patches.sh"
apply_patches

# 1. rustc $MSRV with rust-src (the kernel builds core from it), clippy and rustfmt (the
#    kernel formats the generated bindings with it), kept in the cache.
export RUSTUP_HOME=$CACHE/rustup CARGO_HOME=$CACHE/cargo-home
TC=$RUSTUP_HOME/toolchains/$MSRV-x86_64-unknown-linux-gnu
if [ ! -x "$TC/bin/clippy-driver" ] || [ ! -x "$TC/bin/rustfmt" ] \
	|| [ ! -d "$TC/lib/rustlib/src/rust/library" ]; then
	command -v rustup >/dev/null || die "rustup not found (https://rustup.rs)"
	say "installing rustc $MSRV with rust-src, clippy and rustfmt into $RUSTUP_HOME"
	rustup -q toolchain install --no-self-update --profile minimal -c rust-src -c clippy -c rustfmt \
		"$MSRV" >/dev/null \
		|| die "rustup toolchain install $MSRV failed"
fi
"$TC/bin/rustc" --version | grep -q "^rustc $MSRV " || die "$TC/bin/rustc is not $MSRV"
RUST_ARGS=(RUSTC="$TC/bin/rustc" HOSTRUSTC="$TC/bin/rustc" CLIPPY_DRIVER="$TC/bin/clippy-driver"
	RUSTFMT="$TC/bin/rustfmt" BINDGEN="$BINDGEN")

# 2. The kernel whose Rust metadata rustc $MSRV builds; keyed like kernel.sh's trees.
FRAG=$here/tools/kconfig/pcifab-test.config
key=$( (cat "$FRAG"; basename "$LINUX_SRC"; "$TC/bin/rustc" --version; "$BINDGEN" --version; gcc --version | head -1) \
	| sha256sum | cut -c1-12)
OUT=$CACHE/kbuild-msrv-$key
KMAKE=(make -C "$LINUX_SRC" O="$OUT" "${RUST_ARGS[@]}" -j"$(($(nproc) + 1))")
if [ ! -e "$OUT/.built" ]; then
	say "building the test kernel's vmlinux with rustc $MSRV into $OUT (about 5 minutes on 2 cores)"
	start=$(date +%s)
	rm -rf "$OUT"
	mkdir -p "$OUT"
	"${KMAKE[@]}" -s rustavailable >/dev/null || die "rustc $MSRV is not usable for $(basename "$LINUX_SRC")"
	"${KMAKE[@]}" -s tinyconfig >/dev/null
	"$LINUX_SRC/scripts/kconfig/merge_config.sh" -m -O "$OUT" "$OUT/.config" "$FRAG" >/dev/null
	"${KMAKE[@]}" -s olddefconfig >/dev/null
	grep -q "^CONFIG_RUSTC_VERSION_TEXT=\"rustc $MSRV " "$OUT/.config" \
		|| die "$OUT/.config: CONFIG_RUSTC_VERSION_TEXT is not rustc $MSRV"
	grep -q '^CONFIG_RUST=y' "$OUT/.config" || die "$OUT/.config: Kconfig dropped CONFIG_RUST"
	"${KMAKE[@]}" -s vmlinux modules >"$OUT/build.log" 2>&1 || {
		tail -30 "$OUT/build.log" >&2; die "kernel build with rustc $MSRV failed, see $OUT/build.log"; }
	printf '%s\n' "${RUST_ARGS[@]}" >"$OUT/pcifab-kmake-args"
	touch "$OUT/.built"
	say "kernel with rustc $MSRV built in $(($(date +%s) - start)) s"
fi
# Module.symvers (what modpost checks the module's imports against) comes from `make modules`.
if [ ! -e "$OUT/Module.symvers" ]; then
	"${KMAKE[@]}" -s modules >>"$OUT/build.log" 2>&1 || {
		tail -30 "$OUT/build.log" >&2; die "make modules with rustc $MSRV failed, see $OUT/build.log"; }
	[ -e "$OUT/Module.symvers" ] || die "make modules left no $OUT/Module.symvers"
fi
ln -sfn "$OUT" "$CACHE/kbuild-msrv"

# 3. The module with clippy, outside the checkout; any warning fails.
MO=$CACHE/module-msrv
LOG=$MO/build.log
mkdir -p "$MO"
# One module build of the checkout at a time (make test builds the sanitizer kernel's
# beside this one): their in-tree cleans must not run in the middle of another build.
exec 5>"$CACHE/.module.lock"; flock 5
start=$(date +%s)
make -s -C "$OUT" M="$here" "${RUST_ARGS[@]}" clean
make -s -C "$OUT" M="$here" MO="$MO" "${RUST_ARGS[@]}" clean
make -s -C "$OUT" M="$here" MO="$MO" "${RUST_ARGS[@]}" CLIPPY=1 modules >"$LOG" 2>&1 || {
	cat "$LOG" >&2; die "the module does not build with rustc $MSRV (log above, $LOG)"; }
cat "$LOG" >&2
! grep -q -i -E 'warning|error|undefined' "$LOG" \
	|| die "the module is not warning-free with rustc $MSRV and clippy (see $LOG)"
[ -f "$MO/src/pcifab.ko" ] || die "the module build produced no $MO/src/pcifab.ko"
say "ok: $MO/src/pcifab.ko built clippy-clean with $("$TC/bin/rustc" --version) in $(($(date +%s) - start)) s"

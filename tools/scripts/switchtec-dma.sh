#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only
#
# Build Microchip's out-of-tree Switchtec DMA driver (fabric mode for PAX parts) and its
# fabric_client example modules for the guests of `make check-fabric-dma`, against a
# kernel build of the project (the sanitizer kernel by default). The source is a checkout
# of github.com/Microsemi/switchtec-dma (it is in no package registry); it is copied into
# the cache, patched for Linux 7.3 with tools/patches/switchtec-dma-7.3.patch (which says
# why each hunk is needed) and built there; nothing is installed. The result is a tree for
# pcifab-harness --switchtec-dma:
#   $PCIFAB_CACHE/switchtec-dma/tree/lib/modules/switchtec-dma/{switchtec_dma,target,initiator}.ko
#
# Environment:
#   SWITCHTEC_DMA_SRC   the switchtec-dma checkout (required)
#   KDIR                the kernel build (default $PCIFAB_CACHE/kbuild-debug); what its
#                       module builds need besides M= is read from KDIR/pcifab-kmake-args
#   LINUX_SRC           the kernel source KDIR was built from (default
#                       $PCIFAB_CACHE/linux-src): the driver includes dmaengine's private
#                       header "../drivers/dma/dmaengine.h", which a headers-only build
#                       (Debian's) lacks; it is put where that path finds it from the build
#   PCIFAB_CACHE        the cache (default /var/cache/pcifab)
set -euo pipefail

CACHE=${PCIFAB_CACHE:-/var/cache/pcifab}
KDIR=${KDIR:-$CACHE/kbuild-debug}
LINUX_SRC=${LINUX_SRC:-$CACHE/linux-src}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
PATCH=$HERE/tools/patches/switchtec-dma-7.3.patch
OUT=$CACHE/switchtec-dma

say() { printf 'switchtec-dma: %s\n' "$*" >&2; }
die() { printf 'switchtec-dma: error: %s\n' "$*" >&2; exit 1; }

[ -n "${SWITCHTEC_DMA_SRC:-}" ] \
	|| die "set SWITCHTEC_DMA_SRC to a checkout of github.com/Microsemi/switchtec-dma"
[ -f "$SWITCHTEC_DMA_SRC/switchtec_dma.c" ] && [ -f "$SWITCHTEC_DMA_SRC/fabric_client/initiator.c" ] \
	|| die "$SWITCHTEC_DMA_SRC has no switchtec_dma.c and fabric_client/initiator.c: not a switchtec-dma checkout"
[ -f "$KDIR/Module.symvers" ] || die "$KDIR is not a built kernel tree (no Module.symvers); make kernel-debug builds it"
[ -f "$LINUX_SRC/drivers/dma/dmaengine.h" ] || die "$LINUX_SRC has no drivers/dma/dmaengine.h; set LINUX_SRC"
read -r -a KMAKE <<<"$(cat "$KDIR/pcifab-kmake-args" 2>/dev/null || true)"

mkdir -p "$OUT"
exec 9>"$OUT/.lock"; flock 9
BUILD=$OUT/build
rm -rf "$BUILD" "$OUT/tree" "$OUT/drivers"
mkdir -p "$BUILD" "$OUT/drivers/dma"
# "../drivers/dma/dmaengine.h" from the build's own include path (-I$(src)).
cp "$LINUX_SRC/drivers/dma/dmaengine.h" "$OUT/drivers/dma/"
(cd "$SWITCHTEC_DMA_SRC" && tar --exclude=.git -cf - .) | tar -xf - -C "$BUILD"
patch -d "$BUILD" -p1 --forward --quiet <"$PATCH" \
	|| die "$PATCH does not apply to $SWITCHTEC_DMA_SRC (made for 1cd8527, version 0.93)"
(cd "$BUILD" && OBJDIR=. bash ./VERSION-GEN >/dev/null)
say "building against $KDIR ${KMAKE[*]}"
nice -n 10 make -s -C "$KDIR" "${KMAKE[@]}" M="$BUILD" modules \
	|| die "switchtec_dma.ko does not build against $KDIR"
nice -n 10 make -s -C "$KDIR" "${KMAKE[@]}" M="$BUILD/fabric_client" \
	KBUILD_EXTRA_SYMBOLS="$BUILD/Module.symvers" modules \
	|| die "fabric_client does not build against $KDIR"
mkdir -p "$OUT/tree/lib/modules/switchtec-dma"
for ko in "$BUILD/switchtec_dma.ko" "$BUILD/fabric_client/target.ko" "$BUILD/fabric_client/initiator.ko"; do
	cp "$ko" "$OUT/tree/lib/modules/switchtec-dma/"
done
say "built $(ls "$OUT/tree/lib/modules/switchtec-dma" | tr '\n' ' ')in $OUT/tree"

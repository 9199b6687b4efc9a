#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0-only
#
# pcifab for Debian's own kernel (trixie-backports linux-image-$KREL, built with CONFIG_RUST=y
# by trixie's rustc). Debian ships no Rust metadata (rust/*.rmeta) in its headers, so this
# script rebuilds exactly that part of Debian's kernel from Debian's source, with Debian's
# .config and Debian's compilers, and checks that the result is the kernel Debian built.
# Documentation/kernels.rst explains every piece.
#
#   debian-kernel.sh [prepare]   In $PCIFAB_CACHE: a private trixie tree with Debian's kernel
#                                toolchain ($CACHE/trixie-kbuild), Debian's kernel packages
#                                (checksums checked by apt), the prepared tree
#                                $CACHE/kbuild-debian (modules_prepare, Debian's Module.symvers)
#                                and Debian's vmlinuz and modules beside it.
#   debian-kernel.sh module      prepare, then build the checkout's module against it inside
#                                the trixie tree (clippy on, warnings fail) into
#                                $CACHE/module-debian/src/pcifab.ko.
#   debian-kernel.sh switchtec   prepare, then build Linux's own switchtec driver (the C peer
#                                the benchmarks compare with; Debian's config leaves
#                                PCI_SW_SWITCHTEC off) from Debian's unmodified source, as an
#                                external module against the prepared tree, inside the trixie
#                                tree, into $CACHE/module-debian-switchtec/switchtec.ko
#                                ($DEBIAN_SWITCHTEC_MO if set), and beside it switchtec_dma.ko
#                                and dmatest.ko (the DMA endpoint's C peer and its test client,
#                                also off in Debian's config).
#   debian-kernel.sh check-dkms  prepare, then inside the trixie tree: install dkms, Debian's
#                                headers and linux-source, `dkms add` this checkout and
#                                `dkms build -k $KREL`; copies the module to
#                                $CACHE/module-dkms/pcifab.ko.
#   debian-kernel.sh dkms KREL   On a Debian host (dkms.conf's MAKE, in the module's source
#                                directory): prepare the Rust metadata for installed kernel KREL
#                                from linux-headers-KREL and linux-source-X.Y under
#                                /var/lib/pcifab, then build the module against it.
#
# Rerunning with nothing changed returns at once: every step is keyed by the package versions.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${PCIFAB_CACHE:-/var/cache/pcifab}
MIRROR=${PCIFAB_MIRROR:-http://deb.debian.org/debian}
# Debian's kernel: its ABI name (uname -r) and the trixie rustc package it was built with.
# Unset (the default), the newest 7.3.x kernel in trixie-backports and the newest trixie rustc
# of the version its .config names (CONFIG_RUSTC_VERSION_TEXT); when the archive cannot be
# asked, the kernel and rustc already prepared in the cache (resolve_kernel). The archive
# drops a kernel when a newer one is uploaded: nothing here pins one.
KREL=${PCIFAB_DEBIAN_KREL:-}
RUST_VER=${PCIFAB_DEBIAN_RUSTC:-}
KSERIES=${PCIFAB_DEBIAN_KSERIES:-7.3}
ROOT=$CACHE/trixie-kbuild
# What Debian's kernel was built with (CONFIG_*_VERSION_TEXT of its .config); from trixie,
# the Rust packages of the kernel's rustc (set by resolve_kernel).
tools_main() {
	echo "rustc=$RUST_VER rust-src=$RUST_VER libstd-rust-dev=$RUST_VER rust-clippy=$RUST_VER
  rustfmt=$RUST_VER bindgen gcc-14 make bc bison flex libssl-dev openssl cpio kmod libclang-19-dev python3 xz-utils"
}
# From trixie-backports: pahole 1.30 (Debian's CONFIG_PAHOLE_VERSION) and its libelf.
TOOLS_BPO="dwarves libelf-dev"
# The only differences olddefconfig may leave ('<' Debian's line, '>' ours): Kconfig asks the
# build machine's `openssl` whether it knows ML-DSA (openssl >= 3.5, as trixie's), and the
# ML-DSA key types, all off in Debian's config, are only visible then. A host without such an
# openssl (DKMS on an older system) gets these lines; module signing is not affected.
CONFIG_ALLOWED="< CONFIG_OPENSSL_SUPPORTS_ML_DSA=y
< # CONFIG_MODULE_SIG_KEY_TYPE_MLDSA_44 is not set
< # CONFIG_MODULE_SIG_KEY_TYPE_MLDSA_65 is not set
< # CONFIG_MODULE_SIG_KEY_TYPE_MLDSA_87 is not set"
JOBS=$(($(nproc) + 1))

MODE=${1:-prepare}
say() { printf 'debian-kernel: %s\n' "$*" >&2; }
die() { printf 'debian-kernel: error: %s\n' "$*" >&2; exit 1; }

# Runs "$@" inside $ROOT, in a private mount namespace: /proc, $CACHE and the checkout are
# bind-mounted at their own paths, so every path means the same inside and outside, and
# the mounts vanish with the command (nothing stays mounted under the cache).
in_root() {
	unshare -m --propagation private -- bash -c '
		set -e
		root=$1 cache=$2 checkout=$3; shift 3
		mount -t proc proc "$root/proc"
		mount --rbind /dev "$root/dev"
		for d in "$cache" "$checkout"; do
			mkdir -p "$root$d"
			mount --bind "$d" "$root$d"
		done
		cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
		exec chroot "$root" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
			HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"
	' in_root "$ROOT" "$CACHE" "$here" "$@"
}

# 1. The private trixie tree with Debian's kernel toolchain. The harness's guest root
#    ($CACHE/trixie) is not touched.
root_base() {
	if [ ! -e "$ROOT/.debootstrap-done" ]; then
		say "debootstrap trixie into $ROOT (about 30 s)"
		rm -rf "$ROOT" "$ROOT.new"
		debootstrap --variant=minbase trixie "$ROOT.new" "$MIRROR" >"$CACHE/debootstrap-kbuild.log" 2>&1 \
			|| die "debootstrap trixie failed, see $CACHE/debootstrap-kbuild.log"
		echo "deb $MIRROR trixie-backports main" >"$ROOT.new/etc/apt/sources.list.d/backports.list"
		mv "$ROOT.new" "$ROOT"
		touch "$ROOT/.debootstrap-done"
	fi
}

# Which kernel and rustc (KREL, RUST_VER), unless given: see their definitions above.
resolve_kernel() {
	[ -n "$KREL" ] && [ -n "$RUST_VER" ] && return 0
	local newest="" hdr want rust="" prepared memo=$CACHE/debian-kernel.resolved
	# The archive is asked once a day; the answer is kept for the runs in between.
	if [ -z "$KREL$RUST_VER" ] && [ -n "$(find "$memo" -mmin -1440 2>/dev/null)" ]; then
		read -r KREL RUST_VER <"$memo"
		[ -n "$KREL" ] && [ -n "$RUST_VER" ] && return 0
	fi
	if in_root apt-get update -qq 2>/dev/null; then
		newest=$(in_root apt-cache search --names-only "^linux-headers-${KSERIES//./\\.}\\.[0-9]+\\+deb13-amd64\$" \
			| cut -d' ' -f1 | sed 's/^linux-headers-//' | sort -V | tail -n1)
	fi
	if [ -z "$KREL" ] && [ -n "$newest" ]; then
		KREL=$newest
	elif [ -z "$KREL" ]; then
		prepared=$(sed -n 's/^KERNELRELEASE=//p' "$CACHE/kbuild-debian/pcifab-kmake-args" 2>/dev/null || true)
		[ -n "$prepared" ] || die "cannot ask the archive for Debian's newest $KSERIES kernel and none is prepared in $CACHE (set PCIFAB_DEBIAN_KREL and PCIFAB_DEBIAN_RUSTC)"
		say "the archive cannot be asked: using the kernel prepared in the cache, $prepared"
		KREL=$prepared
	fi
	if [ -z "$RUST_VER" ]; then
		hdr=$(fetch_deb "linux-headers-$KREL")
		want=$(dpkg-deb --fsys-tarfile "$hdr" | tar -xO "./usr/src/linux-headers-$KREL/.config" \
			| sed -n 's/^CONFIG_RUSTC_VERSION_TEXT="rustc \([0-9.]*\) .*/\1/p')
		[ -n "$want" ] || die "linux-headers-$KREL: no CONFIG_RUSTC_VERSION_TEXT in its .config"
		rust=$(in_root apt-cache madison rustc | awk -F'|' '{gsub(/ /, "", $2); print $2}' \
			| grep -E "^${want//./\\.}\\+" | sort -V | tail -n1 || true)
		if [ -z "$rust" ]; then
			rust=$(in_root dpkg-query -W -f='${Version}' rustc 2>/dev/null | grep -E "^${want//./\\.}\\+" || true)
			[ -n "$rust" ] || die "Debian's $KREL was built with rustc $want, which trixie no longer has (set PCIFAB_DEBIAN_RUSTC)"
		fi
		RUST_VER=$rust
	fi
	say "Debian's kernel $KREL, built with rustc $RUST_VER"
	[ -n "$newest" ] && echo "$KREL $RUST_VER" >"$memo"
	return 0
}

root_ready() {
	root_base
	resolve_kernel
	local key TOOLS_MAIN
	TOOLS_MAIN=$(tools_main)
	key=$(echo "$TOOLS_MAIN $TOOLS_BPO" | sha256sum | cut -c1-12)
	if [ ! -e "$ROOT/.tools-$key" ]; then
		say "installing Debian's kernel toolchain into $ROOT (rustc $RUST_VER, bindgen, gcc-14, pahole)"
		in_root apt-get update -qq || die "apt-get update in $ROOT failed"
		# shellcheck disable=SC2086
		in_root apt-get install -y -qq --no-install-recommends $TOOLS_MAIN >/dev/null \
			|| die "installing $TOOLS_MAIN in $ROOT failed (is rustc $RUST_VER still in trixie?)"
		# shellcheck disable=SC2086
		in_root apt-get install -y -qq --no-install-recommends -t trixie-backports $TOOLS_BPO >/dev/null \
			|| die "installing $TOOLS_BPO from trixie-backports in $ROOT failed"
		rm -f "$ROOT"/.tools-*
		touch "$ROOT/.tools-$key"
	fi
}

# The installed version of each package named, one "name=version" a line.
root_versions() {
	in_root dpkg-query -W -f='${Package}=${Version}\n' "$@"
}

# 2. A Debian package downloaded by apt inside $ROOT into $CACHE/debs, its SHA256 checked
#    against apt's (signed) index. Prints the .deb's path.
fetch_deb() {
	local pkg=$1 suite=${2:-trixie-backports} ver deb want got
	ver=$(in_root apt-cache policy "$pkg" | sed -n 's/^  Candidate: //p')
	[ -n "$ver" ] && [ "$ver" != "(none)" ] || {
		in_root apt-get update -qq || die "apt-get update in $ROOT failed"
		ver=$(in_root apt-cache policy "$pkg" | sed -n 's/^  Candidate: //p')
	}
	[ -n "$ver" ] && [ "$ver" != "(none)" ] || die "$pkg is not in trixie/trixie-backports (set PCIFAB_DEBIAN_KREL?)"
	deb=$(ls "$CACHE"/debs/"${pkg}_${ver/:/%3a}"_*.deb 2>/dev/null | head -n1 || true)
	if [ -z "$deb" ]; then
		say "downloading $pkg $ver"
		mkdir -p "$CACHE/debs"
		in_root sh -c "cd '$CACHE/debs' && apt-get download -qq -o APT::Sandbox::User=root -t '$suite' '$pkg=$ver'" \
			|| die "apt-get download $pkg=$ver failed"
		deb=$(ls "$CACHE"/debs/"${pkg}_${ver/:/%3a}"_*.deb | head -n1)
	fi
	if [ ! -e "$deb.sha256-ok" ]; then
		want=$(in_root apt-cache show --no-all-versions "$pkg=$ver" | sed -n 's/^SHA256: //p' | head -n1)
		got=$(sha256sum "$deb" | cut -d' ' -f1)
		[ -n "$want" ] && [ "$want" = "$got" ] \
			|| die "$deb: SHA256 $got, apt's index says '${want:-nothing}'; delete it and rerun"
		echo "$got" >"$deb.sha256-ok"
	fi
	echo "$deb"
}

# 3. Debian's .config, olddefconfig'd by the same compilers, must come out as Debian's:
#    everything that decides the Rust metadata (RUSTC_VERSION_TEXT, BINDGEN_VERSION_TEXT,
#    PAHOLE_VERSION and what depends on them, CC_VERSION_TEXT) is in it. Only the lines of
#    $CONFIG_ALLOWED may differ; they are printed.
config_lines() { grep -E '^(CONFIG_[A-Za-z0-9_]+=|# CONFIG_[A-Za-z0-9_]+ is not set)' "$1" | sort; }
check_config() {
	local theirs=$1 ours=$2 diffs bad=""
	diffs=$(diff <(config_lines "$theirs") <(config_lines "$ours") | grep -E '^[<>]' || true)
	while IFS= read -r line; do
		[ -n "$line" ] || continue
		if grep -qxF -- "$line" <<<"$CONFIG_ALLOWED"; then
			say "config: allowed difference (openssl probe of the build machine): $line"
		else
			bad="$bad
  $line"
		fi
	done <<<"$diffs"
	[ -z "$bad" ] || die "the rebuilt .config differs from Debian's ('<' Debian, '>' ours):$bad
the toolchain in the build tree is not the one Debian used (rustc, bindgen, pahole, gcc)"
}

# 4. The prepared tree: Debian's source + .config, modules_prepare with Debian's release
#    name, Debian's Module.symvers. $1: source, $2: output, $3: Debian's .config,
#    $4: Debian's Module.symvers; $RUN: how to run the compilers (in_root or nothing).
prepare_tree() {
	local src=$1 out=$2 config=$3 symvers=$4 cc n missing
	cc=$(sed -n 's/^CONFIG_CC_VERSION_TEXT="\([^ ]*\) .*/\1/p' "$config")
	[ -n "$cc" ] || die "$config has no CONFIG_CC_VERSION_TEXT"
	local kmake=(make -C "$src" O="$out" CC="$cc" HOSTCC="$cc" KERNELRELEASE="$KREL")
	rm -rf "$out"
	mkdir -p "$out"
	cp "$config" "$out/.config"
	$RUN "${kmake[@]}" -s olddefconfig >/dev/null || die "olddefconfig failed in $out"
	check_config "$config" "$out/.config"
	say "modules_prepare for $KREL in $out (about 1 minute on 2 cores)"
	$RUN "${kmake[@]}" -s -j"$JOBS" modules_prepare >"$out/prepare.log" 2>&1 || {
		tail -20 "$out/prepare.log" >&2; die "modules_prepare failed, see $out/prepare.log"; }
	ls "$out"/rust/libkernel.rmeta "$out"/rust/libcore.rmeta >/dev/null 2>&1 \
		|| die "modules_prepare built no rust/*.rmeta in $out (is CONFIG_RUST set?)"
	cp "$symvers" "$out/Module.symvers"
	# The Rust symbols this metadata makes modules reference must be the ones Debian's
	# kernel exports: same crate hashes, same mangled names.
	n=0 missing=""
	for f in "$out"/rust/exports_*_generated.h; do
		[ -e "$f" ] || continue
		while read -r sym; do
			n=$((n + 1))
			grep -q "	$sym	" "$out/Module.symvers" || missing="$missing $sym"
		done < <(sed -n 's/^EXPORT_SYMBOL_RUST_GPL(\(.*\));$/\1/p' "$f")
	done
	[ -z "$missing" ] || die "$(echo "$missing" | wc -w) of $n Rust exports of the rebuilt metadata are not in Debian's Module.symvers (first:${missing:0:200}): the metadata differs from Debian's"
	say "rust metadata matches Debian's: $n Rust exports found in its Module.symvers"
	printf '%s\n' "CC=$cc" "HOSTCC=$cc" "KERNELRELEASE=$KREL" >"$out/pcifab-kmake-args"
}

# What a module build against $1 passes besides M=.
kmake_args() { cat "$1/pcifab-kmake-args"; }

# Clippy build of the module in $here against tree $1 into MO=$2 (inside the trixie tree);
# any warning fails, every symbol must resolve against Debian's Module.symvers.
build_module() {
	local tree=$1 mo=$2 log=$2/build.log args
	mapfile -t args < <(kmake_args "$tree")
	mkdir -p "$mo"
	$RUN make -s -C "$tree" M="$here" "${args[@]}" clean
	$RUN make -s -C "$tree" M="$here" MO="$mo" "${args[@]}" clean
	$RUN make -s -C "$tree" M="$here" MO="$mo" "${args[@]}" CLIPPY=1 modules >"$log" 2>&1 || {
		cat "$log" >&2; die "module build against $tree failed"; }
	cat "$log" >&2
	! grep -q -i -E 'warning|error|undefined' "$log" \
		|| die "module build against $tree is not warning-free (see $log)"
	[ -f "$mo/src/pcifab.ko" ] || die "module build produced no $mo/src/pcifab.ko"
	local vm
	vm=$($RUN modinfo -F vermagic "$mo/src/pcifab.ko")
	case "$vm" in "$KREL "*) ;; *) die "$mo/src/pcifab.ko: vermagic '$vm', expected '$KREL ...'" ;; esac
	say "built $mo/src/pcifab.ko (vermagic $vm)"
}

# Linux's switchtec driver, drivers/pci/switch/switchtec.c of the source the prepared tree $1
# was made from, built unmodified as an external module into $2 (inside the trixie tree), and
# beside it the driver of the switch's DMA endpoint and the dmaengine test client the
# benchmark's dmaep part runs (drivers/dma/switchtec_dma.c with its dmaengine.h, and
# drivers/dma/dmatest.c; Debian's config leaves SWITCHTEC_DMA and DMATEST off); every symbol
# must resolve against Debian's Module.symvers.
SWITCHTEC_SRCS="drivers/pci/switch/switchtec.c drivers/dma/switchtec_dma.c drivers/dma/dmaengine.h drivers/dma/dmatest.c"
SWITCHTEC_KOS="switchtec switchtec_dma dmatest"
build_switchtec() {
	local tree=$1 mo=$2 src args vm f fresh=1
	src=$(readlink -f "$tree/source")
	for f in $SWITCHTEC_SRCS; do
		[ -f "$src/$f" ] || die "no $f in $src"
		cmp -s "$src/$f" "$mo/${f##*/}" || fresh=0
	done
	for f in $SWITCHTEC_KOS; do
		[ -f "$mo/$f.ko" ] && [ "$mo/$f.ko" -nt "$tree/.built" ] || fresh=0
	done
	if [ "$fresh" = 1 ]; then
		say "up to date: $mo/switchtec.ko, switchtec_dma.ko, dmatest.ko"
		return
	fi
	mapfile -t args < <(kmake_args "$tree")
	rm -rf "$mo"
	mkdir -p "$mo"
	for f in $SWITCHTEC_SRCS; do cp "$src/$f" "$mo/"; done
	echo 'obj-m := switchtec.o switchtec_dma.o dmatest.o' >"$mo/Kbuild"
	$RUN make -s -C "$tree" M="$mo" "${args[@]}" modules >"$mo/build.log" 2>&1 || {
		cat "$mo/build.log" >&2; die "switchtec build against $tree failed"; }
	! grep -q -i -E 'warning|error|undefined' "$mo/build.log" \
		|| { cat "$mo/build.log" >&2; die "switchtec build against $tree is not clean (see $mo/build.log)"; }
	for f in $SWITCHTEC_KOS; do
		vm=$($RUN modinfo -F vermagic "$mo/$f.ko")
		case "$vm" in "$KREL "*) ;; *) die "$mo/$f.ko: vermagic '$vm', expected '$KREL ...'" ;; esac
	done
	say "built $mo/switchtec.ko, switchtec_dma.ko and dmatest.ko from Debian's source (vermagic $vm)"
}

# Cache mode: everything of 1-4 in $CACHE.
prepare_cache() {
	mkdir -p "$CACHE"
	root_ready
	local hdr bin mods src vers key out kver srcdeb kroot
	hdr=$(fetch_deb "linux-headers-$KREL")
	bin=$(fetch_deb "linux-binary-$KREL")
	mods=$(fetch_deb "linux-modules-$KREL")
	kver=$(dpkg-deb -f "$hdr" Version)
	# Debian's source of the same upload (deps.sh may have fetched it already).
	srcdeb=$(fetch_deb "linux-source-${KREL%%.*}.$(echo "$KREL" | cut -d. -f2)")
	[ "$(dpkg-deb -f "$srcdeb" Version)" = "$kver" ] \
		|| die "$srcdeb is version $(dpkg-deb -f "$srcdeb" Version), the headers $kver"
	vers=$(root_versions rustc rust-src bindgen gcc-14 dwarves libclang-19-dev)
	key=$( (echo "$KREL $kver"; echo "$vers") | sha256sum | cut -c1-12)
	out=$CACHE/kbuild-debian-$key
	kroot=$CACHE/debian-kernel-$kver
	if [ ! -e "$out/.built" ]; then
		local start
		start=$(date +%s)
		if [ ! -e "$kroot/.unpacked" ]; then
			rm -rf "$kroot"
			for d in "$hdr" "$bin" "$mods"; do dpkg-deb -x "$d" "$kroot"; done
			touch "$kroot/.unpacked"
		fi
		# A pristine copy of Debian's source: the shared $CACHE/linux-src carries the test
		# kernels' patches (tools/kconfig/patches).
		src=$CACHE/linux-debian-$kver
		if [ ! -e "$src/.unpacked" ]; then
			say "unpacking Debian's linux-source $kver into $src (about 30 s)"
			rm -rf "$src" "$src.deb"
			dpkg-deb -x "$srcdeb" "$src.deb"
			mkdir -p "$src"
			tar -xJf "$src.deb"/usr/src/linux-source-*.tar.xz -C "$src" --strip-components=1
			rm -rf "$src.deb"
			touch "$src/.unpacked"
		fi
		say "preparing $out for Debian's $KREL with:" $vers
		RUN=in_root prepare_tree "$src" "$out" "$kroot/usr/src/linux-headers-$KREL/.config" \
			"$kroot/usr/src/linux-headers-$KREL/Module.symvers"
		local vmlinuz
		vmlinuz=$(find "$kroot" -name "vmlinuz*" -path "*$KREL*" | head -n1)
		[ -n "$vmlinuz" ] || die "no vmlinuz in linux-binary-$KREL"
		ln -sfn "$vmlinuz" "$out/vmlinuz"
		ln -sfn "$kroot/usr/lib/modules/$KREL" "$out/debian-modules"
		touch "$out/.built"
		say "prepared $out in $(($(date +%s) - start)) s"
	fi
	ln -sfn "$out" "$CACHE/kbuild-debian"
}

# DKMS mode on a Debian host: Debian's headers (.config, Module.symvers) and linux-source
# of the same version are installed; the compilers are the host's own.
dkms_host() {
	local krel=$1 hdrdir kver major srcpkg srcver tarball key out src vers base=/var/lib/pcifab
	KREL=$krel
	hdrdir=/usr/src/linux-headers-$krel
	[ -e "$hdrdir/.config" ] || hdrdir=/lib/modules/$krel/build
	[ -e "$hdrdir/.config" ] && [ -e "$hdrdir/Module.symvers" ] \
		|| die "no .config and Module.symvers for $krel: apt install linux-headers-$krel"
	grep -q '^CONFIG_RUST=y' "$hdrdir/.config" || die "kernel $krel is built without CONFIG_RUST"
	if [ -e "$hdrdir/rust/libkernel.rmeta" ]; then
		# The distribution ships the metadata: build against the headers as they are.
		say "$hdrdir has the Rust metadata; building against it"
		make -C "$hdrdir" M="$PWD" modules
		return
	fi
	kver=$(dpkg-query -W -f='${Version}' "linux-headers-$krel" 2>/dev/null) \
		|| die "linux-headers-$krel is not an installed package"
	major=$(sed -n 's/^VERSION = //p' "$hdrdir/Makefile" 2>/dev/null || true)
	[ -n "$major" ] || major=${krel%%.*}
	srcpkg=linux-source-$major.$(echo "$krel" | cut -d. -f2)
	srcver=$(dpkg-query -W -f='${Version}' "$srcpkg" 2>/dev/null || true)
	[ "$srcver" = "$kver" ] || die "the Rust metadata is rebuilt from Debian's source: \
apt install $srcpkg=$kver (installed: ${srcver:-none})"
	tarball=$(ls /usr/src/"$srcpkg".tar.* 2>/dev/null | head -n1)
	[ -n "$tarball" ] || die "$srcpkg is installed but /usr/src/$srcpkg.tar.* is missing"
	local want
	want=$(sed -n 's/^CONFIG_RUSTC_VERSION_TEXT="\(.*\)"$/\1/p' "$hdrdir/.config")
	[ "$(rustc --version 2>/dev/null)" = "$want" ] || die "kernel $krel was built with '$want', \
rustc here is '$(rustc --version 2>/dev/null || echo none)': install that rustc (Debian: apt install \
rustc rust-src libstd-rust-dev of that version) so the metadata matches the kernel's"
	vers=$(dpkg-query -W -f='${Package}=${Version}\n' rustc rust-src bindgen dwarves 2>/dev/null || true)
	key=$( (echo "$krel $kver"; echo "$vers") | sha256sum | cut -c1-12)
	out=$base/kbuild-$krel-$key
	mkdir -p "$base"
	exec 7>"$base/.lock"
	flock 7
	if [ ! -e "$out/.built" ]; then
		src=$base/linux-source-$kver
		if [ ! -e "$src/.unpacked" ]; then
			say "unpacking $tarball into $src"
			rm -rf "$src"
			mkdir -p "$src"
			tar -xf "$tarball" -C "$src" --strip-components=1
			touch "$src/.unpacked"
		fi
		RUN="" prepare_tree "$src" "$out" "$hdrdir/.config" "$hdrdir/Module.symvers"
		touch "$out/.built"
	fi
	flock -u 7
	local args
	mapfile -t args < <(kmake_args "$out")
	make -C "$out" M="$PWD" "${args[@]}" modules
}

# The files of a source package: what dkms.conf and the build need.
DKMS_FILES="dkms.conf Kbuild Makefile src include tools/Cargo.toml tools/scripts/debian-kernel.sh"

# check-dkms: dkms on a Debian system as a user has it, inside $ROOT: Debian's headers and
# linux-source of the kernel's upload, dkms from trixie, this checkout added and built.
check_dkms() {
	local hdr srcdeb ver stage built
	hdr=$(fetch_deb "linux-headers-$KREL")
	srcdeb=$(fetch_deb "linux-source-$(echo "$KREL" | cut -d. -f1-2)")
	local want="dkms $hdr $srcdeb" key
	key=$(echo "$want" | sha256sum | cut -c1-12)
	if [ ! -e "$ROOT/.dkms-$key" ]; then
		say "installing dkms, linux-headers-$KREL and $(basename "$srcdeb") into $ROOT"
		# shellcheck disable=SC2086
		in_root apt-get install -y -qq --no-install-recommends $want >/dev/null \
			|| die "installing $want in $ROOT failed"
		rm -f "$ROOT"/.dkms-*
		touch "$ROOT/.dkms-$key"
	fi
	# The checkout's files as a source tarball would carry them (tracked and new, not ignored).
	stage=$ROOT/tmp/pcifab-dkms-src
	rm -rf "$stage"
	mkdir -p "$stage"
	# shellcheck disable=SC2086
	(cd "$here" && git ls-files -z --cached --others --exclude-standard -- $DKMS_FILES \
		| xargs -0 cp --parents -t "$stage") || die "cannot copy the sources to $stage"
	ver=$(bash -c '. "$1/dkms.conf" && echo "$PACKAGE_VERSION"' _ "$stage")
	[ -n "$ver" ] || die "dkms.conf yields no PACKAGE_VERSION"
	say "dkms add and build pcifab/$ver for $KREL"
	in_root sh -c "
		set -e
		if dkms status -m pcifab -v '$ver' | grep -q .; then dkms remove -q pcifab/'$ver' --all; fi
		rm -rf /usr/src/pcifab-'$ver'
		dkms add /tmp/pcifab-dkms-src
		dkms build pcifab/'$ver' -k '$KREL'
	" || {
		# dkms names its make.log inside the build tree but does not print it.
		cat "$ROOT/var/lib/dkms/pcifab/$ver/build/make.log" >&2 2>/dev/null || true
		die "dkms build pcifab/$ver -k $KREL failed (its make.log above, in $ROOT/var/lib/dkms)"
	}
	built=$(ls "$ROOT/var/lib/dkms/pcifab/$ver/$KREL"/*/module/pcifab.ko* | head -n1)
	[ -n "$built" ] || die "dkms build left no pcifab.ko under $ROOT/var/lib/dkms/pcifab/$ver/$KREL"
	mkdir -p "$CACHE/module-dkms"
	# dkms compresses like the kernel's own modules (xz); busybox insmod takes it plain.
	case "$built" in
	*.xz) xz -dc "$built" >"$CACHE/module-dkms/pcifab.ko" ;;
	*) cp "$built" "$CACHE/module-dkms/pcifab.ko" ;;
	esac
	local log
	log=$(ls "$ROOT/var/lib/dkms/pcifab/$ver/$KREL"/*/log/make.log | head -n1)
	[ -n "$log" ] || die "dkms left no make.log under $ROOT/var/lib/dkms/pcifab/$ver/$KREL"
	! grep -q -i -E 'warning|error|undefined' "$log" || die "dkms build log has warnings: $log"
	say "dkms built $built (vermagic $(in_root modinfo -F vermagic "$CACHE/module-dkms/pcifab.ko")) -> $CACHE/module-dkms/pcifab.ko"
}

case "$MODE" in
prepare | module | switchtec | check-dkms)
	[ "$(id -u)" = 0 ] || die "run as root (debootstrap, chroot and mounts need it)"
	mkdir -p "$CACHE"
	exec 9>"$CACHE/.debian-kernel.lock"
	flock 9
	prepare_cache
	;;
dkms) ;;
*) die "unknown mode '$MODE' (prepare, module, switchtec, check-dkms or dkms KREL)" ;;
esac

case "$MODE" in
prepare) say "ok: $CACHE/kbuild-debian -> $(readlink "$CACHE/kbuild-debian")" ;;
module)
	start=$(date +%s)
	RUN=in_root build_module "$CACHE/kbuild-debian" "${DEBIAN_MO:-$CACHE/module-debian}"
	say "module built in $(($(date +%s) - start)) s"
	;;
switchtec)
	RUN=in_root build_switchtec "$CACHE/kbuild-debian" "${DEBIAN_SWITCHTEC_MO:-$CACHE/module-debian-switchtec}"
	;;
check-dkms)
	start=$(date +%s)
	check_dkms
	say "dkms check took $(($(date +%s) - start)) s"
	;;
dkms)
	[ -n "${2:-}" ] || die "usage: debian-kernel.sh dkms KERNELRELEASE (dkms passes \${kernelver})"
	dkms_host "$2"
	;;
esac

# SPDX-License-Identifier: GPL-2.0-only
#
# Sourced by kernel.sh and msrv.sh (which set here, CACHE and LINUX_SRC): the project's fixes
# to the cached Linux source, applied once, under their own lock, by whichever script comes
# first, so a kernel is never built from a source being patched.

# Fixes to the kernel's own code that the test kernels need (tools/kconfig/patches, each
# explained at its top), applied once to the shared source; an older set is undone first.
PATCHES=$here/tools/kconfig/patches
apply_patches() {
	# Under a lock of its own: msrv.sh builds from the same source while kernel.sh may
	# hold the kernel lock for a whole build.
	exec 6>"$CACHE/.patches.lock"; flock 6
	local phash applied=$LINUX_SRC/.pcifab-patches p
	phash=$(cat "$PATCHES"/*.patch | sha256sum | cut -c1-12)
	[ -e "$LINUX_SRC/.pcifab-patched-$phash" ] && { flock -u 6; return 0; }
	if [ -d "$applied" ]; then
		for p in $(ls -r "$applied"/*.patch); do
			patch -d "$LINUX_SRC" -p1 -R -s <"$p" || {
				echo "kernel: cannot undo $p in $LINUX_SRC; remove that tree and run 'make deps'" >&2
				exit 1; }
		done
		rm -rf "$applied" "$LINUX_SRC"/.pcifab-patched-*
	fi
	for p in "$PATCHES"/*.patch; do
		patch -d "$LINUX_SRC" -p1 -s --forward <"$p" || {
			echo "kernel: $p does not apply to $LINUX_SRC" >&2; exit 1; }
	done
	mkdir -p "$applied"
	cp "$PATCHES"/*.patch "$applied"/
	touch "$LINUX_SRC/.pcifab-patched-$phash"
	flock -u 6
}

#!/bin/sh
# SPDX-License-Identifier: GPL-2.0-only
# install-files.sh install|uninstall [all|cli|manager]: the tools' files, for
# `make install-tools` and `make uninstall` (all) and the packages pcifab-tools (cli: the
# pcifab command and what a host needs to reach /dev/pcifabN) and pcifab-manager (manager: the
# daemon and its unit). Every directory comes from the environment the Makefile sets (DESTDIR,
# BINDIR, MANDIR, DOCDIR, UDEVRULESDIR, MODPROBEDIR, SYSUSERSDIR, UNITDIR, PREFIX, MUSL_BIN,
# GEN_DIR).
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
D=${DESTDIR:-}
BASHDIR=$PREFIX/share/bash-completion/completions
ZSHDIR=$PREFIX/share/zsh/vendor-completions
FISHDIR=$PREFIX/share/fish/vendor_completions.d

PART=${2:-all}
MANAGER_DOCDIR=${MANAGER_DOCDIR:-$DOCDIR}

cli_files() {
    # source|destination|mode
    echo "${MUSL_BIN:-}/pcifab|$BINDIR/pcifab|0755"
    echo "$GEN_DIR/completions/pcifab.bash|$BASHDIR/pcifab|0644"
    echo "$GEN_DIR/completions/_pcifab|$ZSHDIR/_pcifab|0644"
    echo "$GEN_DIR/completions/pcifab.fish|$FISHDIR/pcifab.fish|0644"
    echo "$top/packaging/udev/60-pcifab.rules|$UDEVRULESDIR/60-pcifab.rules|0644"
    echo "$top/packaging/modprobe.d/pcifab.conf|$MODPROBEDIR/pcifab.conf|0644"
    echo "$top/packaging/sysusers.d/pcifab.conf|$SYSUSERSDIR/pcifab.conf|0644"
    for d in cli install uapi; do
        echo "$top/Documentation/$d.rst|$DOCDIR/$d.rst|0644"
    done
    for m in "$GEN_DIR"/man/*.1; do
        echo "$m|$MANDIR/man1/$(basename "$m")|0644"
    done
}

manager_files() {
    echo "${MUSL_BIN:-}/pcifab-manager|$BINDIR/pcifab-manager|0755"
    echo "$top/packaging/systemd/pcifab-manager.service|$UNITDIR/pcifab-manager.service|0644"
    echo "$top/packaging/systemd/socket-only.conf|$MANAGER_DOCDIR/examples/pcifab-manager.service.d/socket-only.conf|0644"
    echo "$top/packaging/man/pcifab-manager.8|$MANDIR/man8/pcifab-manager.8|0644"
    for d in manager manager-api; do
        echo "$top/Documentation/$d.rst|$MANAGER_DOCDIR/$d.rst|0644"
    done
}

files() {
    case "$PART" in
    all) cli_files; manager_files ;;
    cli) cli_files ;;
    manager) manager_files ;;
    *) echo "install-files.sh: part is all, cli or manager, not '$PART'" >&2; exit 2 ;;
    esac
}

case "${1:-}" in
install)
    files | while IFS='|' read -r src dst mode; do
        [ -f "$src" ] || { echo "install-files.sh: $src is missing (make install-build)" >&2; exit 1; }
        install -D -m "$mode" "$src" "$D$dst"
        case "$dst" in
        "$BINDIR"/*) strip "$D$dst" ;;
        *.service) sed -i "s|@BINDIR@|$BINDIR|g" "$D$dst" ;;
        esac
    done
    ;;
uninstall)
    files | while IFS='|' read -r src dst mode; do
        rm -f "$D$dst"
    done
    # The man pages even without the generated ones to list them.
    rm -f "$D$MANDIR/man1/pcifab.1" "$D$MANDIR"/man1/pcifab-*.1
    rmdir "$D$DOCDIR" "$D$MANAGER_DOCDIR" 2>/dev/null || true
    ;;
*)
    echo "usage: install-files.sh install|uninstall [all|cli|manager]" >&2
    exit 2
    ;;
esac

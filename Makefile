# SPDX-License-Identifier: GPL-2.0-only
#
# pcifab: the module (default goal), the test kernel, the tools, the tests and the demo.
# Everything downloaded or built outside the module itself lives in $(PCIFAB_CACHE).

PCIFAB_CACHE ?= /var/cache/pcifab
export PCIFAB_CACHE
# The kernel tree the module is built against: any tree with CONFIG_RUST=y.
KDIR ?= $(PCIFAB_CACHE)/kbuild
export CARGO_TARGET_DIR ?= $(PCIFAB_CACHE)/target
export LIBCLANG_PATH ?= /usr/lib/llvm-19/lib

MUSL := x86_64-unknown-linux-musl
MUSL_BIN := $(CARGO_TARGET_DIR)/$(MUSL)/release
# Everything in here lands in the guests' /bin.
GUEST_BIN := $(PCIFAB_CACHE)/guest
HOST_BIN := $(CARGO_TARGET_DIR)/release
RESULTS ?= $(CURDIR)/results
CARGO := cargo
TOOLS := --manifest-path tools/Cargo.toml

.PHONY: modules clean deps kernel tools lint check-module cargo-test qemu-test test demo bench help

modules:
	$(MAKE) -C $(KDIR) M=$(CURDIR) modules

clean:
	$(MAKE) -C $(KDIR) M=$(CURDIR) clean

help:
	@echo "make            build src/pcifab.ko against KDIR=$(KDIR)"
	@echo "make deps       prepare this machine (packages, QEMU, Linux source) in $(PCIFAB_CACHE)"
	@echo "make kernel     build the test kernel and the in-tree switchtec.ko"
	@echo "make test       lint + cargo test + QEMU scenarios; prints 'N passed, N failed'"
	@echo "make demo       boot the two-host fabric and show what pcifab sees"
	@echo "make bench      MRPC echo vs switchtec, bind/unbind vs raw hot-plug, manager scheduling"

deps:
	@tools/scripts/deps.sh

kernel: deps
	@tools/scripts/kernel.sh

tools: deps
	$(CARGO) build -q --release $(TOOLS) -p pcifab-emu -p pcifab-harness
	$(CARGO) build -q --release $(TOOLS) --target $(MUSL) -p pcifab -p pcifab-agent -p pcifab-manager
	@mkdir -p $(GUEST_BIN)
	cp $(MUSL_BIN)/pcifab $(MUSL_BIN)/pcifab-agent $(MUSL_BIN)/pcifab-selftest $(MUSL_BIN)/pcifab-manager $(GUEST_BIN)/
	cp samples/identity.sh $(GUEST_BIN)/pcifab-identity.sh
	$(CC) -static -O2 -Wall -Wextra -Werror -Iinclude/uapi -o $(GUEST_BIN)/pcifab-identity samples/identity.c
	$(CC) -static -O2 -Wall -Wextra -Werror -Iinclude/uapi -o $(GUEST_BIN)/pcifab-move samples/move.c
	$(CC) -static -O2 -Wall -Wextra -Werror -Iinclude/uapi -o $(GUEST_BIN)/pcifab-p2p samples/p2p.c
	cp samples/move-gpu.sh $(GUEST_BIN)/pcifab-move-gpu.sh

# The module with clippy; any warning fails.
check-module: kernel
	@$(MAKE) -s -C $(KDIR) M=$(CURDIR) clean
	@$(MAKE) -s -C $(KDIR) M=$(CURDIR) CLIPPY=1 modules 2>&1 | tee $(PCIFAB_CACHE)/module-build.log
	@! grep -q -E 'warning|error' $(PCIFAB_CACHE)/module-build.log || \
		{ echo "module build is not warning-free (make CLIPPY=1)"; exit 1; }

lint: deps
	rustfmt --check --edition 2021 --config-path $(PCIFAB_CACHE)/linux-src/.rustfmt.toml src/*.rs
	$(CARGO) fmt $(TOOLS) --all --check
	$(CARGO) clippy -q $(TOOLS) --workspace --all-targets -- -D warnings

cargo-test: deps
	$(CARGO) test -q $(TOOLS) --workspace

HARNESS_ARGS = --kernel $(KDIR)/arch/x86/boot/bzImage --module $(CURDIR)/src/pcifab.ko \
	--switchtec $(KDIR)/drivers/pci/switch/switchtec.ko --guest-bin $(GUEST_BIN) \
	--emu $(HOST_BIN)/pcifab-emu --emu-config $(CURDIR)/tools/pcifab-harness/fabric.toml \
	--qemu-root $(PCIFAB_CACHE)/trixie --results $(RESULTS)

qemu-test: check-module tools
	$(HOST_BIN)/pcifab-harness test $(HARNESS_ARGS)

# The order matters: cheap checks first, the QEMU scenarios print the final summary line.
test: deps kernel lint check-module cargo-test tools
	$(HOST_BIN)/pcifab-harness test $(HARNESS_ARGS)

demo: kernel check-module tools
	$(HOST_BIN)/pcifab-harness demo $(HARNESS_ARGS)

# One guest: MRPC echo through pcifab's ioctl vs the C driver's /dev/switchtec0, and
# bind/unbind latency through pcifab vs raw QMP hot-plug. Documentation/benchmarks.rst
# records the numbers.
bench: kernel check-module tools
	$(HOST_BIN)/pcifab-harness bench $(HARNESS_ARGS)
	$(CARGO) run -q --release $(TOOLS) -p pcifab-manager --bin pcifab-manager-bench

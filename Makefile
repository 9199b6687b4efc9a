# SPDX-License-Identifier: GPL-2.0-only
#
# pcifab: the module (default goal), the test kernel, the tools, the tests and the demo.
# Everything downloaded or built outside the module itself lives in $(PCIFAB_CACHE).

PCIFAB_CACHE ?= /var/cache/pcifab
export PCIFAB_CACHE
# The kernel tree the module is built against: any tree with CONFIG_RUST=y. The default is
# the fast test kernel of `make demo` and `make bench`.
KDIR ?= $(PCIFAB_CACHE)/kbuild
# The sanitizer kernel every QEMU scenario of `make test` runs on, and the module built for it
# outside the checkout, so that neither build throws away the other's objects.
DEBUG_KDIR := $(PCIFAB_CACHE)/kbuild-debug
DEBUG_MO ?= $(PCIFAB_CACHE)/module-debug
# What a module build against a kernel tree must pass besides M= (LLVM=-19 for the debug
# kernel), as tools/scripts/kernel.sh recorded it.
kmake-args = $(shell cat $(1)/pcifab-kmake-args 2>/dev/null)
export CARGO_TARGET_DIR ?= $(PCIFAB_CACHE)/target
export LIBCLANG_PATH ?= /usr/lib/llvm-19/lib

MUSL := x86_64-unknown-linux-musl
MUSL_BIN := $(CARGO_TARGET_DIR)/$(MUSL)/release
# ring (TLS for the manager's API) compiles C for the musl target with musl-gcc (musl-tools).
export CC_x86_64_unknown_linux_musl ?= musl-gcc
# Everything in here lands in the guests' /bin.
GUEST_BIN ?= $(PCIFAB_CACHE)/guest
HOST_BIN := $(CARGO_TARGET_DIR)/release
RESULTS ?= $(CURDIR)/results
CARGO := cargo
TOOLS := --manifest-path tools/Cargo.toml

.PHONY: modules clean deps kernel kernel-debug tools lint check-module check-module-debug \
	cargo-test qemu-test test soak demo bench bench-slurm help kernel-debian module-debian switchtec-debian test-debian switchtec-user pax-client \
	check-dkms check-module-msrv check-fabric-dma test-nvme test-p2pdma test-ha-guests test-lane1 test-lane2 \
	test-lane3 test-lane4 scenarios slurm

modules:
	$(MAKE) -C $(KDIR) M=$(CURDIR) $(call kmake-args,$(KDIR)) modules

clean:
	$(MAKE) -C $(KDIR) M=$(CURDIR) $(call kmake-args,$(KDIR)) clean

help:
	@echo "make            build src/pcifab.ko against KDIR=$(KDIR)"
	@echo "make deps       prepare this machine (packages, QEMU, Linux source) in $(PCIFAB_CACHE)"
	@echo "make kernel     build the fast test kernel and the in-tree switchtec.ko (demo, bench)"
	@echo "make kernel-debug  build the sanitizer kernel (KASAN, lockdep, ...) make test runs on"
	@echo "make test       lint + cargo test + QEMU scenarios; prints 'N passed, N failed'"
	@echo "make demo       boot the two-host fabric (PAX firmware): what pcifab sees, GPUs composed,"
	@echo "                a copy between the hosts through the DMA endpoint, a drive moved"
	@echo "                (DIALECT=extended: pcifab's firmware extensions too, emulator only)"
	@echo "make soak       the QEMU scenarios on the debug kernel with the trust scenarios at full"
	@echo "                size (100,000 fuzz calls, 1,000 unload cycles, 5,000 hostile replies)"
	@echo "make bench      MRPC echo vs switchtec, bind/unbind vs raw hot-plug and switchtec-user, DMA"
	@echo "                endpoint copies vs switchtec_dma + dmatest, manager scheduling"
	@echo "make kernel-debian  prepare Debian's kernel $(DEBIAN_KREL) for module builds (rust metadata)"
	@echo "make module-debian  build the module for Debian's kernel (in the trixie build tree)"
	@echo "make test-debian    a few scenarios on Debian's own kernel with that module"
	@echo "make test-nvme      the NVMe drive scenarios (make test's nvme cell) alone"
	@echo "make test-ha-guests  managers in HA on etcd in two guests (not in make test)"
	@echo "make test-p2pdma    Linux's P2PDMA between two fabric drives (sanitizer kernel; make test runs it on Debian's)"
	@echo "make scenarios FILTER='a|b' [DIALECT=pax] [HOSTS=N]  some scenarios on the sanitizer kernel"
	@echo "make slurm      Debian's Slurm and MUNGE for the guests (the slurm: scenarios)"
	@echo "make check-dkms     dkms build of this checkout for Debian's kernel, loaded in a guest"
	@echo "make check-fabric-dma SWITCHTEC_DMA_SRC=DIR  Microchip's fabric DMA driver and fabric_client in guests"
	@echo "make check-module-msrv  the module with clippy on Linux's minimum rustc (1.85.0 for 7.3)"
	@echo "DEMO_KERNEL=test: make demo on the fast test kernel instead of Debian's"

deps:
	@tools/scripts/deps.sh

kernel: deps
	@tools/scripts/kernel.sh test

kernel-debug: deps
	@tools/scripts/kernel.sh debug

tools: deps
	$(CARGO) build -q --release $(TOOLS) -p pcifab-emu -p pcifab-harness
	$(CARGO) build -q --release $(TOOLS) --target $(MUSL) -p pcifab -p pcifab-agent -p pcifab-manager
	@mkdir -p $(GUEST_BIN)
	cp $(MUSL_BIN)/pcifab $(MUSL_BIN)/pcifab-agent $(MUSL_BIN)/pcifab-selftest $(MUSL_BIN)/pcifab-manager $(GUEST_BIN)/
	cp samples/identity.sh $(GUEST_BIN)/pcifab-identity.sh
	$(CC) -static -O2 -Wall -Wextra -Werror -Iinclude/uapi -o $(GUEST_BIN)/pcifab-identity samples/identity.c
	$(CC) -static -O2 -Wall -Wextra -Werror -Iinclude/uapi -o $(GUEST_BIN)/pcifab-move samples/move.c
	$(CC) -static -O2 -Wall -Wextra -Werror -Iinclude/uapi -o $(GUEST_BIN)/pcifab-bind samples/bind.c
	$(CC) -static -O2 -Wall -Wextra -Werror -Iinclude/uapi -o $(GUEST_BIN)/pcifab-p2p samples/p2p.c
	cp samples/move-gpu.sh $(GUEST_BIN)/pcifab-move-gpu.sh

# The module with clippy; any warning or error fails. $(1): kernel tree, $(2): extra make
# arguments (MO=DIR builds outside the checkout; kbuild then wants the checkout itself free of
# objects, so those of an in-tree build are cleaned first), $(3): the module it must produce.
define clippy-module
	@flock $(PCIFAB_CACHE)/.module.lock sh -c '$(MAKE) -s -C $(1) M=$(CURDIR) $(call kmake-args,$(1)) clean && \
		$(MAKE) -s -C $(1) M=$(CURDIR) $(call kmake-args,$(1)) $(2) clean && \
		$(MAKE) -s -C $(1) M=$(CURDIR) $(call kmake-args,$(1)) $(2) CLIPPY=1 modules 2>&1' \
		| tee $(PCIFAB_CACHE)/module-build.log
	@! grep -q -i -E 'warning|error' $(PCIFAB_CACHE)/module-build.log || \
		{ echo "module build is not warning-free (make CLIPPY=1)"; exit 1; }
	@[ -f $(3) ] || { echo "module build produced no $(3)"; exit 1; }
endef

check-module: kernel
	$(call clippy-module,$(KDIR),,$(CURDIR)/src/pcifab.ko)

check-module-debug: kernel-debug
	@mkdir -p $(DEBUG_MO)
	$(call clippy-module,$(DEBUG_KDIR),MO=$(DEBUG_MO),$(DEBUG_MO)/src/pcifab.ko)

lint: deps
	rustfmt --check --edition 2021 --config-path $(PCIFAB_CACHE)/linux-src/.rustfmt.toml $(shell find src -name "*.rs")
	$(CARGO) fmt $(TOOLS) --all --check
	$(CARGO) clippy -q $(TOOLS) --workspace --all-targets -- -D warnings

cargo-test: deps
	$(CARGO) test -q $(TOOLS) --workspace

GUEST_ARGS = --guest-bin $(GUEST_BIN) \
	--emu $(HOST_BIN)/pcifab-emu --emu-config $(CURDIR)/tools/pcifab-harness/fabric.toml \
	--qemu-root $(PCIFAB_CACHE)/trixie
COMMON_ARGS = $(GUEST_ARGS) --results $(RESULTS)
# The fast kernel and the module in src/ (demo, bench).
TEST_KERNEL_ONLY = --kernel $(KDIR)/arch/x86/boot/bzImage --module $(CURDIR)/src/pcifab.ko \
	--switchtec $(KDIR)/drivers/pci/switch/switchtec.ko
TEST_KERNEL_ARGS = $(TEST_KERNEL_ONLY) $(GUEST_ARGS)
HARNESS_ARGS = $(TEST_KERNEL_ARGS) --results $(RESULTS)
# The public PAX client (switchtec-user's CLI) for the `pax client` scenarios.
SWITCHTEC_USER := $(PCIFAB_CACHE)/switchtec-user/switchtec
# The sanitizer kernel and the module built for it (test).
DEBUG_KERNEL_ARGS = --kernel $(DEBUG_KDIR)/arch/x86/boot/bzImage \
	--module $(DEBUG_MO)/src/pcifab.ko --debug-kernel \
	--switchtec $(DEBUG_KDIR)/drivers/pci/switch/switchtec.ko
DEBUG_HARNESS_ARGS = $(DEBUG_KERNEL_ARGS) $(GUEST_ARGS)
# The nvme scenarios' fabric: two hosts and an NVMe drive (QEMU's nvme device).
NVME_GUEST_ARGS = --guest-bin $(GUEST_BIN) \
	--emu $(HOST_BIN)/pcifab-emu --emu-config $(CURDIR)/tools/pcifab-harness/fabric-nvme.toml \
	--qemu-root $(PCIFAB_CACHE)/trixie
NVME_HARNESS_ARGS = $(DEBUG_KERNEL_ARGS) $(NVME_GUEST_ARGS)
NVME_FILTER := agent answers|pcifab binds the MEP|nvme:|rmmod pcifab in every host|kmemleak
# The p2pdma scenarios' fabric: two hosts and two NVMe drives, one with a CMB.
P2PDMA_GUEST_ARGS = --guest-bin $(GUEST_BIN) \
	--emu $(HOST_BIN)/pcifab-emu --emu-config $(CURDIR)/tools/pcifab-harness/fabric-p2pdma.toml \
	--qemu-root $(PCIFAB_CACHE)/trixie
P2PDMA_HARNESS_ARGS = $(DEBUG_KERNEL_ARGS) $(P2PDMA_GUEST_ARGS)
P2PDMA_FILTER := agent answers|pcifab binds the MEP|p2pdma:|kmemleak
# The sanitizer cells' guests have two CPUs (multi-threaded TCG), so that what races in
# the driver can race in the kernel too.
DEBUG_SMP := --smp 2

switchtec-user: deps
	@tools/scripts/switchtec-user.sh

qemu-test: check-module-debug tools
	$(HOST_BIN)/pcifab-harness test --keep-going $(DEBUG_SMP) $(DEBUG_HARNESS_ARGS) \
		--results $(RESULTS)

# The public PAX client over switchtec.ko, in both dialects, on the test kernel
# (Documentation/testing.rst, "The PAX client"); make test runs the same scenarios in its
# sanitizer x extended and Debian x pax cells.
pax-client: kernel check-module tools switchtec-user
	-$(HOST_BIN)/pcifab-harness test --keep-going --dialect pax --filter 'pax client' \
		$(TEST_KERNEL_ARGS) --switchtec-user $(SWITCHTEC_USER) --results $(RESULTS)/pax-client-pax
	-$(HOST_BIN)/pcifab-harness test --keep-going --dialect extended --filter 'pax client' \
		$(TEST_KERNEL_ARGS) --switchtec-user $(SWITCHTEC_USER) \
		--results $(RESULTS)/pax-client-extended
	$(HOST_BIN)/pcifab-harness summary $(RESULTS)/pax-client-pax $(RESULTS)/pax-client-extended

# The QEMU matrix of make test (Documentation/testing.rst, "The matrix"): every scenario
# runs on the sanitizer kernel under the PAX dialect real switches speak (split in two
# cells, one per lane), what needs pcifab's firmware extensions on the sanitizer kernel
# under the extended dialect, and on Debian's kernel what can differ there:
#   debug  x pax       debug-pax: every scenario but those that need the extensions
#                      (EXT_ONLY), the drive's, DEBUG_PAX_2 and the manager's (lane 1)
#   debug  x pax       debug-pax-2: DEBUG_PAX_2, DMA MRPC, the PAX client and what the
#                      driver must survive (lane 2)
#   debug  x pax       nvme: the NVMe drive (fabric-nvme.toml) (lane 4, after debug-manager)
#   debug  x pax       debug-manager: the manager's scenarios and the management network
#                      they use (DEBUG_MANAGER), mostly waiting on leases and time slices
#                      (lane 4)
#   debug  x extended  debug-extended: the extensions (P2P copies and grants, telemetry,
#                      features) and the composition paths the firmware's unbind requests
#                      change (lane 2)
#   debian x pax       debian-pax: module load, interrupts, pciehp, IOMMU and DMA, ACS with
#                      vfio-pci, lockdown, the network as modules and the manager over it,
#                      Debian's switchtec.ko under the PAX client (lane 3)
#   debian x pax       debian-slurm: Slurm's jobs (their kernel paths are the manager's;
#                      here the 29 MB Slurm tree in the guests costs the cores nothing)
#                      (lane 3)
#   debian x extended  debian-extended: the P2P copies (Debian's IOMMU and P2PDMA) (lane 3)
#   debian x pax       debian-p2pdma: Linux's P2PDMA between two fabric drives
#                      (fabric-p2pdma.toml; 25 s here, 3-4 min on the sanitizer kernel,
#                      where `make test-p2pdma` runs it) (lane 3)
#   debian, DKMS build dkms: the identity scenarios (lane 3)
# Every sanitizer cell ends with the kmemleak scan. Each run writes
# RESULTS/<cell>/summary.json; a failed cell does not stop the others, and `pcifab-harness
# summary` prints one line per cell and the final `N passed, N failed`.
# Two steps that need the firmware's UNBIND_REQUEST, which PAX firmware does not send.
EXT_STEPS := free logical port counts in compose_waiting|stale, not a lie
EXT_ONLY := p2p:|p2p grants|p2p trust|$(EXT_STEPS)
# Slurm's jobs run on Debian's kernel only (the guests then carry Debian's Slurm; the kernel
# paths they drive are the manager's, which debug-pax runs), in a cell of their own.
DEBIAN_ONLY := slurm:
# The Slurm figures of `make bench` (a `slurm:` scenario, so Debian's only; not a test).
SLURM_BENCH := slurm: bench:
# The inventory-stall scenario (userfaultfd: the sanitizer kernel has it since
# tools/kconfig/pcifab-debug.config enables it) runs in debug-pax-2 and on Debian's kernel.
UFFD := inventory copy stalled
# Microchip's fabric-mode DMA driver: make check-fabric-dma only.
FABRIC_DMA_ONLY := fabric dma:
DEBUG_PAX_2 := $(UFFD)|DMA MRPC|pax client|mrpc classes|sysfs: other|mrpc: an abandoned|mrpc: a caller queued|events:|hostile firmware|firmware lies|fwctl|fuzz:|insmod/rmmod|probe|install:
DEBUG_EXT_FILTER := agent answers|pcifab binds the MEP|p2p|$(EXT_STEPS)|sysfs: per-function|features|extensions|compose: move GPU0|bind and unbind reach h0|two hosts unbind|rmmod pcifab in every host|kmemleak
DEBIAN_PAX_FILTER := agent answers|pcifab binds the MEP|$(UFFD)|identity|load/unload cycles leave|MRPC echo: random|compose: bind GPU0|compose: move GPU0|compose: gpu1 VFs|compose: samples|ACS|multi-function bind: three VFs|DMA MRPC|features|fwctl|mgmt net|manager: h1 requests|manager: host killed|pax client|sysfs: per-function|rmmod pcifab in every host
DEBIAN_EXT_FILTER := pcifab binds the MEP|p2p: same-host|p2p: user buffers|p2p grants|rmmod pcifab in every host
# The manager's scenarios and the management network they run over: mostly waiting on
# leases, time slices and pciehp, so they take a lane of their own (lane 4).
DEBUG_MANAGER := mgmt net|manager:
# The managers on etcd inside two sanitizer guests: under make test's load the guests' etcd
# did not answer the managers within their 3 s (a run on 2026-12-07 failed so), so it runs
# alone, in `make test-ha-guests`, until it holds beside the other lanes.
HA_GUESTS := manager: HA on etcd in the guests
MATRIX := debug-pax debug-pax-2 nvme debug-extended debug-manager debian-pax debian-slurm \
	debian-extended debian-p2pdma dkms

# make test: first what the cells need (the kernels, the modules, the tools) and the cargo
# tests; then three lanes at once. The machine has two cores: lanes 1 and 2 hold the
# sanitizer cells, which keep the cores busy; lane 3 the Debian cells, which mostly wait
# (on pciehp, timers and the network) and cost little CPU.
#   lane 1 (test-lane1, on the terminal): the debug-pax cell
#   lane 2 (test-lane2): the checks that boot no guest (TEST_CHECKS), then the
#          debug-extended and debug-pax-2 cells
#   lane 4 (test-lane4): the debug-manager cell, which mostly waits, then the nvme cell
#   lane 3 (test-lane3): the debian-pax, debian-slurm, debian-extended, debian-p2pdma and
#          dkms cells, then check-ha
# Lanes 2 and 3 write RESULTS/lane2.log and RESULTS/lane3.log, printed when all lanes end.
# A failed check stops its lane (its cells count as failed runs) and fails make test; a
# failed cell does not stop the others. The summary prints one line per cell and the
# final line.
TEST_CHECKS := lint check-packages check-systemd check-redfish
# cargo-test runs before the lanes, alone: the manager's API tests measure latencies (a
# lockout by 2,000 stalled connections must leave an operator's p99 under 100 ms) that a
# sanitizer cell's two-CPU guests beside them would decide instead.
# Before that, Debian's kernel tree and Slurm's guest tree (TEST_BG: mostly downloads and
# debootstrap, little CPU) are made in the background while the sanitizer kernel, its
# module and the tools (TEST_FG) take the cores; on a cold cache that hides their minutes.
# The module on the minimum rustc (its own kernel: ten minutes cold, a module build warm)
# is made there too: in lane 2 it made that lane end eight minutes after the others on a
# cold cache, with the machine's second core idle meanwhile.
TEST_BG := kernel-debian slurm check-module-msrv
TEST_FG := kernel-debug check-module-debug tools switchtec-user
test: deps
	@mkdir -p $(RESULTS)
	@echo "# in the background: $(TEST_BG) ($(RESULTS)/prepare.log, printed when done)"
	@$(MAKE) -s --no-print-directory $(TEST_BG) >$(RESULTS)/prepare.log 2>&1 & bg=$$!; \
	$(MAKE) --no-print-directory $(TEST_FG); fg=$$?; \
	wait $$bg; st=$$?; echo "# ---- $(RESULTS)/prepare.log"; cat $(RESULTS)/prepare.log; \
	[ $$st -eq 0 ] || echo "# $(TEST_BG) failed (above)"; [ $$fg -eq 0 ] && [ $$st -eq 0 ]
	@$(MAKE) --no-print-directory module-debian switchtec-debian
	@tools/scripts/versions.sh $(DEBUG_KDIR) $(DEBIAN_KDIR)
	@$(MAKE) --no-print-directory cargo-test
	@rm -rf $(addprefix $(RESULTS)/,$(MATRIX)) $(RESULTS)/lane2.log $(RESULTS)/lane3.log \
		$(RESULTS)/lane4.log
	@echo "# lane 1: the debug-pax cell; lane 2: $(TEST_CHECKS), then" \
		"the debug-extended and debug-pax-2" \
		"cells ($(RESULTS)/lane2.log); lane 3: the debian-pax, debian-slurm, debian-extended, debian-p2pdma" \
		"and dkms cells, then check-ha ($(RESULTS)/lane3.log); lane 4: the debug-manager" \
		"and nvme cells ($(RESULTS)/lane4.log); lanes 2-4 printed when all lanes end"
	@$(MAKE) -s test-lane2 >$(RESULTS)/lane2.log 2>&1 & lane2=$$!; \
	$(MAKE) -s test-lane3 >$(RESULTS)/lane3.log 2>&1 & lane3=$$!; \
	$(MAKE) -s test-lane4 >$(RESULTS)/lane4.log 2>&1 & lane4=$$!; \
	$(MAKE) -s test-lane1; \
	wait $$lane2; st=$$?; wait $$lane3; st3=$$?; wait $$lane4; \
	for l in lane2 lane3 lane4; do echo "# ---- $(RESULTS)/$$l.log"; cat $(RESULTS)/$$l.log; \
	done; \
	[ $$st -eq 0 ] || echo "# the checks of lane 2 failed (above): make test fails"; \
	[ $$st3 -eq 0 ] || echo "# lane 3 failed (check-ha, above): make test fails"; \
	$(HOST_BIN)/pcifab-harness summary $(addprefix $(RESULTS)/,$(MATRIX)) && [ $$st -eq 0 ] && \
		[ $$st3 -eq 0 ]

# The first lane of make test: the sanitizer x pax cell without its second half and the
# manager's scenarios.
test-lane1:
	-$(HOST_BIN)/pcifab-harness test --keep-going --dialect pax \
		--exclude '$(EXT_ONLY)|$(DEBUG_PAX_2)|$(DEBUG_MANAGER)|$(DEBIAN_ONLY)|$(FABRIC_DMA_ONLY)' \
		$(DEBUG_SMP) \
		$(DEBUG_HARNESS_ARGS) --switchtec-user $(SWITCHTEC_USER) --results $(RESULTS)/debug-pax

# The fourth lane of make test: the manager's scenarios on the sanitizer kernel under pax,
# then the NVMe cell.
test-lane4:
	-$(HOST_BIN)/pcifab-harness test --keep-going --dialect pax \
		--filter 'agent answers|pcifab binds the MEP|$(DEBUG_MANAGER)|rmmod pcifab in every host|kmemleak' \
		--exclude '$(HA_GUESTS)' $(DEBUG_SMP) $(DEBUG_HARNESS_ARGS) --results $(RESULTS)/debug-manager
	-$(HOST_BIN)/pcifab-harness test --keep-going --dialect pax --filter '$(NVME_FILTER)' \
		$(DEBUG_SMP) $(NVME_HARNESS_ARGS) --results $(RESULTS)/nvme

# The managers in HA on etcd inside the guests, the leader's host powered off (not in make
# test, see HA_GUESTS).
test-ha-guests: check-module-debug tools
	$(HOST_BIN)/pcifab-harness test --keep-going --dialect pax \
		--filter 'agent answers|pcifab binds the MEP|$(HA_GUESTS)|rmmod pcifab in every host|kmemleak' \
		$(DEBUG_SMP) $(DEBUG_HARNESS_ARGS) $(call ETCD_ARGS,manager:) --results $(RESULTS)/ha-guests

# The second lane of make test: the checks, then the sanitizer kernel's extended cell, the
# second half of its pax cell, in a row.
test-lane2: $(TEST_CHECKS)
	-$(HOST_BIN)/pcifab-harness test --keep-going --dialect extended \
		--filter '$(DEBUG_EXT_FILTER)' $(DEBUG_SMP) $(DEBUG_HARNESS_ARGS) \
		--results $(RESULTS)/debug-extended
	-$(HOST_BIN)/pcifab-harness test --keep-going --dialect pax \
		--filter 'agent answers|pcifab binds the MEP|$(DEBUG_PAX_2)|rmmod pcifab in every host|kmemleak' \
		--exclude '$(EXT_ONLY)' $(DEBUG_SMP) $(DEBUG_HARNESS_ARGS) \
		--switchtec-user $(SWITCHTEC_USER) --results $(RESULTS)/debug-pax-2

# The third lane of make test: Debian's kernel (the module for it is built before the
# lanes) under pax, Slurm's scenarios on it, then extended, then the DKMS build; last the HA
# checks (no guest), whose failure fails the lane (and make test) without costing the cells
# before it.
test-lane3:
	-$(HOST_BIN)/pcifab-harness test --keep-going --dialect pax --filter '$(DEBIAN_PAX_FILTER)' \
		--cell debian $(DEBIAN_HARNESS_ARGS) --switchtec $(DEBIAN_SWITCHTEC) \
		--switchtec-user $(SWITCHTEC_USER) --results $(RESULTS)/debian-pax
	-$(HOST_BIN)/pcifab-harness test --keep-going --dialect pax \
		--filter 'agent answers|pcifab binds the MEP|$(DEBIAN_ONLY)|rmmod pcifab in every host' \
		--exclude '$(SLURM_BENCH)' \
		--cell debian $(DEBIAN_HARNESS_ARGS) --slurm $(SLURM_GUEST) --results $(RESULTS)/debian-slurm
	-$(HOST_BIN)/pcifab-harness test --keep-going --dialect extended --cell debian \
		--filter '$(DEBIAN_EXT_FILTER)' $(DEBIAN_HARNESS_ARGS) --results $(RESULTS)/debian-extended
	-$(HOST_BIN)/pcifab-harness test --keep-going --dialect pax --cell debian \
		--filter 'agent answers|pcifab binds the MEP|p2pdma:|rmmod pcifab in every host' \
		--kernel $(DEBIAN_KDIR)/vmlinuz --module $(DEBIAN_MO)/src/pcifab.ko \
		--kernel-modules $(DEBIAN_KDIR)/debian-modules $(P2PDMA_GUEST_ARGS) \
		--results $(RESULTS)/debian-p2pdma
	-$(MAKE) -s check-dkms
	$(MAKE) -s check-ha

# A few scenarios on the sanitizer kernel, for work on one part:
#   make scenarios FILTER='compose|manager' [DIALECT=pax|extended] [HOSTS=N]
DIALECT ?= pax
FILTER ?= pcifab binds the MEP
# Debian's Slurm and MUNGE for the `slurm:` scenarios (tools/scripts/slurm.sh); fetched and
# passed only when FILTER names them.
SLURM_GUEST := $(PCIFAB_CACHE)/slurm-guest
SLURM_FOR = $(if $(findstring slurm,$(1)),slurm)
SLURM_ARGS = $(if $(findstring slurm,$(1)),--slurm $(SLURM_GUEST))
# Debian's etcd (tools/scripts/etcd.sh fetches it into the cache) for the manager's HA
# scenario, which runs it in the guests; passed only when the filter can select it.
ETCD_ARGS = $(if $(findstring manager,$(1)),--etcd "$$(tools/scripts/etcd.sh)")

slurm: deps
	@tools/scripts/slurm.sh

scenarios: check-module-debug tools switchtec-user $(call SLURM_FOR,$(FILTER))
	$(HOST_BIN)/pcifab-harness test --keep-going --dialect $(DIALECT) --filter '$(FILTER)' \
		$(if $(HOSTS),--hosts $(HOSTS)) $(DEBUG_SMP) $(DEBUG_HARNESS_ARGS) \
		--switchtec-user $(SWITCHTEC_USER) $(call SLURM_ARGS,$(FILTER)) $(call ETCD_ARGS,$(FILTER)) \
		$(if $(SWITCHTEC_DMA_SRC),,--exclude '$(FABRIC_DMA_ONLY)') --results $(RESULTS)/scenarios

# Microchip's out-of-tree fabric-mode DMA driver and its fabric_client (h0 initiator, h1
# target) against the emulated PAX DMA endpoint, on the sanitizer kernel
# (Documentation/testing.rst, "fabric dma"). Not part of make test: the source is in no
# package registry; SWITCHTEC_DMA_SRC names a checkout of github.com/Microsemi/switchtec-dma.
check-fabric-dma: check-module-debug tools
	@[ -n "$(SWITCHTEC_DMA_SRC)" ] || { echo "make check-fabric-dma needs \
		SWITCHTEC_DMA_SRC=/path/to/switchtec-dma (github.com/Microsemi/switchtec-dma)"; exit 1; }
	SWITCHTEC_DMA_SRC=$(SWITCHTEC_DMA_SRC) KDIR=$(DEBUG_KDIR) tools/scripts/switchtec-dma.sh
	$(HOST_BIN)/pcifab-harness test --keep-going --dialect pax --hosts 2 \
		--filter '$(FABRIC_DMA_ONLY)' $(DEBUG_SMP) $(DEBUG_HARNESS_ARGS) \
		--switchtec-dma $(PCIFAB_CACHE)/switchtec-dma/tree --results $(RESULTS)/fabric-dma

# The nvme cell of make test alone.
test-nvme: deps kernel-debug check-module-debug tools
	$(HOST_BIN)/pcifab-harness test --keep-going --dialect pax --filter '$(NVME_FILTER)' \
		$(DEBUG_SMP) $(NVME_HARNESS_ARGS) --results $(RESULTS)/nvme

# Linux's P2PDMA between two fabric drives (fabric-p2pdma.toml) alone.
test-p2pdma: deps kernel-debug check-module-debug tools
	$(HOST_BIN)/pcifab-harness test --keep-going --dialect pax --filter '$(P2PDMA_FILTER)' \
		$(DEBUG_SMP) $(P2PDMA_HARNESS_ARGS) --results $(RESULTS)/p2pdma

# The same scenarios with the trust scenarios at full size; hours on 2 cores under TCG.
soak: deps kernel-debug check-module-debug tools
	$(HOST_BIN)/pcifab-harness test --keep-going --soak $(DEBUG_SMP) $(DEBUG_HARNESS_ARGS) \
		--results $(RESULTS)

# Debian's own kernel (trixie-backports linux-image-$(DEBIAN_KREL)) and the module built for
# it; no switchtec.ko (Debian's config leaves PCI_SW_SWITCHTEC off). Documentation/kernels.rst.
DEBIAN_KREL := 7.3.4+deb13-amd64
DEBIAN_KDIR := $(PCIFAB_CACHE)/kbuild-debian
DEBIAN_MO ?= $(PCIFAB_CACHE)/module-debian
# Debian's kernel has virtio_net (the management network) as a module: the harness puts it
# and its dependencies into the guests' initramfs from the module tree.
DEBIAN_HARNESS_ARGS = --kernel $(DEBIAN_KDIR)/vmlinuz --module $(DEBIAN_MO)/src/pcifab.ko \
	--kernel-modules $(DEBIAN_KDIR)/debian-modules $(GUEST_ARGS)
# Identity, management (bind, move), P2P and the manager: about 90 s of scenarios.
DEBIAN_FILTER := pcifab binds the MEP|identity|compose: bind GPU0|compose: move GPU0|p2p: same-host|manager: four requests|rmmod pcifab in every host
# demo and bench: debian (Debian's own kernel, the default) or test (the fast test kernel).
# bench compares pcifab with Linux's switchtec driver on the same kernel: Debian builds none
# (PCI_SW_SWITCHTEC is off), so switchtec-debian builds it, unmodified, from Debian's source
# for Debian's kernel (Documentation/benchmarks.rst).
DEMO_KERNEL ?= debian
BENCH_KERNEL ?= debian
# Linux's switchtec.ko, and beside it switchtec_dma.ko and dmatest.ko (the dmaep part of bench),
# built from Debian's source for Debian's kernel.
export DEBIAN_SWITCHTEC_MO ?= $(PCIFAB_CACHE)/module-debian-switchtec
DEBIAN_SWITCHTEC := $(DEBIAN_SWITCHTEC_MO)/switchtec.ko

kernel-debian: deps
	@tools/scripts/debian-kernel.sh prepare

module-debian: kernel-debian
	@tools/scripts/debian-kernel.sh module

switchtec-debian: kernel-debian
	@tools/scripts/debian-kernel.sh switchtec

test-debian: module-debian tools
	$(HOST_BIN)/pcifab-harness test --keep-going --filter '$(DEBIAN_FILTER)' --cell debian \
		$(DEBIAN_HARNESS_ARGS) --results $(RESULTS)/debian

# `dkms build` of this checkout inside the trixie build tree, then the module DKMS built
# loaded and checked in a guest on Debian's kernel.
check-dkms: kernel-debian tools
	@tools/scripts/debian-kernel.sh check-dkms
	$(HOST_BIN)/pcifab-harness test --keep-going --hosts 1 --filter 'pcifab binds the MEP|identity' \
		--cell debian-dkms --kernel $(DEBIAN_KDIR)/vmlinuz --module $(PCIFAB_CACHE)/module-dkms/pcifab.ko \
		$(GUEST_ARGS) --results $(RESULTS)/dkms

# The module with clippy on the oldest rustc Linux accepts, against a tree whose Rust
# metadata that rustc built (tools/scripts/msrv.sh).
check-module-msrv: deps
	@tools/scripts/msrv.sh

ifeq ($(DEMO_KERNEL),debian)
demo: module-debian tools
	$(HOST_BIN)/pcifab-harness demo --dialect $(DIALECT) $(DEBIAN_HARNESS_ARGS) \
		--results $(RESULTS)
	$(HOST_BIN)/pcifab-harness demo --dialect $(DIALECT) --kernel $(DEBIAN_KDIR)/vmlinuz \
		--module $(DEBIAN_MO)/src/pcifab.ko --kernel-modules $(DEBIAN_KDIR)/debian-modules \
		$(NVME_GUEST_ARGS) --results $(RESULTS)/demo-drive
	$(HOST_BIN)/pcifab-harness demo --dialect $(DIALECT) --kernel $(DEBIAN_KDIR)/vmlinuz \
		--module $(DEBIAN_MO)/src/pcifab.ko --kernel-modules $(DEBIAN_KDIR)/debian-modules \
		$(P2PDMA_GUEST_ARGS) --results $(RESULTS)/demo-p2pdma
else
demo: kernel check-module tools
	$(HOST_BIN)/pcifab-harness demo --dialect $(DIALECT) $(HARNESS_ARGS)
	$(HOST_BIN)/pcifab-harness demo --dialect $(DIALECT) $(TEST_KERNEL_ONLY) $(NVME_GUEST_ARGS) \
		--results $(RESULTS)/demo-drive
	$(HOST_BIN)/pcifab-harness demo --dialect $(DIALECT) $(TEST_KERNEL_ONLY) $(P2PDMA_GUEST_ARGS) \
		--results $(RESULTS)/demo-p2pdma
endif

# One guest: MRPC echo through pcifab's ioctl vs the C driver's /dev/switchtec0, and
# bind/unbind latency through pcifab vs raw QMP hot-plug and vs switchtec-user's gfms-bind;
# then, on the pax dialect (its own harness run, RESULTS/dmaep), copies through the switch's
# DMA endpoint by pcifab vs switchtec_dma + dmatest.
# Documentation/benchmarks.rst records the numbers.
ifeq ($(BENCH_KERNEL),debian)
bench: module-debian switchtec-debian tools switchtec-user slurm
	@tools/scripts/versions.sh $(DEBIAN_KDIR)
	$(HOST_BIN)/pcifab-harness bench $(DEBIAN_HARNESS_ARGS) --switchtec $(DEBIAN_SWITCHTEC) \
		--switchtec-user $(SWITCHTEC_USER) --results $(RESULTS)
	$(HOST_BIN)/pcifab-harness bench --dialect pax --filter dmaep $(DEBIAN_HARNESS_ARGS) \
		--switchtec $(DEBIAN_SWITCHTEC) --results $(RESULTS)/dmaep
	$(HOST_BIN)/pcifab-harness bench-scale $(DEBIAN_HARNESS_ARGS) --results $(RESULTS)/scale
	$(MAKE) -s bench-slurm
	$(CARGO) run -q --release $(TOOLS) -p pcifab-manager --bin pcifab-manager-bench -- --charts $(RESULTS)
else
bench: kernel check-module tools switchtec-user
	@tools/scripts/versions.sh $(KDIR)
	$(HOST_BIN)/pcifab-harness bench $(HARNESS_ARGS) --switchtec-user $(SWITCHTEC_USER)
	$(HOST_BIN)/pcifab-harness bench --dialect pax --filter dmaep $(TEST_KERNEL_ARGS) \
		--results $(RESULTS)/dmaep
	$(HOST_BIN)/pcifab-harness bench-scale $(TEST_KERNEL_ARGS) --results $(RESULTS)/scale
	$(CARGO) run -q --release $(TOOLS) -p pcifab-manager --bin pcifab-manager-bench -- --charts $(RESULTS)
endif

# The Slurm figures alone (Documentation/benchmarks.rst, "Slurm"): Debian's kernel and
# Slurm, whichever BENCH_KERNEL is; `make bench` runs it on Debian's.
bench-slurm: module-debian tools slurm
	$(HOST_BIN)/pcifab-harness test --dialect pax --filter '$(SLURM_BENCH)' --cell debian \
		$(DEBIAN_HARNESS_ARGS) --slurm $(SLURM_GUEST) --results $(RESULTS)/slurm-bench

# ---- install, packages (Documentation/install.rst) ------------------------------------------
# make install [PREFIX=/usr/local] [DESTDIR=]: the module of src/ for KDIR's kernel (+ depmod
# when DESTDIR is empty), the static tools, man pages, completions, the udev rule, the
# modprobe.d file, the sysusers.d file and the systemd unit. PREFIX=/usr puts the system files
# under /usr/lib (as the packages do); any other PREFIX puts them under /etc.
PREFIX ?= /usr/local
DESTDIR ?=
BINDIR = $(PREFIX)/bin
MANDIR = $(PREFIX)/share/man
DOCDIR = $(PREFIX)/share/doc/pcifab-tools
SYSDIR = $(if $(filter /usr,$(PREFIX)),/usr/lib,/etc)
UDEVRULESDIR ?= $(SYSDIR)/udev/rules.d
MODPROBEDIR ?= $(SYSDIR)/modprobe.d
SYSUSERSDIR ?= $(SYSDIR)/sysusers.d
UNITDIR ?= $(if $(filter /usr,$(PREFIX)),/usr/lib/systemd/system,/etc/systemd/system)
KRELEASE = $(shell cat $(KDIR)/include/config/kernel.release 2>/dev/null)
GEN_DIR = $(CARGO_TARGET_DIR)/pcifab-gen
PKG_OUT ?= $(PCIFAB_CACHE)/packages
INSTALL_FILES = packaging/install-files.sh

.PHONY: install install-build install-tools install-module uninstall deb check-packages \
	check-systemd check-redfish

# The static tools and what pcifab-gen makes; no `make deps` (an installing machine needs
# only cargo with the musl target).
install-build:
	$(CARGO) build -q --release $(TOOLS) --target $(MUSL) -p pcifab -p pcifab-manager
	$(CARGO) build -q --release $(TOOLS) -p pcifab --bin pcifab-gen
	$(HOST_BIN)/pcifab-gen $(GEN_DIR)

install-tools: install-build
	DESTDIR="$(DESTDIR)" BINDIR="$(BINDIR)" MANDIR="$(MANDIR)" DOCDIR="$(DOCDIR)" \
	UDEVRULESDIR="$(UDEVRULESDIR)" MODPROBEDIR="$(MODPROBEDIR)" SYSUSERSDIR="$(SYSUSERSDIR)" \
	UNITDIR="$(UNITDIR)" PREFIX="$(PREFIX)" MUSL_BIN="$(MUSL_BIN)" GEN_DIR="$(GEN_DIR)" \
		$(INSTALL_FILES) install

install-module:
	@[ -f src/pcifab.ko ] || { echo "no src/pcifab.ko: run make (KDIR=...) first"; exit 1; }
	@[ -n "$(KRELEASE)" ] || { echo "no kernel release in $(KDIR)/include/config/kernel.release"; exit 1; }
	install -D -m 0644 src/pcifab.ko $(DESTDIR)/lib/modules/$(KRELEASE)/extra/pcifab.ko
	$(if $(DESTDIR),@echo "DESTDIR set: run depmod $(KRELEASE) on the target",depmod -a $(KRELEASE))

install: install-tools install-module

uninstall:
	DESTDIR="$(DESTDIR)" BINDIR="$(BINDIR)" MANDIR="$(MANDIR)" DOCDIR="$(DOCDIR)" \
	UDEVRULESDIR="$(UDEVRULESDIR)" MODPROBEDIR="$(MODPROBEDIR)" SYSUSERSDIR="$(SYSUSERSDIR)" \
	UNITDIR="$(UNITDIR)" PREFIX="$(PREFIX)" GEN_DIR="$(GEN_DIR)" $(INSTALL_FILES) uninstall
	rm -f $(DESTDIR)/lib/modules/$(KRELEASE)/extra/pcifab.ko
	$(if $(DESTDIR),,-depmod -a $(KRELEASE))

# pcifab-tools_<v>_amd64.deb, pcifab-manager_<v>_amd64.deb and pcifab-dkms_<v>_all.deb into
# $(PKG_OUT) (Documentation/install.rst).
deb: install-build
	MUSL_BIN="$(MUSL_BIN)" GEN_DIR="$(GEN_DIR)" packaging/build-deb.sh $(PKG_OUT)

# lintian on the packages, then installs and purges them in a copy of the guests' trixie tree
# (never the tree itself), checking the files land and go.
check-packages: deb
	packaging/check-packages.sh $(PKG_OUT)

# systemd-analyze verify of the unit, in the same copy (systemd installed there, not here).
check-systemd:
	packaging/check-systemd.sh

# DMTF's Redfish Protocol Validator and sushy against the manager's Redfish service
# (a manager on loopback with the simulated executor; Documentation/manager-api.rst).
check-redfish:
	$(CARGO) build -q --release $(TOOLS) -p pcifab-manager
	PCIFAB_MANAGER_BIN=$(HOST_BIN)/pcifab-manager tools/scripts/redfish-check.sh

# The manager's high availability on etcd (Documentation/manager.rst, "High
# availability"): Debian's etcd fetched into the cache if missing, then the ignored tests of
# tests/ha.rs (a 3-member cluster on loopback, real managers; one at a time, they use fixed
# loopback ports). `bench NAME VALUE` lines: `make bench-ha`.
check-ha:
	PCIFAB_ETCD=$$(tools/scripts/etcd.sh) $(CARGO) test -q $(TOOLS) -p pcifab-manager --test ha \
		-- --ignored --test-threads 1 --nocapture

bench-ha:
	PCIFAB_ETCD=$$(tools/scripts/etcd.sh) $(CARGO) test -q --release $(TOOLS) -p pcifab-manager \
		--test ha_bench -- --ignored --test-threads 1 --nocapture

.PHONY: check-ha bench-ha

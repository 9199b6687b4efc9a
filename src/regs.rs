// SPDX-License-Identifier: GPL-2.0-only

//! The management endpoint's BAR0 register map: the Switchtec Gen4 global address space.
//!
//! Only this file knows offsets. Layout as in `include/linux/switchtec.h`: MRPC at 0x0, system
//! information at 0x2000, per-partition configuration at 0x4000 (one 0x400 block per
//! partition), NTB information at 0x10000, PFF CSRs at 0x134000.

use kernel::{io::register, num::Bounded, prelude::*};

/// Size of the BAR0 mapping the driver requires (the emulated and real parts expose 4 MiB).
pub(crate) const GAS_SIZE: usize = 0x40_0000;

/// Number of partitions (host virtual switches) a Gen4 part supports.
pub(crate) const MAX_PARTITIONS: usize = 48;

/// Offset of the Gen4 system-information block.
const SYS_INFO: usize = 0x2000;
/// Offset of the Gen4-specific part of the system-information block.
const SYS_INFO_GEN4: usize = SYS_INFO + 0xc;

/// Vendor id string in the system-information block (8 bytes, not NUL-terminated).
pub(crate) const SYS_VENDOR_ID: usize = SYS_INFO_GEN4 + 304;
/// Length of [`SYS_VENDOR_ID`].
pub(crate) const SYS_VENDOR_ID_LEN: usize = 8;
/// Product id string (24 bytes).
pub(crate) const SYS_PRODUCT_ID: usize = SYS_INFO_GEN4 + 312;
/// Length of [`SYS_PRODUCT_ID`].
pub(crate) const SYS_PRODUCT_ID_LEN: usize = 24;
/// Product revision string (2 bytes).
pub(crate) const SYS_PRODUCT_REV: usize = SYS_INFO_GEN4 + 336;
/// Length of [`SYS_PRODUCT_REV`].
pub(crate) const SYS_PRODUCT_REV_LEN: usize = 2;

/// Size of the MRPC input and output buffers.
pub(crate) const MRPC_PAYLOAD: usize = 1024;

/// The states of `MRPC_STATUS` the driver acts on (switchtec's `SWITCHTEC_MRPC_STATUS_*`).
/// Any other value ends the command: done (2), error (0xff) or a value only the firmware
/// knows, which the caller gets as it is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u32)]
pub(crate) enum MrpcState {
    /// The firmware is running the command.
    InProgress = 1,
    /// The command was interrupted (e.g. by a firmware reset).
    Interrupted = 0x100,
}

impl MrpcState {
    /// The state a raw status value means, if the driver acts on it.
    pub(crate) fn of(raw: u32) -> Option<Self> {
        match raw {
            1 => Some(Self::InProgress),
            0x100 => Some(Self::Interrupted),
            _ => None,
        }
    }
}

impl TryFrom<Bounded<u32, 32>> for MrpcState {
    type Error = Error;

    fn try_from(raw: Bounded<u32, 32>) -> Result<Self> {
        Self::of(raw.get()).ok_or(EINVAL)
    }
}

impl From<MrpcState> for Bounded<u32, 32> {
    fn from(state: MrpcState) -> Self {
        Bounded::from(state as u32)
    }
}

register! {
    /// MRPC input buffer, in 32-bit words.
    pub(crate) MRPC_INPUT(u32)[256] @ 0x0 {
        31:0 value;
    }

    /// MRPC output buffer, in 32-bit words.
    pub(crate) MRPC_OUTPUT(u32)[256] @ 0x400 {
        31:0 value;
    }

    /// Writing a command id starts the command whose input is in [`MRPC_INPUT`].
    pub(crate) MRPC_CMD(u32) @ 0x800 {
        31:0 value;
    }

    /// State of the current command.
    pub(crate) MRPC_STATUS(u32) @ 0x804 {
        /// The raw status, which a finished command's caller gets.
        31:0 value;
        /// The same bits as a state the driver acts on.
        31:0 state ?=> MrpcState;
    }

    /// Return code of the last command.
    pub(crate) MRPC_RET_VALUE(u32) @ 0x808 {
        31:0 value;
    }

    /// DMA MRPC: write status and output to the host buffer at [`MRPC_DMA_ADDR_LO`].
    pub(crate) MRPC_DMA_EN(u32) @ 0x80c {
        0:0 enabled => bool;
    }

    /// DMA MRPC: bus address of the host buffer, low half.
    pub(crate) MRPC_DMA_ADDR_LO(u32) @ 0x810 {
        31:0 value;
    }

    /// DMA MRPC: bus address of the host buffer, high half.
    pub(crate) MRPC_DMA_ADDR_HI(u32) @ 0x814 {
        31:0 value;
    }

    /// DMA MRPC: the MSI-X vector the firmware raises when it wrote a completion.
    pub(crate) MRPC_DMA_VECTOR(u32) @ 0x818 {
        15:0 vector;
    }

    /// DMA MRPC: non-zero when the firmware offers it.
    pub(crate) MRPC_DMA_VER(u32) @ 0x81c {
        31:0 version;
    }

    /// Fabric-manager (GFMS) event header (`sw_event.gfms_event_hdr`).
    pub(crate) SW_GFMS_EVENT_HDR(u32) @ 0x1968 {
        /// The event occurred (write 1 to clear).
        0:0 occurred => bool;
        /// Raise the event interrupt when the event occurs.
        3:3 irq_enable => bool;
    }

    /// PFF instance of this partition's upstream port (`part_cfg.usp_pff_inst_id`).
    pub(crate) PART_USP_PFF(u32)[48, stride = 0x400] @ 0x4010 {
        31:0 pff;
    }

    /// PFF instances of the partition's downstream ports (`part_cfg.dsp_pff_inst_id[47]`),
    /// indexed by [`dsp_pff_index`].
    pub(crate) PART_DSP_PFF(u32)[48 * 0x100] @ 0x4018 {
        31:0 pff;
    }

    /// Link-state event header of each PFF (`pff_csr[n].link_state_hdr`).
    pub(crate) PFF_LINK_STATE_HDR(u32)[255, stride = 0x1000] @ 0x134d30 {
        /// The event occurred (write 1 to clear).
        0:0 occurred => bool;
        /// Raise the event interrupt when the event occurs.
        3:3 irq_enable => bool;
    }

    /// MSI-X vector of this partition's events (`part_cfg.vep_vector_number`).
    pub(crate) PART_VEP_VECTOR(u16)[48, stride = 0x400] @ 0x4100 {
        15:0 vector;
    }

    /// Which event groups of this partition have occurred (`part_cfg.part_event_summary`).
    pub(crate) PART_EVENT_SUMMARY(u32)[48, stride = 0x400] @ 0x4114 {
        31:0 bits;
    }

    /// MRPC completion event header (`part_cfg.mrpc_comp_hdr`).
    pub(crate) PART_MRPC_COMP_HDR(u32)[48, stride = 0x400] @ 0x413c {
        /// The event occurred (write 1 to clear).
        0:0 occurred => bool;
        /// Raise the event interrupt when the event occurs.
        3:3 irq_enable => bool;
    }

    /// Switch device id (equals the MEP's PCI device id while the firmware runs).
    pub(crate) SYS_DEVICE_ID(u32) @ 0x2000 {
        31:0 value;
    }

    /// Switch device version.
    pub(crate) SYS_DEVICE_VERSION(u32) @ 0x2004 {
        31:0 value;
    }

    /// Running firmware version.
    pub(crate) SYS_FW_VERSION(u32) @ 0x2008 {
        31:0 value;
    }

    /// Partition of the host reading it (Gen4 layout: `sys_info.gen4.partition_id`).
    pub(crate) SYS_PARTITION_ID(u32) @ 0x2048 {
        7:0 partition;
    }

    /// Number of partitions of the switch (`ntb_info.partition_count`).
    pub(crate) NTB_PARTITION_COUNT(u8) @ 0x10000 {
        7:0 count;
    }

    /// Bytes of the system-information strings, read one at a time.
    pub(crate) SYS_INFO_BYTE(u8)[0x200] @ 0x2000 {
        7:0 value;
    }

    /// P2P DMA engine control (pcifab extension, `Documentation/mrpc.rst`).
    pub(crate) DMA_CTRL(u32) @ 0x3000 {
        /// Run the engine.
        0:0 enable => bool;
        /// Stop the engine and zero its indices.
        1:1 reset => bool;
    }

    /// P2P DMA engine status.
    pub(crate) DMA_STATUS(u32) @ 0x3004 {
        /// The engine is working on a descriptor.
        0:0 busy => bool;
        /// The engine stopped on a ring it could not read or write.
        1:1 halted => bool;
    }

    /// Descriptor ring bus address, low half.
    pub(crate) DMA_RING_LO(u32) @ 0x3008 {
        31:0 value;
    }

    /// Descriptor ring bus address, high half.
    pub(crate) DMA_RING_HI(u32) @ 0x300c {
        31:0 value;
    }

    /// Descriptor ring entries, a power of two.
    pub(crate) DMA_RING_SIZE(u32) @ 0x3010 {
        31:0 value;
    }

    /// Producer index: writing it hands descriptors to the engine.
    pub(crate) DMA_TAIL(u32) @ 0x3014 {
        31:0 value;
    }

    /// Consumer index: the next descriptor the engine completes.
    pub(crate) DMA_HEAD(u32) @ 0x3018 {
        31:0 value;
    }

    /// Completion interrupt.
    pub(crate) DMA_IRQ(u32) @ 0x301c {
        /// The MSI-X vector to signal.
        15:0 vector;
        /// Signal it.
        31:31 enable => bool;
    }

    /// P2P events, write 1 to clear.
    pub(crate) P2P_EVENT_STATUS(u32) @ 0x3020 {
        /// A descriptor that asked for an interrupt completed.
        0:0 dma_done => bool;
        /// The engine halted.
        1:1 dma_error => bool;
        /// A window access outside every route was refused.
        2:2 fault => bool;
        /// The firmware removed a route (its target was unbound).
        3:3 routes_changed => bool;
    }

    /// Window accesses refused since reset.
    pub(crate) P2P_FAULT_COUNT(u32) @ 0x3024 {
        31:0 value;
    }

    /// Window offset of the last refused access, low half.
    pub(crate) P2P_FAULT_ADDR_LO(u32) @ 0x3028 {
        31:0 value;
    }

    /// Window offset of the last refused access, high half.
    pub(crate) P2P_FAULT_ADDR_HI(u32) @ 0x302c {
        31:0 value;
    }

    /// Descriptors completed since reset.
    pub(crate) DMA_COMPLETED(u32) @ 0x3030 {
        31:0 value;
    }

    /// P2P capabilities: version, window and engine present, window size in MiB.
    pub(crate) P2P_CAPS(u32) @ 0x3034 {
        7:0 version;
        8:8 window => bool;
        9:9 engine => bool;
        31:16 window_mib;
    }
}

impl P2P_EVENT_STATUS {
    /// Every event this driver knows, set: what clears them all.
    pub(crate) fn all() -> Self {
        pin_init::zeroed::<Self>()
            .with_dma_done(true)
            .with_dma_error(true)
            .with_fault(true)
            .with_routes_changed(true)
    }

    /// Whether any event is set, known to this driver or not.
    pub(crate) fn any(self) -> bool {
        self.into_raw() != 0
    }
}

/// Downstream ports of a partition pcifab watches (the virtual switch's logical ports).
pub(crate) const DSP_PORTS: usize = 4;

/// Index into [`PART_DSP_PFF`] of downstream port `port` of `partition`.
pub(crate) const fn dsp_pff_index(partition: usize, port: usize) -> usize {
    partition * 0x100 + port
}

/// Absolute offset of `SYS_INFO_BYTE` index for an offset inside the GAS.
pub(crate) const fn sys_info_index(gas_offset: usize) -> usize {
    gas_offset - SYS_INFO
}

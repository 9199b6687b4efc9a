// SPDX-License-Identifier: GPL-2.0-only

//! The DMA endpoint's BAR0 register map and its queue entries.
//!
//! Only this file knows the endpoint's offsets. Layout as the public sources define it (Linux's
//! `drivers/dma/switchtec_dma.c`, `Documentation/emulator.rst`, "The DMA endpoint"): version
//! and capability registers at the start, per channel the hardware registers in 4 KiB strides
//! from 0x1000 and the firmware registers in 0x80 strides from 0x160000.

use kernel::io::register;

/// Size of the BAR0 mapping the driver requires (the endpoint's registers end below 0x166000;
/// the parts and the emulator expose 2 MiB).
pub(crate) const BAR0_SIZE: usize = 0x20_0000;

/// Channels the register map has room for (the hardware strides from 0x1000 and 0x160000).
pub(crate) const MAX_CHANNELS: usize = 32;

/// Largest byte count of one submission entry.
pub(crate) const SE_MAX_BYTES: u32 = 1 << 20;

/// Submission entry opcode: copy within the host's memory (basic mode).
pub(crate) const OPC_MEMCPY: u8 = 0;

/// Submission entry control: fabric mode (DFM), the DFIDs name whose memory is read and
/// written.
pub(crate) const SE_DFM: u8 = 1 << 5;

/// Fabric command status: done.
pub(crate) const CMD_STATUS_DONE: u32 = 2;
/// Fabric command status: the firmware refused the command.
pub(crate) const CMD_STATUS_ERROR: u32 = 0xff;
/// Bytes of a fabric command's input and of its reply at most.
pub(crate) const CMD_DATA: usize = 1024;

/// Fabric commands (Microchip's `switchtec_fabric_dma.h`, `Documentation/emulator.rst`).
pub(crate) const CMD_REGISTER_BUF: u32 = 2;
pub(crate) const CMD_UNREGISTER_BUF: u32 = 3;
pub(crate) const CMD_GET_BUF_LIST: u32 = 4;
pub(crate) const CMD_GET_OWN_BUF_LIST: u32 = 5;

/// Buffers a host may register for one peer: the firmware's slots 0 to 5.
pub(crate) const BUFS_PER_PEER: u8 = 6;

register! {
    /// Firmware version.
    pub(crate) FW_VER(u32) @ 0x0 {
        31:0 value;
    }

    /// Version of the endpoint's queue protocol.
    pub(crate) DMA_PROT_VER(u32) @ 0x4 {
        31:0 value;
    }

    /// Number of channels.
    pub(crate) CHAN_CNT(u32) @ 0x84 {
        31:0 count;
    }

    /// Per channel: the host's consumer index of the completion queue.
    pub(crate) CHAN_CQ_HEAD(u16)[32, stride = 0x1000] @ 0x1000 {
        15:0 head;
    }

    /// Per channel: the host's producer index of the submission queue (its doorbell).
    pub(crate) CHAN_SQ_TAIL(u16)[32, stride = 0x1000] @ 0x1004 {
        15:0 tail;
    }

    /// Per channel: control.
    pub(crate) CHAN_CTRL(u32)[32, stride = 0x1000] @ 0x1008 {
        /// Fetch no more entries.
        0:0 pause => bool;
        /// Stop the channel.
        1:1 halt => bool;
        /// Put the channel's indices and phase back to their start.
        2:2 reset => bool;
        /// Pause the channel on an entry that fails.
        3:3 err_pause => bool;
    }

    /// Per channel: status.
    pub(crate) CHAN_STATUS(u32)[32, stride = 0x1000] @ 0x100c {
        /// The channel is paused.
        9:9 paused => bool;
        /// The channel is halted.
        10:10 halted => bool;
        /// Why the channel paused on an error (0: no error).
        29:13 errors;
    }

    /// Per channel: whether it exists, whether it is enabled, its SE buffers.
    pub(crate) CHAN_VALID_EN_SE(u32)[32, stride = 0x80] @ 0x160000 {
        /// The channel exists.
        0:0 valid => bool;
        /// The host enabled it.
        1:1 enable => bool;
        /// First SE buffer of the channel.
        10:2 se_base;
        /// SE buffers of the channel.
        20:12 se_count;
        /// The host's fetch threshold.
        31:23 se_thresh;
    }

    /// Per channel: completion queue bus address, low half.
    pub(crate) CHAN_CQ_BASE_LO(u32)[32, stride = 0x80] @ 0x160004 {
        31:0 value;
    }

    /// Per channel: completion queue bus address, high half.
    pub(crate) CHAN_CQ_BASE_HI(u32)[32, stride = 0x80] @ 0x160008 {
        31:0 value;
    }

    /// Per channel: completion queue size in entries.
    pub(crate) CHAN_CQ_SIZE(u16)[32, stride = 0x80] @ 0x16000c {
        15:0 entries;
    }

    /// Per channel: submission queue bus address, low half.
    pub(crate) CHAN_SQ_BASE_LO(u32)[32, stride = 0x80] @ 0x160010 {
        31:0 value;
    }

    /// Per channel: submission queue bus address, high half.
    pub(crate) CHAN_SQ_BASE_HI(u32)[32, stride = 0x80] @ 0x160014 {
        31:0 value;
    }

    /// Per channel: submission queue size in entries.
    pub(crate) CHAN_SQ_SIZE(u16)[32, stride = 0x80] @ 0x160018 {
        15:0 entries;
    }

    /// Fabric mode: the command's input, 1 KiB.
    pub(crate) FAB_CMD_INPUT(u32)[256, stride = 4] @ 0x164000 {
        31:0 value;
    }

    /// Fabric mode: writing the command (a u16, written with a 32-bit write) runs it.
    pub(crate) FAB_CMD(u32) @ 0x164800 {
        31:0 value;
    }

    /// Fabric mode: bus address of the command output buffer, low half.
    pub(crate) FAB_CMD_ADDR_LO(u32) @ 0x165004 {
        31:0 value;
    }

    /// Fabric mode: bus address of the command output buffer, high half.
    pub(crate) FAB_CMD_ADDR_HI(u32) @ 0x165008 {
        31:0 value;
    }

    /// Fabric mode: bit 0 turns the event queue on.
    pub(crate) FAB_EVENT_ENABLE(u32) @ 0x165020 {
        31:0 value;
    }

    /// Fabric mode: this host's HFID.
    pub(crate) FAB_LOCAL_HFID(u32) @ 0x165024 {
        15:0 hfid;
    }
}

crate::payload::payload! {
    /// A submission entry, as the endpoint reads it from host memory.
    pub(crate) struct Se[32] {
        pub(crate) opc: u8,
        /// Bit 5: fabric mode (DFM); bit 6: interrupt on completion (LIOF).
        pub(crate) ctrl: u8,
        pub(crate) tlp: u16,
        pub(crate) rsvd1: u16,
        pub(crate) cid: u16,
        pub(crate) byte_cnt: u32,
        pub(crate) saddr_lo: u32,
        pub(crate) saddr_hi: u32,
        pub(crate) daddr_lo: u32,
        pub(crate) daddr_hi: u32,
        /// Destination and source DMA FIDs (fabric mode only).
        pub(crate) dfid: u16,
        pub(crate) sfid: u16,
    }

    /// A completion entry, as the endpoint writes it to host memory: device input.
    pub(crate) struct Ce[32] {
        pub(crate) rdimm0: u32,
        pub(crate) rdimm1: u32,
        pub(crate) rsvd1: u32,
        pub(crate) byte_cnt: u32,
        pub(crate) sq_head: u16,
        pub(crate) rsvd2: u16,
        pub(crate) rsvd3: u32,
        pub(crate) status: u32,
        pub(crate) cid: u16,
        pub(crate) phase: u16,
    }
}

crate::payload::payload! {
    /// The fabric command output buffer, written by the firmware: device input. The status
    /// is written last.
    pub(crate) struct CmdOut[1040] {
        pub(crate) status: u32,
        pub(crate) cmd: u32,
        pub(crate) ret: u32,
        pub(crate) size: u32,
        pub(crate) data: [u32; 256],
    }

    /// `REGISTER_BUF` input.
    pub(crate) struct RegisterIn[20] {
        pub(crate) peer: u16,
        pub(crate) index: u8,
        pub(crate) rsvd: u8,
        pub(crate) addr_lo: u32,
        pub(crate) addr_hi: u32,
        pub(crate) size_lo: u32,
        pub(crate) size_hi: u32,
    }

    /// `REGISTER_BUF` reply.
    pub(crate) struct RegisterOut[4] {
        pub(crate) index: u8,
        pub(crate) rsvd: u8,
        pub(crate) rhi_vec: u16,
    }

    /// `UNREGISTER_BUF` input (no reply).
    pub(crate) struct UnregisterIn[4] {
        pub(crate) peer: u16,
        pub(crate) index: u8,
        pub(crate) rsvd: u8,
    }

    /// `GET_BUF_LIST` input: the owner whose buffers for this host are listed.
    pub(crate) struct BufListIn[4] {
        pub(crate) owner: u16,
        pub(crate) rsvd: u16,
    }

    /// `GET_BUF_LIST` reply header; `count` entries follow.
    pub(crate) struct BufListHead[8] {
        pub(crate) count: u8,
        pub(crate) rsvd: [u8; 7],
    }

    /// `GET_OWN_BUF_LIST` input: the first entry wanted.
    pub(crate) struct OwnListIn[4] {
        pub(crate) start: u16,
        pub(crate) rsvd: u16,
    }

    /// `GET_OWN_BUF_LIST` reply header; `count` entries follow.
    pub(crate) struct OwnListHead[8] {
        pub(crate) total: u16,
        pub(crate) start: u16,
        pub(crate) count: u8,
        pub(crate) rsvd: [u8; 3],
    }

    /// A buffer of a list reply: the owner (`GET_BUF_LIST`) or the peer (`GET_OWN_BUF_LIST`),
    /// the slot, the range in the owner's bus addresses and the DFIDs a copy goes through.
    pub(crate) struct BufEntry[32] {
        pub(crate) hfid: u16,
        pub(crate) index: u8,
        pub(crate) rsvd: u8,
        pub(crate) addr_lo: u32,
        pub(crate) addr_hi: u32,
        pub(crate) size_lo: u32,
        pub(crate) size_hi: u32,
        pub(crate) rhi: u16,
        pub(crate) rsvd2: u16,
        pub(crate) local_dfid: u16,
        pub(crate) remote_dfid: u16,
        pub(crate) local_rhi_dfid: u16,
        pub(crate) remote_rhi_dfid: u16,
    }
}

// SPDX-License-Identifier: GPL-2.0-only
//! Layout of the Switchtec Gen4 Global Address Space (GAS) served in BAR0.
//!
//! Offsets follow the packed structs of the kernel's `include/linux/switchtec.h`;
//! the tests check each one against that header when it is available.
//! The table is complete for the registers named; not all are modelled.
#![allow(dead_code)]

/// BAR0 size: the whole GAS.
pub const GAS_SIZE: u64 = 0x40_0000;

// Top-level blocks (enum in switchtec.h).
pub const MRPC: u64 = 0x0000;
pub const TOP_CFG: u64 = 0x1000;
pub const SW_EVENT: u64 = 0x1800;
pub const SYS_INFO: u64 = 0x2000;
pub const FLASH_INFO: u64 = 0x2200;
/// pcifab: the P2P / DMA engine registers (Documentation/mrpc.rst).
pub const P2P: u64 = 0x3000;
pub const PART_CFG: u64 = 0x4000;
pub const NTB: u64 = 0x1_0000;
pub const PFF_CSR: u64 = 0x13_4000;

// struct mrpc_regs.
pub const MRPC_PAYLOAD_SIZE: u64 = 1024;
pub const MRPC_INPUT_DATA: u64 = MRPC;
pub const MRPC_OUTPUT_DATA: u64 = MRPC + 0x400;
pub const MRPC_CMD: u64 = MRPC + 0x800;
pub const MRPC_STATUS: u64 = MRPC + 0x804;
pub const MRPC_RET_VALUE: u64 = MRPC + 0x808;
pub const MRPC_DMA_EN: u64 = MRPC + 0x80c;
pub const MRPC_DMA_ADDR: u64 = MRPC + 0x810;
pub const MRPC_DMA_VECTOR: u64 = MRPC + 0x818;
pub const MRPC_DMA_VER: u64 = MRPC + 0x81c;

/// DMA MRPC: the version in dma_ver, the MSI-X vector in dma_vector, the
/// enable bit of dma_en (Linux's switchtec.h).
pub const DMA_MRPC_VER: u32 = 1;
pub const DMA_MRPC_VECTOR: u32 = 1;
pub const DMA_MRPC_EN: u32 = 1;
/// Size of Linux's `struct dma_mrpc_output`: status, cmd_id, rtn_code,
/// output_size, then the 1024 data bytes.
pub const DMA_MRPC_OUTPUT_SIZE: usize = 16 + MRPC_PAYLOAD_SIZE as usize;

// enum mrpc_status.
pub const MRPC_STATUS_INPROGRESS: u32 = 1;
pub const MRPC_STATUS_DONE: u32 = 2;
pub const MRPC_STATUS_ERROR: u32 = 0xff;
/// The firmware dropped the command (reset, recovery); `switchtec.h` SWITCHTEC_MRPC_STATUS_INTERRUPTED.
pub const MRPC_STATUS_INTERRUPTED: u32 = 0x100;

// struct sw_event_regs: 14 event headers, 0x18 apart, from stack_error_event_hdr
// to gfms_event_hdr.
pub const SW_EVENT_HDR_FIRST: u64 = 0x30;
pub const SW_EVENT_HDR_COUNT: u64 = 14;
pub const EVENT_HDR_STRIDE: u64 = 0x18;
pub const SW_PART_EVENT_BITMAP: u64 = 0x10;
pub const SW_GLOBAL_SUMMARY: u64 = 0x20;
/// gfms_event_hdr, the last sw_event header, and its data word.
pub const SW_GFMS_EVENT_HDR: u64 = 0x168;
pub const SW_GFMS_EVENT_DATA: u64 = 0x16c;
/// global_summary bit of gfms_event_hdr: its index among the headers.
pub const GLOBAL_EVENT_GFMS: u32 = 1 << 13;

// struct sys_info_regs, relative to SYS_INFO; the gen4 union member starts at 0x0c.
pub const SI_DEVICE_ID: u64 = 0x00;
pub const SI_DEVICE_VERSION: u64 = 0x04;
pub const SI_FIRMWARE_VERSION: u64 = 0x08;
pub const SI_GEN4: u64 = 0x0c;
pub const SI4_GAS_LAYOUT_VER: u64 = 0x0c;
pub const SI4_MGMT_CMD_SET_VER: u64 = 0x10;
pub const SI4_FABRIC_CMD_SET_VER: u64 = 0x12;
pub const SI4_PARTITION_ID: u64 = 0x48;
pub const SI4_BL2_RUNNING: u64 = 0x4c;
pub const SI4_CFG_RUNNING: u64 = 0x4e;
pub const SI4_IMG_RUNNING: u64 = 0x50;
pub const SI4_KEY_RUNNING: u64 = 0x52;
pub const SI4_P2P_VENDOR_ID: u64 = 0x110;
pub const SI4_P2P_DEVICE_ID: u64 = 0x112;
pub const SI4_P2P_REVISION_ID: u64 = 0x114;
pub const SI4_P2P_CLASS_ID: u64 = 0x118;
pub const SI4_SUBSYSTEM_VENDOR_ID: u64 = 0x11c;
pub const SI4_SUBSYSTEM_ID: u64 = 0x11e;
pub const SI4_VENDOR_ID: u64 = 0x13c;
pub const SI4_PRODUCT_ID: u64 = 0x144;
pub const SI4_PRODUCT_REVISION: u64 = 0x15c;
/// sizeof(struct sys_info_regs) with the gen4 member.
pub const SYS_INFO_SIZE_GEN4: u64 = 0x160;

// SWITCHTEC_GEN4_*_RUNNING values: image 0 of everything runs.
pub const GEN4_BL2_0_RUNNING: u16 = 0x04;
pub const GEN4_CFG0_RUNNING: u16 = 0x06;
pub const GEN4_IMG0_RUNNING: u16 = 0x08;
pub const GEN4_KEY0_RUNNING: u16 = 0x02;

// struct part_cfg_regs, relative to its partition's block.
pub const PART_CFG_SIZE: u64 = 0x400;
pub const PC_STATUS: u64 = 0x000;
pub const PC_STATE: u64 = 0x004;
pub const PC_PORT_CNT: u64 = 0x008;
pub const PC_USP_PORT_MODE: u64 = 0x00c;
pub const PC_USP_PFF_INST_ID: u64 = 0x010;
pub const PC_VEP_PFF_INST_ID: u64 = 0x014;
pub const PC_DSP_PFF_INST_ID: u64 = 0x018;
pub const PC_DSP_PFF_COUNT: u64 = 47;
pub const PC_VEP_VECTOR_NUMBER: u64 = 0x100;
pub const PC_USP_VECTOR_NUMBER: u64 = 0x102;
pub const PC_PORT_EVENT_BITMAP: u64 = 0x104;
pub const PC_PART_EVENT_SUMMARY: u64 = 0x114;
pub const PC_PART_RESET_HDR: u64 = 0x124;
pub const PC_MRPC_COMP_HDR: u64 = 0x13c;
pub const PC_MRPC_COMP_ASYNC_HDR: u64 = 0x154;
pub const PC_DYN_BINDING_HDR: u64 = 0x16c;
pub const PC_INTERCOMM_NOTIFY_HDR: u64 = 0x184;
/// Event headers of a partition, in part_event_summary bit order.
pub const PC_EVENT_HDRS: [u64; 5] = [
    PC_PART_RESET_HDR,
    PC_MRPC_COMP_HDR,
    PC_MRPC_COMP_ASYNC_HDR,
    PC_DYN_BINDING_HDR,
    PC_INTERCOMM_NOTIFY_HDR,
];
/// Most partitions the part_cfg array holds.
pub const MAX_PARTITIONS: u64 = 48;

// SWITCHTEC_PART_CFG_EVENT_*.
pub const PART_EVENT_MRPC_CMP: u32 = 1 << 1;

// struct ntb_info_regs, relative to NTB.
pub const NTB_PARTITION_COUNT: u64 = 0x0;
pub const NTB_PARTITION_ID: u64 = 0x1;

// struct pff_csr_regs, relative to its PFF's block.
pub const PFF_CSR_SIZE: u64 = 0x1000;
pub const PFF_VENDOR_ID: u64 = 0x0;
pub const PFF_DEVICE_ID: u64 = 0x2;
pub const PFF_CLASS: u64 = 0x8;
pub const PFF_EVENT_SUMMARY: u64 = 0xc00;
/// pff_event_summary bit of link_state_hdr: its index among the headers.
pub const PFF_EVENT_LINK_STATE: u32 = 1 << 12;
/// aer_in_p2p_hdr: first of 13 event headers, 0x18 apart, up to link_state_hdr.
pub const PFF_EVENT_HDR_FIRST: u64 = 0xc10;
pub const PFF_EVENT_HDR_COUNT: u64 = 13;
pub const PFF_LINK_STATE_HDR: u64 = 0xd30;

// Event header bits (SWITCHTEC_EVENT_*).
pub const EVENT_OCCURRED: u32 = 1 << 0;
pub const EVENT_CLEAR: u32 = 1 << 0;
pub const EVENT_EN_IRQ: u32 = 1 << 3;
/// EN_LOG, EN_CLI, EN_IRQ and FATAL: the bits a host may set or clear.
pub const EVENT_WRITABLE: u32 = 0x1e;
pub const EVENT_COUNT_SHIFT: u32 = 5;
pub const EVENT_COUNT_MASK: u32 = 0xff << EVENT_COUNT_SHIFT;

// P2P / DMA engine registers, relative to P2P.
pub const DMA_CTRL: u64 = 0x00;
pub const DMA_STATUS: u64 = 0x04;
pub const DMA_RING_LO: u64 = 0x08;
pub const DMA_RING_HI: u64 = 0x0c;
pub const DMA_RING_SIZE: u64 = 0x10;
pub const DMA_TAIL: u64 = 0x14;
pub const DMA_HEAD: u64 = 0x18;
pub const DMA_IRQ: u64 = 0x1c;
pub const P2P_EVENT_STATUS: u64 = 0x20;
pub const P2P_FAULT_COUNT: u64 = 0x24;
pub const P2P_FAULT_ADDR_LO: u64 = 0x28;
pub const P2P_FAULT_ADDR_HI: u64 = 0x2c;
pub const DMA_COMPLETED: u64 = 0x30;
pub const P2P_CAPS: u64 = 0x34;
/// Size of the register block.
pub const P2P_SIZE: u64 = 0x38;

pub const DMA_CTRL_ENABLE: u32 = 1 << 0;
pub const DMA_CTRL_RESET: u32 = 1 << 1;
pub const DMA_STATUS_BUSY: u32 = 1 << 0;
pub const DMA_STATUS_HALTED: u32 = 1 << 1;
pub const DMA_IRQ_ENABLE: u32 = 1 << 31;
pub const EV_DMA_DONE: u32 = 1 << 0;
pub const EV_DMA_ERROR: u32 = 1 << 1;
pub const EV_P2P_FAULT: u32 = 1 << 2;
pub const EV_ROUTES_CHANGED: u32 = 1 << 3;
pub const EV_ALL: u32 = 0xf;
/// P2P_CAPS: version 1, window, DMA engine; the window size goes in 16-31.
pub const P2P_CAPS_BITS: u32 = 1 | 1 << 8 | 1 << 9;

/// PFF function instances per partition: USP, VEP and four DSPs.
pub const PFFS_PER_PARTITION: u32 = 6;
/// Ports per partition reported in port_cnt: the USP and four DSPs.
pub const PORTS_PER_PARTITION: u32 = 5;
pub const DSPS_PER_PARTITION: u32 = 4;
/// dsp_pff_inst_id value for a port that does not exist.
pub const PFF_NONE: u32 = 0xffff_ffff;

// The blocks do not overlap and all fit in BAR0.
const _: () = {
    assert!(MRPC_DMA_VER + 4 <= TOP_CFG);
    assert!(SYS_INFO + SYS_INFO_SIZE_GEN4 <= FLASH_INFO);
    assert!(FLASH_INFO < P2P && P2P + P2P_SIZE <= PART_CFG);
    assert!(P2P_CAPS + 4 == P2P_SIZE);
    assert!(PART_CFG + MAX_PARTITIONS * PART_CFG_SIZE == NTB);
    assert!(PFF_CSR + MAX_PARTITIONS * PFFS_PER_PARTITION as u64 * PFF_CSR_SIZE <= GAS_SIZE);
    assert!(PFF_LINK_STATE_HDR == PFF_EVENT_HDR_FIRST + 12 * EVENT_HDR_STRIDE);
    assert!(SW_GFMS_EVENT_HDR == SW_EVENT_HDR_FIRST + 13 * EVENT_HDR_STRIDE);
};

#[cfg(test)]
mod tests {
    use super::*;

    /// A field of a packed C struct: name, offset, size.
    type Field = (String, u64, u64);

    /// Lays out `struct NAME { ... } __packed;` from switchtec.h. Handles plain
    /// scalar and array members, anonymous unions and `struct X y;` members;
    /// stops (returning what it has) at a nested struct definition.
    fn layout(src: &str, name: &str) -> (Vec<Field>, u64) {
        let start = src
            .find(&format!("struct {name} {{"))
            .unwrap_or_else(|| panic!("struct {name} not in header"));
        let mut fields = Vec::new();
        let mut off = 0;
        let mut union: Option<(u64, u64)> = None;
        for raw in src[start..].lines().skip(1) {
            let line = raw.split("/*").next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            if line.starts_with('}') {
                match union.take() {
                    Some((base, max)) => off = base + max,
                    None => return (fields, off),
                }
                continue;
            }
            if line == "union {" {
                union = Some((off, 0));
                continue;
            }
            if line.ends_with('{') {
                return (fields, off);
            }
            let decl = line.trim_end_matches(';');
            let mut words: Vec<&str> = decl.split_whitespace().collect();
            let member = words.pop().expect("member name");
            let ty = words.join(" ");
            let (member, count) = match member.split_once('[') {
                Some((m, n)) => {
                    let n = n.trim_end_matches(']');
                    let n = match n {
                        "SWITCHTEC_MRPC_PAYLOAD_SIZE" => 1024,
                        _ => n.parse().unwrap_or_else(|_| panic!("array size {n}")),
                    };
                    (m, n)
                }
                None => (member, 1),
            };
            let elem = match ty.as_str() {
                "u8" | "char" | "unsigned char" => 1,
                "u16" => 2,
                "u32" => 4,
                "u64" => 8,
                t => match t.strip_prefix("struct ") {
                    Some(inner) => layout(src, inner).1,
                    None => panic!("unknown type {t} in {name}"),
                },
            };
            let size = elem * count;
            match union.as_mut() {
                Some((base, max)) => {
                    fields.push((member.to_owned(), *base, size));
                    *max = (*max).max(size);
                }
                None => {
                    fields.push((member.to_owned(), off, size));
                    off += size;
                }
            }
        }
        panic!("struct {name} has no end");
    }

    fn offset(fields: &[Field], name: &str) -> u64 {
        fields
            .iter()
            .find(|f| f.0 == name)
            .map(|f| f.1)
            .unwrap_or_else(|| panic!("member {name} not found"))
    }

    /// Linux's `include/linux/switchtec.h`; a missing header fails the test (it would
    /// otherwise pass without comparing anything).
    fn header() -> String {
        let root = std::env::var("PCIFAB_LINUX_SRC")
            .unwrap_or_else(|_| "/var/cache/pcifab/linux-src".to_owned());
        let path = format!("{root}/include/linux/switchtec.h");
        std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "cannot read {path}: {e}; the GAS offsets are compared with Linux's header: \
                 run `make deps` (it unpacks the Linux source into /var/cache/pcifab) or set \
                 PCIFAB_LINUX_SRC to a Linux source tree"
            )
        })
    }

    #[test]
    fn offsets_match_kernel_header() {
        let h = header();

        let (mrpc, mrpc_size) = layout(&h, "mrpc_regs");
        assert_eq!(mrpc_size, 0x820);
        for (name, want) in [
            ("input_data", MRPC_INPUT_DATA),
            ("output_data", MRPC_OUTPUT_DATA),
            ("cmd", MRPC_CMD),
            ("status", MRPC_STATUS),
            ("ret_value", MRPC_RET_VALUE),
            ("dma_en", MRPC_DMA_EN),
            ("dma_addr", MRPC_DMA_ADDR),
            ("dma_vector", MRPC_DMA_VECTOR),
            ("dma_ver", MRPC_DMA_VER),
        ] {
            assert_eq!(offset(&mrpc, name), want, "mrpc_regs.{name}");
        }

        let (sw, sw_size) = layout(&h, "sw_event_regs");
        assert_eq!(offset(&sw, "part_event_bitmap"), SW_PART_EVENT_BITMAP);
        assert_eq!(offset(&sw, "global_summary"), SW_GLOBAL_SUMMARY);
        assert_eq!(offset(&sw, "gfms_event_hdr"), SW_GFMS_EVENT_HDR);
        assert_eq!(offset(&sw, "gfms_event_data"), SW_GFMS_EVENT_DATA);
        assert!(sw_size <= SYS_INFO - SW_EVENT);
        let hdrs: Vec<u64> = sw
            .iter()
            .filter(|f| f.0.ends_with("_hdr"))
            .map(|f| f.1)
            .collect();
        let want: Vec<u64> = (0..SW_EVENT_HDR_COUNT)
            .map(|i| SW_EVENT_HDR_FIRST + i * EVENT_HDR_STRIDE)
            .collect();
        assert_eq!(hdrs, want, "sw_event_regs headers");

        let (si, _) = layout(&h, "sys_info_regs");
        assert_eq!(offset(&si, "device_id"), SI_DEVICE_ID);
        assert_eq!(offset(&si, "device_version"), SI_DEVICE_VERSION);
        assert_eq!(offset(&si, "firmware_version"), SI_FIRMWARE_VERSION);
        assert_eq!(offset(&si, "gen4"), SI_GEN4);
        let (g4, g4_size) = layout(&h, "sys_info_regs_gen4");
        assert_eq!(SI_GEN4 + g4_size, SYS_INFO_SIZE_GEN4);
        for (name, want) in [
            ("gas_layout_ver", SI4_GAS_LAYOUT_VER),
            ("mgmt_cmd_set_ver", SI4_MGMT_CMD_SET_VER),
            ("fabric_cmd_set_ver", SI4_FABRIC_CMD_SET_VER),
            ("partition_id", SI4_PARTITION_ID),
            ("bl2_running", SI4_BL2_RUNNING),
            ("cfg_running", SI4_CFG_RUNNING),
            ("img_running", SI4_IMG_RUNNING),
            ("key_running", SI4_KEY_RUNNING),
            ("p2p_vendor_id", SI4_P2P_VENDOR_ID),
            ("p2p_device_id", SI4_P2P_DEVICE_ID),
            ("p2p_revision_id", SI4_P2P_REVISION_ID),
            ("p2p_class_id", SI4_P2P_CLASS_ID),
            ("subsystem_vendor_id", SI4_SUBSYSTEM_VENDOR_ID),
            ("subsystem_id", SI4_SUBSYSTEM_ID),
            ("vendor_id", SI4_VENDOR_ID),
            ("product_id", SI4_PRODUCT_ID),
            ("product_revision", SI4_PRODUCT_REVISION),
        ] {
            assert_eq!(SI_GEN4 + offset(&g4, name), want, "sys_info gen4.{name}");
        }

        let (pc, pc_size) = layout(&h, "part_cfg_regs");
        assert_eq!(pc_size, PART_CFG_SIZE);
        for (name, want) in [
            ("status", PC_STATUS),
            ("state", PC_STATE),
            ("port_cnt", PC_PORT_CNT),
            ("usp_port_mode", PC_USP_PORT_MODE),
            ("usp_pff_inst_id", PC_USP_PFF_INST_ID),
            ("vep_pff_inst_id", PC_VEP_PFF_INST_ID),
            ("dsp_pff_inst_id", PC_DSP_PFF_INST_ID),
            ("vep_vector_number", PC_VEP_VECTOR_NUMBER),
            ("usp_vector_number", PC_USP_VECTOR_NUMBER),
            ("part_event_summary", PC_PART_EVENT_SUMMARY),
            ("port_event_bitmap", PC_PORT_EVENT_BITMAP),
            ("part_reset_hdr", PC_PART_RESET_HDR),
            ("mrpc_comp_hdr", PC_MRPC_COMP_HDR),
            ("mrpc_comp_async_hdr", PC_MRPC_COMP_ASYNC_HDR),
            ("dyn_binding_hdr", PC_DYN_BINDING_HDR),
            ("intercomm_notify_hdr", PC_INTERCOMM_NOTIFY_HDR),
        ] {
            assert_eq!(offset(&pc, name), want, "part_cfg_regs.{name}");
        }
        let dsp = pc.iter().find(|f| f.0 == "dsp_pff_inst_id").map(|f| f.2);
        assert_eq!(dsp, Some(PC_DSP_PFF_COUNT * 4));

        let (ntb, _) = layout(&h, "ntb_info_regs");
        assert_eq!(offset(&ntb, "partition_count"), NTB_PARTITION_COUNT);
        assert_eq!(offset(&ntb, "partition_id"), NTB_PARTITION_ID);

        let (pff, pff_size) = layout(&h, "pff_csr_regs");
        assert_eq!(pff_size, PFF_CSR_SIZE);
        assert_eq!(offset(&pff, "vendor_id"), PFF_VENDOR_ID);
        assert_eq!(offset(&pff, "device_id"), PFF_DEVICE_ID);
        assert_eq!(offset(&pff, "pci_class"), PFF_CLASS);
        assert_eq!(offset(&pff, "link_state_hdr"), PFF_LINK_STATE_HDR);
        assert_eq!(offset(&pff, "pff_event_summary"), PFF_EVENT_SUMMARY);
        let hdrs: Vec<u64> = pff
            .iter()
            .filter(|f| f.0.ends_with("_hdr"))
            .map(|f| f.1)
            .collect();
        let want: Vec<u64> = (0..PFF_EVENT_HDR_COUNT)
            .map(|i| PFF_EVENT_HDR_FIRST + i * EVENT_HDR_STRIDE)
            .collect();
        assert_eq!(hdrs, want, "pff_csr_regs headers");
    }
}

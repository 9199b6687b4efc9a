// SPDX-License-Identifier: GPL-2.0-only
//! PCI Express configuration space of the MEP (function 0 of its own as far as
//! we know; QEMU decides where it sits and owns the multifunction bit).

use crate::config::Firmware;
use crate::gas::GAS_SIZE;

pub const CONFIG_SIZE: usize = 4096;
pub const VENDOR_MICROSEMI: u16 = 0x11f8;
/// Class 05 (memory controller), subclass 80 (other), prog-if 00.
pub const CLASS_MEMORY_OTHER: u32 = 0x05_8000;
/// Class 08 (system peripheral), subclass 80 (other): the switch's DMA endpoint.
pub const CLASS_SYSTEM_OTHER: u32 = 0x08_8000;

pub const BAR0_SIZE: u64 = GAS_SIZE;
pub const BAR4_SIZE: u64 = 0x4000;
pub const MSIX_VECTORS: u16 = 4;
pub const MSIX_TABLE_OFFSET: u32 = 0x0;
pub const MSIX_PBA_OFFSET: u32 = 0x800;
pub const MSIX_BAR: u32 = 4;

// Capability positions.
pub const CAP_PM: usize = 0x40;
pub const CAP_MSIX: usize = 0x50;
pub const CAP_EXP: usize = 0x70;

const BAR_MEM_64: u32 = 0x4;
const BAR_PREFETCH: u32 = 0x8;

/// Extended capability position of a PF's SR-IOV capability.
pub const CAP_SRIOV: usize = 0x100;
/// Endpoint functions: BAR0 size and the MSI-X table and PBA inside BAR0.
pub const FN_BAR0_SIZE: u64 = 0x4000;
/// Whether endpoint functions have MSI-X. Off: QEMU 11.1's vfio-user-pci
/// aborts on hot-unplug of a device with MSI-X (its finalize tears the
/// MSI-X table down after the BARs are gone: memory_region_del_subregion
/// assertion), which kills the whole host.
pub const FN_MSIX: bool = false;
/// MSI-X table and PBA of an endpoint function: in BAR4 (16 KiB).
pub const FN_MSIX_BAR: u32 = 4;
pub const FN_BAR4_SIZE: u64 = 0x4000;
pub const FN_MSIX_TABLE: u32 = 0x0;
pub const FN_MSIX_PBA: u32 = 0x800;

/// What an endpoint function's config space shows.
pub struct FunctionIds {
    pub vid: u16,
    pub did: u16,
    pub class: u32,
    pub total_vfs: u8,
    pub vf_did: u16,
    /// BAR2 size in bytes, a power of two, or 0 for none.
    pub mem_size: u64,
}

/// Config space contents plus, per byte, which bits the host may change.
pub struct ConfigSpace {
    data: [u8; CONFIG_SIZE],
    writable: [u8; CONFIG_SIZE],
}

impl ConfigSpace {
    /// Config space of the MEP; `window` is the size of its P2P window
    /// (BAR2) in bytes, a power of two.
    pub fn new(fw: &Firmware, window: u64) -> Self {
        let mut c = ConfigSpace {
            data: [0; CONFIG_SIZE],
            writable: [0; CONFIG_SIZE],
        };
        c.set16(0x00, VENDOR_MICROSEMI);
        c.set16(0x02, fw.device_id);
        c.set16(0x06, 0x0010); // status: capability list
        c.data[0x08] = fw.revision;
        c.set_bytes(0x09, &CLASS_MEMORY_OTHER.to_le_bytes()[..3]);
        c.data[0x0e] = 0x00; // header type 0; QEMU owns the multifunction bit
        c.set32(0x10, BAR_MEM_64); // BAR0+1: 64-bit memory, non-prefetchable
        c.set32(0x18, BAR_MEM_64 | BAR_PREFETCH); // BAR2+3: the P2P window
        c.set32(0x20, BAR_MEM_64); // BAR4+5: 64-bit memory, non-prefetchable
        c.set16(0x2c, VENDOR_MICROSEMI);
        c.set16(0x2e, fw.device_id);
        c.data[0x34] = CAP_PM as u8;
        c.data[0x3d] = 1; // INTA

        // Power management, version 3, No_Soft_Reset.
        c.data[CAP_PM] = 0x01;
        c.data[CAP_PM + 1] = CAP_MSIX as u8;
        c.set16(CAP_PM + 2, 0x0003);
        c.set16(CAP_PM + 4, 0x0008);

        // MSI-X: table and PBA in BAR4.
        c.data[CAP_MSIX] = 0x11;
        c.data[CAP_MSIX + 1] = CAP_EXP as u8;
        c.set16(CAP_MSIX + 2, MSIX_VECTORS - 1);
        c.set32(CAP_MSIX + 4, MSIX_TABLE_OFFSET | MSIX_BAR);
        c.set32(CAP_MSIX + 8, MSIX_PBA_OFFSET | MSIX_BAR);

        // PCI Express capability, version 2, endpoint.
        c.data[CAP_EXP] = 0x10;
        c.data[CAP_EXP + 1] = 0x00;
        c.set16(CAP_EXP + 0x02, 0x0002);
        c.set32(CAP_EXP + 0x04, 0x0000_8001); // devcap: RBER, MPS 256
        c.set16(CAP_EXP + 0x08, 0x2810); // devctl: MRRS 512, no snoop, RO
        c.set32(CAP_EXP + 0x0c, 0x0000_0104); // linkcap: 16 GT/s x16
        c.set16(CAP_EXP + 0x12, 0x0104); // linksta: 16 GT/s x16
        c.set32(CAP_EXP + 0x24, 0x0000_0010); // devcap2: completion timeout disable
        c.set32(CAP_EXP + 0x2c, 0x0000_001e); // linkcap2: 2.5 to 16 GT/s
        c.set16(CAP_EXP + 0x30, 0x0004); // linkctl2: target 16 GT/s

        // What the host may write.
        c.wmask16(0x04, 0x0547); // command: io, mem, master, parity, serr, intx off
        c.wmask8(0x0c, 0xff); // cache line size
        c.wmask8(0x0d, 0xff); // latency timer
        c.wmask32(0x10, !(BAR0_SIZE as u32 - 1) & !0xf);
        c.wmask32(0x14, 0xffff_ffff);
        c.wmask32(0x18, !(window.clamp(16, 1 << 31) as u32 - 1) & !0xf);
        c.wmask32(0x1c, (!(window.max(16) - 1) >> 32) as u32);
        c.wmask32(0x20, !(BAR4_SIZE as u32 - 1) & !0xf);
        c.wmask32(0x24, 0xffff_ffff);
        c.wmask8(0x3c, 0xff); // interrupt line
        c.wmask16(CAP_PM + 4, 0x0103); // power state, PME enable
        c.wmask16(CAP_MSIX + 2, 0xc000); // MSI-X enable, function mask
        c.wmask16(CAP_EXP + 0x08, 0x7fff); // devctl
        c.wmask16(CAP_EXP + 0x10, 0x01c3); // linkctl: ASPM, RCB, CCC, ES
        c.wmask16(CAP_EXP + 0x28, 0x0010); // devctl2: completion timeout disable
        c.wmask16(CAP_EXP + 0x30, 0x000f); // linkctl2: target speed
        c
    }

    /// Config space of the switch's DMA endpoint (class 0x088000, "system other"): BAR0
    /// `bar0` bytes of registers, BAR4 its MSI-X table of `vectors` entries and PBA.
    pub fn dma_endpoint(device_id: u16, revision: u8, bar0: u64, vectors: u16) -> Self {
        let mut c = ConfigSpace {
            data: [0; CONFIG_SIZE],
            writable: [0; CONFIG_SIZE],
        };
        c.set16(0x00, VENDOR_MICROSEMI);
        c.set16(0x02, device_id);
        c.set16(0x06, 0x0010);
        c.data[0x08] = revision;
        c.set_bytes(0x09, &CLASS_SYSTEM_OTHER.to_le_bytes()[..3]);
        c.set32(0x10, BAR_MEM_64);
        c.set32(0x20, BAR_MEM_64);
        c.set16(0x2c, VENDOR_MICROSEMI);
        c.set16(0x2e, device_id);
        c.data[0x34] = CAP_PM as u8;
        c.data[0x3d] = 1;
        c.data[CAP_PM] = 0x01;
        c.data[CAP_PM + 1] = CAP_MSIX as u8;
        c.set16(CAP_PM + 2, 0x0003);
        c.set16(CAP_PM + 4, 0x0008);
        c.data[CAP_MSIX] = 0x11;
        c.data[CAP_MSIX + 1] = CAP_EXP as u8;
        c.set16(CAP_MSIX + 2, vectors.saturating_sub(1));
        c.set32(CAP_MSIX + 4, MSIX_TABLE_OFFSET | MSIX_BAR);
        c.set32(CAP_MSIX + 8, MSIX_PBA_OFFSET | MSIX_BAR);
        c.data[CAP_EXP] = 0x10;
        c.set16(CAP_EXP + 0x02, 0x0002);
        c.set32(CAP_EXP + 0x04, 0x0000_8001);
        c.set16(CAP_EXP + 0x08, 0x2810);
        c.set32(CAP_EXP + 0x0c, 0x0000_0104);
        c.set16(CAP_EXP + 0x12, 0x0104);
        c.set32(CAP_EXP + 0x24, 0x0000_0010);
        c.set32(CAP_EXP + 0x2c, 0x0000_001e);
        c.set16(CAP_EXP + 0x30, 0x0004);
        c.wmask16(0x04, 0x0547);
        c.wmask8(0x0c, 0xff);
        c.wmask8(0x0d, 0xff);
        c.wmask32(0x10, !(bar0.clamp(16, 1 << 31) as u32 - 1) & !0xf);
        c.wmask32(0x14, 0xffff_ffff);
        c.wmask32(0x20, !(BAR4_SIZE as u32 - 1) & !0xf);
        c.wmask32(0x24, 0xffff_ffff);
        c.wmask8(0x3c, 0xff);
        c.wmask16(CAP_PM + 4, 0x0103);
        c.wmask16(CAP_MSIX + 2, 0xc000);
        c.wmask16(CAP_EXP + 0x08, 0x7fff);
        c.wmask16(CAP_EXP + 0x10, 0x01c3);
        c.wmask16(CAP_EXP + 0x28, 0x0010);
        c.wmask16(CAP_EXP + 0x30, 0x000f);
        c
    }

    /// Config space of an endpoint function (a GPU-like PF or VF): BAR0
    /// registers (MSI-X table inside), BAR2 device memory, PM, MSI-X, PCIe
    /// endpoint capability, and for a PF with VFs an SR-IOV capability.
    pub fn function(f: &FunctionIds) -> Self {
        let mut c = ConfigSpace {
            data: [0; CONFIG_SIZE],
            writable: [0; CONFIG_SIZE],
        };
        c.set16(0x00, f.vid);
        c.set16(0x02, f.did);
        c.set16(0x06, 0x0010); // status: capability list
        c.data[0x08] = 0x01;
        c.set_bytes(0x09, &f.class.to_le_bytes()[..3]);
        c.set32(0x10, BAR_MEM_64); // BAR0+1: registers
        if f.mem_size != 0 {
            c.set32(0x18, BAR_MEM_64 | BAR_PREFETCH); // BAR2+3: device memory
        }
        c.set16(0x2c, f.vid);
        c.set16(0x2e, f.did);
        c.data[0x34] = CAP_PM as u8;
        c.data[0x3d] = 1; // INTA
        c.data[CAP_PM] = 0x01;
        c.data[CAP_PM + 1] = if FN_MSIX { CAP_MSIX } else { CAP_EXP } as u8;
        c.set16(CAP_PM + 2, 0x0003);
        c.set16(CAP_PM + 4, 0x0008);
        if FN_MSIX {
            c.data[CAP_MSIX] = 0x11;
            c.data[CAP_MSIX + 1] = CAP_EXP as u8;
            c.set16(CAP_MSIX + 2, MSIX_VECTORS - 1);
            c.set32(CAP_MSIX + 4, FN_MSIX_TABLE | FN_MSIX_BAR);
            c.set32(CAP_MSIX + 8, FN_MSIX_PBA | FN_MSIX_BAR);
            c.set32(0x20, BAR_MEM_64); // BAR4+5: MSI-X table and PBA
            c.wmask32(0x20, !(FN_BAR4_SIZE as u32 - 1) & !0xf);
            c.wmask32(0x24, 0xffff_ffff);
            c.wmask16(CAP_MSIX + 2, 0xc000);
        }
        c.data[CAP_EXP] = 0x10;
        c.set16(CAP_EXP + 0x02, 0x0002); // v2, endpoint
        c.set32(CAP_EXP + 0x04, 0x0000_8001);
        c.set16(CAP_EXP + 0x08, 0x2810);
        c.set32(CAP_EXP + 0x0c, 0x0000_0104);
        c.set16(CAP_EXP + 0x12, 0x0104);
        c.set32(CAP_EXP + 0x24, 0x0000_0010);
        c.set32(CAP_EXP + 0x2c, 0x0000_001e);
        c.set16(CAP_EXP + 0x30, 0x0004);
        if f.total_vfs > 0 {
            let s = CAP_SRIOV;
            c.set32(s, 0x0001_0010); // SR-IOV, version 1, last
            c.set16(s + 0x0c, u16::from(f.total_vfs)); // InitialVFs
            c.set16(s + 0x0e, u16::from(f.total_vfs)); // TotalVFs
            c.set16(s + 0x14, 1); // First VF offset
            c.set16(s + 0x16, 1); // VF stride
            c.set16(s + 0x1a, f.vf_did);
            c.set32(s + 0x1c, 0x553); // supported page sizes
            c.set32(s + 0x20, 1); // system page size 4 KiB
        }
        c.wmask16(0x04, 0x0547);
        c.wmask8(0x0c, 0xff);
        c.wmask8(0x0d, 0xff);
        c.wmask32(0x10, !(FN_BAR0_SIZE as u32 - 1) & !0xf);
        c.wmask32(0x14, 0xffff_ffff);
        let bar2 = f.mem_size;
        if bar2 != 0 {
            // No device memory (an nvme function): no BAR2, it reads 0 and sizes to 0.
            c.wmask32(0x18, !(bar2.min(1 << 31) as u32 - 1) & !0xf);
            c.wmask32(0x1c, (!(bar2 - 1) >> 32) as u32);
        }
        c.wmask8(0x3c, 0xff);
        c.wmask16(CAP_PM + 4, 0x0103);
        c.wmask16(CAP_EXP + 0x08, 0x7fff);
        c.wmask16(CAP_EXP + 0x10, 0x01c3);
        c.wmask16(CAP_EXP + 0x28, 0x0010);
        c.wmask16(CAP_EXP + 0x30, 0x000f);
        c
    }

    pub fn read(&self, off: usize, buf: &mut [u8]) -> Result<(), String> {
        let src = self
            .data
            .get(off..off + buf.len())
            .ok_or_else(|| range_error(off, buf.len()))?;
        buf.copy_from_slice(src);
        Ok(())
    }

    pub fn write(&mut self, off: usize, val: &[u8]) -> Result<(), String> {
        if off
            .checked_add(val.len())
            .is_none_or(|end| end > CONFIG_SIZE)
        {
            return Err(range_error(off, val.len()));
        }
        for (i, &v) in val.iter().enumerate() {
            let m = self.writable[off + i];
            self.data[off + i] = (self.data[off + i] & !m) | (v & m);
        }
        Ok(())
    }

    #[cfg(test)]
    pub fn get16(&self, off: usize) -> u16 {
        u16::from_le_bytes([self.data[off], self.data[off + 1]])
    }

    fn set_bytes(&mut self, off: usize, b: &[u8]) {
        self.data[off..off + b.len()].copy_from_slice(b);
    }
    fn set16(&mut self, off: usize, v: u16) {
        self.set_bytes(off, &v.to_le_bytes());
    }
    fn set32(&mut self, off: usize, v: u32) {
        self.set_bytes(off, &v.to_le_bytes());
    }
    fn wmask8(&mut self, off: usize, m: u8) {
        self.writable[off] = m;
    }
    fn wmask16(&mut self, off: usize, m: u16) {
        self.writable[off..off + 2].copy_from_slice(&m.to_le_bytes());
    }
    fn wmask32(&mut self, off: usize, m: u32) {
        self.writable[off..off + 4].copy_from_slice(&m.to_le_bytes());
    }
}

fn range_error(off: usize, len: usize) -> String {
    format!("config space access of {len} bytes at {off:#x} is outside its {CONFIG_SIZE} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cs() -> ConfigSpace {
        ConfigSpace::new(&Firmware::default(), 64 << 20)
    }

    #[test]
    fn ids_and_class() {
        let c = cs();
        assert_eq!(c.get16(0), 0x11f8);
        assert_eq!(c.get16(2), 0x4228);
        let mut b = [0u8; 4];
        c.read(0x08, &mut b).expect("read");
        assert_eq!(u32::from_le_bytes(b), 0x0580_0001);
        assert_eq!(c.data[0x0e], 0);
    }

    #[test]
    fn capability_chain() {
        let c = cs();
        let mut pos = c.data[0x34] as usize;
        let mut ids = vec![];
        while pos != 0 {
            ids.push(c.data[pos]);
            pos = c.data[pos + 1] as usize;
        }
        assert_eq!(ids, vec![0x01, 0x11, 0x10]);
        assert_eq!(c.get16(CAP_EXP + 2) & 0xf, 2, "PCIe cap version 2");
        assert_eq!(c.get16(CAP_EXP + 2) >> 4 & 0xf, 0, "endpoint");
    }

    #[test]
    fn bar_sizing_and_readonly() {
        let mut c = cs();
        c.write(0x10, &[0xff; 8]).expect("write");
        let mut b = [0u8; 8];
        c.read(0x10, &mut b).expect("read");
        assert_eq!(u64::from_le_bytes(b), !(BAR0_SIZE - 1) | 0x4);
        c.write(0x18, &[0xff; 8]).expect("write");
        c.read(0x18, &mut b).expect("read");
        assert_eq!(u64::from_le_bytes(b), !((64 << 20) - 1) | 0xc, "P2P window");
        c.write(0x00, &[0; 4]).expect("write ids");
        assert_eq!(c.get16(0), 0x11f8);
        c.write(0x04, &[0x06, 0x00]).expect("write command");
        assert_eq!(c.get16(4), 0x0006);
        assert!(c.write(4095, &[0, 0]).is_err());
        assert!(c.read(4096, &mut [0]).is_err());
    }
}

// SPDX-License-Identifier: GPL-2.0-only
//! The MRPC commands the firmware serves. Layouts and return codes are those
//! of Documentation/mrpc.rst.

use crate::config::LOG_PORTS;
use crate::ep::{self, EpAccess};
use crate::gas::{MRPC_STATUS_DONE, MRPC_STATUS_ERROR};
use crate::model::{Model, Notice, PortKind, Request, Requester, MULTI_FUNC_NUM};

// Commands (switchtec-user's enum mrpc_cmd) and pcifab's extensions.
pub const MRPC_DIETEMP: u32 = 0x04;
pub const MRPC_FWLOGRD: u32 = 0x06;
pub const MRPC_MULTI_CFG: u32 = 0x1d;
pub const MRPC_FTDC_LOG_DUMP: u32 = 0x147;
pub const MRPC_PMON: u32 = 0x07;
pub const MRPC_LNKSTAT: u32 = 0x1c;
pub const MRPC_PART_INFO: u32 = 0x2b;
pub const MRPC_ECHO: u32 = 0x41;
pub const MRPC_GET_PAX_ID: u32 = 0x81;
pub const MRPC_PORT_CONFIG: u32 = 0x88;
pub const MRPC_EP_RESOURCE_ACCESS: u32 = 0x8e;
pub const MRPC_EP_TUNNEL_CFG: u32 = 0x8f;
pub const MRPC_I2C_TWI_PING: u32 = 0x100;
pub const MRPC_EXT_FEATURES: u32 = 0xf000;
/// The command range of pcifab's extensions (answered in `extended` only).
pub const EXT_FIRST: u32 = 0xf000;
pub const EXT_LAST: u32 = 0xf0ff;
/// EXT_FEATURES: its version and feature bits.
pub const EXT_FEATURES_VERSION: u32 = 1;
pub const EXT_FEAT_TELEMETRY: u32 = 1 << 0;
pub const EXT_FEAT_P2P: u32 = 1 << 1;
pub const EXT_FEAT_DMA_ENGINE: u32 = 1 << 2;
pub const EXT_FEAT_UNBIND_REQUEST: u32 = 1 << 3;

// GFMS_DB_DUMP sub-commands (switchtec-user's mrpc.h).
pub const DUMP_FABRIC: u8 = 0;
pub const DUMP_PAX_ALL: u8 = 1;
pub const DUMP_PAX: u8 = 2;
pub const DUMP_HVD: u8 = 3;
pub const DUMP_FAB_PORT: u8 = 4;
pub const DUMP_EP_PORT: u8 = 5;
pub const DUMP_HVD_DETAIL: u8 = 6;
/// The `type` of a chunked dump step.
pub const DUMP_START: u32 = 1;
pub const DUMP_GET: u32 = 2;
pub const DUMP_FINISH: u32 = 3;

/// Where switchtec-user puts the target PAX id in the command word
/// (`SWITCHTEC_PAX_ID_SHIFT`, `SWITCHTEC_PAX_ID_MASK`); the all-ones id
/// (`SWITCHTEC_PAX_ID_LOCAL`) and this switch's own id (GET_PAX_ID) both
/// mean this switch.
pub const PAX_ID_SHIFT: u32 = 18;
pub const PAX_ID_MASK: u32 = 0x1f;
pub const PAX_ID_LOCAL: u32 = PAX_ID_MASK;
/// This switch's PAX id, as GET_PAX_ID answers it.
pub const LOCAL_PAX_ID: u8 = 0;

/// FWLOGRD sub-commands (mrpc.h): the app log (log "A", Gen4 numbers),
/// the fatal-error dumps (log "B") and the NVLog header (log "C").
pub const FWLOGRD_RAM: u8 = 0;
pub const FWLOGRD_FLASH: u8 = 1;
pub const FWLOGRD_MEMLOG: u8 = 2;
pub const FWLOGRD_THRD: u8 = 6;
pub const FWLOGRD_NVHDR: u8 = 10;
pub const FWLOGRD_RAM_WITH_FLAG: u8 = 13;
pub const FWLOGRD_FLASH_WITH_FLAG: u8 = 14;
/// `struct log_a_retr_hdr` and one `struct log_a_data` (log.h).
pub const LOG_A_HDR: usize = 32;
pub const LOG_A_ENTRY: usize = 32;
/// Entries of the emulated app log in RAM (two replies' worth) and in flash.
pub const APP_LOG_RAM_ENTRIES: u32 = 40;
pub const APP_LOG_FLASH_ENTRIES: u32 = 8;
/// FTDC_LOG_DUMP: chunks of the emulated FTDC log, payload dwords per chunk.
pub const FTDC_CHUNKS: u16 = 2;
pub const FTDC_CHUNK_DW: usize = 15;
/// MULTI_CFG sub-commands (mrpc.h).
pub const MULTI_CFG_SUPPORTED: u8 = 0;
pub const MULTI_CFG_COUNT: u8 = 1;
pub const MULTI_CFG_ACTIVE: u8 = 2;
pub const MULTI_CFG_START_ADDR: u8 = 3;
pub const MULTI_CFG_LENGTH: u8 = 4;
/// Configurations stored in the active CFG partition.
pub const MULTI_CFG_IMAGES: u32 = 2;
/// fabric.h's `SWITCHTEC_GFMS_DB_VEP_TYPE_MGMT`: the management VEP.
pub const VEP_TYPE_MGMT: u8 = 6;

/// PART_INFO sub-commands (mrpc.h) and the Gen4 flash layout (lib/fw.c).
pub const PART_INFO_GET_ALL_INFO: u8 = 0;
pub const PART_INFO_GET_METADATA: u8 = 1;
/// Partitions map0, map1, keyman0/1, bl2 0/1, cfg0/1, img0/1, nvlog
/// (switchtec_priv.h's SWITCHTEC_FW_PART_ID_G4_*), then vendor[8].
pub const FLASH_PARTS_GEN4: usize = 11;
pub const FLASH_INFO_HDR: usize = 64;
pub const FLASH_PART_INFO_SIZE: usize = 32;
pub const FLASH_INFO_SIZE: usize = FLASH_INFO_HDR + (FLASH_PARTS_GEN4 + 8) * FLASH_PART_INFO_SIZE;
/// sizeof(struct switchtec_fw_metadata_gen4).
pub const FW_METADATA_GEN4_SIZE: usize = 628;
/// Every emulated flash partition: 64 KiB at 64 KiB * (id + 1).
pub const FLASH_PART_BYTES: u32 = 0x1_0000;
/// Ports LNKSTAT reports on a Gen4 part (switchtec_max_supported_ports).
pub const LNKSTAT_PORTS: usize = 52;
pub const LNKSTAT_ENTRY: usize = 12;
/// PMON GET_BW_COUNTER: sub-command and the size of one result.
pub const PMON_GET_BW_COUNTER: u8 = 1;
pub const BWCNTR_RES_SIZE: usize = 56;
/// switchtec-user's SWITCHTEC_UNBOUND_PORT: a port in no partition.
pub const UNBOUND_PORT: u8 = 255;
/// PORT_CONFIG sub-commands and port types (fabric.h).
pub const PORT_CONFIG_SET: u8 = 0;
pub const PORT_CONFIG_GET: u8 = 1;
pub const FAB_PORT_TYPE_UNUSED: u8 = 0;
pub const FAB_PORT_TYPE_FABRIC_EP: u8 = 2;
pub const FAB_PORT_TYPE_FABRIC_HOST: u8 = 3;
/// GFMS DB reachability (fabric.h): unicast, unreachable.
pub const REACH_UC: u8 = 0;
pub const REACH_UR: u8 = 2;
/// EP function types (sriov_cap_pf) as cli/fabric.c prints them.
pub const FUNC_SRIOV_PF: u8 = 3;
pub const FUNC_PF: u8 = 1;
pub const FUNC_SRIOV_VF: u8 = 0;
/// EP BAR types (fabric.h).
pub const BAR_MEM64: u8 = 0x4;
pub const BAR_MEM64_PREFETCH: u8 = 0xc;
/// Functions' BAR0 size as a power of two (16 KiB).
pub const FN_BAR0_EXP: u8 = 14;
pub const MRPC_TOPO_INFO_DUMP: u32 = 0x82;
pub const MRPC_GFMS_DB_DUMP: u32 = 0x83;
pub const MRPC_GFMS_BIND_UNBIND: u32 = 0x84;
pub const MRPC_GFMS_EVENT: u32 = 0x89;
pub const GFMS_BIND: u8 = 1;
pub const GFMS_UNBIND: u8 = 2;

pub const MRPC_PORT_CONTROL: u32 = 0x8d;
pub const MRPC_FABRIC_SUMMARY: u32 = 0xf001;
pub const MRPC_FUNCTION_TELEMETRY: u32 = 0xf002;
pub const MRPC_FUNCTION_LIST: u32 = 0xf003;
pub const MRPC_P2P_ROUTE: u32 = 0xf004;
pub const ROUTE_ADD: u8 = 1;
pub const ROUTE_DEL: u8 = 2;
pub const ROUTE_LIST: u8 = 3;
pub const ROUTE_GRANT: u8 = 4;
pub const ROUTE_REVOKE: u8 = 5;
pub const ROUTE_GRANT_LIST: u8 = 6;
pub const GRANT_ENTRY_SIZE: usize = 8;
pub const ROUTE_INPUT_SIZE: usize = 32;
pub const ROUTE_ENTRY_SIZE: usize = 32;

pub const DIETEMP_SET_CLOCK: u32 = 0;
pub const DIETEMP_SET_MEAS: u32 = 1;
pub const DIETEMP_GET: u32 = 2;
pub const DIETEMP_STOP: u32 = 3;

// Firmware return codes (switchtec-user's errors.h) and pcifab's.
pub const ERR_PHYC_PORT_NOT_EXIST: u32 = 0x4;
pub const ERR_MRPC_DENIED: u32 = 0x64010;
pub const ERR_SUBCMD_INVALID: u32 = 0x64004;
pub const ERR_CMD_INVALID: u32 = 0x64005;
pub const ERR_PARAM_INVALID: u32 = 0x64006;
pub const ERR_MRPC_NO_PREV_DATA: u32 = 0x64012;
pub const PCIFAB_ERR_PDFID_UNKNOWN: u32 = 0xf0_0001;
pub const PCIFAB_ERR_RANGE: u32 = 0xf0_0002;

/// Output buffer size.
pub const PAYLOAD: usize = 1024;
/// Bytes of TOPO_INFO_DUMP data per DATA_GET.
pub const TOPO_CHUNK: usize = 1000;
/// Dwords per EP port GET reply, its 3 header dwords included.
pub const EP_CHUNK_DW: usize = 0xf0;
/// Dwords per GET reply of the other chunked dumps (a whole output buffer).
pub const DUMP_CHUNK_DW: usize = PAYLOAD / 4;
/// The length a `bad-length` fault puts in dump replies, in dwords.
pub const BAD_LEN_DW: u32 = 512;

pub const EXT_VERSION: u16 = 1;
pub const LIST_ENTRY_SIZE: usize = 24;
pub const LIST_HDR_SIZE: usize = 16;
pub const LIST_MAX_ENTRIES: usize = (PAYLOAD - LIST_HDR_SIZE) / LIST_ENTRY_SIZE;

pub fn mrpc_name(cmd: u32) -> &'static str {
    match cmd & 0xffff {
        MRPC_DIETEMP => "DIETEMP",
        MRPC_FWLOGRD => "FWLOGRD",
        MRPC_MULTI_CFG => "MULTI_CFG",
        MRPC_FTDC_LOG_DUMP => "FTDC_LOG_DUMP",
        MRPC_PMON => "PMON",
        MRPC_LNKSTAT => "LNKSTAT",
        MRPC_PART_INFO => "PART_INFO",
        MRPC_ECHO => "ECHO",
        MRPC_GET_PAX_ID => "GET_PAX_ID",
        MRPC_PORT_CONFIG => "PORT_CONFIG",
        MRPC_EP_RESOURCE_ACCESS => "EP_RESOURCE_ACCESS",
        MRPC_EP_TUNNEL_CFG => "EP_TUNNEL_CFG",
        MRPC_I2C_TWI_PING => "I2C_TWI_PING",
        MRPC_EXT_FEATURES => "EXT_FEATURES",
        MRPC_TOPO_INFO_DUMP => "TOPO_INFO_DUMP",
        MRPC_GFMS_DB_DUMP => "GFMS_DB_DUMP",
        MRPC_GFMS_EVENT => "GFMS_EVENT",
        MRPC_GFMS_BIND_UNBIND => "GFMS_BIND_UNBIND",
        MRPC_PORT_CONTROL => "PORT_CONTROL",
        MRPC_FABRIC_SUMMARY => "FABRIC_SUMMARY",
        MRPC_FUNCTION_TELEMETRY => "FUNCTION_TELEMETRY",
        MRPC_FUNCTION_LIST => "FUNCTION_LIST",
        MRPC_P2P_ROUTE => "P2P_ROUTE",
        _ => "unknown",
    }
}

/// What the firmware produced for one MRPC command.
#[derive(Debug, PartialEq)]
pub struct MrpcOutcome {
    pub status: u32,
    pub ret: u32,
    pub output: Vec<u8>,
}

impl MrpcOutcome {
    pub fn done(output: Vec<u8>) -> Self {
        MrpcOutcome {
            status: MRPC_STATUS_DONE,
            ret: 0,
            output,
        }
    }

    pub fn error(ret: u32) -> Self {
        MrpcOutcome {
            status: MRPC_STATUS_ERROR,
            ret,
            output: Vec::new(),
        }
    }
}

type Res = Result<Vec<u8>, u32>;

/// Little-endian output builder.
#[derive(Default)]
struct Out(Vec<u8>);

impl Out {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn zeros(&mut self, n: usize) -> &mut Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
}

fn u8_at(input: &[u8], at: usize) -> Result<u8, u32> {
    input.get(at).copied().ok_or(ERR_PARAM_INVALID)
}

fn u16_at(input: &[u8], at: usize) -> Result<u16, u32> {
    match input.get(at..at + 2) {
        Some(b) => Ok(u16::from_le_bytes([b[0], b[1]])),
        None => Err(ERR_PARAM_INVALID),
    }
}

fn u32_at(input: &[u8], at: usize) -> Result<u32, u32> {
    match input.get(at..at + 4) {
        Some(b) => Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        None => Err(ERR_PARAM_INVALID),
    }
}

fn u64_at(input: &[u8], at: usize) -> Result<u64, u32> {
    match input.get(at..at + 8) {
        Some(b) => {
            let mut v = [0u8; 8];
            v.copy_from_slice(b);
            Ok(u64::from_le_bytes(v))
        }
        None => Err(ERR_PARAM_INVALID),
    }
}

fn put_u16(buf: &mut [u8], at: usize, v: u16) {
    if let Some(b) = buf.get_mut(at..at + 2) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}

/// The firmware executing one command for the host of `partition`.
pub struct Exec<'a> {
    pub model: &'a mut Model,
    pub partition: usize,
    /// The `bad-length` fault: length words claim more than the buffer.
    pub bad_length: bool,
    /// Fabric changes the command made, to be signalled on every MEP.
    pub notices: Vec<Notice>,
    /// A checked and reserved bind/unbind the worker must now carry out;
    /// the command completes when it is done.
    pub deferred: Option<Vec<Request>>,
    /// A checked EP_RESOURCE_ACCESS the worker must now carry out without
    /// the model lock (`ep::perform`); its result is the command's.
    pub ep_access: Option<EpAccess>,
}

impl Exec<'_> {
    pub fn run(&mut self, cmd: u32, input: &[u8]) -> MrpcOutcome {
        let c = cmd & 0xffff;
        let pax = cmd >> PAX_ID_SHIFT & PAX_ID_MASK;
        let r = match c {
            // One switch: no other PAX is reachable through this one.
            _ if pax != PAX_ID_LOCAL && pax != u32::from(LOCAL_PAX_ID) => Err(ERR_PARAM_INVALID),
            EXT_FIRST..=EXT_LAST if !self.model.dialect.extended() => Err(ERR_CMD_INVALID),
            // PAX answers ECHO with its input bit-inverted (cli/main.c `test`).
            MRPC_ECHO => Ok(input.iter().map(|b| !b).collect()),
            MRPC_I2C_TWI_PING => self.twi_ping(input),
            MRPC_GET_PAX_ID => Ok(vec![LOCAL_PAX_ID]),
            MRPC_FWLOGRD => self.fwlogrd(input),
            MRPC_FTDC_LOG_DUMP => self.ftdc_log(input),
            MRPC_MULTI_CFG => self.multi_cfg(input),
            MRPC_LNKSTAT => self.lnkstat(input),
            MRPC_PART_INFO => self.part_info(input),
            MRPC_PMON => self.pmon(input),
            MRPC_PORT_CONFIG => self.port_config(input),
            MRPC_EXT_FEATURES => Ok(self.ext_features()),
            MRPC_DIETEMP => self.dietemp(input),
            MRPC_TOPO_INFO_DUMP => self.topo(input),
            MRPC_GFMS_DB_DUMP => self.gfms_db(input),
            MRPC_GFMS_EVENT => self.gfms_event(input),
            MRPC_PORT_CONTROL => self.port_control(input),
            MRPC_GFMS_BIND_UNBIND => self.bind_unbind(input),
            MRPC_FABRIC_SUMMARY => self.summary(input),
            MRPC_FUNCTION_TELEMETRY => self.telemetry(input),
            MRPC_FUNCTION_LIST => self.list(input),
            MRPC_P2P_ROUTE => self.p2p_route(input),
            MRPC_EP_TUNNEL_CFG => ep::tunnel_cfg(self.model, self.partition, input),
            MRPC_EP_RESOURCE_ACCESS => self.ep_resource_access(input),
            _ => Err(ERR_CMD_INVALID),
        };
        match r {
            Ok(mut out) => {
                out.truncate(PAYLOAD);
                MrpcOutcome::done(out)
            }
            Err(ret) => MrpcOutcome::error(ret),
        }
    }

    /// EP_RESOURCE_ACCESS (0x8E): parse and check here, under the model
    /// lock; the worker reads or writes the function (`ep::perform`).
    fn ep_resource_access(&mut self, input: &[u8]) -> Res {
        let acc = ep::parse(input)?;
        ep::check(self.model, self.partition, &acc)?;
        self.ep_access = Some(acc);
        Ok(Vec::new())
    }

    /// GFMS_BIND_UNBIND: check and reserve; the worker does the rest.
    ///
    /// Bind: `{u8 subcmd=1, u8 host_sw_idx, u8 host_phys_port_id,
    /// u8 host_log_port_id, {u16 pdfid, u8 next_valid, u8 rsvd}[8]}`, the
    /// functions chained by next_valid from the first. Unbind: `{u8 subcmd=2,
    /// u8 host_sw_idx, u8 host_phys_port_id, u8 host_log_port_id, u16 pdfid,
    /// u8 option, u8 rsvd}`; switchtec-user leaves pdfid and option
    /// unset, so an unbind takes everything on the logical port.
    fn bind_unbind(&mut self, input: &[u8]) -> Res {
        let sub = u8_at(input, 0)?;
        if sub != GFMS_BIND && sub != GFMS_UNBIND {
            return Err(crate::model::ERR_BIND_SUBCMD_INVALID);
        }
        if input.len() < 4 {
            return Err(ERR_PARAM_INVALID);
        }
        let (sw, port, log_port) = (input[1], input[2], input[3]);
        if sw != 0 {
            return Err(ERR_PARAM_INVALID);
        }
        let host = self
            .model
            .host_by_port(port)
            .map_err(|_| ERR_PARAM_INVALID)?;
        let me = Requester::Host(self.partition);
        let reqs = if sub == GFMS_BIND {
            let mut pdfids = Vec::new();
            for i in 0..MULTI_FUNC_NUM {
                let at = 4 + 4 * i;
                pdfids.push(u16_at(input, at)?);
                if u8_at(input, at + 2)? == 0 {
                    break;
                }
                if i + 1 == MULTI_FUNC_NUM {
                    // next_valid on the last slot: nothing follows.
                    return Err(ERR_PARAM_INVALID);
                }
            }
            self.model.begin_bind_group(me, host, log_port, &pdfids)?
        } else {
            if input.len() < 8 {
                return Err(ERR_PARAM_INVALID);
            }
            self.model.begin_unbind_port(me, host, log_port)?
        };
        self.deferred = Some(reqs);
        Ok(vec![0; 4])
    }

    /// I2C_TWI_PING (0x100): `{u32 dev_info, u32 ~ping}`; dev_info is the
    /// boot phase (3, main firmware) | revision << 8 | generation << 12
    /// (0: Gen4), as switchtec_get_device_info() reads it.
    fn twi_ping(&mut self, input: &[u8]) -> Res {
        let ping = u32_at(input, 0)?;
        let rev = u32::from(self.model.fw.product_revision.as_bytes().first() == Some(&b'C'));
        let mut o = Out::default();
        o.u32(3 | rev << 8).u32(!ping);
        Ok(o.0)
    }

    /// PART_INFO (0x2B), Gen4: GET_ALL_INFO -> `switchtec_flash_info_gen4`
    /// (672 bytes), GET_METADATA `{u8 sub, u8 part_id}` ->
    /// `switchtec_fw_metadata_gen4` (628 bytes). Copy 0 of every image is
    /// the active, running one; copy 1 is valid and inactive.
    fn part_info(&mut self, input: &[u8]) -> Res {
        let fw = &self.model.fw;
        match u8_at(input, 0)? {
            PART_INFO_GET_ALL_INFO => {
                let mut o = Out::default();
                o.u32(fw.fw_version)
                    .u32(16 * FLASH_PART_BYTES)
                    .u16(fw.device_id)
                    .u8(0)
                    .u8(0)
                    .zeros(4)
                    .zeros(48);
                debug_assert_eq!(o.0.len(), FLASH_INFO_HDR);
                for id in 0..FLASH_PARTS_GEN4 as u32 {
                    let start = FLASH_PART_BYTES * (id + 1);
                    let first = id % 2 == 0 || id == 10;
                    o.u32(0)
                        .u32(FLASH_PART_BYTES / 2)
                        .u16((fw.fw_version >> 16) as u16)
                        .u8(1)
                        .u8(u8::from(first))
                        .u32(start)
                        .u32(start + FLASH_PART_BYTES - 1)
                        .u32(0)
                        .u32(FLASH_PART_BYTES / 4)
                        .u8(0)
                        .u8(u8::from(first))
                        .zeros(2);
                }
                o.zeros(8 * FLASH_PART_INFO_SIZE);
                debug_assert_eq!(o.0.len(), FLASH_INFO_SIZE);
                Ok(o.0)
            }
            PART_INFO_GET_METADATA => {
                let id = u8_at(input, 1)?;
                // Image types of switchtec-user's switchtec_fw_part_type_gen4:
                // map 0, keyman 1, bl2 2, cfg 3, img 4 (two copies each).
                if id >= 10 {
                    return Err(ERR_PARAM_INVALID);
                }
                let mut o = Out::default();
                o.0.extend_from_slice(b"MSCC_MD ");
                o.u32(1)
                    .u32(0)
                    .u32(0x400)
                    .u32(0x400)
                    .u32(FLASH_PART_BYTES / 2)
                    .u32(u32::from(id / 2))
                    .u8(0)
                    .zeros(3)
                    .u32(fw.fw_version)
                    .u32(1)
                    .u32(0);
                o.0.extend_from_slice(b"20260101");
                o.0.extend_from_slice(b"00:00:00");
                let mut img = [0u8; 16];
                let name = fw.product_id.as_bytes();
                img[..name.len().min(16)].copy_from_slice(&name[..name.len().min(16)]);
                o.0.extend_from_slice(&img);
                o.zeros(4)
                    .u32(0)
                    .zeros(512 + 4)
                    .zeros(8)
                    .u32(0)
                    .u32(0)
                    .u32(0)
                    .u32(0);
                debug_assert_eq!(o.0.len(), FW_METADATA_GEN4_SIZE);
                Ok(o.0)
            }
            _ => Err(ERR_SUBCMD_INVALID),
        }
    }

    /// FWLOGRD (0x06), Gen4. The app log (RAM, FLASH and their WITH_FLAG
    /// forms): `struct log_a_retr {u8 sub, u8 from_end, rsvd[6], u32
    /// count, u32 rsvd, u32 start}` (start 0xFFFFFFFF: the oldest entry,
    /// count 0: as many as fit) -> `struct log_a_retr_hdr` {u8 sub, u8
    /// from_end, u8 overflow, rsvd, u32 total, u32 count, u32 remain, u32
    /// next_start, u32 sdk_version, u32 fw_version, rsvd} and `count`
    /// 8-dword entries (two timestamp dwords, then severity << 28 |
    /// module << 16 | event id, then five parameters). The fatal-error dumps
    /// (MEMLOG..THRD): `{u8 sub, rsvd[3], u32 offset, u32 length}` ->
    /// `{u8 sub, rsvd[3], u32 length 0, u32 remain 0}`: there was no fatal
    /// error. NVHDR: `{u8 reason, rsvd[3], u32 nvlog_version, u32
    /// thread_handle, u32 fw_version, u32 timestamp1, u32 timestamp2}`.
    fn fwlogrd(&mut self, input: &[u8]) -> Res {
        let sub = u8_at(input, 0)?;
        match sub {
            FWLOGRD_RAM | FWLOGRD_FLASH | FWLOGRD_RAM_WITH_FLAG | FWLOGRD_FLASH_WITH_FLAG => {
                let total = if sub == FWLOGRD_RAM || sub == FWLOGRD_RAM_WITH_FLAG {
                    APP_LOG_RAM_ENTRIES
                } else {
                    APP_LOG_FLASH_ENTRIES
                };
                let from_end = u8_at(input, 1)?;
                let want = u32_at(input, 8)?;
                let start = match u32_at(input, 16)? {
                    u32::MAX => 0,
                    s if s <= total => s,
                    _ => return Err(ERR_PARAM_INVALID),
                };
                let fit = ((PAYLOAD - LOG_A_HDR) / LOG_A_ENTRY) as u32;
                let mut n = (total - start).min(fit);
                if want != 0 {
                    n = n.min(want);
                }
                let mut o = Out::default();
                o.u8(sub)
                    .u8(from_end)
                    .u8(0)
                    .u8(0)
                    .u32(total)
                    .u32(n)
                    .u32(total - start - n)
                    .u32(start + n)
                    .u32(0)
                    .u32(self.model.fw.fw_version)
                    .u32(0);
                for i in start..start + n {
                    // 1 ms apart; modules 1-4, severity LOW (4) and
                    // MEDIUM (3), event ids counting up per module.
                    let ts = 1_000_000u64 * u64::from(i + 1);
                    let module = 1 + i % 4;
                    let sev = 3 + i % 2;
                    o.u32((ts >> 32) as u32)
                        .u32(ts as u32)
                        .u32(sev << 28 | module << 16 | (i / 4))
                        .u32(i)
                        .zeros(16);
                }
                Ok(o.0)
            }
            FWLOGRD_MEMLOG..=FWLOGRD_THRD => {
                u32_at(input, 8)?;
                let mut o = Out::default();
                o.u8(sub).zeros(3).u32(0).u32(0);
                Ok(o.0)
            }
            FWLOGRD_NVHDR => {
                let mut o = Out::default();
                o.u8(0)
                    .zeros(3)
                    .u32(1)
                    .u32(0)
                    .u32(self.model.fw.fw_version)
                    .u32(0)
                    .u32(0);
                Ok(o.0)
            }
            _ => Err(ERR_SUBCMD_INVALID),
        }
    }

    /// FTDC_LOG_DUMP (0x147): `struct log_ftdc_retr {u8 sub (0, RAM), u8
    /// rsvd, u16 req_seq}` -> one chunk: a dword {u8 dwords after this one,
    /// u8 last, u16 seq}, then that many dwords (switchtec-user writes
    /// `(data[0] + 1) * 4` bytes and stops at a non-zero `data[1]`).
    fn ftdc_log(&mut self, input: &[u8]) -> Res {
        if u8_at(input, 0)? != FWLOGRD_RAM {
            return Err(ERR_SUBCMD_INVALID);
        }
        let seq = u16_at(input, 2)?;
        if seq >= FTDC_CHUNKS {
            return Err(ERR_PARAM_INVALID);
        }
        let mut o = Out::default();
        o.u8(FTDC_CHUNK_DW as u8)
            .u8(u8::from(seq + 1 == FTDC_CHUNKS))
            .u16(seq);
        for i in 0..FTDC_CHUNK_DW as u32 {
            o.u32(u32::from(seq) << 16 | i);
        }
        Ok(o.0)
    }

    /// MULTI_CFG (0x1D): `u32 sub-command | index << 8` -> `u32 result`:
    /// SUPPORTED 1, COUNT 2, ACTIVE 0, START_ADDR and LENGTH of configuration
    /// `index`: the halves of the active CFG partition (cfg0, PART_INFO).
    fn multi_cfg(&mut self, input: &[u8]) -> Res {
        let word = u32_at(input, 0)?;
        let (sub, index) = (word as u8, (word >> 8) as u8);
        let half = FLASH_PART_BYTES / 2;
        // cfg0 is partition 6 (FLASH_PARTS_GEN4's order), at 64 KiB * 7.
        let cfg0 = FLASH_PART_BYTES * 7;
        let indexed = |v: u32| {
            if u32::from(index) < MULTI_CFG_IMAGES {
                Ok(v)
            } else {
                Err(ERR_PARAM_INVALID)
            }
        };
        let r = match sub {
            MULTI_CFG_SUPPORTED => 1,
            MULTI_CFG_COUNT => MULTI_CFG_IMAGES,
            MULTI_CFG_ACTIVE => 0,
            MULTI_CFG_START_ADDR => indexed(cfg0 + u32::from(index) * half)?,
            MULTI_CFG_LENGTH => indexed(half)?,
            _ => return Err(ERR_SUBCMD_INVALID),
        };
        Ok(r.to_le_bytes().to_vec())
    }

    /// EXT_FEATURES (0xF000, extended only): `{u32 version, u32 features}`.
    fn ext_features(&self) -> Vec<u8> {
        let mut o = Out::default();
        o.u32(EXT_FEATURES_VERSION)
            .u32(EXT_FEAT_TELEMETRY | EXT_FEAT_P2P | EXT_FEAT_DMA_ENGINE | EXT_FEAT_UNBIND_REQUEST);
        o.0
    }

    /// LNKSTAT (0x1C): input `u64 port_bitmap` (0: every port); output 52
    /// entries of 12 bytes, the ports first in ascending order, the rest
    /// with stk_id 0xff (switchtec_status() skips those).
    fn lnkstat(&mut self, input: &[u8]) -> Res {
        let map = u64_at(input, 0)?;
        let m = &*self.model;
        let mut o = Out::default();
        let mut n = 0;
        for p in m.ports.iter().filter(|p| map == 0 || map >> p.id & 1 != 0) {
            let (part, usp) = match p.kind {
                PortKind::Host(h) => (h as u8, 1),
                PortKind::Endpoint(_) => (UNBOUND_PORT, 0),
            };
            let width = if usp == 1 { 16 } else { 4 };
            o.u8(p.id)
                .u8(part)
                .u8(0)
                .u8(((p.id / 8) << 4) | (p.id % 8))
                .u8(width)
                .u8(if p.link_up { width } else { 0 })
                .u8(usp)
                .u8(if p.link_up { 0x80 | 4 } else { 4 })
                .u16(if p.link_up { 3 } else { 0 })
                .u8(0)
                .u8(0);
            n += 1;
        }
        for _ in n..LNKSTAT_PORTS {
            o.zeros(3).u8(0xff).zeros(8);
        }
        debug_assert_eq!(o.0.len(), LNKSTAT_PORTS * LNKSTAT_ENTRY);
        Ok(o.0)
    }

    /// PMON (0x07): only GET_BW_COUNTER, `{u8 sub, u8 count, {u8 id, u8
    /// clear}[count]}` -> count `switchtec_bwcntr_res` (56 bytes): the time
    /// in microseconds and zero byte counts (the emulator counts no traffic).
    fn pmon(&mut self, input: &[u8]) -> Res {
        if u8_at(input, 0)? != PMON_GET_BW_COUNTER {
            return Err(ERR_SUBCMD_INVALID);
        }
        let count = usize::from(u8_at(input, 1)?);
        if count * BWCNTR_RES_SIZE > PAYLOAD || input.len() < 2 + 2 * count {
            return Err(ERR_PARAM_INVALID);
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let mut o = Out::default();
        for i in 0..count {
            if self.model.port(input[2 + 2 * i]).is_none() {
                return Err(ERR_PHYC_PORT_NOT_EXIST);
            }
            o.u64(now).zeros(BWCNTR_RES_SIZE - 8);
        }
        Ok(o.0)
    }

    /// PORT_CONFIG (0x88): GET `{u8 sub=1, u8 phys_port_id, u8 rsvd[2]}` ->
    /// `{u8 port_type, u8 clock_source, u8 clock_sris, u8 hvd_inst}`. SET is
    /// refused: the fabric's ports are fixed by the configuration.
    fn port_config(&mut self, input: &[u8]) -> Res {
        let sub = u8_at(input, 0)?;
        let id = u8_at(input, 1)?;
        match sub {
            PORT_CONFIG_GET => {
                if id >= crate::config::MAX_PORTS {
                    return Err(ERR_PARAM_INVALID);
                }
                let (ty, hvd) = match self.model.port(id).map(|p| p.kind) {
                    Some(PortKind::Host(h)) => (FAB_PORT_TYPE_FABRIC_HOST, h as u8),
                    Some(PortKind::Endpoint(_)) => (FAB_PORT_TYPE_FABRIC_EP, 0xff),
                    None => (FAB_PORT_TYPE_UNUSED, 0xff),
                };
                Ok(vec![ty, 0, 0, hvd])
            }
            PORT_CONFIG_SET => Err(ERR_MRPC_DENIED),
            _ => Err(ERR_SUBCMD_INVALID),
        }
    }

    fn dietemp(&mut self, input: &[u8]) -> Res {
        let mut sub = [0u8; 4];
        let n = input.len().min(4);
        sub[..n].copy_from_slice(&input[..n]);
        match u32::from_le_bytes(sub) {
            DIETEMP_GET => Ok(self.model.fw.die_temp_centi.to_le_bytes().to_vec()),
            DIETEMP_SET_CLOCK | DIETEMP_SET_MEAS | DIETEMP_STOP => Ok(Vec::new()),
            _ => Err(ERR_SUBCMD_INVALID),
        }
    }

    // ---- TOPO_INFO_DUMP ----

    fn topo_snapshot(&self) -> Vec<u8> {
        let m = &*self.model;
        let mut o = Out::default();
        o.u8(0).zeros(3).zeros(28).zeros(16);
        o.u64(m.port_map(|_| true));
        for p in &m.ports {
            let up = p.link_up;
            let ty = match p.kind {
                PortKind::Host(_) => 3,
                PortKind::Endpoint(_) => 2,
            };
            o.u8(p.id).u8(ty).u8(0).u8(p.id).zeros(20);
            o.u8(16)
                .u8(if up { 16 } else { 0 })
                .u8(4)
                .u8(if up { 4 } else { 0 })
                .u8(if up { 3 } else { 0 })
                .u8(0)
                .zeros(2);
        }
        o.0
    }

    fn topo(&mut self, input: &[u8]) -> Res {
        let p = self.partition;
        match u8_at(input, 0)? {
            1 => {
                let snap = self.topo_snapshot();
                self.model.hosts[p].topo = Some(snap);
                Ok(vec![0; 4])
            }
            2 => Ok(match &self.model.hosts[p].topo {
                None => vec![1, 0, 0, 0],
                Some(d) => {
                    let mut o = Out::default();
                    o.u8(3).u8(0).u16((d.len() / 4) as u16);
                    o.0
                }
            }),
            3 => {
                let offset = usize::from(u16_at(input, 2)?);
                let d = self.model.hosts[p]
                    .topo
                    .as_ref()
                    .ok_or(ERR_MRPC_NO_PREV_DATA)?;
                if offset % 4 != 0 || offset > d.len() {
                    return Err(ERR_PARAM_INVALID);
                }
                let n = (d.len() - offset).min(TOPO_CHUNK);
                let len_dw = if self.bad_length {
                    BAD_LEN_DW as u16
                } else {
                    (n / 4) as u16
                };
                let mut o = Out::default();
                o.u8(3).u8(0).u16(len_dw);
                o.0.extend_from_slice(&d[offset..offset + n]);
                Ok(o.0)
            }
            4 => {
                self.model.hosts[p]
                    .topo
                    .take()
                    .ok_or(ERR_MRPC_NO_PREV_DATA)?;
                Ok(vec![0; 4])
            }
            _ => Err(ERR_SUBCMD_INVALID),
        }
    }

    // ---- GFMS_DB_DUMP ----
    //
    // Every section starts with switchtec-user's
    // `switchtec_gfms_db_dump_section_hdr` {u8 section_class (the
    // sub-command), u8 pax_idx, u16 swfid, u32 resp_size_dw (the whole
    // section, this header included), u32 rsvd}. FABRIC, PAX and FAB_PORT
    // answer at once; PAX_ALL, HVD, EP_PORT and HVD_DETAIL are fetched in
    // steps (`type` at byte 4: 1 START with the index at byte 1 -> {u32
    // dw_len, u32 num_of_switch}, 2 GET with u32 offset_dw at byte 8 ->
    // {u32 offset_dw, u32 size_dw (3 + data dwords), u32 rsvd, data}, 3
    // FINISH), the section START built staying per MEP until FINISH.

    fn section_hdr(&self, o: &mut Out, class: u8, size_bytes: usize) {
        let dw = if self.bad_length {
            BAD_LEN_DW
        } else {
            (size_bytes / 4) as u32
        };
        o.u8(class).u8(0).u16(0).u32(dw).u32(0);
    }

    fn gfms_db(&mut self, input: &[u8]) -> Res {
        match u8_at(input, 0)? {
            DUMP_FABRIC => Ok(self.fabric_general()),
            DUMP_PAX => Ok(self.pax_general()),
            DUMP_FAB_PORT => self.fab_port(u8_at(input, 1)?),
            sub @ (DUMP_PAX_ALL | DUMP_HVD | DUMP_EP_PORT | DUMP_HVD_DETAIL) => {
                self.dump_step(sub, input)
            }
            _ => Err(ERR_SUBCMD_INVALID),
        }
    }

    /// One START / GET / FINISH step of a chunked dump.
    fn dump_step(&mut self, sub: u8, input: &[u8]) -> Res {
        let p = self.partition;
        match u32_at(input, 4)? {
            DUMP_START => {
                let param = u8_at(input, 1)?;
                let d = match sub {
                    DUMP_PAX_ALL => self.pax_all(),
                    DUMP_HVD => self.hvd_section(usize::from(param))?,
                    DUMP_EP_PORT => self.ep_section(param)?,
                    _ => self.hvd_detail(usize::from(param))?,
                };
                let dw = if self.bad_length {
                    BAD_LEN_DW
                } else {
                    (d.len() / 4) as u32
                };
                self.model.hosts[p].dump = Some((sub, d));
                let mut o = Out::default();
                o.u32(dw).u32(1);
                Ok(o.0)
            }
            DUMP_GET => {
                let off_dw = u32_at(input, 8)? as usize;
                let d = match &self.model.hosts[p].dump {
                    Some((s, d)) if *s == sub => d,
                    _ => return Err(ERR_MRPC_NO_PREV_DATA),
                };
                let total = d.len() / 4;
                if off_dw > total {
                    return Err(ERR_PARAM_INVALID);
                }
                let chunk = if sub == DUMP_EP_PORT {
                    EP_CHUNK_DW
                } else {
                    DUMP_CHUNK_DW
                };
                let n = (total - off_dw).min(chunk - 3);
                let size_dw = if self.bad_length {
                    BAD_LEN_DW
                } else {
                    (3 + n) as u32
                };
                let mut o = Out::default();
                o.u32(off_dw as u32).u32(size_dw).u32(0);
                o.0.extend_from_slice(&d[off_dw * 4..(off_dw + n) * 4]);
                Ok(o.0)
            }
            DUMP_FINISH => match self.model.hosts[p].dump {
                Some((s, _)) if s == sub => {
                    self.model.hosts[p].dump = None;
                    Ok(Vec::new())
                }
                _ => Err(ERR_MRPC_NO_PREV_DATA),
            },
            _ => Err(ERR_SUBCMD_INVALID),
        }
    }

    /// FABRIC: `switchtec_gfms_db_fabric_general`, this switch (PAX index
    /// 0) alone: the other 15 indices unreachable.
    fn fabric_general(&self) -> Vec<u8> {
        let mut o = Out::default();
        self.section_hdr(&mut o, DUMP_FABRIC, 12 + 12 + 16 * 4);
        o.zeros(12);
        for i in 0..16u8 {
            o.u8(i).u8(if i == 0 { REACH_UC } else { REACH_UR }).u16(0);
        }
        o.0
    }

    /// PAX: `switchtec_gfms_db_pax_general` (80 bytes).
    fn pax_general(&self) -> Vec<u8> {
        let m = &*self.model;
        let mut o = Out::default();
        self.section_hdr(&mut o, DUMP_PAX, 80);
        let is_host = |p: &crate::model::Port| matches!(p.kind, PortKind::Host(_));
        let rc = m.port_map(is_host);
        let ep = m.port_map(|p| !is_host(p));
        let free = ((1u64 << crate::config::MAX_PORTS) - 1) & !(rc | ep);
        // The PDFIDs of ports 0-47 as ever; VFs from 32 on (model::pdfid) widen the range.
        let pdfid_end = m.functions.iter().map(|f| f.pdfid).fold(0x06ff, u16::max);
        o.u8(m.ports.len() as u8)
            .u8(m.hosts.len() as u8)
            .u16(m.endpoints.len() as u16)
            .u16(m.functions.len() as u16)
            .u16(0)
            .zeros(12);
        for v in [
            0x0001,
            pdfid_end.max(0x0fff),
            0x0800,
            0x082f,
            0x0900,
            0x09ff,
            0x0100,
            pdfid_end,
        ] {
            o.u16(v);
        }
        o.u64(rc).u64(ep).u64(0).u64(free);
        o.0
    }

    /// One `switchtec_gfms_db_hvd_body`: 8 bytes and 8 `port_bound`
    /// entries per logical port, function-major (entry j * count + l:
    /// function j of logical port l).
    fn hvd_body(&self, o: &mut Out, idx: usize) {
        let m = &*self.model;
        let host = &m.hosts[idx];
        o.u8(idx as u8)
            .u8(host.port)
            .u16(0x0800 + idx as u16)
            .u16(u16::from(LOG_PORTS))
            .u16(0);
        // Function-major, as cli/fabric.c indexes it: entry j * count + l is
        // function j of logical port l.
        for slot in 0..MULTI_FUNC_NUM as u8 {
            for l in 0..LOG_PORTS {
                let b = m
                    .functions
                    .iter()
                    .find(|f| f.binding == Some((idx, l)) && f.devfn == slot)
                    .map(|f| f.pdfid);
                o.u8(l).u8(u8::from(b.is_some())).u16(b.unwrap_or(0));
            }
        }
    }

    fn hvd_body_len() -> usize {
        8 + usize::from(LOG_PORTS) * MULTI_FUNC_NUM * 4
    }

    /// HVD: the section of host (HVD instance) `idx`.
    fn hvd_section(&self, idx: usize) -> Res {
        if idx >= self.model.hosts.len() {
            return Err(ERR_PARAM_INVALID);
        }
        let mut o = Out::default();
        self.section_hdr(&mut o, DUMP_HVD, 12 + Self::hvd_body_len());
        self.hvd_body(&mut o, idx);
        Ok(o.0)
    }

    /// HVD_DETAIL: `switchtec_gfms_db_hvd_detail_body` as the client parses
    /// it: one VEP (the MEP), the logical DSPs' 8 function entries each, a
    /// zero P2P enable bitmap and so no P2P bitmaps.
    fn hvd_detail(&self, idx: usize) -> Res {
        let m = &*self.model;
        let host = m.hosts.get(idx).ok_or(ERR_PARAM_INVALID)?;
        let size = 12 + 8 + 4 + 4 + usize::from(LOG_PORTS) * MULTI_FUNC_NUM * 8 + 8;
        let mut o = Out::default();
        self.section_hdr(&mut o, DUMP_HVD_DETAIL, size);
        let up = m.link_up(host.port);
        o.u8(idx as u8)
            .u8(host.port)
            .u16(0x0800 + idx as u16)
            .u8(1)
            .u8(u8::from(up))
            .u16(0);
        // The VEP: the management endpoint, bdf 00:00.1 of the host's switch.
        o.u8(VEP_TYPE_MGMT).u8(0).u16(0x0001);
        o.u16(u16::from(LOG_PORTS)).u16(0x0000);
        for slot in 0..MULTI_FUNC_NUM as u8 {
            for l in 0..LOG_PORTS {
                let b = m
                    .functions
                    .iter()
                    .find(|f| f.binding == Some((idx, l)) && f.devfn == slot)
                    .map(|f| f.pdfid);
                // DSP l is device l on the switch's internal bus 1.
                let dsp_bdf = 0x0100 | u16::from(l) << 3;
                o.u8(l)
                    .u8(u8::from(b.is_some()))
                    .u16(dsp_bdf)
                    .u16(b.unwrap_or(0))
                    .u16(0);
            }
        }
        o.u32(0).u32(0);
        Ok(o.0)
    }

    /// FAB_PORT: `switchtec_gfms_db_fab_port`. This switch has no fabric
    /// (inter-switch) ports; any physical port answers "nothing attached".
    fn fab_port(&self, pid: u8) -> Res {
        if pid >= crate::config::MAX_PORTS {
            return Err(ERR_PHYC_PORT_NOT_EXIST);
        }
        let mut o = Out::default();
        self.section_hdr(&mut o, DUMP_FAB_PORT, 12 + 20);
        o.u8(pid)
            .zeros(3)
            .u8(0xff)
            .u8(0xff)
            .u16(0xffff)
            .u32(0)
            .zeros(8);
        Ok(o.0)
    }

    /// The `switchtec_gfms_db_ep_port` of an endpoint port: port header,
    /// then (link up) the attachment header and 36 bytes per function.
    fn ep_port_sub(&self, port: u8) -> Res {
        let m = &*self.model;
        let p = m.port(port).ok_or(ERR_PHYC_PORT_NOT_EXIST)?;
        let PortKind::Endpoint(e) = p.kind else {
            return Err(ERR_PHYC_PORT_NOT_EXIST);
        };
        let funcs: Vec<_> = m.endpoint_functions(e).collect();
        let n = funcs.len();
        let present = p.link_up;
        let port_dw = if present { 2 + 2 + 9 * n } else { 2 };
        let mut o = Out::default();
        o.u8(if present { 0 } else { 2 })
            .u8(port)
            .u16(u16::from(present))
            .u32(port_dw as u32);
        if present {
            o.u16(n as u16).u16(0).u32((2 + 9 * n) as u32);
            for f in funcs {
                let (host_pid, log_pid) = match f.binding {
                    Some((h, l)) => (m.hosts[h].port, l),
                    None => (0, 0),
                };
                let (ty, vf_num) = if f.vf_index != 0 {
                    (FUNC_SRIOV_VF, f.vf_index)
                } else if f.total_vfs > 0 {
                    (FUNC_SRIOV_PF, f.total_vfs)
                } else {
                    (FUNC_PF, 0)
                };
                // No BAR2 (an nvme function): type and size 0, as for an absent BAR.
                let (bar_count, bar2_type, bar2_exp) = if f.bar2 == 0 {
                    (1u8, 0, 0)
                } else {
                    (2, BAR_MEM64_PREFETCH, f.bar2.trailing_zeros() as u8)
                };
                o.u16(u16::from(f.vf_index))
                    .u16(f.pdfid)
                    .u8(ty)
                    .u8(vf_num)
                    .u16(0)
                    .u8(u8::from(f.binding.is_some()))
                    .u8(0)
                    .u8(host_pid)
                    .u8(log_pid)
                    .u16(f.vid)
                    .u16(f.did)
                    .u16(f.vid)
                    .u16(f.did)
                    .u32(f.class & 0xff_ffff | u32::from(bar_count) << 24)
                    .u8(BAR_MEM64)
                    .u8(FN_BAR0_EXP)
                    .zeros(2)
                    .u8(bar2_type)
                    .u8(bar2_exp)
                    .zeros(6);
            }
        }
        Ok(o.0)
    }

    /// EP_PORT: one port's section.
    fn ep_section(&self, port: u8) -> Res {
        let sub = self.ep_port_sub(port)?;
        // The section header's size is always the true one here; a
        // bad-length fault corrupts the START and GET replies instead.
        let mut o = Out::default();
        o.u8(DUMP_EP_PORT)
            .u8(0)
            .u16(0)
            .u32((3 + sub.len() / 4) as u32)
            .u32(0);
        o.0.extend_from_slice(&sub);
        Ok(o.0)
    }

    /// PAX_ALL: the PAX section, every HVD under one header, every EP port
    /// under one header (switchtec_fab_gfms_db_dump_pax_all's parse).
    fn pax_all(&self) -> Vec<u8> {
        let m = &*self.model;
        let mut o = Out::default();
        o.0.extend_from_slice(&self.pax_general());
        self.section_hdr(&mut o, DUMP_HVD, 12 + m.hosts.len() * Self::hvd_body_len());
        for h in 0..m.hosts.len() {
            self.hvd_body(&mut o, h);
        }
        let mut eps = Vec::new();
        for p in &m.ports {
            if let PortKind::Endpoint(_) = p.kind {
                if let Ok(sub) = self.ep_port_sub(p.id) {
                    eps.extend_from_slice(&sub);
                }
            }
        }
        self.section_hdr(&mut o, DUMP_EP_PORT, 12 + eps.len());
        o.0.extend_from_slice(&eps);
        o.0
    }

    // ---- GFMS_EVENT ----

    fn gfms_event(&mut self, input: &[u8]) -> Res {
        if input.len() < 4 {
            return Err(ERR_PARAM_INVALID);
        }
        let host = &mut self.model.hosts[self.partition];
        match input[0] {
            0 => {
                host.events.clear();
                host.overflow = false;
                Ok(Vec::new())
            }
            1 => {
                let req = usize::from(u16_at(input, 2)?);
                let mut data = Vec::new();
                let mut num = 0u16;
                while usize::from(num) < req {
                    let Some(ev) = host.events.front() else { break };
                    let e = ev.encode();
                    if 4 + data.len() + e.len() > PAYLOAD {
                        break;
                    }
                    data.extend_from_slice(&e);
                    host.events.pop_front();
                    num += 1;
                }
                let remain =
                    (host.events.len().min(0x7fff) as u16) | if host.overflow { 0x8000 } else { 0 };
                host.overflow = false;
                let mut o = Out::default();
                o.u16(if self.bad_length { 300 } else { num }).u16(remain);
                o.0.extend_from_slice(&data);
                Ok(o.0)
            }
            _ => Err(ERR_SUBCMD_INVALID),
        }
    }

    // ---- PORT_CONTROL ----

    fn port_control(&mut self, input: &[u8]) -> Res {
        if input.len() < 4 {
            return Err(ERR_PARAM_INVALID);
        }
        let (ty, port, flag) = (input[0], input[1], input[2]);
        if ty > 3 {
            return Err(ERR_SUBCMD_INVALID);
        }
        if self.model.port(port).is_none() {
            return Err(ERR_PHYC_PORT_NOT_EXIST);
        }
        if ty == 3 && flag > 1 {
            return Err(ERR_PARAM_INVALID);
        }
        let steps: &[bool] = match ty {
            0 => &[false],
            1 => &[true],
            _ => &[false, true],
        };
        for &up in steps {
            if let Ok(Some(n)) = self.model.set_link(port, up) {
                self.notices.push(n);
            }
        }
        Ok(Vec::new())
    }

    // ---- pcifab extensions ----

    /// Check the version/size header of an extension input.
    fn ext_input(input: &[u8], min: usize) -> Result<(), u32> {
        let version = u16_at(input, 0)?;
        let size = usize::from(u16_at(input, 2)?);
        if version != EXT_VERSION || size < min || input.len() < size {
            return Err(ERR_PARAM_INVALID);
        }
        Ok(())
    }

    fn summary(&mut self, input: &[u8]) -> Res {
        Self::ext_input(input, 4)?;
        let m = &*self.model;
        let mut o = Out::default();
        o.u16(EXT_VERSION)
            .u16(32)
            .u32(m.generation)
            .u8(m.hosts.len() as u8)
            .u8(self.partition as u8)
            .u8(m.ports.len() as u8)
            .u8(m.endpoints.len() as u8)
            .u16(m.functions.len() as u16)
            .u16(m.bound_count() as u16)
            .u64(m.port_map(|p| p.link_up))
            .u32(m.hosts[self.partition].events.len() as u32)
            .u32(0);
        Ok(o.0)
    }

    fn telemetry(&mut self, input: &[u8]) -> Res {
        Self::ext_input(input, 8)?;
        let pdfid = u16_at(input, 4)?;
        let m = &*self.model;
        let f = m.function(pdfid).ok_or(PCIFAB_ERR_PDFID_UNKNOWN)?;
        let (temp, power, util, health) = m.telemetry(f);
        let mut o = Out::default();
        o.u16(EXT_VERSION)
            .u16(24)
            .u16(pdfid)
            .u16(0)
            .u32(temp as u32)
            .u32(power)
            .u8(util)
            .zeros(3)
            .u32(health);
        Ok(o.0)
    }

    fn p2p_route(&mut self, input: &[u8]) -> Res {
        Self::ext_input(input, ROUTE_INPUT_SIZE)?;
        let host = self.partition;
        let count = match u8_at(input, 4)? {
            ROUTE_ADD => self.model.add_route(
                host,
                u64_at(input, 8)?,
                u64_at(input, 16)?,
                u64_at(input, 24)?,
                u16_at(input, 6)?,
            )?,
            ROUTE_DEL => self.model.del_route(host, u64_at(input, 8)?)?,
            sub @ (ROUTE_GRANT | ROUTE_REVOKE) => {
                // pdfid at 6, grantee at 8, the rest of the structure zero.
                if input[9..ROUTE_INPUT_SIZE].iter().any(|&b| b != 0) {
                    return Err(ERR_PARAM_INVALID);
                }
                let (pdfid, grantee) = (u16_at(input, 6)?, usize::from(u8_at(input, 8)?));
                if sub == ROUTE_GRANT {
                    self.model.grant(host, pdfid, grantee)?
                } else {
                    let (n, lost) = self.model.revoke(host, pdfid, grantee)?;
                    if lost {
                        self.notices.push(Notice {
                            routes_lost: vec![grantee],
                            ..Notice::default()
                        });
                    }
                    n
                }
            }
            ROUTE_GRANT_LIST => {
                let grants = self.model.grant_list(host);
                let mut o = Out::default();
                o.u16(EXT_VERSION)
                    .u16((8 + GRANT_ENTRY_SIZE * grants.len()) as u16)
                    .u16(grants.len() as u16)
                    .u16(GRANT_ENTRY_SIZE as u16);
                for (pdfid, holder, grantee) in grants {
                    o.u16(pdfid).u8(holder as u8).u8(grantee as u8).u32(0);
                }
                return Ok(o.0);
            }
            ROUTE_LIST => {
                let m = &*self.model;
                let routes = &m.hosts[host].routes;
                let mut o = Out::default();
                o.u16(EXT_VERSION)
                    .u16((8 + ROUTE_ENTRY_SIZE * routes.len()) as u16)
                    .u16(routes.len() as u16)
                    .u16(ROUTE_ENTRY_SIZE as u16);
                for r in routes {
                    let target_host = m
                        .function(r.pdfid)
                        .and_then(|f| f.binding)
                        .map_or(0xff, |b| b.0 as u8);
                    o.u64(r.window_off)
                        .u64(r.size)
                        .u64(r.target_off)
                        .u16(r.pdfid)
                        .u8(target_host)
                        .u8(0)
                        .u32(0);
                }
                return Ok(o.0);
            }
            _ => return Err(ERR_SUBCMD_INVALID),
        };
        let mut o = Out::default();
        o.u16(EXT_VERSION).u16(8).u16(count as u16).u16(0);
        Ok(o.0)
    }

    fn list(&mut self, input: &[u8]) -> Res {
        Self::ext_input(input, 8)?;
        let start = usize::from(u16_at(input, 4)?);
        let max = match usize::from(u16_at(input, 6)?) {
            0 => LIST_MAX_ENTRIES,
            n => n.min(LIST_MAX_ENTRIES),
        };
        let m = &*self.model;
        let total = m.functions.len();
        if start > total {
            return Err(PCIFAB_ERR_RANGE);
        }
        let page = &m.functions[start..(start + max).min(total)];
        let mut o = Out::default();
        o.u16(EXT_VERSION)
            .u16((LIST_HDR_SIZE + LIST_ENTRY_SIZE * page.len()) as u16)
            .u32(m.generation)
            .u16(total as u16)
            .u16(start as u16)
            .u16(page.len() as u16)
            .u16(LIST_ENTRY_SIZE as u16);
        for f in page {
            let mut flags = 0u8;
            if f.vf_index != 0 {
                flags |= 1;
            }
            if f.binding.is_some() {
                flags |= 2;
            }
            if m.link_up(f.port) {
                flags |= 4;
            }
            let (host, lport) = match f.binding {
                Some((h, l)) => (h as u8, l),
                None => (0xff, 0xff),
            };
            o.u16(f.pdfid)
                .u16(f.pf_pdfid)
                .u16(f.vid)
                .u16(f.did)
                .u32(f.class & 0xff_ffff)
                .u8(f.port)
                .u8(f.vf_index)
                .u8(f.total_vfs)
                .u8(flags)
                .u8(u8::from(f.binding.is_some()))
                .u8(host)
                .u8(lport)
                .u8(0)
                .u32(0);
        }
        if self.bad_length {
            put_u16(&mut o.0, 2, 2048);
            put_u16(&mut o.0, 12, 84);
        }
        Ok(o.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn model() -> Model {
        let text = include_str!("../fabric.toml");
        Model::new(&Config::parse(text).expect("fabric.toml"))
    }

    fn run(m: &mut Model, cmd: u32, input: &[u8]) -> MrpcOutcome {
        Exec {
            model: m,
            partition: 0,
            bad_length: false,
            notices: Vec::new(),
            deferred: None,
            ep_access: None,
        }
        .run(cmd, input)
    }

    #[test]
    fn basic_commands() {
        let mut m = model();
        assert_eq!(run(&mut m, MRPC_ECHO, b"abc").output, [!b'a', !b'b', !b'c']);
        let t = run(&mut m, MRPC_DIETEMP, &DIETEMP_GET.to_le_bytes());
        assert_eq!(
            (t.status, t.output),
            (MRPC_STATUS_DONE, 4500u32.to_le_bytes().to_vec())
        );
        let bad = run(&mut m, MRPC_DIETEMP, &7u32.to_le_bytes());
        assert_eq!(
            (bad.status, bad.ret),
            (MRPC_STATUS_ERROR, ERR_SUBCMD_INVALID)
        );
        let unk = run(&mut m, 0x1234, &[]);
        assert_eq!((unk.status, unk.ret), (MRPC_STATUS_ERROR, ERR_CMD_INVALID));
        assert_eq!(run(&mut m, 0xf0ff, &[]).ret, ERR_CMD_INVALID);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let mut m = model();
        for (cmd, input, ret) in [
            (MRPC_TOPO_INFO_DUMP, &[][..], ERR_PARAM_INVALID),
            (MRPC_TOPO_INFO_DUMP, &[9][..], ERR_SUBCMD_INVALID),
            (
                MRPC_TOPO_INFO_DUMP,
                &[3, 0, 0, 0][..],
                ERR_MRPC_NO_PREV_DATA,
            ),
            (MRPC_TOPO_INFO_DUMP, &[4][..], ERR_MRPC_NO_PREV_DATA),
            (MRPC_GFMS_DB_DUMP, &[7][..], ERR_SUBCMD_INVALID),
            (MRPC_GFMS_DB_DUMP, &[3][..], ERR_PARAM_INVALID),
            (MRPC_GFMS_DB_DUMP, &[3, 2][..], ERR_PARAM_INVALID),
            (
                MRPC_GFMS_DB_DUMP,
                &[3, 2, 0, 0, 1, 0, 0, 0][..],
                ERR_PARAM_INVALID,
            ),
            (
                MRPC_GFMS_DB_DUMP,
                &[3, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0][..],
                ERR_MRPC_NO_PREV_DATA,
            ),
            (
                MRPC_GFMS_DB_DUMP,
                &[6, 0, 0, 0, 3, 0, 0, 0][..],
                ERR_MRPC_NO_PREV_DATA,
            ),
            (
                MRPC_GFMS_DB_DUMP,
                &[5, 0, 0, 0, 1, 0, 0, 0][..],
                ERR_PHYC_PORT_NOT_EXIST,
            ),
            (
                MRPC_GFMS_DB_DUMP,
                &[5, 16, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0][..],
                ERR_MRPC_NO_PREV_DATA,
            ),
            (
                MRPC_GFMS_DB_DUMP,
                &[5, 16, 0, 0, 7, 0, 0, 0][..],
                ERR_SUBCMD_INVALID,
            ),
            (MRPC_GFMS_EVENT, &[1, 0][..], ERR_PARAM_INVALID),
            (MRPC_GFMS_EVENT, &[2, 0, 0, 0][..], ERR_SUBCMD_INVALID),
            (MRPC_PORT_CONTROL, &[0, 1, 0][..], ERR_PARAM_INVALID),
            (MRPC_PORT_CONTROL, &[4, 0, 0, 0][..], ERR_SUBCMD_INVALID),
            (
                MRPC_PORT_CONTROL,
                &[0, 47, 0, 0][..],
                ERR_PHYC_PORT_NOT_EXIST,
            ),
            (MRPC_PORT_CONTROL, &[3, 0, 2, 0][..], ERR_PARAM_INVALID),
            (MRPC_FABRIC_SUMMARY, &[1, 0][..], ERR_PARAM_INVALID),
            (MRPC_FABRIC_SUMMARY, &[2, 0, 4, 0][..], ERR_PARAM_INVALID),
            (MRPC_FABRIC_SUMMARY, &[1, 0, 8, 0][..], ERR_PARAM_INVALID),
            (MRPC_FUNCTION_LIST, &[1, 0, 4, 0][..], ERR_PARAM_INVALID),
            (
                MRPC_FUNCTION_LIST,
                &[1, 0, 8, 0, 11, 0, 0, 0][..],
                PCIFAB_ERR_RANGE,
            ),
            (
                MRPC_FUNCTION_TELEMETRY,
                &[1, 0, 8, 0, 0x99, 0x09, 0, 0][..],
                PCIFAB_ERR_PDFID_UNKNOWN,
            ),
        ] {
            let r = run(&mut m, cmd, input);
            assert_eq!(
                (r.status, r.ret),
                (MRPC_STATUS_ERROR, ret),
                "cmd {cmd:#x} input {input:?}"
            );
        }
        // Exactly at the end: an empty page.
        let r = run(&mut m, MRPC_FUNCTION_LIST, &[1, 0, 8, 0, 10, 0, 0, 0]);
        assert_eq!(r.status, MRPC_STATUS_DONE);
        assert_eq!(&r.output[12..14], &[0, 0]);
    }

    #[test]
    fn port_control_changes_links() {
        let mut m = model();
        let mut x = Exec {
            model: &mut m,
            partition: 1,
            bad_length: false,
            notices: Vec::new(),
            deferred: None,
            ep_access: None,
        };
        assert_eq!(x.run(MRPC_PORT_CONTROL, &[0, 16, 0, 0]).status, 2);
        assert_eq!(x.notices.len(), 1);
        assert_eq!(x.run(MRPC_PORT_CONTROL, &[0, 16, 0, 0]).status, 2);
        assert_eq!(x.notices.len(), 1, "already down");
        assert_eq!(x.run(MRPC_PORT_CONTROL, &[1, 16, 0, 0]).status, 2);
        assert_eq!(x.notices.len(), 2);
        assert_eq!(x.run(MRPC_PORT_CONTROL, &[2, 16, 0, 0]).status, 2);
        assert_eq!(x.notices.len(), 4, "retrain: down, up");
        assert!(m.link_up(16));
    }

    fn le16(b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes([b[at], b[at + 1]])
    }

    fn le32(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    fn ok(m: &mut Model, cmd: u32, input: &[u8]) -> Vec<u8> {
        let r = run(m, cmd, input);
        assert_eq!(
            (r.status, r.ret),
            (MRPC_STATUS_DONE, 0),
            "cmd {cmd:#x} {input:?}"
        );
        r.output
    }

    /// START, GETs, FINISH as lib/fabric.c's gfms_dump_start/get/finish.
    fn chunked(m: &mut Model, sub: u8, param: u8) -> Vec<u8> {
        let st = ok(m, MRPC_GFMS_DB_DUMP, &[sub, param, 0, 0, 1, 0, 0, 0]);
        // {u32 dw_len @0, u32 num_of_switch @4}
        let total = le32(&st, 0) as usize;
        assert_eq!(le32(&st, 4), 1);
        let mut d = Vec::new();
        while d.len() < total * 4 {
            let mut inp = vec![sub, 0, 0, 0, 2, 0, 0, 0];
            inp.extend_from_slice(&((d.len() / 4) as u32).to_le_bytes());
            let r = ok(m, MRPC_GFMS_DB_DUMP, &inp);
            // {u32 offset_dw @0, u32 size_dw @4 (3 + data), u32 rsvd @8, data @12}
            assert_eq!(le32(&r, 0) as usize, d.len() / 4);
            let n = le32(&r, 4) as usize - 3;
            assert_eq!(r.len(), 12 + 4 * n);
            d.extend_from_slice(&r[12..]);
        }
        assert!(ok(m, MRPC_GFMS_DB_DUMP, &[sub, 0, 0, 0, 3, 0, 0, 0]).is_empty());
        d
    }

    /// Byte offsets of every structure served, checked against the numbers
    /// derived from switchtec-user's headers (inc/switchtec/fabric.h,
    /// mrpc.h, switchtec.h, lib/fabric.c, lib/switchtec.c, lib/pmon.c) and
    /// Linux's include/linux/switchtec.h, written out here.
    #[test]
    fn layouts_match_switchtec_user() {
        let mut m = model();
        // switchtec_get_device_info: {u32 dev_info @0, u32 ping_reply @4};
        // phase = dev_info & 0xff, rev = bits 8-11, gen = bits 12-15 (0: Gen4).
        let r = ok(&mut m, MRPC_I2C_TWI_PING, &0xdead_beefu32.to_le_bytes());
        assert_eq!((r.len(), le32(&r, 0), le32(&r, 4)), (8, 3, !0xdead_beef));
        // set_local_pax_id: one byte.
        assert_eq!(ok(&mut m, MRPC_GET_PAX_ID, &[]), [0]);
        // cli/main.c test: out == ~in.
        assert_eq!(
            ok(&mut m, MRPC_ECHO, &0x1234_5678u32.to_le_bytes()),
            (!0x1234_5678u32).to_le_bytes()
        );

        // switchtec_status_gen345: 52 (Gen4) entries of 12 bytes: phys_port_id
        // @0, par_id @1, log_port_id @2, stk_id @3, cfg_lnk_width @4,
        // neg_lnk_width @5, usp_flag @6, linkup_linkrate @7, LTSSM @8 (u16),
        // lane_reversal @10, first_act_lane @11.
        let l = ok(&mut m, MRPC_LNKSTAT, &0u64.to_le_bytes());
        assert_eq!((l.len(), LNKSTAT_ENTRY), (52 * 12, 12));
        assert_eq!(&l[12..20], &[8, 1, 0, 0x10, 16, 16, 1, 0x84], "h1's USP");
        assert_eq!(
            &l[24..32],
            &[16, 255, 0, 0x20, 4, 4, 0, 0x84],
            "gpu0: unbound"
        );
        assert_eq!(le16(&l, 32), 3);
        assert_eq!(l[4 * 12 + 3], 0xff, "no fifth port");

        // switchtec_bwcntr_res: time_us @0, egress {posted, comp, nonposted}
        // @8, ingress @32; 56 bytes. pmon_bw_get: sub @0, count @1, {id, clear} @2.
        let b = ok(&mut m, MRPC_PMON, &[1, 2, 0, 0, 16, 0]);
        assert_eq!(b.len(), 2 * 56);
        assert!(u64::from_le_bytes(b[56..64].try_into().unwrap()) > 0);

        // switchtec_fab_port_config: port_type @0, clock_source @1,
        // clock_sris @2, hvd_inst @3; FABRIC_HOST 3, FABRIC_EP 2, UNUSED 0.
        assert_eq!(ok(&mut m, MRPC_PORT_CONFIG, &[1, 8, 0, 0]), [3, 0, 0, 1]);
        assert_eq!(
            ok(&mut m, MRPC_PORT_CONFIG, &[1, 16, 0, 0]),
            [2, 0, 0, 0xff]
        );
        assert_eq!(ok(&mut m, MRPC_PORT_CONFIG, &[1, 5, 0, 0]), [0, 0, 0, 0xff]);

        // switchtec_gfms_db_dump_section_hdr: section_class @0, pax_idx @1,
        // swfid @2, resp_size_dw @4, rsvd @8 (12 bytes).
        // fabric_general: body rsvd[3] @12, pax_idx[16] {pax_idx, reachable_type,
        // rsvd u16} @24; 88 bytes.
        let f = ok(&mut m, MRPC_GFMS_DB_DUMP, &[DUMP_FABRIC]);
        assert_eq!((f.len(), le32(&f, 4)), (88, 22));
        assert_eq!(&f[24..32], &[0, REACH_UC, 0, 0, 1, REACH_UR, 0, 0]);

        // pax_general body @12: phy_port_count @12, hvd_count @13, ep_count
        // @14, ep_function_count @16, rsvd0 @18, rsvd1[3] @20, fid_start @32 ..
        // pdfid_end @46, rc_port_map @48, ep_port_map @56, fab_port_map @64,
        // free_port_map @72; 80 bytes.
        let p = ok(&mut m, MRPC_GFMS_DB_DUMP, &[DUMP_PAX]);
        assert_eq!((p.len(), le32(&p, 4)), (80, 20));
        assert_eq!((p[12], p[13], le16(&p, 14), le16(&p, 16)), (4, 2, 2, 10));
        assert_eq!((le16(&p, 44), le16(&p, 46)), (0x100, 0x6ff), "pdfid range");
        assert_eq!(le32(&p, 48), 1 | 1 << 8);
        assert_eq!(le32(&p, 56), 1 << 16 | 1 << 24);

        // hvd_body: hvd_inst_id @0, phy_pid @1, hfid @2, logical_port_count @4,
        // rsvd @6, port_bound[8 per logical port] {log_pid, bound, bound_pdfid
        // u16} @8, function-major: entry j * logical_port_count + l.
        let h = chunked(&mut m, DUMP_HVD, 1);
        assert_eq!((h.len(), le32(&h, 4)), (12 + 8 + 4 * 8 * 4, 37));
        assert_eq!((h[12], h[13], le16(&h, 14), le16(&h, 16)), (1, 8, 0x801, 4));
        let e = 20 + 4; // entry 0 * 4 + 1: function 0 of logical port 1
        assert_eq!((h[e], h[e + 1], le16(&h, e + 2)), (1, 1, 0x0402));

        // hvd_detail_body @12: hvd_inst_id, phy_pid, hfid u16, vep_count @4,
        // usp_status @5, rsvd @6, vep_region[vep_count] {type, rsvd, bdf} @8,
        // then log_dsp_count u16, usp_bdf u16, log_port_region[count * 8]
        // {log_pid, bound, dsp_bdf, bound_pdfid, bound_hvd_bdf} (8 bytes), then
        // p2p enable bitmap low/high.
        let d = chunked(&mut m, DUMP_HVD_DETAIL, 0);
        let b = 12;
        assert_eq!((d[b], d[b + 1], d[b + 4], d[b + 5]), (0, 0, 1, 1));
        let after_vep = b + 8 + 4;
        assert_eq!(le16(&d, after_vep), 4, "log_dsp_count");
        let lp = after_vep + 4;
        assert_eq!(
            (d[lp], d[lp + 1], le16(&d, lp + 4)),
            (0, 1, 0x0301),
            "h0 lport 0"
        );
        assert_eq!(d.len(), lp + 4 * 8 * 8 + 8);
        assert_eq!(le32(&d, 4) as usize * 4, d.len());

        // fab_port body @12: phy_pid @0, rsvd0 @1, attached_phy_pid @4,
        // attached_sw_idx @5, attached_swfid @6, attached_fw_version @8,
        // rsvd1 @12; 32 bytes.
        let fp = ok(&mut m, MRPC_GFMS_DB_DUMP, &[DUMP_FAB_PORT, 16]);
        assert_eq!((fp.len(), fp[12], fp[16], fp[17]), (32, 16, 0xff, 0xff));

        // ep_port: section hdr, ep_port_hdr {type @0, phy_pid @1, ep_count
        // @2, size_dw:24 @4} @12, attachement_hdr {function_number @0,
        // attached_dsp_enumid @2, size_dw:24 @4} @20, functions @28 of 36
        // bytes: func_id @0, pdfid @2, sriov_cap_pf @4, vf_num @5, rsvd @6,
        // bound @8, bound_pax_id @9, bound_hvd_phy_pid @10, bound_hvd_log_pid
        // @11, vid @12, did @14, sub_sys_vid @16, sub_sys_did @18,
        // device_class:24 | bar_number:8 @20, bars[6] {type, size} @24.
        let ep = chunked(&mut m, DUMP_EP_PORT, 24);
        assert_eq!((ep[12], ep[13], le16(&ep, 14)), (0, 24, 1));
        assert_eq!((le16(&ep, 20), le32(&ep, 24)), (5, 2 + 9 * 5));
        let fnr = |i: usize| 28 + 36 * i;
        let pf = fnr(0);
        assert_eq!(
            (le16(&ep, pf), le16(&ep, pf + 2), ep[pf + 4], ep[pf + 5]),
            (0, 0x400, 3, 4)
        );
        let vf2 = fnr(2);
        assert_eq!(
            (le16(&ep, vf2), le16(&ep, vf2 + 2), ep[vf2 + 4], ep[vf2 + 5]),
            (2, 0x402, 0, 2)
        );
        assert_eq!(
            &ep[vf2 + 8..vf2 + 12],
            &[1, 0, 8, 1],
            "bound to h1 (port 8) lport 1"
        );
        assert_eq!((le16(&ep, vf2 + 12), le16(&ep, vf2 + 14)), (0x10de, 0x2331));
        assert_eq!(le32(&ep, vf2 + 20), 0x0203_0200, "class, 2 BARs");
        assert_eq!(
            &ep[vf2 + 24..vf2 + 30],
            &[BAR_MEM64, 14, 0, 0, BAR_MEM64_PREFETCH, 20]
        );
        assert_eq!(ep.len(), fnr(5));

        // PAX_ALL: pax_general, then one HVD header and both bodies, then one
        // EP header and both ports: exactly what gfms_pax_all_parse consumes.
        let all = chunked(&mut m, DUMP_PAX_ALL, 0);
        assert_eq!(&all[..80], &p[..]);
        let hv = 80;
        assert_eq!(le32(&all, hv + 4) as usize * 4, 12 + 2 * 136);
        let eh = hv + 12 + 2 * 136;
        assert_eq!(le32(&all, eh + 4) as usize * 4, all.len() - eh);
        assert_eq!(all[eh + 12 + 1], 16, "first EP port");

        // topo_info_reply_gen4: sw_idx @0, rsvd @1, stack_bif[7] @4,
        // route_port[16] @32, port_bitmap @48, switchtec_fab_port_info[] @56
        // of 32 bytes (phys_port_id @0, port_type @1, ..., port_cfg_width @24,
        // port_neg_width @25, cfg_rate @26, neg_rate @27, major_ltssm @28).
        ok(&mut m, MRPC_TOPO_INFO_DUMP, &[1]);
        let st = ok(&mut m, MRPC_TOPO_INFO_DUMP, &[2]);
        assert_eq!((st[0], le16(&st, 2)), (3, (56 + 4 * 32) / 4));
        let t = ok(&mut m, MRPC_TOPO_INFO_DUMP, &[3, 0, 0, 0]);
        let t = &t[4..];
        assert_eq!(
            u64::from_le_bytes(t[48..56].try_into().unwrap()),
            1 | 1 << 8 | 1 << 16 | 1 << 24
        );
        assert_eq!(&t[56 + 32..56 + 32 + 2], &[8, 3]);
        assert_eq!(t[56 + 32 + 28], 3);

        // GFMS_EVENT entry: entry_len u16 @0, event_code @2, src_sw_id @3,
        // data @4; bind data {host_sw_idx, host_phys_port_id, log_port_id,
        // rsvd, pdfid u16}.
        let ev = crate::model::GfmsEvent::Binding {
            code: crate::model::GFMS_BIND,
            host_port: 8,
            log_port: 1,
            pdfid: 0x0402,
        }
        .encode();
        assert_eq!(ev, [12, 0, 6, 0, 0, 8, 1, 0, 0x02, 0x04, 0, 0]);

        // Linux's struct dma_mrpc_output: status @0, cmd_id @4, rtn_code @8,
        // output_size @12, data @16.
        assert_eq!(crate::gas::DMA_MRPC_OUTPUT_SIZE, 16 + 1024);

        // switchtec_flash_info_gen4: firmware_version @0, flash_size @4,
        // device_id @8, ecc_enable @10, running_*_flag @12..16, rsvd2[12] @16,
        // then map0, map1, keyman0, keyman1, bl20, bl21, cfg0, cfg1, img0,
        // img1, nvlog, vendor[8] of 32 bytes each: image_crc @0, image_len @4,
        // image_version @8, valid @10, active @11, part_start @12, part_end
        // @16, part_offset @20, part_size_dw @24, read_only @28, is_using @29.
        let fi = ok(&mut m, MRPC_PART_INFO, &[0]);
        assert_eq!((fi.len(), FLASH_INFO_SIZE), (672, 672));
        assert_eq!((le32(&fi, 0), le16(&fi, 8)), (0x0407_0041, 0x4228));
        let img0 = 64 + 8 * 32;
        assert_eq!((fi[img0 + 10], fi[img0 + 11], fi[img0 + 29]), (1, 1, 1));
        let img1 = img0 + 32;
        assert_eq!((fi[img1 + 10], fi[img1 + 11], fi[img1 + 29]), (1, 0, 0));
        assert_eq!(le32(&fi, img0 + 24) * 4, FLASH_PART_BYTES);
        // switchtec_fw_metadata_gen4: magic @0, sub_magic @4, header_len @16,
        // image_len @24, type @28, fw_id @32, version @36, date_str @48,
        // img_str @64, image_crc @84, public_key_modulus @88, xml_version
        // @612, relocatable_img_len @616, link_addr @620, header_crc @624.
        let md = ok(&mut m, MRPC_PART_INFO, &[1, 8]);
        assert_eq!((md.len(), &md[..8]), (628, &b"MSCC_MD "[..]));
        assert_eq!((le32(&md, 28), le32(&md, 36)), (4, 0x0407_0041));
        assert_eq!(&md[64..73], b"PAX 28XG4");
        assert_eq!(run(&mut m, MRPC_PART_INFO, &[1, 10]).ret, ERR_PARAM_INVALID);

        // EXT_FEATURES: {u32 version @0, u32 features @4}.
        assert_eq!(
            ok(&mut m, MRPC_EXT_FEATURES, &[]),
            [1, 0, 0, 0, 0xf, 0, 0, 0]
        );
    }

    #[test]
    fn bind_requests_as_switchtec_user_fills_them() {
        let mut m = model();
        // {subcmd @0, host_sw_idx @1, host_phys_port_id @2, host_log_port_id
        // @3, function[8] {pdfid u16, next_valid, rsvd} @4}: 36 bytes.
        let mut bind = vec![1, 0, 0, 2];
        for (p, nv) in [(0x0303u16, 1u8), (0x0304, 0)] {
            bind.extend_from_slice(&p.to_le_bytes());
            bind.extend_from_slice(&[nv, 0xee]);
        }
        bind.resize(36, 0x5a);
        let mut x = Exec {
            model: &mut m,
            partition: 0,
            bad_length: false,
            notices: Vec::new(),
            deferred: None,
            ep_access: None,
        };
        assert_eq!(x.run(MRPC_GFMS_BIND_UNBIND, &bind).status, MRPC_STATUS_DONE);
        let reqs = x.deferred.take().expect("deferred");
        assert_eq!(
            reqs.iter().map(|r| (r.pdfid, r.devfn)).collect::<Vec<_>>(),
            [(0x0303, 0), (0x0304, 1)]
        );
        for r in &reqs {
            m.finish(r, true, false);
        }
        // {subcmd @0, host_sw_idx @1, host_phys_port_id @2, host_log_port_id
        // @3, pdfid @4, option @6, rsvd @7}; pdfid and option are not set by
        // cli/fabric.c: the port alone decides.
        let mut x = Exec {
            model: &mut m,
            partition: 0,
            bad_length: false,
            notices: Vec::new(),
            deferred: None,
            ep_access: None,
        };
        let un = [2, 0, 0, 2, 0x34, 0x12, 0x77, 0x88];
        assert_eq!(x.run(MRPC_GFMS_BIND_UNBIND, &un).status, MRPC_STATUS_DONE);
        assert_eq!(x.deferred.take().map(|r| r.len()), Some(2));
        // Eight functions, the last still claiming a successor: refused.
        let mut eight = vec![1, 0, 0, 3];
        for i in 0..8u16 {
            eight.extend_from_slice(&(0x0401 + i).to_le_bytes());
            eight.extend_from_slice(&[1, 0]);
        }
        assert_eq!(x.run(MRPC_GFMS_BIND_UNBIND, &eight).ret, ERR_PARAM_INVALID);
        assert_eq!(
            x.run(MRPC_GFMS_BIND_UNBIND, &[2, 0, 0, 3, 0, 0, 0, 0]).ret,
            0xb
        );
        assert_eq!(
            x.run(MRPC_GFMS_BIND_UNBIND, &[2, 0, 0, 4, 0, 0, 0, 0]).ret,
            0x6
        );
        assert_eq!(
            x.run(MRPC_GFMS_BIND_UNBIND, &[2, 1, 0, 3, 0, 0, 0, 0]).ret,
            ERR_PARAM_INVALID
        );
    }

    #[test]
    fn pax_dialect_refuses_extensions() {
        let mut cfg = Config::parse(include_str!("../fabric.toml")).expect("fabric.toml");
        cfg.dialect = crate::config::Dialect::Pax;
        let mut m = Model::new(&cfg);
        for cmd in [0xf000, 0xf001, 0xf002, 0xf003, 0xf004, 0xf0ff] {
            assert_eq!(
                run(&mut m, cmd, &[1, 0, 8, 0, 0, 0, 0, 0]).ret,
                ERR_CMD_INVALID
            );
        }
        assert_eq!(run(&mut m, MRPC_ECHO, &[0]).output, [0xff]);
        let req = m
            .begin_unbind_port(Requester::Control, 0, 0)
            .expect("h0 lport 0 holds 0x0301");
        assert!(!m.unbind_request(&req[0]), "no UNBIND_REQUEST in pax");
    }

    /// 48 partitions and 1,024 functions (four endpoints of 255 VFs on ports 48-51): the
    /// PAX_ALL dump holds every host and function and stays within what a driver reads
    /// (pcifab's MAX_DUMP, 256 KiB), the general record counts them and widens the PDFID
    /// range, and a VF past 31 is listed with its PDFID and VF number.
    #[test]
    fn pax_all_of_the_largest_fabric() {
        let mut text: String = (0..48)
            .map(|i| format!("[[hosts]]\nname = \"h{i}\"\n"))
            .collect();
        for e in 0..4 {
            text.push_str(&format!(
                "[[endpoints]]\nname = \"gpu{e}\"\nport = {}\nvendor_id = 0x10de\n\
                 device_id = 0x2330\nclass = 0x030200\nvfs = 255\nmem_mib = 2\nvf_mem_mib = 1\n",
                48 + e
            ));
        }
        let mut m = Model::new(&Config::parse(&text).expect("config"));
        let d = chunked(&mut m, DUMP_PAX_ALL, 0);
        // General 80, HVD section 12 + 48 * 136, EP section 12 + 4 * (8 + 8 + 256 * 36).
        assert_eq!(d.len(), 80 + 12 + 48 * 136 + 12 + 4 * (16 + 256 * 36));
        assert!(d.len() <= 256 * 1024);
        assert_eq!(
            (d[12], d[13], le16(&d, 14), le16(&d, 16)),
            (52, 48, 4, 1024)
        );
        assert_eq!((le16(&d, 44), le16(&d, 46)), (0x100, 0x43ff), "pdfid range");
        assert_eq!(
            u64::from_le_bytes(d[72..80].try_into().unwrap()),
            0,
            "no port free"
        );
        // The last endpoint's record: port header, attachment header, 256 functions.
        let last = d.len() - (16 + 256 * 36);
        assert_eq!((d[last], d[last + 1], le16(&d, last + 8)), (0, 51, 256));
        let vf255 = last + 16 + 255 * 36;
        assert_eq!((le16(&d, vf255), le16(&d, vf255 + 2)), (255, 0x43ff));
        assert_eq!((d[vf255 + 4], d[vf255 + 5]), (FUNC_SRIOV_VF, 255));
        let pf = last + 16;
        assert_eq!(
            (le16(&d, pf + 2), d[pf + 4], d[pf + 5]),
            (0x0760, FUNC_SRIOV_PF, 255)
        );
    }

    /// An nvme endpoint in the inventory: QEMU's ids and class, one BAR.
    #[test]
    fn nvme_endpoint_in_dumps() {
        let mut m = Model::new(
            &Config::parse(
                "[[hosts]]\nname = \"h0\"\n[[endpoints]]\nname = \"nvme0\"\nport = 20\n\
                 kind = \"nvme\"\n[[bindings]]\nendpoint = \"nvme0\"\nhost = \"h0\"\n\
                 logical_port = 2\n",
            )
            .expect("config"),
        );
        let ep = chunked(&mut m, DUMP_EP_PORT, 20);
        assert_eq!(
            (ep[12], ep[13], le16(&ep, 14)),
            (0, 20, 1),
            "one function on port 20"
        );
        let f = 28;
        assert_eq!(
            (le16(&ep, f), le16(&ep, f + 2), ep[f + 4], ep[f + 5]),
            (0, 0x380, 1, 0)
        );
        assert_eq!(&ep[f + 8..f + 12], &[1, 0, 0, 2], "bound to h0 lport 2");
        assert_eq!((le16(&ep, f + 12), le16(&ep, f + 14)), (0x1b36, 0x0010));
        assert_eq!((le16(&ep, f + 16), le16(&ep, f + 18)), (0x1b36, 0x0010));
        assert_eq!(le32(&ep, f + 20), 0x0101_0802, "class, 1 BAR");
        assert_eq!(&ep[f + 24..f + 30], &[BAR_MEM64, 14, 0, 0, 0, 0], "no BAR2");
        let hvd = chunked(&mut m, DUMP_HVD, 0);
        let e = 20 + 4 * 2; // function 0 of logical port 2
        assert_eq!((hvd[e], hvd[e + 1], le16(&hvd, e + 2)), (2, 1, 0x0380));
    }

    /// A bind whose functions belong to two endpoints (gpu0 VF 3, gpu1 VF
    /// 4) is refused whole: nothing reserved, nothing deferred.
    #[test]
    fn bind_across_endpoints_is_refused() {
        let mut m = model();
        let mut bind = vec![1, 0, 0, 2];
        for (p, nv) in [(0x0303u16, 1u8), (0x0404, 0)] {
            bind.extend_from_slice(&p.to_le_bytes());
            bind.extend_from_slice(&[nv, 0]);
        }
        bind.resize(36, 0);
        let mut x = Exec {
            model: &mut m,
            partition: 0,
            bad_length: false,
            notices: Vec::new(),
            deferred: None,
            ep_access: None,
        };
        let r = x.run(MRPC_GFMS_BIND_UNBIND, &bind);
        assert_eq!(
            (r.status, r.ret),
            (MRPC_STATUS_ERROR, crate::model::ERR_BIND_CHECK_FAIL)
        );
        assert!(x.deferred.is_none());
        for p in [0x0303, 0x0404] {
            let f = m.function(p).expect("function");
            assert!(f.binding.is_none() && f.op.is_none(), "{p:#x} was touched");
        }
    }

    /// A command for another PAX (`switchtec -x N`: the id in bits 18-22)
    /// is refused, as this fabric has one switch; the all-ones id and this
    /// switch's own id are served here.
    #[test]
    fn commands_for_other_pax_ids_are_refused() {
        let mut m = model();
        for pax in [PAX_ID_LOCAL, u32::from(LOCAL_PAX_ID)] {
            let r = run(&mut m, MRPC_ECHO | pax << PAX_ID_SHIFT, b"x");
            assert_eq!((r.status, r.output), (MRPC_STATUS_DONE, vec![!b'x']));
        }
        for pax in [1, 2, 15, 30] {
            for cmd in [MRPC_ECHO, MRPC_GET_PAX_ID, MRPC_GFMS_DB_DUMP] {
                let r = run(&mut m, cmd | pax << PAX_ID_SHIFT, &[0; 8]);
                assert_eq!(
                    (r.status, r.ret),
                    (MRPC_STATUS_ERROR, ERR_PARAM_INVALID),
                    "command {cmd:#x} for PAX {pax}"
                );
            }
        }
    }

    /// HVD_DETAIL's one VEP is the management endpoint (fabric.h's
    /// SWITCHTEC_GFMS_DB_VEP_TYPE_MGMT), at bdf 00:00.1.
    #[test]
    fn hvd_detail_vep_is_the_management_endpoint() {
        let mut m = model();
        let d = chunked(&mut m, DUMP_HVD_DETAIL, 1);
        // Header 12, then hvd_inst_id, phy_pid, hfid, vep_count @16, usp_status,
        // rsvd[2], vep_region[0] {type @20, rsvd, bdf @22}.
        assert_eq!(d[16], 1);
        assert_eq!(d[20], VEP_TYPE_MGMT);
        assert_eq!(le16(&d, 22), 0x0001);
    }

    /// FWLOGRD app log as log_a_to_file reads it: pages of whole entries
    /// from start 0xFFFFFFFF, following next_start until remain is 0.
    #[test]
    fn app_log_pages_as_switchtec_user_reads_them() {
        let mut m = model();
        for (sub, total) in [
            (FWLOGRD_RAM_WITH_FLAG, APP_LOG_RAM_ENTRIES),
            (FWLOGRD_RAM, APP_LOG_RAM_ENTRIES),
            (FWLOGRD_FLASH_WITH_FLAG, APP_LOG_FLASH_ENTRIES),
            (FWLOGRD_FLASH, APP_LOG_FLASH_ENTRIES),
        ] {
            let mut start = u32::MAX;
            let mut entries = Vec::new();
            let mut replies = 0;
            loop {
                let mut req = vec![sub, 0, 0, 0, 0, 0, 0, 0];
                req.extend_from_slice(&0u32.to_le_bytes());
                req.extend_from_slice(&0u32.to_le_bytes());
                req.extend_from_slice(&start.to_le_bytes());
                let o = ok(&mut m, MRPC_FWLOGRD, &req);
                replies += 1;
                assert_eq!(o[0], sub);
                assert_eq!(o[2], 0, "overflow");
                assert_eq!(le32(&o, 4), total);
                let count = le32(&o, 8) as usize;
                assert_eq!(o.len(), LOG_A_HDR + count * LOG_A_ENTRY);
                assert_eq!(le32(&o, 24), 0x04070041, "fw_version");
                entries.extend_from_slice(&o[LOG_A_HDR..]);
                assert_eq!(le32(&o, 12) as usize, total as usize - entries.len() / 32);
                start = le32(&o, 16);
                if le32(&o, 12) == 0 {
                    break;
                }
                assert!(replies < 10, "the log never ends");
            }
            assert_eq!(entries.len(), total as usize * LOG_A_ENTRY);
            assert_eq!(replies, 1 + usize::from(total > 31));
            let mut last = 0u64;
            for e in entries.chunks(LOG_A_ENTRY) {
                let ts = u64::from(le32(e, 0)) << 32 | u64::from(le32(e, 4));
                assert!(ts > last, "timestamps rise");
                last = ts;
                let sev = le32(e, 8) >> 28;
                assert!((1..=5).contains(&sev), "severity {sev}");
            }
        }
        // A start past the end, the Gen5 sub-commands: refused.
        let mut req = vec![FWLOGRD_RAM, 0, 0, 0, 0, 0, 0, 0];
        req.extend_from_slice(&[0; 8]);
        req.extend_from_slice(&(APP_LOG_RAM_ENTRIES + 1).to_le_bytes());
        assert_eq!(run(&mut m, MRPC_FWLOGRD, &req).ret, ERR_PARAM_INVALID);
        for sub in [11u8, 12] {
            assert_eq!(
                run(&mut m, MRPC_FWLOGRD, &[sub; 20]).ret,
                ERR_SUBCMD_INVALID
            );
        }
    }

    /// FWLOGRD's fatal-error dumps are empty (no fatal error happened), the
    /// NVLog header is 24 bytes, and FTDC_LOG_DUMP ends at its last chunk.
    #[test]
    fn dumps_nvlog_header_and_ftdc_log() {
        let mut m = model();
        for sub in FWLOGRD_MEMLOG..=FWLOGRD_THRD {
            let mut req = vec![sub, 0, 0, 0];
            req.extend_from_slice(&0u32.to_le_bytes());
            req.extend_from_slice(&1012u32.to_le_bytes());
            let o = ok(&mut m, MRPC_FWLOGRD, &req);
            assert_eq!((o[0], le32(&o, 4), le32(&o, 8)), (sub, 0, 0));
        }
        let o = ok(&mut m, MRPC_FWLOGRD, &[FWLOGRD_NVHDR, 0, 0, 0]);
        assert_eq!(o.len(), 24);
        assert_eq!(le32(&o, 12), 0x04070041);
        let mut seq = 0u16;
        let mut chunks = 0;
        loop {
            let mut req = vec![FWLOGRD_RAM, 0];
            req.extend_from_slice(&seq.to_le_bytes());
            let o = ok(&mut m, MRPC_FTDC_LOG_DUMP, &req);
            assert_eq!(o.len(), (usize::from(o[0]) + 1) * 4);
            chunks += 1;
            if o[1] != 0 {
                break;
            }
            seq += 1;
            assert!(chunks < 10, "the FTDC log never ends");
        }
        assert_eq!(chunks, usize::from(FTDC_CHUNKS));
        let past = FTDC_CHUNKS.to_le_bytes();
        assert_eq!(
            run(&mut m, MRPC_FTDC_LOG_DUMP, &[0, 0, past[0], past[1]]).ret,
            ERR_PARAM_INVALID
        );
    }

    /// MULTI_CFG as get_multicfg() asks: supported, count, each start
    /// address and length, the active one.
    #[test]
    fn multi_cfg_as_switchtec_user_asks() {
        let mut m = model();
        let ask = |m: &mut Model, sub: u32, index: u32| -> MrpcOutcome {
            run(m, MRPC_MULTI_CFG, &(sub | index << 8).to_le_bytes())
        };
        let val = |o: MrpcOutcome| {
            assert_eq!(o.status, MRPC_STATUS_DONE);
            le32(&o.output, 0)
        };
        assert_eq!(val(ask(&mut m, 0, 0)), 1);
        assert_eq!(val(ask(&mut m, 1, 0)), MULTI_CFG_IMAGES);
        let mut addrs = Vec::new();
        for i in 0..MULTI_CFG_IMAGES {
            addrs.push(val(ask(&mut m, 3, i)));
            assert_eq!(val(ask(&mut m, 4, i)), FLASH_PART_BYTES / 2);
        }
        assert_eq!(
            addrs,
            [
                7 * FLASH_PART_BYTES,
                7 * FLASH_PART_BYTES + FLASH_PART_BYTES / 2
            ]
        );
        assert!(val(ask(&mut m, 2, 0)) < MULTI_CFG_IMAGES);
        assert_eq!(ask(&mut m, 3, MULTI_CFG_IMAGES).ret, ERR_PARAM_INVALID);
        assert_eq!(ask(&mut m, 5, 0).ret, ERR_SUBCMD_INVALID);
    }
}

// SPDX-License-Identifier: GPL-2.0-only
//! The TOML fabric description (see `fabric.toml` for every key).

use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Most partitions a PAX switch has (and so most hosts).
pub const MAX_HOSTS: usize = 48;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub firmware: Firmware,
    #[serde(default)]
    pub hosts: Vec<Host>,
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
    #[serde(default)]
    pub bindings: Vec<Binding>,
    #[serde(default)]
    pub policy: Policy,
    /// Size of every MEP's P2P window (its BAR2), MiB, a power of two.
    #[serde(default = "default_window")]
    pub p2p_window_mib: u32,
    /// Which firmware the emulator is: plain PAX or PAX with pcifab's extensions.
    #[serde(default)]
    pub dialect: Dialect,
    /// The MRPC interface offers DMA MRPC (dma_ver non-zero).
    #[serde(default = "default_true")]
    pub dma_mrpc: bool,
    /// Microseconds from the write of an MRPC command register to the command's completion
    /// (status, DMA MRPC output, interrupt); 0: done before the write is acknowledged.
    #[serde(default)]
    pub mrpc_completion_us: u64,
    /// How long an unbind waits for the host to let the device go (QEMU's DEVICE_DELETED
    /// after the guest's hot-plug driver removed it) before it answers UNBIND_TIMEOUT, ms.
    #[serde(default = "default_unbind_timeout")]
    pub unbind_timeout_ms: u64,
    /// Channels of each host's DMA endpoint (Documentation/emulator.rst, "The DMA
    /// endpoint"); 0: the switch shows no DMA endpoint.
    #[serde(default)]
    pub dma_endpoint_channels: u8,
}

/// Default and range of `unbind_timeout_ms`.
pub const DEFAULT_UNBIND_TIMEOUT_MS: u64 = 10_000;
pub const MAX_UNBIND_TIMEOUT_MS: u64 = 120_000;

fn default_unbind_timeout() -> u64 {
    DEFAULT_UNBIND_TIMEOUT_MS
}

/// Longest MRPC completion delay (config key and control request), microseconds.
pub const MAX_COMPLETION_US: u64 = 1_000_000;

/// The firmware dialect (Documentation/emulator.rst, "Dialects").
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    /// Switchtec PAX as switchtec-user and Linux define it, nothing more.
    Pax,
    /// PAX plus pcifab's extension commands, registers, event and policy.
    #[default]
    Extended,
}

impl Dialect {
    pub fn name(self) -> &'static str {
        match self {
            Dialect::Pax => "pax",
            Dialect::Extended => "extended",
        }
    }

    pub fn extended(self) -> bool {
        self == Dialect::Extended
    }

    pub fn parse(s: &str) -> Result<Dialect, String> {
        match s {
            "pax" => Ok(Dialect::Pax),
            "extended" => Ok(Dialect::Extended),
            _ => Err(format!("unknown dialect '{s}'; use pax or extended")),
        }
    }
}

fn default_true() -> bool {
    true
}

/// Default and largest P2P window, in MiB.
pub const DEFAULT_P2P_WINDOW_MIB: u32 = 64;
pub const MAX_P2P_WINDOW_MIB: u32 = 1024;
/// Largest device memory of a PF, in MiB.
pub const MAX_DEV_MEM_MIB: u32 = 4096;

fn default_window() -> u32 {
    DEFAULT_P2P_WINDOW_MIB
}

/// Who may bind what (Documentation/mrpc.rst, GFMS_BIND_UNBIND "Policy").
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// The fabric-manager host; None: every host is a manager.
    pub manager: Option<String>,
}

/// Default of `hosts[].max_functions`: one per logical port.
pub const DEFAULT_MAX_FUNCTIONS: u8 = 4;
/// Default device memory (BAR2) of a PF and of a VF, in MiB.
pub const DEFAULT_PF_MEM_MIB: u32 = 16;
pub const DEFAULT_VF_MEM_MIB: u32 = 4;
/// Largest BAR2 accepted, in MiB.
pub const MAX_MEM_MIB: u32 = 1024;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Firmware {
    pub device_id: u16,
    pub device_version: u32,
    pub revision: u8,
    pub fw_version: u32,
    pub vendor_id: String,
    pub product_id: String,
    pub product_revision: String,
    pub die_temp_centi: u32,
}

impl Default for Firmware {
    fn default() -> Self {
        Firmware {
            device_id: 0x4228,
            device_version: 0x0000_4228,
            revision: 0x01,
            fw_version: 0x0407_0041,
            vendor_id: "MICROSEM".into(),
            product_id: "PAX 28XG4".into(),
            product_revision: "B0".into(),
            die_temp_centi: 4500,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    pub name: String,
    /// Physical port id of the host's upstream port; defaults to the index.
    pub usp_port: Option<u8>,
    /// Endpoint names a non-manager host may bind to itself; None: all.
    pub allowed: Option<Vec<String>>,
    /// Most functions the host may hold.
    #[serde(default = "default_max_functions")]
    pub max_functions: u8,
}

fn default_max_functions() -> u8 {
    DEFAULT_MAX_FUNCTIONS
}

/// Highest physical port id plus one: the ports of a Gen4 PAX (switchtec-user's
/// `switchtec_max_supported_ports`, as many as LNKSTAT reports), so 48 partitions leave
/// ports 48-51 for endpoints.
pub const MAX_PORTS: u8 = 52;
/// Most VFs an endpoint may have: `vf_num` of the fabric database's function records is
/// one byte. VFs 1-31 take PDFIDs in the port's block of 32, the others in a block of
/// 256 of their own ([`crate::model::pdfid`]).
pub const MAX_VFS: u8 = 255;
/// Logical downstream ports per host.
pub const LOG_PORTS: u8 = 4;

/// What an endpoint's functions are (Documentation/emulator.rst, "NVMe endpoints").
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum EndpointKind {
    /// GPU-like register file with device memory, served here over vfio-user.
    #[default]
    Gpu,
    /// QEMU's own `nvme` device on a backing image, added by QMP; no device memory here.
    Nvme,
}

impl EndpointKind {
    pub fn name(self) -> &'static str {
        match self {
            EndpointKind::Gpu => "gpu",
            EndpointKind::Nvme => "nvme",
        }
    }
}

/// What QEMU's `nvme` device shows in config space: Red Hat's QEMU NVMe
/// controller, class mass storage / NVM / NVMe I/O controller.
pub const NVME_VENDOR_ID: u16 = 0x1b36;
pub const NVME_DEVICE_ID: u16 = 0x0010;
pub const NVME_CLASS: u32 = 0x01_0802;
/// Default and largest capacity of an nvme endpoint's image, MiB.
pub const DEFAULT_NVME_CAPACITY_MIB: u32 = 64;
pub const MAX_NVME_CAPACITY_MIB: u32 = 65536;
/// Smallest and largest controller memory buffer of an nvme endpoint, MiB.
pub const MIN_NVME_CMB_MIB: u32 = 2;
pub const MAX_NVME_CMB_MIB: u32 = 256;
/// Longest serial number QEMU's nvme device keeps (the Identify field).
pub const NVME_SERIAL_MAX: usize = 20;
/// Prefix of an nvme function's serial number; the endpoint name follows.
pub const NVME_SERIAL_PREFIX: &str = "pcifab-";

/// An endpoint device: one PF with `vfs` VFs on an endpoint port.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    pub name: String,
    pub port: u8,
    #[serde(default)]
    pub kind: EndpointKind,
    pub vendor_id: Option<u16>,
    pub device_id: Option<u16>,
    pub vf_device_id: Option<u16>,
    pub class: Option<u32>,
    #[serde(default, deserialize_with = "vf_count")]
    pub vfs: u8,
    #[serde(default = "default_temp")]
    pub temp_centi: i32,
    #[serde(default = "default_power")]
    pub power_mw: u32,
    #[serde(default = "default_power_limit")]
    pub power_limit_mw: u32,
    #[serde(default)]
    pub utilisation: u8,
    /// BAR2 (device memory) of the PF, MiB, a power of two (gpu only).
    pub mem_mib: Option<u32>,
    /// BAR2 of each VF, MiB, a power of two (gpu only).
    pub vf_mem_mib: Option<u32>,
    /// Device memory of the PF, MiB (None: `mem_mib`); BAR2 shows its start (gpu only).
    pub dev_mem_mib: Option<u32>,
    /// Size of the backing image, MiB (nvme only).
    pub capacity_mib: Option<u32>,
    /// Backing image file (nvme only); relative to the run directory.
    pub image: Option<String>,
    /// Controller memory buffer of the drive, MiB (nvme only; None: no CMB).
    pub cmb_mib: Option<u32>,
}

impl Endpoint {
    pub fn is_nvme(&self) -> bool {
        self.kind == EndpointKind::Nvme
    }

    /// PCI vendor id (validated: present for gpu, QEMU's for nvme).
    pub fn vid(&self) -> u16 {
        self.vendor_id.unwrap_or(NVME_VENDOR_ID)
    }

    /// PCI device id of the PF.
    pub fn did(&self) -> u16 {
        self.device_id.unwrap_or(NVME_DEVICE_ID)
    }

    /// PCI device id of the VFs.
    pub fn vf_did(&self) -> u16 {
        self.vf_device_id.unwrap_or(self.did())
    }

    /// 24-bit class code.
    pub fn class_code(&self) -> u32 {
        self.class.unwrap_or(NVME_CLASS)
    }

    /// BAR2 of the PF in MiB; 0 for nvme (no device memory here).
    pub fn pf_mem_mib(&self) -> u32 {
        match self.kind {
            EndpointKind::Gpu => self.mem_mib.unwrap_or(DEFAULT_PF_MEM_MIB),
            EndpointKind::Nvme => 0,
        }
    }

    /// BAR2 (and device memory) of each VF in MiB; 0 for nvme.
    pub fn vf_mem(&self) -> u32 {
        match self.kind {
            EndpointKind::Gpu => self.vf_mem_mib.unwrap_or(DEFAULT_VF_MEM_MIB),
            EndpointKind::Nvme => 0,
        }
    }

    /// Device memory of the PF in MiB: what routes and the DMA engine reach.
    pub fn pf_dev_mem_mib(&self) -> u32 {
        match self.kind {
            EndpointKind::Gpu => self.dev_mem_mib.unwrap_or(self.pf_mem_mib()),
            EndpointKind::Nvme => 0,
        }
    }

    /// Size of an nvme endpoint's image in bytes.
    pub fn capacity_bytes(&self) -> u64 {
        u64::from(self.capacity_mib.unwrap_or(DEFAULT_NVME_CAPACITY_MIB)) << 20
    }

    /// The image file of an nvme endpoint: `image` (relative to `run_dir`)
    /// or `run_dir/<name>.img`.
    pub fn image_path(&self, run_dir: &Path) -> PathBuf {
        match &self.image {
            Some(i) => run_dir.join(i),
            None => run_dir.join(format!("{}.img", self.name)),
        }
    }

    /// Serial number of an nvme function in QEMU.
    pub fn nvme_serial(&self) -> String {
        format!("{NVME_SERIAL_PREFIX}{}", self.name)
    }
}

/// `endpoints[].vfs`: 0 to [`MAX_VFS`], refused with the limit beyond.
fn vf_count<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u8, D::Error> {
    let n = u64::deserialize(d)?;
    u8::try_from(n).map_err(|_| {
        serde::de::Error::custom(format!(
            "vfs = {n} is too many; an endpoint has at most {MAX_VFS} VFs"
        ))
    })
}

fn default_temp() -> i32 {
    5500
}
fn default_power() -> u32 {
    75_000
}
fn default_power_limit() -> u32 {
    300_000
}

/// An initial binding of a function to a host's logical port.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    pub endpoint: String,
    /// VF number (1-based); absent or 0 means the PF.
    #[serde(default)]
    pub vf: u8,
    pub host: String,
    pub logical_port: u8,
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
        Config::parse(&text).map_err(|e| format!("config {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Config, String> {
        let cfg: Config = toml::from_str(text).map_err(|e| e.to_string().trim_end().to_owned())?;
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), String> {
        let fw = &self.firmware;
        let w = self.p2p_window_mib;
        if !w.is_power_of_two() || w > MAX_P2P_WINDOW_MIB {
            return Err(format!(
                "p2p_window_mib = {w} must be a power of two from 1 to {MAX_P2P_WINDOW_MIB} (MiB)"
            ));
        }
        if !(100..=MAX_UNBIND_TIMEOUT_MS).contains(&self.unbind_timeout_ms) {
            return Err(format!(
                "unbind_timeout_ms = {} is out of range; use 100 to {MAX_UNBIND_TIMEOUT_MS} (milliseconds)",
                self.unbind_timeout_ms
            ));
        }
        if self.dma_endpoint_channels > crate::dmaep::MAX_CHANNELS {
            return Err(format!(
                "dma_endpoint_channels = {} is too many; use 0 (no DMA endpoint) to {}",
                self.dma_endpoint_channels,
                crate::dmaep::MAX_CHANNELS
            ));
        }
        if self.mrpc_completion_us > MAX_COMPLETION_US {
            return Err(format!(
                "mrpc_completion_us = {} is too long; use 0 to {MAX_COMPLETION_US} (microseconds)",
                self.mrpc_completion_us
            ));
        }
        check_str("firmware.vendor_id", &fw.vendor_id, 8)?;
        check_str("firmware.product_id", &fw.product_id, 24)?;
        check_str("firmware.product_revision", &fw.product_revision, 2)?;
        if self.hosts.is_empty() {
            return Err("no hosts: add at least one [[hosts]] table with a name".into());
        }
        if self.hosts.len() > MAX_HOSTS {
            return Err(format!(
                "{} hosts given but a PAX switch has at most {MAX_HOSTS} partitions; remove some [[hosts]]",
                self.hosts.len()
            ));
        }
        for (i, host) in self.hosts.iter().enumerate() {
            let name = &host.name;
            let ok = !name.is_empty()
                && name.len() <= 32
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !ok {
                return Err(format!(
                    "hosts[{i}].name '{name}' is not usable in a socket file name; use 1 to 32 characters of A-Z, a-z, 0-9, '-' or '_'"
                ));
            }
            if let Some(j) = self.hosts[..i].iter().position(|h| h.name == *name) {
                return Err(format!(
                    "hosts[{i}].name '{name}' is already used by hosts[{j}]; give every host a unique name"
                ));
            }
        }
        self.validate_fabric()
    }

    /// Physical port of host `i`.
    pub fn host_port(&self, i: usize) -> u8 {
        self.hosts[i].usp_port.unwrap_or(i as u8)
    }

    fn validate_fabric(&self) -> Result<(), String> {
        // Every physical port used once: (port, who).
        let mut used: Vec<(u8, String)> = Vec::new();
        let mut claim = |port: u8, who: String| -> Result<(), String> {
            if port >= MAX_PORTS {
                return Err(format!(
                    "{who}: port {port} is not a physical port; use 0 to {}",
                    MAX_PORTS - 1
                ));
            }
            if let Some((_, other)) = used.iter().find(|(p, _)| *p == port) {
                return Err(format!(
                    "{who}: port {port} is already used by {other}; give every host and endpoint its own port"
                ));
            }
            used.push((port, who));
            Ok(())
        };
        for i in 0..self.hosts.len() {
            claim(self.host_port(i), format!("hosts[{i}]"))?;
        }
        for (i, ep) in self.endpoints.iter().enumerate() {
            let who = format!("endpoints[{i}]");
            let name = &ep.name;
            let ok = !name.is_empty()
                && name.len() <= 32
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !ok {
                return Err(format!(
                    "{who}.name '{name}' must be 1 to 32 characters of A-Z, a-z, 0-9, '-' or '_'"
                ));
            }
            if let Some(j) = self.endpoints[..i].iter().position(|e| e.name == *name) {
                return Err(format!(
                    "{who}.name '{name}' is already used by endpoints[{j}]; give every endpoint a unique name"
                ));
            }
            claim(ep.port, who.clone())?;
            match ep.kind {
                EndpointKind::Gpu => validate_gpu(ep, &who)?,
                EndpointKind::Nvme => validate_nvme(ep, &who)?,
            }
            if ep.utilisation > 100 {
                return Err(format!(
                    "{who}.utilisation = {} is not a percentage; use 0 to 100",
                    ep.utilisation
                ));
            }
        }
        if let Some(m) = &self.policy.manager {
            if !self.hosts.iter().any(|h| h.name == *m) {
                return Err(format!(
                    "policy.manager '{m}' is not the name of a [[hosts]] table"
                ));
            }
        }
        for (i, h) in self.hosts.iter().enumerate() {
            for name in h.allowed.iter().flatten() {
                if !self.endpoints.iter().any(|e| e.name == *name) {
                    return Err(format!(
                        "hosts[{i}].allowed names '{name}', which is not the name of an [[endpoints]] table"
                    ));
                }
            }
        }
        let mut taken: Vec<(usize, u8, usize)> = Vec::new(); // host, lport, binding
        let mut bound: Vec<(usize, u8, usize)> = Vec::new(); // endpoint, vf, binding
        for (i, b) in self.bindings.iter().enumerate() {
            let who = format!("bindings[{i}]");
            let e = self
                .endpoints
                .iter()
                .position(|e| e.name == b.endpoint)
                .ok_or_else(|| {
                    format!(
                        "{who}.endpoint '{}' is not the name of an [[endpoints]] table",
                        b.endpoint
                    )
                })?;
            if b.vf > self.endpoints[e].vfs {
                return Err(format!(
                    "{who}.vf = {} but endpoint '{}' has {} VFs; use 0 (the PF) to {}",
                    b.vf, b.endpoint, self.endpoints[e].vfs, self.endpoints[e].vfs
                ));
            }
            let h = self
                .hosts
                .iter()
                .position(|h| h.name == b.host)
                .ok_or_else(|| {
                    format!(
                        "{who}.host '{}' is not the name of a [[hosts]] table",
                        b.host
                    )
                })?;
            if b.logical_port >= LOG_PORTS {
                return Err(format!(
                    "{who}.logical_port = {} does not exist; a host has logical ports 0 to {}",
                    b.logical_port,
                    LOG_PORTS - 1
                ));
            }
            if let Some((_, _, j)) = taken.iter().find(|t| t.0 == h && t.1 == b.logical_port) {
                return Err(format!(
                    "{who}: logical port {} of host '{}' is already bound by bindings[{j}]",
                    b.logical_port, b.host
                ));
            }
            if let Some((_, _, j)) = bound.iter().find(|t| t.0 == e && t.1 == b.vf) {
                return Err(format!(
                    "{who}: this function is already bound by bindings[{j}]; a function binds to one logical port"
                ));
            }
            taken.push((h, b.logical_port, i));
            bound.push((e, b.vf, i));
        }
        Ok(())
    }
}

/// The keys a gpu endpoint needs and the ones only nvme takes.
fn validate_gpu(ep: &Endpoint, who: &str) -> Result<(), String> {
    let missing: Vec<&str> = [
        ("vendor_id", ep.vendor_id.is_none()),
        ("device_id", ep.device_id.is_none()),
        ("class", ep.class.is_none()),
    ]
    .iter()
    .filter(|k| k.1)
    .map(|k| k.0)
    .collect();
    if !missing.is_empty() {
        return Err(format!(
            "{who} ('{}') has no {}; a gpu endpoint needs vendor_id, device_id and class (kind = \"nvme\" takes QEMU's)",
            ep.name,
            missing.join(", ")
        ));
    }
    for (key, given) in [
        ("capacity_mib", ep.capacity_mib.is_some()),
        ("image", ep.image.is_some()),
        ("cmb_mib", ep.cmb_mib.is_some()),
    ] {
        if given {
            return Err(format!(
                "{who}.{key} applies to kind = \"nvme\" only; remove it or set kind = \"nvme\""
            ));
        }
    }
    let class = ep.class_code();
    if class > 0xff_ffff {
        return Err(format!(
            "{who}.class = {class:#x} is not a 24-bit class code (base << 16 | sub << 8 | prog_if)"
        ));
    }
    for (key, v) in [("mem_mib", ep.pf_mem_mib()), ("vf_mem_mib", ep.vf_mem())] {
        if !v.is_power_of_two() || v > MAX_MEM_MIB {
            return Err(format!(
                "{who}.{key} = {v} must be a power of two from 1 to {MAX_MEM_MIB} (MiB)"
            ));
        }
    }
    if let Some(d) = ep.dev_mem_mib {
        if d < ep.pf_mem_mib() || d > MAX_DEV_MEM_MIB {
            return Err(format!(
                "{who}.dev_mem_mib = {d} must be at least mem_mib ({}) and at most {MAX_DEV_MEM_MIB} (MiB); BAR2 shows the first mem_mib of it",
                ep.pf_mem_mib()
            ));
        }
    }
    Ok(())
}

/// An nvme endpoint: QEMU's nvme device, one function, no device memory here.
fn validate_nvme(ep: &Endpoint, who: &str) -> Result<(), String> {
    if ep.vfs != 0 {
        return Err(format!(
            "{who}.vfs = {} but an nvme endpoint has no VFs (QEMU's nvme device is one function); use 0",
            ep.vfs
        ));
    }
    let ids = (
        ep.vendor_id.unwrap_or(NVME_VENDOR_ID),
        ep.device_id.unwrap_or(NVME_DEVICE_ID),
        ep.class.unwrap_or(NVME_CLASS),
    );
    if ids != (NVME_VENDOR_ID, NVME_DEVICE_ID, NVME_CLASS) {
        return Err(format!(
            "{who}: QEMU's nvme device shows {NVME_VENDOR_ID:04x}:{NVME_DEVICE_ID:04x} class {NVME_CLASS:06x}, not {:04x}:{:04x} class {:06x} as vendor_id, device_id and class say; leave those keys out of an nvme endpoint",
            ids.0, ids.1, ids.2
        ));
    }
    for (key, given) in [
        ("vf_device_id", ep.vf_device_id.is_some()),
        ("mem_mib", ep.mem_mib.is_some()),
        ("vf_mem_mib", ep.vf_mem_mib.is_some()),
        ("dev_mem_mib", ep.dev_mem_mib.is_some()),
    ] {
        if given {
            return Err(format!(
                "{who}.{key} does not apply to an nvme endpoint (no VFs, no device memory the fabric reaches); remove it"
            ));
        }
    }
    if let Some(c) = ep.capacity_mib {
        if !(1..=MAX_NVME_CAPACITY_MIB).contains(&c) {
            return Err(format!(
                "{who}.capacity_mib = {c} is out of range; use 1 to {MAX_NVME_CAPACITY_MIB} (MiB)"
            ));
        }
    }
    if let Some(c) = ep.cmb_mib {
        if !(MIN_NVME_CMB_MIB..=MAX_NVME_CMB_MIB).contains(&c) || !c.is_power_of_two() {
            return Err(format!(
                "{who}.cmb_mib = {c}: use a power of two from {MIN_NVME_CMB_MIB} to {MAX_NVME_CMB_MIB} (MiB; QEMU's CMB BAR is exactly that size, and Linux maps a CMB for P2PDMA in 2 MiB pieces), or leave it out for no CMB"
            ));
        }
    }
    if let Some(i) = &ep.image {
        if i.is_empty() || i.contains('\0') {
            return Err(format!(
                "{who}.image = {i:?} is not a file name; give a path (relative to the run directory) or leave it out for RUN_DIR/{}.img",
                ep.name
            ));
        }
    }
    let serial = ep.nvme_serial();
    if serial.len() > NVME_SERIAL_MAX {
        return Err(format!(
            "{who}.name '{}' is too long for an nvme endpoint: its serial number '{serial}' must fit QEMU's {NVME_SERIAL_MAX} characters; use at most {} characters",
            ep.name,
            NVME_SERIAL_MAX - NVME_SERIAL_PREFIX.len()
        ));
    }
    Ok(())
}

fn check_str(key: &str, value: &str, max: usize) -> Result<(), String> {
    if !value.is_ascii() || value.bytes().any(|b| b.is_ascii_control()) {
        return Err(format!("{key} = {value:?} must be printable ASCII"));
    }
    if value.len() > max {
        return Err(format!(
            "{key} = {value:?} is {} characters long; shorten it to at most {max}",
            value.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        match Config::parse(text) {
            Ok(_) => panic!("config accepted:\n{text}"),
            Err(e) => e,
        }
    }

    #[test]
    fn example_file_parses() {
        let text = include_str!("../fabric.toml");
        let cfg = Config::parse(text).expect("fabric.toml must parse");
        assert_eq!(cfg.hosts.len(), 2);
        assert_eq!(cfg.hosts[0].name, "h0");
        assert_eq!(cfg.hosts[1].name, "h1");
        assert_eq!(cfg.firmware, Firmware::default());
        // The commented nvme example, uncommented, is valid as it stands.
        let mut on = false;
        let mut nvme = String::new();
        for line in text.lines() {
            on |= line == "# [[endpoints]]";
            if on && line.is_empty() {
                break;
            }
            if on && !line.starts_with("# #") {
                nvme.push_str(line.strip_prefix("# ").unwrap_or(line));
                nvme.push('\n');
            }
        }
        let cfg = Config::parse(&format!("{text}\n{nvme}")).expect("nvme example must parse");
        let ep = cfg.endpoints.last().expect("nvme0");
        assert_eq!(
            (ep.name.as_str(), ep.is_nvme(), ep.port),
            ("nvme0", true, 20)
        );
        assert_eq!(ep.capacity_bytes(), 64 << 20);
    }

    #[test]
    fn dialect_and_dma_mrpc() {
        let c = Config::parse("[[hosts]]\nname = \"a\"\n").expect("minimal");
        assert_eq!((c.dialect, c.dma_mrpc), (Dialect::Extended, true));
        let c = Config::parse("dialect = \"pax\"\ndma_mrpc = false\n[[hosts]]\nname = \"a\"\n")
            .expect("pax");
        assert_eq!((c.dialect, c.dma_mrpc), (Dialect::Pax, false));
        let c = Config::parse("unbind_timeout_ms = 25000\n[[hosts]]\nname = \"a\"\n").unwrap();
        assert_eq!(c.unbind_timeout_ms, 25_000);
        let e = Config::parse("unbind_timeout_ms = 50\n[[hosts]]\nname = \"a\"\n").unwrap_err();
        assert!(e.contains("unbind_timeout_ms"), "{e}");
        let c = Config::parse("[[hosts]]\nname = \"a\"\n").unwrap();
        assert_eq!(c.dma_endpoint_channels, 0, "no DMA endpoint unless asked");
        let c = Config::parse("dma_endpoint_channels = 4\n[[hosts]]\nname = \"a\"\n").unwrap();
        assert_eq!(c.dma_endpoint_channels, 4);
        let e = Config::parse("dma_endpoint_channels = 33\n[[hosts]]\nname = \"a\"\n").unwrap_err();
        assert!(e.contains("dma_endpoint_channels"), "{e}");
        let c = Config::parse("mrpc_completion_us = 20\n[[hosts]]\nname = \"a\"\n").unwrap();
        assert_eq!(c.mrpc_completion_us, 20);
        let e =
            Config::parse("mrpc_completion_us = 1000001\n[[hosts]]\nname = \"a\"\n").unwrap_err();
        assert!(e.contains("mrpc_completion_us"), "{e}");
        let e = Config::parse("dialect = \"gen3\"\n[[hosts]]\nname = \"a\"\n").unwrap_err();
        assert!(e.contains("dialect"), "{e}");
        assert_eq!(Dialect::parse("pax"), Ok(Dialect::Pax));
        assert!(Dialect::parse("PAX").is_err());
        assert_eq!(Dialect::Extended.name(), "extended");
    }

    #[test]
    fn defaults_apply() {
        let cfg = Config::parse("[[hosts]]\nname = \"a\"\n").expect("minimal config");
        assert_eq!(cfg.firmware, Firmware::default());
        let cfg = Config::parse("[firmware]\ndevice_id = 0x4236\n[[hosts]]\nname = \"a\"\n")
            .expect("partial firmware");
        assert_eq!(cfg.firmware.device_id, 0x4236);
        assert_eq!(cfg.firmware.product_id, "PAX 28XG4");
    }

    #[test]
    fn rejects_unknown_keys() {
        let e = err("[firmware]\ndevice_idd = 1\n[[hosts]]\nname = \"a\"\n");
        assert!(e.contains("device_idd"), "{e}");
        let e = err("bogus = 1\n[[hosts]]\nname = \"a\"\n");
        assert!(e.contains("bogus"), "{e}");
        let e = err("[[hosts]]\nname = \"a\"\nport = 3\n");
        assert!(e.contains("port"), "{e}");
    }

    #[test]
    fn rejects_bad_values() {
        let e = err("[firmware]\nvendor_id = \"MICROSEMI\"\n[[hosts]]\nname = \"a\"\n");
        assert!(
            e.contains("firmware.vendor_id") && e.contains("at most 8"),
            "{e}"
        );
        let e = err(&format!(
            "[firmware]\nproduct_id = \"{}\"\n[[hosts]]\nname = \"a\"\n",
            "x".repeat(25)
        ));
        assert!(e.contains("firmware.product_id"), "{e}");
        let e = err("[firmware]\nproduct_revision = \"B0X\"\n[[hosts]]\nname = \"a\"\n");
        assert!(e.contains("firmware.product_revision"), "{e}");
        let e = err("[firmware]\ndevice_id = 0x12345\n[[hosts]]\nname = \"a\"\n");
        assert!(e.contains("device_id"), "{e}");
        let e = err("[firmware]\nrevision = -1\n[[hosts]]\nname = \"a\"\n");
        assert!(e.contains("revision"), "{e}");
    }

    #[test]
    fn rejects_bad_fabric() {
        let ep = |extra: &str| {
            format!(
                "[[hosts]]\nname = \"h\"\n[[endpoints]]\nname = \"g\"\nport = 16\nvendor_id = 1\n\
                 device_id = 2\nclass = 0x030200\nvfs = 2\n{extra}"
            )
        };
        assert!(Config::parse(&ep("")).is_ok());
        for (extra, want) in [
            ("bogus = 1\n", "bogus"),
            ("vfs = 40\n", "duplicate"),
            ("[[endpoints]]\nname = \"g2\"\nport = 16\nvendor_id = 1\ndevice_id = 2\nclass = 1\n", "port 16 is already used by endpoints[0]"),
            ("[[endpoints]]\nname = \"g\"\nport = 17\nvendor_id = 1\ndevice_id = 2\nclass = 1\n", "endpoints[1].name 'g' is already used"),
            ("[[endpoints]]\nname = \"x\"\nport = 52\nvendor_id = 1\ndevice_id = 2\nclass = 1\n", "port 52 is not a physical port; use 0 to 51"),
            ("[[endpoints]]\nname = \"x\"\nport = 20\nvendor_id = 1\ndevice_id = 2\nclass = 0x1000000\n", "24-bit"),
            ("[[endpoints]]\nname = \"x\"\nport = 20\nvendor_id = 1\ndevice_id = 2\nclass = 1\nvfs = 256\n", "vfs = 256 is too many; an endpoint has at most 255 VFs"),
            ("[[endpoints]]\nname = \"x\"\nport = 20\nvendor_id = 1\ndevice_id = 2\nclass = 1\nvfs = -1\n", "vfs"),
            ("[[endpoints]]\nname = \"x\"\nport = 20\nvendor_id = 1\ndevice_id = 2\nclass = 1\nutilisation = 101\n", "percentage"),
            ("[[endpoints]]\nname = \"x\"\nport = 20\nvendor_id = 1\nclass = 1\n", "device_id"),
            ("dev_mem_mib = 8\n", "endpoints[0].dev_mem_mib = 8 must be at least mem_mib (16)"),
            ("dev_mem_mib = 8192\n", "at most 4096"),
            ("[[bindings]]\nendpoint = \"nope\"\nhost = \"h\"\nlogical_port = 0\n", "bindings[0].endpoint 'nope'"),
            ("[[bindings]]\nendpoint = \"g\"\nhost = \"nope\"\nlogical_port = 0\n", "bindings[0].host 'nope'"),
            ("[[bindings]]\nendpoint = \"g\"\nvf = 3\nhost = \"h\"\nlogical_port = 0\n", "has 2 VFs"),
            ("[[bindings]]\nendpoint = \"g\"\nhost = \"h\"\nlogical_port = 4\n", "logical ports 0 to 3"),
            ("[[bindings]]\nendpoint = \"g\"\nhost = \"h\"\nlogical_port = 1\n[[bindings]]\nendpoint = \"g\"\nvf = 1\nhost = \"h\"\nlogical_port = 1\n", "already bound by bindings[0]"),
            ("[[bindings]]\nendpoint = \"g\"\nhost = \"h\"\nlogical_port = 1\n[[bindings]]\nendpoint = \"g\"\nhost = \"h\"\nlogical_port = 2\n", "function is already bound"),
        ] {
            let e = err(&ep(extra));
            assert!(e.contains(want), "{extra}: {e}");
        }
        let e = err("[[hosts]]\nname = \"a\"\nusp_port = 1\n[[hosts]]\nname = \"b\"\n");
        assert!(
            e.contains("hosts[1]: port 1 is already used by hosts[0]"),
            "{e}"
        );
    }

    #[test]
    fn p2p_keys() {
        let cfg = Config::parse("[[hosts]]\nname = \"a\"\n").expect("minimal config");
        assert_eq!(cfg.p2p_window_mib, 64);
        let cfg = Config::parse(
            "p2p_window_mib = 1024\n[[hosts]]\nname = \"a\"\n[[endpoints]]\nname = \"g\"\n\
             port = 16\nvendor_id = 1\ndevice_id = 2\nclass = 1\nmem_mib = 2\ndev_mem_mib = 24\n",
        )
        .expect("p2p config");
        assert_eq!(cfg.p2p_window_mib, 1024);
        assert_eq!(cfg.endpoints[0].pf_dev_mem_mib(), 24);
        for w in ["0", "3", "2048"] {
            let e = err(&format!("p2p_window_mib = {w}\n[[hosts]]\nname = \"a\"\n"));
            assert!(
                e.contains(&format!("p2p_window_mib = {w} must be a power of two")),
                "{e}"
            );
        }
        let e = err("p2p_window_mib = -1\n[[hosts]]\nname = \"a\"\n");
        assert!(e.contains("p2p_window_mib"), "{e}");
    }

    #[test]
    fn rejects_bad_hosts() {
        let e = err("[firmware]\n");
        assert!(e.contains("no hosts"), "{e}");
        let e = err("[[hosts]]\nname = \"a\"\n[[hosts]]\nname = \"a\"\n");
        assert!(e.contains("hosts[1].name") && e.contains("unique"), "{e}");
        let e = err("[[hosts]]\nname = \"a/b\"\n");
        assert!(e.contains("hosts[0].name"), "{e}");
        let e = err("[[hosts]]\n");
        assert!(e.contains("name"), "{e}");
        let many: String = (0..49)
            .map(|i| format!("[[hosts]]\nname = \"h{i}\"\n"))
            .collect();
        let e = err(&many);
        assert!(e.contains("49 hosts") && e.contains("48"), "{e}");
        let max: String = (0..48)
            .map(|i| format!("[[hosts]]\nname = \"h{i}\"\n"))
            .collect();
        assert!(Config::parse(&max).is_ok());
    }

    /// The fabric-scale benchmark's largest fabric: 48 partitions on ports 0-47 and four
    /// SR-IOV endpoints of 255 VFs on the four ports left, 1,024 functions.
    #[test]
    fn largest_fabric() {
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
        let cfg = Config::parse(&text).expect("48 hosts, 4 x 256 functions");
        assert_eq!(
            cfg.endpoints
                .iter()
                .map(|e| e.vfs as usize + 1)
                .sum::<usize>(),
            1024
        );
        let e = err(&text.replace("port = 51", "port = 47"));
        assert!(e.contains("port 47 is already used by hosts[47]"), "{e}");
    }

    #[test]
    fn nvme_endpoints() {
        let nv = |extra: &str| {
            format!(
                "[[hosts]]\nname = \"h\"\n[[endpoints]]\nname = \"nvme0\"\nport = 20\n\
                 kind = \"nvme\"\n{extra}"
            )
        };
        let c = Config::parse(&nv("")).expect("minimal nvme endpoint");
        let ep = &c.endpoints[0];
        assert!(ep.is_nvme());
        assert_eq!(
            (ep.vid(), ep.did(), ep.class_code()),
            (0x1b36, 0x0010, 0x01_0802)
        );
        assert_eq!(
            (ep.pf_mem_mib(), ep.pf_dev_mem_mib(), ep.vf_mem()),
            (0, 0, 0)
        );
        assert_eq!(ep.capacity_bytes(), 64 << 20);
        assert_eq!(
            ep.image_path(Path::new("/run")),
            PathBuf::from("/run/nvme0.img")
        );
        assert_eq!(ep.nvme_serial(), "pcifab-nvme0");
        let c = Config::parse(&nv(
            "capacity_mib = 65536\nimage = \"disks/a.raw\"\nvendor_id = 0x1b36\n\
             device_id = 0x10\nclass = 0x010802\ntemp_centi = 3000\n",
        ))
        .expect("nvme with every key");
        let ep = &c.endpoints[0];
        assert_eq!(ep.capacity_bytes(), 65536 << 20);
        assert_eq!(
            ep.image_path(Path::new("/run")),
            PathBuf::from("/run/disks/a.raw")
        );
        assert_eq!(ep.cmb_mib, None, "no CMB unless asked");
        for ok in [2, 4, 256] {
            let c = Config::parse(&nv(&format!("cmb_mib = {ok}\n"))).expect("a CMB");
            assert_eq!(c.endpoints[0].cmb_mib, Some(ok));
        }
        let c = Config::parse(&nv("image = \"/abs/b.img\"\n")).expect("absolute image");
        assert_eq!(
            c.endpoints[0].image_path(Path::new("/run")),
            PathBuf::from("/abs/b.img")
        );
        // A gpu endpoint (the default kind) is unchanged.
        let g = Config::parse(
            "[[hosts]]\nname = \"h\"\n[[endpoints]]\nname = \"g\"\nport = 16\n\
             vendor_id = 1\ndevice_id = 2\nclass = 3\n",
        )
        .expect("gpu");
        assert_eq!(g.endpoints[0].kind, EndpointKind::Gpu);
        assert_eq!(
            (g.endpoints[0].pf_mem_mib(), g.endpoints[0].vf_mem()),
            (16, 4)
        );
        for (extra, want) in [
            (
                "vfs = 1\n",
                "endpoints[0].vfs = 1 but an nvme endpoint has no VFs",
            ),
            (
                "vendor_id = 0x8086\n",
                "QEMU's nvme device shows 1b36:0010 class 010802, not 8086:0010 class 010802",
            ),
            ("device_id = 0x0011\n", "shows 1b36:0010 class 010802"),
            ("class = 0x010801\n", "not 1b36:0010 class 010801"),
            (
                "mem_mib = 2\n",
                "endpoints[0].mem_mib does not apply to an nvme endpoint",
            ),
            ("vf_mem_mib = 2\n", "endpoints[0].vf_mem_mib does not apply"),
            (
                "dev_mem_mib = 2\n",
                "endpoints[0].dev_mem_mib does not apply",
            ),
            (
                "vf_device_id = 2\n",
                "endpoints[0].vf_device_id does not apply",
            ),
            (
                "capacity_mib = 0\n",
                "endpoints[0].capacity_mib = 0 is out of range; use 1 to 65536",
            ),
            (
                "capacity_mib = 65537\n",
                "capacity_mib = 65537 is out of range",
            ),
            (
                "image = \"\"\n",
                "endpoints[0].image = \"\" is not a file name",
            ),
            (
                "cmb_mib = 0\n",
                "endpoints[0].cmb_mib = 0: use a power of two from 2 to 256",
            ),
            (
                "cmb_mib = 1\n",
                "endpoints[0].cmb_mib = 1: use a power of two",
            ),
            (
                "cmb_mib = 3\n",
                "endpoints[0].cmb_mib = 3: use a power of two",
            ),
            (
                "cmb_mib = 512\n",
                "endpoints[0].cmb_mib = 512: use a power of two",
            ),
            ("kind = \"ssd\"\n", "kind"),
        ] {
            let e = err(&nv(extra));
            assert!(e.contains(want), "{extra}: {e}");
        }
        let e = err(
            "[[hosts]]\nname = \"h\"\n[[endpoints]]\nname = \"a-very-long-name\"\nport = 20\n\
             kind = \"nvme\"\n",
        );
        assert!(
            e.contains("endpoints[0].name 'a-very-long-name' is too long")
                && e.contains("at most 13"),
            "{e}"
        );
        assert!(Config::parse(
            "[[hosts]]\nname = \"h\"\n[[endpoints]]\nname = \"a-long-name13\"\nport = 20\n\
             kind = \"nvme\"\n"
        )
        .is_ok());
        // A gpu endpoint needs its ids and takes no nvme keys.
        let gpu = |extra: &str| {
            format!("[[hosts]]\nname = \"h\"\n[[endpoints]]\nname = \"g\"\nport = 16\n{extra}")
        };
        let e = err(&gpu("kind = \"gpu\"\n"));
        assert!(
            e.contains(
                "endpoints[0] ('g') has no vendor_id, device_id, class; a gpu endpoint needs"
            ),
            "{e}"
        );
        let e = err(&gpu("vendor_id = 1\ndevice_id = 2\n"));
        assert!(e.contains("has no class;"), "{e}");
        for (extra, want) in [
            (
                "capacity_mib = 8\n",
                "endpoints[0].capacity_mib applies to kind = \"nvme\" only",
            ),
            (
                "image = \"x.img\"\n",
                "endpoints[0].image applies to kind = \"nvme\" only",
            ),
            (
                "cmb_mib = 2\n",
                "endpoints[0].cmb_mib applies to kind = \"nvme\" only",
            ),
        ] {
            let e = err(&gpu(&format!(
                "vendor_id = 1\ndevice_id = 2\nclass = 3\n{extra}"
            )));
            assert!(e.contains(want), "{extra}: {e}");
        }
    }
}

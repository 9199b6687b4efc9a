// SPDX-License-Identifier: GPL-2.0-only
//! What the guests should see, read from the emulator's TOML configuration.
//!
//! Parsed as a generic `toml::Table` on purpose: the harness checks the
//! emulator, so it must not share the emulator's own parser. The defaults
//! below mirror the ones documented in `tools/pcifab-emu/fabric.toml`.

use std::path::Path;

#[derive(Debug, Clone)]
pub struct Expected {
    pub device_id: u32,
    pub device_version: u32,
    pub fw_version: u32,
    pub vendor_id: String,
    pub product_id: String,
    pub product_revision: String,
    /// Host names in file order; index = switch partition.
    pub hosts: Vec<String>,
    /// `[[endpoints]]` in file order.
    pub endpoints: Vec<Endpoint>,
    /// `[policy] manager`, if any (none: every host is a manager).
    pub manager: Option<String>,
    /// Per host (same order as `hosts`): `allowed` endpoint names (None: all).
    pub allowed: Vec<Option<Vec<String>>>,
    /// Per host: `max_functions` (default 4).
    pub max_functions: Vec<u32>,
    /// Per host: `usp_port`, the physical port of its upstream port (default: the index).
    pub usp_ports: Vec<u32>,
    /// The firmware dialect the emulator speaks in this run: the top-level `dialect` key
    /// (default "extended"), overridden by `pcifab-harness test --dialect`.
    pub dialect: Dialect,
    /// The top-level `dma_mrpc` key (default true): the MEP offers DMA MRPC.
    pub dma_mrpc: bool,
    /// The top-level `dma_endpoint_channels` key (default 0, at most 32): channels of each
    /// host's DMA endpoint; 0: the switch shows none.
    pub dma_endpoint_channels: u32,
}

/// The emulator's firmware dialect (Documentation/emulator.rst, "Dialects").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Pax,
    Extended,
}

impl Dialect {
    pub fn parse(s: &str) -> Result<Dialect, String> {
        match s {
            "pax" => Ok(Dialect::Pax),
            "extended" => Ok(Dialect::Extended),
            _ => Err(format!("unknown dialect {s:?}: expected pax or extended")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dialect::Pax => "pax",
            Dialect::Extended => "extended",
        }
    }
}

/// One `[[endpoints]]` entry, with the emulator's documented defaults.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub name: String,
    pub port: u32,
    pub vendor_id: u32,
    pub device_id: u32,
    pub vf_device_id: u32,
    pub vfs: u32,
    pub mem_mib: u32,
    pub vf_mem_mib: u32,
    /// Telemetry the firmware reports for the PF (MRPC 0xF002): hundredths of a degree C,
    /// mW, mW, percent.
    pub temp_centi: i32,
    pub power_mw: u32,
    pub power_limit_mw: u32,
    pub utilisation: u32,
    /// `kind`: "gpu" (the emulator's register-file function, default) or "nvme" (QEMU's
    /// nvme device on the drive's image).
    pub kind: String,
    /// Controller memory buffer of an nvme drive, MiB (0: none).
    pub cmb_mib: u32,
}

impl Endpoint {
    /// PDFID of function `f` (0 = PF, i = VF i): 0x0100 + 0x20 * port + f.
    /// PDFID of function `f` (0 = PF), as the emulator numbers them
    /// (Documentation/emulator.rst): `0x0100 + 0x20 * port + f` below 32, `0x1000 + 0x100 *
    /// port + f` for VFs 32-255.
    pub fn pdfid(&self, f: u32) -> u16 {
        if f < 32 {
            (0x100 + 0x20 * self.port + f) as u16
        } else {
            (0x1000 + 0x100 * self.port + f) as u16
        }
    }
}

/// What the configuration says about one function.
#[derive(Debug, Clone)]
pub struct FunctionInfo {
    pub pdfid: u16,
    pub pf: u16,
    pub endpoint: String,
    pub vendor_id: u32,
    pub device_id: u32,
    pub bar2_bytes: u64,
}

fn endpoint(i: usize, t: &toml::Value) -> Result<Endpoint, String> {
    let t = t
        .as_table()
        .ok_or_else(|| format!("[[endpoints]] entry {i} is not a table"))?;
    let name = t
        .get("name")
        .and_then(|n| n.as_str())
        .ok_or_else(|| format!("[[endpoints]] entry {i} has no string `name`"))?
        .to_string();
    let req = |k: &str| -> Result<u32, String> {
        if t.get(k).is_none() {
            return Err(format!("[[endpoints]] {name}: `{k}` is required"));
        }
        int(t, k, 0, 0xffff_ffff).map_err(|e| format!("[[endpoints]] {name}: {e}"))
    };
    let opt = |k: &str, d: u32| {
        int(t, k, d, 0xffff_ffff).map_err(|e| format!("[[endpoints]] {name}: {e}"))
    };
    let device_id = req("device_id")?;
    let kind = match t.get("kind") {
        None => "gpu".to_string(),
        Some(toml::Value::String(k)) if k == "gpu" || k == "nvme" => k.clone(),
        Some(k) => {
            return Err(format!(
                "[[endpoints]] {name}: kind = {k} is not \"gpu\" or \"nvme\""
            ))
        }
    };
    Ok(Endpoint {
        kind,
        port: req("port")?,
        vendor_id: req("vendor_id")?,
        device_id,
        vf_device_id: opt("vf_device_id", device_id)?,
        vfs: opt("vfs", 0)?,
        mem_mib: opt("mem_mib", 16)?,
        vf_mem_mib: opt("vf_mem_mib", 4)?,
        temp_centi: signed(t, "temp_centi", 5500)
            .map_err(|e| format!("[[endpoints]] {name}: {e}"))?,
        power_mw: opt("power_mw", 75_000)?,
        power_limit_mw: opt("power_limit_mw", 300_000)?,
        utilisation: int(t, "utilisation", 0, 100)
            .map_err(|e| format!("[[endpoints]] {name}: {e}"))?,
        cmb_mib: opt("cmb_mib", 0)?,
        name,
    })
}

fn int(table: &toml::Table, key: &str, default: u32, max: u64) -> Result<u32, String> {
    let v = match table.get(key) {
        None => return Ok(default),
        Some(toml::Value::Integer(i)) => u64::try_from(*i).ok(),
        Some(toml::Value::String(s)) => {
            let s = s.trim();
            match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
                Some(hex) => u64::from_str_radix(hex, 16).ok(),
                None => s.parse().ok(),
            }
        }
        Some(_) => None,
    };
    match v {
        Some(v) if v <= max => Ok(v as u32),
        _ => Err(format!(
            "{key} = {:?} is not an integer in 0..={max:#x}",
            table.get(key)
        )),
    }
}

fn signed(table: &toml::Table, key: &str, default: i32) -> Result<i32, String> {
    match table.get(key) {
        None => Ok(default),
        Some(toml::Value::Integer(i)) => {
            i32::try_from(*i).map_err(|_| format!("{key} = {i} does not fit a 32-bit integer"))
        }
        Some(v) => Err(format!("{key} = {v} is not an integer")),
    }
}

fn string(table: &toml::Table, key: &str, default: &str) -> Result<String, String> {
    match table.get(key) {
        None => Ok(default.to_string()),
        Some(toml::Value::String(s)) => Ok(s.clone()),
        Some(v) => Err(format!("[firmware] {key} = {v} is not a string")),
    }
}

impl Expected {
    pub fn parse(text: &str) -> Result<Self, String> {
        let root: toml::Table = text.parse().map_err(|e| format!("invalid TOML: {e}"))?;
        let empty = toml::Table::new();
        let fw = match root.get("firmware") {
            None => &empty,
            Some(toml::Value::Table(t)) => t,
            Some(_) => return Err("[firmware] is not a table".into()),
        };
        let hosts = match root.get("hosts") {
            Some(toml::Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    h.get("name")
                        .and_then(|n| n.as_str())
                        .map(str::to_string)
                        .ok_or_else(|| format!("[[hosts]] entry {i} has no string `name`"))
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => return Err("no [[hosts]] entries: the fabric needs at least one host".into()),
        };
        if hosts.is_empty() {
            return Err("no [[hosts]] entries: the fabric needs at least one host".into());
        }
        let host_tables: Vec<&toml::Value> = match root.get("hosts") {
            Some(toml::Value::Array(a)) => a.iter().collect(),
            _ => Vec::new(),
        };
        let allowed = host_tables
            .iter()
            .map(|h| {
                h.get("allowed").and_then(|a| a.as_array()).map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect()
                })
            })
            .collect();
        let max_functions = host_tables
            .iter()
            .map(|h| match h.as_table() {
                Some(t) => int(t, "max_functions", 4, 48),
                None => Ok(4),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let usp_ports = host_tables
            .iter()
            .enumerate()
            .map(|(i, h)| match h.as_table() {
                Some(t) => int(t, "usp_port", i as u32, 47),
                None => Ok(i as u32),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let endpoints = match root.get("endpoints") {
            None => Vec::new(),
            Some(toml::Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, t)| endpoint(i, t))
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => return Err("`endpoints` is not an array of tables".into()),
        };
        let manager = root
            .get("policy")
            .and_then(|p| p.get("manager"))
            .and_then(|m| m.as_str())
            .map(str::to_string);
        let dialect = match root.get("dialect") {
            None => Dialect::Extended,
            Some(toml::Value::String(d)) => Dialect::parse(d)?,
            Some(v) => return Err(format!("dialect = {v} is not a string")),
        };
        let dma_mrpc = match root.get("dma_mrpc") {
            None => true,
            Some(toml::Value::Boolean(b)) => *b,
            Some(v) => return Err(format!("dma_mrpc = {v} is not a boolean")),
        };
        let dma_endpoint_channels = int(&root, "dma_endpoint_channels", 0, 32)?;
        Ok(Expected {
            dialect,
            dma_mrpc,
            dma_endpoint_channels,
            device_id: int(fw, "device_id", 0x4228, 0xffff)?,
            device_version: int(fw, "device_version", 0x4228, 0xffff_ffff)?,
            fw_version: int(fw, "fw_version", 0x0407_0041, 0xffff_ffff)?,
            vendor_id: string(fw, "vendor_id", "MICROSEM")?,
            product_id: string(fw, "product_id", "PAX 28XG4")?,
            product_revision: string(fw, "product_revision", "B0")?,
            hosts,
            endpoints,
            manager,
            allowed,
            max_functions,
            usp_ports,
        })
    }

    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read emulator config {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn partition_count(&self) -> usize {
        self.hosts.len()
    }

    pub fn endpoint(&self, name: &str) -> Option<&Endpoint> {
        self.endpoints.iter().find(|e| e.name == name)
    }

    /// Every function of every endpoint.
    pub fn functions(&self) -> Vec<FunctionInfo> {
        let mut v = Vec::new();
        for e in &self.endpoints {
            for f in 0..=e.vfs {
                v.push(FunctionInfo {
                    pdfid: e.pdfid(f),
                    pf: e.pdfid(0),
                    endpoint: e.name.clone(),
                    vendor_id: e.vendor_id,
                    device_id: if f == 0 { e.device_id } else { e.vf_device_id },
                    bar2_bytes: u64::from(if f == 0 { e.mem_mib } else { e.vf_mem_mib }) << 20,
                });
            }
        }
        v
    }

    pub fn function(&self, pdfid: u16) -> Option<FunctionInfo> {
        self.functions().into_iter().find(|f| f.pdfid == pdfid)
    }

    /// Whether host `index` may do everything (the manager, or no manager at all).
    pub fn is_manager(&self, index: usize) -> bool {
        match &self.manager {
            None => true,
            Some(m) => self.hosts.get(index) == Some(m),
        }
    }

    /// Whether host `index` may bind functions of `endpoint` to itself.
    pub fn may_bind_self(&self, index: usize, endpoint: &str) -> bool {
        self.is_manager(index)
            || match self.allowed.get(index) {
                Some(Some(list)) => list.iter().any(|e| e == endpoint),
                _ => true,
            }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dialect_dma_and_ports() {
        let e = Expected::parse("[[hosts]]\nname = \"a\"\n[[hosts]]\nname = \"b\"\nusp_port = 8\n")
            .unwrap();
        assert_eq!((e.dialect, e.dma_mrpc), (Dialect::Extended, true));
        assert_eq!(e.usp_ports, [0, 8]);
        let e = Expected::parse("dialect = \"pax\"\ndma_mrpc = false\n[[hosts]]\nname = \"a\"\n")
            .unwrap();
        assert_eq!((e.dialect, e.dma_mrpc), (Dialect::Pax, false));
        assert!(Expected::parse("dialect = 1\n[[hosts]]\nname = \"a\"\n").is_err());
        assert!(Expected::parse("dialect = \"x\"\n[[hosts]]\nname = \"a\"\n").is_err());
    }

    #[test]
    fn defaults_and_hosts() {
        let e = Expected::parse("[[hosts]]\nname = \"a\"\n[[hosts]]\nname = \"b\"\n").unwrap();
        assert_eq!(e.hosts, ["a", "b"]);
        assert_eq!(e.fw_version, 0x0407_0041);
        assert_eq!(e.device_id, 0x4228);
    }

    #[test]
    fn values_and_errors() {
        let e = Expected::parse(
            "[firmware]\nfw_version = 0x01020304\nproduct_id = \"X \"\n[[hosts]]\nname = \"h\"\n",
        )
        .unwrap();
        assert_eq!(e.fw_version, 0x0102_0304);
        assert_eq!(e.product_id, "X ");
        assert!(Expected::parse("[firmware]\n").is_err());
        assert!(
            Expected::parse("[firmware]\ndevice_id = 0x10000\n[[hosts]]\nname=\"h\"\n").is_err()
        );
    }

    #[test]
    fn harness_config() {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/fabric.toml");
        let e = Expected::load(Path::new(p)).unwrap();
        assert_eq!(e.hosts, ["h0", "h1"]);
        assert_eq!(e.manager.as_deref(), Some("h0"));
        assert!(e.is_manager(0) && !e.is_manager(1));
        assert!(e.may_bind_self(1, "gpu1") && !e.may_bind_self(1, "gpu0"));
        let gpu0 = e.endpoint("gpu0").unwrap();
        assert_eq!((gpu0.pdfid(0), gpu0.pdfid(4), gpu0.vfs), (0x300, 0x304, 4));
        let f = e.function(0x402).unwrap();
        assert_eq!((f.pf, f.device_id, f.bar2_bytes), (0x400, 0x2331, 1 << 20));
        assert_eq!(e.functions().len(), 10);
        assert_eq!(e.dma_endpoint_channels, 4);
        let one = "[[hosts]]\nname = \"h0\"\n";
        assert_eq!(Expected::parse(one).unwrap().dma_endpoint_channels, 0);
        assert!(Expected::parse(&format!("dma_endpoint_channels = 33\n{one}")).is_err());
    }
}

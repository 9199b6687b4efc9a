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
            "[firmware] {key} = {:?} is not an integer in 0..={max:#x}",
            table.get(key)
        )),
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
        Ok(Expected {
            device_id: int(fw, "device_id", 0x4228, 0xffff)?,
            device_version: int(fw, "device_version", 0x4228, 0xffff_ffff)?,
            fw_version: int(fw, "fw_version", 0x0407_0041, 0xffff_ffff)?,
            vendor_id: string(fw, "vendor_id", "MICROSEM")?,
            product_id: string(fw, "product_id", "PAX 28XG4")?,
            product_revision: string(fw, "product_revision", "B0")?,
            hosts,
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

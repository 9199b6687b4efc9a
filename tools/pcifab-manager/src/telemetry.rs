// SPDX-License-Identifier: GPL-2.0-only

//! Per-function telemetry through the MRPC pass-through and the `FUNCTION_TELEMETRY`
//! firmware extension (0xF002, `Documentation/mrpc.rst`), and the thresholds that take a
//! device out of the pool.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use serde::{Deserialize, Serialize};

use crate::config::TelemetryConfig;
use crate::driver::Driver;
use crate::scheduler::Pdfid;

/// pcifab's FUNCTION_TELEMETRY firmware extension and its health bits (the codec lives in
/// pcifab-uapi, shared with the CLI).
pub use pcifab_uapi::telemetry::{
    EXT_FUNCTION_TELEMETRY, HEALTH_LINK_DOWN, HEALTH_POWER_WARN, HEALTH_THERMAL_WARN,
};

/// One reading of one function.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    pub pdfid: Pdfid,
    /// Hundredths of a degree Celsius.
    pub temperature_centi: i32,
    pub power_mw: u32,
    pub utilisation: u8,
    pub health: u32,
}

/// The 8-byte input: header (version 1, size 8), pdfid, reserved.
pub fn request(pdfid: Pdfid) -> [u8; 8] {
    pcifab_uapi::telemetry::request(pdfid)
}

/// Decodes a reply; checks its header and that it is about `pdfid`.
pub fn parse(pdfid: Pdfid, out: &[u8]) -> Result<Sample, String> {
    let s = pcifab_uapi::telemetry::parse(pdfid, out)?;
    Ok(Sample {
        pdfid,
        temperature_centi: s.temperature_centi,
        power_mw: s.power_mw,
        utilisation: s.utilisation,
        health: s.health,
    })
}

/// Where samples come from.
pub trait Source {
    fn read(&mut self, pdfid: Pdfid) -> Result<Sample, String>;
}

impl Source for Driver {
    /// With pcifab's telemetry extension, the function's own reading. On PAX firmware, which
    /// reports no per-function telemetry, what PAX does report: the switch's die temperature
    /// and whether the function's link is up (the inventory), so a device whose link goes
    /// down still leaves the pool.
    fn read(&mut self, pdfid: Pdfid) -> Result<Sample, String> {
        if !self.has_telemetry()? {
            // A function whose endpoint's link is down is missing from the endpoint records
            // PAX reports: that is a link down too.
            let link_down = self
                .functions()?
                .into_iter()
                .find(|f| f.pdfid == pdfid)
                .is_none_or(|f| f.flags & pcifab_uapi::FN_LINK_UP == 0);
            return Ok(Sample {
                pdfid,
                temperature_centi: self.die_temperature()?,
                power_mw: 0,
                utilisation: 0,
                health: if link_down { HEALTH_LINK_DOWN } else { 0 },
            });
        }
        let mut out = [0u8; 24];
        let (status, ret) = self
            .mrpc(EXT_FUNCTION_TELEMETRY, &request(pdfid), &mut out)
            .map_err(|e| format!("FUNCTION_TELEMETRY {pdfid:#06x} on {}: {e}", self.path))?;
        if status != pcifab_uapi::MRPC_STATUS_DONE {
            return Err(format!(
                "the firmware failed FUNCTION_TELEMETRY for {pdfid:#06x}: return value {ret:#x}"
            ));
        }
        parse(pdfid, &out)
    }
}

/// A simulated source: readings set by hand (tests); clones share them.
#[derive(Clone, Debug, Default)]
pub struct SimSource {
    pub samples: Arc<Mutex<BTreeMap<Pdfid, Sample>>>,
}

impl SimSource {
    /// Sets what `pdfid` reads from now on.
    pub fn set(&self, s: Sample) {
        if let Ok(mut m) = self.samples.lock() {
            m.insert(s.pdfid, s);
        }
    }
}

impl Source for SimSource {
    fn read(&mut self, pdfid: Pdfid) -> Result<Sample, String> {
        let m = self
            .samples
            .lock()
            .map_err(|_| "simulated telemetry lock poisoned".to_string())?;
        Ok(m.get(&pdfid).copied().unwrap_or(Sample {
            pdfid,
            temperature_centi: 4500,
            power_mw: 100_000,
            utilisation: 0,
            health: 0,
        }))
    }
}

/// Why a sample is bad under the thresholds, if it is.
pub fn judge(cfg: &TelemetryConfig, s: &Sample) -> Option<String> {
    let mut why = Vec::new();
    let flags = s.health & cfg.health_mask;
    if flags & HEALTH_LINK_DOWN != 0 {
        why.push("link down".to_string());
    }
    if flags & HEALTH_THERMAL_WARN != 0 {
        why.push("thermal warning".into());
    }
    if flags & HEALTH_POWER_WARN != 0 {
        why.push("power warning".into());
    }
    if f64::from(s.temperature_centi) / 100.0 >= cfg.max_temp_c {
        why.push(format!(
            "{:.2} C >= {:.2} C",
            f64::from(s.temperature_centi) / 100.0,
            cfg.max_temp_c
        ));
    }
    if cfg.max_power_mw != 0 && s.power_mw > cfg.max_power_mw {
        why.push(format!("{} mW > {} mW", s.power_mw, cfg.max_power_mw));
    }
    (!why.is_empty()).then(|| format!("{:#06x}: {}", s.pdfid, why.join(", ")))
}

/// Counts consecutive bad polls per device and says when its health changes.
#[derive(Clone, Debug, Default)]
pub struct Judge {
    bad: BTreeMap<Pdfid, u32>,
}

/// A change of a device's health the manager should act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Unhealthy(String),
    Healthy,
}

impl Judge {
    /// Feeds the samples of one device (its PF first); `currently_unhealthy` is what the
    /// scheduler has. Unreadable functions count as bad.
    pub fn feed(
        &mut self,
        cfg: &TelemetryConfig,
        pf: Pdfid,
        samples: &[Result<Sample, String>],
        currently_unhealthy: bool,
    ) -> Option<Verdict> {
        let reason = samples
            .iter()
            .filter_map(|s| match s {
                Ok(s) => judge(cfg, s),
                Err(e) => Some(e.clone()),
            })
            .next();
        match reason {
            Some(r) => {
                let n = self.bad.entry(pf).or_default();
                *n += 1;
                (!currently_unhealthy && *n >= cfg.bad_samples.max(1))
                    .then_some(Verdict::Unhealthy(r))
            }
            None => {
                self.bad.remove(&pf);
                currently_unhealthy.then_some(Verdict::Healthy)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_and_decodes() {
        assert_eq!(request(0x0121), [1, 0, 8, 0, 0x21, 0x01, 0, 0]);
        let mut out = [0u8; 24];
        out[..2].copy_from_slice(&1u16.to_le_bytes());
        out[2..4].copy_from_slice(&24u16.to_le_bytes());
        out[4..6].copy_from_slice(&0x0121u16.to_le_bytes());
        out[8..12].copy_from_slice(&(-150i32).to_le_bytes());
        out[12..16].copy_from_slice(&250_000u32.to_le_bytes());
        out[16] = 77;
        out[20..24].copy_from_slice(&HEALTH_THERMAL_WARN.to_le_bytes());
        let s = parse(0x0121, &out).expect("parse");
        assert_eq!(s.temperature_centi, -150);
        assert_eq!((s.power_mw, s.utilisation, s.health), (250_000, 77, 2));
        assert!(parse(0x0122, &out).is_err());
        assert!(parse(0x0121, &out[..20]).is_err());
        out[0] = 2;
        assert!(parse(0x0121, &out).is_err());
    }

    #[test]
    fn thresholds_need_consecutive_bad_samples() {
        let cfg = TelemetryConfig {
            max_temp_c: 90.0,
            bad_samples: 2,
            ..TelemetryConfig::default()
        };
        let hot = Sample {
            pdfid: 0x120,
            temperature_centi: 9100,
            ..Sample::default()
        };
        let ok = Sample {
            pdfid: 0x120,
            temperature_centi: 5000,
            ..Sample::default()
        };
        let mut j = Judge::default();
        assert_eq!(j.feed(&cfg, 0x120, &[Ok(hot)], false), None);
        assert_eq!(j.feed(&cfg, 0x120, &[Ok(ok)], false), None);
        assert_eq!(j.feed(&cfg, 0x120, &[Ok(hot)], false), None);
        assert!(matches!(
            j.feed(&cfg, 0x120, &[Ok(hot)], false),
            Some(Verdict::Unhealthy(r)) if r.contains("91.00 C")
        ));
        assert_eq!(j.feed(&cfg, 0x120, &[Ok(ok)], true), Some(Verdict::Healthy));
    }
}

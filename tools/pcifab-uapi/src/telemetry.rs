// SPDX-License-Identifier: GPL-2.0-only

//! The codec of pcifab's FUNCTION_TELEMETRY firmware extension (0xF002,
//! `Documentation/mrpc.rst`): the request bytes and the checked decoding of the reply, shared
//! by the CLI and the manager.

/// The MRPC command id of FUNCTION_TELEMETRY.
pub const EXT_FUNCTION_TELEMETRY: u32 = 0xf002;
/// Bytes of a version 1 reply.
pub const REPLY_LEN: usize = 24;
/// Health flag bits of the reply.
pub const HEALTH_LINK_DOWN: u32 = 1 << 0;
pub const HEALTH_THERMAL_WARN: u32 = 1 << 1;
pub const HEALTH_POWER_WARN: u32 = 1 << 2;

/// One reading of one function.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    pub pdfid: u16,
    /// Hundredths of a degree Celsius.
    pub temperature_centi: i32,
    pub power_mw: u32,
    /// Percent.
    pub utilisation: u8,
    /// `HEALTH_*` bits.
    pub health: u32,
}

/// The 8-byte input: header (version 1, size 8), pdfid, reserved.
pub fn request(pdfid: u16) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..2].copy_from_slice(&1u16.to_le_bytes());
    b[2..4].copy_from_slice(&8u16.to_le_bytes());
    b[4..6].copy_from_slice(&pdfid.to_le_bytes());
    b
}

/// Decodes a reply; checks its length, its header and that it is about `pdfid`.
pub fn parse(pdfid: u16, out: &[u8]) -> Result<Sample, String> {
    if out.len() < REPLY_LEN {
        return Err(format!(
            "telemetry reply of {} bytes, need {REPLY_LEN}",
            out.len()
        ));
    }
    let u16_at = |o: usize| u16::from_le_bytes([out[o], out[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes([out[o], out[o + 1], out[o + 2], out[o + 3]]);
    let (version, size) = (u16_at(0), u16_at(2));
    if version != 1 || usize::from(size) < REPLY_LEN {
        return Err(format!(
            "telemetry reply version {version} size {size}: this tool reads version 1, 24 bytes"
        ));
    }
    if u16_at(4) != pdfid {
        return Err(format!(
            "telemetry reply is about {:#06x}, asked for {pdfid:#06x}",
            u16_at(4)
        ));
    }
    Ok(Sample {
        pdfid,
        temperature_centi: u32_at(8) as i32,
        power_mw: u32_at(12),
        utilisation: out[16],
        health: u32_at(20),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_checks() {
        let mut out = [0u8; 24];
        out[..2].copy_from_slice(&1u16.to_le_bytes());
        out[2..4].copy_from_slice(&24u16.to_le_bytes());
        out[4..6].copy_from_slice(&0x300u16.to_le_bytes());
        out[8..12].copy_from_slice(&(-150i32).to_le_bytes());
        out[12..16].copy_from_slice(&250_000u32.to_le_bytes());
        out[16] = 77;
        out[20..24].copy_from_slice(&HEALTH_THERMAL_WARN.to_le_bytes());
        let s = parse(0x300, &out).expect("parse");
        assert_eq!(
            (s.temperature_centi, s.power_mw, s.utilisation, s.health),
            (-150, 250_000, 77, 2)
        );
        assert!(parse(0x301, &out).is_err());
        assert!(parse(0x300, &out[..23]).is_err());
        out[0] = 2;
        assert!(parse(0x300, &out).is_err());
        assert_eq!(&request(0x300)[..6], &[1, 0, 8, 0, 0, 3]);
    }
}

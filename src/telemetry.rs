// SPDX-License-Identifier: GPL-2.0-only

//! Telemetry the firmware reports: the switch's die temperature (PAX's `DIETEMP`, 0x04) and,
//! where the firmware has pcifab's extension ([`fw::ext::TELEMETRY`]), each function's
//! temperature, power, utilisation and health (`FUNCTION_TELEMETRY`, 0xF002). Without the
//! extension a function's telemetry is `EOPNOTSUPP`.
//!
//! sysfs files anyone may read show them. Each answer is kept for [`MAX_AGE`], so a reader in
//! a loop costs the mailbox at most one command per second and value, however many readers
//! there are: unprivileged users cannot monopolise the firmware's mailbox this way.

use kernel::{
    new_mutex,
    prelude::*,
    sync::Mutex,
    time::{Delta, Instant, Monotonic},
};

use crate::{fabric, fw, Mep};

/// How long an answer is served from the cache.
const MAX_AGE: Delta = Delta::from_millis(1_000);
/// Functions whose last answer is kept; beyond it the oldest entry is replaced.
const MAX_ENTRIES: usize = 1024;

/// One function's telemetry, as the firmware reports it.
#[derive(Clone, Copy)]
pub(crate) struct Function {
    pub(crate) temp_centi: i32,
    pub(crate) power_mw: u32,
    pub(crate) utilisation: u8,
    pub(crate) health: u32,
}

struct Entry {
    pdfid: u16,
    at: Instant<Monotonic>,
    value: Function,
}

struct State {
    die: Option<(Instant<Monotonic>, u32)>,
    functions: KVec<Entry>,
}

/// The cached answers of one endpoint.
#[pin_data]
pub(crate) struct Cache {
    /// Held across the firmware command too, so that concurrent readers of a stale value
    /// wait for the one command instead of sending one each.
    #[pin]
    state: Mutex<State>,
}

impl Cache {
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            state <- new_mutex!(State {
                die: None,
                functions: KVec::new(),
            }),
        })
    }

    /// Die temperature in hundredths of a degree Celsius, at most [`MAX_AGE`] old.
    pub(crate) fn die_temperature(&self, mep: &Mep) -> Result<u32> {
        let mut st = self.state.lock();
        if let Some((at, t)) = st.die {
            if at.elapsed() < MAX_AGE {
                return Ok(t);
            }
        }
        let t = fabric::die_temperature(mep)?;
        st.die = Some((Instant::now(), t));
        Ok(t)
    }

    /// Function `pdfid`'s telemetry, at most [`MAX_AGE`] old.
    pub(crate) fn function(&self, mep: &Mep, pdfid: u16) -> Result<Function> {
        mep.features().require(fw::ext::TELEMETRY)?;
        let mut st = self.state.lock();
        let slot = st.functions.iter().position(|e| e.pdfid == pdfid);
        if let Some(e) = slot.and_then(|i| st.functions.get(i)) {
            if e.at.elapsed() < MAX_AGE {
                return Ok(e.value);
            }
        }
        let value = read_function(mep, pdfid)?;
        let entry = Entry {
            pdfid,
            at: Instant::now(),
            value,
        };
        let full = st.functions.len() >= MAX_ENTRIES;
        let functions = &mut st.functions;
        match slot.and_then(|i| functions.get_mut(i)) {
            Some(e) => *e = entry,
            None if !full => functions.push(entry, GFP_KERNEL)?,
            None => {
                // Replace the oldest answer.
                if let Some(e) = functions.iter_mut().max_by_key(|e| e.at.elapsed()) {
                    *e = entry;
                }
            }
        }
        Ok(value)
    }
}

fn read_function(mep: &Mep, pdfid: u16) -> Result<Function> {
    let t = fw::query(mep, &fw::ext::TelemetryReq::new(pdfid))?;
    Ok(Function {
        temp_centi: t.temp_centi,
        power_mw: t.power_mw,
        utilisation: t.utilisation,
        health: t.health,
    })
}

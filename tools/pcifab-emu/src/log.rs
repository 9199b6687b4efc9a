// SPDX-License-Identifier: GPL-2.0-only
//! Timestamped one-line logging to stderr.
//!
//! Plain lines start with the timestamp. Lines about something that went
//! wrong start with a fixed prefix, then the timestamp, so a test harness can
//! tell them apart without parsing the message (Documentation/emulator.rst,
//! "Log"): `pcifab-emu: error: ` for what a healthy run never shows (a fault
//! in the emulator or its environment), `pcifab-emu: note: ` for refusals and
//! failures that are expected in tests (a guest's refused request, an
//! injected fault, a client that went away).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

static VERBOSE: AtomicBool = AtomicBool::new(false);

pub fn set_verbose(on: bool) {
    VERBOSE.store(on, Ordering::Relaxed);
}

/// UTC time as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn timestamp() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs();
    let (days, rem) = (secs / 86400, secs % 86400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        now.subsec_millis()
    )
}

pub const ERROR_PREFIX: &str = "pcifab-emu: error: ";
pub const NOTE_PREFIX: &str = "pcifab-emu: note: ";

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Level {
    /// Only with `--verbose`.
    Debug,
    Info,
    /// Expected in tests: a refused request, an injected fault.
    Note,
    /// Never in a healthy run.
    Error,
}

/// The line logged for `args` at `level` (without the newline).
pub fn line(level: Level, args: fmt::Arguments) -> String {
    let prefix = match level {
        Level::Debug | Level::Info => "",
        Level::Note => NOTE_PREFIX,
        Level::Error => ERROR_PREFIX,
    };
    format!("{prefix}{} {args}", timestamp())
}

pub fn emit(level: Level, args: fmt::Arguments) {
    if level == Level::Debug && !VERBOSE.load(Ordering::Relaxed) {
        return;
    }
    eprintln!("{}", line(level, args));
}

/// Always logged.
macro_rules! info {
    ($($arg:tt)*) => { $crate::log::emit($crate::log::Level::Info, format_args!($($arg)*)) };
}

/// Logged only with `--verbose`.
macro_rules! debug {
    ($($arg:tt)*) => { $crate::log::emit($crate::log::Level::Debug, format_args!($($arg)*)) };
}

/// Something expected in tests went wrong: `pcifab-emu: note: ` prefix.
macro_rules! note {
    ($($arg:tt)*) => { $crate::log::emit($crate::log::Level::Note, format_args!($($arg)*)) };
}

/// Something a healthy run never shows: `pcifab-emu: error: ` prefix.
macro_rules! error {
    ($($arg:tt)*) => { $crate::log::emit($crate::log::Level::Error, format_args!($($arg)*)) };
}

/// Logged as a note when `$cond` holds, else as an ordinary line.
macro_rules! info_or_note {
    ($cond:expr, $($arg:tt)*) => {
        $crate::log::emit(
            if $cond { $crate::log::Level::Note } else { $crate::log::Level::Info },
            format_args!($($arg)*),
        )
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamp_shape() {
        let t = super::timestamp();
        assert_eq!(t.len(), 24, "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T', "{t}");
    }

    #[test]
    fn prefixes() {
        use super::{line, Level};
        let e = line(Level::Error, format_args!("x {}", 1));
        assert!(e.starts_with("pcifab-emu: error: 20"), "{e}");
        assert!(e.ends_with("Z x 1"), "{e}");
        let n = line(Level::Note, format_args!("y"));
        assert!(
            n.starts_with("pcifab-emu: note: 20") && n.ends_with("Z y"),
            "{n}"
        );
        let i = line(Level::Info, format_args!("z"));
        assert!(i.starts_with("20") && i.ends_with("Z z"), "{i}");
        assert!(!i.contains("pcifab-emu:"), "{i}");
    }
}

// SPDX-License-Identifier: GPL-2.0-only

//! `pcifab top` (live telemetry of every function) and `pcifab stats --telemetry` (one
//! snapshot), read from the driver directly.
//!
//! On a terminal `top` redraws in place with plain VT100 cursor moves (home, erase to end of
//! line and of screen: no alternate screen, so it works on a serial console and leaves its
//! last frame on the screen), reads single keys (`q` quits, `s` changes the sort key) and
//! restores the terminal on exit or Ctrl-C. Otherwise it prints one timestamped table per
//! refresh.

use std::{
    fs::File,
    io::{IsTerminal, Write},
    os::fd::AsRawFd,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant, SystemTime},
};

use pcifab::cli::SortKey;
use pcifab_uapi::{dev, telemetry::Sample};
use serde_json::{json, Value};

use super::{emit, inventory, open, out::rfc3339, pdfid_str, telemetry_json, Cli, Error};

/// One row: a function and its telemetry, or why there is none.
struct Row {
    pdfid: u16,
    vf: bool,
    host: Option<u8>,
    t: Result<Sample, String>,
}

fn rows(dev: &File, cli: &Cli) -> Result<(u32, Vec<Row>), Error> {
    let fab = inventory(dev, &cli.device)?;
    let rows = fab
        .functions
        .iter()
        .map(|f| Row {
            pdfid: f.pdfid,
            vf: f.flags & pcifab_uapi::FN_VF != 0,
            host: (f.flags & pcifab_uapi::FN_BOUND != 0).then_some(f.bound_host),
            t: dev::telemetry(dev, f.pdfid),
        })
        .collect();
    Ok((fab.inv.generation, rows))
}

fn rows_json(generation: u32, rows: &[Row]) -> Value {
    let fns: Vec<Value> = rows
        .iter()
        .map(|r| {
            let mut j = json!({
                "pdfid": pdfid_str(r.pdfid),
                "kind": if r.vf { "vf" } else { "pf" },
                "host": r.host,
            });
            match &r.t {
                Ok(t) => j["telemetry"] = telemetry_json(t),
                Err(e) => j["error"] = json!(e),
            }
            j
        })
        .collect();
    json!({"generation": generation, "functions": fns})
}

pub fn health_text(h: u64) -> String {
    if h == 0 {
        return "ok".into();
    }
    let mut v = Vec::new();
    for (bit, name) in [(1, "link-down"), (2, "thermal"), (4, "power")] {
        if h & bit != 0 {
            v.push(name);
        }
    }
    if h & !7 != 0 || v.is_empty() {
        return format!("{h:#x}");
    }
    v.join(",")
}

/// Sorts rows by `key`: largest first for the readings, ascending for ids; rows without
/// telemetry last.
fn sort(rows: &mut [Row], key: SortKey) {
    rows.sort_by(|a, b| {
        let reading = |r: &Row| -> Option<i64> {
            let t = r.t.as_ref().ok()?;
            Some(match key {
                SortKey::Temp => i64::from(t.temperature_centi),
                SortKey::Power => i64::from(t.power_mw),
                SortKey::Util => i64::from(t.utilisation),
                SortKey::Health => i64::from(t.health),
                SortKey::Pdfid | SortKey::Host => 0,
            })
        };
        let by = match key {
            SortKey::Pdfid => a.pdfid.cmp(&b.pdfid),
            SortKey::Host => (a.host.is_none(), a.host).cmp(&(b.host.is_none(), b.host)),
            _ => match (reading(a), reading(b)) {
                (Some(x), Some(y)) => y.cmp(&x),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (None, None) => std::cmp::Ordering::Equal,
            },
        };
        by.then(a.pdfid.cmp(&b.pdfid))
    });
}

/// The table as lines of text.
fn table(generation: u32, rows: &[Row], key: SortKey, live: bool) -> Vec<String> {
    let mut out = vec![format!(
        "{}  fabric generation {generation}: {} functions, sorted by {}{}",
        rfc3339(SystemTime::now()),
        rows.len(),
        key.name(),
        if live { "  (q quits, s sorts)" } else { "" }
    )];
    out.push("PDFID   KIND  HOST  TEMP      POWER       UTIL  HEALTH".into());
    for r in rows {
        let host = r.host.map_or("-".into(), |h| h.to_string());
        let kind = if r.vf { "vf" } else { "pf" };
        match &r.t {
            Ok(t) => {
                let c = t.temperature_centi;
                out.push(format!(
                    "{:<7} {:<5} {:<5} {:<9} {:<11} {:<5} {}",
                    pdfid_str(r.pdfid),
                    kind,
                    host,
                    format!("{}.{:02} C", c / 100, (c % 100).abs()),
                    format!("{} mW", t.power_mw),
                    format!("{}%", t.utilisation),
                    health_text(u64::from(t.health))
                ));
            }
            Err(e) => out.push(format!(
                "{:<7} {:<5} {:<5} telemetry not available: {e}",
                pdfid_str(r.pdfid),
                kind,
                host
            )),
        }
    }
    out
}

/// `stats --telemetry`: one snapshot.
pub fn snapshot(cli: &Cli) -> Result<(), Error> {
    let dev = open(&cli.device)?;
    let (generation, mut rows) = rows(&dev, cli)?;
    sort(&mut rows, SortKey::Pdfid);
    if cli.json {
        emit("stats-telemetry", rows_json(generation, &rows));
    } else {
        for l in table(generation, &rows, SortKey::Pdfid, false) {
            println!("{l}");
        }
    }
    Ok(())
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// The terminal in single-key mode (no line editing, no echo; signals still work) until
/// dropped.
struct Raw {
    fd: i32,
    saved: libc::termios,
}

impl Raw {
    fn enter(fd: i32) -> Option<Self> {
        // SAFETY: termios is plain data; tcgetattr fills it or fails.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open; `t` is a valid termios to fill.
        if unsafe { libc::tcgetattr(fd, &mut t) } != 0 {
            return None;
        }
        let saved = t;
        t.c_lflag &= !(libc::ICANON | libc::ECHO);
        t.c_cc[libc::VMIN] = 0;
        t.c_cc[libc::VTIME] = 0;
        // SAFETY: as above; `t` is a termios tcgetattr filled.
        (unsafe { libc::tcsetattr(fd, libc::TCSANOW, &t) } == 0).then_some(Self { fd, saved })
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: restores what `enter` read from the same descriptor.
        unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved) };
    }
}

/// Waits up to `d` for a key on `fd`; returns it, or None on timeout or a signal.
fn key(fd: Option<i32>, d: Duration) -> Option<u8> {
    let Some(fd) = fd else {
        std::thread::sleep(d);
        return None;
    };
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(d.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd.
    if unsafe { libc::poll(&mut p, 1, ms) } <= 0 {
        return None;
    }
    let mut b = [0u8; 1];
    // SAFETY: reads at most one byte into `b`.
    (unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) } == 1).then_some(b[0])
}

/// `top`: refresh every `interval` seconds until `q`, Ctrl-C or `--count` refreshes.
pub fn top(cli: &Cli, interval: f64, mut key_sort: SortKey) -> Result<(), Error> {
    let dev = open(&cli.device)?;
    let live = std::io::stdout().is_terminal() && !cli.json;
    let stdin = std::io::stdin();
    let raw = (live && stdin.is_terminal())
        .then(|| Raw::enter(stdin.as_raw_fd()))
        .flatten();
    let keys = raw.as_ref().map(|r| r.fd);
    let handler = on_signal as extern "C" fn(libc::c_int);
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
        libc::signal(libc::SIGTERM, handler as libc::sighandler_t);
    }
    let period = Duration::from_secs_f64(interval);
    let count = cli.count.unwrap_or(0);
    let mut n = 0;
    let mut stdout = std::io::stdout();
    'refresh: while !STOP.load(Ordering::Relaxed) {
        let (generation, mut rows) = rows(&dev, cli)?;
        sort(&mut rows, key_sort);
        if cli.json {
            emit("top", rows_json(generation, &rows));
        } else if live {
            let mut frame = String::from("\x1b[H");
            for l in table(generation, &rows, key_sort, keys.is_some()) {
                frame.push_str(&l);
                frame.push_str("\x1b[K\r\n");
            }
            frame.push_str("\x1b[J");
            let _ = stdout.write_all(frame.as_bytes());
        } else {
            for l in table(generation, &rows, key_sort, false) {
                let _ = writeln!(stdout, "{l}");
            }
            let _ = writeln!(stdout);
        }
        let _ = stdout.flush();
        n += 1;
        if count != 0 && n >= count {
            break;
        }
        let until = Instant::now() + period;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || STOP.load(Ordering::Relaxed) {
                break;
            }
            match key(keys, left) {
                Some(b'q' | b'Q') => break 'refresh,
                Some(b's' | b'S') => {
                    key_sort = key_sort.next();
                    continue 'refresh;
                }
                _ => {}
            }
        }
    }
    drop(raw);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pdfid: u16, host: Option<u8>, temp: Option<i32>) -> Row {
        Row {
            pdfid,
            vf: false,
            host,
            t: temp
                .map(|c| Sample {
                    pdfid,
                    temperature_centi: c,
                    ..Sample::default()
                })
                .ok_or_else(|| "none".to_string()),
        }
    }

    #[test]
    fn sorts_by_each_key() {
        let mut r = vec![
            row(3, Some(1), Some(5000)),
            row(1, None, None),
            row(2, Some(0), Some(7000)),
        ];
        sort(&mut r, SortKey::Temp);
        assert_eq!(r.iter().map(|r| r.pdfid).collect::<Vec<_>>(), [2, 3, 1]);
        sort(&mut r, SortKey::Host);
        assert_eq!(r.iter().map(|r| r.pdfid).collect::<Vec<_>>(), [2, 3, 1]);
        sort(&mut r, SortKey::Pdfid);
        assert_eq!(r.iter().map(|r| r.pdfid).collect::<Vec<_>>(), [1, 2, 3]);
        let mut k = SortKey::Pdfid;
        for _ in 0..6 {
            k = k.next();
        }
        assert_eq!(k, SortKey::Pdfid);
    }

    #[test]
    fn names_health_bits() {
        assert_eq!(health_text(0), "ok");
        assert_eq!(health_text(3), "link-down,thermal");
        assert_eq!(health_text(8), "0x8");
    }
}

// SPDX-License-Identifier: GPL-2.0-only

//! `pcifab top` (live telemetry of every function) and `pcifab stats --telemetry` (one
//! snapshot), read from the driver directly; `top` with a manager URL (`--manager`,
//! PCIFAB_MANAGER, /etc/pcifab/client.toml) shows the manager's samples of the pool's
//! functions instead, from any host.
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

use super::{
    emit, has_telemetry, inventory, no_telemetry, open, out::rfc3339, pdfid_str, telemetry_json,
    Cli, Error,
};

/// Opens the device for telemetry: fails naming the missing firmware feature when the
/// firmware lacks the telemetry extension (PAX firmware), rather than a row of firmware
/// errors per function.
fn open_for_telemetry(cli: &Cli) -> Result<File, Error> {
    let dev = open(&cli.device)?;
    if has_telemetry(&dev) == Some(false) {
        return Err(no_telemetry(&cli.device));
    }
    Ok(dev)
}

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

/// Where `top` reads: this host's driver, or the manager.
enum Source {
    Driver(File),
    Manager,
}

/// The rows of the pool's functions from the manager's telemetry and pool replies.
fn manager_rows(telemetry: &Value, pool: &Value) -> Vec<Row> {
    let hex = |v: &Value| -> Option<u16> {
        let s = v.as_str()?;
        u16::from_str_radix(s.strip_prefix("0x")?, 16).ok()
    };
    let mut samples = std::collections::BTreeMap::new();
    for s in telemetry["samples"].as_array().into_iter().flatten() {
        let Some(f) = s["pdfid"].as_u64().and_then(|f| u16::try_from(f).ok()) else {
            continue;
        };
        let t = match s.get("error") {
            Some(e) => Err(e.as_str().unwrap_or("failed").to_string()),
            None => serde_json::from_value::<ManagerSample>(s.clone())
                .map(|m| Sample {
                    pdfid: f,
                    temperature_centi: m.temperature_centi,
                    power_mw: m.power_mw,
                    utilisation: m.utilisation,
                    health: m.health,
                })
                .map_err(|e| format!("the manager's sample is malformed: {e}")),
        };
        samples.insert(f, t);
    }
    let mut rows = Vec::new();
    for d in pool["devices"].as_array().into_iter().flatten() {
        let pf = std::iter::once((&d["pf"], false));
        let vfs = d["vfs"].as_array().into_iter().flatten().map(|v| (v, true));
        for (f, vf) in pf.chain(vfs) {
            let Some(pdfid) = hex(f) else { continue };
            let host = pool["bound"][pdfid_str(pdfid)]
                .as_u64()
                .and_then(|h| u8::try_from(h).ok());
            let t = samples
                .remove(&pdfid)
                .unwrap_or_else(|| Err("no sample from the manager yet".into()));
            rows.push(Row { pdfid, vf, host, t });
        }
    }
    rows
}

/// A sample as the manager's telemetry reply gives it.
#[derive(serde::Deserialize)]
struct ManagerSample {
    temperature_centi: i32,
    power_mw: u32,
    utilisation: u8,
    health: u32,
}

/// What a refresh read: the rows and where from.
enum From {
    Generation(u32),
    Manager(String),
}

impl From {
    fn title(&self) -> String {
        match self {
            From::Generation(g) => format!("fabric generation {g}"),
            From::Manager(url) => format!("manager {url}"),
        }
    }

    /// The JSON object of one refresh (`top` or `manager-top`).
    fn emit(&self, rows: &[Row]) {
        match self {
            From::Generation(g) => emit("top", rows_json(*g, rows)),
            From::Manager(url) => {
                let mut v = rows_json(0, rows);
                if let Some(o) = v.as_object_mut() {
                    o.remove("generation");
                    o.insert("manager".into(), json!(url));
                }
                emit("manager-top", v);
            }
        }
    }
}

fn read(src: &Source, cli: &Cli) -> Result<(From, Vec<Row>), Error> {
    match src {
        Source::Driver(dev) => {
            let (g, rows) = rows(dev, cli)?;
            Ok((From::Generation(g), rows))
        }
        Source::Manager => match super::manager::telemetry_view(cli)? {
            Some((url, t, p)) => Ok((From::Manager(url), manager_rows(&t, &p))),
            None => Err(super::failure("the manager's URL went away".to_string())),
        },
    }
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
fn table(title: &str, rows: &[Row], key: SortKey, live: bool) -> Vec<String> {
    let mut out = vec![format!(
        "{}  {title}: {} functions, sorted by {}{}",
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
    let dev = open_for_telemetry(cli)?;
    let (generation, mut rows) = rows(&dev, cli)?;
    sort(&mut rows, SortKey::Pdfid);
    if cli.json {
        emit("stats-telemetry", rows_json(generation, &rows));
    } else {
        let title = format!("fabric generation {generation}");
        for l in table(&title, &rows, SortKey::Pdfid, false) {
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
    let src = if super::manager::has_url(cli)? {
        Source::Manager
    } else {
        Source::Driver(open_for_telemetry(cli)?)
    };
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
        let (from, mut rows) = read(&src, cli)?;
        let title = from.title();
        sort(&mut rows, key_sort);
        if cli.json {
            from.emit(&rows);
        } else if live {
            let mut frame = String::from("\x1b[H");
            for l in table(&title, &rows, key_sort, keys.is_some()) {
                frame.push_str(&l);
                frame.push_str("\x1b[K\r\n");
            }
            frame.push_str("\x1b[J");
            let _ = stdout.write_all(frame.as_bytes());
        } else {
            for l in table(&title, &rows, key_sort, false) {
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
    fn rows_from_the_manager() {
        let t = json!({"ok": true, "samples": [
            {"pdfid": 0x0400, "temperature_centi": 4512, "power_mw": 250000,
             "utilisation": 40, "health": 0},
            {"pdfid": 0x0401, "error": "MRPC timed out"},
        ]});
        let p = json!({"ok": true, "bound": {"0x0400": 1},
            "devices": [{"pf": "0x0400", "vfs": ["0x0401", "0x0402"]}]});
        let r = manager_rows(&t, &p);
        assert_eq!(
            r.iter().map(|r| r.pdfid).collect::<Vec<_>>(),
            [0x400, 0x401, 0x402]
        );
        assert_eq!(r[0].host, Some(1));
        assert_eq!(r[0].t.as_ref().map(|s| s.temperature_centi), Ok(4512));
        assert!(r[1].vf && r[1].host.is_none());
        assert_eq!(
            r[1].t.as_ref().err().map(String::as_str),
            Some("MRPC timed out")
        );
        assert!(r[2].t.is_err());
    }

    #[test]
    fn names_health_bits() {
        assert_eq!(health_text(0), "ok");
        assert_eq!(health_text(3), "link-down,thermal");
        assert_eq!(health_text(8), "0x8");
    }
}

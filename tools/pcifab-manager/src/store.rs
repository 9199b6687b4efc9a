// SPDX-License-Identifier: GPL-2.0-only

//! The manager's state on disk: one redb database (`STATE_DIR/manager.redb`).
//!
//! Table `state` holds the scheduler (pool, leases, queue, hosts, notices) as JSON under the key
//! `scheduler`; table `log` the request log, one JSON entry per request, keyed by a sequence
//! number. Every request commits the new state and its log entry in one write transaction
//! with immediate durability (redb's copy-on-write B-trees and fsync before the commit is
//! visible), so a crash at any point leaves either the state before or the state after it.

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::scheduler::Scheduler;

const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("state");
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const KEY: &str = "scheduler";
/// The state's format version, under this key of table `state` (absent: version 1).
const VERSION_KEY: &str = "version";

/// The format this manager writes. 1: the scheduler as it was before formats were
/// numbered; 2: requests carry their `owner` (the principal that asked).
pub const STATE_VERSION: u32 = 2;

/// Brings a stored scheduler of format `from` to [`STATE_VERSION`], one step at a time;
/// a format newer than this manager's is refused (nothing is written).
pub fn migrate(from: u32, mut v: serde_json::Value) -> Result<serde_json::Value, String> {
    if from > STATE_VERSION {
        return Err(format!(
            "it is state format {from}, written by a newer pcifab-manager (this one knows up \
             to {STATE_VERSION}); run that manager, or move the directory away to start afresh"
        ));
    }
    let mut at = from.max(1);
    while at < STATE_VERSION {
        v = match at {
            // Requests made before principals existed have no owner: only admins may
            // release them (the field's default), nothing to rewrite.
            1 => v,
            _ => unreachable!("every format below STATE_VERSION has a step"),
        };
        at += 1;
    }
    Ok(v)
}

/// One request as the daemon received and answered it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogEntry {
    pub at: u64,
    pub request: serde_json::Value,
    pub ok: bool,
    pub summary: String,
}

/// False when the kernel has no file locking at all (`flock` is ENOSYS).
fn file_locks_work(path: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(f) = std::fs::File::open(path) else {
        return true;
    };
    // SAFETY: flock on a descriptor we own; LOCK_UN of a lock not held changes nothing.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS)
}

/// The database file without any locks (for kernels without file locking): plain positioned
/// reads and writes, `fdatasync` for durability.
#[derive(Debug)]
struct UnlockedFile(std::fs::File);

impl redb::StorageBackend for UnlockedFile {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(self.0.metadata()?.len())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        std::os::unix::fs::FileExt::read_exact_at(&self.0, out, offset)
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.0.set_len(len)
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.0.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        std::os::unix::fs::FileExt::write_all_at(&self.0, data, offset)
    }
}

pub struct Store {
    db: Database,
    path: String,
}

fn err(path: &str, what: &str, e: impl std::fmt::Display) -> String {
    format!("state database {path}: {what}: {e}")
}

impl Store {
    /// Opens (creating if needed) the database in `dir`.
    pub fn open(dir: &Path) -> Result<Self, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create state directory {}: {e}", dir.display()))?;
        let path = dir.join("manager.redb");
        let p = path.display().to_string();
        let db = match Database::create(&path) {
            Ok(db) => db,
            // A kernel without file locking (CONFIG_FILE_LOCKING=n, like the test guests')
            // fails every lock, which redb cannot tell from a lock held by someone else.
            Err(redb::DatabaseError::DatabaseAlreadyOpen) if !file_locks_work(&path) => {
                eprintln!(
                    "pcifab-manager: this kernel has no file locks (CONFIG_FILE_LOCKING is \
                     off): opening {p} without redb's lock; make sure only one manager uses \
                     this --state directory"
                );
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&path)
                    .map_err(|e| err(&p, "cannot open", e))?;
                redb::Builder::new()
                    .create_with_backend(UnlockedFile(file))
                    .map_err(|e| err(&p, "cannot open", e))?
            }
            Err(e) => {
                return Err(err(
                    &p,
                    "cannot open",
                    format!("{e}; is another pcifab-manager using this --state directory?"),
                ))
            }
        };
        Ok(Self { db, path: p })
    }

    /// The stored scheduler, if any.
    pub fn load(&self) -> Result<Option<Scheduler>, String> {
        let tx = self
            .db
            .begin_read()
            .map_err(|e| err(&self.path, "read", e))?;
        let t = match tx.open_table(STATE) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(err(&self.path, "open table", e)),
        };
        let Some(v) = t.get(KEY).map_err(|e| err(&self.path, "read", e))? else {
            return Ok(None);
        };
        let version = match t.get(VERSION_KEY).map_err(|e| err(&self.path, "read", e))? {
            None => 1,
            Some(b) => std::str::from_utf8(b.value())
                .ok()
                .and_then(|t| t.trim().parse::<u32>().ok())
                .ok_or_else(|| {
                    err(
                        &self.path,
                        "stored state",
                        "its format version is not a number; move the directory away to \
                         start afresh",
                    )
                })?,
        };
        let raw: serde_json::Value = serde_json::from_slice(v.value()).map_err(|e| {
            err(
                &self.path,
                "stored state does not parse",
                format!("{e}; move the directory away to start afresh"),
            )
        })?;
        let migrated = migrate(version, raw).map_err(|e| err(&self.path, "stored state", e))?;
        if version < STATE_VERSION {
            eprintln!(
                "pcifab-manager: {}: state format {version} migrated to {STATE_VERSION} (written \
                 back at the next commit)",
                self.path
            );
        }
        let s: Scheduler = serde_json::from_value(migrated).map_err(|e| {
            err(
                &self.path,
                "stored state does not parse",
                format!("{e}; move the directory away to start afresh"),
            )
        })?;
        Ok(Some(s))
    }

    /// Commits the scheduler and, if given, one log entry, atomically and durably.
    pub fn save(&self, s: &Scheduler, entry: Option<&LogEntry>) -> Result<(), String> {
        let state = serde_json::to_vec(s).map_err(|e| err(&self.path, "encode", e))?;
        let tx = self
            .db
            .begin_write()
            .map_err(|e| err(&self.path, "write", e))?;
        {
            let mut t = tx
                .open_table(STATE)
                .map_err(|e| err(&self.path, "open table", e))?;
            t.insert(KEY, state.as_slice())
                .map_err(|e| err(&self.path, "write", e))?;
            t.insert(VERSION_KEY, STATE_VERSION.to_string().as_bytes())
                .map_err(|e| err(&self.path, "write", e))?;
            if let Some(entry) = entry {
                let mut log = tx
                    .open_table(LOG)
                    .map_err(|e| err(&self.path, "open log", e))?;
                let next = log
                    .last()
                    .map_err(|e| err(&self.path, "read log", e))?
                    .map(|(k, _)| k.value() + 1)
                    .unwrap_or(1);
                let e = serde_json::to_vec(entry).map_err(|e| err(&self.path, "encode", e))?;
                log.insert(next, e.as_slice())
                    .map_err(|e| err(&self.path, "write log", e))?;
                // Retention: at most log_max_entries, none older than log_max_age_s.
                let m = &s.config.manager;
                let keep_from = next.saturating_sub(m.log_max_entries.max(1)) + 1;
                let mut drop_to = keep_from.saturating_sub(1);
                if m.log_max_age_s > 0 {
                    let cutoff = entry.at.saturating_sub(m.log_max_age_s);
                    for r in log
                        .range(drop_to + 1..next)
                        .map_err(|e| err(&self.path, "read log", e))?
                    {
                        let (k, v) = r.map_err(|e| err(&self.path, "read log", e))?;
                        let at = serde_json::from_slice::<LogEntry>(v.value())
                            .map(|l| l.at)
                            .unwrap_or(0);
                        if at >= cutoff {
                            break;
                        }
                        drop_to = k.value();
                    }
                }
                if drop_to > 0 {
                    log.retain_in(..=drop_to, |_, _| false)
                        .map_err(|e| err(&self.path, "trim log", e))?;
                }
            }
        }
        tx.commit().map_err(|e| err(&self.path, "commit", e))
    }

    /// How many entries the log holds.
    pub fn log_len(&self) -> Result<u64, String> {
        let tx = self
            .db
            .begin_read()
            .map_err(|e| err(&self.path, "read", e))?;
        match tx.open_table(LOG) {
            Ok(t) => t.len().map_err(|e| err(&self.path, "read log", e)),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
            Err(e) => Err(err(&self.path, "open log", e)),
        }
    }

    /// The last `n` log entries, oldest first.
    pub fn log_tail(&self, n: u64) -> Result<Vec<LogEntry>, String> {
        let tx = self
            .db
            .begin_read()
            .map_err(|e| err(&self.path, "read", e))?;
        let t = match tx.open_table(LOG) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(err(&self.path, "open log", e)),
        };
        let last = t
            .last()
            .map_err(|e| err(&self.path, "read log", e))?
            .map(|(k, _)| k.value())
            .unwrap_or(0);
        let mut out = Vec::new();
        for r in t
            .range(last.saturating_sub(n) + 1..)
            .map_err(|e| err(&self.path, "read log", e))?
        {
            let (_, v) = r.map_err(|e| err(&self.path, "read log", e))?;
            out.push(
                serde_json::from_slice(v.value()).map_err(|e| err(&self.path, "log entry", e))?,
            );
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// The log keeps at most log_max_entries entries and none older than log_max_age_s.
    #[test]
    fn the_log_is_kept_within_its_retention() {
        let dir = std::env::temp_dir().join(format!("pcifab-store-log-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir).expect("store");
        let mut s = Scheduler::new(Config::default());
        s.config.manager.log_max_entries = 5;
        let entry = |at: u64| LogEntry {
            at,
            request: serde_json::json!({"op": "heartbeat", "host": at}),
            ok: true,
            summary: "ok".into(),
        };
        for at in 0..12 {
            store.save(&s, Some(&entry(at))).expect("save");
        }
        assert_eq!(store.log_len().expect("len"), 5);
        let ats: Vec<u64> = store
            .log_tail(100)
            .expect("tail")
            .iter()
            .map(|e| e.at)
            .collect();
        assert_eq!(ats, vec![7, 8, 9, 10, 11]);
        // By age: entries more than 3 s older than the newest go.
        s.config.manager.log_max_entries = 100;
        s.config.manager.log_max_age_s = 3;
        store.save(&s, Some(&entry(13))).expect("save");
        let ats: Vec<u64> = store
            .log_tail(100)
            .expect("tail")
            .iter()
            .map(|e| e.at)
            .collect();
        assert_eq!(ats, vec![10, 11, 13]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn round_trip() {
        let dir = std::env::temp_dir().join(format!("pcifab-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir).expect("open");
        assert!(store.load().expect("load").is_none());
        let mut s = Scheduler::new(Config::default());
        s.next_id = 42;
        for i in 0..3 {
            let e = LogEntry {
                at: i,
                request: serde_json::json!({"op": "x"}),
                ok: true,
                summary: format!("entry {i}"),
            };
            store.save(&s, Some(&e)).expect("save");
        }
        drop(store);
        let store = Store::open(&dir).expect("reopen");
        assert_eq!(store.load().expect("load"), Some(s));
        let tail = store.log_tail(2).expect("tail");
        assert_eq!(tail.len(), 2);
        assert_eq!(tail[1].summary, "entry 2");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A state of format 1 (no version key, no owners) loads and is written back as the
    /// current format; a newer format is refused and left alone.
    #[test]
    fn older_formats_migrate_newer_ones_are_refused() {
        let dir = std::env::temp_dir().join(format!("pcifab-store-v-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir).expect("open");
        let mut s = Scheduler::new(Config::default());
        s.next_id = 9;
        let mut v1 = serde_json::to_value(&s).expect("encode");
        v1.as_object_mut().expect("object").remove("version");
        let put = |version: Option<&str>, v: &serde_json::Value| {
            let tx = store.db.begin_write().expect("tx");
            {
                let mut t = tx.open_table(STATE).expect("table");
                t.insert(KEY, serde_json::to_vec(v).expect("json").as_slice())
                    .expect("insert");
                match version {
                    Some(n) => t.insert(VERSION_KEY, n.as_bytes()).map(|_| ()),
                    None => t.remove(VERSION_KEY).map(|_| ()),
                }
                .expect("version");
            }
            tx.commit().expect("commit");
        };
        put(None, &v1);
        assert_eq!(store.load().expect("format 1 loads"), Some(s.clone()));
        store.save(&s, None).expect("save");
        let tx = store.db.begin_read().expect("tx");
        let t = tx.open_table(STATE).expect("table");
        let stored = t.get(VERSION_KEY).expect("get").expect("version written");
        assert_eq!(stored.value(), STATE_VERSION.to_string().as_bytes());
        drop((stored, t, tx));
        put(Some("99"), &v1);
        let e = store.load().expect_err("format 99");
        assert!(e.contains("newer pcifab-manager"), "{e}");
        put(Some("two"), &v1);
        assert!(store.load().is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The lock-free file backend (kernels without file locking) keeps what was saved.
    #[test]
    fn unlocked_file_round_trip() {
        let dir = std::env::temp_dir().join(format!("pcifab-store-nolock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("manager.redb");
        let open = || {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .expect("file");
            Store {
                db: redb::Builder::new()
                    .create_with_backend(UnlockedFile(f))
                    .expect("database"),
                path: path.display().to_string(),
            }
        };
        let store = open();
        let mut s = Scheduler::new(Config::default());
        s.next_id = 7;
        store.save(&s, None).expect("save");
        drop(store);
        assert_eq!(open().load().expect("load"), Some(s));
        assert!(
            file_locks_work(&path),
            "the build machine's kernel has flock"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

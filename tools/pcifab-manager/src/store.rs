// SPDX-License-Identifier: GPL-2.0-only

//! The manager's state on disk: records in tables, and the request log.
//!
//! The store knows nothing of the scheduler: it keeps records (a table name, a key, the
//! value's bytes) and the log, behind [`StateStore`]. What the records are is the
//! scheduler's business (`scheduler::persist`); which records a request changed, too. A
//! store applies one [`Batch`] (and appends the request's log entry) atomically and durably,
//! so a crash at any point leaves either the state before the request or the state after.
//!
//! [`RedbStore`] (also named [`Store`]) is the one store today: `STATE_DIR/manager.redb`,
//! one redb table per record table, table `log` the request log (one JSON entry per
//! request, keyed by a sequence number), table `format` the records' format version. Every
//! commit is one write transaction with immediate durability (redb's copy-on-write B-trees
//! and fsync before the commit is visible). Formats 1 and 2 held the whole scheduler as one
//! JSON value (table `state`, key `scheduler`, format under key `version`), rewritten by
//! every request; [`StateStore::load`] hands that value up as [`Stored::whole`] and a batch
//! with [`Batch::drop_whole`] replaces it, in the commit that writes its records, with an
//! empty state marked as format 3, which managers of formats 1 and 2 refuse as newer.

use std::{collections::BTreeMap, path::Path};

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};

/// A table of records (e.g. `leases`).
pub type Table = &'static str;

/// Changes to records, applied all or nothing by [`StateStore::commit`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    /// (table, key, value) to write.
    pub puts: Vec<(Table, String, Vec<u8>)>,
    /// (table, key) to remove.
    pub deletes: Vec<(Table, String)>,
    /// The records' format version to write (none: unchanged).
    pub version: Option<u32>,
    /// Remove the whole-state value of formats 1 and 2 ([`Stored::whole`]).
    pub drop_whole: bool,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.puts.is_empty()
            && self.deletes.is_empty()
            && self.version.is_none()
            && !self.drop_whole
    }
}

/// What a store holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stored {
    /// The records' format version; none: no records were ever committed.
    pub version: Option<u32>,
    /// The records of the tables asked for: table -> key -> value.
    pub records: BTreeMap<Table, BTreeMap<String, Vec<u8>>>,
    /// The whole state of format 1 or 2, if the store holds one: (its format, its JSON).
    pub whole: Option<(u32, Vec<u8>)>,
}

/// What the store holds, in short (tests, diagnostics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Empty,
    /// The whole state as one value, of this format (1 or 2).
    Whole(u32),
    /// Records of this format (3 on).
    Records(u32),
}

/// How much of the request log to keep: at most `max_entries` entries, none older than
/// `max_age_s` seconds before the newest (0: no age limit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    pub max_entries: u64,
    pub max_age_s: u64,
}

/// One request as the daemon received and answered it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogEntry {
    pub at: u64,
    pub request: serde_json::Value,
    pub ok: bool,
    pub summary: String,
    /// The request's idempotency key and its principal, `KEY@PRINCIPAL` (see [`scoped_key`]);
    /// none for a request sent without one. Stored in the same commit as the request's
    /// changes, and kept as long as this entry is: a repeat of the key is answered
    /// [`LogEntry::reply`] instead of being carried out again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The reply as the manager gave it (a request with a key only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<serde_json::Value>,
}

/// The longest idempotency key a client may send.
pub const MAX_KEY_LEN: usize = 128;

/// Checks a client's idempotency key: 1 to [`MAX_KEY_LEN`] characters of `A-Z a-z 0-9 . _
/// : -` (a UUID fits).
pub fn check_key(key: &str) -> Result<(), String> {
    let ok = (1..=MAX_KEY_LEN).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "the idempotency key {key:?} is not 1 to {MAX_KEY_LEN} characters of A-Z a-z 0-9 \
             . _ : - (a UUID is one): send a valid key, or none"
        ))
    }
}

/// The key under which a principal's idempotency key is stored: `KEY@PRINCIPAL` (a key has
/// no `@`, so two principals' keys never meet).
pub fn scoped_key(key: &str, principal: &str) -> String {
    format!("{key}@{principal}")
}

/// Where the manager keeps its state. A second implementation (e.g. one on etcd, for a
/// manager with a standby) implements these four methods; nothing else in the manager
/// depends on redb.
pub trait StateStore: Send {
    /// Everything stored in `tables`, the records' format version and any whole state
    /// of an older format.
    fn load(&self, tables: &[Table]) -> Result<Stored, String>;

    /// Applies `batch` and appends `entry` (if any) to the log, trimmed to `retention`, in
    /// one atomic, durable step: after a crash, all of it is stored or none of it.
    fn commit(
        &self,
        batch: &Batch,
        entry: Option<&LogEntry>,
        retention: Retention,
    ) -> Result<(), String>;

    /// How many entries the log holds.
    fn log_len(&self) -> Result<u64, String>;

    /// The last `n` log entries, oldest first.
    fn log_tail(&self, n: u64) -> Result<Vec<LogEntry>, String>;

    /// The log entry that recorded the idempotency key `key` ([`LogEntry::key`]), while the
    /// log keeps it; none when no kept entry has it.
    fn recorded(&self, key: &str) -> Result<Option<LogEntry>, String>;
}

const FORMAT: TableDefinition<&str, &[u8]> = TableDefinition::new("format");
const FORMAT_KEY: &str = "version";
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
/// Idempotency keys ([`LogEntry::key`]) -> the number of the log entry that has them.
const KEYS: TableDefinition<&str, u64> = TableDefinition::new("keys");
/// Formats 1 and 2: the whole scheduler under `scheduler`, the format under `version`.
const WHOLE: TableDefinition<&str, &[u8]> = TableDefinition::new("state");
const WHOLE_KEY: &str = "scheduler";
const WHOLE_VERSION_KEY: &str = "version";
/// The first format stored as records. The whole value a migration replaces is left as an
/// empty state marked with it, so that a manager of formats 1 or 2 opening the file refuses
/// it as written by a newer pcifab-manager instead of finding no state and starting empty
/// (and then freeing every leased function).
const RECORDS_FIRST_FORMAT: u32 = 3;

/// One table's puts (key, value) and deletes (key) in a commit.
type TableChanges<'a> = (Vec<(&'a str, &'a [u8])>, Vec<&'a str>);

fn records(t: Table) -> TableDefinition<'static, &'static str, &'static [u8]> {
    TableDefinition::new(t)
}

/// Tables the records may not use: the store's own.
const RESERVED: [&str; 4] = ["format", "log", "state", "keys"];

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

/// The state in a redb database (`manager.redb`).
pub struct RedbStore {
    db: Database,
    path: String,
}

/// The store the manager uses today.
pub type Store = RedbStore;

fn err(path: &str, what: &str, e: impl std::fmt::Display) -> String {
    format!("state database {path}: {what}: {e}")
}

fn version_of(path: &str, b: &[u8]) -> Result<u32, String> {
    std::str::from_utf8(b)
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
        .ok_or_else(|| {
            err(
                path,
                "stored state",
                "its format version is not a number; move the directory away to start afresh",
            )
        })
}

impl RedbStore {
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

    /// What the database holds, in short.
    pub fn format(&self) -> Result<Format, String> {
        let tx = self
            .db
            .begin_read()
            .map_err(|e| err(&self.path, "read", e))?;
        if let Some(v) = self.read_version(&tx)? {
            return Ok(Format::Records(v));
        }
        Ok(match self.read_whole(&tx)? {
            Some((v, _)) => Format::Whole(v),
            None => Format::Empty,
        })
    }

    fn read_version(&self, tx: &redb::ReadTransaction) -> Result<Option<u32>, String> {
        let t = match tx.open_table(FORMAT) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(err(&self.path, "open table", e)),
        };
        let v = t.get(FORMAT_KEY).map_err(|e| err(&self.path, "read", e))?;
        v.map(|v| version_of(&self.path, v.value())).transpose()
    }

    fn read_whole(&self, tx: &redb::ReadTransaction) -> Result<Option<(u32, Vec<u8>)>, String> {
        let t = match tx.open_table(WHOLE) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(err(&self.path, "open table", e)),
        };
        let Some(v) = t.get(WHOLE_KEY).map_err(|e| err(&self.path, "read", e))? else {
            return Ok(None);
        };
        let version = match t
            .get(WHOLE_VERSION_KEY)
            .map_err(|e| err(&self.path, "read", e))?
        {
            None => 1,
            Some(b) => version_of(&self.path, b.value())?,
        };
        // The marker a migration leaves for older managers: no whole state.
        if version >= RECORDS_FIRST_FORMAT {
            return Ok(None);
        }
        Ok(Some((version, v.value().to_vec())))
    }
}

impl StateStore for RedbStore {
    fn load(&self, tables: &[Table]) -> Result<Stored, String> {
        let tx = self
            .db
            .begin_read()
            .map_err(|e| err(&self.path, "read", e))?;
        let mut out = Stored {
            version: self.read_version(&tx)?,
            whole: self.read_whole(&tx)?,
            ..Stored::default()
        };
        for &name in tables {
            if RESERVED.contains(&name) {
                return Err(err(
                    &self.path,
                    "table",
                    format!("'{name}' is the store's own"),
                ));
            }
            let t = match tx.open_table(records(name)) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => continue,
                Err(e) => return Err(err(&self.path, "open table", e)),
            };
            let m = out.records.entry(name).or_default();
            for r in t.iter().map_err(|e| err(&self.path, "read", e))? {
                let (k, v) = r.map_err(|e| err(&self.path, "read", e))?;
                m.insert(k.value().to_string(), v.value().to_vec());
            }
        }
        Ok(out)
    }

    fn commit(
        &self,
        batch: &Batch,
        entry: Option<&LogEntry>,
        retention: Retention,
    ) -> Result<(), String> {
        let tx = self
            .db
            .begin_write()
            .map_err(|e| err(&self.path, "write", e))?;
        {
            // One table open per table the batch touches.
            let mut by_table: BTreeMap<Table, TableChanges> = BTreeMap::new();
            for (t, k, v) in &batch.puts {
                by_table
                    .entry(*t)
                    .or_default()
                    .0
                    .push((k.as_str(), v.as_slice()));
            }
            for (t, k) in &batch.deletes {
                by_table.entry(*t).or_default().1.push(k.as_str());
            }
            for (name, (puts, deletes)) in by_table {
                if RESERVED.contains(&name) {
                    return Err(err(
                        &self.path,
                        "table",
                        format!("'{name}' is the store's own"),
                    ));
                }
                let mut t = tx
                    .open_table(records(name))
                    .map_err(|e| err(&self.path, "open table", e))?;
                for k in deletes {
                    t.remove(k).map_err(|e| err(&self.path, "write", e))?;
                }
                for (k, v) in puts {
                    t.insert(k, v).map_err(|e| err(&self.path, "write", e))?;
                }
            }
            if let Some(v) = batch.version {
                let mut t = tx
                    .open_table(FORMAT)
                    .map_err(|e| err(&self.path, "open table", e))?;
                t.insert(FORMAT_KEY, v.to_string().as_bytes())
                    .map_err(|e| err(&self.path, "write", e))?;
            }
            if batch.drop_whole {
                let mut t = tx
                    .open_table(WHOLE)
                    .map_err(|e| err(&self.path, "open table", e))?;
                t.insert(WHOLE_KEY, b"{}".as_slice())
                    .map_err(|e| err(&self.path, "replace the old state", e))?;
                t.insert(
                    WHOLE_VERSION_KEY,
                    RECORDS_FIRST_FORMAT.to_string().as_bytes(),
                )
                .map_err(|e| err(&self.path, "replace the old state", e))?;
            }
            if let Some(entry) = entry {
                let mut log = tx
                    .open_table(LOG)
                    .map_err(|e| err(&self.path, "open log", e))?;
                let next = match log.last().map_err(|e| err(&self.path, "read log", e))? {
                    None => 1,
                    Some((k, _)) => k.value().checked_add(1).ok_or_else(|| {
                        err(
                            &self.path,
                            "write log",
                            "the request log is at its last entry number; move the \
                             directory away (or migrate the state out and back) to number it \
                             afresh",
                        )
                    })?,
                };
                let e = serde_json::to_vec(entry).map_err(|e| err(&self.path, "encode", e))?;
                log.insert(next, e.as_slice())
                    .map_err(|e| err(&self.path, "write log", e))?;
                let mut keys = tx
                    .open_table(KEYS)
                    .map_err(|e| err(&self.path, "open keys", e))?;
                if let Some(k) = &entry.key {
                    keys.insert(k.as_str(), next)
                        .map_err(|e| err(&self.path, "write keys", e))?;
                }
                // Retention: at most max_entries, none older than max_age_s.
                let keep_from = next.saturating_sub(retention.max_entries.max(1)) + 1;
                let mut drop_to = keep_from.saturating_sub(1);
                if retention.max_age_s > 0 {
                    let cutoff = entry.at.saturating_sub(retention.max_age_s);
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
                    // The keys of the entries dropped go with them.
                    let mut gone = Vec::new();
                    for r in log
                        .range(..=drop_to)
                        .map_err(|e| err(&self.path, "read log", e))?
                    {
                        let (n, v) = r.map_err(|e| err(&self.path, "read log", e))?;
                        if let Ok(LogEntry { key: Some(k), .. }) = serde_json::from_slice(v.value())
                        {
                            gone.push((k, n.value()));
                        }
                    }
                    for (k, n) in gone {
                        let held = keys
                            .get(k.as_str())
                            .map_err(|e| err(&self.path, "read keys", e))?
                            .map(|v| v.value());
                        if held == Some(n) {
                            keys.remove(k.as_str())
                                .map_err(|e| err(&self.path, "trim keys", e))?;
                        }
                    }
                    log.retain_in(..=drop_to, |_, _| false)
                        .map_err(|e| err(&self.path, "trim log", e))?;
                }
            }
        }
        tx.commit().map_err(|e| err(&self.path, "commit", e))
    }

    fn log_len(&self) -> Result<u64, String> {
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

    fn log_tail(&self, n: u64) -> Result<Vec<LogEntry>, String> {
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

    fn recorded(&self, key: &str) -> Result<Option<LogEntry>, String> {
        self.recorded_entry(key)
    }
}

impl RedbStore {
    fn recorded_entry(&self, key: &str) -> Result<Option<LogEntry>, String> {
        let tx = self
            .db
            .begin_read()
            .map_err(|e| err(&self.path, "read", e))?;
        let keys = match tx.open_table(KEYS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(err(&self.path, "open keys", e)),
        };
        let Some(n) = keys
            .get(key)
            .map_err(|e| err(&self.path, "read keys", e))?
            .map(|v| v.value())
        else {
            return Ok(None);
        };
        let log = tx
            .open_table(LOG)
            .map_err(|e| err(&self.path, "open log", e))?;
        let Some(v) = log.get(n).map_err(|e| err(&self.path, "read log", e))? else {
            return Ok(None);
        };
        serde_json::from_slice(v.value())
            .map(Some)
            .map_err(|e| err(&self.path, "log entry", e))
    }
}

impl<S: StateStore + ?Sized> StateStore for Box<S> {
    fn load(&self, tables: &[Table]) -> Result<Stored, String> {
        (**self).load(tables)
    }

    fn commit(
        &self,
        batch: &Batch,
        entry: Option<&LogEntry>,
        retention: Retention,
    ) -> Result<(), String> {
        (**self).commit(batch, entry, retention)
    }

    fn log_len(&self) -> Result<u64, String> {
        (**self).log_len()
    }

    fn log_tail(&self, n: u64) -> Result<Vec<LogEntry>, String> {
        (**self).log_tail(n)
    }

    fn recorded(&self, key: &str) -> Result<Option<LogEntry>, String> {
        (**self).recorded(key)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The checks of idempotency keys every store must pass: a key is stored with its entry
    /// in one commit (none by a commit that fails), found under its principal only, and
    /// gone once the log no longer keeps its entry.
    pub(crate) fn keys_are_kept_with_their_log_entries(s: &dyn StateStore) {
        let three = Retention {
            max_entries: 3,
            max_age_s: 0,
        };
        let entry = |n: u64, key: Option<&str>| LogEntry {
            at: 1000 + n,
            request: serde_json::json!({"op": "heartbeat", "host": n}),
            ok: true,
            summary: "ok".into(),
            key: key.map(|k| scoped_key(k, "ops")),
            reply: key.map(|_| serde_json::json!({"ok": true, "n": n})),
        };
        let batch = Batch {
            puts: vec![("leases", "1".into(), b"{}".to_vec())],
            version: Some(3),
            ..Batch::default()
        };
        s.commit(&batch, Some(&entry(1, Some("k1"))), three)
            .expect("commit");
        let got = s.recorded(&scoped_key("k1", "ops")).expect("recorded");
        assert_eq!(got, Some(entry(1, Some("k1"))));
        assert_eq!(
            s.load(&["leases"]).expect("load").records["leases"]["1"],
            b"{}".to_vec(),
            "the key and the records are one commit"
        );
        assert_eq!(s.recorded(&scoped_key("k1", "other")).expect("other"), None);
        // A commit that fails stores no key.
        let bad = Batch {
            puts: vec![("log", "x".into(), b"{}".to_vec())],
            ..Batch::default()
        };
        assert!(s.commit(&bad, Some(&entry(2, Some("k2"))), three).is_err());
        assert_eq!(s.recorded(&scoped_key("k2", "ops")).expect("k2"), None);
        s.commit(&Batch::default(), Some(&entry(2, Some("k2"))), three)
            .expect("commit");
        s.commit(&Batch::default(), Some(&entry(3, None)), three)
            .expect("commit");
        assert!(s.recorded(&scoped_key("k1", "ops")).expect("k1").is_some());
        // The fourth entry pushes the first out of the log, and its key with it.
        s.commit(&Batch::default(), Some(&entry(4, Some("k4"))), three)
            .expect("commit");
        assert_eq!(s.recorded(&scoped_key("k1", "ops")).expect("k1"), None);
        assert_eq!(
            s.recorded(&scoped_key("k2", "ops")).expect("k2"),
            Some(entry(2, Some("k2")))
        );
        assert_eq!(
            s.recorded(&scoped_key("k4", "ops")).expect("k4"),
            Some(entry(4, Some("k4")))
        );
        assert_eq!(s.log_len().expect("len"), 3);
        // The key may be used again once it expired.
        s.commit(&Batch::default(), Some(&entry(5, Some("k1"))), three)
            .expect("commit");
        assert_eq!(
            s.recorded(&scoped_key("k1", "ops")).expect("k1"),
            Some(entry(5, Some("k1")))
        );
        s.commit(&Batch::default(), Some(&entry(6, None)), three)
            .expect("commit");
        assert_eq!(s.recorded(&scoped_key("k2", "ops")).expect("k2"), None);
    }

    #[test]
    fn idempotency_keys_are_kept_with_their_log_entries() {
        let dir = tempdir("keys");
        let store = Store::open(&dir).expect("store");
        keys_are_kept_with_their_log_entries(&store);
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempdir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("pcifab-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    const KEEP: Retention = Retention {
        max_entries: 1000,
        max_age_s: 0,
    };

    fn put(t: Table, k: &str, v: &str) -> (Table, String, Vec<u8>) {
        (t, k.to_string(), v.as_bytes().to_vec())
    }

    /// The log keeps at most max_entries entries and none older than max_age_s.
    #[test]
    fn the_log_is_kept_within_its_retention() {
        let dir = tempdir("log");
        let store = Store::open(&dir).expect("store");
        let entry = |at: u64| LogEntry {
            at,
            request: serde_json::json!({"op": "heartbeat", "host": at}),
            ok: true,
            summary: "ok".into(),
            key: None,
            reply: None,
        };
        let five = Retention {
            max_entries: 5,
            max_age_s: 0,
        };
        for at in 0..12 {
            store
                .commit(&Batch::default(), Some(&entry(at)), five)
                .expect("commit");
        }
        assert_eq!(store.log_len().expect("len"), 5);
        let ats = |s: &Store| -> Vec<u64> {
            s.log_tail(100)
                .expect("tail")
                .iter()
                .map(|e| e.at)
                .collect()
        };
        assert_eq!(ats(&store), vec![7, 8, 9, 10, 11]);
        // By age: entries more than 3 s older than the newest go.
        let young = Retention {
            max_entries: 100,
            max_age_s: 3,
        };
        store
            .commit(&Batch::default(), Some(&entry(13)), young)
            .expect("commit");
        assert_eq!(ats(&store), vec![10, 11, 13]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A log whose last entry has the last number a u64 holds: the next commit with an
    /// entry fails with the reason, and stores nothing.
    #[test]
    fn a_log_at_its_last_number_refuses_the_next_entry() {
        let dir = tempdir("log-end");
        let store = Store::open(&dir).expect("store");
        let tx = store.db.begin_write().expect("tx");
        tx.open_table(LOG)
            .expect("log")
            .insert(
                u64::MAX,
                br#"{"at":0,"request":null,"ok":true,"summary":"ok"}"#.as_slice(),
            )
            .expect("insert");
        tx.commit().expect("commit");
        let entry = LogEntry {
            at: 1,
            request: serde_json::json!({"op": "queue"}),
            ok: true,
            summary: "ok".into(),
            key: None,
            reply: None,
        };
        let b = Batch {
            puts: vec![put("a", "k", "v")],
            ..Batch::default()
        };
        let e = store
            .commit(&b, Some(&entry), KEEP)
            .expect_err("no number left");
        assert!(e.contains("last entry number"), "{e}");
        assert_eq!(store.log_len().expect("len"), 1);
        assert_eq!(store.load(&["a"]).expect("load"), Stored::default());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Records written, overwritten and removed read back so after a reopen, with the
    /// format version; tables not asked for are not read.
    #[test]
    fn records_round_trip() {
        let dir = tempdir("records");
        let store = Store::open(&dir).expect("open");
        assert_eq!(store.format().expect("format"), Format::Empty);
        assert_eq!(store.load(&["a"]).expect("load"), Stored::default());
        let b = Batch {
            puts: vec![
                put("a", "1", "one"),
                put("a", "2", "two"),
                put("b", "x", "ex"),
            ],
            version: Some(3),
            ..Batch::default()
        };
        store.commit(&b, None, KEEP).expect("commit");
        let b = Batch {
            puts: vec![put("a", "2", "deux")],
            deletes: vec![("a", "1".into()), ("b", "absent".into())],
            ..Batch::default()
        };
        store.commit(&b, None, KEEP).expect("commit");
        drop(store);
        let store = Store::open(&dir).expect("reopen");
        let s = store.load(&["a", "c"]).expect("load");
        assert_eq!(s.version, Some(3));
        assert_eq!(s.whole, None);
        assert_eq!(
            s.records,
            BTreeMap::from([("a", BTreeMap::from([("2".to_string(), b"deux".to_vec())]))])
        );
        assert_eq!(store.format().expect("format"), Format::Records(3));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A batch that fails part-way stores none of it: the records before the failure are
    /// not committed either.
    #[test]
    fn a_failed_commit_stores_nothing() {
        let dir = tempdir("atomic");
        let store = Store::open(&dir).expect("open");
        let b = Batch {
            puts: vec![put("leases", "1", "x"), put("log", "1", "the store's own")],
            version: Some(3),
            ..Batch::default()
        };
        let e = store.commit(&b, None, KEEP).expect_err("a reserved table");
        assert!(e.contains("the store's own"), "{e}");
        assert_eq!(store.load(&["leases"]).expect("load"), Stored::default());
        assert_eq!(store.format().expect("format"), Format::Empty);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The whole state of formats 1 (no version key) and 2 is handed up with its format;
    /// a version that is not a number is an error; `drop_whole` replaces it in the commit
    /// that writes the records with the marker an older manager refuses.
    #[test]
    fn whole_states_of_old_formats_are_handed_up_then_dropped() {
        let dir = tempdir("whole");
        let store = Store::open(&dir).expect("open");
        let write = |version: Option<&str>| {
            let tx = store.db.begin_write().expect("tx");
            {
                let mut t = tx.open_table(WHOLE).expect("table");
                t.insert(WHOLE_KEY, br#"{"next_id": 9}"#.as_slice())
                    .expect("insert");
                match version {
                    Some(n) => t.insert(WHOLE_VERSION_KEY, n.as_bytes()).map(|_| ()),
                    None => t.remove(WHOLE_VERSION_KEY).map(|_| ()),
                }
                .expect("version");
            }
            tx.commit().expect("commit");
        };
        write(None);
        let s = store.load(&[]).expect("load");
        assert_eq!(s.whole, Some((1, br#"{"next_id": 9}"#.to_vec())));
        assert_eq!(s.version, None);
        write(Some("two"));
        assert!(store.load(&[]).is_err());
        write(Some("2"));
        assert_eq!(store.format().expect("format"), Format::Whole(2));
        let b = Batch {
            puts: vec![put("manager", "counters", "{}")],
            version: Some(3),
            drop_whole: true,
            ..Batch::default()
        };
        store.commit(&b, None, KEEP).expect("commit");
        let s = store.load(&["manager"]).expect("load");
        assert_eq!((s.version, s.whole), (Some(3), None));
        assert_eq!(store.format().expect("format"), Format::Records(3));
        // What a manager of format 2 reads there: an empty state of format 3, which it
        // refuses as written by a newer manager, rather than no state at all.
        let tx = store.db.begin_read().expect("tx");
        let t = tx.open_table(WHOLE).expect("the old table is still there");
        let got = |k| t.get(k).expect("get").map(|v| v.value().to_vec());
        assert_eq!(got(WHOLE_KEY), Some(b"{}".to_vec()));
        assert_eq!(got(WHOLE_VERSION_KEY), Some(b"3".to_vec()));
        drop(t);
        drop(tx);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The lock-free file backend (kernels without file locking) keeps what was saved.
    #[test]
    fn unlocked_file_round_trip() {
        let dir = tempdir("nolock");
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
        let b = Batch {
            puts: vec![put("a", "k", "v")],
            version: Some(3),
            ..Batch::default()
        };
        store.commit(&b, None, KEEP).expect("commit");
        drop(store);
        let s = open().load(&["a"]).expect("load");
        assert_eq!(s.records["a"]["k"], b"v".to_vec());
        assert!(
            file_locks_work(&path),
            "the build machine's kernel has flock"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

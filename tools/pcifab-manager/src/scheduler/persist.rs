// SPDX-License-Identifier: GPL-2.0-only

//! The scheduler's state as the store's records (format 3), and what a commit changes.
//!
//! Every part of the state that changes on its own is its own record, so a request writes
//! what it changed and nothing else (Documentation/manager.rst, "The store"):
//!
//! ============ ============================= ==========================================
//! table        key                           value (JSON)
//! ============ ============================= ==========================================
//! `manager`    `config`                      the pools and rules ([`Config`])
//! `manager`    `counters`                    next request id, next notice, grants
//! `manager`    `queue`                       the queue's order: request ids
//! `requests`   request id                    a queued request ([`Queued`])
//! `leases`     lease id                      a lease ([`Lease`])
//! `devices`    index in the pools            a device: holders, VF leases, health, scrub
//! `bindings`   PDFID                         the host the function is bound to
//! `hosts`      host                          failover state ([`HostState`])
//! `notices`    sequence number               a notice ([`Notice`])
//! `usage`      tenant                        its use for the fair share ([`Usage`])
//! ============ ============================= ==========================================
//!
//! [`Image`] is what the store holds, as values: [`Image::diff`] compares it with the
//! scheduler (the notices by their sequence numbers, the rest record by record, without
//! encoding anything unchanged) and gives the [`Batch`] to commit; [`Image::accept`] takes
//! the changes in once the commit succeeded.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{Device, Host, HostState, Lease, Notice, Pdfid, Queued, Scheduler, Usage};
use crate::config::Config;
use crate::store::{Batch, StateStore, Table};

/// The records' format. 1 and 2 were the whole scheduler as one value (2: requests carry
/// their `owner`); 3: the records above.
pub const FORMAT: u32 = 3;

/// The last format that stored the whole scheduler as one value.
const WHOLE_LAST: u32 = 2;

const MANAGER: Table = "manager";
const REQUESTS: Table = "requests";
const LEASES: Table = "leases";
const DEVICES: Table = "devices";
const BINDINGS: Table = "bindings";
const HOSTS: Table = "hosts";
const NOTICES: Table = "notices";
const USAGE: Table = "usage";

/// Every table of the records.
pub const TABLES: &[Table] = &[
    MANAGER, REQUESTS, LEASES, DEVICES, BINDINGS, HOSTS, NOTICES, USAGE,
];

const CONFIG_KEY: &str = "config";
const COUNTERS_KEY: &str = "counters";
const QUEUE_KEY: &str = "queue";

/// The scheduler's fields this module stores; `every_stored_field_has_a_record` checks
/// that they are all the scheduler serialises.
#[cfg(test)]
const FIELDS: &[&str] = &[
    "config",
    "devices",
    "holders",
    "leases",
    "queue",
    "hosts",
    "notices",
    "next_id",
    "next_notice",
    "grants",
    "usage",
];

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Counters {
    next_id: u64,
    next_notice: u64,
    grants: u64,
}

impl Counters {
    fn of(s: &Scheduler) -> Self {
        Self {
            next_id: s.next_id,
            next_notice: s.next_notice,
            grants: s.grants,
        }
    }
}

/// Brings a whole stored scheduler of format `from` (1 or 2) to the last whole format, one
/// step at a time; a format newer than this manager's is refused (nothing is written).
pub fn migrate(from: u32, mut v: Value) -> Result<Value, String> {
    if from > FORMAT {
        return Err(newer(from));
    }
    let mut at = from.max(1);
    while at < WHOLE_LAST {
        v = match at {
            // Requests made before principals existed have no owner: only admins may
            // release them (the field's default), nothing to rewrite.
            1 => v,
            _ => unreachable!("every whole format below WHOLE_LAST has a step"),
        };
        at += 1;
    }
    Ok(v)
}

fn newer(v: u32) -> String {
    format!(
        "it is state format {v}, written by a newer pcifab-manager (this one knows up to \
         {FORMAT}); run that manager, or move the directory away to start afresh"
    )
}

fn stored(what: &str, e: impl std::fmt::Display) -> String {
    format!(
        "stored state: {what}: {e}; move the state directory away to start afresh (the \
         fabric is left as it is)"
    )
}

/// Loads the scheduler the store holds (none if it holds none) and the image of what it
/// holds. A whole state of format 1 or 2 is migrated: its image is empty, so the first
/// commit writes every record and removes the whole value, in one transaction.
pub fn load(store: &dyn StateStore) -> Result<Option<(Scheduler, Image)>, String> {
    let st = store.load(TABLES)?;
    match (st.version, st.whole) {
        (Some(v), _) if v > FORMAT => Err(newer(v)),
        (Some(v), whole) => {
            let s = assemble(&st.records)?;
            let mut image = Image::of(&s);
            image.version = Some(v);
            image.whole = whole.is_some();
            Ok(Some((s, image)))
        }
        (None, Some((v, bytes))) => {
            let raw: Value = serde_json::from_slice(&bytes).map_err(|e| stored("JSON", e))?;
            let migrated = migrate(v, raw)?;
            let s: Scheduler =
                serde_json::from_value(migrated).map_err(|e| stored("does not parse", e))?;
            let image = Image {
                whole: true,
                ..Image::default()
            };
            Ok(Some((s, image)))
        }
        (None, None) if st.records.values().any(|t| !t.is_empty()) => Err(stored(
            "records without a format version",
            "an interrupted or foreign write",
        )),
        (None, None) => Ok(None),
    }
}

/// The scheduler of the records: assembled into the scheduler's own JSON, so what it
/// reads (defaults included) is what its serialisation says.
fn assemble(records: &BTreeMap<Table, BTreeMap<String, Vec<u8>>>) -> Result<Scheduler, String> {
    let empty = BTreeMap::new();
    let table = |t: Table| records.get(t).unwrap_or(&empty);
    let json = |t: Table, k: &str, v: &[u8]| -> Result<Value, String> {
        serde_json::from_slice(v).map_err(|e| stored(&format!("{t}/{k}"), e))
    };
    let num = |t: Table, k: &str| -> Result<u64, String> {
        k.parse()
            .map_err(|e| stored(&format!("{t}/{k}: the key is not a number"), e))
    };
    let manager = table(MANAGER);
    let one = |k: &str| -> Result<Value, String> {
        let v = manager
            .get(k)
            .ok_or_else(|| stored(&format!("{MANAGER}/{k}"), "missing"))?;
        json(MANAGER, k, v)
    };
    let counters: Counters =
        serde_json::from_value(one(COUNTERS_KEY)?).map_err(|e| stored(COUNTERS_KEY, e))?;
    let order: Vec<u64> =
        serde_json::from_value(one(QUEUE_KEY)?).map_err(|e| stored(QUEUE_KEY, e))?;
    let mut requests = BTreeMap::new();
    for (k, v) in table(REQUESTS) {
        requests.insert(num(REQUESTS, k)?, json(REQUESTS, k, v)?);
    }
    let mut queue = Vec::new();
    for id in &order {
        queue.push(
            requests.remove(id).ok_or_else(|| {
                stored(QUEUE_KEY, format!("request {id} is queued but not stored"))
            })?,
        );
    }
    if let Some(id) = requests.keys().next() {
        return Err(stored(
            REQUESTS,
            format!("request {id} is stored but not queued"),
        ));
    }
    let mut devices = BTreeMap::new();
    for (k, v) in table(DEVICES) {
        devices.insert(num(DEVICES, k)?, json(DEVICES, k, v)?);
    }
    if devices.keys().copied().ne(0..devices.len() as u64) {
        return Err(stored(DEVICES, "the device numbers have gaps"));
    }
    let mut notices = BTreeMap::new();
    for (k, v) in table(NOTICES) {
        notices.insert(num(NOTICES, k)?, json(NOTICES, k, v)?);
    }
    let object = |t: Table| -> Result<Value, String> {
        let mut m = Map::new();
        for (k, v) in table(t) {
            m.insert(k.clone(), json(t, k, v)?);
        }
        Ok(Value::Object(m))
    };
    let mut s = Map::new();
    s.insert("config".into(), one(CONFIG_KEY)?);
    s.insert("devices".into(), devices.into_values().collect());
    s.insert("holders".into(), object(BINDINGS)?);
    s.insert("leases".into(), object(LEASES)?);
    s.insert("queue".into(), queue.into());
    s.insert("hosts".into(), object(HOSTS)?);
    s.insert("notices".into(), notices.into_values().collect());
    s.insert("next_id".into(), counters.next_id.into());
    s.insert("next_notice".into(), counters.next_notice.into());
    s.insert("grants".into(), counters.grants.into());
    s.insert("usage".into(), object(USAGE)?);
    serde_json::from_value(Value::Object(s)).map_err(|e| stored("does not parse", e))
}

/// What the store holds, as values.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Image {
    version: Option<u32>,
    /// The store still holds a whole state of format 1 or 2.
    whole: bool,
    config: Option<Config>,
    counters: Option<Counters>,
    order: Option<Vec<u64>>,
    requests: BTreeMap<u64, Queued>,
    leases: BTreeMap<u64, Lease>,
    devices: BTreeMap<u64, Device>,
    bindings: BTreeMap<Pdfid, Host>,
    hosts: BTreeMap<Host, HostState>,
    notices: BTreeMap<u64, Notice>,
    usage: BTreeMap<String, Usage>,
}

/// The changes of one commit: the batch for the store, and the same as values for the
/// image.
#[derive(Debug, Default)]
pub struct Delta {
    pub batch: Batch,
    config: Option<Config>,
    counters: Option<Counters>,
    order: Option<Vec<u64>>,
    requests: Vec<(u64, Option<Queued>)>,
    leases: Vec<(u64, Option<Lease>)>,
    devices: Vec<(u64, Option<Device>)>,
    bindings: Vec<(Pdfid, Option<Host>)>,
    hosts: Vec<(Host, Option<HostState>)>,
    notices: Vec<(u64, Option<Notice>)>,
    usage: Vec<(String, Option<Usage>)>,
}

impl Delta {
    /// Nothing to commit.
    pub fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }
}

fn encode(v: &impl Serialize) -> Result<Vec<u8>, String> {
    serde_json::to_vec(v).map_err(|e| format!("cannot encode the state: {e}"))
}

/// The changes from `stored` to `now` (both ascending by key): puts for new and changed
/// values, deletes for keys gone.
fn diff_map<'a, K, V>(
    table: Table,
    stored: &BTreeMap<K, V>,
    now: impl Iterator<Item = (K, &'a V)>,
    batch: &mut Batch,
) -> Result<Vec<(K, Option<V>)>, String>
where
    K: Ord + Clone + ToString,
    V: PartialEq + Clone + Serialize + 'a,
{
    let mut out = Vec::new();
    let mut old = stored.iter().peekable();
    for (k, v) in now {
        while let Some((ok, _)) = old.next_if(|(ok, _)| **ok < k) {
            batch.deletes.push((table, ok.to_string()));
            out.push((ok.clone(), None));
        }
        match old.next_if(|(ok, _)| **ok == k) {
            Some((_, ov)) if ov == v => {}
            _ => {
                batch.puts.push((table, k.to_string(), encode(v)?));
                out.push((k, Some(v.clone())));
            }
        }
    }
    for (ok, _) in old {
        batch.deletes.push((table, ok.to_string()));
        out.push((ok.clone(), None));
    }
    Ok(out)
}

fn apply<K: Ord, V>(map: &mut BTreeMap<K, V>, changes: Vec<(K, Option<V>)>) {
    for (k, v) in changes {
        match v {
            Some(v) => map.insert(k, v),
            None => map.remove(&k),
        };
    }
}

impl Image {
    /// The store holds a whole state of format 1 or 2, which the next commit replaces with
    /// records.
    pub fn migrating(&self) -> bool {
        self.whole
    }

    /// The image of a store that holds exactly `s`.
    pub fn of(s: &Scheduler) -> Self {
        Self {
            version: Some(FORMAT),
            whole: false,
            config: Some(s.config.clone()),
            counters: Some(Counters::of(s)),
            order: Some(s.queue.iter().map(|q| q.id).collect()),
            requests: s.queue.iter().map(|q| (q.id, q.clone())).collect(),
            leases: s.leases.clone(),
            devices: (0u64..).zip(s.devices.iter().cloned()).collect(),
            bindings: s.holders.clone(),
            hosts: s.hosts.clone(),
            notices: s.notices.iter().map(|n| (n.seq, n.clone())).collect(),
            usage: s.usage.clone(),
        }
    }

    /// What to commit so that the store holds `s`.
    pub fn diff(&self, s: &Scheduler) -> Result<Delta, String> {
        let mut d = Delta::default();
        let b = &mut d.batch;
        if self.version != Some(FORMAT) {
            b.version = Some(FORMAT);
        }
        b.drop_whole = self.whole;
        if self.config.as_ref() != Some(&s.config) {
            b.puts
                .push((MANAGER, CONFIG_KEY.into(), encode(&s.config)?));
            d.config = Some(s.config.clone());
        }
        let counters = Counters::of(s);
        if self.counters.as_ref() != Some(&counters) {
            b.puts
                .push((MANAGER, COUNTERS_KEY.into(), encode(&counters)?));
            d.counters = Some(counters);
        }
        let order_same = self
            .order
            .as_ref()
            .is_some_and(|o| o.iter().copied().eq(s.queue.iter().map(|q| q.id)));
        if !order_same {
            let order: Vec<u64> = s.queue.iter().map(|q| q.id).collect();
            b.puts.push((MANAGER, QUEUE_KEY.into(), encode(&order)?));
            d.order = Some(order);
        }
        let queued: BTreeMap<u64, &Queued> = s.queue.iter().map(|q| (q.id, q)).collect();
        d.requests = diff_map(REQUESTS, &self.requests, queued.into_iter(), b)?;
        d.leases = diff_map(
            LEASES,
            &self.leases,
            s.leases.iter().map(|(k, v)| (*k, v)),
            b,
        )?;
        d.devices = diff_map(DEVICES, &self.devices, (0u64..).zip(s.devices.iter()), b)?;
        d.bindings = diff_map(
            BINDINGS,
            &self.bindings,
            s.holders.iter().map(|(k, v)| (*k, v)),
            b,
        )?;
        d.hosts = diff_map(HOSTS, &self.hosts, s.hosts.iter().map(|(k, v)| (*k, v)), b)?;
        d.usage = diff_map(
            USAGE,
            &self.usage,
            s.usage.iter().map(|(k, v)| (k.clone(), v)),
            b,
        )?;
        // Notices are only added at the back and dropped at the front: look at the new
        // ones and the dropped ones, not at the thousands in between.
        match (s.notices.front(), s.notices.back()) {
            (Some(first), Some(last)) => {
                for n in s.notices.iter().rev() {
                    if self.notices.get(&n.seq) == Some(n) {
                        break;
                    }
                    b.puts.push((NOTICES, n.seq.to_string(), encode(n)?));
                    d.notices.push((n.seq, Some(n.clone())));
                }
                let gone = self
                    .notices
                    .range(..first.seq)
                    .chain(self.notices.range(last.seq.saturating_add(1)..))
                    .filter(|(k, _)| **k < first.seq || **k > last.seq);
                for (k, _) in gone {
                    b.deletes.push((NOTICES, k.to_string()));
                    d.notices.push((*k, None));
                }
            }
            _ => {
                for k in self.notices.keys() {
                    b.deletes.push((NOTICES, k.to_string()));
                    d.notices.push((*k, None));
                }
            }
        }
        Ok(d)
    }

    /// Takes in the changes of a commit that succeeded.
    pub fn accept(&mut self, d: Delta) {
        if let Some(v) = d.batch.version {
            self.version = Some(v);
        }
        if d.batch.drop_whole {
            self.whole = false;
        }
        if d.config.is_some() {
            self.config = d.config;
        }
        if d.counters.is_some() {
            self.counters = d.counters;
        }
        if d.order.is_some() {
            self.order = d.order;
        }
        apply(&mut self.requests, d.requests);
        apply(&mut self.leases, d.leases);
        apply(&mut self.devices, d.devices);
        apply(&mut self.bindings, d.bindings);
        apply(&mut self.hosts, d.hosts);
        apply(&mut self.notices, d.notices);
        apply(&mut self.usage, d.usage);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::{RequestSpec, Want};
    use crate::store::{Retention, Store};

    const KEEP: Retention = Retention {
        max_entries: 100,
        max_age_s: 0,
    };

    fn tempdir(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("pcifab-persist-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// Two GPUs with two VFs each, three hosts, whole and VF requests.
    fn busy() -> Scheduler {
        let c = Config::parse(
            r#"
[manager]
hosts = 3
[[pools]]
name = "gpus"
mode = "hybrid"
[[pools.devices]]
pf = 0x0120
vfs = [0x0121, 0x0122]
[[pools.devices]]
pf = 0x0140
vfs = [0x0141, 0x0142]
"#,
        )
        .expect("config");
        Scheduler::new(c)
    }

    fn spec(host: Host, want: Want, priority: u32) -> RequestSpec {
        RequestSpec {
            host,
            want,
            priority,
            duration_s: Some(100),
            preemptible_by_higher: true,
            migratable: true,
            pool: None,
            tenant: None,
            owner: None,
            tag: None,
        }
    }

    /// Commits `s` as the daemon does: the image's diff, then the image takes it in.
    fn commit(store: &Store, image: &mut Image, s: &Scheduler) -> Batch {
        let d = image.diff(s).expect("diff");
        store.commit(&d.batch, None, KEEP).expect("commit");
        let b = d.batch.clone();
        image.accept(d);
        b
    }

    /// The scheduler as stored (its statistics, e.g. `passes`, are not).
    fn json(s: &Scheduler) -> Value {
        serde_json::to_value(s).expect("encode")
    }

    fn keys(b: &Batch) -> Vec<String> {
        b.puts
            .iter()
            .map(|(t, k, _)| format!("{t}/{k}"))
            .chain(b.deletes.iter().map(|(t, k)| format!("-{t}/{k}")))
            .collect()
    }

    /// The scheduler after each step reads back equal from the records, and each commit
    /// writes only the records the step changed: a grant its lease, devices, bindings,
    /// counters and notice; a release no other lease; nothing changed nothing.
    #[test]
    fn commits_write_what_changed_and_read_back_equal() {
        let dir = tempdir("diff");
        let store = Store::open(&dir).expect("store");
        assert!(load(&store).expect("load").is_none());
        let mut s = busy();
        let mut image = Image::default();
        let first = commit(&store, &mut image, &s);
        assert_eq!(first.version, Some(FORMAT));
        assert!(keys(&first).contains(&"manager/config".to_string()));
        let a = s
            .submit(spec(0, Want::Gpus { count: 1 }, 1), 10)
            .expect("grant");
        let b = s
            .submit(
                spec(
                    1,
                    Want::Vfs {
                        count: 1,
                        profile: None,
                    },
                    1,
                ),
                10,
            )
            .expect("grant");
        commit(&store, &mut image, &s);
        let q = s
            .submit(spec(2, Want::Gpus { count: 2 }, 1), 11)
            .expect("queued");
        assert!(!q.granted);
        let k = keys(&commit(&store, &mut image, &s));
        assert!(k.contains(&format!("requests/{}", q.id)), "{k:?}");
        assert!(k.contains(&"manager/queue".to_string()), "{k:?}");
        assert!(!k.iter().any(|k| k.starts_with("leases/")), "{k:?}");
        assert!(!k.contains(&"manager/config".to_string()), "{k:?}");
        let (loaded, loaded_image) = load(&store).expect("load").expect("stored");
        assert_eq!(json(&loaded), json(&s));
        assert_eq!(loaded_image, image);
        // Nothing changed: nothing to write.
        assert!(image.diff(&s).expect("diff").is_empty());
        // A release: its lease goes, the other lease is not written.
        s.release(a.id, 12).expect("release");
        let k = keys(&commit(&store, &mut image, &s));
        assert!(k.contains(&format!("-leases/{}", a.id)), "{k:?}");
        assert!(!k.contains(&format!("leases/{}", b.id)), "{k:?}");
        assert!(k.iter().any(|k| k.starts_with("notices/")), "{k:?}");
        assert_eq!(
            json(&load(&store).expect("load").expect("stored").0),
            json(&s)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// With the notices' ring full, a commit writes the new notice and removes the oldest
    /// one: two notice records, whatever the ring holds.
    #[test]
    fn a_full_notice_ring_costs_two_records_per_notice() {
        let dir = tempdir("ring");
        let store = Store::open(&dir).expect("store");
        let mut s = busy();
        let mut image = Image::default();
        for i in 0..(super::super::MAX_NOTICES as u64 / 2 + 10) {
            let g = s
                .submit(spec(0, Want::Gpus { count: 1 }, 1), i)
                .expect("grant");
            s.release(g.id, i).expect("release");
        }
        commit(&store, &mut image, &s);
        assert_eq!(s.notices.len(), super::super::MAX_NOTICES);
        let g = s
            .submit(spec(1, Want::Gpus { count: 1 }, 1), 5000)
            .expect("grant");
        let b = commit(&store, &mut image, &s);
        let notices: Vec<String> = keys(&b)
            .into_iter()
            .filter(|k| k.contains("notices/"))
            .collect();
        assert_eq!(notices.len(), 2, "{notices:?}");
        assert!(b.puts.len() + b.deletes.len() < 12, "{:?}", keys(&b));
        let (loaded, _) = load(&store).expect("load").expect("stored");
        assert_eq!(json(&loaded), json(&s));
        assert!(loaded.leases.contains_key(&g.id));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Every field the scheduler serialises is one this module stores.
    #[test]
    fn every_stored_field_has_a_record() {
        let v = serde_json::to_value(busy()).expect("encode");
        let fields: Vec<&str> = v
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        let mut want = FIELDS.to_vec();
        want.sort_unstable();
        let mut got = fields.clone();
        got.sort_unstable();
        assert_eq!(
            got, want,
            "a new field of Scheduler needs a record (persist.rs)"
        );
    }

    /// Records of a newer format are refused, and so is a queue whose order and requests
    /// disagree.
    #[test]
    fn newer_formats_and_broken_records_are_refused() {
        let dir = tempdir("refuse");
        let store = Store::open(&dir).expect("store");
        let mut s = busy();
        s.submit(spec(0, Want::Gpus { count: 2 }, 1), 1)
            .expect("grant");
        s.submit(spec(1, Want::Gpus { count: 1 }, 1), 1)
            .expect("queued");
        let mut image = Image::default();
        commit(&store, &mut image, &s);
        let put = |t: Table, k: &str, v: &str| Batch {
            puts: vec![(t, k.into(), v.as_bytes().to_vec())],
            ..Batch::default()
        };
        store
            .commit(&put(MANAGER, QUEUE_KEY, "[]"), None, KEEP)
            .expect("commit");
        let e = load(&store).expect_err("a request not queued");
        assert!(e.contains("stored but not queued"), "{e}");
        let newer = Batch {
            version: Some(FORMAT + 1),
            ..Batch::default()
        };
        store.commit(&newer, None, KEEP).expect("commit");
        let e = load(&store).expect_err("newer");
        assert!(e.contains("newer pcifab-manager"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

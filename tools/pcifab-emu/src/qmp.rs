// SPDX-License-Identifier: GPL-2.0-only
//! A QMP client per host: `device_add` / `device_del` on the host's QEMU and
//! the `DEVICE_DELETED` events that follow.
//!
//! The connection is made lazily (and again after it broke) with capability
//! negotiation; a reader thread routes replies (by `id`) and events.

use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a QMP command may take to be answered.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting and negotiating may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, PartialEq)]
pub enum QmpError {
    /// QEMU refused; the text says why.
    Failed(String),
    /// QEMU could not be reached (nothing listens on the socket, or the connection broke
    /// before the reply): its process is probably gone.
    Unreachable(String),
    /// No answer or event in time.
    Timeout,
}

impl std::fmt::Display for QmpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QmpError::Failed(e) | QmpError::Unreachable(e) => write!(f, "{e}"),
            QmpError::Timeout => write!(f, "timed out"),
        }
    }
}

#[derive(Default)]
struct State {
    writer: Option<UnixStream>,
    /// Bumped on every new connection, so a dying reader thread only
    /// tears down its own.
    conn_gen: u64,
    next_id: u64,
    replies: HashMap<u64, Result<Value, String>>,
    /// Device ids QEMU reported DEVICE_DELETED for (not yet consumed).
    deleted: HashSet<String>,
}

pub struct Qmp {
    pub host: String,
    pub path: PathBuf,
    st: Mutex<State>,
    cv: Condvar,
}

impl Qmp {
    pub fn new(host: &str, path: PathBuf) -> Arc<Qmp> {
        Arc::new(Qmp {
            host: host.to_owned(),
            path,
            st: Mutex::new(State::default()),
            cv: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Connect, read the greeting, negotiate capabilities, start the reader.
    fn connect(self: &Arc<Self>, st: &mut State) -> Result<(), String> {
        let what = format!("QMP of {} at {}", self.host, self.path.display());
        let sock = UnixStream::connect(&self.path).map_err(|e| format!("{what}: {e}"))?;
        sock.set_read_timeout(Some(CONNECT_TIMEOUT))
            .and_then(|()| sock.set_write_timeout(Some(CONNECT_TIMEOUT)))
            .map_err(|e| format!("{what}: {e}"))?;
        let mut reader = BufReader::new(sock.try_clone().map_err(|e| format!("{what}: {e}"))?);
        let mut line = String::new();
        reader
            .read_line(&mut line)
            .map_err(|e| format!("{what}: no greeting: {e}"))?;
        let greeting: Value =
            serde_json::from_str(&line).map_err(|e| format!("{what}: bad greeting: {e}"))?;
        if greeting.get("QMP").is_none() {
            return Err(format!("{what}: not a QMP greeting: {}", line.trim()));
        }
        (&sock)
            .write_all(b"{\"execute\":\"qmp_capabilities\"}\n")
            .map_err(|e| format!("{what}: {e}"))?;
        loop {
            line.clear();
            let n = reader
                .read_line(&mut line)
                .map_err(|e| format!("{what}: capability negotiation: {e}"))?;
            if n == 0 {
                return Err(format!("{what}: closed during capability negotiation"));
            }
            let v: Value = serde_json::from_str(&line)
                .map_err(|e| format!("{what}: bad reply {}: {e}", line.trim()))?;
            if v.get("return").is_some() {
                break;
            }
            if let Some(e) = v.get("error") {
                return Err(format!("{what}: qmp_capabilities refused: {e}"));
            }
            Self::note_event(st, &v);
        }
        reader
            .get_ref()
            .set_read_timeout(None)
            .map_err(|e| format!("{what}: {e}"))?;
        st.conn_gen += 1;
        st.writer = Some(sock);
        let me = Arc::clone(self);
        let gen = st.conn_gen;
        std::thread::Builder::new()
            .name(format!("qmp-{}", self.host))
            .spawn(move || me.reader(reader, gen))
            .map_err(|e| format!("cannot start thread: {e}"))?;
        info!("{}: QMP connected ({})", self.host, self.path.display());
        Ok(())
    }

    fn note_event(st: &mut State, v: &Value) {
        if v.get("event").and_then(Value::as_str) == Some("DEVICE_DELETED") {
            if let Some(id) = v.pointer("/data/device").and_then(Value::as_str) {
                st.deleted.insert(id.to_owned());
            }
        }
    }

    fn reader(&self, mut reader: BufReader<UnixStream>, gen: u64) {
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                error!(
                    "{}: QMP sent something that is not JSON: {}",
                    self.host,
                    line.trim()
                );
                continue;
            };
            let mut st = self.lock();
            if v.get("event").is_some() {
                debug!("{}: QMP event {}", self.host, line.trim());
                Self::note_event(&mut st, &v);
            } else if let Some(id) = v.get("id").and_then(Value::as_u64) {
                let r = match v.get("error") {
                    Some(e) => Err(format!(
                        "{}: {}",
                        e.get("class").and_then(Value::as_str).unwrap_or("Error"),
                        e.get("desc").and_then(Value::as_str).unwrap_or("?")
                    )),
                    None => Ok(v.get("return").cloned().unwrap_or(Value::Null)),
                };
                st.replies.insert(id, r);
            }
            self.cv.notify_all();
        }
        let mut st = self.lock();
        if st.conn_gen == gen {
            st.writer = None;
            info!("{}: QMP connection closed", self.host);
        }
        self.cv.notify_all();
    }

    /// Run one command and wait for its reply.
    pub fn execute(self: &Arc<Self>, cmd: &str, args: Value) -> Result<Value, QmpError> {
        let mut st = self.lock();
        if st.writer.is_none() {
            self.connect(&mut st).map_err(QmpError::Unreachable)?;
        }
        st.next_id += 1;
        let id = st.next_id;
        let gen = st.conn_gen;
        let msg = json!({"execute": cmd, "arguments": args, "id": id}).to_string() + "\n";
        let sent = match st.writer.as_ref() {
            Some(mut w) => w.write_all(msg.as_bytes()).map_err(|e| e.to_string()),
            None => Err("not connected".to_owned()),
        };
        if let Err(e) = sent {
            st.writer = None;
            return Err(QmpError::Unreachable(format!("QMP of {}: {e}", self.host)));
        }
        let deadline = Instant::now() + REPLY_TIMEOUT;
        loop {
            if let Some(r) = st.replies.remove(&id) {
                return r.map_err(QmpError::Failed);
            }
            if st.conn_gen != gen || st.writer.is_none() {
                return Err(QmpError::Unreachable(format!(
                    "QMP of {}: connection lost before the reply",
                    self.host
                )));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(QmpError::Timeout);
            }
            st = match self.cv.wait_timeout(st, left) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
    }

    /// Forget an earlier DEVICE_DELETED of `id` (a new device of that id
    /// was added).
    pub fn forget_deleted(&self, id: &str) {
        self.lock().deleted.remove(id);
    }

    /// `device_del` of `id`, then wait for its DEVICE_DELETED. A device QEMU
    /// does not know (any more) counts as deleted.
    pub fn device_del_wait(self: &Arc<Self>, id: &str, timeout: Duration) -> Result<(), QmpError> {
        let deadline = Instant::now() + timeout;
        if self.lock().deleted.remove(id) {
            return Ok(());
        }
        // QEMU refuses a device_del while the slot is still settling from a hot-plug
        // (its power indicator blinks until the guest has powered the slot on); the
        // request is retried until the deadline rather than failed at once.
        loop {
            match self.execute("device_del", json!({ "id": id })) {
                Ok(_) => break,
                Err(QmpError::Failed(e)) if e.starts_with("DeviceNotFound") => {
                    self.forget_deleted(id);
                    return Ok(());
                }
                Err(QmpError::Failed(e)) if e.contains("already in the process of unplug") => break,
                Err(QmpError::Failed(e)) if e.contains("busy") && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                    if self.lock().deleted.remove(id) {
                        return Ok(());
                    }
                }
                Err(e) => return Err(e),
            }
        }
        self.wait_deleted(id, deadline)
    }

    /// Wait until QEMU reported `id` deleted (or did already), at most
    /// until `deadline`.
    pub fn wait_deleted(&self, id: &str, deadline: Instant) -> Result<(), QmpError> {
        let mut st = self.lock();
        loop {
            if st.deleted.remove(id) {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(QmpError::Timeout);
            }
            st = match self.cv.wait_timeout(st, left) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
    }
}

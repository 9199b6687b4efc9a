// SPDX-License-Identifier: GPL-2.0-only
//! Minimal QMP client: greeting, `qmp_capabilities`, `execute`.
//! Asynchronous events are collected in [`Qmp::events`] and otherwise skipped.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::thread::sleep;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::conn::Conn;

pub struct Qmp {
    conn: Conn,
    pub events: Vec<Value>,
    timeout: Duration,
}

impl Qmp {
    /// Connects (retrying until `timeout`, QEMU creates the socket at start)
    /// and negotiates capabilities.
    pub fn connect(path: &Path, qemu_pid: Option<u32>, timeout: Duration) -> Result<Self, String> {
        let start = Instant::now();
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if start.elapsed() >= timeout => {
                    return Err(format!(
                        "cannot connect to QMP socket {}: {e}",
                        path.display()
                    ))
                }
                Err(_) => sleep(Duration::from_millis(50)),
            }
        };
        let what = format!("QMP {}", path.display());
        let mut q = Qmp {
            conn: Conn::new(stream, qemu_pid, &what)?,
            events: Vec::new(),
            timeout,
        };
        let deadline = Instant::now() + timeout;
        let greeting = q.read_msg(deadline)?;
        if greeting.get("QMP").is_none() {
            return Err(format!("{what}: expected a QMP greeting, got {greeting}"));
        }
        q.execute("qmp_capabilities", None)?;
        Ok(q)
    }

    fn read_msg(&mut self, deadline: Instant) -> Result<Value, String> {
        let line = self.conn.read_line(deadline)?;
        serde_json::from_slice(&line).map_err(|e| {
            format!(
                "QMP: invalid JSON {:?}: {e}",
                String::from_utf8_lossy(&line)
            )
        })
    }

    /// Runs `cmd` and returns its `return` value, or the QMP error as text.
    pub fn execute(&mut self, cmd: &str, args: Option<Value>) -> Result<Value, String> {
        let mut req = json!({ "execute": cmd });
        if let Some(a) = args {
            req["arguments"] = a;
        }
        let mut line = req.to_string().into_bytes();
        line.push(b'\n');
        self.conn.send(&line)?;
        let deadline = Instant::now() + self.timeout;
        loop {
            let msg = self.read_msg(deadline)?;
            if let Some(r) = msg.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = msg.get("error") {
                return Err(format!(
                    "QMP {cmd} failed: {}: {}",
                    e.get("class").and_then(Value::as_str).unwrap_or("?"),
                    e.get("desc").and_then(Value::as_str).unwrap_or("?")
                ));
            }
            if msg.get("event").is_some() {
                self.events.push(msg);
            }
        }
    }
}

impl Qmp {
    /// Waits until `deadline` for event `name` whose `data` satisfies `matches` (events that
    /// arrived during earlier commands count); returns it.
    pub fn wait_event(
        &mut self,
        name: &str,
        matches: impl Fn(&Value) -> bool,
        deadline: Instant,
    ) -> Result<Value, String> {
        let hit = |e: &Value| {
            e.get("event").and_then(Value::as_str) == Some(name)
                && matches(e.get("data").unwrap_or(&Value::Null))
        };
        if let Some(i) = self.events.iter().position(hit) {
            return Ok(self.events.remove(i));
        }
        loop {
            let msg = self
                .read_msg(deadline)
                .map_err(|e| format!("waiting for QMP event {name}: {e}"))?;
            if hit(&msg) {
                return Ok(msg);
            }
            if msg.get("event").is_some() {
                self.events.push(msg);
            }
        }
    }
}

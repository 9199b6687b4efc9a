// SPDX-License-Identifier: GPL-2.0-only
//! The fabric manager daemon (`pcifab-manager --executor driver`) in h0, as the manager
//! scenarios run it: started with a configuration, asked over its socket, stopped, its log
//! for failure messages, and a run of a scenario's body between its start and its stop.

use std::time::Duration;

use serde_json::Value;

use crate::checks::world::emu_owners;
use crate::fabric::{Fabric, Host};

/// Where the daemon keeps its database in h0 (emptied at the start of every scenario).
pub const STATE_DIR: &str = "/tmp/pcifab-manager";
pub const CONFIG: &str = "/tmp/pcifab-manager.toml";
/// The daemon's stderr (appended to; shown in failure messages).
pub const LOG: &str = "/tmp/pcifab-manager.log";
pub const PIDFILE: &str = "/tmp/pcifab-manager.pid";
/// The daemon's default control socket, which the CLI uses by default too.
pub const SOCKET: &str = "/run/pcifab-manager.sock";

/// Starts the daemon in h0 with `config` (a fresh state directory unless `keep_state`) and
/// waits until it answers `pcifab queue`.
pub fn start_manager(h0: &mut Host, config: Option<&str>, keep_state: bool) -> Result<(), String> {
    let mut script = String::new();
    if !keep_state {
        script.push_str(&format!("rm -rf {STATE_DIR}; : > {LOG}\n"));
    }
    if let Some(c) = config {
        script.push_str(&format!("cat > {CONFIG} <<'EOF'\n{c}EOF\n"));
    }
    script.push_str(&format!(
        "setsid pcifab-manager --config {CONFIG} --state {STATE_DIR} --socket {SOCKET} \
         --executor driver \
         </dev/null >>{LOG} 2>&1 &\n\
         echo $! > {PIDFILE}\n\
         i=0\n\
         until pcifab queue >/dev/null 2>&1; do\n\
           kill -0 $(cat {PIDFILE}) 2>/dev/null || {{ echo 'pcifab-manager exited:'; tail -20 {LOG}; exit 1; }}\n\
           [ $i -ge 300 ] && {{ echo 'pcifab-manager did not answer within 60 s:'; tail -20 {LOG}; exit 1; }}\n\
           sleep 0.2; i=$((i+1))\n\
         done\n\
         echo started pid $(cat {PIDFILE})"
    ));
    h0.run_ok_timeout(&script, Duration::from_secs(90))
        .map(|_| ())
        .map_err(|e| format!("starting pcifab-manager in h0: {e}"))
}

/// Stops the daemon (`signal` TERM or KILL) and waits until it is gone.
pub fn stop_manager(h0: &mut Host, signal: &str) -> Result<(), String> {
    h0.run_ok(&format!(
        "[ -f {PIDFILE} ] || exit 0\n\
         p=$(cat {PIDFILE}); kill -{signal} $p 2>/dev/null\n\
         i=0; while kill -0 $p 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done\n\
         if kill -0 $p 2>/dev/null; then echo \"pcifab-manager (pid $p) still running after SIG{signal}\"; exit 1; fi\n\
         rm -f {PIDFILE}"
    ))
    .map(|_| ())
}

/// The last `lines` lines of the daemon's log, for failure messages.
pub fn manager_log(h0: &mut Host, lines: usize) -> String {
    h0.run(&format!("tail -{lines} {LOG}"))
        .map(|o| o.out)
        .unwrap_or_default()
}

/// One request to the daemon's socket with `pcifab-manager --ask` (ops the CLI has no
/// command for: pool, events, state).
pub fn ask(h0: &mut Host, request: &str) -> Result<Value, String> {
    let o = h0.run(&format!("pcifab-manager --ask '{request}'"))?;
    let v: Value = serde_json::from_str(o.out.trim()).map_err(|e| {
        format!(
            "h0: `pcifab-manager --ask {request}`: expected one JSON line, got {:?} ({e})",
            o.out.trim()
        )
    })?;
    if o.code != 0 || v.get("ok") != Some(&Value::Bool(true)) {
        return Err(format!(
            "h0: `pcifab-manager --ask {request}`: expected exit 0 and ok, got exit {}: {v}",
            o.code
        ));
    }
    Ok(v)
}

/// Starts the daemon in h0 with `cfg` (logged first) and runs `body`; afterwards, whatever
/// happened, stops the daemon (SIGTERM) and frees every function through the emulator. The
/// body's error comes first, with the last `log_lines` lines of the daemon's log, then the
/// stop's, then the freeing's (`cleaning up (FREEING): ...`).
pub fn run_with_manager<T>(
    f: &mut Fabric,
    cfg: &str,
    log_lines: usize,
    freeing: &str,
    body: impl FnOnce(&mut Fabric) -> Result<T, String>,
) -> Result<T, String> {
    f.hosts[0].log_note(&format!("manager configuration:\n{cfg}"));
    start_manager(&mut f.hosts[0], Some(cfg), false)?;
    let r = body(f).map_err(|e| {
        format!(
            "{e}\nmanager log (h0 {LOG}):\n{}",
            manager_log(&mut f.hosts[0], log_lines)
        )
    });
    let stop = stop_manager(&mut f.hosts[0], "TERM");
    let emu = f.emu();
    let mut free = Ok(());
    if let Ok((o, _)) = emu_owners(&emu, &f.expected) {
        for p in o.keys() {
            if let Err(e) = emu.request(&format!("unbind {p:#06x}")) {
                free = Err(format!("cleaning up ({freeing}): {e}"));
            }
        }
    }
    let r = r?;
    stop?;
    free?;
    Ok(r)
}

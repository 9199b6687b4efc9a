// SPDX-License-Identifier: GPL-2.0-only
//! Checks of the harness and the agent themselves (`pcifab-harness selftest`): exit codes
//! and output, binary-safe large output, timeouts that kill the process group, and a
//! stopped guest fenced off. They need no driver; the last one leaves host 0 unusable on
//! purpose.

use std::time::Duration;

use crate::checks::Checks;
use crate::fabric::Fabric;

pub fn st_exit_codes(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, _| {
        let o = h.run("echo out; echo err >&2; exit 3")?;
        let mut c = Checks::new(&h.name);
        c.eq("exit code", 3, o.code);
        c.eq("output", "out\nerr\n", o.out.as_str());
        c.finish()
    })
}

pub fn st_binary(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, _| {
        let o = h.run("head -c 3000000 /dev/zero; printf '\\001\\377\\n'")?;
        let raw = &o.raw;
        let mut c = Checks::new(&h.name);
        c.eq("exit code", 0, o.code);
        c.eq("output length", 3_000_003, raw.len());
        c.eq(
            "NUL bytes",
            3_000_000,
            raw.iter().filter(|&&b| b == 0).count(),
        );
        c.eq(
            "last bytes",
            &b"\x01\xff\n"[..],
            &raw[raw.len().saturating_sub(3)..],
        );
        c.finish()
    })
}

pub fn st_timeout(f: &mut Fabric) -> Result<(), String> {
    f.each_host(|h, _| {
        let t = std::time::Instant::now();
        let o = h.run_timeout("sleep 100 & sleep 101", Duration::from_secs(1))?;
        let secs = t.elapsed().as_secs_f64();
        let mut c = Checks::new(&h.name);
        c.eq("exit code of a timed-out command", -1, o.code);
        c.eq("returned within 5 s", true, secs < 5.0);
        let left = h.run("ps | grep -c '[s]leep 10[01]'")?;
        c.eq("sleeps left behind", "0", left.out.trim());
        c.finish()
    })
}

pub fn st_hung_guest(f: &mut Fabric) -> Result<(), String> {
    let h = &mut f.hosts[0];
    let mut q = h.qmp()?;
    q.execute("stop", None)?;
    let r = h.run_timeout("true", Duration::from_secs(1));
    q.execute("cont", None)?;
    match r {
        Ok(o) => return Err(format!("expected an error from a stopped guest, got {o:?}")),
        Err(e) if e.contains("timed out") => {}
        Err(e) => return Err(format!("expected a timeout error, got {e:?}")),
    }
    match h.run("true") {
        Err(e) if e.contains("not usable") => Ok(()),
        other => Err(format!(
            "expected later commands to be refused with \"not usable\", got {other:?}"
        )),
    }
}

// SPDX-License-Identifier: GPL-2.0-only
//! Slurm jobs get fabric GPUs on demand (Documentation/slurm.rst): Debian's slurmctld and
//! the pcifab manager run in h0, munged and slurmd in h1 (`--slurm` puts them into the
//! guests). The site configuration under `packaging/slurm/` is installed as it is; its
//! PrologSlurmctld binds the job's GPUs through the manager before the job starts, its
//! EpilogSlurmctld gives them back. Everything is checked from outside: the job's output
//! (written in h1), the manager's leases, Slurm's view of the node, the emulator's bindings.

use std::time::Duration;

use serde_json::Value;

use crate::checks::{
    check_world, compose_begin, json_line, owners, run_with_manager, start_manager, stop_manager,
    Checks, Owners, LOG,
};
use crate::fabric::{Fabric, Host};
use crate::scenarios::manager::durable_state;

/// The site configuration the scenario installs (packaging/slurm/).
const SLURM_CONF_PCIFAB: &str = include_str!("../../../../packaging/slurm/slurm.conf");
const GRES_CONF: &str = include_str!("../../../../packaging/slurm/gres.conf");
const HOOK_CONF: &str = include_str!("../../../../packaging/slurm/pcifab-slurm.conf");
const PROLOG: &str = include_str!("../../../../packaging/slurm/prolog-slurmctld");
const EPILOG: &str = include_str!("../../../../packaging/slurm/epilog-slurmctld");
const TASK_PROLOG: &str = include_str!("../../../../packaging/slurm/task-prolog");

/// The test world's part of slurm.conf: one controller (h0), daemons and jobs as root, no
/// cgroups (the test kernels have none: cgroup.conf says `CgroupPlugin=disabled`) and no
/// accounting database. `cred_expire=10`: a requeued job may start again 11 s after its
/// requeue instead of Slurm's default 121 s. `config_overrides`: h1 is declared with two
/// CPUs (two 1-GPU jobs at once) although its guest has one. `SlurmdTimeout=20`: a killed
/// node is marked down within about 20 s instead of 300.
const SLURM_CONF_BASE: &str = "ClusterName=pcifab\n\
SlurmctldHost=h0\n\
SlurmUser=root\n\
AuthType=auth/munge\n\
CredType=cred/munge\n\
StateSaveLocation=/var/spool/slurmctld\n\
SlurmdSpoolDir=/var/spool/slurmd\n\
SlurmctldPidFile=/run/slurmctld.pid\n\
SlurmdPidFile=/run/slurmd.pid\n\
SlurmctldLogFile=/var/log/slurm/slurmctld.log\n\
SlurmdLogFile=/var/log/slurm/slurmd.log\n\
ProctrackType=proctrack/linuxproc\n\
TaskPlugin=task/none\n\
JobAcctGatherType=jobacct_gather/none\n\
AccountingStorageType=accounting_storage/none\n\
MpiDefault=none\n\
ReturnToService=2\n\
AuthInfo=cred_expire=10\n\
SlurmdParameters=config_overrides\n\
SlurmdTimeout=20\n\
Include /etc/slurm/pcifab.conf\n";

/// Local user `nobody`: the manager's principal `alice`, who is not Slurm.
const NOBODY: u32 = 65534;

/// The MUNGE key both hosts share (any 32 bytes or more).
const MUNGE_KEY: &str = "pcifab-test-world-munge-key-0123456789abcdef";

/// Job output in h1, and the file that lets the job end.
const JOB_OUT: &str = "/tmp/slurm-job.out";
const JOB_GO: &str = "/tmp/slurm-job-go";

/// The job: prints what it was given and what it sees, then waits to be let go.
const JOB_SCRIPT: &str = r#"#!/bin/sh
echo "LEASE ${PCIFAB_LEASE:-none}"
echo "FUNCTIONS ${PCIFAB_FUNCTIONS:-none}"
echo "SLURM_JOB_GPUS ${SLURM_JOB_GPUS:-none}"
for d in /sys/bus/pci/devices/*; do
  [ "$(cat $d/vendor)" = 0x10de ] || continue
  echo "DEV ${d##*/} $(cat $d/vendor) $(cat $d/device)"
  pcifab-selftest bar-id --device ${d##*/} 2>&1
done
echo READY
i=0
until [ -e /tmp/slurm-job-go ]; do
  [ $i -lt 1500 ] || { echo "not let go within 300 s"; exit 1; }
  sleep 0.2; i=$((i+1))
done
echo DONE
"#;

/// The PF of the configuration's endpoint `name`.
fn pdfid(f: &Fabric, name: &str) -> Result<u16, String> {
    f.expected
        .endpoint(name)
        .map(|e| e.pdfid(0))
        .ok_or_else(|| format!("the fabric configuration has no endpoint {name}"))
}

/// `cat > PATH` of `text` (a newline added if it has none at its end), mode `mode`, as a
/// shell step.
fn put(path: &str, mode: &str, text: &str) -> String {
    let nl = if text.ends_with('\n') { "" } else { "\n" };
    format!("cat > {path} <<'PCIFAB_EOF'\n{text}{nl}PCIFAB_EOF\nchmod {mode} {path}\n")
}

/// Configuration, MUNGE key and directories of every Slurm host; then munged, checked
/// with a credential round trip.
fn install(h: &mut Host, hosts: &str, pcifab_conf: &str) -> Result<(), String> {
    let mut s = String::from(
        "set -e\n\
         mkdir -p /etc/slurm/pcifab /etc/munge /var/lib/munge /var/log/munge /run/munge \
           /var/spool/slurmd /var/spool/slurmctld /var/log/slurm /root\n\
         rm -rf /var/spool/slurmd/* /var/spool/slurmctld/* /var/log/slurm/*\n\
         chmod 700 /etc/munge /var/lib/munge /var/log/munge; chmod 755 /run/munge\n\
         for k in 0 1; do [ -e /dev/pcifab-slot$k ] || mknod -m 666 /dev/pcifab-slot$k c 1 3; done\n",
    );
    s += &put(
        "/etc/passwd",
        "644",
        &format!("root:x:0:0:root:/root:/bin/sh\nnobody:x:{NOBODY}:{NOBODY}:nobody:/:/bin/sh\n"),
    );
    s += &put(
        "/etc/group",
        "644",
        &format!("root:x:0:\nnogroup:x:{NOBODY}:\n"),
    );
    s += &put("/etc/hosts", "644", hosts);
    s += &put("/etc/munge/munge.key", "400", MUNGE_KEY);
    s += &put("/etc/slurm/slurm.conf", "644", SLURM_CONF_BASE);
    s += &put("/etc/slurm/pcifab.conf", "644", pcifab_conf);
    s += &put("/etc/slurm/gres.conf", "644", GRES_CONF);
    // The test kernels have no cgroups; slurmd refuses to start unless told not to use them.
    s += &put("/etc/slurm/cgroup.conf", "644", "CgroupPlugin=disabled\n");
    s += &put("/etc/slurm/pcifab-slurm.conf", "644", HOOK_CONF);
    s += &put("/etc/slurm/pcifab/prolog-slurmctld", "755", PROLOG);
    s += &put("/etc/slurm/pcifab/epilog-slurmctld", "755", EPILOG);
    s += &put("/etc/slurm/pcifab/task-prolog", "755", TASK_PROLOG);
    s += "munged || { tail -5 /var/log/munge/munged.log; exit 1; }\n\
          munge -n | unmunge >/dev/null || { echo 'munge round trip failed'; tail -5 /var/log/munge/munged.log; exit 1; }\n\
          echo munged up";
    h.run_ok_timeout(&s, Duration::from_secs(60))
        .map(|_| ())
        .map_err(|e| format!("{}: installing Slurm and starting munged: {e}", h.name))
}

/// Waits (in `h`) until `cond` (a shell test) holds, at most `secs` by the guest's clock;
/// on time-out prints `diag` and fails.
fn wait_in(h: &mut Host, cond: &str, secs: u32, what: &str, diag: &str) -> Result<(), String> {
    let script = format!(
        "end=$(($(date +%s) + {secs}))\nuntil {cond}; do\n  \
         [ $(date +%s) -lt $end ] || {{ echo 'not within {secs} s: {what}'; {diag}; exit 1; }}\n  \
         sleep 0.2\ndone"
    );
    h.run_ok_timeout(&script, Duration::from_secs(u64::from(secs) + 60))
        .map(|_| ())
        .map_err(|e| format!("{}: {e}", h.name))
}

const CTLD_DIAG: &str = "tail -20 /var/log/slurm/slurmctld.log";

/// Starts slurmctld in h0 and slurmd in h1; waits until h0 sees h1 idle.
fn start_slurm(f: &mut Fabric) -> Result<(), String> {
    start_slurm_with(f, SLURM_CONF_PCIFAB)
}

/// [`start_slurm`] with `pcifab_conf` as pcifab's part of slurm.conf.
fn start_slurm_with(f: &mut Fabric, pcifab_conf: &str) -> Result<(), String> {
    let hosts = "127.0.0.1 localhost\n10.77.1.1 h0\n10.77.1.2 h1\n";
    install(&mut f.hosts[0], hosts, pcifab_conf)?;
    install(&mut f.hosts[1], hosts, pcifab_conf)?;
    let h0 = &mut f.hosts[0];
    h0.run_ok("slurmctld || { tail -20 /var/log/slurm/slurmctld.log; exit 1; }")
        .map_err(|e| format!("h0: starting slurmctld: {e}"))?;
    wait_in(
        h0,
        "scontrol ping 2>/dev/null | grep -q UP",
        60,
        "slurmctld answers",
        CTLD_DIAG,
    )?;
    f.hosts[1]
        .run_ok("slurmd || { tail -20 /var/log/slurm/slurmd.log; exit 1; }")
        .map_err(|e| format!("h1: starting slurmd: {e}"))?;
    let h0 = &mut f.hosts[0];
    wait_in(
        h0,
        "[ \"$(sinfo -h -N -n h1 -o %T 2>/dev/null)\" = idle ]",
        90,
        "h1 idle in sinfo",
        "sinfo -N; scontrol show node h1; tail -20 /var/log/slurm/slurmctld.log",
    )
    .map_err(|e| {
        let d = f.hosts[1]
            .run("tail -30 /var/log/slurm/slurmd.log; ps")
            .map(|o| o.out)
            .unwrap_or_default();
        format!("{e}\nh1:\n{d}")
    })
}

/// Stops slurmd, slurmctld and both munged; the first failure is returned.
fn stop_slurm(f: &mut Fabric) -> Result<(), String> {
    let stop = "for p in /run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid; do\n\
                  [ -f $p ] || continue\n\
                  pid=$(cat $p); kill $pid 2>/dev/null || true\n\
                  i=0; while kill -0 $pid 2>/dev/null && [ $i -lt 150 ]; do sleep 0.2; i=$((i+1)); done\n\
                  if kill -0 $pid 2>/dev/null; then echo \"$p: pid $pid still running after SIGTERM\"; exit 1; fi\n\
                  rm -f $p\n\
                done";
    let r1 = f.hosts[1].run_ok(stop).map(|_| ());
    let r0 = f.hosts[0].run_ok(stop).map(|_| ());
    r1.and(r0).map_err(|e| format!("stopping Slurm: {e}"))
}

/// A lease as `pcifab leases --json` shows it: (id, host, pool, functions).
type Lease = (u64, u64, String, Vec<String>);

/// The manager's leases.
fn leases(h0: &mut Host) -> Result<Vec<Lease>, String> {
    let o = h0.run("pcifab leases --json")?;
    let v = json_line(&o.out).map_err(|e| format!("h0: `pcifab leases --json`: {e}"))?;
    Ok(v["leases"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|l| {
                    let fns = l["functions"]
                        .as_array()
                        .map(|x| {
                            x.iter()
                                .filter_map(Value::as_str)
                                .map(str::to_string)
                                .collect()
                        })
                        .unwrap_or_default();
                    (
                        l["id"].as_u64().unwrap_or(0),
                        l["host"].as_u64().unwrap_or(u64::MAX),
                        l["pool"].as_str().unwrap_or("?").to_string(),
                        fns,
                    )
                })
                .collect()
        })
        .unwrap_or_default())
}

/// The manager's leases' (id, tenant, owner, tag).
fn lease_tenants(h0: &mut Host) -> Result<Vec<(u64, String, String, String)>, String> {
    let o = h0.run("pcifab leases --json")?;
    let v = json_line(&o.out).map_err(|e| format!("h0: `pcifab leases --json`: {e}"))?;
    Ok(v["leases"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|l| {
                    let text = |k: &str| l[k].as_str().unwrap_or("?").to_string();
                    (
                        l["id"].as_u64().unwrap_or(0),
                        text("tenant"),
                        text("owner"),
                        text("tag"),
                    )
                })
                .collect()
        })
        .unwrap_or_default())
}

/// The job's output: (LEASE, FUNCTIONS, PDFIDs of the fabric functions it saw).
fn job_output(out: &str) -> (String, String, Vec<String>) {
    let field = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(k))
            .map_or(String::new(), |v| v.trim().to_string())
    };
    let seen = out
        .lines()
        .filter(|l| l.starts_with("{\"test\":\"bar-id\""))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["pdfid"].as_str().map(str::to_string))
        .collect();
    (field("LEASE "), field("FUNCTIONS "), seen)
}

/// The Slurm account of the held job (`sbatch -A`), a manager tenant of the same name: the
/// hooks' `PCIFAB_TENANTS="*"` counts its requests against it.
const ACCOUNT: &str = "physics";

/// The manager configuration of the Slurm scenarios: one pool `slurm` of mode `mode`
/// holding gpu0 and gpu1, reserved to the hooks' principal (`root` here: the test world's
/// SlurmUser); `alice` (local user nobody) is a tenant of h0 and h1 who is not Slurm; the
/// tenant [`ACCOUNT`].
fn manager_cfg(f: &Fabric, mode: &str) -> Result<String, String> {
    let (g0, g1) = (pdfid(f, "gpu0")?, pdfid(f, "gpu1")?);
    Ok(format!(
        "[manager]\nhosts = {}\nmax_priority = 9\naging_s = 1000\ndefault_lease_s = 600\n\
         max_lease_s = 3600\nmax_functions_per_host = 4\n\n\
         [failover]\nhost_timeout_s = 3\nreclaim_after_s = 2\n\n\
         [telemetry]\ninterval_s = 0\nmax_temp_c = 90.0\nbad_samples = 2\n\n\
         [[pools]]\nname = \"slurm\"\nmode = \"{mode}\"\nprincipals = [\"root\"]\n\n\
         [[pools.devices]]\npf = {g0:#06x}\n[[pools.devices]]\npf = {g1:#06x}\n\n\
         [[principals]]\nname = \"alice\"\nrole = \"tenant\"\nhosts = [0, 1]\n\
         uids = [{NOBODY}]\n\n\
         [[manager.tenants]]\nname = \"{ACCOUNT}\"\n",
        f.hosts.len()
    ))
}

/// The frame of every Slurm scenario: the manager (pool `slurm` of `mode`) and Slurm up
/// around `body`, both stopped after it, and every function free at the end.
fn with_slurm(
    f: &mut Fabric,
    mode: &str,
    body: impl FnOnce(&mut Fabric) -> Result<(), String>,
) -> Result<(), String> {
    if !f.slurm {
        return Err(
            "the guests carry no Slurm: run the harness with --slurm DIR (made by \
             tools/scripts/slurm.sh; `make scenarios FILTER=slurm` passes it)"
                .into(),
        );
    }
    if f.hosts.len() < 2 {
        return Err("needs h0 (controller and manager) and h1 (the node): --hosts 2".into());
    }
    compose_begin(f)?;
    let cfg = manager_cfg(f, mode)?;
    run_with_manager(f, &cfg, 30, "every function free", |f| {
        start_slurm(f)?;
        let r = body(f);
        let stop = stop_slurm(f);
        r?;
        stop
    })?;
    check_world(
        f,
        &Owners::new(),
        "the end (Slurm and the manager stopped, every function free)",
    )
}

/// "slurm: a 2-GPU job on a node with none runs once the manager binds two GPUs".
pub fn two_gpu_job(f: &mut Fabric) -> Result<(), String> {
    let (g0, g1) = (pdfid(f, "gpu0")?, pdfid(f, "gpu1")?);
    with_slurm(f, "whole", |f| job(f, g0, g1))
}

fn job(f: &mut Fabric, g0: u16, g1: u16) -> Result<(), String> {
    let want_fns = vec![format!("{g0:#06x}"), format!("{g1:#06x}")];
    // Before: h1 holds none of the pool's GPUs, the manager no lease.
    check_world(f, &Owners::new(), "Slurm up, before the job")?;
    let h0 = &mut f.hosts[0];
    crate::checks::expect_eq("leases before the job", vec![], leases(h0)?)?;
    not_slurm_refused(h0)?;

    // Submitted in h0 (the job runs in h1), asking for two GPUs on a node that has none.
    f.hosts[1].run_ok(&format!("rm -f {JOB_GO} {JOB_OUT}"))?;
    let h0 = &mut f.hosts[0];
    let sub = h0.run_ok(&format!(
        "{}rm -f {JOB_OUT}; sbatch --parsable --gres=gpu:2 -w h1 -o {JOB_OUT} /tmp/slurm-job.sh",
        put("/tmp/slurm-job.sh", "755", JOB_SCRIPT)
    ))?;
    let id: u64 = sub
        .trim()
        .lines()
        .last()
        .and_then(|l| l.split(';').next())
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| format!("h0: sbatch printed no job id: {sub:?}"))?;
    f.hosts[0].log_note(&format!("Slurm job {id} submitted"));

    // The job starts once the prolog has its lease: its output says READY.
    let h1 = &mut f.hosts[1];
    wait_in(
        h1,
        &format!("grep -q READY {JOB_OUT} 2>/dev/null"),
        180,
        "the job printing READY",
        &format!("cat {JOB_OUT}; tail -20 /var/log/slurm/slurmd.log"),
    )
    .map_err(|e| {
        let ctld = f.hosts[0]
            .run(&format!("squeue; scontrol show job {id}; {CTLD_DIAG}"))
            .map(|o| o.out)
            .unwrap_or_default();
        format!("{e}\nh0:\n{ctld}")
    })?;
    let out = f.hosts[1].run_ok(&format!("cat {JOB_OUT}"))?;
    f.hosts[1].log_note(&format!("job {id} output so far:\n{out}"));

    // While it runs: one lease of the slurm pool for h1 with both GPUs; they are bound to
    // h1 and nowhere else; the job was told exactly them and sees exactly them.
    let h0 = &mut f.hosts[0];
    let l = leases(h0)?;
    let mut c = Checks::new(&format!("job {id} running"));
    c.eq("number of leases", 1, l.len());
    let lease = l.first().cloned().unwrap_or_default();
    c.eq("lease host", 1, lease.1);
    c.eq("lease pool", "slurm".to_string(), lease.2.clone());
    let mut lease_fns = lease.3.clone();
    lease_fns.sort();
    c.eq("lease functions", want_fns.clone(), lease_fns);
    let (job_lease, job_fns, mut seen) = job_output(&out);
    c.eq("PCIFAB_LEASE in the job", lease.0.to_string(), job_lease);
    let mut told: Vec<String> = job_fns.split(',').map(str::to_string).collect();
    told.sort();
    c.eq("PCIFAB_FUNCTIONS in the job", want_fns.clone(), told);
    seen.sort();
    c.eq("fabric functions the job sees", want_fns.clone(), seen);
    let slots = out
        .lines()
        .find_map(|l| l.strip_prefix("SLURM_JOB_GPUS "))
        .unwrap_or("")
        .trim()
        .to_string();
    c.eq("SLURM_JOB_GPUS (the node's two slots)", "0,1", &slots);
    let node = h0.run_ok("scontrol show node -d h1")?;
    c.eq(
        "Slurm's allocation on h1 (GresUsed=gpu:2,gpuvf:0)",
        true,
        node.lines().any(|l| l.trim() == "GresUsed=gpu:2,gpuvf:0"),
    );
    let state = h0.run_ok(&format!("squeue -h -j {id} -o %T"))?;
    c.eq("job state", "RUNNING", state.trim());
    c.finish()?;
    check_world(f, &owners(&[(g0, 1), (g1, 1)]), "the job running")?;

    // Let it end: the epilog releases the lease; the GPUs leave h1.
    f.hosts[1].run_ok(&format!("touch {JOB_GO}"))?;
    let h0 = &mut f.hosts[0];
    wait_in(
        h0,
        &format!("[ -z \"$(squeue -h -j {id} 2>/dev/null)\" ] && pcifab leases --json | grep -q '\"leases\":\\[\\]'"),
        120,
        "the job gone and no lease left",
        &format!("squeue; pcifab leases; {CTLD_DIAG}"),
    )?;
    let h0 = &mut f.hosts[0];
    let fin = h0.run_ok(&format!("scontrol show job {id}"))?;
    let mut c = Checks::new(&format!("job {id} ended"));
    c.eq(
        "JobState=COMPLETED",
        true,
        fin.contains("JobState=COMPLETED"),
    );
    c.eq("ExitCode=0:0", true, fin.contains("ExitCode=0:0"));
    c.eq("leases", vec![], leases(h0)?);
    let out = f.hosts[1].run_ok(&format!("cat {JOB_OUT}"))?;
    c.eq(
        "the job printed DONE",
        true,
        out.lines().any(|l| l == "DONE"),
    );
    c.finish()?;
    check_world(
        f,
        &Owners::new(),
        "the job ended, its GPUs back in the pool",
    )
}

/// A short job: notes its id in /tmp/slurm-order (h1), prints what it was given and the
/// fabric GPUs it sees (PDFIDs), then ends.
const QUICK_JOB: &str = r#"#!/bin/sh
echo "$SLURM_JOB_ID" >> /tmp/slurm-order
echo "LEASE ${PCIFAB_LEASE:-none}"
echo "FUNCTIONS ${PCIFAB_FUNCTIONS:-none}"
for d in /sys/bus/pci/devices/*; do
  [ "$(cat $d/vendor)" = 0x10de ] || continue
  pcifab-selftest bar-id --device ${d##*/} 2>&1
done
echo DONE
"#;

/// `sbatch --parsable ARGS /tmp/slurm-quick.sh` in h0 (the script written first); the job id.
fn sbatch(h0: &mut Host, args: &str) -> Result<u64, String> {
    let sub = h0.run_ok(&format!(
        "{}sbatch --parsable {args} /tmp/slurm-quick.sh",
        put("/tmp/slurm-quick.sh", "755", QUICK_JOB)
    ))?;
    let id = sub
        .trim()
        .lines()
        .last()
        .and_then(|l| l.split(';').next())
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| format!("h0: sbatch {args} printed no job id: {sub:?}"))?;
    h0.log_note(&format!("Slurm job {id} submitted: sbatch {args}"));
    Ok(id)
}

/// `KEY=VALUE` of `scontrol show job` output (the value up to the next space).
fn job_field(show: &str, key: &str) -> String {
    show.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .unwrap_or("")
        .to_string()
}

/// A manager request in h0 (`pcifab request ARGS --json`): (id, granted at once).
fn mgr_request(h0: &mut Host, args: &str) -> Result<(u64, bool), String> {
    let o = h0.run_ok(&format!("pcifab request {args} --json"))?;
    let v = json_line(&o).map_err(|e| format!("h0: `pcifab request {args}`: {e}"))?;
    let id = v["id"]
        .as_u64()
        .ok_or_else(|| format!("h0: `pcifab request {args}`: no id in {o:?}"))?;
    Ok((id, v["granted"].as_bool().unwrap_or(false)))
}

/// The hosts of the manager's queued requests, in queue order.
fn queued_hosts(h0: &mut Host) -> Result<Vec<u64>, String> {
    let o = h0.run("pcifab queue --json")?;
    let v = json_line(&o.out).map_err(|e| format!("h0: `pcifab queue --json`: {e}"))?;
    Ok(v["queue"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|q| q["host"].as_u64().unwrap_or(u64::MAX))
                .collect()
        })
        .unwrap_or_default())
}

/// Another principal than Slurm's (`alice`, local user nobody) asks the manager for a GPU of
/// the pool `slurm` on the control socket: refused (exit 3) with the reservation named;
/// no lease made.
fn not_slurm_refused(h0: &mut Host) -> Result<(), String> {
    // The socket the manager and the hooks use (PCIFAB_SOCKET), open to every local user:
    // the manager tells them apart by their uid.
    let o = h0.run(
        "chmod 666 /run/pcifab-manager.sock; su -s /bin/sh nobody -c 'pcifab request \
         --gpus 1 --host 1 --priority 1 --duration 60 --pool slurm --json'",
    )?;
    let mut c = Checks::new("a request of principal alice (not Slurm) for the slurm pool");
    c.eq("exit code (3: refused)", 3, o.code);
    c.eq(
        "names the reservation and the principal",
        true,
        o.out.contains("pool 'slurm' is reserved to principals")
            && o.out.contains("'alice' may not lease from it"),
    );
    c.eq("leases", vec![], leases(h0)?);
    c.finish()
        .map_err(|e| format!("{e}\n`pcifab request` as nobody printed: {}", o.out))
}

/// Sets the hooks' `PCIFAB_BIND_TIMEOUT_S` (they read their configuration at every run).
fn set_bind_timeout(h0: &mut Host, secs: u32) -> Result<(), String> {
    h0.run_ok(&format!(
        "sed -i 's/^PCIFAB_BIND_TIMEOUT_S=.*/PCIFAB_BIND_TIMEOUT_S={secs}/' /etc/slurm/pcifab-slurm.conf\n\
         grep -qx 'PCIFAB_BIND_TIMEOUT_S={secs}' /etc/slurm/pcifab-slurm.conf"
    ))
    .map(|_| ())
}

/// "slurm: a bind that times out requeues the job; one cancelled while its bind waits
/// leaves nothing bound".
pub fn bind_failures(f: &mut Fabric) -> Result<(), String> {
    let (g0, g1) = (pdfid(f, "gpu0")?, pdfid(f, "gpu1")?);
    with_slurm(f, "whole", |f| {
        timed_out_bind(f, g0, g1)?;
        cancelled_bind(f, g0, g1)
    })
}

/// Both GPUs held by a manager lease for h0: the job's request queues behind it, the
/// prolog gives up after PCIFAB_BIND_TIMEOUT_S, Slurm requeues the job and says why; once
/// the GPUs are free the job runs with them.
fn timed_out_bind(f: &mut Fabric, g0: u16, g1: u16) -> Result<(), String> {
    let want_fns = vec![format!("{g0:#06x}"), format!("{g1:#06x}")];
    let h0 = &mut f.hosts[0];
    set_bind_timeout(h0, 6)?;
    let (holder, granted) = mgr_request(
        h0,
        "--gpus 2 --host 0 --priority 9 --duration 600 --pool slurm",
    )?;
    crate::checks::expect_eq(
        "the holder's request (both GPUs, for h0) granted",
        true,
        granted,
    )?;
    check_world(f, &owners(&[(g0, 0), (g1, 0)]), "both GPUs held for h0")?;
    let h0 = &mut f.hosts[0];
    let id = sbatch(h0, "--requeue --gres=gpu:2 -w h1 -o /tmp/slurm-a.out")?;
    // Requeued (Restarts=1; COMPLETING, then PENDING until it may start again 11 s later):
    // a snapshot while it is PENDING.
    let snap = h0
        .run_ok_timeout(
            &format!(
                "end=$(($(date +%s) + 90))\n\
                 while :; do\n  \
                   s=$(scontrol show job {id}; echo; echo \"REASON $(squeue -h -j {id} -o %r)\")\n  \
                   echo \"$s\" | grep -q 'Restarts=[1-9]' && echo \"$s\" | grep -q 'JobState=PENDING' && break\n  \
                   [ $(date +%s) -lt $end ] || {{ echo 'not requeued (PENDING, Restarts=1) within 90 s'; echo \"$s\"; {CTLD_DIAG}; exit 1; }}\n  \
                   sleep 0.2\n\
                 done\n\
                 echo \"$s\""
            ),
            Duration::from_secs(150),
        )
        .map_err(|e| format!("h0: job {id} requeued after its bind timed out: {e}"))?;
    h0.log_note(&format!("job {id} requeued:\n{snap}"));
    let mut c = Checks::new(&format!("job {id} requeued after its bind timed out"));
    c.eq("JobState", "PENDING", &job_field(&snap, "JobState"));
    c.eq("Restarts", "1", &job_field(&snap, "Restarts"));
    c.eq(
        "AdminComment names the time-out",
        true,
        snap.contains("AdminComment=pcifab: request ") && snap.contains("not granted within 6 s"),
    );
    c.finish()?;

    // The GPUs free: the requeued job runs with them and ends; nothing stays bound.
    let h0 = &mut f.hosts[0];
    h0.run_ok(&format!("pcifab release {holder}"))?;
    wait_in(
        h0,
        &format!("scontrol show job {id} | grep -q 'JobState=COMPLETED'"),
        120,
        "the requeued job COMPLETED",
        &format!("scontrol show job {id}; pcifab leases; pcifab queue; {CTLD_DIAG}"),
    )?;
    wait_in(
        h0,
        "pcifab leases --json | grep -q '\"leases\":\\[\\]'",
        30,
        "no lease left",
        "pcifab leases; pcifab queue",
    )?;
    let fin = h0.run_ok(&format!("scontrol show job {id}"))?;
    let out = f.hosts[1].run_ok("cat /tmp/slurm-a.out")?;
    let (_, told, mut seen) = job_output(&out);
    let mut c = Checks::new(&format!("job {id} after its requeue"));
    c.eq("ExitCode", "0:0", &job_field(&fin, "ExitCode"));
    c.eq("Restarts", true, job_field(&fin, "Restarts") != "0");
    let mut told: Vec<String> = told.split(',').map(str::to_string).collect();
    told.sort();
    c.eq("PCIFAB_FUNCTIONS in the job", want_fns.clone(), told);
    seen.sort();
    c.eq("fabric functions the job saw", want_fns, seen);
    let h0 = &mut f.hosts[0];
    c.eq("queued requests", Vec::<u64>::new(), queued_hosts(h0)?);
    c.finish()?;
    check_world(f, &Owners::new(), "the requeued job done, its GPUs back")
}

/// Both GPUs held for h0 again: a job's prolog waits for its request; the job is
/// cancelled. The prolog stops waiting and withdraws the request, so when the GPUs come
/// free nothing is bound to h1.
fn cancelled_bind(f: &mut Fabric, g0: u16, g1: u16) -> Result<(), String> {
    let h0 = &mut f.hosts[0];
    set_bind_timeout(h0, 300)?;
    let (holder, granted) = mgr_request(
        h0,
        "--gpus 2 --host 0 --priority 9 --duration 600 --pool slurm",
    )?;
    crate::checks::expect_eq(
        "the holder's request (both GPUs, for h0) granted",
        true,
        granted,
    )?;
    check_world(
        f,
        &owners(&[(g0, 0), (g1, 0)]),
        "both GPUs held for h0 again",
    )?;
    let h0 = &mut f.hosts[0];
    let id = sbatch(h0, "--gres=gpu:2 -w h1 -o /tmp/slurm-b.out")?;
    wait_in(
        h0,
        "pcifab queue --json | grep -q '\"host\":1'",
        60,
        "the request of the job queued in the manager",
        &format!("scontrol show job {id}; pcifab queue; {CTLD_DIAG}"),
    )?;
    let state = h0.run_ok(&format!("squeue -h -j {id} -o %T"))?;
    crate::checks::expect_eq(
        "job state while its bind waits",
        "CONFIGURING",
        state.trim(),
    )?;
    h0.run_ok(&format!("scancel {id}"))?;
    h0.log_note(&format!("job {id} cancelled while its prolog waits"));
    // Within 20 s (the prolog would otherwise wait 300): the job gone, no prolog left, the
    // request withdrawn.
    wait_in(
        h0,
        &format!(
            "[ -z \"$(squeue -h -j {id} 2>/dev/null)\" ] && \
             ! ps | grep -v grep | grep -q prolog-slurmctld && \
             ! pcifab queue --json | grep -q '\"host\":1'"
        ),
        20,
        "the prolog of the cancelled job ended, its request withdrawn",
        &format!("squeue; ps | grep slurm; pcifab queue; pcifab leases; {CTLD_DIAG}"),
    )?;
    h0.run_ok(&format!("pcifab release {holder}"))?;
    let fin = h0.run_ok(&format!("scontrol show job {id}"))?;
    let mut c = Checks::new(&format!("job {id} cancelled while its bind waited"));
    c.eq("JobState", "CANCELLED", &job_field(&fin, "JobState"));
    c.eq("leases", vec![], leases(h0)?);
    c.eq("queued requests", Vec::<u64>::new(), queued_hosts(h0)?);
    c.finish()?;
    check_world(
        f,
        &Owners::new(),
        "the cancelled job's GPUs back in the pool, none bound to h1",
    )
}

/// "slurm: a job asking for one VF (--gres=gpuvf:1) gets one SR-IOV VF bound to its node".
pub fn vf_job(f: &mut Fabric) -> Result<(), String> {
    let (g0, g1) = (pdfid(f, "gpu0")?, pdfid(f, "gpu1")?);
    with_slurm(f, "hybrid", |f| {
        let h0 = &mut f.hosts[0];
        let id = sbatch(h0, "--gres=gpuvf:1 -w h1 -o /tmp/slurm-vf.out")?;
        wait_in(
            h0,
            &format!("scontrol show job {id} | grep -q 'JobState=COMPLETED'"),
            120,
            "the VF job COMPLETED",
            &format!("scontrol show job {id}; pcifab leases; {CTLD_DIAG}"),
        )?;
        // The lease outlives the job until the epilog has run: its record is in the
        // manager's log, the binding in the emulator's; both are checked from the job's
        // own view (what it was told and what it saw) and the manager's notices.
        let out = f.hosts[1].run_ok("cat /tmp/slurm-vf.out")?;
        f.hosts[1].log_note(&format!("job {id} output:\n{out}"));
        let (lease, told, seen) = job_output(&out);
        let fin = f.hosts[0].run_ok(&format!("scontrol show job {id}"))?;
        let vf: Option<u16> = told
            .strip_prefix("0x")
            .and_then(|h| u16::from_str_radix(h, 16).ok());
        let mut c = Checks::new(&format!("VF job {id}"));
        c.eq("ExitCode", "0:0", &job_field(&fin, "ExitCode"));
        c.eq(
            "PCIFAB_LEASE set",
            true,
            lease != "none" && !lease.is_empty(),
        );
        match vf {
            Some(p) => c.eq(
                "PCIFAB_FUNCTIONS: one VF of gpu0 or gpu1",
                true,
                p & 0xff != 0 && (p & !0xff == g0 || p & !0xff == g1),
            ),
            None => c.fail(format!(
                "PCIFAB_FUNCTIONS: expected one function, got {told:?}"
            )),
        }
        c.eq("fabric functions the job saw", vec![told.clone()], seen);
        c.finish()?;
        let h0 = &mut f.hosts[0];
        wait_in(
            h0,
            "pcifab leases --json | grep -q '\"leases\":\\[\\]'",
            30,
            "the lease of the VF released",
            "pcifab leases",
        )?;
        check_world(
            f,
            &Owners::new(),
            "the VF job done, its VF back in the pool",
        )
    })
}

/// "slurm: ten 1-GPU jobs at two priorities share the pool's two GPUs, higher priority
/// first, all finish".
pub fn ten_jobs(f: &mut Fabric) -> Result<(), String> {
    let (g0, g1) = (pdfid(f, "gpu0")?, pdfid(f, "gpu1")?);
    let pool = [format!("{g0:#06x}"), format!("{g1:#06x}")];
    with_slurm(f, "whole", |f| {
        f.hosts[1].run_ok("rm -f /tmp/slurm-order /tmp/slurm-j*.out")?;
        // Submitted to the partition set DOWN, so that Slurm sees all ten at once when it
        // is set UP (one change, unlike releasing held jobs one by one); every other one
        // with a higher priority (nice -100).
        let h0 = &mut f.hosts[0];
        h0.run_ok("scontrol update PartitionName=fabric State=DOWN")?;
        let mut jobs = Vec::new();
        for i in 0..10 {
            let high = i % 2 == 1;
            let nice = if high { "--nice=-100 " } else { "" };
            let id = sbatch(
                h0,
                &format!("{nice}--gres=gpu:1 -w h1 -o /tmp/slurm-j{i}.out"),
            )?;
            jobs.push((id, high, i));
        }
        let ids: Vec<String> = jobs.iter().map(|j| j.0.to_string()).collect();
        h0.run_ok("scontrol update PartitionName=fabric State=UP")?;
        let prio = h0.run_ok(&format!("squeue -h -j {} -o '%i %Q %T'", ids.join(",")))?;
        h0.log_note(&format!("released (job, priority, state):\n{prio}"));
        wait_in(
            h0,
            "[ -z \"$(squeue -h 2>/dev/null)\" ] && pcifab leases --json | grep -q '\"leases\":\\[\\]'",
            300,
            "all ten jobs ended and no lease left",
            &format!("squeue; pcifab leases; pcifab queue; {CTLD_DIAG}"),
        )?;
        let mut c = Checks::new("ten jobs on two GPUs");
        let order: Vec<u64> = f.hosts[1]
            .run_ok("cat /tmp/slurm-order")?
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        f.hosts[1].log_note(&format!("start order: {order:?}"));
        let mut started = order.clone();
        started.sort_unstable();
        let mut all: Vec<u64> = jobs.iter().map(|j| j.0).collect();
        all.sort_unstable();
        c.eq("jobs that ran, each once", all, started);
        // Slurm's order: the time it gave each job its allocation (StartTime, before the
        // prolog; two jobs whose prologs wait for the GPUs may then begin in either order).
        // No job of the default priority was given one before every nice -100 job had one.
        let mut high_last = String::new();
        let mut low_first = String::from("~");
        for (id, high, i) in &jobs {
            let fin = f.hosts[0].run_ok(&format!("scontrol show job {id}"))?;
            let start = job_field(&fin, "StartTime");
            if *high {
                high_last = high_last.max(start);
            } else {
                low_first = low_first.min(start);
            }
            c.eq(
                &format!("job {id}: JobState"),
                "COMPLETED",
                &job_field(&fin, "JobState"),
            );
            if job_field(&fin, "ExitCode") != "0:0" {
                let ctld = f.hosts[0]
                    .run(&format!(
                        "grep -w 'JobId={id}' /var/log/slurm/slurmctld.log"
                    ))
                    .map(|o| o.out)
                    .unwrap_or_default();
                let slurmd = f.hosts[1]
                    .run(&format!("grep -w 'JobId={id}' /var/log/slurm/slurmd.log"))
                    .map(|o| o.out)
                    .unwrap_or_default();
                c.fail(format!(
                    "job {id}: ExitCode: expected 0:0, got {}\nslurmctld:\n{ctld}\nslurmd:\n{slurmd}",
                    job_field(&fin, "ExitCode")
                ));
            }
            // Told one GPU of the pool; found it in h1 (beside, at most, the other job's).
            let out = f.hosts[1].run_ok(&format!("cat /tmp/slurm-j{i}.out"))?;
            let (_, told, seen) = job_output(&out);
            c.eq(
                &format!("job {id}: PCIFAB_FUNCTIONS one GPU of the pool"),
                true,
                pool.contains(&told),
            );
            c.eq(
                &format!("job {id}: its GPU among the fabric functions it saw, all of the pool ({seen:?})"),
                true,
                seen.contains(&told) && seen.iter().all(|p| pool.contains(p)),
            );
        }
        c.eq(
            &format!(
                "the last nice -100 job allocated ({high_last}) no later than the first \
                 other one ({low_first})"
            ),
            true,
            high_last <= low_first,
        );
        let h0 = &mut f.hosts[0];
        c.eq("queued requests", Vec::<u64>::new(), queued_hosts(h0)?);
        c.finish()?;
        check_world(
            f,
            &Owners::new(),
            "all ten jobs done, both GPUs back in the pool",
        )
    })
}

/// "slurm: a node killed mid-job is marked down, its GPUs reclaimed, its job requeued and run
/// again".
pub fn node_killed(f: &mut Fabric) -> Result<(), String> {
    let (g0, g1) = (pdfid(f, "gpu0")?, pdfid(f, "gpu1")?);
    let want_fns = vec![format!("{g0:#06x}"), format!("{g1:#06x}")];
    let r = with_slurm(f, "whole", |f| {
        // An earlier scenario's go file would let the job end at once.
        f.hosts[1].run_ok(&format!("rm -f {JOB_GO} {JOB_OUT}"))?;
        let h0 = &mut f.hosts[0];
        let id = h0
            .run_ok(&format!(
                "{}rm -f {JOB_OUT}; sbatch --parsable --requeue --gres=gpu:2 -w h1 -o {JOB_OUT} /tmp/slurm-job.sh",
                put("/tmp/slurm-job.sh", "755", JOB_SCRIPT)
            ))?
            .trim()
            .lines()
            .last()
            .and_then(|l| l.split(';').next())
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or("h0: sbatch printed no job id")?;
        wait_in(
            &mut f.hosts[1],
            &format!("grep -q READY {JOB_OUT} 2>/dev/null"),
            120,
            "the job printing READY",
            &format!("cat {JOB_OUT}"),
        )?;
        check_world(f, &owners(&[(g0, 1), (g1, 1)]), "the job running on h1")?;
        f.hosts[1].kill_qemu()?;
        f.hosts[0].log_note("h1 killed while its job holds both GPUs");
        // Slurm marks h1 down and requeues the job; the manager reclaims the GPUs.
        let h0 = &mut f.hosts[0];
        let snap = h0
            .run_ok_timeout(
                &format!(
                    "end=$(($(date +%s) + 90))\n\
                     while :; do\n  \
                       s=$(echo \"NODE $(sinfo -h -N -n h1 -o %T)\"; scontrol show job {id}; pcifab leases --json)\n  \
                       echo \"$s\" | grep -q '^NODE down' && echo \"$s\" | grep -q 'Restarts=1' && \
                         echo \"$s\" | grep -q 'JobState=PENDING' && echo \"$s\" | grep -q '\"leases\":\\[\\]' && break\n  \
                       [ $(date +%s) -lt $end ] || {{ echo 'not within 90 s: h1 down, the job requeued, no lease'; echo \"$s\"; {CTLD_DIAG}; exit 1; }}\n  \
                       sleep 0.5\n\
                     done\n\
                     echo \"$s\""
                ),
                Duration::from_secs(150),
            )
            .map_err(|e| format!("h0: after h1 was killed: {e}"))?;
        h0.log_note(&format!("after the kill:\n{snap}"));
        let mut c = Checks::new(&format!("h1 killed while job {id} ran"));
        c.eq(
            "job PENDING again (requeued)",
            true,
            snap.contains("JobState=PENDING"),
        );
        c.eq("leases", vec![], leases(h0)?);
        c.eq("queued requests", Vec::<u64>::new(), queued_hosts(h0)?);
        c.finish()?;
        check_world(f, &Owners::new(), "h1 dead, its GPUs reclaimed")?;

        // h1 back: Slurm returns it to service and runs the job again, with both GPUs.
        crate::scenarios::manager::start_again(f, 1)?;
        compose_begin(f)?;
        let hosts = "127.0.0.1 localhost\n10.77.1.1 h0\n10.77.1.2 h1\n";
        install(&mut f.hosts[1], hosts, SLURM_CONF_PCIFAB)?;
        f.hosts[1]
            .run_ok("slurmd || { tail -20 /var/log/slurm/slurmd.log; exit 1; }")
            .map_err(|e| format!("h1: starting slurmd again: {e}"))?;
        wait_in(
            &mut f.hosts[1],
            &format!("grep -q READY {JOB_OUT} 2>/dev/null"),
            180,
            "the requeued job printing READY on the rebooted h1",
            "tail -20 /var/log/slurm/slurmd.log",
        )
        .map_err(|e| {
            let ctld = f.hosts[0]
                .run(&format!("sinfo -N; scontrol show job {id}; {CTLD_DIAG}"))
                .map(|o| o.out)
                .unwrap_or_default();
            format!("{e}\nh0:\n{ctld}")
        })?;
        let out = f.hosts[1].run_ok(&format!("cat {JOB_OUT}"))?;
        let (_, told, mut seen) = job_output(&out);
        check_world(f, &owners(&[(g0, 1), (g1, 1)]), "the requeued job running")?;
        f.hosts[1].run_ok(&format!("touch {JOB_GO}"))?;
        let h0 = &mut f.hosts[0];
        wait_in(
            h0,
            &format!(
                "scontrol show job {id} | grep -q 'JobState=COMPLETED' && \
                 pcifab leases --json | grep -q '\"leases\":\\[\\]'"
            ),
            120,
            "the requeued job COMPLETED and no lease left",
            &format!("scontrol show job {id}; pcifab leases; {CTLD_DIAG}"),
        )?;
        let fin = h0.run_ok(&format!("scontrol show job {id}"))?;
        let mut c = Checks::new(&format!("job {id} run again"));
        c.eq("ExitCode", "0:0", &job_field(&fin, "ExitCode"));
        c.eq("Restarts", "1", &job_field(&fin, "Restarts"));
        let mut told: Vec<String> = told.split(',').map(str::to_string).collect();
        told.sort();
        c.eq("PCIFAB_FUNCTIONS in the job", want_fns.clone(), told);
        seen.sort();
        c.eq("fabric functions the job saw", want_fns, seen);
        c.finish()?;
        check_world(f, &Owners::new(), "the requeued job done, its GPUs back")
    });
    // h1 back for the scenarios after this one, whatever happened.
    let reboot = crate::scenarios::manager::start_again(f, 1);
    r?;
    reboot?;
    compose_begin(f)
}

/// The held job (JOB_SCRIPT, `--gres=gpu:2 -w h1`) submitted in h0 and running: it printed
/// READY. Checked: one lease of the pool for h1 with both GPUs, the job told that lease and
/// those functions and seeing exactly them, both bound to h1 and nowhere else. The job id
/// and that lease.
fn held_job_running(f: &mut Fabric, g0: u16, g1: u16) -> Result<(u64, Lease), String> {
    let want_fns = vec![format!("{g0:#06x}"), format!("{g1:#06x}")];
    f.hosts[1].run_ok(&format!("rm -f {JOB_GO} {JOB_OUT}"))?;
    let h0 = &mut f.hosts[0];
    let sub = h0.run_ok(&format!(
        "{}sbatch --parsable -A {ACCOUNT} --gres=gpu:2 -w h1 -o {JOB_OUT} /tmp/slurm-job.sh",
        put("/tmp/slurm-job.sh", "755", JOB_SCRIPT)
    ))?;
    let id: u64 = sub
        .trim()
        .lines()
        .last()
        .and_then(|l| l.split(';').next())
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| format!("h0: sbatch printed no job id: {sub:?}"))?;
    h0.log_note(&format!("Slurm job {id} submitted (account {ACCOUNT})"));
    wait_in(
        &mut f.hosts[1],
        &format!("grep -q READY {JOB_OUT} 2>/dev/null"),
        120,
        "the job printing READY",
        &format!("cat {JOB_OUT}; tail -20 /var/log/slurm/slurmd.log"),
    )
    .map_err(|e| {
        let ctld = f.hosts[0]
            .run(&format!("squeue; scontrol show job {id}; {CTLD_DIAG}"))
            .map(|o| o.out)
            .unwrap_or_default();
        format!("{e}\nh0:\n{ctld}")
    })?;
    let out = f.hosts[1].run_ok(&format!("cat {JOB_OUT}"))?;
    let l = leases(&mut f.hosts[0])?;
    let mut c = Checks::new(&format!("job {id} running"));
    c.eq("number of leases", 1, l.len());
    let lease = l.first().cloned().unwrap_or_default();
    c.eq("lease host", 1, lease.1);
    c.eq("lease pool", "slurm", &lease.2);
    let mut lease_fns = lease.3.clone();
    lease_fns.sort();
    c.eq("lease functions", want_fns.clone(), lease_fns);
    let (job_lease, _, mut seen) = job_output(&out);
    c.eq("PCIFAB_LEASE in the job", lease.0.to_string(), job_lease);
    seen.sort();
    c.eq("fabric functions the job sees", want_fns, seen);
    let show = f.hosts[0].run_ok(&format!("scontrol show job {id}"))?;
    c.eq(
        "the job's Slurm account",
        ACCOUNT,
        &job_field(&show, "Account"),
    );
    c.eq(
        "the lease's tenant, owner and tag (the job's account; the hooks' principal; the job)",
        vec![(
            lease.0,
            ACCOUNT.to_string(),
            "root".to_string(),
            format!("slurm-job-{id}"),
        )],
        lease_tenants(&mut f.hosts[0])?,
    );
    c.finish()?;
    check_world(f, &owners(&[(g0, 1), (g1, 1)]), "the job running")?;
    Ok((id, lease))
}

/// The hooks' record of job `id`'s leases in h0 (the prolog's state file; the epilog removes
/// it once it released them all): its lease ids, or None when there is no such file.
fn hook_state(h0: &mut Host, id: u64) -> Result<Option<Vec<u64>>, String> {
    let o = h0.run(&format!("cat /var/spool/slurmctld/pcifab/{id}"))?;
    if o.code != 0 {
        return Ok(None);
    }
    Ok(Some(
        o.out
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .filter_map(|w| w.parse().ok())
            .collect(),
    ))
}

/// The held job `id` let go: it ends COMPLETED 0:0 having printed DONE, its epilog released
/// its leases (the hooks' state file gone, which the epilog removes only when every
/// release succeeded), the manager has no lease and no queued request, nothing is bound.
fn held_job_ends(f: &mut Fabric, id: u64) -> Result<(), String> {
    f.hosts[1].run_ok(&format!("touch {JOB_GO}"))?;
    let h0 = &mut f.hosts[0];
    wait_in(
        h0,
        &format!(
            "[ -z \"$(squeue -h -j {id} 2>/dev/null)\" ] && \
             pcifab leases --json | grep -q '\"leases\":\\[\\]'"
        ),
        120,
        "the job gone and no lease left",
        &format!("squeue; scontrol show job {id}; pcifab leases; {CTLD_DIAG}"),
    )?;
    let fin = h0.run_ok(&format!("scontrol show job {id}"))?;
    let mut c = Checks::new(&format!("job {id} ended"));
    c.eq("JobState", "COMPLETED", &job_field(&fin, "JobState"));
    c.eq("ExitCode", "0:0", &job_field(&fin, "ExitCode"));
    c.eq(
        "the hooks' state file of the job (removed by a successful epilog)",
        None,
        hook_state(h0, id)?,
    );
    c.eq("leases", vec![], leases(h0)?);
    c.eq("queued requests", Vec::<u64>::new(), queued_hosts(h0)?);
    let out = f.hosts[1].run_ok(&format!("cat {JOB_OUT}"))?;
    c.eq(
        "the job printed DONE",
        true,
        out.lines().any(|l| l == "DONE"),
    );
    c.finish()?;
    check_world(
        f,
        &Owners::new(),
        "the job ended, its GPUs back in the pool",
    )
}

/// The fields of `scontrol show job` that a restart must not change while the job runs.
fn job_record(show: &str) -> Vec<(&'static str, String)> {
    [
        "JobState",
        "Restarts",
        "StartTime",
        "NodeList",
        "AdminComment",
    ]
    .into_iter()
    .map(|k| (k, job_field(show, k)))
    .collect()
}

/// "slurm: slurmctld restarted mid-job loses nothing".
pub fn ctld_restart(f: &mut Fabric) -> Result<(), String> {
    let (g0, g1) = (pdfid(f, "gpu0")?, pdfid(f, "gpu1")?);
    with_slurm(f, "whole", |f| {
        let (id, lease) = held_job_running(f, g0, g1)?;
        let h0 = &mut f.hosts[0];
        let before = h0.run_ok(&format!("scontrol show job {id}"))?;
        // Stopped as a site stops it (SIGTERM: it saves its state to StateSaveLocation,
        // which persists) and started again without -c, so it recovers that state.
        h0.run_ok(
            "p=$(cat /run/slurmctld.pid); kill $p\n\
             i=0; while kill -0 $p 2>/dev/null && [ $i -lt 150 ]; do sleep 0.2; i=$((i+1)); done\n\
             if kill -0 $p 2>/dev/null; then echo \"slurmctld (pid $p) still running 30 s after SIGTERM\"; exit 1; fi",
        )
        .map_err(|e| format!("h0: stopping slurmctld: {e}"))?;
        h0.log_note(&format!(
            "slurmctld stopped while job {id} holds lease {}",
            lease.0
        ));
        // Without slurmctld, the job's GPUs stay where they are.
        let mut c = Checks::new("slurmctld stopped");
        c.eq("leases", vec![lease.clone()], leases(h0)?);
        c.eq(
            "the job's output (still running, not let go)",
            false,
            f.hosts[1]
                .run_ok(&format!("cat {JOB_OUT}"))?
                .lines()
                .any(|l| l == "DONE"),
        );
        c.finish()?;
        check_world(f, &owners(&[(g0, 1), (g1, 1)]), "slurmctld stopped")?;
        let h0 = &mut f.hosts[0];
        h0.run_ok("slurmctld || { tail -20 /var/log/slurm/slurmctld.log; exit 1; }")
            .map_err(|e| format!("h0: starting slurmctld again: {e}"))?;
        wait_in(
            h0,
            "scontrol ping 2>/dev/null | grep -q UP",
            60,
            "the restarted slurmctld answers",
            CTLD_DIAG,
        )?;
        h0.log_note("slurmctld started again");
        let after = h0.run_ok(&format!("scontrol show job {id}"))?;
        let mut c = Checks::new(&format!("job {id} after slurmctld's restart"));
        c.eq("job record", job_record(&before), job_record(&after));
        c.eq("JobState", "RUNNING", &job_field(&after, "JobState"));
        c.eq("leases", vec![lease.clone()], leases(h0)?);
        c.eq(
            "hooks' state file",
            Some(vec![lease.0]),
            hook_state(h0, id)?,
        );
        c.finish()?;
        check_world(
            f,
            &owners(&[(g0, 1), (g1, 1)]),
            "slurmctld restarted, the job running",
        )?;
        held_job_ends(f, id)?;

        // A job submitted after the restart gets a GPU through the restarted slurmctld's
        // prolog and gives it back through its epilog (one GPU: the hooks' path is the same
        // for two, each GPU costs a bind and an unbind).
        let h0 = &mut f.hosts[0];
        let id2 = sbatch(h0, "--gres=gpu:1 -w h1 -o /tmp/slurm-after.out")?;
        wait_in(
            h0,
            &format!(
                "scontrol show job {id2} | grep -q 'JobState=COMPLETED' && \
                 pcifab leases --json | grep -q '\"leases\":\\[\\]'"
            ),
            120,
            "the job submitted after the restart COMPLETED and no lease left",
            &format!("scontrol show job {id2}; pcifab leases; pcifab queue; {CTLD_DIAG}"),
        )?;
        let fin = h0.run_ok(&format!("scontrol show job {id2}"))?;
        let out = f.hosts[1].run_ok("cat /tmp/slurm-after.out")?;
        let (lease2, told, seen) = job_output(&out);
        let pool = [format!("{g0:#06x}"), format!("{g1:#06x}")];
        let mut c = Checks::new(&format!("job {id2}, submitted after the restart"));
        c.eq("ExitCode", "0:0", &job_field(&fin, "ExitCode"));
        c.eq(
            "PCIFAB_LEASE: a new lease",
            true,
            lease2.parse::<u64>().is_ok_and(|l| l > lease.0),
        );
        c.eq(
            &format!("PCIFAB_FUNCTIONS ({told}): one GPU of the pool"),
            true,
            pool.contains(&told),
        );
        c.eq("fabric functions the job saw", vec![told.clone()], seen);
        c.eq("hooks' state file", None, hook_state(&mut f.hosts[0], id2)?);
        c.finish()?;
        check_world(f, &Owners::new(), "the second job done, its GPUs back")
    })
}

/// "slurm: pcifab-manager restarted mid-job loses nothing".
pub fn manager_restart(f: &mut Fabric) -> Result<(), String> {
    let (g0, g1) = (pdfid(f, "gpu0")?, pdfid(f, "gpu1")?);
    with_slurm(f, "whole", |f| {
        let (id, lease) = held_job_running(f, g0, g1)?;
        let h0 = &mut f.hosts[0];
        let state_before = durable_state(h0)?;
        stop_manager(h0, "KILL")?;
        h0.log_note(&format!(
            "pcifab-manager killed (SIGKILL) while job {id} holds lease {}",
            lease.0
        ));
        check_world(f, &owners(&[(g0, 1), (g1, 1)]), "the manager killed")?;
        let h0 = &mut f.hosts[0];
        start_manager(h0, None, true)?;
        let restarted = h0.run_ok("date +%s")?;
        h0.log_note("pcifab-manager started again with its state");
        let mut c = Checks::new("the manager restarted");
        c.eq_json("durable state", state_before, durable_state(h0)?);
        c.eq("leases", vec![lease.clone()], leases(h0)?);
        // The fabric was as the stored state says: the restart had nothing to repair.
        let fixed = h0.run(&format!("grep -c 'differs from the stored state' {LOG}"))?;
        c.eq(
            "restarts that had to fix the fabric (log lines)",
            "0",
            fixed.out.trim(),
        );
        c.finish()?;
        check_world(f, &owners(&[(g0, 1), (g1, 1)]), "the manager restarted")?;
        // Not handed to anybody else: a higher-priority request for one GPU of the pool
        // queues behind the job's lease; withdrawn, it leaves nothing behind.
        let h0 = &mut f.hosts[0];
        let (other, granted) = mgr_request(
            h0,
            "--gpus 1 --host 0 --priority 9 --duration 60 --pool slurm",
        )?;
        let mut c = Checks::new("another request after the restart");
        c.eq("granted", false, granted);
        c.eq("queued requests (hosts)", vec![0], queued_hosts(h0)?);
        c.eq("leases", vec![lease.clone()], leases(h0)?);
        c.finish()?;
        h0.run_ok(&format!("pcifab release {other}"))?;
        crate::checks::expect_eq(
            "queued requests after withdrawing the other request",
            Vec::<u64>::new(),
            queued_hosts(h0)?,
        )?;
        check_world(
            f,
            &owners(&[(g0, 1), (g1, 1)]),
            "the other request withdrawn",
        )?;
        // Not reclaimed: the lease is still there once the failover's host time-out and
        // reclaim delay (3 s + 2 s) have passed since the restart, watched until then.
        h0_watch_lease(&mut f.hosts[0], &lease, restarted.trim(), 6)?;
        held_job_ends(f, id)
    })
}

/// Sets the hooks' `PCIFAB_RELEASE_RETRY_S` (they read their configuration at every run).
fn set_release_retry(h0: &mut Host, secs: u32) -> Result<(), String> {
    h0.run_ok(&format!(
        "sed -i 's/^PCIFAB_RELEASE_RETRY_S=.*/PCIFAB_RELEASE_RETRY_S={secs}/' /etc/slurm/pcifab-slurm.conf\n\
         grep -qx 'PCIFAB_RELEASE_RETRY_S={secs}' /etc/slurm/pcifab-slurm.conf"
    ))
    .map(|_| ())
}

/// The manager stopped (SIGTERM) while the held job `id` holds `lease`, then the job let go:
/// once its script has printed DONE, and `ended` (a shell test) holds, the lease's GPUs are
/// still bound to h1 and the hooks' state file still names the lease.
fn job_ends_without_manager(
    f: &mut Fabric,
    id: u64,
    lease: &Lease,
    ended: &str,
    what: &str,
) -> Result<(), String> {
    let (g0, g1) = (pdfid(f, "gpu0")?, pdfid(f, "gpu1")?);
    stop_manager(&mut f.hosts[0], "TERM")?;
    f.hosts[0].log_note(&format!(
        "pcifab-manager stopped while job {id} holds lease {}",
        lease.0
    ));
    f.hosts[1].run_ok(&format!("touch {JOB_GO}"))?;
    wait_in(
        &mut f.hosts[1],
        &format!("grep -qx DONE {JOB_OUT} 2>/dev/null"),
        60,
        "the job script printing DONE",
        &format!("cat {JOB_OUT}"),
    )?;
    wait_in(
        &mut f.hosts[0],
        ended,
        60,
        what,
        &format!("squeue; scontrol show job {id}; ps; {CTLD_DIAG}"),
    )?;
    let mut c = Checks::new(&format!("job {id} ended, the manager down ({what})"));
    c.eq(
        "the hooks' state file (the lease not released)",
        Some(vec![lease.0]),
        hook_state(&mut f.hosts[0], id)?,
    );
    c.finish()?;
    check_world(
        f,
        &owners(&[(g0, 1), (g1, 1)]),
        "the job ended while the manager is down",
    )
}

/// "slurm: the manager down when a job ends: its GPUs come back once the manager is".
pub fn manager_down_at_job_end(f: &mut Fabric) -> Result<(), String> {
    let (g0, g1) = (pdfid(f, "gpu0")?, pdfid(f, "gpu1")?);
    with_slurm(f, "whole", |f| {
        // The epilog retries within PCIFAB_RELEASE_RETRY_S: the manager back while it
        // does, the release goes through and the job completes with its GPUs returned.
        let (id, lease) = held_job_running(f, g0, g1)?;
        // A request of the job that its state file does not name (as one whose prolog was
        // stopped between the manager's answer and writing the id): queued behind the
        // job's lease, found by the epilog by the job's tag.
        let (stray, granted) = mgr_request(
            &mut f.hosts[0],
            &format!(
                "--gpus 1 --host 1 --priority 5 --duration 600 --pool slurm \
                 --tenant {ACCOUNT} --tag slurm-job-{id}"
            ),
        )?;
        let mut c = Checks::new("a request tagged for the job, not in its state file");
        c.eq("granted", false, granted);
        c.eq(
            "queued requests (hosts)",
            vec![1],
            queued_hosts(&mut f.hosts[0])?,
        );
        c.eq(
            "the hooks' state file",
            Some(vec![lease.0]),
            hook_state(&mut f.hosts[0], id)?,
        );
        c.finish()?;
        f.hosts[0].log_note(&format!("request {stray} tagged slurm-job-{id}, queued"));
        job_ends_without_manager(
            f,
            id,
            &lease,
            "ps | grep -q '[e]pilog-slurmctld'",
            "the epilog running, retrying its release",
        )?;
        start_manager(&mut f.hosts[0], None, true)?;
        f.hosts[0].log_note("pcifab-manager started again while the epilog retries");
        held_job_ends(f, id)?;

        // Down longer than the epilog tries (3 s here): the job completes with its lease
        // left in the hooks' state file, which the manager back does not change; the next
        // job's prolog (a job without GPUs) sweeps it.
        set_release_retry(&mut f.hosts[0], 3)?;
        let (id, lease) = held_job_running(f, g0, g1)?;
        job_ends_without_manager(
            f,
            id,
            &lease,
            &format!(
                "scontrol show job {id} | grep -q 'JobState=COMPLETED' && \
                 ! ps | grep -q '[e]pilog-slurmctld'"
            ),
            "the job COMPLETED, its epilog given up",
        )?;
        let h0 = &mut f.hosts[0];
        start_manager(h0, None, true)?;
        h0.log_note("pcifab-manager started again after the epilog gave up");
        crate::checks::expect_eq(
            "leases once the manager is back, before another hook runs",
            vec![lease.clone()],
            leases(h0)?,
        )?;
        let next = sbatch(h0, "-w h1 -o /tmp/slurm-next.out")?;
        wait_in(
            h0,
            &format!(
                "scontrol show job {next} | grep -q 'JobState=COMPLETED' && \
                 [ ! -e /var/spool/slurmctld/pcifab/{id} ] && \
                 pcifab leases --json | grep -q '\"leases\":\\[\\]'"
            ),
            120,
            "the next job COMPLETED, the lease of the ended job released and its state file gone",
            &format!("scontrol show job {next}; pcifab leases; ls -l /var/spool/slurmctld/pcifab; {CTLD_DIAG}"),
        )?;
        let mut c = Checks::new(&format!("job {next} (no GPUs) swept job {id}'s lease"));
        c.eq("leases", vec![], leases(h0)?);
        c.eq("queued requests", Vec::<u64>::new(), queued_hosts(h0)?);
        c.eq("the ended job's state file", None, hook_state(h0, id)?);
        c.finish()?;
        check_world(f, &Owners::new(), "the swept lease's GPUs back in the pool")
    })
}

/// Watches (in h0) that the manager's leases stay exactly `lease` until `secs` seconds after
/// `since` (seconds since the epoch, by h0's clock).
fn h0_watch_lease(h0: &mut Host, lease: &Lease, since: &str, secs: u32) -> Result<(), String> {
    let since: u64 = since
        .parse()
        .map_err(|_| format!("h0: `date +%s` printed {since:?}"))?;
    // The listing without its clock fields (`now`, `remaining_s`), which move.
    const LIST: &str = "pcifab leases --json | sed -E 's/\"(now|remaining_s)\":[0-9]*//g'";
    let want = h0.run_ok(LIST)?;
    let first = leases(h0)?;
    crate::checks::expect_eq("leases when the watch begins", vec![lease.clone()], first)?;
    h0.run_ok_timeout(
        &format!(
            "want=$(cat <<'PCIFAB_EOF'\n{}\nPCIFAB_EOF\n)\n\
             end=$(({since} + {secs}))\n\
             while [ $(date +%s) -le $end ]; do\n  \
               now=$({LIST})\n  \
               [ \"$now\" = \"$want\" ] || {{ echo \"the leases changed: $now\"; exit 1; }}\n  \
               sleep 0.5\n\
             done",
            want.trim()
        ),
        Duration::from_secs(u64::from(secs) + 60),
    )
    .map(|_| ())
    .map_err(|e| format!("h0: watching the job's lease after the restart: {e}"))
}

// ---- figures (`make bench`, Documentation/benchmarks.rst) --------------------------------

/// Jobs of each kind whose start times the overhead figure takes the median of.
pub const BENCH_JOBS: usize = 7;

/// The benchmark's job, run in h1: prints when its script starts, by h1's
/// `/proc/uptime` (busybox's date has no %N; 10 ms resolution), and ends.
const BENCH_JOB: &str = "#!/bin/sh\necho START $(cut -d' ' -f1 /proc/uptime)\n";
const BENCH_OUT: &str = "/tmp/slurm-bench.out";

/// pcifab's part of slurm.conf without the controller hooks: a node whose GPUs are its own,
/// as a site without pcifab has it (the task prolog stays, so both kinds of job run it).
fn static_conf() -> String {
    SLURM_CONF_PCIFAB
        .lines()
        .filter(|l| !l.starts_with("PrologSlurmctld=") && !l.starts_with("EpilogSlurmctld="))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// A number printed by a guest, e.g. `/proc/uptime`'s seconds.
fn secs_of(h: &str, what: &str, text: &str) -> Result<f64, String> {
    text.trim()
        .parse::<f64>()
        .map_err(|_| format!("{h}: {what}: expected seconds, got {text:?}"))
}

/// One 2-GPU job submitted in h1 to h1: the time (ms, by h1's clock) from just before
/// `sbatch` to the job's script running. Then waits until the job has ended, its epilog
/// (if any) has released its lease and the fabric is as `after` says.
fn timed_job(f: &mut Fabric, after: &Owners, step: &str) -> Result<f64, String> {
    let h1 = &mut f.hosts[1];
    let sub = h1.run_ok(&format!(
        "rm -f {BENCH_OUT}; t0=$(cut -d' ' -f1 /proc/uptime)\n\
         id=$(sbatch --parsable --gres=gpu:2 -w h1 -o {BENCH_OUT} /tmp/slurm-bench.sh) || exit 1\n\
         echo \"$t0 ${{id%%;*}}\""
    ))?;
    let mut w = sub.split_whitespace();
    let t0 = secs_of("h1", "the time before sbatch", w.next().unwrap_or(""))?;
    let id: u64 = w
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("h1: sbatch printed no job id: {sub:?}"))?;
    wait_in(
        h1,
        &format!("grep -q '^START ' {BENCH_OUT} 2>/dev/null"),
        120,
        "the benchmark job script starting",
        &format!("cat {BENCH_OUT}; tail -20 /var/log/slurm/slurmd.log"),
    )?;
    let start = h1.run_ok(&format!("sed -n 's/^START //p' {BENCH_OUT}"))?;
    let t1 = secs_of("h1", "the job's start", &start)?;
    // Ended, and the epilog (when there is one) done: the hooks' state file is gone.
    wait_in(
        &mut f.hosts[0],
        &format!(
            "[ \"$(squeue -h -t all -j {id} -o %T 2>/dev/null)\" = COMPLETED ] && \
             [ ! -e /var/spool/slurmctld/pcifab/{id} ]"
        ),
        120,
        "the benchmark job completed and its leases released",
        &format!("scontrol show job {id}; {CTLD_DIAG}"),
    )?;
    check_world(f, after, step)?;
    Ok((t1 - t0) * 1000.0)
}

/// The start times of the benchmark: `BENCH_JOBS` 2-GPU jobs on h1 holding no GPU (the
/// prolog has the manager compose both), then as many on h1 already holding both (bound by
/// a manager lease; Slurm without the controller hooks). Both by h1's clock.
pub struct StartTimes {
    pub composed_ms: Vec<f64>,
    pub held_ms: Vec<f64>,
}

fn start_times(f: &mut Fabric) -> Result<StartTimes, String> {
    let (g0, g1) = (pdfid(f, "gpu0")?, pdfid(f, "gpu1")?);
    let mut t = StartTimes {
        composed_ms: Vec::new(),
        held_ms: Vec::new(),
    };
    with_slurm(f, "whole", |f| {
        f.hosts[1].run_ok(&put("/tmp/slurm-bench.sh", "755", BENCH_JOB))?;
        for i in 0..BENCH_JOBS {
            let ms = timed_job(f, &Owners::new(), "a composed benchmark job ended")?;
            f.hosts[0].log_note(&format!("composed job {i}: {ms:.0} ms"));
            t.composed_ms.push(ms);
        }
        // The same node holding both GPUs for good: Slurm without the hooks.
        stop_slurm(f)?;
        let (lease, granted) = mgr_request(
            &mut f.hosts[0],
            "--gpus 2 --host 1 --priority 9 --duration 3600 --pool slurm",
        )?;
        crate::checks::expect_eq("the static lease granted at once", true, granted)?;
        let held = owners(&[(g0, 1), (g1, 1)]);
        check_world(f, &held, "both GPUs bound to h1 for the static jobs")?;
        start_slurm_with(f, &static_conf())?;
        for i in 0..BENCH_JOBS {
            let ms = timed_job(f, &held, "a benchmark job on the static node ended")?;
            f.hosts[0].log_note(&format!("static job {i}: {ms:.0} ms"));
            t.held_ms.push(ms);
        }
        f.hosts[0].run_ok(&format!("pcifab release {lease}"))?;
        Ok(())
    })?;
    Ok(t)
}

/// "slurm: bench: ..." (`make bench`, not `make test`): the start overhead of a composed
/// node, measured, and the trace utilisation it implies, computed (`slurm_trace`).
pub fn bench_figures(f: &mut Fabric) -> Result<(), String> {
    let t = start_times(f)?;
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let (c, h) = (
        crate::bench::median(&t.composed_ms),
        crate::bench::median(&t.held_ms),
    );
    let span = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lo, hi)
    };
    let ((cl, ch), (hl, hh)) = (span(&t.composed_ms), span(&t.held_ms));
    crate::say(&format!(
        "# Slurm: sbatch to the job's script running, {} 2-GPU jobs each on h1, by h1's clock \
         (ms): composed {} (median {c:.0}, {cl:.0}-{ch:.0}); held {} (median {h:.0}, \
         {hl:.0}-{hh:.0})",
        BENCH_JOBS,
        fmt(&t.composed_ms),
        fmt(&t.held_ms)
    ));
    let overhead = c - h;
    crate::say(&format!("bench slurm_start_ms_composed {c:.0}"));
    crate::say(&format!("bench slurm_start_ms_held {h:.0}"));
    crate::say(&format!(
        "bench slurm_compose_start_overhead_ms {overhead:.0} (spread {:.0} to {:.0}; goal <= 1000)",
        cl - hh,
        ch - hl
    ));
    // The trace charges each composed job the whole composed start time, before it runs
    // and again after it ends: an upper bound of the overhead (the held start time not
    // taken off), so that a noisy difference cannot flatter composition.
    let r = super::slurm_trace::replay_both(
        &super::slurm_trace::Cluster::BENCH,
        super::slurm_trace::SEED,
        c / 1000.0,
    );
    crate::say(&format!(
        "# Slurm trace ({} jobs, {} nodes, {} GPUs, one day computed, {c:.0} ms held idle \
         before and after each composed job): GPU busy fraction composed on demand {:.3}, \
         best static split {:?} {:.3}",
        r.jobs,
        super::slurm_trace::Cluster::BENCH.nodes,
        super::slurm_trace::Cluster::BENCH.gpus,
        r.on_demand,
        r.best_split,
        r.best_static
    ));
    crate::say(&format!(
        "bench slurm_trace_utilisation_vs_static {:.3} (goal >= 1.3)",
        r.on_demand / r.best_static
    ));
    Ok(())
}

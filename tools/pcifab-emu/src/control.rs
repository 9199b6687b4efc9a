// SPDX-License-Identifier: GPL-2.0-only
//! Control socket for tests: one request per line in, one JSON line out.
//!
//! Requests are a verb followed by whitespace-separated arguments, so
//! requests such as fault injection can be added as new verbs.

use crate::fabric::Fabric;
use crate::mep::Faults;
use crate::model::{self, PortKind, Requester};
use crate::p2p;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub fn serve(listener: UnixListener, fabric: Arc<Fabric>) {
    for stream in listener.incoming() {
        match stream {
            Ok(s) => {
                let fabric = Arc::clone(&fabric);
                std::thread::spawn(move || {
                    if let Err(e) = session(s, &fabric) {
                        debug!("control: session ended: {e}");
                    }
                });
            }
            Err(e) => error!("control: accept failed: {e}"),
        }
    }
}

fn session(stream: UnixStream, fabric: &Fabric) -> std::io::Result<()> {
    let mut out = stream.try_clone()?;
    for line in BufReader::new(stream).lines() {
        let reply = handle(&line?, fabric);
        out.write_all(reply.as_bytes())?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// Answer one request line with one line of JSON.
pub fn handle(line: &str, fabric: &Fabric) -> String {
    let mut words = line.split_whitespace();
    match (words.next(), words.next()) {
        (Some("ping"), None) => "{\"ok\":true}".into(),
        (Some("state"), None) => state(fabric),
        (Some(verb @ ("ping" | "state" | "fabric-change" | "invariants")), Some(_)) => {
            error(&format!("request '{verb}' takes no arguments"))
        }
        (Some("fabric-change"), None) => {
            let generation = fabric.fabric_change();
            format!("{{\"ok\":true,\"generation\":{generation}}}")
        }
        (Some("fault"), arg) => {
            let args: Vec<&str> = arg.into_iter().chain(words).collect();
            fault(&args, fabric).unwrap_or_else(|e| error(&e))
        }
        (Some("dmaep"), arg) => {
            let args: Vec<&str> = arg.into_iter().chain(words).collect();
            dmaep(&args, fabric).unwrap_or_else(|e| error(&e))
        }
        (Some("link"), arg) => {
            let args: Vec<&str> = arg.into_iter().chain(words).collect();
            link(&args, fabric).unwrap_or_else(|e| error(&e))
        }
        (Some("invariants"), None) => {
            let v: Vec<String> = fabric
                .model()
                .invariants()
                .iter()
                .map(|s| json_str(s))
                .collect();
            format!("{{\"ok\":true,\"violations\":[{}]}}", v.join(","))
        }
        (Some("bind"), arg) => {
            let args: Vec<&str> = arg.into_iter().chain(words).collect();
            bind(&args, fabric).unwrap_or_else(|e| error(&e))
        }
        (Some("unbind"), arg) => {
            let args: Vec<&str> = arg.into_iter().chain(words).collect();
            unbind(&args, fabric).unwrap_or_else(|e| error(&e))
        }
        (Some("telemetry"), arg) => {
            let args: Vec<&str> = arg.into_iter().chain(words).collect();
            telemetry(&args, fabric).unwrap_or_else(|e| error(&e))
        }
        (
            Some(
                verb @ ("routes" | "grants" | "dma-maps" | "p2p" | "mem-fill" | "mem-hash"
                | "memcpy-bench" | "dma-state" | "dma-arm" | "lies" | "reset-regs"),
            ),
            arg,
        ) => {
            let args: Vec<&str> = arg.into_iter().chain(words).collect();
            let r = match verb {
                "routes" => routes(&args, fabric),
                "grants" => grants(&args, fabric),
                "dma-maps" => dma_maps(&args, fabric),
                "p2p" => p2p_state(&args, fabric),
                "dma-state" => dma_state(&args, fabric),
                "dma-arm" => dma_arm(&args, fabric),
                "lies" => lies(&args, fabric),
                "reset-regs" => reset_regs(&args, fabric),
                "mem-fill" => mem_fill(&args, fabric),
                "memcpy-bench" => memcpy_bench(&args, fabric),
                _ => mem_hash(&args, fabric),
            };
            r.unwrap_or_else(|e| error(&e))
        }
        _ => error(&format!(
            "unknown request '{}'; try ping or state",
            line.trim()
        )),
    }
}

fn parse_num<T: TryFrom<u64>>(s: &str, what: &str) -> Result<T, String> {
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse::<u64>(),
    }
    .map_err(|_| format!("{what} '{s}' is not a number"))?;
    T::try_from(v).map_err(|_| format!("{what} {s} is out of range"))
}

const FAULT_USAGE: &str = "usage: fault <host|all> <mrpc-hang|mrpc-error RET|drop-irq|delay MS|bad-length|firmware-dead|no-enumerate|late-unbind-request|dma-delay MS|completion-delay US|hostile SEED|lie bind-status|event-code|event-count|unbind-request|dma-done|bind-other|gone|dma-mrpc off|on>, or fault clear [host|all]";

/// The outcome of a control bind/unbind as JSON.
fn bind_result(what: &str, ret: u32, ms: u128) -> Result<String, String> {
    if ret == 0 {
        Ok(format!("{{\"ok\":true,\"ret\":0,\"ms\":{ms}}}"))
    } else {
        Ok(format!(
            "{{\"ok\":false,\"error\":{},\"ret\":{ret},\"ms\":{ms}}}",
            json_str(&format!(
                "{what} failed: {} ({ret:#x})",
                model::ret_name(ret)
            ))
        ))
    }
}

/// `bind <pdfid>[,<pdfid>...] <host> <log_port>`, as the fabric manager:
/// several PDFIDs bind as one multi-function device (function i = i-th).
fn bind(args: &[&str], fabric: &Fabric) -> Result<String, String> {
    let [pdfids, host, lport] = args else {
        return Err("usage: bind <pdfid>[,<pdfid>...] <host> <log_port>".into());
    };
    let list: Vec<u16> = pdfids
        .split(',')
        .map(|p| parse_num(p, "pdfid"))
        .collect::<Result<_, _>>()?;
    if list.is_empty() || list.len() > model::MULTI_FUNC_NUM {
        return Err(format!(
            "give 1 to {} PDFIDs separated by commas",
            model::MULTI_FUNC_NUM
        ));
    }
    let pdfid = list[0];
    let lport: u8 = parse_num(lport, "logical port")?;
    let h = fabric
        .meps
        .iter()
        .position(|m| m.name == *host)
        .ok_or_else(|| format!("no host '{host}'"))?;
    let start = std::time::Instant::now();
    let what = if list.len() == 1 {
        format!("bind of {pdfid:#06x} to {host} logical port {lport}")
    } else {
        format!("bind of {pdfids} to {host} logical port {lport}")
    };
    let req = fabric
        .model()
        .begin_bind_group(Requester::Control, h, lport, &list);
    let ret = match req {
        Ok(req) => fabric.execute(req),
        Err(ret) => {
            note!(
                "{what} requested by control: {} ({ret:#x})",
                model::ret_name(ret)
            );
            ret
        }
    };
    bind_result(&what, ret, start.elapsed().as_millis())
}

/// `unbind <pdfid>`, as the fabric manager, from wherever it is bound.
fn unbind(args: &[&str], fabric: &Fabric) -> Result<String, String> {
    let [pdfid] = args else {
        return Err("usage: unbind <pdfid>".into());
    };
    let pdfid: u16 = parse_num(pdfid, "pdfid")?;
    let start = std::time::Instant::now();
    let what = format!("unbind of {pdfid:#06x}");
    let req = {
        let mut m = fabric.model();
        match m.function(pdfid).map(|f| f.binding) {
            None => Err(model::ERR_PHYC_PORT_NOT_EXIST),
            Some(None) => Err(model::ERR_LOGC_PORT_NOT_BIND_PHYC_PORT),
            Some(Some((h, l))) => m.begin_unbind(Requester::Control, h, l, pdfid),
        }
    };
    let ret = match req {
        Ok(req) => fabric.execute(req),
        Err(ret) => {
            note!(
                "{what} requested by control: {} ({ret:#x})",
                model::ret_name(ret)
            );
            ret
        }
    };
    bind_result(&what, ret, start.elapsed().as_millis())
}

/// `fault <host|all> <kind> [args]`, `fault clear [host|all]`.
fn fault(args: &[&str], fabric: &Fabric) -> Result<String, String> {
    let select = |who: &str| -> Result<Vec<usize>, String> {
        if who == "all" {
            return Ok((0..fabric.meps.len()).collect());
        }
        fabric
            .meps
            .iter()
            .position(|m| m.name == who)
            .map(|i| vec![i])
            .ok_or_else(|| format!("no host '{who}'; use a host name or all"))
    };
    if let [who, "dma-mrpc", state] = args {
        let on = match *state {
            "on" => true,
            "off" => false,
            _ => return Err(FAULT_USAGE.into()),
        };
        for i in select(who)? {
            fabric.meps[i].set_dma_mrpc(on);
        }
        return Ok("{\"ok\":true}".into());
    }
    type Apply = Box<dyn Fn(&mut Faults)>;
    let mut arm = None;
    let mut gone = false;
    let (targets, apply): (Vec<usize>, Apply) = match args {
        ["clear"] => (select("all")?, Box::new(clear_faults)),
        ["clear", who] | [who, "clear"] => (select(who)?, Box::new(clear_faults)),
        [who, "mrpc-hang"] => (select(who)?, Box::new(|f| f.hang = true)),
        [who, "mrpc-error", ret] => {
            let ret: u32 = parse_num(ret, "return code")?;
            (select(who)?, Box::new(move |f| f.error = Some(ret)))
        }
        [who, "drop-irq"] => (select(who)?, Box::new(|f| f.drop_irq = true)),
        [who, "delay", ms] => {
            let ms: u64 = parse_num(ms, "delay")?;
            if ms > 600_000 {
                return Err(format!("delay {ms} ms is too long; use at most 600000"));
            }
            (select(who)?, Box::new(move |f| f.delay_ms = ms))
        }
        [who, "bad-length"] => (select(who)?, Box::new(|f| f.bad_length = true)),
        [who, "firmware-dead"] => (select(who)?, Box::new(|f| f.dead = true)),
        [who, "no-enumerate"] => (select(who)?, Box::new(|f| f.no_enumerate = true)),
        [who, "late-unbind-request"] => (select(who)?, Box::new(|f| f.late_unbind_request = true)),
        [who, "dma-delay", ms] => {
            let ms: u64 = parse_num(ms, "DMA delay")?;
            if ms > 600_000 {
                return Err(format!("dma-delay {ms} ms is too long; use at most 600000"));
            }
            (select(who)?, Box::new(move |f| f.dma_delay_ms = ms))
        }
        [who, "completion-delay", us] => {
            let us: u64 = parse_num(us, "completion delay")?;
            if us > crate::config::MAX_COMPLETION_US {
                return Err(format!(
                    "completion-delay {us} us is too long; use at most {}",
                    crate::config::MAX_COMPLETION_US
                ));
            }
            (select(who)?, Box::new(move |f| f.completion_us = us))
        }
        [who, "lie", kind] => {
            let lie = crate::hostile::Lie::parse(kind).ok_or_else(|| {
                format!(
                    "unknown lie '{kind}'; use one of {}",
                    crate::hostile::Lie::ALL
                        .iter()
                        .map(|l| l.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?;
            (select(who)?, Box::new(move |f| f.lie = Some(lie)))
        }
        [who, "gone"] => {
            gone = true;
            (select(who)?, Box::new(|f| f.gone = true))
        }
        [who, "hostile", seed] => {
            let seed: u64 = parse_num(seed, "seed")?;
            arm = Some(seed);
            (select(who)?, Box::new(move |f| f.hostile = Some(seed)))
        }
        _ => return Err(FAULT_USAGE.into()),
    };
    for &i in &targets {
        if let Some(seed) = arm {
            fabric.meps[i].arm_hostile(seed);
        }
        fabric.meps[i].set_faults(|f| apply(f));
        if gone {
            fabric.meps[i].raise_gone();
        }
        info!(
            "{}: faults now [{}]",
            fabric.meps[i].name,
            fabric.meps[i].faults().names().join(", ")
        );
    }
    Ok("{\"ok\":true}".into())
}

/// `fault clear`: every fault off; the completion delay (a setting) stays.
fn clear_faults(f: &mut Faults) {
    *f = Faults {
        completion_us: f.completion_us,
        ..Faults::default()
    };
}

/// `link <phys_port> <up|down>`.
fn link(args: &[&str], fabric: &Fabric) -> Result<String, String> {
    let [port, state] = args else {
        return Err("usage: link <phys_port> <up|down>".into());
    };
    let port: u8 = parse_num(port, "port")?;
    let up = match *state {
        "up" => true,
        "down" => false,
        s => return Err(format!("link state '{s}' is neither up nor down")),
    };
    let changed = fabric.set_link(port, up)?;
    let generation = fabric.model().generation;
    Ok(format!(
        "{{\"ok\":true,\"changed\":{changed},\"generation\":{generation}}}"
    ))
}

/// `telemetry <pf_pdfid> <temp_centi> <power_mw> <utilisation>`.
fn telemetry(args: &[&str], fabric: &Fabric) -> Result<String, String> {
    let [pdfid, temp, power, util] = args else {
        return Err("usage: telemetry <pf_pdfid> <temp_centi> <power_mw> <utilisation>".into());
    };
    let pdfid: u16 = parse_num(pdfid, "pdfid")?;
    let temp: i32 = temp
        .parse()
        .map_err(|_| format!("temperature '{temp}' is not a number"))?;
    let power: u32 = parse_num(power, "power")?;
    let util: u8 = parse_num(util, "utilisation")?;
    if util > 100 {
        return Err(format!("utilisation {util} is not a percentage"));
    }
    let mut m = fabric.model();
    let e = m
        .function(pdfid)
        .filter(|f| f.vf_index == 0)
        .map(|f| f.endpoint)
        .ok_or_else(|| format!("no PF with pdfid {pdfid:#06x}"))?;
    let t = &mut m.endpoints[e].telemetry;
    t.temp_centi = temp;
    t.power_mw = power;
    t.utilisation = util;
    Ok("{\"ok\":true}".into())
}

/// The MEP index of host `name`.
fn host_index(fabric: &Fabric, name: &str) -> Result<usize, String> {
    fabric
        .meps
        .iter()
        .position(|m| m.name == name)
        .ok_or_else(|| format!("no host '{name}'"))
}

/// `routes <host>`: the P2P routes of that host's MEP.
fn routes(args: &[&str], fabric: &Fabric) -> Result<String, String> {
    let [host] = args else {
        return Err("usage: routes <host>".into());
    };
    let h = host_index(fabric, host)?;
    let m = fabric.model();
    let list: Vec<String> = m.hosts[h]
        .routes
        .iter()
        .map(|r| {
            let target = m
                .function(r.pdfid)
                .and_then(|f| f.binding)
                .map_or("null".into(), |b| json_str(&m.hosts[b.0].name));
            format!(
                "{{\"window_off\":{},\"size\":{},\"target_off\":{},\"pdfid\":{},\"target_host\":{target}}}",
                r.window_off, r.size, r.target_off, r.pdfid
            )
        })
        .collect();
    Ok(format!("{{\"ok\":true,\"routes\":[{}]}}", list.join(",")))
}

/// `grants [host]`: the P2P grants of the fabric, or those on functions
/// `host` holds or was granted, ascending (pdfid, grantee).
fn grants(args: &[&str], fabric: &Fabric) -> Result<String, String> {
    let only = match args {
        [] => None,
        [host] => Some(host_index(fabric, host)?),
        _ => return Err("usage: grants [host]".into()),
    };
    let m = fabric.model();
    let list: Vec<String> = m
        .grants
        .iter()
        .filter_map(|g| {
            let holder = m.function(g.pdfid)?.binding?.0;
            if only.is_some_and(|h| h != holder && h != g.grantee) {
                return None;
            }
            Some(format!(
                "{{\"pdfid\":{},\"holder\":{},\"grantee\":{}}}",
                g.pdfid,
                json_str(&m.hosts[holder].name),
                json_str(&m.hosts[g.grantee].name)
            ))
        })
        .collect();
    Ok(format!("{{\"ok\":true,\"grants\":[{}]}}", list.join(",")))
}

/// `dma-maps <host>`: the vfio-user DMA mappings of that host's MEP.
fn dma_maps(args: &[&str], fabric: &Fabric) -> Result<String, String> {
    let [host] = args else {
        return Err("usage: dma-maps <host>".into());
    };
    let h = host_index(fabric, host)?;
    let maps = fabric.meps[h].lock().dma.list();
    let list: Vec<String> = maps
        .iter()
        .map(|m| {
            format!(
                "{{\"iova\":{},\"size\":{},\"flags\":{},\"mmapped\":{}}}",
                m.iova, m.size, m.flags, m.mmapped
            )
        })
        .collect();
    Ok(format!("{{\"ok\":true,\"maps\":[{}]}}", list.join(",")))
}

/// `p2p <host>`: the P2P and DMA engine registers of that host's MEP.
fn p2p_state(args: &[&str], fabric: &Fabric) -> Result<String, String> {
    use crate::gas::*;
    let [host] = args else {
        return Err("usage: p2p <host>".into());
    };
    let h = host_index(fabric, host)?;
    let inner = fabric.meps[h].lock();
    let g = &inner.gas;
    let addr = u64::from(g.p2p(P2P_FAULT_ADDR_LO)) | u64::from(g.p2p(P2P_FAULT_ADDR_HI)) << 32;
    Ok(format!(
        "{{\"ok\":true,\"fault_count\":{},\"fault_addr\":{addr},\"dma_completed\":{},\"head\":{},\"tail\":{},\"status\":{},\"event_status\":{}}}",
        g.p2p(P2P_FAULT_COUNT),
        g.p2p(DMA_COMPLETED),
        g.p2p(DMA_HEAD),
        g.p2p(DMA_TAIL),
        g.p2p(DMA_STATUS),
        g.p2p(P2P_EVENT_STATUS)
    ))
}

/// `dma-state <host>`: what of that host's MEP can write to host memory: DMA MRPC and the
/// DMA engine, and the commands run while DMA MRPC pointed where `dma-arm` left it.
fn dma_state(args: &[&str], fabric: &Fabric) -> Result<String, String> {
    use crate::gas::*;
    let [host] = args else {
        return Err("usage: dma-state <host>".into());
    };
    let h = host_index(fabric, host)?;
    let inner = fabric.meps[h].lock();
    let g = &inner.gas;
    let mut mrpc_addr = [0u8; 8];
    g.read(MRPC_DMA_ADDR, &mut mrpc_addr)?;
    let mut en = [0u8; 4];
    g.read(MRPC_DMA_EN, &mut en)?;
    let ring = u64::from(g.p2p(DMA_RING_LO)) | u64::from(g.p2p(DMA_RING_HI)) << 32;
    Ok(format!(
        "{{\"ok\":true,\"mrpc_dma_on\":{},\"mrpc_dma_addr\":{},\"engine_on\":{},\
         \"engine_busy\":{},\"ring\":{ring},\"ring_size\":{},\"irq\":{},\
         \"stale_armed\":{},\"stale_commands\":{}}}",
        u32::from_le_bytes(en) & DMA_MRPC_EN != 0,
        u64::from_le_bytes(mrpc_addr),
        g.p2p(DMA_CTRL) & DMA_CTRL_ENABLE != 0,
        g.p2p(DMA_STATUS) & DMA_STATUS_BUSY != 0,
        g.p2p(DMA_RING_SIZE),
        g.p2p(DMA_IRQ),
        g.stale_dma.is_some() && g.dma_mrpc_target() == g.stale_dma,
        g.stale_dma_commands
    ))
}

/// `lies <host>`: the one-shot lies (`fault <host> lie <kind>`) that host's MEP told since
/// the emulator started, per kind, and the BAR0 writes it dropped while gone.
fn lies(args: &[&str], fabric: &Fabric) -> Result<String, String> {
    let [host] = args else {
        return Err("usage: lies <host>".into());
    };
    let mep = &fabric.meps[host_index(fabric, host)?];
    let told: Vec<String> = crate::hostile::Lie::ALL
        .iter()
        .zip(mep.lies_told())
        .map(|(l, n)| format!("\"{}\":{n}", l.name()))
        .collect();
    Ok(format!(
        "{{\"ok\":true,\"told\":{{{}}},\"gone_writes\":{}}}",
        told.join(","),
        mep.gone_writes.load(Ordering::Relaxed)
    ))
}

/// `reset-regs <host>`: the MEP's registers as a reset whose config space the host restored
/// leaves them.
fn reset_regs(args: &[&str], fabric: &Fabric) -> Result<String, String> {
    let [host] = args else {
        return Err("usage: reset-regs <host>".into());
    };
    fabric.meps[host_index(fabric, host)?].reset_regs();
    Ok("{\"ok\":true}".into())
}

/// Where `dma-arm` points DMA MRPC and the DMA engine: far above any guest's memory, so
/// nothing is mapped there and what the firmware writes is refused, not spread over RAM.
pub const STALE_DMA_ADDR: u64 = 0x4000_0000_0000;

/// `dma-arm <host>`: leaves DMA MRPC and the DMA engine of that host's MEP armed at
/// [`STALE_DMA_ADDR`], as a kernel that did not shut them down would (kexec).
fn dma_arm(args: &[&str], fabric: &Fabric) -> Result<String, String> {
    let [host] = args else {
        return Err("usage: dma-arm <host>".into());
    };
    let h = host_index(fabric, host)?;
    let mut inner = fabric.meps[h].lock();
    let (mrpc, engine) = inner.gas.arm_stale(STALE_DMA_ADDR);
    inner.gas.stale_dma_commands = 0;
    Ok(format!(
        "{{\"ok\":true,\"addr\":{STALE_DMA_ADDR},\"mrpc_dma\":{mrpc},\"engine\":{engine}}}"
    ))
}

/// The function device of a pdfid argument.
fn function_arg<'a>(
    fabric: &'a Fabric,
    pdfid: &str,
) -> Result<&'a crate::function::FnDevice, String> {
    let id: u16 = parse_num(pdfid, "pdfid")?;
    fabric
        .function_dev(id)
        .map(|f| &**f)
        .ok_or_else(|| format!("no function with pdfid {id:#06x}"))
}

/// `mem-fill <pdfid> <off> <len> <seed>`.
fn mem_fill(args: &[&str], fabric: &Fabric) -> Result<String, String> {
    let [pdfid, off, len, seed] = args else {
        return Err("usage: mem-fill <pdfid> <off> <len> <seed>".into());
    };
    let f = function_arg(fabric, pdfid)?;
    let off: u64 = parse_num(off, "offset")?;
    let len: u64 = parse_num(len, "length")?;
    let seed: u64 = parse_num(seed, "seed")?;
    p2p::mem_fill(f, off, len, seed)?;
    Ok("{\"ok\":true}".into())
}

/// `mem-hash <pdfid> <off> <len>`: FNV-1a 64 as 16 hex digits.
fn mem_hash(args: &[&str], fabric: &Fabric) -> Result<String, String> {
    let [pdfid, off, len] = args else {
        return Err("usage: mem-hash <pdfid> <off> <len>".into());
    };
    let f = function_arg(fabric, pdfid)?;
    let off: u64 = parse_num(off, "offset")?;
    let len: u64 = parse_num(len, "length")?;
    let h = p2p::mem_hash(f, off, len)?;
    Ok(format!("{{\"ok\":true,\"fnv1a64\":\"{h:016x}\"}}"))
}

/// `memcpy-bench <src_pdfid> <dst_pdfid> <bytes> [reps]`: the DMA engine's copy alone, from
/// offset 0 of one function's device memory to offset 0 of the other's, best of `reps`
/// (default 3).
fn memcpy_bench(args: &[&str], fabric: &Fabric) -> Result<String, String> {
    let (src, dst, bytes, reps) = match args {
        [s, d, b] => (s, d, b, None),
        [s, d, b, r] => (s, d, b, Some(r)),
        _ => return Err("usage: memcpy-bench <src_pdfid> <dst_pdfid> <bytes> [reps]".into()),
    };
    let src: u16 = parse_num(src, "pdfid")?;
    let dst: u16 = parse_num(dst, "pdfid")?;
    let bytes: u64 = parse_num(bytes, "bytes")?;
    let reps: u32 = reps.map_or(Ok(3), |r| parse_num(r, "reps"))?;
    let secs = p2p::memcpy_bench(&fabric.p2p, src, dst, bytes, reps)?;
    let mib_s = bytes as f64 / f64::from(1 << 20) / secs.max(1e-9);
    Ok(format!(
        "{{\"ok\":true,\"src\":{src},\"dst\":{dst},\"bytes\":{bytes},\"reps\":{reps},\
         \"chunk\":{},\"seconds\":{secs:.9},\"mib_s\":{mib_s:.1}}}",
        p2p::CHUNK
    ))
}

const DMAEP_USAGE: &str = "usage: dmaep <host> stats, or dmaep <host|all> <bad-status CODE|wrong-phase|drop-irq|short|stall|hostile SEED|cmd-hang|drop-events|clear>";

/// `dmaep`: the DMA endpoints' counters and injected faults.
fn dmaep(args: &[&str], fabric: &Fabric) -> Result<String, String> {
    use crate::dmaep::DmaFaults;
    if fabric.dmaeps.is_empty() {
        return Err("the fabric has no DMA endpoint; set dma_endpoint_channels".into());
    }
    let select = |who: &str| -> Result<Vec<usize>, String> {
        if who == "all" {
            return Ok((0..fabric.dmaeps.len()).collect());
        }
        fabric
            .meps
            .iter()
            .position(|m| m.name == who)
            .map(|i| vec![i])
            .ok_or_else(|| format!("no host '{who}'; use a host name or all"))
    };
    type Apply = Box<dyn Fn(&mut DmaFaults)>;
    let (who, apply): (&str, Apply) = match args {
        [who, "stats"] => {
            let [i] = select(who)?[..] else {
                return Err("dmaep stats takes one host".into());
            };
            let d = &fabric.dmaeps[i];
            let chans: Vec<String> = d
                .stats()
                .iter()
                .map(|c| {
                    format!(
                        "{{\"fetched\":{},\"bytes\":{},\"completions\":{},\"irqs\":{},\"enabled\":{},\"status\":{}}}",
                        c.fetched, c.bytes, c.completions, c.irqs, c.enabled, c.status
                    )
                })
                .collect();
            let faults: Vec<String> = d.faults().names().iter().map(|n| json_str(n)).collect();
            let f = d.fabric_stats();
            let bufs: Vec<String> = f
                .buffers
                .iter()
                .map(|(peer, index, b)| {
                    format!(
                        "{{\"peer\":{},\"index\":{index},\"addr\":{},\"size\":{}}}",
                        json_str(&fabric.meps[*peer].name),
                        b.addr,
                        b.size
                    )
                })
                .collect();
            return Ok(format!(
                "{{\"ok\":true,\"name\":{},\"connected\":{},\"faults\":[{}],\"channels\":[{}],\
                 \"completion_lies\":{},\"fabric\":{{\"hfid\":{},\"commands\":{},\"events\":{},\
                 \"rhis\":{},\"lies\":{},\"buffers\":[{}]}}}}",
                json_str(&d.name),
                d.connected.load(Ordering::Relaxed),
                faults.join(","),
                chans.join(","),
                d.completion_lies(),
                f.hfid,
                f.commands,
                f.events,
                f.rhis,
                f.lies,
                bufs.join(",")
            ));
        }
        [who, "clear"] => (who, Box::new(|f| *f = DmaFaults::default())),
        [who, "bad-status", code] => {
            let code: u32 = parse_num(code, "status code")?;
            if code == 0 {
                return Err("bad-status 0 is a good status; give a non-zero code".into());
            }
            (who, Box::new(move |f| f.bad_status = Some(code)))
        }
        [who, "wrong-phase"] => (who, Box::new(|f| f.wrong_phase = true)),
        [who, "drop-irq"] => (who, Box::new(|f| f.drop_irq = true)),
        [who, "short"] => (who, Box::new(|f| f.short = true)),
        [who, "stall"] => (who, Box::new(|f| f.stall = true)),
        [who, "cmd-hang"] => (who, Box::new(|f| f.cmd_hang = true)),
        [who, "drop-events"] => (who, Box::new(|f| f.drop_events = true)),
        [who, "hostile", seed] => {
            let seed: u64 = parse_num(seed, "seed")?;
            (who, Box::new(move |f| f.hostile = Some(seed)))
        }
        _ => return Err(DMAEP_USAGE.into()),
    };
    for i in select(who)? {
        fabric.dmaeps[i].set_faults(&apply);
    }
    Ok("{\"ok\":true}".into())
}

fn error(msg: &str) -> String {
    format!("{{\"ok\":false,\"error\":{}}}", json_str(msg))
}

fn state(fabric: &Fabric) -> String {
    let fw = &fabric.config.firmware;
    let firmware = format!(
        "{{\"device_id\":{},\"device_version\":{},\"revision\":{},\"fw_version\":{},\
         \"vendor_id\":{},\"product_id\":{},\"product_revision\":{},\"die_temp_centi\":{}}}",
        fw.device_id,
        fw.device_version,
        fw.revision,
        fw.fw_version,
        json_str(&fw.vendor_id),
        json_str(&fw.product_id),
        json_str(&fw.product_revision),
        fw.die_temp_centi
    );
    let hosts: Vec<String> = fabric
        .meps
        .iter()
        .map(|m| {
            format!(
                "{{\"name\":{},\"partition\":{},\"connected\":{},\"mrpc_commands\":{},\"irqs_fired\":{},\"ext_block_accesses\":{},\"bar_reads\":{},\"bar_writes\":{}}}",
                json_str(&m.name),
                m.partition,
                m.connected.load(Ordering::Relaxed),
                m.mrpc_commands.load(Ordering::Relaxed),
                m.irqs_fired.load(Ordering::Relaxed),
                m.ext_block_accesses.load(Ordering::Relaxed),
                m.bar_reads.load(Ordering::Relaxed),
                m.bar_writes.load(Ordering::Relaxed)
            )
        })
        .collect();
    let m = fabric.model();
    let ports: Vec<String> = m
        .ports
        .iter()
        .map(|p| {
            let (kind, owner) = match p.kind {
                PortKind::Host(h) => ("host", &m.hosts[h].name),
                PortKind::Endpoint(e) => ("endpoint", &m.endpoints[e].name),
            };
            format!(
                "{{\"port\":{},\"type\":\"{kind}\",\"name\":{},\"link\":\"{}\"}}",
                p.id,
                json_str(owner),
                if p.link_up { "up" } else { "down" }
            )
        })
        .collect();
    let functions: Vec<String> = m
        .functions
        .iter()
        .map(|f| {
            let (host, lport) = match f.binding {
                Some((h, l)) => (json_str(&m.hosts[h].name), l.to_string()),
                None => ("null".into(), "null".into()),
            };
            let ep = &fabric.config.endpoints[f.endpoint];
            let image = match fabric.images.get(f.endpoint).and_then(Option::as_ref) {
                Some(p) => format!(",\"image\":{}", json_str(&p.to_string_lossy())),
                None => String::new(),
            };
            format!(
                "{{\"pdfid\":{},\"pf_pdfid\":{},\"vf\":{},\"port\":{},\"kind\":\"{}\"{image},\"vid\":{},\"did\":{},\"class\":{},\"total_vfs\":{},\"bound\":{},\"host\":{host},\"logical_port\":{lport}}}",
                f.pdfid,
                f.pf_pdfid,
                f.vf_index,
                f.port,
                ep.kind.name(),
                f.vid,
                f.did,
                f.class,
                f.total_vfs,
                f.binding.is_some()
            )
        })
        .collect();
    let details: Vec<String> = fabric
        .meps
        .iter()
        .zip(&m.hosts)
        .map(|(mep, h)| {
            let faults: Vec<String> = mep.faults().names().iter().map(|n| json_str(n)).collect();
            let events: Vec<String> = h.events.iter().map(|e| json_str(&e.describe())).collect();
            let hs = mep.hostile_report();
            let hostile = match hs.seed {
                None => "null".to_owned(),
                Some(seed) => format!(
                    "{{\"seed\":{seed},\"on\":{},\"mrpc_replies\":{},\"register_reads\":{},\"dma_writebacks\":{},\"spurious_irqs\":{}}}",
                    mep.faults().hostile.is_some(),
                    hs.counts.mrpc_replies,
                    hs.counts.register_reads,
                    hs.counts.dma_writebacks,
                    hs.counts.spurious_irqs
                ),
            };
            format!(
                "{{\"name\":{},\"port\":{},\"faults\":[{}],\"events_pending\":[{}],\"event_overflow\":{},\"hostile\":{hostile}}}",
                json_str(&h.name),
                h.port,
                faults.join(","),
                events.join(","),
                h.overflow
            )
        })
        .collect();
    let owners: Vec<String> = m
        .functions
        .iter()
        .map(|f| {
            let (owner, lport) = match f.binding {
                Some((h, l)) => (json_str(&m.hosts[h].name), l.to_string()),
                None => ("null".into(), "null".into()),
            };
            let dev = fabric.function_dev(f.pdfid);
            format!(
                "{{\"pdfid\":{},\"owner\":{owner},\"logical_port\":{lport},\"busy\":{},\"in_qemu\":{},\"connected\":{},\"mem_bytes\":{},\"dev_mem_bytes\":{},\"scrubs\":{}}}",
                f.pdfid,
                f.op.is_some(),
                f.binding.is_some() && !f.phantom,
                dev.is_some_and(|d| d.connected.load(Ordering::Relaxed)),
                dev.map_or(0, |d| d.mem_size()),
                f.dev_mem,
                f.scrubs
            )
        })
        .collect();
    format!(
        "{{\"ok\":true,\"firmware\":{firmware},\"hosts\":[{}],\"generation\":{},\"ports\":[{}],\"functions\":[{}],\"host_state\":[{}],\"bindings\":[{}]}}",
        hosts.join(","),
        m.generation,
        ports.join(","),
        functions.join(","),
        details.join(","),
        owners.join(",")
    )
}

/// A JSON string literal.
pub fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn fabric() -> Fabric {
        let cfg =
            Config::parse("[[hosts]]\nname = \"h0\"\n[[hosts]]\nname = \"h1\"\n").expect("config");
        Fabric::new(cfg)
    }

    #[test]
    fn dmaep_requests() {
        let f = fabric();
        assert!(handle("dmaep h0 stats", &f).contains("no DMA endpoint"));
        let cfg = Config::parse(
            "dma_endpoint_channels = 2\n[[hosts]]\nname = \"h0\"\n[[hosts]]\nname = \"h1\"\n",
        )
        .expect("config");
        let f = Fabric::new(cfg);
        assert_eq!(f.dmaeps.len(), 2);
        assert_eq!(handle("dmaep all bad-status 0x2", &f), "{\"ok\":true}");
        assert_eq!(handle("dmaep h1 stall", &f), "{\"ok\":true}");
        assert_eq!(
            handle("dmaep h1 stats", &f),
            "{\"ok\":true,\"name\":\"dmaep-h1\",\"connected\":false,\"faults\":[\"bad-status 0x2\",\"stall\"],\"channels\":[{\"fetched\":0,\"bytes\":0,\"completions\":0,\"irqs\":0,\"enabled\":false,\"status\":0},{\"fetched\":0,\"bytes\":0,\"completions\":0,\"irqs\":0,\"enabled\":false,\"status\":0}],\"completion_lies\":0,\"fabric\":{\"hfid\":2562,\"commands\":0,\"events\":0,\"rhis\":0,\"lies\":0,\"buffers\":[]}}"
        );
        assert_eq!(handle("dmaep h1 clear", &f), "{\"ok\":true}");
        assert!(handle("dmaep h1 stats", &f).contains("\"faults\":[]"));
        assert!(handle("dmaep h0 stats", &f).contains("bad-status 0x2"));
        assert!(handle("dmaep h2 stall", &f).contains("no host 'h2'"));
        assert!(handle("dmaep h0 bad-status 0", &f).contains("non-zero"));
        assert!(handle("dmaep h0 bogus", &f).contains("usage: dmaep"));
        assert!(handle("dmaep all stats", &f).contains("one host"));
    }

    #[test]
    fn dma_arm_state_and_lies() {
        let f = fabric();
        let v = handle("dma-state h0", &f);
        assert!(
            v.contains("\"mrpc_dma_on\":false,\"mrpc_dma_addr\":0,\"engine_on\":false"),
            "{v}"
        );
        let v = handle("dma-arm h0", &f);
        assert!(v.contains("\"mrpc_dma\":true,\"engine\":true"), "{v}");
        let v = handle("dma-state h0", &f);
        assert!(
            v.contains(&format!(
                "\"mrpc_dma_on\":true,\"mrpc_dma_addr\":{STALE_DMA_ADDR},\"engine_on\":true"
            )),
            "{v}"
        );
        assert!(
            v.contains("\"stale_armed\":true,\"stale_commands\":0"),
            "{v}"
        );
        assert!(handle("dma-state", &f).contains("usage"));
        assert!(handle("dma-arm h9", &f).contains("\"ok\":false"));
        let v = handle("lies h0", &f);
        assert!(v.contains("\"bind-status\":0"), "{v}");
        assert!(v.contains("\"gone_writes\":0"), "{v}");
        assert_eq!(handle("fault h0 lie event-code", &f), "{\"ok\":true}");
        assert!(handle("state", &f).contains("\"lie event-code\""));
        assert!(handle("fault h0 lie nonsense", &f).contains("unknown lie"));
        assert_eq!(handle("fault h0 gone", &f), "{\"ok\":true}");
        assert!(handle("state", &f).contains("\"gone\""));
        assert_eq!(handle("fault clear h0", &f), "{\"ok\":true}");
    }

    #[test]
    fn requests() {
        let f = fabric();
        assert_eq!(handle("ping", &f), "{\"ok\":true}");
        assert_eq!(handle("  ping \r", &f), "{\"ok\":true}");
        let s = handle("state", &f);
        assert!(
            s.starts_with("{\"ok\":true,\"firmware\":{\"device_id\":16936,"),
            "{s}"
        );
        assert!(s.contains("\"product_id\":\"PAX 28XG4\""), "{s}");
        assert!(
            s.contains("{\"name\":\"h1\",\"partition\":1,\"connected\":false,\"mrpc_commands\":0,\"irqs_fired\":0,\"ext_block_accesses\":0,\"bar_reads\":0,\"bar_writes\":0}"),
            "{s}"
        );
        assert_eq!(
            handle("x", &f),
            "{\"ok\":false,\"error\":\"unknown request 'x'; try ping or state\"}"
        );
        assert!(handle("ping 1", &f).contains("takes no arguments"));
    }

    #[test]
    fn state_counts_the_hosts_bar_accesses() {
        use crate::mep::{REGION_BAR0, REGION_BAR4, REGION_CONFIG};
        let f = fabric();
        let m = &f.meps[0];
        let mut b = [0u8; 4];
        // Two BAR0 reads (the MRPC input buffer and the status), one BAR4 read, one BAR0
        // write of the input buffer (no command); config space is not a BAR.
        m.region_read(REGION_BAR0, 0, &mut b).unwrap();
        m.region_read(REGION_BAR0, crate::gas::MRPC_STATUS, &mut b)
            .unwrap();
        m.region_read(REGION_BAR4, 0, &mut b).unwrap();
        m.region_write(REGION_BAR0, 0, &[1, 2, 3, 4]).unwrap();
        m.region_read(REGION_CONFIG, 0, &mut b).unwrap();
        m.region_write(REGION_CONFIG, 0x4, &[0, 0]).unwrap();
        let s = handle("state", &f);
        assert!(
            s.contains("\"ext_block_accesses\":0,\"bar_reads\":3,\"bar_writes\":1}"),
            "{s}"
        );
        // The other host's counts are its own.
        assert!(
            s.contains("\"name\":\"h1\",\"partition\":1,\"connected\":false,\"mrpc_commands\":0,\"irqs_fired\":0,\"ext_block_accesses\":0,\"bar_reads\":0,\"bar_writes\":0}"),
            "{s}"
        );
    }

    #[test]
    fn fault_link_and_change_requests() {
        let f = fabric();
        assert_eq!(handle("fault h1 delay 50", &f), "{\"ok\":true}");
        assert_eq!(handle("fault all drop-irq", &f), "{\"ok\":true}");
        assert_eq!(handle("fault h0 mrpc-error 0x64006", &f), "{\"ok\":true}");
        let s = handle("state", &f);
        assert!(s.contains("\"faults\":[\"drop-irq\",\"delay 50\"]"), "{s}");
        assert!(s.contains("\"mrpc-error 0x64006\",\"drop-irq\""), "{s}");
        assert_eq!(handle("fault all hostile 0x2a", &f), "{\"ok\":true}");
        let s = handle("state", &f);
        assert!(s.contains("\"delay 50\",\"hostile 42\"]"), "{s}");
        assert!(s.contains("\"hostile\":{\"seed\":42,\"on\":true,\"mrpc_replies\":0,\"register_reads\":0,\"dma_writebacks\":0,\"spurious_irqs\":0}"), "{s}");
        assert_eq!(handle("fault clear h1", &f), "{\"ok\":true}");
        assert_eq!(f.meps[1].faults(), Faults::default());
        assert_eq!(handle("fault clear", &f), "{\"ok\":true}");
        assert_eq!(f.meps[0].faults(), Faults::default());
        for bad in [
            "fault",
            "fault h9 drop-irq",
            "fault h0 frob",
            "fault h0 delay x",
            "fault h0 delay 9999999",
            "fault h0 mrpc-error",
            "fault h0 hostile",
            "fault h0 hostile x",
            "fault h0 hostile 1 2",
            "link 1",
            "link 99 up",
            "link 300 up",
            "link 0 sideways",
            "fabric-change now",
            "telemetry 0x999 1 2 3",
            "telemetry 0x100 1 2 300",
        ] {
            assert!(handle(bad, &f).starts_with("{\"ok\":false,"), "{bad}");
        }
        assert_eq!(
            handle("link 1 down", &f),
            "{\"ok\":true,\"changed\":true,\"generation\":2}"
        );
        assert_eq!(
            handle("link 1 down", &f),
            "{\"ok\":true,\"changed\":false,\"generation\":2}"
        );
        assert_eq!(
            handle("fabric-change", &f),
            "{\"ok\":true,\"generation\":3}"
        );
        let s = handle("state", &f);
        assert!(s.contains("\"generation\":3,\"ports\":[{\"port\":0,\"type\":\"host\",\"name\":\"h0\",\"link\":\"up\"},{\"port\":1,\"type\":\"host\",\"name\":\"h1\",\"link\":\"down\"}]"), "{s}");
        assert!(
            s.contains("\"events_pending\":[\"host_link_down port 1\",\"database_changed\"]"),
            "{s}"
        );
    }

    #[test]
    fn escaping() {
        assert_eq!(json_str("a\"b\\c\n\u{1}"), "\"a\\\"b\\\\c\\n\\u0001\"");
    }
}

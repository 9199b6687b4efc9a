// SPDX-License-Identifier: GPL-2.0-only
//! Kernel splats in a guest's console log and error lines in the emulator's log.
//!
//! After every scenario the harness reads what each guest wrote to its console since the
//! previous check and what the emulator wrote to `emu.log`; a splat or an unexpected
//! emulator error fails the scenario (Documentation/testing.rst, "Kernel splats and
//! emulator errors"). There is no allow-list for splats.

/// Lines of a splat shown in a failure message and saved in `splats.log` (at most).
pub const SPLAT_LINES: usize = 40;

/// One report found in a console log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Splat {
    /// What kind of report (e.g. "KASAN", "lockdep", "hung task").
    pub kind: &'static str,
    /// Its first line and up to [`SPLAT_LINES`] - 1 lines after it.
    pub lines: Vec<String>,
}

impl Splat {
    pub fn first_line(&self) -> &str {
        self.lines.first().map_or("", String::as_str)
    }
}

/// Informational lines that share a prefix with reports; they are printed on every healthy
/// boot of the debug kernel and are not splats.
const DMA_API_INFO: &[&str] = &[
    "preallocated ",
    "debugging enabled by kernel config",
    "dma_debug_entry pool grown",
    "enable driver filter",
    "switching off dma-debug driver filter",
];
const ODEBUG_INFO: &[&str] = &["selftest passed", "active objects replaced"];

/// The kind of report a console line starts, if any. Matching is case-sensitive, as the
/// kernel prints these markers.
pub fn splat_kind(line: &str) -> Option<&'static str> {
    // The command line echo contains parameters such as `hung_task_panic=0`.
    if line.contains("Kernel command line:") {
        return None;
    }
    // A marker must start a word: `ODEBUG:` is no `BUG:`.
    let has = |s: &str| {
        line.match_indices(s).any(|(i, _)| {
            !s.starts_with(|c: char| c.is_ascii_alphanumeric())
                || !line[..i]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_ascii_alphanumeric())
        })
    };
    if has("KASAN:") {
        return Some("KASAN");
    }
    if has("UBSAN:") {
        return Some("UBSAN");
    }
    if has("BUG: workqueue lockup") {
        return Some("workqueue lockup");
    }
    if has("BUG: sleeping function called from invalid context") {
        return Some("sleeping function called from invalid context");
    }
    if has("BUG: soft lockup") {
        return Some("soft lockup");
    }
    const LOCKDEP: &[&str] = &[
        "trying to register non-static key",
        "possible circular locking dependency",
        "possible recursive locking",
        "inconsistent lock state",
        "suspicious RCU usage",
        "bad unlock balance",
        "lock held when returning",
        "possible irq lock inversion dependency",
        "held lock freed",
    ];
    if LOCKDEP.iter().any(|p| has(p)) {
        return Some("lockdep");
    }
    if has("list_add corruption") || has("list_del corruption") {
        return Some("list corruption");
    }
    if has("refcount_t:") {
        return Some("refcount");
    }
    if let Some(rest) = line.split_once("ODEBUG: ").map(|(_, r)| r) {
        if !ODEBUG_INFO.iter().any(|p| rest.contains(p)) {
            return Some("ODEBUG");
        }
    }
    if let Some(rest) = line.split_once("DMA-API: ").map(|(_, r)| r) {
        if !DMA_API_INFO.iter().any(|p| rest.starts_with(p)) {
            return Some("DMA-API");
        }
    }
    if has("general protection fault") {
        return Some("general protection fault");
    }
    if has("BUG:") {
        return Some("BUG");
    }
    if has("WARNING:") {
        return Some("WARNING");
    }
    if has("Oops") {
        return Some("Oops");
    }
    if has("INFO: task ") && has("blocked") && has(" for more than ") {
        return Some("hung task");
    }
    if has("hung_task:") {
        return Some("hung task");
    }
    if has("unreferenced object 0x") || has("new suspected memory leak") {
        return Some("kmemleak");
    }
    if has("panicked at") || has("rust_panic") {
        return Some("Rust panic");
    }
    if has("Kernel panic") {
        return Some("kernel panic");
    }
    if has("detected stalls on CPUs")
        || has("self-detected stall on CPU")
        || has("detected expedited stalls")
    {
        return Some("RCU stall");
    }
    None
}

/// Lines longer than this are cut in reports (a console line is rarely longer than 200).
const LINE_MAX: usize = 300;

fn cut(line: &str) -> String {
    if line.len() <= LINE_MAX {
        return line.to_string();
    }
    let mut end = LINE_MAX;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} [...]", &line[..end])
}

/// Every report in `text`: a line [`splat_kind`] recognises, with the lines after it up to
/// the kernel's `---[ end ...` marker, the next report's first line or [`SPLAT_LINES`]
/// lines in all.
pub fn find_splats(text: &str) -> Vec<Splat> {
    let lines: Vec<&str> = text.lines().map(|l| l.trim_end_matches('\r')).collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(kind) = splat_kind(lines[i]) else {
            i += 1;
            continue;
        };
        let mut end = (i + SPLAT_LINES).min(lines.len());
        for (k, l) in lines.iter().enumerate().take(end).skip(i + 1) {
            if l.contains("---[ end ") {
                end = k + 1;
                break;
            }
            if splat_kind(l).is_some() {
                end = k;
                break;
            }
        }
        out.push(Splat {
            kind,
            lines: lines[i..end].iter().map(|l| cut(l)).collect(),
        });
        i = end;
    }
    out
}

/// What an emulator line says, for the check after each scenario.
pub fn is_emu_error(line: &str) -> bool {
    // `pcifab-emu: error:` is the emulator's prefix for what a healthy run never shows;
    // `bad DMA range` is the message older emulators print without that prefix.
    line.contains("pcifab-emu: error:") || line.contains("bad DMA range")
}

/// Emulator error lines of `text` that no pattern of `expected` (substrings) covers.
pub fn unexpected_emu_errors<'a>(text: &'a str, expected: &[String]) -> Vec<&'a str> {
    text.lines()
        .filter(|l| is_emu_error(l))
        .filter(|l| !expected.iter().any(|p| l.contains(p.as_str())))
        .collect()
}

/// The new, complete lines of a growing log: `data` read from offset `seen`, returns the
/// text up to and including the last newline and the offset after it. With `all`, a last
/// line without a newline is taken too (the end of the run).
pub fn complete_part(data: &[u8], all: bool) -> (String, usize) {
    let n = if all {
        data.len()
    } else {
        data.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1)
    };
    (String::from_utf8_lossy(&data[..n]).into_owned(), n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A console log of the debug kernel: a healthy boot, then one report of every kind the
    /// harness must catch, each in the shape the kernel prints it.
    const CONSOLE: &str = r#"[    0.000000] Linux version 7.3.4 (pcifab@build) #1 SMP PREEMPT_DYNAMIC
[    0.000000] Kernel command line: console=ttyS0 panic=-1 pcifab_host=h0 kmemleak=on hung_task_panic=0 panic_on_warn=0
[    0.010000] kasan: KernelAddressSanitizer initialized (generic)
[    0.020000] Lock dependency validator: Copyright (c) 2006 Red Hat, Inc., Ingo Molnar
[    0.030000] ODEBUG: selftest passed
[    0.040000] DMA-API: preallocated 65536 debug entries
[    0.040001] DMA-API: debugging enabled by kernel config
[    0.050000] kmemleak: Kernel memory leak detector initialized (mem pool available: 15783)
[    0.060000] pcifab-init: host h0 up, starting /bin/pcifab-agent
[    1.000000] pcifab-harness: console mark 1
[   10.000000] ==================================================================
[   10.000001] BUG: KASAN: slab-use-after-free in pcifab_remove+0x1c/0x80 [pcifab]
[   10.000002] Read of size 8 at addr ffff888003a1c000 by task rmmod/123
[   10.000003] Call Trace:
[   10.000004]  <TASK>
[   10.000005]  kasan_report+0x8c/0xc0
[   10.000006]  </TASK>
[   10.000007] ==================================================================
[   11.000000] ------------[ cut here ]------------
[   11.000001] WARNING: CPU: 0 PID: 77 at drivers/misc/pcifab/mrpc.rs:120 pcifab::mrpc::run+0x40/0x90 [pcifab]
[   11.000002] Modules linked in: pcifab
[   11.000003] ---[ end trace 0000000000000000 ]---
[   12.000000] ======================================================
[   12.000001] WARNING: possible circular locking dependency detected
[   12.000002] 7.3.4 #1 Not tainted
[   12.000003] ------------------------------------------------------
[   13.000000] =============================
[   13.000001] WARNING: suspicious RCU usage
[   14.000000] ================================
[   14.000001] WARNING: inconsistent lock state
[   15.000000] =====================================
[   15.000001] WARNING: bad unlock balance detected!
[   16.000000] ================================================
[   16.000001] WARNING: lock held when returning to user space!
[   17.000000] ============================================
[   17.000001] WARNING: possible recursive locking detected
[   18.000000] INFO: task pcifab-selftes:201 blocked for more than 20 seconds.
[   18.000001]       Not tainted 7.3.4 #1
[   18.000002] "echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this message.
[   19.000000] BUG: workqueue lockup - pool cpus=0 node=0 flags=0x0 nice=0 stuck for 31s!
[   20.000000] DMA-API: pcifab 0000:01:00.1: device driver failed to check map error[device address=0x0000000001000000] [size=4096 bytes] [mapped as single]
[   21.000000] kmemleak: 2 new suspected memory leaks (see /sys/kernel/debug/kmemleak)
[   21.500000] unreferenced object 0xffff888003b2c000 (size 64):
[   22.000000] UBSAN: array-index-out-of-bounds in drivers/misc/pcifab/p2p.c:42:7
[   23.000000] rust_kernel: panicked at drivers/misc/pcifab/fabric.rs:88:9:
[   24.000000] list_add corruption. prev->next should be next (ffff888003a1c0a8), but was 0000000000000000.
[   25.000000] list_del corruption, ffff888003a1c0a8->next is LIST_POISON1 (dead000000000100)
[   26.000000] ODEBUG: free active (active state 0) object: ffff888003a1c000 object type: timer_list hint: pcifab_timeout+0x0/0x40 [pcifab]
[   27.000000] refcount_t: underflow; use-after-free.
[   28.000000] BUG: sleeping function called from invalid context at kernel/locking/mutex.c:580
[   29.000000] Oops: general protection fault, probably for non-canonical address 0xdffffc0000000001: 0000 [#1] PREEMPT SMP KASAN
[   30.000000] BUG: kernel NULL pointer dereference, address: 0000000000000008
[   31.000000] Kernel panic - not syncing: hung_task: blocked tasks
[   32.000000] BUG: soft lockup - CPU#0 stuck for 26s! [pcifab-selftes:300]
[   33.000000] rcu: INFO: rcu_preempt self-detected stall on CPU
[   33.500000] rcu: INFO: rcu_preempt detected expedited stalls on CPUs/tasks: { 1-... } 21003 jiffies s: 389 root: 0x2/.
[   33.600000] INFO: trying to register non-static key.
[   34.000000] pcifab-harness: console mark 2
"#;

    #[test]
    fn every_kind_is_found_and_healthy_boot_lines_are_not() {
        let s = find_splats(CONSOLE);
        let got: Vec<(&str, &str)> = s
            .iter()
            .map(|s| (s.kind, s.first_line().split_once("] ").map_or("", |x| x.1)))
            .collect();
        let want: Vec<(&str, &str)> = vec![
            ("KASAN", "BUG: KASAN: slab-use-after-free in pcifab_remove+0x1c/0x80 [pcifab]"),
            ("WARNING", "WARNING: CPU: 0 PID: 77 at drivers/misc/pcifab/mrpc.rs:120 pcifab::mrpc::run+0x40/0x90 [pcifab]"),
            ("lockdep", "WARNING: possible circular locking dependency detected"),
            ("lockdep", "WARNING: suspicious RCU usage"),
            ("lockdep", "WARNING: inconsistent lock state"),
            ("lockdep", "WARNING: bad unlock balance detected!"),
            ("lockdep", "WARNING: lock held when returning to user space!"),
            ("lockdep", "WARNING: possible recursive locking detected"),
            ("hung task", "INFO: task pcifab-selftes:201 blocked for more than 20 seconds."),
            ("workqueue lockup", "BUG: workqueue lockup - pool cpus=0 node=0 flags=0x0 nice=0 stuck for 31s!"),
            ("DMA-API", "DMA-API: pcifab 0000:01:00.1: device driver failed to check map error[device address=0x0000000001000000] [size=4096 bytes] [mapped as single]"),
            ("kmemleak", "kmemleak: 2 new suspected memory leaks (see /sys/kernel/debug/kmemleak)"),
            ("kmemleak", "unreferenced object 0xffff888003b2c000 (size 64):"),
            ("UBSAN", "UBSAN: array-index-out-of-bounds in drivers/misc/pcifab/p2p.c:42:7"),
            ("Rust panic", "rust_kernel: panicked at drivers/misc/pcifab/fabric.rs:88:9:"),
            ("list corruption", "list_add corruption. prev->next should be next (ffff888003a1c0a8), but was 0000000000000000."),
            ("list corruption", "list_del corruption, ffff888003a1c0a8->next is LIST_POISON1 (dead000000000100)"),
            ("ODEBUG", "ODEBUG: free active (active state 0) object: ffff888003a1c000 object type: timer_list hint: pcifab_timeout+0x0/0x40 [pcifab]"),
            ("refcount", "refcount_t: underflow; use-after-free."),
            ("sleeping function called from invalid context", "BUG: sleeping function called from invalid context at kernel/locking/mutex.c:580"),
            ("general protection fault", "Oops: general protection fault, probably for non-canonical address 0xdffffc0000000001: 0000 [#1] PREEMPT SMP KASAN"),
            ("BUG", "BUG: kernel NULL pointer dereference, address: 0000000000000008"),
            ("hung task", "Kernel panic - not syncing: hung_task: blocked tasks"),
            ("soft lockup", "BUG: soft lockup - CPU#0 stuck for 26s! [pcifab-selftes:300]"),
            ("RCU stall", "rcu: INFO: rcu_preempt self-detected stall on CPU"),
            ("RCU stall", "rcu: INFO: rcu_preempt detected expedited stalls on CPUs/tasks: { 1-... } 21003 jiffies s: 389 root: 0x2/."),
            ("lockdep", "INFO: trying to register non-static key."),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn a_report_keeps_its_lines_up_to_the_end_marker() {
        let s = find_splats(CONSOLE);
        // The KASAN report ends where the next report starts; the WARNING at `---[ end trace`.
        assert_eq!(s[0].lines.len(), 8);
        let w = &s[1];
        assert_eq!(w.lines.len(), 3);
        assert!(w.lines[2].contains("---[ end trace"));
        assert!(s[0].lines[1].contains("Read of size 8"));
        assert!(s[0].lines.len() <= SPLAT_LINES);
    }

    #[test]
    fn a_long_report_is_cut_at_forty_lines() {
        let mut text = String::from("[ 1.0] BUG: KASAN: out-of-bounds in x\n");
        for i in 0..100 {
            text.push_str(&format!("[ 1.0]  frame_{i}+0x0/0x10\n"));
        }
        text.push_str("[ 2.0] WARNING: CPU: 0 PID: 1 at x.c:1 f\n");
        let s = find_splats(&text);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].lines.len(), SPLAT_LINES);
        assert_eq!(s[1].kind, "WARNING");
    }

    #[test]
    fn healthy_lines_are_no_splats() {
        for l in [
            "[    0.000000] Kernel command line: console=ttyS0 panic=-1 hung_task_panic=0 panic_on_warn=0 kmemleak=on",
            "[    0.010000] kasan: KernelAddressSanitizer initialized (generic)",
            "[    0.030000] ODEBUG: selftest passed",
            "[    0.030000] ODEBUG: 12 of 12 active objects replaced",
            "[    0.040000] DMA-API: preallocated 65536 debug entries",
            "[    0.040001] DMA-API: debugging enabled by kernel config",
            "[    0.050000] kmemleak: Kernel memory leak detector initialized (mem pool available: 15783)",
            "[    0.050000] kmemleak: Automatic memory scanning thread started",
            "[    1.000000] pcifab-harness: console mark 3 after scenario 2",
            "[    1.000000] pcifab 0000:01:00.1: MEP bound, firmware 01.02",
        ] {
            assert_eq!(splat_kind(l), None, "{l}");
        }
    }

    #[test]
    fn emulator_errors_and_expected_patterns() {
        let log = "12.0 pcifab-emu: ready\n\
                   13.0 pcifab-emu: error: h0: DMA read outside every mapping at 0x1000\n\
                   14.0 mep-h0: DMA_UNMAP: bad DMA range 0x0+0x0\n\
                   15.0 pcifab-emu: note: h0: copy from unmapped IOVA 0x1000 refused\n";
        assert_eq!(
            unexpected_emu_errors(log, &[]),
            vec![
                "13.0 pcifab-emu: error: h0: DMA read outside every mapping at 0x1000",
                "14.0 mep-h0: DMA_UNMAP: bad DMA range 0x0+0x0"
            ]
        );
        assert_eq!(
            unexpected_emu_errors(log, &["outside every mapping".into()]),
            vec!["14.0 mep-h0: DMA_UNMAP: bad DMA range 0x0+0x0"]
        );
    }

    #[test]
    fn only_complete_lines_unless_at_the_end() {
        let (t, n) = complete_part(b"a\nb\nhalf", false);
        assert_eq!((t.as_str(), n), ("a\nb\n", 4));
        let (t, n) = complete_part(b"a\nb\nhalf", true);
        assert_eq!((t.as_str(), n), ("a\nb\nhalf", 8));
        assert_eq!(complete_part(b"no newline", false).1, 0);
    }
}

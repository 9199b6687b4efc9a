// SPDX-License-Identifier: GPL-2.0-only
//! Block-device checks of `pcifab-selftest`: seeded, per-block checksummed patterns written
//! and verified with direct I/O on a composed drive (or on its backing image, from the
//! machine that runs the test world), and a streaming writer for removal with I/O in flight.
//!
//! Every 4 KiB block holds a header and a payload:
//!
//! | bytes      | content                                                  |
//! |------------|----------------------------------------------------------|
//! | 0..8       | `PCIFABBK`                                               |
//! | 8..16      | the seed (u64 LE)                                        |
//! | 16..24     | the block's index on the device (u64 LE)                 |
//! | 24..32     | FNV-1a 64 of the u64 LE words of bytes 32..4096 (u64 LE) |
//! | 32..4096   | the stream of [`Rng`] seeded by (seed, index)            |
//!
//! so a block read back is either the expected one, zero, a whole block of another seed or
//! index (named in the report), or corrupt.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::Instant;

use super::args::Args;
use super::util::{check, errno_name, json_str, num, usage, Res, Rng};

pub const USAGE: &str = "\
  blk-write --dev PATH --seed S [--blocks N] [--chunk B]
        writes blocks 0..N (default: the whole device) with the pattern of SEED,
        direct I/O in chunks of B bytes (default 64K)
  blk-verify --dev PATH (--seed S | --zero) [--blocks N] [--acked A --old S2] [--buffered]
             [--p2pmem FILE]
        reads blocks 0..N back and checks each one: all must be SEED's (or zero);
        with --acked: blocks below A must be SEED's, the rest SEED's or S2's (the
        writes in flight when the drive went away); --buffered: no O_DIRECT (for
        an image file on a file system without it); --p2pmem: the O_DIRECT reads
        land in 64 KiB mapped from FILE (a device's sysfs p2pmem/allocate: PCI
        peer-to-peer memory), poisoned with 0xA5 before each read
  blk-stream --dev PATH --seed S --ack FILE [--chunk B]
        writes SEED's blocks from block 0 on, wrapping at the end, until a write
        fails; after every completed write FILE holds the number of blocks whose
        writes completed; prints that number, the error and how long the failing
        write took (the drive taken away must fail the writer, not hang it)
";

/// Bytes per pattern block.
pub const BLOCK: usize = 4096;
const MAGIC: &[u8; 8] = b"PCIFABBK";
const HDR: usize = 32;

/// FNV-1a over the block's 64-bit little-endian words (the payload is a whole number of
/// them), so the checksum costs an eighth of a byte-wise one in a slow guest.
fn fnv1a(b: &[u8]) -> u64 {
    b.chunks_exact(8).fold(0xcbf2_9ce4_8422_2325, |h, w| {
        let x = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
        (h ^ x).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Fills `b` (one block) with block `index` of `seed`'s pattern.
fn fill_block(b: &mut [u8], seed: u64, index: u64) {
    b[..8].copy_from_slice(MAGIC);
    b[8..16].copy_from_slice(&seed.to_le_bytes());
    b[16..24].copy_from_slice(&index.to_le_bytes());
    Rng::new(seed ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03)).fill(&mut b[HDR..]);
    let sum = fnv1a(&b[HDR..]);
    b[24..32].copy_from_slice(&sum.to_le_bytes());
}

/// What a block read back holds.
#[derive(Debug, PartialEq)]
enum Found {
    /// A whole block of some pattern: (seed, index).
    Block(u64, u64),
    Zero,
    Corrupt,
}

fn classify(b: &[u8]) -> Found {
    if b.iter().all(|&x| x == 0) {
        return Found::Zero;
    }
    let word = |r: std::ops::Range<usize>| u64::from_le_bytes(b[r].try_into().unwrap_or([0; 8]));
    if &b[..8] != MAGIC || word(24..32) != fnv1a(&b[HDR..]) {
        return Found::Corrupt;
    }
    let (seed, index) = (word(8..16), word(16..24));
    let mut want = vec![0u8; BLOCK];
    fill_block(&mut want, seed, index);
    if want == b {
        Found::Block(seed, index)
    } else {
        Found::Corrupt
    }
}

/// A block-aligned buffer for direct I/O: heap memory, or a shared mapping of a file
/// (`mapped`: unmapped on drop instead of freed).
struct Buf {
    ptr: *mut u8,
    len: usize,
    mapped: bool,
}

impl Buf {
    /// `len` bytes mapped shared, read-write, from offset 0 of `path` (a sysfs
    /// `p2pmem/allocate` file hands out peer-to-peer memory this way). The file is
    /// closed again; the mapping keeps the memory.
    fn map(path: &str, len: usize) -> Res<Buf> {
        use std::os::fd::AsRawFd;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| check(format!("cannot open {path}: {e}")))?;
        // SAFETY: a fresh shared mapping of `len` bytes (no fixed address) of an open file;
        // the result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            return Err(check(format!(
                "cannot map {len} bytes of {path}: {}",
                io_err(e)
            )));
        }
        Ok(Buf {
            ptr: ptr.cast(),
            len,
            mapped: true,
        })
    }

    fn new(len: usize) -> Res<Buf> {
        let layout = std::alloc::Layout::from_size_align(len, BLOCK)
            .map_err(|_| usage(format!("chunk of {len} bytes is not usable")))?;
        // SAFETY: `layout` has a non-zero size (callers pass at least one block).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(check(format!("cannot allocate {len} bytes")));
        }
        Ok(Buf {
            ptr,
            len,
            mapped: false,
        })
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `len` initialised bytes owned by this buffer.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        if self.mapped {
            // SAFETY: mapped in `map` with this length and not unmapped since.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
            return;
        }
        // SAFETY: allocated in `new` with this layout (valid there, so valid here).
        unsafe {
            std::alloc::dealloc(
                self.ptr,
                std::alloc::Layout::from_size_align_unchecked(self.len, BLOCK),
            )
        };
    }
}

fn open(path: &str, write: bool, direct: bool) -> Res<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(write);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path).map_err(|e| {
        check(format!(
            "cannot open {path}{}: {e}",
            if direct { " with O_DIRECT" } else { "" }
        ))
    })
}

/// Blocks on the device or file (its size / BLOCK).
fn device_blocks(f: &File, path: &str) -> Res<u64> {
    use std::io::{Seek, SeekFrom};
    let mut f = f;
    let end = f
        .seek(SeekFrom::End(0))
        .map_err(|e| check(format!("cannot find the size of {path}: {e}")))?;
    if end == 0 {
        return Err(check(format!("{path} has no blocks (size 0)")));
    }
    Ok(end / BLOCK as u64)
}

fn blocks_arg(a: &Args, have: u64, path: &str) -> Res<u64> {
    match a.get("blocks") {
        None => Ok(have),
        Some(v) => {
            let n = num("--blocks", v)?;
            if n == 0 || n > have {
                return Err(usage(format!(
                    "--blocks {n}: {path} has {have} blocks of {BLOCK} bytes; use 1 to {have}"
                )));
            }
            Ok(n)
        }
    }
}

fn chunk_arg(a: &Args) -> Res<usize> {
    let c = a.get("chunk").map_or(Ok(65536), |v| num("--chunk", v))?;
    if c == 0 || c % BLOCK as u64 != 0 || c > 16 << 20 {
        return Err(usage(format!(
            "--chunk {c}: use a multiple of {BLOCK} bytes up to 16 MiB"
        )));
    }
    Ok(c as usize)
}

fn io_err(e: std::io::Error) -> String {
    e.raw_os_error().map_or_else(|| e.to_string(), errno_name)
}

pub fn cmd_blk_write(args: &[String]) -> Res<()> {
    let a = Args::parse(args)?;
    let path = a.need("dev")?;
    let seed = num("--seed", a.need("seed")?)?;
    let f = open(path, true, true)?;
    let n = blocks_arg(&a, device_blocks(&f, path)?, path)?;
    let chunk = chunk_arg(&a)?;
    let per = (chunk / BLOCK) as u64;
    let mut buf = Buf::new(chunk)?;
    let t = Instant::now();
    let mut i = 0;
    while i < n {
        let k = per.min(n - i);
        let b = &mut buf.bytes()[..k as usize * BLOCK];
        for (j, blk) in b.chunks_mut(BLOCK).enumerate() {
            fill_block(blk, seed, i + j as u64);
        }
        f.write_all_at(b, i * BLOCK as u64).map_err(|e| {
            check(format!(
                "write of blocks {i}..{} of {path} failed: {}",
                i + k,
                io_err(e)
            ))
        })?;
        i += k;
    }
    f.sync_all()
        .map_err(|e| check(format!("flush of {path} failed: {}", io_err(e))))?;
    println!(
        "{{\"dev\":{},\"seed\":{seed},\"blocks\":{n},\"ms\":{}}}",
        json_str(path),
        t.elapsed().as_millis()
    );
    Ok(())
}

pub fn cmd_blk_verify(args: &[String]) -> Res<()> {
    // --zero and --buffered take no value.
    let args: Vec<String> = args
        .iter()
        .flat_map(|x| match x.as_str() {
            "--zero" | "--buffered" => vec![x.clone(), "1".into()],
            _ => vec![x.clone()],
        })
        .collect();
    let a = Args::parse(&args)?;
    let path = a.need("dev")?;
    let zero = a.get("zero").is_some();
    let seed = match (a.get("seed"), zero) {
        (Some(s), false) => Some(num("--seed", s)?),
        (None, true) => None,
        _ => return Err(usage("give exactly one of --seed S and --zero")),
    };
    let acked = a.get("acked").map(|v| num("--acked", v)).transpose()?;
    let old = a.get("old").map(|v| num("--old", v)).transpose()?;
    if acked.is_some() != old.is_some() || (acked.is_some() && seed.is_none()) {
        return Err(usage("--acked and --old go together, with --seed"));
    }
    let direct = a.get("buffered").is_none();
    let p2pmem = a.get("p2pmem");
    if p2pmem.is_some() && !direct {
        return Err(usage("--p2pmem reads with O_DIRECT; leave out --buffered"));
    }
    let f = open(path, false, direct)?;
    let n = blocks_arg(&a, device_blocks(&f, path)?, path)?;
    let per = (65536 / BLOCK) as u64;
    let mut buf = match p2pmem {
        Some(m) => Buf::map(m, 65536)?,
        None => Buf::new(65536)?,
    };
    let t = Instant::now();
    let (mut good, mut in_flight_old, mut bad) = (0u64, 0u64, 0u64);
    let mut first_bad: Vec<String> = Vec::new();
    let mut want = vec![0u8; BLOCK];
    let mut i = 0;
    while i < n {
        let k = per.min(n - i);
        let b = &mut buf.bytes()[..k as usize * BLOCK];
        if p2pmem.is_some() {
            // What is there after the read came from the read, not from before.
            b.fill(0xA5);
        }
        f.read_exact_at(b, i * BLOCK as u64).map_err(|e| {
            check(format!(
                "read of blocks {i}..{} of {path} failed: {}",
                i + k,
                io_err(e)
            ))
        })?;
        for (j, blk) in b.chunks(BLOCK).enumerate() {
            let idx = i + j as u64;
            // The expected block first (one pattern fill and a compare); what else it is
            // only when it is not.
            match seed {
                Some(s) => fill_block(&mut want, s, idx),
                None => want.fill(0),
            }
            if blk == want.as_slice() {
                good += 1;
                continue;
            }
            let found = classify(blk);
            let ok = match (seed, &found) {
                (None, Found::Zero) => true,
                (Some(s), Found::Block(fs, fi)) if *fs == s && *fi == idx => true,
                (Some(_), Found::Block(fs, fi))
                    if acked.is_some_and(|a| idx >= a) && Some(*fs) == old && *fi == idx =>
                {
                    in_flight_old += 1;
                    continue;
                }
                _ => false,
            };
            if ok {
                good += 1;
            } else {
                bad += 1;
                if first_bad.len() < 8 {
                    first_bad.push(match found {
                        Found::Zero => format!("block {idx}: zeros"),
                        Found::Corrupt => format!("block {idx}: corrupt"),
                        Found::Block(s, x) => format!("block {idx}: seed {s} block {x}"),
                    });
                }
            }
        }
        i += k;
    }
    println!(
        "{{\"dev\":{},\"blocks\":{n},\"good\":{good},\"old_after_acked\":{in_flight_old},\"bad\":{bad},\"p2pmem\":{},\"ms\":{}}}",
        json_str(path),
        p2pmem.map_or("null".to_string(), json_str),
        t.elapsed().as_millis()
    );
    if bad != 0 {
        let want = match (seed, acked) {
            (None, _) => "zeros".to_string(),
            (Some(s), None) => format!("seed {s}"),
            (Some(s), Some(a)) => format!("seed {s} below block {a}, seed {s} or {old:?} above"),
        };
        return Err(check(format!(
            "{bad} of {n} blocks of {path} are not {want}: {}",
            first_bad.join("; ")
        )));
    }
    Ok(())
}

pub fn cmd_blk_stream(args: &[String]) -> Res<()> {
    let a = Args::parse(args)?;
    let path = a.need("dev")?;
    let seed = num("--seed", a.need("seed")?)?;
    let ack_path = a.need("ack")?;
    let chunk = chunk_arg(&a)?;
    let f = open(path, true, true)?;
    let n = device_blocks(&f, path)?;
    let ack =
        File::create(ack_path).map_err(|e| check(format!("cannot create {ack_path}: {e}")))?;
    let per = (chunk / BLOCK) as u64;
    let mut buf = Buf::new(chunk)?;
    let t = Instant::now();
    let mut acked: u64 = 0;
    loop {
        let at = acked % n;
        let k = per.min(n - at);
        let b = &mut buf.bytes()[..k as usize * BLOCK];
        for (j, blk) in b.chunks_mut(BLOCK).enumerate() {
            fill_block(blk, seed, at + j as u64);
        }
        let w = Instant::now();
        if let Err(e) = f.write_all_at(b, at * BLOCK as u64) {
            println!(
                "{{\"dev\":{},\"acked_blocks\":{acked},\"error\":{},\"failed_write_ms\":{},\"ms\":{}}}",
                json_str(path),
                json_str(&io_err(e)),
                w.elapsed().as_millis(),
                t.elapsed().as_millis()
            );
            return Ok(());
        }
        acked += k;
        // A fixed-width record, so a reader never sees a shorter number's leftovers.
        let rec = format!("{acked:020}\n");
        ack.write_all_at(rec.as_bytes(), 0)
            .map_err(|e| check(format!("cannot record progress in {ack_path}: {e}")))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_classify() {
        let mut b = vec![0u8; BLOCK];
        assert_eq!(classify(&b), Found::Zero);
        fill_block(&mut b, 7, 42);
        assert_eq!(classify(&b), Found::Block(7, 42));
        let mut c = vec![0u8; BLOCK];
        fill_block(&mut c, 7, 43);
        assert_ne!(b[HDR..], c[HDR..]);
        b[1000] ^= 1;
        assert_eq!(classify(&b), Found::Corrupt);
    }
}

//! Memory and time of DWARF line/inline lookups: the streaming resolver
//! (`DwarfLines::frames`, `frames_many`) against addr2line's `Context`
//! (which keeps every unit it parsed), on `PROFCOL_BENCH_BINARY` (a large
//! Rust binary with debuginfo; default: this bench's own executable).
//!
//! Each mode runs in a process of its own (a fresh heap): resolve N
//! distinct addresses spread over the binary's functions, drop the
//! answers, `malloc_trim`, and print the anonymous memory (`RssAnon`)
//! retained against before the first lookup, with the time per address.
//! The `recurring` modes resolve N distinct addresses in only 200 of the
//! functions, one at a time, interleaved: what a profile's steady state
//! asks (new addresses, in functions sampled before), the streaming
//! resolver beside `Context`.
//!
//!     PROFCOL_BENCH_BINARY=target/release/profcol cargo bench -p profcol-elf --bench dwarf_memory

use std::process::Command;
use std::time::Instant;

const N: usize = 5_000;

extern "C" {
    fn malloc_trim(pad: usize) -> i32;
}

fn rss_anon_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines().find(|l| l.starts_with("RssAnon:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0)
}

fn trimmed_anon_kib() -> u64 {
    // SAFETY: glibc's malloc_trim only returns free heap pages to the kernel.
    unsafe { malloc_trim(0) };
    rss_anon_kib()
}

fn main() {
    let bin = std::env::var("PROFCOL_BENCH_BINARY")
        .unwrap_or_else(|_| std::env::current_exe().unwrap().to_string_lossy().into_owned());
    const MODES: [&str; 5] = ["context", "single", "batch", "recurring-context", "recurring"];
    let mode = std::env::args().nth(1).filter(|a| MODES.contains(&a.as_str()));
    let Some(mode) = mode else {
        // Parent: one child per mode.
        for mode in MODES {
            let out = Command::new(std::env::current_exe().unwrap()).arg(mode).output().expect("run child");
            print!("{}", String::from_utf8_lossy(&out.stdout));
            eprint!("{}", String::from_utf8_lossy(&out.stderr));
        }
        return;
    };
    let elf = profcol_elf::ElfFile::open(&std::fs::File::open(&bin).expect("open binary")).expect("ELF");
    let syms = elf.function_symbols();
    let funcs: Vec<(u64, u64)> = syms.iter().filter(|s| s.1 > 0).map(|s| (s.0, u64::from(s.1))).collect();
    // N addresses: the middle of every k-th function (spread over units).
    let k = (funcs.len() / N).max(1);
    let addrs: Vec<u64> = if mode.starts_with("recurring") {
        // 200 functions of at least 64 bytes, N / 200 offsets in each.
        let big: Vec<(u64, u64)> = funcs.iter().copied().filter(|f| f.1 >= 64).collect();
        let hot: Vec<(u64, u64)> = big.iter().step_by((big.len() / 200).max(1)).take(200).copied().collect();
        let per = (N / hot.len().max(1)) as u64;
        (0..per).flat_map(|j| hot.iter().map(move |&(a, size)| a + size * j / per)).collect()
    } else {
        funcs.iter().step_by(k).take(N).map(|&(a, size)| a + size / 2).collect()
    };
    let t = Instant::now();
    let lines = elf.dwarf_lines(1 << 30).expect("debug info");
    let load = t.elapsed();
    let before = trimmed_anon_kib();
    let t = Instant::now();
    let mut frames = 0usize;
    let reference;
    match mode.as_str() {
        "context" | "recurring-context" => {
            reference = lines.addr2line_reference();
            let r = reference.as_ref().expect("context");
            for &a in &addrs {
                frames += r.frames(a).len();
            }
        }
        "single" | "recurring" => {
            reference = None;
            for &a in &addrs {
                frames += lines.frames(a).len();
            }
        }
        _ => {
            reference = None;
            let mut q: Vec<_> = addrs.iter().map(|&a| (a, Vec::new())).collect();
            lines.frames_many(&mut q);
            frames = q.iter().map(|f| f.1.len()).sum();
        }
    }
    let took = t.elapsed();
    let after = trimmed_anon_kib();
    let (built, reused) = lines.unit_reads();
    println!(
        "{mode:>17}: {} addresses ({frames} frames, {} units; units read {built}, answered from windows {reused}) \
         in {:.1} ms = {:.1} us/address; anon retained {} KiB \
         (heap: index + decompressed sections + windows + kept units + unit maps {} KiB; load {:.0} ms; RssAnon {} -> {} KiB)",
        addrs.len(),
        lines.units(),
        took.as_secs_f64() * 1e3,
        took.as_secs_f64() * 1e6 / addrs.len() as f64,
        after.saturating_sub(before),
        lines.heap_bytes() / 1024,
        load.as_secs_f64() * 1e3,
        before,
        after,
    );
    drop(reference);
}

//! The streaming DWARF resolver against addr2line's `Context` (the same
//! answers, field for field) and against binutils' `addr2line -f -i`, on
//! C (gcc and clang, DWARF 4 and 5, -O2 with inlining) and Rust binaries
//! (the program's units DWARF 4 or 5, std's as shipped).

use super::open;
use crate::DwarfLines;
use std::path::{Path, PathBuf};
use std::process::Command;

const INLINED_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
static inline int sq(int x) { return x * x; }
static inline int add3(int a, int b, int c) { return sq(a) + sq(b) + c; }
static inline __attribute__((always_inline)) int deep3(int x) { return add3(x, x + 1, x + 2) ^ (x >> 3); }
static inline __attribute__((always_inline)) int deep2(int x) { int s = 0; for (int i = 0; i < x; i++) s += deep3(i + x); return s; }
static inline __attribute__((always_inline)) int deep1(int x) { return deep2(x) + deep2(x * 2); }
int table[64];
__attribute__((noinline)) int work(int n) { int s = 0; for (int i = 0; i < n; i++) { s += deep1(i); table[i & 63] = s; } return s; }
static int cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }
__attribute__((noinline)) void sortit(int n) { qsort(table, n < 64 ? n : 64, sizeof(int), cmp); }
int main(int argc, char **argv) { int n = argc > 1 ? atoi(argv[1]) : 10; int r = work(n); sortit(n); printf("%d %d\n", r, table[0]); return 0; }
"#;

/// binutils' addr2line; for LLVM's DWARF 5 output LLVM's own, as binutils
/// 2.40 leaves out some of its inlined subroutines (addr2line's Context,
/// the exact check, finds them too).
const BINUTILS: &str = "addr2line";
const LLVM: &str = "llvm-addr2line-16";

const RUST: &str = include_str!("../../../examples/workloads/deep_rust.rs");

fn build(dir: &Path, name: &str, src_name: &str, src: &str, cmd: &str, args: &[&str]) -> PathBuf {
    let file = dir.join(src_name);
    std::fs::write(&file, src).unwrap();
    let out = dir.join(name);
    let status = Command::new(cmd)
        .args(args)
        .arg("-o")
        .arg(&out)
        .arg(&file)
        .status()
        .unwrap_or_else(|e| panic!("run {cmd}: {e}"));
    assert!(status.success(), "building {name}");
    out
}

/// Up to `max` addresses: every byte of small functions, spread evenly
/// over the rest.
fn addresses(bin: &Path, max: usize) -> Vec<u64> {
    let syms = open(bin).function_symbols();
    let all: Vec<(u64, u64)> = syms.iter().filter(|s| s.1 > 0).map(|s| (s.0, u64::from(s.1))).collect();
    let bytes: u64 = all.iter().map(|s| s.1).sum();
    let stride = (bytes / max as u64).max(1);
    let mut out = Vec::new();
    let mut carry = 0;
    for (start, size) in all {
        let mut a = start + carry;
        while a < start + size {
            out.push(a);
            a += stride;
        }
        carry = a - (start + size);
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// `tool -a -f -i` (binutils' addr2line with `-C`, or LLVM's without: it
/// demangles legacy Rust names as C++): (function, file base name, line)
/// innermost first; `?` lines read as 0.
fn addr2line_tool(tool: &str, bin: &Path, addrs: &[u64]) -> Vec<Vec<(String, String, u32)>> {
    let mut out = Vec::new();
    for chunk in addrs.chunks(2000) {
        let o = Command::new(tool)
            .args(["-a", "-f", "-i"])
            .args((tool == BINUTILS).then_some("-C"))
            .arg("-e")
            .arg(bin)
            .args(chunk.iter().map(|a| format!("{a:#x}")))
            .output()
            .unwrap_or_else(|e| panic!("run {tool}: {e}"));
        assert!(o.status.success());
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        let mut lines = text.lines().peekable();
        while let Some(head) = lines.next() {
            assert!(head.starts_with("0x"), "{head}");
            let mut frames = Vec::new();
            while lines.peek().is_some_and(|l| !l.starts_with("0x")) {
                let function = lines.next().unwrap().to_owned();
                let loc = lines.next().expect("a location line");
                let (file, line) = loc.rsplit_once(':').unwrap();
                let line = line.split_whitespace().next().unwrap_or("").parse().unwrap_or(0);
                frames.push((function, base(file), line));
            }
            out.push(frames);
        }
    }
    assert_eq!(out.len(), addrs.len());
    out
}

fn base(p: &str) -> String {
    p.rsplit('/').next().unwrap_or(p).to_owned()
}

/// Checks `lines` on `addrs`: equal to addr2line's Context everywhere,
/// one address at a time and in one batch; equal to `tool` (an addr2line
/// program) wherever a unit names the address (binutils falls back to the
/// symbol table elsewhere). Returns how many addresses had inlined frames.
fn check(what: &str, bin: &Path, lines: &DwarfLines, addrs: &[u64], tool: &str) -> usize {
    let reference = lines.addr2line_reference().expect("addr2line context");
    let mut batch: Vec<_> = addrs.iter().rev().map(|&a| (a, Vec::new())).collect();
    lines.frames_many(&mut batch);
    batch.reverse();
    let ours: Vec<_> = addrs.iter().map(|&a| lines.frames(a)).collect();
    for ((&a, got), (_, batched)) in addrs.iter().zip(&ours).zip(&batch) {
        assert_eq!(*got, reference.frames(a), "{what} at {a:#x}: streaming vs addr2line's Context");
        assert_eq!(got, batched, "{what} at {a:#x}: batch vs one by one");
    }
    // The batch read each unit once; one by one, addresses were answered
    // from the windows it kept (C's sequences whose addresses go back and
    // forth excepted).
    let (reads, hits) = lines.unit_reads();
    assert!(
        hits * 2 >= addrs.len() as u64,
        "{what}: {hits} of {} lookups from windows ({reads} unit reads)",
        addrs.len()
    );
    // Every unit read again, now from its map (built on a unit's second
    // read): the same answers, batched and one at a time.
    lines.map_from_next_read();
    let mut mapped: Vec<_> = addrs.iter().map(|&a| (a, Vec::new())).collect();
    lines.frames_many(&mut mapped);
    lines.map_from_next_read();
    for ((&a, got), (_, m)) in addrs.iter().zip(&ours).zip(&mapped) {
        assert_eq!(got, m, "{what} at {a:#x}: unit map vs streaming, batched");
        assert_eq!(*got, lines.frames(a), "{what} at {a:#x}: unit map vs streaming, alone");
    }
    let (maps, map_bytes) = lines.unit_maps();
    assert!(maps > 0 && map_bytes > 0, "{what}: {maps} unit maps kept, {map_bytes} bytes");
    assert!(map_bytes <= 512 << 10, "{what}: unit maps within their bound: {map_bytes} bytes");
    let want = addr2line_tool(tool, bin, addrs);
    // Folded copies (several symbols, and subprograms, at one address):
    // which one names the code is arbitrary, in each tool.
    let nm = Command::new("nm").arg(bin).output().expect("run nm (binutils)");
    let mut starts: Vec<u64> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().and_then(|a| u64::from_str_radix(a, 16).ok()))
        .collect();
    starts.sort_unstable();
    let syms = open(bin).function_symbols();
    let folded = |a: u64| {
        let start = syms.lookup(a).map_or(0, |s| s.1);
        starts.partition_point(|&s| s <= start) - starts.partition_point(|&s| s < start) > 1
    };
    let (mut compared, mut inlined, mut differ) = (0, 0, Vec::new());
    for ((&a, got), want) in addrs.iter().zip(&ours).zip(want) {
        if got.is_empty() || got.iter().any(|f| f.function.is_none()) {
            continue;
        }
        compared += 1;
        inlined += usize::from(got.len() > 1);
        let got: Vec<_> = got
            .iter()
            .map(|f| {
                let name =
                    if tool == BINUTILS { f.function.as_ref() } else { f.mangled.as_ref().or(f.function.as_ref()) };
                (name.cloned().unwrap_or_default(), base(f.file.as_deref().unwrap_or("??")), f.line)
            })
            .collect();
        let same_but_outer_name = got.len() == want.len()
            && got.iter().zip(&want).rev().skip(1).all(|(g, w)| g == w)
            && got.last().map(|g| (&g.1, g.2)) == want.last().map(|w| (&w.1, w.2));
        if got != want && !(same_but_outer_name && folded(a)) {
            differ.push(format!("{a:#x}: ours {got:?}\n  binutils {want:?}"));
        }
    }
    assert!(compared * 2 > addrs.len(), "{what}: {compared} of {} addresses named", addrs.len());
    assert!(differ.is_empty(), "{what}: {} of {compared} differ from {tool}:\n{}", differ.len(), differ.join("\n"));
    inlined
}

#[test]
fn streaming_frames_equal_addr2line_context_and_binutils_for_c() {
    let dir = tempfile::tempdir().unwrap();
    for (name, cc, dwarf, tool) in [
        ("gcc4", "gcc", "-gdwarf-4", BINUTILS),
        ("gcc5", "gcc", "-gdwarf-5", BINUTILS),
        ("clang4", "clang-16", "-gdwarf-4", BINUTILS),
        ("clang5", "clang-16", "-gdwarf-5", LLVM),
    ] {
        let bin = build(dir.path(), name, "inl.c", INLINED_C, cc, &["-O2", dwarf]);
        let elf = open(&bin);
        let lines = elf.dwarf_lines(64 << 20).expect("debug info");
        let addrs = addresses(&bin, 5000);
        let inlined = check(name, &bin, &lines, &addrs, tool);
        assert!(inlined > 10, "{name}: {inlined} addresses inside inlined functions");
    }
}

#[test]
fn streaming_frames_equal_addr2line_context_and_binutils_for_rust() {
    let dir = tempfile::tempdir().unwrap();
    for (v, tool) in [("4", BINUTILS), ("5", LLVM)] {
        let name = format!("rust{v}");
        let version = format!("dwarf-version={v}");
        let args = ["-C", "opt-level=2", "-C", "debuginfo=2", "-C", &version];
        let bin = build(dir.path(), &name, "deep_rust.rs", RUST, "rustc", &args);
        let elf = open(&bin);
        let lines = elf.dwarf_lines(256 << 20).expect("debug info");
        assert!(lines.units() > 10, "std's units too");
        let addrs = addresses(&bin, 4000);
        let inlined = check(&name, &bin, &lines, &addrs, tool);
        assert!(inlined > 100, "{name}: {inlined} addresses inside inlined functions");
    }
}

/// The units kept parsed count in `heap_bytes` (what `cache.max_bytes`
/// bounds): their file tables and abbreviations, at most two units.
#[test]
fn kept_units_count_in_heap_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["-C", "opt-level=2", "-C", "debuginfo=2"];
    let bin = build(dir.path(), "rust", "deep_rust.rs", RUST, "rustc", &args);
    let elf = open(&bin);
    let lines = elf.dwarf_lines(256 << 20).expect("debug info");
    let before = lines.heap_bytes();
    assert_eq!(lines.kept_units(), (0, 0));
    // One at a time, over every unit: each new unit is read and kept.
    for a in addresses(&bin, 2000) {
        lines.frames(a);
    }
    let (kept, bytes) = lines.kept_units();
    assert_eq!(kept, 2, "two units kept");
    assert!(bytes < 4 << 20, "{bytes} bytes counted for {kept} kept units");
    assert!(bytes > 4096, "{bytes} bytes counted for {kept} kept units: their file tables and abbreviations");
    assert!(lines.heap_bytes() >= before + bytes, "heap_bytes counts the kept units");
}

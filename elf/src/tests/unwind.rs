//! Unwind tables against `readelf --debug-dump=frames-interp` (binutils'
//! own CFI interpreter) on binaries compiled here and on the system's libc.

use super::{gcc, open, strip};
use crate::unwind::{kind, rbp, Rule, UnwindTable};
use std::collections::HashSet;
use std::path::Path;
use std::process::Command;

const DEEP: &str = r#"
#include <stdio.h>
#include <stdlib.h>
volatile unsigned long sink;
__attribute__((noinline)) void deep_leaf(unsigned long n) { for (unsigned long i = 0; i < n; i++) sink += i * i; }
__attribute__((noinline)) void deep_mid(unsigned long n) { char buf[300]; snprintf(buf, sizeof buf, "%lu", n); deep_leaf(n + buf[0]); sink += buf[1]; }
__attribute__((noinline)) void deep_top(unsigned long n) { deep_mid(n); sink++; }
int main(int argc, char **argv) { deep_top(argc > 1 ? strtoul(argv[1], 0, 10) : 10); puts("done"); return 0; }
"#;

/// One row of readelf's interpreted CFI: address, CFA text, rbp and ra text.
struct ReadelfRow {
    loc: u64,
    cfa: String,
    rbp: String,
    ra: String,
}

/// Rows of every FDE whose CIE is not a signal trampoline's ("S").
fn readelf_rows(path: &Path) -> Vec<ReadelfRow> {
    let out =
        Command::new("readelf").arg("--debug-dump=frames-interp").arg(path).output().expect("run readelf (binutils)");
    // readelf 2.40 exits 1 on libc.so.6 with complete output and no message.
    assert!(!out.stdout.is_empty(), "readelf printed nothing for {}", path.display());
    let text = String::from_utf8_lossy(&out.stdout);
    let mut signal_cies = HashSet::new();
    let mut rows = Vec::new();
    let mut columns: Vec<String> = Vec::new();
    let mut skip = false;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.len() >= 5 && words[3] == "CIE" {
            if words[4].trim_matches('"').contains('S') {
                signal_cies.insert(words[0].to_owned());
            }
            skip = true; // the CIE's own rows are no addresses
            continue;
        }
        if words.len() >= 5 && words[3] == "FDE" {
            let cie = words[4].trim_start_matches("cie=");
            skip = signal_cies.contains(cie);
            continue;
        }
        if words.first() == Some(&"LOC") {
            columns = words.iter().map(|w| w.to_string()).collect();
            continue;
        }
        if skip || words.len() != columns.len() || words.len() < 2 || words[1] == "ZERO" {
            continue;
        }
        let Ok(loc) = u64::from_str_radix(words[0], 16) else { continue };
        let col = |name: &str| columns.iter().position(|c| c == name).map_or("u".to_owned(), |i| words[i].to_owned());
        rows.push(ReadelfRow { loc, cfa: words[1].to_owned(), rbp: col("rbp"), ra: col("ra") });
    }
    rows
}

fn expected_matches(r: &ReadelfRow, got: Rule) -> bool {
    if r.ra == "u" {
        return got.kind == kind::OUTERMOST;
    }
    if r.ra != "c-8" {
        return got.kind == kind::UNSUPPORTED;
    }
    let cfa_ok = match r.cfa.split_once('+') {
        Some(("rsp", n)) => got.kind == kind::CFA_RSP && n.parse() == Ok(got.cfa_offset),
        Some(("rbp", n)) => got.kind == kind::CFA_RBP && n.parse() == Ok(got.cfa_offset),
        _ if r.cfa == "exp" => got.kind == kind::PLT || got.kind == kind::UNSUPPORTED,
        _ => got.kind == kind::UNSUPPORTED,
    };
    if !cfa_ok {
        return false;
    }
    if got.kind == kind::UNSUPPORTED {
        return true;
    }
    match r.rbp.strip_prefix("c") {
        _ if r.rbp == "u" || r.rbp == "s" => got.rbp == rbp::SAME,
        Some(n) => n.parse::<i16>().ok() == Some(got.rbp_offset) && got.rbp == rbp::AT_CFA,
        None => got.rbp == rbp::UNKNOWN,
    }
}

/// Every readelf row agrees with the table and with its compact form; the
/// compact form is no bigger than the CFI it came from.
fn check_against_readelf(path: &Path) -> UnwindTable {
    let f = open(path);
    let (table, stats) = f.unwind_table().unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let compact = table.compact().unwrap();
    assert_streamed_is_compacted(&f, path);
    let rows = readelf_rows(path);
    assert!(rows.len() > 10, "{}: readelf shows rows", path.display());
    let mut plt = 0;
    for r in &rows {
        let got = table.rule_at(r.loc);
        assert!(
            expected_matches(r, got),
            "{} at {:#x}: readelf says CFA {} rbp {} ra {}, table {got:?}",
            path.display(),
            r.loc,
            r.cfa,
            r.rbp,
            r.ra
        );
        assert_eq!(compact.rule_at(r.loc), got, "compact form at {:#x}", r.loc);
        plt += usize::from(got.kind == kind::PLT);
    }
    // Between rows too (every address of the first 64 KiB of rows).
    let lo = table.rows[0].address;
    for a in lo..lo + 0x10000 {
        assert_eq!(compact.rule_at(a), table.rule_at(a), "compact form at {a:#x}");
    }
    assert!(
        compact.bytes() as u64 <= stats.cfi_bytes,
        "{}: {} table bytes for {} bytes of CFI",
        path.display(),
        compact.bytes(),
        stats.cfi_bytes
    );
    assert_eq!(stats.bad_fdes, 0, "{}", path.display());
    let _ = plt;
    table
}

/// The table built as its rows come (what the receiver loads) is the full
/// table compacted, with the same stats.
fn assert_streamed_is_compacted(f: &crate::ElfFile, what: &Path) {
    let (table, stats) = f.unwind_table().unwrap_or_else(|e| panic!("{}: {e}", what.display()));
    let (streamed, streamed_stats) = f.compact_unwind_table().unwrap_or_else(|e| panic!("{}: {e}", what.display()));
    assert_eq!(streamed_stats, stats, "{}", what.display());
    assert!(streamed == table.compact().unwrap(), "{}: the streamed compact table differs", what.display());
}

#[test]
fn streamed_tables_are_the_full_tables_compacted() {
    // This test binary: a Rust program with thousands of FDEs, some of
    // them spanning pages; and system binaries built by other compilers.
    let exe = std::env::current_exe().unwrap();
    let mut seen = 0;
    for p in
        [exe.as_path(), Path::new("/lib/x86_64-linux-gnu/libc.so.6"), Path::new("/lib/x86_64-linux-gnu/libstdc++.so.6")]
    {
        if p.exists() {
            assert_streamed_is_compacted(&open(p), p);
            seen += 1;
        }
    }
    assert!(seen >= 2, "the test binary and libc at least");
    let (table, stats) = open(&exe).unwind_table().unwrap();
    assert!(stats.fdes > 1000 && table.rows.len() > 10_000, "{stats:?}, {} rows", table.rows.len());
}

#[test]
fn tables_agree_with_readelf_on_compiled_programs() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [
        ("omitfp", &["-fomit-frame-pointer", "-fasynchronous-unwind-tables"][..]),
        ("fp", &["-fno-omit-frame-pointer", "-fasynchronous-unwind-tables"][..]),
        ("static", &["-fomit-frame-pointer", "-fasynchronous-unwind-tables", "-static"][..]),
    ] {
        let bin = gcc(dir.path(), name, DEEP, args);
        let table = check_against_readelf(&bin);
        let f = open(&bin);
        let (syms, _) = f.find_functions(&["deep_leaf", "deep_mid", "main", "_start"]);
        let [leaf, mid, main, start] = [0, 1, 2, 3].map(|i| syms[i].clone().expect("symbol"));
        // A frameless leaf: CFA = rsp + 8 at its first instruction.
        assert_eq!(table.rule_at(leaf.address).kind, kind::CFA_RSP, "{name}");
        assert_eq!(table.rule_at(leaf.address).cfa_offset, 8, "{name}");
        // deep_mid's 300-byte buffer: somewhere inside, CFA is far above rsp
        // (or rbp-based in the frame-pointer build).
        let inside: Vec<Rule> = (mid.address..mid.address + mid.size).map(|a| table.rule_at(a)).collect();
        if name == "fp" {
            assert!(inside.iter().any(|r| r.kind == kind::CFA_RBP && r.cfa_offset == 16), "{name}: {inside:?}");
            assert!(inside.iter().any(|r| r.rbp == rbp::AT_CFA && r.rbp_offset == -16), "{name}");
        } else {
            assert!(inside.iter().any(|r| r.kind == kind::CFA_RSP && r.cfa_offset > 300), "{name}: {inside:?}");
        }
        assert!(table.rule_at(main.address).kind == kind::CFA_RSP, "{name}");
        // _start marks the outermost frame (its return address is undefined).
        assert_eq!(table.rule_at(start.address + 1).kind, kind::OUTERMOST, "{name}");
        // Stripping keeps .eh_frame: the same table.
        assert_eq!(open(&strip(&bin)).unwind_table().unwrap().0, table, "{name}");
    }
}

#[test]
fn tables_agree_with_readelf_on_system_libraries() {
    for p in ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/sha256sum"] {
        let p = Path::new(p);
        if p.exists() {
            check_against_readelf(p);
        }
    }
}

#[test]
fn plt_entries_get_the_plt_rule() {
    // A lazy-binding PLT (-z lazy) has binutils' CFA expression.
    let dir = tempfile::tempdir().unwrap();
    let bin = gcc(dir.path(), "lazy", DEEP, &["-fasynchronous-unwind-tables", "-Wl,-z,lazy"]);
    let (table, _) = open(&bin).unwind_table().unwrap();
    let plt: Vec<_> = table.rows.iter().filter(|r| r.rule.kind == kind::PLT).collect();
    assert!(!plt.is_empty(), "a PLT row");
    for r in plt {
        assert!(r.rule.cfa_offset == 11 || r.rule.cfa_offset == 10, "{r:?}");
    }
}

#[test]
fn debug_frame_is_read_when_eh_frame_is_absent() {
    let dir = tempfile::tempdir().unwrap();
    let bin = gcc(
        dir.path(),
        "dbg",
        DEEP,
        &["-fomit-frame-pointer", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables", "-g", "-static"],
    );
    let f = open(&bin);
    let (syms, _) = f.find_functions(&["deep_mid"]);
    let mid = syms[0].clone().unwrap();
    let (table, stats) = f.unwind_table().unwrap();
    assert!(stats.cfi_bytes > 0);
    let inside: Vec<Rule> = (mid.address..mid.address + mid.size).map(|a| table.rule_at(a)).collect();
    assert!(inside.iter().any(|r| r.kind == kind::CFA_RSP && r.cfa_offset > 300), "{inside:?}");
}

#[test]
fn truncated_and_garbled_cfi_is_no_panic() {
    let dir = tempfile::tempdir().unwrap();
    let bin = std::fs::read(gcc(dir.path(), "g", DEEP, &["-fasynchronous-unwind-tables"])).unwrap();
    let f = crate::ElfFile::from_vec(bin.clone()).unwrap();
    assert!(f.unwind_table().is_ok());
    // Flip bytes all over the file: errors or tables, never a panic.
    for step in [7usize, 13, 101] {
        let mut bad = bin.clone();
        let mut i = 0x40;
        while i < bad.len() {
            bad[i] ^= 0x5a;
            i += step * 37;
        }
        if let Ok(f) = crate::ElfFile::from_vec(bad) {
            // Both builds agree on garbage too: the same table or an error.
            match (f.unwind_table().map(|(t, _)| t.compact()), f.compact_unwind_table()) {
                (Ok(Ok(full)), Ok((streamed, _))) => assert!(streamed == full, "step {step}"),
                (Ok(Err(_)), Err(_)) | (Err(_), Err(_)) => {}
                (full, streamed) => panic!("step {step}: full {:?}, streamed {:?}", full.is_ok(), streamed.is_ok()),
            }
        }
    }
    for cut in [64, 1000, bin.len() / 2] {
        if let Ok(f) = crate::ElfFile::from_vec(bin[..cut].to_vec()) {
            let _ = f.unwind_table();
        }
    }
}

#[test]
fn signal_trampolines_get_the_signal_rule() {
    // glibc's __restore_rt (linked in statically): CFA = *(rsp + 160),
    // rip at rsp + 168, rbp at rsp + 120 (offsets into the ucontext).
    let dir = tempfile::tempdir().unwrap();
    let bin = gcc(dir.path(), "static", DEEP, &["-static"]);
    let f = open(&bin);
    let (syms, _) = f.find_functions(&["__restore_rt"]);
    let restore = syms[0].clone().expect("__restore_rt in a static glibc binary");
    let (table, _) = f.unwind_table().unwrap();
    let want = Rule { kind: kind::SIGNAL, rbp: rbp::SAME, rbp_offset: 120, cfa_offset: 160 };
    // The FDE starts one byte early: a handler's return address minus 1.
    for a in [restore.address - 1, restore.address, restore.address + 8] {
        assert_eq!(table.rule_at(a), want, "at {a:#x}");
        assert_eq!(table.compact().unwrap().rule_at(a), want);
    }
}

#[test]
fn go_binaries_walk_code_without_eh_frame_by_frame_pointers() {
    // C standing in for a cgo binary: its code has only .debug_frame (as Go
    // code does), the C start files have .eh_frame.
    let go_note = r#"
struct go_note { unsigned namesz, descsz, type; char name[4]; char desc[12]; };
__attribute__((section(".note.go.buildid"), aligned(4), used))
static const struct go_note go_note = { 3, 12, 4, "Go", "abc/def-GHI_" };
"#;
    let dir = tempfile::tempdir().unwrap();
    let flags = ["-fomit-frame-pointer", "-g", "-static"];
    let plain = open(&gcc(dir.path(), "plain", DEEP, &flags));
    let go = open(&gcc(dir.path(), "go", &format!("{DEEP}{go_note}"), &flags));
    let mid = |f: &crate::ElfFile| f.find_functions(&["deep_mid"]).0[0].clone().unwrap();
    let (plain_table, plain_stats) = plain.unwind_table().unwrap();
    let (go_table, go_stats) = go.unwind_table().unwrap();
    assert!(!plain_stats.go && go_stats.go);
    assert_streamed_is_compacted(&go, Path::new("go"));
    let m = mid(&plain);
    assert!((m.address..m.address + m.size).any(|a| plain_table.rule_at(a).kind == kind::CFA_RSP));
    let m = mid(&go);
    for a in m.address..m.address + m.size {
        assert_eq!(go_table.rule_at(a), Rule::FRAME_POINTER, "Go code at {a:#x}: frame pointers, not .debug_frame");
    }
    // .eh_frame's FDEs keep their rules; outside the executable segments
    // there is no info.
    let (syms, _) = go.find_functions(&["_start"]);
    let start = syms[0].clone().unwrap();
    assert_eq!(go_table.rule_at(start.address + 1).kind, kind::OUTERMOST);
    assert_eq!(go_table.rule_at(0).kind, kind::NO_INFO);
    assert_eq!(go_table.rows.last().map(|r| r.rule), Some(Rule::NO_INFO), "the end marker");
    let compact = go_table.compact().unwrap();
    assert_eq!(compact.rule_at(m.address), Rule::FRAME_POINTER);
}

#[test]
fn go_asmcgocall_gets_the_cgo_call_rule() {
    // Go 1.19's runtime.asmcgocall around its call into C: saves g at
    // 0x30(%rsp) and the depth at 0x28(%rsp), then `call *%rax`.
    let asm = r#"
__asm__(".text\n.globl runtime.asmcgocall.abi0\n.type runtime.asmcgocall.abi0,@function\n"
        "runtime.asmcgocall.abi0:\n"
        "mov 0x8(%rsp),%rax\nmov 0x10(%rsp),%rbx\nmov %rsp,%rdx\n"
        "sub $0x40,%rsp\nand $-16,%rsp\n"
        ".byte 0x48,0x89,0x7c,0x24,0x30\n"
        ".byte 0x48,0x8b,0x7f,0x08\n.byte 0x48,0x29,0xd7\n"
        ".byte 0x48,0x89,0x7c,0x24,0x28\n"
        "mov %rbx,%rdi\nmov %rbx,%rcx\n"
        "asmcgocall_call:\ncall *%rax\n"
        "mov 0x30(%rsp),%rdi\nret\n"
        ".size runtime.asmcgocall.abi0, .-runtime.asmcgocall.abi0\n");
struct go_note { unsigned namesz, descsz, type; char name[4]; char desc[12]; };
__attribute__((section(".note.go.buildid"), aligned(4), used))
static const struct go_note go_note = { 3, 12, 4, "Go", "abc/def-GHI_" };
"#;
    let dir = tempfile::tempdir().unwrap();
    let f = open(&gcc(dir.path(), "cgo", &format!("{DEEP}{asm}"), &["-static"]));
    let (syms, _) = f.find_functions(&["runtime.asmcgocall.abi0"]);
    let fun = syms[0].clone().unwrap();
    let (table, stats) = f.unwind_table().unwrap();
    assert!(stats.go);
    let call = (fun.address..fun.address + fun.size)
        .find(|&a| table.rule_at(a).kind == kind::GO_CGO_CALL)
        .expect("a cgo-call row");
    let want = Rule { kind: kind::GO_CGO_CALL, rbp: rbp::SAME, rbp_offset: 0x28, cfa_offset: 0x30 };
    // The call instruction's two bytes (a return address minus 1 is the second).
    assert_eq!((table.rule_at(call), table.rule_at(call + 1)), (want, want));
    assert_eq!(table.rule_at(call + 2), Rule::FRAME_POINTER);
    assert_eq!(table.rule_at(call - 1), Rule::FRAME_POINTER);
    assert_eq!(table.compact().unwrap().rule_at(call + 1), want);
}

//! Tests against binaries compiled here with gcc (PIE, non-PIE, stripped,
//! versioned, a Go build-id note) and against real files on the machine.

use super::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `marker` compiles to `mov $0x12345678,%eax; ret`: the bytes at the
/// symbol's file offset prove the offset right.
const MARKER_CODE: [u8; 6] = [0xb8, 0x78, 0x56, 0x34, 0x12, 0xc3];

const PROGRAM: &str = r#"
int marker(void) { return 0x12345678; }
struct go_note { unsigned namesz, descsz, type; char name[4]; char desc[12]; };
__attribute__((section(".note.go.buildid"), aligned(4), used))
static const struct go_note go_note = { 3, 12, 4, "Go", "abc/def-GHI_" };
int main(void) { return marker() == 0; }
"#;

const VERSIONED: &str = r#"
int real_foo(void) { return 0x12345678; }
__asm__(".symver real_foo,foo@@VERS_1");
"#;

fn gcc(dir: &Path, name: &str, src: &str, args: &[&str]) -> PathBuf {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, src).unwrap();
    let out = dir.join(name);
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-O2", "-fcf-protection=none", "-fno-asynchronous-unwind-tables", "-Wl,--build-id"])
        .args(args)
        .arg("-o")
        .arg(&out)
        .arg(&c)
        .status()
        .expect("run cc (install gcc)");
    assert!(status.success(), "compiling {name}");
    out
}

fn strip(path: &Path) -> PathBuf {
    let out = path.with_extension("stripped");
    let status = Command::new("strip").arg("-o").arg(&out).arg(path).status().expect("run strip (binutils)");
    assert!(status.success());
    out
}

fn open(path: &Path) -> ElfFile {
    ElfFile::open(&File::open(path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn code_at(path: &Path, offset: u64) -> Vec<u8> {
    std::fs::read(path).unwrap()[offset as usize..offset as usize + MARKER_CODE.len()].to_vec()
}

#[test]
fn symbol_offsets_for_pie_and_non_pie() {
    let dir = tempfile::tempdir().unwrap();
    for (name, args) in [("pie", &["-fPIE", "-pie"][..]), ("nopie", &["-fno-PIE", "-no-pie"][..])] {
        let bin = gcc(dir.path(), name, PROGRAM, args);
        let f = open(&bin);
        let (found, tables) = f.find_functions(&["marker", "absent", "main"]);
        assert!(tables.symtab > 0, "{name}: unstripped binary has .symtab");
        let m = found[0].clone().unwrap_or_else(|| panic!("{name}: marker found"));
        assert!(found[1].is_none());
        assert!(found[2].is_some());
        assert_eq!(m.name, "marker");
        assert_eq!(code_at(&bin, m.file_offset), MARKER_CODE, "{name}: bytes at the file offset");
        assert_eq!(f.file_offset(m.address), Some(m.file_offset));
        if name == "nopie" {
            // Non-PIE code is linked at 0x400000 and up: address != offset.
            assert!(m.address >= 0x400000 && m.address != m.file_offset, "{m:?}");
        }
        assert_eq!(f.gnu_build_id().map(|b| b.len()), Some(20), "{name}: build id");
        assert_eq!(f.go_build_id(), Some("abc/def-GHI_"));
    }
}

#[test]
fn stripped_binary_keeps_build_id_and_dynsym_only() {
    let dir = tempfile::tempdir().unwrap();
    let bin = gcc(dir.path(), "prog", PROGRAM, &[]);
    let id = open(&bin).gnu_build_id().unwrap().to_vec();
    let stripped = strip(&bin);
    let f = open(&stripped);
    let (found, tables) = f.find_functions(&["marker"]);
    assert_eq!(tables.symtab, 0, "strip removes .symtab");
    assert!(found[0].is_none(), "marker is not exported, so a stripped file has no name for it");
    assert_eq!(f.gnu_build_id(), Some(&id[..]), "build id survives strip");
}

#[test]
fn versioned_names_match_plain() {
    let dir = tempfile::tempdir().unwrap();
    let map = dir.path().join("vers.map");
    std::fs::write(&map, "VERS_1 { global: foo; local: *; };\n").unwrap();
    let lib = gcc(
        dir.path(),
        "libv.so",
        VERSIONED,
        &["-shared", "-fPIC", &format!("-Wl,--version-script={}", map.display())],
    );
    let f = open(&lib);
    let (found, _) = f.find_functions(&["foo", "foo@@VERS_1", "fo"]);
    let foo = found[0].clone().expect("foo matched through its version");
    assert!(foo.name.starts_with("foo@"), "{foo:?}");
    assert_eq!(code_at(&lib, foo.file_offset), MARKER_CODE);
    assert!(found[1].is_none(), "a versioned query is not a plain name");
    assert!(found[2].is_none(), "prefixes do not match");
    // Stripped, the name lives in .dynsym only (plain, version in .gnu.version).
    let (found, tables) = open(&strip(&lib)).find_functions(&["foo"]);
    assert_eq!(tables.symtab, 0);
    assert_eq!(found[0].as_ref().map(|s| s.file_offset), Some(foo.file_offset));
}

const OBJECTS: &str = r#"
const unsigned long version_word = 0x030b07f0UL;
unsigned long data_word = 0x1122334455667788UL;
unsigned long bss_words[64];
int function(void) { return (int)(data_word + bss_words[3] + version_word); }
int main(void) { return function(); }
"#;

#[test]
fn data_objects_and_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let bin = gcc(dir.path(), "objects", OBJECTS, &["-fPIE", "-pie"]);
    for f in [open(&bin), open(&strip(&bin))] {
        let (found, _) = f.find_objects(&["version_word", "data_word", "bss_words", "function"]);
        if found[0].is_none() {
            // Stripped: the objects are not exported, so nothing names them.
            assert!(found.iter().all(Option::is_none));
            continue;
        }
        let [version, data, bss] = [0, 1, 2].map(|i| found[i].clone().unwrap());
        assert!(found[3].is_none(), "a function is not a data object");
        assert_eq!(f.bytes_at(version.address, 8), Some(&0x030b07f0u64.to_le_bytes()[..]));
        assert_eq!(f.bytes_at(data.address, 8), Some(&0x1122334455667788u64.to_le_bytes()[..]));
        assert_eq!((bss.size, f.bytes_at(bss.address, 8)), (512, None), "zero-filled: found, no file bytes");
        assert_eq!(f.bytes_at(data.address, 0), None);
        assert_eq!(f.find_functions(&["data_word"]).0[0], None, "an object is not a function");
    }
}

#[test]
fn real_libc_has_malloc_in_dynsym() {
    let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6", "/lib64/libc.so.6"]
        .iter()
        .map(Path::new)
        .find(|p| p.exists())
        .expect("a glibc on this machine");
    let f = open(libc);
    let (found, tables) = f.find_functions(&["malloc", "free"]);
    assert!(tables.dynsym > 1000, "{tables:?}");
    for s in found {
        let s = s.expect("malloc and free exported");
        assert!(s.file_offset < f.len() as u64 && s.size > 0, "{s:?}");
        assert_eq!(f.file_offset(s.address), Some(s.file_offset));
    }
    assert_eq!(f.gnu_build_id().map(|b| b.len()), Some(20));
    // A system executable: ELF, with a build id.
    let sh = open(Path::new("/bin/sh"));
    assert!(sh.gnu_build_id().is_some());
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    assert!(matches!(ElfFile::from_vec(b"#!/bin/sh\n".to_vec()), Err(Error::NotElf)));
    assert!(matches!(ElfFile::from_vec(Vec::new()), Err(Error::NotElf)));
    let dir = tempfile::tempdir().unwrap();
    let bin = std::fs::read(gcc(dir.path(), "prog", PROGRAM, &[])).unwrap();
    for cut in [4, 16, 52, 63, 64, 100, 1000, 4096, bin.len() / 2, bin.len() - 1] {
        if let Ok(f) = ElfFile::from_vec(bin[..cut].to_vec()) {
            let _ = f.find_functions(&["marker"]);
            let _ = f.gnu_build_id();
            let _ = f.go_build_id();
        }
    }
    // Scrambled section header offsets: an error or no answers, never a panic.
    let mut bad = bin.clone();
    bad[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(ElfFile::from_vec(bad), Err(Error::Malformed(_))));
}

const LINES_PROGRAM: &str = include_str!("../../examples/workloads/inlined.c");

/// binutils' `addr2line -f -i -C -e FILE ADDR`: (function, file base name, line), innermost first.
fn binutils_frames(file: &Path, vaddr: u64) -> Vec<(String, String, u32)> {
    let out = Command::new("addr2line")
        .args(["-f", "-i", "-C", "-e"])
        .arg(file)
        .arg(format!("{vaddr:#x}"))
        .output()
        .expect("run addr2line (binutils)");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    lines
        .chunks(2)
        .map(|c| {
            let (file, line) = c[1].rsplit_once(':').unwrap();
            let line = line.split_whitespace().next().unwrap().parse().unwrap_or(0);
            (c[0].to_owned(), base(file), line)
        })
        .collect()
}

fn base(p: &str) -> String {
    p.rsplit('/').next().unwrap_or(p).to_owned()
}

fn ours(lines: &DwarfLines, vaddr: u64) -> Vec<(String, String, u32)> {
    lines
        .frames(vaddr)
        .into_iter()
        .map(|f| (f.function.unwrap_or_default(), base(&f.file.unwrap_or_default()), f.line))
        .collect()
}

#[test]
fn dwarf_lines_and_inlined_frames_agree_with_binutils() {
    let dir = tempfile::tempdir().unwrap();
    for (name, extra) in [("plain", &[][..]), ("zdebug", &["-gz=zlib"][..])] {
        let mut args = vec!["-g", "-O2"];
        args.extend_from_slice(extra);
        let bin = gcc(dir.path(), name, LINES_PROGRAM, &args);
        let elf = open(&bin);
        let syms = elf.function_symbols();
        let (_, outer_start) = syms.lookup(syms.iter().find(|s| s.2 == "outer").unwrap().0).unwrap();
        let size = syms.iter().find(|s| s.2 == "outer").unwrap().1 as u64;
        let lines = elf.dwarf_lines(64 << 20).expect("debug info");
        // Compressed sections decompressed into unlinked files and mapped,
        // not into the heap; the same answers.
        let spill = tempfile::tempdir().unwrap();
        let spilled = elf.dwarf_lines_spilled(64 << 20, Some(spill.path())).expect("debug info");
        if name == "zdebug" {
            assert!(spilled.mapped_bytes() > lines.mapped_bytes(), "{name}: sections mapped from files");
            assert!(spilled.heap_bytes() < lines.heap_bytes() / 2, "{name}: not decompressed into the heap");
            assert_eq!(std::fs::read_dir(spill.path()).unwrap().count(), 0, "{name}: the files are unlinked");
        }
        let mut inlined = 0;
        for vaddr in outer_start..outer_start + size {
            let want = binutils_frames(&bin, vaddr);
            let got = ours(&lines, vaddr);
            assert_eq!(got, want, "{name} at {vaddr:#x}");
            assert_eq!(ours(&spilled, vaddr), want, "{name} at {vaddr:#x}, sections in files");
            inlined += usize::from(got.len() > 1);
        }
        assert!(inlined > 0, "{name}: some address of outer is inside the inlined `inner`");
        // Symbol table: every address of outer is named outer.
        assert_eq!(syms.lookup(outer_start + size - 1).map(|s| s.0).as_deref(), Some("outer"));
    }
}

#[test]
fn debuglink_and_file_offsets_of_a_stripped_copy() {
    let dir = tempfile::tempdir().unwrap();
    let bin = gcc(dir.path(), "linked", LINES_PROGRAM, &["-g"]);
    let debug = dir.path().join("linked.debug");
    let run = |args: &[&std::ffi::OsStr]| assert!(Command::new("objcopy").args(args).status().unwrap().success());
    run(&["--only-keep-debug".as_ref(), bin.as_os_str(), debug.as_os_str()]);
    let stripped = strip(&bin);
    let with_link = dir.path().join("linked.with-link");
    let link = format!("--add-gnu-debuglink={}", debug.display());
    run(&[link.as_ref(), stripped.as_os_str(), with_link.as_os_str()]);
    let elf = open(&with_link);
    assert!(!elf.has_symtab() && !elf.has_debug_info());
    let (name, crc) = elf.debuglink().expect("debuglink");
    assert_eq!(name, "linked.debug");
    assert_eq!(crc, debuglink_crc(&mut File::open(&debug).unwrap()).unwrap());
    let dbg = open(&debug);
    assert_eq!(dbg.gnu_build_id(), elf.gnu_build_id());
    let outer = dbg.function_symbols().iter().find(|s| s.2 == "outer").unwrap().0;
    // The stripped file's segments map the debug file's addresses.
    let off = elf.file_offset(outer).unwrap();
    assert_eq!(elf.vaddr_of_file_offset(off), Some(outer));
    assert_eq!(ours(&dbg.dwarf_lines(64 << 20).unwrap(), outer), binutils_frames(&debug, outer));
    // file_id: 16 bytes of hex, changes with the contents.
    let a = file_id(&File::open(&bin).unwrap()).unwrap();
    assert_eq!(a.len(), 32);
    assert_ne!(a, file_id(&File::open(&stripped).unwrap()).unwrap());
    let tiny = dir.path().join("tiny");
    std::fs::write(&tiny, b"x").unwrap();
    assert_eq!(file_id(&File::open(&tiny).unwrap()).unwrap().len(), 32);
}

#[test]
fn mini_debug_info_adds_static_functions_and_refuses_bombs() {
    let dir = tempfile::tempdir().unwrap();
    let bin = gcc(dir.path(), "mini", LINES_PROGRAM, &["-g"]);
    let stripped = strip(&bin);
    assert!(open(&stripped).function_symbols().iter().all(|s| s.2 != "outer"), "outer is not in .dynsym");
    // .gnu_debugdata = xz(the unstripped binary): its .symtab names outer.
    let with = |name: &str, payload: &Path| {
        let out = dir.path().join(name);
        let add = format!(".gnu_debugdata={}", payload.display());
        let ok = Command::new("objcopy").arg("--add-section").arg(add).arg(&stripped).arg(&out).status();
        assert!(ok.expect("run objcopy (binutils)").success());
        out
    };
    let xz = |input: &Path, args: &[&str]| {
        let ok = Command::new("xz").args(args).arg("-kf").arg(input).status().expect("run xz (xz-utils)");
        assert!(ok.success());
        input.with_extension("xz")
    };
    let good = with("good", &xz(&bin, &[]));
    let elf = open(&good);
    let mini = elf.mini_debug_info(64 << 20).unwrap().expect(".gnu_debugdata");
    let syms = elf.function_symbols_with(Some(&mini));
    let full = open(&bin).function_symbols();
    assert_eq!(syms.iter().collect::<Vec<_>>(), full.iter().collect::<Vec<_>>());
    assert!(open(&stripped).mini_debug_info(1 << 20).unwrap().is_none());
    // A bomb: 64 MiB of zeros against a 16 MiB limit; garbage; not ELF.
    let zeros = dir.path().join("zeros");
    std::fs::write(&zeros, vec![0u8; 64 << 20]).unwrap();
    let bomb = with("bomb", &xz(&zeros, &["-0"]));
    assert!(std::fs::metadata(&bomb).unwrap().len() < 1 << 20);
    let err = open(&bomb).mini_debug_info(16 << 20).err().expect("a bomb is an error");
    assert!(matches!(err, minidebuginfo::MiniDebugInfoError::TooLarge(_)), "{err}");
    let junk = dir.path().join("junk");
    std::fs::write(&junk, b"\xfd7zXZ\0 not really xz").unwrap();
    let err = open(&with("junk", &junk)).mini_debug_info(16 << 20).err().expect("garbage is an error");
    assert!(matches!(err, minidebuginfo::MiniDebugInfoError::Xz(_)), "{err}");
    let text = dir.path().join("text");
    std::fs::write(&text, b"not an ELF file").unwrap();
    let err = open(&with("text", &xz(&text, &[]))).mini_debug_info(16 << 20).err().expect("not ELF");
    assert!(matches!(err, minidebuginfo::MiniDebugInfoError::NotElf(_)), "{err}");
}

mod dwarf_stream;
mod unwind;

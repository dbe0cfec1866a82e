//! `profcol symbols lookup` end to end: names every address of a function
//! with an inlined callee as binutils' `addr2line -f -i -C` does, by file
//! and by build id (a debug file in a `.build-id` tree); bad input is a
//! clear error.

use std::path::Path;
use std::process::Command;

use profcol_testkit::tools::tool_available;

const PROGRAM: &str = include_str!("../../examples/workloads/inlined.c");

fn profcol(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_profcol")).args(args).output().expect("profcol runs")
}

/// `ADDR FUNCTION FILE:LINE` lines in profcol's format from binutils.
fn binutils(bin: &Path, addrs: &[String]) -> String {
    let out = Command::new("addr2line").args(["-a", "-f", "-i", "-C", "-e"]).arg(bin).args(addrs).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines().peekable();
    let mut want = String::new();
    while let Some(a) = lines.next() {
        let addr = format!("{:#x}", u64::from_str_radix(a.trim_start_matches("0x"), 16).unwrap());
        let mut first = true;
        while lines.peek().is_some_and(|l| !l.starts_with("0x")) {
            let func = lines.next().unwrap();
            let place = lines.next().unwrap().split(' ').next().unwrap();
            let lead = if first { "" } else { "  in " };
            want.push_str(&format!("{addr} {lead}{func} {place}\n"));
            first = false;
        }
    }
    want
}

#[test]
fn lookup_names_addresses_as_addr2line_does() {
    if !tool_available("gcc", &["--version"]) || !tool_available("addr2line", &["--version"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("p.c");
    std::fs::write(&src, PROGRAM).unwrap();
    let bin = dir.path().join("p");
    let ok = Command::new("gcc").args(["-g", "-O2", "-o"]).arg(&bin).arg(&src).status().unwrap().success();
    assert!(ok, "gcc");
    let elf = profcol_elf::ElfFile::open(&std::fs::File::open(&bin).unwrap()).unwrap();
    let (start, size, _) = elf.function_symbols().iter().find(|s| s.2 == "outer").map(|s| (s.0, s.1, ())).unwrap();
    let addrs: Vec<String> = (start..start + u64::from(size)).map(|a| format!("{a:#x}")).collect();
    let want = binutils(&bin, &addrs);
    assert!(want.contains(" in outer "), "some address of outer is inside the inlined `inner`");

    let mut args = vec!["symbols", "lookup", "--vaddr", "--file", bin.to_str().unwrap()];
    args.extend(addrs.iter().map(String::as_str));
    let out = profcol(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), want);

    // By build id: only the debug file, under DIR/.build-id/xx/rest.debug.
    let id = profcol_elf::notes::hex(elf.gnu_build_id().unwrap());
    let tree = dir.path().join("debug/.build-id").join(&id[..2]);
    std::fs::create_dir_all(&tree).unwrap();
    let debug = tree.join(format!("{}.debug", &id[2..]));
    let ok = Command::new("objcopy").arg("--only-keep-debug").arg(&bin).arg(&debug).status().unwrap().success();
    assert!(ok, "objcopy");
    let debug_dir = dir.path().join("debug");
    let mut args = vec!["symbols", "lookup", "--build-id", &id, "--debug-dir", debug_dir.to_str().unwrap()];
    args.extend(addrs.iter().map(String::as_str));
    let out = profcol(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), want);

    // File offsets (the default with --file): the same names.
    let off = elf.file_offset(start).unwrap();
    let out = profcol(&["symbols", "lookup", "--file", bin.to_str().unwrap(), &format!("{off:x}")]);
    assert!(String::from_utf8(out.stdout).unwrap().contains(" outer "));

    // Errors say what and where.
    let out = profcol(&["symbols", "lookup", "--build-id", "abcdef", "--debug-dir", debug_dir.to_str().unwrap(), "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no debug file for build id abcdef"));
    let out = profcol(&["symbols", "lookup", "--file", src.to_str().unwrap(), "1"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an ELF file"));
    let out = profcol(&["symbols", "lookup", "--file", bin.to_str().unwrap(), "zz"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"zz\" is not a hex address"));
}

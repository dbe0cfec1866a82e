//! `profcol kernel-symbols` end to end, on the kernel_symbols fixtures.

use std::path::PathBuf;
use std::process::Command;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../processors/tests/fixtures/kernel_symbols")
}

fn profcol(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_profcol")).args(args).output().expect("profcol runs")
}

#[test]
fn lookup_prints_one_line_per_address() {
    let f = fixtures();
    let k = f.join("quirks.kallsyms");
    let s = f.join("sysfs");
    let out = profcol(&[
        "kernel-symbols",
        "lookup",
        "--kallsyms",
        k.to_str().unwrap(),
        "--sysfs",
        s.to_str().unwrap(),
        "ffffffff81000115",
        "0xffffffffc0a00100",
        "ffffffffc0d00010",
        "ffffffffc0ff0000",
        "ffffffffc0c00040",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "0xffffffff81000115 vfs_read+0x5\n\
         0xffffffffc0a00100 lm_export+0x0 [live_mod]\n\
         0xffffffffc0d00010 ? [fresh_mod]\n\
         0xffffffffc0ff0000 ?\n\
         0xffffffffc0c00040 nm_start+0x40 [new_mod]\n"
    );
}

#[test]
fn lookup_rejects_bad_addresses_with_a_hint() {
    let out = profcol(&["kernel-symbols", "lookup", "vfs_read"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`vfs_read` is not a kernel address"), "{err}");
}

#[test]
fn stats_reports_counts_bytes_and_parse_time() {
    let f = fixtures();
    let k = f.join("quirks.kallsyms");
    let s = f.join("sysfs");
    let out = profcol(&["kernel-symbols", "stats", "--kallsyms", k.to_str().unwrap(), "--sysfs", s.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for want in
        ["symbols: ", "modules: 3 loaded per sysfs (2 with names)", "bytes held: ", "parse time: ", "4 malformed"]
    {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
}

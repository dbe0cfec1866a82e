//! The binaries the uprobe benchmarks exec: 50 MB, with a 60,000-entry
//! `.symtab` (generated assembly, so the build takes seconds), and a
//! stripped copy. `main` lives `argv[1]` milliseconds when given, else exits.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Function symbols in the big binary's `.symtab`.
pub(crate) const SYMBOLS: usize = 60_000;
/// Bytes of `.rodata` padding that bring the file to ~50 MB.
pub(crate) const PAD_BYTES: usize = 50 << 20;

/// Builds `big` and `big.stripped` in `dir`.
pub(crate) fn build(dir: &Path) -> (PathBuf, PathBuf) {
    use std::fmt::Write;
    let mut asm = String::with_capacity(SYMBOLS * 80);
    asm.push_str(".text\n");
    for i in 0..SYMBOLS {
        let _ = writeln!(
            asm,
            ".globl bench_fn_{i}\n.type bench_fn_{i},@function\nbench_fn_{i}:\n\tret\n.size bench_fn_{i},1"
        );
    }
    let _ = writeln!(asm, ".section .rodata\n.globl bench_pad\nbench_pad:\n\t.byte 1\n\t.zero {}", PAD_BYTES - 1);
    let asm_path = dir.join("big.s");
    std::fs::write(&asm_path, asm).unwrap();
    let main_path = dir.join("big_main.c");
    std::fs::write(
        &main_path,
        "#include <stdlib.h>\n#include <time.h>\nextern const char bench_pad[];\n\
         int main(int c, char **v) {\n\
           long ms = c > 1 ? atol(v[1]) : 0;\n\
           struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };\n\
           if (ms > 0) nanosleep(&t, 0);\n\
           return bench_pad[0] - 1;\n\
         }\n",
    )
    .unwrap();
    let big = dir.join("big");
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-O1", "-o"])
        .arg(&big)
        .arg(&main_path)
        .arg(&asm_path)
        .status()
        .expect("run cc (install gcc)");
    assert!(status.success(), "building the benchmark binary");
    let stripped = dir.join("big.stripped");
    let status = Command::new("strip").arg("-o").arg(&stripped).arg(&big).status().expect("run strip (binutils)");
    assert!(status.success());
    (big, stripped)
}

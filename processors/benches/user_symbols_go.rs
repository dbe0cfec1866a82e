//! Go's pclntab (hand-written in profcol-elf) against blazesym, side by
//! side in one run (where profcol hand-writes a part, a
//! benchmark against the library). blazesym cannot read `.gopclntab`, so
//! its input is the same program built with `.symtab` kept (`-ldflags=-w`:
//! names, no DWARF) while profcol names the stripped build (`-s -w`): same
//! code at the same addresses, 10,000 addresses (2,000 distinct).
//!
//! - first use: load the table and name the batch;
//! - warm batch: name it again, tables loaded;
//! - memory: the bytes profcol holds (the copied pclntab) against the
//!   `-w` build's `.symtab` + `.strtab`, printed as a `BYTES` line.
//!
//! Needs `go` (examples/workloads/chain.go is built into a temporary dir).
//!
//!     cargo bench -p profcol-processors --bench user_symbols_go

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};
use criterion::{criterion_group, criterion_main, Criterion};
use profcol_processors::user_symbols::table::{BinaryTable, SearchPaths, Want};

const BATCH: usize = 10_000;
const DISTINCT: usize = 2_000;
const PROGRAM: &str = include_str!("../../examples/workloads/chain.go");

fn go_build(dir: &Path, name: &str, ldflags: &str) -> PathBuf {
    let src = dir.join(format!("{name}.go"));
    std::fs::write(&src, PROGRAM).unwrap();
    let out = dir.join(name);
    let o = Command::new("go")
        .args(["build", "-ldflags", ldflags, "-o"])
        .arg(&out)
        .arg(&src)
        .env("GO111MODULE", "off")
        .env("GOTOOLCHAIN", "local")
        .env("GOCACHE", std::env::temp_dir().join("profcol-go-cache"))
        .output()
        .expect("run go build (install golang-go)");
    assert!(o.status.success(), "go build: {}", String::from_utf8_lossy(&o.stderr));
    out
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let stripped = go_build(dir.path(), "stripped", "-s -w");
    let named = go_build(dir.path(), "named", "-w");
    let f = std::fs::File::open(&stripped).unwrap();
    let elf = profcol_elf::ElfFile::open(&f).unwrap();
    let go = elf.go_pclntab(1 << 30).expect(".gopclntab");
    let named_elf = profcol_elf::ElfFile::open(&std::fs::File::open(&named).unwrap()).unwrap();
    // Same code at the same addresses in both builds.
    let entries: Vec<u64> = go.functions().map(|(a, _)| a).collect();
    let named_entries: Vec<u64> = named_elf.go_pclntab(1 << 30).unwrap().functions().map(|(a, _)| a).collect();
    assert_eq!(entries, named_entries, "-s changes no code address");
    let mut rng = fastrand::Rng::with_seed(14);
    let distinct: Vec<u64> = (0..DISTINCT)
        .map(|_| {
            let i = rng.usize(..entries.len() - 1);
            let span = (entries[i + 1] - entries[i]).max(1);
            elf.file_offset(entries[i] + rng.u64(..span)).expect("code in a PT_LOAD segment")
        })
        .collect();
    let offsets: Vec<u64> = (0..BATCH).map(|_| distinct[rng.usize(..DISTINCT)]).collect();
    let want = Want {
        key: Arc::from(profcol_elf::file_id(&f).unwrap()),
        is_build_id: false,
        path: Arc::from(&*stripped.to_string_lossy()),
    };
    let load = || BinaryTable::load(&want, None, &SearchPaths::default()).expect("table loads");
    let ours = |t: &BinaryTable| offsets.iter().map(|&o| t.resolve(o).len()).sum::<usize>();
    let blaze = || Symbolizer::builder().enable_code_info(true).enable_demangling(true).build();
    let src = Source::Elf(Elf::new(&named));
    let theirs = |b: &Symbolizer| {
        let out = b.symbolize(&src, Input::FileOffset(&offsets)).expect("blazesym symbolizes");
        out.iter().filter(|s| matches!(s, Symbolized::Sym(_))).count()
    };
    let symtab_bytes = named_elf.section_size(".symtab").unwrap_or(0) + named_elf.section_size(".strtab").unwrap_or(0);
    eprintln!(
        "BINARY {} ({:.1} MB, {} functions, pclntab {} bytes; -w build's .symtab+.strtab {symtab_bytes} bytes)",
        stripped.display(),
        elf.len() as f64 / 1e6,
        go.len(),
        go.heap_bytes(),
    );
    let table = load();
    let b = blaze();
    eprintln!("FRAMES ours {}, blazesym {} for {BATCH} addresses", ours(&table), theirs(&b));

    let mut g = c.benchmark_group("user_symbols_go/first_use");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    g.bench_function("ours_pclntab", |bn| bn.iter(|| black_box(ours(&load()))));
    g.bench_function("blazesym_symtab", |bn| bn.iter(|| black_box(theirs(&blaze()))));
    g.finish();

    let mut g = c.benchmark_group("user_symbols_go/warm_batch");
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    g.bench_function("ours_pclntab", |bn| bn.iter(|| black_box(ours(&table))));
    g.bench_function("blazesym_symtab", |bn| bn.iter(|| black_box(theirs(&b))));
    g.finish();

    let fresh = load();
    let _ = ours(&fresh);
    eprintln!(
        "BYTES pclntab held {} = {:.2}x the -w build's .symtab+.strtab ({symtab_bytes}); whole table after one batch {}",
        go.heap_bytes(),
        go.heap_bytes() as f64 / symtab_bytes.max(1) as f64,
        fresh.heap_bytes()
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);

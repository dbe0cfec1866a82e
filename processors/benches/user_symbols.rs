//! user_symbols against blazesym, side by side in one run, on the same
//! binary and the same addresses:
//!
//! - warm batch: 10,000 file offsets (2,000 distinct, as a profile repeats
//!   its hot frames) named with DWARF lines, inlined frames and demangling,
//!   every table already loaded: our `BinaryTable::resolve` (memoized per
//!   build id) vs blazesym's `Symbolizer::symbolize` with a warm cache
//!   (goal ≥ 2×); and the whole processor on a batch of those frames;
//! - first use: load the tables and name one batch, ours vs a fresh
//!   blazesym symbolizer (goal ≤ 1×);
//! - memory: bytes of our function-symbol table against the file's
//!   `.symtab` + `.strtab` (goal ≤ 0.5×), printed as a `BYTES` line;
//! - restart: time to the first named frame with the on-disk table cache
//!   (read the table file, name the frame) against without it (parse the
//!   binary: symbols, DWARF, name the frame), goal ≥ 10× faster; also
//!   without it and without lines (symbols only).
//!
//! The binary is `PROFCOL_BENCH_BINARY`, or else this bench's own
//! executable (built with `debug = 1`: symbols and line tables).
//!
//!     cargo bench -p profcol-processors --bench user_symbols

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};
use criterion::{criterion_group, criterion_main, Criterion};
use profcol_processors::user_symbols::disk::DiskCache;
use profcol_processors::user_symbols::table::{BinaryTable, SearchPaths, Want};

const BATCH: usize = 10_000;
const DISTINCT: usize = 2_000;

struct Setup {
    path: PathBuf,
    want: Want,
    offsets: Vec<u64>,
    file_bytes: u64,
    symtab_bytes: u64,
    symbols: usize,
}

fn setup() -> Setup {
    let path = std::env::var_os("PROFCOL_BENCH_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::current_exe().expect("own executable"));
    let f = std::fs::File::open(&path).expect("open the binary");
    let elf = profcol_elf::ElfFile::open(&f).expect("an ELF binary");
    let build_id = profcol_elf::notes::hex(elf.gnu_build_id().expect("the binary has a GNU build id"));
    let syms = elf.function_symbols();
    let funcs: Vec<(u64, u32)> = syms.iter().filter(|s| s.1 > 1).map(|s| (s.0, s.1)).collect();
    assert!(funcs.len() > DISTINCT, "{} has too few sized functions", path.display());
    let mut rng = fastrand::Rng::with_seed(14);
    let distinct: Vec<u64> = (0..DISTINCT)
        .map(|_| {
            let (start, size) = funcs[rng.usize(..funcs.len())];
            elf.file_offset(start + rng.u64(..u64::from(size))).expect("code in a PT_LOAD segment")
        })
        .collect();
    let offsets = (0..BATCH).map(|_| distinct[rng.usize(..DISTINCT)]).collect();
    let symtab_bytes = elf.section_size(".symtab").unwrap_or(0) + elf.section_size(".strtab").unwrap_or(0);
    Setup {
        want: Want { key: Arc::from(build_id), is_build_id: true, path: Arc::from(&*path.to_string_lossy()) },
        path,
        offsets,
        file_bytes: elf.len() as u64,
        symtab_bytes,
        symbols: syms.len(),
    }
}

fn search() -> SearchPaths {
    SearchPaths::default()
}

fn ours_load(s: &Setup) -> BinaryTable {
    BinaryTable::load(&s.want, None, &search()).expect("table loads")
}

/// Restart without the on-disk cache: load the table from the binary and
/// name the first frame.
fn first_frame_parsed(s: &Setup, lines: bool) -> usize {
    let t = BinaryTable::load(&s.want, None, &SearchPaths { debug_dirs: Vec::new(), lines, ..SearchPaths::default() })
        .expect("table loads");
    t.resolve(s.offsets[0]).len()
}

/// Restart with it: read the table file and name the first frame (what
/// the loader publishes before it re-attaches DWARF in the background).
fn first_frame_from_disk(s: &Setup, disk: &DiskCache) -> usize {
    let t = disk.read(&s.want.key).expect("the table file");
    BinaryTable::from_disk(t).resolve(s.offsets[0]).len()
}

fn ours_name(t: &BinaryTable, offsets: &[u64]) -> usize {
    offsets.iter().map(|&o| t.resolve(o).len()).sum()
}

fn blaze() -> Symbolizer {
    Symbolizer::builder().enable_code_info(true).enable_inlined_fns(true).enable_demangling(true).build()
}

fn blaze_name(b: &Symbolizer, path: &std::path::Path, offsets: &[u64]) -> usize {
    let src = Source::Elf(Elf::new(path));
    let out = b.symbolize(&src, Input::FileOffset(offsets)).expect("blazesym symbolizes");
    out.iter()
        .map(|s| match s {
            Symbolized::Sym(sym) => 1 + sym.inlined.len(),
            Symbolized::Unknown(_) => 0,
        })
        .sum()
}

fn bench(c: &mut Criterion) {
    let s = setup();
    eprintln!(
        "BINARY {} ({:.1} MB, {} function symbols, .symtab+.strtab {} bytes)",
        s.path.display(),
        s.file_bytes as f64 / 1e6,
        s.symbols,
        s.symtab_bytes
    );

    // Both name the same frames (count of frames incl. inlined ones).
    let table = ours_load(&s);
    let b = blaze();
    let (ours_frames, blaze_frames) = (ours_name(&table, &s.offsets), blaze_name(&b, &s.path, &s.offsets));
    eprintln!("FRAMES ours {ours_frames}, blazesym {blaze_frames} for {BATCH} addresses");

    let mut g = c.benchmark_group("user_symbols/warm_batch");
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    g.bench_function("ours", |bn| bn.iter(|| black_box(ours_name(&table, &s.offsets))));
    g.bench_function("blazesym", |bn| bn.iter(|| black_box(blaze_name(&b, &s.path, &s.offsets))));
    g.finish();

    let mut g = c.benchmark_group("user_symbols/first_use");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    g.bench_function("ours", |bn| {
        bn.iter(|| {
            let t = ours_load(&s);
            black_box(ours_name(&t, &s.offsets))
        })
    });
    g.bench_function("blazesym", |bn| {
        bn.iter(|| {
            let b = blaze();
            black_box(blaze_name(&b, &s.path, &s.offsets))
        })
    });
    g.finish();

    // Restart: the table file written once, as the loader does.
    let cache_dir = tempfile::tempdir().expect("a temporary directory");
    let disk = DiskCache::open(&cache_dir.path().join("symbols"), 1 << 30).expect("a cache directory");
    let (segments, symbols, had_dwarf) = table.disk_parts().expect("not a Go table");
    disk.write(&s.want.key, segments, symbols, had_dwarf);
    let file_bytes = std::fs::metadata(disk.path_of(&s.want.key).unwrap()).map(|m| m.len()).unwrap_or(0);
    assert!(first_frame_from_disk(&s, &disk) > 0 && first_frame_parsed(&s, true) > 0, "the first frame is named");
    eprintln!("DISK table file {file_bytes} bytes");
    let mut g = c.benchmark_group("user_symbols/restart_first_frame");
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    g.bench_function("on_disk_cache", |bn| bn.iter(|| black_box(first_frame_from_disk(&s, &disk))));
    g.bench_function("parse_binary", |bn| bn.iter(|| black_box(first_frame_parsed(&s, true))));
    g.bench_function("parse_binary_no_lines", |bn| bn.iter(|| black_box(first_frame_parsed(&s, false))));
    g.finish();

    // Memory: the symbol table alone, and everything the table holds after a batch.
    let t0 = Instant::now();
    let fresh = ours_load(&s);
    let load = t0.elapsed();
    let symbols_only =
        profcol_elf::ElfFile::open(&std::fs::File::open(&s.path).unwrap()).unwrap().function_symbols().heap_bytes();
    let _ = ours_name(&fresh, &s.offsets);
    eprintln!(
        "BYTES function-symbol table {symbols_only} = {:.2}x .symtab+.strtab ({}); whole table after one batch {} of which {} debug sections read in place from the mapping; load {load:?}",
        symbols_only as f64 / s.symtab_bytes.max(1) as f64,
        s.symtab_bytes,
        fresh.heap_bytes(),
        fresh.mapped_bytes(),
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);

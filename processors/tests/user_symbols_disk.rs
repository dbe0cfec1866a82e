//! user_symbols' on-disk table cache (`cache.dir`): a restart names frames
//! from the table file without the binary, lines come back when the binary
//! is there, bad files are ignored and rebuilt, the directory stays within
//! its bytes.
//!
//!     cargo test -p profcol-processors --test user_symbols_disk

mod user_symbols_common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use profcol_api::component::{ComponentId, Kind, Processor};
use profcol_api::services::FilePins;
use profcol_api::telemetry::Telemetry;
use profcol_api::Profiles;
use profcol_processors::user_symbols::config::CacheConfig;
use profcol_processors::user_symbols::disk::{self, DiskCache};
use profcol_processors::user_symbols::{Config, UserSymbols};
use user_symbols_common::*;

/// A processor with `cache.dir = dir` (or none) and its metrics.
fn processor(dir: Option<&Path>) -> (UserSymbols, Telemetry) {
    let registry = Telemetry::new();
    let cid: ComponentId = "user_symbols".parse().unwrap();
    let cfg = Config {
        max_wait: Duration::from_secs(10),
        cache: CacheConfig { dir: dir.map(Path::to_owned), ..Default::default() },
        ..Default::default()
    };
    let p = UserSymbols::with_telemetry(cfg, Arc::new(FilePins::default()), &registry.component(Kind::Processor, &cid));
    (p, registry)
}

async fn named(p: &UserSymbols, input: &Profiles) -> Vec<Vec<(String, i64)>> {
    frames(&p.process(input.clone()).await.unwrap().forwarded().unwrap())
}

/// Waits until `file` exists (the loader writes it before publishing the table).
async fn written(file: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !file.exists() {
        assert!(Instant::now() < deadline, "{} never written", file.display());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn metric(registry: &Telemetry, series: &str) -> String {
    let text = registry.render();
    text.lines().find(|l| l.starts_with(series)).map(str::to_owned).unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

struct Workload {
    _tmp: tempfile::TempDir,
    bin: PathBuf,
    id: String,
    cache_dir: PathBuf,
    input: Profiles,
    /// (leaf_work's start, a return address inside middle)
    vaddrs: [u64; 2],
}

fn workload(name: &str) -> Workload {
    let tmp = tempfile::tempdir().unwrap();
    let bin = compile(tmp.path(), name, 0);
    let elf = profcol_elf::ElfFile::open(&std::fs::File::open(&bin).unwrap()).unwrap();
    let id = build_id(&bin);
    let (leaf, _) = symbol(&elf, "leaf_work");
    let (middle, msize) = symbol(&elf, "middle");
    let ret = middle + msize / 2;
    let input = batch(&bin, &id, &[leaf, ret], &elf);
    let cache_dir = tmp.path().join("cache").join("symbols");
    Workload { bin, id, cache_dir, input, vaddrs: [leaf, ret], _tmp: tmp }
}

#[tokio::test]
async fn a_restart_names_frames_from_the_table_file_without_the_binary() {
    if !tools_available() {
        return;
    }
    let w = workload("restart");
    let file = w.cache_dir.join(format!("{}.syms", w.id));
    {
        let (p, registry) = processor(Some(&w.cache_dir));
        let f = named(&p, &w.input).await;
        assert_eq!(f[1].last().unwrap().0, "leaf_work");
        written(&file).await;
        let _ = named(&p, &w.input).await; // mirrors the loader's counters
        assert!(metric(&registry, "profcol_processor_user_symbols_cache_dir_lookups_total{outcome=\"miss\"")
            .ends_with(" 1"));
        assert!(
            metric(&registry, "profcol_processor_user_symbols_cache_dir_writes_total{outcome=\"ok\"").ends_with(" 1")
        );
    }
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&w.cache_dir), 0o700, "the directory is private");
    assert_eq!(mode(&file), 0o600, "the table file is private");
    let leftovers: Vec<_> = std::fs::read_dir(&w.cache_dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers.len(), 1, "only the table, no temporary file: {leftovers:?}");

    // The binary is gone: nothing can parse it. Without the cache the
    // frames stay unnamed; with it, a restarted processor names them.
    std::fs::remove_file(&w.bin).unwrap();
    let (cold, _) = processor(None);
    assert!(named(&cold, &w.input).await[1].is_empty(), "no binary, no cache: unnamed");
    let (p, registry) = processor(Some(&w.cache_dir));
    let f = named(&p, &w.input).await;
    assert_eq!(f[1], vec![("leaf_work".to_owned(), 0)], "named from the table file");
    assert_eq!(f[2], vec![("middle".to_owned(), 0)]);
    let _ = named(&p, &w.input).await;
    assert!(metric(&registry, "profcol_processor_user_symbols_cache_dir_lookups_total{outcome=\"hit\"").ends_with(" 1"));
    assert!(metric(&registry, "profcol_processor_user_symbols_tables_missing_total").ends_with(" 0"));
    assert!(metric(&registry, "profcol_processor_user_symbols_cache_dir_writes_total{outcome=\"ok\"").ends_with(" 0"));
}

/// The table's names are read in place from its file in `cache.dir`
/// (page cache) rather than held on the heap: once written, and after a
/// restart. The frames are the same as without the directory.
#[tokio::test]
async fn names_are_read_in_place_from_the_table_file_not_held_on_the_heap() {
    if !tools_available() {
        return;
    }
    let w = workload("mapped");
    let gauge = |r: &Telemetry, series: &str| -> u64 { metric(r, series).rsplit(' ').next().unwrap().parse().unwrap() };
    let sizes = |r: &Telemetry| {
        (
            gauge(r, "profcol_processor_user_symbols_cache_bytes"),
            gauge(r, "profcol_processor_user_symbols_cache_mapped_bytes"),
        )
    };
    let (plain, rp) = processor(None);
    let want = named(&plain, &w.input).await;
    let _ = named(&plain, &w.input).await; // gauges as of the first batch's tables
    let (heap, mapped) = sizes(&rp);

    let (cold, rc) = processor(Some(&w.cache_dir));
    assert_eq!(named(&cold, &w.input).await, want, "the same frames");
    let _ = named(&cold, &w.input).await;
    let (cold_heap, cold_mapped) = sizes(&rc);
    assert!(cold_heap < heap, "names off the heap: {cold_heap} of {heap}");
    assert_eq!(heap - cold_heap, cold_mapped - mapped, "the bytes left the heap for the mapping");

    let (warm, rw) = processor(Some(&w.cache_dir));
    assert_eq!(named(&warm, &w.input).await, want, "the same frames after a restart");
    let _ = named(&warm, &w.input).await;
    assert_eq!(sizes(&rw).1, cold_mapped, "after a restart too");
}

#[tokio::test]
async fn after_a_restart_lines_and_inlined_frames_come_back_from_the_binary() {
    if !tools_available() {
        return;
    }
    let w = workload("lines");
    let file = w.cache_dir.join(format!("{}.syms", w.id));
    let full = {
        let (p, _) = processor(Some(&w.cache_dir));
        let f = named(&p, &w.input).await;
        written(&file).await;
        f
    };
    let want = addr2line(&w.bin, &[w.vaddrs[0], w.vaddrs[1] - 1]);
    assert_eq!(full[1].len(), want[0].len(), "inlined frames before the restart: {full:?}");
    let (p, registry) = processor(Some(&w.cache_dir));
    let deadline = Instant::now() + Duration::from_secs(10);
    let f = loop {
        let f = named(&p, &w.input).await;
        if f[1].len() == want[0].len() && f[1].iter().all(|x| x.1 != 0) {
            break f;
        }
        assert!(Instant::now() < deadline, "lines never came back: {f:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(f, full, "the same frames as before the restart, with lines and inlined ones");
    assert!(metric(&registry, "profcol_processor_user_symbols_cache_dir_lookups_total{outcome=\"hit\"").ends_with(" 1"));
}

/// A change made to a good table file.
type Damage = Box<dyn Fn(&mut Vec<u8>)>;

#[tokio::test]
async fn truncated_corrupt_or_old_version_files_are_ignored_and_rebuilt() {
    if !tools_available() {
        return;
    }
    let w = workload("damaged");
    let file = w.cache_dir.join(format!("{}.syms", w.id));
    {
        let (p, _) = processor(Some(&w.cache_dir));
        let _ = named(&p, &w.input).await;
        written(&file).await;
    }
    let good = std::fs::read(&file).unwrap();
    assert!(disk::decode(&good, &w.id).is_ok());
    let damages: [(&str, Damage); 5] = [
        ("truncated", Box::new(|b: &mut Vec<u8>| b.truncate(b.len() / 2))),
        ("empty", Box::new(|b: &mut Vec<u8>| b.clear())),
        (
            "corrupt",
            Box::new(|b: &mut Vec<u8>| {
                let at = b.len() - 7;
                b[at] ^= 0x5a;
            }),
        ),
        ("old version", Box::new(|b: &mut Vec<u8>| b[8..12].copy_from_slice(&(disk::VERSION - 1).to_le_bytes()))),
        (
            "another build id",
            Box::new(|b: &mut Vec<u8>| {
                let at = 32; // first byte of the key
                b[at] = if b[at] == b'0' { b'1' } else { b'0' };
            }),
        ),
    ];
    for (what, damage) in damages {
        let mut bad = good.clone();
        damage(&mut bad);
        std::fs::write(&file, &bad).unwrap();
        assert!(disk::decode(&bad, &w.id).is_err(), "{what}: refused");
        let (p, registry) = processor(Some(&w.cache_dir));
        let f = named(&p, &w.input).await;
        assert_eq!(f[1].last().unwrap().0, "leaf_work", "{what}: named from the binary");
        assert!(f[1].iter().all(|x| x.1 != 0), "{what}: with lines (parsed, not from the file): {f:?}");
        written(&file).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read(&file).ok().as_ref() != Some(&good) {
            assert!(Instant::now() < deadline, "{what}: the file was not rebuilt");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = named(&p, &w.input).await;
        assert!(
            metric(&registry, "profcol_processor_user_symbols_cache_dir_lookups_total{outcome=\"invalid\"")
                .ends_with(" 1"),
            "{what}"
        );
    }
}

#[test]
fn the_directory_stays_within_its_bytes_least_recently_used_first() {
    if !tools_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let table = |variant: u32| {
        let bin = compile(tmp.path(), &format!("b{variant}"), variant);
        let elf = profcol_elf::ElfFile::open(&std::fs::File::open(&bin).unwrap()).unwrap();
        let segs: Vec<_> = elf.load_segments().iter().map(|s| (s.vaddr, s.filesz, s.offset)).collect();
        (build_id(&bin), segs, elf.function_symbols())
    };
    let tables: Vec<_> = (0..3).map(table).collect();
    let one = disk::encode(&tables[0].0, &tables[0].1, &tables[0].2, true).len() as u64;
    let dir = tmp.path().join("c");
    let d = DiskCache::open(&dir, one * 2 + one / 2).expect("a usable directory");
    let pause = || std::thread::sleep(Duration::from_millis(20)); // distinct mtimes
    d.write(&tables[0].0, &tables[0].1, &tables[0].2, true);
    pause();
    d.write(&tables[1].0, &tables[1].1, &tables[1].2, true);
    pause();
    assert!(d.read(&tables[0].0).is_some(), "b0 read: used more recently than b1");
    pause();
    d.write(&tables[2].0, &tables[2].1, &tables[2].2, true);
    assert!(d.bytes() <= one * 2 + one / 2, "{} bytes on disk", d.bytes());
    assert!(d.path_of(&tables[0].0).unwrap().exists(), "recently used kept");
    assert!(!d.path_of(&tables[1].0).unwrap().exists(), "least recently used removed");
    assert!(d.path_of(&tables[2].0).unwrap().exists(), "just written kept");
    assert_eq!(d.counters.evictions.load(std::sync::atomic::Ordering::Relaxed), 1);
    let back = d.read(&tables[2].0).unwrap();
    assert_eq!(back.symbols, tables[2].2, "read back as written");
    assert_eq!(back.segments, tables[2].1);
}

#[test]
fn a_directory_others_can_write_is_not_used() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("open");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(DiskCache::open(&dir, 1 << 30).is_none(), "world-writable: refused");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let d = DiskCache::open(&dir, 1 << 30).expect("private: used");
    assert_eq!(d.path_of("../etc/passwd"), None, "a key is never a path");
    assert!(d.read("abcd").is_none());
    assert_eq!(d.counters.misses.load(std::sync::atomic::Ordering::Relaxed), 1);
}

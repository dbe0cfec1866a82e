//! Per-exec cost of the uprobe side for a binary with nothing to attach:
//! with the negative cache (fstat + lookup) against without it (open, map
//! and parse the symbol tables on every exec), for a 50 MB binary with a
//! 60,000-symbol `.symtab` and for its stripped copy.
//!
//!     cargo bench -p profcol-receivers --bench uprobe_exec
//!
//! - `cache_only`: the cache's own work per exec: `fstat` of the opened
//!   executable and the lookup; `parse_only`: what it saves (open, map,
//!   read the symbol tables).
//! - `per_exec/cached`, `per_exec/no_cache`: the whole handling of one
//!   exec and exit of a live process running the binary, as the receiver
//!   does it: a `stat` of the exe link and the lookup (or open and parse),
//!   and the exit (a probe on an executable by name reads no maps). "No cache" is the
//!   same code with a zero TTL, so every verdict has expired.
//! - `per_exec_kernel/cached`, `per_exec_kernel/no_cache`: the same from
//!   the kernel's exec and mapping records, as the receiver handles them
//!   when it has them: the exec record, the executable's mapping record
//!   (a `stat` of its path checked against the record's device and inode,
//!   and the lookup, or the parse) and the exit.

#[path = "common/uprobe_fixture.rs"]
mod uprobe_fixture;

use criterion::{criterion_group, criterion_main, Criterion};
use profcol_api::component::{ComponentId, Kind};
use profcol_api::telemetry::ComponentTelemetry;
use profcol_elf::ElfFile;
use profcol_receivers::ebpf::config::UprobeSpec;
use profcol_receivers::ebpf::process::mmap_events::{MappingBatch, MappingEventKind};
use profcol_receivers::ebpf::process::procfs;
use profcol_receivers::ebpf::uprobes::cache::{Acquire, AttachmentCache, CacheLimits, FileStamp};
use profcol_receivers::ebpf::uprobes::{AttachError, Attacher, UprobeCounters, Uprobes, MAPS_RESCAN_DELAYS};
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Never called: the benchmark's binaries lack the symbol.
struct NoAttach;

impl Attacher for NoAttach {
    type Link = ();
    fn attach(&mut self, _: &File, _: u64, _: u32) -> Result<(), AttachError> {
        unreachable!("the benchmark binaries have no probed symbol")
    }
}

fn uprobes(binary: &str, ttl: Duration) -> Uprobes<()> {
    let spec = UprobeSpec { symbol: "profcol_not_in_this_binary".into(), binary: Some(binary.into()) };
    let t = ComponentTelemetry::detached(Kind::Receiver, &"ebpf".parse::<ComponentId>().unwrap());
    Uprobes::with_limits(&[spec], CacheLimits { ttl, max_entries: 65_536 }, UprobeCounters::new(&t))
}

struct Sleeper(Child);

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let (big, stripped) = uprobe_fixture::build(dir.path());
    for (label, bin) in [("symtab_50MB", &big), ("stripped_50MB", &stripped)] {
        let name = bin.file_name().unwrap().to_str().unwrap().to_owned();
        let proc_ = Sleeper(Command::new(bin).arg("3600000").spawn().unwrap());
        let pid = proc_.0.id();
        std::thread::sleep(Duration::from_millis(100));
        let mut g = c.benchmark_group(format!("uprobe_exec/{label}"));
        g.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4)).sample_size(20);

        // The cache's own work: fstat of the opened executable + lookup.
        let file = File::open(format!("/proc/{pid}/exe")).unwrap();
        let mut cache: AttachmentCache<()> =
            AttachmentCache::new(CacheLimits { ttl: Duration::from_secs(600), max_entries: 65_536 });
        let now = Instant::now();
        let (k, s) = FileStamp::of(&file.metadata().unwrap());
        cache.insert_negative(k, s, now);
        g.bench_function("cache_only", |b| {
            b.iter(|| {
                let (key, stamp) = FileStamp::of(&file.metadata().unwrap());
                assert_eq!(cache.acquire(key, stamp, now), Acquire::Negative);
            })
        });

        // What the cache saves on each exec: open, map and parse.
        g.bench_function("parse_only", |b| {
            b.iter(|| {
                let f = File::open(format!("/proc/{pid}/exe")).unwrap();
                let elf = ElfFile::open(&f).unwrap();
                assert!(elf.find_functions(&["profcol_not_in_this_binary"]).0[0].is_none());
            })
        });

        for (case, ttl) in [("cached", Duration::from_secs(600)), ("no_cache", Duration::ZERO)] {
            let mut u = uprobes(&name, ttl);
            let mut att = NoAttach;
            let t0 = Instant::now();
            let mut i = 0u64;
            g.bench_function(format!("per_exec/{case}"), |b| {
                b.iter(|| {
                    // A fresh clock point per exec, as the receiver sees them.
                    let now = t0 + Duration::from_micros(i);
                    i += 1;
                    u.on_exec(pid, now, &mut att);
                    u.poll(now + MAPS_RESCAN_DELAYS[0], &mut att);
                    u.poll(now + MAPS_RESCAN_DELAYS[1], &mut att);
                    u.on_exit(pid, now);
                })
            });
            let parsed = u.counters().binaries_parsed.get();
            let hits = u.counters().negative_hits.get();
            if case == "cached" {
                assert_eq!(parsed, 1, "cached: one parse, then hits ({hits})");
            } else {
                assert_eq!(hits, 0, "no_cache: every exec parses ({parsed})");
            }
        }

        // The executable's mapping as the kernel's record gives it.
        let exe = procfs::read_maps(pid).unwrap().into_iter().find(|m| m.path.ends_with(&name)).unwrap();
        let md = std::fs::metadata(&exe.path).unwrap();
        let mut batch = MappingBatch::default();
        let dev = (libc::major(md.dev()), libc::minor(md.dev()));
        batch.push_map(0, pid, exe.start..exe.end, 0, (dev, md.ino()), exe.path.as_bytes());
        let MappingEventKind::Map(record) = batch.events[0].kind else { unreachable!() };
        for (case, ttl) in [("cached", Duration::from_secs(600)), ("no_cache", Duration::ZERO)] {
            let mut u = uprobes(&name, ttl);
            let mut att = NoAttach;
            let t0 = Instant::now();
            let mut i = 0u64;
            g.bench_function(format!("per_exec_kernel/{case}"), |b| {
                b.iter(|| {
                    let now = t0 + Duration::from_micros(i);
                    i += 1;
                    u.on_image(pid, now);
                    u.on_kernel_mapping(pid, &record, &batch, now, &mut att);
                    u.on_exit(pid, now);
                })
            });
            let parsed = u.counters().binaries_parsed.get();
            let hits = u.counters().negative_hits.get();
            if case == "cached" {
                assert_eq!(parsed, 1, "cached: one parse, then hits ({hits})");
            } else {
                assert_eq!(hits, 0, "no_cache: every exec parses ({parsed})");
            }
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);

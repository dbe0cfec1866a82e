//! What user-stack unwinding with `.eh_frame` tables costs, side by
//! side in one run (root: BPF):
//!
//!     cargo bench -p profcol-receivers --bench unwind_cost
//!
//! 1. Table building: for the system's libc, python3 and sha256sum and this
//!    benchmark's own (Rust, large) executable: time to build the compact
//!    table (open, parse `.eh_frame`/`.debug_frame`, evaluate, compact;
//!    median of 5), bytes of CFI, bytes of table, table bytes per MiB of CFI,
//!    and the most heap the build held at once (a counting allocator)
//!    against the table's bytes; each for the receiver's streamed build
//!    and, alternating with it, the full table compacted after (the
//!    baseline). `EXTRA_FILES=a:b` adds files (absolute paths; a large
//!    binary: `target/release/profcol`); `-- tables` runs only this part.
//! 2. In-kernel time per sample of the sampling program (the kernel's
//!    `bpf_stats_enabled` run time of `profcol_cpu_sample`, which includes
//!    its tail calls into `profcol_unwind`), on `examples/workloads/deep.c`
//!    spinning 6 frames deep: `unwind.mode: frame_pointers` on a build with
//!    frame pointers (the baseline) against `auto` (tables) on the same
//!    build and on an `-fomit-frame-pointer` build, each sample a record
//!    of its own (`count_in_kernel: false`, the program before counting in the kernel); then
//!    the same three counting samples per stack in the kernel (the
//!    default); the settings interleaved over 3 rounds, medians
//!    reported. Every sample of a run is in its figure (the workload
//!    spins only once the receiver is started).

#[path = "../tests/ebpf_common/mod.rs"]
mod ebpf_common;

use ebpf_common::{compile_workload, metric, start, Workload};
use profcol_ebpf::sys;
use profcol_elf::ElfFile;
use profcol_receivers::ebpf::config::{UnwindConfig, UnwindMode};
use profcol_receivers::ebpf::EbpfConfig;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[global_allocator]
static HEAP: profcol_testkit::alloc::Counting = profcol_testkit::alloc::Counting;

const STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";
const FREQ: u64 = 499;
const SECONDS: f64 = 2.0;
const ROUNDS: usize = 3;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn table_builds() {
    let own = std::env::current_exe().unwrap();
    let files: Vec<PathBuf> = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/python3", "/usr/bin/sha256sum"]
        .iter()
        .map(PathBuf::from)
        .chain([own])
        .chain(std::env::var("EXTRA_FILES").unwrap_or_default().split(':').filter(|p| !p.is_empty()).map(PathBuf::from))
        .filter(|p| p.exists())
        .map(|p| std::fs::canonicalize(p).unwrap())
        .collect();
    println!("## table build");
    println!("streamed: what the receiver builds (`compact_unwind_table`, rows compacted as they come);");
    println!("full: the full table first, then compacted (`unwind_table` + `compact`), the baseline.");
    println!(
        "| file | file size | CFI bytes | table bytes | table bytes per MiB of CFI | rows | build ms, streamed / full (median of 5) | peak heap of a build, streamed / full | peak / table, streamed / full |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for f in files {
        let file = File::open(&f).unwrap();
        // One build either way, measured alike; the two alternate.
        let build = |streamed: bool| {
            profcol_testkit::alloc::reset_peak();
            let before = profcol_testkit::alloc::live();
            let t = Instant::now();
            let elf = ElfFile::open(&file).unwrap();
            let (compact, stats) = if streamed {
                elf.compact_unwind_table().unwrap()
            } else {
                let (table, stats) = elf.unwind_table().unwrap();
                (table.compact().unwrap(), stats)
            };
            let ms = t.elapsed().as_secs_f64() * 1e3;
            (ms, profcol_testkit::alloc::peak() - before, stats, compact)
        };
        let (mut times, mut peaks) = ([Vec::new(), Vec::new()], [0isize, 0]);
        let mut result = None;
        for _ in 0..5 {
            for (i, streamed) in [true, false].into_iter().enumerate() {
                let (ms, peak, stats, compact) = build(streamed);
                times[i].push(ms);
                peaks[i] = peaks[i].max(peak);
                if let Some((_, c)) = &result {
                    assert!(*c == compact, "{}: the streamed and the full build differ", f.display());
                }
                result = Some((stats, compact));
            }
        }
        let (stats, compact) = result.unwrap();
        let size = file.metadata().unwrap().len();
        let [t_streamed, t_full] = times.map(median);
        println!(
            "| {} | {} | {} | {} | {:.0} | {} | {:.1} / {:.1} | {} / {} | {:.1} / {:.1} |",
            f.file_name().unwrap().to_string_lossy(),
            size,
            stats.cfi_bytes,
            compact.bytes(),
            compact.bytes() as f64 / (stats.cfi_bytes as f64 / (1 << 20) as f64),
            compact.rows.len(),
            t_streamed,
            t_full,
            peaks[0],
            peaks[1],
            peaks[0] as f64 / compact.bytes() as f64,
            peaks[1] as f64 / compact.bytes() as f64
        );
    }
}

/// (run time ns, runs) of this process's `profcol_cpu_sample` program.
fn sampler_stats() -> (u64, u64) {
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(target) = std::fs::read_link(entry.path()) else { continue };
        if target.to_string_lossy() != "anon_inode:bpf-prog" {
            continue;
        }
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<RawFd>() else { continue };
        // SAFETY: the fd is open in this process for the duration of the call.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let Ok(info) = sys::prog_info(fd.as_fd()) else { continue };
        let name: Vec<u8> = info.name.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        if name.starts_with(b"profcol_cpu_sa") {
            return (info.run_time_ns, info.run_cnt);
        }
    }
    panic!("no profcol_cpu_sample program among this process's fds");
}

/// ns per sample, and samples, for one run of `bin` under `mode`.
async fn kernel_ns_per_sample(bin: &Path, mode: UnwindMode, count_in_kernel: bool) -> (f64, u64) {
    let mut w = Workload::spawn(bin, SECONDS);
    let pid = w.pid;
    let running = start(EbpfConfig {
        sample_frequency: FREQ,
        report_interval: Duration::from_secs(1),
        pids: vec![pid],
        unwind: UnwindConfig { mode, ..Default::default() },
        count_in_kernel,
        ..Default::default()
    })
    .await;
    // The workload waits for go(): every sample of it falls between the
    // two reads (its first ones before its tables are loaded too).
    let (t0, _) = sampler_stats();
    w.go();
    tokio::task::spawn_blocking(move || w.wait_cpu_ns()).await.unwrap();
    let (t1, _) = sampler_stats();
    let (_, metrics) = running.stop().await;
    // Counted samples are in the total once the last report took them.
    let samples = metric(&metrics, "profcol_receiver_ebpf_samples_total") as u64;
    ((t1 - t0) as f64 / samples.max(1) as f64, samples)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    table_builds();
    if std::env::args().any(|a| a == "tables") {
        return;
    }
    if profcol_receivers::ebpf::bpf::privileges::Privileges::current().check().is_err() {
        println!("in-kernel cost: skipped (needs root or CAP_BPF+CAP_PERFMON)");
        return;
    }
    let before = std::fs::read_to_string(STATS_SYSCTL).unwrap_or_else(|_| "0".into());
    std::fs::write(STATS_SYSCTL, "1").expect("enable kernel.bpf_stats_enabled (root)");
    let dir = tempfile::tempdir().unwrap();
    let fp = compile_workload("deep.c", "deep_fp", dir.path(), &["-O2", "-fno-omit-frame-pointer"]);
    let omit = compile_workload("deep.c", "deep_omit", dir.path(), &["-O2", "-fomit-frame-pointer"]);
    let settings = [
        ("frame_pointers, frame-pointer build (baseline)", UnwindMode::FramePointers, &fp, false),
        ("auto (tables), frame-pointer build", UnwindMode::Auto, &fp, false),
        ("auto (tables), -fomit-frame-pointer build", UnwindMode::Auto, &omit, false),
        ("counted in the kernel: frame_pointers, frame-pointer build", UnwindMode::FramePointers, &fp, true),
        ("counted in the kernel: auto (tables), frame-pointer build", UnwindMode::Auto, &fp, true),
        ("counted in the kernel: auto (tables), -fomit-frame-pointer build", UnwindMode::Auto, &omit, true),
    ];
    let mut ns: Vec<Vec<f64>> = vec![Vec::new(); settings.len()];
    let mut counts = vec![0u64; settings.len()];
    for _ in 0..ROUNDS {
        for (i, (_, mode, bin, counted)) in settings.iter().enumerate() {
            let (v, n) = kernel_ns_per_sample(bin, *mode, *counted).await;
            ns[i].push(v);
            counts[i] += n;
        }
    }
    let _ = std::fs::write(STATS_SYSCTL, before.trim());
    let base = median(ns[0].clone());
    println!("\n## in-kernel time per sample ({FREQ} Hz, {SECONDS} s CPU per run, {ROUNDS} rounds interleaved)");
    println!("| setting | ns per sample (median) | runs | samples | × baseline |");
    println!("|---|---|---|---|---|");
    for (i, (label, _, _, _)) in settings.iter().enumerate() {
        let m = median(ns[i].clone());
        let runs: Vec<String> = ns[i].iter().map(|v| format!("{v:.0}")).collect();
        println!("| {label} | {m:.0} | {} | {} | {:.2} |", runs.join(", "), counts[i], m / base);
    }
}

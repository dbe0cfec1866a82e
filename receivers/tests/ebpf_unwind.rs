//! User stacks unwound with `.eh_frame` tables, end to end: the real
//! receiver and BPF program on programs compiled here without frame
//! pointers. Needs root (or CAP_BPF + CAP_PERFMON); fails under CI=true
//! without them, skips with a message otherwise.
//!
//!     sudo -E cargo test -p profcol-receivers --test ebpf_unwind -- --test-threads=1

mod ebpf_common;

use ebpf_common::*;
use profcol_receivers::ebpf::config::{UnwindConfig, UnwindMode};
use profcol_receivers::ebpf::stacks::aggregate::UNWIND_END_ATTR;
use profcol_receivers::ebpf::EbpfConfig;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const FREQ: u64 = 99;
const SECONDS: f64 = 3.0;

/// examples/workloads/deep.c compiled with `flags`.
fn build_deep(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    compile_workload("deep.c", name, dir, flags)
}

/// `deep.c` or `deep_rust.rs` run under the receiver with `mode`.
async fn profile(bin: &Path, mode: UnwindMode) -> (Vec<profcol_api::Profiles>, String, u32) {
    let config = EbpfConfig {
        sample_frequency: FREQ,
        report_interval: Duration::from_secs(1),
        unwind: UnwindConfig { mode, ..Default::default() },
        ..Default::default()
    };
    profile_workload(bin, SECONDS, config).await
}

/// The chain every sample should carry below its leaf, leaf first.
const CHAIN: [&str; 4] = ["deep_leaf", "deep_mid", "deep_top", "main"];

/// Function names of a sample's user frames, each looked up in the
/// binary of its mapping (return addresses minus 1: the call).
fn names(s: &Observed, syms: &mut Vec<(String, Symbolizer)>) -> Vec<String> {
    let user: Vec<&Frame> = s.frames.iter().filter(|f| f.frame_type == "native").collect();
    user.iter()
        .enumerate()
        .map(|(i, f)| {
            let Some(m) = &f.mapping else { return format!("{:#x}", f.address) };
            if !Path::new(&f.mapping_filename).is_file() {
                return format!("{}+{:#x}", f.mapping_filename, f.address - m.memory_start);
                // [vdso]
            }
            if !syms.iter().any(|(p, _)| *p == f.mapping_filename) {
                syms.push((f.mapping_filename.clone(), Symbolizer::new(Path::new(&f.mapping_filename))));
            }
            let sym = &syms.iter().find(|(p, _)| *p == f.mapping_filename).unwrap().1;
            let addr = if i == 0 { f.address } else { f.address - 1 };
            let base = Path::new(&f.mapping_filename).file_name().unwrap().to_string_lossy().to_string();
            match sym.function(m, addr) {
                Some(n) => n.to_owned(),
                None => format!("{base}+{:#x}", addr - m.memory_start + m.file_offset),
            }
        })
        .collect()
}

/// The sample's `profcol.unwind.end`, if any.
fn unwind_end(s: &Observed) -> Option<String> {
    s.attrs.iter().find(|(k, _)| k == UNWIND_END_ATTR).map(|(_, v)| format!("{v:?}"))
}

/// Prints the stacks that were not whole, with their sample counts.
fn print_counts(bad: &std::collections::BTreeMap<String, usize>) {
    for (stack, n) in bad {
        eprintln!("  {n:4} {stack}");
    }
}

/// Whether `stack` is CHAIN from some frame on, then libc's start routine
/// (in the binary when static, in libc.so.6 otherwise) and `_start` last.
fn whole(stack: &[String], is_static: bool) -> bool {
    whole_chain(stack, &CHAIN, is_static)
}

/// Whether `stack` is `chain` (ending in `main`) from some frame on, then
/// libc's start routine and `_start` last.
fn whole_chain(stack: &[String], chain: &[&str], is_static: bool) -> bool {
    let Some(k) = chain.iter().position(|c| stack.first().map(String::as_str) == Some(*c)) else {
        return false;
    };
    let n = chain.len() - k;
    if stack.len() != n + 3 || stack[..n] != chain[k..] {
        return false;
    }
    let (call_main, start_main) = (&stack[n], &stack[n + 1]);
    let call_main_ok =
        if is_static { call_main == "__libc_start_call_main" } else { call_main.starts_with("libc.so.6+") };
    call_main_ok && start_main.starts_with("__libc_start_main") && stack[n + 2] == "_start"
}

/// Runs `bin` under the receiver (only its pid sampled); returns the share
/// of its samples with whole stacks, after printing the ones without.
async fn whole_share(bin: &Path, is_static: bool, mode: UnwindMode) -> f64 {
    let (batches, metrics, pid) = profile(bin, mode).await;
    let samples = samples_of(&batches, pid);
    let mut syms = Vec::new();
    let (mut good, mut total) = (0, 0);
    let mut bad = std::collections::BTreeMap::<String, usize>::new();
    for s in &samples {
        let stack = names(s, &mut syms);
        total += s.count;
        let end = unwind_end(s);
        if whole(&stack, is_static) {
            assert_eq!(end, None, "a whole stack has no {UNWIND_END_ATTR}: {stack:?}");
            good += s.count;
        } else {
            *bad.entry(format!("{} (end {end:?})", stack.join(" <- "))).or_default() += s.count;
        }
    }
    let name = bin.file_name().unwrap().to_string_lossy();
    eprintln!("{name} ({mode:?}): {good}/{total} samples whole");
    print_counts(&bad);
    assert!(total as f64 >= FREQ as f64 * SECONDS * 0.5, "{name}: only {total} samples\n{metrics}");
    if mode != UnwindMode::FramePointers {
        assert!(metrics.contains("profcol_receiver_ebpf_unwind_table_builds_total{receiver=\"ebpf\"}"), "{metrics}");
        let outermost = metrics
            .lines()
            .find(|l| l.starts_with("profcol_receiver_ebpf_unwind_stack_end_total") && l.contains("outermost"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        assert!(outermost as f64 >= good as f64 * 0.9, "stack ends counted: {outermost} vs {good}\n{metrics}");
    }
    good as f64 / total as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stacks_without_frame_pointers_are_whole() {
    if !require_bpf("stacks_without_frame_pointers_are_whole") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let omit = ["-O2", "-fomit-frame-pointer"];
    let dynamic = build_deep(dir.path(), "deep_dynamic", &omit);
    let stat = build_deep(dir.path(), "deep_static", &[&omit[..], &["-static"]].concat());
    for (bin, is_static) in [(&dynamic, false), (&stat, true)] {
        let share = whole_share(bin, is_static, UnwindMode::Auto).await;
        assert!(share >= 0.95, "{}: {:.1}% whole stacks", bin.display(), share * 100.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frame_pointer_build_gives_the_same_stacks_under_auto() {
    if !require_bpf("frame_pointer_build_gives_the_same_stacks_under_auto") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fp = build_deep(dir.path(), "deep_fp", &["-O2", "-fno-omit-frame-pointer"]);
    let share = whole_share(&fp, false, UnwindMode::Auto).await;
    assert!(share >= 0.95, "{:.1}% whole stacks", share * 100.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_only_mode_unwinds_too() {
    if !require_bpf("tables_only_mode_unwinds_too") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = build_deep(dir.path(), "deep_static_tables", &["-O2", "-fomit-frame-pointer", "-static"]);
    let share = whole_share(&bin, true, UnwindMode::Tables).await;
    assert!(share >= 0.95, "{:.1}% whole stacks", share * 100.0);
}

/// A Rust release binary (rustc -C opt-level=2: no frame pointers):
/// `deep_rust_leaf` <- `deep_rust_mid` <- `deep_rust_top` <- `deep_rust::main`
/// (after the callees of `cpu_ns`'s file reads, when sampled there), std's
/// runtime frames, the C `main`, libc's start routine and `_start` last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_release_stacks_are_whole() {
    if !require_bpf("rust_release_stacks_are_whole") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = compile_workload("deep_rust.rs", "deep_rust", dir.path(), &["-C", "opt-level=2", "-C", "debuginfo=0"]);
    let (batches, metrics, pid) = profile(&bin, UnwindMode::Auto).await;
    let chain = ["deep_rust_leaf", "deep_rust_mid", "deep_rust_top", "deep_rust4main"];
    let mut syms = Vec::new();
    let (mut good, mut total) = (0, 0);
    let mut bad = std::collections::BTreeMap::<String, usize>::new();
    for s in &samples_of(&batches, pid) {
        let stack = names(s, &mut syms);
        total += s.count;
        // Callees of the chain (std's file reads in cpu_ns) may come first.
        let first = stack.iter().position(|f| chain.iter().any(|c| f.contains(c)));
        let k = first.and_then(|i| chain.iter().position(|c| stack[i].contains(c)));
        let stack = &stack[first.unwrap_or(0)..];
        let ok = k.is_some_and(|k| {
            let n = chain.len() - k;
            let c_main = stack.iter().position(|f| f == "main");
            stack.len() > n
                && stack[..n].iter().zip(&chain[k..]).all(|(f, c)| f.contains(c))
                && c_main.is_some_and(|m| {
                    m > n
                        && stack.len() == m + 4
                        && stack[m + 1].starts_with("libc.so.6+")
                        && stack[m + 2].starts_with("__libc_start_main")
                        && stack[m + 3] == "_start"
                })
        }) && !s.attrs.iter().any(|(k, _)| k == UNWIND_END_ATTR);
        if ok {
            good += s.count;
        } else {
            *bad.entry(stack.join(" <- ")).or_default() += s.count;
        }
    }
    eprintln!("deep_rust: {good}/{total} samples whole");
    print_counts(&bad);
    assert!(total as f64 >= FREQ as f64 * SECONDS * 0.5, "only {total} samples\n{metrics}");
    let share = good as f64 / total as f64;
    assert!(share >= 0.95, "{:.1}% whole stacks", share * 100.0);
}

/// Whole-stack share of a distribution binary run as `cmd args` for
/// SECONDS × 2: whole stacks end with libc's `__libc_start_main` and then
/// `_start` in the executable, and carry no `profcol.unwind.end`. Returns
/// (whole, total, samples with kernel frames).
async fn distribution_stacks(cmd: &str, args: &[&str]) -> (usize, usize, usize) {
    let mut child = Command::new(cmd)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd} runs: {e}"));
    let pid = child.id();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap().to_string_lossy().to_string();
    let running = start(EbpfConfig {
        sample_frequency: FREQ,
        report_interval: Duration::from_secs(1),
        pids: vec![pid],
        ..Default::default()
    })
    .await;
    tokio::time::sleep(Duration::from_secs_f64(SECONDS * 2.0)).await;
    let (batches, metrics) = running.stop().await;
    child.kill().unwrap();
    child.wait().unwrap();
    let samples = samples_of(&batches, pid);
    let mut syms = Vec::new();
    let (mut good, mut total, mut in_kernel) = (0, 0, 0);
    let mut bad = std::collections::BTreeMap::<String, usize>::new();
    for s in &samples {
        let stack = names(s, &mut syms);
        let user: Vec<&Frame> = s.frames.iter().filter(|f| f.frame_type == "native").collect();
        total += s.count;
        if s.frames.iter().any(|f| f.frame_type == "kernel") {
            in_kernel += s.count;
        }
        let end = unwind_end(s);
        let n = stack.len();
        let ok = n >= 4
            && end.is_none()
            && user[n - 1].mapping_filename == exe
            && stack[n - 2].starts_with("__libc_start_main")
            && user[n - 3].mapping_filename.ends_with("/libc.so.6");
        if ok {
            good += s.count;
        } else {
            *bad.entry(format!("{} (end {end:?})", stack.join(" <- "))).or_default() += s.count;
        }
    }
    let build_us = metrics
        .lines()
        .find(|l| l.starts_with("profcol_receiver_ebpf_unwind_table_build_microseconds_total"))
        .unwrap_or_default()
        .to_owned();
    eprintln!("{cmd}: {good}/{total} samples whole, {in_kernel} in the kernel; {build_us}");
    print_counts(&bad);
    assert!(total >= 100, "{total} samples\n{metrics}");
    (good, total, in_kernel)
}

/// Debian's `sha256sum` (stripped, no frame pointers) hashing /dev/zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distribution_sha256sum_stacks_are_whole() {
    if !require_bpf("distribution_sha256sum_stacks_are_whole") {
        return;
    }
    let (good, total, _) = distribution_stacks("sha256sum", &["/dev/zero"]).await;
    let share = good as f64 / total as f64;
    assert!(share >= 0.95, "{:.1}% whole stacks", share * 100.0);
}

/// `dd` copying /dev/zero to /dev/null: mostly in `read`, so most samples
/// are taken in kernel mode and the walk starts from the user registers
/// saved at syscall entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stacks_of_samples_taken_in_syscalls_are_whole() {
    if !require_bpf("stacks_of_samples_taken_in_syscalls_are_whole") {
        return;
    }
    let (good, total, in_kernel) = distribution_stacks("dd", &["if=/dev/zero", "of=/dev/null", "bs=4M"]).await;
    assert!(in_kernel * 2 >= total, "mostly kernel samples: {in_kernel}/{total}");
    let share = good as f64 / total as f64;
    assert!(share >= 0.95, "{:.1}% whole stacks", share * 100.0);
}

/// Names functions the same way for both sides of the perf comparison: the
/// file's symbols, else the `.eh_frame` FDE holding the address (stripped
/// code), as `file+0xFDE_START`.
#[derive(Default)]
struct FunctionNamer {
    files: std::collections::HashMap<String, (Symbolizer, Vec<(u64, u64)>)>,
}

impl FunctionNamer {
    fn load(&mut self, path: &str) -> &(Symbolizer, Vec<(u64, u64)>) {
        self.files.entry(path.to_owned()).or_insert_with(|| {
            let fdes = File::open(path)
                .ok()
                .and_then(|f| profcol_elf::ElfFile::open(&f).ok())
                .map(|e| e.fde_ranges())
                .unwrap_or_default();
            (Symbolizer::new(Path::new(path)), fdes)
        })
    }

    /// The function at the file's virtual address `v` of `path`.
    fn name(&mut self, path: &str, v: u64) -> String {
        let base = Path::new(path).file_name().map(|b| b.to_string_lossy().to_string()).unwrap_or_default();
        let (sym, fdes) = self.load(path);
        if let Some(n) = sym.function_at(v) {
            return n.to_owned();
        }
        let i = fdes.partition_point(|&(s, _)| s <= v);
        match i.checked_sub(1).map(|i| fdes[i]) {
            Some((s, e)) if v < e => format!("{base}+{s:#x}"),
            _ => format!("{base}+{v:#x}?"),
        }
    }

    /// A profcol sample's user stack, leaf first, at most 16 functions.
    fn profcol_stack(&mut self, s: &Observed) -> Vec<String> {
        let user: Vec<&Frame> = s.frames.iter().filter(|f| f.frame_type == "native").take(16).collect();
        user.iter()
            .enumerate()
            .map(|(i, f)| {
                let Some(m) = &f.mapping else { return format!("{:#x}?", f.address) };
                if !Path::new(&f.mapping_filename).is_file() {
                    return f.mapping_filename.clone(); // [vdso]
                }
                let addr = if i == 0 { f.address } else { f.address - 1 };
                let v = self.load(&f.mapping_filename).0.vaddr(m, addr);
                match v {
                    Some(v) => self.name(&f.mapping_filename, v),
                    None => format!("{addr:#x}?"),
                }
            })
            .collect()
    }
}

/// `perf script`'s user call chains (leaf first, at most 16 functions) of
/// `perf.data`, named by `namer`.
fn perf_stacks(data: &Path, namer: &mut FunctionNamer) -> Vec<Vec<String>> {
    let out = Command::new("perf")
        .args(["script", "--no-inline", "-F", "ip,dso", "-i"])
        .arg(data)
        .output()
        .expect("run perf script (linux-perf)");
    assert!(out.status.success(), "perf script: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut stacks = Vec::new();
    for block in text.split("\n\n") {
        let mut frames: Vec<(u64, String)> = Vec::new();
        for line in block.lines() {
            let line = line.trim();
            let (Some((ip, rest)), Some(open)) = (line.split_once(' '), line.rfind('(')) else { continue };
            let dso = rest[open - ip.len() - 1..].trim_start_matches('(').trim_end_matches(')').to_owned();
            if dso == "[kernel.kallsyms]" || !(dso.starts_with('/') || dso == "[vdso]") {
                continue; // kernel frames, unknown objects
            }
            let Ok(ip) = u64::from_str_radix(ip, 16) else { continue };
            frames.push((ip, dso));
        }
        if frames.is_empty() {
            continue;
        }
        // perf prints a frame as its offset in the file (`map_ip`): the
        // same as the virtual address in PIE code, not in a non-PIE binary.
        let stack = frames
            .iter()
            .take(16)
            .enumerate()
            .map(|(i, (off, dso))| {
                let off = if i == 0 { *off } else { off - 1 };
                if dso == "[vdso]" {
                    return dso.clone();
                }
                match namer.load(dso).0.vaddr_of_offset(off) {
                    Some(v) => namer.name(dso, v),
                    None => format!("{dso}@{off:#x}?"),
                }
            })
            .collect();
        stacks.push(stack);
    }
    stacks
}

/// Share of each stack in `stacks`.
fn distribution<'a>(stacks: impl Iterator<Item = (&'a Vec<String>, usize)>) -> std::collections::HashMap<String, f64> {
    let mut counts = std::collections::HashMap::<String, f64>::new();
    let mut total = 0.0;
    for (s, n) in stacks {
        *counts.entry(s.join(";")).or_default() += n as f64;
        total += n as f64;
    }
    counts.values_mut().for_each(|v| *v /= total.max(1.0));
    counts
}

/// Σ min(a, b) over stacks: 1 when the distributions are the same.
fn overlap(a: &std::collections::HashMap<String, f64>, b: &std::collections::HashMap<String, f64>) -> f64 {
    a.iter().map(|(k, v)| v.min(b.get(k).copied().unwrap_or(0.0))).sum()
}

/// profcol and `perf record --call-graph dwarf` (which unwinds the same
/// `.eh_frame` in user space from a copy of the stack) profile the same
/// process at once; both sides named by [`FunctionNamer`]. Returns the
/// overlap of the two distributions of leaf-first function sequences and
/// perf's overlap with itself (odd against even samples).
async fn agreement_with_perf(cmd: &str, args: &[&str]) -> (f64, f64) {
    let mut child = Command::new(cmd)
        .args(args)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd} runs: {e}"));
    let pid = child.id();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("perf.data");
    let running = start(EbpfConfig {
        sample_frequency: FREQ,
        report_interval: Duration::from_secs(1),
        pids: vec![pid],
        // A time per sample: only those inside perf's run are compared.
        count_in_kernel: false,
        // The native walk against perf's: no Python frames in place of
        // the interpreter's eval calls (collector/tests/python_frames.rs
        // checks those against py-spy).
        interpreters: Vec::new(),
        ..Default::default()
    })
    .await;
    // Tables in first, so both sides see the same steady state.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let perf = Command::new("perf")
        .args(["record", "-q", "-F", &FREQ.to_string(), "--call-graph", "dwarf,65528", "-p", &pid.to_string(), "-o"])
        .arg(&data)
        .args(["--", "sleep", "8"])
        .stdout(std::process::Stdio::null())
        .status();
    let t1 = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let (batches, _) = running.stop().await;
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(perf.expect("run perf record (linux-perf)").success(), "perf record failed");
    let mut namer = FunctionNamer::default();
    let ours: Vec<(Vec<String>, usize)> = samples_of(&batches, pid)
        .iter()
        .map(|s| {
            let n = s.timestamps.iter().filter(|&&t| t >= t0 && t <= t1).count();
            (namer.profcol_stack(s), n)
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    let theirs = perf_stacks(&data, &mut namer);
    let a = distribution(ours.iter().map(|(s, n)| (s, *n)));
    let b = distribution(theirs.iter().map(|s| (s, 1)));
    let odd = distribution(theirs.iter().step_by(2).map(|s| (s, 1)));
    let even = distribution(theirs.iter().skip(1).step_by(2).map(|s| (s, 1)));
    let (agree, noise) = (overlap(&a, &b), overlap(&odd, &even));
    let n_ours: usize = ours.iter().map(|(_, n)| n).sum();
    eprintln!("{cmd}: profcol {n_ours} samples, perf {}; overlap {agree:.3}, perf halves {noise:.3}", theirs.len());
    let mut top: Vec<(&String, &f64)> = a.iter().collect();
    top.sort_by(|x, y| y.1.total_cmp(x.1));
    for (k, v) in top.iter().take(5) {
        eprintln!("  profcol {:.3} perf {:.3} {k}", v, b.get(*k).copied().unwrap_or(0.0));
    }
    let mut top: Vec<(&String, &f64)> = b.iter().filter(|(k, _)| !a.contains_key(*k)).collect();
    top.sort_by(|x, y| y.1.total_cmp(x.1));
    for (k, v) in top.iter().take(3) {
        eprintln!("  perf only {v:.3} {k}");
    }
    assert!(n_ours >= 100 && theirs.len() >= 100, "too few samples: {n_ours} and {}", theirs.len());
    (agree, noise)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distribution_binaries_agree_with_perf_dwarf() {
    if !require_bpf("distribution_binaries_agree_with_perf_dwarf")
        || !profcol_testkit::tools::tool_available("perf", &["--version"])
    {
        return;
    }
    // Debian's interpreter (stripped, no frame pointers), not a pyenv shim.
    let python = "/usr/bin/python3";
    let loop_src = "def f(n):\n    return sum(i * i for i in range(n))\nwhile True:\n    f(1000)\n";
    for (cmd, args) in [("sha256sum", vec!["/dev/zero"]), (python, vec!["-c", loop_src])] {
        let (agree, noise) = agreement_with_perf(cmd, &args).await;
        // The goal is 0.9; where perf does not agree with itself that well
        // (python3's spread of stacks at 99 Hz over 8 s: 0.92 in one run),
        // profcol must come within 0.05 of perf's own agreement.
        let want = 0.9f64.min(noise - 0.05);
        assert!(agree >= want, "{cmd}: overlap with perf {agree:.3} < {want:.3} (perf against itself: {noise:.3})");
    }
}

/// `examples/workloads/cgo_deep.go` built with `go build`: with `cgo`,
/// against `libcgo_deep_lib.so` (`cgo_deep_lib.c`, `-O2
/// -fomit-frame-pointer`); without, pure Go (internally linked, no
/// `.eh_frame`).
fn build_cgo_deep(dir: &Path, cgo: bool) -> PathBuf {
    let workloads = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/workloads");
    let bin = dir.join(if cgo { "cgo_deep" } else { "go_deep" });
    let mut go = Command::new(std::env::var("GO").unwrap_or_else(|_| "go".into()));
    // go needs a build cache; without HOME (some CI runners) one here.
    if std::env::var_os("HOME").is_none() && std::env::var_os("XDG_CACHE_HOME").is_none() {
        go.env("GOCACHE", dir.join("gocache"));
    }
    go.args(["build", "-o"]).arg(&bin).arg(workloads.join("cgo_deep.go"));
    // Files named on the command line are built whatever their build tags.
    if cgo {
        compile_workload(
            "cgo_deep_lib.c",
            "libcgo_deep_lib.so",
            dir,
            &["-O2", "-fomit-frame-pointer", "-shared", "-fPIC"],
        );
        go.arg(workloads.join("cgo_deep_c.go"))
            .env("CGO_ENABLED", "1")
            .env("CGO_LDFLAGS", format!("-L{0} -Wl,-rpath,{0}", dir.display()));
    } else {
        go.arg(workloads.join("cgo_deep_pure.go")).env("CGO_ENABLED", "0");
    }
    let status = go.status().expect("run go (golang-go)");
    assert!(status.success(), "go build {}", bin.display());
    bin
}

/// The Go chain of `cgo_deep.go`, leaf first, as the frame-pointer walk
/// gives it: down to `runtime.goexit`, the bottom of a goroutine's stack.
const GO_CHAIN: [&str; 6] = ["main.goLeaf", "main.goMid", "main.goTop", "main.main", "runtime.main", "runtime.goexit"];

/// Whether frame name `f` is function `want` (Go assembly symbols carry an
/// ABI suffix such as `.abi0`).
fn is_fn(f: &str, want: &str) -> bool {
    f == want || f.strip_prefix(want).is_some_and(|s| s.starts_with(".abi"))
}

/// Frames of `stack` that are `chain` from some link of it on (None when
/// the stack does not start inside the chain or leaves it).
fn chain_prefix(stack: &[String], chain: &[&str]) -> Option<usize> {
    let k = chain.iter().position(|c| stack.first().is_some_and(|f| is_fn(f, c)))?;
    let n = chain.len() - k;
    (stack.len() >= n && stack[..n].iter().zip(&chain[k..]).all(|(f, c)| is_fn(f, c))).then_some(n)
}

/// A pure Go program (no cgo: no `.eh_frame`, its `.debug_frame` not
/// used) under `mode: auto`: ≥ 95% of its samples are exactly the Go chain
/// down to `runtime.goexit`, walked by frame pointers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pure_go_stacks_are_whole() {
    if !require_bpf("pure_go_stacks_are_whole") || !profcol_testkit::tools::tool_available("go", &["version"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = build_cgo_deep(dir.path(), false);
    let (batches, metrics, pid) = profile(&bin, UnwindMode::Auto).await;
    let mut syms = Vec::new();
    let (mut good, mut total) = (0, 0);
    let mut bad = std::collections::BTreeMap::<String, usize>::new();
    for s in &samples_of(&batches, pid) {
        let stack = names(s, &mut syms);
        total += s.count;
        let end = unwind_end(s);
        if chain_prefix(&stack, &GO_CHAIN) == Some(stack.len()) && end.is_none() {
            good += s.count;
        } else {
            *bad.entry(format!("{} (end {end:?})", stack.join(" <- "))).or_default() += s.count;
        }
    }
    eprintln!("go_deep: {good}/{total} samples whole");
    print_counts(&bad);
    assert!(total as f64 >= FREQ as f64 * SECONDS * 0.5, "only {total} samples\n{metrics}");
    assert!(good as f64 >= total as f64 * 0.95, "{good}/{total} whole");
}

/// A Go program (frame pointers) spinning alternately in a Go chain and,
/// through cgo, in a C library without frame pointers (tables), under
/// `mode: auto`. Each side of the Go/C stack switch comes out whole:
/// `goLeaf` <- `goMid` <- `goTop` <- `main.main` <- `runtime.main` <-
/// `runtime.goexit` and nothing after; `cgo_c_leaf` <- `cgo_c_mid` <-
/// `cgo_c_top` <- `runtime.asmcgocall` (the cgo wrapper tail-calls the C
/// function), then across the switch onto the goroutine's stack:
/// `runtime.cgocall` <- `main._Cfunc_cgo_c_top` <- `main.callC` <-
/// `main.main` <- `runtime.main` <- `runtime.goexit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_and_c_stacks_through_cgo_are_whole() {
    if !require_bpf("go_and_c_stacks_through_cgo_are_whole")
        || !profcol_testkit::tools::tool_available("go", &["version"])
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = build_cgo_deep(dir.path(), true);
    let (batches, metrics, pid) = profile(&bin, UnwindMode::Auto).await;
    let c_side = ["cgo_c_leaf", "cgo_c_mid", "cgo_c_top", "runtime.asmcgocall"];
    let go_caller =
        ["runtime.cgocall", "main._Cfunc_cgo_c_top", "main.callC", "main.main", "runtime.main", "runtime.goexit"];
    let mut syms = Vec::new();
    let (mut go_whole, mut go_total, mut c_whole, mut crossed, mut c_total, mut total) = (0, 0, 0, 0, 0, 0);
    let mut bad = std::collections::BTreeMap::<String, usize>::new();
    for s in &samples_of(&batches, pid) {
        let stack = names(s, &mut syms);
        total += s.count;
        let end = unwind_end(s);
        let ok = if stack.first().is_some_and(|f| f.starts_with("main.go")) {
            go_total += s.count;
            let ok = chain_prefix(&stack, &GO_CHAIN) == Some(stack.len()) && end.is_none();
            go_whole += if ok { s.count } else { 0 };
            ok
        } else if stack.first().is_some_and(|f| f.starts_with("cgo_c_")) {
            c_total += s.count;
            let n = chain_prefix(&stack, &c_side);
            let ok = n.is_some();
            c_whole += if ok { s.count } else { 0 };
            let rest = &stack[n.unwrap_or(stack.len())..];
            let across = rest.len() == go_caller.len() && chain_prefix(rest, &go_caller).is_some();
            crossed += if across && end.is_none() { s.count } else { 0 };
            ok
        } else {
            false
        };
        if !ok {
            *bad.entry(format!("{} (end {end:?})", stack.join(" <- "))).or_default() += s.count;
        }
    }
    eprintln!(
        "cgo_deep: Go side {go_whole}/{go_total} whole; C side {c_whole}/{c_total} whole, {crossed} across the \
         switch; {total} samples"
    );
    print_counts(&bad);
    assert!(total as f64 >= FREQ as f64 * SECONDS * 0.5, "only {total} samples\n{metrics}");
    assert!(go_total * 4 >= total && c_total * 4 >= total, "both sides sampled: Go {go_total}, C {c_total} of {total}");
    assert!(go_whole as f64 >= go_total as f64 * 0.95, "Go side: {go_whole}/{go_total} whole");
    assert!(c_whole as f64 >= c_total as f64 * 0.95, "C side: {c_whole}/{c_total} whole");
    assert!(crossed as f64 >= c_total as f64 * 0.9, "C side across the switch: {crossed}/{c_total}");
}

/// `mov $0xf,%rax; syscall` (rt_sigreturn): the code of libc's signal
/// trampoline `__restore_rt`, whose symbol a stripped libc does not keep.
const SIGRETURN_CODE: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05];

/// Whether the frame's address is a signal trampoline's first instruction
/// (the return address a handler was given).
fn is_sigreturn(f: &Frame) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let Some(m) = &f.mapping else { return false };
    let Ok(mut file) = File::open(&f.mapping_filename) else { return false };
    let mut code = [0u8; 9];
    file.seek(SeekFrom::Start(f.address - m.memory_start + m.file_offset)).is_ok()
        && file.read_exact(&mut code).is_ok()
        && code == SIGRETURN_CODE
}

/// `signal_deep.c` spends most of its time in a SIGPROF handler: its
/// stacks go sig_leaf <- sig_handler <- `__restore_rt` <- the interrupted
/// code (callees of `work_mid`, then the chain down to main, libc's start
/// routine and `_start`), with no `profcol.unwind.end`. Returns the share
/// of the handler's samples that are whole.
async fn signal_share(bin: &Path, is_static: bool) -> f64 {
    const WORK: [&str; 4] = ["work_leaf", "work_mid", "work_top", "main"];
    let (batches, metrics, pid) = profile(bin, UnwindMode::Auto).await;
    let mut syms = Vec::new();
    let (mut good, mut handler, mut total) = (0, 0, 0);
    let mut bad = std::collections::BTreeMap::<String, usize>::new();
    for s in &samples_of(&batches, pid) {
        let user: Vec<&Frame> = s.frames.iter().filter(|f| f.frame_type == "native").collect();
        let mut stack = names(s, &mut syms);
        total += s.count;
        let Some(t) = user.iter().skip(1).position(|f| is_sigreturn(f)).map(|i| i + 1) else {
            continue; // not in the handler
        };
        handler += s.count;
        stack[t] = "__restore_rt".into();
        let end = unwind_end(s);
        // The interrupted code: the work chain from the first of its
        // frames on (at most two callees before it: cpu_ns's clock_gettime
        // and the vdso).
        let interrupted = &stack[t + 1..];
        let chain_at = interrupted.iter().position(|f| WORK.contains(&f.as_str())).filter(|&i| i <= 2);
        let ok = stack[t - 1] == "sig_handler"
            && end.is_none()
            && chain_at.is_some_and(|i| whole_chain(&interrupted[i..], &WORK, is_static));
        if ok {
            good += s.count;
        } else {
            *bad.entry(format!("{} (end {end:?})", stack.join(" <- "))).or_default() += s.count;
        }
    }
    let name = bin.file_name().unwrap().to_string_lossy();
    eprintln!("{name}: {good}/{handler} handler samples whole ({total} samples)");
    print_counts(&bad);
    assert!(handler * 2 >= total && total as f64 >= FREQ as f64 * SECONDS * 0.5, "{handler}/{total}\n{metrics}");
    good as f64 / handler as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stacks_through_signal_handlers_are_whole() {
    if !require_bpf("stacks_through_signal_handlers_are_whole") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let omit = ["-O2", "-fomit-frame-pointer"];
    let dynamic = compile_workload("signal_deep.c", "signal_dynamic", dir.path(), &omit);
    let stat = compile_workload("signal_deep.c", "signal_static", dir.path(), &[&omit[..], &["-static"]].concat());
    for (bin, is_static) in [(&dynamic, false), (&stat, true)] {
        let share = signal_share(bin, is_static).await;
        assert!(share >= 0.95, "{}: {:.1}% whole handler stacks", bin.display(), share * 100.0);
    }
}

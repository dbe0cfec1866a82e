//! `targets:` against the real kernel: processes in real cgroup v2 groups,
//! the selection made in the BPF program, and perf as the count to meet.
//! Root / CAP_BPF and a mounted cgroup v2 hierarchy needed.

mod ebpf_common;

use ebpf_common::*;
use profcol_receivers::ebpf::targets::{Matcher, TargetsConfig};
use profcol_receivers::ebpf::EbpfConfig;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const FREQ: u64 = 199;

/// The cgroup2 mount point (`/sys/fs/cgroup`, or `.../unified` beside v1).
fn cgroup2_root() -> PathBuf {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            (right.starts_with("cgroup2 ") && f[3] == "/").then(|| PathBuf::from(f[4]))
        })
        .expect("a cgroup2 hierarchy is mounted")
}

/// A cgroup made for the test, removed when dropped (its processes moved
/// back to the root first).
struct Cgroup {
    dir: PathBuf,
    /// Its path as /proc/PID/cgroup shows it.
    path: String,
}

impl Cgroup {
    fn new(name: &str) -> Self {
        let path = format!("/profcol-test-{}-{name}", std::process::id());
        let dir = cgroup2_root().join(&path[1..]);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Cgroup { dir, path }
    }

    fn add(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let root = self.dir.parent().unwrap().join("cgroup.procs");
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for p in procs.lines() {
                let _ = std::fs::write(&root, p);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn copy_as(bin: &Path, name: &str) -> PathBuf {
    let to = bin.with_file_name(name);
    std::fs::copy(bin, &to).unwrap();
    to
}

fn total(batches: &[profcol_api::Profiles], pid: u32) -> usize {
    samples_of(batches, pid).iter().map(|s| s.count).sum()
}

fn unix_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}

fn targets(include: Vec<Matcher>, exclude: Vec<Matcher>) -> EbpfConfig {
    EbpfConfig {
        sample_frequency: FREQ,
        report_interval: Duration::from_secs(1),
        targets: TargetsConfig { include, exclude },
        // A time per sample: the late cgroup's first one is timed.
        count_in_kernel: false,
        ..Default::default()
    }
}

/// Two busy cgroups, one included; in it, a second executable excluded by
/// name. The others have no sample, the included one as many as perf
/// counts for it over the same window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_included_cgroup_is_sampled_and_counts_match_perf() {
    if !require_bpf("only_the_included_cgroup_is_sampled_and_counts_match_perf")
        || !profcol_testkit::tools::tool_available("perf", &["--version"])
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let burn = build_workload("burn", dir.path());
    let other = copy_as(&burn, "other");
    let (a, b) = (Cgroup::new("a"), Cgroup::new("b"));
    let mut kept = Workload::spawn(&burn, 6.0);
    let mut by_name = Workload::spawn(&other, 3.0);
    let mut outside = Workload::spawn(&burn, 3.0);
    a.add(kept.pid);
    a.add(by_name.pid);
    b.add(outside.pid);
    let config = targets(
        vec![Matcher { cgroup_path: Some(a.path.clone()), ..Default::default() }],
        vec![Matcher { executable: Some("other".into()), ..Default::default() }],
    );
    let running = start(config).await;
    let pids = (kept.pid, by_name.pid, outside.pid);
    // perf counts the kept process over its whole burn, as profcol does:
    // it attaches before the burn starts and ends when the process exits.
    let data = dir.path().join("perf.data");
    let mut perf = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "-F", &FREQ.to_string(), "-p", &pids.0.to_string(), "-o"])
        .arg(&data)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("run perf record");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    kept.go();
    by_name.go();
    outside.go();
    for w in [kept, by_name, outside] {
        tokio::task::spawn_blocking(move || w.wait_cpu_ns()).await.unwrap();
    }
    assert!(perf.wait().unwrap().success(), "perf record failed");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (batches, metrics) = running.stop().await;

    let script = Command::new("perf").args(["script", "-F", "pid", "-i"]).arg(&data).output().unwrap();
    let theirs = String::from_utf8_lossy(&script.stdout).lines().filter(|l| !l.trim().is_empty()).count();
    let ours = total(&batches, pids.0);
    let (named, other_cgroup) = (total(&batches, pids.1), total(&batches, pids.2));
    let filtered = metric(&metrics, "profcol_receiver_ebpf_samples_filtered_total");
    eprintln!(
        "kept {ours} (perf {theirs}), excluded by name {named}, other cgroup {other_cgroup}, filtered {filtered}"
    );
    assert_eq!(named, 0, "the excluded executable was sampled");
    assert_eq!(other_cgroup, 0, "the other cgroup was sampled");
    assert!(theirs >= 300, "perf saw {theirs} samples");
    let ratio = ours as f64 / theirs as f64;
    assert!((0.95..=1.05).contains(&ratio), "profcol {ours} vs perf {theirs} samples of the kept process\n{metrics}");
    // Both left out in the kernel: ~FREQ a second for 3 s each, at least.
    assert!(filtered >= FREQ as f64 * 3.0, "{filtered} samples filtered\n{metrics}");
}

/// A cgroup made after the receiver started is asked about by its first
/// sample and sampled within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cgroup_created_after_start_is_sampled_within_a_second() {
    if !require_bpf("a_cgroup_created_after_start_is_sampled_within_a_second") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let burn = build_workload("burn", dir.path());
    let prefix = format!("/profcol-test-{}-late*", std::process::id());
    let running = start(targets(vec![Matcher { cgroup_path: Some(prefix), ..Default::default() }], vec![])).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let late = Cgroup::new("late");
    let mut w = Workload::spawn(&burn, 2.0);
    let pid = w.pid;
    late.add(pid);
    let moved = unix_ns();
    let started = Instant::now();
    w.go();
    tokio::task::spawn_blocking(move || w.wait_cpu_ns()).await.unwrap();
    let ran = started.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (batches, metrics) = running.stop().await;
    let first = samples_of(&batches, pid).iter().flat_map(|s| s.timestamps.clone()).min();
    let first = first.unwrap_or_else(|| panic!("no sample of the late cgroup's process\n{metrics}"));
    let after = Duration::from_nanos(first.saturating_sub(moved));
    let n = total(&batches, pid);
    eprintln!("first sample {after:?} after the move; {n} samples over {ran:?}");
    assert!(after <= Duration::from_secs(1), "first sample {after:?} after the cgroup was joined");
    // And sampled from then on (2 s of CPU at FREQ, less the first second).
    assert!(n as f64 >= FREQ as f64 * 1.0, "{n} samples");
}

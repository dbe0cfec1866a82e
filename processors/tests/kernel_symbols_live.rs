//! kernel_symbols behind the real ebpf receiver, on real workloads (root).
//!
//!     sudo -E cargo test -p profcol-processors --test kernel_symbols_live

mod live;

use std::process::{Command, Stdio};
use std::time::Duration;

use live::{kernel_samples, require_root, Pipeline};
use profcol_receivers::ebpf::EbpfConfig;

/// A Python loop calling `os.getppid()`: the syscall frame is the x86-64
/// entry `__x64_sys_getppid`, never the `__ia32_sys_getppid` /
/// `__do_sys_getppid` aliases at the same address.
#[cfg(target_arch = "x86_64")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_getppid_loop_names_x64_sys_getppid() {
    if !require_root("python_getppid_loop_names_x64_sys_getppid") {
        return;
    }
    let script = "import os, sys, time\nsys.stdin.readline()\ng = os.getppid\nend = time.time() + 4.0\nwhile time.time() < end:\n    for _ in range(1000):\n        g()\n";
    let child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("python3: {e}; install it (.ci/kernel_symbols.sh)"));
    let pid = child.id();
    let p = Pipeline::start(EbpfConfig {
        sample_frequency: 99,
        report_interval: Duration::from_millis(500),
        pids: vec![pid],
        ..Default::default()
    })
    .await;
    profcol_testkit::workload::release_and_finish(child).await;
    let (batches, metrics) = p.stop().await;

    let samples = kernel_samples(&batches, pid);
    let total: usize = samples.iter().map(|s| s.timestamps.len()).sum();
    let with = |name: &str| {
        samples
            .iter()
            .filter(|s| s.kernel.iter().any(|f| f.function.as_ref().is_some_and(|(n, _)| n == name)))
            .map(|s| s.timestamps.len())
            .sum::<usize>()
    };
    let (x64, ia32, do_sys) = (with("__x64_sys_getppid"), with("__ia32_sys_getppid"), with("__do_sys_getppid"));
    eprintln!(
        "getppid: {total} samples, {x64} with __x64_sys_getppid, {ia32} __ia32_sys_getppid, {do_sys} __do_sys_getppid"
    );
    assert!(total >= 60, "only {total} samples of python3\n{metrics}");
    // Most of the loop is the interpreter and the syscall entry; the
    // syscall's own body is a few percent of the samples.
    assert!(x64 >= 3, "__x64_sys_getppid in only {x64} of {total} samples");
    assert_eq!((ia32, do_sys), (0, 0), "compat or inner aliases named");
    let unnamed: usize = samples.iter().flat_map(|s| &s.kernel).filter(|f| f.function.is_none()).count();
    assert_eq!(unnamed, 0, "unnamed kernel frames");
}

//! 100 failed reloads leave the process's OS threads, live tokio tasks, open
//! fds and BPF links where they were. Alone in its test binary: the counts
//! are process-wide, and another test running beside it would move them.

mod common;

use common::service::*;
use common::*;
use profcol_api::Exporter;
use std::time::{Duration, Instant};

fn count_dir(path: &str) -> usize {
    std::fs::read_dir(path).map(|d| d.count()).unwrap_or(0)
}

/// What this process's fds point at (for a failure message).
fn fd_targets() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return Vec::new() };
    let mut v: Vec<String> =
        dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok()).map(|p| p.display().to_string()).collect();
    v.sort();
    v
}

/// BPF links among this process's fds (the kernel's `link_id` in fdinfo).
fn bpf_links() -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/fdinfo") else { return 0 };
    dir.filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok()).filter(|t| t.contains("link_id:")).count()
}

#[derive(Debug, PartialEq, Clone, Copy)]
struct Footprint {
    os_threads: usize,
    tokio_tasks: usize,
    fds: usize,
    bpf_links: usize,
}

fn footprint() -> Footprint {
    Footprint {
        os_threads: count_dir("/proc/self/task"),
        tokio_tasks: tokio::runtime::Handle::current().metrics().num_alive_tasks(),
        fds: count_dir("/proc/self/fd"),
        bpf_links: bpf_links(),
    }
}

/// The footprint once it holds still (the same over five readings 200 ms
/// apart): transient threads and tasks of what just ran are gone.
async fn steady_footprint() -> Footprint {
    let mut last = footprint();
    let mut same = 0;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = footprint();
        same = if now == last { same + 1 } else { 0 };
        last = now;
        if same >= 4 {
            break;
        }
    }
    last
}

/// Waits (threads of the blocking pool idle out, stopped tasks finish) until
/// the footprint is back at `base`; returns the last one seen.
async fn settle_to(base: Footprint) -> Footprint {
    let t0 = Instant::now();
    loop {
        let now = footprint();
        if now == base || t0.elapsed() > Duration::from_secs(20) {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// 100 reloads that each start a health_check extension (a socket, a task),
/// an ebpf receiver (BPF program, perf events, sampler thread), a kernel_symbols processor (netlink and perf fds, tasks),
/// a changed batch processor and a second file exporter (an open file), and
/// then fail on the otlp receiver's port, held by someone else: afterwards the
/// process has the OS threads, live tokio tasks, fds and BPF links it had.
#[test]
fn a_hundred_failed_reloads_leave_threads_tasks_fds_and_bpf_links_where_they_were() {
    runtime().block_on(async {
        log();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.jsonl");
        let mut host = Host::start(&gateway("otlp", "127.0.0.1:0", "100ms", &out)).await;
        let addr = grpc_addr("otlp");
        let (taken, busy) = profcol_testkit::net::listener();
        let busy = busy.port();
        let bad = format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: 127.0.0.1:{busy}\n\
             \x20 ebpf:\n    sample_frequency: 49\n    report_interval: 1s\n\
             processors:\n  batch:\n    timeout: 300ms\n  kernel_symbols:\n\
             exporters:\n  file:\n    path: {out}\n  file/extra:\n    path: {extra}\n\
             extensions:\n  health_check/extra:\n    endpoint: 127.0.0.1:0\n\
             service:\n  extensions: [health_check/extra]\n  shutdown_timeout: 20s\n\
             \x20 telemetry:\n    metrics:\n      address: \"\"\n\
             \x20 pipelines:\n    profiles:\n      receivers: [ebpf, otlp]\n      processors: [kernel_symbols, batch]\n\
             \x20     exporters: [file, file/extra]\n",
            out = out.display(),
            extra = dir.path().join("extra.jsonl").display()
        );
        // One failed reload first, so what is made once per process (lazy
        // statics, the blocking pool's first threads) is not counted as a leak.
        let e = host.reload(&bad).await.unwrap_err();
        assert!(e.contains("receiver otlp") && e.contains(&busy.to_string()), "{e}");
        let base = steady_footprint().await;
        assert_eq!(base.bpf_links, 0, "the running graph has no ebpf receiver");
        for i in 0..100 {
            let e = host.reload(&bad).await.expect_err("the otlp port is taken");
            assert!(e.contains("cannot listen"), "reload {i}: {e}");
            assert!(host.status.running(), "a failed reload leaves the host running (health OK)");
        }
        // Each failed reload did start the parts it then released.
        let text = log().text();
        for started in ["health_check listening", "ebpf receiver: perf events attached"] {
            assert!(text.matches(started).count() >= 101, "{started:?} logged {} times", text.matches(started).count());
        }
        let after = settle_to(base).await;
        assert_eq!(after, base, "before vs after 100 failed reloads; fds now: {:?}", fd_targets());
        // The old graph still serves.
        let batch = profcol_testkit::batch::random_batch(7, 2, 200, 10, 6);
        sender(addr).export(&batch).await.unwrap();
        assert_all_arrive_once(&out, std::slice::from_ref(&batch)).await;
        // Nothing the failed graphs' receivers produced arrived anywhere (the
        // file exporter is shared with the running graph).
        assert!(read_jsonl(&dir.path().join("extra.jsonl")).is_empty());
        // Positive control: the same graph with a free port goes live, with BPF links.
        let good = bad.replace(&format!(":{busy}"), ":0");
        host.reload(&good).await.unwrap();
        assert!(bpf_links() > 0, "the ebpf receiver of the new graph attached BPF links");
        host.service.shutdown().await;
        drop(taken);
    });
}

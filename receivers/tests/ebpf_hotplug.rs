//! ebpf receiver and CPU hotplug, for real: CPU 1 is taken offline and
//! brought back while the receiver runs, and a thread pinned to CPU 1 must
//! be sampled on CPU 1 afterwards each time.
//!
//! This file is its own test binary on purpose, with a single test: cargo
//! runs test binaries one after the other, so offlining a CPU here never
//! disturbs another test (the other ebpf tests count samples per CPU
//! second and would see their threads migrated). Do not add tests here.
//!
//! Needs root (BPF, perf events and writing
//! /sys/devices/system/cpu/cpu1/online). Skipped with a message without
//! the privileges or without a hot-pluggable CPU 1; under CI=true both fail
//! instead. CPU 1 is put back online by a guard, also when the test fails.
//!
//!     sudo -E cargo test -p profcol-receivers --test ebpf_hotplug -- --nocapture

mod ebpf_common;

use ebpf_common::*;
use profcol_api::model::{any_value::Value, keys};
use profcol_receivers::ebpf::config::SampleAttribute;
use profcol_receivers::ebpf::EbpfConfig;
use std::time::{Duration, Instant};

const CPU1_ONLINE: &str = "/sys/devices/system/cpu/cpu1/online";
const FREQ: u64 = 99;
const BURN: Duration = Duration::from_millis(1500);
/// The receiver re-reads the online CPUs about once a second.
const FOLLOW_TIMEOUT: Duration = Duration::from_secs(5);

fn set_cpu1_online(online: bool) {
    std::fs::write(CPU1_ONLINE, if online { "1" } else { "0" })
        .unwrap_or_else(|e| panic!("writing {CPU1_ONLINE}: {e}"));
}

/// Takes CPU 1 offline; puts it back online when dropped (test end, failure
/// or panic), whatever the test did in between.
struct Cpu1Offline;

impl Cpu1Offline {
    fn new() -> Self {
        let guard = Cpu1Offline;
        set_cpu1_online(false);
        guard
    }
}

impl Drop for Cpu1Offline {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(CPU1_ONLINE, "1") {
            eprintln!("!!! could not bring CPU 1 back online ({e}): run `echo 1 > {CPU1_ONLINE}`");
        }
    }
}

/// Whether CPU 1 can be hot-plugged here; skips (fails under CI=true) if not.
fn require_cpu1_hotplug(test: &str) -> bool {
    let need = if std::path::Path::new(CPU1_ONLINE).exists() {
        Ok(())
    } else {
        Err(format!("{CPU1_ONLINE} does not exist (needs >= 2 CPUs and CPU hotplug)"))
    };
    profcol_testkit::tools::require(test, need)
}

/// A value of the receiver's metrics, by name prefix.
fn metric(running: &Running, name: &str) -> i64 {
    let text = running.registry.render();
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
}

/// Waits until `cond` holds on the receiver's metrics.
async fn wait_for(running: &Running, what: &str, cond: impl Fn(&Running) -> bool) -> Duration {
    let t = Instant::now();
    while !cond(running) {
        assert!(t.elapsed() < FOLLOW_TIMEOUT, "{what}: not within {FOLLOW_TIMEOUT:?}\n{}", running.registry.render());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    t.elapsed()
}

/// Burns CPU on a new thread pinned to `cpu` for `d`; returns its tid and
/// the CPU time it got.
async fn burn_on(cpu: usize, d: Duration) -> (i64, Duration) {
    tokio::task::spawn_blocking(move || {
        std::thread::spawn(move || {
            // SAFETY: a zeroed cpu_set_t is an empty set; pid 0 = this thread.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                let rc = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                assert_eq!(rc, 0, "pinning to CPU {cpu}: {}", std::io::Error::last_os_error());
            }
            // SAFETY: plain syscall.
            let tid = unsafe { libc::gettid() } as i64;
            let t = Instant::now();
            let mut x = 0u64;
            while t.elapsed() < d {
                for _ in 0..10_000 {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
                }
            }
            let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: ts is a valid timespec.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
            (tid, Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
        })
        .join()
        .unwrap()
    })
    .await
    .unwrap()
}

/// Samples of thread `tid` per CPU (`cpu.logical_number`), as (cpu, count).
fn per_cpu(batches: &[profcol_api::Profiles], tid: i64) -> Vec<(i64, usize)> {
    let mut m = std::collections::BTreeMap::new();
    for s in samples_of(batches, std::process::id()) {
        if !s.attrs.contains(&(keys::THREAD_ID.into(), Value::IntValue(tid))) {
            continue;
        }
        let cpu = s
            .attrs
            .iter()
            .find(|(k, _)| k == keys::CPU_LOGICAL_NUMBER)
            .map(|(_, v)| match v {
                Value::IntValue(c) => *c,
                other => panic!("cpu.logical_number is {other:?}"),
            })
            .expect("every sample has cpu.logical_number");
        *m.entry(cpu).or_insert(0) += s.count;
    }
    m.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpus_coming_online_after_start_are_sampled() {
    const TEST: &str = "cpus_coming_online_after_start_are_sampled";
    if !require_bpf(TEST) || !require_cpu1_hotplug(TEST) {
        return;
    }
    // The receiver's hotplug log lines, shown with --nocapture.
    let _ =
        tracing_subscriber::fmt().with_test_writer().with_ansi(false).with_max_level(tracing::Level::INFO).try_init();
    let started = Instant::now();
    let _restore = Cpu1Offline::new();
    // Only this process (in-kernel pid filter): the burners are its threads.
    let running = start(EbpfConfig {
        sample_frequency: FREQ,
        report_interval: Duration::from_millis(500),
        pids: vec![std::process::id()],
        sample_attributes: vec![SampleAttribute::ThreadId, SampleAttribute::CpuLogicalNumber],
        ..Default::default()
    })
    .await;
    assert_eq!(metric(&running, "profcol_receiver_ebpf_cpus_sampled"), 1, "CPU 1 is offline at start");
    let attaches = |r: &Running| metric(r, "profcol_receiver_ebpf_cpu_attaches_total");
    let sampled = |r: &Running| metric(r, "profcol_receiver_ebpf_cpus_sampled");
    assert_eq!(attaches(&running), 1);

    // 1. CPU 1 comes online after start.
    set_cpu1_online(true);
    let took = wait_for(&running, "CPU 1 attached after coming online", |r| sampled(r) == 2).await;
    eprintln!("hotplug: CPU 1 online -> attached after {took:?}");
    let first = burn_on(1, BURN).await;

    // 2. Offline, seen offline (its event detached), back online.
    set_cpu1_online(false);
    let took = wait_for(&running, "CPU 1 seen offline", |r| sampled(r) == 1).await;
    eprintln!("hotplug: CPU 1 offline -> detached after {took:?}");
    set_cpu1_online(true);
    let took = wait_for(&running, "CPU 1 attached again", |r| sampled(r) == 2 && attaches(r) == 3).await;
    eprintln!("hotplug: CPU 1 online again -> attached after {took:?}");
    let second = burn_on(1, BURN).await;

    // 3. Offline and online back to back, faster than the receiver looks at
    // the online list: the old event is dead although CPU 1 always looks
    // online, and the receiver must notice (liveness probe) and replace it.
    set_cpu1_online(false);
    set_cpu1_online(true);
    let took = wait_for(&running, "CPU 1 re-attached after a quick cycle", |r| attaches(r) == 4).await;
    eprintln!("hotplug: quick offline/online -> re-attached after {took:?}");
    let third = burn_on(1, BURN).await;

    let (batches, metrics) = running.stop().await;
    for (name, (tid, cpu_time)) in [("first", first), ("second", second), ("third", third)] {
        let per_cpu = per_cpu(&batches, tid);
        let expected = FREQ as f64 * cpu_time.as_secs_f64();
        let on_cpu1 = per_cpu.iter().find(|(c, _)| *c == 1).map_or(0, |(_, n)| *n);
        eprintln!("hotplug: {name} burner (tid {tid}, {cpu_time:?} CPU): samples per CPU {per_cpu:?}, expected ~{expected:.0}");
        assert!(
            on_cpu1 as f64 >= 0.6 * expected,
            "{name} burner: {on_cpu1} samples on CPU 1, expected ~{expected:.0} ({per_cpu:?})\n{metrics}"
        );
        // A sample or two may predate the pin (thread start, the
        // sched_setaffinity call itself on another CPU).
        let elsewhere: usize = per_cpu.iter().filter(|(c, _)| *c != 1).map(|(_, n)| n).sum();
        assert!(elsewhere <= 3, "pinned to CPU 1 but sampled elsewhere: {per_cpu:?}");
    }
    assert!(metrics.contains("profcol_receiver_ebpf_cpu_attach_failures_total{receiver=\"ebpf\"} 0"), "{metrics}");
    eprintln!("hotplug: test body took {:?}", started.elapsed());
}

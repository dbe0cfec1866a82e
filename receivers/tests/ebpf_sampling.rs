//! ebpf receiver, end to end: real BPF program, real perf events, real
//! workloads. Needs root (or CAP_BPF + CAP_PERFMON); fails under CI=true
//! without them, skips with a message otherwise.
//!
//!     sudo -E cargo test -p profcol-receivers --test ebpf_sampling -- --test-threads=1

mod ebpf_common;

use ebpf_common::*;
use profcol_api::model::{any_value::Value, keys};
use profcol_receivers::ebpf::config::{SampleAttribute, UnwindConfig, UnwindMode};
use profcol_receivers::ebpf::EbpfConfig;
use std::time::Duration;

const FREQ: u64 = 99;
const BURN_SECONDS: f64 = 3.0;

/// A time per sample (`count_in_kernel: false`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burn_workload_is_sampled_in_its_hot_function() {
    if !require_bpf("burn_workload_is_sampled_in_its_hot_function") {
        return;
    }
    burn_workload(false).await;
}

/// Counted per stack in the kernel (the default): the same counts and
/// stacks, each Sample with its count and no times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burn_workload_counted_in_the_kernel_is_sampled_in_its_hot_function() {
    if !require_bpf("burn_workload_counted_in_the_kernel_is_sampled_in_its_hot_function") {
        return;
    }
    burn_workload(true).await;
}

/// The burn workload run for BURN_SECONDS under a receiver made from
/// `config(its pid)`, stopped `settle` after it ended.
struct Burned {
    bin: std::path::PathBuf,
    pid: u32,
    cpu_ns: u64,
    batches: Vec<profcol_api::Profiles>,
    metrics: String,
    /// Unix ns just before the burn began and just after the receiver stopped.
    t0: u64,
    t1: u64,
    _dir: tempfile::TempDir,
}

async fn burn_under(config: impl FnOnce(u32) -> EbpfConfig, settle: Duration) -> Burned {
    let dir = tempfile::tempdir().unwrap();
    let bin = build_workload("burn", dir.path());
    let mut w = Workload::spawn(&bin, BURN_SECONDS);
    let pid = w.pid;
    let running = start(config(pid)).await;
    let t0 = unix_ns();
    w.go();
    let cpu_ns = tokio::task::spawn_blocking(move || w.wait_cpu_ns()).await.unwrap();
    tokio::time::sleep(settle).await;
    let (batches, metrics) = running.stop().await;
    Burned { bin, pid, cpu_ns, batches, metrics, t0, t1: unix_ns(), _dir: dir }
}

async fn burn_workload(count_in_kernel: bool) {
    // Whole host (no pid filter), as the node agent runs.
    let config = |_| EbpfConfig {
        sample_frequency: FREQ,
        report_interval: Duration::from_secs(1),
        count_in_kernel,
        ..Default::default()
    };
    // `_dir` keeps the binary for the symbolizer below.
    let Burned { bin, pid, cpu_ns, batches, metrics, t0, t1, _dir } =
        burn_under(config, Duration::from_millis(300)).await;

    let samples = samples_of(&batches, pid);
    assert!(!samples.is_empty(), "no batch contains pid {pid}; {} batches\n{metrics}", batches.len());
    let total: usize = samples.iter().map(|s| s.count).sum();

    // Sample count ~ frequency x CPU seconds the workload actually burned
    // (CPU time, not wall time: the host may be shared).
    let expected = FREQ as f64 * cpu_ns as f64 / 1e9;
    let ratio = total as f64 / expected;
    eprintln!("burn: {total} samples, expected {expected:.0} (cpu {:.2}s), ratio {ratio:.2}", cpu_ns as f64 / 1e9);
    assert!((0.7..=1.3).contains(&ratio), "sample count {total} not within ±30% of {expected:.0}\n{metrics}");

    // >= 70% of samples have profcol_burn_hot in the user stack, symbolized
    // from the binary's own symbol table through the batch's mappings.
    let sym = Symbolizer::new(&bin);
    let exe = bin.to_string_lossy().to_string();
    let mut hot = 0;
    for s in &samples {
        let found = s.frames.iter().filter(|f| f.frame_type == "native").any(|f| {
            f.mapping_filename == exe
                && f.mapping.as_ref().and_then(|m| sym.function(m, f.address)) == Some("profcol_burn_hot")
        });
        if found {
            hot += s.count;
        }
    }
    let share = hot as f64 / total as f64;
    eprintln!("burn: {hot}/{total} samples in profcol_burn_hot ({:.0}%)", share * 100.0);
    assert!(share >= 0.7, "only {:.0}% of samples in profcol_burn_hot", share * 100.0);

    // The data model: resource, sample attributes, timestamps, build id.
    let s = samples.iter().max_by_key(|s| s.count).unwrap();
    assert!(s.resource.contains(&(keys::PROCESS_EXECUTABLE_NAME.into(), Value::StringValue("burn".into()))));
    assert!(s.resource.contains(&(keys::PROCESS_EXECUTABLE_PATH.into(), Value::StringValue(exe.clone()))));
    assert!(s.resource.iter().any(|(k, _)| k == keys::HOST_NAME));
    assert!(s.attrs.contains(&(keys::THREAD_ID.into(), Value::IntValue(pid as i64))));
    assert!(s.attrs.contains(&(keys::THREAD_NAME.into(), Value::StringValue("burn".into()))));
    // The CPU is not among the default sample attributes: stacks merge across CPUs.
    assert!(!s.attrs.iter().any(|(k, _)| k == keys::CPU_LOGICAL_NUMBER), "{:?}", s.attrs);
    // service.name: the executable's name by default.
    assert!(s.resource.contains(&(keys::SERVICE_NAME.into(), Value::StringValue("burn".into()))), "{:?}", s.resource);
    let counted = metric(&metrics, "profcol_receiver_ebpf_samples_counted_in_kernel_total");
    if count_in_kernel {
        // The burn loop is one stack: nearly all its samples were only counted.
        assert!(counted >= total as f64 * 0.5, "{counted} of {total} samples counted in the kernel\n{metrics}");
        // The process's first samples, before the unwinder loaded it, came
        // one by one (its tables are built from its second sample); the
        // rest are counts without times.
        let with_times: usize = samples.iter().filter(|s| !s.timestamps.is_empty()).map(|s| s.count).sum();
        assert!(with_times <= total / 4, "{with_times} of {total} samples came one by one");
        for s in &samples {
            assert!(s.timestamps.is_empty() || s.timestamps.len() == s.count, "{s:?}");
        }
    } else {
        assert_eq!(counted, 0.0, "{metrics}");
        for s in &samples {
            assert_eq!(s.timestamps.len(), s.count);
            for &t in &s.timestamps {
                assert!(t >= t0 - 1_000_000_000 && t <= t1, "timestamp {t} outside [{t0}, {t1}]");
            }
        }
    }
    let exe_frame = s.frames.iter().find(|f| f.mapping_filename == exe).expect("a frame in the executable");
    assert!(sym.build_id.is_some(), "workload linked with --build-id");
    assert_eq!(exe_frame.build_id, sym.build_id, "mapping carries the GNU build id");
    // Leaf first: the first user frame is the hot function itself.
    let first_user = s.frames.iter().find(|f| f.frame_type == "native").unwrap();
    assert_eq!(sym.function(first_user.mapping.as_ref().unwrap(), first_user.address), Some("profcol_burn_hot"));
    assert!(metrics.contains("profcol_receiver_ebpf_samples_lost_ringbuf_total{receiver=\"ebpf\"} 0"), "{metrics}");
}

/// A counted stack is a record once while it recurs, not once per report:
/// its count stays in the kernel's map across reports and only its growth
/// is handed on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recurring_counted_stack_is_recorded_once_not_per_report() {
    if !require_bpf("a_recurring_counted_stack_is_recorded_once_not_per_report") {
        return;
    }
    // Only the burn process: the kernel's counters below are all its own.
    let config = |pid| EbpfConfig {
        sample_frequency: FREQ,
        report_interval: Duration::from_millis(300),
        count_in_kernel: true,
        pids: vec![pid],
        ..Default::default()
    };
    let Burned { pid, batches, metrics, .. } = burn_under(config, Duration::from_millis(400)).await;
    let samples = samples_of(&batches, pid);
    let total: usize = samples.iter().map(|s| s.count).sum();
    let one_by_one: usize = samples.iter().filter(|s| !s.timestamps.is_empty()).map(|s| s.count).sum();
    // A Sample per stack and report it had samples in.
    let appearances = samples.iter().filter(|s| s.timestamps.is_empty()).count();
    let counted = metric(&metrics, "profcol_receiver_ebpf_samples_counted_in_kernel_total") as usize;
    // Every counted stack's first sample is its record; the rest only counts.
    let records = total - one_by_one - counted;
    eprintln!("burn: {total} samples in {} batches, {appearances} counted Samples, {records} records", batches.len());
    assert!(
        batches.len() >= 5,
        "{} reports
{metrics}",
        batches.len()
    );
    assert!(
        appearances >= 10,
        "the burn loop's stacks recur in every report: {appearances}
{metrics}"
    );
    // A record per stack and report would make records == appearances.
    assert!(
        records * 2 <= appearances,
        "{records} records for {appearances} stack-reports
{metrics}"
    );
    assert!(metrics.contains("profcol_receiver_ebpf_samples_counted_unnamed_total{receiver=\"ebpf\"} 0"), "{metrics}");
}

/// Pins process `pid` to one CPU.
fn pin(pid: u32, cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET stays in bounds.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(libc::sched_setaffinity(pid as i32, std::mem::size_of_val(&set), &set), 0, "pin {pid} to {cpu}");
    }
}

fn unix_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// Runs `burn` on CPU 0, then on CPU 1 (moved half-way); returns its
/// samples per batch and the (unix ns) time of the move.
async fn burn_on_two_cpus(sample_attributes: Vec<SampleAttribute>) -> (Vec<Vec<Observed>>, u64) {
    let dir = tempfile::tempdir().unwrap();
    let bin = build_workload("burn", dir.path());
    let mut w = Workload::spawn(&bin, 1.6);
    let pid = w.pid;
    pin(pid, 0);
    let cfg = EbpfConfig {
        sample_frequency: FREQ,
        report_interval: Duration::from_secs(30),
        pids: vec![pid],
        sample_attributes,
        // Which side of the move a sample is on: its time.
        count_in_kernel: false,
        ..Default::default()
    };
    let running = start(cfg).await;
    w.go();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let moved = unix_ns();
    pin(pid, 1);
    tokio::task::spawn_blocking(move || w.wait_cpu_ns()).await.unwrap();
    let (batches, _) = running.stop().await;
    (batches.iter().map(|b| samples_of(std::slice::from_ref(b), pid)).collect(), moved)
}

/// The identity of a sample's stack: its frames' addresses.
fn stack_of(o: &Observed) -> Vec<u64> {
    o.frames.iter().map(|f| f.address).collect()
}

/// Under the default sample attributes the same stack sampled on two CPUs
/// is one Sample (its timestamps on both sides of the move); with
/// `cpu.logical_number` asked for it is one Sample per CPU, each with its CPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_stack_on_two_cpus_is_one_sample_unless_the_cpu_is_asked_for() {
    if !require_bpf("the_same_stack_on_two_cpus_is_one_sample_unless_the_cpu_is_asked_for") {
        return;
    }
    if !std::path::Path::new("/sys/devices/system/cpu/cpu1").exists() {
        assert!(!profcol_testkit::tools::in_ci(), "CI=true: this test needs two CPUs");
        eprintln!("SKIPPED: needs two CPUs");
        return;
    }
    // A margin around the move: samples taken while it happens are on either CPU.
    let margin = 20_000_000;
    let (batches, moved) = burn_on_two_cpus(EbpfConfig::default().sample_attributes).await;
    let mut spanning = 0;
    for samples in &batches {
        let stacks: Vec<Vec<u64>> = samples.iter().map(stack_of).collect();
        let distinct: std::collections::BTreeSet<&Vec<u64>> = stacks.iter().collect();
        assert_eq!(distinct.len(), stacks.len(), "each stack is one Sample of its batch");
        for o in samples {
            assert!(!o.attrs.iter().any(|(k, _)| k == keys::CPU_LOGICAL_NUMBER), "{:?}", o.attrs);
            let before = o.timestamps.iter().any(|&t| t + margin < moved);
            let after = o.timestamps.iter().any(|&t| t > moved + margin);
            if before && after {
                spanning += 1;
            }
        }
    }
    assert!(spanning > 0, "some stack was sampled on CPU 0 and on CPU 1, each in one Sample");

    let cpu_of = |o: &Observed| match o.attrs.iter().find(|(k, _)| k == keys::CPU_LOGICAL_NUMBER) {
        Some((_, Value::IntValue(c))) => *c,
        other => panic!("cpu.logical_number asked for, got {other:?}"),
    };
    let all = vec![SampleAttribute::ThreadId, SampleAttribute::ThreadName, SampleAttribute::CpuLogicalNumber];
    let (batches, moved) = burn_on_two_cpus(all).await;
    let mut split = 0;
    for samples in &batches {
        let mut cpus_of_stack: std::collections::BTreeMap<Vec<u64>, Vec<i64>> = Default::default();
        for o in samples {
            let cpu = cpu_of(o);
            for &t in &o.timestamps {
                if t + margin < moved {
                    assert_eq!(cpu, 0, "sampled before the move");
                } else if t > moved + margin {
                    assert_eq!(cpu, 1, "sampled after the move");
                }
            }
            cpus_of_stack.entry(stack_of(o)).or_default().push(cpu);
        }
        split += cpus_of_stack.values().filter(|c| c.len() == 2).count();
    }
    assert!(split > 0, "a stack sampled on both CPUs is two Samples, one per CPU");
}

/// `sha256sum` (Debian's stripped binary, no frame pointers): the kernel's
/// frame-pointer walk through it and through libc reports 0s and junk after
/// the real frames. Every stack the receiver hands on ends at its last real
/// frame, each user frame inside a mapping of the process, and the cut
/// stacks are counted. (`unwind: frame_pointers`: with tables, in the
/// default mode, these stacks are whole; see tests/ebpf_unwind.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stacks_of_code_without_frame_pointers_end_at_their_last_real_frame() {
    if !require_bpf("stacks_of_code_without_frame_pointers_end_at_their_last_real_frame") {
        return;
    }
    let mut child = std::process::Command::new("sha256sum")
        .arg("/dev/zero")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("sha256sum (coreutils) runs");
    let pid = child.id();
    let running = start(EbpfConfig {
        sample_frequency: 199,
        report_interval: Duration::from_secs(1),
        pids: vec![pid],
        unwind: UnwindConfig { mode: UnwindMode::FramePointers, ..Default::default() },
        ..Default::default()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (batches, metrics) = running.stop().await;
    child.kill().unwrap();
    child.wait().unwrap();
    let samples = samples_of(&batches, pid);
    let total: usize = samples.iter().map(|s| s.count).sum();
    assert!(total >= 20, "{total} samples of sha256sum\n{metrics}");
    for s in &samples {
        for f in &s.frames {
            assert_ne!(f.address, 0, "a 0x0 frame");
            if f.frame_type == "native" {
                assert!(f.mapping.is_some(), "user frame {:#x} in no mapping: {:?}", f.address, s.frames);
            }
        }
    }
    let cut: u64 = metrics
        .lines()
        .find(|l| l.starts_with("profcol_receiver_ebpf_stacks_cut_total{"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no stacks_cut series:\n{metrics}"));
    assert!(cut > 0, "sha256sum's walks end in 0 or junk, and were cut:\n{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syscall_workload_yields_kernel_frames_in_kernel_text() {
    if !require_bpf("syscall_workload_yields_kernel_frames_in_kernel_text") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = build_workload("readzero", dir.path());
    // 4 s of wall time: enough CPU for 50+ samples even on a shared host.
    let mut w = Workload::spawn(&bin, 4.0);
    let pid = w.pid;
    // Only this process (exercises the `pids` option).
    let running = start(EbpfConfig {
        sample_frequency: FREQ,
        report_interval: Duration::from_secs(1),
        pids: vec![pid],
        ..Default::default()
    })
    .await;
    w.go();
    let cpu_ns = tokio::task::spawn_blocking(move || w.wait_cpu_ns()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (batches, metrics) = running.stop().await;

    // With the pid filter, no other process appears.
    for b in &batches {
        for rp in &b.0.resource_profiles {
            let pid_attr = rp.resource.as_ref().unwrap().attributes.iter().find(|a| a.key == keys::PROCESS_PID);
            assert_eq!(pid_attr.and_then(|a| a.value.clone()).and_then(|v| v.value), Some(Value::IntValue(pid as i64)));
        }
    }
    let samples = samples_of(&batches, pid);
    let total: usize = samples.iter().map(|s| s.count).sum();
    assert!(total > 50, "too few samples ({total})\n{metrics}");
    // And in proportion to the CPU it burned (frequency x CPU seconds).
    let expected = FREQ as f64 * cpu_ns as f64 / 1e9;
    assert!(total as f64 >= 0.7 * expected, "{total} samples for {expected:.0} expected\n{metrics}");
    let (stext, etext) = kernel_text();
    assert!(stext != 0, "/proc/kallsyms shows zero addresses (kptr_restrict); run as root");
    let mut with_kernel = 0;
    let mut kernel_frames = 0;
    for s in &samples {
        let k: Vec<_> = s.frames.iter().filter(|f| f.frame_type == "kernel").collect();
        if !k.is_empty() {
            with_kernel += s.count;
        }
        for f in &k {
            assert_eq!(f.mapping_filename, keys::KERNEL_MAPPING);
            assert!(
                f.address >= stext && f.address < etext,
                "kernel frame {:#x} outside kernel text [{stext:#x}, {etext:#x})",
                f.address
            );
            kernel_frames += 1;
        }
        // Kernel frames come first (leaf first), then user frames.
        if let Some(first_native) = s.frames.iter().position(|f| f.frame_type == "native") {
            assert!(s.frames[first_native..].iter().all(|f| f.frame_type == "native"));
        }
    }
    if let Some(top) = samples.iter().max_by_key(|s| s.count) {
        let names = kallsyms_names(top.frames.iter().filter(|f| f.frame_type == "kernel").map(|f| f.address));
        eprintln!("readzero: most common stack ({} samples), kernel part: {names:?}", top.count);
    }
    eprintln!("readzero: {with_kernel}/{total} samples with kernel frames, {kernel_frames} kernel frames checked");
    assert!(with_kernel as f64 >= 0.5 * total as f64, "only {with_kernel}/{total} samples have kernel frames");
}

/// Nearest preceding text symbol of each address, from /proc/kallsyms.
fn kallsyms_names(addrs: impl Iterator<Item = u64>) -> Vec<String> {
    let text = std::fs::read_to_string("/proc/kallsyms").unwrap();
    let mut syms: Vec<(u64, String)> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let a = u64::from_str_radix(f.next()?, 16).ok()?;
            let t = f.next()?;
            matches!(t, "t" | "T").then(|| (a, f.next().unwrap_or("").to_owned()))
        })
        .collect();
    syms.sort();
    addrs
        .map(|a| {
            let i = syms.partition_point(|(s, _)| *s <= a);
            i.checked_sub(1).map(|i| syms[i].1.clone()).unwrap_or_else(|| format!("{a:#x}"))
        })
        .collect()
}

/// A sink that holds the first batch until released: downstream is stuck.
struct Stuck {
    release: tokio::sync::Semaphore,
    got: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl profcol_api::component::Consumer for Stuck {
    async fn consume(&self, _batch: profcol_api::Profiles) -> Result<(), profcol_api::component::ConsumeError> {
        let _permit = self.release.acquire().await;
        self.got.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backpressure_fills_the_ring_and_losses_are_counted() {
    use profcol_api::component::{ComponentId, Consumer, Kind, Next, Receiver};
    use std::sync::Arc;
    if !require_bpf("backpressure_fills_the_ring_and_losses_are_counted") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = build_workload("burn", dir.path());
    let mut w = Workload::spawn(&bin, 2.0);
    let registry = profcol_api::telemetry::Telemetry::new();
    let id: ComponentId = "ebpf".parse().unwrap();
    let telemetry = registry.component(Kind::Receiver, &id);
    let receiver = profcol_receivers::ebpf::EbpfReceiver::new(
        profcol_api::CreateSettings { id, telemetry: telemetry.clone(), services: Default::default() },
        EbpfConfig {
            sample_frequency: 999,
            report_interval: Duration::from_millis(100),
            ring_buffer_size: Some(4096), // one page
            ..Default::default()
        },
    );
    let sink = Arc::new(Stuck { release: tokio::sync::Semaphore::new(0), got: Default::default() });
    receiver.start(Next::new(vec![sink.clone() as Arc<dyn Consumer>], telemetry)).await.unwrap();
    w.go();
    let _ = tokio::task::spawn_blocking(move || w.wait_cpu_ns()).await.unwrap();
    // Downstream was stuck the whole time; now let it drain and stop.
    sink.release.add_permits(1_000_000);
    receiver.shutdown().await.unwrap();
    let metrics = registry.render();
    let value = |name: &str| -> u64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing:\n{metrics}"))
    };
    let lost = value("profcol_receiver_ebpf_samples_lost_ringbuf_total");
    let dropped = value("profcol_receiver_dropped_samples_total");
    let delivered = value("profcol_receiver_ebpf_samples_total");
    eprintln!("backpressure: {delivered} samples read, {lost} lost to the full ring buffer");
    assert!(lost > 0, "a one-page ring with stuck downstream must overflow\n{metrics}");
    assert_eq!(dropped, lost);
    assert!(sink.got.load(std::sync::atomic::Ordering::SeqCst) >= 1);
}

/// Re-runs this test binary as `nobody` (no capabilities) and checks that
/// start fails with a message naming what is missing and how to grant it.
#[test]
fn start_without_privileges_names_what_is_missing() {
    if std::env::var("PROFCOL_EBPF_UNPRIVILEGED_CHILD").is_ok() {
        return; // we are the child: the check runs in unprivileged_child_start
    }
    if !require_bpf("start_without_privileges_names_what_is_missing") {
        return; // already unprivileged: needs root to drop to nobody
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"])
        .arg(&exe)
        .args(["--exact", "unprivileged_child_start", "--ignored", "--nocapture", "--test-threads=1"])
        .env("PROFCOL_EBPF_UNPRIVILEGED_CHILD", "1")
        .env_remove("CI")
        .output()
        .expect("run setpriv (util-linux)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(text.contains("UNPRIVILEGED-START-ERROR"), "child did not run the check:\n{text}");
}

#[tokio::test]
#[ignore = "runs only as the unprivileged child of start_without_privileges_names_what_is_missing"]
async fn unprivileged_child_start() {
    use profcol_api::component::{ComponentId, Kind, Next, Receiver};
    assert!(
        std::env::var("PROFCOL_EBPF_UNPRIVILEGED_CHILD").is_ok(),
        "run by start_without_privileges_names_what_is_missing as user nobody"
    );
    let id: ComponentId = "ebpf".parse().unwrap();
    let telemetry = profcol_api::telemetry::ComponentTelemetry::detached(Kind::Receiver, &id);
    let receiver = profcol_receivers::ebpf::EbpfReceiver::new(
        profcol_api::CreateSettings { id, telemetry: telemetry.clone(), services: Default::default() },
        EbpfConfig::default(),
    );
    let err = receiver.start(Next::new(vec![], telemetry)).await.expect_err("start must fail unprivileged");
    let msg = err.to_string();
    assert!(msg.contains("receivers::ebpf"), "{msg}");
    assert!(msg.contains("missing: CAP_BPF, CAP_PERFMON"), "{msg}");
    assert!(msg.contains("setcap cap_bpf,cap_perfmon"), "{msg}");
    assert!(msg.contains("root"), "{msg}");
    if std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .is_ok_and(|p| p.trim().parse::<i32>().unwrap_or(0) > 0)
    {
        assert!(msg.contains("kernel.perf_event_paranoid"), "{msg}");
    }
    println!("UNPRIVILEGED-START-ERROR: {msg}");
}

//! Uprobes in the ebpf receiver, for real (root / CAP_BPF+CAP_PERFMON+
//! CAP_SYS_ADMIN): the negative cache across 200 execs, a binary replaced
//! in place, exact call counts with the user stack's leaf, 50 concurrent
//! processes sharing one attachment (links checked through the kernel), and
//! a process in another mount namespace.
//!
//! Tests run one at a time (one receiver with probes at a time), each with
//! a probe on a binary name of its own so running processes never match.

mod ebpf_common;

use ebpf_common::{build_workload, require_bpf, samples_of, start, Observed, Running, Symbolizer};
use profcol_api::model::any_value::Value;
use profcol_receivers::ebpf::config::UprobeSpec;
use profcol_receivers::ebpf::EbpfConfig;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What every test starts with: privileges, its turn, a directory with the
/// probe_target workload, and a binary name of its own.
struct Setup {
    _turn: tokio::sync::MutexGuard<'static, ()>,
    dir: tempfile::TempDir,
    /// `profcol-<tag>-<pid>`: the probe's `binary:`.
    name: String,
    /// probe_target, built in `dir`.
    target: PathBuf,
}

async fn setup(test: &str, tag: &str) -> Option<Setup> {
    if !require_bpf(test) {
        return None;
    }
    let turn = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let target = build_workload("probe_target", dir.path());
    Some(Setup { _turn: turn, name: format!("profcol-{tag}-{}", std::process::id()), target, dir })
}

const SYMBOL: &str = "profcol_probe_target";

fn config(binary: &str) -> EbpfConfig {
    EbpfConfig {
        sample_frequency: 1,
        report_interval: Duration::from_millis(500),
        uprobes: vec![UprobeSpec { symbol: SYMBOL.into(), binary: Some(binary.into()) }],
        ..EbpfConfig::default()
    }
}

/// Value of a `profcol_receiver_<name>` series (summed over its labels).
fn metric(running: &Running, name: &str) -> u64 {
    let full = format!("profcol_receiver_{name}");
    running
        .registry
        .render()
        .lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(full.as_str()))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Waits (up to 20 s) until `cond` holds; the panic shows the metrics.
fn wait_for(running: &Running, what: &str, cond: impl Fn(&Running) -> bool) {
    let until = Instant::now() + Duration::from_secs(20);
    while !cond(running) {
        assert!(Instant::now() < until, "timed out waiting for {what}\n{}", running.registry.render());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn copy_named(src: &Path, dir: &Path, name: &str) -> PathBuf {
    let dst = dir.join(name);
    std::fs::copy(src, &dst).unwrap();
    dst
}

/// A running probe_target process.
struct Target {
    child: Child,
    pid: u32,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Target {
    fn spawn(cmd: &mut Command) -> Self {
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("spawn probe target");
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let pid =
            line.trim().strip_prefix("ready ").unwrap_or_else(|| panic!("ready line, got {line:?}")).parse().unwrap();
        Target { child, pid, stdin, stdout }
    }

    fn call(&mut self, n: u64) {
        writeln!(self.stdin.as_mut().unwrap(), "call {n}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), format!("called {n}"));
    }

    /// Closes stdin; the process exits.
    fn finish(mut self) {
        drop(self.stdin.take());
        assert!(self.child.wait().unwrap().success());
    }
}

/// Probe samples (calls) of `pid` for our symbol.
fn calls_of(batches: &[profcol_api::Profiles], pid: u32) -> Vec<Observed> {
    samples_of(batches, pid)
        .into_iter()
        .filter(|s| s.sample_type == ("calls".to_string(), "count".to_string()))
        .inspect(|s| {
            assert!(
                s.profile_attrs.contains(&("profcol.uprobe.symbol".into(), Value::StringValue(SYMBOL.into()))),
                "probe profile names its symbol: {:?}",
                s.profile_attrs
            )
        })
        .collect()
}

/// Links of the loaded `profcol_uprobe` program, as the kernel lists them.
fn kernel_uprobe_links() -> usize {
    let ids: Vec<u32> = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| p.name_as_str() == Some(profcol_ebpf::UPROBE_PROGRAM))
        .map(|p| p.id())
        .collect();
    aya::programs::loaded_links().filter_map(Result::ok).filter(|l| ids.contains(&l.program_id())).count()
}

fn strip(path: &Path) {
    let status = Command::new("strip").arg(path).status().expect("run strip (binutils)");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripped_binary_parsed_once_then_replaced_in_place_and_counted() {
    let Some(Setup { _turn, dir, name, target }) =
        setup("stripped_binary_parsed_once_then_replaced_in_place_and_counted", "neg").await
    else {
        return;
    };
    let brief = build_workload("brief", dir.path());
    let prog = copy_named(&brief, dir.path(), &name);
    strip(&prog);
    let running = start(config(&name)).await;

    // 200 execs, 50 alive at a time (each lives 300 ms so its exec event
    // finds it in /proc).
    for _wave in 0..4 {
        let kids: Vec<Child> = (0..50).map(|_| Command::new(&prog).arg("300").spawn().unwrap()).collect();
        for mut k in kids {
            assert!(k.wait().unwrap().success());
        }
    }
    wait_for(&running, "200 exec events and 199 verdict hits", |r| {
        metric(r, "ebpf_process_execs_total") >= 200 && metric(r, "ebpf_uprobe_negative_hits_total") >= 199
    });
    assert_eq!(metric(&running, "ebpf_uprobe_binaries_parsed_total"), 1, "{}", running.registry.render());
    // Every exec after the first was answered by the verdict (other execs on
    // the host count too: their binaries get a verdict without a parse).
    assert!(metric(&running, "ebpf_uprobe_negative_hits_total") >= 199);
    assert_eq!(metric(&running, "ebpf_uprobe_attachments"), 0);

    // Replaced in place (same inode, new size and mtime) by a binary that
    // has the symbol: looked at again, attached, its calls counted.
    let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    let before = ino(&prog);
    std::fs::write(&prog, std::fs::read(&target).unwrap()).unwrap();
    assert_eq!(ino(&prog), before, "rewritten in place");
    let mut t = Target::spawn(&mut Command::new(&prog));
    wait_for(&running, "the attachment", |r| metric(r, "ebpf_uprobe_attachments") == 1);
    assert_eq!(metric(&running, "ebpf_uprobe_binaries_parsed_total"), 2);
    t.call(300);
    let pid = t.pid;
    t.finish();
    wait_for(&running, "the detach", |r| metric(r, "ebpf_uprobe_attachments") == 0);
    let (batches, metrics) = running.stop().await;
    let calls: usize = calls_of(&batches, pid).iter().map(|s| s.count).sum();
    assert_eq!(calls, 300, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_call_count_with_the_function_as_leaf() {
    let Some(Setup { _turn, dir, name, target }) = setup("exact_call_count_with_the_function_as_leaf", "exact").await
    else {
        return;
    };
    let bin = copy_named(&target, dir.path(), &name);
    let running = start(config(&name)).await;
    // Started through a shell that execs it: two exec events of one pid.
    let mut t = Target::spawn(Command::new("sh").args(["-c", &format!("exec {}", bin.display())]));
    wait_for(&running, "the attachment", |r| metric(r, "ebpf_uprobe_attachments") == 1);
    const N: u64 = 1234;
    t.call(N);
    let pid = t.pid;
    // Stay alive until the receiver drained these samples: a process gone
    // before its samples are read keeps the mappings of its exec'ing shell
    // (the pinning registry removes that limit).
    tokio::time::sleep(Duration::from_millis(800)).await;
    t.finish();
    // Run again after the detach: attached again (parsed again), counted.
    wait_for(&running, "the detach", |r| metric(r, "ebpf_uprobe_attachments") == 0);
    let mut again = Target::spawn(&mut Command::new(&bin));
    wait_for(&running, "the second attachment", |r| metric(r, "ebpf_uprobe_attachments") == 1);
    again.call(5);
    let pid2 = again.pid;
    again.finish();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (batches, metrics) = running.stop().await;
    assert_eq!(calls_of(&batches, pid2).iter().map(|s| s.count).sum::<usize>(), 5, "{metrics}");
    let calls = calls_of(&batches, pid);
    let total: usize = calls.iter().map(|s| s.count).sum();
    assert_eq!(total as u64, N, "{metrics}");
    assert!(metrics.contains("profcol_receiver_ebpf_uprobe_probe_hits_total{receiver=\"ebpf\"} 1239"), "{metrics}");
    let sym = Symbolizer::new(&bin);
    for s in &calls {
        let leaf = s.frames.iter().find(|f| f.frame_type == "native").expect("a user frame");
        let m = leaf.mapping.as_ref().expect("leaf in a mapping");
        assert_eq!(
            sym.function(m, leaf.address),
            Some(SYMBOL),
            "leaf {:#x} in {}",
            leaf.address,
            leaf.mapping_filename
        );
        // The caller is next on the stack.
        let caller = s.frames.iter().filter(|f| f.frame_type == "native").nth(1).expect("a caller frame");
        assert_eq!(sym.function(caller.mapping.as_ref().unwrap(), caller.address - 1), Some("call_many"));
        assert!(s.attrs.iter().any(|(k, _)| k == "thread.id"));
    }
    let res = &calls[0].resource;
    assert!(res.contains(&("process.executable.name".into(), Value::StringValue(name.clone()))), "{res:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_processes_share_one_attachment_gone_after_the_last_exit() {
    let Some(Setup { _turn, dir, name, target }) =
        setup("fifty_processes_share_one_attachment_gone_after_the_last_exit", "fifty").await
    else {
        return;
    };
    let bin = copy_named(&target, dir.path(), &name);
    let running = start(config(&name)).await;
    assert_eq!(kernel_uprobe_links(), 0);
    let targets: Vec<Target> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..50).map(|_| s.spawn(|| Target::spawn(&mut Command::new(&bin)))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    wait_for(&running, "50 holders", |r| metric(r, "ebpf_uprobe_holders") == 50);
    assert_eq!(metric(&running, "ebpf_uprobe_binaries_parsed_total"), 1, "{}", running.registry.render());
    assert_eq!(metric(&running, "ebpf_uprobe_attachments"), 1);
    assert_eq!(metric(&running, "ebpf_uprobe_positive_hits_total"), 49);
    assert_eq!(kernel_uprobe_links(), 1, "one uprobe link in the kernel");
    let mut targets = targets;
    for t in &mut targets {
        t.call(2);
    }
    let pids: Vec<u32> = targets.iter().map(|t| t.pid).collect();
    for t in targets {
        t.finish();
    }
    wait_for(&running, "the detach", |r| metric(r, "ebpf_uprobe_attachments") == 0);
    assert_eq!(metric(&running, "ebpf_uprobe_holders"), 0);
    assert_eq!(kernel_uprobe_links(), 0, "the kernel lists no uprobe link after the last exit");
    let (batches, metrics) = running.stop().await;
    for pid in pids {
        let calls: usize = calls_of(&batches, pid).iter().map(|s| s.count).sum();
        assert_eq!(calls, 2, "pid {pid}\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_in_another_mount_namespace_is_probed() {
    let Some(Setup { _turn, dir, name, target: built }) =
        setup("process_in_another_mount_namespace_is_probed", "mntns").await
    else {
        return;
    };
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let inside = mnt.join(&name);
    let running = start(config(&name)).await;
    // A tmpfs mounted only in the child's namespace holds the binary: its
    // path does not exist on the host, and the host cannot reach the file.
    let script = format!(
        "mount -t tmpfs none {m} && cp {b} {i} && exec {i}",
        m = mnt.display(),
        b = built.display(),
        i = inside.display()
    );
    let mut t = Target::spawn(Command::new("unshare").args(["-m", "--propagation", "private", "sh", "-c", &script]));
    assert!(!inside.exists(), "the binary's path does not exist in the host's mount namespace");
    wait_for(&running, "the attachment", |r| metric(r, "ebpf_uprobe_attachments") == 1);
    t.call(77);
    let pid = t.pid;
    t.finish();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (batches, metrics) = running.stop().await;
    let calls: usize = calls_of(&batches, pid).iter().map(|s| s.count).sum();
    assert_eq!(calls, 77, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_gone_before_their_events_are_read_are_still_looked_at() {
    let Some(Setup { _turn, dir, name, .. }) =
        setup("processes_gone_before_their_events_are_read_are_still_looked_at", "gone").await
    else {
        return;
    };
    let prog = copy_named(&build_workload("brief", dir.path()), dir.path(), &name);
    let running = start(config(&name)).await;
    // Each exits at once: gone long before its exec is read. The kernel's
    // mapping record still names the executable (path, device, inode).
    for _ in 0..100 {
        assert!(Command::new(&prog).status().unwrap().success());
    }
    wait_for(&running, "a verdict for every exec", |r| {
        metric(r, "ebpf_uprobe_binaries_parsed_total") + metric(r, "ebpf_uprobe_negative_hits_total") >= 100
    });
    assert_eq!(metric(&running, "ebpf_uprobe_binaries_parsed_total"), 1, "{}", running.registry.render());
    assert_eq!(metric(&running, "ebpf_uprobe_mapping_records_lost_total"), 0);
    running.stop().await;
}

#[test]
fn kernel_mapping_records_name_the_executable_after_its_exec() {
    use profcol_receivers::ebpf::process::mmap_events::{MappingBatch, MappingEventKind, MappingEvents};
    use std::os::unix::fs::MetadataExt;
    if !require_bpf("kernel_mapping_records_name_the_executable_after_its_exec") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let prog = build_workload("brief", dir.path());
    let cpus = profcol_ebpf::sys::online_cpus().unwrap();
    let mut events = MappingEvents::open(&cpus).expect("perf side-band events");
    let pid = Command::new(&prog).spawn().unwrap().id();
    std::thread::sleep(Duration::from_millis(100));
    let mut batch = MappingBatch::default();
    events.read(&mut batch);
    let mine: Vec<_> = batch.events.iter().filter(|e| e.pid == pid).collect();
    assert!(matches!(mine.first().map(|e| e.kind), Some(MappingEventKind::Exec)), "the exec comes first: {mine:?}");
    let md = std::fs::metadata(&prog).unwrap();
    let exe = mine.iter().find_map(|e| match e.kind {
        MappingEventKind::Map(m) if batch.path(&m) == prog.as_os_str().as_encoded_bytes() => Some((e.time_ns, m)),
        _ => None,
    });
    let (time, exe) = exe.unwrap_or_else(|| panic!("a mapping of {} in {mine:?}", prog.display()));
    assert_eq!((exe.dev(), exe.ino), (md.dev(), md.ino()), "the kernel's device and inode are stat's");
    assert!(time > mine[0].time_ns);
    let libc =
        mine.iter().any(|e| matches!(e.kind, MappingEventKind::Map(m) if batch.path(&m).ends_with(b"/libc.so.6")));
    assert!(libc, "libraries mapped by the loader come too: {mine:?}");
    assert_eq!(batch.lost, 0);
}

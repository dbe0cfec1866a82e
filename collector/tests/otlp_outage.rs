//! Outage: profcol's otlp exporter points at a closed port; the backend
//! appears 10 s later and every batch profcol accepted arrives (the host's
//! retry wrapper around the otlp exporter). With the persistent queue,
//! profcol is SIGKILLed during the outage (with and without a batch
//! processor in front) and restarted: every batch it had accepted still
//! arrives, exactly once. Also: SIGTERM keeps the queue; a full queue makes
//! senders retry instead of losing data; a reload hands the queue to the new
//! exporter instance; a second profcol cannot share the queue directory.

mod common;

use common::backend;
use profcol_api::component::Kind;
use profcol_api::model::{canonical, pb, ProfileMeta};
use profcol_api::{Exporter, Profiles, ProfilesBuilder, Receiver};
use profcol_exporters::otlp::{OtlpGrpcConfig, OtlpGrpcExporter};
use profcol_receivers::otlp::OtlpReceiver;
use profcol_testkit::config::{one_pipeline, otlp_exporter_retrying};
use profcol_testkit::prelude::{closed_port, settings, Collector};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn batch(seed: u64) -> Profiles {
    let mut b = ProfilesBuilder::new();
    let r = b.resource(Default::default());
    let p = b.profile(r, &ProfileMeta::cpu(1, 0, 0));
    for k in 0..20u64 {
        let f = b.function(&format!("fn_{seed}_{}", k % 7), "", "a.c", 0);
        let l = b.line_location(f, k as i64);
        let st = b.stack(&[l]);
        b.sample(
            p,
            pb::Sample {
                stack_index: st,
                values: vec![1 + (k % 3) as i64],
                timestamps_unix_nano: vec![seed * 1000 + k],
                ..Default::default()
            },
        );
    }
    b.build()
}

fn merged(v: &[Profiles]) -> Vec<canonical::CanonicalSample> {
    let mut b = ProfilesBuilder::new();
    for p in v {
        b.append(p.clone());
    }
    canonical::samples(&b.build())
}

fn start_profcol(cfg: &std::path::Path, log: &std::path::Path) -> Child {
    common::assert_validates(cfg);
    Command::new(env!("CARGO_BIN_EXE_profcol"))
        .arg("--config")
        .arg(cfg)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(log.with_extension("out")).unwrap())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// Waits until profcol logged the port its otlp receiver bound (it is
/// configured with port 0, so no other process can take the port first).
async fn wait_listening(child: &mut Child, log: &std::path::Path) -> u16 {
    let t = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let line = text.lines().find(|l| l.contains("otlp receiver listening"));
        if let Some(a) = line.and_then(|l| profcol_testkit::net::addr_in_log(l, "grpc")) {
            return a.port();
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("profcol exited with {st}: {}", std::fs::read_to_string(log).unwrap_or_default());
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "profcol did not listen: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn config(
    dir: &std::path::Path,
    port_in: u16,
    port_out: u16,
    storage: Option<&std::path::Path>,
    queue_extra: &str,
    batch_processor: bool,
) -> std::path::PathBuf {
    let storage = storage.map(|s| format!("\n      storage: {}{queue_extra}", s.display())).unwrap_or_default();
    let (processors, listed) = if batch_processor {
        // Holds batches for up to 300 ms: an acknowledgement must still mean "on disk".
        ("processors:\n  batch:\n    send_batch_size: 100000\n    timeout: 300ms\n", "batch")
    } else {
        ("", "")
    };
    let service = one_pipeline("otlp", listed, "otlp");
    let exporter = otlp_exporter_retrying(port_out);
    let text = format!(
        "receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{port_in}
{processors}{exporter}    compression: gzip
    sending_queue:
      queue_size: 100
      num_consumers: 2{storage}
{service}"
    );
    let p = dir.join("profcol.yaml");
    std::fs::write(&p, text).unwrap();
    p
}

async fn send_all(port_in: u16, batches: &[Profiles]) {
    let cfg = OtlpGrpcConfig { endpoint: Some(format!("http://127.0.0.1:{port_in}")), ..Default::default() };
    let e = OtlpGrpcExporter::new(settings(Kind::Exporter, "otlp/client"), cfg).unwrap();
    for b in batches {
        e.export(b).await.unwrap();
    }
}

async fn wait_samples(sink: &Collector, n: usize, timeout: Duration) {
    let t = Instant::now();
    loop {
        let got: usize = sink.batches.lock().unwrap().iter().map(|b| b.sample_count()).sum();
        if got >= n {
            return;
        }
        assert!(t.elapsed() < timeout, "{got} of {n} samples arrived within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the backend has exactly the samples of `batches` (a multiset:
/// nothing lost, nothing twice).
async fn expect_delivered(sink: &Collector, batches: &[Profiles]) {
    let n: usize = batches.iter().map(|b| b.sample_count()).sum();
    wait_samples(sink, n, Duration::from_secs(30)).await;
    assert!(merged(&sink.batches.lock().unwrap()) == merged(batches));
}

/// Stops profcol and the backend.
async fn finish(mut child: Child, backend: Arc<OtlpReceiver>) {
    let _ = child.kill();
    let _ = child.wait();
    backend.shutdown().await.unwrap();
}

/// Waits up to 20 s for `cond`; a timeout shows profcol's log.
async fn wait_for(log: &std::path::Path, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < Duration::from_secs(20), "{}", std::fs::read_to_string(log).unwrap_or_default());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_appears_10s_later_and_every_batch_arrives() {
    let dir = tempfile::tempdir().unwrap();
    // The backend's port stays closed for 10 s, then the backend binds it.
    let port_out = closed_port();
    let cfg = config(dir.path(), 0, port_out, None, "", false);
    let log = dir.path().join("profcol.log");
    let mut child = start_profcol(&cfg, &log);
    let port_in = wait_listening(&mut child, &log).await;
    let t0 = Instant::now();
    let batches: Vec<Profiles> = (0..10).map(batch).collect();
    send_all(port_in, &batches).await;
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(t0.elapsed())).await;
    let (r, sink) = backend(port_out).await;
    expect_delivered(&sink, &batches).await;
    finish(child, r).await;
}

fn queue_files(storage: &std::path::Path, ext: &str) -> Vec<std::path::PathBuf> {
    let dir = storage.join("otlp");
    let Ok(rd) = std::fs::read_dir(&dir) else { return Vec::new() };
    rd.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == ext)).collect()
}

async fn wait_exit(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        assert!(t.elapsed() < timeout, "profcol did not exit within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// profcol with a persistent queue under `dir/queue`, listening, its backend not up yet.
struct QueuedNode {
    cfg: std::path::PathBuf,
    storage: std::path::PathBuf,
    child: Child,
    port_in: u16,
    port_out: u16,
}

async fn start_queued(dir: &std::path::Path, queue_extra: &str, batch_processor: bool) -> QueuedNode {
    let storage = dir.join("queue");
    let port_out = closed_port();
    let cfg = config(dir, 0, port_out, Some(&storage), queue_extra, batch_processor);
    let log = dir.join("profcol.log");
    let mut child = start_profcol(&cfg, &log);
    let port_in = wait_listening(&mut child, &log).await;
    QueuedNode { cfg, storage, child, port_in, port_out }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_outage_with_persistent_queue_loses_nothing() {
    sigkill_during_outage(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_with_a_batch_processor_in_front_of_the_persistent_queue_loses_nothing() {
    sigkill_during_outage(true).await;
}

async fn sigkill_during_outage(batch_processor: bool) {
    let dir = tempfile::tempdir().unwrap();
    let QueuedNode { cfg, storage, mut child, port_in, port_out } = start_queued(dir.path(), "", batch_processor).await;
    let batches: Vec<Profiles> = (0..10).map(batch).collect();
    send_all(port_in, &batches).await;
    // Every batch was acknowledged, so every batch is on disk; now the process dies without a word.
    // SAFETY: kill on a child this test started and still owns.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    let on_disk = queue_files(&storage, "batch").len();
    if batch_processor {
        assert!((1..=batches.len()).contains(&on_disk), "{on_disk} files");
    } else {
        assert_eq!(on_disk, batches.len());
    }
    // A file the crash (or a disk) mangled must not stop the restart.
    std::fs::write(storage.join("otlp").join("00000000009999999999.batch"), b"PCQ1 torn").unwrap();
    let (r, sink) = backend(port_out).await;
    let log2 = dir.path().join("profcol2.log");
    let mut child = start_profcol(&cfg, &log2);
    wait_listening(&mut child, &log2).await;
    expect_delivered(&sink, &batches).await;
    // Exported batches leave the disk; the torn file is set aside with a log line.
    let t = Instant::now();
    while !queue_files(&storage, "batch").is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "exported batches stay on disk: {:?}",
            queue_files(&storage, "batch")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(queue_files(&storage, "corrupt").len(), 1);
    let text = std::fs::read_to_string(&log2).unwrap();
    assert!(text.contains("does not read back") && text.contains("00000000009999999999"), "{text}");
    finish(child, r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_outage_keeps_the_persistent_queue_for_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let QueuedNode { cfg, storage, mut child, port_in, port_out } = start_queued(dir.path(), "", false).await;
    let batches: Vec<Profiles> = (0..5).map(batch).collect();
    send_all(port_in, &batches).await;
    // SAFETY: kill on a child this test started and still owns.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    // The batches are safe on disk, so retrying until shutdown_timeout (10 s by default) would only hold the exit up.
    let st = wait_exit(&mut child, Duration::from_secs(5)).await;
    assert!(st.success(), "{st}: {}", std::fs::read_to_string(dir.path().join("profcol.log")).unwrap_or_default());
    assert_eq!(queue_files(&storage, "batch").len(), batches.len());
    let (r, sink) = backend(port_out).await;
    let child = start_profcol(&cfg, &dir.path().join("profcol2.log"));
    expect_delivered(&sink, &batches).await;
    finish(child, r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_persistent_queue_refuses_and_the_sender_is_told_to_retry() {
    let dir = tempfile::tempdir().unwrap();
    let one = batch(0).encode_to_vec().len();
    // Room for two batches on disk, not three.
    let room = format!("\n      max_storage_bytes: {}", 2 * (one + 24) + 8);
    let QueuedNode { storage, child, port_in, port_out, .. } = start_queued(dir.path(), &room, false).await;
    send_all(port_in, &[batch(0), batch(1)]).await;
    let client = OtlpGrpcExporter::new(
        settings(Kind::Exporter, "otlp/client"),
        OtlpGrpcConfig { endpoint: Some(format!("http://127.0.0.1:{port_in}")), ..Default::default() },
    )
    .unwrap();
    match client.export(&batch(2)).await {
        Err(profcol_api::ExportError::Retryable { message, .. }) => {
            assert!(message.contains("full") && message.contains("max_storage_bytes"), "{message}");
            // Where the queue lives is for the operator's log, not for senders.
            assert!(!message.contains(dir.path().to_str().unwrap()), "{message}");
            assert!(log_has(&dir.path().join("profcol.log"), storage.to_str().unwrap()));
        }
        other => panic!("a full persistent queue must answer a retryable error, got {other:?}"),
    }
    assert_eq!(queue_files(&storage, "batch").len(), 2);
    // Once the backend takes the two, there is room again and the third goes through.
    let (r, sink) = backend(port_out).await;
    wait_samples(&sink, 2 * batch(0).sample_count(), Duration::from_secs(30)).await;
    let t = Instant::now();
    loop {
        match client.export(&batch(2)).await {
            Ok(()) => break,
            Err(e) => assert!(t.elapsed() < Duration::from_secs(10), "still refused: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_samples(&sink, 3 * batch(0).sample_count(), Duration::from_secs(30)).await;
    finish(child, r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_receiver_waits_out_a_full_persistent_queue() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::create_dir(&input).unwrap();
    let batches: Vec<Profiles> = (0..6).map(batch).collect();
    for (k, b) in batches.iter().enumerate() {
        std::fs::write(input.join(format!("{k:02}.pb")), b.encode_to_vec()).unwrap();
    }
    let port_out = closed_port();
    // Room for two batches: the other four are refused until the backend drains the queue.
    let room = 2 * (batch(0).encode_to_vec().len() + 24) + 8;
    let service = one_pipeline("file", "", "otlp");
    let text = format!(
        "receivers:
  file:
    path: {}
exporters:
  otlp:
    endpoint: http://127.0.0.1:{port_out}
    retry_on_failure:
      initial_interval: 200ms
      max_interval: 1s
      max_elapsed_time: 0s
    sending_queue:
      storage: {}
      max_storage_bytes: {room}
{service}",
        input.display(),
        dir.path().join("queue").display()
    );
    let cfg = dir.path().join("profcol.yaml");
    std::fs::write(&cfg, text).unwrap();
    let log = dir.path().join("profcol.log");
    let mut child = start_profcol(&cfg, &log);
    wait_for(&log, || log_has(&log, "batch refused")).await;
    assert!(child.try_wait().unwrap().is_none(), "{}", std::fs::read_to_string(&log).unwrap_or_default());
    let (r, sink) = backend(port_out).await;
    expect_delivered(&sink, &batches).await;
    finish(child, r).await;
}

fn log_has(log: &std::path::Path, text: &str) -> bool {
    std::fs::read_to_string(log).unwrap_or_default().contains(text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_replaces_the_persistent_exporter_hands_its_queue_over() {
    let dir = tempfile::tempdir().unwrap();
    let QueuedNode { cfg, storage, child, port_in, port_out } = start_queued(dir.path(), "", false).await;
    let log = dir.path().join("profcol.log");
    let first: Vec<Profiles> = (0..8).map(batch).collect();
    send_all(port_in, &first).await;
    // A changed exporter section makes a new exporter instance, on the same queue directory.
    let text = std::fs::read_to_string(&cfg).unwrap().replace("timeout: 2s", "timeout: 3s");
    std::fs::write(&cfg, text).unwrap();
    // SAFETY: kill on a child this test started and still owns.
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    wait_for(&log, || log_has(&log, "configuration reloaded")).await;
    let second: Vec<Profiles> = (8..12).map(batch).collect();
    send_all(port_in, &second).await;
    assert_eq!(queue_files(&storage, "batch").len(), first.len() + second.len());
    let (r, sink) = backend(port_out).await;
    let all: Vec<Profiles> = first.iter().chain(&second).cloned().collect();
    expect_delivered(&sink, &all).await;
    // Exactly once: nothing lost in the hand-over, nothing sent by both instances.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(merged(&sink.batches.lock().unwrap()) == merged(&all));
    finish(child, r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_profcol_on_the_same_persistent_queue_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let QueuedNode { storage, mut child, port_out, .. } = start_queued(dir.path(), "", false).await;
    // Same storage, its own config file and listening port.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let cfg = config(&other, 0, port_out, Some(&storage), "", false);
    let log = other.join("profcol.log");
    let mut second = start_profcol(&cfg, &log);
    let st = wait_exit(&mut second, Duration::from_secs(20)).await;
    assert!(!st.success());
    let text = std::fs::read_to_string(&log).unwrap();
    let holder = format!("another process (pid {})", child.id());
    assert!(text.contains(&holder) && text.contains("sending_queue.storage"), "{text}");
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_batches_wait_on_disk_not_in_memory() {
    // Retries every 3 s at first, so the files can be changed in between.
    let dir = tempfile::tempdir().unwrap();
    let QueuedNode { cfg, storage, child, port_in, port_out } = start_queued(dir.path(), "", false).await;
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("initial_interval: 200ms", "initial_interval: 3s")
        // validate refuses a max_interval below initial_interval.
        .replace("max_interval: 1s", "max_interval: 3s");
    std::fs::write(&cfg, text).unwrap();
    // SAFETY: kill on a child this test started and still owns.
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    let log = dir.path().join("profcol.log");
    wait_for(&log, || log_has(&log, "configuration reloaded")).await;
    let batches: Vec<Profiles> = (0..6).map(batch).collect();
    send_all(port_in, &batches).await;
    // The queue holds only the files: a batch whose file goes bad while it waits is set aside, not sent.
    let mut files = queue_files(&storage, "batch");
    files.sort();
    assert_eq!(files.len(), batches.len());
    let last = files.last().unwrap();
    let mut bytes = std::fs::read(last).unwrap();
    let end = bytes.len() - 1;
    bytes[end] ^= 0xff;
    std::fs::write(last, bytes).unwrap();
    let (r, sink) = backend(port_out).await;
    let n: usize = batches[..5].iter().map(|b| b.sample_count()).sum();
    wait_samples(&sink, n, Duration::from_secs(30)).await;
    wait_for(&log, || !queue_files(&storage, "corrupt").is_empty()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(merged(&sink.batches.lock().unwrap()) == merged(&batches[..5]));
    assert!(log_has(&log, "checksum mismatch"), "{}", std::fs::read_to_string(&log).unwrap());
    finish(child, r).await;
}

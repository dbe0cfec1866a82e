//! The host end to end, through the real binary: round trips, draining on
//! SIGTERM, reload on SIGHUP, stalled exporters, telemetry and health.

mod common;
use common::*;
use profcol_api::model::canonical;
use std::path::Path;
use std::time::{Duration, Instant};

fn config(dir: &Path, receivers: &str, exporters: &str, pipeline_exporters: &str, extra: &str) -> String {
    format!(
        "receivers:\n{receivers}\nprocessors:\n  batch:\n    send_batch_size: 5000\n    timeout: 100ms\nexporters:\n{exporters}\n{extra}service:\n  shutdown_timeout: 60s\n  telemetry:\n    metrics:\n      address: \"\"\n  pipelines:\n    profiles:\n      receivers: [file]\n      processors: [batch]\n      exporters: [{pipeline_exporters}]\n",
    )
    .replace("DIR", &dir.display().to_string())
}

fn all_samples(batches: &[profcol_api::Profiles]) -> Vec<canonical::CanonicalSample> {
    let mut v: Vec<_> = batches.iter().flat_map(canonical::samples).collect();
    v.sort();
    v
}

#[test]
fn file_to_batch_to_file_preserves_every_sample() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = write_corpus(&dir.path().join("in"), 20, 700);
    let cfg = config(dir.path(), "  file:\n    path: DIR/in", "  file:\n    path: DIR/out.jsonl", "file", "");
    let cfgp = write(&dir.path().join("c.yaml"), &cfg);
    let mut p = Profcol::start(&["--config", cfgp.to_str().unwrap()]);
    let want = all_samples(&corpus);
    let out = dir.path().join("out.jsonl");
    assert!(wait_until(Duration::from_secs(30), || all_samples(&read_jsonl(&out)).len() >= want.len()));
    p.signal(libc::SIGTERM);
    assert!(p.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()));
    let got = read_jsonl(&out);
    assert!(got.len() < corpus.len(), "the batch processor merged batches ({} out)", got.len());
    assert_eq!(all_samples(&got), want);
}

#[test]
fn sigterm_under_load_loses_nothing() {
    // The exporter writes into a FIFO the test drains slowly: a real slow backend.
    let dir = tempfile::tempdir().unwrap();
    let corpus = write_corpus(&dir.path().join("in"), 40, 500);
    let fifo = dir.path().join("slow.pipe");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let cfg = config(
        dir.path(),
        "  file:\n    path: DIR/in",
        "  file:\n    path: DIR/slow.pipe\n    timeout: 120s\n    sending_queue:\n      block_on_overflow: true\n      num_consumers: 1",
        "file",
        "",
    );
    let cfgp = write(&dir.path().join("c.yaml"), &cfg);
    let mut p = Profcol::start(&["--config", cfgp.to_str().unwrap()]);
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut f = std::fs::File::open(&fifo).unwrap();
        let mut all = Vec::new();
        let mut buf = [0u8; 16 << 10];
        loop {
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => all.extend_from_slice(&buf[..n]),
                Err(e) => panic!("{e}"),
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        all
    });
    assert!(p.wait_log("profcol started", Duration::from_secs(20)));
    // SIGTERM stops the file receiver where it is: wait until it has handed
    // the whole corpus to the pipeline (most of it still queued behind the
    // slow exporter), so "nothing lost" covers every batch of the corpus.
    assert!(p.wait_log("file receiver: done reading", Duration::from_secs(60)));
    p.signal(libc::SIGTERM);
    let status = p.wait_exit(Duration::from_secs(90)).expect("profcol exits within shutdown_timeout");
    assert!(status.success());
    let bytes = reader.join().unwrap();
    let got: Vec<_> = String::from_utf8(bytes)
        .unwrap()
        .lines()
        .map(|l| profcol_api::Profiles::from_json(l.as_bytes()).unwrap())
        .collect();
    assert_eq!(all_samples(&got).len(), all_samples(&corpus).len());
    assert_eq!(all_samples(&got), all_samples(&corpus));
}

#[test]
fn stalled_exporter_does_not_delay_the_other() {
    // `stalled` writes into a FIFO nobody reads: open(2) blocks forever.
    let dir = tempfile::tempdir().unwrap();
    let corpus = write_corpus(&dir.path().join("in"), 30, 100);
    let fifo = dir.path().join("stalled.pipe");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let cfg = config(
        dir.path(),
        "  file:\n    path: DIR/in\n    replay_rate: 30",
        "  file/stalled:\n    path: DIR/stalled.pipe\n    timeout: 1h\n    sending_queue:\n      queue_size: 2\n      num_consumers: 1\n  file/ok:\n    path: DIR/ok.jsonl",
        "file/stalled, file/ok",
        "",
    )
    .replace("send_batch_size: 5000", "send_batch_size: 1");
    let cfgp = write(&dir.path().join("c.yaml"), &cfg);
    let p = Profcol::start(&["--config", cfgp.to_str().unwrap()]);
    assert!(p.wait_log("profcol started", Duration::from_secs(20)));
    let t0 = Instant::now();
    let out = dir.path().join("ok.jsonl");
    let want = all_samples(&corpus);
    // 30 batches at 30/s: one second of sending; allow generous slack for a loaded CI box.
    assert!(
        wait_until(Duration::from_secs(10), || all_samples(&read_jsonl(&out)).len() == want.len()),
        "the healthy exporter did not get every batch while the other was stalled"
    );
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert_eq!(all_samples(&read_jsonl(&out)), want);
    drop(p);
    // Unblock the stalled open(2) so nothing lingers.
    let _ = std::fs::OpenOptions::new().read(true).custom_flags_nonblock().open(&fifo);
}

trait NonBlock {
    fn custom_flags_nonblock(&mut self) -> &mut Self;
}
impl NonBlock for std::fs::OpenOptions {
    fn custom_flags_nonblock(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NONBLOCK)
    }
}

#[test]
fn sighup_with_broken_config_keeps_running() {
    let dir = tempfile::tempdir().unwrap();
    write_corpus(&dir.path().join("in"), 3, 50);
    let cfg = config(
        dir.path(),
        "  file:\n    path: DIR/in\n    loop: true\n    replay_rate: 20",
        "  file:\n    path: DIR/out.jsonl",
        "file",
        "",
    );
    let cfgp = write(&dir.path().join("c.yaml"), &cfg);
    let mut p = Profcol::start(&["--config", cfgp.to_str().unwrap()]);
    assert!(p.wait_log("profcol started", Duration::from_secs(20)));
    let out = dir.path().join("out.jsonl");
    assert!(wait_until(Duration::from_secs(10), || !read_jsonl(&out).is_empty()));
    write(&cfgp, "receivers: [oops\n");
    p.signal(libc::SIGHUP);
    assert!(p.wait_log("reload failed; keeping the running configuration", Duration::from_secs(10)));
    let before = std::fs::metadata(&out).unwrap().len();
    assert!(
        wait_until(Duration::from_secs(10), || std::fs::metadata(&out).unwrap().len() > before),
        "the old pipeline stopped after a failed reload"
    );
    assert!(p.child.try_wait().unwrap().is_none(), "profcol exited");
    p.signal(libc::SIGTERM);
    assert!(p.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()));
}

#[test]
fn sighup_with_changed_exporter_keeps_the_receiver_instance() {
    let dir = tempfile::tempdir().unwrap();
    write_corpus(&dir.path().join("in"), 3, 50);
    let cfg = config(
        dir.path(),
        "  file:\n    path: DIR/in\n    loop: true\n    replay_rate: 20",
        "  file:\n    path: DIR/a.jsonl",
        "file",
        "",
    );
    let cfgp = write(&dir.path().join("c.yaml"), &cfg);
    let mut p = Profcol::start(&["--config", cfgp.to_str().unwrap()]);
    assert!(p.wait_log("profcol started", Duration::from_secs(20)));
    assert!(wait_until(Duration::from_secs(10), || !read_jsonl(&dir.path().join("a.jsonl")).is_empty()));
    assert_eq!(p.log_count("started receiver=file"), 1);
    write(&cfgp, &cfg.replace("a.jsonl", "b.jsonl"));
    p.signal(libc::SIGHUP);
    assert!(p.wait_log("configuration reloaded", Duration::from_secs(20)));
    assert!(
        wait_until(Duration::from_secs(10), || !read_jsonl(&dir.path().join("b.jsonl")).is_empty()),
        "the new exporter gets data"
    );
    // The receiver was neither stopped nor started again: same instance, still sending.
    assert_eq!(p.log_count("started receiver=file"), 1);
    assert_eq!(p.log_count("file receiver: done reading"), 0);
    let a_len = std::fs::metadata(dir.path().join("a.jsonl")).unwrap().len();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(std::fs::metadata(dir.path().join("a.jsonl")).unwrap().len(), a_len, "the old exporter was stopped");
    p.signal(libc::SIGTERM);
    assert!(p.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()));
}

#[test]
fn metrics_and_health_check_are_served() {
    let dir = tempfile::tempdir().unwrap();
    write_corpus(&dir.path().join("in"), 4, 25);
    let cfg = config(
        dir.path(),
        "  file:\n    path: DIR/in",
        "  file:\n    path: DIR/out.jsonl",
        "file",
        "extensions:\n  health_check:\n    endpoint: 127.0.0.1:0\n",
    )
    .replace("address: \"\"", "address: 127.0.0.1:0")
    .replace("service:\n", "service:\n  extensions: [health_check]\n");
    let cfgp = write(&dir.path().join("c.yaml"), &cfg);
    let mut p = Profcol::start(&["--config", cfgp.to_str().unwrap()]);
    assert!(p.wait_log("profcol started", Duration::from_secs(20)));
    let haddr = p.wait_addr("health_check listening", "address", Duration::from_secs(5));
    assert_eq!(http_get(&haddr.to_string(), "/").0, 200);
    let maddr = p.wait_addr("serving metrics", "address", Duration::from_secs(5)).to_string();
    assert!(wait_until(Duration::from_secs(10), || http_get(&maddr, "/metrics")
        .1
        .contains("profcol_receiver_accepted_samples_total{receiver=\"file\"} 100")));
    // An OTel histogram has its first point with the first export.
    let latency = "profcol_exporter_export_latency_count{exporter=\"file\"}";
    wait_until(Duration::from_secs(10), || http_get(&maddr, "/metrics").1.contains(latency));
    let (_, m) = http_get(&maddr, "/metrics");
    assert!(m.contains(latency), "{m}");
    p.signal(libc::SIGTERM);
    assert!(p.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()));
}

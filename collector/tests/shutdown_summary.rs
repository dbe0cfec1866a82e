//! SIGTERM accounts for every batch in one line: delivered, kept on disk,
//! dropped (batches and samples), the numbers /metrics counts
//! (`profcol_exporter_sent_batches_total`, `_dropped_batches_total`,
//! `_queue_storage_batches`, `_queue_storage_samples` and the sample counters).

mod common;

use common::{backend, metric, Profcol};
use profcol_api::Receiver;
use profcol_testkit::batch::cpu_batch;
use profcol_testkit::config::OTLP_GRPC_RECEIVER;
use profcol_testkit::raw::grpc_send;
use std::time::Duration;

fn gateway(dir: &std::path::Path, backend_port: u16, storage: Option<&std::path::Path>) -> Profcol {
    let storage = storage.map(|s| format!("\n      storage: {}", s.display())).unwrap_or_default();
    common::start_config(
        dir,
        "profcol.yaml",
        &format!(
            "{OTLP_GRPC_RECEIVER}exporters:
  otlp:
    endpoint: http://127.0.0.1:{backend_port}
    timeout: 1s
    retry_on_failure:
      initial_interval: 100ms
      max_interval: 500ms
      max_elapsed_time: 0s
    sending_queue:
      num_consumers: 2{storage}
service:
  shutdown_timeout: 3s
  telemetry: {{ metrics: {{ address: 127.0.0.1:0 }} }}
  pipelines:
    profiles: {{ receivers: [otlp], exporters: [otlp] }}
"
        ),
    )
}

async fn scrape(addr: std::net::SocketAddr) -> String {
    reqwest::get(format!("http://{addr}/metrics")).await.unwrap().text().await.unwrap()
}

fn summary(p: &Profcol) -> String {
    let log = p.log.lock().unwrap();
    let lines: Vec<&String> = log.iter().filter(|l| l.contains("shut down:")).collect();
    assert_eq!(lines.len(), 1, "one summary line: {lines:?}");
    lines[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_queue_backend_gone_delivered_and_dropped_are_summed_once() {
    let dir = tempfile::tempdir().unwrap();
    let port = profcol_testkit::net::closed_port();
    let (r, sink) = backend(port).await;
    let mut p = gateway(dir.path(), port, None);
    let g = p.wait_addr("otlp receiver listening", "grpc", Duration::from_secs(30));
    let m = p.wait_addr("serving metrics", "address", Duration::from_secs(30));
    let delivered: Vec<_> = (0..5).map(|k| cpu_batch(k, 2, 10)).collect();
    for b in &delivered {
        grpc_send(g, b.encode_to_vec(), false).await.unwrap();
    }
    let want: usize = delivered.iter().map(|b| b.sample_count()).sum();
    assert!(common::wait_until(Duration::from_secs(10), || sink.sample_count() == want));
    r.shutdown().await.unwrap();
    // The backend is gone: these wait in memory, retrying.
    let stuck: Vec<_> = (10..13).map(|k| cpu_batch(k, 1, 7)).collect();
    for b in &stuck {
        grpc_send(g, b.encode_to_vec(), false).await.unwrap();
    }
    let lost: usize = stuck.iter().map(|b| b.sample_count()).sum();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let text = scrape(m).await;
    let series = |name: &str| metric(&text, &format!("profcol_exporter_{name}{{exporter=\"otlp\"}}"));
    assert_eq!(series("sent_batches_total"), Some(5.0), "{text}");
    assert_eq!(series("sent_samples_total"), Some(want as f64));
    assert_eq!(series("queue_size"), Some(3.0));
    p.signal(libc::SIGTERM);
    assert!(p.wait_exit(Duration::from_secs(15)).is_some_and(|s| s.success()));
    let line = summary(&p);
    let expected = format!(
        "delivered 5 batches ({want} samples), kept on disk 0 batches (0 samples), dropped 3 batches ({lost} samples)"
    );
    assert!(line.contains(&expected), "{line}\nwanted: {expected}");
    assert_eq!(p.log_count("batch dropped"), 0, "no line per dropped batch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_queue_backend_down_what_is_on_disk_is_kept_and_said() {
    let dir = tempfile::tempdir().unwrap();
    let port = profcol_testkit::net::closed_port();
    let storage = dir.path().join("queue");
    let mut p = gateway(dir.path(), port, Some(&storage));
    let g = p.wait_addr("otlp receiver listening", "grpc", Duration::from_secs(30));
    let m = p.wait_addr("serving metrics", "address", Duration::from_secs(30));
    let batches: Vec<_> = (0..4).map(|k| cpu_batch(k, 1, 9)).collect();
    for b in &batches {
        grpc_send(g, b.encode_to_vec(), false).await.unwrap();
    }
    let kept: usize = batches.iter().map(|b| b.sample_count()).sum();
    let text = scrape(m).await;
    let series = |name: &str| metric(&text, &format!("profcol_exporter_{name}{{exporter=\"otlp\"}}"));
    assert_eq!(series("queue_storage_batches"), Some(4.0), "{text}");
    assert_eq!(series("queue_storage_samples"), Some(kept as f64));
    p.signal(libc::SIGTERM);
    assert!(p.wait_exit(Duration::from_secs(15)).is_some_and(|s| s.success()));
    let line = summary(&p);
    let expected = format!(
        "delivered 0 batches (0 samples), kept on disk 4 batches ({kept} samples), dropped 0 batches (0 samples)"
    );
    assert!(line.contains(&expected), "{line}\nwanted: {expected}");
}

#[test]
fn each_exporter_is_accounted_apart_and_processor_drops_are_said() {
    // One receiver, two pipelines: three exporters get every batch; a wasm
    // processor with `on_error: drop` drops every batch of the other.
    let dir = tempfile::tempdir().unwrap();
    let corpus = common::write_corpus(&dir.path().join("in"), 3, 20);
    let samples: usize = corpus.iter().map(|b| b.sample_count()).sum();
    let plugin = profcol_testkit::plugins::test_plugin("misbehave");
    let mut p = common::start_config(
        dir.path(),
        "profcol.yaml",
        &format!(
            "receivers:
  file: {{ path: DIR/in }}
processors:
  wasm/drop: {{ path: {}, config: {{ mode: permanent }}, on_error: drop }}
exporters:
  file/a: {{ path: DIR/a.jsonl }}
  file/b: {{ path: DIR/b.jsonl }}
  file/c: {{ path: DIR/c.jsonl }}
  file/kept: {{ path: DIR/kept.jsonl }}
service:
  plugins: {{ cache_dir: DIR/cache }}
  pipelines:
    profiles/all: {{ receivers: [file], exporters: [file/a, file/b, file/c] }}
    profiles/dropped: {{ receivers: [file], processors: [wasm/drop], exporters: [file/kept] }}
",
            plugin.display()
        )
        .replace("DIR", &dir.path().display().to_string()),
    );
    let c = dir.path().join("c.jsonl");
    assert!(common::wait_until(Duration::from_secs(30), || common::read_jsonl(&c).len() == 3));
    std::thread::sleep(Duration::from_millis(300));
    p.signal(libc::SIGTERM);
    assert!(p.wait_exit(Duration::from_secs(15)).is_some_and(|s| s.success()));
    let line = summary(&p);
    for e in ["file/a", "file/b", "file/c"] {
        let want = format!(
            "exporter {e}: delivered 3 batches ({samples} samples), kept on disk 0 batches (0 samples), dropped 0 batches (0 samples)"
        );
        assert!(line.contains(&want), "{line}\nwanted: {want}");
    }
    assert!(line.contains("exporter file/kept: delivered 0 batches (0 samples)"), "{line}");
    let want = format!("processors dropped 3 batches ({samples} samples)");
    assert!(line.contains(&want), "{line}\nwanted: {want}");
}

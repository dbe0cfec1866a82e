//! The `wasm` exporter: the host delivers the plugin's outputs to their
//! sinks; a retry re-delivers only the sinks that failed; plugin failures
//! map onto retryable or permanent export errors.

mod common;
use common::{component, counter};
use profcol_api::component::{Component, ExportError, Exporter, Kind};
use profcol_api::telemetry::Telemetry;
use profcol_plugins::exporter::ExporterFactory;
use profcol_testkit::prelude::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::Arc;

fn exporter(yaml: &str, telemetry: &Telemetry) -> Arc<dyn Exporter> {
    match component(&ExporterFactory, Kind::Exporter, "misbehave_export", yaml, telemetry) {
        Component::Exporter(e) => e,
        _ => unreachable!(),
    }
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

fn export_calls(t: &Telemetry) -> u64 {
    let series = "profcol_plugin_counter_total{component=\"wasm/test\",name=\"export_calls\"} ";
    t.render().lines().find_map(|l| l.strip_prefix(series)).map_or(0, |v| v.parse().unwrap())
}

/// Answers `n` HTTP requests with 200 on `listener`; returns their bodies.
fn serve(listener: TcpListener, n: usize) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        let mut bodies = Vec::new();
        for _ in 0..n {
            let (mut s, _) = listener.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut len = 0;
            loop {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap();
                }
                if line == "\r\n" {
                    break;
                }
            }
            let mut body = vec![0; len];
            r.read_exact(&mut body).unwrap();
            bodies.push(String::from_utf8(body).unwrap());
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").unwrap();
        }
        bodies
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_redelivers_only_the_sinks_that_failed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("out.txt");
    let port = closed_port();
    let t = Telemetry::new();
    let e = exporter(
        &format!(
            "path: PLUGIN\nconfig: {{sinks: [out, web]}}\nsinks:\n  out: {{file: {}}}\n  web: {{http: {{endpoint: 'http://127.0.0.1:{port}/in'}}}}",
            file.display()
        ),
        &t,
    );
    let batch = cpu_batch(3, 2, 10);
    for attempt in 1..=2 {
        let r = e.export(&batch).await;
        assert!(matches!(&r, Err(ExportError::Retryable { message, .. }) if message.contains("sink web")), "{r:?}");
        assert_eq!(lines(&file), 1, "attempt {attempt}: the file sink got the batch once");
    }
    // The endpoint comes up: the retry delivers to it alone.
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    let server = serve(listener, 1);
    e.export(&batch).await.unwrap();
    let bodies = server.join().unwrap();
    assert_eq!(bodies, vec![format!("{} bytes\n", batch.encode_to_vec().len())]);
    assert_eq!(lines(&file), 1);
    assert_eq!(export_calls(&t), 1, "the plugin ran once; retries re-used its outputs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_failures_map_onto_export_errors() {
    let dir = tempfile::tempdir().unwrap();
    let sinks = format!("sinks: {{out: {{file: {}}}}}", dir.path().join("o").display());
    let batch = cpu_batch(1, 1, 3);
    let t = Telemetry::new();
    let trap = exporter(&format!("path: PLUGIN\nconfig: {{mode: trap}}\n{sinks}"), &t);
    assert!(matches!(trap.export(&batch).await, Err(ExportError::Permanent { .. })));
    let slow = exporter(&format!("path: PLUGIN\nconfig: {{mode: loop}}\ncall_timeout: 50ms\n{sinks}"), &t);
    assert!(matches!(slow.export(&batch).await, Err(ExportError::Retryable { .. })), "a timeout may pass later");
    let retry = exporter(&format!("path: PLUGIN\nconfig: {{mode: retryable}}\n{sinks}"), &t);
    assert!(
        matches!(retry.export(&batch).await, Err(ExportError::Retryable { message, .. }) if message.contains("try later"))
    );
    let drop = exporter(&format!("path: PLUGIN\nconfig: {{mode: drop}}\n{sinks}"), &t);
    drop.export(&batch).await.unwrap();
    let unknown = exporter(&format!("path: PLUGIN\nconfig: {{sinks: [elsewhere]}}\n{sinks}"), &t);
    let r = unknown.export(&batch).await;
    assert!(
        matches!(&r, Err(ExportError::Permanent { message }) if message.contains("\"elsewhere\", which is not configured")),
        "{r:?}"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing was delivered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_holds_one_instance_per_export_the_host_runs_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let sinks = format!("sinks: {{out: {{file: {}}}}}", dir.path().join("o").display());
    let batch = cpu_batch(1, 1, 3);
    // Default pool: filled at start to the host's concurrency, so four
    // overlapping exports (each spins 150 ms) find four ready instances.
    // pool_size: 1 starts one; the other calls get fresh ones, never wait.
    for (pool, at_start) in [("", 4), ("pool_size: 1\n", 1)] {
        let t = Telemetry::new();
        let e = exporter(
            &format!("path: PLUGIN\n{pool}call_timeout: 5s\nconfig: {{mode: spin, ms: 150, sinks: [out]}}\n{sinks}"),
            &t,
        );
        e.set_concurrency(4);
        e.start().await.unwrap();
        assert_eq!(counter(&t, "inits"), Some(at_start), "{pool:?}: instances made at start");
        let calls: Vec<_> = (0..4)
            .map(|_| {
                let (e, b) = (Arc::clone(&e), batch.clone());
                tokio::spawn(async move { e.export(&b).await })
            })
            .collect();
        for c in calls {
            c.await.unwrap().unwrap();
        }
        assert_eq!(counter(&t, "inits"), Some(4), "{pool:?}: one instance per concurrent export");
    }
    assert_eq!(lines(&dir.path().join("o")), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_kept_for_retries_are_bounded_and_freed_when_the_host_gives_up() {
    let port = closed_port();
    let t = Telemetry::new();
    let e = exporter(
        &format!(
            "path: PLUGIN\nconfig: {{mode: big, mb: 4, sinks: [web]}}\ncall_timeout: 10s\nsinks:\n  web: {{http: {{endpoint: 'http://127.0.0.1:{port}/in'}}}}"
        ),
        &t,
    );
    e.set_concurrency(2);
    e.start().await.unwrap();
    let pending = || common::metric(&t, "profcol_plugin_pending_output_bytes{component=\"wasm/test\"}");
    let batches: Vec<_> = (0..6).map(|k| cpu_batch(k, 1, 5)).collect();
    for b in &batches {
        let r = e.export(b).await;
        assert!(matches!(&r, Err(ExportError::Retryable { message, .. }) if message.contains("sink web")), "{r:?}");
        // One batch per concurrent export at most: older ones were retried
        // and settled (delivered or dropped) by the consumer that held them.
        assert!(pending() <= 2 * (4 << 20) + 1024, "{} bytes kept", pending());
    }
    assert!(pending() >= 2 * (4 << 20), "the last two batches' outputs wait for their retries");
    // The host gives up on them (retries exhausted): nothing is kept.
    for b in &batches {
        e.gave_up(b);
    }
    assert_eq!(pending(), 0);
}

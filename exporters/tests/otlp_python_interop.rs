//! The otlp exporter against a server on another stack: Python grpcio and
//! the official opentelemetry-proto package from PyPI (1.45.x, the same
//! v1.10 profiles layout), started here on loopback. Every sample arrives
//! and decodes; RetryInfo and partial_success from that server are honoured.

use profcol_api::component::Kind;
use profcol_api::model::{canonical, ExportProfilesServiceRequest};
use profcol_api::{ExportError, Exporter, Profiles};
use profcol_exporters::otlp::{Compression, OtlpGrpcConfig, OtlpGrpcExporter};
use profcol_testkit::prelude::*;
use profcol_testkit::py_otlp::PyOtlpServer;
use prost::Message;
use std::time::Duration;

/// The Python server, or None (skipped; under CI=true a failure) without its packages.
fn start(args: &[&str]) -> Option<PyOtlpServer> {
    PyOtlpServer::available().then(|| PyOtlpServer::start(args))
}

fn exporter(port: u16, compression: Compression, name: &str) -> (OtlpGrpcExporter, profcol_api::CreateSettings) {
    let cfg = OtlpGrpcConfig { endpoint: Some(format!("http://127.0.0.1:{port}")), compression, ..Default::default() };
    let s = settings(Kind::Exporter, name);
    (OtlpGrpcExporter::new(s.clone(), cfg).unwrap(), s)
}

#[tokio::test]
async fn python_grpcio_server_receives_and_decodes_every_sample() {
    let out = tempfile::tempdir().unwrap();
    let Some(py) = start(&["--out", out.path().to_str().unwrap()]) else { return };
    let (gz, _) = exporter(py.grpc_port, Compression::Gzip, "otlp/gzip");
    let (plain, _) = exporter(py.grpc_port, Compression::None, "otlp/plain");
    let batches: Vec<Profiles> = (0..6).map(|k| cpu_batch(100 + k, 3, 60)).collect();
    for (k, b) in batches.iter().enumerate() {
        let e = if k % 2 == 0 { &gz } else { &plain };
        e.export(b).await.unwrap();
    }
    let (mut samples, mut sample_messages) = (0u64, 0u64);
    let mut leaves = std::collections::BTreeMap::<String, u64>::new();
    for _ in 0..batches.len() {
        let line = py.lines.recv_timeout(Duration::from_secs(10)).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        samples += v["samples"].as_u64().unwrap();
        sample_messages += v["sample_messages"].as_u64().unwrap();
        for (k, n) in v["leaves"].as_object().unwrap() {
            *leaves.entry(k.clone()).or_default() += n.as_u64().unwrap();
        }
    }
    let want = merge(&batches);
    // Python counted observations by the same rule, and the messages apart.
    assert_eq!(samples as usize, want.sample_count());
    assert_eq!(sample_messages as usize, want.sample_messages());
    assert!(samples > sample_messages, "cpu_batch has Samples of several observations");
    // Python resolved the same leaf functions through the dictionary.
    let mut want_leaves = std::collections::BTreeMap::<String, u64>::new();
    for s in want.samples() {
        *want_leaves.entry(s.frames().next().unwrap().function_name().unwrap().to_owned()).or_default() += 1;
    }
    assert_eq!(leaves, want_leaves);
    // What Python decoded and re-encoded is the same data.
    let mut got = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(out.path()).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    for f in files {
        let req = ExportProfilesServiceRequest::decode(std::fs::read(f).unwrap().as_slice()).unwrap();
        let p = Profiles::from_request(req);
        p.validate().unwrap();
        got.push(p);
    }
    assert_eq!(got.len(), batches.len());
    assert!(canonical::samples(&merge(&got)) == canonical::samples(&want), "sample multisets differ after Python");
    drop(py);
}

#[tokio::test]
async fn retry_info_and_partial_success_from_python() {
    let Some(py) = start(&["--unavailable-first", "2", "--partial", "1"]) else { return };
    let (e, s) = exporter(py.grpc_port, Compression::Gzip, "otlp/py");
    let batch = cpu_batch(9, 1, 10);
    for _ in 0..2 {
        match e.export(&batch).await {
            Err(ExportError::Retryable { retry_after, .. }) => assert_eq!(retry_after, Some(Duration::from_secs(1))),
            other => panic!("expected UNAVAILABLE with RetryInfo, got {other:?}"),
        }
    }
    // The server rejected the batch's one profile: all its samples, and no retry.
    match e.export(&batch).await {
        Err(ExportError::Partial { rejected_samples, message }) => {
            assert_eq!(rejected_samples, batch.sample_count() as u64, "{message}");
            assert!(message.contains("python says"), "{message}");
        }
        other => panic!("expected a partial success, got {other:?}"),
    }
    assert_eq!(s.telemetry.counter_value("rejected_profiles_total"), 1);
    assert_eq!(s.telemetry.counter_value("partial_success_total"), 1);
    assert_eq!(s.telemetry.counter_value("retryable_errors_total"), 2);
    drop(py);
}

//! Every documented series counts, in observations: one known set of batches
//! sent over each of the otlp receiver's paths (gRPC, HTTP protobuf, HTTP
//! JSON) through the real host, two processors (one merges, one passes
//! batches on as they fill) and three exporters (file JSON lines, file
//! protobuf stream, debug). Each component's counters equal the observations
//! sent, and in = out + dropped + refused at every step. Samples in the batches
//! carry several observations each, so a count of Sample messages fails it.

mod common;

use common::service::{load, log};
use profcol::service::Service;
use profcol_api::telemetry::Telemetry;
use profcol_api::Profiles;
use profcol_testkit::batch::cpu_batch;
use profcol_testkit::raw::{grpc_send, http_send};
use std::path::Path;

/// `name{label="id"}` in Prometheus text; absent reads as `None`.
fn series(text: &str, name: &str, label: &str, id: &str) -> Option<u64> {
    let key = format!("{name}{{{label}=\"{id}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&key)).map(|v| v.trim().parse().unwrap())
}

/// What the file exporter wrote with `format: proto`: 4-byte big-endian lengths.
fn read_pbstream(path: &Path) -> Vec<Profiles> {
    let bytes = std::fs::read(path).unwrap();
    let mut rest = bytes.as_slice();
    let mut out = Vec::new();
    while let Some((len, tail)) = rest.split_first_chunk::<4>() {
        let (msg, tail) = tail.split_at(u32::from_be_bytes(*len) as usize);
        out.push(Profiles::decode(msg).unwrap());
        rest = tail;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_components_counters_add_up_to_the_observations_sent() {
    let log = log();
    let dir = tempfile::tempdir().unwrap();
    let (json, pbstream) = (dir.path().join("out.jsonl"), dir.path().join("out.pbstream"));
    let yaml = format!(
        "receivers:\n  otlp/in:\n    protocols:\n      grpc: {{ endpoint: 127.0.0.1:0 }}\n      http: {{ endpoint: 127.0.0.1:0 }}\n\
         processors:\n  batch/merge: {{ send_batch_size: 100000, timeout: 50ms }}\n  batch/small: {{ send_batch_size: 60, timeout: 50ms }}\n\
         exporters:\n  file/json: {{ path: {} }}\n  file/proto: {{ path: {}, format: proto }}\n  debug: {{}}\n\
         service:\n  telemetry: {{ metrics: {{ address: \"\" }} }}\n  pipelines:\n    profiles:\n\
         \x20     receivers: [otlp/in]\n      processors: [batch/merge, batch/small]\n      exporters: [file/json, file/proto, debug]\n",
        json.display(),
        pbstream.display()
    );
    let status = profcol::extensions::HostStatus::default();
    let registry = profcol::registry::Registry::builtin(&status);
    let telemetry = Telemetry::new();
    let mut service = Service::new(registry.clone(), telemetry.clone(), status);
    let (config, checked) = load(&registry, &yaml);
    service.start(config, checked).await.unwrap();
    let needles = ["otlp receiver listening", "receiver=otlp/in "];
    let (grpc, http) = (log.addr(&needles, "grpc").unwrap(), log.addr(&needles, "http").unwrap());

    let batches: Vec<Profiles> = (0..3).map(|k| cpu_batch(40 + k, 3, 25)).collect();
    let sent: u64 = batches.iter().map(|b| b.sample_count() as u64).sum();
    let messages: usize = batches.iter().map(Profiles::sample_messages).sum();
    assert!(sent > 2 * messages as u64, "the batches must tell observations from messages");
    // ProfilesData and the export request have the same fields: the same bytes.
    grpc_send(grpc, batches[0].encode_to_vec(), false).await.unwrap();
    let (code, _, text) = http_send(http, batches[1].encode_to_vec(), "application/x-protobuf", false).await;
    assert_eq!(code, 200, "{text}");
    let (code, _, text) = http_send(http, batches[2].to_json().into_bytes(), "application/json", false).await;
    assert_eq!(code, 200, "{text}");
    // Shutdown flushes what the batch processors hold and drains the queues.
    service.shutdown().await;

    let text = telemetry.render();
    let get = |name: &str, label: &str, id: &str| {
        series(&text, name, label, id).unwrap_or_else(|| panic!("no {name}{{{label}=\"{id}\"}} in\n{text}"))
    };
    // The receiver: all accepted, nothing refused or lost.
    let r = |s: &str| get(&format!("profcol_receiver_{s}_samples_total"), "receiver", "otlp/in");
    assert_eq!((r("accepted"), r("refused"), r("dropped")), (sent, 0, 0), "otlp/in");
    // Each processor: what came in went out; the first one's input is what the receiver accepted.
    let mut upstream = r("accepted");
    for p in ["batch/merge", "batch/small"] {
        let c = |s: &str| get(&format!("profcol_processor_{s}_samples_total"), "processor", p);
        let (incoming, outgoing, dropped, refused) = (c("incoming"), c("outgoing"), c("dropped"), c("refused"));
        assert_eq!(incoming, upstream, "{p}: incoming = what the step before passed on");
        assert_eq!(incoming, outgoing + dropped + refused, "{p}: in = out + dropped + refused");
        assert_eq!((outgoing, dropped, refused), (sent, 0, 0), "{p}");
        upstream = outgoing;
    }
    // Each exporter: every observation sent, none failed, refused or dropped.
    for e in ["file/json", "file/proto", "debug"] {
        let c = |s: &str| get(&format!("profcol_exporter_{s}_samples_total"), "exporter", e);
        let (ok, failed, refused, dropped) = (c("sent"), c("send_failed"), c("refused"), c("dropped"));
        assert_eq!(ok + failed + refused + dropped, upstream, "{e}: everything handed to it is accounted for");
        assert_eq!((ok, failed, refused, dropped), (sent, 0, 0, 0), "{e}");
    }
    // What the exporters wrote and logged holds the same observations.
    let written = |batches: Vec<Profiles>| batches.iter().map(|b| b.sample_count() as u64).sum::<u64>();
    assert_eq!(written(common::read_jsonl(&json)), sent, "file/json");
    assert_eq!(written(read_pbstream(&pbstream)), sent, "file/proto");
    let logged: u64 = log
        .text()
        .lines()
        .filter(|l| l.contains("exporter=debug"))
        .filter_map(|l| l.split_once(" samples=")?.1.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(logged, sent, "the debug exporter's samples=");
}

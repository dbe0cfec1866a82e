//! profcol's own telemetry over OTLP, end to end, against a server built on
//! the official protos (grpcio + opentelemetry-proto from PyPI:
//! collector/tests/python/otlp_telemetry_server.py): the metric points a
//! periodic reader pushes equal what /metrics shows at the same moment (after
//! the standard OTel-to-Prometheus naming: counters get `_total`, histograms
//! `_count`/`_sum`), a component's warning arrives as a log record carrying
//! its component id, and /metrics passes `promtool check metrics`.

mod common;

use common::*;
use profcol_testkit::py_otlp::PyOtlpServer;
use profcol_testkit::tools::tool_available;
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHECK: &str = "import grpc\n\
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc\n\
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc\n\
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc";

/// The telemetry server: its ports and the requests it printed.
struct Server {
    proc: PyOtlpServer,
    /// Requests read while looking for another signal's.
    pending: std::sync::Mutex<std::collections::VecDeque<Request>>,
    grpc: u16,
    http: u16,
}

/// One request: its signal and body (protobuf's JSON mapping).
struct Request {
    signal: String,
    transport: String,
    body: Value,
}

impl Server {
    /// `None` when python3 or the protos are missing outside CI (a skip).
    fn start() -> Option<Server> {
        if !tool_available("python3", &["-c", CHECK]) {
            return None;
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/otlp_telemetry_server.py");
        let proc = PyOtlpServer::start_script(script, &[], true);
        let (grpc, http) = (proc.grpc_port, proc.http_port.unwrap_or_default());
        Some(Server { proc, pending: Default::default(), grpc, http })
    }

    /// The next request of `signal` within `timeout` (others wait their turn).
    fn next(&self, signal: &str, timeout: Duration) -> Option<Request> {
        let mut pending = self.pending.lock().unwrap();
        if let Some(i) = pending.iter().position(|r| r.signal == signal) {
            return pending.remove(i);
        }
        let until = Instant::now() + timeout;
        loop {
            let left = until.checked_duration_since(Instant::now())?;
            let line = self.proc.lines.recv_timeout(left).ok()?;
            let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
            let r = Request {
                signal: v["signal"].as_str().unwrap_or_default().to_owned(),
                transport: v["transport"].as_str().unwrap_or_default().to_owned(),
                body: v["body"].clone(),
            };
            if r.signal == signal {
                return Some(r);
            }
            pending.push_back(r);
        }
    }
}

/// A series: name and sorted labels.
type Series = (String, Vec<(String, String)>);

/// The samples of Prometheus text, without histogram buckets.
fn parse_prometheus(text: &str) -> BTreeMap<Series, f64> {
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or(text);
    let mut out = BTreeMap::new();
    for line in body.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("not a sample line: {line}"));
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if name.ends_with("_bucket") {
            continue;
        }
        let mut ls: Vec<(String, String)> = labels
            .split("\",")
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once("=\"").unwrap_or_else(|| panic!("label {p} in {line}"));
                (k.to_owned(), v.trim_end_matches('"').to_owned())
            })
            .collect();
        ls.sort();
        out.insert((name.to_owned(), ls), value.parse().unwrap_or_else(|_| panic!("value in {line}")));
    }
    out
}

fn attrs(point: &Value) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = point["attributes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|kv| {
                    let s = kv["value"]["string_value"].as_str().unwrap_or_default();
                    (kv["key"].as_str().unwrap_or_default().to_owned(), s.to_owned())
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn number(v: &Value) -> f64 {
    match v {
        Value::String(s) => s.parse().unwrap(),
        Value::Number(n) => n.as_f64().unwrap(),
        Value::Null => 0.0,
        other => panic!("not a number: {other}"),
    }
}

/// An OTLP metrics request as Prometheus series (the standard translation).
fn otlp_as_prometheus(body: &Value) -> BTreeMap<Series, f64> {
    let mut out = BTreeMap::new();
    for rm in body["resource_metrics"].as_array().into_iter().flatten() {
        for sm in rm["scope_metrics"].as_array().into_iter().flatten() {
            for m in sm["metrics"].as_array().into_iter().flatten() {
                let name = m["name"].as_str().unwrap().to_owned();
                if let Some(sum) = m.get("sum") {
                    let suffix = if sum["is_monotonic"] == true { "_total" } else { "" };
                    for p in sum["data_points"].as_array().into_iter().flatten() {
                        let v = p.get("as_int").map(number).or_else(|| p.get("as_double").map(number)).unwrap_or(0.0);
                        out.insert((format!("{name}{suffix}"), attrs(p)), v);
                    }
                } else if let Some(g) = m.get("gauge") {
                    for p in g["data_points"].as_array().into_iter().flatten() {
                        let v = p.get("as_int").map(number).or_else(|| p.get("as_double").map(number)).unwrap_or(0.0);
                        out.insert((name.clone(), attrs(p)), v);
                    }
                } else if let Some(h) = m.get("histogram") {
                    for p in h["data_points"].as_array().into_iter().flatten() {
                        out.insert((format!("{name}_count"), attrs(p)), number(&p["count"]));
                        out.insert((format!("{name}_sum"), attrs(p)), number(&p["sum"]));
                    }
                } else {
                    panic!("a metric kind profcol does not make: {m}");
                }
            }
        }
    }
    out
}

fn resource_attr(body: &Value, list: &str, key: &str) -> Option<String> {
    body[list][0]["resource"]["attributes"]
        .as_array()?
        .iter()
        .find(|kv| kv["key"] == key)
        .and_then(|kv| kv["value"]["string_value"].as_str().map(str::to_owned))
}

fn config(dir: &std::path::Path, server: &Server, protocol: &str) -> std::path::PathBuf {
    let endpoint = match protocol {
        "grpc" => format!("http://127.0.0.1:{}", server.grpc),
        _ => format!("http://127.0.0.1:{}", server.http),
    };
    let down = profcol_testkit::net::closed_port();
    let yaml = format!(
        "receivers:\n  file:\n    path: {dir}/in\n\
         exporters:\n  file:\n    path: {dir}/out.jsonl\n\
         \x20 otlp/down:\n    endpoint: http://127.0.0.1:{down}\n    timeout: 1s\n    retry_on_failure:\n      enabled: false\n\
         service:\n  shutdown_timeout: 5s\n  telemetry:\n\
         \x20   resource:\n      deployment.environment: test\n\
         \x20   logs:\n      level: info\n      processors:\n        - batch:\n            schedule_delay: 200ms\n\
         \x20           exporter:\n              otlp:\n                protocol: {protocol}\n                endpoint: {endpoint}\n\
         \x20   metrics:\n      level: detailed\n      address: 127.0.0.1:0\n      readers:\n\
         \x20       - periodic:\n            interval: 500ms\n            exporter:\n              otlp:\n\
         \x20               protocol: {protocol}\n                endpoint: {endpoint}\n\
         \x20 pipelines:\n    profiles:\n      receivers: [file]\n      exporters: [file, otlp/down]\n",
        dir = dir.display()
    );
    write(&dir.join("c.yaml"), &yaml)
}

/// The whole check, over one OTLP transport.
fn metrics_and_logs_arrive(protocol: &str) {
    let Some(server) = Server::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    write_corpus(&dir.path().join("in"), 4, 25);
    let cfg = config(dir.path(), &server, protocol);
    let mut p = Profcol::start(&["--config", cfg.to_str().unwrap()]);
    assert!(p.wait_log("profcol started", Duration::from_secs(20)));
    let maddr = p.wait_addr("serving metrics", "address", Duration::from_secs(5)).to_string();
    let scrape = || parse_prometheus(&http_get(&maddr, "/metrics").1);
    let key = |name: &str, label: &str, id: &str| (name.to_owned(), vec![(label.to_owned(), id.to_owned())]);
    let settled = wait_until(Duration::from_secs(20), || {
        let m = scrape();
        m.get(&key("profcol_exporter_sent_samples_total", "exporter", "file")) == Some(&100.0)
            && m.get(&key("profcol_exporter_send_failed_samples_total", "exporter", "otlp/down")) == Some(&100.0)
    });
    assert!(settled, "the pipeline did not settle:\n{}", http_get(&maddr, "/metrics").1);

    // The same moment: nothing changes between two scrapes around one push.
    let mut compared = false;
    for _ in 0..10 {
        let before = scrape();
        let Some(push) = server.next("metrics", Duration::from_secs(5)) else { continue };
        if scrape() != before {
            continue;
        }
        assert_eq!(push.transport, protocol.split('/').next().unwrap());
        let pushed = otlp_as_prometheus(&push.body);
        // A push collected before the scrape can only lack the series that
        // appeared since (the histogram's first point): take the next one.
        if pushed.len() < before.len() {
            continue;
        }
        // Same series; counts exact, float sums to the last bits (the two
        // readers aggregate apart, and Prometheus text and JSON print floats
        // their own way).
        assert_eq!(pushed.keys().collect::<Vec<_>>(), before.keys().collect::<Vec<_>>(), "OTLP series vs /metrics");
        for (k, v) in &pushed {
            let want = before[k];
            assert!((v - want).abs() <= 1e-9 * want.abs(), "{k:?}: OTLP {v} vs /metrics {want}");
        }
        assert!(pushed.keys().any(|(n, _)| n == "profcol_exporter_export_latency_count"), "{pushed:?}");
        assert_eq!(resource_attr(&push.body, "resource_metrics", "service.name").as_deref(), Some("profcol"));
        assert_eq!(resource_attr(&push.body, "resource_metrics", "deployment.environment").as_deref(), Some("test"));
        let id = resource_attr(&push.body, "resource_metrics", "service.instance.id").unwrap();
        assert_eq!(id.len(), 36, "{id}");
        assert!(resource_attr(&push.body, "resource_metrics", "host.name").is_some());
        compared = true;
        break;
    }
    assert!(compared, "no OTLP push matched a stable /metrics");

    // The otlp/down exporter's warning, as a log record with its component id.
    let mut found = None;
    let mut seen = Vec::new();
    let until = Instant::now() + Duration::from_secs(20);
    while found.is_none() && Instant::now() < until {
        let Some(req) = server.next("logs", Duration::from_secs(5)) else { continue };
        assert_eq!(req.signal, "logs");
        for rl in req.body["resource_logs"].as_array().into_iter().flatten() {
            for sl in rl["scope_logs"].as_array().into_iter().flatten() {
                let scope = sl["scope"]["name"].as_str().unwrap_or_default();
                for t in ["opentelemetry", "tonic", "hyper", "h2", "reqwest"] {
                    assert!(!scope.starts_with(t), "a log record of {scope} was exported");
                }
                for r in sl["log_records"].as_array().into_iter().flatten() {
                    seen.push(r.to_string());
                    let body = r["body"]["string_value"].as_str().unwrap_or_default();
                    if r["severity_text"] == "WARN" && body.contains("export failed") {
                        found = Some((r.clone(), resource_attr(&req.body, "resource_logs", "service.name")));
                    }
                }
            }
        }
    }
    let (record, service) =
        found.unwrap_or_else(|| panic!("no log record of the failed export arrived; seen:\n{}", seen.join("\n")));
    assert!(attrs(&record).contains(&("exporter".into(), "otlp/down".into())), "{record}");
    assert_eq!(service.as_deref(), Some("profcol"));

    p.signal(libc::SIGTERM);
    assert!(p.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()));
}

#[test]
fn otlp_grpc_metrics_equal_prometheus_and_component_warnings_arrive_as_log_records() {
    metrics_and_logs_arrive("grpc");
}

#[test]
fn otlp_http_metrics_equal_prometheus_and_component_warnings_arrive_as_log_records() {
    metrics_and_logs_arrive("http/protobuf");
}

/// `promtool check metrics` (Debian's prometheus package, .ci/telemetry.sh)
/// accepts /metrics as served with every kind of series profcol makes
/// (counters, gauges, histograms with buckets at `level: detailed`).
#[test]
fn metrics_pass_promtool_check() {
    if !tool_available("promtool", &["--version"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write_corpus(&dir.path().join("in"), 2, 10);
    let yaml = format!(
        "receivers:\n  file:\n    path: {dir}/in\n\
         processors:\n  batch:\n    timeout: 100ms\n\
         exporters:\n  file:\n    path: {dir}/out.jsonl\n\
         service:\n  telemetry:\n    metrics:\n      level: detailed\n      address: 127.0.0.1:0\n\
         \x20 pipelines:\n    profiles:\n      receivers: [file]\n      processors: [batch]\n      exporters: [file]\n",
        dir = dir.path().display()
    );
    let cfg = write(&dir.path().join("c.yaml"), &yaml);
    let mut p = Profcol::start(&["--config", cfg.to_str().unwrap()]);
    let maddr = p.wait_addr("serving metrics", "address", Duration::from_secs(20)).to_string();
    let latency = "profcol_exporter_export_latency_bucket{exporter=\"file\"";
    assert!(wait_until(Duration::from_secs(20), || http_get(&maddr, "/metrics").1.contains(latency)));
    let (code, answer) = http_get(&maddr, "/metrics");
    assert_eq!(code, 200);
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    check.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics:\n{}{}\n--- /metrics:\n{body}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    p.signal(libc::SIGTERM);
    assert!(p.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()));
}

/// With traces on at ratio 1.0, one batch through a gateway (otlp receiver,
/// a processor, an exporter) is one trace: the root `pipeline/profiles` and
/// its children `receive`, `processor/batch`, `queue_wait/file` and one
/// `export/file` attempt with its outcome.
#[test]
fn one_batch_through_a_gateway_is_one_trace() {
    use profcol_api::Exporter as _;
    let Some(server) = Server::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: 127.0.0.1:0\n\
         processors:\n  batch:\n    send_batch_size: 1\n\
         exporters:\n  file:\n    path: {dir}/out.jsonl\n\
         service:\n  telemetry:\n    metrics:\n      address: \"\"\n\
         \x20   traces:\n      sampling_ratio: 1.0\n      processors:\n        - batch:\n            schedule_delay: 200ms\n\
         \x20           exporter:\n              otlp:\n                endpoint: http://127.0.0.1:{port}\n\
         \x20 pipelines:\n    profiles:\n      receivers: [otlp]\n      processors: [batch]\n      exporters: [file]\n",
        dir = dir.path().display(),
        port = server.grpc
    );
    let cfg = write(&dir.path().join("c.yaml"), &yaml);
    let mut p = Profcol::start(&["--config", cfg.to_str().unwrap()]);
    let addr = p.wait_addr("otlp receiver listening", "grpc", Duration::from_secs(20));
    let rt = common::service::runtime();
    rt.block_on(async {
        let sender = common::service::sender(addr);
        sender.export(&random_batch(1, 2, 20, 10, 6)).await.unwrap();
    });

    let mut spans: Vec<Value> = Vec::new();
    let until = Instant::now() + Duration::from_secs(20);
    while !spans.iter().any(|s| s["name"] == "export/file") && Instant::now() < until {
        let Some(req) = server.next("traces", Duration::from_secs(5)) else { continue };
        assert_eq!(resource_attr(&req.body, "resource_spans", "service.name").as_deref(), Some("profcol"));
        for rs in req.body["resource_spans"].as_array().into_iter().flatten() {
            for ss in rs["scope_spans"].as_array().into_iter().flatten() {
                spans.extend(ss["spans"].as_array().into_iter().flatten().cloned());
            }
        }
    }
    // Let a stray second trace show up, if there were one.
    std::thread::sleep(Duration::from_millis(500));
    while let Some(req) = server.next("traces", Duration::from_millis(300)) {
        for rs in req.body["resource_spans"].as_array().into_iter().flatten() {
            for ss in rs["scope_spans"].as_array().into_iter().flatten() {
                spans.extend(ss["spans"].as_array().into_iter().flatten().cloned());
            }
        }
    }
    let show = || spans.iter().map(|s| s.to_string()).collect::<Vec<_>>().join("\n");
    let roots: Vec<&Value> = spans.iter().filter(|s| s.get("parent_span_id").is_none()).collect();
    assert_eq!(roots.len(), 1, "one root span:\n{}", show());
    let root = roots[0];
    assert_eq!(root["name"], "pipeline/profiles", "{}", show());
    let mut children: Vec<&str> = spans
        .iter()
        .filter(|s| s.get("parent_span_id").is_some())
        .map(|s| {
            assert_eq!(s["trace_id"], root["trace_id"], "one trace:\n{}", show());
            assert_eq!(s["parent_span_id"], root["span_id"], "parented to the root:\n{}", show());
            s["name"].as_str().unwrap()
        })
        .collect();
    children.sort();
    assert_eq!(children, ["export/file", "processor/batch", "queue_wait/file", "receive"], "{}", show());
    let export = spans.iter().find(|s| s["name"] == "export/file").unwrap();
    let outcome = export["attributes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|kv| kv["key"] == "profcol.outcome")
        .map(|kv| kv["value"]["string_value"].clone());
    assert_eq!(outcome, Some(Value::from("ok")), "{export}");

    p.signal(libc::SIGTERM);
    assert!(p.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()));
}

/// Telemetry endpoints down (metrics, logs and traces): the pipeline still
/// delivers everything, and each signal's failure is logged once (not at
/// every interval), however many pushes fail.
#[test]
fn an_unreachable_telemetry_endpoint_is_logged_once_and_blocks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let sent = write_corpus(&dir.path().join("in"), 4, 25);
    let down = profcol_testkit::net::closed_port();
    let otlp = format!("exporter:\n              otlp:\n                endpoint: http://127.0.0.1:{down}\n");
    let yaml = format!(
        "receivers:\n  file:\n    path: {dir}/in\n\
         exporters:\n  file:\n    path: {dir}/out.jsonl\n\
         service:\n  telemetry:\n\
         \x20   logs:\n      processors:\n        - batch:\n            schedule_delay: 100ms\n            {otlp}\
         \x20   traces:\n      processors:\n        - batch:\n            schedule_delay: 100ms\n            {otlp}\
         \x20   metrics:\n      address: \"\"\n      readers:\n        - periodic:\n            interval: 100ms\n            {otlp}\
         \x20 pipelines:\n    profiles:\n      receivers: [file]\n      exporters: [file]\n",
        dir = dir.path().display()
    );
    let cfg = write(&dir.path().join("c.yaml"), &yaml);
    let mut p = Profcol::start(&["--config", cfg.to_str().unwrap()]);
    assert!(p.wait_log("profcol started", Duration::from_secs(20)));
    let out = dir.path().join("out.jsonl");
    let want: usize = sent.iter().map(|b| b.sample_count()).sum();
    assert!(
        wait_until(Duration::from_secs(10), || read_jsonl(&out).iter().map(|b| b.sample_count()).sum::<usize>()
            == want),
        "the pipeline did not deliver with the telemetry endpoint down"
    );
    // Twenty intervals and more: every push fails.
    std::thread::sleep(Duration::from_secs(2));
    let needle = "self-telemetry export failed; retrying in the background";
    for signal in ["metrics", "logs", "traces"] {
        let tag = format!("signal=\"{signal}\"");
        let n = p.log.lock().unwrap().iter().filter(|l| l.contains(needle) && l.contains(&tag)).count();
        assert_eq!(n, 1, "{signal}: the failure is logged once, not at every push");
    }
    p.signal(libc::SIGTERM);
    assert!(p.wait_exit(Duration::from_secs(20)).is_some_and(|s| s.success()));
}

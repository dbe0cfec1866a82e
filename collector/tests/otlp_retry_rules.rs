//! The otlp exporters inside the host's queue / retry wrapper, against an
//! OTLP server built on the official protos (Python grpcio and
//! opentelemetry-proto 1.45 from PyPI: exporters/tests/python/otlp_server.py),
//! case by case as the OTLP specification says: a partial_success is counted
//! and never retried; RESOURCE_EXHAUSTED is retried only with a RetryInfo,
//! after its delay; HTTP 429 is retried after its Retry-After.

use profcol::exporter_helper::settings::{ExporterHelperConfig, RetryConfig};
use profcol::exporter_helper::ExporterHandle;
use profcol_api::component::{ComponentId, CreateSettings, Kind};
use profcol_api::telemetry::{ComponentTelemetry, Telemetry};
use profcol_api::{Exporter, Profiles};
use profcol_exporters::otlp::{OtlpGrpcConfig, OtlpGrpcExporter, OtlpHttpConfig, OtlpHttpExporter};
use profcol_testkit::batch::random_batch;
use profcol_testkit::py_otlp::PyOtlpServer;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The Python server is there, or (CI=true) the test fails.
fn python_ready() -> bool {
    PyOtlpServer::available()
}

/// The Python server with both protocols.
struct Server(PyOtlpServer);

/// One request as the server saw it.
#[derive(Debug)]
struct Attempt {
    answer: String,
    t: f64,
    samples: u64,
}

impl Server {
    fn start(script: &str) -> Server {
        Server(PyOtlpServer::start(&["--http", "--script", script]))
    }

    fn grpc(&self) -> u16 {
        self.0.grpc_port
    }

    fn http(&self) -> u16 {
        self.0.http_port.expect("started with --http")
    }

    /// Every request answered so far (waits `quiet` for more after the last).
    fn attempts(&self, quiet: Duration) -> Vec<Attempt> {
        let mut out = Vec::new();
        while let Ok(l) = self.0.lines.recv_timeout(quiet) {
            let v: serde_json::Value = serde_json::from_str(&l).unwrap();
            out.push(Attempt {
                answer: v["answer"].as_str().unwrap().to_owned(),
                t: v["t"].as_f64().unwrap(),
                samples: v["samples"].as_u64().unwrap(),
            });
        }
        out
    }
}

/// The host's settings: retries start at 100 ms (so a longer wait is the
/// server's delay), no jitter, give up after 20 s.
fn helper() -> ExporterHelperConfig {
    let mut h = ExporterHelperConfig { timeout: Duration::from_secs(10), ..Default::default() };
    h.retry_on_failure = RetryConfig {
        initial_interval: Duration::from_millis(100),
        randomization_factor: 0.0,
        max_elapsed_time: Duration::from_secs(20),
        ..RetryConfig::default()
    };
    h
}

#[derive(Clone, Copy, Debug)]
enum Proto {
    Grpc,
    Http,
}

/// Exports `batch` once through the host's wrapper; returns the exporter's
/// telemetry once the batch has been settled (sent and failed add up).
async fn export_through_host(server: &Server, proto: Proto, batch: &Profiles) -> ComponentTelemetry {
    let id: ComponentId =
        format!("{}/py", if matches!(proto, Proto::Grpc) { "otlp" } else { "otlp_http" }).parse().unwrap();
    let telemetry = Telemetry::new().component(Kind::Exporter, &id);
    let settings = CreateSettings { id: id.clone(), telemetry: telemetry.clone(), services: Default::default() };
    let exporter: Arc<dyn Exporter> = match proto {
        Proto::Grpc => {
            let cfg =
                OtlpGrpcConfig { endpoint: Some(format!("http://127.0.0.1:{}", server.grpc())), ..Default::default() };
            Arc::new(OtlpGrpcExporter::new(settings, cfg).unwrap())
        }
        Proto::Http => {
            let cfg = OtlpHttpConfig {
                endpoint: Some(format!("http://127.0.0.1:{}", server.http()).into()),
                ..Default::default()
            };
            Arc::new(OtlpHttpExporter::new(settings, cfg).unwrap())
        }
    };
    let handle = ExporterHandle::start(id, exporter, helper(), telemetry.clone()).await.unwrap();
    handle.enqueue(Arc::new(batch.clone())).await.unwrap();
    let n = batch.sample_count() as u64;
    let t0 = Instant::now();
    while telemetry.sent.get() + telemetry.send_failed.get() < n {
        assert!(t0.elapsed() < Duration::from_secs(30), "the batch was not settled within 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    handle.shutdown(Instant::now() + Duration::from_secs(5)).await;
    telemetry
}

fn counter(t: &ComponentTelemetry, name: &str) -> u64 {
    t.counter_value(name)
}

/// Three processes: three profiles, so a partial success of one is a third.
fn three_profiles() -> Profiles {
    random_batch(5, 3, 300, 20, 6)
}

#[tokio::test]
async fn partial_success_is_counted_and_not_retried() {
    if !python_ready() {
        return;
    }
    let b = three_profiles();
    let n = b.sample_count() as u64;
    assert_eq!(b.profiles().count(), 3);
    for proto in [Proto::Grpc, Proto::Http] {
        let server = Server::start("partial:1");
        let t = export_through_host(&server, proto, &b).await;
        let attempts = server.attempts(Duration::from_millis(500));
        assert_eq!(attempts.len(), 1, "{proto:?}: never retried: {attempts:?}");
        assert_eq!(attempts[0].samples, n, "{proto:?}: the server decoded every sample");
        let rejected = n.div_ceil(3);
        assert_eq!(t.send_failed.get(), rejected, "{proto:?}: a third of the samples, rounded up");
        assert_eq!(t.sent.get(), n - rejected, "{proto:?}");
        assert_eq!(counter(&t, "partial_success_total"), 1, "{proto:?}");
        assert_eq!(counter(&t, "rejected_profiles_total"), 1, "{proto:?}");
        assert_eq!(counter(&t, "retryable_errors_total") + counter(&t, "permanent_errors_total"), 0, "{proto:?}");
    }
}

#[tokio::test]
async fn resource_exhausted_with_retry_info_is_retried_after_its_delay() {
    if !python_ready() {
        return;
    }
    let b = three_profiles();
    let server = Server::start("exhausted-retry:1");
    let t = export_through_host(&server, Proto::Grpc, &b).await;
    let a = server.attempts(Duration::from_millis(500));
    assert_eq!(a.iter().map(|a| a.answer.as_str()).collect::<Vec<_>>(), ["exhausted-retry:1", "ok"]);
    let gap = a[1].t - a[0].t;
    assert!(gap >= 1.0, "the retry waited the RetryInfo delay (1 s), not the 100 ms backoff: {gap:.3} s");
    assert_eq!(t.sent.get(), b.sample_count() as u64);
    assert_eq!(t.send_failed.get(), 0);
    assert_eq!(counter(&t, "retryable_errors_total"), 1);
    assert_eq!(counter(&t, "permanent_errors_total"), 0);
}

#[tokio::test]
async fn resource_exhausted_without_retry_info_is_permanent() {
    if !python_ready() {
        return;
    }
    let b = three_profiles();
    let server = Server::start("exhausted");
    let t = export_through_host(&server, Proto::Grpc, &b).await;
    let a = server.attempts(Duration::from_millis(800));
    assert_eq!(a.len(), 1, "not retried: {a:?}");
    assert_eq!(t.send_failed.get(), b.sample_count() as u64);
    assert_eq!(t.sent.get(), 0);
    assert_eq!(counter(&t, "permanent_errors_total"), 1);
    assert_eq!(counter(&t, "retryable_errors_total"), 0);
}

#[tokio::test]
async fn http_429_is_retried_after_its_retry_after() {
    if !python_ready() {
        return;
    }
    let b = three_profiles();
    // Twice 429 (Retry-After: 1), then a 503 without Retry-After (the backoff), then OK.
    let server = Server::start("http:429:1,http:429:1,http:503:");
    let t = export_through_host(&server, Proto::Http, &b).await;
    let a = server.attempts(Duration::from_millis(500));
    assert_eq!(
        a.iter().map(|a| a.answer.as_str()).collect::<Vec<_>>(),
        ["http:429:1", "http:429:1", "http:503:", "ok"]
    );
    for w in a.windows(2).take(2) {
        assert!(w[1].t - w[0].t >= 1.0, "Retry-After: 1 honoured: {:.3} s", w[1].t - w[0].t);
    }
    let backoff = a[3].t - a[2].t;
    assert!(backoff < 1.0, "without Retry-After the backoff (about 225 ms by then) decides: {backoff:.3} s");
    assert_eq!(t.sent.get(), b.sample_count() as u64);
    assert_eq!(t.send_failed.get(), 0);
    assert_eq!(counter(&t, "retryable_errors_total"), 3);
}

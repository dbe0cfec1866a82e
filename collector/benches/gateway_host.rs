//! Gateway throughput through the real host: OTLP/gRPC in → `batch` →
//! OTLP/gRPC out, on loopback, in samples per second, beside the floor (a
//! bare prost decode + encode of the same request bytes).
//!
//! The service is built from a YAML config exactly as `profcol run` builds
//! it (receiver, pipeline task, batch processor, the exporter's sending queue
//! and retry wrapper); clients and the backend live in the same process.
//! One measurement sends requests from 4 concurrent clients and stops the
//! clock when the backend has every sample, so the batch processor's last
//! flush is inside the time. The third case adds the persistent sending
//! queue (`sending_queue.storage`: one fsynced file per outgoing batch).
//!
//! cargo bench -p profcol --bench gateway_host

use profcol_testkit::config::{one_pipeline, OTLP_GRPC_RECEIVER};
use profcol_testkit::floor::{busy_node_batch, decode_encode, samples_per_second};
use profcol_testkit::otlp::start_receiver;
use profcol_testkit::prelude::{receiver_config, settings, LOOPBACK};
use profcol_testkit::sink::next_to;

/// The bench process's log (one subscriber per process).
static LOG: std::sync::OnceLock<profcol_testkit::log::Captured> = std::sync::OnceLock::new();
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use profcol::extensions::HostStatus;
use profcol::registry::Registry;
use profcol::service::{check, Service};
use profcol_api::component::{ConsumeError, Consumer, Kind};
use profcol_api::telemetry::Telemetry;
use profcol_api::{Exporter, Profiles, Receiver};
use profcol_config::Source;
use profcol_exporters::otlp::{Compression, OtlpGrpcConfig, OtlpGrpcExporter};
use profcol_receivers::otlp::OtlpReceiver;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLIENTS: u64 = 4;

/// Counts what reaches the backend.
#[derive(Default)]
struct Count(AtomicU64);

#[async_trait::async_trait]
impl Consumer for Count {
    async fn consume(&self, batch: Profiles) -> Result<(), ConsumeError> {
        self.0.fetch_add(batch.sample_count() as u64, Ordering::Relaxed);
        Ok(())
    }
}

struct Setup {
    service: Service,
    backend: Arc<OtlpReceiver>,
    arrived: Arc<Count>,
    clients: Vec<Arc<OtlpGrpcExporter>>,
}

async fn setup(compression: Compression, storage: Option<&std::path::Path>) -> Setup {
    let arrived = Arc::new(Count::default());
    let backend = start_receiver("otlp/backend", receiver_config(Some(LOOPBACK), None), next_to(arrived.clone())).await;
    // The receiver binds port 0; its address comes from the captured log.
    let log = LOG.get_or_init(profcol_testkit::log::capture);
    let gzip = if compression == Compression::Gzip { "gzip" } else { "none" };
    let storage = storage.map(|d| format!("\n    sending_queue:\n      storage: {}", d.display())).unwrap_or_default();
    let service = one_pipeline("otlp", "batch", "otlp");
    let text = format!(
        "{OTLP_GRPC_RECEIVER}processors:
  batch:
    send_batch_size: 8192
    timeout: 200ms
exporters:
  otlp:
    endpoint: http://{}
    compression: {gzip}{storage}
{service}",
        backend.grpc_addr().unwrap()
    );
    let status = HostStatus::default();
    let registry = Registry::builtin(&status);
    let (config, errors) =
        profcol_config::load_partial(&[Source::Text { name: "gateway".into(), text }], &[], &|_| None);
    assert!(errors.is_empty(), "{errors:?}");
    let config = config.unwrap();
    let checked = check::check(&config, &registry).unwrap();
    let mut service = Service::new(registry, Telemetry::new(), status);
    service.start(config, checked).await.unwrap();
    // The last "listening" line is this setup's receiver (setups run one after another).
    let port_in = log
        .text()
        .lines()
        .rev()
        .find(|l| l.contains("otlp receiver listening") && l.contains("receiver=otlp "))
        .and_then(|l| profcol_testkit::net::addr_in_log(l, "grpc"))
        .expect("the gateway's receiver logged its address")
        .port();
    let clients = (0..CLIENTS)
        .map(|k| {
            let cfg =
                OtlpGrpcConfig { endpoint: format!("http://127.0.0.1:{port_in}"), compression, ..Default::default() };
            Arc::new(OtlpGrpcExporter::new(settings(Kind::Exporter, &format!("otlp/client{k}")), cfg).unwrap())
        })
        .collect();
    Setup { service, backend, arrived, clients }
}

/// Sends `requests` requests spread over the clients and waits until the
/// backend has all their samples; returns the time that took.
async fn run(s: &Setup, batch: &Arc<Profiles>, requests: u64) -> Duration {
    let per_batch = batch.sample_count() as u64;
    let want = s.arrived.0.load(Ordering::Relaxed) + requests * per_batch;
    let t = Instant::now();
    let mut tasks = Vec::new();
    for (k, c) in s.clients.iter().enumerate() {
        let (c, batch) = (Arc::clone(c), Arc::clone(batch));
        let mine = requests / CLIENTS + u64::from((k as u64) < requests % CLIENTS);
        tasks.push(tokio::spawn(async move {
            for _ in 0..mine {
                c.export(&batch).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    while s.arrived.0.load(Ordering::Relaxed) < want {
        assert!(t.elapsed() < Duration::from_secs(120), "the gateway lost samples");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    t.elapsed()
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (batch, bytes) = busy_node_batch();
    let n = batch.sample_count() as u64;
    let batch = Arc::new(batch);

    let mut g = c.benchmark_group("gateway_host");
    g.throughput(Throughput::Elements(n));
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    g.bench_function("floor_prost_decode_encode", |b| b.iter(|| decode_encode(&bytes)));
    let floor = samples_per_second(&bytes, n, Duration::from_secs(3));
    let queue_dir = tempfile::tempdir().unwrap();
    let cases = [
        (Compression::None, None, "plain"),
        (Compression::Gzip, None, "gzip"),
        (Compression::None, Some(queue_dir.path()), "plain_persistent_queue"),
    ];
    for (compression, storage, label) in cases {
        let mut s = rt.block_on(setup(compression, storage));
        let name = format!("otlp_batch_otlp_{label}");
        g.bench_function(&name, |b| b.iter_custom(|iters| rt.block_on(run(&s, &batch, iters))));
        // The ratio, measured plainly in the same run: 400 requests, 1.6 M samples.
        let took = rt.block_on(run(&s, &batch, 400));
        let gw = (400 * n) as f64 / took.as_secs_f64();
        eprintln!(
            "RATIO host gateway({label}) {gw:.0} samples/s vs floor (prost decode+encode) {floor:.0} samples/s: \
             gateway = {:.3} × floor",
            gw / floor
        );
        rt.block_on(async {
            s.service.shutdown().await;
            s.backend.shutdown().await.unwrap();
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

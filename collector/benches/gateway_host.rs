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
//! cargo bench -p profcol --bench gateway_host -- nomatch   # the RATIO lines only
//!
//! Each RATIO line is the median of `GATEWAY_RATIO_ROUNDS` (default 5)
//! rounds that measure the floor and the gateway one after the other.
//!
//! With the argument `telemetry` it measures the self-telemetry's cost
//! instead: `metrics.level: none` (telemetry off), `detailed`, and
//! `normal` with an OTLP periodic reader (every 200 ms) whose endpoint is down
//! for the whole run, in interleaved rounds (`GATEWAY_TELEMETRY_ROUNDS`,
//! default 7), each a fresh gateway warmed up then timed over 400 requests;
//! it prints every run, the medians and spread, each setting's ratio to
//! `none` of the same round (median and range: the load of a shared machine
//! drifts between rounds more than within one), and the process's RSS over a
//! longer outage run (4,000 requests, a failed push every 200 ms) beside the
//! same run with telemetry off.
//!
//! cargo bench -p profcol --bench gateway_host -- telemetry

use profcol_receivers::otlp::testing::{receiver_config, start_receiver, LOOPBACK};
use profcol_testkit::config::{one_pipeline, OTLP_GRPC_RECEIVER};
use profcol_testkit::floor::{busy_node_batch, decode_encode, samples_per_second};
use profcol_testkit::prelude::settings;
use profcol_testkit::sink::next_to;

/// The bench process's log (one subscriber per process).
static LOG: std::sync::OnceLock<profcol_testkit::log::Captured> = std::sync::OnceLock::new();
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use profcol::extensions::HostStatus;
use profcol::registry::Registry;
use profcol::self_telemetry::SelfTelemetry;
use profcol::service::{check, Service};
use profcol_api::component::{ConsumeError, Consumer, Kind};
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
    telemetry: SelfTelemetry,
}

/// The `service.telemetry.metrics` lines of the default gateway (with no telemetry settings).
const METRICS_DEFAULT: &str = "      address: \"\"\n";

async fn setup(compression: Compression, storage: Option<&std::path::Path>, telemetry: &str) -> Setup {
    let arrived = Arc::new(Count::default());
    let backend = start_receiver("otlp/backend", receiver_config(Some(LOOPBACK), None), next_to(arrived.clone())).await;
    // The receiver binds port 0; its address comes from the captured log.
    let log = LOG.get_or_init(profcol_testkit::log::capture);
    let gzip = if compression == Compression::Gzip { "gzip" } else { "none" };
    let storage = storage.map(|d| format!("\n    sending_queue:\n      storage: {}", d.display())).unwrap_or_default();
    let service = one_pipeline("otlp", "batch", "otlp").replace("      address: \"\"\n", telemetry);
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
    let telemetry = SelfTelemetry::start(&config.service.telemetry, &[]).unwrap();
    let mut service = Service::new(registry, telemetry.metrics.clone(), status);
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
            let cfg = OtlpGrpcConfig {
                endpoint: Some(format!("http://127.0.0.1:{port_in}")),
                compression,
                ..Default::default()
            };
            Arc::new(OtlpGrpcExporter::new(settings(Kind::Exporter, &format!("otlp/client{k}")), cfg).unwrap())
        })
        .collect();
    Setup { service, backend, arrived, clients, telemetry }
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
    if std::env::args().skip(1).any(|a| a == "telemetry") {
        return telemetry_cost(&rt);
    }
    let (batch, bytes) = busy_node_batch();
    let n = batch.sample_count() as u64;
    let batch = Arc::new(batch);

    let mut g = c.benchmark_group("gateway_host");
    g.throughput(Throughput::Elements(n));
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    g.bench_function("floor_prost_decode_encode", |b| b.iter(|| decode_encode(&bytes)));
    let queue_dir = tempfile::tempdir().unwrap();
    let cases = [
        (Compression::None, None, "plain"),
        (Compression::Gzip, None, "gzip"),
        (Compression::None, Some(queue_dir.path()), "plain_persistent_queue"),
    ];
    let rounds: usize = std::env::var("GATEWAY_RATIO_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(5).max(1);
    for (compression, storage, label) in cases {
        let mut s = rt.block_on(setup(compression, storage, METRICS_DEFAULT));
        let name = format!("otlp_batch_otlp_{label}");
        g.bench_function(&name, |b| b.iter_custom(|iters| rt.block_on(run(&s, &batch, iters))));
        // The ratio, measured plainly in the same run, the floor (1 s) and
        // the gateway (400 requests, 1.6 M samples) in alternating rounds:
        // a VM's speed drifts by a third within a minute, so a ratio of
        // two figures taken apart says more about the drift than the code.
        let (mut ratios, mut floors, mut gws) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let floor = samples_per_second(&bytes, n, Duration::from_secs(1));
            let took = rt.block_on(run(&s, &batch, 400));
            let gw = (400 * n) as f64 / took.as_secs_f64();
            ratios.push(gw / floor);
            floors.push(floor);
            gws.push(gw);
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let per_round = ratios.iter().map(|r| format!("{r:.3}")).collect::<Vec<_>>().join(", ");
        eprintln!(
            "RATIO host gateway({label}) {:.0} samples/s vs floor (prost decode+encode) {:.0} samples/s (medians): \
             gateway = {:.3} × floor (median of {rounds} alternating rounds: {per_round})",
            median(&mut gws),
            median(&mut floors),
            median(&mut ratios),
        );
        rt.block_on(stop(&mut s));
    }
    g.finish();
}

async fn stop(s: &mut Setup) {
    s.service.shutdown().await;
    s.backend.shutdown().await.unwrap();
    s.telemetry.shutdown();
}

/// User + system CPU time of this process so far.
fn process_cpu() -> Duration {
    // SAFETY: a zeroed rusage is valid; getrusage fills it.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1_000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Resident set size of this process, in KiB.
fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64 / 1024
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// Self-telemetry settings side by side, interleaved (see the module doc).
fn telemetry_cost(rt: &tokio::runtime::Runtime) {
    let (batch, _) = busy_node_batch();
    let n = batch.sample_count() as u64;
    let batch = Arc::new(batch);
    let down = profcol_testkit::net::closed_port();
    let settings = [
        ("none (off)", "      address: \"\"\n      level: none\n".to_owned()),
        ("detailed", "      address: \"\"\n      level: detailed\n".to_owned()),
        (
            "normal, OTLP endpoint down",
            format!(
                "      address: \"\"\n      level: normal\n      readers:\n        - periodic:\n            interval: 200ms\n\
                 \x20           exporter:\n              otlp:\n                endpoint: http://127.0.0.1:{down}\n                timeout: 1s\n"
            ),
        ),
    ];
    let rounds: usize = std::env::var("GATEWAY_TELEMETRY_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(7);
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); settings.len()];
    // CPU time per sample of the whole process (clients, gateway, backend):
    // what the settings differ in, and far steadier than wall time on a
    // shared machine.
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); settings.len()];
    for round in 0..rounds {
        // Rotated order, so no setting always runs first (or after the same one).
        for k in 0..settings.len() {
            let i = (k + round) % settings.len();
            let (label, metrics) = &settings[i];
            let mut s = rt.block_on(setup(Compression::None, None, metrics));
            rt.block_on(run(&s, &batch, 50));
            let cpu0 = process_cpu();
            let took = rt.block_on(run(&s, &batch, 400));
            let ns = (process_cpu() - cpu0).as_nanos() as f64 / (400 * n) as f64;
            let rate = (400 * n) as f64 / took.as_secs_f64();
            eprintln!("TELEMETRY round {round} {label}: {rate:.0} samples/s, {ns:.1} CPU ns/sample");
            results[i].push(rate);
            cpu[i].push(ns);
            rt.block_on(stop(&mut s));
        }
    }
    let base = median(&mut results[0].clone());
    for (i, (label, _)) in settings.iter().enumerate() {
        let mut paired: Vec<f64> = results[i].iter().zip(&results[0]).map(|(x, none)| x / none).collect();
        let paired_med = median(&mut paired);
        let v = &mut results[i];
        let med = median(v);
        let (lo, hi) = (v[0], v[v.len() - 1]);
        eprintln!(
            "TELEMETRY {label}: median {med:.0} samples/s, min {lo:.0}, max {hi:.0}, spread (max-min)/median {:.1}%, \
             median vs none {:+.1}%; per-round ratio to none: median {:+.1}%, range {:+.1}% .. {:+.1}%",
            (hi - lo) / med * 100.0,
            (med / base - 1.0) * 100.0,
            (paired_med - 1.0) * 100.0,
            (paired[0] - 1.0) * 100.0,
            (paired[paired.len() - 1] - 1.0) * 100.0
        );
    }
    let base = median(&mut cpu[0].clone());
    for (i, (label, _)) in settings.iter().enumerate() {
        let v = &mut cpu[i];
        let med = median(v);
        let (lo, hi) = (v[0], v[v.len() - 1]);
        eprintln!(
            "TELEMETRY CPU {label}: median {med:.1} ns/sample, min {lo:.1}, max {hi:.1}, \
             spread (max-min)/median {:.1}%, median vs none {:+.1}%",
            (hi - lo) / med * 100.0,
            (med / base - 1.0) * 100.0
        );
    }
    // Memory through a longer outage, beside the same run with telemetry off:
    // RSS after warm-up, halfway, at the end.
    for i in [0, 2] {
        let mut s = rt.block_on(setup(Compression::None, None, &settings[i].1));
        rt.block_on(run(&s, &batch, 200));
        let mut rss = vec![rss_kib()];
        for _ in 0..2 {
            rt.block_on(run(&s, &batch, 2000));
            rss.push(rss_kib());
        }
        eprintln!(
            "TELEMETRY RSS {} (port {down} closed), 4,000 requests: {rss:?} KiB (after warm-up, halfway, end)",
            settings[i].0
        );
        rt.block_on(stop(&mut s));
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! Gateway throughput: OTLP/gRPC in → pipeline → OTLP/gRPC out, all on
//! loopback, in samples per second, beside the floor: a bare prost decode +
//! encode of the same request bytes.
//!
//! Each iteration is one request through the whole chain: a client exporter
//! sends to the gateway's otlp receiver, whose pipeline hands the batch to the
//! gateway's otlp exporter, which sends it to a backend otlp receiver; the
//! gateway answers only after the backend did (the receiver acknowledges
//! once the pipeline took the batch), so the time covers both hops.
//!
//! The chain holds two decodes and two encodes (and the client's encode)
//! against the floor's one of each, so its ratio cannot pass ~0.5×. The
//! last RATIO line therefore also measures the gateway alone: it runs on a
//! runtime of its own, whose threads' CPU time per request (schedstat) is
//! what a host running a gateway pays, set against the floor's time for the
//! same request. The client and the backend run on the bench's runtime.
//!
//! cargo bench -p profcol-exporters --bench gateway

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use profcol_api::component::{ConsumeError, Consumer, Kind, Next};
use profcol_api::{Exporter, Profiles, Receiver};
use profcol_exporters::otlp::{Compression, OtlpGrpcConfig, OtlpGrpcExporter};
use profcol_receivers::otlp::testing::start_receiver;
use profcol_receivers::otlp::testing::{receiver_config, LOOPBACK};
use profcol_receivers::otlp::OtlpReceiver;
use profcol_testkit::floor::{busy_node_batch, decode_encode, samples_per_second};
use profcol_testkit::prelude::*;
use profcol_testkit::sink::next_to;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The gateway's pipeline: hands each batch to its exporter (what the host
/// does with its queue and retry wrapper, minus the queue hop).
struct Forward(Arc<OtlpGrpcExporter>);

#[async_trait::async_trait]
impl Consumer for Forward {
    async fn consume(&self, batch: Profiles) -> Result<(), ConsumeError> {
        self.0.export(&batch).await.map_err(|e| ConsumeError::Refused(e.to_string()))
    }
}

struct Sink;

#[async_trait::async_trait]
impl Consumer for Sink {
    async fn consume(&self, _batch: Profiles) -> Result<(), ConsumeError> {
        Ok(())
    }
}

async fn receiver(next: Next) -> Arc<OtlpReceiver> {
    start_receiver("otlp", receiver_config(Some(LOOPBACK), None), next).await
}

fn exporter(addr: std::net::SocketAddr, compression: Compression) -> OtlpGrpcExporter {
    let cfg = OtlpGrpcConfig { endpoint: Some(format!("http://{addr}")), compression, ..Default::default() };
    OtlpGrpcExporter::new(settings(Kind::Exporter, "otlp"), cfg).unwrap()
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (batch, bytes) = busy_node_batch();
    let n = batch.sample_count() as u64;

    let mut g = c.benchmark_group("gateway");
    g.throughput(Throughput::Elements(n));
    g.sample_size(20).measurement_time(Duration::from_secs(8));
    g.bench_function("floor_prost_decode_encode", |b| b.iter(|| decode_encode(&bytes)));
    for compression in [Compression::None, Compression::Gzip] {
        let (client, backend, gateway) = rt.block_on(async {
            let backend = receiver(next_to(Arc::new(Sink))).await;
            let out = Arc::new(exporter(backend.grpc_addr().unwrap(), compression));
            let gateway = receiver(next_to(Arc::new(Forward(out)))).await;
            let client = exporter(gateway.grpc_addr().unwrap(), compression);
            (client, backend, gateway)
        });
        let name = format!("otlp_in_out_{}", if compression == Compression::Gzip { "gzip" } else { "plain" });
        g.bench_function(&name, |b| b.iter(|| rt.block_on(client.export(&batch)).unwrap()));
        rt.block_on(async {
            gateway.shutdown().await.unwrap();
            backend.shutdown().await.unwrap();
        });
    }
    g.finish();

    // The ratio, measured plainly in the same run.
    let floor = samples_per_second(&bytes, n, Duration::from_secs(3));
    for compression in [Compression::None, Compression::Gzip] {
        let gw = rt.block_on(async {
            let backend = receiver(next_to(Arc::new(Sink))).await;
            let out = Arc::new(exporter(backend.grpc_addr().unwrap(), compression));
            let gateway = receiver(next_to(Arc::new(Forward(out)))).await;
            let client = exporter(gateway.grpc_addr().unwrap(), compression);
            let t = Instant::now();
            let mut k = 0;
            while t.elapsed() < Duration::from_secs(3) {
                client.export(&batch).await.unwrap();
                k += 1;
            }
            let r = (k * n) as f64 / t.elapsed().as_secs_f64();
            gateway.shutdown().await.unwrap();
            backend.shutdown().await.unwrap();
            r
        });
        eprintln!(
            "RATIO gateway({:?}) {:.0} samples/s vs floor (prost decode+encode) {:.0} samples/s: gateway = {:.3} × floor",
            compression,
            gw,
            floor,
            gw / floor
        );
    }

    // The gateway alone: its own runtime, its threads' CPU per request.
    let gw_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(GATEWAY_THREAD)
        .enable_all()
        .build()
        .unwrap();
    let backend = rt.block_on(receiver(next_to(Arc::new(Sink))));
    let backend_addr = backend.grpc_addr().unwrap();
    let gateway = gw_rt.block_on(async {
        let out = Arc::new(exporter(backend_addr, Compression::None));
        receiver(next_to(Arc::new(Forward(out)))).await
    });
    let client = rt.block_on(async { exporter(gateway.grpc_addr().unwrap(), Compression::None) });
    // Connections made and first allocations done before the clock starts.
    for _ in 0..20 {
        rt.block_on(client.export(&batch)).unwrap();
    }
    // The floor's unit of work runs between requests (on this thread, while
    // the gateway's are idle), so both are timed under the same conditions.
    let (cpu0, t) = (threads_cpu_ns(GATEWAY_THREAD), Instant::now());
    let (mut k, mut floor_time) = (0u64, Duration::ZERO);
    while t.elapsed() < Duration::from_secs(4) {
        let f = Instant::now();
        std::hint::black_box(decode_encode(&bytes));
        floor_time += f.elapsed();
        rt.block_on(client.export(&batch)).unwrap();
        k += 1;
    }
    let per_request = (threads_cpu_ns(GATEWAY_THREAD) - cpu0) as f64 / 1e9 / k as f64;
    gw_rt.block_on(gateway.shutdown()).unwrap();
    rt.block_on(backend.shutdown()).unwrap();
    let floor_per_request = floor_time.as_secs_f64() / k as f64;
    eprintln!(
        "RATIO gateway alone (None): {:.0} µs of its CPU per request ({:.0} samples per CPU-second) vs floor {:.0} µs: \
         gateway = {:.3} × floor",
        per_request * 1e6,
        n as f64 / per_request,
        floor_per_request * 1e6,
        floor_per_request / per_request
    );
}

/// The gateway runtime's thread name, by which its CPU is found.
const GATEWAY_THREAD: &str = "bench-gateway";

/// CPU time of this process's threads called `name`, in nanoseconds (the
/// first field of each one's schedstat).
fn threads_cpu_ns(name: &str) -> u64 {
    let mut ns = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        // comm is cut to 15 bytes.
        if comm.trim_end() == &name[..name.len().min(15)] {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
            ns += stat.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    ns
}

criterion_group!(benches, bench);
criterion_main!(benches);

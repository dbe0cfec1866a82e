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
//! cargo bench -p profcol-exporters --bench gateway

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use profcol_api::component::{ConsumeError, Consumer, Kind, Next};
use profcol_api::{Exporter, Profiles, Receiver};
use profcol_exporters::otlp::{Compression, OtlpGrpcConfig, OtlpGrpcExporter};
use profcol_receivers::otlp::OtlpReceiver;
use profcol_testkit::floor::{busy_node_batch, decode_encode, samples_per_second};
use profcol_testkit::otlp::start_receiver;
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
}

criterion_group!(benches, bench);
criterion_main!(benches);

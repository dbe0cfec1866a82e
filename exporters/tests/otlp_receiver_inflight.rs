//! The otlp receiver's `max_concurrent_requests`: gRPC and HTTP share the
//! slots; a request that finds none free is answered UNAVAILABLE / 503
//! promptly (before its body is read), counted, and the senders' own clients
//! see it as retryable; the requests that hold slots finish once the pipeline
//! moves, and nothing accepted is lost.

use profcol_api::component::{ComponentId, ConsumeError, Consumer, CreateSettings, ExportError, Kind, Next};
use profcol_api::telemetry::{ComponentTelemetry, Telemetry};
use profcol_api::{Exporter, Profiles, Receiver};
use profcol_exporters::otlp::{
    Compression, HttpEncoding, OtlpGrpcConfig, OtlpGrpcExporter, OtlpHttpConfig, OtlpHttpExporter,
};
use profcol_receivers::otlp::testing::{receiver_config, LOOPBACK};
use profcol_receivers::otlp::{OtlpReceiver, OtlpReceiverConfig};
use profcol_testkit::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use profcol_receivers::otlp::testing::with_max_mib;
use profcol_testkit::raw::{grpc_send, http_send};

/// The test [`Collector`] (with its `stall` flag), counting the batches that
/// reached the pipeline, so a test knows when requests hold their slots.
struct Counting {
    inner: Arc<Collector>,
    entered: AtomicUsize,
}

#[async_trait::async_trait]
impl Consumer for Counting {
    async fn consume(&self, batch: Profiles) -> Result<(), ConsumeError> {
        self.entered.fetch_add(1, Ordering::SeqCst);
        self.inner.consume(batch).await
    }
}

impl Counting {
    async fn wait_entered(&self, n: usize) {
        let t = Instant::now();
        while self.entered.load(Ordering::SeqCst) < n {
            assert!(t.elapsed() < Duration::from_secs(10), "only {} requests reached the pipeline", self.entered(),);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    fn entered(&self) -> usize {
        self.entered.load(Ordering::SeqCst)
    }
}

struct Setup {
    r: Arc<OtlpReceiver>,
    c: Arc<Collector>,
    pipe: Arc<Counting>,
    /// The receiver's telemetry (a registry of its own).
    tel: ComponentTelemetry,
    registry: Telemetry,
}

impl Setup {
    fn grpc(&self) -> std::net::SocketAddr {
        self.r.grpc_addr().unwrap()
    }
    fn http(&self) -> std::net::SocketAddr {
        self.r.http_addr().unwrap()
    }
    fn inflight_refusals(&self) -> u64 {
        self.tel.counter_value("inflight_refusals_total")
    }
    fn backpressure_refusals(&self) -> u64 {
        self.tel.counter_value("backpressure_refusals_total")
    }
}

async fn start(max_concurrent_requests: usize, backpressure: Duration, max_mib: f64) -> Setup {
    let cfg = OtlpReceiverConfig {
        backpressure_timeout: backpressure,
        max_concurrent_requests,
        ..with_max_mib(receiver_config(Some(LOOPBACK), Some(LOOPBACK)), max_mib)
    };
    let registry = Telemetry::new();
    let id: ComponentId = "otlp".parse().unwrap();
    let tel = registry.component(Kind::Receiver, &id);
    let r = Arc::new(
        OtlpReceiver::new(CreateSettings { telemetry: tel.clone(), id: id.clone(), services: Default::default() }, cfg)
            .unwrap(),
    );
    let c = Arc::new(Collector::default());
    let pipe = Arc::new(Counting { inner: c.clone(), entered: AtomicUsize::new(0) });
    r.start(Next::new(vec![pipe.clone() as Arc<dyn Consumer>], ComponentTelemetry::detached(Kind::Receiver, &id)))
        .await
        .unwrap();
    Setup { r, c, pipe, tel, registry }
}

fn grpc_exporter(addr: std::net::SocketAddr) -> OtlpGrpcExporter {
    let cfg = OtlpGrpcConfig {
        endpoint: Some(format!("http://{addr}")),
        compression: Compression::Gzip,
        ..Default::default()
    };
    OtlpGrpcExporter::new(settings(Kind::Exporter, "otlp/agent"), cfg).unwrap()
}

fn http_exporter(addr: std::net::SocketAddr) -> OtlpHttpExporter {
    let cfg = OtlpHttpConfig {
        endpoint: Some(format!("http://{addr}").into()),
        encoding: HttpEncoding::Proto,
        compression: Compression::None,
        ..Default::default()
    };
    OtlpHttpExporter::new(settings(Kind::Exporter, "otlp_http/agent"), cfg).unwrap()
}

const IN_FLIGHT: &str = "this gateway has 2 requests in flight";

/// The refusal must come after the slot wait (min(backpressure_timeout, 1 s)
/// = 1 s here), not after backpressure_timeout (30 s) or never.
fn assert_prompt(t: Instant) {
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(900) && waited < Duration::from_secs(5), "answered after {waited:?}");
}

#[tokio::test]
async fn over_the_limit_is_unavailable_and_503_promptly_and_nothing_accepted_is_lost() {
    let s = start(2, Duration::from_secs(30), 32.0).await;
    s.c.stall.store(true, Ordering::SeqCst);

    // Two senders, one per protocol, take both slots and hang on the stalled pipeline.
    let (a, b) = (cpu_batch(10, 2, 20), cpu_batch(11, 3, 15));
    let (na, nb) = (a.sample_count(), b.sample_count());
    let ga = grpc_exporter(s.grpc());
    let hb = http_exporter(s.http());
    let hang_grpc = tokio::spawn(async move { ga.export(&a).await });
    let hang_http = tokio::spawn(async move { hb.export(&b).await });
    s.pipe.wait_entered(2).await;

    // A third request over gRPC: UNAVAILABLE with the message, after the short wait.
    let t = Instant::now();
    let e = grpc_send(s.grpc(), cpu_batch(12, 1, 5).encode_to_vec(), false).await.unwrap_err();
    assert_prompt(t);
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains(IN_FLIGHT) && e.message().contains("retry later"), "{}", e.message());

    // And over HTTP: 503, Retry-After, a google.rpc.Status in the request's encoding.
    let t = Instant::now();
    let (code, ra, text) =
        http_send(s.http(), cpu_batch(13, 1, 5).to_json().into_bytes(), "application/json", false).await;
    assert_prompt(t);
    assert_eq!(code, 503, "{text}");
    assert_eq!(ra.as_deref(), Some("1"));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["code"], 14, "{text}");
    assert!(v["message"].as_str().unwrap().contains(IN_FLIGHT), "{text}");

    // The project's own clients see a retryable error (agents retry on it).
    for e in [
        grpc_exporter(s.grpc()).export(&cpu_batch(14, 1, 5)).await.unwrap_err(),
        http_exporter(s.http()).export(&cpu_batch(15, 1, 5)).await.unwrap_err(),
    ] {
        match &e {
            ExportError::Retryable { message, .. } => assert!(message.contains(IN_FLIGHT), "{message}"),
            other => panic!("expected a retryable error, got {other:?}"),
        }
    }

    // The refused requests never reached the pipeline, the two are still waiting on it.
    assert_eq!(s.pipe.entered(), 2);
    assert!(!hang_grpc.is_finished() && !hang_http.is_finished());
    assert_eq!(s.inflight_refusals(), 4);
    assert_eq!(s.backpressure_refusals(), 4, "in-flight refusals are retry-later answers too");
    let metrics = s.registry.render();
    assert!(metrics.contains("profcol_receiver_inflight_refusals_total{receiver=\"otlp\"} 4"), "{metrics}");

    // Un-stall: the two complete, and new requests over both protocols are taken.
    s.c.stall.store(false, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(10), hang_grpc).await.unwrap().unwrap().unwrap();
    tokio::time::timeout(Duration::from_secs(10), hang_http).await.unwrap().unwrap().unwrap();
    let (c, d) = (cpu_batch(16, 2, 10), cpu_batch(17, 1, 10));
    let (nc, nd) = (c.sample_count(), d.sample_count());
    grpc_send(s.grpc(), c.encode_to_vec(), false).await.unwrap();
    let (code, _, text) = http_send(s.http(), d.encode_to_vec(), "application/x-protobuf", false).await;
    assert_eq!(code, 200, "{text}");

    // Exactly the accepted batches arrived, whole.
    assert_eq!(s.c.batches.lock().unwrap().len(), 4);
    assert_eq!(s.c.sample_count(), na + nb + nc + nd);
    assert_eq!(s.inflight_refusals(), 4);
    s.r.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_request_without_a_slot_is_refused_before_it_is_decoded() {
    // A 0.5 MiB cap. A body is read into the read budget without a slot, so
    // an oversized one meets the size cap as it arrives (whatever the slots);
    // a slot is taken only to decode: garbage is refused as retry-later, not
    // decoded into INVALID_ARGUMENT / 400.
    let s = start(2, Duration::from_secs(30), 0.5).await;
    s.c.stall.store(true, Ordering::SeqCst);
    let (a, b) = (cpu_batch(20, 1, 10), cpu_batch(21, 1, 10));
    let n = a.sample_count() + b.sample_count();
    let (g, h) = (s.grpc(), s.http());
    let hang_a = tokio::spawn(async move { grpc_send(g, a.encode_to_vec(), false).await });
    let hang_b = tokio::spawn(async move { http_send(h, b.encode_to_vec(), "application/x-protobuf", false).await });
    s.pipe.wait_entered(2).await;

    let e = grpc_send(g, vec![0u8; 1 << 20], false).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "an oversized body met no size cap: {e:?}");
    let e = grpc_send(g, b"\xff\xff\xff\xff\x0fnot protobuf".to_vec(), false).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "garbage was decoded: {e:?}");
    let (code, _, text) =
        http_send(h, b"\xff\xff\xff\xff\x0fnot protobuf".to_vec(), "application/x-protobuf", false).await;
    assert_eq!(code, 503, "garbage was decoded: {text}");
    // Still answered in the request's encoding: the protobuf Status carries the message.
    assert!(text.contains(IN_FLIGHT), "{text}");

    s.c.stall.store(false, Ordering::SeqCst);
    hang_a.await.unwrap().unwrap();
    assert_eq!(hang_b.await.unwrap().0, 200);
    assert_eq!(s.c.sample_count(), n);
    // With slots free, the same bodies get their usual answers.
    let e = grpc_send(g, vec![0u8; 1 << 20], false).await.unwrap_err();
    assert!(matches!(e.code(), tonic::Code::OutOfRange | tonic::Code::ResourceExhausted), "{e:?}");
    let (code, _, _) =
        http_send(h, b"\xff\xff\xff\xff\x0fnot protobuf".to_vec(), "application/x-protobuf", false).await;
    assert_eq!(code, 400);
    assert_eq!(s.inflight_refusals(), 2);
    s.r.shutdown().await.unwrap();
}

#[tokio::test]
async fn slots_are_given_back_on_every_outcome() {
    // One slot, a pipeline that pushes back after 200 ms.
    let s = start(1, Duration::from_millis(200), 32.0).await;
    let (g, h) = (s.grpc(), s.http());
    // Refusals as malformed give the slot back.
    for _ in 0..3 {
        let e = grpc_send(g, b"\xff\xff\xff\xff\x0fnot protobuf".to_vec(), false).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        let (code, _, _) = http_send(h, b"{not json".to_vec(), "application/json", false).await;
        assert_eq!(code, 400);
    }
    // A pipeline refusal (backpressure timeout) gives it back: the next
    // request is refused by the pipeline again, not for want of a slot.
    s.c.stall.store(true, Ordering::SeqCst);
    for _ in 0..2 {
        let e = grpc_send(g, cpu_batch(30, 1, 5).encode_to_vec(), false).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
        assert!(e.message().contains("did not take the batch"), "{}", e.message());
        let (code, _, text) = http_send(h, cpu_batch(31, 1, 5).to_json().into_bytes(), "application/json", false).await;
        assert_eq!(code, 503);
        assert!(text.contains("did not take the batch"), "{text}");
    }
    assert_eq!(s.inflight_refusals(), 0);
    assert_eq!(s.backpressure_refusals(), 4);
    s.c.stall.store(false, Ordering::SeqCst);
    let batch = cpu_batch(32, 2, 10);
    grpc_send(g, batch.encode_to_vec(), false).await.unwrap();
    assert_eq!(s.c.sample_count(), batch.sample_count());
    s.r.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_burst_above_the_limit_waits_for_slots_when_the_pipeline_is_healthy() {
    // 32 senders at once against 2 slots: each request holds its slot for
    // milliseconds, so the waiting ones get one within the slot wait.
    let s = start(2, Duration::from_secs(5), 32.0).await;
    let (g, h) = (s.grpc(), s.http());
    let mut tasks = Vec::new();
    let mut want = 0;
    for k in 0..32u64 {
        let batch = cpu_batch(100 + k, 2, 20);
        want += batch.sample_count();
        if k % 2 == 0 {
            tasks.push(tokio::spawn(async move {
                grpc_send(g, batch.encode_to_vec(), false).await.map_err(|e| e.to_string())
            }));
        } else {
            tasks.push(tokio::spawn(async move {
                match http_send(h, batch.encode_to_vec(), "application/x-protobuf", false).await {
                    (200, _, _) => Ok(()),
                    (code, _, text) => Err(format!("{code} {text}")),
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(s.c.sample_count(), want);
    assert_eq!(s.inflight_refusals(), 0);
    s.r.shutdown().await.unwrap();
}

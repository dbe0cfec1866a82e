//! Slow and stalled senders cannot starve the otlp receiver: connections
//! that send headers and then nothing hold no slot; bodies that stall hold
//! one for at most `read_timeout` and are answered DEADLINE_EXCEEDED / 408;
//! meanwhile valid senders get through (within `read_timeout` + 1 s).

use profcol_api::component::Kind;
use profcol_api::Receiver;
use profcol_receivers::otlp::{GrpcConfig, HttpConfig, OtlpReceiver, OtlpReceiverConfig, Protocols};
use profcol_testkit::hostile::{grpc_message_start, StalledGrpc, StalledHttp};
use profcol_testkit::prelude::*;
use profcol_testkit::raw::{grpc_send, http_send};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SLOTS: usize = 16;
const READ_TIMEOUT: Duration = Duration::from_secs(2);

struct Gateway {
    r: Arc<OtlpReceiver>,
    c: Arc<Collector>,
    s: profcol_api::component::CreateSettings,
}

impl Gateway {
    async fn start() -> Gateway {
        let cfg = OtlpReceiverConfig {
            protocols: Protocols {
                grpc: Some(GrpcConfig { endpoint: "127.0.0.1:0".into(), ..Default::default() }),
                http: Some(HttpConfig { endpoint: "127.0.0.1:0".into(), ..Default::default() }),
            },
            max_concurrent_requests: SLOTS,
            read_timeout: READ_TIMEOUT,
            ..Default::default()
        };
        let s = settings(Kind::Receiver, "otlp");
        let r = Arc::new(OtlpReceiver::new(s.clone(), cfg).unwrap());
        let c = Arc::new(Collector::default());
        r.start(c.next()).await.unwrap();
        Gateway { r, c, s }
    }
    fn grpc(&self) -> std::net::SocketAddr {
        self.r.grpc_addr().unwrap()
    }
    fn http(&self) -> std::net::SocketAddr {
        self.r.http_addr().unwrap()
    }
    fn read_timeouts(&self) -> u64 {
        self.s.telemetry.counter_value("read_timeouts_total")
    }
}

/// A valid request on each protocol, each timed from its first attempt;
/// a sender told UNAVAILABLE retries after 100 ms, as OTLP senders retry.
async fn valid_requests(g: &Gateway) -> (Duration, Duration) {
    let batch = cpu_batch(1, 2, 20);
    let (grpc, http) = (g.grpc(), g.http());
    let b = batch.encode_to_vec();
    let via_grpc = tokio::spawn(async move {
        let t = Instant::now();
        loop {
            match grpc_send(grpc, b.clone(), false).await {
                Ok(()) => return t.elapsed(),
                Err(e) if e.code() == tonic::Code::Unavailable => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => panic!("{e:?}"),
            }
        }
    });
    let b = batch.encode_to_vec();
    let via_http = tokio::spawn(async move {
        let t = Instant::now();
        loop {
            match http_send(http, b.clone(), "application/x-protobuf", false).await {
                (200, _, _) => return t.elapsed(),
                (503, _, _) => tokio::time::sleep(Duration::from_millis(100)).await,
                (code, _, text) => panic!("{code}: {text}"),
            }
        }
    });
    (via_grpc.await.unwrap(), via_http.await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_send_only_headers_hold_no_slot() {
    let g = Gateway::start().await;
    let mut grpc_stalls = Vec::new();
    let mut http_stalls = Vec::new();
    for _ in 0..SLOTS {
        grpc_stalls.push(StalledGrpc::open(g.grpc(), None).await.unwrap());
        http_stalls.push(StalledHttp::open(g.http(), 1000, 0).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (grpc, http) = valid_requests(&g).await;
    eprintln!("with {SLOTS} + {SLOTS} header-only stalls: gRPC in {grpc:?}, HTTP in {http:?}");
    // No slot was ever taken by the stalls: no wait, no retry.
    assert!(grpc < Duration::from_secs(1) && http < Duration::from_secs(1), "{grpc:?} {http:?}");
    assert_eq!(g.c.sample_count(), 2 * cpu_batch(1, 2, 20).sample_count());
    // Each stall is answered at its read_timeout.
    let t = Instant::now();
    for s in grpc_stalls {
        let (code, msg) = tokio::time::timeout(READ_TIMEOUT * 3, s.status()).await.unwrap().expect("an answer");
        assert_eq!(code, tonic::Code::DeadlineExceeded as i32, "{msg}");
    }
    for s in http_stalls {
        let (code, body) = tokio::time::timeout(READ_TIMEOUT * 3, s.answer()).await.unwrap().expect("an answer");
        assert_eq!(code, 408, "{body}");
        assert!(body.contains("read_timeout"), "{body}");
    }
    assert!(t.elapsed() < READ_TIMEOUT + Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(g.read_timeouts(), 2 * SLOTS as u64);
    g.r.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_bodies_lose_their_slots_at_read_timeout() {
    let g = Gateway::start().await;
    // Every slot taken by a body that started and stalled, half on each protocol.
    let mut grpc_stalls = Vec::new();
    let mut http_stalls = Vec::new();
    for _ in 0..SLOTS / 2 {
        grpc_stalls.push(StalledGrpc::open(g.grpc(), Some(grpc_message_start(1000, 10))).await.unwrap());
        http_stalls.push(StalledHttp::open(g.http(), 1000, 10).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (grpc, http) = valid_requests(&g).await;
    eprintln!("with {SLOTS} stalled bodies: gRPC in {grpc:?}, HTTP in {http:?}");
    let bound = READ_TIMEOUT + Duration::from_secs(1);
    assert!(grpc < bound && http < bound, "gRPC {grpc:?}, HTTP {http:?}: over read_timeout + 1 s");
    for s in grpc_stalls {
        let (code, msg) = tokio::time::timeout(READ_TIMEOUT * 3, s.status()).await.unwrap().expect("an answer");
        assert_eq!(code, tonic::Code::DeadlineExceeded as i32, "{msg}");
        assert!(msg.contains("read_timeout"), "{msg}");
    }
    for s in http_stalls {
        let (code, body) = tokio::time::timeout(READ_TIMEOUT * 3, s.answer()).await.unwrap().expect("an answer");
        assert_eq!(code, 408, "{body}");
    }
    assert_eq!(g.read_timeouts(), SLOTS as u64);
    assert_eq!(g.c.sample_count(), 2 * cpu_batch(1, 2, 20).sample_count());
    g.r.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_oversized_http_body_gets_413_naming_the_limit() {
    let cfg = OtlpReceiverConfig {
        protocols: Protocols {
            grpc: None,
            http: Some(HttpConfig { endpoint: "127.0.0.1:0".into(), max_recv_msg_size_mib: 1.0, ..Default::default() }),
        },
        ..Default::default()
    };
    let r = OtlpReceiver::new(settings(Kind::Receiver, "otlp"), cfg).unwrap();
    r.start(Arc::new(Collector::default()).next()).await.unwrap();
    // 40 MiB against a 1 MiB cap: the sender reads the answer, not a reset.
    let (code, _, text) = http_send(r.http_addr().unwrap(), vec![0u8; 40 << 20], "application/x-protobuf", false).await;
    assert_eq!(code, 413, "{text}");
    assert!(text.contains("max_recv_msg_size_mib") && text.contains("1048576 bytes"), "{text}");
    r.shutdown().await.unwrap();
}

//! The otlp receiver's decode budget (`max_decoded_size_mib`): requests over
//! it are refused unread with RESOURCE_EXHAUSTED / 413 naming the limit, and
//! counted; real batches still pass. (The estimate against the decode's
//! measured peak: otlp_receiver_budget_estimate.rs.)

use profcol_api::component::Kind;
use profcol_api::Receiver;
use profcol_receivers::otlp::{GrpcConfig, HttpConfig, OtlpReceiver, OtlpReceiverConfig, Protocols};
use profcol_testkit::hostile::{expansion_request, json_expansion_request};
use profcol_testkit::prelude::*;
use profcol_testkit::raw::{grpc_send, http_send};
use std::sync::Arc;

async fn start(
    max_decoded_size_mib: f64,
) -> (Arc<OtlpReceiver>, Arc<Collector>, profcol_api::component::CreateSettings) {
    let cfg = OtlpReceiverConfig {
        protocols: Protocols {
            grpc: Some(GrpcConfig { endpoint: "127.0.0.1:0".into(), ..Default::default() }),
            http: Some(HttpConfig { endpoint: "127.0.0.1:0".into(), ..Default::default() }),
        },
        max_decoded_size_mib,
        ..Default::default()
    };
    let s = settings(Kind::Receiver, "otlp");
    let r = Arc::new(OtlpReceiver::new(s.clone(), cfg).unwrap());
    let c = Arc::new(Collector::default());
    r.start(c.next()).await.unwrap();
    (r, c, s)
}

#[tokio::test]
async fn expansion_requests_are_refused_with_resource_exhausted_and_413() {
    let (r, c, s) = start(64.0).await;
    let (g, h) = (r.grpc_addr().unwrap(), r.http_addr().unwrap());
    let refused = || s.telemetry.counter_value("decode_budget_refusals_total");
    for size in [3_000_000, 30 << 20] {
        let body = expansion_request(size);
        let e = grpc_send(g, body.clone(), false).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("max_decoded_size_mib (64 MiB)"), "{}", e.message());
        // Without RetryInfo: the request can never fit.
        assert!(e.details().is_empty(), "{:?}", e.details());
        let (code, retry_after, text) = http_send(h, body, "application/x-protobuf", false).await;
        assert_eq!(code, 413, "{text}");
        assert!(retry_after.is_none());
        assert!(text.contains("max_decoded_size_mib (64 MiB)"), "{text}");
    }
    let (code, _, text) = http_send(h, json_expansion_request(3_000_000), "application/json", false).await;
    assert_eq!(code, 413, "{text}");
    assert_eq!(refused(), 5);
    assert_eq!(c.sample_count(), 0);
    // A real batch of the same order of size still passes.
    let real = random_batch(9, 10, 50_000, 5_000, 24);
    grpc_send(g, real.encode_to_vec(), true).await.unwrap();
    let (code, _, text) = http_send(h, real.encode_to_vec(), "application/x-protobuf", false).await;
    assert_eq!(code, 200, "{text}");
    assert_eq!(c.sample_count(), 2 * real.sample_count());
    assert_eq!(refused(), 5);
    r.shutdown().await.unwrap();
}

#[test]
fn max_decoded_size_mib_must_be_positive() {
    for bad in [0.0, -2.0, f64::NAN] {
        let mut cfg = OtlpReceiverConfig { max_decoded_size_mib: bad, ..Default::default() };
        cfg.protocols.grpc = Some(GrpcConfig::default());
        let e = OtlpReceiver::new(settings(Kind::Receiver, "otlp"), cfg).err().expect("refused").to_string();
        assert!(e.contains("max_decoded_size_mib"), "{e}");
    }
    assert_eq!(OtlpReceiverConfig::default().max_decoded_size_mib, 128.0);
}

//! The otlp receiver drops the invalid profiles of a request it otherwise
//! accepts and says so with `partial_success`; profcol's own otlp exporters
//! read that answer as a partial failure (not retried) over gRPC and HTTP
//! (protobuf and JSON).

use profcol_api::component::Kind;
use profcol_api::model::canonical;
use profcol_api::{ExportError, Exporter, Profiles, Receiver};
use profcol_exporters::otlp::{HttpEncoding, OtlpGrpcConfig, OtlpGrpcExporter, OtlpHttpConfig, OtlpHttpExporter};
use profcol_receivers::otlp::testing::{receiver_config, LOOPBACK};
use profcol_receivers::otlp::OtlpReceiver;
use profcol_testkit::prelude::*;
use std::sync::Arc;
use std::time::Duration;

/// Two processes (two profiles) of which the first has a sample pointing past
/// the stack table; returns (the request, the valid part).
fn half_broken(seed: u64) -> (Profiles, Profiles) {
    let good = cpu_batch(seed, 2, 30);
    let mut bad = good.clone();
    let first = bad.0.resource_profiles[0].scope_profiles[0].profiles.get_mut(0).unwrap();
    first.samples[3].stack_index = 100_000;
    let mut valid = good.clone();
    valid.0.resource_profiles[0].scope_profiles[0].profiles.remove(0);
    (bad, valid)
}

#[tokio::test]
async fn invalid_profiles_are_dropped_and_answered_with_partial_success() {
    let rs = settings(Kind::Receiver, "otlp/in");
    let r = Arc::new(OtlpReceiver::new(rs.clone(), receiver_config(Some(LOOPBACK), Some(LOOPBACK))).unwrap());
    let c = Arc::new(Collector::default());
    r.start(c.next()).await.unwrap();
    let grpc = OtlpGrpcConfig { endpoint: Some(format!("http://{}", r.grpc_addr().unwrap())), ..Default::default() };
    let http = |encoding| OtlpHttpConfig {
        endpoint: Some(format!("http://{}", r.http_addr().unwrap()).into()),
        encoding,
        ..Default::default()
    };
    let exporters: Vec<(&str, Box<dyn Exporter>)> = vec![
        ("grpc", Box::new(OtlpGrpcExporter::new(settings(Kind::Exporter, "otlp"), grpc).unwrap())),
        (
            "http",
            Box::new(OtlpHttpExporter::new(settings(Kind::Exporter, "otlp_http"), http(HttpEncoding::Proto)).unwrap()),
        ),
        (
            "json",
            Box::new(
                OtlpHttpExporter::new(settings(Kind::Exporter, "otlp_http/json"), http(HttpEncoding::Json)).unwrap(),
            ),
        ),
    ];
    let mut want = Vec::new();
    let mut refused = 0u64;
    for (k, (name, e)) in exporters.iter().enumerate() {
        let (request, valid) = half_broken(k as u64 + 1);
        let n_bad = (request.sample_count() - valid.sample_count()) as u64;
        match e.export(&request).await {
            Err(ExportError::Partial { rejected_samples, message }) => {
                // Two profiles, one rejected: half of the samples, rounded up.
                assert_eq!(rejected_samples, (request.sample_count() as u64).div_ceil(2), "{name}");
                assert!(
                    message.contains("1 invalid profile dropped") && message.contains("stack_index"),
                    "{name}: {message}"
                );
            }
            other => panic!("{name}: expected a partial success, got {other:?}"),
        }
        refused += n_bad;
        want.push(valid);
    }
    let total: usize = want.iter().map(Profiles::sample_count).sum();
    c.wait_for(total, Duration::from_secs(10)).await;
    assert!(canonical::samples(&c.merged()) == canonical::samples(&merge(&want)), "only the valid profiles arrived");
    assert_eq!(rs.telemetry.refused.get(), refused);
    assert_eq!(rs.telemetry.counter_value("partial_requests_total"), 3);
    // A request with nothing valid is refused whole, as before.
    let (mut all_bad, _) = half_broken(9);
    all_bad.0.resource_profiles.truncate(1);
    match exporters[0].1.export(&all_bad).await {
        Err(ExportError::Permanent { message }) => assert!(message.contains("InvalidArgument"), "{message}"),
        other => panic!("{other:?}"),
    }
    r.shutdown().await.unwrap();
}

//! exporter → second collector's otlp receiver, over gRPC and HTTP (protobuf
//! and JSON), gzip on and off: the sample multisets are equal.

use profcol_api::component::Kind;
use profcol_api::model::canonical;
use profcol_api::{Exporter, Receiver};
use profcol_exporters::otlp::{
    Compression, HttpEncoding, OtlpGrpcConfig, OtlpGrpcExporter, OtlpHttpConfig, OtlpHttpExporter,
};
use profcol_receivers::otlp::testing::{collecting_receiver, receiver_config, LOOPBACK};
use profcol_receivers::otlp::OtlpReceiver;
use profcol_testkit::prelude::*;
use std::sync::Arc;
use std::time::Duration;

async fn start_receiver() -> (Arc<OtlpReceiver>, Arc<Collector>) {
    collecting_receiver("otlp/in", receiver_config(Some(LOOPBACK), Some(LOOPBACK))).await
}

async fn roundtrip(exporter: &dyn Exporter, collector: &Collector) {
    let batches: Vec<_> = (0..5).map(|k| cpu_batch(k, 3, 40)).collect();
    let total: usize = batches.iter().map(|b| b.sample_count()).sum();
    for b in &batches {
        exporter.export(b).await.unwrap();
    }
    collector.wait_for(total, Duration::from_secs(10)).await;
    let got = canonical::samples(&collector.merged());
    let want = canonical::samples(&merge(&batches));
    assert_eq!(got.len(), want.len());
    assert!(got == want, "sample multisets differ");
    // Frames survived with their kernel marking.
    assert!(got.iter().any(|s| s.frames.iter().any(|f| f.0 == "[kernel.kallsyms]")));
}

#[tokio::test]
async fn grpc_roundtrip_gzip_and_plain() {
    for compression in [Compression::Gzip, Compression::None] {
        let (r, c) = start_receiver().await;
        let mut cfg = OtlpGrpcConfig {
            endpoint: Some(format!("http://{}", r.grpc_addr().unwrap())),
            compression,
            ..Default::default()
        };
        cfg.headers.insert("authorization".into(), "Bearer t0ken".into());
        let e = OtlpGrpcExporter::new(settings(Kind::Exporter, "otlp/out"), cfg).unwrap();
        roundtrip(&e, &c).await;
        r.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn http_roundtrip_proto_json_gzip_and_plain() {
    for encoding in [HttpEncoding::Proto, HttpEncoding::Json] {
        for compression in [Compression::Gzip, Compression::None] {
            let (r, c) = start_receiver().await;
            let cfg = OtlpHttpConfig {
                endpoint: Some(format!("http://{}", r.http_addr().unwrap()).into()),
                encoding,
                compression,
                ..Default::default()
            };
            let e = OtlpHttpExporter::new(settings(Kind::Exporter, "otlp_http/out"), cfg).unwrap();
            roundtrip(&e, &c).await;
            r.shutdown().await.unwrap();
        }
    }
}

#[tokio::test]
async fn factories_build_from_yaml() {
    let f = profcol_receivers::otlp::factory_otlp();
    let yaml = |t: &str| profcol_config::parse_section(t).unwrap();
    let raw = yaml("protocols:\n  grpc:\n    endpoint: 127.0.0.1:0\n  http:\n");
    let eff = f.check(&raw).unwrap();
    let text = serde_json::to_string(&eff).unwrap();
    assert!(text.contains("localhost:4318") && text.contains("max_recv_msg_size_mib"), "{text}");
    let bad = yaml("protocols: {grpc: {endpiont: x}}");
    assert!(f.check(&bad).unwrap_err()[0].to_string().contains("endpiont"));
    for ty in ["otlp", "otlp_grpc", "otlp_http"] {
        let f = profcol_exporters::factories().into_iter().find(|f| f.meta().type_name == ty).unwrap();
        let raw = yaml("endpoint: http://127.0.0.1:1\ncompression: none");
        f.create(settings(Kind::Exporter, ty), &raw).unwrap();
    }
}

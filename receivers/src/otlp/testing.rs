//! An otlp receiver on loopback, as other crates' tests and benches start
//! one: a backend that collects what arrives, or a gateway's front door
//! (feature `test-support`; nothing here ships).

use super::{GrpcConfig, HttpConfig, OtlpReceiver, OtlpReceiverConfig, Protocols};
use profcol_api::component::Kind;
use profcol_api::component::Next;
use profcol_api::Receiver;
use profcol_testkit::settings;
use profcol_testkit::sink::Collector;
use std::sync::Arc;

/// Loopback with a port the kernel picks (the receiver logs and reports it).
pub const LOOPBACK: &str = "127.0.0.1:0";

/// A receiver config with gRPC and/or HTTP on the given endpoints, the rest default.
pub fn receiver_config(grpc: Option<&str>, http: Option<&str>) -> OtlpReceiverConfig {
    OtlpReceiverConfig {
        protocols: Protocols {
            grpc: grpc.map(|e| GrpcConfig { endpoint: e.into(), ..Default::default() }),
            http: http.map(|e| HttpConfig { endpoint: e.into(), ..Default::default() }),
        },
        ..Default::default()
    }
}

/// Sets both protocols' size limit (MiB, fractions allowed).
pub fn with_max_mib(mut cfg: OtlpReceiverConfig, mib: f64) -> OtlpReceiverConfig {
    if let Some(g) = &mut cfg.protocols.grpc {
        g.max_recv_msg_size_mib = mib;
    }
    if let Some(h) = &mut cfg.protocols.http {
        h.max_recv_msg_size_mib = mib;
    }
    cfg
}

/// Starts `cfg` as component `id`, handing what arrives to `next`.
pub async fn start_receiver(id: &str, cfg: OtlpReceiverConfig, next: Next) -> Arc<OtlpReceiver> {
    let r = Arc::new(OtlpReceiver::new(settings(Kind::Receiver, id), cfg).expect("a valid receiver config"));
    r.start(next).await.expect("the receiver starts");
    r
}

/// Starts `cfg` as component `id`, collecting every batch that arrives.
pub async fn collecting_receiver(id: &str, cfg: OtlpReceiverConfig) -> (Arc<OtlpReceiver>, Arc<Collector>) {
    let c = Arc::new(Collector::default());
    (start_receiver(id, cfg, c.next()).await, c)
}

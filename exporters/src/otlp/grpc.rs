//! `otlp` (alias `otlp_grpc`): OTLP profiles over gRPC with tonic.

use super::balancer::{BalancerConfig, Resolver, Route, Target};
use super::exporter::{OtlpExporter, Transport};
use super::{check_headers, error_chain, status, ClientTlsConfig, Compression, OtlpCounters, Shape};
use bytes::{BufMut, Bytes};
use profcol_api::component::{
    factory_with_metrics, Component, ComponentError, CreateSettings, Factory, FactoryMeta, Kind,
};
use profcol_api::model::ExportProfilesServiceResponse;
use profcol_api::telemetry::ComponentTelemetry;
use profcol_api::{ExportError, Profiles, Stability};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::Status;

const EXPORT_PATH: &str = "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";

/// `exporters: otlp: ...` (the host's `timeout`, `retry_on_failure` and
/// `sending_queue` keys sit beside these).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpGrpcConfig {
    /// `host:port`, `http://host:port` (plain text) or `https://host:port`
    /// (default `localhost:4317`); not with `balancer`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Spreads batches over several gateways instead of one `endpoint`:
    /// see "Balancing over gateways" in docs/CONFIG.md.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balancer: Option<BalancerConfig>,
    /// Sent with every request, e.g. `authorization: "Bearer ${env:TOKEN}"`.
    pub headers: BTreeMap<String, profcol_api::config::Secret>,
    /// Request compression: `gzip` or `none`.
    pub compression: Compression,
    /// Client TLS (the endpoint's scheme, or `tls.insecure`, decides whether TLS is used).
    pub tls: ClientTlsConfig,
    /// Largest answer accepted from the server, in MiB.
    pub max_recv_msg_size_mib: u64,
}

impl profcol_api::config::Validate for OtlpGrpcConfig {
    fn validate(&self, p: &mut profcol_api::config::Problems) {
        match (&self.endpoint, &self.balancer) {
            (Some(_), Some(_)) => p.add(
                "balancer",
                "cannot be used with endpoint: the balancer names the addresses; remove endpoint (or balancer)",
            ),
            (_, Some(b)) => {
                p.nested("balancer", b);
                for e in balanced_endpoints(b) {
                    if !endpoint_uri(&e, &self.tls).1 {
                        p.check("", self.tls.check_plaintext(&e));
                    }
                }
            }
            (_, None) => {
                let e = self.endpoint();
                validate_endpoint(p, e);
                if !endpoint_uri(e, &self.tls).1 {
                    p.check("", self.tls.check_plaintext(e));
                }
            }
        }
        super::validate_headers(p, &self.headers);
        p.nested("tls", &self.tls);
        if self.max_recv_msg_size_mib == 0 || self.max_recv_msg_size_mib > 4096 {
            p.add(
                "max_recv_msg_size_mib",
                format!("{} is out of range; use 1 to 4096 MiB (default 4)", self.max_recv_msg_size_mib),
            );
        }
    }
}

fn validate_endpoint(p: &mut profcol_api::config::Problems, e: &str) {
    use profcol_api::config::checks;
    let e = e.trim();
    if e.contains("://") {
        p.check("endpoint", checks::http_url(e));
        let authority = e.split_once("://").map_or("", |(_, r)| r.split(['/', '?', '#']).next().unwrap_or(""));
        if authority.contains('@') {
            p.add(
                "endpoint",
                "credentials in a gRPC endpoint are not sent; remove them and use headers: {authorization: ...}",
            );
        }
    } else {
        p.check("endpoint", checks::host_port(e, false));
    }
}

/// The static endpoints, or a stand-in address for a DNS name (what TLS
/// checks need: only the scheme matters).
fn balanced_endpoints(b: &BalancerConfig) -> Vec<String> {
    match &b.resolver {
        super::balancer::ResolverConfig::Static(s) => s.endpoints.clone(),
        super::balancer::ResolverConfig::Dns(d) => {
            vec![format!("{}:{}", d.hostname.trim(), d.port.unwrap_or(DEFAULT_PORT))]
        }
    }
}

const DEFAULT_PORT: u16 = 4317;

impl OtlpGrpcConfig {
    /// The endpoint in use without a balancer.
    pub(crate) fn endpoint(&self) -> &str {
        self.endpoint.as_deref().unwrap_or("localhost:4317")
    }
}

impl Default for OtlpGrpcConfig {
    fn default() -> Self {
        OtlpGrpcConfig {
            endpoint: None,
            balancer: None,
            headers: BTreeMap::new(),
            compression: Compression::Gzip,
            tls: ClientTlsConfig::default(),
            max_recv_msg_size_mib: 4,
        }
    }
}

pub(crate) fn factory_otlp() -> Arc<dyn Factory> {
    make_factory("otlp", "OTLP profiles over gRPC (tonic); gzip, headers, TLS")
}

pub(crate) fn factory_otlp_grpc() -> Arc<dyn Factory> {
    make_factory("otlp_grpc", "alias of `otlp`: OTLP profiles over gRPC")
}

fn make_factory(type_name: &'static str, description: &'static str) -> Arc<dyn Factory> {
    factory_with_metrics::<OtlpGrpcConfig, _>(
        FactoryMeta { type_name, kind: Kind::Exporter, stability: Stability::Alpha, description },
        super::METRICS,
        |settings, cfg| Ok(Component::Exporter(Arc::new(OtlpGrpcExporter::new(settings, cfg)?))),
    )
}

/// Sends bytes that are already the encoded request.
#[derive(Clone, Copy, Default)]
struct PreEncoded;
struct BytesEncoder;
struct ResponseDecoder;

impl Encoder for BytesEncoder {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for ResponseDecoder {
    type Item = ExportProfilesServiceResponse;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        prost::Message::decode(src).map(Some).map_err(|e| Status::internal(format!("undecodable answer: {e}")))
    }
}

impl Codec for PreEncoded {
    type Encode = Bytes;
    type Decode = ExportProfilesServiceResponse;
    type Encoder = BytesEncoder;
    type Decoder = ResponseDecoder;
    fn encoder(&mut self) -> BytesEncoder {
        BytesEncoder
    }
    fn decoder(&mut self) -> ResponseDecoder {
        ResponseDecoder
    }
}

/// The `otlp` exporter component.
pub type OtlpGrpcExporter = OtlpExporter<GrpcTarget>;

/// What every address's sender shares.
pub(crate) struct Shared {
    id: String,
    metadata: MetadataMap,
    compression: Compression,
    max_recv: usize,
    counters: OtlpCounters,
}

/// One address: a channel and what requests carry.
pub struct GrpcTarget {
    channel: Channel,
    shared: Arc<Shared>,
}

/// The URI tonic connects to, and whether it is TLS.
fn endpoint_uri(endpoint: &str, tls: &ClientTlsConfig) -> (String, bool) {
    let e = endpoint.trim();
    if e.starts_with("http://") {
        (e.to_owned(), false)
    } else if e.starts_with("https://") {
        (e.to_owned(), true)
    } else if tls.insecure {
        (format!("http://{e}"), false)
    } else {
        (format!("https://{e}"), true)
    }
}

/// A lazy channel to `endpoint`, as the config says (`tls_name`: the name
/// the server's certificate is checked against, when not the endpoint's host).
fn channel(cfg: &OtlpGrpcConfig, endpoint: &str, tls_name: Option<&str>) -> Result<Channel, String> {
    let (uri, tls) = endpoint_uri(endpoint, &cfg.tls);
    let mut ep = Endpoint::from_shared(uri)
        .map_err(|e| {
            format!("endpoint {endpoint:?} is not a valid address ({e}); write host:port or http(s)://host:port")
        })?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .initial_stream_window_size(Some(1 << 20))
        .initial_connection_window_size(Some(4 << 20))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(false);
    if !tls {
        cfg.tls.check_plaintext(endpoint)?;
    } else {
        let (ca, ident) = cfg.tls.load()?;
        let mut tc = tonic::transport::ClientTlsConfig::new();
        tc = match ca {
            Some(ca) => tc.ca_certificate(tonic::transport::Certificate::from_pem(ca)),
            None => tc.with_native_roots(),
        };
        if let Some((c, k)) = ident {
            tc = tc.identity(tonic::transport::Identity::from_pem(c, k));
        }
        if let Some(n) = cfg.tls.server_name_override.as_deref().or(tls_name) {
            tc = tc.domain_name(n.to_owned());
        }
        ep = ep.tls_config(tc).map_err(|e| format!("tls: {e}"))?;
    }
    // Lazy: a backend that is down at start-up is an outage to ride out
    // (the host retries), not a start-up failure.
    Ok(ep.connect_lazy())
}

impl Transport for GrpcTarget {
    type Config = OtlpGrpcConfig;
    type Shared = Shared;
    const DEFAULT_PORT: u16 = DEFAULT_PORT;

    fn balancer(cfg: &OtlpGrpcConfig) -> Option<&BalancerConfig> {
        cfg.balancer.as_ref()
    }

    fn names_endpoint(cfg: &OtlpGrpcConfig) -> bool {
        cfg.endpoint.is_some()
    }

    fn shared(cfg: &OtlpGrpcConfig, id: &str, telemetry: &ComponentTelemetry) -> Result<Shared, String> {
        check_headers(&cfg.headers)?;
        let mut metadata = MetadataMap::new();
        for (k, v) in &cfg.headers {
            let key = MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
                .map_err(|e| format!("headers: {k:?} is not a valid gRPC metadata key: {e}"))?;
            let val = MetadataValue::try_from(v.expose())
                .map_err(|e| format!("headers.{k}: not a valid gRPC metadata value: {e}"))?;
            metadata.insert(key, val);
        }
        Ok(Shared {
            counters: OtlpCounters::new(telemetry),
            id: id.to_owned(),
            metadata,
            compression: cfg.compression,
            max_recv: usize::try_from(cfg.max_recv_msg_size_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX),
        })
    }

    fn one(cfg: &OtlpGrpcConfig, shared: Arc<Shared>) -> Result<Self, String> {
        Ok(GrpcTarget { channel: channel(cfg, cfg.endpoint(), None)?, shared })
    }

    fn connect(
        cfg: &OtlpGrpcConfig,
        address: &str,
        dns_name: Option<&str>,
        shared: Arc<Shared>,
    ) -> Result<Self, String> {
        Ok(GrpcTarget { channel: channel(cfg, address, dns_name)?, shared })
    }
}

impl OtlpExporter<GrpcTarget> {
    pub fn new(settings: CreateSettings, cfg: OtlpGrpcConfig) -> Result<Self, ComponentError> {
        super::exporter::new(settings, cfg)
    }

    /// As [`OtlpGrpcExporter::new`], with `balancer`'s addresses from
    /// `resolver` instead of the one the config names (tests decide what a
    /// name resolves to).
    pub fn with_resolver(
        settings: CreateSettings,
        cfg: OtlpGrpcConfig,
        resolver: Arc<dyn Resolver>,
    ) -> Result<Self, ComponentError> {
        super::exporter::build(settings, cfg, Some(resolver))
    }

    /// Sends one request whose protobuf bytes are `body`, the encoding of a
    /// batch of `shape` (what a partial success is counted against). With a
    /// balancer the bytes are decoded and balanced as a batch.
    pub async fn export_encoded(&self, body: Bytes, shape: Shape) -> Result<(), ExportError> {
        match &self.route {
            Route::One(t) => t.send_encoded(body, shape).await,
            Route::Balanced(b) => {
                let batch = Profiles::decode(&body).map_err(|e| ExportError::permanent(format!("{e}")))?;
                b.export(&batch).await
            }
        }
    }
}

impl GrpcTarget {
    async fn send_encoded(&self, body: Bytes, shape: Shape) -> Result<(), ExportError> {
        let s = &*self.shared;
        let mut grpc = tonic::client::Grpc::new(self.channel.clone()).max_decoding_message_size(s.max_recv);
        if s.compression == Compression::Gzip {
            grpc = grpc.send_compressed(tonic::codec::CompressionEncoding::Gzip);
        }
        grpc = grpc.accept_compressed(tonic::codec::CompressionEncoding::Gzip);
        let result = async {
            grpc.ready().await.map_err(|e| ExportError::Retryable {
                message: format!("cannot reach the backend: {}", error_chain(&e)),
                retry_after: None,
            })?;
            let mut req = tonic::Request::new(body);
            *req.metadata_mut() = s.metadata.clone();
            let path = http::uri::PathAndQuery::from_static(EXPORT_PATH);
            grpc.unary(req, path, PreEncoded).await.map_err(|s| status::from_grpc(&s))
        }
        .await;
        match result {
            Ok(resp) => match &resp.get_ref().partial_success {
                Some(p) => s.counters.partial(&s.id, p, shape),
                None => Ok(()),
            },
            Err(e) => {
                s.counters.count(&s.id, &e);
                Err(e)
            }
        }
    }
}

#[async_trait::async_trait]
impl Target for GrpcTarget {
    async fn send(&self, batch: &Profiles) -> Result<(), ExportError> {
        // ProfilesData and ExportProfilesServiceRequest share field numbers:
        // the batch's encoding is the request's.
        self.send_encoded(Bytes::from(batch.encode_to_vec()), Shape::of(batch)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_schemes() {
        let mut tls = ClientTlsConfig::default();
        assert_eq!(endpoint_uri("localhost:4317", &tls), ("https://localhost:4317".into(), true));
        tls.insecure = true;
        assert_eq!(endpoint_uri("localhost:4317", &tls), ("http://localhost:4317".into(), false));
        assert_eq!(endpoint_uri("https://x:1", &tls), ("https://x:1".into(), true));
    }

    #[test]
    fn config_rejects_host_keys_and_typos() {
        let yaml = |t: &str| profcol_config::parse_section(t).unwrap();
        assert!(yaml("endpoint: a:1\ntimeout: 5s").decode::<OtlpGrpcConfig>().is_err());
        assert!(yaml("endpoint: a:1\ncompression: zstd").decode::<OtlpGrpcConfig>().is_err());
        let v = yaml("endpoint: a:1\ncompression: none\nheaders: {authorization: Bearer x}\ntls: {insecure: true}");
        let c: OtlpGrpcConfig = v.decode().unwrap();
        assert_eq!(c.compression, Compression::None);
    }
}

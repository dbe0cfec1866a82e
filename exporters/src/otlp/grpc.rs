//! `otlp` (alias `otlp_grpc`): OTLP profiles over gRPC with tonic.

use super::{check_headers, error_chain, status, ClientTlsConfig, Compression, OtlpCounters, Shape};
use bytes::{BufMut, Bytes};
use profcol_api::component::{factory, Component, ComponentError, CreateSettings, Factory, FactoryMeta, Kind};
use profcol_api::model::ExportProfilesServiceResponse;
use profcol_api::{ExportError, Exporter, Profiles, Stability};
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
    /// `host:port`, `http://host:port` (plain text) or `https://host:port`.
    pub endpoint: String,
    /// Sent with every request, e.g. `authorization: "Bearer ${env:TOKEN}"`.
    pub headers: BTreeMap<String, profcol_api::config::Secret>,
    pub compression: Compression,
    pub tls: ClientTlsConfig,
    /// Largest answer accepted from the server, in MiB.
    pub max_recv_msg_size_mib: u64,
}

impl profcol_api::config::Validate for OtlpGrpcConfig {}

impl Default for OtlpGrpcConfig {
    fn default() -> Self {
        OtlpGrpcConfig {
            endpoint: "localhost:4317".into(),
            headers: BTreeMap::new(),
            compression: Compression::Gzip,
            tls: ClientTlsConfig::default(),
            max_recv_msg_size_mib: 4,
        }
    }
}

pub fn factory_otlp() -> Arc<dyn Factory> {
    make_factory("otlp", "OTLP profiles over gRPC (tonic); gzip, headers, TLS")
}

pub fn factory_otlp_grpc() -> Arc<dyn Factory> {
    make_factory("otlp_grpc", "alias of `otlp`: OTLP profiles over gRPC")
}

fn make_factory(type_name: &'static str, description: &'static str) -> Arc<dyn Factory> {
    factory::<OtlpGrpcConfig, _>(
        FactoryMeta { type_name, kind: Kind::Exporter, stability: Stability::Alpha, description },
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
pub struct OtlpGrpcExporter {
    id: String,
    channel: Channel,
    metadata: MetadataMap,
    compression: Compression,
    max_recv: usize,
    counters: OtlpCounters,
}

/// The URI tonic connects to, and whether it is TLS.
fn endpoint_uri(cfg: &OtlpGrpcConfig) -> (String, bool) {
    let e = cfg.endpoint.trim();
    if e.starts_with("http://") {
        (e.to_owned(), false)
    } else if e.starts_with("https://") {
        (e.to_owned(), true)
    } else if cfg.tls.insecure {
        (format!("http://{e}"), false)
    } else {
        (format!("https://{e}"), true)
    }
}

impl OtlpGrpcExporter {
    pub fn new(settings: CreateSettings, cfg: OtlpGrpcConfig) -> Result<Self, ComponentError> {
        let id = settings.id.to_string();
        let err = |m: String| ComponentError::msg(format!("exporter {id}: {m}"));
        check_headers(&cfg.headers).map_err(err)?;
        let mut metadata = MetadataMap::new();
        for (k, v) in &cfg.headers {
            let key = MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
                .map_err(|e| err(format!("headers: {k:?} is not a valid gRPC metadata key: {e}")))?;
            let val = MetadataValue::try_from(v.expose())
                .map_err(|e| err(format!("headers.{k}: not a valid gRPC metadata value: {e}")))?;
            metadata.insert(key, val);
        }
        let (uri, tls) = endpoint_uri(&cfg);
        let mut ep = Endpoint::from_shared(uri.clone())
            .map_err(|e| {
                err(format!(
                    "endpoint {:?} is not a valid address ({e}); write host:port or http(s)://host:port",
                    cfg.endpoint
                ))
            })?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .initial_stream_window_size(Some(1 << 20))
            .initial_connection_window_size(Some(4 << 20))
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_while_idle(false);
        if !tls {
            cfg.tls.check_plaintext(&cfg.endpoint).map_err(err)?;
        } else {
            let (ca, ident) = cfg.tls.load().map_err(err)?;
            let mut tc = tonic::transport::ClientTlsConfig::new();
            tc = match ca {
                Some(ca) => tc.ca_certificate(tonic::transport::Certificate::from_pem(ca)),
                None => tc.with_native_roots(),
            };
            if let Some((c, k)) = ident {
                tc = tc.identity(tonic::transport::Identity::from_pem(c, k));
            }
            if let Some(n) = &cfg.tls.server_name_override {
                tc = tc.domain_name(n.clone());
            }
            ep = ep.tls_config(tc).map_err(|e| err(format!("tls: {e}")))?;
        }
        // Lazy: a backend that is down at start-up is an outage to ride out
        // (the host retries), not a start-up failure.
        let channel = ep.connect_lazy();
        Ok(OtlpGrpcExporter {
            counters: OtlpCounters::new(&settings.telemetry),
            id,
            channel,
            metadata,
            compression: cfg.compression,
            max_recv: usize::try_from(cfg.max_recv_msg_size_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX),
        })
    }

    /// Sends one request whose protobuf bytes are `body`, the encoding of a
    /// batch of `shape` (what a partial success is counted against).
    pub async fn export_encoded(&self, body: Bytes, shape: Shape) -> Result<(), ExportError> {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone()).max_decoding_message_size(self.max_recv);
        if self.compression == Compression::Gzip {
            grpc = grpc.send_compressed(tonic::codec::CompressionEncoding::Gzip);
        }
        grpc = grpc.accept_compressed(tonic::codec::CompressionEncoding::Gzip);
        let result = async {
            grpc.ready().await.map_err(|e| ExportError::Retryable {
                message: format!("cannot reach the backend: {}", error_chain(&e)),
                retry_after: None,
            })?;
            let mut req = tonic::Request::new(body);
            *req.metadata_mut() = self.metadata.clone();
            let path = http::uri::PathAndQuery::from_static(EXPORT_PATH);
            grpc.unary(req, path, PreEncoded).await.map_err(|s| status::from_grpc(&s))
        }
        .await;
        match result {
            Ok(resp) => match &resp.get_ref().partial_success {
                Some(p) => self.counters.partial(&self.id, p, shape),
                None => Ok(()),
            },
            Err(e) => {
                self.counters.count(&self.id, &e);
                Err(e)
            }
        }
    }
}

#[async_trait::async_trait]
impl Exporter for OtlpGrpcExporter {
    async fn export(&self, batch: &Profiles) -> Result<(), ExportError> {
        // ProfilesData and ExportProfilesServiceRequest share field numbers:
        // the batch's encoding is the request's.
        self.export_encoded(Bytes::from(batch.encode_to_vec()), Shape::of(batch)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_schemes() {
        let mut c = OtlpGrpcConfig::default();
        assert_eq!(endpoint_uri(&c), ("https://localhost:4317".into(), true));
        c.tls.insecure = true;
        assert_eq!(endpoint_uri(&c), ("http://localhost:4317".into(), false));
        c.endpoint = "https://x:1".into();
        assert_eq!(endpoint_uri(&c), ("https://x:1".into(), true));
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
